//! The StoreService's ownership-protocol calls as plain functions (sans-IO): each checks a
//! request, builds the command a Raft write carries, and turns the applied result (or the applied
//! state, for the linearizable reads) into the reply, given `now` and the leader's in-memory view.
//!
//! [`step()`] and [`committed`] (in `step.rs`) dispatch a request to these functions; two drivers
//! call them: the gRPC services (`grpc::serve`), which put openraft's writes and ReadIndex
//! between the steps, and the deterministic simulator (`sim dst`), which puts a simulated Raft
//! group there. Whatever decides what an AllocSvr is told lives here, so both run the same code.
//! The route table a set hands out is built in `routes`.
//!
//! Every call an incarnation makes after its Register (Renew, Release, Bump) is checked against
//! the secret that incarnation registered with (`domain::binding`) before anything is proposed or
//! answered, and refused with UNAUTHENTICATED when it does not carry it. UNAUTHENTICATED rather
//! than PERMISSION_DENIED: the TLS role check answers PERMISSION_DENIED to a caller whose role may
//! not call the method at all; here the caller failed to prove it is the incarnation it names,
//! and an operator reading either code in a log should know which check spoke.
//!
//! Deliberately left out: Raft itself (writes, read index, leader hints), the route-table cache
//! and the cluster map copy, which need a replica's IO; the callers pass their results in.

use std::time::{Duration, Instant};

use seqsvr_proto::{Epoch, Incarnation, NodeId, SectionId, pb};

use crate::domain::arbiter::{self, Plan};
use crate::domain::binding::{MAX_SECRET_BYTES, MIN_SECRET_BYTES, SecretHash, Verdict};
use crate::domain::liveness::{self, Liveness};
use crate::domain::ranges::RangeState;
use crate::domain::state::{
    BumpItem, BumpOutcome, Command, CommandResult, NOBODY, Released, SetParams, SetState, Span, UnsafeRules,
};
use crate::error::RpcError;

pub mod ids;
pub mod ledger;
pub mod moves;
#[cfg(test)]
mod props;
pub mod routes;
mod step;

pub use step::{CallReply, ReplicaView, Reply, Request, Step, Switches, committed, step};

/// Most bump items in one request and most sections named by one Load: the shared table, so the
/// AllocSvr sends no more than this accepts and a reply always fits the client's decode limit.
pub use seqsvr_proto::limits::{MAX_BUMP_ITEMS, MAX_LOAD_SECTIONS};
/// Most sections one Release may name: all of the largest set (a leaving AllocSvr gives back
/// everything; the request names ranges, so its size does not grow with this).
const MAX_RELEASE_SECTIONS: u64 = seqsvr_proto::params::MAX_SECTIONS;
/// Longest accepted AllocSvr address.
const MAX_ADDR_LEN: usize = 256;

/// How long after a change of the set's routes or map the AllocSvrs are asked to renew soon: long
/// enough to cover a move's switch and its map publication after the install or freeze that
/// started it; short enough that a steady set renews once per interval.
pub const CHANGE_WINDOW: Duration = Duration::from_secs(1);

/// What only the current leader knows, in memory: whom it heard from, its arbiter's last plan,
/// since when that plan has asked for handovers, and when the versions renewals see last changed.
/// A new leadership starts it over.
#[derive(Debug, Default)]
pub struct LeaderView {
    pub liveness: Liveness,
    pub plan: Plan,
    /// Since when the arbiter's plans have asked for at least one handover (`None`: none asked).
    pub handover_since: Option<Instant>,
    pub last_change: LastChange,
}

impl LeaderView {
    /// Whether renewals may already ask owners to hand sections over: once the plan has asked for
    /// handovers for one renew interval. A planned handover makes every renewal answer
    /// `renew_soon`, and by then every live AllocSvr has renewed once since and polls every
    /// `RENEW_SOON`, so the one that will gain a section learns of its grant within that, instead
    /// of up to a whole renew interval after the previous owner stopped serving it (measured by
    /// `takeover-bench`: that wait was most of a takeover's no-serve window). The handover itself
    /// starts up to one renew interval later; what callers see is the shorter gap.
    fn may_ask_handover(&self, now: Instant, renew_interval: Duration) -> bool {
        self.handover_since
            .is_some_and(|since| now.saturating_duration_since(since) >= renew_interval)
    }
}

/// The route and map versions renewals were last answered with, and when that pair last changed
/// (leader-local: a new leader starts from its first renewal).
#[derive(Debug, Default)]
pub struct LastChange {
    versions: (u64, u64),
    at: Option<Instant>,
}

impl LastChange {
    /// Notes the versions a renewal is answered with at `now`; true while the last change is less
    /// than [`CHANGE_WINDOW`] old.
    pub fn recent(&mut self, versions: (u64, u64), now: Instant) -> bool {
        if self.versions != versions || self.at.is_none() {
            self.versions = versions;
            self.at = Some(now);
        }
        self.at
            .is_some_and(|at| now.saturating_duration_since(at) < CHANGE_WINDOW)
    }
}

/// The set's parameters, or why there are none yet.
pub fn params_of(set: &SetState) -> Result<SetParams, RpcError> {
    set.params
        .clone()
        .ok_or_else(|| RpcError::Unavailable("the set is not initialized yet (waiting for bootstrap)".into()))
}

/// A result the command cannot produce: a bug in this server, not a reason to retry.
pub fn unexpected(r: CommandResult) -> RpcError {
    RpcError::Internal(format!("unexpected state machine result {r:?}"))
}

// ---- Binding: every call of an incarnation after its Register ----

/// What a call of `incarnation` proves: the hash of the secret it carries, for its command to
/// carry (`Command::Bound`), or `None` when it carries none. A call naming a bound incarnation
/// without its secret is refused here, before anything is proposed or answered; the state machine
/// checks again when it applies the command, so a call checked against a lagging state cannot
/// slip through. `skip` is the negative control `--unsafe-skip-binding`.
pub fn binding(
    set: &SetState,
    call: &'static str,
    incarnation: u64,
    secret: &[u8],
    skip: bool,
) -> Result<Option<SecretHash>, RpcError> {
    if secret.len() > MAX_SECRET_BYTES {
        return Err(RpcError::InvalidArgument(format!(
            "a secret is at most {MAX_SECRET_BYTES} bytes, got {}",
            secret.len()
        )));
    }
    let presented = (!secret.is_empty()).then(|| SecretHash::of(secret));
    if skip || set.bindings.check(Incarnation(incarnation), presented.as_ref()) != Verdict::Refused {
        return Ok(presented);
    }
    Err(not_bound(call, incarnation))
}

/// The refusal of a call that does not carry its incarnation's secret, logged: it is either an
/// attack or a bug worth seeing.
fn not_bound(call: &'static str, incarnation: u64) -> RpcError {
    // Counted as well as logged: an alert can watch the count, and a log line per forged call
    // is what an operator greps for once it fires.
    metrics::counter!("storesvr_unbound_calls_total", "call" => call).increment(1);
    tracing::warn!(
        call,
        incarnation,
        "refused: the call does not carry the secret its incarnation registered with"
    );
    RpcError::Unauthenticated(format!(
        "{call} refused: incarnation {incarnation} registered with a secret and this call does not carry it; \
         only the process that registered it may renew, release or bump in its name"
    ))
}

/// `cmd`, made under the hash of the caller's secret when it gave one.
fn under(presented: Option<SecretHash>, cmd: Command) -> Command {
    match presented {
        Some(secret_hash) => Command::Bound {
            secret_hash,
            cmd: Box::new(cmd),
        },
        None => cmd,
    }
}

// ---- Register ----

/// The write a Register asks for: bound to the caller's secret, or (an AllocSvr from before the
/// binding, which sends none) unbound, with a warning: anyone may then act in its name.
pub fn register_command(req: &pb::RegisterRequest) -> Result<Command, RpcError> {
    if req.node_id == 0 {
        return Err(RpcError::InvalidArgument("node_id must be > 0".into()));
    }
    check_addr(&req.addr)?;
    let cmd = Command::Register {
        node_id: NodeId(req.node_id),
        addr: req.addr.clone(),
        nonce: req.nonce,
    };
    if req.secret.is_empty() {
        tracing::warn!(
            node_id = req.node_id,
            "an AllocSvr registers without a secret (older version): anyone who reaches the leader can renew, \
             release or bump in its name until it restarts on a version that sends one"
        );
        return Ok(cmd);
    }
    if !(MIN_SECRET_BYTES..=MAX_SECRET_BYTES).contains(&req.secret.len()) {
        return Err(RpcError::InvalidArgument(format!(
            "a secret is {MIN_SECRET_BYTES}..={MAX_SECRET_BYTES} bytes, got {}",
            req.secret.len()
        )));
    }
    Ok(under(Some(SecretHash::of(&req.secret)), cmd))
}

/// The reply to a committed Register; the new incarnation's detection clock starts at `now`.
pub fn registered(
    result: CommandResult,
    params: &SetParams,
    live: &mut Liveness,
    now: Instant,
) -> Result<(Incarnation, pb::RegisterReply), RpcError> {
    let CommandResult::Registered { incarnation } = result else {
        return Err(unexpected(result));
    };
    live.registered(incarnation, now);
    Ok((
        incarnation,
        pb::RegisterReply {
            not_leader: None,
            incarnation: incarnation.0,
            params: Some(params.to_pb()),
        },
    ))
}

// ---- Renew (a linearizable read) ----

/// The reply to a renewal, read from the applied state once the read index passed. `map` is the
/// cluster map part (version, and the map when the caller is behind); `routes` builds the table
/// when the caller's is older. Records the renewal in the leader's liveness, unless it does not
/// carry its incarnation's secret (a forged renewal would keep a dead owner's sections from
/// being reassigned); `rules.skip_binding` is the negative control. A forced grant carries what
/// is left of its earlier owners' leases (`Grant.wait_ms`, [`Liveness::predecessor_wait`]),
/// computed after this renewal was recorded.
pub fn renew_reply(
    set: &SetState,
    view: &mut LeaderView,
    req: &pb::RenewRequest,
    map: (u64, Option<pb::ClusterMap>),
    routes: impl FnOnce() -> Result<pb::RouteTable, RpcError>,
    now: Instant,
    rules: UnsafeRules,
) -> Result<pb::RenewReply, RpcError> {
    binding(set, "Renew", req.incarnation, &req.secret, rules.skip_binding)?;
    let incarnation = Incarnation(req.incarnation);
    let route_version = set.route_version;
    if !set.allocsvrs.contains_key(&incarnation) {
        return Ok(pb::RenewReply {
            status: pb::RenewStatus::UnknownIncarnation as i32,
            route_version,
            ..Default::default()
        });
    }
    view.liveness.record(incarnation, now);
    let wait = set.params.as_ref().and_then(|p| {
        let registered = |i| set.allocsvrs.contains_key(&i);
        let from_first = rules.predecessor_wait_from_first_renewal;
        view.liveness
            .predecessor_wait(registered, now, liveness::whole_wait(p), from_first)
    });
    let (grants, moving) = grants_of(set, incarnation, wait);
    let (map_version, map) = map;
    view.liveness.want_slots(incarnation, req.id_slots_wanted);
    view.liveness.report_version(incarnation, &req.version);
    let renew_interval = Duration::from_millis(set.params.as_ref().map_or(0, |p| p.renew_interval_ms));
    let mut handover = if view.may_ask_handover(now, renew_interval) {
        handover_of(&view.plan, incarnation)
    } else {
        Vec::new()
    };
    // A frozen section is asked back at once, whatever the plan says: it is granted under its
    // new epoch only so that its owner can release it under that epoch, and an owner not asked
    // to hand it over would take it as a gain and try to Load it, refused every RENEW_SOON.
    handover.extend(frozen_of(set, incarnation));
    // ...or is planned (see `may_ask_handover`), or just changed (a move's switch and its map
    // copies follow its install and freeze).
    let renew_soon =
        moving || view.handover_since.is_some() || view.last_change.recent((route_version, map_version), now);
    let routes = if req.route_version < route_version {
        Some(routes()?)
    } else {
        None
    };
    let (id_layout, id_max_ahead_ms, slots) = ids::slots_of(set, incarnation);
    Ok(pb::RenewReply {
        id_layout,
        id_max_ahead_ms,
        id_slots_per_set: set.ids.as_ref().map_or(0, |i| i.per_set),
        slots,
        not_leader: None,
        status: pb::RenewStatus::Ok as i32,
        grants,
        handover,
        route_version,
        routes,
        map_version,
        map,
        renew_soon,
    })
}

/// The grants of `incarnation`, and whether ownership in the set is about to change: a move is
/// importing or exporting a range, or sections the set serves wait for an owner (the renewal then
/// asks for the next one soon). `wait` is what is left of earlier owners' leases, sent with every
/// grant that must wait them out (`None`: the whole wait).
fn grants_of(set: &SetState, incarnation: Incarnation, wait: Option<Duration>) -> (Vec<pb::Grant>, bool) {
    // Rounded up: the new owner must never wait less than the leader computed.
    let wait_ms = wait.map(|w| u32::try_from(w.as_nanos().div_ceil(1_000_000)).unwrap_or(u32::MAX));
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
            wait_ms: if run.state.no_wait { None } else { wait_ms },
        })
        .collect();
    (grants, renew_soon)
}

/// The sections `incarnation` owns that a move has frozen. Only the frozen ranges are walked
/// (none, almost always): a renewal must not scan every section of a big set.
fn frozen_of(set: &SetState, incarnation: Incarnation) -> Vec<pb::SectionRange> {
    let mut out: Vec<pb::SectionRange> = Vec::new();
    for frozen in set
        .ranges
        .runs()
        .filter(|r| matches!(r.state, RangeState::Migrating { .. }))
    {
        for (section, s) in set.sections_in(frozen.begin, frozen.end) {
            if s.owner != incarnation {
                continue;
            }
            match out.last_mut() {
                Some(last) if last.end == section.0 => last.end += 1,
                _ => out.push(pb::SectionRange {
                    begin: section.0,
                    end: section.0 + 1,
                }),
            }
        }
    }
    out
}

/// The sections the arbiter's latest plan asks `incarnation` to hand over.
fn handover_of(plan: &Plan, incarnation: Incarnation) -> Vec<pb::SectionRange> {
    let spans = plan.handover.get(&incarnation).map(Vec::as_slice).unwrap_or_default();
    spans
        .iter()
        .map(|span| pb::SectionRange {
            begin: span.begin.0,
            end: span.end.0,
        })
        .collect()
}

// ---- Release ----

/// The write a Release asks for, made under the caller's secret (see [`binding`]).
pub fn release_command(set: &SetState, req: &pb::ReleaseRequest, skip_binding: bool) -> Result<Command, RpcError> {
    let p = params_of(set)?;
    let ranges = if req.leaving && req.sections.is_empty() {
        Vec::new()
    } else {
        check_released(&p, &req.sections, MAX_RELEASE_SECTIONS)?
    };
    let presented = binding(set, "Release", req.incarnation, &req.secret, skip_binding)?;
    let cmd = Command::Release {
        incarnation: Incarnation(req.incarnation),
        ranges,
        leaving: req.leaving,
    };
    Ok(under(presented, cmd))
}

/// The reply to a committed Release.
pub fn released(req: &pb::ReleaseRequest, result: CommandResult) -> Result<pb::ReleaseReply, RpcError> {
    match result {
        CommandResult::Released { count } => Ok(pb::ReleaseReply {
            not_leader: None,
            released: count,
        }),
        CommandResult::UnknownIncarnation => Err(RpcError::FailedPrecondition(format!(
            "incarnation {} is not registered (superseded or expired): register again",
            req.incarnation
        ))),
        CommandResult::NotBound => Err(not_bound("Release", req.incarnation)),
        other => Err(unexpected(other)),
    }
}

// ---- Bump ----

/// The write a Bump asks for, made under the caller's secret (see [`binding`]). An incarnation
/// the set does not know is refused before anything is proposed; `skip_epoch_fence` (negative
/// control) removes that check, which is the fence against an owner the arbiter declared dead
/// (see `SetState::bump`), and `skip_binding` the binding's.
pub fn bump_command(
    set: &SetState,
    req: &pb::BumpRequest,
    skip_epoch_fence: bool,
    skip_binding: bool,
) -> Result<Command, RpcError> {
    let items = check_bump_items(&params_of(set)?, &req.items)?;
    let incarnation = Incarnation(req.incarnation);
    if !skip_epoch_fence && !set.allocsvrs.contains_key(&incarnation) {
        return Err(RpcError::FailedPrecondition(format!(
            "unknown incarnation {}: register first",
            req.incarnation
        )));
    }
    let presented = binding(set, "Bump", req.incarnation, &req.secret, skip_binding)?;
    Ok(under(presented, Command::Bump { incarnation, items }))
}

/// The reply to a committed Bump.
pub fn bumped(req: &pb::BumpRequest, result: CommandResult) -> Result<pb::BumpReply, RpcError> {
    match result {
        CommandResult::Bumped(results) => Ok(pb::BumpReply {
            not_leader: None,
            results: results
                .into_iter()
                .map(|r| pb::BumpResult {
                    section: r.section.0,
                    outcome: outcome_pb(r.outcome),
                    max_seq: r.max_seq,
                    epoch: r.epoch.0,
                })
                .collect(),
        }),
        CommandResult::UnknownIncarnation => Err(RpcError::FailedPrecondition(format!(
            "unknown incarnation {}: register first",
            req.incarnation
        ))),
        CommandResult::NotBound => Err(not_bound("Bump", req.incarnation)),
        CommandResult::Invalid(m) => Err(RpcError::InvalidArgument(m)),
        other => Err(unexpected(other)),
    }
}

/// The items of a Bump, checked against the limits and the set's sections.
fn check_bump_items(p: &SetParams, items: &[pb::BumpItem]) -> Result<Vec<BumpItem>, RpcError> {
    if items.is_empty() || items.len() > MAX_BUMP_ITEMS {
        return Err(RpcError::InvalidArgument(format!(
            "a bump needs 1..={MAX_BUMP_ITEMS} items, got {}",
            items.len()
        )));
    }
    // The state machine checks each item against the section's ceiling by itself; a section named
    // twice would let one Bump climb 4 steps per item instead of 4 per request (rule 6). An
    // AllocSvr has at most one bump in flight per section, so it never names one twice.
    let mut seen = std::collections::HashSet::with_capacity(items.len());
    if let Some(twice) = items.iter().find(|i| !seen.insert(i.section)) {
        return Err(RpcError::InvalidArgument(format!(
            "section {} is named twice in one bump; name each section at most once",
            twice.section
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

fn outcome_pb(o: BumpOutcome) -> i32 {
    match o {
        BumpOutcome::Applied => pb::BumpOutcome::Applied as i32,
        BumpOutcome::NoOp => pb::BumpOutcome::NoOp as i32,
        BumpOutcome::StaleEpoch => pb::BumpOutcome::StaleEpoch as i32,
        BumpOutcome::OutOfRange => pb::BumpOutcome::OutOfRange as i32,
        BumpOutcome::NotOwned => pb::BumpOutcome::NotOwned as i32,
    }
}

// ---- Load (a linearizable read) ----

/// The ranges a Load names, checked before the read index is asked for.
pub fn load_ranges(p: &SetParams, req: &pb::LoadRequest) -> Result<Vec<Span>, RpcError> {
    check_ranges(p, &req.sections, MAX_LOAD_SECTIONS)
}

/// The reply to a Load, read from the applied state once the read index passed. Only an owned
/// section is loaded: an owner of a frozen or moved one would serve it.
pub fn load_reply(set: &SetState, p: &SetParams, ranges: &[Span]) -> Result<pb::LoadReply, RpcError> {
    if let Some((section, state)) = ranges.iter().find_map(|span| set.first_not_owned(*span)) {
        return Err(RpcError::FailedPrecondition(not_owned_message(
            p.set_id, section, state,
        )));
    }
    Ok(pb::LoadReply {
        not_leader: None,
        sections: ranges
            .iter()
            .flat_map(|span| set.sections_in(span.begin, span.end))
            .map(|(section, s)| pb::SectionState {
                section: section.0,
                max_seq: s.max_seq,
                epoch: s.epoch.0,
                owner_incarnation: s.owner.0,
            })
            .collect(),
    })
}

// ---- The arbiter, once per tick ----

/// What one arbiter tick asks to be written.
#[derive(Debug, PartialEq, Eq)]
pub enum Tick {
    /// Not the leader: nothing.
    Follower,
    /// The set has no parameters yet: write them.
    Init(SetParams),
    /// The plan (kept in the view for renewals); its command, if any, is to be written.
    Plan(Option<Command>),
}

/// One arbiter tick on a replica that Raft reports as leader or not in `term`: the leadership
/// bookkeeping of the liveness view (`became_leader` is true when it started over), then one
/// arbiter decision, whose plan is kept in `view`.
pub fn arbiter_tick(
    set: &SetState,
    view: &mut LeaderView,
    (is_leader, term): (bool, u64),
    now: Instant,
    detect: Duration,
    bootstrap: &SetParams,
) -> (bool, Tick) {
    let became_leader = view.liveness.observe_leadership(is_leader, term, now);
    if !is_leader {
        return (became_leader, Tick::Follower);
    }
    if set.params.is_none() {
        return (became_leader, Tick::Init(bootstrap.clone()));
    }
    let alive = liveness::alive(set, &view.liveness, now, detect);
    let plan = arbiter::plan(set, &alive);
    if takes_from_unknown(set, &view.liveness, &plan) {
        view.liveness.mark_unknown(now);
    }
    let cmd = plan.command();
    if !plan.expire.is_empty() {
        tracing::info!(expire = ?plan.expire, "declaring AllocSvr incarnations dead");
    }
    if !plan.moves.is_empty() {
        tracing::info!(moves = ?plan.moves, "moving sections");
    }
    view.handover_since = match (plan.handover.is_empty(), view.handover_since) {
        (true, _) => None,
        (false, since) => since.or(Some(now)),
    };
    view.plan = plan;
    (became_leader, Tick::Plan(cmd))
}

/// Whether the plan takes sections whose earlier owners' leases this leader cannot bound by what
/// it heard: unowned sections still to be waited out (after a restore, or behind an owner that
/// released before its own wait ended), or sections of an owner it never heard renew.
fn takes_from_unknown(set: &SetState, live: &Liveness, plan: &Plan) -> bool {
    plan.moves.iter().any(|m| {
        if m.from == NOBODY {
            set.sections_in(m.begin, m.end).any(|(_, s)| !s.no_wait)
        } else {
            !live.has_renewed(m.from)
        }
    })
}

// ---- Checks shared by several calls ----

pub fn check_ranges(p: &SetParams, ranges: &[pb::SectionRange], limit: u64) -> Result<Vec<Span>, RpcError> {
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

pub fn check_addr(addr: &str) -> Result<(), RpcError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bump_naming_a_section_twice_is_refused_before_it_is_proposed() {
        let (set, incs) = crate::domain::testing::set_with(&[1]);
        let item = |section, new_max| pb::BumpItem {
            section,
            epoch: 1,
            new_max,
        };
        let req = |items| pb::BumpRequest {
            secret: Vec::new(),
            incarnation: incs[0].0,
            items,
        };
        let err = bump_command(&set, &req(vec![item(3, 41), item(4, 5), item(3, 1)]), false, false).unwrap_err();
        let status = tonic::Status::from(err);
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains("section 3 is named twice"), "{status:?}");
        assert!(bump_command(&set, &req(vec![item(3, 41), item(4, 5)]), false, false).is_ok());
    }

    /// A planned handover makes every renewal ask for the next one soon at once, but is asked of
    /// its owner only after a renew interval: by then the node that will gain the section polls
    /// every `RENEW_SOON` and learns of its grant quickly.
    #[test]
    fn a_planned_handover_is_asked_for_one_renew_interval_after_everyone_renews_soon() {
        use crate::domain::testing::{register, set_with, small_params};
        let (mut set, incs) = set_with(&[1]);
        let mut view = LeaderView::default();
        let t0 = Instant::now();
        let detect = Duration::from_secs(2);
        let renew = |set: &SetState, view: &mut LeaderView, inc: Incarnation, now| {
            let req = pb::RenewRequest {
                secret: Vec::new(),
                incarnation: inc.0,
                ..Default::default()
            };
            renew_reply(
                set,
                view,
                &req,
                (0, None),
                || Ok(pb::RouteTable::default()),
                now,
                UnsafeRules::default(),
            )
            .expect("renew")
        };
        let tick = |set: &mut SetState, view: &mut LeaderView, now| {
            if let (_, Tick::Plan(Some(cmd))) = arbiter_tick(set, view, (true, 1), now, detect, &small_params()) {
                set.apply(&cmd, false);
            }
        };
        // Leadership first: a new leader trusts no renewal heard before it.
        tick(&mut set, &mut view, t0);
        renew(&set, &mut view, incs[0], t0);
        tick(&mut set, &mut view, t0);
        assert!(
            view.handover_since.is_none(),
            "one node owns everything: nothing to hand over"
        );
        let two = register(&mut set, 2);
        let t1 = t0 + Duration::from_millis(100);
        renew(&set, &mut view, two, t1);
        tick(&mut set, &mut view, t1);
        assert!(
            !view.plan.handover.is_empty(),
            "node 2 is live: node 1 should hand half over"
        );

        let early = renew(&set, &mut view, incs[0], t1 + Duration::from_millis(499));
        assert!(
            early.handover.is_empty(),
            "asked before everyone renews soon: {early:?}"
        );
        assert!(early.renew_soon);
        assert!(renew(&set, &mut view, two, t1 + Duration::from_millis(499)).renew_soon);
        let due = renew(&set, &mut view, incs[0], t1 + Duration::from_millis(500));
        assert!(
            !due.handover.is_empty(),
            "a renew interval later the owner is asked: {due:?}"
        );
    }

    /// Issue 49, item 3: a section taken from a dead owner is granted with what is left of that
    /// owner's lease, `lease·(1+drift)+margin` after this leader last heard it; a leader that
    /// cannot bound it (just elected) says nothing, so the new owner waits the whole lease.
    #[test]
    fn a_forced_grant_carries_what_is_left_of_the_dead_owners_lease() {
        use crate::domain::testing::{set_with, small_params};
        let (mut set, incs) = set_with(&[1, 2]);
        let mut view = LeaderView::default();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let renew = |set: &SetState, view: &mut LeaderView, inc: Incarnation, now, rules| {
            let req = pb::RenewRequest {
                incarnation: inc.0,
                ..Default::default()
            };
            renew_reply(set, view, &req, (0, None), || Ok(pb::RouteTable::default()), now, rules).expect("renew")
        };
        let tick = |set: &mut SetState, view: &mut LeaderView, term, now| {
            let detect = Duration::from_secs(2);
            if let (_, Tick::Plan(Some(cmd))) = arbiter_tick(set, view, (true, term), now, detect, &small_params()) {
                set.apply(&cmd, false);
            }
        };
        // Both renew every 500 ms; node 1 is last heard at 4,000 ms and declared dead at 6,000.
        for ms in (0..=6_000).step_by(500) {
            renew(&set, &mut view, incs[1], at(ms), UnsafeRules::default());
            if ms <= 4_000 {
                renew(&set, &mut view, incs[0], at(ms), UnsafeRules::default());
            }
            tick(&mut set, &mut view, 1, at(ms));
        }
        assert!(!set.allocsvrs.contains_key(&incs[0]), "node 1 expired");
        let waits = |reply: pb::RenewReply| -> Vec<(u64, bool, Option<u32>)> {
            reply
                .grants
                .iter()
                .map(|g| (g.section_begin, g.no_wait, g.wait_ms))
                .collect()
        };
        let safe = waits(renew(&set, &mut view, incs[1], at(6_100), UnsafeRules::default()));
        // 3,130 − (6,100 − 4,000) = 1,030 ms left for the forced grant; none asked for its own.
        assert_eq!(safe, vec![(0, false, Some(1_030)), (5, true, None)]);
        let first = UnsafeRules {
            predecessor_wait_from_first_renewal: true,
            ..UnsafeRules::default()
        };
        let unsafe_ = waits(renew(&set, &mut view, incs[1], at(6_100), first));
        assert_eq!(
            unsafe_,
            vec![(0, false, Some(0)), (5, true, None)],
            "the control waits too little"
        );
        // Leadership regained in a later term: nothing heard before counts, the whole wait.
        tick(&mut set, &mut view, 2, at(6_200));
        let young = waits(renew(&set, &mut view, incs[1], at(6_300), UnsafeRules::default()));
        assert_eq!(young, vec![(0, false, None), (5, true, None)]);
    }

    /// Issue 25, item 8: a frozen section's owner is asked to hand it over in the first renewal
    /// after the freeze, not when the arbiter's next plan says so (until then it was granted under
    /// its new epoch and nothing more, which the owner took for a gain, its Load refused).
    #[test]
    fn a_frozen_section_is_asked_back_in_the_first_renewal() {
        use crate::domain::moves::RangeCommand;
        use crate::domain::state::{Move, NOBODY};
        use crate::domain::testing::set_with;
        let (mut set, incs) = set_with(&[1]);
        let moves = vec![Move {
            begin: SectionId(0),
            end: SectionId(10),
            from: NOBODY,
            to: incs[0],
        }];
        set.apply(&Command::Assign { expire: vec![], moves }, false);
        let freeze = RangeCommand::Freeze {
            op: 5,
            span: crate::domain::state::Span {
                begin: SectionId(2),
                end: SectionId(4),
            },
            to_set: 1,
        };
        set.apply(&Command::Range(freeze), false);
        let req = pb::RenewRequest {
            incarnation: incs[0].0,
            ..Default::default()
        };
        let mut view = LeaderView::default();
        let reply = renew_reply(
            &set,
            &mut view,
            &req,
            (0, None),
            || Ok(pb::RouteTable::default()),
            Instant::now(),
            UnsafeRules::default(),
        )
        .expect("renew");
        assert_eq!(reply.handover, vec![pb::SectionRange { begin: 2, end: 4 }], "{reply:?}");
        assert!(
            reply
                .grants
                .iter()
                .any(|g| (g.section_begin, g.section_end, g.epoch) == (2, 4, 2)),
            "still granted under the new epoch, so that the owner can release it: {reply:?}"
        );
    }

    #[test]
    fn a_state_machine_surprise_is_internal_not_retryable() {
        let status = tonic::Status::from(unexpected(CommandResult::Released { count: 0 }));
        assert_eq!(status.code(), tonic::Code::Internal, "{status:?}");
    }
}
