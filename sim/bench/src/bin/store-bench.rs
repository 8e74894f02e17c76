//! `store-bench`: how fast a 3-replica StoreSvr group commits bumps, next to
//! how fast this machine's disk syncs.
//!
//! One run measures (1) serial `write + fdatasync` on the data dir's disk,
//! then (2) starts a 3-replica group of real `storesvr` processes on loopback
//! and drives committed bumps at concurrency 1, 16 and 64, single-section and
//! batched (10 sections per request), printing throughput and latency and the
//! two targets of the StoreSvr issue as ratios against the fsync baseline.
//!
//! It starts and kills its own processes and stops by itself (bounded by
//! `--seconds` per case).

use clap::Parser;
use hdrhistogram::Histogram;
use seqsvr_bench::cluster::{self, status};
use seqsvr_bench::{args, procfs, report};
use seqsvr_proto::pb;
use seqsvr_proto::pb::store_service_client::StoreServiceClient;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use seqsvr_harness::Supervisor;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tonic::transport::Channel;

#[derive(Parser, Debug)]
#[command(name = "store-bench", version = seqsvr_plumbing::version::LONG)]
struct Args {
    #[command(flatten)]
    config: args::Config,
    /// Seconds per measured case.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Serial fsyncs for the disk baseline.
    #[arg(long, default_value_t = 1_000)]
    fsyncs: usize,
    /// Where replicas keep their data (default: a temp dir on the same disk as the target dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Sections bumped per request in the batched mode.
    #[arg(long, default_value_t = 10)]
    batch: u64,
    /// Concurrency levels to measure (the targets need 1 and 64).
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    concurrency: Vec<u64>,
    /// Keep the data dir and the replicas' logs (path printed at start) instead of deleting them.
    #[arg(long)]
    keep: bool,
}

const SECTIONS: u64 = 100;
/// The StoreSvr defaults: what the targets are stated for.
const SECTION_SIZE: u64 = 100_000;
const STEP: u64 = 10_000;
static NEXT_MAX: AtomicU64 = AtomicU64::new(1_000_000);

fn fsync_baseline(dir: &std::path::Path, n: usize) -> (f64, Duration) {
    let path = dir.join("fsync-probe");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap();
    let buf = vec![0u8; 4096];
    let mut h = Histogram::<u64>::new(3).unwrap();
    let start = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        f.write_all(&buf).unwrap();
        f.sync_data().unwrap();
        h.record(t.elapsed().as_nanos() as u64).unwrap();
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(path);
    (rate, Duration::from_nanos(h.value_at_quantile(0.5)))
}

struct CaseResult {
    items_per_sec: f64,
    reqs_per_sec: f64,
    p50: Duration,
    p99: Duration,
}

async fn run_case(
    client: StoreServiceClient<Channel>,
    incarnation: u64,
    epochs: Arc<Vec<u64>>,
    concurrency: u64,
    batch: u64,
    seconds: u64,
) -> CaseResult {
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..concurrency {
        let mut client = client.clone();
        let stop = stop.clone();
        let epochs = epochs.clone();
        tasks.push(tokio::spawn(async move {
            let mut h = Histogram::<u64>::new(3).unwrap();
            let mut reqs = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // Ever-growing ceilings, so nearly every item is applied rather than a no-op.
                let next = NEXT_MAX.fetch_add(1, Ordering::Relaxed);
                let items = (0..batch)
                    .map(|k| {
                        let section = (t * batch + k) % SECTIONS;
                        pb::BumpItem {
                            section,
                            epoch: epochs[section as usize],
                            new_max: next,
                        }
                    })
                    .collect();
                let t0 = Instant::now();
                let r = client
                    .bump(pb::BumpRequest {
                        incarnation,
                        items,
                        secret: Vec::new(),
                    })
                    .await;
                match r {
                    Ok(r) if r.get_ref().not_leader.is_none() => {
                        h.record(t0.elapsed().as_nanos() as u64).unwrap();
                        reqs += 1;
                    }
                    other => panic!("bump failed: {other:?}"),
                }
            }
            (h, reqs)
        }));
    }
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut h = Histogram::<u64>::new(3).unwrap();
    let mut reqs = 0;
    for t in tasks {
        let (th, r) = t.await.unwrap();
        h.add(th).unwrap();
        reqs += r;
    }
    let secs = start.elapsed().as_secs_f64();
    CaseResult {
        items_per_sec: (reqs * batch) as f64 / secs,
        reqs_per_sec: reqs as f64 / secs,
        p50: Duration::from_nanos(h.value_at_quantile(0.5)),
        p99: Duration::from_nanos(h.value_at_quantile(0.99)),
    }
}

fn fmt_d(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

/// The running group, with the benchmark registered as the owner of every section.
struct Group {
    /// Kills the replicas when dropped.
    _procs: Supervisor,
    leader: String,
    client: StoreServiceClient<Channel>,
    incarnation: u64,
    epochs: Arc<Vec<u64>>,
}

/// Starts a 3-replica group of `storesvr` (data and logs in `dir`) and registers the owner.
async fn start_group(storesvr: &Path, dir: &Path) -> Result<Group, String> {
    let mut procs = Supervisor::new(dir).map_err(|e| format!("cannot start the group: {e}"))?;
    // The owner below is the benchmark, which renews rarely: detection must not take its sections.
    let extra = [
        format!("--uid-limit={}", SECTIONS * SECTION_SIZE),
        "--detect-ms=600000".into(),
    ];
    let stores = cluster::start_stores_with(&mut procs, storesvr, dir, STEP, SECTION_SIZE, &extra)
        .await
        .map_err(|e| format!("cannot start the group: {e}; logs in {}", dir.display()))?;
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", stores.leader))
        .map_err(|e| e.to_string())?
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| format!("cannot connect to the leader: {e}"))?;
    let mut client = StoreServiceClient::new(ch)
        .max_decoding_message_size(seqsvr_proto::limits::STORE_MESSAGE_BYTES)
        .max_encoding_message_size(seqsvr_proto::limits::STORE_MESSAGE_BYTES);
    let (incarnation, epochs) = register_owner(&mut client)
        .await
        .map_err(|e| format!("cannot register an owner: {e}"))?;
    Ok(Group {
        _procs: procs,
        leader: stores.leader,
        client,
        incarnation,
        epochs,
    })
}

/// Registers one owner and waits until it is granted every section; its incarnation and epochs.
async fn register_owner(client: &mut StoreServiceClient<Channel>) -> Result<(u64, Arc<Vec<u64>>), tonic::Status> {
    let req = pb::RegisterRequest {
        secret: Vec::new(),
        node_id: 1,
        addr: "127.0.0.1:9".into(),
        nonce: 0,
    };
    let incarnation = client.register(req).await?.into_inner().incarnation;
    loop {
        let renew = pb::RenewRequest {
            secret: Vec::new(),
            incarnation,
            route_version: 0,
            map_version: u64::MAX,
            id_slots_wanted: 0,
            version: String::new(),
        };
        let r = client.renew(renew).await?.into_inner();
        let mut epochs = vec![0u64; SECTIONS as usize];
        let mut covered = 0;
        for g in &r.grants {
            for s in g.section_begin..g.section_end {
                epochs[s as usize] = g.epoch;
                covered += 1;
            }
        }
        if covered == SECTIONS {
            return Ok((incarnation, Arc::new(epochs)));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs every case (concurrency × single/batched) and prints a row for each.
async fn run_cases(args: &Args, group: &Group) -> Vec<(u64, &'static str, CaseResult)> {
    println!(
        "\n{:>5} {:>8} {:>14} {:>12} {:>10} {:>10} {:>10} {:>12}",
        "conc", "mode", "bumps/s", "requests/s", "p50", "p99", "entries/s", "reqs/entry"
    );
    let mut results = Vec::new();
    for &c in &args.concurrency {
        for (mode, batch) in [("single", 1), ("batched", args.batch)] {
            let log_before = status(&group.leader).await.map_or(0, |s| s.last_log_index);
            let started = Instant::now();
            let (client, epochs) = (group.client.clone(), group.epochs.clone());
            let r = run_case(client, group.incarnation, epochs, c, batch, args.seconds).await;
            let entries = status(&group.leader)
                .await
                .map_or(0, |s| s.last_log_index)
                .saturating_sub(log_before);
            let entries_per_sec = entries as f64 / started.elapsed().as_secs_f64();
            println!(
                "{:>5} {:>8} {:>14.0} {:>12.0} {:>10} {:>10} {:>10.0} {:>12.1}",
                c,
                mode,
                r.items_per_sec,
                r.reqs_per_sec,
                fmt_d(r.p50),
                fmt_d(r.p99),
                entries_per_sec,
                r.reqs_per_sec / entries_per_sec.max(1e-9)
            );
            results.push((c, mode, r));
        }
    }
    results
}

/// Prints the verdict of each target; true when all are met.
fn print_targets(results: &[(u64, &'static str, CaseResult)], fsync_rate: f64, fsync_p50: Duration) -> bool {
    let single = |conc| {
        results
            .iter()
            .find(|(c, m, _)| *c == conc && *m == "single")
            .map(|r| &r.2)
    };
    println!("\ntargets:");
    let mut met = true;
    if let Some(c64) = single(64) {
        let ratio = c64.items_per_sec / fsync_rate;
        met &= ratio > 1.0;
        println!(
            "  c=64 committed bumps/s / serial fsyncs/s = {ratio:.2}x (target > 1x): {}",
            report::verdict(ratio > 1.0)
        );
    }
    if let Some(c1) = single(1) {
        let ratio = c1.p50.as_secs_f64() / fsync_p50.as_secs_f64();
        met &= ratio <= 4.0;
        println!(
            "  c=1 p50 bump latency / fsync p50 = {ratio:.2}x (target <= 4x): {}",
            report::verdict(ratio <= 4.0)
        );
    }
    met
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Args = seqsvr_plumbing::cli::parse("STORE_BENCH");
    let exe_dir = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let storesvr = exe_dir.join("storesvr");
    if !storesvr.exists() {
        eprintln!(
            "store-bench: {} not found; build it first (cargo build --release -p storesvr)",
            storesvr.display()
        );
        return ExitCode::from(2);
    }
    let tmp = match &args.dir {
        Some(d) => tempfile::tempdir_in(d),
        None => tempfile::tempdir_in(exe_dir.parent().unwrap()),
    }
    .unwrap();
    let tmp_path = tmp.path().to_path_buf();
    let _tmp = if args.keep {
        let _ = tmp.keep();
        None
    } else {
        Some(tmp)
    };
    println!("machine: {}; data dir {}", procfs::machine(), tmp_path.display());
    let (fsync_rate, fsync_p50) = fsync_baseline(&tmp_path, args.fsyncs);
    println!(
        "disk: {:.0} serial fsyncs/s, p50 {} (write 4 KiB + fdatasync, n={})",
        fsync_rate,
        fmt_d(fsync_p50),
        args.fsyncs
    );
    let group = match start_group(&storesvr, &tmp_path).await {
        Ok(g) => g,
        Err(e) => {
            eprintln!("store-bench: {e}");
            return ExitCode::from(3);
        }
    };
    let results = run_cases(&args, &group).await;
    let met = print_targets(&results, fsync_rate, fsync_p50);
    drop(group);
    if met { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
