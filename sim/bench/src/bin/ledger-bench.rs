//! `ledger-bench`: gapless invoice numbers, ledger counters against PostgreSQL, in one run on one
//! machine: reserve+confirm pairs per second and the latency of a pair.
//!
//! 1. Starts 3 `storesvr` and `--allocsvrs` `allocsvr` (1 by default), declares `--ledgers`
//!    ledgers `inv:0..K` (`CreateLedger`), and starts PostgreSQL from the system packages in the
//!    run's temp dir (`seqsvr_bench::postgres`: fsync and synchronous commit on) with one row per
//!    series `inv:0..K`.
//! 2. At 1, 16, 64, 256 callers (closed loop; one channel per 32 callers): `ledger` — `Reserve`
//!    then `Confirm` of the number over gRPC `LedgerService`, through the AllocSvrs (`--via
//!    alloc`, each forwards to the store leader) or straight at the StoreSvr leader (`--via
//!    store-leader`); `issue` — the same invoice in one `Reserve` carrying its reference
//!    (confirmed in the same entry); `postgres` — `BEGIN; UPDATE series … RETURNING next; INSERT
//!    INTO invoices …; COMMIT`. The sides rotate from point to point and run to run, so drift hits
//!    all alike.
//!    For each ledger point the store leader's Raft entries per second and commands per entry
//!    (`storesvr_entry_commands`) say how well its group commit shares an fsync.
//! 3. At the end, both sides are checked against what the callers were given: every number
//!    distinct, none skipped, and the server's own summary (`Show`; the tables) says high ==
//!    pairs and confirmed == pairs. A mismatch exits 3.
//!
//! The summary gives medians over `--runs` of pairs/s, p50/p99 of a pair and server CPU per pair,
//! and the ratios ledger ÷ postgres and issue ÷ postgres (throughput, p99). Targets are printed, not asserted, at
//! 64 callers: ≥ 2× PostgreSQL's pairs/s and p99 ≤ PostgreSQL's. Exit 0 when measuring (and the checks)
//! worked, 2 bad options or missing binaries (PostgreSQL's with its install line), 3 the harness or
//! a final check failed.
//!
//! Every process is started through the harness's `Supervisor` and stopped by pid when the run ends;
//! everything listens on 127.0.0.1; every load loop stops by itself.
//!
//! Deliberately left out: `--tls`, releases and expiry (see `seqsvr_bench::ledgers`), and tuning
//! PostgreSQL away from its defaults.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use seqsvr_bench::args::{self, chosen};
use seqsvr_bench::cluster::{self, AllocNode, Stores};
use seqsvr_bench::exit::{Failure, harness};
use seqsvr_bench::ledgers::{self, Numbers};
use seqsvr_bench::load::{Pids, Sample};
use seqsvr_bench::postgres::{self, PgServer};
use seqsvr_bench::procfs;
use seqsvr_bench::report::{self, median};
use seqsvr_bench::setup::{self, Run};
use seqsvr_harness::Supervisor;
use seqsvr_proto::pb::ledger_service_client::LedgerServiceClient;
use tonic::transport::Channel;

/// As `counter-bench`: 16,777 sections of 1,000 uids; a ledger is placed like a counter.
const SECTION_SIZE: u64 = 1_000;
const UID_LIMIT: u64 = 1 << 24;
const STEP: u64 = 10_000;
const CONCURRENCIES: [usize; 4] = [1, 16, 64, 256];
const MOST_CALLERS: usize = 256;
const MAX_CHANNELS: usize = 8;
const SERVING_LIMIT: Duration = Duration::from_secs(60);
const LISTEN_LIMIT: Duration = Duration::from_secs(20);

/// The sides, in the order the tables list them: the ledger's reserve+confirm pair, the ledger's
/// issue (the pair in one call), PostgreSQL's transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Ledger,
    Issue,
    Postgres,
}

impl Side {
    const ALL: [Side; 3] = [Side::Ledger, Side::Issue, Side::Postgres];

    fn name(self) -> &'static str {
        match self {
            Side::Ledger => "ledger",
            Side::Issue => "issue",
            Side::Postgres => "postgres",
        }
    }
}

/// Where the ledger calls go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Via {
    /// The AllocSvrs' data-plane addresses (each forwards to the store leader): what applications
    /// call.
    Alloc,
    /// The StoreSvr leader itself: for an AllocSvr that does not serve `LedgerService` yet.
    StoreLeader,
}

#[derive(Parser, Debug)]
#[command(name = "ledger-bench", version = seqsvr_plumbing::version::LONG,
    about = "Ledger counters against PostgreSQL: reserve+confirm pairs per second and p99 of a pair"
)]
struct Args {
    #[command(flatten)]
    common: args::Common,
    /// Times every point is measured; medians are shown.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Ledgers (and PostgreSQL series) the callers spread over: caller t uses `inv:{t % K}`.
    #[arg(long, default_value_t = 1)]
    ledgers: usize,
    /// AllocSvrs started; with `--via alloc` the channels spread over them.
    #[arg(long, default_value_t = 1)]
    allocsvrs: u64,
    /// Where the ledger calls go.
    #[arg(long, value_enum, default_value_t = Via::Alloc)]
    via: Via,
    /// Measure only these sides (ledger, issue, postgres); no target is judged without postgres.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Measure only at these caller counts (of 1, 16, 64, 256).
    #[arg(long, value_delimiter = ',')]
    callers: Vec<usize>,
}

impl Args {
    fn validate(&self) -> Result<(), String> {
        self.common.validate(600, 60_000)?;
        args::check_runs(self.runs)?;
        if let Some(bad) = self
            .only
            .iter()
            .find(|n| !Side::ALL.iter().any(|s| s.name() == n.as_str()))
        {
            return Err(format!("--only: no side {bad:?} (ledger, issue, postgres)"));
        }
        args::check_subset("--callers", &self.callers, &CONCURRENCIES)?;
        if !(1..=256).contains(&self.ledgers) || !(1..=8).contains(&self.allocsvrs) {
            return Err("--ledgers must be in 1..=256 and --allocsvrs in 1..=8".into());
        }
        Ok(())
    }

    fn measures(&self, side: Side) -> bool {
        self.only.is_empty() || self.only.iter().any(|n| n == side.name())
    }
}

fn main() -> ExitCode {
    let args: Args = seqsvr_plumbing::cli::parse("LEDGER_BENCH");
    seqsvr_bench::exit::run_valid("ledger-bench", args.validate(), bench(&args))
}

/// The servers under test and what the loads need of them.
struct Servers {
    /// Channels to the ledger's targets (client `i` to target `i % targets`).
    ledger: Vec<LedgerServiceClient<Channel>>,
    targets: usize,
    /// The process the ledger calls reach first (the AllocSvr, or the store leader) and the rest.
    ledger_pid: u32,
    ledger_others: Vec<u32>,
    /// The store leader's metrics address.
    leader_metrics: String,
    pg: Option<PgServer>,
    /// Every process this benchmark started (PostgreSQL's children are added per point).
    ours: Vec<u32>,
    /// The numbers each side's pairs were given, for the final checks.
    ledger_numbers: Arc<Numbers>,
    pg_numbers: Arc<Numbers>,
}

async fn bench(args: &Args) -> Result<bool, Failure> {
    let pg_bins = if args.measures(Side::Postgres) {
        Some(postgres::binaries().map_err(Failure::Usage)?)
    } else {
        None
    };
    let mut run = Run::new(args.common.dir.as_deref())?;
    let w = &args.common.window;
    let options = format!(
        "--seconds {} --warmup-ms {} --runs {} --ledgers {} --allocsvrs {} --via {:?}",
        w.seconds, w.warmup_ms, args.runs, args.ledgers, args.allocsvrs, args.via
    );
    setup::print_header(&options, run.dir());
    let mut s = start(&mut run, args).await?;
    if let Some(bins) = &pg_bins {
        let (procs, dir) = run.procs_and_dir();
        let pg = postgres::start(procs, dir, bins, args.ledgers).await.map_err(harness)?;
        println!(
            "postgres: {} at {} (pid {}), fsync=on, synchronous_commit=on",
            pg.version,
            pg.conninfo.split(" user=").next().unwrap_or_default(),
            pg.pid
        );
        s.ours.push(pg.pid);
        s.pg = Some(pg);
    }
    let mut points: Vec<Point> = CONCURRENCIES
        .iter()
        .flat_map(|&concurrency| {
            Side::ALL.map(|side| Point {
                side,
                concurrency,
                runs: Vec::new(),
            })
        })
        .collect();
    for r in 0..args.runs {
        one_run(args, &s, &mut run.procs, r, &mut points).await?;
    }
    summarize(&points);
    let checked = final_checks(args, &s).await;
    if s.pg.is_some() {
        postgres::stop(&mut run.procs).await.map_err(harness)?;
    }
    checked.map(|()| true)
}

/// The StoreSvr set and the AllocSvrs; the ledgers declared through every target.
async fn start(run: &mut Run, args: &Args) -> Result<Servers, Failure> {
    let started = Instant::now();
    let storesvr = run.bins.storesvr.clone();
    let (procs, dir) = run.procs_and_dir();
    let extra = [format!("--uid-limit={UID_LIMIT}")];
    let stores = cluster::start_stores_with(procs, &storesvr, dir, STEP, SECTION_SIZE, &extra)
        .await
        .map_err(harness)?;
    let mut allocs = Vec::new();
    for id in 1..=args.allocsvrs {
        let node = cluster::start_allocsvr(&mut run.procs, &run.bins.allocsvr, id, &stores).map_err(harness)?;
        if !seqsvr_harness::wait_listening(&node.addr, LISTEN_LIMIT).await {
            return Err(harness(format!("allocsvr {id} did not listen within {LISTEN_LIMIT:?}")));
        }
        allocs.push(node);
    }
    let leader_idx = stores.addrs.iter().position(|a| *a == stores.leader).unwrap_or(0);
    let (targets, ledger_pid, ledger_others) = ledger_targets(args.via, &stores, &allocs, leader_idx);
    let mut ledger = Vec::new();
    for i in 0..MAX_CHANNELS.max(targets.len()) {
        let ch = cluster::connect(&targets[i % targets.len()]).await.map_err(harness)?;
        ledger.push(ledgers::client(ch));
    }
    for (i, target) in targets.iter().enumerate() {
        wait_serving(&ledger[i], target, args).await?;
    }
    println!(
        "cluster: 3 storesvr (section size {SECTION_SIZE}, uid limit 2^24, step {STEP}) + {} allocsvr; {} ledger(s) inv:0..{} served via {} {:?}, {:.1} s after the start; logs in {}",
        args.allocsvrs,
        args.ledgers,
        args.ledgers,
        match args.via {
            Via::Alloc => "the allocsvr(s)",
            Via::StoreLeader => "the store leader",
        },
        targets,
        started.elapsed().as_secs_f64(),
        run.dir().join("logs").display()
    );
    let mut ours: Vec<u32> = stores.pids.clone();
    ours.extend(allocs.iter().map(|a| a.pid));
    Ok(Servers {
        ledger,
        targets: targets.len(),
        ledger_pid,
        ledger_others,
        leader_metrics: stores.metrics[leader_idx].clone(),
        pg: None,
        ours,
        ledger_numbers: Arc::new(Numbers::new(MOST_CALLERS)),
        pg_numbers: Arc::new(Numbers::new(MOST_CALLERS)),
    })
}

/// Where the ledger calls go (addresses), the pid of the process they reach first, and the pids of
/// the rest of the service.
fn ledger_targets(via: Via, stores: &Stores, allocs: &[AllocNode], leader_idx: usize) -> (Vec<String>, u32, Vec<u32>) {
    match via {
        Via::Alloc => (
            allocs.iter().map(|a| a.addr.clone()).collect(),
            allocs[0].pid,
            allocs[1..]
                .iter()
                .map(|a| a.pid)
                .chain(stores.pids.iter().copied())
                .collect(),
        ),
        Via::StoreLeader => {
            let others = stores
                .pids
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != leader_idx)
                .map(|(_, p)| *p)
                .chain(allocs.iter().map(|a| a.pid))
                .collect();
            (vec![stores.leader.clone()], stores.pids[leader_idx], others)
        }
    }
}

/// Until `CreateLedger` of every ledger answers OK through `client` (to `target`). UNIMPLEMENTED
/// fails at once: that server does not serve `LedgerService`.
async fn wait_serving(client: &LedgerServiceClient<Channel>, target: &str, args: &Args) -> Result<(), Failure> {
    let deadline = Instant::now() + SERVING_LIMIT;
    loop {
        match ledgers::create(client, args.ledgers).await {
            Ok(()) => return Ok(()),
            Err(e) if e.code() == tonic::Code::Unimplemented => {
                return Err(harness(format!(
                    "{target} does not serve LedgerService ({}); an AllocSvr built before ledgers are forwarded does not: --via store-leader measures the store leader itself",
                    e.message()
                )));
            }
            Err(e) if Instant::now() >= deadline => {
                return Err(harness(format!(
                    "no ledger declared through {target} within {SERVING_LIMIT:?}: {e}"
                )));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Samples of one (side, callers) point, one per run.
struct Point {
    side: Side,
    concurrency: usize,
    runs: Vec<Sample>,
}

/// Run `run` of every point, the side order alternating by run and caller count.
async fn one_run(
    args: &Args,
    s: &Servers,
    procs: &mut Supervisor,
    run: usize,
    points: &mut [Point],
) -> Result<(), Failure> {
    println!("\n== run {}/{} ==", run + 1, args.runs);
    println!("{}", report::header_for("pairs/s"));
    for (ci, c) in chosen(&CONCURRENCIES, &args.callers).into_iter().enumerate() {
        for k in 0..Side::ALL.len() {
            let side = Side::ALL[(k + run + ci) % Side::ALL.len()];
            if !args.measures(side) {
                continue;
            }
            let sample = measure_point(args, s, procs, side, c).await?;
            let p = points
                .iter_mut()
                .find(|p| p.side == side && p.concurrency == c)
                .expect("planned");
            p.runs.push(sample);
        }
    }
    Ok(())
}

/// The store leader's `storesvr_entry_commands` histogram: (commands, entries) so far.
fn entry_commands(metrics: &str) -> Option<(f64, f64)> {
    Some((
        procfs::scrape(metrics, "storesvr_entry_commands_sum", None)?,
        procfs::scrape(metrics, "storesvr_entry_commands_count", None)?,
    ))
}

/// One side at `c` callers once the machine is quiet; its row printed (and for the ledger the store
/// leader's entries).
async fn measure_point(
    args: &Args,
    s: &Servers,
    procs: &mut Supervisor,
    side: Side,
    c: usize,
) -> Result<Sample, Failure> {
    let quiet = &args.common.quiet;
    cluster::wait_quiet(&s.ours, quiet.quiet_below, quiet.wait()).await;
    let window = args.common.window.durations();
    let sample = match side {
        Side::Ledger | Side::Issue => {
            let n = cluster::channel_count(c).max(s.targets).min(s.ledger.len());
            let pids = Pids {
                server: s.ledger_pid,
                others: &s.ledger_others,
                ours: &s.ours,
            };
            let before = entry_commands(&s.leader_metrics);
            let (clients, numbers) = (&s.ledger[..n], s.ledger_numbers.clone());
            let sample = if side == Side::Ledger {
                ledgers::pair_load(clients, c, args.ledgers, numbers, window, pids).await
            } else {
                ledgers::issue_load(clients, c, args.ledgers, numbers, window, pids).await
            };
            let after = entry_commands(&s.leader_metrics);
            println!("{}", report::row(side.name(), c, "ledger", &sample));
            if let (Some((cmds0, entries0)), Some((cmds1, entries1))) = (before, after) {
                // Warm-up included: a mean size, and a rate over warm-up and window alike.
                let secs = (window.warmup + window.measure).as_secs_f64();
                let entries = entries1 - entries0;
                println!(
                    "  store leader: {:.0} Raft entries/s, {:.1} commands per entry",
                    entries / secs,
                    (cmds1 - cmds0) / entries.max(1.0)
                );
            }
            sample
        }
        Side::Postgres => {
            let pg = s.pg.as_ref().ok_or_else(|| harness("postgres is not running"))?;
            let sample = postgres::pair_load(
                &pg.conninfo,
                c,
                args.ledgers,
                s.pg_numbers.clone(),
                window,
                pg.pid,
                &s.ours,
            )
            .await
            .map_err(harness)?;
            println!("{}", report::row(side.name(), c, "pg", &sample));
            sample
        }
    };
    setup::check(procs, &format!("{} at {c}", side.name()), &sample)?;
    Ok(sample)
}

/// The caller count the targets are judged at.
const TARGET_CALLERS: usize = 64;

/// Medians per point, the ratios ledger ÷ postgres and the targets.
fn summarize(points: &[Point]) {
    let runs = points.iter().map(|p| p.runs.len()).max().unwrap_or(0);
    println!(
        "\n== summary: medians of {runs} run(s); latency of a pair in µs; server CPU per pair (every server process) =="
    );
    println!(
        "{:<9} {:>4} {:>9} {:>8} {:>8} {:>9} {:>7}",
        "side", "conc", "pairs/s", "p50", "p99", "srv µs/p", "errors"
    );
    for p in points.iter().filter(|p| !p.runs.is_empty()) {
        let st = report::stats(p.runs.iter());
        let cpu = median(p.runs.iter().map(server_cpu_per_pair).collect());
        let errors: u64 = p.runs.iter().map(|s| s.errors + s.not_ok).sum();
        println!(
            "{:<9} {:>4} {:>9.0} {:>8.0} {:>8.0} {:>9.0} {:>7}",
            p.side.name(),
            p.concurrency,
            st.calls_per_sec,
            st.p50_us,
            st.p99_us,
            cpu,
            errors
        );
    }
    let find = |side, c| {
        points
            .iter()
            .find(|p| p.side == side && p.concurrency == c && !p.runs.is_empty())
    };
    // Medians of per-run ratios: runs pair up by index (both sides measured in the same run).
    let ratio = |a: &Point, b: &Point, f: &dyn Fn(&Sample) -> f64| {
        median(a.runs.iter().zip(&b.runs).map(|(x, y)| f(x) / f(y)).collect())
    };
    let mut verdicts = Vec::new();
    for side in [Side::Ledger, Side::Issue] {
        let name = side.name();
        println!("\nratios {name} ÷ postgres (medians of per-run ratios):");
        println!("{:<4} {:>10} {:>10}", "conc", "pairs/s", "p99");
        for c in CONCURRENCIES {
            let (Some(l), Some(pg)) = (find(side, c), find(Side::Postgres, c)) else {
                continue;
            };
            let tput = ratio(l, pg, &Sample::calls_per_sec);
            let p99 = ratio(l, pg, &|s: &Sample| s.quantile_us(0.99));
            println!("{c:<4} {tput:>10.2} {p99:>10.2}");
            // The targets are the issue's point, 64 callers; the other points are printed above
            // for what they show (one caller: a replicated commit against one local WAL flush).
            if c == TARGET_CALLERS {
                verdicts.push((
                    tput >= 2.0,
                    format!("{name} pairs/s >= 2x PostgreSQL's at {c} callers: {tput:.2}"),
                ));
                verdicts.push((
                    p99 <= 1.0,
                    format!("{name} p99 <= PostgreSQL's p99 at {c} callers: {p99:.2}"),
                ));
            }
        }
    }
    report::print_targets(&verdicts);
}

/// CPU of every server process (the first one and the rest) per pair, microseconds.
fn server_cpu_per_pair(s: &Sample) -> f64 {
    (s.server_cpu + s.other_cpu) * 1e6 / s.calls.max(1) as f64
}

/// Both sides' numbers against what their servers say; a mismatch is a harness failure (exit 3).
async fn final_checks(args: &Args, s: &Servers) -> Result<(), Failure> {
    println!("\nfinal checks:");
    let mut failed = Vec::new();
    if args.measures(Side::Ledger) || args.measures(Side::Issue) {
        let said = ledgers::said(&s.ledger[0], args.ledgers).await.map_err(harness)?;
        match ledgers::check("ledger", &s.ledger_numbers.seen(args.ledgers), &said, false) {
            Ok(line) => println!("  {line}"),
            Err(e) => failed.push(e),
        }
    }
    if let Some(pg) = &s.pg {
        let said: Vec<ledgers::Said> = postgres::tally(&pg.conninfo)
            .await
            .map_err(harness)?
            .into_iter()
            .map(|t| ledgers::Said {
                high: t.next,
                // The primary key makes the numbers distinct; count them to be sure.
                confirmed: t.invoices.min(t.distinct),
                held: 0,
            })
            .collect();
        match ledgers::check("postgres", &s.pg_numbers.seen(args.ledgers), &said, true) {
            Ok(line) => println!("  {line}"),
            Err(e) => failed.push(e),
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        for f in &failed {
            println!("  {f}");
        }
        Err(harness(failed.join("\n")))
    }
}
