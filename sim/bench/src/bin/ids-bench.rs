//! `ids-bench`: time-ordered ids (`AllocService.NextIds`) side by side, in one run, with a bare
//! tonic echo and with a Snowflake gRPC server that others wrote (ferroid-tonic-server 2.0.0).
//!
//! 1. Starts a local cluster: 3 `storesvr` (set 0, Twitter id layout) + ONE `allocsvr`, and waits
//!    until the AllocSvr holds an id slot and answers a `NextIds`.
//! 2. Starts the baseline echo (`ids-bench --serve-echo ADDR`: `seqsvr_bench::echo`, whose
//!    `NextIds` answers one run of `count` ids from nothing) and, when it is installed
//!    (`sim/bench/install-ferroid.sh`), ferroid-tonic-server on 127.0.0.1 with one generator, as the
//!    AllocSvr first holds one slot (it asks for more as its rate grows; the run prints how many it
//!    holds after each point): twice, as shipped and with `TCP_NODELAY` on its accepted sockets (an
//!    LD_PRELOAD shim; as shipped each call waits ~40 ms for a delayed ACK: `seqsvr_bench::ferroid`).
//!    Without it, ferroid is skipped with a line saying how to install it.
//! 3. At `count` 1 and 100 ids per call and 1, 16, 64, 256 callers (closed loop, one channel per 32
//!    callers, at most 8): the servers one after another, in an order that rotates from point to
//!    point and run to run, so that drift on a shared machine hits each alike. A ferroid call is
//!    one `StreamIds` of `count` ids read to its end. `--callers` and `--counts` keep a subset of
//!    the points (to measure one point many times).
//! 4. Per run, the in-process ceiling of one slot: `SlotIssuer` in a tight loop on this thread,
//!    next to the layout's limit (4,096 ids per millisecond per slot).
//!
//! The summary gives medians over `--runs`, ids/s (count × calls), p50/p99, server CPU per call,
//! the ratios AllocSvr/ferroid and AllocSvr/echo, and says which targets are met. Targets are
//! printed, not asserted: exit code 0 when measuring worked, 2 bad options or missing binaries,
//! 3 the harness failed (a process died, no slot, a server answered nothing).
//!
//! Every process is started through the harness's `Supervisor` and killed by pid when the run ends
//! (also on panic); everything listens on 127.0.0.1; every load loop stops by itself.
//!
//! Deliberately left out: `--tls` (alloc-bench measures what TLS costs a call), more than one
//! AllocSvr, ferroid with more generators than the AllocSvr has slots (`--ferroid-workers` can
//! ask for it), and open-loop load.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use seqsvr_bench::args::{self, chosen};
use seqsvr_bench::cluster;
use seqsvr_bench::exit::{Failure, harness};
use seqsvr_bench::ids::{self, Ceiling, Point, Server};
use seqsvr_bench::load::{Pids, Sample, Window};
use seqsvr_bench::report::median;
use seqsvr_bench::setup::{self, Run};
use seqsvr_bench::{echo, ferroid, procfs, report};
use seqsvr_harness::Supervisor;
use seqsvr_proto::id_layout::IdLayout;
use seqsvr_proto::pb::alloc_service_client::AllocServiceClient;
use tonic::transport::Channel;

/// Uids per section and step: the StoreSvr defaults alloc-bench uses (NextIds touches no uid).
const SECTION_SIZE: u64 = 100_000;
const STEP: u64 = 10_000;
/// Ids per call.
const COUNTS: [u32; 2] = [1, 100];
const CONCURRENCIES: [usize; 4] = [1, 16, 64, 256];
/// Most channels per server; task `t` uses channel `t % n`.
const MAX_CHANNELS: usize = 8;
/// How long the in-process ceiling loop runs per count and run.
const CEILING_WINDOW: Duration = Duration::from_secs(1);
/// Longest wait for the AllocSvr to hold a slot and issue.
const ISSUING_LIMIT: Duration = Duration::from_secs(60);

#[derive(Parser, Debug)]
#[command(name = "ids-bench", version = seqsvr_plumbing::version::LONG,
    about = "NextIds against a bare tonic echo and ferroid-tonic-server"
)]
struct Args {
    #[command(flatten)]
    common: args::Common,
    /// Times every point is measured (each time against all three servers); medians are shown.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// The ferroid-tonic-server binary (default: on PATH, else where install-ferroid.sh puts it).
    #[arg(long, value_name = "PATH")]
    ferroid_bin: Option<PathBuf>,
    /// ferroid's `--num-workers`: Snowflake generators (machine ids) in its one process.
    #[arg(long, default_value_t = 1)]
    ferroid_workers: usize,
    /// The TCP_NODELAY shim for ferroid (default: `../lib/ferroid-nodelay.so` from its binary's dir).
    #[arg(long, value_name = "PATH")]
    ferroid_shim: Option<PathBuf>,
    /// Measure only these numbers of callers (of 1, 16, 64, 256; default all): one point measured
    /// many times, alternating the servers, says more than a full run in a noisy hour.
    #[arg(long, value_delimiter = ',')]
    callers: Vec<usize>,
    /// Measure only these ids per call (of 1, 100; default both).
    #[arg(long, value_delimiter = ',')]
    counts: Vec<u32>,
    #[command(flatten)]
    echo: echo::ChildFlags,
}

impl Args {
    fn validate(&self) -> Result<(), String> {
        self.common.validate(600, 60_000)?;
        args::check_runs(self.runs)?;
        args::check_subset("--callers", &self.callers, &CONCURRENCIES)?;
        args::check_subset("--counts", &self.counts, &COUNTS)?;
        if !(1..=1_024).contains(&self.ferroid_workers) {
            return Err("--ferroid-workers must be in 1..=1024".into());
        }
        Ok(())
    }
}

fn main() -> ExitCode {
    let args: Args = seqsvr_plumbing::cli::parse("IDS_BENCH");
    if let Some(code) = args.echo.serve(SECTION_SIZE) {
        return code;
    }
    seqsvr_bench::exit::run_valid("ids-bench", args.validate(), bench(&args))
}

/// The running servers, channels to each, and what the samples need to know about them.
struct Servers {
    alloc_pid: u32,
    store_pids: Vec<u32>,
    echo_pid: u32,
    /// The ferroid variants running ([`Server::Ferroid`], [`Server::FerroidNodelay`]), each with
    /// its clients.
    ferroids: Vec<(Server, ferroid::Server, Vec<FerroidClient>)>,
    alloc: Vec<AllocServiceClient<Channel>>,
    echo: Vec<AllocServiceClient<Channel>>,
    /// Every process this benchmark started (the rest of the machine's busy time is foreign load).
    ours: Vec<u32>,
    layout: IdLayout,
    /// Slots the AllocSvr held when it first issued (it asks for more as its load grows).
    slots_held: u64,
    /// The StoreSvr leader, whose Status says how many slots are held.
    leader: String,
}

type FerroidClient = ferroid::pb::id_generator_client::IdGeneratorClient<Channel>;

impl Servers {
    fn pids<'a>(&'a self, server: u32, others: &'a [u32]) -> Pids<'a> {
        Pids {
            server,
            others,
            ours: &self.ours,
        }
    }

    /// One load of `server` at this point; `None` for a ferroid that is not running.
    async fn measure(&self, server: Server, count: u32, c: usize, window: Window) -> Option<Sample> {
        let n = cluster::channel_count(c).min(MAX_CHANNELS);
        Some(match server {
            Server::Alloc => {
                let pids = self.pids(self.alloc_pid, &self.store_pids);
                ids::next_ids(&self.alloc[..n], c, count, window, pids).await
            }
            Server::Echo => ids::next_ids(&self.echo[..n], c, count, window, self.pids(self.echo_pid, &[])).await,
            Server::Ferroid | Server::FerroidNodelay => {
                let (_, f, clients) = self.ferroids.iter().find(|(s, ..)| *s == server)?;
                ferroid::load(&clients[..n], c, count, window, self.pids(f.pid, &[])).await
            }
        })
    }
}

/// Starts the cluster, the echo and ferroid; returns once the AllocSvr issues ids.
async fn start(args: &Args, run: &mut Run) -> Result<Servers, Failure> {
    let exe = std::env::current_exe().map_err(|e| harness(format!("cannot find own binary: {e}")))?;
    let (echo_addr, echo_pid) = echo::start(&mut run.procs, &exe).await.map_err(harness)?;
    let layout_flag = ["--id-layout=twitter".to_string()];
    let one = run.one_allocsvr(STEP, SECTION_SIZE, &layout_flag, MAX_CHANNELS).await?;
    let (slots_held, layout) = ids::wait_issuing(&one.stores.leader, &one.clients[0], ISSUING_LIMIT)
        .await
        .map_err(harness)?;
    let (procs, dir) = run.procs_and_dir();
    println!(
        "cluster: 3 storesvr + 1 allocsvr; ids: {layout}, {slots_held} slot(s) held, first id {:.1} s after the allocsvr started; logs in {}",
        one.started.elapsed().as_secs_f64(),
        dir.join("logs").display()
    );
    let echo = cluster::channels(&echo_addr, MAX_CHANNELS).await.map_err(harness)?;
    let mut ours = vec![echo_pid, one.node.pid];
    ours.extend(&one.stores.pids);
    let ferroids = start_ferroids(args, procs, dir).await?;
    ours.extend(ferroids.iter().map(|(_, f, _)| f.pid));
    Ok(Servers {
        alloc_pid: one.node.pid,
        store_pids: one.stores.pids,
        echo_pid,
        ferroids,
        alloc: one.clients,
        echo,
        ours,
        layout,
        slots_held,
        leader: one.stores.leader,
    })
}

/// ferroid as shipped and with the TCP_NODELAY shim, each skipped with a line saying why when its
/// binary or the shim is missing.
async fn start_ferroids(
    args: &Args,
    procs: &mut Supervisor,
    dir: &Path,
) -> Result<Vec<(Server, ferroid::Server, Vec<FerroidClient>)>, Failure> {
    let Some(bin) = ferroid::find(args.ferroid_bin.as_deref()) else {
        let at = args.ferroid_bin.as_ref().map(|p| format!(" at {}", p.display()));
        println!(
            "ferroid: not measured ({} not found{}; install it with ./sim/bench/install-ferroid.sh, or pass --ferroid-bin PATH)",
            ferroid::BINARY,
            at.unwrap_or_default()
        );
        return Ok(Vec::new());
    };
    let shim = ferroid::shim(&bin, args.ferroid_shim.as_deref());
    if shim.is_none() {
        println!(
            "ferroid with TCP_NODELAY: not measured (no {}; ./sim/bench/install-ferroid.sh builds it)",
            ferroid::SHIM
        );
    }
    let mut out = Vec::new();
    for (server, preload) in [(Server::Ferroid, None), (Server::FerroidNodelay, shim.as_deref())] {
        if server == Server::FerroidNodelay && preload.is_none() {
            continue;
        }
        let f = ferroid::start(procs, dir, &bin, args.ferroid_workers, preload)
            .await
            .map_err(|e| harness(format!("ferroid: {e}")))?;
        let other = if f.version.ends_with(ferroid::VERSION) {
            String::new()
        } else {
            format!(" (not {}, which docs/BENCHMARKS.md is about)", ferroid::VERSION)
        };
        println!(
            "{} = {}: {}{other} at {} (pid {}, {} worker(s)), {}{}",
            server.name(),
            server.title(),
            f.version,
            f.addr,
            f.pid,
            f.workers,
            bin.display(),
            preload.map_or(String::new(), |p| format!(", LD_PRELOAD={}", p.display()))
        );
        let clients = ferroid::clients(&f.addr, MAX_CHANNELS).await.map_err(harness)?;
        out.push((server, f, clients));
    }
    Ok(out)
}

/// What the runs gathered besides the points.
struct Tally {
    ceilings: Vec<Ceiling>,
    /// Samples measured while foreign load was above `--quiet-below`, of all samples.
    noisy: usize,
    samples: usize,
    /// Slots the AllocSvr held after the last point.
    slots_end: u64,
}

async fn bench(args: &Args) -> Result<bool, Failure> {
    let mut run = Run::new(args.common.dir.as_deref())?;
    print_machine(args, run.dir());
    let s = start(args, &mut run).await?;
    let counts = chosen(&COUNTS, &args.counts);
    let callers = chosen(&CONCURRENCIES, &args.callers);
    let mut points: Vec<Point> = counts
        .iter()
        .flat_map(|&count| {
            callers.iter().map(move |&concurrency| Point {
                count,
                concurrency,
                runs: Vec::new(),
            })
        })
        .collect();
    let mut tally = Tally {
        ceilings: Vec::new(),
        noisy: 0,
        samples: 0,
        slots_end: s.slots_held,
    };
    for r in 0..args.runs {
        println!("\n== run {}/{} ==", r + 1, args.runs);
        println!("{}", report::header_for("ids/s"));
        for (i, p) in points.iter_mut().enumerate() {
            measure_point(args, &s, &mut run.procs, i + r, p, &mut tally).await?;
        }
        tally.ceilings.extend(ceilings(s.layout, &counts).await?);
    }
    summarize(&s, &points, &tally.ceilings, tally.slots_end);
    println!(
        "\nsamples measured while processes this benchmark did not start used > {} % of a core: {} of {}",
        args.common.quiet.quiet_below, tally.noisy, tally.samples
    );
    println!("load average at the end: {}", procfs::load_average());
    Ok(true)
}

/// Every server once at point `p`, once the machine is quiet; who goes first rotates with `turn`
/// (point to point and run to run).
async fn measure_point(
    args: &Args,
    s: &Servers,
    procs: &mut Supervisor,
    turn: usize,
    p: &mut Point,
    tally: &mut Tally,
) -> Result<(), Failure> {
    let quiet = &args.common.quiet;
    cluster::wait_quiet(&s.ours, quiet.quiet_below, quiet.wait()).await;
    let window = args.common.window.durations();
    let mut measured = Vec::new();
    for k in 0..Server::ALL.len() {
        let server = Server::ALL[(turn + k) % Server::ALL.len()];
        let Some(sample) = s.measure(server, p.count, p.concurrency, window).await else {
            continue;
        };
        println!(
            "{}",
            report::row(&format!("ids{}", p.count), p.concurrency, server.name(), &sample)
        );
        setup::check(procs, server.name(), &sample)?;
        tally.noisy += usize::from(sample.foreign_pct() > quiet.quiet_below);
        tally.samples += 1;
        measured.push((server, sample));
    }
    p.runs.push(ids::Run(measured));
    if let Some(st) = cluster::status(&s.leader).await {
        println!("  (the AllocSvr holds {} slot(s) after this point)", st.slots_held);
        tally.slots_end = st.slots_held;
    }
    Ok(())
}

/// One slot's in-process ceiling at each of `counts`, off the runtime's threads.
async fn ceilings(layout: IdLayout, counts: &[u32]) -> Result<Vec<Ceiling>, Failure> {
    let mut out = Vec::new();
    for &count in counts {
        let c = tokio::task::spawn_blocking(move || ids::issuer_ceiling(layout, count.into(), CEILING_WINDOW))
            .await
            .map_err(|e| harness(format!("ceiling loop: {e}")))?
            .map_err(harness)?;
        println!(
            "one slot in process, count {count}: {:.0} ids/s ({:.0} ns per call)",
            c.ids_per_sec, c.ns_per_call
        );
        out.push(c);
    }
    Ok(out)
}

/// The table of medians, the ceiling, the ratios and the verdicts.
fn summarize(s: &Servers, points: &[Point], ceilings: &[Ceiling], slots_end: u64) {
    let runs = points.first().map_or(0, |p| p.runs.len());
    println!("\n== summary: medians of {runs} run(s); ids/s = count × calls per second; latency in µs ==");
    println!("{}", ids::summary_header());
    for p in points {
        ids::summary_rows(p, &p.summary()).iter().for_each(|l| println!("{l}"));
    }
    println!("servers:");
    for server in Server::ALL {
        println!("  {:<6} {}", server.name(), server.title());
    }
    println!("\nratios (medians of the per-run ratios): AllocSvr ids/s over each server's; AllocSvr p99 over echo's");
    println!("{}", ids::ratio_header());
    for p in points {
        println!("{}", ids::ratio_row(p, &p.summary()));
    }
    let limit = ids::layout_limit(&s.layout);
    for count in COUNTS
        .into_iter()
        .filter(|&n| ceilings.iter().any(|c| c.count == u64::from(n)))
    {
        let of =
            |f: fn(&Ceiling) -> f64| median(ceilings.iter().filter(|c| c.count == u64::from(count)).map(f).collect());
        println!(
            "one slot in process (SlotIssuer, one thread), count {count}: {:.0} ids/s ({:.0} ns per call)",
            of(|c| c.ids_per_sec),
            of(|c| c.ns_per_call)
        );
    }
    println!(
        "the layout's limit per slot ({}): {} ids per {} ms tick = {limit:.0} ids/s; the AllocSvr held {} slot(s) \
         when it first issued and {slots_end} at the end (it asks for as many as its rate fills half)",
        s.layout,
        s.layout.ids_per_tick(),
        s.layout.tick_ms,
        s.slots_held
    );
    report::print_targets(&ids::verdicts(points));
}

fn print_machine(args: &Args, dir: &Path) {
    println!("{}; load average {}", setup::machine_line(), procfs::load_average());
    let w = &args.common.window;
    let options = format!(
        "--seconds {} --warmup-ms {} --runs {} --ferroid-workers {}",
        w.seconds, w.warmup_ms, args.runs, args.ferroid_workers
    );
    println!("{}", setup::options_line(&options, dir));
}
