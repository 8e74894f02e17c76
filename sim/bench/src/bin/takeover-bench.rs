//! `takeover-bench`: how long one section is unavailable when it changes AllocSvr on the release
//! path, under load — and, of that, how long the gaining AllocSvr takes from the grant to serving.
//!
//! The set has exactly two sections (`--uid-limit` = 2 × `--section-size`) and two AllocSvrs, so
//! every ownership change moves ONE section. Callers of the client library fetch uids of both
//! sections in a closed loop the whole time. Each round makes two single-section takeovers:
//!
//! 1. **drain**: `DrainAllocSvr(A)` — A releases its section at its next renewal and B gains it;
//! 2. **rejoin**: A is killed (it holds nothing) and started again; its new incarnation registers,
//!    the arbiter takes one section back from B, which releases it, and A gains it.
//!
//! For each takeover it prints the gaining node's `allocsvr_gain_ready_seconds{path="release"}`
//! (grant to servable: Load, first bump, no lease wait), and what the callers saw: the longest
//! time the moved section served nothing (between two served fetches of it, any caller) and the
//! slowest single call. The other section is the control: its gap stays at the load's own.
//!
//! `--kill` measures the crash path instead: each round SIGKILLs the AllocSvr owning one
//! section (the nodes take turns) and times, from the kill, the first fetch of that section begun
//! after the kill and served (by the other AllocSvr, once the store declared the victim dead and
//! the gainer waited out what was left of its lease, docs/DESIGN.md rule 4); then the victim is
//! started again and the two rebalance before the next round. It prints every kill and the
//! median, p90 and max.
//!
//! `--storesvr PATH` and `--allocsvr PATH` run other binaries (e.g. a saved baseline) to compare
//! builds in the same hour. Every process is killed when the run ends (the harness's `Supervisor`, also on
//! panic); the load stops by itself after the last round. Exit code: 0 done, 2 bad options or
//! missing binaries, 3 the harness failed.
//!
//! Deliberately left out: many sections at once (docs/journal/benchmarks-2026-11.md has the
//! drain of 21,475), and whether the crash path is safe (the simulator checks that).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use seqsvr_bench::cluster::{self, AllocNode, Stores};
use seqsvr_bench::exit::{Failure, harness};
use seqsvr_bench::{args, procfs, setup};
use seqsvr_client::{Client, ClientConfig};
use seqsvr_harness::Supervisor;
use seqsvr_proto::Uid;
use seqsvr_proto::pb;
use seqsvr_proto::pb::admin_service_client::AdminServiceClient;

/// Longest wait for ownership to settle after a step.
const SETTLE_LIMIT: Duration = Duration::from_secs(30);
/// Quiet time kept before and after each takeover, so that the gaps of one are not the next's.
const BREATHE: Duration = Duration::from_millis(700);

#[derive(Parser, Debug)]
#[command(name = "takeover-bench", version = seqsvr_plumbing::version::LONG,
    about = "Single-section takeover on the release path, under load"
)]
struct Args {
    #[command(flatten)]
    config: args::Config,
    /// Rounds; each makes two takeovers (a drain and a rejoin).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Callers fetching in a closed loop, half on each section.
    #[arg(long, default_value_t = 16)]
    callers: usize,
    /// Uids per section.
    #[arg(long, default_value_t = 100_000)]
    section_size: u64,
    /// StoreSvr step.
    #[arg(long, default_value_t = 10_000)]
    step: u64,
    /// The StoreSvr binary (default: the one beside this benchmark).
    #[arg(long)]
    storesvr: Option<PathBuf>,
    /// The AllocSvr binary (default: the one beside this benchmark).
    #[arg(long)]
    allocsvr: Option<PathBuf>,
    /// Crash path: each round SIGKILLs an owner and times kill → first fetch of its section
    /// served again (instead of a drain and a rejoin).
    #[arg(long)]
    kill: bool,
    /// Where the StoreSvr replicas keep their data (default: a temp dir next to the target dir).
    #[arg(long)]
    dir: Option<PathBuf>,
}

impl Args {
    fn validate(&self) -> Result<(), String> {
        if !(1..=50).contains(&self.rounds) {
            return Err("--rounds must be in 1..=50".into());
        }
        if !(2..=512).contains(&self.callers) {
            return Err("--callers must be in 2..=512".into());
        }
        if !(1_000..=10_000_000).contains(&self.section_size) {
            return Err("--section-size must be in 1000..=10000000".into());
        }
        if self.step == 0 {
            return Err("--step must be > 0".into());
        }
        Ok(())
    }
}

fn main() -> ExitCode {
    let args: Args = seqsvr_plumbing::cli::parse("TAKEOVER_BENCH");
    let bench = async { run(&args).await.map(|()| true) };
    seqsvr_bench::exit::run_valid("takeover-bench", args.validate(), bench)
}

/// One served (or failed) fetch, as a caller saw it.
#[derive(Clone, Copy)]
struct Call {
    section: usize,
    done: Instant,
    took: Duration,
    ok: bool,
}

/// One takeover: when it was started, when the gaining node was serving, and the node's figure.
struct Takeover {
    what: &'static str,
    section: usize,
    gainer: u64,
    started: Instant,
    settled: Instant,
    /// The gaining node's grant-to-servable time for this one section (sum delta of the summary).
    grant_to_ready: Duration,
}

async fn run(args: &Args) -> Result<(), Failure> {
    let bins = binaries(args)?;
    let tmp = tempfile::Builder::new()
        .prefix("takeover-bench")
        .tempdir_in(args.dir.clone().unwrap_or_else(|| PathBuf::from("target")))
        .map_err(|e| harness(format!("temp dir: {e}")))?;
    let mut procs = setup::supervisor(tmp.path())?;
    let extra = [format!("--uid-limit={}", 2 * args.section_size)];
    let stores = cluster::start_stores_with(
        &mut procs,
        &bins.storesvr,
        tmp.path(),
        args.step,
        args.section_size,
        &extra,
    )
    .await
    .map_err(harness)?;
    let a = cluster::start_allocsvr(&mut procs, &bins.allocsvr, 1, &stores).map_err(harness)?;
    cluster::wait_balanced(&stores.leader, 1, SETTLE_LIMIT)
        .await
        .map_err(harness)?;
    let b = cluster::start_allocsvr(&mut procs, &bins.allocsvr, 2, &stores).map_err(harness)?;
    cluster::wait_balanced(&stores.leader, 2, SETTLE_LIMIT)
        .await
        .map_err(harness)?;
    println!(
        "machine: {}; storesvr {}; allocsvr {}; 2 sections of {} uids, step {}, {} callers",
        procfs::machine(),
        bins.storesvr.display(),
        bins.allocsvr.display(),
        args.section_size,
        args.step,
        args.callers
    );
    let client = Client::connect(ClientConfig {
        tls: seqsvr_bench::tls::client(),
        ..ClientConfig::new([a.addr.clone(), b.addr.clone()])
    })
    .await
    .map_err(|e| harness(format!("client: {e}")))?;
    let (stop, calls) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(Vec::new())));
    let load = start_load(&client, args, stop.clone(), calls.clone());
    tokio::time::sleep(BREATHE).await;
    let nodes = [a, b];
    let mut takeovers = Vec::new();
    let mut kills = Vec::new();
    let outcome = if args.kill {
        kill_rounds(args, &client, &mut procs, &stores, &nodes, &mut kills).await
    } else {
        rounds(args, &mut procs, &stores, &nodes, &mut takeovers).await
    };
    tokio::time::sleep(BREATHE).await;
    stop.store(true, Ordering::Relaxed);
    for task in load {
        let _ = task.await;
    }
    outcome?;
    let calls = std::mem::take(&mut *calls.lock().unwrap_or_else(|e| e.into_inner()));
    if args.kill {
        report_kills(&kills, &calls);
    } else {
        report(&takeovers, &calls);
    }
    Ok(())
}

/// One SIGKILL of an owner: its section and when it was killed.
struct Kill {
    section: usize,
    victim: u64,
    at: Instant,
}

/// The crash rounds: SIGKILL the owner of one section (the nodes take turns), wait until the other
/// node owns both, start the victim again and wait until the two are balanced.
async fn kill_rounds(
    args: &Args,
    client: &Client,
    procs: &mut Supervisor,
    stores: &Stores,
    nodes: &[AllocNode; 2],
    out: &mut Vec<Kill>,
) -> Result<(), Failure> {
    for r in 0..args.rounds {
        let victim = &nodes[r % 2];
        let section = owned_by(stores, victim.node_id).await?;
        let name = format!("alloc{}", victim.node_id);
        let at = Instant::now();
        procs.kill(&name).map_err(|e| harness(format!("kill {name}: {e}")))?;
        out.push(Kill {
            section,
            victim: victim.node_id,
            at,
        });
        // Served again before the restart: the gap is the crash path's alone.
        wait_served(client, section as u64 * args.section_size).await?;
        tokio::time::sleep(BREATHE).await;
        procs
            .start(&name)
            .map_err(|e| harness(format!("restart {name}: {e}")))?;
        cluster::wait_balanced(&stores.leader, 2, SETTLE_LIMIT)
            .await
            .map_err(harness)?;
        tokio::time::sleep(BREATHE).await;
    }
    Ok(())
}

/// Fetches `uid` until one fetch is served (within [`SETTLE_LIMIT`]).
async fn wait_served(client: &Client, uid: u64) -> Result<(), Failure> {
    let deadline = Instant::now() + SETTLE_LIMIT;
    while Instant::now() < deadline {
        if client.fetch_next_seq(Uid(uid)).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Err(harness(format!(
        "uid {uid} not served within {SETTLE_LIMIT:?} of a kill"
    )))
}

/// Per kill: from the SIGKILL to the first fetch of the victim's section begun after it and
/// served; then median, p90 and max.
fn report_kills(kills: &[Kill], calls: &[Call]) {
    println!(
        "\n{:<5} {:>4} {:>6} {:>16} {:>6}",
        "kill", "sect", "victim", "kill→served", "failed"
    );
    let mut took = Vec::new();
    for (i, k) in kills.iter().enumerate() {
        let after = calls
            .iter()
            .filter(|c| c.section == k.section && c.done >= k.at && c.done - c.took >= k.at);
        let first = after.clone().filter(|c| c.ok).map(|c| c.done).min();
        let failed = after.filter(|c| !c.ok && first.is_none_or(|f| c.done <= f)).count();
        let v = first.map_or(f64::NAN, |f| ms(f - k.at));
        println!(
            "{:<5} {:>4} {:>6} {:>13.1} ms {:>6}",
            i + 1,
            k.section,
            k.victim,
            v,
            failed
        );
        took.push(v);
    }
    took.sort_by(f64::total_cmp);
    let at = |q: f64| {
        took.get(((took.len() as f64 * q).ceil() as usize).saturating_sub(1))
            .copied()
    };
    let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
    println!(
        "\nkill → first fetch of the victim's section served again, over {} kills (ms): median {}; p90 {}; max {}",
        took.len(),
        fmt(at(0.5)),
        fmt(at(0.9)),
        fmt(took.last().copied())
    );
    println!(
        "columns: kill→served = SIGKILL to the first fetch of that section begun after the kill and served; failed = \
         fetches of it begun after the kill that failed before that"
    );
}

/// The binaries beside this benchmark, or those `--storesvr` and `--allocsvr` name.
fn binaries(args: &Args) -> Result<cluster::Binaries, Failure> {
    let mut bins = cluster::binaries().map_err(Failure::Usage)?;
    for (flag, given, bin) in [
        ("--storesvr", &args.storesvr, &mut bins.storesvr),
        ("--allocsvr", &args.allocsvr, &mut bins.allocsvr),
    ] {
        if let Some(p) = given {
            if !p.exists() {
                return Err(Failure::Usage(format!("{flag} {} does not exist", p.display())));
            }
            *bin = p.clone();
        }
    }
    Ok(bins)
}

/// `args.callers` tasks fetching uids of section `i % 2`, each call recorded; they stop with `stop`
/// (and every call has the client's deadline).
fn start_load(
    client: &Client,
    args: &Args,
    stop: Arc<AtomicBool>,
    calls: Arc<Mutex<Vec<Call>>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..args.callers)
        .map(|i| {
            let (client, stop, calls) = (client.clone(), stop.clone(), calls.clone());
            let section = i % 2;
            let base = section as u64 * args.section_size;
            tokio::spawn(async move {
                let mut mine = Vec::new();
                let mut k = i as u64;
                while !stop.load(Ordering::Relaxed) {
                    k = k
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    let uid = base + (k >> 33) % 1_000;
                    let t0 = Instant::now();
                    let ok = client.fetch_next_seq(Uid(uid)).await.is_ok();
                    let done = Instant::now();
                    mine.push(Call {
                        section,
                        done,
                        took: done - t0,
                        ok,
                    });
                }
                calls.lock().unwrap_or_else(|e| e.into_inner()).extend(mine);
            })
        })
        .collect()
}

/// The rounds: drain one node (its section goes to the other), then restart it so that it gains
/// a section back; the nodes take turns being drained.
async fn rounds(
    args: &Args,
    procs: &mut Supervisor,
    stores: &Stores,
    nodes: &[AllocNode; 2],
    out: &mut Vec<Takeover>,
) -> Result<(), Failure> {
    let admin = cluster::connect(&stores.leader).await.map_err(harness)?;
    let mut admin = AdminServiceClient::new(admin);
    for r in 0..args.rounds {
        let (victim, gainer) = (&nodes[r % 2], &nodes[(r + 1) % 2]);
        let section = owned_by(stores, victim.node_id).await?;
        let before = gain_sum(gainer)?;
        let started = Instant::now();
        admin
            .drain_alloc_svr(pb::DrainAllocSvrRequest {
                node_id: victim.node_id,
            })
            .await
            .map_err(|e| harness(format!("drain node {}: {e}", victim.node_id)))?;
        let settled = wait_ready(gainer, before).await?;
        out.push(Takeover {
            what: "drain",
            section,
            gainer: gainer.node_id,
            started,
            settled,
            grant_to_ready: Duration::from_secs_f64(gain_sum(gainer)?.0 - before.0),
        });
        tokio::time::sleep(BREATHE).await;
        let name = format!("alloc{}", victim.node_id);
        procs.kill(&name).map_err(|e| harness(format!("kill {name}: {e}")))?;
        let before = (0.0, 0.0); // a fresh process starts its summary at zero
        let started = Instant::now();
        procs
            .start(&name)
            .map_err(|e| harness(format!("restart {name}: {e}")))?;
        let settled = wait_ready(victim, before).await?;
        out.push(Takeover {
            what: "rejoin",
            section: owned_by(stores, victim.node_id).await?,
            gainer: victim.node_id,
            started,
            settled,
            grant_to_ready: Duration::from_secs_f64(gain_sum(victim)?.0),
        });
        cluster::wait_balanced(&stores.leader, 2, SETTLE_LIMIT)
            .await
            .map_err(harness)?;
        tokio::time::sleep(BREATHE).await;
    }
    Ok(())
}

/// The one section `node` owns (the set has two, one per node).
async fn owned_by(stores: &Stores, node: u64) -> Result<usize, Failure> {
    let routes = cluster::routes(&stores.leader).await.map_err(harness)?;
    routes
        .entries
        .iter()
        .find(|e| e.node_id == node)
        .map(|e| e.section_begin as usize)
        .ok_or_else(|| harness(format!("node {node} owns no section in the route table")))
}

/// `(sum, count)` of the node's release-path grant-to-servable summary.
fn gain_sum(node: &AllocNode) -> Result<(f64, f64), Failure> {
    let read = |m| procfs::scrape(&node.metrics, m, Some("path=\"release\""));
    match (
        read("allocsvr_gain_ready_seconds_sum"),
        read("allocsvr_gain_ready_seconds_count"),
    ) {
        (Some(s), Some(c)) => Ok((s, c)),
        _ => Err(harness(format!("cannot read node {}'s metrics", node.node_id))),
    }
}

/// Waits until `node` has gained one more section on the release path than in `before`.
async fn wait_ready(node: &AllocNode, before: (f64, f64)) -> Result<Instant, Failure> {
    let deadline = Instant::now() + SETTLE_LIMIT;
    while Instant::now() < deadline {
        if procfs::scrape(
            &node.metrics,
            "allocsvr_gain_ready_seconds_count",
            Some("path=\"release\""),
        )
        .is_some_and(|c| c >= before.1 + 1.0)
        {
            return Ok(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Err(harness(format!(
        "node {} gained no section on the release path within {SETTLE_LIMIT:?}",
        node.node_id
    )))
}

/// Per takeover: the server's grant-to-servable, and what the callers of the moved section and of
/// the other one saw around it; then the medians.
fn report(takeovers: &[Takeover], calls: &[Call]) {
    println!(
        "\n{:<7} {:>4} {:>4} {:>11} {:>13} {:>11} {:>12} {:>12} {:>6} {:>12}",
        "event",
        "sect",
        "gain",
        "grant→ready",
        "request→seen",
        "seen→served",
        "no-serve",
        "slowest",
        "failed",
        "other gap"
    );
    let mut columns: [Vec<f64>; 6] = Default::default();
    for t in takeovers {
        let from = t.started - BREATHE / 2;
        let to = t.settled + BREATHE / 2;
        let window = |s: usize| {
            calls
                .iter()
                .filter(move |c| c.section == s && c.done >= from && c.done <= to)
        };
        let gap = |s: usize| longest_gap(window(s).filter(|c| c.ok).map(|c| c.done));
        let slowest = window(t.section).map(|c| c.took).max().unwrap_or_default();
        let failed = window(t.section).filter(|c| !c.ok).count();
        // The first fetch of the moved section served after the benchmark saw the gainer ready
        // (it polls the gainer's metrics every 5 ms, so this is within 5 ms of the truth).
        let first = window(t.section)
            .filter(|c| c.ok && c.done >= t.settled)
            .map(|c| c.done)
            .min();
        let served_after = first.map_or(f64::NAN, |f| ms(f - t.settled));
        let ready_ms = t.grant_to_ready.as_secs_f64() * 1e3;
        let row = [
            ready_ms,
            ms(t.settled - t.started),
            served_after,
            ms(gap(t.section)),
            ms(slowest),
            ms(gap(1 - t.section)),
        ];
        println!(
            "{:<7} {:>4} {:>4} {:>8.2} ms {:>10.1} ms {:>8.1} ms {:>9.1} ms {:>9.1} ms {:>6} {:>9.1} ms",
            t.what, t.section, t.gainer, row[0], row[1], row[2], row[3], row[4], failed, row[5]
        );
        for (col, v) in columns.iter_mut().zip(row) {
            col.push(v);
        }
    }
    let med: Vec<String> = columns.iter_mut().map(|c| format!("{:.2}", median(c))).collect();
    println!(
        "\nmedians over {} takeovers (ms): grant→ready {}; request→gainer ready {}; ready→first served fetch {}; \
         moved section served nothing for {}; its slowest call {}; the other section's longest gap {}",
        takeovers.len(),
        med[0],
        med[1],
        med[2],
        med[3],
        med[4],
        med[5]
    );
    println!(
        "columns: grant→ready = the gainer's allocsvr_gain_ready_seconds{{path=\"release\"}}; request→seen = drain RPC \
         (or restart) to the benchmark seeing the gainer ready; seen→served = to the first fetch of the moved section \
         served after that; no-serve = longest time no fetch of the moved section was served; other gap = the same for \
         the section that did not move (the control)"
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The longest time between two consecutive instants (sorted here).
fn longest_gap(times: impl Iterator<Item = Instant>) -> Duration {
    let mut t: Vec<Instant> = times.collect();
    t.sort_unstable();
    t.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}
