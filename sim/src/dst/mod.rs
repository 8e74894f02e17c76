//! `sim dst`: deterministic simulation. One seed runs a whole set — three StoreSvr replicas, three
//! AllocSvrs, three routing clients — in one thread on tokio's paused clock, with the network,
//! crashes, pauses and disk wipes drawn from the seed, and checks the history with the same
//! checkers as `sim run`. The same seed gives the same history, bit for bit.
//!
//! The code under test is the production code, not a model of it:
//! - StoreSvr: the state machine (`SetState::apply_with`), the request checks and replies and the
//!   arbiter tick (`storesvr::protocol`), with the same unsafe rules as the real binary;
//! - AllocSvr: `allocsvr::Core` (registration, renewal loop, grants, gains, bumps, releases,
//!   leases) and its gRPC `Service` behind the generated server;
//! - client: `seqsvr_client::Client` (routing, retries, backoff, deadlines) over its in-process
//!   transport, recorded by the same workload code as `sim run`;
//! - with `--sets 2`, a second set and operator moves ([`moves`]): the move driver
//!   (`seqsvr_control::Mover`) and the store's move RPCs (`storesvr::protocol::moves`, behind the
//!   generated servers in [`services`]); the faults then hit set 1's AllocSvrs and StoreSvr
//!   leader too ([`faults::set1_faults`]);
//! - in a share of the seeds, a backup of a set, its loss and its restore ([`restore`]) by the
//!   code of `storesvr restore` (the backup file, the check against the live map, the margin, the
//!   raised state).
//!
//! What is modelled is listed in [`group`] (Raft) and [`world`] (network, processes, the
//! AllocSvr's store client); [`transport`] carries the client's and the operator's calls to the
//! generated servers, [`addrs`] names every replica, [`tally`] counts what the forger and the
//! restores did. The files import strictly downward: addrs and tally, group, world, services and
//! the forger, transport, moves and restore, faults, then this file.
//!
//! Deliberately left out: data-plane duplicates (a copy of a fetch only wastes a number) and clock
//! faults on the StoreSvrs (they read the one simulated clock; an AllocSvr's lease clock can be
//! suspended or drift, [`faults`]).

pub mod addrs;
pub mod faults;
pub mod forger;
pub mod group;
pub mod ids;
pub mod ledger;
pub mod moves;
pub mod restore;
#[cfg(test)]
mod scripts;
pub mod services;
pub mod tally;
pub mod trace;
pub mod transport;
pub mod world;

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use seqsvr_client::{Client, ClientConfig};
use storesvr::domain::state::SetParams;

use crate::checks::{self, Report};
use crate::history::{FaultSpan, History, HistoryWriter, Poll, Record, RunClock, RunInfo};
use crate::workload::{self, Recorder, WorkloadParams};
use addrs::REPLICAS;
use faults::Fault;
use group::Group;
use transport::SimConnect;
use world::{AllocSlot, Proc, State, World};

/// AllocSvrs per seed.
pub const ALLOCS: usize = 3;
/// Workload clients per seed.
pub const CLIENTS: u32 = 3;

/// What to run a seed with.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// AllocSvr negative controls.
    pub alloc: allocsvr::UnsafeRules,
    /// StoreSvr negative controls (the state machine's rules and the fence before a Bump).
    pub store: storesvr::domain::state::UnsafeRules,
    /// Keep only these faults of the seed's schedule (by index); all when `None`.
    pub only_faults: Option<BTreeSet<usize>>,
    /// Keep the history (for `--history` and the trace).
    pub keep_history: bool,
    /// Two sets and operator moves between them (`--sets 2`); one set otherwise.
    pub two_sets: bool,
    /// Negative control: a move's source hands out its ceilings without the lease wait.
    pub skip_move_wait: bool,
    /// Negative controls of the clock faults.
    pub clock: world::ClockControl,
    /// Negative control: a restore does not check the backup against the live cluster map.
    pub skip_restore_map_check: bool,
    /// Time-ordered ids beside the sequences (`--ids`): set 0 sets ids up, the AllocSvrs hold
    /// slots and raise marks, id clients call `NextIds`, the id clocks take faults, and U1–U4 are
    /// checked. Off, a seed runs the schedule it ran before ids existed.
    pub ids: bool,
    /// Blocks (`--blocks`): a share of the routing clients' fetches are `Reserve(uid, n)` of up to
    /// [`MAX_BLOCK`] seqs (or the set's step), checked as n fetches each. Off, a seed runs the
    /// schedule it ran before blocks existed.
    pub blocks: bool,
    /// Named counters (`--keys`): a share of the routing clients' single calls ask one of
    /// [`crate::keys::KEYS`] keys instead of a uid (next, blocks with `--blocks`, get), each key
    /// checked as a subject of its own; every AllocSvr holds at most
    /// [`crate::keys::MAX_LIVE_KEYS`], so keys are forgotten and come back. Off, a seed runs the
    /// schedule it ran before keys existed.
    pub keys: bool,
    /// Ledger counters (`--ledger`): callers reserve, confirm and release numbers of a few
    /// ledgers through the store's LedgerService logic, and G1–G3 are checked ([`ledger`]). Off,
    /// a seed runs the schedule it ran before ledgers existed.
    pub ledger: bool,
    /// Negative control (with `ledger`): a reserve is answered with the leader's predicted number
    /// before its entry commits.
    pub ledger_answer_before_commit: bool,
}

/// Largest block `--blocks` draws: the seeds' steps are 10 to 50.
pub const MAX_BLOCK: u64 = 16;

impl Options {
    /// The flags that reproduce these options on the command line.
    pub fn flags(&self) -> String {
        let mut out = String::new();
        let mut add = |on: bool, f: &str| {
            if on {
                out.push_str(" --");
                out.push_str(f);
            }
        };
        add(self.alloc.skip_lease_wait, "unsafe-skip-lease-wait");
        add(self.alloc.serve_before_bump_ack, "unsafe-serve-before-bump-ack");
        add(self.alloc.keep_memory, "unsafe-keep-memory");
        add(self.store.skip_epoch_fence, "unsafe-skip-epoch-fence");
        add(self.store.unfenced_release, "unsafe-unfenced-release");
        add(self.store.skip_binding, "unsafe-skip-binding");
        add(self.skip_move_wait, "unsafe-skip-move-wait");
        add(self.clock.monotonic, "unsafe-monotonic-lease-clock");
        add(self.skip_restore_map_check, "unsafe-skip-restore-map-check");
        add(self.store.skip_slot_fence, "unsafe-skip-slot-fence");
        add(
            self.store.predecessor_wait_from_first_renewal,
            "unsafe-predecessor-wait-from-first-renewal",
        );
        add(self.alloc.ids.ignore_floor, "unsafe-ids-ignore-floor");
        add(self.alloc.ids.ignore_mark, "unsafe-ids-ignore-mark");
        add(self.alloc.block_overlap, "unsafe-block-overlap");
        add(self.alloc.keys_share_seq, "unsafe-keys-share-seq");
        add(self.alloc.keys_forget_to_base, "unsafe-keys-forget-to-base");
        add(self.ledger_answer_before_commit, "unsafe-ledger-answer-before-commit");
        if let Some(ppm) = self.clock.drift_ppm {
            out.push_str(&format!(" --unsafe-clock-drift-ppm={ppm}"));
        }
        if self.two_sets {
            out.push_str(" --sets 2");
        }
        if self.ids {
            out.push_str(" --ids");
        }
        if self.keys {
            out.push_str(" --keys");
        }
        if self.blocks {
            out.push_str(" --blocks");
        }
        if self.ledger {
            out.push_str(" --ledger");
        }
        if let Some(only) = &self.only_faults {
            let list: Vec<String> = only.iter().map(usize::to_string).collect();
            out.push_str(&format!(" --faults {}", list.join(",")));
        }
        out
    }
}

/// What one seed gave.
pub struct Outcome {
    pub seed: u64,
    /// Hash of every history record, in order: equal for equal histories.
    pub hash: u64,
    pub report: Report,
    pub faults: Vec<Fault>,
    pub history: Option<History>,
    pub changes: Vec<group::OwnerChange>,
    /// Sections named by a Release the epoch fence refused (see `Group::stale_releases`).
    pub stale_releases: u64,
    /// What the seed's forger sent and the store refused (zeros without one).
    pub forged: tally::Forged,
    /// What the seed's restore did (nothing without one).
    pub restores: tally::Tally,
    /// What the ledger callers did and how their numbers ended (`--ledger` only).
    pub ledger: Option<crate::checks::ledger::LedgerStats>,
}

impl Outcome {
    /// Faults of the schedule that hit set 1's processes (a restore of set 1 not counted).
    pub fn set1_faults(&self) -> usize {
        let restore = |f: &Fault| matches!(f.kind, faults::Kind::RestoreSet(_));
        self.faults.iter().filter(|f| f.hits_set(1) && !restore(f)).count()
    }
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.report.total_violations() == 0
    }
}

/// The set's parameters of a seed, drawn from it: small sections and steps so that a few seconds
/// see many bumps and owner changes; a lease of 1, 2 or 4 s against a 1 s failure detection, so
/// that a cut-off owner's lease sometimes outlives the detection of its death (where the lease
/// wait and the fences matter) and sometimes does not.
pub fn params(seed: u64) -> SetParams {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x9a7a_0000_0000_0000);
    let lease_ms = [1_000, 2_000, 4_000][rng.random_range(0..3)];
    SetParams {
        set_id: 0,
        section_size: 1_000,
        uid_limit: 8_000,
        step: [10, 20, 50][rng.random_range(0..3)],
        lease_ms,
        renew_interval_ms: (lease_ms / 4).min(500),
        drift_ppm: 10_000,
        margin_ms: 100,
        section_begin: 0,
        section_end: 8,
    }
}

/// Failure detection on the store leader.
const DETECT: Duration = Duration::from_millis(1_000);
/// Load with faults, then healed; then the verify phase.
pub const LOAD_MS: u64 = 8_000;
const POLL_EVERY: Duration = Duration::from_millis(250);

/// After the heal: long enough for a lost owner to be detected, its sections' lease wait to pass
/// and the new owner to load them.
fn settle(p: &SetParams) -> Duration {
    Duration::from_millis(2 * p.lease_ms + DETECT.as_millis() as u64 + 1_000)
}

/// Runs one seed to the end and checks its history.
pub fn run_seed(seed: u64, opts: &Options) -> Outcome {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    rt.block_on(run(seed, opts))
}

async fn run(seed: u64, opts: &Options) -> Outcome {
    let p = params(seed);
    let all = seed_faults(seed, &p, opts);
    let world = World::new(initial_state(seed, &p, opts), opts.alloc);
    let ids = opts.ids.then(|| ids::set_up(&world, seed));
    let ledgers = opts
        .ledger
        .then(|| ledger::set_up(&world, seed, opts.ledger_answer_before_commit));
    world.set_clock_control(opts.clock);
    let info = RunInfo {
        seed,
        section_size: p.section_size,
        uid_limit: p.uid_limit,
        step: p.step,
        lease_ms: p.lease_ms,
        fault_free: false,
        replay: format!("sim dst --seed {seed}{}", opts.flags()),
        verify_from_ns: None,
        ids,
        key_placement: Default::default(),
    };
    let clock = RunClock::start();
    let rec = Arc::new(Recorder::new(Arc::new(HistoryWriter::in_memory(clock, &info))));
    spawn_store(&world);
    let allocs = world.lock().allocs.len();
    for i in 0..allocs {
        world.start_alloc(i);
    }
    let mover = if opts.two_sets {
        moves::add_set(&world).await;
        let plans = moves::schedule(seed, LOAD_MS);
        Some(tokio::spawn(moves::run(
            world.clone(),
            plans,
            rec.clone(),
            p.section_end,
        )))
    } else {
        None
    };
    let poller = tokio::spawn(poll(world.clone(), rec.clone()));
    let stop = Arc::new(AtomicBool::new(false));
    let wp = workload_params(seed, &p, opts.blocks, opts.keys);
    spawn_clients(&world, seed, &wp, &rec, &stop);
    if opts.ids {
        ids::spawn_clients(&world, seed, &rec, &stop);
    }
    if let Some(l) = &ledgers {
        l.spawn(seed, &stop);
    }
    inject_all(&world, &all, &rec).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    faults::heal_all(&world);
    if let Some(m) = mover {
        let _ = m.await;
    }
    tokio::time::sleep(settle(&p)).await;
    let verify_from_ns = clock.now_ns();
    verify(&world, seed, &rec).await;
    if opts.ids {
        ids::verify(&world, seed, &rec).await;
    }
    if let Some(l) = &ledgers {
        l.verify().await;
    }
    poller.abort();
    let ledger_end = ledgers.map(|l| (l.ops(), l.finals()));
    finish(world, rec, info, verify_from_ns, all, opts, ledger_end)
}

/// The seed's faults, or the subset `--faults` keeps (the others stay where they were).
fn seed_faults(seed: u64, p: &SetParams, opts: &Options) -> Vec<Fault> {
    let all = faults::schedule(seed, LOAD_MS, ALLOCS, p.lease_ms, opts.two_sets, opts.ids);
    match &opts.only_faults {
        None => all,
        Some(only) => all
            .into_iter()
            .enumerate()
            .filter(|(i, _)| only.contains(i))
            .map(|(_, f)| f)
            .collect(),
    }
}

/// The routing clients, then one pinned client per AllocSvr, until `stop`.
fn spawn_clients(world: &Arc<World>, seed: u64, wp: &WorkloadParams, rec: &Arc<Recorder>, stop: &Arc<AtomicBool>) {
    let hot = Arc::new(workload::hot_uids(wp));
    for c in 0..CLIENTS {
        let client = client(world, seed, c, Duration::from_secs(2));
        tokio::spawn(workload::run_client(
            client,
            c,
            wp.clone(),
            hot.clone(),
            rec.clone(),
            stop.clone(),
        ));
    }
    spawn_pinned(world, wp, &hot, rec, stop);
}

fn initial_state(seed: u64, p: &SetParams, opts: &Options) -> State {
    State {
        rng: world::rng(seed),
        net: Default::default(),
        groups: groups(p, opts),
        allocs: (0..ALLOCS + if opts.two_sets { moves::SET1_ALLOCS } else { 0 })
            .map(|i| AllocSlot {
                set: u64::from(i >= ALLOCS),
                node_id: i as u64 + 1,
                addr: format!("allocsvr-{i}:7000"),
                proc: Proc::none(),
                core: None,
                server: None,
                host_suspended_until: None,
            })
            .collect(),
        forger: None,
        forged: Default::default(),
        skip_restore_check: opts.skip_restore_map_check,
        restores: Default::default(),
    }
}

/// Set 0 over the whole uid space, and with `--sets 2` an empty set 1 that ranges move into.
fn groups(p: &SetParams, opts: &Options) -> Vec<Group> {
    if !opts.two_sets {
        return vec![Group::new(p.clone(), DETECT, opts.store)];
    }
    let set1 = SetParams {
        set_id: 1,
        section_begin: 0,
        section_end: 0,
        ..p.clone()
    };
    [p.clone(), set1]
        .into_iter()
        .map(|params| {
            let mut g = Group::new(params, DETECT, opts.store);
            g.carry_map = true;
            g.skip_move_wait = opts.skip_move_wait;
            g
        })
        .collect()
}

fn workload_params(seed: u64, p: &SetParams, blocks: bool, keys: bool) -> WorkloadParams {
    WorkloadParams {
        seed,
        clients: CLIENTS,
        rate_per_client: 100.0,
        section_size: p.section_size,
        uid_limit: p.uid_limit,
        hot_per_section: 2,
        max_batch: 4,
        // Blocks up to a step (one bump's room) but short enough for a history of values.
        max_block: if blocks { p.step.min(MAX_BLOCK) as u32 } else { 0 },
        keys: if keys { crate::keys::KEYS } else { 0 },
    }
}

pub(crate) fn client(world: &Arc<World>, seed: u64, id: u32, deadline: Duration) -> Client {
    let cfg = ClientConfig {
        seeds: world.lock().allocs.iter().map(|s| s.addr.clone()).collect(),
        deadline,
        attempt_timeout: Duration::from_millis(500),
        ..ClientConfig::default()
    };
    let via = Arc::new(SimConnect { world: world.clone() });
    Client::in_process(cfg, via, seed.wrapping_mul(31).wrapping_add(id as u64)).expect("valid client config")
}

/// One client per AllocSvr that ignores routing and keeps asking that node (a stale route cache),
/// as in `sim run`: what lets a stale owner that still answers show itself.
fn spawn_pinned(
    world: &Arc<World>,
    wp: &WorkloadParams,
    hot: &Arc<Vec<u64>>,
    rec: &Arc<Recorder>,
    stop: &Arc<AtomicBool>,
) {
    let addrs: Vec<String> = world.lock().allocs.iter().map(|s| s.addr.clone()).collect();
    let via: Arc<dyn seqsvr_client::Connect> = Arc::new(SimConnect { world: world.clone() });
    for (i, addr) in addrs.into_iter().enumerate() {
        let conn = seqsvr_client::Conn::InProcess {
            addr: addr.into(),
            via: via.clone(),
        };
        let alloc = seqsvr_proto::pb::alloc_service_client::AllocServiceClient::new(conn)
            .max_decoding_message_size(seqsvr_proto::limits::DATA_PLANE_MESSAGE_BYTES)
            .max_encoding_message_size(seqsvr_proto::limits::DATA_PLANE_MESSAGE_BYTES);
        let pinned = WorkloadParams {
            rate_per_client: wp.rate_per_client / 2.0,
            ..wp.clone()
        };
        let id = workload::PINNED_CLIENT_BASE + i as u32;
        tokio::spawn(workload::run_pinned(
            alloc,
            id,
            pinned,
            hot.clone(),
            rec.clone(),
            stop.clone(),
        ));
    }
}

/// Raft's housekeeping every 10 ms and each replica's arbiter every tick, as the store runs it.
pub(crate) fn spawn_store(world: &Arc<World>) {
    let w = world.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(10)).await;
            let mut st = w.lock();
            let st = &mut *st;
            let rng = &mut st.rng;
            for g in &mut st.groups {
                g.raft_tick(tokio::time::Instant::now().into_std(), |n| {
                    rand::Rng::random_range(&mut *rng, 0..n)
                });
            }
        }
    });
    let sets = world.lock().groups.len() as u64;
    for set in 0..sets {
        for r in 0..REPLICAS {
            let w = world.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(storesvr::replica::ARBITER_TICK).await;
                    let (cmds, term) = {
                        let mut st = w.lock();
                        let g = &mut st.groups[set as usize];
                        (g.arbiter(r, tokio::time::Instant::now().into_std()), g.term_of(r))
                    };
                    // In order, stopping at the first that did not commit (as the store's loop).
                    for cmd in cmds {
                        if w.commit(set, r, term, &cmd).await.is_none() {
                            break;
                        }
                    }
                }
            });
        }
    }
}

/// Each set's leader's `max_seq` of every section, read linearizably a few times a second (P3),
/// one source per set ("leader" for set 0, "set N leader" for the others).
async fn poll(world: Arc<World>, rec: Arc<Recorder>) {
    loop {
        tokio::time::sleep(POLL_EVERY).await;
        let polls: Vec<(String, Vec<(u64, u64)>)> = {
            let st = world.lock();
            st.groups
                .iter()
                .enumerate()
                .filter(|(_, g)| g.leader().is_some())
                .map(|(set, g)| {
                    let source = if set == 0 {
                        "leader".into()
                    } else {
                        format!("set {set} leader")
                    };
                    let max_seqs = g
                        .set
                        .sections
                        .iter()
                        .enumerate()
                        .map(|(i, s)| (i as u64, s.max_seq))
                        .collect();
                    (source, max_seqs)
                })
                .collect()
        };
        for (source, max_seqs) in polls {
            let _ = rec.history.write(&Record::Poll(Poll {
                at_ns: rec.history.clock().now_ns(),
                source,
                max_seqs,
                sum: None,
            }));
        }
    }
}

/// Injects and heals every fault at its time; returns at the end of the load.
async fn inject_all(world: &Arc<World>, all: &[Fault], rec: &Arc<Recorder>) {
    let mut events: Vec<(u64, bool, usize)> = Vec::new();
    for (i, f) in all.iter().enumerate() {
        events.push((f.at_ms, true, i));
        events.push(((f.at_ms + f.for_ms).min(LOAD_MS), false, i));
    }
    events.sort();
    let start = tokio::time::Instant::now();
    let mut targets: BTreeMap<usize, (String, u64)> = BTreeMap::new();
    for (at, inject, i) in events {
        tokio::time::sleep_until(start + Duration::from_millis(at)).await;
        let f = &all[i];
        if inject {
            targets.insert(i, (faults::inject(world, f), rec.history.clock().now_ns()));
        } else if let Some((target, start_ns)) = targets.remove(&i) {
            faults::heal(world, f, &target);
            let _ = rec.history.write(&Record::Fault(FaultSpan {
                id: i as u64,
                kind: f.name(),
                target,
                start_ns,
                end_ns: rec.history.clock().now_ns(),
            }));
        }
    }
    tokio::time::sleep_until(start + Duration::from_millis(LOAD_MS)).await;
}

/// After the heal, every touched uid must be served again.
async fn verify(world: &Arc<World>, seed: u64, rec: &Arc<Recorder>) {
    let client = client(world, seed, CLIENTS, Duration::from_secs(10));
    let touched: BTreeSet<u64> = rec
        .touched
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .copied()
        .collect();
    for subject in touched {
        rec.fetch_subject(&client, CLIENTS, subject).await;
    }
}

fn finish(
    world: Arc<World>,
    rec: Arc<Recorder>,
    mut info: RunInfo,
    verify_from_ns: u64,
    faults: Vec<Fault>,
    opts: &Options,
    ledger_end: Option<(
        Vec<checks::ledger::LedgerOp>,
        BTreeMap<String, Vec<storesvr::domain::ledger::Ledger>>,
    )>,
) -> Outcome {
    info.verify_from_ns = Some(verify_from_ns);
    let records = rec.history.take();
    let mut hasher = std::hash::DefaultHasher::new();
    for r in &records {
        serde_json::to_string(r).unwrap_or_default().hash(&mut hasher);
    }
    let mut history = History::from_records(records);
    history.info = info;
    let (final_max, changes, stale_releases, forged, restores) = {
        let mut st = world.lock();
        // The AllocSvrs hold the world through their store transport: let go of them so that
        // the seed's memory is freed with its runtime.
        st.allocs.clear();
        let mut m: BTreeMap<u64, u64> = BTreeMap::new();
        let mut changes = Vec::new();
        let mut stale = 0;
        for g in &st.groups {
            for (i, s) in g.set.sections.iter().enumerate() {
                let e = m.entry(i as u64).or_default();
                *e = (*e).max(s.max_seq);
            }
            changes.extend(g.changes.iter().cloned());
            stale += g.stale_releases;
        }
        changes.sort_by_key(|c| c.at_ns);
        (m, changes, stale, st.forged, std::mem::take(&mut st.restores))
    };
    let mut report = checks::check_all(&history, Some(&final_max)).unwrap_or_default();
    let ledger =
        ledger_end.map(|(ops, ledgers)| check_ledgers(&mut report, &ops, &ledgers, &restores, verify_from_ns, opts));
    Outcome {
        seed: history.info.seed,
        hash: hasher.finish(),
        report,
        faults,
        history: opts.keep_history.then_some(history),
        changes,
        stale_releases,
        forged,
        restores,
        ledger,
    }
}

/// Checks the ledger calls and final ledgers into `report`; what the callers did.
fn check_ledgers(
    report: &mut Report,
    ops: &[checks::ledger::LedgerOp],
    ledgers: &BTreeMap<String, Vec<storesvr::domain::ledger::Ledger>>,
    restores: &tally::Tally,
    verify_from_ns: u64,
    opts: &Options,
) -> checks::ledger::LedgerStats {
    let rewinds: Vec<(u64, u64, u64)> = restores
        .rewinds
        .iter()
        .map(|r| (r.set, r.backup_ns, r.restored_ns))
        .collect();
    let end = checks::ledger::Final {
        rewinds: &rewinds,
        ledgers,
        // With `--ids` the StoreSvrs' clocks take faults: a leader's clock is not the true time.
        wall_origin_ms: (!opts.ids).then_some(world::ID_ORIGIN_MS),
        verify_from_ns,
    };
    for promise in [
        checks::Promise::G1,
        checks::Promise::G2,
        checks::Promise::G3,
        checks::Promise::Holds,
    ] {
        report.add(promise, Vec::new());
    }
    for (promise, found) in checks::ledger::check(ops, &end) {
        report.add(promise, found);
    }
    checks::ledger::LedgerStats::of(ops, ledgers)
}

/// What a range of seeds gave.
pub struct RangeResult {
    /// Seeds run (fewer than asked when stopped at the first failure).
    pub seeds_run: u64,
    /// Failing seeds, lowest first.
    pub failures: Vec<Outcome>,
    pub elapsed: Duration,
    /// Seeds in which the Release's epoch fence refused at least one section.
    pub stale_release_seeds: u64,
    /// Seeds with a forger, and the forged calls sent and refused over all of them.
    pub forger_seeds: u64,
    pub forged: tally::Forged,
    /// Seeds whose schedule hit set 1's processes.
    pub set1_fault_seeds: u64,
    /// Seeds in which a set was restored from its backup, in which the restore was refused, and
    /// in which the check against the live map refused it.
    pub restored_seeds: u64,
    pub refused_restore_seeds: u64,
    pub map_refused_restore_seeds: u64,
    /// Gaps across an owner change held to their section's reserve (P6's second half), over all
    /// seeds, and those beyond it (a statistic: every seed has faults).
    pub p6_bounded: u64,
    pub p6_beyond: u64,
    /// The ledger callers' calls and their numbers' ends, over all seeds (`--ledger`).
    pub ledger: crate::checks::ledger::LedgerStats,
}

impl RangeResult {
    pub fn seeds_per_second(&self) -> f64 {
        self.seeds_run as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// One line for a log: seeds run and failed, time and rate, seeds with faults on set 1, and
    /// restores done and refused.
    pub fn summary(&self, label: &str) -> String {
        format!(
            "{label}: {} seeds, {} failed, {:.1} s, {:.1} seeds/s; set-1 faults in {} seeds, restores in {} \
             seeds, refused in {}",
            self.seeds_run,
            self.failures.len(),
            self.elapsed.as_secs_f64(),
            self.seeds_per_second(),
            self.set1_fault_seeds,
            self.restored_seeds,
            self.refused_restore_seeds
        )
    }

    /// `Err` naming every failing seed and how to replay one (with `opts`' flags), or when fewer
    /// seeds ran than `range` holds; `Ok` when every seed of `range` ran and passed.
    pub fn all_passed(&self, range: &std::ops::Range<u64>, opts: &Options) -> Result<(), String> {
        if !self.failures.is_empty() {
            let failed: Vec<String> = self
                .failures
                .iter()
                .map(|o| format!("seed {}: {:?}", o.seed, o.report.counts))
                .collect();
            return Err(format!(
                "promises broken: {failed:?} (replay with `sim dst --seed S{}`)",
                opts.flags()
            ));
        }
        let asked = range.end - range.start;
        if self.seeds_run != asked {
            return Err(format!("{} of {asked} seeds ran", self.seeds_run));
        }
        Ok(())
    }
}

/// Runs seeds `range` on `threads` threads (each seed alone on one). With `stop_at_first`, no new
/// seed starts once one failed, and only failures below it are kept: the first failing seed of
/// the range is found whatever the threads' timing.
pub fn run_range(range: std::ops::Range<u64>, threads: usize, opts: &Options, stop_at_first: bool) -> RangeResult {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};
    let started = std::time::Instant::now();
    let next = AtomicU64::new(range.start);
    let first_failure = AtomicU64::new(u64::MAX);
    let ran = AtomicU64::new(0);
    let stale = AtomicU64::new(0);
    let (forger_seeds, sent, refused) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let (set1, restored, refused_restores) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let map_refused = AtomicU64::new(0);
    let (p6_bounded, p6_beyond) = (AtomicU64::new(0), AtomicU64::new(0));
    let failures = Mutex::new(Vec::new());
    let ledger = Mutex::new(crate::checks::ledger::LedgerStats::default());
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= range.end || (stop_at_first && seed > first_failure.load(Ordering::Relaxed)) {
                        return;
                    }
                    let o = run_seed(seed, opts);
                    ran.fetch_add(1, Ordering::Relaxed);
                    stale.fetch_add(u64::from(o.stale_releases > 0), Ordering::Relaxed);
                    forger_seeds.fetch_add(u64::from(o.forged.sent > 0), Ordering::Relaxed);
                    sent.fetch_add(o.forged.sent, Ordering::Relaxed);
                    refused.fetch_add(o.forged.refused, Ordering::Relaxed);
                    set1.fetch_add(u64::from(o.set1_faults() > 0), Ordering::Relaxed);
                    restored.fetch_add(u64::from(o.restores.restored > 0), Ordering::Relaxed);
                    refused_restores.fetch_add(u64::from(o.restores.refused > 0), Ordering::Relaxed);
                    map_refused.fetch_add(u64::from(o.restores.refused_by_map > 0), Ordering::Relaxed);
                    p6_bounded.fetch_add(o.report.p6.bounded as u64, Ordering::Relaxed);
                    p6_beyond.fetch_add(o.report.p6.beyond_reserve as u64, Ordering::Relaxed);
                    if let Some(l) = &o.ledger {
                        ledger.lock().unwrap_or_else(|e| e.into_inner()).add(l);
                    }
                    if !o.passed() {
                        first_failure.fetch_min(seed, Ordering::Relaxed);
                        failures.lock().unwrap_or_else(|e| e.into_inner()).push(o);
                    }
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap_or_else(|e| e.into_inner());
    failures.sort_by_key(|o| o.seed);
    if stop_at_first {
        failures.truncate(1);
    }
    RangeResult {
        seeds_run: ran.into_inner(),
        failures,
        elapsed: started.elapsed(),
        stale_release_seeds: stale.into_inner(),
        forger_seeds: forger_seeds.into_inner(),
        forged: tally::Forged {
            sent: sent.into_inner(),
            refused: refused.into_inner(),
        },
        set1_fault_seeds: set1.into_inner(),
        restored_seeds: restored.into_inner(),
        refused_restore_seeds: refused_restores.into_inner(),
        map_refused_restore_seeds: map_refused.into_inner(),
        p6_bounded: p6_bounded.into_inner(),
        p6_beyond: p6_beyond.into_inner(),
        ledger: ledger.into_inner().unwrap_or_else(|e| e.into_inner()),
    }
}

/// Drops the failing `seed`'s faults one at a time, keeping each drop after which the seed still
/// fails: the options of a shorter failing run (often one or two faults).
pub fn shrink(seed: u64, opts: &Options) -> Options {
    let n = faults::schedule(seed, LOAD_MS, ALLOCS, params(seed).lease_ms, opts.two_sets, opts.ids).len();
    let mut keep: BTreeSet<usize> = opts.only_faults.clone().unwrap_or_else(|| (0..n).collect());
    for i in keep.clone() {
        let mut fewer = keep.clone();
        fewer.remove(&i);
        let trial = Options {
            only_faults: Some(fewer.clone()),
            keep_history: false,
            ..opts.clone()
        };
        if !run_seed(seed, &trial).passed() {
            keep = fewer;
        }
    }
    Options {
        only_faults: Some(keep),
        ..opts.clone()
    }
}
