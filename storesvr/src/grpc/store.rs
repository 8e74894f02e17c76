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
//! call checks, writes and answers is in `protocol` (shared with the deterministic
//! simulator); this module adds Raft, the route cache, logs and metrics.

use crate::domain::liveness::Liveness;
use crate::domain::ranges::RangeState;
use crate::domain::state::{NOBODY, SetParams, SetState};
use crate::error::RpcError;
use crate::protocol;
use crate::replica::{Led, ReplicaState};
use seqsvr_proto::{SectionId, pb};
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

    /// The route table of the current state, rebuilt only when its version changed.
    fn route_table(&self) -> Result<pb::RouteTable, RpcError> {
        self.ctx.data(|d| self.route_table_of(&d.set))
    }

    /// [`Self::route_table`] of a state the caller already holds.
    fn route_table_of(&self, set: &SetState) -> Result<pb::RouteTable, RpcError> {
        let mut cache = self.ctx.routes.lock().expect("routes lock poisoned");
        if let Some(t) = cache.as_ref().filter(|t| t.version == set.route_version) {
            return Ok(t.clone());
        }
        let t = build_routes(set).ok_or_else(|| RpcError::Unavailable("the set is not initialized yet".into()))?;
        *cache = Some(t.clone());
        Ok(t)
    }
}

/// Route table of a set: runs of sections with the same owner.
pub fn build_routes(set: &SetState) -> Option<pb::RouteTable> {
    let p = set.params.as_ref()?;
    let total = SectionId(p.total_sections());
    let mut entries = Vec::new();
    let mut at = SectionId(0);
    for run in set.owner_runs() {
        not_owned(set, p, at, run.begin, &mut entries);
        let rec = set.allocsvrs.get(&run.owner);
        entries.push(pb::RouteEntry {
            set_id: p.set_id,
            section_begin: run.begin.0,
            section_end: run.end.0,
            node_id: rec.map_or(0, |r| r.node_id.0),
            incarnation: rec.map_or(0, |r| r.incarnation.0),
            addr: rec.map(|r| r.addr.clone()).unwrap_or_default(),
        });
        at = run.end;
    }
    not_owned(set, p, at, total, &mut entries);
    Some(pb::RouteTable {
        version: set.route_version,
        section_size: p.section_size,
        uid_limit: p.uid_limit,
        entries,
        set_id: p.set_id,
    })
}

/// Route entries for sections `[begin, end)`, none of which the set owns. Clients accept only a
/// table that covers the whole uid space, so these are listed without an owner, under the set the
/// sections went to (or are known to be served by), `u64::MAX` when this set does not know.
fn not_owned(set: &SetState, p: &SetParams, begin: SectionId, end: SectionId, out: &mut Vec<pb::RouteEntry>) {
    let entry = |b: SectionId, e: SectionId, state: Option<RangeState>| {
        let set_id = match state {
            Some(RangeState::Migrating { to_set, .. } | RangeState::Tombstoned { to_set, .. }) => to_set,
            Some(RangeState::Importing { .. } | RangeState::Owned) => p.set_id,
            None => set.map.as_ref().and_then(|m| m.set_of(b)).unwrap_or(u64::MAX),
        };
        pb::RouteEntry {
            set_id,
            section_begin: b.0,
            section_end: e.0,
            ..Default::default()
        }
    };
    let mut at = begin;
    for run in set.ranges.runs_in(begin, end) {
        if at < run.begin {
            out.push(entry(at, run.begin, None));
        }
        out.push(entry(run.begin, run.end, Some(run.state)));
        at = run.end;
    }
    if at < end {
        out.push(entry(at, end, None));
    }
}

#[tonic::async_trait]
impl pb::store_service_server::StoreService for StoreSvc {
    async fn register(&self, req: Request<pb::RegisterRequest>) -> Result<Response<pb::RegisterReply>, Status> {
        let req = req.into_inner();
        let cmd = protocol::register_command(&req)?;
        let params = self.ctx.params()?;
        let result = match self.ctx.write(cmd).await? {
            Led::Elsewhere(hint) => {
                return Ok(Response::new(pb::RegisterReply {
                    not_leader: Some(hint),
                    ..Default::default()
                }));
            }
            Led::Here(result) => result,
        };
        let (incarnation, reply) = protocol::registered(
            result,
            &params,
            &mut self.ctx.view().liveness,
            ReplicaState::lease_now(),
        )?;
        tracing::info!(node_id = req.node_id, %incarnation, addr = %req.addr, "AllocSvr registered");
        Ok(Response::new(reply))
    }

    async fn renew(&self, req: Request<pb::RenewRequest>) -> Result<Response<pb::RenewReply>, Status> {
        let req = req.into_inner();
        if let Led::Elsewhere(hint) = self.ctx.linearizable().await? {
            return Ok(Response::new(pb::RenewReply {
                not_leader: Some(hint),
                ..Default::default()
            }));
        }
        // Two integers compared unless the AllocSvr is behind (after a map change only). A copy
        // that cannot be handed out must not cost the owner its lease: the renewal goes on without.
        let map = crate::grpc::moves::map_for(&self.ctx, &self.ctx.params()?, req.map_version).unwrap_or_else(|e| {
            tracing::error!(error = %e, "cluster map not handed out with a renewal");
            (req.map_version, None)
        });
        let reply = self.ctx.data(|d| {
            protocol::renew_reply(
                &d.set,
                &mut self.ctx.view(),
                &req,
                map,
                || self.route_table_of(&d.set),
                ReplicaState::lease_now(),
                self.ctx.config.unsafe_skip_binding,
            )
        })?;
        Ok(Response::new(reply))
    }

    async fn release(&self, req: Request<pb::ReleaseRequest>) -> Result<Response<pb::ReleaseReply>, Status> {
        let req = req.into_inner();
        let skip_binding = self.ctx.config.unsafe_skip_binding;
        let cmd = self
            .ctx
            .data(|d| protocol::release_command(&d.set, &req, skip_binding))?;
        match self.ctx.write(cmd).await? {
            Led::Elsewhere(hint) => Ok(Response::new(pb::ReleaseReply {
                not_leader: Some(hint),
                released: 0,
            })),
            Led::Here(result) => {
                let reply = protocol::released(&req, result)?;
                if reply.released > 0 {
                    self.ctx.arbiter_wake.notify_one();
                }
                tracing::info!(
                    incarnation = req.incarnation,
                    count = reply.released,
                    leaving = req.leaving,
                    "sections released"
                );
                Ok(Response::new(reply))
            }
        }
    }

    async fn bump(&self, req: Request<pb::BumpRequest>) -> Result<Response<pb::BumpReply>, Status> {
        let req = req.into_inner();
        let c = &self.ctx.config;
        let (skip_fence, skip_binding) = (c.unsafe_skip_epoch_fence, c.unsafe_skip_binding);
        let cmd = self
            .ctx
            .data(|d| protocol::bump_command(&d.set, &req, skip_fence, skip_binding))?;
        let started = Instant::now();
        match self.ctx.write(cmd).await? {
            Led::Elsewhere(hint) => Ok(Response::new(pb::BumpReply {
                not_leader: Some(hint),
                results: vec![],
            })),
            Led::Here(result) => {
                let reply = protocol::bumped(&req, result)?;
                metrics::counter!("storesvr_bump_items_total").increment(req.items.len() as u64);
                metrics::histogram!("storesvr_bump_seconds").record(started.elapsed().as_secs_f64());
                Ok(Response::new(reply))
            }
        }
    }

    async fn raise_marks(&self, req: Request<pb::RaiseMarksRequest>) -> Result<Response<pb::RaiseMarksReply>, Status> {
        let req = req.into_inner();
        let c = &self.ctx.config;
        let skips = (c.unsafe_rules().slots_unfenced(), c.unsafe_skip_binding);
        let max_ahead_ms = self.ctx.data(|d| d.set.ids.as_ref().map_or(0, |i| i.max_ahead_ms));
        let leader_ms = self.ctx.id_clock_ms(max_ahead_ms);
        let step = self
            .ctx
            .data(|d| protocol::ids::raise_step(&d.set, &req, leader_ms, skips))?;
        let reply = match step {
            // Answered from the applied state, but only by the leader: its clock is the one a
            // holder compares its own with.
            protocol::ids::RaiseStep::Answer(reply) => match self.ctx.leads() {
                true => {
                    metrics::counter!("storesvr_slot_raises_unwritten_total").increment(1);
                    reply
                }
                false => {
                    return Ok(Response::new(pb::RaiseMarksReply {
                        not_leader: Some(self.ctx.leader_hint(None)),
                        ..Default::default()
                    }));
                }
            },
            protocol::ids::RaiseStep::Propose(cmd) => match self.ctx.write(cmd).await? {
                Led::Elsewhere(hint) => {
                    return Ok(Response::new(pb::RaiseMarksReply {
                        not_leader: Some(hint),
                        ..Default::default()
                    }));
                }
                Led::Here(result) => {
                    // Raft entries that are not bumps: the benchmark's store-write bound counts them.
                    metrics::counter!("storesvr_slot_raises_total").increment(1);
                    protocol::ids::raised(&req, result, leader_ms)?
                }
            },
        };
        let ahead = reply
            .results
            .iter()
            .filter(|r| r.outcome == pb::RaiseOutcome::TooFarAhead as i32)
            .count();
        if ahead > 0 {
            metrics::counter!("storesvr_slot_raises_too_far_ahead_total").increment(ahead as u64);
            self.ctx.raise_capped_warning(req.incarnation);
        }
        Ok(Response::new(reply))
    }

    async fn load(&self, req: Request<pb::LoadRequest>) -> Result<Response<pb::LoadReply>, Status> {
        let req = req.into_inner();
        let p = self.ctx.params()?;
        let ranges = protocol::load_ranges(&p, &req)?;
        if let Led::Elsewhere(hint) = self.ctx.linearizable().await? {
            return Ok(Response::new(pb::LoadReply {
                not_leader: Some(hint),
                sections: vec![],
            }));
        }
        Ok(Response::new(
            self.ctx.data(|d| protocol::load_reply(&d.set, &p, &ranges))?,
        ))
    }

    async fn get_routes(&self, _req: Request<pb::GetRoutesRequest>) -> Result<Response<pb::GetRoutesReply>, Status> {
        self.check_restored()?;
        let routes = self.route_table()?;
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
        })
        .collect()
}
