//! `sim run`: one seeded simulation from start to verdict.
//!
//! Phases: start 3 StoreSvrs, wait for a leader; start 3 AllocSvrs, wait until all own sections
//! and every section serves; run the workload while the fault injector follows the seeded
//! schedule and a poller records `max_seq` (P3); heal everything; verify that every touched uid
//! is served again; read every section's final `max_seq` linearizably (P2); stop the cluster;
//! read the history back from disk and run every checker over it.
//!
//! With `--sets N` (N > 1) every set gets its own StoreSvr group and AllocSvrs; set 0 starts with
//! the whole uid space, the others are added to the cluster map empty, and the move fault kinds
//! ([`moves`]) shift ranges between them with `seqctl`.
//!
//! Deliberately left out: StoreSvr membership changes.

mod moves;

use crate::checks;
use crate::history::{FaultSpan, History, HistoryWriter, Poll, Record, RunClock, RunInfo, write_max_seqs};
use crate::proxy::{FlowMode, LinkMode};
use crate::schedule::{FaultKind, LAG_SEND_WINDOW, PlannedFault, RELEASE_WINDOW, ScheduleParams, plan};
use crate::stats;
use crate::topology::{N, SetArgs, Topology, alloc_name, data_dir, members, set_of, store_name};
use crate::workload::{Counters, Recorder, WorkloadParams, hot_uids, run_client, run_pinned};
use anyhow::{Context, bail};
use seqsvr_client::{Client, ClientConfig};
use seqsvr_control::{StoreClient, StoreTimeouts};
use seqsvr_harness::supervisor::START_MARKER;
use seqsvr_harness::{PanicLine, Supervisor, find_binary};
use seqsvr_proto::pb;
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Mutex as AsyncMutex;
use tokio::time::{Instant, sleep};

/// Everything one run needs, validated by the caller.
#[derive(Clone, Debug)]
pub struct RunOpts {
    pub seed: u64,
    pub duration: Duration,
    pub data_dir: Option<PathBuf>,
    /// Mutual TLS with roles on every link (`crate::tls`).
    pub tls: bool,
    pub bin_dir: Option<PathBuf>,
    pub clients: u32,
    pub rate_per_client: f64,
    pub faults: bool,
    /// Fault kinds scheduled first, in order (CI profile, negative controls).
    pub must_include: Vec<FaultKind>,
    /// Kinds the seeded draws pick from; every kind when empty.
    pub fault_kinds: Vec<FaultKind>,
    pub set: SetArgs,
    /// StoreSvr groups (sets); moves need two or more.
    pub sets: u64,
    pub replay: String,
}

/// The verdict of a run that completed (a harness failure is an `Err` instead).
pub struct Verdict {
    pub violations: usize,
    pub crashes: Vec<String>,
    pub panics: usize,
}

impl Verdict {
    pub fn passed(&self) -> bool {
        self.violations == 0 && self.crashes.is_empty() && self.panics == 0
    }
}

type ReplicaClient = pb::store_service_client::StoreServiceClient<tonic::transport::Channel>;

const READY_TIMEOUT: Duration = Duration::from_secs(60);
const VERIFY_TIMEOUT: Duration = Duration::from_secs(60);
const POLL_EVERY: Duration = Duration::from_millis(500);
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

struct Shared {
    cluster: AsyncMutex<Supervisor>,
    topo: Topology,
    /// One client per set's StoreSvr group, indexed by set id.
    stores: Vec<StoreClient>,
    /// One direct client per StoreSvr replica (no proxy): Status polls and leader confirmation.
    replicas: Vec<(u64, ReplicaClient)>,
    history: Arc<HistoryWriter>,
    sections: u64,
    faults_done: AtomicU64,
    crashes: Mutex<Vec<String>>,
    /// The `seqctl` binary (operator moves) and where its output goes.
    seqctl: PathBuf,
    logs: PathBuf,
    section_size: u64,
    uid_limit: u64,
    lease_ms: u64,
    /// The workload's recorder and hot uids, for calls a fault makes itself (a paused owner's
    /// stale callers, `moves::paused_owner_move`).
    rec: Arc<Recorder>,
    hot: Arc<Vec<u64>>,
    /// Stale calls made so far (their client ids).
    stale_calls: AtomicU64,
}

/// Starts every set's StoreSvr group, waits for their leaders, then the AllocSvrs; waits until
/// every section is owned (all in set 0) and puts the other sets into the cluster map.
async fn start_cluster(opts: &RunOpts, dir: &Path, topo: &Topology) -> anyhow::Result<(Supervisor, Vec<StoreClient>)> {
    let store_bin = find_binary("storesvr", opts.bin_dir.as_deref())?;
    let alloc_bin = find_binary("allocsvr", opts.bin_dir.as_deref())?;
    let mut cluster = Supervisor::new(&dir.join("logs"))?;
    let all = 1..=opts.sets * N;
    for i in all.clone() {
        cluster.spawn(topo.store_spec(i, &store_bin, dir, &opts.set))?;
    }
    let timeouts = StoreTimeouts {
        attempt: Duration::from_millis(500),
        overall: Duration::from_secs(5),
    };
    let mut stores = Vec::new();
    for set in 0..opts.sets {
        // Status, routes and the final Load of every ceiling: Load is an AllocSvr's call.
        let dialer = seqsvr_control::Dialer::with_tls(crate::tls::allocsvr());
        let store = StoreClient::with_dialer(topo.store_seeds(set), timeouts, &dialer).map_err(anyhow::Error::msg)?;
        wait_for_leader(&store).await?;
        stores.push(store);
    }
    for i in all {
        cluster.spawn(topo.alloc_spec(i, &alloc_bin, &opts.set))?;
    }
    wait_for_owners(&stores[0]).await?;
    for set in 1..opts.sets {
        moves::add_set(topo, set).await?;
    }
    Ok((cluster, stores))
}

fn workload_params(opts: &RunOpts) -> WorkloadParams {
    WorkloadParams {
        seed: opts.seed,
        clients: opts.clients,
        rate_per_client: opts.rate_per_client,
        section_size: opts.set.section_size,
        uid_limit: opts.set.uid_limit,
        hot_per_section: 4,
        max_batch: 16,
    }
}

/// Starts the seeded routing clients and the pinned (stale-route) clients.
async fn start_workload(
    opts: &RunOpts,
    shared: &Shared,
    client_cfg: &ClientConfig,
    rec: &Arc<Recorder>,
    stop: &Arc<AtomicBool>,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let wp = workload_params(opts);
    let hot = shared.hot.clone();
    let mut workers = Vec::new();
    for c in 1..=opts.clients {
        let client = Client::connect(client_cfg.clone()).await.context("client connect")?;
        let worker = run_client(client, c, wp.clone(), hot.clone(), rec.clone(), stop.clone());
        workers.push(tokio::spawn(worker));
    }
    for (&a, proxy) in &shared.topo.client_alloc {
        let pinned = WorkloadParams {
            rate_per_client: opts.rate_per_client / 2.0,
            ..wp.clone()
        };
        let id = crate::workload::PINNED_CLIENT_BASE + a as u32;
        let Some(conn) = crate::workload::pinned_conn(&proxy.addr().to_string(), Duration::from_secs(1)) else {
            continue;
        };
        let worker = run_pinned(conn, id, pinned, hot.clone(), rec.clone(), stop.clone());
        workers.push(tokio::spawn(worker));
    }
    Ok(workers)
}

/// Every uid the workload touched, sorted. Also `sim load`'s.
pub(crate) fn touched_uids(rec: &Recorder) -> Vec<u64> {
    let t = rec.touched.lock().unwrap_or_else(|e| e.into_inner());
    let mut v: Vec<u64> = t.iter().copied().collect();
    v.sort_unstable();
    v
}

/// Stops every process; the panics found in their logs and the crashes seen during the run.
async fn stop_cluster(shared: &Shared) -> anyhow::Result<(Vec<PanicLine>, Vec<String>)> {
    let mut cluster = shared.cluster.lock().await;
    let exits = cluster.take_unexpected_exits();
    cluster.kill_all();
    let mut crashes = shared.crashes.lock().unwrap_or_else(|e| e.into_inner()).clone();
    crashes.extend(exits.into_iter().map(|(n, s)| format!("{n}: {s}")));
    Ok((cluster.scan_panics()?, crashes))
}

/// Prints the checkers' report, unavailability per fault kind and per fault, panics and crashes.
fn print_report(h: &History, report: &checks::Report, panics: &[PanicLine], crashes: &[String]) {
    print!("{}", report.render(h));
    let unavail = stats::unavailability(&h.calls, &h.faults, h.info.section_size);
    println!("faults: {} injected", h.faults.len());
    for (kind, (n, p50, p99, max)) in stats::per_kind(&h.faults, &unavail) {
        println!("  {kind:<24} x{n:<3} unavailability p50 {p50:?} p99 {p99:?} max {max:?}");
    }
    for (f, u) in h.faults.iter().zip(&unavail) {
        println!(
            "  fault {:<3} at {:>7.1?} {:<24} on {} for {:.1?}; unavailability {:.1?}",
            f.id,
            Duration::from_nanos(f.start_ns),
            f.kind,
            f.target,
            Duration::from_nanos(f.end_ns.saturating_sub(f.start_ns)),
            u
        );
    }
    for p in panics {
        println!("PANIC in {}: {}", p.process, p.line);
    }
    for c in crashes {
        println!("CRASH: {c}");
    }
}

/// Writes the final `max_seq` of every section into the history and `max_seqs.json`.
async fn record_final_state(
    shared: &Shared,
    history: &HistoryWriter,
    clock: RunClock,
    max_path: &Path,
) -> anyhow::Result<std::collections::BTreeMap<u64, u64>> {
    let final_max = final_load(shared).await?;
    history.write(&Record::Poll(Poll {
        at_ns: clock.now_ns(),
        source: "leader".into(),
        max_seqs: final_max.iter().map(|(&s, &m)| (s, m)).collect(),
        sum: None,
    }))?;
    write_max_seqs(max_path, &final_max)?;
    Ok(final_max)
}

/// Injects the fault schedule while the workload runs for the run's duration, then stops the
/// workload and waits for its clients.
async fn drive_faults(
    shared: &Arc<Shared>,
    opts: &RunOpts,
    workers: Vec<tokio::task::JoinHandle<()>>,
    stop: &AtomicBool,
) -> anyhow::Result<()> {
    let schedule = schedule_for(opts);
    println!("sim: {} faults scheduled over {:?}", schedule.len(), opts.duration);
    let start = Instant::now();
    let injector = tokio::spawn(inject_all(shared.clone(), schedule, start));
    tokio::time::sleep_until(start + opts.duration).await;
    injector.await.context("fault injector")??;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.context("workload client")?;
    }
    Ok(())
}

/// The run's parameters as the history's first record states them.
fn run_info(opts: &RunOpts) -> RunInfo {
    RunInfo {
        seed: opts.seed,
        section_size: opts.set.section_size,
        uid_limit: opts.set.uid_limit,
        step: opts.set.step,
        lease_ms: opts.set.lease_ms,
        fault_free: !opts.faults,
        replay: opts.replay.clone(),
        verify_from_ns: None,
    }
}

/// Prints where the history is and how to check it again or replay the run.
fn print_where(opts: &RunOpts, history_path: &Path, max_path: &Path) {
    println!("history: {}  max_seqs: {}", history_path.display(), max_path.display());
    println!(
        "re-check with: sim check {} --max-seqs {}",
        history_path.display(),
        max_path.display()
    );
    println!("sim: seed {} replay with: {}", opts.seed, opts.replay);
}

/// `--tls`: certificates in the run's data dir, and every process started with its role's.
fn turn_on_tls(opts: &mut RunOpts, dir: &Path) -> anyhow::Result<()> {
    let certs = dir.join("certs");
    crate::tls::setup(&certs)?;
    let set = &mut opts.set;
    set.store_extra.extend(crate::tls::flags(seqsvr_auth::Role::StoreSvr));
    set.alloc_extra.extend(crate::tls::flags(seqsvr_auth::Role::AllocSvr));
    println!("sim: mutual TLS on every link, certificates in {}", certs.display());
    Ok(())
}

pub async fn run(mut opts: RunOpts) -> anyhow::Result<Verdict> {
    let dir = data_dir(opts.data_dir.as_deref(), opts.seed)?;
    println!("sim: seed {} data dir {}", opts.seed, dir.display());
    if opts.tls {
        turn_on_tls(&mut opts, &dir)?;
    }
    println!("sim: replay with: {}", opts.replay);
    let topo = Topology::new(opts.sets).await?;
    let (cluster, stores) = start_cluster(&opts, &dir, &topo).await?;
    let sections = opts.set.uid_limit.div_ceil(opts.set.section_size);

    let clock = RunClock::start();
    let mut info = run_info(&opts);
    let history_path = dir.join("history.jsonl");
    let history = Arc::new(HistoryWriter::create(&history_path, clock, &info)?);
    let rec = Arc::new(Recorder::new(history.clone()));
    let counters = rec.counters.clone();
    let shared = Arc::new(Shared {
        cluster: AsyncMutex::new(cluster),
        replicas: replica_clients(&topo),
        topo,
        stores,
        history: history.clone(),
        sections,
        faults_done: AtomicU64::new(0),
        crashes: Mutex::new(Vec::new()),
        seqctl: find_binary("seqctl", opts.bin_dir.as_deref())?,
        logs: dir.join("logs"),
        section_size: opts.set.section_size,
        uid_limit: opts.set.uid_limit,
        lease_ms: opts.set.lease_ms,
        rec: rec.clone(),
        hot: Arc::new(hot_uids(&workload_params(&opts))),
        stale_calls: AtomicU64::new(0),
    });
    let client_cfg = ClientConfig {
        tls: crate::tls::client(),
        ..ClientConfig::new(shared.topo.client_seeds())
    };
    let probe = Client::connect(client_cfg.clone()).await.context("client connect")?;
    serve_every_section(&probe, &rec, opts.set.section_size, opts.set.uid_limit).await?;

    let stop = Arc::new(AtomicBool::new(false));
    let workers = start_workload(&opts, &shared, &client_cfg, &rec, &stop).await?;
    let background_stop = Arc::new(AtomicBool::new(false));
    let poller = tokio::spawn(poll_loop(shared.clone(), background_stop.clone()));
    let progress = tokio::spawn(progress_loop(shared.clone(), counters.clone(), background_stop.clone()));
    drive_faults(&shared, &opts, workers, &stop).await?;
    heal_everything(&shared).await?;
    moves::finish_all(&shared).await?;
    let verify_from = clock.now_ns();
    let touched = touched_uids(&rec);
    println!("sim: healed; verifying {} touched uids are served again", touched.len());
    verify_served(&probe, &rec, &touched).await;
    background_stop.store(true, Ordering::Relaxed);
    poller.await.context("poller")?;
    progress.await.context("progress")?;

    let max_path = dir.join("max_seqs.json");
    let final_max = record_final_state(&shared, &history, clock, &max_path).await?;
    info.verify_from_ns = Some(verify_from);
    history.write(&Record::Info(info))?;
    history.flush()?;
    let (panics, crashes) = stop_cluster(&shared).await?;
    judge(&opts, &history_path, &max_path, &final_max, panics, crashes)
}

/// Reads the whole history back and checks every promise over it; prints the report.
fn judge(
    opts: &RunOpts,
    history_path: &Path,
    max_path: &Path,
    final_max: &BTreeMap<u64, u64>,
    panics: Vec<PanicLine>,
    crashes: Vec<String>,
) -> anyhow::Result<Verdict> {
    let h = History::read(history_path)?;
    let report = checks::check_all(&h, Some(final_max))?;
    print_report(&h, &report, &panics, &crashes);
    print_where(opts, history_path, max_path);
    Ok(Verdict {
        violations: report.total_violations(),
        crashes,
        panics: panics.len(),
    })
}

/// The fault schedule of a run (empty with faults off).
pub fn schedule_for(opts: &RunOpts) -> Vec<PlannedFault> {
    if !opts.faults {
        return vec![];
    }
    plan(
        opts.seed,
        &ScheduleParams {
            duration: opts.duration,
            lease: Duration::from_millis(opts.set.lease_ms),
            election_max: Duration::from_millis(opts.set.election_max_ms),
            detect: Duration::from_millis(opts.set.detect_ms),
            warmup: Duration::from_secs(3),
            cooldown: Duration::from_secs(5),
            must_include: opts.must_include.clone(),
            kinds: opts.fault_kinds.clone(),
            sets: opts.sets,
        },
    )
}

async fn wait_for_leader(store: &StoreClient) -> anyhow::Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Ok(s) = store.status().await
            && s.leader_id != 0
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("no StoreSvr leader within {READY_TIMEOUT:?}");
        }
        sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until every AllocSvr owns some sections and no section is unowned.
async fn wait_for_owners(store: &StoreClient) -> anyhow::Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Ok(r) = store.get_routes().await
            && let Some(t) = r.routes
        {
            let owners: HashSet<u64> = t.entries.iter().map(|e| e.node_id).collect();
            if owners.len() == N as usize && t.entries.iter().all(|e| e.incarnation != 0) {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!("AllocSvrs did not all own sections within {READY_TIMEOUT:?}");
        }
        sleep(Duration::from_millis(100)).await;
    }
}

/// One recorded fetch of the first uid of every section of `[0, uid_limit)`, until each has been
/// served once or [`READY_TIMEOUT`] passes. Also `sim load`'s first step.
pub(crate) async fn serve_every_section(
    probe: &Client,
    rec: &Recorder,
    section_size: u64,
    uid_limit: u64,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let sections = uid_limit.div_ceil(section_size);
    let mut left: Vec<u64> = (0..sections).map(|s| s * section_size).collect();
    while !left.is_empty() {
        let served: HashSet<u64> = rec.batch(probe, 0, &left).await.into_iter().collect();
        left.retain(|u| !served.contains(u));
        if Instant::now() > deadline {
            bail!("{} sections not served within {READY_TIMEOUT:?}", left.len());
        }
        if !left.is_empty() {
            sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}

/// Fetches every touched uid until each is served once or [`VERIFY_TIMEOUT`] passes (the liveness
/// checker then names the ones left). Also `sim load`'s last step.
pub(crate) async fn verify_served(probe: &Client, rec: &Recorder, touched: &[u64]) {
    let deadline = Instant::now() + VERIFY_TIMEOUT;
    let mut left: Vec<u64> = touched.to_vec();
    while !left.is_empty() && Instant::now() < deadline {
        let mut served = HashSet::new();
        for chunk in left.chunks(500) {
            served.extend(rec.batch(probe, 0, chunk).await);
        }
        left.retain(|u| !served.contains(u));
        if !left.is_empty() {
            sleep(Duration::from_millis(500)).await;
        }
    }
}

/// Every section's `max_seq`, read linearizably from the set that owns it (all of them, or an error
/// once the deadline passes).
async fn final_load(shared: &Shared) -> anyhow::Result<BTreeMap<u64, u64>> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let mut all = BTreeMap::new();
        for set in 0..shared.stores.len() as u64 {
            if let Ok(found) = load_owned(shared, set).await {
                all.extend(found);
            }
        }
        if all.len() as u64 == shared.sections {
            return Ok(all);
        }
        if Instant::now() > deadline {
            bail!("the final Loads returned {} of {} sections", all.len(), shared.sections);
        }
        sleep(Duration::from_millis(200)).await;
    }
}

/// `(section, max_seq)` of every section set `set` serves, in one linearizable Load from its
/// leader. Fails when the set's route table cannot be read or the Load is refused (a move changed
/// what the set owns in between).
async fn load_owned(shared: &Shared, set: u64) -> anyhow::Result<Vec<(u64, u64)>> {
    let store = &shared.stores[set as usize];
    let routes = store.get_routes().await?.routes.context("no route table")?;
    let sections: Vec<pb::SectionRange> = routes
        .entries
        .iter()
        .filter(|e| e.set_id == set)
        .map(|e| pb::SectionRange {
            begin: e.section_begin,
            end: e.section_end,
        })
        .collect();
    if sections.is_empty() {
        return Ok(vec![]);
    }
    let r = store.load(pb::LoadRequest { sections }).await?;
    if r.not_leader.is_some() {
        bail!("set {set}: not the leader");
    }
    Ok(r.sections.iter().map(|s| (s.section, s.max_seq)).collect())
}

fn replica_clients(topo: &Topology) -> Vec<(u64, ReplicaClient)> {
    topo.store_addr
        .iter()
        .filter_map(|(&i, a)| {
            // Status and Load; Load is an AllocSvr's call.
            let ep = seqsvr_auth::endpoint(&a.to_string(), crate::tls::allocsvr().as_deref()).ok()?;
            let ch = ep
                .connect_timeout(Duration::from_millis(300))
                .timeout(Duration::from_millis(500))
                .connect_lazy();
            Some((i, ReplicaClient::new(ch)))
        })
        .collect()
}

async fn poll_loop(shared: Arc<Shared>, stop: Arc<AtomicBool>) {
    let clock = shared.history.clock();
    while !stop.load(Ordering::Relaxed) {
        // One source for every set: a range that moves keeps its ceiling (the target installs at
        // least the source's), so `max_seq` must not go down across a move either.
        for set in 0..shared.stores.len() as u64 {
            if let Ok(max_seqs) = load_owned(&shared, set).await {
                let _ = shared.history.write(&Record::Poll(Poll {
                    at_ns: clock.now_ns(),
                    source: "leader".into(),
                    max_seqs,
                    sum: None,
                }));
            }
        }
        for (i, c) in &shared.replicas {
            let mut c = c.clone();
            if let Ok(Ok(r)) = tokio::time::timeout(Duration::from_millis(500), c.status(pb::StatusRequest {})).await {
                let _ = shared.history.write(&Record::Poll(Poll {
                    at_ns: clock.now_ns(),
                    source: format!("replica-{i}"),
                    max_seqs: vec![],
                    sum: Some(r.into_inner().max_seq_sum),
                }));
            }
        }
        let _ = shared.history.flush();
        sleep(POLL_EVERY).await;
    }
}

async fn progress_loop(shared: Arc<Shared>, counters: Arc<Counters>, stop: Arc<AtomicBool>) {
    let started = Instant::now();
    let mut last = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        sleep(Duration::from_millis(200)).await;
        if last.elapsed() < PROGRESS_EVERY {
            continue;
        }
        last = Instant::now();
        let restarted = restart_crashed(&shared).await;
        println!(
            "sim: {:>5.0?} calls {} failed {} unknown {} faults {} crashes {}",
            started.elapsed(),
            counters.calls.load(Ordering::Relaxed),
            counters.failed.load(Ordering::Relaxed),
            counters.unknown.load(Ordering::Relaxed),
            shared.faults_done.load(Ordering::Relaxed),
            restarted,
        );
    }
}

/// Restarts processes that exited without the simulator asking; each such exit is a finding.
async fn restart_crashed(shared: &Shared) -> usize {
    let mut cluster = shared.cluster.lock().await;
    let exits = cluster.take_unexpected_exits();
    let mut crashes = shared.crashes.lock().unwrap_or_else(|e| e.into_inner());
    for (name, status) in exits {
        println!("sim: CRASH {name} exited by itself ({status}); restarting it");
        crashes.push(format!("{name}: {status}"));
        let _ = cluster.start(&name);
    }
    crashes.len()
}

async fn heal_everything(shared: &Shared) -> anyhow::Result<()> {
    shared.topo.heal_all();
    let mut cluster = shared.cluster.lock().await;
    let names: Vec<String> = cluster.names().map(String::from).collect();
    for n in names {
        cluster.resume(&n)?;
        if !cluster.is_running(&n) {
            cluster.start(&n)?;
        }
    }
    Ok(())
}

async fn inject_all(shared: Arc<Shared>, schedule: Vec<PlannedFault>, start: Instant) -> anyhow::Result<()> {
    for (n, f) in schedule.into_iter().enumerate() {
        tokio::time::sleep_until(start + f.at).await;
        let clock = shared.history.clock();
        let start_ns = clock.now_ns();
        let target = inject(&shared, &f).await?;
        println!("sim: fault {} {} on {target} for {:?}", n + 1, f.kind.name(), f.hold);
        let end_ns = clock.now_ns();
        shared.history.write(&Record::Fault(FaultSpan {
            id: n as u64 + 1,
            kind: f.kind.name().into(),
            target,
            start_ns,
            end_ns,
        }))?;
        shared.faults_done.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// How long the injector looks for a fault's intended target before it falls back to a seeded
/// guess (and says so in the target's name).
const TARGET_TIMEOUT: Duration = Duration::from_secs(3);

/// The set a StoreSvr fault hits: always set 0 in a one-set run.
fn set_of_pick(shared: &Shared, pick: u64) -> u64 {
    (pick >> 8) % shared.stores.len() as u64
}

/// The StoreSvr leader of `set`, confirmed by the replica itself (its own Status names itself
/// leader; the highest term wins if two still do). Retried for [`TARGET_TIMEOUT`].
async fn store_leader(shared: &Shared, set: u64) -> Option<u64> {
    let deadline = Instant::now() + TARGET_TIMEOUT;
    loop {
        let mut best: Option<(u64, u64)> = None;
        for (i, c) in shared.replicas.iter().filter(|(i, _)| set_of(*i) == set) {
            let mut c = c.clone();
            if let Ok(Ok(r)) = tokio::time::timeout(Duration::from_millis(500), c.status(pb::StatusRequest {})).await {
                let r = r.into_inner();
                if r.leader_id == *i && best.is_none_or(|(term, _)| r.term > term) {
                    best = Some((r.term, *i));
                }
            }
        }
        if let Some((_, id)) = best {
            return Some(id);
        }
        if Instant::now() > deadline {
            return None;
        }
        sleep(Duration::from_millis(100)).await;
    }
}

/// The StoreSvr leader's name (of the set `pick` chooses), or a seeded guess marked as such.
async fn leader_target(shared: &Shared, pick: u64) -> (String, String) {
    let set = set_of_pick(shared, pick);
    match store_leader(shared, set).await {
        Some(l) => (store_name(l), format!("{} (leader)", store_name(l))),
        None => {
            let n = store_name(members(set).start() + pick % N);
            (n.clone(), format!("{n} (no leader found; guessed)"))
        }
    }
}

/// The AllocSvr that owns section `pick % sections` in the store's route table (retried for
/// [`TARGET_TIMEOUT`]), with a description naming the sections it owns; a seeded guess, marked
/// as such, when no owner is known.
/// SIGTERM with a grace period; a process that does not leave in time is killed (and said so).
async fn terminate(shared: &Shared, name: &str) -> anyhow::Result<()> {
    let clean = shared
        .cluster
        .lock()
        .await
        .terminate(name, Duration::from_secs(5))
        .await?;
    if !clean {
        println!("sim: {name} did not exit within 5 s of SIGTERM; killed");
    }
    Ok(())
}

/// Waits until the part of `log` after the simulator's last start marker has a line containing
/// `text` (polled every 2 ms: the point is to act before the process's next step).
async fn wait_for_log_line(log: &std::path::Path, text: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Ok(all) = std::fs::read_to_string(log) {
            let tail = all.rsplit(START_MARKER).next().unwrap_or("");
            if tail.lines().any(|l| l.contains(text)) {
                return true;
            }
        }
        sleep(Duration::from_millis(2)).await;
    }
    false
}

async fn owner_of(shared: &Shared, pick: u64) -> (u64, String) {
    let section = pick % shared.sections.max(1);
    let deadline = Instant::now() + TARGET_TIMEOUT;
    loop {
        for set in 0..shared.stores.len() as u64 {
            if let Some((node, desc, _)) = owner_in(shared, set, section).await {
                return (node, desc);
            }
        }
        if Instant::now() > deadline {
            let a = pick % N + 1;
            return (a, format!("{} (no owner found; guessed)", alloc_name(a)));
        }
        sleep(Duration::from_millis(100)).await;
    }
}

/// The AllocSvr of set `set` that owns `section` in that set's route table, with a description
/// naming the sections it owns and the run `[begin, end)` of the entry holding `section`; `None`
/// when the set does not serve the section or nobody owns it.
async fn owner_in(shared: &Shared, set: u64, section: u64) -> Option<(u64, String, (u64, u64))> {
    let t = shared.stores[set as usize].get_routes().await.ok()?.routes?;
    let e = t
        .entries
        .iter()
        .find(|e| e.section_begin <= section && section < e.section_end)?;
    if e.set_id != set || !members(set).contains(&e.node_id) || e.incarnation == 0 {
        return None;
    }
    let owned: Vec<String> = t
        .entries
        .iter()
        .filter(|o| o.node_id == e.node_id && o.incarnation == e.incarnation)
        .map(|o| format!("{}..{}", o.section_begin, o.section_end))
        .collect();
    let desc = format!("{} (owner of sections {})", alloc_name(e.node_id), owned.join(","));
    Some((e.node_id, desc, (e.section_begin, e.section_end)))
}

/// Applies one fault, waits its hold, heals it. Returns the target's description.
/// Puts every AllocSvr→StoreSvr link of AllocSvr `a` through `steps` (mode, how long), in order,
/// then lets them pass again.
async fn store_links_through(topo: &Topology, a: u64, steps: &[(LinkMode, Duration)]) {
    for &(mode, how_long) in steps {
        set_store_links(topo, a, mode);
        sleep(how_long).await;
    }
    set_store_links(topo, a, LinkMode::PASS);
}

/// Puts every AllocSvr→StoreSvr link of AllocSvr `a` in `mode`.
fn set_store_links(topo: &Topology, a: u64, mode: LinkMode) {
    for j in members(set_of(a)) {
        topo.alloc_store[&(a, j)].set(mode);
    }
}

/// Injects one fault and holds it for its duration; a description of its target.
async fn inject(shared: &Shared, f: &PlannedFault) -> anyhow::Result<String> {
    match f.kind {
        FaultKind::KillAllocOwner | FaultKind::KillStoreLeader | FaultKind::KillStoreFollower => {
            kill_fault(shared, f).await
        }
        FaultKind::PauseAllocShort
        | FaultKind::PauseAllocLong
        | FaultKind::PauseAllocVeryLong
        | FaultKind::PauseStoreLeader => pause_fault(shared, f).await,
        FaultKind::CutAllocFromStore | FaultKind::HoldAllocToStore | FaultKind::LagAllocToStore => {
            owner_link_fault(shared, f).await
        }
        FaultKind::PartitionStoreLeader => partition_leader(shared, f).await,
        FaultKind::DelayLinks => {
            for p in shared.topo.all_proxies() {
                p.set(LinkMode::delay(f.delay));
            }
            sleep(f.hold).await;
            shared.topo.heal_all();
            Ok(format!("all links +{:?}", f.delay))
        }
        FaultKind::TermAlloc | FaultKind::TermAllocTwice => term_fault(shared, f).await,
        FaultKind::KillAllocRegistered => kill_registered(shared, f).await,
        FaultKind::MoveRange | FaultKind::MoveKillCli | FaultKind::MovePausedOwner | FaultKind::MoveUnderFault => {
            moves::move_fault(shared, f).await
        }
    }
}

/// SIGKILL an owner AllocSvr, the StoreSvr leader or a follower; restart it after the hold.
async fn kill_fault(shared: &Shared, f: &PlannedFault) -> anyhow::Result<String> {
    let (name, desc) = match f.kind {
        FaultKind::KillAllocOwner => {
            let (a, desc) = owner_of(shared, f.pick).await;
            (alloc_name(a), desc)
        }
        FaultKind::KillStoreLeader => leader_target(shared, f.pick).await,
        _ => {
            let set = set_of_pick(shared, f.pick);
            let leader = store_leader(shared, set).await.unwrap_or(0);
            let followers: Vec<u64> = members(set).filter(|&i| i != leader).collect();
            let n = store_name(followers[(f.pick % followers.len() as u64) as usize]);
            (n.clone(), n)
        }
    };
    shared.cluster.lock().await.kill(&name)?;
    sleep(f.hold).await;
    shared.cluster.lock().await.start(&name)?;
    Ok(desc)
}

/// SIGSTOP an owner AllocSvr or the StoreSvr leader; SIGCONT after the hold.
async fn pause_fault(shared: &Shared, f: &PlannedFault) -> anyhow::Result<String> {
    let (name, desc) = match f.kind {
        FaultKind::PauseStoreLeader => leader_target(shared, f.pick).await,
        _ => {
            let (a, desc) = owner_of(shared, f.pick).await;
            (alloc_name(a), desc)
        }
    };
    shared.cluster.lock().await.pause(&name)?;
    sleep(f.hold).await;
    shared.cluster.lock().await.resume(&name)?;
    Ok(desc)
}

/// Drives an owner's links to the store through phases: cut, hold-then-release, or lag.
async fn owner_link_fault(shared: &Shared, f: &PlannedFault) -> anyhow::Result<String> {
    let (a, desc) = owner_of(shared, f.pick).await;
    let steps: Vec<(LinkMode, Duration)> = match f.kind {
        FaultKind::HoldAllocToStore => {
            let phases = f.phases.context("a hold fault without its phases")?;
            vec![
                (LinkMode::DROP, phases.drop_first),
                (LinkMode::HOLD, phases.hold),
                (LinkMode::PASS, RELEASE_WINDOW),
                (LinkMode::DROP, phases.drop_after),
            ]
        }
        FaultKind::LagAllocToStore => {
            let lag = f.delay + LAG_SEND_WINDOW;
            let late_requests = LinkMode {
                forward: FlowMode::Delay(f.delay),
                backward: FlowMode::Pass,
            };
            vec![(late_requests, lag), (LinkMode::DROP, f.hold.saturating_sub(lag))]
        }
        _ => vec![(LinkMode::DROP, f.hold)],
    };
    store_links_through(&shared.topo, a, &steps).await;
    Ok(desc)
}

/// Cuts the StoreSvr leader off from both followers for the hold.
async fn partition_leader(shared: &Shared, f: &PlannedFault) -> anyhow::Result<String> {
    let set = set_of_pick(shared, f.pick);
    let guess = members(set).start() + f.pick % N;
    let l = store_leader(shared, set).await;
    let desc = match l {
        Some(l) => format!("{} (leader)", store_name(l)),
        None => format!("{} (no leader found; guessed)", store_name(guess)),
    };
    let l = l.unwrap_or(guess);
    let links: Vec<(u64, u64)> = members(set)
        .filter(|&j| j != l)
        .flat_map(|j| [(l, j), (j, l)])
        .collect();
    for k in &links {
        shared.topo.raft[k].set(LinkMode::DROP);
    }
    sleep(f.hold).await;
    for k in &links {
        shared.topo.raft[k].set(LinkMode::PASS);
    }
    Ok(desc)
}

/// SIGTERM an owner AllocSvr and restart it; for `TermAllocTwice`, once more after the hold.
async fn term_fault(shared: &Shared, f: &PlannedFault) -> anyhow::Result<String> {
    let (a, desc) = owner_of(shared, f.pick).await;
    let name = alloc_name(a);
    terminate(shared, &name).await?;
    if f.kind == FaultKind::TermAllocTwice {
        shared.cluster.lock().await.start(&name)?;
        sleep(f.hold).await;
        terminate(shared, &name).await?;
    } else {
        sleep(f.hold).await;
    }
    shared.cluster.lock().await.start(&name)?;
    Ok(desc)
}

/// SIGKILL an owner, restart it, SIGKILL it again as soon as it registered; restart after the hold.
async fn kill_registered(shared: &Shared, f: &PlannedFault) -> anyhow::Result<String> {
    let (a, desc) = owner_of(shared, f.pick).await;
    let name = alloc_name(a);
    let log = {
        let mut c = shared.cluster.lock().await;
        c.kill(&name)?;
        c.start(&name)?;
        c.log_path(&name).map(|p| p.to_path_buf())
    };
    let seen = match log {
        Some(log) => wait_for_log_line(&log, "registered", TARGET_TIMEOUT).await,
        None => false,
    };
    shared.cluster.lock().await.kill(&name)?;
    sleep(f.hold).await;
    shared.cluster.lock().await.start(&name)?;
    Ok(if seen {
        format!("{desc}; killed again right after it registered")
    } else {
        format!("{desc}; no registration seen, killed again anyway")
    })
}
