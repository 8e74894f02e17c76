//! The client-facing `StoreService` (control plane for AllocSvrs and tools).
//!
//! Writes go through the batching writer; linearizable reads (`Renew`,
//! `Load`) pass openraft's ReadIndex (`ensure_linearizable`) before reading
//! the applied state, so they never see a deposed leader's stale view.
//! `GetRoutes` and `Status` read local state on any replica. A replica that is
//! not the leader answers leader-only calls with `not_leader` set.
//!
//! Bad input is refused before anything is proposed, and the state machine
//! checks again at apply time, so a refused request changes nothing.

use crate::domain::ranges::RangeState;
use crate::domain::state::{
    BumpItem, BumpOutcome, Command, CommandResult, NOBODY, Released, SetParams, SetState, Span,
};
use crate::error::RpcError;
use crate::shared::{Led, Shared};
use seqsvr_proto::{Epoch, Incarnation, NodeId, SectionId, pb};
use std::sync::Arc;
use std::time::Instant;
use tonic::{Request, Response, Status};

/// Most bump items in one request and most sections named by one Load: the shared table, so the
/// AllocSvr sends no more than this accepts and a reply always fits the client's decode limit.
pub use seqsvr_proto::limits::{MAX_BUMP_ITEMS, MAX_LOAD_SECTIONS};
/// Most sections one Release may name: all of the largest set (a leaving AllocSvr gives back
/// everything; the request names ranges, so its size does not grow with this).
const MAX_RELEASE_SECTIONS: u64 = seqsvr_proto::params::MAX_SECTIONS;
/// Longest accepted AllocSvr address.
const MAX_ADDR_LEN: usize = 256;

pub struct StoreSvc {
    pub ctx: Arc<Shared>,
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

    /// The sections the arbiter's latest plan asks `incarnation` to hand over.
    fn handover_of(&self, incarnation: Incarnation) -> Vec<pb::SectionRange> {
        let plan = self.ctx.plan.lock().expect("plan lock poisoned");
        let spans = plan.handover.get(&incarnation).map(Vec::as_slice).unwrap_or_default();
        spans
            .iter()
            .map(|span| pb::SectionRange {
                begin: span.begin.0,
                end: span.end.0,
            })
            .collect()
    }

    /// The route table of the current state, rebuilt only when its version changed.
    fn route_table(&self) -> Result<pb::RouteTable, RpcError> {
        let version = self.ctx.data(|d| d.set.route_version);
        let mut cache = self.ctx.routes.lock().expect("routes lock poisoned");
        if let Some(t) = cache.as_ref().filter(|t| t.version == version) {
            return Ok(t.clone());
        }
        let t = self
            .ctx
            .data(|d| build_routes(&d.set))
            .ok_or_else(|| RpcError::Unavailable("the set is not initialized yet".into()))?;
        *cache = Some(t.clone());
        Ok(t)
    }
}

/// A result the command cannot produce: a bug in this server, not a reason to retry.
/// The items of a Bump, checked against the limits and the set's sections.
fn check_bump_items(p: &SetParams, items: &[pb::BumpItem]) -> Result<Vec<BumpItem>, RpcError> {
    if items.is_empty() || items.len() > MAX_BUMP_ITEMS {
        return Err(RpcError::InvalidArgument(format!(
            "a bump needs 1..={MAX_BUMP_ITEMS} items, got {}",
            items.len()
        )));
    }
    items
        .iter()
        .map(|i| {
            if i.section >= p.total_sections() {
                return Err(RpcError::InvalidArgument(format!(
                    "unknown section {} (the uid space has sections [0, {}))",
                    i.section,
                    p.total_sections()
                )));
            }
            Ok(BumpItem {
                section: SectionId(i.section),
                epoch: Epoch(i.epoch),
                new_max: i.new_max,
            })
        })
        .collect()
}

fn unexpected(r: CommandResult) -> RpcError {
    RpcError::Internal(format!("unexpected state machine result {r:?}"))
}

/// The grants of `incarnation`, and whether ownership in the set is about to change: a move is
/// importing or exporting a range, or sections the set serves wait for an owner (the renewal then
/// asks for the next one soon).
fn grants_of(set: &SetState, incarnation: Incarnation) -> (Vec<pb::Grant>, bool) {
    let runs = set.runs();
    let renew_soon = runs.iter().any(|r| match r.range {
        RangeState::Importing { .. } | RangeState::Migrating { .. } => true,
        RangeState::Owned => r.state.owner == NOBODY,
        RangeState::Tombstoned { .. } => false,
    });
    let grants = runs
        .into_iter()
        .filter(|run| run.state.owner == incarnation)
        .map(|run| pb::Grant {
            section_begin: run.begin.0,
            section_end: run.end.0,
            epoch: run.state.epoch.0,
            no_wait: run.state.no_wait,
        })
        .collect();
    (grants, renew_soon)
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

pub(super) fn check_ranges(p: &SetParams, ranges: &[pb::SectionRange], limit: u64) -> Result<Vec<Span>, RpcError> {
    if ranges.is_empty() {
        return Err(RpcError::InvalidArgument("no sections given".into()));
    }
    let mut total = 0u64;
    let mut out = Vec::with_capacity(ranges.len());
    for r in ranges {
        if r.begin >= r.end || r.end > p.total_sections() {
            return Err(RpcError::InvalidArgument(format!(
                "section range [{}, {}) is empty or outside the uid space's sections [0, {})",
                r.begin,
                r.end,
                p.total_sections()
            )));
        }
        total += r.end - r.begin;
        if total > limit {
            return Err(RpcError::InvalidArgument(format!(
                "more than {limit} sections in one request"
            )));
        }
        out.push(Span {
            begin: SectionId(r.begin),
            end: SectionId(r.end),
        });
    }
    Ok(out)
}

/// Validates a Release's ranges like [`check_ranges`], keeping each range's epoch.
fn check_released(p: &SetParams, ranges: &[pb::ReleasedRange], limit: u64) -> Result<Vec<Released>, RpcError> {
    let plain: Vec<pb::SectionRange> = ranges
        .iter()
        .map(|r| pb::SectionRange {
            begin: r.begin,
            end: r.end,
        })
        .collect();
    check_ranges(p, &plain, limit)?;
    Ok(ranges
        .iter()
        .map(|r| Released {
            begin: SectionId(r.begin),
            end: SectionId(r.end),
            epoch: Epoch(r.epoch),
            waited: r.waited,
        })
        .collect())
}

/// Why a set refuses to load or serve a section it does not own, and where the caller should go.
fn not_owned_message(set_id: u64, section: SectionId, state: Option<RangeState>) -> String {
    match state {
        Some(RangeState::Tombstoned {
            to_set, map_version, ..
        }) => format!("section {section} moved from set {set_id} to set {to_set} (cluster map version {map_version})"),
        Some(RangeState::Migrating { to_set, .. }) => {
            format!("section {section} is being moved from set {set_id} to set {to_set}; retry shortly")
        }
        Some(RangeState::Importing { .. }) => {
            format!("section {section} is being moved into set {set_id}; retry shortly")
        }
        Some(RangeState::Owned) | None => format!("section {section} is not served by set {set_id}"),
    }
}

fn check_addr(addr: &str) -> Result<(), RpcError> {
    let ok = addr.len() <= MAX_ADDR_LEN
        && addr
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
    if ok {
        Ok(())
    } else {
        Err(RpcError::InvalidArgument(format!(
            "addr must be host:port, got {addr:?}"
        )))
    }
}

fn outcome_pb(o: BumpOutcome) -> i32 {
    match o {
        BumpOutcome::Applied => pb::BumpOutcome::Applied as i32,
        BumpOutcome::NoOp => pb::BumpOutcome::NoOp as i32,
        BumpOutcome::StaleEpoch => pb::BumpOutcome::StaleEpoch as i32,
        BumpOutcome::OutOfRange => pb::BumpOutcome::OutOfRange as i32,
        BumpOutcome::NotOwned => pb::BumpOutcome::NotOwned as i32,
    }
}

#[tonic::async_trait]
impl pb::store_service_server::StoreService for StoreSvc {
    async fn register(&self, req: Request<pb::RegisterRequest>) -> Result<Response<pb::RegisterReply>, Status> {
        let req = req.into_inner();
        if req.node_id == 0 {
            return Err(RpcError::InvalidArgument("node_id must be > 0".into()).into());
        }
        check_addr(&req.addr)?;
        let params = self.ctx.params()?;
        let incarnation = match self
            .ctx
            .write(Command::Register {
                node_id: NodeId(req.node_id),
                addr: req.addr.clone(),
                nonce: req.nonce,
            })
            .await?
        {
            Led::Elsewhere(hint) => {
                return Ok(Response::new(pb::RegisterReply {
                    not_leader: Some(hint),
                    ..Default::default()
                }));
            }
            Led::Here(CommandResult::Registered { incarnation }) => incarnation,
            Led::Here(other) => return Err(unexpected(other).into()),
        };
        self.ctx
            .liveness
            .lock()
            .expect("liveness lock poisoned")
            .registered(incarnation, Instant::now());
        tracing::info!(node_id = req.node_id, %incarnation, addr = %req.addr, "AllocSvr registered");
        Ok(Response::new(pb::RegisterReply {
            not_leader: None,
            incarnation: incarnation.0,
            params: Some(params.to_pb()),
        }))
    }

    async fn renew(&self, req: Request<pb::RenewRequest>) -> Result<Response<pb::RenewReply>, Status> {
        let req = req.into_inner();
        let incarnation = Incarnation(req.incarnation);
        if let Led::Elsewhere(hint) = self.ctx.linearizable().await? {
            return Ok(Response::new(pb::RenewReply {
                not_leader: Some(hint),
                ..Default::default()
            }));
        }
        let (known, route_version, (grants, renew_soon)) = self.ctx.data(|d| {
            let known = d.set.allocsvrs.contains_key(&incarnation);
            (known, d.set.route_version, grants_of(&d.set, incarnation))
        });
        if !known {
            return Ok(Response::new(pb::RenewReply {
                status: pb::RenewStatus::UnknownIncarnation as i32,
                route_version,
                ..Default::default()
            }));
        }
        // Two integers compared unless the AllocSvr is behind (after a map change only). A copy
        // that cannot be handed out must not cost the owner its lease: the renewal goes on without.
        let (map_version, map) = crate::grpc::moves::map_for(&self.ctx, &self.ctx.params()?, req.map_version)
            .unwrap_or_else(|e| {
                tracing::error!(error = %e, "cluster map not handed out with a renewal");
                (req.map_version, None)
            });
        self.ctx
            .liveness
            .lock()
            .expect("liveness lock poisoned")
            .record(incarnation, Instant::now());
        let handover = self.handover_of(incarnation);
        // ...or just changed (a move's switch and its map copies follow its install and freeze).
        let renew_soon = renew_soon
            || self
                .ctx
                .last_change
                .lock()
                .expect("last-change lock poisoned")
                .recent((route_version, map_version), Instant::now());
        let routes = if req.route_version < route_version {
            Some(self.route_table()?)
        } else {
            None
        };
        Ok(Response::new(pb::RenewReply {
            not_leader: None,
            status: pb::RenewStatus::Ok as i32,
            grants,
            handover,
            route_version,
            routes,
            map_version,
            map,
            renew_soon,
        }))
    }

    async fn release(&self, req: Request<pb::ReleaseRequest>) -> Result<Response<pb::ReleaseReply>, Status> {
        let req = req.into_inner();
        let p = self.ctx.params()?;
        let ranges = if req.leaving && req.sections.is_empty() {
            Vec::new()
        } else {
            check_released(&p, &req.sections, MAX_RELEASE_SECTIONS)?
        };
        match self
            .ctx
            .write(Command::Release {
                incarnation: Incarnation(req.incarnation),
                ranges,
                leaving: req.leaving,
            })
            .await?
        {
            Led::Elsewhere(hint) => Ok(Response::new(pb::ReleaseReply {
                not_leader: Some(hint),
                released: 0,
            })),
            Led::Here(CommandResult::Released { count }) => {
                tracing::info!(
                    incarnation = req.incarnation,
                    count,
                    leaving = req.leaving,
                    "sections released"
                );
                Ok(Response::new(pb::ReleaseReply {
                    not_leader: None,
                    released: count,
                }))
            }
            Led::Here(CommandResult::UnknownIncarnation) => Err(RpcError::FailedPrecondition(format!(
                "incarnation {} is not registered (superseded or expired): register again",
                req.incarnation
            ))
            .into()),
            Led::Here(other) => Err(unexpected(other).into()),
        }
    }

    async fn bump(&self, req: Request<pb::BumpRequest>) -> Result<Response<pb::BumpReply>, Status> {
        let req = req.into_inner();
        let items = check_bump_items(&self.ctx.params()?, &req.items)?;
        // `--unsafe-skip-epoch-fence` (negative control) removes this check too: it is the fence
        // against an owner the arbiter declared dead (see `SetState::bump`).
        let incarnation = Incarnation(req.incarnation);
        if !self.ctx.config.unsafe_skip_epoch_fence && !self.ctx.data(|d| d.set.allocsvrs.contains_key(&incarnation)) {
            return Err(RpcError::FailedPrecondition(format!(
                "unknown incarnation {}: register first",
                req.incarnation
            ))
            .into());
        }
        let started = Instant::now();
        let n = items.len();
        match self.ctx.write(Command::Bump { incarnation, items }).await? {
            Led::Elsewhere(hint) => Ok(Response::new(pb::BumpReply {
                not_leader: Some(hint),
                results: vec![],
            })),
            Led::Here(CommandResult::Bumped(results)) => {
                metrics::counter!("storesvr_bump_items_total").increment(n as u64);
                metrics::histogram!("storesvr_bump_seconds").record(started.elapsed().as_secs_f64());
                let results = results
                    .into_iter()
                    .map(|r| pb::BumpResult {
                        section: r.section.0,
                        outcome: outcome_pb(r.outcome),
                        max_seq: r.max_seq,
                        epoch: r.epoch.0,
                    })
                    .collect();
                Ok(Response::new(pb::BumpReply {
                    not_leader: None,
                    results,
                }))
            }
            Led::Here(CommandResult::UnknownIncarnation) => Err(RpcError::FailedPrecondition(format!(
                "unknown incarnation {}: register first",
                req.incarnation
            ))
            .into()),
            Led::Here(CommandResult::Invalid(m)) => Err(RpcError::InvalidArgument(m).into()),
            Led::Here(other) => Err(unexpected(other).into()),
        }
    }

    async fn load(&self, req: Request<pb::LoadRequest>) -> Result<Response<pb::LoadReply>, Status> {
        let req = req.into_inner();
        let p = self.ctx.params()?;
        let ranges = check_ranges(&p, &req.sections, MAX_LOAD_SECTIONS)?;
        if let Led::Elsewhere(hint) = self.ctx.linearizable().await? {
            return Ok(Response::new(pb::LoadReply {
                not_leader: Some(hint),
                sections: vec![],
            }));
        }
        let sections = self.ctx.data(|d| {
            // Only an owned section is loaded: an owner of a frozen or moved one would serve it.
            if let Some((section, state)) = ranges.iter().find_map(|span| d.set.first_not_owned(*span)) {
                return Err(RpcError::FailedPrecondition(not_owned_message(
                    p.set_id, section, state,
                )));
            }
            Ok(ranges
                .iter()
                .flat_map(|span| d.set.sections_in(span.begin, span.end))
                .map(|(section, s)| pb::SectionState {
                    section: section.0,
                    max_seq: s.max_seq,
                    epoch: s.epoch.0,
                    owner_incarnation: s.owner.0,
                })
                .collect())
        })?;
        Ok(Response::new(pb::LoadReply {
            not_leader: None,
            sections,
        }))
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
        let now = Instant::now();
        let detect = self.ctx.detect();
        let reply = self.ctx.data(|d| {
            let live = self.ctx.liveness.lock().expect("liveness lock poisoned");
            let alive = crate::domain::liveness::alive(&d.set, &live, now, detect);
            let allocsvrs = d
                .set
                .allocsvrs
                .values()
                .map(|r| pb::AllocSvrInfo {
                    node_id: r.node_id.0,
                    incarnation: r.incarnation.0,
                    addr: r.addr.clone(),
                    alive: alive.renewing.contains(&r.incarnation),
                    last_renew_ms_ago: live
                        .last_seen(r.incarnation)
                        .map_or(0, |t| now.saturating_duration_since(t).as_millis() as u64),
                    sections_owned: d.set.sections.iter().filter(|s| s.owner == r.incarnation).count() as u64,
                })
                .collect();
            pb::StatusReply {
                node_id: self.ctx.node_id,
                set_id: self.ctx.config.set_id,
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
            }
        });
        let applied = self.ctx.data(|d| d.last_applied.map(|l| l.index));
        self.expose(applied).await?;
        Ok(Response::new(reply))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_machine_surprise_is_internal_not_retryable() {
        let status = Status::from(unexpected(CommandResult::Released { count: 0 }));
        assert_eq!(status.code(), tonic::Code::Internal, "{status:?}");
    }
}
