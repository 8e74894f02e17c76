//! The composition root's state: everything the data-plane service and the background tasks
//! share, behind methods, built once by `node` and handed to both as `Arc<AllocState>`.
//!
//! It depends on the pure parts (`grants`, `section`, `lease`) and the map (`owned`), never on the
//! service, the tasks or the node, so that none of them import each other in a circle.
//!
//! The bump queue is bounded ([`BUMP_QUEUE_MESSAGES`]): a fetch that would have to wait for room
//! gives its prefetch up instead (the section's next fetch asks again), so a slow store never
//! makes a fetch block on the queue or the queue grow without bound.
//!
//! Deliberately left out: deciding when to renew, load or bump (see `tasks`) and serving (see
//! `service`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use seqsvr_plumbing::lease_clock::LeaseClock;
use seqsvr_proto::keys::KeyPlacement;
use seqsvr_proto::params::SetParams;
use seqsvr_proto::pb;
use seqsvr_proto::{Incarnation, NodeId, SectionId};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::config::{NodeConfig, UnsafeRules};
use crate::grants::{GrantDiff, ranges};
use crate::ids::slots::IdSlots;
use crate::lease::LeaseTimings;
use crate::metrics::Metrics;
use crate::owned::{Owned, Slot};
use crate::section::{KeyBudget, Section, SectionSpec};
use crate::store::Store;

/// Most messages waiting for the bumper. A message is one prefetch (one section) or one loaded
/// chunk of a gain; a section has at most one bump in flight, so this is reached only when the
/// store is much slower than the fetches that cross half a step.
/// [`AllocState::key_placement`] before a map with an id setup arrived.
const PLACEMENT_UNKNOWN: u8 = 0;

pub const BUMP_QUEUE_MESSAGES: usize = 4_096;

/// Sections waiting for a Bump.
pub type BumpQueue = mpsc::Receiver<Vec<Arc<Slot>>>;

/// State shared by the service and the background tasks.
pub struct AllocState {
    node_id: NodeId,
    params: SetParams,
    timings: LeaseTimings,
    /// Every lease deadline's clock (see [`AllocState::lease_now`]).
    clock: LeaseClock,
    unsafe_rules: UnsafeRules,
    /// Test only: every Release is sent once more, 1–2× this later.
    repeat_releases_after: Option<Duration>,
    /// Address registered in the route table.
    advertise: String,
    store: Arc<dyn Store>,
    owned: Owned,
    incarnation: AtomicU64,
    routes: RwLock<Option<Arc<pb::RouteTable>>>,
    route_version: AtomicU64,
    /// The newest cluster map heard from the store (renewals), and its version: a data-plane
    /// reply compares the caller's version with the atomic and reads the lock only when behind.
    map: RwLock<Option<Arc<pb::ClusterMap>>>,
    map_version: AtomicU64,
    /// How counter keys are placed, from the held map's id setup: [`PLACEMENT_UNKNOWN`] until a
    /// map with one arrives, then `1 +` the wire value. An atomic: every key call reads it.
    key_placement: AtomicU8,
    bump_tx: mpsc::Sender<Vec<Arc<Slot>>>,
    /// Memory of dropped sections, only under `--unsafe-keep-memory`.
    kept: Mutex<HashMap<SectionId, Vec<u64>>>,
    metrics: Metrics,
    stopping: AtomicBool,
    /// Slots held for time-ordered ids.
    ids: IdSlots,
    /// Counter keys held, over every owned section, and the most allowed.
    keys: KeyBudget,
}

impl AllocState {
    /// The state of a node registered as `incarnation` with the set's validated `params`, and the
    /// receiving end of its bump queue.
    pub fn new(
        cfg: &NodeConfig,
        params: SetParams,
        advertise: String,
        store: Arc<dyn Store>,
        incarnation: Incarnation,
    ) -> (Arc<AllocState>, BumpQueue) {
        let (bump_tx, bump_rx) = mpsc::channel(BUMP_QUEUE_MESSAGES);
        let shared = AllocState {
            node_id: cfg.node_id,
            // Slots for the whole uid space: a range moved into the set is granted like any other.
            owned: Owned::new(0, params.total_sections() as usize, cfg.lease_clock.now()),
            clock: cfg.lease_clock.clone(),
            timings: LeaseTimings::of(&params),
            params,
            unsafe_rules: cfg.unsafe_rules,
            repeat_releases_after: cfg.repeat_releases_after,
            advertise,
            store,
            incarnation: AtomicU64::new(incarnation.0),
            routes: RwLock::new(None),
            route_version: AtomicU64::new(0),
            map: RwLock::new(None),
            map_version: AtomicU64::new(0),
            key_placement: AtomicU8::new(PLACEMENT_UNKNOWN),
            bump_tx,
            kept: Mutex::new(HashMap::new()),
            metrics: Metrics::new(),
            stopping: AtomicBool::new(false),
            ids: IdSlots::new(cfg.id_clock.clone(), cfg.unsafe_rules.ids),
            keys: KeyBudget::with_max_bytes(cfg.max_live_keys, cfg.max_live_key_bytes),
        };
        (Arc::new(shared), bump_rx)
    }

    pub fn node_id(&self) -> NodeId {
        self.node_id
    }

    pub fn params(&self) -> &SetParams {
        &self.params
    }

    pub fn timings(&self) -> &LeaseTimings {
        &self.timings
    }

    /// Now, for lease arithmetic: the lease end, the gain wait, a renewal's send time. It counts
    /// the time the host was suspended, which tokio's `Instant::now()` does not; plain timeouts
    /// (RPC waits, backoffs, the renewal schedule) stay on tokio's clock.
    pub fn lease_now(&self) -> Instant {
        self.clock.now()
    }

    pub fn unsafe_rules(&self) -> UnsafeRules {
        self.unsafe_rules
    }

    pub fn repeat_releases_after(&self) -> Option<Duration> {
        self.repeat_releases_after
    }

    pub fn advertise(&self) -> &str {
        &self.advertise
    }

    pub fn store(&self) -> &dyn Store {
        &*self.store
    }

    pub fn ids(&self) -> &IdSlots {
        &self.ids
    }

    pub fn owned(&self) -> &Owned {
        &self.owned
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn incarnation(&self) -> Incarnation {
        Incarnation(self.incarnation.load(Ordering::Acquire))
    }

    /// A new registration: later renewals, bumps and releases go out under it.
    pub fn set_incarnation(&self, incarnation: Incarnation) {
        self.incarnation.store(incarnation.0, Ordering::Release);
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// From now on no task renews, gains or bumps.
    pub fn begin_stopping(&self) {
        self.stopping.store(true, Ordering::Release);
    }

    pub fn route_version(&self) -> u64 {
        self.route_version.load(Ordering::Acquire)
    }

    /// The node's route version and, when the caller's is older (or `always`), the table.
    pub fn routes_for(&self, caller_version: u64, always: bool) -> (u64, Option<pb::RouteTable>) {
        let version = self.route_version();
        if caller_version < version || always {
            let table = self.routes.read().unwrap().as_ref().map(|t| (**t).clone());
            (version, table)
        } else {
            (version, None)
        }
    }

    /// Keeps a route table from a renewal unless an older one.
    pub fn store_routes(&self, version: u64, routes: Option<pb::RouteTable>) {
        let Some(table) = routes else { return };
        let old = self.route_version();
        if table.version >= old {
            if table.version != old {
                info!(from = old, to = table.version, "route version changed");
            }
            *self.routes.write().unwrap() = Some(Arc::new(table));
            self.route_version.store(version.max(old), Ordering::Release);
        }
    }

    pub fn map_version(&self) -> u64 {
        self.map_version.load(Ordering::Acquire)
    }

    /// The node's map version and, when the caller sent an older one, the map. A caller that sent
    /// none (`None`) does not track the map and gets none.
    pub fn map_for(&self, caller_version: Option<u64>) -> (u64, Option<pb::ClusterMap>) {
        let version = self.map_version();
        match caller_version {
            Some(v) if v < version => {
                let map = self.map.read().unwrap().as_ref().map(|m| (**m).clone());
                (version, map)
            }
            _ => (version, None),
        }
    }

    /// Keeps a map from a renewal when it is newer than the one held, or as new and the first to
    /// carry the id setup (a map published before set 0 set its ids up keeps its version after).
    pub fn store_map(&self, map: Option<pb::ClusterMap>) {
        let Some(map) = map else { return };
        let mut held = self.map.write().unwrap();
        let old = self.map_version();
        let completes = map.version == old && map.ids.is_some() && held.as_ref().is_some_and(|h| h.ids.is_none());
        if map.version > old || completes {
            info!(from = old, to = map.version, "cluster map version changed");
            let version = map.version;
            if let Some(placement) = KeyPlacement::of_map(&map) {
                self.key_placement.store(1 + placement as u8, Ordering::Release);
            }
            *held = Some(Arc::new(map));
            // Published after the map: a caller that reads the new version finds the map too.
            self.map_version.store(version, Ordering::Release);
        }
    }

    /// The newest cluster map heard, if any (the ledger front routes keys by it).
    pub fn map(&self) -> Option<Arc<pb::ClusterMap>> {
        self.map.read().unwrap().clone()
    }

    /// The map version a renewal sends: one below the held map's while that map has no id setup,
    /// so that the store sends the map again until it has one (its version does not change when
    /// set 0 sets its ids up).
    pub fn map_version_to_ask(&self) -> u64 {
        let version = self.map_version();
        let complete = self.map.read().unwrap().as_ref().is_none_or(|m| m.ids.is_some());
        if complete { version } else { version.saturating_sub(1) }
    }

    /// How the cluster places counter keys, `None` until the held map says.
    pub fn key_placement(&self) -> Option<KeyPlacement> {
        match self.key_placement.load(Ordering::Acquire) {
            PLACEMENT_UNKNOWN => None,
            1 => Some(KeyPlacement::Sha256),
            _ => Some(KeyPlacement::Slots),
        }
    }

    /// Queues a prefetch from the fetch path without waiting: when the queue is full the bump is
    /// given up (the section's next fetch past half a step asks again).
    pub fn queue_prefetch(&self, slot: Arc<Slot>) {
        if let Err(e) = self.bump_tx.try_send(vec![slot]) {
            let slot = e.into_inner().pop().expect("one slot was queued");
            slot.section.lock().unwrap().bump_abandoned();
            slot.bumped.notify_waiters();
            self.metrics.bump_queue_full.increment(1);
        }
    }

    /// Queues loaded sections for their first Bump, waiting for room.
    pub async fn queue_bumps(&self, slots: Vec<Arc<Slot>>) {
        if let Err(e) = self.bump_tx.send(slots).await {
            for slot in e.0 {
                self.abandon_bump(&slot, false);
            }
        }
    }

    /// A bump of `slot` will not be acknowledged: wake its waiters; with `drop_it`, stop serving it.
    pub fn abandon_bump(&self, slot: &Arc<Slot>, drop_it: bool) {
        slot.section.lock().unwrap().bump_abandoned();
        if drop_it && self.owned.remove_if_held(slot) {
            self.let_go(std::slice::from_ref(slot));
        }
        slot.bumped.notify_waiters();
    }

    /// Lets dropped slots go: under `--unsafe-keep-memory` their memory is kept for a regain.
    pub fn let_go(&self, dropped: &[Arc<Slot>]) {
        if self.unsafe_rules.keep_memory {
            let mut kept = self.kept.lock().unwrap();
            for slot in dropped {
                let memory = slot.section.lock().unwrap().take_memory();
                if !memory.is_empty() {
                    kept.insert(slot.id, memory);
                }
            }
        }
        wake(dropped);
        self.metrics.sections_held.set(self.owned.held_count() as f64);
        self.metrics
            .keys_live
            .set(self.keys.live.load(std::sync::atomic::Ordering::Relaxed) as f64);
        self.metrics
            .key_bytes_live
            .set(self.keys.bytes.load(std::sync::atomic::Ordering::Relaxed) as f64);
    }

    /// Memory kept from an earlier epoch (only under `--unsafe-keep-memory`).
    pub fn take_kept(&self, section: SectionId) -> Option<Vec<u64>> {
        if !self.unsafe_rules.keep_memory {
            return None;
        }
        self.kept.lock().unwrap().remove(&section)
    }

    /// Stops serving everything at once (sections and id slots) and says why; returns the
    /// sections dropped.
    pub fn drop_everything(&self, why: &str) -> Vec<Arc<Slot>> {
        self.ids.drop_all(why);
        let dropped = self.owned.drop_all();
        if !dropped.is_empty() {
            warn!(sections = dropped.len(), why, "stopped serving every section");
        }
        self.let_go(&dropped);
        dropped
    }

    /// Applies a renewal's diff (see `grants`): drops what is no longer granted and inserts newly
    /// gained sections as not-ready, observed at `t_obs`. Returns the gained slots.
    pub fn apply_grants(&self, diff: &GrantDiff, t_obs: Instant) -> Vec<Arc<Slot>> {
        if !diff.outside.is_empty() {
            warn!(grants = ?diff.outside, sections = ?self.params.all_sections(), "grants outside the uid space ignored in part");
        }
        let incarnation = self.incarnation();
        let mut changes: Vec<(SectionId, Option<Arc<Slot>>)> = diff.drop.iter().map(|id| (*id, None)).collect();
        let mut gained = Vec::with_capacity(diff.gain.len());
        for g in &diff.gain {
            let serve_after = if self.unsafe_rules.skip_lease_wait {
                t_obs
            } else {
                self.timings.serve_after(t_obs, g.no_wait, g.wait)
            };
            let spec = SectionSpec {
                section_size: self.params.section_size,
                step: self.params.step,
                unsafe_serve_before_ack: self.unsafe_rules.serve_before_bump_ack,
                unsafe_block_overlap: self.unsafe_rules.block_overlap,
                unsafe_keys_share_seq: self.unsafe_rules.keys_share_seq,
                unsafe_keys_forget_to_base: self.unsafe_rules.keys_forget_to_base,
            };
            let slot = Arc::new(Slot::new(
                Section::new(g.id, g.epoch, spec, serve_after).with_key_budget(self.keys.clone()),
                incarnation,
                t_obs,
            ));
            gained.push(slot.clone());
            changes.push((g.id, Some(slot)));
        }
        if !changes.is_empty() {
            let dropped = self.owned.replace(changes);
            if !dropped.is_empty() {
                info!(sections = ?ranges(dropped.iter().map(|s| s.id)), "let go of sections");
            }
            if !gained.is_empty() {
                info!(sections = ?ranges(gained.iter().map(|s| s.id)), "gained sections (loading)");
            }
            self.let_go(&dropped);
        }
        gained
    }
}

/// Wakes every fetch waiting on a bump of these slots (they will find the slot gone).
pub fn wake(slots: &[Arc<Slot>]) {
    for s in slots {
        s.bumped.notify_waiters();
    }
}
