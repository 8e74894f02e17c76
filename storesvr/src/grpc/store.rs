//! The client-facing `StoreService` (control plane for AllocSvrs and tools).
//!
//! Writes go through the batching writer; linearizable reads (`Renew`,
//! `Load`) pass openraft's ReadIndex (`ensure_linearizable`) before reading
//! the applied state, so they never see a deposed leader's stale view.
//! `GetRoutes` and `Status` read local state on any replica. A replica that is
//! not the leader answers leader-only calls with `not_leader` set.
//!
//! Bad input is refused before anything is proposed, and the state machine
//! checks again at apply time, so a refused request changes nothing. What each
//! call checks, writes and answers is decided by `protocol::step` (shared with the
//! deterministic simulator), through `serve`; this module adds each call's logs and metrics.

use crate::domain::liveness::Liveness;
use crate::domain::state::{NOBODY, SetParams, SetState};
use crate::error::RpcError;
use crate::grpc::serve::{Served, respond, serve};
use crate::protocol::{Reply, Request as Call};
use crate::replica::ReplicaState;
use seqsvr_auth::Caller;
use seqsvr_proto::pb;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::{Request, Response, Status};

pub use crate::protocol::{MAX_BUMP_ITEMS, MAX_LOAD_SECTIONS};

pub struct StoreSvc {
    pub ctx: Arc<ReplicaState>,
}

impl StoreSvc {
    /// Before a local read shows state applied up to `applied`, make that commit index durable,
    /// so that this replica never shows an older state after a crash (see `Durability`).
    async fn expose(&self, applied: Option<u64>) -> Result<(), RpcError> {
        match applied {
            None => Ok(()),
            Some(index) => self
                .ctx
                .durability
                .make_durable(index)
                .await
                .map_err(|e| RpcError::Unavailable(format!("cannot persist the commit index: {e}"))),
        }
    }

    fn applied(&self) -> Option<u64> {
        self.ctx.data(|d| d.last_applied.map(|l| l.index))
    }

    fn check_restored(&self) -> Result<(), RpcError> {
        if self.ctx.is_restored() {
            Ok(())
        } else {
            Err(RpcError::Unavailable(
                "this replica is restoring its state after a restart (waiting for a leader's commit index)".into(),
            ))
        }
    }
}

#[tonic::async_trait]
impl pb::store_service_server::StoreService for StoreSvc {
    async fn register(&self, req: Request<pb::RegisterRequest>) -> Result<Response<pb::RegisterReply>, Status> {
        let who = Caller::of(&req);
        let q = req.into_inner();
        let (node_id, addr) = (q.node_id, q.addr.clone());
        let served = serve(&self.ctx, who, &Call::Register(q)).await;
        if let Ok(Served::Committed(Reply::Register(r))) = &served {
            let incarnation = r.incarnation;
            tracing::info!(node_id, %incarnation, %addr, "AllocSvr registered");
        }
        respond(served)
    }

    async fn renew(&self, req: Request<pb::RenewRequest>) -> Result<Response<pb::RenewReply>, Status> {
        let who = Caller::of(&req);
        respond(serve(&self.ctx, who, &Call::Renew(req.into_inner())).await)
    }

    async fn release(&self, req: Request<pb::ReleaseRequest>) -> Result<Response<pb::ReleaseReply>, Status> {
        let who = Caller::of(&req);
        let q = req.into_inner();
        let (incarnation, leaving) = (q.incarnation, q.leaving);
        let served = serve(&self.ctx, who, &Call::Release(q)).await;
        if let Ok(Served::Committed(Reply::Release(r))) = &served {
            if r.released > 0 {
                self.ctx.arbiter_wake.notify_one();
            }
            tracing::info!(incarnation, count = r.released, leaving, "sections released");
        }
        respond(served)
    }

    async fn bump(&self, req: Request<pb::BumpRequest>) -> Result<Response<pb::BumpReply>, Status> {
        let who = Caller::of(&req);
        let q = req.into_inner();
        let items = q.items.len() as u64;
        let started = Instant::now();
        let served = serve(&self.ctx, who, &Call::Bump(q)).await;
        if let Ok(Served::Committed(_)) = &served {
            metrics::counter!("storesvr_bump_items_total").increment(items);
            metrics::histogram!("storesvr_bump_seconds").record(started.elapsed().as_secs_f64());
        }
        respond(served)
    }

    async fn raise_marks(&self, req: Request<pb::RaiseMarksRequest>) -> Result<Response<pb::RaiseMarksReply>, Status> {
        let who = Caller::of(&req);
        let q = req.into_inner();
        let incarnation = q.incarnation;
        let served = serve(&self.ctx, who, &Call::RaiseMarks(q)).await;
        let reply = match &served {
            // Raft entries that are not bumps: the benchmark's store-write bound counts them.
            Ok(Served::Committed(Reply::RaiseMarks(r))) => {
                metrics::counter!("storesvr_slot_raises_total").increment(1);
                r
            }
            Ok(Served::Answered(Reply::RaiseMarks(r))) => {
                metrics::counter!("storesvr_slot_raises_unwritten_total").increment(1);
                r
            }
            _ => return respond(served),
        };
        let ahead = reply
            .results
            .iter()
            .filter(|r| r.outcome == pb::RaiseOutcome::TooFarAhead as i32)
            .count();
        if ahead > 0 {
            metrics::counter!("storesvr_slot_raises_too_far_ahead_total").increment(ahead as u64);
            self.ctx.raise_capped_warning(incarnation);
        }
        respond(served)
    }

    async fn load(&self, req: Request<pb::LoadRequest>) -> Result<Response<pb::LoadReply>, Status> {
        let who = Caller::of(&req);
        respond(serve(&self.ctx, who, &Call::Load(req.into_inner())).await)
    }

    async fn get_routes(&self, _req: Request<pb::GetRoutesRequest>) -> Result<Response<pb::GetRoutesReply>, Status> {
        self.check_restored()?;
        let routes = self.ctx.data(|d| self.ctx.route_table(&d.set))?;
        // Read after the table: applied only grows, so this covers the state the table came from.
        self.expose(self.applied()).await?;
        Ok(Response::new(pb::GetRoutesReply { routes: Some(routes) }))
    }

    async fn status(&self, _req: Request<pb::StatusRequest>) -> Result<Response<pb::StatusReply>, Status> {
        self.check_restored()?;
        let m = self.ctx.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: Vec<u64> = membership.voter_ids().collect();
        let members = membership
            .nodes()
            .map(|(id, n)| pb::ReplicaInfo {
                node_id: *id,
                addr: n.addr.clone(),
                voter: voters.contains(id),
            })
            .collect();
        let leader_id = m.current_leader.unwrap_or(0);
        let leader_addr = membership
            .get_node(&leader_id)
            .map(|n| n.addr.clone())
            .unwrap_or_default();
        let now = ReplicaState::lease_now();
        let detect = self.ctx.detect();
        let reply = self.ctx.data(|d| {
            let allocsvrs = allocsvr_infos(&d.set, &self.ctx.view().liveness, now, detect);
            pb::StatusReply {
                node_id: self.ctx.node_id,
                set_id: self.ctx.config.set_id,
                group_id: self.ctx.identity.group(),
                leader_id,
                leader_addr,
                term: m.current_term,
                // openraft 0.9 does not publish the committed index; the leader's
                // applied index equals it once applied, followers trail by one heartbeat.
                committed_index: m.last_applied.map_or(0, |l| l.index),
                applied_index: d.last_applied.map_or(0, |l| l.index),
                last_log_index: m.last_log_index.unwrap_or(0),
                members,
                allocsvrs,
                route_version: d.set.route_version,
                sections_total: d.set.sections.len() as u64,
                sections_owned: d.set.sections.iter().filter(|s| s.owner != NOBODY).count() as u64,
                max_seq_high: d.set.sections.iter().map(|s| s.max_seq).max().unwrap_or(0),
                params: d.set.params.as_ref().map(SetParams::to_pb),
                max_seq_sum: d.set.max_seq_sum(),
                ids: d.set.ids.as_ref().map(|i| i.setup_pb()),
                slots_held: d
                    .set
                    .ids
                    .as_ref()
                    .map_or(0, |i| i.iter().filter(|(_, s)| s.holder != NOBODY).count() as u64),
                first_slot: d.set.ids.as_ref().map_or(0, |i| i.first),
                version: seqsvr_plumbing::version::LONG.into(),
            }
        });
        let applied = self.ctx.data(|d| d.last_applied.map(|l| l.index));
        self.expose(applied).await?;
        Ok(Response::new(reply))
    }
}

/// What `Status` says of each AllocSvr incarnation the set knows, as this replica sees it now.
fn allocsvr_infos(set: &SetState, live: &Liveness, now: Instant, detect: Duration) -> Vec<pb::AllocSvrInfo> {
    let alive = crate::domain::liveness::alive(set, live, now, detect);
    set.allocsvrs
        .values()
        .map(|r| pb::AllocSvrInfo {
            node_id: r.node_id.0,
            incarnation: r.incarnation.0,
            addr: r.addr.clone(),
            alive: alive.renewing.contains(&r.incarnation),
            last_renew_ms_ago: live
                .last_seen(r.incarnation)
                .map_or(0, |t| now.saturating_duration_since(t).as_millis() as u64),
            sections_owned: set.sections.iter().filter(|s| s.owner == r.incarnation).count() as u64,
            version: live.version(r.incarnation).to_owned(),
        })
        .collect()
}
