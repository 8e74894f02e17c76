//! `AdminService` client for operator actions on a StoreSvr group (add or remove a replica, read
//! and change the cluster map, one set's move steps, read its audit trail), over the same
//! leader-following loop as the StoreService client.
//!
//! Membership changes are not idempotent from the caller's view: a failure with `maybe_taken` set
//! means an attempt may have been applied; the operator checks `seqctl status` before retrying.
//!
//! Deliberately left out: the rules of membership (learner first, quorum checks) — the server owns them.

use seqsvr_proto::pb::admin_service_client::AdminServiceClient;
use seqsvr_proto::{NodeId, limits, pb};
use tonic::{Request, Response, Status};

use crate::leader::{ControlError, Leader, LeaderCall, Seed, StoreTimeouts};
use seqsvr_rpc::transport::{Conn, Dialer};

/// Client of one StoreSvr group's `AdminService`.
#[derive(Debug, Clone)]
pub struct AdminClient {
    leader: Leader,
}

impl AdminClient {
    /// A client over `seeds` (StoreSvr addresses, `addr` or `id=addr`); does no IO.
    pub fn new(seeds: Vec<Seed>, timeouts: StoreTimeouts) -> Result<Self, String> {
        Self::with_dialer(seeds, timeouts, &Dialer::default())
    }

    /// The same, over the transport `dialer` opens.
    pub fn with_dialer(seeds: Vec<Seed>, timeouts: StoreTimeouts, dialer: &Dialer) -> Result<Self, String> {
        Ok(Self {
            leader: Leader::with_dialer(seeds, timeouts, dialer)?,
        })
    }

    /// Adds a replica under a never-used node id: it joins as a learner, catches up, becomes a voter.
    pub async fn add_replica(&self, node_id: NodeId, addr: &str) -> Result<pb::MembershipReply, ControlError> {
        let req = pb::AddReplicaRequest {
            node_id: node_id.0,
            addr: addr.to_owned(),
        };
        self.leader.call(req).await
    }

    /// Removes a voter or learner; its node id is retired for good.
    pub async fn remove_replica(&self, node_id: NodeId) -> Result<pb::MembershipReply, ControlError> {
        self.leader.call(pb::RemoveReplicaRequest { node_id: node_id.0 }).await
    }

    /// The cluster map, read linearizably from set 0's leader.
    pub async fn cluster_map(&self) -> Result<pb::ClusterMap, ControlError> {
        // `cluster_map_reply` refuses a reply without a map.
        Ok(self.cluster_map_reply().await?.map.unwrap_or_default())
    }

    /// The whole reply to GetClusterMap: the map and the answering set's own range states.
    pub async fn cluster_map_reply(&self) -> Result<pb::ClusterMapReply, ControlError> {
        let reply = self.leader.call(pb::GetClusterMapRequest {}).await?;
        if reply.map.is_none() {
            return Err(ControlError::Rejected(Status::internal(
                "the cluster map reply carried no map",
            )));
        }
        Ok(reply)
    }

    /// Changes the map (set 0 only).
    pub async fn change_map(&self, change: pb::change_map_request::Change) -> Result<pb::ChangeMapReply, ControlError> {
        self.leader.call(pb::ChangeMapRequest { change: Some(change) }).await
    }

    /// Keeps `map` as the set's cached copy unless the set has that version or a newer one.
    /// Publishes `map` to this set, which the publisher knows as set `for_set`: a group that is
    /// another set refuses it.
    pub async fn publish_map(&self, map: pb::ClusterMap, for_set: u64) -> Result<pb::PublishMapReply, ControlError> {
        let req = pb::PublishMapRequest {
            map: Some(map),
            for_set: Some(for_set),
        };
        self.leader.call(req).await
    }

    /// Applies one range step of a move on this group's set.
    pub async fn range_step(&self, req: pb::RangeStepRequest) -> Result<pb::RangeStepReply, ControlError> {
        self.leader.call(req).await
    }

    /// Starts (or continues) draining AllocSvr node `node_id`; how many sections it still owns.
    pub async fn drain_alloc_svr(&self, node_id: u64) -> Result<pb::DrainAllocSvrReply, ControlError> {
        self.leader.call(pb::DrainAllocSvrRequest { node_id }).await
    }

    /// Records of the set's audit trail numbered above `after`, at most `limit` (0: a full page):
    /// the oldest such, or with `newest` the newest such.
    pub async fn audit(&self, after: u64, limit: u32, newest: bool) -> Result<pb::GetAuditReply, ControlError> {
        self.leader.call(pb::GetAuditRequest { after, limit, newest }).await
    }

    /// How far the owners of move `op`'s frozen range have let go.
    pub async fn export_status(&self, op: u64) -> Result<pb::ExportStatusReply, ControlError> {
        self.leader.call(pb::ExportStatusRequest { op }).await
    }
}

fn admin_service(channel: Conn) -> AdminServiceClient<Conn> {
    AdminServiceClient::new(channel)
        .max_decoding_message_size(limits::STORE_MESSAGE_BYTES)
        .max_encoding_message_size(limits::STORE_MESSAGE_BYTES)
}

/// Each admin request goes to the group's leader; a reply's `not_leader` hint redirects it.
macro_rules! admin_call {
    ($($req:ident => $reply:ident, $method:ident;)*) => {$(
        impl LeaderCall for pb::$req {
            type Reply = pb::$reply;
            async fn send(channel: Conn, req: Request<Self>) -> Result<Response<Self::Reply>, Status> {
                admin_service(channel).$method(req).await
            }
            fn hint(reply: &Self::Reply) -> Option<&pb::LeaderHint> {
                reply.not_leader.as_ref()
            }
        }
    )*};
}

admin_call! {
    AddReplicaRequest => MembershipReply, add_replica;
    RemoveReplicaRequest => MembershipReply, remove_replica;
    GetClusterMapRequest => ClusterMapReply, get_cluster_map;
    ChangeMapRequest => ChangeMapReply, change_map;
    RangeStepRequest => RangeStepReply, range_step;
    ExportStatusRequest => ExportStatusReply, export_status;
    DrainAllocSvrRequest => DrainAllocSvrReply, drain_alloc_svr;
    PublishMapRequest => PublishMapReply, publish_map;
    GetAuditRequest => GetAuditReply, get_audit;
}
