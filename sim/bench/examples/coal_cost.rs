//! Instructions per value on the *caller's* side of the Coalescer, for
//! `sim/bench/callgrind-coalescer.sh`: `counter-bench`'s coalesced case spends more CPU in the
//! benchmark process (the client library) than in the AllocSvr, and that share does not show in
//! a server's profile. Run under `valgrind --tool=callgrind` (the servers it starts run natively):
//! `--callers` tasks call `Coalescer::counter_next` (or `fetch_next_seq` with `--uids`) on random
//! keys in a closed loop; after a warm-up this process zeroes its own counters
//! (`callgrind_control --zero`), makes `--values` calls in all, and dumps them.
//!
//! Deliberately left out: timing and throughput (under valgrind they mean nothing), and the load
//! driver's histogram and timeout, which `counter-bench` has and a caller of the library does not.
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::Parser;
use seqsvr_bench::callgrind::control;
use seqsvr_bench::{cluster, counters};
use seqsvr_client::{Client, ClientConfig, Coalescer, CoalescerConfig};

/// As in counter-bench.
const SECTION_SIZE: u64 = 1_000;
const UID_LIMIT: u64 = 1 << 24;
const STEP: u64 = 10_000;

#[derive(Parser)]
struct Args {
    /// Concurrent callers.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1024))]
    callers: u64,
    /// Values counted, over all callers.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..))]
    values: u64,
    /// Distinct keys (`ctr:0..KEYS`, counter-bench's names and default number).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    keys: u64,
    /// Uids (each key's position) through `fetch_next_seq` instead of keys.
    #[arg(long)]
    uids: bool,
    /// Where the StoreSvrs keep their data and the servers their logs.
    #[arg(long)]
    dir: std::path::PathBuf,
}

/// `total` values by `callers` tasks in a closed loop; fails on the first error.
async fn load(coalescer: &Arc<Coalescer>, args: &Args, total: u64) -> Result<(), String> {
    let left = Arc::new(AtomicU64::new(total));
    let mut tasks = Vec::new();
    for t in 0..args.callers {
        let (coalescer, left, keys, uids) = (coalescer.clone(), left.clone(), args.keys, args.uids);
        tasks.push(tokio::spawn(async move {
            let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ ((t + 1) << 17);
            while left
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
            {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let key = counters::key_name("ctr", (rng >> 11) % keys);
                let r = if uids {
                    let uid = seqsvr_proto::keys::position(&key, UID_LIMIT);
                    coalescer.fetch_next_seq(uid).await.map(drop)
                } else {
                    coalescer.counter_next(&key).await.map(drop)
                };
                r.map_err(|e| format!("{key}: {e}"))?;
            }
            Ok::<(), String>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| format!("caller task: {e}"))??;
    }
    Ok(())
}

async fn run(args: Args) -> Result<(), String> {
    let bins = cluster::binaries()?;
    let mut procs = seqsvr_harness::Supervisor::new(&args.dir.join("logs")).map_err(|e| e.to_string())?;
    let extra = [format!("--uid-limit={UID_LIMIT}")];
    let stores = cluster::start_stores_with(&mut procs, &bins.storesvr, &args.dir, STEP, SECTION_SIZE, &extra).await?;
    let node = cluster::start_allocsvr(&mut procs, &bins.allocsvr, 1, &stores)?;
    if !seqsvr_harness::wait_listening(&node.addr, Duration::from_secs(60)).await {
        return Err("the allocsvr did not listen within 60 s".into());
    }
    let alloc = cluster::channels(&node.addr, 1).await?;
    // Every key (and its section) served once before anything is counted, as in counter-bench.
    let touched = seqsvr_harness::poll_until(Duration::from_secs(120), || async {
        counters::touch_keys(&alloc, "ctr", args.keys).await.ok()
    })
    .await;
    touched.ok_or("the keys were not all served within 120 s")?;
    let client = Client::connect(ClientConfig::new([node.addr.clone()]))
        .await
        .map_err(|e| format!("client: {e}"))?;
    let coalescer = Arc::new(Coalescer::new(client, CoalescerConfig::default()).map_err(|e| e.to_string())?);
    load(&coalescer, &args, args.values / 5).await?;
    let before = coalescer.stats();
    control(std::process::id(), "--zero")?;
    load(&coalescer, &args, args.values).await?;
    control(std::process::id(), "--dump=client-coalesced")?;
    let after = coalescer.stats();
    let batches = after.batches - before.batches;
    println!(
        "{} values by {} callers in {batches} batches ({:.1} a batch)",
        args.values,
        args.callers,
        (after.callers - before.callers) as f64 / batches.max(1) as f64
    );
    cluster::check_alive(&mut procs)
}

fn main() -> ExitCode {
    seqsvr_bench::callgrind::main("coal_cost", run(Args::parse()))
}
