//! The move RPCs of `AdminService`: the cluster map (read and change, on set 0) and a set's range
//! steps, drain and export status. `admin.rs` forwards to these functions; what each decides is in
//! `protocol::moves` (shared with the deterministic simulator), and this module adds Raft's writes and
//! read index, the replica's membership and the leader's clock. Every write here is an admin
//! action: it is stamped with its caller and time and recorded in the audit trail in the same
//! Raft entry (`grpc::audit`).
//!
//! Left out: driving a move (seqctl does) and checking the caller's role (the server's auth
//! layer does, before a handler runs).

use seqsvr_auth::Caller;
use seqsvr_proto::pb;

use crate::error::RpcError;
use crate::grpc::audit::stamped;
use crate::protocol::moves as protocol;
use crate::replica::{Led, ReplicaState};

fn members(ctx: &ReplicaState) -> Vec<String> {
    let m = ctx.raft.metrics().borrow().clone();
    m.membership_config
        .membership()
        .voter_ids()
        .filter_map(|id| m.membership_config.membership().get_node(&id).map(|n| n.addr.clone()))
        .collect()
}

pub async fn get_cluster_map(ctx: &ReplicaState) -> Result<pb::ClusterMapReply, RpcError> {
    let p = ctx.params()?;
    if let Led::Elsewhere(hint) = ctx.linearizable().await? {
        return Ok(pb::ClusterMapReply {
            not_leader: Some(hint),
            ..Default::default()
        });
    }
    let own = members(ctx);
    ctx.data(|d| protocol::cluster_map_reply(&d.set, &p, &own))
}

/// The set's map version, and the map when `caller` has an older one (see `protocol::moves::map_for`).
pub fn map_for(
    ctx: &ReplicaState,
    p: &crate::domain::state::SetParams,
    caller: u64,
) -> Result<(u64, Option<pb::ClusterMap>), RpcError> {
    ctx.data(|d| protocol::map_for(&d.set, p, caller, || members(ctx)))
}

pub async fn publish_map(
    ctx: &ReplicaState,
    who: &Caller,
    req: pb::PublishMapRequest,
) -> Result<pb::PublishMapReply, RpcError> {
    let cmd = protocol::publish_command(&ctx.params()?, req)?;
    match ctx.write(stamped(who, cmd)).await? {
        Led::Elsewhere(hint) => Ok(pb::PublishMapReply {
            not_leader: Some(hint),
            ..Default::default()
        }),
        Led::Here(result) => protocol::published(result),
    }
}

pub async fn change_map(
    ctx: &ReplicaState,
    who: &Caller,
    req: pb::ChangeMapRequest,
) -> Result<pb::ChangeMapReply, RpcError> {
    let cmd = protocol::map_command(&ctx.params()?, req)?;
    match ctx.write(stamped(who, cmd)).await? {
        Led::Elsewhere(hint) => Ok(pb::ChangeMapReply {
            not_leader: Some(hint),
            ..Default::default()
        }),
        Led::Here(result) => protocol::map_changed(result),
    }
}

pub async fn range_step(
    ctx: &ReplicaState,
    who: &Caller,
    req: pb::RangeStepRequest,
) -> Result<pb::RangeStepReply, RpcError> {
    let cmd = protocol::range_command(&ctx.params()?, req)?;
    match ctx.write(stamped(who, cmd)).await? {
        Led::Elsewhere(hint) => Ok(pb::RangeStepReply {
            not_leader: Some(hint),
            already: false,
        }),
        Led::Here(result) => protocol::stepped(result),
    }
}

/// Marks node `node_id` draining (once) and says how many sections it still owns.
pub async fn drain(ctx: &ReplicaState, who: &Caller, node_id: u64) -> Result<pb::DrainAllocSvrReply, RpcError> {
    let not_leader = |hint| pb::DrainAllocSvrReply {
        not_leader: Some(hint),
        ..Default::default()
    };
    if let Led::Elsewhere(hint) = ctx.linearizable().await? {
        return Ok(not_leader(hint));
    }
    let now = ReplicaState::lease_now();
    let cmd = ctx.data(|d| protocol::drain_command(&d.set, &ctx.view().liveness, now, ctx.detect(), node_id))?;
    match ctx.write(stamped(who, cmd)).await? {
        Led::Elsewhere(hint) => Ok(not_leader(hint)),
        Led::Here(result) => ctx.data(|d| protocol::drained(&d.set, node_id, result)),
    }
}

pub async fn export_status(
    ctx: &ReplicaState,
    req: pb::ExportStatusRequest,
) -> Result<pb::ExportStatusReply, RpcError> {
    let p = ctx.params()?;
    if let Led::Elsewhere(hint) = ctx.linearizable().await? {
        return Ok(pb::ExportStatusReply {
            not_leader: Some(hint),
            ..Default::default()
        });
    }
    let term = ctx.raft.metrics().borrow().current_term;
    let skip_wait = ctx.config.unsafe_skip_move_wait;
    ctx.data(|d| {
        let mut seen = ctx.frozen_seen.lock().expect("frozen_seen lock poisoned");
        protocol::export_reply(
            &d.set,
            &p,
            req.op,
            ReplicaState::lease_now(),
            &mut seen,
            term,
            skip_wait,
        )
    })
}
