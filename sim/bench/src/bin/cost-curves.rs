//! `cost-curves`: what an AllocSvr and the StoreSvr set cost as the load grows, in one invocation.
//!
//! 1. **Touched uids**: 3 `storesvr` + ONE `allocsvr` (it owns every section). For N = 10^3 …
//!    10^`--max-uids-exp` it touches N distinct uids (contiguous from a fresh section range, in
//!    batches of 1,000, the most a call may carry), reads the AllocSvr's `VmRSS` (bytes per uid
//!    over the RSS before the first touch), then measures `BatchFetchNextSeq` of 100 uids drawn
//!    uniformly from the N touched uids for `--seconds` at `--concurrency`.
//! 2. **Sections per batch**: the same cluster, a pool of 100 sections touched beforehand; batches of
//!    100 uids spanning exactly 1, 2, 4, …, 64, 100 of them, at `--concurrency`.
//! 3. **AllocSvrs**: for K = 1, 2, 4, 8, 16 a fresh cluster (3 `storesvr` with a small
//!    `--bump-step`, K `allocsvr` processes, the sections split among them by the store's arbiter),
//!    batch100 load on `--hot-sections` hot uids per node (so every node crosses step boundaries all
//!    the time); the leader's Raft entries/s (applied index), committed bump items/s, the
//!    AllocSvrs' bump RPCs/s and the seqs/s served, over the measured window only.
//! 4. **Extrapolation** to the full 2^32 uid space from the measured bytes/uid, idle RSS and
//!    per-AllocSvr seqs/s, for an assumed demand (`--demand`) and RAM budget (`--ram-budget-gib`).
//! 5. **PNG plots** of the three curves into `--out-dir` (default `docs/img`), drawn by plotters.
//!
//! Steps 1–2 use `--step` 10,000 (the StoreSvr default): at these rates a section bumps at most a
//! few times a second, so bumps do not shape the curves. Every load loop stops by itself (warm-up
//! plus `--seconds`), every call has a deadline, every process is killed when its cluster is done
//! (the harness's `Supervisor`, also on panic). Exit code: 0 done, 2 bad options or missing
//! binaries, 3 the harness failed (a process died, no leader, a call failed).
//!
//! Deliberately left out: faults and moves (the simulator's job), more than one StoreSvr set, a
//! second machine (every process shares the same two cores, so the AllocSvr curve is a lower bound
//! of what one dedicated node does), and unary calls (alloc-bench measures them against an echo).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use seqsvr_proto::pb::alloc_service_client::AllocServiceClient;
use tonic::transport::Channel;

use seqsvr_bench::args;
use seqsvr_bench::cluster::{self, AllocNode, Stores};
use seqsvr_bench::costs::{self, Inputs, thousands};
use seqsvr_bench::exit::{Failure, harness};
use seqsvr_bench::load::{self, Pids, Sample, Shape, Uids};
use seqsvr_bench::plot::{self, Chart, Corner, Scale, Series};
use seqsvr_bench::procfs;
use seqsvr_bench::setup;
use seqsvr_harness::Supervisor;

/// Uids per section (the StoreSvr default).
const SECTION_SIZE: u64 = 100_000;
/// Uids per measured call.
const BATCH: usize = 100;
/// First section of the touched-uids curve; nothing else touches sections from here on.
const UIDS_FIRST_SECTION: u64 = 1_000;
/// First section of the sections-per-batch pool (after the 1,000 sections of 10^8 uids).
const SPAN_FIRST_SECTION: u64 = 5_000;
/// Sections in that pool: the widest batch spans all of them.
const SPAN_POOL: usize = 100;
/// Longest wait for ownership or serving.
const START_LIMIT: Duration = Duration::from_secs(120);
/// Idle window before the AllocSvr-count load: entries the set writes with no load (renewals).
const IDLE: Duration = Duration::from_secs(2);

#[derive(Parser, Debug)]
#[command(name = "cost-curves", version = seqsvr_plumbing::version::LONG, about = "AllocSvr and StoreSvr cost curves, with PNG plots")]
struct Args {
    #[command(flatten)]
    common: args::Common,
    /// Largest touched-uid count of step 1 is 10^this (3..=8; 10^8 uids = 800 MB of arrays).
    #[arg(long, default_value_t = 8)]
    max_uids_exp: u32,
    /// Callers of steps 1 and 2.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// StoreSvr step of steps 1 and 2.
    #[arg(long, default_value_t = 10_000)]
    step: u64,
    /// StoreSvr step of step 3 (small, so that every node bumps often).
    #[arg(long, default_value_t = 100)]
    bump_step: u64,
    /// Largest AllocSvr count of step 3 (1..=16).
    #[arg(long, default_value_t = 16)]
    max_allocsvrs: usize,
    /// Callers of step 3 in all, split evenly over the AllocSvrs.
    #[arg(long, default_value_t = 64)]
    store_concurrency: usize,
    /// Hot uids (one per section) each AllocSvr is asked for in step 3.
    #[arg(long, default_value_t = 8)]
    hot_sections: usize,
    /// Assumed aggregate demand for the extrapolation, seqs/s.
    #[arg(long, default_value_t = 10_000_000.0)]
    demand: f64,
    /// RAM one AllocSvr may use in the extrapolation, GiB.
    #[arg(long, default_value_t = 8.0)]
    ram_budget_gib: f64,
    /// Steps to run: any of uids, span, allocsvrs.
    #[arg(long, value_delimiter = ',', default_value = "uids,span,allocsvrs")]
    parts: Vec<String>,
    /// Where the PNG plots go.
    #[arg(long, default_value = "docs/img")]
    out_dir: PathBuf,
    /// Draw no plots.
    #[arg(long)]
    no_plots: bool,
}

impl Args {
    fn validate(&self) -> Result<(), String> {
        self.common.validate(60, 10_000)?;
        let checks: [(bool, &str); 10] = [
            ((3..=8).contains(&self.max_uids_exp), "--max-uids-exp must be in 3..=8"),
            (
                (1..=256).contains(&self.concurrency),
                "--concurrency must be in 1..=256",
            ),
            (
                (1_000..=1_000_000_000).contains(&self.step),
                "--step must be in 1000..=10^9",
            ),
            (
                (10..=1_000_000).contains(&self.bump_step),
                "--bump-step must be in 10..=10^6",
            ),
            (
                (1..=16).contains(&self.max_allocsvrs),
                "--max-allocsvrs must be in 1..=16",
            ),
            (
                (self.max_allocsvrs..=512).contains(&self.store_concurrency),
                "--store-concurrency must be in --max-allocsvrs..=512",
            ),
            (
                (1..=64).contains(&self.hot_sections),
                "--hot-sections must be in 1..=64",
            ),
            (self.demand.is_finite() && self.demand > 0.0, "--demand must be > 0"),
            (
                self.ram_budget_gib.is_finite() && (0.1..=4096.0).contains(&self.ram_budget_gib),
                "--ram-budget-gib must be in 0.1..=4096",
            ),
            (!self.parts.is_empty(), "--parts names no step"),
        ];
        if let Some((_, msg)) = checks.iter().find(|(ok, _)| !ok) {
            return Err((*msg).into());
        }
        if let Some(p) = self
            .parts
            .iter()
            .find(|p| !["uids", "span", "allocsvrs"].contains(&p.as_str()))
        {
            return Err(format!("--parts: unknown step {p:?} (uids, span, allocsvrs)"));
        }
        Ok(())
    }

    fn part(&self, name: &str) -> bool {
        self.parts.iter().any(|p| p == name)
    }
}

fn main() -> ExitCode {
    let args: Args = seqsvr_plumbing::cli::parse("COST_CURVES");
    let bench = async { run(&args).await.map(|()| true) };
    seqsvr_bench::exit::run_valid("cost-curves", args.validate(), bench)
}

/// One point of the touched-uids curve.
struct UidsPoint {
    uids: u64,
    rss: u64,
    bytes_per_uid: f64,
    touch_secs: f64,
    sample: Sample,
}

/// One point of the sections-per-batch curve.
struct SpanPoint {
    span: usize,
    sample: Sample,
}

/// One point of the AllocSvr-count curve.
struct StorePoint {
    allocsvrs: usize,
    seqs_per_sec: f64,
    not_ok: u64,
    errors: u64,
    p99_us: f64,
    entries_per_sec: f64,
    items_per_sec: f64,
    rpcs_per_sec: f64,
    idle_entries_per_sec: f64,
    leader_cpu_pct: f64,
}

/// Everything measured, for the tables, the extrapolation and the plots.
#[derive(Default)]
struct Results {
    base_rss: Option<u64>,
    uids: Vec<UidsPoint>,
    spans: Vec<SpanPoint>,
    stores: Vec<StorePoint>,
}

async fn run(args: &Args) -> Result<(), Failure> {
    let bins = cluster::binaries().map_err(Failure::Usage)?;
    if !args.no_plots {
        std::fs::create_dir_all(&args.out_dir)
            .map_err(|e| Failure::Usage(format!("cannot create --out-dir {}: {e}", args.out_dir.display())))?;
    }
    let tmp = setup::temp_dir(args.common.dir.as_deref(), &bins)?;
    print_machine(args, tmp.path());
    let mut r = Results::default();
    if args.part("uids") || args.part("span") {
        one_allocsvr(args, &bins, &tmp.path().join("one"), &mut r).await?;
    }
    if args.part("allocsvrs") {
        for k in costs::allocsvr_counts(args.max_allocsvrs) {
            let p = many_allocsvrs(args, &bins, &tmp.path().join(format!("k{k}")), k).await?;
            r.stores.push(p);
        }
    }
    print_tables(args, &r);
    extrapolate(args, &r);
    if !args.no_plots {
        for path in plots(args, &r).map_err(Failure::Harness)? {
            let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            println!("plot: {} ({} KB)", path.display(), size / 1024);
        }
    }
    Ok(())
}

/// The cluster of steps 1 and 2 and its clients.
struct OneNode {
    stores: Stores,
    alloc: AllocNode,
    clients: Vec<AllocServiceClient<Channel>>,
    route_version: u64,
    ours: Vec<u32>,
}

impl OneNode {
    fn pids(&self) -> Pids<'_> {
        Pids {
            server: self.alloc.pid,
            others: &self.stores.pids,
            ours: &self.ours,
        }
    }

    async fn quiet(&self, args: &Args) {
        let quiet = &args.common.quiet;
        cluster::wait_quiet(&self.ours, quiet.quiet_below, quiet.wait()).await;
    }

    /// batch100 over `uids` at `--concurrency`; fails on a dead process or a point with no call.
    async fn measure(&self, args: &Args, procs: &mut Supervisor, uids: Uids) -> Result<Sample, Failure> {
        self.quiet(args).await;
        let n = cluster::channel_count(args.concurrency);
        let c = args.concurrency;
        let s = load::raw(
            &self.clients[..n],
            c,
            Shape::Batch(BATCH),
            uids,
            self.route_version,
            args.common.window.durations(),
            self.pids(),
        )
        .await;
        setup::check(procs, "a point", &s)?;
        Ok(s)
    }
}

/// Steps 1 and 2: 3 StoreSvrs and one AllocSvr that owns every section.
async fn one_allocsvr(args: &Args, bins: &cluster::Binaries, dir: &Path, r: &mut Results) -> Result<(), Failure> {
    let mut procs = setup::supervisor(dir)?;
    let stores = cluster::start_stores(&mut procs, &bins.storesvr, dir, args.step, SECTION_SIZE)
        .await
        .map_err(harness)?;
    let alloc = cluster::start_allocsvr(&mut procs, &bins.allocsvr, 1, &stores).map_err(harness)?;
    let t0 = std::time::Instant::now();
    cluster::wait_balanced(&stores.leader, 1, START_LIMIT)
        .await
        .map_err(harness)?;
    let clients = cluster::channels(&alloc.addr, cluster::channel_count(args.concurrency).max(4))
        .await
        .map_err(harness)?;
    let max_uids = 10u64.pow(args.max_uids_exp);
    let mut used = costs::sections_of(UIDS_FIRST_SECTION, max_uids, SECTION_SIZE);
    used.extend(SPAN_FIRST_SECTION..SPAN_FIRST_SECTION + SPAN_POOL as u64);
    let firsts: Vec<u64> = used.iter().map(|s| s * SECTION_SIZE).collect();
    let route_version = cluster::wait_serving(&clients[0], &firsts, START_LIMIT)
        .await
        .map_err(harness)?;
    println!(
        "cluster: 3 storesvr (step {}) + 1 allocsvr, every section owned and the {} sections used served {:.1} s after start",
        args.step,
        used.len(),
        t0.elapsed().as_secs_f64()
    );
    let mut ours = stores.pids.clone();
    ours.push(alloc.pid);
    let node = OneNode {
        stores,
        alloc,
        clients,
        route_version,
        ours,
    };
    if args.part("uids") {
        touched_uids(args, &node, &mut procs, r).await?;
    }
    if args.part("span") {
        sections_per_batch(args, &node, &mut procs, r).await?;
    }
    Ok(())
}

/// Step 1: touch 10^3 … 10^max uids (growing one range), RSS and batch100 throughput at each.
async fn touched_uids(args: &Args, node: &OneNode, procs: &mut Supervisor, r: &mut Results) -> Result<(), Failure> {
    let rss = || procfs::rss_bytes(node.alloc.pid).ok_or_else(|| harness("cannot read the allocsvr's RSS"));
    let base = rss()?;
    r.base_rss = Some(base);
    println!(
        "\n== step 1: touched uids (allocsvr RSS before the first touch: {}) ==",
        costs::gib(base as f64)
    );
    let first = UIDS_FIRST_SECTION * SECTION_SIZE;
    let mut touched = 0;
    for n in costs::uid_counts(args.max_uids_exp) {
        let t = std::time::Instant::now();
        cluster::touch(&node.clients, first + touched, n - touched, node.route_version)
            .await
            .map_err(harness)?;
        let touch_secs = t.elapsed().as_secs_f64();
        touched = n;
        let now = rss()?;
        let bytes_per_uid = (now as f64 - base as f64) / n as f64;
        let sample = node.measure(args, procs, Uids::Range { first, count: n }).await?;
        println!(
            "  {n:>11} uids: touched in {touch_secs:.1} s, RSS {}, {bytes_per_uid:.2} bytes/uid; batch100@{}: {} seqs/s, p50 {:.0} µs, p99 {:.0} µs, foreign {:.0} %",
            costs::gib(now as f64),
            args.concurrency,
            thousands(sample.seqs_per_sec()),
            sample.quantile_us(0.5),
            sample.quantile_us(0.99),
            sample.foreign_pct()
        );
        r.uids.push(UidsPoint {
            uids: n,
            rss: now,
            bytes_per_uid,
            touch_secs,
            sample,
        });
    }
    Ok(())
}

/// Step 2: batches spanning 1 … 100 sections of a pool touched beforehand.
async fn sections_per_batch(
    args: &Args,
    node: &OneNode,
    procs: &mut Supervisor,
    r: &mut Results,
) -> Result<(), Failure> {
    let first = SPAN_FIRST_SECTION * SECTION_SIZE;
    let t = std::time::Instant::now();
    cluster::touch(
        &node.clients,
        first,
        SPAN_POOL as u64 * SECTION_SIZE,
        node.route_version,
    )
    .await
    .map_err(harness)?;
    println!(
        "\n== step 2: sections per batch (pool of {SPAN_POOL} sections, every uid touched in {:.1} s) ==",
        t.elapsed().as_secs_f64()
    );
    let pool = Arc::new((SPAN_FIRST_SECTION..SPAN_FIRST_SECTION + SPAN_POOL as u64).collect::<Vec<u64>>());
    for span in costs::spans(SPAN_POOL) {
        let uids = Uids::Striped {
            sections: pool.clone(),
            section_size: SECTION_SIZE,
            span,
        };
        let sample = node.measure(args, procs, uids).await?;
        println!(
            "  {span:>3} sections per batch: {} seqs/s, p50 {:.0} µs, p99 {:.0} µs, server {:.1} µs CPU per call, foreign {:.0} %",
            thousands(sample.seqs_per_sec()),
            sample.quantile_us(0.5),
            sample.quantile_us(0.99),
            sample.server_cpu * 1e6 / sample.calls.max(1) as f64,
            sample.foreign_pct()
        );
        r.spans.push(SpanPoint { span, sample });
    }
    Ok(())
}

/// The cluster of one point of step 3.
struct ManyNodes {
    stores: Stores,
    allocs: Vec<AllocNode>,
    /// Per node: its clients, its hot uids and its route version.
    targets: Vec<(Vec<AllocServiceClient<Channel>>, Vec<u64>, u64)>,
    ours: Vec<u32>,
}

/// Starts 3 StoreSvrs and `k` AllocSvrs; returns when the arbiter has balanced the sections and
/// every node serves its hot uids.
async fn start_many(
    args: &Args,
    bins: &cluster::Binaries,
    dir: &Path,
    procs: &mut Supervisor,
    k: usize,
) -> Result<ManyNodes, Failure> {
    let stores = cluster::start_stores(procs, &bins.storesvr, dir, args.bump_step, SECTION_SIZE)
        .await
        .map_err(harness)?;
    let mut allocs = Vec::new();
    for id in 1..=k as u64 {
        allocs.push(cluster::start_allocsvr(procs, &bins.allocsvr, id, &stores).map_err(harness)?);
    }
    let t0 = std::time::Instant::now();
    cluster::wait_balanced(&stores.leader, k, START_LIMIT)
        .await
        .map_err(harness)?;
    let table = cluster::routes(&stores.leader).await.map_err(harness)?;
    let mut targets = Vec::new();
    let per_node = costs::split(args.store_concurrency, k);
    for (a, conc) in allocs.iter().zip(&per_node) {
        let run = table
            .entries
            .iter()
            .find(|e| e.node_id == a.node_id)
            .ok_or_else(|| harness(format!("node {} owns no sections in the route table", a.node_id)))?;
        let hot = costs::hot_uids(run.section_begin, run.section_end, args.hot_sections, SECTION_SIZE);
        let clients = cluster::channels(&a.addr, cluster::channel_count(*conc))
            .await
            .map_err(harness)?;
        let version = cluster::wait_serving(&clients[0], &hot, START_LIMIT)
            .await
            .map_err(harness)?;
        targets.push((clients, hot, version));
    }
    println!(
        "\n== step 3: {k} allocsvr(s), 3 storesvr (step {}): balanced and serving {:.1} s after start ==",
        args.bump_step,
        t0.elapsed().as_secs_f64()
    );
    let mut ours = stores.pids.clone();
    ours.extend(allocs.iter().map(|a| a.pid));
    Ok(ManyNodes {
        stores,
        allocs,
        targets,
        ours,
    })
}

/// Step 3, one K: idle entries/s, then batch100 load on every node's hot uids while the store's
/// counters are read at the start and the end of the measured window.
async fn many_allocsvrs(args: &Args, bins: &cluster::Binaries, dir: &Path, k: usize) -> Result<StorePoint, Failure> {
    let mut procs = setup::supervisor(dir)?;
    let m = start_many(args, bins, dir, &mut procs, k).await?;
    let quiet = &args.common.quiet;
    cluster::wait_quiet(&m.ours, quiet.quiet_below, quiet.wait()).await;
    let i0 = cluster::read_store(&m.stores, &m.allocs).await.map_err(harness)?;
    tokio::time::sleep(IDLE).await;
    let i1 = cluster::read_store(&m.stores, &m.allocs).await.map_err(harness)?;
    let idle_entries_per_sec = (i1.applied_index - i0.applied_index) as f64 / IDLE.as_secs_f64();
    let window = args.common.window.durations();
    let per_node = costs::split(args.store_concurrency, k);
    let mut tasks = Vec::new();
    for ((clients, hot, version), (a, conc)) in m.targets.iter().zip(m.allocs.iter().zip(per_node)) {
        let (clients, uids, version) = (
            clients.clone(),
            Uids::Hot {
                uids: Arc::new(hot.clone()),
            },
            *version,
        );
        let (server, others, ours) = (a.pid, m.stores.pids.clone(), m.ours.clone());
        tasks.push(tokio::spawn(async move {
            let pids = Pids {
                server,
                others: &others,
                ours: &ours,
            };
            load::raw(&clients, conc, Shape::Batch(BATCH), uids, version, window, pids).await
        }));
    }
    // The counters bracket the measured window only, as the load loops count calls.
    tokio::time::sleep(window.warmup).await;
    let r0 = cluster::read_store(&m.stores, &m.allocs).await.map_err(harness)?;
    tokio::time::sleep(window.measure).await;
    let r1 = cluster::read_store(&m.stores, &m.allocs).await.map_err(harness)?;
    let mut samples = Vec::new();
    for t in tasks {
        samples.push(t.await.map_err(|e| harness(format!("load task: {e}")))?);
    }
    cluster::check_alive(&mut procs).map_err(harness)?;
    let point = store_point(k, &samples, r0, r1, window.measure.as_secs_f64(), idle_entries_per_sec)?;
    print_store_point(&point);
    Ok(point)
}

/// Figures of one K from the samples and the readings around the window.
fn store_point(
    k: usize,
    samples: &[Sample],
    r0: cluster::StoreReading,
    r1: cluster::StoreReading,
    secs: f64,
    idle_entries_per_sec: f64,
) -> Result<StorePoint, Failure> {
    if samples.iter().any(|s| s.calls == 0) {
        let (errors, not_ok): (u64, u64) = samples
            .iter()
            .map(|s| (s.errors, s.not_ok))
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        return Err(harness(format!(
            "a node completed no call ({errors} errors, {not_ok} not OK)"
        )));
    }
    let mut hist = samples[0].hist.clone();
    for s in &samples[1..] {
        hist.add(&s.hist).map_err(|e| harness(format!("histograms: {e}")))?;
    }
    Ok(StorePoint {
        allocsvrs: k,
        seqs_per_sec: samples.iter().map(Sample::seqs_per_sec).sum(),
        not_ok: samples.iter().map(|s| s.not_ok).sum(),
        errors: samples.iter().map(|s| s.errors).sum(),
        p99_us: hist.value_at_quantile(0.99) as f64 / 1e3,
        entries_per_sec: (r1.applied_index - r0.applied_index) as f64 / secs,
        items_per_sec: (r1.bump_items - r0.bump_items) / secs,
        rpcs_per_sec: (r1.bump_rpcs - r0.bump_rpcs) / secs,
        idle_entries_per_sec,
        leader_cpu_pct: (r1.leader_cpu - r0.leader_cpu) * 100.0 / secs,
    })
}

fn print_store_point(p: &StorePoint) {
    println!(
        "  {} allocsvr(s): {} seqs/s (p99 {:.0} µs, {} not OK, {} errors); store: {} entries/s ({} idle), {} bump items/s, {} bump RPCs/s, leader CPU {:.0} %",
        p.allocsvrs,
        thousands(p.seqs_per_sec),
        p.p99_us,
        p.not_ok,
        p.errors,
        thousands(p.entries_per_sec),
        thousands(p.idle_entries_per_sec),
        thousands(p.items_per_sec),
        thousands(p.rpcs_per_sec),
        p.leader_cpu_pct
    );
}

/// The three curves as Markdown tables (the run's tables for docs/benchmarks/cost-curves.md).
fn print_tables(args: &Args, r: &Results) {
    if !r.uids.is_empty() {
        println!(
            "\n### touched uids (batch100 @{}, step {})\n",
            args.concurrency, args.step
        );
        println!(
            "| touched uids | touch time s | AllocSvr RSS | RSS bytes/uid over idle | seqs/s | p50 µs | p99 µs | foreign % |"
        );
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
        for p in &r.uids {
            let s = &p.sample;
            println!(
                "| {} | {:.1} | {} | {:.2} | {} | {:.0} | {:.0} | {:.0} |",
                thousands(p.uids as f64),
                p.touch_secs,
                costs::gib(p.rss as f64),
                p.bytes_per_uid,
                thousands(s.seqs_per_sec()),
                s.quantile_us(0.5),
                s.quantile_us(0.99),
                s.foreign_pct()
            );
        }
    }
    if !r.spans.is_empty() {
        println!(
            "\n### sections per batch (batch100 @{}, pool of {SPAN_POOL} touched sections)\n",
            args.concurrency
        );
        println!("| sections per batch | seqs/s | p50 µs | p99 µs | AllocSvr CPU µs/call | foreign % |");
        println!("|---:|---:|---:|---:|---:|---:|");
        for p in &r.spans {
            let s = &p.sample;
            println!(
                "| {} | {} | {:.0} | {:.0} | {:.1} | {:.0} |",
                p.span,
                thousands(s.seqs_per_sec()),
                s.quantile_us(0.5),
                s.quantile_us(0.99),
                s.server_cpu * 1e6 / s.calls.max(1) as f64,
                s.foreign_pct()
            );
        }
    }
    if !r.stores.is_empty() {
        print_store_table(args, &r.stores);
    }
}

fn print_store_table(args: &Args, points: &[StorePoint]) {
    println!(
        "\n### AllocSvrs (step {}, {} callers in all, batch100 on {} hot uids per AllocSvr)\n",
        args.bump_step, args.store_concurrency, args.hot_sections
    );
    println!(
        "| AllocSvrs | seqs/s | p99 µs | not OK | Raft entries/s | idle entries/s | bump items/s | items/entry | bump RPCs/s | leader CPU % |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for p in points {
        println!(
            "| {} | {} | {:.0} | {} | {} | {} | {} | {:.1} | {} | {:.0} |",
            p.allocsvrs,
            thousands(p.seqs_per_sec),
            p.p99_us,
            p.not_ok + p.errors,
            thousands(p.entries_per_sec),
            thousands(p.idle_entries_per_sec),
            thousands(p.items_per_sec),
            p.items_per_sec / p.entries_per_sec.max(1e-9),
            thousands(p.rpcs_per_sec),
            p.leader_cpu_pct
        );
    }
}

/// Step 4: from the largest touched-uid point (bytes/uid, seqs/s) and the idle RSS.
fn extrapolate(args: &Args, r: &Results) {
    let (Some(base), Some(last)) = (r.base_rss, r.uids.last()) else {
        println!("\nextrapolation: needs step 1 (--parts uids)");
        return;
    };
    let inputs = Inputs {
        bytes_per_uid: last.bytes_per_uid,
        base_rss: base as f64,
        seqs_per_sec_per_node: last.sample.seqs_per_sec(),
        demand: args.demand,
        ram_budget: args.ram_budget_gib * (1u64 << 30) as f64,
        section_size: SECTION_SIZE,
        step: args.step,
    };
    println!(
        "\n### extrapolation to the full uid space (from the {} touched uids point)\n",
        thousands(last.uids as f64)
    );
    match costs::size(&inputs) {
        Ok(s) => costs::sizing_lines(&inputs, &s).iter().for_each(|l| println!("- {l}")),
        Err(e) => println!("- no sizing: {e}"),
    }
    if let Some(best) = r.stores.iter().map(|p| p.items_per_sec).reduce(f64::max) {
        println!(
            "- StoreSvr measured in step 3: up to {} committed bump items/s on this machine",
            thousands(best)
        );
    }
}

/// Step 5: the three PNGs (only those whose step ran).
fn plots(args: &Args, r: &Results) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    if !r.uids.is_empty() {
        out.push(uids_plot(args, &r.uids)?);
    }
    if !r.spans.is_empty() {
        out.push(spans_plot(args, &r.spans)?);
    }
    if !r.stores.is_empty() {
        out.push(store_plot(args, &r.stores)?);
    }
    Ok(out)
}

fn chart(title: String, x: &str, y: &str, xs: Scale, ys: Scale, legend: Corner) -> Chart {
    Chart {
        title,
        x_label: x.into(),
        y_label: y.into(),
        x: xs,
        y: ys,
        legend,
    }
}

fn uids_plot(args: &Args, points: &[UidsPoint]) -> Result<PathBuf, String> {
    let pts = |f: &dyn Fn(&UidsPoint) -> f64| points.iter().map(|p| (p.uids as f64, f(p))).collect();
    let x = "touched uids";
    let title = format!("AllocSvr batch100 @{}: seqs/s vs touched uids", args.concurrency);
    let top = chart(title, x, "seqs/s", Scale::Log10, Scale::Linear, Corner::LowerLeft);
    let title = "AllocSvr RSS per touched uid (over the idle RSS)".to_string();
    // Linear: the small counts measure ~0 bytes/uid (freed heap pages reused), which a log axis
    // could not show.
    let bottom = chart(title, x, "bytes/uid", Scale::Log10, Scale::Linear, Corner::LowerRight);
    let path = args.out_dir.join("cost-touched-uids.png");
    plot::panels(
        &path,
        &[
            (top, vec![Series::new("seqs/s", 0, pts(&|p| p.sample.seqs_per_sec()))]),
            (bottom, vec![Series::new("RSS bytes/uid", 1, pts(&|p| p.bytes_per_uid))]),
        ],
    )?;
    Ok(path)
}

fn spans_plot(args: &Args, points: &[SpanPoint]) -> Result<PathBuf, String> {
    let pts = |f: &dyn Fn(&Sample) -> f64| points.iter().map(|p| (p.span as f64, f(&p.sample))).collect();
    let x = "sections one batch of 100 uids spans";
    let title = format!("AllocSvr batch100 @{}: seqs/s vs sections per batch", args.concurrency);
    let top = chart(title, x, "seqs/s", Scale::Log2, Scale::Linear, Corner::LowerLeft);
    let bottom = chart("latency".into(), x, "µs", Scale::Log2, Scale::Linear, Corner::UpperLeft);
    let title = "AllocSvr CPU per call (less sensitive to other load than seqs/s)".to_string();
    let cpu = chart(title, x, "µs per call", Scale::Log2, Scale::Linear, Corner::LowerRight);
    let path = args.out_dir.join("cost-sections-per-batch.png");
    let latency = vec![
        Series::new("p50", 2, pts(&|s| s.quantile_us(0.5))),
        Series::new("p99", 1, pts(&|s| s.quantile_us(0.99))),
    ];
    let cpu_per_call = pts(&|s| s.server_cpu * 1e6 / s.calls.max(1) as f64);
    plot::panels(
        &path,
        &[
            (top, vec![Series::new("seqs/s", 0, pts(&Sample::seqs_per_sec))]),
            (bottom, latency),
            (cpu, vec![Series::new("AllocSvr CPU µs/call", 3, cpu_per_call)]),
        ],
    )?;
    Ok(path)
}

fn store_plot(args: &Args, points: &[StorePoint]) -> Result<PathBuf, String> {
    let pts = |f: &dyn Fn(&StorePoint) -> f64| points.iter().map(|p| (p.allocsvrs as f64, f(p))).collect();
    let x = "AllocSvr processes";
    let title = format!("StoreSvr leader writes vs AllocSvrs (step {})", args.bump_step);
    let top = chart(title, x, "per second", Scale::Log2, Scale::Linear, Corner::UpperLeft);
    let title = "seqs/s served by all AllocSvrs".to_string();
    let bottom = chart(title, x, "seqs/s", Scale::Log2, Scale::Linear, Corner::LowerLeft);
    let path = args.out_dir.join("cost-allocsvrs.png");
    let writes = vec![
        Series::new("Raft entries/s", 0, pts(&|p| p.entries_per_sec)),
        Series::new("bump items/s", 1, pts(&|p| p.items_per_sec)),
        Series::new("bump RPCs/s", 2, pts(&|p| p.rpcs_per_sec)),
    ];
    plot::panels(
        &path,
        &[
            (top, writes),
            (bottom, vec![Series::new("seqs/s", 0, pts(&|p| p.seqs_per_sec))]),
        ],
    )?;
    Ok(path)
}

fn print_machine(args: &Args, dir: &Path) {
    let options = format!(
        "--max-uids-exp {} --seconds {} --warmup-ms {} --concurrency {} --step {} --bump-step {} --max-allocsvrs {} --store-concurrency {} --hot-sections {} --parts {}",
        args.max_uids_exp,
        args.common.window.seconds,
        args.common.window.warmup_ms,
        args.concurrency,
        args.step,
        args.bump_step,
        args.max_allocsvrs,
        args.store_concurrency,
        args.hot_sections,
        args.parts.join(",")
    );
    setup::print_header(&options, dir);
}
