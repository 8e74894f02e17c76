//! `AdminService` client for operator actions on a StoreSvr group (add or remove a replica).
//!
//! Follows `not_leader` hints like [`crate::store::StoreClient`] (to the configured address of the
//! hinted node id when the operator named it, else to the hint's address, else to the next seed after
//! a backoff). Membership changes are not idempotent from the caller's view: an attempt that timed out
//! or lost its reply makes the call's outcome [`ClientError::Unknown`] unless a later attempt answers.
//!
//! Deliberately left out: the rules of membership (learner first, quorum checks) — the server owns them.

use std::time::Duration;

use seqsvr_proto::NodeId;
use seqsvr_proto::pb;
use seqsvr_proto::pb::admin_service_client::AdminServiceClient;
use tokio::time::Instant;
use tonic::transport::Endpoint;

use crate::client::Unsettled;
use crate::error::{ClientError, FailureKind};
use crate::retry::{Budget, Delivery, classify};
use crate::store::{Seed, StoreTimeouts};

/// Hints followed in a row before backing off (stops ping-pong between two confused replicas).
const FREE_HOPS: u32 = 3;

/// Client of one StoreSvr group's `AdminService`.
#[derive(Debug, Clone)]
pub struct AdminClient {
    seeds: Vec<Seed>,
    timeouts: StoreTimeouts,
}

/// One admin request.
#[derive(Debug, Clone)]
enum AdminRequest {
    Add(pb::AddReplicaRequest),
    Remove(pb::RemoveReplicaRequest),
}

impl AdminClient {
    /// A client over `seeds` (StoreSvr addresses, `addr` or `id=addr`); does no IO.
    pub fn new(seeds: Vec<Seed>, timeouts: StoreTimeouts) -> Result<Self, ClientError> {
        if seeds.is_empty() {
            return Err(ClientError::failed(FailureKind::BadConfig, "no store address given"));
        }
        Ok(Self { seeds, timeouts })
    }

    /// Adds a replica under a never-used node id: it joins as a learner, catches up, becomes a voter.
    pub async fn add_replica(&self, node_id: NodeId, addr: &str) -> Result<pb::MembershipReply, ClientError> {
        self.call(AdminRequest::Add(pb::AddReplicaRequest {
            node_id: node_id.0,
            addr: addr.to_owned(),
        }))
        .await
    }

    /// Removes a voter or learner; its node id is retired for good.
    pub async fn remove_replica(&self, node_id: NodeId) -> Result<pb::MembershipReply, ClientError> {
        self.call(AdminRequest::Remove(pb::RemoveReplicaRequest { node_id: node_id.0 }))
            .await
    }

    async fn call(&self, req: AdminRequest) -> Result<pb::MembershipReply, ClientError> {
        let mut budget = Budget::with_timeouts(self.timeouts.attempt, Instant::now() + self.timeouts.overall);
        let mut state = Unsettled::default();
        let mut next_seed = 0usize;
        let mut target = self.seeds[0].addr.clone();
        let mut hops = 0;
        while let Some(timeout) = budget.start_attempt(Instant::now()) {
            match send(&target, req.clone(), timeout).await {
                Ok(reply) => match reply.not_leader.clone() {
                    None => return Ok(reply),
                    Some(hint) => {
                        state.last = format!("{target} is not the leader");
                        if !hint.leader_addr.is_empty() && hops < FREE_HOPS {
                            hops += 1;
                            target = self.addr_of(hint);
                            continue;
                        }
                    }
                },
                Err(Attempt::TimedOut) => {
                    state.maybe_taken = true;
                    state.last = format!("{target}: timed out after {timeout:?}");
                }
                Err(Attempt::Status(s)) => {
                    let verdict = classify(&s);
                    state.maybe_taken |= verdict.delivery == Delivery::Maybe;
                    state.last = format!("{target}: {}: {}", s.code(), s.message());
                    if verdict.invalid_argument {
                        return Err(state.into_error(FailureKind::InvalidArgument));
                    }
                    if !verdict.retry {
                        return Err(state.into_error(FailureKind::Unavailable));
                    }
                }
            }
            hops = 0;
            next_seed += 1;
            target = self.seeds[next_seed % self.seeds.len()].addr.clone();
            let jitter = rand::random::<f64>();
            tokio::time::sleep_until(budget.next_try_at(Instant::now(), jitter)).await;
        }
        Err(state.into_error(FailureKind::Unavailable))
    }

    /// The configured address of the hinted leader when the operator named its node id, else the hint's.
    fn addr_of(&self, hint: pb::LeaderHint) -> String {
        self.seeds
            .iter()
            .find(|s| s.node_id == Some(NodeId(hint.leader_id)))
            .map_or(hint.leader_addr, |s| s.addr.clone())
    }
}

enum Attempt {
    Status(tonic::Status),
    TimedOut,
}

async fn send(addr: &str, req: AdminRequest, timeout: Duration) -> Result<pb::MembershipReply, Attempt> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| Attempt::Status(tonic::Status::failed_precondition(format!("bad address {addr:?}: {e}"))))?
        .connect_timeout(timeout);
    let mut client = AdminServiceClient::new(endpoint.connect_lazy())
        .max_decoding_message_size(seqsvr_proto::limits::STORE_MESSAGE_BYTES)
        .max_encoding_message_size(seqsvr_proto::limits::STORE_MESSAGE_BYTES);
    let call = async {
        match req {
            AdminRequest::Add(r) => {
                let mut r = tonic::Request::new(r);
                r.set_timeout(timeout);
                client.add_replica(r).await
            }
            AdminRequest::Remove(r) => {
                let mut r = tonic::Request::new(r);
                r.set_timeout(timeout);
                client.remove_replica(r).await
            }
        }
    };
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(reply)) => Ok(reply.into_inner()),
        Ok(Err(s)) => Err(Attempt::Status(s)),
        Err(_) => Err(Attempt::TimedOut),
    }
}
