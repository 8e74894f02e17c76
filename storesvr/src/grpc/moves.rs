//! The move RPCs of `AdminService`: the cluster map (read and change, on set 0) and a set's range
//! steps and export status. `admin.rs` forwards to these functions.
//!
//! The lease wait of a move is enforced here, on the source's leader, not trusted to the driver:
//! [`export_status`] hands out a frozen range's final ceilings only when every owner released it
//! (and none could still be serving under an older lease), or when a full
//! `lease·(1+drift)+margin` has passed since this leader first saw the range frozen. A new leader
//! starts that wait again: it cannot know when the freeze committed.
//!
//! Left out: driving a move (seqctl does) and authentication.

use std::time::{Duration, Instant};

use prost::Message;
use seqsvr_proto::{NodeId, pb};

use crate::domain::cluster_map::{ClusterMap, MapCommand, MapResult, MoveOp, Phase};
use crate::domain::moves::RangeCommand;
use crate::domain::state::{CachedMap, Command, CommandResult, SetParams, Span};
use crate::error::RpcError;
use crate::serve::check_ranges;
use crate::shared::{Led, Shared};

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

/// The wire form of the map; set 0's addresses are its Raft members'.
pub fn map_pb(map: &ClusterMap, p: &SetParams, own_stores: &[String]) -> pb::ClusterMap {
    pb::ClusterMap {
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

fn members(ctx: &Shared) -> Vec<String> {
    let m = ctx.raft.metrics().borrow().clone();
    m.membership_config
        .membership()
        .voter_ids()
        .filter_map(|id| m.membership_config.membership().get_node(&id).map(|n| n.addr.clone()))
        .collect()
}

pub async fn get_cluster_map(ctx: &Shared) -> Result<pb::ClusterMapReply, RpcError> {
    let p = ctx.params()?;
    if let Led::Elsewhere(hint) = ctx.linearizable().await? {
        return Ok(pb::ClusterMapReply {
            not_leader: Some(hint),
            map: None,
        });
    }
    let own = members(ctx);
    let map = ctx.data(|d| d.set.map.as_ref().map(|m| map_pb(m, &p, &own)));
    // Elsewhere the cached copy: a hint, which the operator's tools never plan a change from.
    let map = match map {
        Some(map) => Some(map),
        None => cached(ctx)?,
    };
    match map {
        Some(map) => Ok(pb::ClusterMapReply {
            not_leader: None,
            map: Some(map),
        }),
        None => Err(RpcError::FailedPrecondition(format!(
            "set {} does not keep the cluster map and has no copy yet; ask set 0",
            p.set_id
        ))),
    }
}

/// The set's cached copy of the map, decoded.
fn cached(ctx: &Shared) -> Result<Option<pb::ClusterMap>, RpcError> {
    let Some(c) = ctx.data(|d| d.set.cached_map.clone()) else {
        return Ok(None);
    };
    pb::ClusterMap::decode(&c.encoded[..]).map(Some).map_err(|e| {
        RpcError::Internal(format!(
            "the cached cluster map (version {}) does not decode: {e}",
            c.version
        ))
    })
}

/// The set's map version, and the map itself when `caller` has an older one: the cached copy or,
/// on set 0 while its own map is newer than the copy (a change not published yet), its own map
/// with the AllocSvr addresses of the copy carried over. Only integers are read unless the caller
/// is behind.
pub fn map_for(ctx: &Shared, p: &SetParams, caller: u64) -> Result<(u64, Option<pb::ClusterMap>), RpcError> {
    let (own_v, cached_v) = ctx.data(|d| {
        let own = d.set.map.as_ref().map_or(0, |m| m.version);
        (own, d.set.cached_map.as_ref().map_or(0, |c| c.version))
    });
    let version = own_v.max(cached_v);
    if caller >= version {
        return Ok((version, None));
    }
    let copy = cached(ctx)?;
    if cached_v >= own_v {
        return Ok((version, copy));
    }
    let members = members(ctx);
    let Some(mut own) = ctx.data(|d| d.set.map.as_ref().map(|m| map_pb(m, p, &members))) else {
        return Ok((version, copy));
    };
    for set in &mut own.sets {
        if let Some(c) = copy
            .as_ref()
            .and_then(|c| c.sets.iter().find(|s| s.set_id == set.set_id))
        {
            set.allocsvrs = c.allocsvrs.clone();
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

/// Keeps a published map as the set's cached copy unless it has that version or a newer one.
pub async fn publish_map(ctx: &Shared, req: pb::PublishMapRequest) -> Result<pb::PublishMapReply, RpcError> {
    let p = ctx.params()?;
    let cmd = Command::CacheMap(check_published(&p, req.map)?);
    match ctx.write(cmd).await? {
        Led::Elsewhere(hint) => Ok(pb::PublishMapReply {
            not_leader: Some(hint),
            ..Default::default()
        }),
        Led::Here(CommandResult::MapCached { version, already }) => Ok(pb::PublishMapReply {
            not_leader: None,
            version,
            already,
        }),
        Led::Here(CommandResult::Invalid(m)) => Err(RpcError::InvalidArgument(m)),
        Led::Here(other) => Err(RpcError::Internal(format!("unexpected state machine result {other:?}"))),
    }
}

fn map_command(p: &SetParams, req: pb::ChangeMapRequest) -> Result<MapCommand, RpcError> {
    use pb::change_map_request::Change;
    Ok(match req.change {
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
        None => return Err(RpcError::InvalidArgument("no change given".into())),
    })
}

pub async fn change_map(ctx: &Shared, req: pb::ChangeMapRequest) -> Result<pb::ChangeMapReply, RpcError> {
    let p = ctx.params()?;
    let cmd = map_command(&p, req)?;
    match ctx.write(Command::Map(cmd)).await? {
        Led::Elsewhere(hint) => Ok(pb::ChangeMapReply {
            not_leader: Some(hint),
            ..Default::default()
        }),
        Led::Here(CommandResult::Map(MapResult::Ok { version, already })) => Ok(pb::ChangeMapReply {
            not_leader: None,
            version,
            already,
            version_changed: false,
        }),
        Led::Here(CommandResult::Map(MapResult::VersionChanged { version })) => Ok(pb::ChangeMapReply {
            not_leader: None,
            version,
            already: false,
            version_changed: true,
        }),
        Led::Here(CommandResult::Map(MapResult::Refused(m)) | CommandResult::Refused(m)) => {
            Err(RpcError::FailedPrecondition(m))
        }
        Led::Here(other) => Err(RpcError::Internal(format!("unexpected state machine result {other:?}"))),
    }
}

fn range_command(p: &SetParams, req: pb::RangeStepRequest) -> Result<RangeCommand, RpcError> {
    let span = span_of(p, req.sections.as_ref())?;
    let op = req.op;
    Ok(match pb::MovePhase::try_from(req.step) {
        Ok(pb::MovePhase::Importing) => RangeCommand::Import {
            op,
            span,
            from_set: req.other_set,
        },
        Ok(pb::MovePhase::Frozen) => RangeCommand::Freeze {
            op,
            span,
            to_set: req.other_set,
        },
        Ok(pb::MovePhase::Installed) => RangeCommand::Install {
            op,
            span,
            ceilings: req.ceilings,
        },
        Ok(pb::MovePhase::Done) => RangeCommand::Tombstone {
            op,
            span,
            to_set: req.other_set,
            map_version: req.map_version,
        },
        Ok(pb::MovePhase::Cancelled) => RangeCommand::Cancel { op, span },
        _ => {
            return Err(RpcError::InvalidArgument(format!(
                "a range step is IMPORTING, FROZEN, INSTALLED, DONE or CANCELLED, not {}",
                req.step
            )));
        }
    })
}

pub async fn range_step(ctx: &Shared, req: pb::RangeStepRequest) -> Result<pb::RangeStepReply, RpcError> {
    let p = ctx.params()?;
    let cmd = range_command(&p, req)?;
    match ctx.write(Command::Range(cmd)).await? {
        Led::Elsewhere(hint) => Ok(pb::RangeStepReply {
            not_leader: Some(hint),
            already: false,
        }),
        Led::Here(CommandResult::Stepped { already }) => Ok(pb::RangeStepReply {
            not_leader: None,
            already,
        }),
        Led::Here(CommandResult::Refused(m)) => Err(RpcError::FailedPrecondition(m)),
        Led::Here(CommandResult::Invalid(m)) => Err(RpcError::InvalidArgument(m)),
        Led::Here(other) => Err(RpcError::Internal(format!("unexpected state machine result {other:?}"))),
    }
}

/// Marks node `node_id` draining (once) and says how many sections it still owns. Refused when no
/// other AllocSvr of the set is renewing: its sections would have nowhere to go.
pub async fn drain(ctx: &Shared, node_id: u64) -> Result<pb::DrainAllocSvrReply, RpcError> {
    if let Led::Elsewhere(hint) = ctx.linearizable().await? {
        return Ok(pb::DrainAllocSvrReply {
            not_leader: Some(hint),
            ..Default::default()
        });
    }
    let now = Instant::now();
    let others = ctx.data(|d| {
        let view = ctx.view();
        let alive = crate::domain::liveness::alive(&d.set, &view.liveness, now, ctx.detect());
        alive
            .renewing
            .iter()
            .filter_map(|i| d.set.allocsvrs.get(i))
            .filter(|r| r.node_id.0 != node_id && !r.draining)
            .count()
    });
    if others == 0 {
        return Err(RpcError::FailedPrecondition(format!(
            "no other live AllocSvr in this set to take node {node_id}'s sections; start one first"
        )));
    }
    let incarnation = match ctx
        .write(Command::Drain {
            node_id: NodeId(node_id),
        })
        .await?
    {
        Led::Elsewhere(hint) => {
            return Ok(pb::DrainAllocSvrReply {
                not_leader: Some(hint),
                ..Default::default()
            });
        }
        Led::Here(CommandResult::Draining { incarnation: Some(i) }) => i,
        Led::Here(CommandResult::Draining { incarnation: None }) => {
            return Err(RpcError::FailedPrecondition(format!(
                "AllocSvr node {node_id} is not registered in this set"
            )));
        }
        Led::Here(other) => return Err(RpcError::Internal(format!("unexpected state machine result {other:?}"))),
    };
    let held = ctx.data(|d| d.set.sections.iter().filter(|s| s.owner == incarnation).count() as u64);
    Ok(pb::DrainAllocSvrReply {
        not_leader: None,
        incarnation: incarnation.0,
        held,
    })
}

/// How long after a freeze no owner can still be serving: a lease stretched by the drift bound,
/// plus the margin.
fn lease_wait(p: &SetParams) -> Duration {
    p.lease().mul_f64(1.0 + p.drift_ppm as f64 / 1e6) + p.margin()
}

/// When this leader first saw move `op` frozen (now, if it had not). Moves no longer frozen here
/// are forgotten, so the map holds at most the moves in flight.
fn first_seen(ctx: &Shared, op: u64, now: Instant) -> Instant {
    let term = ctx.raft.metrics().borrow().current_term;
    let mut seen = ctx.frozen_seen.lock().expect("frozen_seen lock poisoned");
    if seen.term != term {
        seen.term = term;
        seen.seen.clear();
    }
    seen.seen
        .retain(|o, _| *o == op || ctx.data(|d| d.set.export_status(*o).is_some()));
    *seen.seen.entry(op).or_insert(now)
}

pub async fn export_status(ctx: &Shared, req: pb::ExportStatusRequest) -> Result<pb::ExportStatusReply, RpcError> {
    let p = ctx.params()?;
    if let Led::Elsewhere(hint) = ctx.linearizable().await? {
        return Ok(pb::ExportStatusReply {
            not_leader: Some(hint),
            ..Default::default()
        });
    }
    let (status, ceilings) = ctx.data(|d| (d.set.export_status(req.op), d.set.final_ceilings(req.op)));
    let Some(ceilings) = ceilings else {
        return Err(RpcError::FailedPrecondition(format!(
            "move {} has no range frozen or moved out of set {}",
            req.op, p.set_id
        )));
    };
    let Some(status) = status else {
        // Tombstoned already: the ceilings are final and nobody serves the range here.
        return Ok(pb::ExportStatusReply {
            ready: true,
            released: true,
            ceilings,
            ..Default::default()
        });
    };
    let now = Instant::now();
    let waited = now.saturating_duration_since(first_seen(ctx, req.op, now));
    let remaining = lease_wait(&p).saturating_sub(waited);
    let ready = status.released() || remaining.is_zero() || ctx.config.unsafe_skip_move_wait;
    Ok(pb::ExportStatusReply {
        not_leader: None,
        ready,
        released: status.released(),
        forced: status.forced > 0,
        held: status.held,
        wait_ms: if ready { 0 } else { remaining.as_millis() as u64 },
        ceilings: if ready { ceilings } else { Vec::new() },
    })
}
