//! The replica's health as Prometheus gauges, sampled every [`SAMPLE_EVERY`]: what an operator
//! must see of the Raft group (leader, term, leader changes, how far followers and the state
//! machine trail the log, how long since a quorum answered the leader) and of the set's state
//! (sections per range state and without an owner, the highest ceiling, registered AllocSvrs,
//! ledger counters with their held and voided numbers, and on set 0 the moves per phase).
//!
//! Sampling rather than following openraft's metrics watch: the watch fires on every applied
//! entry, thousands of times a second under load, and a gauge only needs to be current when it
//! is scraped. The leader-change counter compares consecutive samples, so two changes within one
//! interval count once; `storesvr_raft_term` still shows every election.
//!
//! The values are computed by pure functions ([`raft_sample`], [`state_sample`]) from openraft's
//! `RaftMetrics` and the replicated `SetState`; the loop only publishes them. Every replica
//! reports the replicated values it has applied, so a dashboard takes the leader's (`max by
//! (set)` over caught-up replicas gives the same).
//!
//! On the leader also the replicas' wall clocks (`storesvr_clock_offset_ms{peer}`,
//! `storesvr_clock_skew_ms`: its own clock minus the quorum's; issue 47).
//!
//! Left out: per-follower lag series (the maximum is what an alert needs; `seqctl status` names
//! the replica), and anything that would scan a section's uids (the ceilings are per section).

use std::sync::{Arc, Weak};
use std::time::Duration;

use metrics::{counter, gauge};
use openraft::{RaftMetrics, ServerState};

use std::collections::BTreeSet;

use prost::Message as _;
use seqsvr_proto::pb;

use crate::domain::ledger::VoidReason;
use crate::domain::ranges::{OpId, RangeState};
use crate::domain::state::{NOBODY, SetState};
use crate::raft::types::{Node, NodeId};
use crate::replica::ReplicaState;

/// How often the gauges are refreshed.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(500);

/// The range states, as the `state` label of `storesvr_sections`.
const RANGE_STATES: [&str; 4] = ["owned", "importing", "migrating", "tombstoned"];

/// The move phases, as the `phase` label of `storesvr_moves` (cluster_map::Phase::name).
const PHASES: [&str; 9] = [
    "recorded",
    "importing",
    "frozen",
    "sealed",
    "installed",
    "switched",
    "done",
    "cancelled",
    "cancelling",
];

/// What one look at the Raft node shows.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct RaftSample {
    pub term: u64,
    pub is_leader: bool,
    /// The leader this replica knows of, if any.
    pub leader: Option<NodeId>,
    pub last_log_index: u64,
    pub applied_index: u64,
    /// On the leader, the largest gap between its log and a follower's matched index; 0 elsewhere.
    pub replication_lag_max: u64,
    /// On the leader, seconds since a quorum last acknowledged it; 0 elsewhere.
    pub quorum_ack_age_seconds: f64,
    pub voters: u64,
    /// False once openraft stopped on a fatal error.
    pub running: bool,
}

/// Reads a [`RaftSample`] off openraft's metrics.
pub fn raft_sample(m: &RaftMetrics<NodeId, Node>) -> RaftSample {
    let last_log_index = m.last_log_index.unwrap_or(0);
    let is_leader = m.state == ServerState::Leader && m.current_leader == Some(m.id);
    let replication_lag_max = match (&m.replication, is_leader) {
        (Some(peers), true) => peers
            .iter()
            .filter(|(id, _)| **id != m.id)
            .map(|(_, matched)| last_log_index.saturating_sub(matched.map_or(0, |l| l.index)))
            .max()
            .unwrap_or(0),
        _ => 0,
    };
    let quorum_ack_age_seconds = match (is_leader, m.millis_since_quorum_ack) {
        (true, Some(ms)) => ms as f64 / 1_000.0,
        _ => 0.0,
    };
    RaftSample {
        term: m.current_term,
        is_leader,
        leader: m.current_leader,
        last_log_index,
        applied_index: m.last_applied.map_or(0, |l| l.index),
        replication_lag_max,
        quorum_ack_age_seconds,
        voters: m.membership_config.membership().voter_ids().count() as u64,
        running: m.running_state.is_ok(),
    }
}

/// Counts changes of the known leader between samples.
#[derive(Debug, Default)]
pub struct LeaderChanges {
    last: Option<(u64, NodeId)>,
}

impl LeaderChanges {
    /// True when `sample` names a leader other than the last one known (a new term counts even
    /// with the same node). The first leader a process sees is not a change: a restarted replica
    /// would otherwise report one per restart.
    pub fn observe(&mut self, sample: &RaftSample) -> bool {
        let Some(leader) = sample.leader else {
            return false;
        };
        let now = (sample.term, leader);
        let changed = self.last.is_some_and(|last| last != now);
        self.last = Some(now);
        changed
    }
}

/// What one look at the replicated state shows.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct StateSample {
    /// Sections per range state, in [`RANGE_STATES`] order.
    pub sections: [u64; 4],
    /// Owned sections that no AllocSvr holds: nobody serves them until the arbiter assigns them.
    pub unowned: u64,
    /// The highest `max_seq` of any section: how much of the 64-bit space is used.
    pub max_seq_highest: u64,
    pub allocsvrs_live: u64,
    pub allocsvrs_draining: u64,
    pub route_version: u64,
    /// The newest cluster map this set holds (its own on set 0, else the published copy).
    pub map_version: u64,
    /// Moves per phase, in [`PHASES`] order; only on set 0, the map's home.
    pub moves: Option<[u64; 9]>,
    /// Sections held importing or migrating here for a move that the newest map this set knows
    /// calls done or cancelled: nobody serves them, and no running move will give them back
    /// (a cancel whose range step never arrived; `seqctl move cancel OP` finishes it).
    pub stranded: u64,
    /// Ledger counters kept here, numbers held now, and numbers voided so far by reason (in
    /// `VoidReason::ALL` order), over the ledgers this set serves.
    pub ledgers: u64,
    pub ledger_held: u64,
    pub ledger_voided: [u64; 4],
    /// Ledgers restored from a backup whose reserves wait for a reconcile.
    pub ledgers_restored: u64,
}

/// Reads a [`StateSample`] off the set's state.
pub fn state_sample(set: &SetState) -> StateSample {
    let mut s = StateSample::default();
    let mut in_flight = Vec::new();
    for run in set.ranges.runs() {
        let n = run.end.0.saturating_sub(run.begin.0);
        let i = match run.state {
            RangeState::Owned => 0,
            RangeState::Importing { .. } => 1,
            RangeState::Migrating { .. } => 2,
            RangeState::Tombstoned { .. } => 3,
        };
        s.sections[i] += n;
        if let RangeState::Importing { op } | RangeState::Migrating { op, .. } = run.state {
            in_flight.push((op, n));
        }
        if run.state == RangeState::Owned {
            s.unowned += set
                .sections_in(run.begin, run.end)
                .filter(|(_, st)| st.owner == NOBODY)
                .count() as u64;
        }
    }
    s.max_seq_highest = set.sections.iter().map(|st| st.max_seq).max().unwrap_or(0);
    for l in set.ledgers.by_key.values() {
        s.ledgers += 1;
        s.ledger_held += l.held.len() as u64;
        s.ledgers_restored += u64::from(l.restored);
        for (sum, n) in s.ledger_voided.iter_mut().zip(l.voided_by) {
            *sum += n;
        }
    }
    s.allocsvrs_draining = set.allocsvrs.values().filter(|a| a.draining).count() as u64;
    s.allocsvrs_live = set.allocsvrs.len() as u64 - s.allocsvrs_draining;
    s.route_version = set.route_version;
    let own = set.map.as_ref().map_or(0, |m| m.version);
    s.map_version = own.max(set.cached_map.as_ref().map_or(0, |c| c.version));
    if !in_flight.is_empty() {
        let ended = ended_moves(set);
        s.stranded = in_flight
            .iter()
            .filter(|(op, _)| ended.contains(op))
            .map(|(_, n)| n)
            .sum();
    }
    s.moves = set.map.as_ref().map(|map| {
        let mut by_phase = [0u64; 9];
        for op in map.ops.values() {
            if let Some(i) = PHASES.iter().position(|p| *p == op.phase.name()) {
                by_phase[i] += 1;
            }
        }
        by_phase
    });
    s
}

/// The moves that the newest map this set holds calls done or cancelled: its own on set 0, the
/// published copy elsewhere (decoded only when a range is in flight here, which is rare).
fn ended_moves(set: &SetState) -> BTreeSet<OpId> {
    if let Some(map) = &set.map {
        return map.ops.values().filter(|m| !m.phase.running()).map(|m| m.op).collect();
    }
    let Some(copy) = set.cached_map.as_ref() else {
        return BTreeSet::new();
    };
    let Ok(map) = pb::ClusterMap::decode(copy.encoded.as_slice()) else {
        return BTreeSet::new();
    };
    let ended = |m: &&pb::MoveInfo| {
        matches!(
            pb::MovePhase::try_from(m.phase),
            Ok(pb::MovePhase::Done | pb::MovePhase::Cancelled)
        )
    };
    map.moves.iter().filter(ended).map(|m| m.op).collect()
}

fn flag(b: bool) -> f64 {
    if b { 1.0 } else { 0.0 }
}

fn publish_raft(r: &RaftSample) {
    gauge!("storesvr_raft_term").set(r.term as f64);
    gauge!("storesvr_raft_is_leader").set(flag(r.is_leader));
    gauge!("storesvr_raft_has_leader").set(flag(r.leader.is_some()));
    gauge!("storesvr_raft_last_log_index").set(r.last_log_index as f64);
    gauge!("storesvr_raft_applied_index").set(r.applied_index as f64);
    gauge!("storesvr_raft_apply_lag_entries").set(r.last_log_index.saturating_sub(r.applied_index) as f64);
    gauge!("storesvr_raft_replication_lag_max_entries").set(r.replication_lag_max as f64);
    gauge!("storesvr_raft_quorum_ack_age_seconds").set(r.quorum_ack_age_seconds);
    gauge!("storesvr_raft_voters").set(r.voters as f64);
    gauge!("storesvr_raft_running").set(flag(r.running));
}

fn publish_state(s: &StateSample) {
    for (state, n) in RANGE_STATES.iter().zip(s.sections) {
        gauge!("storesvr_sections", "state" => *state).set(n as f64);
    }
    gauge!("storesvr_sections_unowned").set(s.unowned as f64);
    gauge!("storesvr_max_seq_highest").set(s.max_seq_highest as f64);
    gauge!("storesvr_allocsvrs", "state" => "live").set(s.allocsvrs_live as f64);
    gauge!("storesvr_allocsvrs", "state" => "draining").set(s.allocsvrs_draining as f64);
    gauge!("storesvr_route_version").set(s.route_version as f64);
    gauge!("storesvr_map_version").set(s.map_version as f64);
    gauge!("storesvr_sections_stranded").set(s.stranded as f64);
    gauge!("storesvr_ledgers").set(s.ledgers as f64);
    gauge!("storesvr_ledgers_restored").set(s.ledgers_restored as f64);
    gauge!("storesvr_ledger_held").set(s.ledger_held as f64);
    // Gauges that only grow (while the ledgers stay here): `increase()` of one reads as a count.
    for (reason, n) in VoidReason::ALL.iter().zip(s.ledger_voided) {
        gauge!("storesvr_ledger_voided", "reason" => reason.name()).set(n as f64);
    }
    if let Some(moves) = s.moves {
        for (phase, n) in PHASES.iter().zip(moves) {
            gauge!("storesvr_moves", "phase" => *phase).set(n as f64);
        }
    }
}

/// Publishes a sample every [`SAMPLE_EVERY`] until the replica is gone. Holds the replica weakly
/// so that it never keeps a stopped node's state alive; ends when openraft's metrics channel
/// closes (the Raft node shut down).
pub async fn metrics_loop(ctx: Weak<ReplicaState>) {
    let leader_changes = counter!("storesvr_raft_leader_changes_total");
    leader_changes.absolute(0);
    let mut changes = LeaderChanges::default();
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(ctx): Option<Arc<ReplicaState>> = ctx.upgrade() else {
            return;
        };
        let watch = ctx.raft.metrics();
        if watch.has_changed().is_err() {
            return;
        }
        let raft = raft_sample(&watch.borrow());
        if changes.observe(&raft) {
            leader_changes.increment(1);
        }
        publish_raft(&raft);
        publish_state(&ctx.data(|d| state_sample(&d.set)));
        publish_clocks(&ctx, raft.is_leader);
    }
}

/// On the leader, each follower's clock offset from its own and its own skew from the quorum's
/// clock (`raft::clocks`); the alert compares the skew with the id allowance, also published.
/// Off the leader the skew reads 0: followers read no clocks.
fn publish_clocks(ctx: &ReplicaState, is_leader: bool) {
    let max_ahead_ms = ctx.data(|d| d.set.ids.as_ref().map(|i| i.max_ahead_ms));
    if let Some(ms) = max_ahead_ms {
        gauge!("storesvr_id_max_ahead_ms").set(ms as f64);
    }
    let skew = if is_leader {
        ctx.quorum_offset().map_or(0, |o| -o)
    } else {
        0
    };
    gauge!("storesvr_clock_skew_ms").set(skew as f64);
    if is_leader {
        for (peer, r) in ctx.clocks.fresh(std::time::Instant::now()) {
            gauge!("storesvr_clock_offset_ms", "peer" => peer.to_string()).set(r.offset_ms as f64);
        }
        if let Some(why) = max_ahead_ms.and_then(|ms| crate::raft::clocks::disagreement(-skew, ms / 2)) {
            ctx.warn_clock(&why);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn led(term: u64, leader: Option<NodeId>) -> RaftSample {
        RaftSample {
            term,
            leader,
            ..Default::default()
        }
    }

    #[test]
    fn leader_changes_count_a_new_leader_or_term_but_not_the_first_or_none() {
        let mut c = LeaderChanges::default();
        let seen: Vec<bool> = [
            led(1, Some(1)), // first leader seen: not a change
            led(1, Some(1)),
            led(2, None), // election in progress
            led(2, Some(2)),
            led(3, Some(2)), // re-elected in a new term
            led(3, Some(2)),
        ]
        .iter()
        .map(|s| c.observe(s))
        .collect();
        assert_eq!(seen, [false, false, false, true, true, false]);
    }

    #[test]
    fn a_fresh_state_has_no_sections_and_no_moves() {
        let s = state_sample(&SetState::default());
        assert_eq!(s.sections, [0; 4]);
        assert_eq!((s.unowned, s.max_seq_highest, s.moves), (0, 0, None));
    }

    #[test]
    fn an_initialized_set_counts_owned_unowned_sections_ceilings_and_allocsvrs() {
        let (mut st, incs) = crate::domain::testing::set_with(&[1, 2]);
        st.sections[3].owner = incs[0];
        st.sections[7].max_seq = 42;
        st.allocsvrs.get_mut(&incs[1]).unwrap().draining = true;
        let s = state_sample(&st);
        assert_eq!(s.sections, [10, 0, 0, 0]);
        assert_eq!(s.unowned, 9);
        assert_eq!(s.max_seq_highest, 42);
        assert_eq!((s.allocsvrs_live, s.allocsvrs_draining), (1, 1));
        assert_eq!(s.moves, Some([0; 9]), "set 0 holds the map, with no move yet");
    }

    /// Issue 25: a range left migrating by a cancel whose range step never arrived shows, from the
    /// map's home and from a set that only holds a published copy; a running move's does not.
    #[test]
    fn sections_in_flight_for_an_ended_move_are_stranded() {
        use crate::domain::cluster_map::{MoveOp, Phase};
        use crate::domain::state::{CachedMap, Span};
        use seqsvr_proto::SectionId;
        let (mut st, _) = crate::domain::testing::set_with(&[1]);
        let span = Span {
            begin: SectionId(2),
            end: SectionId(5),
        };
        st.ranges
            .set(span.begin, span.end, Some(RangeState::Migrating { op: 5, to_set: 1 }));
        let record = |phase| MoveOp {
            op: 5,
            from: 0,
            to: 1,
            span,
            phase,
            driver: 1,
            recorded_at: 1,
            switched_at: 0,
        };
        let map = st.map.as_mut().unwrap();
        map.ops.insert(5, record(Phase::Cancelling));
        assert_eq!(state_sample(&st).stranded, 0, "a cancel in progress is not stranded");
        st.map.as_mut().unwrap().ops.insert(5, record(Phase::Cancelled));
        assert_eq!(state_sample(&st).stranded, 3);

        st.map = None;
        let copy = pb::ClusterMap {
            version: 9,
            moves: vec![pb::MoveInfo {
                op: 5,
                phase: pb::MovePhase::Cancelled as i32,
                ..Default::default()
            }],
            ..Default::default()
        };
        st.cached_map = Some(CachedMap {
            version: 9,
            encoded: copy.encode_to_vec(),
        });
        assert_eq!(state_sample(&st).stranded, 3, "seen through the published copy too");
    }
}
