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
//! This file keeps the orchestration; `cluster` starts, observes, heals and stops the processes,
//! `faults` injects the schedule, `moves` drives the operator moves, and `crate::verify` is what
//! `sim load` shares with it.
//!
//! With `--ids`, time-ordered ids run beside the sequences ([`ids`]): id clients, the AllocSvrs'
//! id clocks behind files the id clock faults write, and U1–U4 checked.
//!
//! With `--hostile` (and `--front http|resp`), [`hostile`] floods the front ends beside the
//! workload after a first phase without floods, and adds its bounds (memory, a well-behaved
//! caller's p99) to the verdict.
//!
//! Deliberately left out: StoreSvr membership changes.

mod cluster;
mod faults;
pub mod hostile;
pub mod ids;
mod moves;
mod targets;

use cluster::{
    heal_everything, poll_loop, progress_loop, record_final_state, replica_clients, start_cluster, stop_cluster,
};
use faults::inject_all;

use crate::checks;
use crate::history::{History, HistoryWriter, Record, RunClock, RunInfo};
use crate::schedule::{FaultKind, PlannedFault, ScheduleParams, plan};
use crate::stats;
use crate::topology::{SetArgs, Topology, data_dir};
use crate::verify::{serve_every_section, touched_uids, verify_served};
use crate::workload::{Recorder, WorkloadParams, hot_uids, run_client, run_pinned};
use anyhow::Context;
use seqsvr_client::{Client, ClientConfig};
use seqsvr_control::StoreClient;
use seqsvr_harness::{PanicLine, Supervisor, find_binary};
use seqsvr_proto::pb;
use std::collections::BTreeMap;
use std::path::Path;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Mutex as AsyncMutex;
use tokio::time::Instant;

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
    /// Time-ordered ids with this layout (`--ids`): id clients, id clock faults, U1–U4.
    pub ids: Option<seqsvr_proto::id_layout::IdLayout>,
    /// Largest block of the routing clients' `Reserve` calls (`--blocks`); 0: none.
    pub max_block: u32,
    /// Named counters asked for beside the uids (`--keys`; 0: none).
    pub keys: u32,
    /// Floods of the front ends beside the workload (`--hostile`).
    pub hostile: Option<hostile::HostileOpts>,
    /// Ledger callers beside the workload (`--ledger`): G1–G3 and holds checked.
    pub ledger: bool,
}

/// The verdict of a run that completed (a harness failure is an `Err` instead).
pub struct Verdict {
    pub violations: usize,
    pub crashes: Vec<String>,
    pub panics: usize,
    /// Why the hostile mode fails the run (memory, the well-behaved caller's p99).
    pub hostile: Vec<String>,
}

impl Verdict {
    pub fn passed(&self) -> bool {
        self.violations == 0 && self.crashes.is_empty() && self.panics == 0 && self.hostile.is_empty()
    }
}

type ReplicaClient = pb::store_service_client::StoreServiceClient<tonic::transport::Channel>;

/// The running lab: the cluster's processes, its clients, the history being written and what the
/// fault injector and the operator moves share.
struct Lab {
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
    /// With ids: where the AllocSvrs' clock files are (`ids`).
    clock_dir: Option<PathBuf>,
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
        max_block: opts.max_block,
        keys: opts.keys,
    }
}

/// Starts the seeded routing clients and the pinned (stale-route) clients.
async fn start_workload(
    opts: &RunOpts,
    lab: &Lab,
    client_cfg: &ClientConfig,
    rec: &Arc<Recorder>,
    stop: &Arc<AtomicBool>,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let wp = workload_params(opts);
    let hot = lab.hot.clone();
    let mut workers = Vec::new();
    let fronts: Vec<std::net::SocketAddr> = lab.topo.front_addr.values().copied().collect();
    for c in 1..=opts.clients {
        if opts.set.front != crate::front_workload::Front::Grpc {
            let worker = crate::front_workload::run_front_client(
                opts.set.front,
                fronts.clone(),
                c,
                wp.clone(),
                hot.clone(),
                rec.clone(),
                stop.clone(),
            );
            workers.push(tokio::spawn(worker));
            continue;
        }
        let client = Client::connect(client_cfg.clone()).await.context("client connect")?;
        let worker = run_client(client, c, wp.clone(), hot.clone(), rec.clone(), stop.clone());
        workers.push(tokio::spawn(worker));
    }
    for (&a, proxy) in &lab.topo.client_alloc {
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
    if opts.ids.is_some() {
        workers.extend(ids::start_clients(lab, opts.seed, client_cfg, rec, stop).await?);
    }
    if opts.ledger {
        let callers = opts.clients.clamp(1, 8);
        let rate = opts.rate_per_client.min(20.0);
        workers.extend(crate::ledger_workload::start(client_cfg, opts.seed, callers, rate, rec, stop).await?);
    }
    Ok(workers)
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

/// Injects the fault schedule while the workload runs for the run's duration, then stops the
/// workload and waits for its clients.
async fn drive_faults(
    lab: &Arc<Lab>,
    opts: &RunOpts,
    workers: Vec<tokio::task::JoinHandle<()>>,
    stop: &AtomicBool,
) -> anyhow::Result<()> {
    let schedule = schedule_for(opts);
    println!("sim: {} faults scheduled over {:?}", schedule.len(), opts.duration);
    let start = Instant::now();
    let injector = tokio::spawn(inject_all(lab.clone(), schedule, start));
    tokio::time::sleep_until(start + opts.duration).await;
    injector.await.context("fault injector")??;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.context("workload client")?;
    }
    Ok(())
}

/// The run's parameters as the history's first record states them.
/// The healed line, and with `--front resp-cluster` how many `-MOVED` the clients followed.
fn say_healed(opts: &RunOpts, touched: usize) {
    println!("sim: healed; verifying {touched} touched uids are served again");
    if opts.set.front == crate::front_workload::Front::RespCluster {
        let moved = crate::front_workload::redirects();
        println!("sim: Redis Cluster clients followed {moved} -MOVED redirects");
    }
}

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
        ids: None,
        key_placement: match opts.set.front {
            crate::front_workload::Front::RespCluster => seqsvr_proto::keys::KeyPlacement::Slots,
            _ => seqsvr_proto::keys::KeyPlacement::Sha256,
        },
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

/// `--ids`: set 0's id setup for every StoreSvr, a clock file for every AllocSvr (at the true time).
fn turn_on_ids(opts: &mut RunOpts, dir: &Path) -> anyhow::Result<()> {
    let Some(layout) = opts.ids else { return Ok(()) };
    opts.set.store_extra.extend(ids::store_flags(&layout));
    opts.set.id_clock_dir = Some(dir.to_path_buf());
    ids::reset_clocks(dir, opts.sets).context("clock files")?;
    println!(
        "sim: time-ordered ids, layout {layout}, allowance {} ms; AllocSvr clocks in {}",
        ids::MAX_AHEAD_MS,
        dir.join("allocsvr-N.clock").display()
    );
    Ok(())
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
    turn_on_ids(&mut opts, &dir)?;
    println!("sim: replay with: {}", opts.replay);
    let topo = Topology::new(opts.sets).await?;
    let (cluster, stores) = start_cluster(&opts, &dir, &topo).await?;
    let sections = opts.set.uid_limit.div_ceil(opts.set.section_size);

    let clock = RunClock::start();
    let mut info = run_info(&opts);
    info.ids = opts.ids.map(|layout| ids::info(layout, clock));
    let history_path = dir.join("history.jsonl");
    let history = Arc::new(HistoryWriter::create(&history_path, clock, &info)?);
    let rec = Arc::new(Recorder::new(history.clone()));
    let counters = rec.counters.clone();
    let lab = Arc::new(Lab {
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
        clock_dir: opts.set.id_clock_dir.clone(),
    });
    let client_cfg = ClientConfig {
        tls: crate::tls::client(),
        ..ClientConfig::new(lab.topo.client_seeds())
    };
    let probe = Client::connect(client_cfg.clone()).await.context("client connect")?;
    serve_every_section(&probe, &rec, opts.set.section_size, opts.set.uid_limit).await?;

    let stop = Arc::new(AtomicBool::new(false));
    let workers = start_workload(&opts, &lab, &client_cfg, &rec, &stop).await?;
    let background_stop = Arc::new(AtomicBool::new(false));
    let poller = tokio::spawn(poll_loop(lab.clone(), background_stop.clone()));
    let progress = tokio::spawn(progress_loop(lab.clone(), counters.clone(), background_stop.clone()));
    let mut hostile = match &opts.hostile {
        Some(h) => Some(hostile::start(&lab, h.clone(), opts.set.front, &rec).await?),
        None => None,
    };
    if let Some(h) = &mut hostile {
        h.first_phase().await;
        h.start_floods(opts.duration);
    }
    drive_faults(&lab, &opts, workers, &stop).await?;
    let hostile = match hostile {
        Some(h) => Some(h.finish().await?),
        None => None,
    };
    heal_everything(&lab).await?;
    moves::finish_all(&lab).await?;
    let verify_from = clock.now_ns();
    let ledgers = verify_after_heal(&opts, &lab, &probe, &client_cfg).await?;
    background_stop.store(true, Ordering::Relaxed);
    poller.await.context("poller")?;
    progress.await.context("progress")?;

    let max_path = dir.join("max_seqs.json");
    let final_max = record_final_state(&lab, &history, clock, &max_path).await?;
    info.verify_from_ns = Some(verify_from);
    history.write(&Record::Info(info))?;
    history.flush()?;
    let (panics, crashes) = stop_cluster(&lab).await?;
    judge(
        &opts,
        &history_path,
        &max_path,
        &final_max,
        Ended {
            panics,
            crashes,
            hostile: hostile.as_ref(),
            ledgers: ledgers.as_ref(),
        },
    )
}

/// The verify phase after the final heal: every touched uid, the ids and the ledgers served
/// again; with `--ledger`, every ledger as each set keeps it.
async fn verify_after_heal(
    opts: &RunOpts,
    lab: &Lab,
    probe: &Client,
    client_cfg: &ClientConfig,
) -> anyhow::Result<Option<checks::ledger::Ledgers>> {
    let rec = &lab.rec;
    let touched = touched_uids(rec);
    say_healed(opts, touched.len());
    verify_served(probe, rec, &touched).await;
    if opts.ids.is_some() {
        ids::verify(client_cfg, rec).await?;
    }
    Ok(match opts.ledger {
        true => Some(crate::ledger_workload::after_heal(client_cfg, rec, &lab.topo).await?),
        false => None,
    })
}

/// How the cluster ended, beside the history: the processes' panics and crashes, the hostile
/// mode's run, and with `--ledger` every ledger as each set keeps it.
struct Ended<'a> {
    panics: Vec<PanicLine>,
    crashes: Vec<String>,
    hostile: Option<&'a hostile::HostileRun>,
    ledgers: Option<&'a checks::ledger::Ledgers>,
}

/// Reads the whole history back and checks every promise over it; prints the report.
fn judge(
    opts: &RunOpts,
    history_path: &Path,
    max_path: &Path,
    final_max: &BTreeMap<u64, u64>,
    ended: Ended<'_>,
) -> anyhow::Result<Verdict> {
    let Ended {
        panics,
        crashes,
        hostile,
        ledgers,
    } = ended;
    let h = History::read(history_path)?;
    let mut report = checks::check_all(&h, Some(final_max))?;
    if let Some(ledgers) = ledgers {
        let end = checks::ledger::Final {
            ledgers,
            // StoreSvr clocks are the host's, but a paused or restarted leader stamps late:
            // expiries are checked for order, not against the hold's length.
            wall_origin_ms: None,
            verify_from_ns: h.info.verify_from_ns.unwrap_or(0),
            rewinds: &[],
        };
        let mut found: BTreeMap<checks::Promise, Vec<checks::Violation>> =
            checks::ledger::check(&h.ledger, &end).into_iter().collect();
        // Each ledger promise shows as checked, with 0 when nothing broke it.
        for promise in [
            checks::Promise::G1,
            checks::Promise::G2,
            checks::Promise::G3,
            checks::Promise::Holds,
        ] {
            report.add(promise, found.remove(&promise).unwrap_or_default());
        }
        for (promise, rest) in found {
            report.add(promise, rest);
        }
        println!(
            "ledger: {} calls checked over {} ledgers",
            h.ledger.len(),
            ledgers.len()
        );
    }
    print_report(&h, &report, &panics, &crashes);
    // A fault's effects can outlast it by a lease: a section that a restarted or healed node
    // gains back waits out its old holder's lease. Longer would leave out nearly every call of
    // a run with faults (one every 10 s or so, each held for seconds).
    let settle = Duration::from_millis(opts.set.lease_ms);
    let hostile = hostile.map(|run| run.judge(&h, settle)).unwrap_or_default();
    print_where(opts, history_path, max_path);
    Ok(Verdict {
        violations: report.total_violations(),
        crashes,
        panics: panics.len(),
        hostile,
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
            ids: opts.ids.is_some(),
        },
    )
}
