//! `AdminService`: Raft membership changes, on the leader, the move RPCs (decided by
//! `protocol::step` through `serve`, except Drain) and the audit trail's read (in `audit`). Every
//! move write is an admin action: stamped with its caller and time and recorded in the audit
//! trail in the same Raft entry (`audit.rs`).
//!
//! A new replica joins as a learner, catches up (by snapshot when the log it
//! needs was purged), and only then becomes a voter, so adding a replica never
//! makes a quorum wait for an empty node. Node ids are never reused: the state
//! machine remembers every id that was ever a member.
//!
//! A membership change is not a state-machine command, so it cannot carry its audit record in
//! its own entry: the leader writes one `Command::Audit` record with the intent ("started")
//! before touching the membership, and one with the outcome after. Only if the intent is
//! committed does the change start, so every change has a record; the outcome record is best
//! effort (a leader that removed itself, or lost its quorum, cannot write it) and its absence
//! after a "started" says the outcome is not known to the trail.
//!
//! Left out: leader transfer (not in openraft 0.9) and joint changes of
//! several replicas at once.

use crate::error::RpcError;
use crate::grpc::serve::{respond, serve};
use crate::grpc::{audit, backup};
use crate::protocol::{Request as Call, moves};
use crate::replica::{Led, ReplicaState};
use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers};
use seqsvr_auth::Caller;
use seqsvr_proto::{NodeId, pb};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tonic::{Request, Response, Status};

/// How long a new replica may take to catch up before the call gives up.
pub const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);

pub struct AdminSvc {
    pub ctx: Arc<ReplicaState>,
}

impl AdminSvc {
    fn reply(&self, log_index: u64) -> pb::MembershipReply {
        let m = self.ctx.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        pb::MembershipReply {
            not_leader: None,
            voters: membership.voter_ids().collect(),
            learners: membership.learner_ids().collect(),
            log_index,
        }
    }

    fn not_leader(&self, id: Option<u64>) -> pb::MembershipReply {
        pb::MembershipReply {
            not_leader: Some(self.ctx.leader_hint(id)),
            ..Default::default()
        }
    }

    fn is_leader(&self) -> bool {
        self.ctx.raft.metrics().borrow().current_leader == Some(self.ctx.node_id)
    }

    async fn change(&self, changes: ChangeMembers<u64, BasicNode>) -> Result<pb::MembershipReply, RpcError> {
        match tokio::time::timeout(CATCH_UP_TIMEOUT, self.ctx.raft.change_membership(changes, false)).await {
            Err(_) => Err(RpcError::Unavailable("membership change did not commit in time".into())),
            Ok(Ok(r)) => Ok(self.reply(r.log_id.index)),
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => Ok(self.not_leader(f.leader_id)),
            Ok(Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e)))) => {
                Err(RpcError::FailedPrecondition(e.to_string()))
            }
            Ok(Err(RaftError::Fatal(e))) => Err(RpcError::Fatal(e.to_string())),
        }
    }

    /// Runs the membership change `change` between its two audit records (see the module docs):
    /// nothing is changed unless the "started" record commits here.
    async fn audited(
        &self,
        who: &Caller,
        what: &str,
        change: impl Future<Output = Result<pb::MembershipReply, RpcError>>,
    ) -> Result<pb::MembershipReply, RpcError> {
        if let Led::Elsewhere(hint) = self.ctx.write(audit::record(who, what, "started")).await? {
            return Ok(pb::MembershipReply {
                not_leader: Some(hint),
                ..Default::default()
            });
        }
        let result = change.await;
        let outcome = match &result {
            Ok(r) => match &r.not_leader {
                Some(h) => format!("not done: node {} leads now", h.leader_id),
                None => format!(
                    "done: voters {:?}, learners {:?} (log index {})",
                    r.voters, r.learners, r.log_index
                ),
            },
            Err(e) => format!("failed: {e}"),
        };
        match self.ctx.write(audit::record(who, what, &outcome)).await {
            Ok(Led::Here(_)) => {}
            Ok(Led::Elsewhere(_)) => tracing::warn!(what, outcome, "outcome not recorded: no longer the leader"),
            Err(e) => tracing::warn!(what, outcome, error = %e, "outcome not recorded"),
        }
        result
    }

    /// Marks node `node_id` draining (once) and says how many sections it still owns. Not a step
    /// of `protocol` (the simulator does not model drains): the read index first, as the decision
    /// reads the leader's liveness, then the write.
    async fn drain(&self, who: &Caller, node_id: u64) -> Result<pb::DrainAllocSvrReply, RpcError> {
        let ctx = &self.ctx;
        let not_leader = |hint| pb::DrainAllocSvrReply {
            not_leader: Some(hint),
            ..Default::default()
        };
        if let Led::Elsewhere(hint) = ctx.linearizable().await? {
            return Ok(not_leader(hint));
        }
        let now = ReplicaState::lease_now();
        let cmd = ctx.data(|d| moves::drain_command(&d.set, &ctx.view().liveness, now, ctx.detect(), node_id))?;
        match ctx.write(audit::stamped(who, cmd)).await? {
            Led::Elsewhere(hint) => Ok(not_leader(hint)),
            Led::Here(result) => ctx.data(|d| moves::drained(&d.set, node_id, result)),
        }
    }

    /// Adds `node_id` as a learner, waits for it to catch up, then promotes it.
    async fn add_then_promote(&self, node_id: u64, addr: String) -> Result<pb::MembershipReply, RpcError> {
        tracing::info!(node_id, addr = %addr, "adding replica as learner");
        let added = tokio::time::timeout(
            CATCH_UP_TIMEOUT,
            self.ctx.raft.add_learner(node_id, BasicNode::new(addr), true),
        )
        .await;
        match added {
            Err(_) => return Err(RpcError::Unavailable("the new replica did not catch up in time".into())),
            Ok(Ok(_)) => {}
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                return Ok(self.not_leader(f.leader_id));
            }
            Ok(Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e)))) => {
                return Err(RpcError::FailedPrecondition(e.to_string()));
            }
            Ok(Err(RaftError::Fatal(e))) => return Err(RpcError::Fatal(e.to_string())),
        }
        tracing::info!(node_id, "learner caught up; promoting to voter");
        self.change(ChangeMembers::AddVoterIds(BTreeSet::from([node_id]))).await
    }
}

#[tonic::async_trait]
impl pb::admin_service_server::AdminService for AdminSvc {
    async fn add_replica(&self, req: Request<pb::AddReplicaRequest>) -> Result<Response<pb::MembershipReply>, Status> {
        let who = Caller::of(&req);
        let req = req.into_inner();
        if req.node_id == 0 {
            return Err(RpcError::InvalidArgument("node_id must be > 0".into()).into());
        }
        if req
            .addr
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse::<u16>().ok())
            .is_none()
        {
            return Err(RpcError::InvalidArgument(format!("addr must be host:port, got {:?}", req.addr)).into());
        }
        if !self.is_leader() {
            return Ok(Response::new(self.not_leader(None)));
        }
        let used = self
            .ctx
            .state
            .read()
            .expect("state lock poisoned")
            .set
            .replica_ids_ever
            .contains(&NodeId(req.node_id));
        if used {
            return Err(RpcError::FailedPrecondition(format!(
                "node id {} was a member before; node ids are never reused, pick a new one",
                req.node_id
            ))
            .into());
        }
        let what = format!("add replica {} at {}", req.node_id, req.addr);
        let change = self.add_then_promote(req.node_id, req.addr);
        Ok(Response::new(self.audited(&who, &what, change).await?))
    }

    async fn remove_replica(
        &self,
        req: Request<pb::RemoveReplicaRequest>,
    ) -> Result<Response<pb::MembershipReply>, Status> {
        let who = Caller::of(&req);
        let req = req.into_inner();
        if !self.is_leader() {
            return Ok(Response::new(self.not_leader(None)));
        }
        let (is_voter, is_learner, voters) = {
            let m = self.ctx.raft.metrics().borrow().clone();
            let mem = m.membership_config.membership();
            let voters: Vec<u64> = mem.voter_ids().collect();
            (
                voters.contains(&req.node_id),
                mem.learner_ids().any(|l| l == req.node_id),
                voters.len(),
            )
        };
        let ids = BTreeSet::from([req.node_id]);
        let changes = if is_voter {
            if voters <= 1 {
                return Err(RpcError::FailedPrecondition("cannot remove the last voter".into()).into());
            }
            ChangeMembers::RemoveVoters(ids)
        } else if is_learner {
            ChangeMembers::RemoveNodes(ids)
        } else {
            return Err(RpcError::InvalidArgument(format!("node {} is not a member", req.node_id)).into());
        };
        tracing::info!(node_id = req.node_id, "removing replica");
        let what = format!("remove replica {}", req.node_id);
        Ok(Response::new(self.audited(&who, &what, self.change(changes)).await?))
    }

    async fn get_cluster_map(
        &self,
        req: Request<pb::GetClusterMapRequest>,
    ) -> Result<Response<pb::ClusterMapReply>, Status> {
        respond(serve(&self.ctx, Caller::of(&req), &Call::GetClusterMap).await)
    }

    async fn change_map(&self, req: Request<pb::ChangeMapRequest>) -> Result<Response<pb::ChangeMapReply>, Status> {
        let who = Caller::of(&req);
        respond(serve(&self.ctx, who, &Call::ChangeMap(req.into_inner())).await)
    }

    async fn range_step(&self, req: Request<pb::RangeStepRequest>) -> Result<Response<pb::RangeStepReply>, Status> {
        let who = Caller::of(&req);
        respond(serve(&self.ctx, who, &Call::RangeStep(req.into_inner())).await)
    }

    async fn drain_alloc_svr(
        &self,
        req: Request<pb::DrainAllocSvrRequest>,
    ) -> Result<Response<pb::DrainAllocSvrReply>, Status> {
        let who = Caller::of(&req);
        Ok(Response::new(self.drain(&who, req.into_inner().node_id).await?))
    }

    async fn publish_map(&self, req: Request<pb::PublishMapRequest>) -> Result<Response<pb::PublishMapReply>, Status> {
        let who = Caller::of(&req);
        respond(serve(&self.ctx, who, &Call::PublishMap(req.into_inner())).await)
    }

    async fn get_audit(&self, req: Request<pb::GetAuditRequest>) -> Result<Response<pb::GetAuditReply>, Status> {
        Ok(Response::new(audit::get_audit(&self.ctx, req.into_inner()).await?))
    }

    async fn export_status(
        &self,
        req: Request<pb::ExportStatusRequest>,
    ) -> Result<Response<pb::ExportStatusReply>, Status> {
        let who = Caller::of(&req);
        respond(serve(&self.ctx, who, &Call::ExportStatus(req.into_inner())).await)
    }

    type BackupStream = backup::BackupStream;

    async fn backup(&self, _req: Request<pb::BackupRequest>) -> Result<Response<Self::BackupStream>, Status> {
        Ok(Response::new(backup::backup(&self.ctx).await?))
    }
}
