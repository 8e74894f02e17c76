//! `front-bench`: the HTTP/JSON and Redis-protocol front ends side by side with what people use
//! instead, in one run, with the tools those projects ship.
//!
//! 1. Starts 3 `storesvr` (section size 1,000, uid limit 2^24) and ONE `allocsvr` with
//!    `--http-listen` and `--resp-listen` (it owns every section: no call is forwarded),
//!    `redis-server` (no persistence), and in this process a bare HTTP server of the same crate
//!    (`seqsvr_frontends::http` over a `Calls` that only increments an atomic). Every section gets
//!    its first fetch before anything is measured (`warm_sections`).
//! 2. `redis-benchmark -t incr -r 1000000` (random keys) against Redis and against our RESP port at
//!    `-c 1/50/256` × `-P 1/16`; `wrk` (POST `/v1/seq/{random uid}/next`) against our HTTP port and
//!    the bare server at 1, 50 and 256 connections. Points rotate run to run; which of a pair goes
//!    first alternates. `--only resp,http,hop` measures a part of the run.
//! 3. Starts a second AllocSvr, waits until the two hold half the sections each, and times the
//!    forwarding hop: `wrk` on uids the second owns, through the first (forwarded) and through the
//!    second (direct), at 1 and 50 connections, with each node's CPU time per call over each `wrk`
//!    run (from `/proc/PID/stat`) and `wrk`'s own (this process's ended children); then the least
//!    any hop over gRPC adds, a bare
//!    tonic echo's p50 through `H2Conn` at 1 and 50 callers at once (`front-bench --serve-echo
//!    ADDR`, `seqsvr_bench::echo`).
//!
//! Prints medians over `--runs` and the ratios against the targets (RESP ≥ 1.0× Redis INCR at every
//! point; HTTP ≥ 0.9× the bare handler; a forwarded call's p50 ≤ 2× the direct one's, what the hop
//! adds ≤ 1.5× the echo's p50 at as many callers, and forwarded throughput ≥ 0.7× direct at 50
//! connections). Targets are printed, not asserted: exit 0 when measuring worked, 2 a missing tool
//! or binary, 3 a harness failure. Every process is started through the harness's `Supervisor` and killed by pid at the
//! end; everything listens on 127.0.0.1; every load run ends by itself.
//!
//! Deliberately left out: TLS (the front ends have none) and the gRPC path (alloc-bench).

use std::future::Future;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::Parser;
use seqsvr_bench::exit::{Failure, harness};
use seqsvr_bench::peers::{self, PeerKind};
use seqsvr_bench::redis_benchmark::incr_point;
use seqsvr_bench::report::{median, verdict};
use seqsvr_bench::{cluster, echo, procfs, setup};
use seqsvr_frontends::calls::{CallError, Calls, Owner, Taken, Who};
use seqsvr_harness::Supervisor;

const SECTION_SIZE: u64 = 1_000;
const UID_LIMIT: u64 = 1 << 24;
const STEP: u64 = 100_000;
const CONNECTIONS: [usize; 3] = [1, 50, 256];
const PIPELINES: [usize; 2] = [1, 16];
const WRK_SECONDS: u64 = 3;

#[derive(Debug, Parser)]
#[command(
    name = "front-bench",
    version = seqsvr_plumbing::version::LONG,
    about = "HTTP/JSON and RESP front ends against Redis and a bare HTTP handler"
)]
struct Args {
    /// Runs of every point; medians are reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Measure only these parts (default all): `resp` (against Redis), `http` (against the bare
    /// handler), `hop` (forwarded against direct, with its floor).
    #[arg(long, value_delimiter = ',', value_enum)]
    only: Vec<Part>,
    /// The bare gRPC echo of the hop's floor, when this process is it.
    #[command(flatten)]
    echo: echo::ChildFlags,
}

/// The parts of a run that `--only` can pick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Part {
    Resp,
    Http,
    Hop,
}

impl Args {
    fn measures(&self, part: Part) -> bool {
        self.only.is_empty() || self.only.contains(&part)
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(code) = args.echo.serve(SECTION_SIZE) {
        return code;
    }
    seqsvr_bench::exit::run("front-bench", bench(args))
}

/// The bare handler's calls: an atomic per process, nothing else. A take names an owner of
/// fixed stand-in values, as the AllocSvr's does, so that both replies have the same shape and
/// the comparison is the per-call work, not the bytes of the JSON.
#[derive(Default)]
struct Bare(AtomicU64);

fn stand_in_owner(who: Who<'_>) -> Owner {
    let uid = match who {
        Who::Uid(uid) => uid,
        Who::Key(_) => 0,
    };
    Owner {
        section: seqsvr_proto::SectionId(uid / SECTION_SIZE),
        node_id: seqsvr_proto::NodeId(1),
        incarnation: seqsvr_proto::Incarnation(1 << 20),
        epoch: seqsvr_proto::Epoch(1 << 10),
        set_id: 0,
    }
}

impl Calls for Bare {
    async fn take(&self, who: Who<'_>, count: u32) -> Result<Taken, CallError> {
        Ok(Taken {
            value: self.0.fetch_add(u64::from(count), Ordering::Relaxed) + 1,
            owner: Some(stand_in_owner(who)),
        })
    }
    async fn current(&self, _: Who<'_>) -> Result<Taken, CallError> {
        Ok(Taken::anonymous(self.0.load(Ordering::Relaxed)))
    }
    async fn batch(&self, uids: &[u64]) -> Result<Vec<Result<Taken, CallError>>, CallError> {
        Ok(uids
            .iter()
            .map(|_| Ok(Taken::anonymous(self.0.fetch_add(1, Ordering::Relaxed) + 1)))
            .collect())
    }
    async fn ids(&self, count: u32) -> Result<Vec<u64>, CallError> {
        let first = self.0.fetch_add(u64::from(count), Ordering::Relaxed) + 1;
        Ok((first..first + u64::from(count)).collect())
    }
}

/// The median over runs of one field of a point.
fn med(v: &[Point], f: fn(&Point) -> f64) -> f64 {
    median(v.iter().map(f).collect())
}

/// Throughput and median latency of one load run.
#[derive(Debug, Clone, Copy)]
struct Point {
    rps: f64,
    p50_ms: f64,
}

fn need(tool: &str) -> Result<(), Failure> {
    peers::on_path(tool).map(|_| ()).ok_or_else(|| {
        Failure::Usage(format!(
            "{tool} is not installed (Debian: apt install redis-tools redis-server wrk)"
        ))
    })
}

/// The least a forwarded call can add, measured: the forwarding AllocSvr makes one gRPC call to
/// the owner, and no gRPC call on this machine is quicker than a bare tonic echo's
/// (`seqsvr_bench::echo`: answers from nothing, in a process of its own). Returns the echo's p50
/// through the connection the forwarder uses (`H2Conn`, plaintext) at each of `callers` callers
/// at once (the hop's connection counts), and prints it beside one caller through a tonic channel.
async fn echo_floor(args: &Args, procs: &mut Supervisor, callers: &[usize]) -> Result<Vec<f64>, Failure> {
    use seqsvr_bench::load::{self, Pids, Shape, Uids, Window};
    let exe = std::env::current_exe().map_err(|e| harness(format!("own path: {e}")))?;
    let (addr, pid) = echo::start(procs, &exe).await.map_err(harness)?;
    let clients = cluster::channels(&addr, 1).await.map_err(harness)?;
    let ours: Vec<u32> = procs.names().filter_map(|n| procs.pid(n)).collect();
    let window = Window {
        warmup: Duration::from_secs(1),
        measure: Duration::from_secs(WRK_SECONDS),
    };
    let uids = Uids::Range {
        first: 0,
        count: UID_LIMIT,
    };
    let mut p50 = Vec::new();
    for _ in 0..args.runs {
        let pids = Pids {
            server: pid,
            others: &[],
            ours: &ours,
        };
        let s = load::raw(&clients, 1, Shape::Unary, uids.clone(), 0, window, pids).await;
        if s.errors > 0 || s.calls == 0 {
            return Err(harness(format!("the echo failed {} calls of {}", s.errors, s.calls)));
        }
        p50.push(s.quantile_us(0.5) / 1e3);
    }
    let channel_ms = median(p50);
    let mut floors = Vec::new();
    for &n in callers {
        let mut p50 = Vec::new();
        for _ in 0..args.runs {
            p50.push(h2_echo_p50_ms(&addr, window, n).await?);
        }
        floors.push(median(p50));
    }
    println!(
        "    the floor: a bare gRPC echo's p50 through H2Conn (the forwarder's connection) at {callers:?} callers: {:?} ms; \
         through a tonic channel at 1 caller {channel_ms:.3} ms",
        floors.iter().map(|f| (f * 1e3).round() / 1e3).collect::<Vec<_>>()
    );
    Ok(floors)
}

/// The p50 of `callers` callers at once against the echo at `addr` through one `H2Conn`, each
/// making calls one after another for the window's warm-up and then its measured time. Each
/// caller is a task, as the forwarder's calls are: a call made from `block_on` on the main thread
/// would pay two more thread wake-ups.
async fn h2_echo_p50_ms(addr: &str, window: seqsvr_bench::load::Window, callers: usize) -> Result<f64, Failure> {
    use seqsvr_client::transport::H2Conn;
    let conn = H2Conn::lazy(addr, Duration::from_secs(1)).map_err(harness)?;
    let tasks: Vec<_> = (0..callers)
        .map(|i| {
            tokio::spawn(h2_echo_caller(
                conn.clone(),
                window,
                i as u64 * UID_LIMIT / callers as u64,
            ))
        })
        .collect();
    let mut lat_us = Vec::new();
    for t in tasks {
        let caller = t.await.map_err(|e| harness(format!("an H2Conn caller: {e}")))?;
        lat_us.extend(caller?);
    }
    lat_us.sort_unstable();
    Ok(lat_us.get(lat_us.len() / 2).copied().unwrap_or(0) as f64 / 1e3)
}

/// One caller's latencies (µs) after the warm-up, calls one after another from `uid` on.
async fn h2_echo_caller(
    conn: seqsvr_client::transport::H2Conn,
    window: seqsvr_bench::load::Window,
    mut uid: u64,
) -> Result<Vec<u64>, Failure> {
    use seqsvr_client::transport::Conn;
    use seqsvr_proto::pb::{FetchNextSeqRequest, alloc_service_client::AllocServiceClient};
    let mut client = AllocServiceClient::new(Conn::H2(conn));
    let mut lat_us = Vec::new();
    let started = std::time::Instant::now();
    let end = window.warmup + window.measure;
    while started.elapsed() < end {
        let t = std::time::Instant::now();
        uid += 1;
        let r = client
            .fetch_next_seq(FetchNextSeqRequest {
                uid,
                ..Default::default()
            })
            .await;
        r.map_err(|e| harness(format!("the echo failed a call through H2Conn: {e}")))?;
        if started.elapsed() > window.warmup {
            lat_us.push(t.elapsed().as_micros() as u64);
        }
    }
    Ok(lat_us)
}

/// Fetches one uid of every section once, so that each has its `cur_seq` array before anything is
/// measured. A section's array is made at its first fetch (8 KB here, and the heap grows for it);
/// `wrk`'s random uids would otherwise pay that for thousands of sections in the first run, which
/// the bare handler, holding nothing, never does. A serving AllocSvr's sections are touched by
/// their users long before: the steady state is what is compared.
async fn warm_sections(addr: &str) -> Result<(), Failure> {
    use seqsvr_proto::pb;
    let clients = cluster::channels(addr, 1).await.map_err(harness)?;
    cluster::in_batches(
        &clients,
        UID_LIMIT / SECTION_SIZE,
        "sections",
        |mut client, lo, hi| async move {
            let req = pb::BatchFetchNextSeqRequest {
                uids: (lo..hi).map(|s| s * SECTION_SIZE).collect(),
                route_version: 0,
            };
            let r = tokio::time::timeout(Duration::from_secs(10), client.batch_fetch_next_seq(req)).await;
            cluster::unserved(r.ok().and_then(Result::ok).map(|r| r.into_inner().outcomes), hi - lo)
        },
    )
    .await
    .map_err(harness)
}

/// `redis-benchmark -t incr` at `addr`.
async fn redis_benchmark(addr: &str, c: usize, p: usize) -> Result<Point, Failure> {
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| harness(format!("bad address {addr}")))?;
    let n = match (c, p) {
        (1, 1) => 20_000,
        (1, _) | (_, 1) => 100_000,
        _ => 400_000,
    };
    let out = tokio::process::Command::new("redis-benchmark")
        .args(["-h", host, "-p", port, "-t", "incr", "-r", "1000000", "--csv"])
        .args(["-n", &n.to_string(), "-c", &c.to_string(), "-P", &p.to_string()])
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), out)
        .await
        .map_err(|_| harness("redis-benchmark ran over 120 s"))?
        .map_err(|e| harness(format!("redis-benchmark: {e}")))?;
    let p = incr_point(&String::from_utf8_lossy(&out.stdout)).map_err(harness)?;
    Ok(Point {
        rps: p.rps,
        p50_ms: p.p50_ms,
    })
}

/// `wrk` POSTing to `/v1/seq/{uid}/next` at `addr`, the uid drawn from `uids` (or any below 2^24).
async fn wrk(dir: &Path, addr: &str, c: usize, uids: Option<&[u64]>) -> Result<Point, Failure> {
    let pick = match uids {
        Some(list) => format!(
            "local uids = {{{}}}\nlocal function uid() return uids[math.random(#uids)] end",
            list.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
        ),
        None => format!("local function uid() return math.random(0, {}) end", UID_LIMIT - 1),
    };
    let script = dir.join(format!("wrk-{}.lua", c));
    let lua = format!(
        "{pick}\nrequest = function()\n  return wrk.format(\"POST\", \"/v1/seq/\" .. uid() .. \"/next\")\nend\n"
    );
    std::fs::write(&script, lua).map_err(|e| harness(format!("cannot write the wrk script: {e}")))?;
    let out = tokio::process::Command::new("wrk")
        .args(["-t", if c == 1 { "1" } else { "2" }, "-c", &c.to_string()])
        .args(["-d", &format!("{WRK_SECONDS}s"), "--latency", "-s"])
        .arg(&script)
        .arg(format!("http://{addr}"))
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(WRK_SECONDS + 30), out)
        .await
        .map_err(|_| harness("wrk ran over its time"))?
        .map_err(|e| harness(format!("wrk: {e}")))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if text.contains("Non-2xx") {
        return Err(harness(format!("wrk saw errors: {text}")));
    }
    let rps = text
        .lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| harness(format!("no Requests/sec from wrk: {text}")))?;
    let p50 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("50%"))
        .map(|v| duration_ms(v.trim()))
        .ok_or_else(|| harness(format!("no 50% latency from wrk: {text}")))?;
    Ok(Point { rps, p50_ms: p50 })
}

/// wrk's `123.45us` / `1.20ms` / `1.00s` in milliseconds.
fn duration_ms(v: &str) -> f64 {
    let (num, scale) = if let Some(n) = v.strip_suffix("us") {
        (n, 0.001)
    } else if let Some(n) = v.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1000.0)
    } else {
        (v, f64::NAN)
    };
    num.parse::<f64>().unwrap_or(f64::NAN) * scale
}

/// Waits until `addr` answers an HTTP next with 200.
async fn wait_http(addr: &str, limit: Duration) -> Result<(), Failure> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let served = seqsvr_harness::poll_until(limit, || async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(b"POST /v1/seq/1/next HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        buf.starts_with(b"HTTP/1.1 200").then_some(())
    })
    .await;
    served.ok_or_else(|| harness(format!("{addr} did not serve HTTP within {limit:?}")))
}

fn fronts(http: &str, resp: &str) -> Vec<String> {
    vec![format!("--http-listen={http}"), format!("--resp-listen={resp}")]
}

async fn bench(args: Args) -> Result<bool, Failure> {
    if args.runs == 0 {
        return Err(Failure::Usage("--runs must be at least 1".into()));
    }
    for tool in ["redis-benchmark", "redis-server", "wrk"] {
        need(tool)?;
    }
    let bins = cluster::binaries().map_err(Failure::Usage)?;
    let dir = tempfile::tempdir().map_err(|e| harness(format!("temp dir: {e}")))?;
    let mut procs = setup::supervisor(dir.path())?;
    let out = run(&args, &bins, dir.path(), &mut procs).await;
    procs.kill_all();
    out
}

/// Our AllocSvr's two front ends and what each is measured against.
struct Fronts {
    node: cluster::AllocNode,
    http: String,
    resp: String,
    redis: peers::Server,
    bare: String,
    /// Keeps the bare server running: it stops when this is dropped.
    _bare_stop: tokio::sync::watch::Sender<bool>,
}

/// The samples of the RESP and HTTP pairs, one list per point, one sample per run.
struct Pairs {
    redis: Vec<Vec<Point>>,
    ours_resp: Vec<Vec<Point>>,
    ours_http: Vec<Vec<Point>>,
    bare: Vec<Vec<Point>>,
}

async fn run(args: &Args, bins: &cluster::Binaries, dir: &Path, procs: &mut Supervisor) -> Result<bool, Failure> {
    let extra = vec![format!("--uid-limit={UID_LIMIT}")];
    let stores = cluster::start_stores_with(procs, &bins.storesvr, dir, STEP, SECTION_SIZE, &extra)
        .await
        .map_err(harness)?;
    let fronts = start_fronts(bins, dir, procs, &stores).await?;
    println!(
        "front-bench: {}, {}, one AllocSvr (pid {}) owning all {} sections; {} runs",
        procfs::machine(),
        fronts.redis.version,
        fronts.node.pid,
        UID_LIMIT / SECTION_SIZE,
        args.runs
    );
    let pairs = measure_pairs(args, dir, procs, &fronts).await?;
    let mut all_met = true;
    if args.measures(Part::Resp) {
        all_met &= print_resp(args, &pairs);
    }
    if args.measures(Part::Http) {
        all_met &= print_http(args, &pairs);
    }
    if args.measures(Part::Hop) {
        all_met &= hop(args, bins, dir, procs, &stores, &fronts).await?;
    }
    cluster::check_alive(procs).map_err(harness)?;
    println!(
        "\nfront-bench: {}",
        if all_met {
            "every target met"
        } else {
            "a target is NOT MET (see above)"
        }
    );
    Ok(true)
}

/// AllocSvr 1 with both front ends, its sections warmed, Redis, and the bare handler in this
/// process.
async fn start_fronts(
    bins: &cluster::Binaries,
    dir: &Path,
    procs: &mut Supervisor,
    stores: &cluster::Stores,
) -> Result<Fronts, Failure> {
    let (http, resp) = (seqsvr_harness::free_addr(), seqsvr_harness::free_addr());
    let node =
        cluster::start_allocsvr_with(procs, &bins.allocsvr, 1, stores, &fronts(&http, &resp)).map_err(harness)?;
    wait_http(&http, Duration::from_secs(60)).await?;
    warm_sections(&node.addr).await?;
    let redis = peers::start(procs, dir, PeerKind::Redis)
        .await
        .map_err(harness)?
        .ok_or_else(|| Failure::Usage("redis-server is not installed".into()))?;
    let bare_listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| harness(format!("bare server: {e}")))?;
    let bare = bare_listener
        .local_addr()
        .map_err(|e| harness(e.to_string()))?
        .to_string();
    let (bare_stop, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(seqsvr_frontends::http::serve(
        bare_listener,
        Arc::new(Bare::default()),
        seqsvr_frontends::http::HttpConfig::default(),
        stop_rx,
    ));
    Ok(Fronts {
        node,
        http,
        resp,
        redis,
        bare,
        _bare_stop: bare_stop,
    })
}

/// Every run of the RESP and HTTP points the run measures, rotating the points run to run.
async fn measure_pairs(args: &Args, dir: &Path, procs: &mut Supervisor, f: &Fronts) -> Result<Pairs, Failure> {
    let mut resp_points: Vec<(usize, usize)> = CONNECTIONS.iter().flat_map(|&c| PIPELINES.map(|p| (c, p))).collect();
    let mut pairs = Pairs {
        redis: vec![Vec::new(); resp_points.len()],
        ours_resp: vec![Vec::new(); resp_points.len()],
        ours_http: vec![Vec::new(); CONNECTIONS.len()],
        bare: vec![Vec::new(); CONNECTIONS.len()],
    };
    for run in 0..args.runs {
        let n = resp_points.len();
        resp_points.rotate_left(run % n);
        // A part not measured leaves its points empty (and its table unprinted, below).
        let resp_now: &[(usize, usize)] = if args.measures(Part::Resp) { &resp_points } else { &[] };
        for &(c, p) in resp_now {
            let i = CONNECTIONS.iter().position(|&x| x == c).unwrap() * PIPELINES.len()
                + PIPELINES.iter().position(|&x| x == p).unwrap();
            let redis_benchmark = |addr: String| async move { redis_benchmark(&addr, c, p).await };
            let (r, o) = in_turn(run, &f.redis.addr, &f.resp, redis_benchmark).await?;
            pairs.redis[i].push(r);
            pairs.ours_resp[i].push(o);
        }
        let http_now: &[usize] = if args.measures(Part::Http) { &CONNECTIONS } else { &[] };
        for (i, &c) in http_now.iter().enumerate() {
            let wrk = |addr: String| async move { wrk(dir, &addr, c, None).await };
            let (o, b) = in_turn(run, &f.http, &f.bare, wrk).await?;
            pairs.ours_http[i].push(o);
            pairs.bare[i].push(b);
        }
        cluster::check_alive(procs).map_err(harness)?;
    }
    Ok(pairs)
}

/// `measure` of `a` and of `b`, `a` first in even runs and `b` first in odd ones: the first of a
/// pair follows whatever ran before it. Returns `(a's, b's)`.
async fn in_turn<F, Fut>(run: usize, a: &str, b: &str, measure: F) -> Result<(Point, Point), Failure>
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = Result<Point, Failure>>,
{
    if run.is_multiple_of(2) {
        let first = measure(a.to_string()).await?;
        Ok((first, measure(b.to_string()).await?))
    } else {
        let first = measure(b.to_string()).await?;
        Ok((measure(a.to_string()).await?, first))
    }
}

/// The RESP table; whether every point meets its target.
fn print_resp(args: &Args, pairs: &Pairs) -> bool {
    println!(
        "\nRESP INCR, random keys (redis-benchmark -t incr -r 1000000), medians of {} runs",
        args.runs
    );
    println!(
        "{:>5} {:>3} {:>12} {:>12} {:>7} {:>10} {:>10}  target ≥ 1.0×",
        "conns", "-P", "Redis/s", "seqsvr/s", "ratio", "Redis p50", "ours p50"
    );
    let mut all_met = true;
    for (i, (c, p)) in CONNECTIONS
        .iter()
        .flat_map(|&c| PIPELINES.map(move |p| (c, p)))
        .enumerate()
    {
        let (cells, met) = pair_cells(&pairs.redis[i], &pairs.ours_resp[i], 1.0);
        all_met &= met;
        println!("{c:>5} {p:>3} {cells}");
    }
    all_met
}

/// The HTTP table; whether every point meets its target.
fn print_http(args: &Args, pairs: &Pairs) -> bool {
    println!(
        "\nHTTP POST /v1/seq/{{random uid}}/next (wrk, {WRK_SECONDS} s), medians of {} runs",
        args.runs
    );
    println!(
        "{:>5} {:>12} {:>12} {:>7} {:>10} {:>10}  target ≥ 0.9×",
        "conns", "bare/s", "seqsvr/s", "ratio", "bare p50", "ours p50"
    );
    let mut all_met = true;
    for (i, c) in CONNECTIONS.iter().enumerate() {
        let (cells, met) = pair_cells(&pairs.bare[i], &pairs.ours_http[i], 0.9);
        all_met &= met;
        println!("{c:>5} {cells}");
    }
    all_met
}

/// The cells of a pair's row after the point's own: both medians, their ratio, both p50s and the
/// verdict of `ours >= target × theirs`; and whether it is met.
fn pair_cells(theirs: &[Point], ours: &[Point], target: f64) -> (String, bool) {
    let (t, o) = (med(theirs, |x| x.rps), med(ours, |x| x.rps));
    let met = o >= target * t;
    let cells = format!(
        "{t:>12.0} {o:>12.0} {:>6.2}× {:>8.3}ms {:>8.3}ms  {}",
        o / t,
        med(theirs, |x| x.p50_ms),
        med(ours, |x| x.p50_ms),
        verdict(met)
    );
    (cells, met)
}

/// Up to 500 uids, spread over the sections `node_id` owns in `table`.
fn sample_uids_of(table: &seqsvr_proto::pb::RouteTable, node_id: u64) -> Vec<u64> {
    table
        .entries
        .iter()
        .filter(|e| e.node_id == node_id)
        .flat_map(|e| {
            (e.section_begin..e.section_end)
                .step_by(97)
                .map(|s| s * SECTION_SIZE + 7)
        })
        .take(500)
        .collect()
}

/// One connection count of the hop: direct and forwarded medians, the echo floor's p50, and
/// where the CPU of the forwarded calls went.
struct HopPoint {
    conns: usize,
    direct: Point,
    forwarded: Point,
    floor_ms: f64,
    direct_cpu: Cpu,
    forwarded_cpu: Cpu,
}

/// The CPU of one `wrk` run: each AllocSvr's in µs per call, and `wrk`'s over the run's wall time.
#[derive(Debug, Clone, Copy, Default)]
struct Cpu {
    node1_us: f64,
    node2_us: f64,
    wrk_cpus: f64,
}

/// `wrk` (as [`wrk`]) with the CPU the two AllocSvrs (`pids`) and `wrk` itself used meanwhile.
async fn wrk_cpu(dir: &Path, addr: &str, c: usize, uids: &[u64], pids: [u32; 2]) -> Result<(Point, Cpu), Failure> {
    let cpu = procfs::CpuSince::start(&pids).map_err(harness)?;
    let point = wrk(dir, addr, c, Some(uids)).await?;
    let used = cpu.end().map_err(harness)?;
    // wrk's rate is over its own duration (WRK_SECONDS); the calls are that many.
    let calls = point.rps * WRK_SECONDS as f64;
    Ok((
        point,
        Cpu {
            node1_us: used.pids[0] * 1e6 / calls,
            node2_us: used.pids[1] * 1e6 / calls,
            wrk_cpus: used.children / used.wall,
        },
    ))
}

/// The median of each of `v`'s fields.
fn med_cpu(v: &[Cpu]) -> Cpu {
    let m = |f: fn(&Cpu) -> f64| median(v.iter().map(f).collect());
    Cpu {
        node1_us: m(|x| x.node1_us),
        node2_us: m(|x| x.node2_us),
        wrk_cpus: m(|x| x.wrk_cpus),
    }
}

/// Where the hop's CPU went, per connection count: each node's CPU per call, direct and forwarded.
fn print_hop_cpu(points: &[HopPoint]) {
    println!("\n  CPU µs a call (node 1 forwards, node 2 owns), from /proc; wrk's CPUs over its run's wall time");
    println!(
        "{:>5} {:>14} {:>16} {:>16} {:>14} {:>12}",
        "conns", "direct: node 2", "fwd: node 1", "fwd: node 2", "fwd ÷ direct", "wrk CPUs d/f"
    );
    for p in points {
        let (d, f) = (&p.direct_cpu, &p.forwarded_cpu);
        let direct = d.node1_us + d.node2_us;
        let forwarded = f.node1_us + f.node2_us;
        println!(
            "{:>5} {:>14.1} {:>16.1} {:>16.1} {:>13.2}× {:>6.2}/{:<5.2}",
            p.conns,
            direct,
            f.node1_us,
            f.node2_us,
            forwarded / direct,
            d.wrk_cpus,
            f.wrk_cpus
        );
    }
}

/// Prints the hop's table and returns whether every target is met: a forwarded call's p50 at
/// most 2× the direct one's, what the hop adds at most 1.5× the echo floor at the same
/// concurrency, and forwarded throughput at least 0.7× direct at 50 connections.
fn print_hop(points: &[HopPoint]) -> bool {
    println!(
        "{:>5} {:>10} {:>12} {:>11} {:>10} {:>10} {:>10} {:>8} {:>10} {:>8}",
        "conns",
        "direct/s",
        "forwarded/s",
        "fwd÷dir/s",
        "direct p50",
        "fwd p50",
        "echo p50",
        "fwd÷dir",
        "add÷echo",
        "targets"
    );
    let mut all_met = true;
    for p in points {
        let (d, f) = (&p.direct, &p.forwarded);
        let (tput, lat) = (f.rps / d.rps, f.p50_ms / d.p50_ms);
        let added = (f.p50_ms - d.p50_ms) / p.floor_ms;
        let met = lat <= 2.0 && added <= 1.5 && (p.conns < 50 || tput >= 0.7);
        all_met &= met;
        println!(
            "{:>5} {:>10.0} {:>12.0} {tput:>10.2}× {:>8.3}ms {:>8.3}ms {:>8.3}ms {lat:>7.2}× {added:>9.2}× {:>8}",
            p.conns,
            d.rps,
            f.rps,
            d.p50_ms,
            f.p50_ms,
            p.floor_ms,
            verdict(met)
        );
    }
    println!(
        "    targets: fwd÷dir p50 ≤ 2.0; what the hop adds ÷ the echo's p50 at as many callers ≤ 1.5; forwarded/s ≥ 0.7× direct at 50"
    );
    all_met
}

/// The hop's connection counts: wrk's connections and the echo floor's callers.
const HOP_CONNECTIONS: [usize; 2] = [1, 50];

/// `runs` of `wrk` at each of the hop's connection counts on the uids node 2 owns (`theirs`),
/// through node 2 (direct) and node 1 (forwarded), at HTTP addresses `https`, with the CPU of the
/// two nodes (`pids`); medians per count, the floor not yet measured.
async fn measure_hop(
    runs: usize,
    dir: &Path,
    https: [&str; 2],
    theirs: &[u64],
    pids: [u32; 2],
) -> Result<Vec<HopPoint>, Failure> {
    let mut points = Vec::new();
    for c in HOP_CONNECTIONS {
        let (mut d, mut f, mut dc, mut fc) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..runs {
            let (point, cpu) = wrk_cpu(dir, https[1], c, theirs, pids).await?;
            d.push(point);
            dc.push(cpu);
            let (point, cpu) = wrk_cpu(dir, https[0], c, theirs, pids).await?;
            f.push(point);
            fc.push(cpu);
        }
        points.push(HopPoint {
            conns: c,
            direct: Point {
                rps: med(&d, |x| x.rps),
                p50_ms: med(&d, |x| x.p50_ms),
            },
            forwarded: Point {
                rps: med(&f, |x| x.rps),
                p50_ms: med(&f, |x| x.p50_ms),
            },
            floor_ms: f64::NAN,
            direct_cpu: med_cpu(&dc),
            forwarded_cpu: med_cpu(&fc),
        });
    }
    Ok(points)
}

/// The forwarding hop: a second AllocSvr takes half the sections; `wrk` on uids it owns through
/// the first (forwarded) and through it (direct), then the floor. Returns whether the targets are met.
async fn hop(
    args: &Args,
    bins: &cluster::Binaries,
    dir: &Path,
    procs: &mut Supervisor,
    stores: &cluster::Stores,
    node1: &Fronts,
) -> Result<bool, Failure> {
    let (http1, resp1, node1_pid) = (node1.http.as_str(), node1.resp.as_str(), node1.node.pid);
    // The hop: a second AllocSvr takes half the sections.
    let (http2, resp2) = (seqsvr_harness::free_addr(), seqsvr_harness::free_addr());
    let node2 =
        cluster::start_allocsvr_with(procs, &bins.allocsvr, 2, stores, &fronts(&http2, &resp2)).map_err(harness)?;
    cluster::wait_balanced(&stores.leader, 2, Duration::from_secs(90))
        .await
        .map_err(harness)?;
    wait_http(&http2, Duration::from_secs(60)).await?;
    let table = cluster::routes(&stores.leader).await.map_err(harness)?;
    let theirs = sample_uids_of(&table, node2.node_id);
    if theirs.is_empty() {
        return Err(harness("the second AllocSvr owns no section"));
    }
    // The forwarded calls' first trip also teaches node 1's client the table: warm it.
    wrk(dir, http1, 1, Some(&theirs)).await?;
    let mut points = measure_hop(args.runs, dir, [http1, &http2], &theirs, [node1_pid, node2.pid]).await?;
    let floors = echo_floor(args, procs, &HOP_CONNECTIONS).await?;
    for (p, floor) in points.iter_mut().zip(floors) {
        p.floor_ms = floor;
    }
    println!(
        "\nForwarding hop: wrk on {} uids node 2 owns, through node 1 (forwarded) and node 2 (direct)",
        theirs.len()
    );
    let all_met = print_hop(&points);
    print_hop_cpu(&points);
    let mut mixed = Vec::new();
    for _ in 0..args.runs {
        mixed.push(redis_benchmark(resp1, 50, 1).await?);
    }
    println!(
        "\nRESP INCR through node 1 with two AllocSvrs (about half forwarded), -c 50 -P 1: {:.0}/s, p50 {:.3} ms",
        med(&mixed, |x| x.rps),
        med(&mixed, |x| x.p50_ms)
    );
    Ok(all_met)
}
