//! The move RPCs of `AdminService` as plain functions (sans-IO), like the rest of `protocol`: each
//! checks a request, builds the command its Raft write carries, and turns the applied result (or
//! the applied state, for the reads) into the reply. The cluster map lives on set 0; range steps
//! and the export status are per set.
//!
//! The lease wait of a move is decided here, for the source's leader, not trusted to the driver:
//! [`export_reply`] hands out a frozen range's final ceilings only when every owner released it
//! (and none could still be serving under an older lease), or when a full
//! `lease·(1+drift)+margin` has passed since this leader first saw the range frozen
//! ([`FrozenSeen`]). A new leader starts that wait again: it cannot know when the freeze committed.
//!
//! Deliberately left out: Raft (writes, read index, leader hints), the replica's own membership
//! (set 0's addresses in the map) and driving a move (the control crate's `Mover` does).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use prost::Message;
use seqsvr_proto::{NodeId, pb};

use crate::domain::cluster_map::{ClusterMap, MapCommand, MapResult, MoveOp, Phase};
use crate::domain::ledger::{Ledger, LedgerCommand, LedgerResult};
use crate::domain::liveness::{self, Liveness};
use crate::domain::moves::RangeCommand;
use crate::domain::ranges::{OpId, RangeRun, RangeState};
use crate::domain::slots::IdState;
use crate::domain::state::{CachedMap, Command, CommandResult, SetParams, SetState, Span};
use crate::error::RpcError;
use crate::protocol::{check_ranges, unexpected};

/// Most sections one move may name (the install carries one ceiling per section).
pub const MAX_MOVE_SECTIONS: u64 = seqsvr_proto::limits::MAX_LOAD_SECTIONS;

fn span_of(p: &SetParams, r: Option<&pb::SectionRange>) -> Result<Span, RpcError> {
    let r = r.ok_or_else(|| RpcError::InvalidArgument("no section range given".into()))?;
    let spans = check_ranges(p, std::slice::from_ref(r), MAX_MOVE_SECTIONS)?;
    Ok(spans[0])
}

fn phase_pb(p: &Phase) -> pb::MovePhase {
    match p {
        Phase::Recorded => pb::MovePhase::Recorded,
        Phase::Importing => pb::MovePhase::Importing,
        Phase::Frozen => pb::MovePhase::Frozen,
        Phase::Sealed(_) => pb::MovePhase::Sealed,
        Phase::Installed => pb::MovePhase::Installed,
        Phase::Switched { .. } => pb::MovePhase::Switched,
        Phase::Done => pb::MovePhase::Done,
        Phase::Cancelled => pb::MovePhase::Cancelled,
        Phase::Cancelling => pb::MovePhase::Cancelling,
    }
}

/// The domain phase a request names; SEALED takes the ceilings along.
fn phase_from_pb(phase: i32, ceilings: &[u64]) -> Result<Phase, RpcError> {
    Ok(match pb::MovePhase::try_from(phase) {
        Ok(pb::MovePhase::Recorded) => Phase::Recorded,
        Ok(pb::MovePhase::Importing) => Phase::Importing,
        Ok(pb::MovePhase::Frozen) => Phase::Frozen,
        Ok(pb::MovePhase::Sealed) => Phase::Sealed(ceilings.to_vec()),
        Ok(pb::MovePhase::Installed) => Phase::Installed,
        Ok(pb::MovePhase::Switched) => Phase::Switched { map_version: 0 },
        Ok(pb::MovePhase::Done) => Phase::Done,
        Ok(pb::MovePhase::Cancelled) => Phase::Cancelled,
        Ok(pb::MovePhase::Cancelling) => Phase::Cancelling,
        _ => return Err(RpcError::InvalidArgument(format!("unknown move phase {phase}"))),
    })
}

fn move_pb(m: &MoveOp) -> pb::MoveInfo {
    let ceilings = match &m.phase {
        Phase::Sealed(c) => c.clone(),
        _ => Vec::new(),
    };
    pb::MoveInfo {
        op: m.op,
        from_set: m.from,
        to_set: m.to,
        sections: Some(pb::SectionRange {
            begin: m.span.begin.0,
            end: m.span.end.0,
        }),
        phase: phase_pb(&m.phase) as i32,
        driver: m.driver,
        recorded_at: m.recorded_at,
        switched_at: m.switched_at,
        ceilings,
    }
}

/// The wire form of the map; set 0's addresses are its Raft members' (`own_stores`), and its
/// time-ordered id setup (`ids`) is every set's.
pub fn map_pb(map: &ClusterMap, p: &SetParams, own_stores: &[String], ids: Option<&IdState>) -> pb::ClusterMap {
    pb::ClusterMap {
        ids: ids.map(IdState::setup_pb),
        version: map.version,
        sets: map
            .sets
            .iter()
            .map(|(&set_id, e)| pb::SetInfo {
                set_id,
                stores: if set_id == 0 && e.stores.is_empty() {
                    own_stores.to_vec()
                } else {
                    e.stores.clone()
                },
                // Only the publisher knows every set's AllocSvrs (see `map_for`).
                allocsvrs: Vec::new(),
            })
            .collect(),
        ranges: map
            .ranges
            .runs()
            .map(|r| pb::MapRange {
                section_begin: r.begin.0,
                section_end: r.end.0,
                set_id: r.state,
            })
            .collect(),
        moves: map.ops.values().map(move_pb).collect(),
        section_size: p.section_size,
        uid_limit: p.uid_limit,
    }
}

/// The set's cached copy of the map, decoded.
pub fn cached(set: &SetState) -> Result<Option<pb::ClusterMap>, RpcError> {
    let Some(c) = &set.cached_map else {
        return Ok(None);
    };
    pb::ClusterMap::decode(&c.encoded[..]).map(Some).map_err(|e| {
        RpcError::Internal(format!(
            "the cached cluster map (version {}) does not decode: {e}",
            c.version
        ))
    })
}

/// The reply to GetClusterMap on the leader: set 0's own map, elsewhere the cached copy (a hint,
/// which the operator's tools never plan a change from).
pub fn cluster_map_reply(
    set: &SetState,
    p: &SetParams,
    own_stores: &[String],
) -> Result<pb::ClusterMapReply, RpcError> {
    let map = match set.map.as_ref() {
        Some(m) => Some(map_pb(m, p, own_stores, set.ids.as_ref())),
        None => cached(set)?,
    };
    match map {
        Some(map) => Ok(pb::ClusterMapReply {
            not_leader: None,
            map: Some(map),
            set_id: p.set_id,
            held: set.ranges.runs().map(|r| held_pb(&r)).collect(),
        }),
        None => Err(RpcError::FailedPrecondition(format!(
            "set {} does not keep the cluster map and has no copy yet; ask set 0",
            p.set_id
        ))),
    }
}

/// One run of the set's own range states, as GetClusterMap reports it.
fn held_pb(run: &RangeRun) -> pb::HeldRange {
    let (state, op, to_set) = match run.state {
        RangeState::Owned => (pb::HeldState::Owned, 0, 0),
        RangeState::Importing { op } => (pb::HeldState::Importing, op, 0),
        RangeState::Migrating { op, to_set } => (pb::HeldState::Frozen, op, to_set),
        RangeState::Tombstoned { op, to_set, .. } => (pb::HeldState::Tombstoned, op, to_set),
    };
    pb::HeldRange {
        sections: Some(pb::SectionRange {
            begin: run.begin.0,
            end: run.end.0,
        }),
        state: state as i32,
        op,
        to_set,
    }
}

/// The set's map version, and the map itself when `caller` has an older one: the cached copy or,
/// on set 0 while its own map is newer than the copy (a change not published yet), its own map
/// with the AllocSvr addresses of the copy carried over. Only integers are read unless the caller
/// is behind; `own_stores` (set 0's members) is asked for only then.
pub fn map_for(
    set: &SetState,
    p: &SetParams,
    caller: u64,
    own_stores: impl FnOnce() -> Vec<String>,
) -> Result<(u64, Option<pb::ClusterMap>), RpcError> {
    let own_v = set.map.as_ref().map_or(0, |m| m.version);
    let cached_v = set.cached_map.as_ref().map_or(0, |c| c.version);
    let version = own_v.max(cached_v);
    if caller >= version {
        return Ok((version, None));
    }
    let copy = cached(set)?;
    if cached_v >= own_v {
        return Ok((version, copy));
    }
    let Some(mut own) = set.map.as_ref().map(|m| map_pb(m, p, &own_stores(), set.ids.as_ref())) else {
        return Ok((version, copy));
    };
    for entry in &mut own.sets {
        if let Some(c) = copy
            .as_ref()
            .and_then(|c| c.sets.iter().find(|s| s.set_id == entry.set_id))
        {
            entry.allocsvrs = c.allocsvrs.clone();
        }
    }
    Ok((own.version, Some(own)))
}

/// Checks a map to publish: for this cluster (same section size and uid space), with a version,
/// well-formed addresses, and small enough to keep in one command.
fn check_published(p: &SetParams, map: Option<pb::ClusterMap>) -> Result<CachedMap, RpcError> {
    let map = map.ok_or_else(|| RpcError::InvalidArgument("no map given".into()))?;
    if map.version == 0 {
        return Err(RpcError::InvalidArgument(
            "a published map has a version above 0".into(),
        ));
    }
    if (map.section_size, map.uid_limit) != (p.section_size, p.uid_limit) {
        return Err(RpcError::InvalidArgument(format!(
            "the map is of another cluster: section size {} and uid limit {}, this set has {} and {}",
            map.section_size, map.uid_limit, p.section_size, p.uid_limit
        )));
    }
    for addr in map.sets.iter().flat_map(|s| s.stores.iter().chain(&s.allocsvrs)) {
        addr.parse::<seqsvr_proto::addr::HostPort>()
            .map_err(|e| RpcError::InvalidArgument(format!("address in the map: {e}")))?;
    }
    let encoded = map.encode_to_vec();
    if encoded.len() > seqsvr_proto::limits::MAX_MAP_BYTES {
        return Err(RpcError::InvalidArgument(format!(
            "the map is {} bytes; at most {}",
            encoded.len(),
            seqsvr_proto::limits::MAX_MAP_BYTES
        )));
    }
    Ok(CachedMap {
        version: map.version,
        encoded,
    })
}

/// The write of a PublishMap: keep the map as the set's cached copy unless it has that version or
/// a newer one.
pub fn publish_command(p: &SetParams, req: pb::PublishMapRequest) -> Result<Command, RpcError> {
    if let Some(meant) = req.for_set
        && meant != p.set_id
    {
        return Err(RpcError::FailedPrecondition(format!(
            "this is set {}, but the map was published to it as set {meant}: the map lists this \
             group's address under another set",
            p.set_id
        )));
    }
    Ok(Command::CacheMap(check_published(p, req.map)?))
}

pub fn published(result: CommandResult) -> Result<pb::PublishMapReply, RpcError> {
    match result {
        CommandResult::MapCached { version, already } => Ok(pb::PublishMapReply {
            not_leader: None,
            version,
            already,
        }),
        CommandResult::Invalid(m) => Err(RpcError::InvalidArgument(m)),
        other => Err(unexpected(other)),
    }
}

/// The write of a ChangeMap (set 0).
pub fn map_command(p: &SetParams, req: pb::ChangeMapRequest) -> Result<Command, RpcError> {
    use pb::change_map_request::Change;
    Ok(Command::Map(match req.change {
        Some(Change::AddSet(a)) => {
            for s in &a.stores {
                s.parse::<seqsvr_proto::addr::HostPort>()
                    .map_err(|e| RpcError::InvalidArgument(format!("store address: {e}")))?;
            }
            MapCommand::AddSet {
                expect_version: a.expect_version,
                set_id: a.set_id,
                stores: a.stores,
            }
        }
        Some(Change::BeginMove(b)) => MapCommand::Begin {
            expect_version: b.expect_version,
            op: b.op,
            from: b.from_set,
            to: b.to_set,
            span: span_of(p, b.sections.as_ref())?,
            driver: b.driver,
        },
        Some(Change::ClaimMove(c)) => MapCommand::Claim {
            op: c.op,
            driver: c.driver,
        },
        Some(Change::AdvanceMove(a)) => MapCommand::Advance {
            op: a.op,
            driver: a.driver,
            phase: phase_from_pb(a.phase, &a.ceilings)?,
        },
        Some(Change::FinishMove(f)) => MapCommand::Finish {
            op: f.op,
            driver: f.driver,
        },
        None => return Err(RpcError::InvalidArgument("no change given".into())),
    }))
}

pub fn map_changed(result: CommandResult) -> Result<pb::ChangeMapReply, RpcError> {
    match result {
        CommandResult::Map(MapResult::Ok { version, already }) => Ok(pb::ChangeMapReply {
            not_leader: None,
            version,
            already,
            version_changed: false,
        }),
        CommandResult::Map(MapResult::VersionChanged { version }) => Ok(pb::ChangeMapReply {
            not_leader: None,
            version,
            already: false,
            version_changed: true,
        }),
        CommandResult::Map(MapResult::Refused(m)) | CommandResult::Refused(m) => Err(RpcError::FailedPrecondition(m)),
        other => Err(unexpected(other)),
    }
}

/// The write of a RangeStep (the set's side of one move step).
pub fn range_command(p: &SetParams, req: pb::RangeStepRequest) -> Result<Command, RpcError> {
    let span = span_of(p, req.sections.as_ref())?;
    let op = req.op;
    let takes_sections = matches!(
        pb::RangeStep::try_from(req.step),
        Ok(pb::RangeStep::Import | pb::RangeStep::Install | pb::RangeStep::InstallLedgers)
    );
    if takes_sections && (req.section_size, req.uid_limit) != (p.section_size, p.uid_limit) {
        return Err(RpcError::FailedPrecondition(format!(
            "set {} has section size {} and uid limit {}; the move's cluster has {} and {}: \
             sections cut differently cannot move between sets",
            p.set_id, p.section_size, p.uid_limit, req.section_size, req.uid_limit
        )));
    }
    Ok(Command::Range(match pb::RangeStep::try_from(req.step) {
        Ok(pb::RangeStep::Import) => RangeCommand::Import {
            op,
            span,
            from_set: req.other_set,
        },
        Ok(pb::RangeStep::Freeze) => RangeCommand::Freeze {
            op,
            span,
            to_set: req.other_set,
        },
        Ok(pb::RangeStep::Install) => RangeCommand::Install {
            op,
            span,
            ceilings: req.ceilings,
        },
        Ok(pb::RangeStep::Tombstone) => RangeCommand::Tombstone {
            op,
            span,
            to_set: req.other_set,
            map_version: req.map_version,
        },
        Ok(pb::RangeStep::Cancel) => RangeCommand::Cancel { op, span },
        Ok(pb::RangeStep::Seal) => RangeCommand::Seal { op, span },
        Ok(pb::RangeStep::InstallLedgers) => {
            let ledgers: Vec<(String, Ledger)> = postcard::from_bytes(&req.ledgers)
                .map_err(|e| RpcError::InvalidArgument(format!("the ledgers of move {op} do not decode: {e}")))?;
            return Ok(Command::Ledger(LedgerCommand::Install { op, span, ledgers }));
        }
        _ => {
            return Err(RpcError::InvalidArgument(format!(
                "a range step is IMPORT, FREEZE, SEAL, INSTALL, INSTALL_LEDGERS, TOMBSTONE or CANCEL, not {}",
                req.step
            )));
        }
    }))
}

pub fn stepped(result: CommandResult) -> Result<pb::RangeStepReply, RpcError> {
    match result {
        CommandResult::Ledger(LedgerResult::Count(_)) => Ok(pb::RangeStepReply {
            not_leader: None,
            already: false,
        }),
        CommandResult::Ledger(LedgerResult::Refused(r)) => Err(RpcError::FailedPrecondition(format!(
            "the target does not take the range's ledgers: {r:?} (it takes them only while it imports the range)"
        ))),
        CommandResult::Stepped { already } => Ok(pb::RangeStepReply {
            not_leader: None,
            already,
        }),
        CommandResult::Refused(m) => Err(RpcError::FailedPrecondition(m)),
        CommandResult::Invalid(m) => Err(RpcError::InvalidArgument(m)),
        other => Err(unexpected(other)),
    }
}

/// The write that marks node `node_id` draining, refused when no other AllocSvr of the set is
/// renewing: its sections would have nowhere to go.
pub fn drain_command(
    set: &SetState,
    liveness: &Liveness,
    now: Instant,
    detect: Duration,
    node_id: u64,
) -> Result<Command, RpcError> {
    let alive = liveness::alive(set, liveness, now, detect);
    let others = alive
        .renewing
        .iter()
        .filter_map(|i| set.allocsvrs.get(i))
        .filter(|r| r.node_id.0 != node_id && !r.draining)
        .count();
    if others == 0 {
        return Err(RpcError::FailedPrecondition(format!(
            "no other live AllocSvr in this set to take node {node_id}'s sections; start one first"
        )));
    }
    Ok(Command::Drain {
        node_id: NodeId(node_id),
    })
}

/// The reply to a committed drain: the incarnation and how many sections it still owns.
pub fn drained(set: &SetState, node_id: u64, result: CommandResult) -> Result<pb::DrainAllocSvrReply, RpcError> {
    match result {
        CommandResult::Draining { incarnation: Some(i) } => Ok(pb::DrainAllocSvrReply {
            not_leader: None,
            incarnation: i.0,
            held: set.sections.iter().filter(|s| s.owner == i).count() as u64,
        }),
        CommandResult::Draining { incarnation: None } => Err(RpcError::FailedPrecondition(format!(
            "AllocSvr node {node_id} is not registered in this set"
        ))),
        other => Err(unexpected(other)),
    }
}

/// How long after a freeze no owner can still be serving: a lease stretched by the drift bound,
/// plus the margin.
pub fn lease_wait(p: &SetParams) -> Duration {
    crate::domain::liveness::whole_wait(p)
}

/// When the current leadership first saw each move frozen: the start of the move's lease wait.
#[derive(Debug, Default)]
pub struct FrozenSeen {
    pub term: u64,
    pub seen: BTreeMap<OpId, Instant>,
}

impl FrozenSeen {
    /// When this leader (in `term`) first saw move `op` frozen: now, if it had not. Moves no longer
    /// frozen in `set` are forgotten, so this holds at most the moves in flight.
    pub fn first_seen(&mut self, term: u64, op: OpId, now: Instant, set: &SetState) -> Instant {
        if self.term != term {
            self.term = term;
            self.seen.clear();
        }
        self.seen.retain(|o, _| *o == op || set.export_status(*o).is_some());
        *self.seen.entry(op).or_insert(now)
    }
}

/// The export status of move `op` at `now`, given when this leader first saw it frozen; with
/// `skip_wait` (negative control) the ceilings are handed out without the lease wait.
pub fn export_reply(
    set: &SetState,
    p: &SetParams,
    op: OpId,
    now: Instant,
    seen: &mut FrozenSeen,
    term: u64,
    skip_wait: bool,
) -> Result<pb::ExportStatusReply, RpcError> {
    let Some(ceilings) = set.final_ceilings(op) else {
        return Err(RpcError::FailedPrecondition(format!(
            "move {op} has no range frozen or moved out of set {}",
            p.set_id
        )));
    };
    let Some(status) = set.export_status(op) else {
        // Tombstoned already: the ceilings are final and nobody serves the range here.
        return Ok(pb::ExportStatusReply {
            ready: true,
            released: true,
            ceilings,
            ..Default::default()
        });
    };
    let waited = now.saturating_duration_since(seen.first_seen(term, op, now, set));
    let remaining = lease_wait(p).saturating_sub(waited);
    let ready = status.released() || remaining.is_zero() || skip_wait;
    Ok(pb::ExportStatusReply {
        not_leader: None,
        ready,
        released: status.released(),
        forced: status.forced > 0,
        held: status.held,
        // Rounded up: a wait under a millisecond is still a wait, and a caller told 0 would ask
        // again at once (and a test took "not ready, wait 0" for a missing reason).
        wait_ms: if ready {
            0
        } else {
            remaining.as_micros().div_ceil(1_000) as u64
        },
        ceilings: if ready { ceilings } else { Vec::new() },
        // Not only when ready: a ledger is decided by the set, not by a section's owner, and
        // none changes after the freeze (every ledger call on a frozen range is refused).
        ledgers: ledgers_of(set, op)?,
    })
}

/// The ledgers of move `op`'s frozen range, encoded for the target (empty when there are none).
/// Frozen, they change no more: every ledger call on them is refused until the target serves them.
fn ledgers_of(set: &SetState, op: OpId) -> Result<Vec<u8>, RpcError> {
    let Some(m) = set.moves.get(&op) else {
        return Ok(Vec::new());
    };
    let ledgers = set.ledgers.of_span(m.span);
    if ledgers.is_empty() {
        return Ok(Vec::new());
    }
    postcard::to_allocvec(&ledgers).map_err(|e| RpcError::Internal(format!("cannot encode the range's ledgers: {e}")))
}

#[cfg(test)]
mod tests {
    use seqsvr_proto::SectionId;

    use super::*;
    use crate::domain::state::{Move, NOBODY};
    use crate::domain::testing::{set_with, small_params};

    const OP: u64 = 9;

    /// Set 0 with sections owned by node 1, and sections 2..5 frozen for move `OP` to set 1.
    fn frozen_set() -> SetState {
        let (mut st, incs) = set_with(&[1]);
        let moves = vec![Move {
            begin: SectionId(0),
            end: SectionId(10),
            from: NOBODY,
            to: incs[0],
        }];
        st.apply(&Command::Assign { expire: vec![], moves }, false);
        let freeze = range_command(
            &small_params(),
            pb::RangeStepRequest {
                op: OP,
                step: pb::RangeStep::Freeze as i32,
                sections: Some(pb::SectionRange { begin: 2, end: 5 }),
                other_set: 1,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(st.apply(&freeze, false), CommandResult::Stepped { already: false });
        st
    }

    /// GetClusterMap reports the answering set's own range states, and `storesvr restore` reads
    /// back what was reported.
    #[test]
    fn the_map_reply_carries_the_sets_own_range_states() {
        let st = frozen_set();
        let reply = cluster_map_reply(&st, &small_params(), &[]).unwrap();
        let held = crate::restore::live_map_of(&reply).held;
        let runs: Vec<_> = held
            .iter()
            .map(|(set, r)| (*set, r.begin.0, r.end.0, r.state))
            .collect();
        assert_eq!(
            runs,
            vec![
                (0, 0, 2, RangeState::Owned),
                (0, 2, 5, RangeState::Migrating { op: OP, to_set: 1 }),
                (0, 5, 10, RangeState::Owned),
            ]
        );
    }

    #[test]
    fn the_ceilings_wait_a_full_lease_from_when_this_leader_first_saw_the_freeze() {
        let st = frozen_set();
        let p = small_params();
        let wait = lease_wait(&p);
        assert_eq!(wait, Duration::from_millis(3_000 + 30 + 100));
        let t0 = Instant::now();
        let mut seen = FrozenSeen::default();
        let at = |seen: &mut FrozenSeen, after: Duration, term| {
            export_reply(&st, &p, OP, t0 + after, seen, term, false).unwrap()
        };
        let first = at(&mut seen, Duration::ZERO, 1);
        assert_eq!((first.ready, first.held, first.wait_ms), (false, 3, 3_130));
        assert!(first.ceilings.is_empty(), "no ceilings before the wait");
        let almost = at(&mut seen, wait - Duration::from_millis(1), 1);
        assert_eq!((almost.ready, almost.wait_ms), (false, 1));
        let last_micros = at(&mut seen, wait - Duration::from_micros(300), 1);
        assert_eq!(
            (last_micros.ready, last_micros.wait_ms),
            (false, 1),
            "never 0 while waiting"
        );
        let done = at(&mut seen, wait, 1);
        assert!(done.ready && !done.released);
        assert_eq!(done.ceilings.len(), 3);
        // A new term starts the wait again: its leader cannot know when the freeze committed.
        let new_leader = at(&mut seen, wait + Duration::from_secs(1), 2);
        assert_eq!((new_leader.ready, new_leader.wait_ms), (false, 3_130));
        // The negative control hands the ceilings out at once.
        let mut fresh = FrozenSeen::default();
        assert!(export_reply(&st, &p, OP, t0, &mut fresh, 1, true).unwrap().ready);
        // An unknown move is refused, not answered ready.
        let unknown = export_reply(&st, &p, OP + 1, t0, &mut seen, 2, false);
        assert!(matches!(unknown, Err(RpcError::FailedPrecondition(_))), "{unknown:?}");
    }

    #[test]
    fn a_drain_is_refused_while_no_other_allocsvr_renews() {
        let (st, incs) = set_with(&[1, 2]);
        let now = Instant::now();
        let detect = Duration::from_secs(1);
        let mut liveness = Liveness::default();
        liveness.become_leader(now);
        liveness.record(incs[0], now);
        let refused = drain_command(&st, &liveness, now, detect, 1);
        assert!(matches!(refused, Err(RpcError::FailedPrecondition(_))), "{refused:?}");
        liveness.record(incs[1], now);
        assert_eq!(
            drain_command(&st, &liveness, now, detect, 1).unwrap(),
            Command::Drain { node_id: NodeId(1) }
        );
    }

    /// Issue 25, item 4: a set takes in sections (import, install) only from a cluster that cuts
    /// the uid space as it does; steps that take nothing in do not carry the shape.
    #[test]
    fn import_and_install_are_refused_unless_the_cluster_cuts_sections_like_this_set() {
        let p = small_params();
        let req = |step: pb::RangeStep, section_size, uid_limit| pb::RangeStepRequest {
            op: OP,
            step: step as i32,
            sections: Some(pb::SectionRange { begin: 2, end: 4 }),
            other_set: 1,
            ceilings: vec![0, 0],
            section_size,
            uid_limit,
            ..Default::default()
        };
        for step in [pb::RangeStep::Import, pb::RangeStep::Install] {
            assert!(range_command(&p, req(step, p.section_size, p.uid_limit)).is_ok());
            for (size, limit) in [
                (p.section_size * 2, p.uid_limit),
                (p.section_size, p.uid_limit + 1),
                (0, 0),
            ] {
                let refused = range_command(&p, req(step, size, limit));
                assert!(
                    matches!(&refused, Err(RpcError::FailedPrecondition(m)) if m.contains(&format!("{size} and {limit}"))),
                    "{step:?} with {size}/{limit}: {refused:?}"
                );
            }
        }
        assert!(range_command(&p, req(pb::RangeStep::Freeze, 0, 0)).is_ok());
    }

    #[test]
    fn bad_move_requests_are_invalid_arguments() {
        let p = small_params();
        let no_range = range_command(
            &p,
            pb::RangeStepRequest {
                step: pb::RangeStep::Freeze as i32,
                ..Default::default()
            },
        );
        assert!(matches!(no_range, Err(RpcError::InvalidArgument(_))), "{no_range:?}");
        let bad_step = range_command(
            &p,
            pb::RangeStepRequest {
                step: pb::RangeStep::Unspecified as i32,
                sections: Some(pb::SectionRange { begin: 0, end: 1 }),
                ..Default::default()
            },
        );
        assert!(matches!(bad_step, Err(RpcError::InvalidArgument(_))), "{bad_step:?}");
        let beyond = map_command(
            &p,
            pb::ChangeMapRequest {
                change: Some(pb::change_map_request::Change::BeginMove(pb::BeginMove {
                    sections: Some(pb::SectionRange { begin: 5, end: 11 }),
                    ..Default::default()
                })),
            },
        );
        assert!(matches!(beyond, Err(RpcError::InvalidArgument(_))), "{beyond:?}");
        let zero = publish_command(
            &p,
            pb::PublishMapRequest {
                map: Some(pb::ClusterMap::default()),
                for_set: None,
            },
        );
        assert!(matches!(zero, Err(RpcError::InvalidArgument(_))), "{zero:?}");
    }
}
