//! `AdminService` client for operator actions on a StoreSvr group (add or remove a replica), over
//! the same leader-following loop as the StoreService client.
//!
//! Membership changes are not idempotent from the caller's view: a failure with `maybe_taken` set
//! means an attempt may have been applied; the operator checks `seqctl status` before retrying.
//!
//! Deliberately left out: the rules of membership (learner first, quorum checks) — the server owns them.

use seqsvr_proto::pb::admin_service_client::AdminServiceClient;
use seqsvr_proto::{NodeId, limits, pb};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::leader::{ControlError, Leader, LeaderCall, Seed, StoreTimeouts};

/// Client of one StoreSvr group's `AdminService`.
#[derive(Debug, Clone)]
pub struct AdminClient {
    leader: Leader,
}

impl AdminClient {
    /// A client over `seeds` (StoreSvr addresses, `addr` or `id=addr`); does no IO.
    pub fn new(seeds: Vec<Seed>, timeouts: StoreTimeouts) -> Result<Self, String> {
        Ok(Self {
            leader: Leader::new(seeds, timeouts)?,
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
}

fn admin_service(channel: Channel) -> AdminServiceClient<Channel> {
    AdminServiceClient::new(channel)
        .max_decoding_message_size(limits::STORE_MESSAGE_BYTES)
        .max_encoding_message_size(limits::STORE_MESSAGE_BYTES)
}

impl LeaderCall for pb::AddReplicaRequest {
    type Reply = pb::MembershipReply;
    async fn send(channel: Channel, req: Request<Self>) -> Result<Response<Self::Reply>, Status> {
        admin_service(channel).add_replica(req).await
    }
    fn hint(reply: &Self::Reply) -> Option<&pb::LeaderHint> {
        reply.not_leader.as_ref()
    }
}

impl LeaderCall for pb::RemoveReplicaRequest {
    type Reply = pb::MembershipReply;
    async fn send(channel: Channel, req: Request<Self>) -> Result<Response<Self::Reply>, Status> {
        admin_service(channel).remove_replica(req).await
    }
    fn hint(reply: &Self::Reply) -> Option<&pb::LeaderHint> {
        reply.not_leader.as_ref()
    }
}
