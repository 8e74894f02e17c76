//! The simulated world of one seed: the network, the StoreSvr group, the AllocSvr processes and
//! the transports that connect the production code to them.
//!
//! - AllocSvr → store: [`SimStore`] implements the AllocSvr's `Store` trait. Each call follows the
//!   leader like the real store client (try the believed leader, follow a not-leader hint, try the
//!   next replica after a silent attempt) until the call's own deadline.
//! - client → AllocSvr and operator → StoreSvr: `super::transport`.
//! - Every message crosses [`Net`]: seeded delay (reordering when delays overlap), drop,
//!   duplication (store requests), and directed cuts (a partition is two cuts, a one-way cut one).
//! - A killed process stops at once (its loops are aborted, whatever it still sends is never
//!   answered); a paused one holds every message it sends or receives until it resumes, while
//!   time goes on, as SIGSTOP does.
//! - Each AllocSvr slot has its host's lease clock ([`World::lease_clock`]), tokio's time until a
//!   clock fault scripts it (a suspension, a drift); the StoreSvrs read tokio's time.
//!
//! One lock guards everything; no task holds it across an `.await`, and every random draw comes
//! from the one seeded generator, in the order the single-threaded runtime runs the tasks.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use allocsvr::ids::clock::IdClock;
use allocsvr::store::{Call, Store, StoreFailure};
use allocsvr::{Core, NodeConfig, UnsafeRules};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use seqsvr_plumbing::lease_clock::Script;
use seqsvr_proto::pb;
use seqsvr_proto::pb::alloc_service_server::AllocServiceServer;
use storesvr::error::RpcError;
use storesvr::protocol::CallReply;
use tokio::time::Instant;

use super::addrs::REPLICAS;
use super::group::{Group, Rep, Req, Step};
use super::tally::{Forged, Tally};

/// One end of a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Ep {
    Clients,
    Alloc(usize),
    /// Replica `.1` of set `.0`.
    Store(u64, usize),
    /// The operator's tools (the move driver).
    Operator,
}

/// The network's condition.
#[derive(Debug, Default)]
pub struct Net {
    /// Directed links that deliver nothing.
    pub cut: BTreeSet<(Ep, Ep)>,
    /// Probability that a message is lost.
    pub drop: f64,
    /// Probability that a store request is delivered twice (the copy later).
    pub dup: f64,
    /// Extra delay on every message, up to this (messages overtake each other).
    pub jitter: Duration,
    /// Fixed extra delay on some directed links.
    pub lag: std::collections::BTreeMap<(Ep, Ep), Duration>,
}

/// A process: alive until killed, perhaps paused until some instant.
#[derive(Debug)]
pub struct Proc {
    alive: AtomicBool,
    paused_until: Mutex<Option<Instant>>,
}

impl Proc {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            alive: AtomicBool::new(true),
            paused_until: Mutex::new(None),
        })
    }

    /// The process of a slot nothing was started in yet.
    pub fn none() -> Arc<Self> {
        let p = Self::new();
        p.alive.store(false, Ordering::Release);
        p
    }

    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Holds the process until `until` at least: a pause never shortens a hold already running (a
    /// host suspended until later keeps the process stopped whatever a SIGCONT says; resuming it
    /// early would let it run while its lease clock still stood, a world that cannot happen).
    pub fn pause_until(&self, until: Instant) {
        let mut held = self.paused_until.lock().unwrap();
        *held = Some(held.map_or(until, |h| h.max(until)));
    }

    /// Ends every hold at once (the heal after the load: every fault has ended by then).
    pub fn resume(&self) {
        *self.paused_until.lock().unwrap() = None;
    }

    /// Returns once the process runs (never, for a dead one).
    pub async fn gate(&self) {
        loop {
            if !self.is_alive() {
                std::future::pending::<()>().await;
            }
            let until = *self.paused_until.lock().unwrap();
            match until {
                Some(t) if Instant::now() < t => tokio::time::sleep_until(t).await,
                _ => return,
            }
        }
    }
}

/// An AllocSvr slot: a stable node id and address, and the process running there, if any.
pub struct AllocSlot {
    /// The set it serves.
    pub set: u64,
    pub node_id: u64,
    pub addr: String,
    pub proc: Arc<Proc>,
    pub core: Option<Core>,
    pub server: Option<AllocServiceServer<allocsvr::service::Service>>,
    /// Until when the slot's host is suspended (`suspend-alloc`): a process started there meanwhile
    /// is held as the one before it was. Without that, a restart during a suspension ran a process
    /// beside a lease clock scripted to stand still and then jump by the whole suspension — lease
    /// time racing ahead of real time in a process that was never stopped, which no host can do —
    /// and its gain wait ended early (seed 69469 of `sim dst --ids`, P1 and P4).
    pub host_suspended_until: Option<Instant>,
}

/// Everything of one seed behind one lock.
pub struct State {
    pub rng: StdRng,
    pub net: Net,
    /// One StoreSvr group per set, by set id.
    pub groups: Vec<Group>,
    pub allocs: Vec<AllocSlot>,
    /// The forger running now, if any (a fault).
    pub forger: Option<tokio::task::AbortHandle>,
    /// What the forgers of this seed sent, and how much of it the store refused.
    pub forged: Forged,
    /// Negative control: a restore goes ahead whatever the check against the live map says.
    pub skip_restore_check: bool,
    /// What the seed's restore did.
    pub restores: Tally,
}

/// Negative controls of the clock faults (test only), which every lease clock's script reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClockControl {
    /// A suspended host's lease clock does not count the suspension: on resume it is behind by
    /// it, as `CLOCK_MONOTONIC` (the clock leases were read on before) is.
    pub monotonic: bool,
    /// Every drift fault runs at this rate instead of the drawn one (beyond the bound, say).
    pub drift_ppm: Option<i64>,
}

/// The world, shared by every task of the seed.
pub struct World {
    state: Mutex<State>,
    pub start: Instant,
    pub switches: UnsafeRules,
    /// Each AllocSvr slot's lease clock (its host's: a restarted process keeps it) and the
    /// clock faults' negative controls.
    clocks: Mutex<(Vec<Script>, ClockControl)>,
    /// Each AllocSvr slot's wall clock for time-ordered ids (its host's: a restarted process
    /// keeps it, and whatever step a fault left on it), all on the simulated time.
    id_clocks: Mutex<Vec<IdClock>>,
}

/// The true Unix time when a seed starts: fixed, so that every replay stamps the same ids.
pub const ID_ORIGIN_MS: u64 = 1_800_000_000_000;

/// The real store client's default attempt and overall limits, for the calls that give none
/// (Register, Load); a call that gives its own wait makes one attempt of that length, as the real
/// one does (`allocsvr::store`).
const STORE_ATTEMPT: Duration = Duration::from_secs(1);
const STORE_DEFAULT_WAIT: Duration = Duration::from_secs(5);
/// Time a leader takes to commit a write (replication plus fsync on a majority).
const COMMIT: (u64, u64) = (500, 3_000);

impl World {
    pub fn new(state: State, switches: UnsafeRules) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(state),
            start: Instant::now(),
            switches,
            clocks: Mutex::new((Vec::new(), ClockControl::default())),
            id_clocks: Mutex::new(Vec::new()),
        })
    }

    /// The wall clock AllocSvr slot `i` stamps ids with: [`ID_ORIGIN_MS`] at the world's start,
    /// running with the simulated time, plus whatever offset a clock fault set.
    pub fn id_clock(&self, i: usize) -> IdClock {
        let mut clocks = self.id_clocks.lock().unwrap_or_else(|e| e.into_inner());
        while clocks.len() <= i {
            clocks.push(IdClock::on_tokio_time_since(self.start, ID_ORIGIN_MS));
        }
        clocks[i].clone()
    }

    /// The lease clock of AllocSvr slot `i`: the simulated time until a clock fault scripts it.
    pub fn lease_clock(&self, i: usize) -> Script {
        let mut clocks = self.clocks.lock().unwrap_or_else(|e| e.into_inner());
        while clocks.0.len() <= i {
            clocks.0.push(Script::new());
        }
        clocks.0[i].clone()
    }

    pub fn clock_control(&self) -> ClockControl {
        self.clocks.lock().unwrap_or_else(|e| e.into_inner()).1
    }

    /// Turns the clock faults' negative controls on (before the first fault).
    pub fn set_clock_control(&self, control: ClockControl) {
        self.clocks.lock().unwrap_or_else(|e| e.into_inner()).1 = control;
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// A uniform draw in `[0, n)` from the seed's generator.
    pub fn draw(&self, n: u64) -> u64 {
        self.lock().rng.random_range(0..n.max(1))
    }

    /// How long a message from `from` to `to` takes, or `None` when it is lost.
    fn transit(&self, from: Ep, to: Ep) -> Option<Duration> {
        let mut st = self.lock();
        let p = st.net.drop;
        if st.net.cut.contains(&(from, to)) || (p > 0.0 && st.rng.random_bool(p)) {
            return None;
        }
        let base = st.rng.random_range(100..1_500);
        let jitter = st.net.jitter.as_micros() as u64;
        let extra = if jitter > 0 { st.rng.random_range(0..jitter) } else { 0 };
        let lag = st.net.lag.get(&(from, to)).copied().unwrap_or_default();
        Some(Duration::from_micros(base + extra) + lag)
    }

    /// Sends a message: sleeps its transit time, or forever when it is lost.
    pub async fn cross(&self, from: Ep, to: Ep) {
        match self.transit(from, to) {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    }

    /// One store request from AllocSvr `from` to replica `r` of its set: the reply, or never.
    async fn store_rpc(self: &Arc<Self>, from: usize, r: usize, req: Req) -> Rep {
        let set = self.lock().allocs[from].set;
        self.cross(Ep::Alloc(from), Ep::Store(set, r)).await;
        let dup = {
            let mut st = self.lock();
            let p = st.net.dup;
            p > 0.0 && st.rng.random_bool(p)
        };
        if dup {
            let (world, copy) = (self.clone(), req.clone());
            // Up to a few seconds later: long enough for a Release to land after its section was
            // granted again (what an unfenced Release gets wrong).
            let later = Duration::from_millis(self.draw(5_000));
            tokio::spawn(async move {
                tokio::time::sleep(later).await;
                world.deliver(set, r, &copy).await;
            });
        }
        let Some(rep) = self.deliver(set, r, &req).await else {
            return std::future::pending().await;
        };
        self.cross(Ep::Store(set, r), Ep::Alloc(from)).await;
        rep
    }

    /// What replica `r` of `set` answers to `req`, after the commit of a write; `None` when it
    /// never does.
    pub async fn deliver(&self, set: u64, r: usize, req: &Req) -> Option<Rep> {
        let (cmd, term) = {
            let mut st = self.lock();
            let g = &mut st.groups[set as usize];
            match g.receive(r, req, Instant::now().into_std()) {
                Step::Silent => return None,
                Step::Answer(rep) => return Some(rep),
                Step::Commit(cmd) => (cmd, g.term_of(r)),
            }
        };
        let result = self.commit(set, r, term, &cmd).await?;
        let mut st = self.lock();
        Some(st.groups[set as usize].reply(r, req, result, Instant::now().into_std()))
    }

    /// Commits `cmd` written by replica `r` of `set` as leader in `term`: its result, or `None`
    /// when the leadership ended first (the entry then survives or not, by a coin, and nobody is
    /// told).
    pub async fn commit(
        &self,
        set: u64,
        r: usize,
        term: u64,
        cmd: &storesvr::domain::state::Command,
    ) -> Option<storesvr::domain::state::CommandResult> {
        let generation = self.lock().groups[set as usize].generation;
        let d = Duration::from_micros(COMMIT.0 + self.draw(COMMIT.1 - COMMIT.0));
        tokio::time::sleep(d).await;
        let at = self.now_ns();
        let mut st = self.lock();
        let st = &mut *st;
        let g = &mut st.groups[set as usize];
        if g.generation != generation {
            // Written by a group that was lost and replaced by a restore: gone with it.
            return None;
        }
        if g.still_leads(r, term) {
            return Some(g.apply(cmd, at));
        }
        if st.rng.random_bool(0.5) {
            g.apply(cmd, at);
        }
        None
    }

    /// Starts the AllocSvr of slot `i` (a new process, a new registration) in the background,
    /// unless one runs there.
    pub fn start_alloc(self: &Arc<Self>, i: usize) {
        let proc = Proc::new();
        let (node_id, addr) = {
            let mut st = self.lock();
            let slot = &mut st.allocs[i];
            if slot.proc.is_alive() {
                return;
            }
            if let Some(until) = slot.host_suspended_until {
                proc.pause_until(until);
            }
            slot.proc = proc.clone();
            (slot.node_id, slot.addr.clone())
        };
        let world = self.clone();
        tokio::spawn(async move {
            let store = Arc::new(SimStore {
                world: world.clone(),
                slot: i,
                proc: proc.clone(),
                leader: AtomicUsize::new(0),
            });
            let mut cfg = NodeConfig::new(
                seqsvr_proto::NodeId(node_id),
                "127.0.0.1:0".parse().expect("literal address"),
                vec![],
            );
            cfg.unsafe_rules = world.switches;
            cfg.lease_clock = world.lease_clock(i).into();
            cfg.id_clock = world.id_clock(i);
            cfg.start_timeout = Duration::from_secs(3_600);
            cfg.max_live_keys = crate::keys::MAX_LIVE_KEYS;
            let Ok(core) = Core::start(&cfg, store, addr).await else {
                return;
            };
            let mut st = world.lock();
            if !proc.is_alive() {
                drop(st);
                core.crash();
                return;
            }
            st.allocs[i].server = Some(AllocServiceServer::new(core.service()));
            st.allocs[i].core = Some(core);
        });
    }

    /// Kills the AllocSvr of slot `i`, if one runs.
    pub fn kill_alloc(&self, i: usize) {
        let core = {
            let mut st = self.lock();
            let slot = &mut st.allocs[i];
            slot.proc.alive.store(false, Ordering::Release);
            slot.server = None;
            slot.core.take()
        };
        if let Some(core) = core {
            core.crash();
        }
    }

    /// Stops the AllocSvr of slot `i` gracefully (it releases everything, as on SIGTERM) and
    /// starts a new one in its place.
    pub fn restart_alloc(self: &Arc<Self>, i: usize) {
        let (core, proc) = {
            let mut st = self.lock();
            let slot = &mut st.allocs[i];
            slot.server = None;
            (slot.core.take(), slot.proc.clone())
        };
        let world = self.clone();
        tokio::spawn(async move {
            if let Some(core) = core {
                core.shutdown().await;
            }
            proc.alive.store(false, Ordering::Release);
            world.start_alloc(i);
        });
    }

    pub fn pause_alloc(&self, i: usize, until: Instant) {
        self.lock().allocs[i].proc.pause_until(until);
    }

    /// Suspends the host of slot `i` until `until`: its process is held, and so is any process
    /// started there before then.
    pub fn suspend_host(&self, i: usize, until: Instant) {
        let mut st = self.lock();
        let slot = &mut st.allocs[i];
        slot.host_suspended_until = Some(slot.host_suspended_until.map_or(until, |t| t.max(until)));
        slot.proc.pause_until(until);
    }
}

/// The AllocSvr's store client in the simulation.
pub struct SimStore {
    world: Arc<World>,
    slot: usize,
    proc: Arc<Proc>,
    /// The replica believed to lead.
    leader: AtomicUsize,
}

impl SimStore {
    async fn call(&self, req: Req, wait: Option<Duration>) -> Result<Rep, StoreFailure> {
        let deadline = Instant::now() + wait.unwrap_or(STORE_DEFAULT_WAIT);
        let mut last = String::from("no attempt");
        loop {
            self.proc.gate().await;
            let now = Instant::now();
            if now >= deadline {
                return Err(StoreFailure::Unknown(last));
            }
            let r = self.leader.load(Ordering::Relaxed) % REPLICAS;
            let attempt = if wait.is_some() {
                deadline - now
            } else {
                STORE_ATTEMPT.min(deadline - now)
            };
            let rep = tokio::time::timeout(attempt, self.world.store_rpc(self.slot, r, req.clone())).await;
            self.proc.gate().await;
            match rep {
                Ok(Rep::NotLeader(hint)) => {
                    self.leader.store(hint.unwrap_or(r + 1), Ordering::Relaxed);
                    last = format!("replica {r} is not the leader");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Ok(Rep::Error(RpcError::Unavailable(m))) => {
                    last = m;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Ok(Rep::Error(e)) => return Err(StoreFailure::Refused(e.to_string())),
                Ok(rep) => return Ok(rep),
                Err(_) => {
                    self.leader.store(r + 1, Ordering::Relaxed);
                    last = format!("replica {r} did not answer in {attempt:?}");
                }
            }
        }
    }
}

/// The reply of type `T` that `f` brings.
fn boxed<'a, T: CallReply + Send + 'a>(f: impl Future<Output = Result<Rep, StoreFailure>> + Send + 'a) -> Call<'a, T> {
    Box::pin(async move {
        let rep = f.await?;
        rep.take()
            .ok_or_else(|| StoreFailure::Refused("reply of another kind".into()))
    })
}

impl Store for SimStore {
    fn register(&self, req: pb::RegisterRequest) -> Call<'_, pb::RegisterReply> {
        boxed(self.call(Req::Register(req), None))
    }

    fn renew(&self, req: pb::RenewRequest, wait: Duration) -> Call<'_, pb::RenewReply> {
        boxed(self.call(Req::Renew(req), Some(wait)))
    }

    fn release(&self, req: pb::ReleaseRequest, wait: Option<Duration>) -> Call<'_, pb::ReleaseReply> {
        boxed(self.call(Req::Release(req), wait))
    }

    fn bump(&self, req: pb::BumpRequest, wait: Duration) -> Call<'_, pb::BumpReply> {
        boxed(self.call(Req::Bump(req), Some(wait)))
    }

    fn raise_marks(&self, req: pb::RaiseMarksRequest, wait: Duration) -> Call<'_, pb::RaiseMarksReply> {
        boxed(self.call(Req::RaiseMarks(req), Some(wait)))
    }

    fn load(&self, req: pb::LoadRequest) -> Call<'_, pb::LoadReply> {
        boxed(self.call(Req::Load(req), None))
    }
}

/// A world's generator for a seed.
pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}
