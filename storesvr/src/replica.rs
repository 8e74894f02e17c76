//! The state one replica's gRPC services and background tasks share ([`ReplicaState`]): the Raft
//! handle, the applied state, the writer, the arbiter's liveness view and plan, and the restart
//! bookkeeping of local reads.
//!
//! It sits below the services (`grpc`) and the tasks (`tasks`) and imports neither, so that no two
//! modules import each other; `node` builds it and hands it to both.
//!
//! Deliberately left out: starting or stopping anything (see `node`).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use seqsvr_plumbing::lease_clock::LeaseClock;
use seqsvr_proto::pb;

use crate::config::Config;
use crate::domain::state::{Command, CommandResult, SetState};
use crate::error::RpcError;
use crate::protocol::LeaderView;
use crate::raft::types::Raft;
use crate::raft::writer::WriteError;
use crate::raft::writer::Writer;
use crate::storage::durability::Durability;
use crate::storage::sm_store::{SharedState, SmData};
use openraft::error::{CheckIsLeaderError, RaftError};

/// How long one Raft write may take before the caller hears "unavailable".
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(3);
/// How often the arbiter looks at liveness and ownership.
pub const ARBITER_TICK: Duration = Duration::from_millis(100);
/// At most one warning about clocks (a capped raise, a leader's clock off the quorum's) per this.
pub const WARN_EVERY: Duration = Duration::from_secs(10);

/// A leader-only call either proceeds or tells the caller where the leader is.
pub(crate) enum Led<T> {
    Here(T),
    Elsewhere(pb::LeaderHint),
}

/// Everything the gRPC services and the background tasks share. Built once by `node`; the
/// fields are crate-visible only.
pub struct ReplicaState {
    pub(crate) node_id: u64,
    pub(crate) config: Config,
    /// This replica's set, group and node, as every Raft message carries them.
    pub(crate) identity: std::sync::Arc<crate::raft::identity::Identity>,
    /// The followers' wall clocks as this replica read them while leading (`raft::clocks`).
    pub(crate) clocks: std::sync::Arc<crate::raft::clocks::PeerClocks>,
    /// When a clock warning was last logged, and what was left unsaid since: at most one line
    /// per [`WARN_EVERY`], as a holder asks again every few hundred ms (issue 47).
    pub(crate) clock_warned: Mutex<Option<(Instant, u64)>>,
    pub(crate) raft: Raft,
    pub(crate) state: SharedState,
    pub(crate) writer: Writer,
    /// What only the leader knows: liveness, the arbiter's latest plan (its `handover` part is
    /// read by renewals), when the versions renewals see last changed.
    pub(crate) view: Mutex<LeaderView>,
    /// Route table cached by route version.
    pub(crate) routes: Mutex<Option<pb::RouteTable>>,
    /// Makes the committed index durable before a local read exposes state applied up to it.
    pub(crate) durability: Durability,
    /// The committed index found on disk at start, plus one: local reads wait until the state
    /// machine has replayed that far.
    pub(crate) replay_to: u64,
    /// Set once the state machine has replayed to `replay_to`.
    pub(crate) restored: AtomicBool,
    /// When this leader first saw each frozen range (the start of its lease wait).
    pub(crate) frozen_seen: Mutex<FrozenSeen>,
    /// Wakes the arbiter before its next tick: a Release committed, so the released sections can
    /// be granted now rather than up to [`ARBITER_TICK`] later (they serve nobody meanwhile).
    pub(crate) arbiter_wake: tokio::sync::Notify,
    /// Set when this leader stops taking writes to hand its leadership over (`raft::handoff`):
    /// [`REFUSING_WRITES`] until a successor is picked, then the successor's id.
    pub(crate) handing_over: AtomicU64,
}

/// [`ReplicaState::handing_over`] when no successor is picked yet.
pub(crate) const REFUSING_WRITES: u64 = u64::MAX;

/// When the current leader first saw each range frozen by a move. Leader-local and forgotten on a
/// new term: a new leader cannot know when the freeze committed, so it starts the wait again.
pub use crate::protocol::moves::FrozenSeen;

impl ReplicaState {
    pub(crate) fn data<T>(&self, f: impl FnOnce(&SmData) -> T) -> T {
        f(&self.state.read().expect("state lock poisoned"))
    }

    pub(crate) fn view(&self) -> std::sync::MutexGuard<'_, LeaderView> {
        self.view.lock().expect("leader view lock poisoned")
    }

    /// The route table of `set` (this replica's state, which the caller holds), rebuilt only when
    /// its version changed.
    pub(crate) fn route_table(&self, set: &SetState) -> Result<pb::RouteTable, RpcError> {
        let mut cache = self.routes.lock().expect("routes lock poisoned");
        if let Some(t) = cache.as_ref().filter(|t| t.version == set.route_version) {
            return Ok(t.clone());
        }
        let t = crate::protocol::routes::table(set)?;
        *cache = Some(t.clone());
        Ok(t)
    }

    pub(crate) async fn write(&self, cmd: Command) -> Result<Led<CommandResult>, RpcError> {
        // A leader handing over takes no new write: its log must stop growing for a follower to
        // catch up with it, and the caller's retry reaches the successor.
        match self.handing_over.load(Ordering::Acquire) {
            0 => {}
            REFUSING_WRITES => return Ok(Led::Elsewhere(pb::LeaderHint::default())),
            to => return Ok(Led::Elsewhere(self.leader_hint(Some(to)))),
        }
        match self.writer.write(cmd, WRITE_TIMEOUT).await {
            Ok(r) => Ok(Led::Here(r)),
            Err(WriteError::NotLeader(id)) => Ok(Led::Elsewhere(self.leader_hint(id))),
            Err(WriteError::Unavailable(m)) => Err(RpcError::MaybeCommitted(m)),
            Err(WriteError::TooLarge(m)) => Err(RpcError::InvalidArgument(m)),
        }
    }

    pub(crate) async fn linearizable(&self) -> Result<Led<()>, RpcError> {
        match tokio::time::timeout(WRITE_TIMEOUT, self.raft.ensure_linearizable()).await {
            Err(_) => Err(RpcError::Unavailable(
                "no quorum answered the read index in time".into(),
            )),
            Ok(Ok(_)) => Ok(Led::Here(())),
            Ok(Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f)))) => {
                Ok(Led::Elsewhere(self.leader_hint(f.leader_id)))
            }
            Ok(Err(RaftError::APIError(e))) => Err(RpcError::Unavailable(e.to_string())),
            Ok(Err(RaftError::Fatal(e))) => Err(RpcError::Fatal(e.to_string())),
        }
    }

    /// Stops taking writes, telling callers to go to `successor` when one is picked.
    pub(crate) fn refuse_writes(&self, successor: Option<u64>) {
        self.handing_over
            .store(successor.unwrap_or(REFUSING_WRITES), Ordering::Release);
    }

    /// Where a caller should send leader-only requests.
    pub fn leader_hint(&self, leader_id: Option<u64>) -> pb::LeaderHint {
        let m = self.raft.metrics().borrow().clone();
        let id = leader_id.or(m.current_leader).unwrap_or(0);
        let addr = m
            .membership_config
            .membership()
            .get_node(&id)
            .map(|n| n.addr.clone())
            .unwrap_or_default();
        pb::LeaderHint {
            leader_id: id,
            leader_addr: addr,
        }
    }

    /// Whether local reads may be served. Before a local read exposes applied state its commit
    /// index is made durable (`Durability::make_durable`), so after a restart the replica must
    /// first replay to the committed index it found on disk: until then a local read could show
    /// an older state than it showed before the crash (P3 on every replica).
    /// Whether this replica leads now, by openraft's last metrics (no round trip: for answers
    /// that are safe from any committed state and only want the leader's clock).
    pub(crate) fn leads(&self) -> bool {
        let watch = self.raft.metrics();
        let m = watch.borrow();
        m.state == openraft::ServerState::Leader && m.current_leader == Some(self.node_id)
    }

    /// The voters other than this replica.
    fn other_voters(&self) -> Vec<u64> {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.membership_config
            .membership()
            .voter_ids()
            .filter(|&id| id != self.node_id)
            .collect()
    }

    /// The quorum's clock minus this replica's, from the followers' last replies (`None`: too
    /// few fresh readings, as on a follower).
    pub(crate) fn quorum_offset(&self) -> Option<i64> {
        self.clocks.quorum_offset(&self.other_voters(), Instant::now())
    }

    /// The clock a raise is stamped with: this leader's own, moved to the quorum's when the
    /// followers' readings show a majority elsewhere (`raft::clocks`), so that one replica's wrong
    /// clock does not stop or skew the set's ids. Says so, at most every [`WARN_EVERY`], when
    /// this clock is off the quorum's by more than half the allowance.
    pub(crate) fn id_clock_ms(&self, max_ahead_ms: u64) -> u64 {
        let own = crate::config::unix_now_ms();
        let Some(offset) = self.quorum_offset() else {
            return own;
        };
        if let Some(why) = crate::raft::clocks::disagreement(offset, max_ahead_ms / 2) {
            self.warn_clock(&why);
        }
        own.saturating_add_signed(offset)
    }

    /// Logs `why` unless a clock warning was logged less than [`WARN_EVERY`] ago (then counts it).
    pub(crate) fn warn_clock(&self, why: &str) {
        let mut warned = self.clock_warned.lock().unwrap_or_else(|e| e.into_inner());
        match warned.as_mut() {
            Some((at, unsaid)) if at.elapsed() < WARN_EVERY => *unsaid += 1,
            _ => {
                let unsaid = warned.map_or(0, |(_, n)| n);
                tracing::warn!(similar_since_last = unsaid, "{why}");
                *warned = Some((Instant::now(), 0));
            }
        }
    }

    /// A raise was capped at this leader's limit: the AllocSvr's clock is ahead of the clock the
    /// raise was stamped with (the quorum's, or this leader's when it cannot tell).
    pub(crate) fn raise_capped_warning(&self, incarnation: u64) {
        let side = match self.quorum_offset() {
            Some(_) => "the AllocSvr's clock runs ahead of the StoreSvr quorum's",
            None => {
                "the AllocSvr's clock runs ahead of this leader's (too few followers answered for a comparison                  with the quorum's: either side may be the wrong one)"
            }
        };
        self.warn_clock(&format!(
            "capped slot marks of incarnation {incarnation} at the leader's clock plus the allowance: {side};              it issues ids only up to the cap"
        ));
    }

    pub fn is_restored(&self) -> bool {
        if self.restored.load(Ordering::Acquire) {
            return true;
        }
        let applied = self
            .state
            .read()
            .expect("state lock poisoned")
            .last_applied
            .map_or(0, |l| l.index + 1);
        let caught_up = applied >= self.replay_to;
        if caught_up {
            self.restored.store(true, Ordering::Release);
        }
        caught_up
    }

    pub fn detect(&self) -> Duration {
        Duration::from_millis(self.config.detect_ms)
    }

    /// Now, for everything measured against a lease: liveness (when a renewal was heard), the
    /// arbiter's detection, a move's lease wait. It counts the time this host was suspended
    /// (`seqsvr_plumbing::lease_clock`), which `Instant::now()` does not: a leader that resumes
    /// must see that its AllocSvrs went unheard for the suspension, and a move's wait that spanned
    /// it has passed. Either error of the monotonic clock was on the safe side here (it waits
    /// longer); this keeps both ends of a lease on one definition of time.
    pub fn lease_now() -> Instant {
        LeaseClock::host().now_std()
    }
}
