//! Instructions per call, the AllocSvr against the echo, for `sim/bench/callgrind-calls.sh`.
//!
//! Throughput ratios on this two-core machine move by ±0.1 from run to run, more than most
//! single changes to the serving path; callgrind counts the instructions a server executes, which
//! for the same binaries and calls are the same whatever else the machine is doing. The script
//! starts the servers under `valgrind --tool=callgrind`; this program drives them: for each case
//! and server, a warm-up, then `callgrind_control --zero`, `--calls` calls one after another, and
//! `callgrind_control --dump=SERVER-CASE`. The script reads the dumps.
//!
//! The `resp16` case is the Redis protocol front end against Redis itself (when `redis-server` is
//! on PATH; the script runs it under callgrind too): one "call" is a pipeline of 16 `INCR`s of
//! random keys, as `redis-benchmark -P 16 -r 1000000` sends them.
//!
//! Deliberately left out: concurrency (one caller: the count is per call either way, and a
//! server under valgrind is too slow for a load to mean anything) and timing.
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use seqsvr_bench::callgrind::control;
use seqsvr_bench::cluster;
use seqsvr_bench::peers::{self, PeerKind};
use seqsvr_proto::pb;
use seqsvr_proto::pb::alloc_service_client::AllocServiceClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::transport::Channel;

/// Uids per section, as in alloc-bench and ids-bench.
const SECTION_SIZE: u64 = 100_000;
/// Sections the uid cases spread over, as alloc-bench's spread cases do.
const SECTIONS: u64 = 64;

#[derive(Parser)]
struct Args {
    /// Calls counted per case and server.
    #[arg(long, default_value_t = 2_000)]
    calls: u32,
    /// Calls before counting starts.
    #[arg(long, default_value_t = 300)]
    warmup: u32,
    /// Keys in each call of the `keys` case (1..=1000).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=1000))]
    keys: u64,
    /// Where the StoreSvrs keep their data and the servers their logs.
    #[arg(long)]
    dir: std::path::PathBuf,
}

#[derive(Clone, Copy)]
enum Case {
    NextIds,
    Unary,
    Batch100,
    /// A `CounterBatch` of `--keys` keys (30 by default: the size the Coalescer's batches reach
    /// at 64 callers).
    Keys,
}

/// `INCR`s in each pipeline of the `resp16` case.
const PIPELINE: usize = 16;

/// One pipeline of [`PIPELINE`] `INCR`s of random keys (`key:` and 12 digits below 1,000,000,
/// `redis-benchmark -r`'s names) on `conn`; fails unless every reply is an integer.
async fn incr_pipeline(conn: &mut TcpStream, rng: &mut u64, buf: &mut Vec<u8>) -> Result<(), String> {
    buf.clear();
    for _ in 0..PIPELINE {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        let key = format!("key:{:012}", (*rng >> 11) % 1_000_000);
        buf.extend_from_slice(format!("*2\r\n$4\r\nINCR\r\n${}\r\n{key}\r\n", key.len()).as_bytes());
    }
    conn.write_all(buf).await.map_err(|e| format!("resp write: {e}"))?;
    buf.clear();
    let mut chunk = [0u8; 4096];
    while buf.iter().filter(|&&b| b == b'\n').count() < PIPELINE {
        let n = conn.read(&mut chunk).await.map_err(|e| format!("resp read: {e}"))?;
        if n == 0 {
            return Err("resp: the server closed the connection".into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    match buf.split(|&b| b == b'\n').find(|l| !l.is_empty() && l[0] != b':') {
        Some(line) => Err(format!("resp: not an integer reply: {}", String::from_utf8_lossy(line))),
        None => Ok(()),
    }
}

/// Distinct counter keys the `keys` case picks from (`ctr:0..KEY_SPACE`, counter-bench's names
/// and number).
const KEY_SPACE: u64 = 10_000;

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::NextIds => "next-ids",
            Case::Unary => "unary",
            Case::Batch100 => "batch100",
            Case::Keys => "keys",
        }
    }

    async fn call(
        self,
        c: &mut AllocServiceClient<Channel>,
        rng: &mut u64,
        route_version: u64,
        keys: u64,
    ) -> Result<(), String> {
        let mut uid = || {
            *rng ^= *rng << 13;
            *rng ^= *rng >> 7;
            *rng ^= *rng << 17;
            (*rng >> 11) % (SECTIONS * SECTION_SIZE)
        };
        let r = match self {
            Case::NextIds => c.next_ids(pb::NextIdsRequest { count: 1 }).await.map(drop),
            Case::Unary => {
                let req = pb::FetchNextSeqRequest {
                    uid: uid(),
                    route_version,
                };
                c.fetch_next_seq(req).await.map(drop)
            }
            Case::Batch100 => {
                let req = pb::BatchFetchNextSeqRequest {
                    uids: (0..100).map(|_| uid()).collect(),
                    route_version,
                };
                c.batch_fetch_next_seq(req).await.map(drop)
            }
            Case::Keys => {
                let req = pb::CounterBatchRequest {
                    keys: (0..keys)
                        .map(|_| format!("ctr:{}", uid() % KEY_SPACE).into_bytes())
                        .collect(),
                    route_version,
                };
                c.counter_batch(req).await.map(drop)
            }
        };
        r.map_err(|e| format!("{}: {e}", self.name()))
    }
}

async fn run(args: Args) -> Result<(), String> {
    let bins = cluster::binaries()?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    // The echo is ids-bench's (`--serve-echo`); beside this binary, the script's wrapper.
    let echo_bin = exe.parent().ok_or("no parent dir")?.join("ids-bench");
    let mut procs = seqsvr_harness::Supervisor::new(&args.dir.join("logs")).map_err(|e| e.to_string())?;
    let (echo_addr, echo_pid) = seqsvr_bench::echo::start(&mut procs, &echo_bin).await?;
    // Keys land in the uid cases' sections (warmed below), so no counted call waits for a first
    // bump of a section.
    let flags = [
        "--id-layout=twitter".to_string(),
        format!("--uid-limit={}", SECTIONS * SECTION_SIZE),
    ];
    let stores =
        cluster::start_stores_with(&mut procs, &bins.storesvr, &args.dir, 10_000, SECTION_SIZE, &flags).await?;
    let resp_addr = seqsvr_harness::free_addr();
    let resp_flag = [format!("--resp-listen={resp_addr}")];
    let node = cluster::start_allocsvr_with(&mut procs, &bins.allocsvr, 1, &stores, &resp_flag)?;
    if !seqsvr_harness::wait_listening(&node.addr, Duration::from_secs(60)).await {
        return Err("the allocsvr did not listen within 60 s".into());
    }
    let alloc = cluster::channels(&node.addr, 1).await?.remove(0);
    seqsvr_bench::ids::wait_issuing(&stores.leader, &alloc, Duration::from_secs(120)).await?;
    let probe: Vec<u64> = (0..SECTIONS).map(|s| s * SECTION_SIZE).collect();
    let version = cluster::wait_serving(&alloc, &probe, Duration::from_secs(120)).await?;
    let echo = cluster::channels(&echo_addr, 1).await?.remove(0);
    for case in [Case::NextIds, Case::Unary, Case::Batch100, Case::Keys] {
        for (server, client, pid) in [("echo", &echo, echo_pid), ("alloc", &alloc, node.pid)] {
            let mut c = client.clone();
            let mut rng = 0x9e37_79b9_7f4a_7c15;
            for _ in 0..args.warmup {
                case.call(&mut c, &mut rng, version, args.keys).await?;
            }
            control(pid, "--zero")?;
            for _ in 0..args.calls {
                case.call(&mut c, &mut rng, version, args.keys).await?;
            }
            control(pid, &format!("--dump={server}-{}", case.name()))?;
            println!("{server} {}: {} calls counted", case.name(), args.calls);
        }
    }
    let redis = peers::start(&mut procs, &args.dir, PeerKind::Redis).await?;
    let mut resp_servers = Vec::new();
    match &redis {
        Some(r) => resp_servers.push(("echo", r.addr.clone(), r.pid)),
        None => println!("resp16: redis-server is not on PATH; only the AllocSvr is counted"),
    }
    resp_servers.push(("alloc", resp_addr, node.pid));
    for (server, addr, pid) in resp_servers {
        let mut conn = TcpStream::connect(&addr).await.map_err(|e| format!("{addr}: {e}"))?;
        conn.set_nodelay(true).map_err(|e| e.to_string())?;
        let (mut rng, mut buf) = (0x9e37_79b9_7f4a_7c15, Vec::new());
        for _ in 0..args.warmup {
            incr_pipeline(&mut conn, &mut rng, &mut buf).await?;
        }
        control(pid, "--zero")?;
        for _ in 0..args.calls {
            incr_pipeline(&mut conn, &mut rng, &mut buf).await?;
        }
        control(pid, &format!("--dump={server}-resp16"))?;
        println!("{server} resp16: {} pipelines of {PIPELINE} counted", args.calls);
    }
    cluster::check_alive(&mut procs)
}

fn main() -> ExitCode {
    seqsvr_bench::callgrind::main("call_cost", run(Args::parse()))
}
