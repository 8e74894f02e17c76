//! `cluster-bench`: three AllocSvrs serving the Redis Cluster protocol against a three-master
//! Redis Cluster, both driven by `redis-benchmark --cluster`, in one run.
//!
//! 1. Starts 3 `storesvr` (section size 1,000, uid limit 2^24, `--key-placement slots`) and 3
//!    `allocsvr` with `--resp-cluster-listen`, waits until each owns a third of the sections and
//!    every cluster port names all three in `CLUSTER NODES`, then warms every slot's section with
//!    an untimed `redis-benchmark --cluster` pass (a section's memory is made at its first call).
//! 2. Starts 3 `redis-server --cluster-enabled yes` (no persistence) and joins them with
//!    `redis-cli --cluster create --cluster-replicas 0`.
//! 3. `redis-benchmark --cluster -t incr -r 1000000` (random keys over every slot) against each at
//!    `-c 50/256` × `-P 1/16`, `--runs` times; the points rotate run to run and which of a pair goes
//!    first alternates.
//!
//! Prints medians, the ratio against the target (ours ≥ 1.0× Redis Cluster at every point), where
//! each run's CPU went (the three servers' CPU time per `INCR`, from `/proc/PID/stat`, and
//! `redis-benchmark`'s CPU over its wall time, from this process's ended children: a single-threaded
//! tool near 1.0 CPU is what limits both systems' rates), and the
//! calls the AllocSvrs forwarded to each other meanwhile (`allocsvr_front_rpcs_total{to=
//! "forwarded"}`: 0 when every key reached its owner). Targets are printed, not asserted: exit 0
//! when measuring worked, 2 a missing tool or binary, 3 a harness failure. Every process is
//! started through the harness's `Supervisor` and killed by pid at the end; everything listens on
//! 127.0.0.1; every load run ends by itself (a count of requests, and a time limit).
//!
//! Deliberately left out: replicas (seqsvr has none to read from), TLS, and the plain port's
//! forwarding (`front-bench` times the hop).

use std::future::Future;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use seqsvr_bench::exit::{Failure, harness};
use seqsvr_bench::redis_benchmark::incr_point;
use seqsvr_bench::report::median;
use seqsvr_bench::{cluster, peers, procfs, setup};
use seqsvr_harness::{ProcSpec, Supervisor};

const SECTION_SIZE: u64 = 1_000;
const UID_LIMIT: u64 = 1 << 24;
const STEP: u64 = 100_000;
const NODES: u64 = 3;
const CONNECTIONS: [usize; 2] = [50, 256];
const PIPELINES: [usize; 2] = [1, 16];

#[derive(Debug, Parser)]
#[command(
    name = "cluster-bench",
    version = seqsvr_plumbing::version::LONG,
    about = "AllocSvrs in Redis Cluster mode against a Redis Cluster, with redis-benchmark --cluster"
)]
struct Args {
    /// Runs of every point; medians are reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
}

fn main() -> ExitCode {
    seqsvr_bench::exit::run("cluster-bench", bench(Args::parse()))
}

/// Throughput and median latency of one load run, and where its CPU went.
#[derive(Debug, Clone, Copy)]
struct Point {
    rps: f64,
    p50_ms: f64,
    /// CPU time of the measured system's three servers, in µs per `INCR`.
    server_us: f64,
    /// `redis-benchmark`'s CPU time over its wall time: near 1.0 it is the bottleneck (its
    /// event loop is one thread), and the two systems' rates are its rate, not theirs.
    bench_cpus: f64,
}

/// One system under load: the address `redis-benchmark` is seeded with, and its servers' pids.
#[derive(Debug, Clone)]
struct System {
    seed: String,
    pids: Vec<u32>,
}

async fn bench(args: Args) -> Result<bool, Failure> {
    if args.runs == 0 {
        return Err(Failure::Usage("--runs must be at least 1".into()));
    }
    for tool in ["redis-benchmark", "redis-server", "redis-cli"] {
        if peers::on_path(tool).is_none() {
            return Err(Failure::Usage(format!(
                "{tool} is not installed (Debian: apt install redis-server redis-tools)"
            )));
        }
    }
    let bins = cluster::binaries().map_err(Failure::Usage)?;
    let dir = tempfile::tempdir().map_err(|e| harness(format!("temp dir: {e}")))?;
    let mut procs = setup::supervisor(dir.path())?;
    let out = run(&args, &bins, dir.path(), &mut procs).await;
    procs.kill_all();
    out
}

async fn run(args: &Args, bins: &cluster::Binaries, dir: &Path, procs: &mut Supervisor) -> Result<bool, Failure> {
    let (nodes, ours) = start_ours(bins, dir, procs).await?;
    let redis = start_redis_cluster(dir, procs).await?;
    println!(
        "cluster-bench: {}, {}; 3 AllocSvrs (--resp-cluster-listen) against 3 Redis Cluster masters; {} runs",
        procfs::machine(),
        redis_version(),
        args.runs
    );
    let forwarded_before = forwarded(&nodes).await?;
    let mut points: Vec<(usize, usize)> = CONNECTIONS.iter().flat_map(|&c| PIPELINES.map(|p| (c, p))).collect();
    let mut samples: Vec<(Vec<Point>, Vec<Point>)> = vec![(Vec::new(), Vec::new()); points.len()];
    for run in 0..args.runs {
        let n = points.len();
        points.rotate_left(run % n);
        for &(c, p) in &points {
            let i = index(c, p);
            let bench = |sys: System| async move { redis_benchmark(&sys, c, p).await };
            let (r, o) = in_turn(run, &redis, &ours, bench).await?;
            samples[i].0.push(r);
            samples[i].1.push(o);
        }
        cluster::check_alive(procs).map_err(harness)?;
    }
    let hops = forwarded(&nodes).await? - forwarded_before;
    let met = print_table(args, &samples);
    println!(
        "\ncalls forwarded between the AllocSvrs during the measured runs: {hops} (0: every key reached its owner)"
    );
    println!(
        "\ncluster-bench: {}",
        if met {
            "every target met"
        } else {
            "a target is NOT MET (see above)"
        }
    );
    Ok(true)
}

fn index(c: usize, p: usize) -> usize {
    CONNECTIONS.iter().position(|&x| x == c).unwrap_or(0) * PIPELINES.len()
        + PIPELINES.iter().position(|&x| x == p).unwrap_or(0)
}

/// The StoreSvrs placing keys by slot and three AllocSvrs with a cluster port, balanced, warmed:
/// the AllocSvrs and one cluster port to seed `redis-benchmark` with.
async fn start_ours(
    bins: &cluster::Binaries,
    dir: &Path,
    procs: &mut Supervisor,
) -> Result<(Vec<cluster::AllocNode>, System), Failure> {
    let extra = vec![format!("--uid-limit={UID_LIMIT}"), "--key-placement=slots".to_string()];
    let stores = cluster::start_stores_with(procs, &bins.storesvr, dir, STEP, SECTION_SIZE, &extra)
        .await
        .map_err(harness)?;
    let mut nodes = Vec::new();
    let mut ports = Vec::new();
    for id in 1..=NODES {
        let port = seqsvr_harness::free_addr();
        let flags = [format!("--resp-cluster-listen={port}")];
        nodes.push(cluster::start_allocsvr_with(procs, &bins.allocsvr, id, &stores, &flags).map_err(harness)?);
        ports.push(port);
    }
    cluster::wait_balanced(&stores.leader, NODES as usize, Duration::from_secs(60))
        .await
        .map_err(harness)?;
    for port in &ports {
        let named = seqsvr_harness::poll_until(Duration::from_secs(30), || async {
            let nodes = redis_cli(port, &["CLUSTER", "NODES"]).await?;
            (nodes.lines().count() == NODES as usize).then_some(())
        })
        .await;
        named.ok_or_else(|| harness(format!("{port} did not name the 3 AllocSvrs in CLUSTER NODES")))?;
    }
    // Untimed: every slot's section gets its first calls (its memory is made then).
    redis_benchmark_n(&ports[0], 50, 16, 400_000).await?;
    let pids = nodes.iter().map(|n| n.pid).collect();
    Ok((
        nodes,
        System {
            seed: ports.swap_remove(0),
            pids,
        },
    ))
}

/// Three `redis-server --cluster-enabled yes` joined into one cluster of three masters.
async fn start_redis_cluster(dir: &Path, procs: &mut Supervisor) -> Result<System, Failure> {
    let bin = peers::on_path("redis-server").ok_or_else(|| Failure::Usage("redis-server is not installed".into()))?;
    let (mut addrs, mut pids) = (Vec::new(), Vec::new());
    for i in 1..=NODES {
        let addr = seqsvr_harness::free_addr();
        let (_, port) = addr
            .rsplit_once(':')
            .ok_or_else(|| harness(format!("bad address {addr}")))?;
        let data = dir.join(format!("redis{i}"));
        std::fs::create_dir_all(&data).map_err(|e| harness(format!("cannot create {}: {e}", data.display())))?;
        let args: Vec<String> = [
            "--bind",
            "127.0.0.1",
            "--port",
            port,
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
        ]
        .into_iter()
        .map(String::from)
        .collect();
        let spec = ProcSpec {
            cwd: Some(data),
            ..ProcSpec::new(format!("redis{i}"), &bin, args)
        };
        let pid = procs
            .spawn(spec)
            .map_err(|e| harness(format!("cannot start redis-server: {e}")))?;
        pids.push(pid);
        let up =
            seqsvr_harness::poll_until(Duration::from_secs(10), || async { redis_cli(&addr, &["PING"]).await }).await;
        up.ok_or_else(|| harness(format!("redis-server at {addr} did not answer PING")))?;
        addrs.push(addr);
    }
    join_redis_cluster(&addrs).await?;
    Ok(System {
        seed: addrs.swap_remove(0),
        pids,
    })
}

/// Joins the `redis-server`s at `addrs` into one cluster of masters and waits until each says so.
async fn join_redis_cluster(addrs: &[String]) -> Result<(), Failure> {
    let mut create = vec!["--cluster", "create"];
    create.extend(addrs.iter().map(String::as_str));
    create.extend(["--cluster-replicas", "0", "--cluster-yes"]);
    let out = tokio::process::Command::new("redis-cli")
        .args(&create)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .map_err(|_| harness("redis-cli --cluster create ran over 60 s"))?
        .map_err(|e| harness(format!("redis-cli: {e}")))?;
    if !out.status.success() {
        return Err(harness(format!(
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        )));
    }
    for addr in addrs {
        let ok = seqsvr_harness::poll_until(Duration::from_secs(30), || async {
            let info = redis_cli(addr, &["CLUSTER", "INFO"]).await?;
            info.contains("cluster_state:ok").then_some(())
        })
        .await;
        ok.ok_or_else(|| harness(format!("the Redis Cluster at {addr} did not reach cluster_state:ok")))?;
    }
    Ok(())
}

/// `redis-cli -h H -p P ARGS...`'s output, when it ran.
async fn redis_cli(addr: &str, args: &[&str]) -> Option<String> {
    let (host, port) = addr.rsplit_once(':')?;
    let out = tokio::process::Command::new("redis-cli")
        .args(["-h", host, "-p", port])
        .args(args)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(5), out).await.ok()?.ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn redis_version() -> String {
    std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "redis-server (version unknown)".into())
}

/// `redis-benchmark --cluster -t incr` against `sys`, with the CPU its servers and the tool used.
async fn redis_benchmark(sys: &System, c: usize, p: usize) -> Result<Point, Failure> {
    let n = if p == 1 { 200_000 } else { 800_000 };
    let cpu = procfs::CpuSince::start(&sys.pids).map_err(harness)?;
    let point = redis_benchmark_n(&sys.seed, c, p, n).await?;
    let used = cpu.end().map_err(harness)?;
    Ok(Point {
        server_us: used.pids.iter().sum::<f64>() * 1e6 / n as f64,
        bench_cpus: used.children / used.wall,
        ..point
    })
}

async fn redis_benchmark_n(addr: &str, c: usize, p: usize, n: usize) -> Result<Point, Failure> {
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| harness(format!("bad address {addr}")))?;
    let out = tokio::process::Command::new("redis-benchmark")
        .args([
            "--cluster",
            "-h",
            host,
            "-p",
            port,
            "-t",
            "incr",
            "-r",
            "1000000",
            "--csv",
        ])
        .args(["-n", &n.to_string(), "-c", &c.to_string(), "-P", &p.to_string()])
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(180), out)
        .await
        .map_err(|_| harness("redis-benchmark ran over 180 s"))?
        .map_err(|e| harness(format!("redis-benchmark: {e}")))?;
    let p =
        incr_point(&String::from_utf8_lossy(&out.stdout)).map_err(|e| harness(format!("--cluster at {addr}: {e}")))?;
    Ok(Point {
        rps: p.rps,
        p50_ms: p.p50_ms,
        server_us: 0.0,
        bench_cpus: 0.0,
    })
}

/// `measure` of `a` and of `b`, `a` first in even runs and `b` first in odd ones. `(a's, b's)`.
async fn in_turn<F, Fut>(run: usize, a: &System, b: &System, measure: F) -> Result<(Point, Point), Failure>
where
    F: Fn(System) -> Fut,
    Fut: Future<Output = Result<Point, Failure>>,
{
    if run.is_multiple_of(2) {
        let first = measure(a.clone()).await?;
        Ok((first, measure(b.clone()).await?))
    } else {
        let first = measure(b.clone()).await?;
        Ok((measure(a.clone()).await?, first))
    }
}

/// Calls the AllocSvrs forwarded so far, from their metrics pages.
async fn forwarded(nodes: &[cluster::AllocNode]) -> Result<f64, Failure> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut sum = 0.0;
    for n in nodes {
        let mut s = tokio::net::TcpStream::connect(&n.metrics)
            .await
            .map_err(|e| harness(format!("metrics of {}: {e}", n.addr)))?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .map_err(|e| harness(e.to_string()))?;
        let mut body = String::new();
        s.read_to_string(&mut body).await.map_err(|e| harness(e.to_string()))?;
        sum += body
            .lines()
            .filter(|l| l.starts_with("allocsvr_front_rpcs_total") && l.contains("to=\"forwarded\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
    }
    Ok(sum)
}

/// The table; whether every point meets the target.
fn print_table(args: &Args, samples: &[(Vec<Point>, Vec<Point>)]) -> bool {
    println!(
        "\nINCR, random keys (redis-benchmark --cluster -t incr -r 1000000), medians of {} runs",
        args.runs
    );
    println!(
        "{:>5} {:>3} {:>14} {:>12} {:>7} {:>10} {:>10} {:>12} {:>12}  target ≥ 1.0×",
        "conns", "-P", "RedisCluster/s", "seqsvr/s", "ratio", "Redis p50", "ours p50", "CPU µs R/us", "bench CPUs"
    );
    let mut all_met = true;
    for c in CONNECTIONS {
        for p in PIPELINES {
            let (redis, ours) = &samples[index(c, p)];
            let med = |v: &[Point], f: fn(&Point) -> f64| median(v.iter().map(f).collect());
            let (r, o) = (med(redis, |x| x.rps), med(ours, |x| x.rps));
            let ratio = o / r;
            let met = ratio >= 1.0;
            all_met &= met;
            println!(
                "{c:>5} {p:>3} {r:>14.0} {o:>12.0} {ratio:>7.2} {:>9.3}ms {:>9.3}ms {:>5.2}/{:<6.2} {:>5.2}/{:<6.2}  {}",
                med(redis, |x| x.p50_ms),
                med(ours, |x| x.p50_ms),
                med(redis, |x| x.server_us),
                med(ours, |x| x.server_us),
                med(redis, |x| x.bench_cpus),
                med(ours, |x| x.bench_cpus),
                if met { "met" } else { "NOT MET" }
            );
        }
    }
    println!(
        "CPU µs R/us: the three servers' CPU time per INCR (Redis Cluster / AllocSvrs); bench CPUs: redis-benchmark's \
         CPU over wall time against each (near 1.0 its one thread is the bottleneck)"
    );
    all_met
}
