//! The arbiter: which live AllocSvr should own which sections.
//!
//! It runs on the Raft leader only, over what [`super::liveness`] says about each incarnation.
//! The decisions are pure ([`plan`], [`desired_layout`]): given the state and the live set they
//! return what to do. Sections move only in whole contiguous runs, balanced over the live
//! incarnations ordered by node id (so a restarted node gets its old range back):
//! - an unowned section goes to its desired owner (no lease wait if it was
//!   released or never owned);
//! - a section of a dead, expired or superseded owner is taken (forced move:
//!   the new owner waits out a lease, docs/DESIGN.md, "The ownership protocol", rule 4);
//! - a section of a live owner that should move is a planned move: the owner
//!   is asked (in its renewal reply) to hand it over, releases it, and the
//!   next tick assigns it with no wait.
//!
//! Safety (P4) never depends on this module: fencing is the epoch, and the
//! lease wait is enforced by the new owner.
//!
//! Left out: weighting nodes by capacity or load.

use super::liveness::Alive;
use super::ranges::{RangeRun, RangeState};
use super::section::{NOBODY, OwnerRun, Span};
use super::state::{Command, Move, SetState};
use seqsvr_proto::{Incarnation, SectionId};
use std::collections::{BTreeMap, BTreeSet};

/// What the arbiter wants written.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Incarnations to declare dead.
    pub expire: Vec<Incarnation>,
    pub moves: Vec<Move>,
    /// Sections each live owner should hand over (planned moves).
    pub handover: BTreeMap<Incarnation, Vec<Span>>,
}

impl Plan {
    /// The command that carries the plan out, if it changes anything.
    pub fn command(&self) -> Option<Command> {
        (!self.expire.is_empty() || !self.moves.is_empty()).then(|| Command::Assign {
            expire: self.expire.clone(),
            moves: self.moves.clone(),
        })
    }
}

/// Balanced layout: the set's owned sections, in order, cut into one share per renewing
/// incarnation (a share spans several runs when the set owns several ranges).
pub fn desired_layout(set: &SetState, renewing: &BTreeSet<Incarnation>) -> Vec<OwnerRun> {
    let mut nodes: Vec<_> = renewing
        .iter()
        .filter_map(|i| set.allocsvrs.get(i))
        .filter(|r| !r.draining)
        .map(|r| (r.node_id, r.incarnation))
        .collect();
    nodes.sort();
    let owned: Vec<RangeRun> = set.ranges.owned().collect();
    let k = nodes.len() as u64;
    let n: u64 = owned.iter().map(|r| r.end.0 - r.begin.0).sum();
    if k == 0 || n == 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    // Node i's share is the owned sections at positions [i·n/k, (i+1)·n/k); `done` positions are
    // handed out, `at` is the next section of the current run.
    let (mut run, mut done, mut at) = (0, 0u64, owned[0].begin.0);
    for (i, &(_, owner)) in nodes.iter().enumerate() {
        let share_end = (i as u64 + 1) * n / k;
        while done < share_end {
            let take = (owned[run].end.0 - at).min(share_end - done);
            out.push(OwnerRun {
                begin: SectionId(at),
                end: SectionId(at + take),
                owner,
            });
            done += take;
            at += take;
            if at == owned[run].end.0 && run + 1 < owned.len() {
                run += 1;
                at = owned[run].begin.0;
            }
        }
    }
    out
}

/// What to change so that ownership approaches the desired layout.
pub fn plan(set: &SetState, alive: &Alive) -> Plan {
    let mut out = Plan {
        expire: set
            .allocsvrs
            .keys()
            .copied()
            .filter(|i| !alive.not_dead.contains(i))
            .collect(),
        ..Default::default()
    };
    // Owners of frozen sections hand them over: the move waits for it (or for their leases).
    for frozen in set
        .ranges
        .runs()
        .filter(|r| matches!(r.state, RangeState::Migrating { .. }))
    {
        for (section, state) in set.sections_in(frozen.begin, frozen.end) {
            if state.owner != NOBODY && alive.not_dead.contains(&state.owner) {
                push_run(out.handover.entry(state.owner).or_default(), section);
            }
        }
    }
    for run in desired_layout(set, &alive.renewing) {
        let want = run.owner;
        for (section, state) in set.sections_in(run.begin, run.end) {
            let owner = state.owner;
            if owner == want {
                continue;
            }
            if owner != NOBODY && alive.renewing.contains(&owner) {
                push_run(out.handover.entry(owner).or_default(), section);
                continue;
            }
            if owner != NOBODY && alive.not_dead.contains(&owner) {
                continue; // not heard by this leader yet: neither robbed nor asked
            }
            let next = SectionId(section.0 + 1);
            match out.moves.last_mut() {
                Some(m) if m.end == section && m.from == owner && m.to == want => m.end = next,
                _ => out.moves.push(Move {
                    begin: section,
                    end: next,
                    from: owner,
                    to: want,
                }),
            }
        }
    }
    out
}

fn push_run(runs: &mut Vec<Span>, section: SectionId) {
    let next = SectionId(section.0 + 1);
    match runs.last_mut() {
        Some(span) if span.end == section => span.end = next,
        _ => runs.push(Span {
            begin: section,
            end: next,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::liveness::{Liveness, alive};
    use crate::domain::state::Released;
    use crate::domain::testing::{register, set_with};
    use seqsvr_proto::Epoch;
    use std::time::{Duration, Instant};

    /// Every given incarnation renewing.
    fn renewing(incs: &[Incarnation]) -> Alive {
        let set: BTreeSet<Incarnation> = incs.iter().copied().collect();
        Alive {
            renewing: set.clone(),
            not_dead: set,
        }
    }

    fn apply(st: &mut SetState, p: &Plan) {
        if let Some(c) = p.command() {
            st.apply(&c, false);
        }
    }

    fn mv(begin: u64, end: u64, from: Incarnation, to: Incarnation) -> Move {
        Move {
            begin: SectionId(begin),
            end: SectionId(end),
            from,
            to,
        }
    }

    fn span(begin: u64, end: u64) -> Span {
        Span {
            begin: SectionId(begin),
            end: SectionId(end),
        }
    }

    fn run(begin: u64, end: u64, owner: Incarnation) -> OwnerRun {
        OwnerRun {
            begin: SectionId(begin),
            end: SectionId(end),
            owner,
        }
    }

    #[test]
    fn fresh_set_is_split_evenly_without_waits() {
        let (mut st, incs) = set_with(&[2, 1]);
        let alive = renewing(&incs);
        let p = plan(&st, &alive);
        assert!(p.expire.is_empty() && p.handover.is_empty());
        apply(&mut st, &p);
        // Node 1 (registered second) sorts first by node id.
        assert_eq!(st.owner_runs(), vec![run(0, 5, incs[1]), run(5, 10, incs[0])]);
        assert!(st.sections.iter().all(|s| s.no_wait && s.epoch == Epoch(1)));
        assert_eq!(plan(&st, &alive), Plan::default(), "a balanced set needs nothing");
    }

    /// A set that owns two ranges (sections 0..3 and 6..10, the middle frozen for a move) splits
    /// the seven owned sections over its nodes (3 and 4), and the frozen ones are asked back.
    #[test]
    fn owned_ranges_are_shared_across_gaps_and_frozen_sections_are_handed_over() {
        use crate::domain::moves::RangeCommand;
        let (mut st, incs) = set_with(&[1, 2]);
        let alive = renewing(&incs);
        let first = plan(&st, &alive);
        apply(&mut st, &first);
        let freeze = RangeCommand::Freeze {
            op: 9,
            span: Span {
                begin: SectionId(3),
                end: SectionId(6),
            },
            to_set: 1,
        };
        st.apply(&Command::Range(freeze), false);
        let layout = desired_layout(&st, &alive.renewing);
        assert_eq!(layout, vec![run(0, 3, incs[0]), run(6, 10, incs[1])]);
        let p = plan(&st, &alive);
        // Sections 3 and 4 were node 1's, 5 node 2's; both are asked to hand them over.
        let span = |b, e| Span {
            begin: SectionId(b),
            end: SectionId(e),
        };
        assert_eq!(p.handover.get(&incs[0]), Some(&vec![span(3, 5)]));
        assert_eq!(p.handover.get(&incs[1]).map(|v| v[0]), Some(span(5, 6)));
        apply(&mut st, &p);
        assert!(
            st.owner_runs()
                .iter()
                .all(|r| r.end <= SectionId(3) || r.begin >= SectionId(6)),
            "no frozen section is routed to"
        );
    }

    /// A draining node is planned nothing: all its sections are asked back, and once it released
    /// them (having served them) the other node takes them without a lease wait.
    #[test]
    fn a_draining_node_hands_everything_over_without_a_lease_wait() {
        let (mut st, incs) = set_with(&[1, 2]);
        let alive = renewing(&incs);
        let first = plan(&st, &alive);
        apply(&mut st, &first);
        let r = st.apply(
            &Command::Drain {
                node_id: seqsvr_proto::NodeId(1),
            },
            false,
        );
        assert_eq!(
            r,
            crate::domain::state::CommandResult::Draining {
                incarnation: Some(incs[0])
            }
        );
        let p = plan(&st, &alive);
        let asked: u64 = p.handover[&incs[0]].iter().map(|s| s.end.0 - s.begin.0).sum();
        assert_eq!(asked, 5, "every section of the draining node is asked back");
        let ranges = p.handover[&incs[0]]
            .iter()
            .map(|s| Released {
                begin: s.begin,
                end: s.end,
                epoch: st.section(s.begin).unwrap().epoch,
                waited: true,
            })
            .collect();
        st.apply(
            &Command::Release {
                incarnation: incs[0],
                ranges,
                leaving: false,
            },
            false,
        );
        let next = plan(&st, &alive);
        apply(&mut st, &next);
        assert_eq!(st.owner_runs(), vec![run(0, 10, incs[1])]);
        assert!(
            st.sections.iter().take(10).all(|s| s.no_wait),
            "no lease wait after a drain"
        );
    }

    #[test]
    fn dead_owner_sections_are_taken_with_a_lease_wait() {
        let (mut st, incs) = set_with(&[1, 2]);
        let p = plan(&st, &renewing(&incs));
        apply(&mut st, &p);
        let only_b = renewing(&[incs[1]]);
        let p = plan(&st, &only_b);
        assert_eq!(p.expire, vec![incs[0]]);
        assert_eq!(p.moves, vec![mv(0, 5, incs[0], incs[1])]);
        apply(&mut st, &p);
        let s = st.section(SectionId(0)).unwrap();
        assert!(!s.no_wait);
        assert_eq!(s.epoch, Epoch(2));
    }

    #[test]
    fn joining_node_gets_its_share_by_planned_handover() {
        let (mut st, incs) = set_with(&[1]);
        let p = plan(&st, &renewing(&[incs[0]]));
        apply(&mut st, &p);
        let b = register(&mut st, 2);
        let alive = renewing(&[incs[0], b]);
        let p = plan(&st, &alive);
        assert!(p.moves.is_empty(), "a live owner is never robbed");
        assert_eq!(p.handover.get(&incs[0]), Some(&vec![span(5, 10)]));
        st.apply(
            &Command::Release {
                incarnation: incs[0],
                ranges: vec![Released {
                    begin: SectionId(5),
                    end: SectionId(10),
                    epoch: Epoch(1),
                    waited: true,
                }],
                leaving: false,
            },
            false,
        );
        let p = plan(&st, &alive);
        assert_eq!(p.moves, vec![mv(5, 10, NOBODY, b)]);
        apply(&mut st, &p);
        assert!(
            st.section(SectionId(7)).unwrap().no_wait,
            "released sections move without a wait"
        );
    }

    #[test]
    fn a_registration_alone_draws_no_sections() {
        let (mut st, incs) = set_with(&[1]);
        let t0 = Instant::now();
        let detect = Duration::from_secs(2);
        let mut live = Liveness::default();
        live.become_leader(t0);
        live.record(incs[0], t0);
        let p = plan(&st, &alive(&st, &live, t0, detect));
        apply(&mut st, &p);
        let ghost = register(&mut st, 2);
        // What the Register handler records; the process dies before its first renewal.
        live.registered(ghost, t0 + Duration::from_millis(10));
        let p = plan(&st, &alive(&st, &live, t0 + Duration::from_millis(20), detect));
        assert!(
            p.handover.is_empty() && p.moves.iter().all(|m| m.to != ghost),
            "sections planned for an incarnation that never renewed: {p:?}"
        );
        assert!(p.expire.is_empty(), "not declared dead before a detection interval");
        // Never heard from again: expired one detection interval after it registered.
        live.record(incs[0], t0 + detect);
        let later = alive(&st, &live, t0 + Duration::from_millis(10) + detect, detect);
        assert_eq!(plan(&st, &later).expire, vec![ghost]);
        // Had it renewed, it would have drawn its share by planned handover.
        live.record(ghost, t0 + detect);
        let p = plan(&st, &alive(&st, &live, t0 + detect, detect));
        assert_eq!(p.handover.get(&incs[0]), Some(&vec![span(5, 10)]));
    }
}
