//! `counter-bench`: named counters side by side, in one run, with the uid path of the same
//! AllocSvr and with Redis `INCR`/`INCRBY` (no persistence, and `appendfsync always`) on the same
//! key names; then the memory one live key costs on each side.
//!
//! 1. Starts 3 `storesvr` (section size 1,000, uid limit 2^24: keys spread over 16,777 sections)
//!    and ONE `allocsvr`, and — when `redis-server` is installed — Redis twice, as `alloc-bench`
//!    does (`seqsvr_bench::peers`). Every key `ctr:0..--keys` is given a value first, on both.
//! 2. At 1, 16, 64, 256 callers (closed loop; one channel per 32 callers): `uid-next`
//!    (FetchNextSeq of the uid at each key's position: the same sections as the keys),
//!    `key-next` (CounterNext), `uid-res100` / `key-res100` (blocks of 100), `key-coal` (CounterNext
//!    through the client library's Coalescer), `uid-coal` (the uids through it), `redis-incr`, `redis-by100` (INCRBY 100),
//!    `redis-fsync` (INCR with the AOF fsynced per call). Cases rotate from point to point and run
//!    to run, so that drift on a shared machine hits each alike.
//! 3. Memory, first, while both servers are fresh (after the load, memory the allocator freed and
//!    keeps would hide the growth): the AllocSvr's RSS before and after `--memory-keys` keys get a
//!    value (through CounterBatch), per key; Redis's RSS the same way, and its `MEMORY USAGE` of a
//!    sample of them.
//!
//! The summary gives medians over `--runs` of values/s (a block counts its values), p50/p99,
//! server CPU per call, the ratios and which targets are met: a key costs at most 1.1× a uid per
//! call (server CPU); through the Coalescer at least 2× Redis INCR at 64 callers; a live key's
//! memory within 2× Redis's. Targets are printed, not asserted: exit 0 when measuring worked, 2 bad
//! options or missing binaries, 3 the harness failed.
//!
//! Every process is started through the harness's `Supervisor` and killed by pid when the run ends;
//! everything listens on 127.0.0.1; every load loop stops by itself.
//!
//! Deliberately left out: `--tls`, more than one AllocSvr (routing is the client library's and the
//! coalesced case includes it), and Redis pipelining.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use seqsvr_bench::args::{self, chosen};
use seqsvr_bench::cluster;
use seqsvr_bench::counters::{self, Call};
use seqsvr_bench::exit::{Failure, harness};
use seqsvr_bench::load::{Pids, Sample, Window};
use seqsvr_bench::peers::{self, PeerKind};
use seqsvr_bench::procfs;
use seqsvr_bench::report::{self, median};
use seqsvr_bench::setup::{self, Run};
use seqsvr_client::{Client, ClientConfig, Coalescer, CoalescerConfig};
use seqsvr_harness::Supervisor;
use seqsvr_proto::pb;
use seqsvr_proto::pb::alloc_service_client::AllocServiceClient;
use tonic::transport::Channel;

const SECTION_SIZE: u64 = 1_000;
const UID_LIMIT: u64 = 1 << 24;
const STEP: u64 = 10_000;
const CONCURRENCIES: [usize; 4] = [1, 16, 64, 256];
const MAX_CHANNELS: usize = 8;
const SERVING_LIMIT: Duration = Duration::from_secs(60);

/// The cases, in the order the tables list them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    UidNext,
    KeyNext,
    UidRes100,
    KeyRes100,
    KeyCoalesced,
    UidCoalesced,
    RedisIncr,
    RedisBy100,
    RedisFsync,
}

impl Case {
    const ALL: [Case; 9] = [
        Case::UidNext,
        Case::KeyNext,
        Case::UidRes100,
        Case::KeyRes100,
        Case::KeyCoalesced,
        Case::UidCoalesced,
        Case::RedisIncr,
        Case::RedisBy100,
        Case::RedisFsync,
    ];

    fn name(self) -> &'static str {
        match self {
            Case::UidNext => "uid-next",
            Case::KeyNext => "key-next",
            Case::UidRes100 => "uid-res100",
            Case::KeyRes100 => "key-res100",
            Case::KeyCoalesced => "key-coal",
            Case::UidCoalesced => "uid-coal",
            Case::RedisIncr => "redis-incr",
            Case::RedisBy100 => "redis-by100",
            Case::RedisFsync => "redis-fsync",
        }
    }

    fn server(self) -> &'static str {
        match self {
            Case::RedisIncr | Case::RedisBy100 | Case::RedisFsync => "redis",
            _ => "alloc",
        }
    }
}

#[derive(Parser, Debug)]
#[command(name = "counter-bench", version = seqsvr_plumbing::version::LONG,
    about = "Named counters against the uid path and Redis INCR/INCRBY, and memory per live key"
)]
struct Args {
    #[command(flatten)]
    common: args::Common,
    /// Times every point is measured; medians are shown.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Keys the load spreads over (`ctr:0..N`), on both sides.
    #[arg(long, default_value_t = 10_000)]
    keys: u64,
    /// Fresh keys given a value for the memory measurement, on both sides.
    #[arg(long, default_value_t = 200_000)]
    memory_keys: u64,
    /// Measure only these cases (uid-next, key-next, uid-res100, key-res100, key-coal, uid-coal,
    /// redis-incr, redis-by100, redis-fsync), for a closer look at one; no target is judged
    /// without its pair.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Measure only at these caller counts (of 1, 16, 64, 256).
    #[arg(long, value_delimiter = ',')]
    callers: Vec<usize>,
    /// The Coalescer's `busy_batch` (default: the client library's): callers that must wait
    /// before a further batch goes out while others are in flight.
    #[arg(long)]
    coal_busy_batch: Option<usize>,
    /// The Coalescer's `max_in_flight` (default: the client library's): batches in flight per
    /// owner.
    #[arg(long)]
    coal_max_in_flight: Option<usize>,
}

impl Args {
    fn validate(&self) -> Result<(), String> {
        self.common.validate(600, 60_000)?;
        args::check_runs(self.runs)?;
        if let Some(bad) = self
            .only
            .iter()
            .find(|n| !Case::ALL.iter().any(|c| c.name() == n.as_str()))
        {
            return Err(format!("--only: no case {bad:?}"));
        }
        args::check_subset("--callers", &self.callers, &CONCURRENCIES)?;
        if !(1..=1_000_000).contains(&self.keys) || !(1_000..=10_000_000).contains(&self.memory_keys) {
            return Err("--keys must be in 1..=1000000 and --memory-keys in 1000..=10000000".into());
        }
        if self.coal_busy_batch.is_some_and(|n| !(1..=1_000).contains(&n))
            || self.coal_max_in_flight.is_some_and(|n| !(1..=64).contains(&n))
        {
            return Err("--coal-busy-batch must be in 1..=1000 and --coal-max-in-flight in 1..=64".into());
        }
        Ok(())
    }

    /// Whether `--only` (empty: every case) keeps `case`.
    fn measures(&self, case: Case) -> bool {
        self.only.is_empty() || self.only.iter().any(|n| n == case.name())
    }
}

fn main() -> ExitCode {
    let args: Args = seqsvr_plumbing::cli::parse("COUNTER_BENCH");
    seqsvr_bench::exit::run_valid("counter-bench", args.validate(), bench(&args))
}

struct Servers {
    alloc_pid: u32,
    store_pids: Vec<u32>,
    alloc: Vec<AllocServiceClient<Channel>>,
    coalescer: Arc<Coalescer>,
    redis: Option<peers::Server>,
    redis_fsync: Option<peers::Server>,
    ours: Vec<u32>,
}

impl Servers {
    async fn measure(&self, case: Case, c: usize, keys: u64, window: Window) -> Result<Option<Sample>, Failure> {
        let n = cluster::channel_count(c).min(MAX_CHANNELS);
        let alloc = Pids {
            server: self.alloc_pid,
            others: &self.store_pids,
            ours: &self.ours,
        };
        let on_alloc = |call| counters::alloc_load(&self.alloc[..n], c, call, keys, UID_LIMIT, window, alloc);
        let on_redis = |server: &Option<peers::Server>, by| {
            let server = server.as_ref().map(|s| (s.addr.clone(), s.pid));
            let ours = &self.ours;
            async move {
                let Some((addr, pid)) = server else {
                    return Ok(None);
                };
                let pids = Pids {
                    server: pid,
                    others: &[],
                    ours,
                };
                counters::redis_load(&addr, c, by, keys, window, pids).await.map(Some)
            }
        };
        Ok(match case {
            Case::UidNext => Some(on_alloc(Call::UidNext).await),
            Case::KeyNext => Some(on_alloc(Call::KeyNext).await),
            Case::UidRes100 => Some(on_alloc(Call::UidReserve(100)).await),
            Case::KeyRes100 => Some(on_alloc(Call::KeyReserve(100)).await),
            Case::KeyCoalesced => Some(counters::coalesced(self.coalescer.clone(), c, keys, None, window, alloc).await),
            Case::UidCoalesced => {
                let uids = Some(UID_LIMIT);
                Some(counters::coalesced(self.coalescer.clone(), c, keys, uids, window, alloc).await)
            }
            Case::RedisIncr => on_redis(&self.redis, 1).await.map_err(harness)?,
            Case::RedisBy100 => on_redis(&self.redis, 100).await.map_err(harness)?,
            Case::RedisFsync => on_redis(&self.redis_fsync, 1).await.map_err(harness)?,
        })
    }
}

/// The cluster (serving counters), the Coalescer over it and both Redis servers (when installed).
async fn start(run: &mut Run, args: &Args) -> Result<Servers, Failure> {
    let extra = [format!("--uid-limit={UID_LIMIT}")];
    let one = run.one_allocsvr(STEP, SECTION_SIZE, &extra, MAX_CHANNELS).await?;
    wait_serving(&one.clients[0]).await?;
    let coalescer = start_coalescer(&one.node.addr, args).await?;
    println!(
        "cluster: 3 storesvr (section size {SECTION_SIZE}, uid limit 2^24, step {STEP}) + 1 allocsvr, serving {:.1} s after it started; logs in {}",
        one.started.elapsed().as_secs_f64(),
        run.dir().join("logs").display()
    );
    let mut ours = vec![one.node.pid];
    ours.extend(&one.stores.pids);
    let (procs, dir) = run.procs_and_dir();
    let mut redis = Vec::new();
    for kind in [PeerKind::Redis, PeerKind::RedisFsync] {
        let server = peers::start(procs, dir, kind).await.map_err(harness)?;
        match &server {
            Some(s) => {
                println!("{}: {} at {} (pid {})", kind.title(), s.version, s.addr, s.pid);
                ours.push(s.pid);
            }
            None => println!(
                "{}: not measured (redis-server is not on PATH; Debian: apt install redis-server)",
                kind.title()
            ),
        }
        redis.push(server);
    }
    let redis_fsync = redis.pop().flatten();
    let redis = redis.pop().flatten();
    Ok(Servers {
        alloc_pid: one.node.pid,
        store_pids: one.stores.pids,
        alloc: one.clients,
        coalescer,
        redis,
        redis_fsync,
        ours,
    })
}

/// The client library's Coalescer over the AllocSvr at `addr`, with the `--coal-*` overrides.
async fn start_coalescer(addr: &str, args: &Args) -> Result<Arc<Coalescer>, Failure> {
    let client = Client::connect(ClientConfig::new([addr.to_string()]))
        .await
        .map_err(|e| harness(format!("client: {e}")))?;
    let mut cfg = CoalescerConfig::default();
    cfg.busy_batch = args.coal_busy_batch.unwrap_or(cfg.busy_batch);
    cfg.max_in_flight = args.coal_max_in_flight.unwrap_or(cfg.max_in_flight);
    println!(
        "coalescer: busy_batch {}, max_in_flight {}, max_batch {}",
        cfg.busy_batch, cfg.max_in_flight, cfg.max_batch
    );
    let coalescer = Coalescer::new(client, cfg).map_err(|e| harness(format!("coalescer: {e}")))?;
    Ok(Arc::new(coalescer))
}

/// Until a CounterNext is answered OK.
async fn wait_serving(client: &AllocServiceClient<Channel>) -> Result<(), Failure> {
    let ok = seqsvr_harness::poll_until(SERVING_LIMIT, || async {
        let req = pb::CounterRequest {
            key: b"ready".to_vec(),
            count: 0,
            route_version: 0,
        };
        let r = client.clone().counter_next(req).await.ok()?;
        (r.get_ref().outcome == pb::Outcome::Ok as i32).then_some(())
    })
    .await;
    ok.ok_or_else(|| harness(format!("no counter served within {SERVING_LIMIT:?}")))
}

/// Samples of one (case, callers) point, one per run.
struct Point {
    case: Case,
    concurrency: usize,
    runs: Vec<Sample>,
}

async fn bench(args: &Args) -> Result<bool, Failure> {
    let mut run = Run::new(args.common.dir.as_deref())?;
    let w = &args.common.window;
    println!(
        "machine: {}; options: --seconds {} --warmup-ms {} --runs {} --keys {} --memory-keys {}",
        procfs::machine(),
        w.seconds,
        w.warmup_ms,
        args.runs,
        args.keys,
        args.memory_keys
    );
    let s = start(&mut run, args).await?;
    // Memory first, on fresh processes: after the load, freed memory the allocator keeps would
    // hide the growth.
    let memory = measure_memory(args, &s).await?;
    // Every load key gets its first value before anything is measured, on both sides.
    counters::touch_keys(&s.alloc, "ctr", args.keys)
        .await
        .map_err(harness)?;
    if let Some(r) = &s.redis {
        counters::redis_touch(&r.addr, "ctr", args.keys)
            .await
            .map_err(harness)?;
    }
    let mut points: Vec<Point> = CONCURRENCIES
        .iter()
        .flat_map(|&concurrency| {
            Case::ALL.map(|case| Point {
                case,
                concurrency,
                runs: Vec::new(),
            })
        })
        .collect();
    for r in 0..args.runs {
        one_run(args, &s, &mut run.procs, r, &mut points).await?;
    }
    summarize(&points, &memory);
    Ok(true)
}

/// Run `run` of every point `--callers` and `--only` keep, the case order rotated by the run and
/// the caller count so that drift on the machine hits each case alike.
async fn one_run(
    args: &Args,
    s: &Servers,
    procs: &mut Supervisor,
    run: usize,
    points: &mut [Point],
) -> Result<(), Failure> {
    println!("\n== run {}/{} ==", run + 1, args.runs);
    println!("{}", report::header_for("values/s"));
    for c in chosen(&CONCURRENCIES, &args.callers) {
        for k in 0..Case::ALL.len() {
            let case = Case::ALL[(k + run + c) % Case::ALL.len()];
            if !args.measures(case) {
                continue;
            }
            let Some(sample) = measure_point(args, s, procs, case, c).await? else {
                continue;
            };
            let p = points
                .iter_mut()
                .find(|p| p.case == case && p.concurrency == c)
                .expect("planned");
            p.runs.push(sample);
        }
    }
    Ok(())
}

/// One case at `c` callers once the machine is quiet, its row printed (and the Coalescer's mean
/// batch); `None` for a Redis case without Redis.
async fn measure_point(
    args: &Args,
    s: &Servers,
    procs: &mut Supervisor,
    case: Case,
    c: usize,
) -> Result<Option<Sample>, Failure> {
    let quiet = &args.common.quiet;
    cluster::wait_quiet(&s.ours, quiet.quiet_below, quiet.wait()).await;
    let sent = s.coalescer.stats();
    let window = args.common.window.durations();
    let Some(sample) = s.measure(case, c, args.keys, window).await? else {
        return Ok(None);
    };
    println!("{}", report::row(case.name(), c, case.server(), &sample));
    if matches!(case, Case::KeyCoalesced | Case::UidCoalesced) {
        // Over the warm-up and the window alike: a mean size, not a rate.
        let now = s.coalescer.stats();
        let (batches, callers) = (now.batches - sent.batches, now.callers - sent.callers);
        println!(
            "  {} batches carried {callers} callers: {:.1} a batch",
            batches,
            callers as f64 / batches.max(1) as f64
        );
    }
    setup::check(procs, &format!("{} at {c}", case.name()), &sample)?;
    Ok(Some(sample))
}

/// Bytes per live key: the AllocSvr's RSS growth, Redis's RSS growth and its `MEMORY USAGE`.
struct Memory {
    alloc_rss: f64,
    redis_rss: Option<f64>,
    redis_usage: Option<f64>,
    keys: u64,
}

async fn measure_memory(args: &Args, s: &Servers) -> Result<Memory, Failure> {
    let per_key = |before: u64, after: u64| after.saturating_sub(before) as f64 / args.memory_keys as f64;
    let rss = |pid| procfs::rss_bytes(pid).ok_or_else(|| harness(format!("no RSS of pid {pid}")));
    let before = rss(s.alloc_pid)?;
    counters::touch_keys(&s.alloc, "mem", args.memory_keys)
        .await
        .map_err(harness)?;
    let alloc_rss = per_key(before, rss(s.alloc_pid)?);
    let (mut redis_rss, mut redis_usage) = (None, None);
    if let Some(r) = &s.redis {
        let before = rss(r.pid)?;
        counters::redis_touch(&r.addr, "mem", args.memory_keys)
            .await
            .map_err(harness)?;
        redis_rss = Some(per_key(before, rss(r.pid)?));
        redis_usage = Some(
            counters::redis_memory_usage(&r.addr, "mem", args.memory_keys, 1_000)
                .await
                .map_err(harness)?,
        );
    }
    Ok(Memory {
        alloc_rss,
        redis_rss,
        redis_usage,
        keys: args.memory_keys,
    })
}

fn summarize(points: &[Point], memory: &Memory) {
    let runs = points.iter().map(|p| p.runs.len()).max().unwrap_or(0);
    println!("\n== summary: medians of {runs} run(s); values/s counts every value of a block; latency in µs ==");
    println!(
        "{:<12} {:>4} {:>10} {:>10} {:>8} {:>8} {:>9}",
        "case", "conc", "calls/s", "values/s", "p50", "p99", "srv µs/c"
    );
    for p in points.iter().filter(|p| !p.runs.is_empty()) {
        let st = report::stats(p.runs.iter());
        println!(
            "{:<12} {:>4} {:>10.0} {:>10.0} {:>8.0} {:>8.0} {:>9.1}",
            p.case.name(),
            p.concurrency,
            st.calls_per_sec,
            st.seqs_per_sec,
            st.p50_us,
            st.p99_us,
            st.server_cpu_us
        );
    }
    let mut verdicts = print_ratios(points);
    verdicts.extend(print_memory(memory));
    report::print_targets(&verdicts);
}

/// The ratios of the pairs per caller count; the verdicts of the per-call targets.
fn print_ratios(points: &[Point]) -> Vec<(bool, String)> {
    let find = |case, c| {
        points
            .iter()
            .find(|p| p.case == case && p.concurrency == c && !p.runs.is_empty())
    };
    // Ratios of medians of per-run ratios: runs pair up by index (both measured in the same run).
    let ratio = |a: &Point, b: &Point, f: fn(&Sample) -> f64| {
        median(a.runs.iter().zip(&b.runs).map(|(x, y)| f(x) / f(y)).collect())
    };
    let cpu = |s: &Sample| s.server_cpu / s.calls.max(1) as f64;
    println!("\nratios (medians of per-run ratios):");
    println!(
        "{:<4} {:>14} {:>14} {:>16} {:>16} {:>15} {:>16}",
        "conc", "key/uid cpu", "key/uid val/s", "kres/ures cpu", "coal/redis-incr", "kcoal/ucoal", "kres/redis-by100"
    );
    let mut verdicts = Vec::new();
    for c in CONCURRENCIES {
        let r = |a, b, f: fn(&Sample) -> f64| match (find(a, c), find(b, c)) {
            (Some(x), Some(y)) => ratio(x, y, f),
            _ => f64::NAN,
        };
        let key_cpu = r(Case::KeyNext, Case::UidNext, cpu);
        let res_cpu = r(Case::KeyRes100, Case::UidRes100, cpu);
        let coal = r(Case::KeyCoalesced, Case::RedisIncr, Sample::seqs_per_sec);
        println!(
            "{:<4} {:>14.2} {:>14.2} {:>16.2} {:>16.2} {:>15.2} {:>16.2}",
            c,
            key_cpu,
            r(Case::KeyNext, Case::UidNext, Sample::seqs_per_sec),
            res_cpu,
            coal,
            r(Case::KeyCoalesced, Case::UidCoalesced, Sample::seqs_per_sec),
            r(Case::KeyRes100, Case::RedisBy100, Sample::seqs_per_sec)
        );
        // A point `--only`/`--callers` left out has no ratio (NaN): no verdict, rather than a
        // NOT MET for something not measured.
        if !key_cpu.is_nan() {
            verdicts.push((
                key_cpu <= 1.1,
                format!("a key costs <= 1.1x a uid per call (server CPU), {c} callers: {key_cpu:.2}"),
            ));
        }
        if c == 64 && !coal.is_nan() {
            verdicts.push((
                coal >= 2.0,
                format!("key-next through the Coalescer >= 2x Redis INCR at 64 callers: {coal:.2}"),
            ));
        }
    }
    verdicts
}

/// The memory line; the verdict of the memory target when Redis was measured.
fn print_memory(memory: &Memory) -> Option<(bool, String)> {
    println!(
        "\nmemory per live key ({} fresh keys): AllocSvr RSS growth {:.1} B; Redis RSS growth {}; Redis MEMORY USAGE {}",
        memory.keys,
        memory.alloc_rss,
        memory.redis_rss.map_or("not measured".into(), |b| format!("{b:.1} B")),
        memory
            .redis_usage
            .map_or("not measured".into(), |b| format!("{b:.1} B (mean of 1,000)")),
    );
    let m = memory.alloc_rss / memory.redis_rss?;
    Some((
        m <= 2.0,
        format!("memory per live key <= 2x Redis's (RSS growth): {m:.2}"),
    ))
}
