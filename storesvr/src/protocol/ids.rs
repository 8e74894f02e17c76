//! The StoreService's side of time-ordered ids, sans-IO like the rest of `protocol`: setting a
//! set's ids up, the arbiter's slot grants, what a renewal tells a holder about its slots, and the
//! fenced `RaiseMarks` write (capped at the leader's clock plus the allowance), or the answer
//! without a write when it would change no mark.
//!
//! Set 0 sets its ids up from its own flags; every other set adopts set 0's setup from the
//! published cluster map, so that all sets issue under one layout and disjoint slot shares. A set
//! that has no published setup yet issues no ids (and says so in `Status`).
//!
//! Left out: issuing (the AllocSvr), and the leader's clock (the caller passes `leader_ms`).

use std::time::Instant;

use seqsvr_proto::limits::MAX_RAISE_ITEMS;
use seqsvr_proto::{Epoch, Incarnation, pb};

use crate::domain::liveness;
use crate::domain::slots::{self, RaiseItem, RaiseOutcome, SlotCommand, SlotResult};
use crate::domain::state::{Command, CommandResult, SetState};
use crate::error::RpcError;
use crate::protocol::{LeaderView, binding, not_bound, under, unexpected};

/// What the arbiter writes about slots this tick, if anything: the setup while the set has none
/// (set 0's from `own_setup`, the others' from their copy of the map), else the grants that give
/// each renewing, non-draining incarnation the slots it asks for (`slots::plan_grants`): one at
/// least, taken from the dead and then from the draining (a drained AllocSvr's slot goes to one
/// that stays once no free slot is left; until then the draining one keeps issuing, and its
/// SIGTERM frees it), more from free slots, and a surplus given back.
pub fn slots_tick(
    set: &SetState,
    view: &LeaderView,
    now: Instant,
    detect: std::time::Duration,
    own_setup: Option<SlotCommand>,
) -> Option<Command> {
    set.params.as_ref()?;
    let Some(ids) = set.ids.as_ref() else {
        let adopted = || {
            let map = crate::protocol::moves::cached(set).ok()??;
            slots::setup_from_pb(map.ids.as_ref()?)
        };
        let setup = own_setup.or_else(adopted)?;
        // A setup this set would refuse (its share lies past the layout's slots) is not written
        // every tick: the set issues no ids, and says so once.
        let set_id = set.params.as_ref().map_or(0, |p| p.set_id);
        if let Some(why) = slots::setup_refusal(set_id, &setup) {
            static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
            if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::error!(%why, "time-ordered ids cannot be set up in this set; it issues none");
            }
            return None;
        }
        return Some(Command::Slots(setup));
    };
    let alive = liveness::alive(set, &view.liveness, now, detect);
    let staying = |i: &&Incarnation| set.allocsvrs.get(i).is_some_and(|r| !r.draining);
    let want = alive
        .renewing
        .iter()
        .filter(staying)
        .map(|&i| (i, view.liveness.slots_wanted(i)))
        .collect();
    // Free slots first, the dead's next, then a holder's surplus: a draining holder gives its
    // slots up only to a taker that found no other.
    let mut moves = slots::plan_grants(ids, &alive.not_dead, &want);
    let unserved = |moves: &[slots::SlotMove]| {
        want.keys()
            .any(|i| ids.held_by(*i).next().is_none() && !moves.iter().any(|m| m.to == *i))
    };
    if unserved(&moves) {
        let keep = alive.not_dead.iter().filter(staying).copied().collect();
        moves = slots::plan_grants(ids, &keep, &want);
    }
    if moves.is_empty() {
        return None;
    }
    tracing::info!(?moves, "granting time-ordered id slots");
    Some(Command::Slots(SlotCommand::Grant(moves)))
}

/// The slot part of a renewal reply: the layout, the allowance, and the slots `incarnation` holds
/// with their epochs and marks.
pub fn slots_of(set: &SetState, incarnation: Incarnation) -> (Option<pb::IdLayout>, u64, Vec<pb::SlotGrant>) {
    let Some(ids) = set.ids.as_ref() else {
        return (None, 0, Vec::new());
    };
    let grants = ids
        .held_by(incarnation)
        .map(|(slot, s)| pb::SlotGrant {
            slot,
            epoch: s.epoch.0,
            mark: s.mark,
        })
        .collect();
    (Some(ids.layout.to_pb()), ids.max_ahead_ms, grants)
}

/// What a RaiseMarks takes: a Raft write, or nothing but an answer.
#[derive(Debug, PartialEq)]
pub enum RaiseStep {
    Propose(Command),
    /// No mark would change (a raise already applied, under a stale epoch, or capped at a mark the
    /// slot has reached): answered from the applied state, with no entry in the log. A holder
    /// whose clock runs ahead of a slow leader asks the same capped raise again and again, and
    /// each would otherwise be a log entry fsynced on every replica (issue 47).
    Answer(pb::RaiseMarksReply),
}

/// The write a RaiseMarks asks for, made under the caller's secret, or the answer when it would
/// change nothing; `leader_ms` is this leader's wall clock, which caps the marks (carried in the
/// command so every replica decides alike).
///
/// The answer without a write is as safe as the write's: every mark it reports is one the slot
/// holds in a committed state under the epoch it reports, and the caller checked the secret.
///
/// `skip_epoch_fence` (negative control) also skips the check that the incarnation is registered,
/// as for a Bump.
pub fn raise_step(
    set: &SetState,
    req: &pb::RaiseMarksRequest,
    leader_ms: u64,
    (skip_epoch_fence, skip_binding): (bool, bool),
) -> Result<RaiseStep, RpcError> {
    let Some(ids) = set.ids.as_ref() else {
        return Err(RpcError::FailedPrecondition(
            "this set has no time-ordered ids set up yet".into(),
        ));
    };
    if req.items.is_empty() || req.items.len() > MAX_RAISE_ITEMS {
        return Err(RpcError::InvalidArgument(format!(
            "a RaiseMarks names 1 to {MAX_RAISE_ITEMS} slots, got {}",
            req.items.len()
        )));
    }
    let incarnation = Incarnation(req.incarnation);
    if !skip_epoch_fence && !set.allocsvrs.contains_key(&incarnation) {
        return Err(RpcError::FailedPrecondition(format!(
            "unknown incarnation {}: register first",
            req.incarnation
        )));
    }
    let presented = binding(set, "RaiseMarks", req.incarnation, &req.secret, skip_binding)?;
    let items: Vec<RaiseItem> = req
        .items
        .iter()
        .map(|i| RaiseItem {
            slot: i.slot,
            epoch: Epoch(i.epoch),
            mark: i.mark,
        })
        .collect();
    if let Some(results) = ids.unchanged_raise(incarnation, &items, leader_ms, skip_epoch_fence) {
        return raised(req, CommandResult::Slots(SlotResult::Raised(results)), leader_ms).map(RaiseStep::Answer);
    }
    let cmd = Command::Slots(SlotCommand::RaiseCapped {
        holder: incarnation,
        items,
        leader_ms,
    });
    Ok(RaiseStep::Propose(under(presented, cmd)))
}

/// The reply to a committed RaiseMarks.
pub fn raised(
    req: &pb::RaiseMarksRequest,
    result: CommandResult,
    leader_ms: u64,
) -> Result<pb::RaiseMarksReply, RpcError> {
    match result {
        CommandResult::Slots(SlotResult::Raised(results)) => Ok(pb::RaiseMarksReply {
            not_leader: None,
            leader_ms,
            results: results
                .into_iter()
                .map(|r| {
                    let (outcome, limit) = match r.outcome {
                        RaiseOutcome::Applied => (pb::RaiseOutcome::Applied, 0),
                        RaiseOutcome::NoOp => (pb::RaiseOutcome::NoOp, 0),
                        RaiseOutcome::StaleEpoch => (pb::RaiseOutcome::StaleEpoch, 0),
                        // Capped or refused, the wire says TOO_FAR_AHEAD with the limit, and the
                        // mark the slot holds: an older AllocSvr treats both as a refusal.
                        RaiseOutcome::TooFarAhead { limit } | RaiseOutcome::Capped { limit } => {
                            (pb::RaiseOutcome::TooFarAhead, limit)
                        }
                        RaiseOutcome::NotOurs => (pb::RaiseOutcome::NotOurs, 0),
                    };
                    pb::RaiseResult {
                        slot: r.slot,
                        outcome: outcome as i32,
                        mark: r.mark,
                        epoch: r.epoch.0,
                        limit,
                    }
                })
                .collect(),
        }),
        CommandResult::NotBound => Err(not_bound("RaiseMarks", req.incarnation)),
        CommandResult::Slots(SlotResult::Refused(m)) => Err(RpcError::FailedPrecondition(m)),
        other => Err(unexpected(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::testing::set_with;
    use seqsvr_proto::id_layout::IdLayout;

    fn setup() -> SlotCommand {
        SlotCommand::Setup {
            layout: IdLayout::twitter(0),
            per_set: 8,
            max_ahead_ms: 5_000,
        }
    }

    #[test]
    fn set_zero_sets_up_from_its_flags_and_then_grants_each_renewing_incarnation_a_slot() {
        let (mut st, incs) = set_with(&[1, 2]);
        let mut view = LeaderView::default();
        let now = Instant::now();
        view.liveness.observe_leadership(true, 1, now);
        let first = slots_tick(&st, &view, now, std::time::Duration::from_secs(2), Some(setup()));
        assert_eq!(first, Some(Command::Slots(setup())));
        st.apply(&first.unwrap(), false);
        for &i in &incs {
            view.liveness.record(i, now);
        }
        let grant = slots_tick(&st, &view, now, std::time::Duration::from_secs(2), Some(setup())).unwrap();
        assert!(matches!(
            st.apply(&grant, false),
            CommandResult::Slots(SlotResult::Granted { moved: 2 })
        ));
        let (layout, ahead, held) = slots_of(&st, incs[1]);
        assert_eq!((layout, ahead), (Some(IdLayout::twitter(0).to_pb()), 5_000));
        assert_eq!(
            held,
            [pb::SlotGrant {
                slot: 1,
                epoch: 1,
                mark: 0
            }]
        );
        assert_eq!(
            slots_tick(&st, &view, now, std::time::Duration::from_secs(2), Some(setup())),
            None
        );
    }

    #[test]
    fn a_draining_holder_gives_its_slot_up_only_when_no_free_slot_is_left() {
        let (mut st, incs) = set_with(&[1, 2, 3]);
        let mut view = LeaderView::default();
        let now = Instant::now();
        view.liveness.observe_leadership(true, 1, now);
        let two_slots = SlotCommand::Setup {
            layout: IdLayout::twitter(0),
            per_set: 2,
            max_ahead_ms: 5_000,
        };
        st.apply(&Command::Slots(two_slots), false);
        for &i in &incs[..2] {
            view.liveness.record(i, now);
        }
        let detect = std::time::Duration::from_secs(2);
        let grant = slots_tick(&st, &view, now, detect, None).unwrap();
        st.apply(&grant, false);
        assert_eq!(slots_of(&st, incs[0]).2.len(), 1);
        // The first holder drains: with nobody waiting, it keeps its slot.
        st.allocsvrs.get_mut(&incs[0]).unwrap().draining = true;
        assert_eq!(slots_tick(&st, &view, now, detect, None), None);
        // A third AllocSvr renews and no slot is free: the draining one's goes to it.
        view.liveness.record(incs[2], now);
        let grant = slots_tick(&st, &view, now, detect, None).expect("a grant");
        st.apply(&grant, false);
        assert!(slots_of(&st, incs[0]).2.is_empty(), "the draining holder let go");
        assert_eq!(slots_of(&st, incs[2]).2.len(), 1);
        assert_eq!(slots_of(&st, incs[1]).2.len(), 1, "the staying holder kept its slot");
    }

    #[test]
    fn a_renewal_that_asks_for_more_slots_gets_them_while_the_draining_keep_theirs() {
        let (mut st, incs) = set_with(&[1, 2, 3]);
        let mut view = LeaderView::default();
        let now = Instant::now();
        view.liveness.observe_leadership(true, 1, now);
        st.apply(&Command::Slots(setup()), false);
        let detect = std::time::Duration::from_secs(2);
        for &i in &incs {
            view.liveness.record(i, now);
        }
        st.allocsvrs.get_mut(&incs[2]).unwrap().draining = true;
        view.liveness.want_slots(incs[0], 3);
        view.liveness.want_slots(incs[1], 0);
        let grant = slots_tick(&st, &view, now, detect, None).expect("a grant");
        st.apply(&grant, false);
        let held = |st: &SetState, i| slots_of(st, i).2.len();
        assert_eq!((held(&st, incs[0]), held(&st, incs[1]), held(&st, incs[2])), (3, 1, 0));
        assert_eq!(slots_tick(&st, &view, now, detect, None), None, "settled");
        // It asks for one again: two are freed (to nobody, under new epochs).
        view.liveness.want_slots(incs[0], 1);
        let release = slots_tick(&st, &view, now, detect, None).expect("a release");
        st.apply(&release, false);
        assert_eq!(held(&st, incs[0]), 1);
        // A new leader has heard nothing yet: everyone asks for one until it renews.
        view.liveness.observe_leadership(true, 2, now);
        assert_eq!(view.liveness.slots_wanted(incs[0]), 1);
    }

    #[test]
    fn a_raise_names_one_to_the_limit_of_slots_of_a_registered_incarnation() {
        let (mut st, incs) = set_with(&[1]);
        let req = |items: Vec<pb::SlotMark>, incarnation| pb::RaiseMarksRequest {
            incarnation,
            items,
            secret: Vec::new(),
        };
        let one = vec![pb::SlotMark {
            slot: 0,
            epoch: 1,
            mark: 9,
        }];
        let err = raise_step(&st, &req(one.clone(), incs[0].0), 0, (false, false)).unwrap_err();
        assert!(format!("{err:?}").contains("no time-ordered ids"), "{err:?}");
        st.apply(&Command::Slots(setup()), false);
        assert!(raise_step(&st, &req(vec![], incs[0].0), 0, (false, false)).is_err());
        let err = raise_step(&st, &req(one.clone(), 99), 0, (false, false)).unwrap_err();
        assert!(format!("{err:?}").contains("unknown incarnation 99"), "{err:?}");
        assert!(raise_step(&st, &req(one, incs[0].0), 0, (false, false)).is_ok());
    }

    /// A set whose slot 0 is held by the first of `nodes` under epoch 1, its mark 0.
    fn holding_slot_zero() -> (SetState, Incarnation) {
        let (mut st, incs) = set_with(&[1]);
        st.apply(&Command::Slots(setup()), false);
        let grant = SlotCommand::Grant(vec![slots::SlotMove {
            slot: 0,
            from: crate::domain::section::NOBODY,
            to: incs[0],
        }]);
        st.apply(&Command::Slots(grant), false);
        (st, incs[0])
    }

    fn raise_req(holder: Incarnation, epoch: u64, mark: u64) -> pb::RaiseMarksRequest {
        pb::RaiseMarksRequest {
            incarnation: holder.0,
            items: vec![pb::SlotMark { slot: 0, epoch, mark }],
            secret: Vec::new(),
        }
    }

    /// The one result of a raise, proposed and applied if it needs a write.
    fn raise(st: &mut SetState, req: &pb::RaiseMarksRequest, leader_ms: u64) -> (pb::RaiseResult, bool) {
        match raise_step(st, req, leader_ms, (false, false)).unwrap() {
            RaiseStep::Propose(cmd) => {
                let result = st.apply(&cmd, false);
                (raised(req, result, leader_ms).unwrap().results[0], true)
            }
            RaiseStep::Answer(reply) => (reply.results[0], false),
        }
    }

    /// Issue 47, item 8: the store leader's clock is behind the holder's, so the holder asks for
    /// a mark past the leader's clock plus the allowance. The mark is raised to that limit (the
    /// holder issues up to it) instead of being refused, which stopped every id of the set.
    #[test]
    fn a_raise_past_the_leaders_clock_plus_the_allowance_is_applied_capped_at_the_limit() {
        let (mut st, holder) = holding_slot_zero();
        let leader_ms = 1_800_000_000_000;
        // Twitter's layout from 1970: a tick is a Unix millisecond.
        let limit = leader_ms + 5_000;
        let (r, written) = raise(&mut st, &raise_req(holder, 1, limit + 1_000), leader_ms);
        assert_eq!(
            (r.outcome, r.limit, r.mark, written),
            (pb::RaiseOutcome::TooFarAhead as i32, limit, limit, true)
        );
        assert_eq!(st.ids.as_ref().unwrap().get(0).unwrap().mark, limit);
    }

    /// Issue 47, item 7: a raise that would change no mark — asked again while the leader's clock
    /// stands still, under a stale epoch, or already applied — is answered without a Raft entry,
    /// with what the slot holds; one that would change a mark is still written.
    #[test]
    fn a_raise_that_would_change_no_mark_is_answered_without_a_proposal() {
        let (mut st, holder) = holding_slot_zero();
        let leader_ms = 1_800_000_000_000;
        let limit = leader_ms + 5_000;
        let (_, written) = raise(&mut st, &raise_req(holder, 1, limit + 1_000), leader_ms);
        assert!(written, "the first capped raise moves the mark");
        let before = st.clone();
        for (req, outcome) in [
            (raise_req(holder, 1, limit + 2_000), pb::RaiseOutcome::TooFarAhead),
            (raise_req(holder, 1, limit - 10), pb::RaiseOutcome::NoOp),
            (raise_req(holder, 7, limit + 5), pb::RaiseOutcome::StaleEpoch),
        ] {
            let RaiseStep::Answer(reply) = raise_step(&st, &req, leader_ms, (false, false)).unwrap() else {
                panic!("{req:?} would change nothing, yet it is proposed");
            };
            let r = reply.results[0];
            assert_eq!((r.outcome, r.mark, r.epoch), (outcome as i32, limit, 1), "{req:?}");
            assert_eq!(reply.leader_ms, leader_ms);
        }
        assert_eq!(st, before);
        // The leader's clock moved on: the limit did too, and the raise is written.
        let (r, written) = raise(&mut st, &raise_req(holder, 1, limit + 2_000), leader_ms + 500);
        assert_eq!((r.mark, written), (limit + 500, true));
        // A forged raise is refused before anything is answered.
        let mut forged = raise_req(holder, 1, 1);
        forged.incarnation = 99;
        assert!(raise_step(&st, &forged, leader_ms, (false, false)).is_err());
    }
}
