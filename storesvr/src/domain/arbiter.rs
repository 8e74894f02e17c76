//! The arbiter: which live AllocSvr should own which sections.
//!
//! It runs on the Raft leader only. Liveness is in-memory: the time of each
//! incarnation's last renewal as seen by this leader. A new leader trusts no
//! liveness data from the old one (a leadership regained in a later term is a
//! new leadership, even when no tick saw it lost): it starts every
//! incarnation's clock at the moment it became leader, so nobody is declared
//! dead before one full detection interval has passed under the new leader.
//!
//! An incarnation draws sections only once this leader has heard a renewal from
//! it within the detection interval ([`Alive::renewing`]): a process that dies
//! right after registering is never planned anything, and is expired one
//! detection interval after its registration. One that is merely not declared
//! dead yet ([`Alive::not_dead`]: just registered, or not heard by a new leader
//! yet) keeps what it owns but gets nothing new.
//!
//! The decisions are pure ([`alive`], [`plan`]): given the state, the live
//! set and the section count they return what to do. Sections move only in
//! whole contiguous runs, balanced over the live incarnations ordered by node
//! id (so a restarted node gets its old range back):
//! - an unowned section goes to its desired owner (no lease wait if it was
//!   released or never owned);
//! - a section of a dead, expired or superseded owner is taken (forced move:
//!   the new owner waits out a lease, ownership rule 4 of docs/DESIGN.md);
//! - a section of a live owner that should move is a planned move: the owner
//!   is asked (in its renewal reply) to hand it over, releases it, and the
//!   next tick assigns it with no wait.
//!
//! Safety (P4) never depends on this module: fencing is the epoch, and the
//! lease wait is enforced by the new owner.
//!
//! Left out: weighting nodes by capacity or load.

use crate::domain::state::{Command, Move, SetState};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// What the arbiter wants written.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub expire: Vec<u64>,
    pub moves: Vec<Move>,
    /// Sections each live owner should hand over (planned moves).
    pub handover: BTreeMap<u64, Vec<(u64, u64)>>,
}

impl Plan {
    pub fn command(&self) -> Option<Command> {
        (!self.expire.is_empty() || !self.moves.is_empty()).then(|| Command::Assign {
            expire: self.expire.clone(),
            moves: self.moves.clone(),
        })
    }
}

/// Liveness as seen by this leader.
#[derive(Debug, Default)]
pub struct Liveness {
    leader_since: Option<Instant>,
    /// The Raft term this node leads in.
    term: u64,
    /// When this leader last heard of each incarnation, and whether that was a renewal (true)
    /// or only its registration (false).
    last_renew: HashMap<u64, (Instant, bool)>,
}

/// Who the arbiter may plan with, at one instant.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Alive {
    /// Renewed with this leader within the detection interval: may gain sections.
    pub renewing: BTreeSet<u64>,
    /// Not declared dead (a superset of `renewing`): keeps what it owns.
    pub not_dead: BTreeSet<u64>,
}

impl Liveness {
    /// Called when this node becomes leader: forget everything heard before.
    pub fn become_leader(&mut self, now: Instant) {
        self.leader_since = Some(now);
        self.last_renew.clear();
    }

    pub fn step_down(&mut self) {
        self.leader_since = None;
        self.last_renew.clear();
    }

    pub fn is_leader(&self) -> bool {
        self.leader_since.is_some()
    }

    /// Called on every arbiter tick with what Raft reports; true when this node just became
    /// leader (its liveness data was reset). A higher term than the one it led in means the
    /// leadership was lost and regained between two ticks: what was heard before is stale.
    pub fn observe_leadership(&mut self, is_leader: bool, term: u64, now: Instant) -> bool {
        match (is_leader, self.is_leader()) {
            (true, false) => {}
            (true, true) if term != self.term => {}
            (false, true) => {
                self.step_down();
                return false;
            }
            _ => return false,
        }
        self.become_leader(now);
        self.term = term;
        true
    }

    /// A renewal from the incarnation reached this leader.
    pub fn record(&mut self, incarnation: u64, now: Instant) {
        if self.leader_since.is_some() {
            self.last_renew.insert(incarnation, (now, true));
        }
    }

    /// The incarnation registered through this leader: its detection clock starts, but it is not
    /// renewing until its first renewal arrives.
    pub fn registered(&mut self, incarnation: u64, now: Instant) {
        if self.leader_since.is_some() {
            self.last_renew.entry(incarnation).or_insert((now, false));
        }
    }

    /// When this leader last heard from the incarnation (or became leader).
    pub fn last_seen(&self, incarnation: u64) -> Option<Instant> {
        self.last_renew.get(&incarnation).map(|(t, _)| *t).or(self.leader_since)
    }

    fn has_renewed(&self, incarnation: u64) -> bool {
        self.last_renew.get(&incarnation).is_some_and(|(_, renewed)| *renewed)
    }
}

/// Registered incarnations by what the arbiter may do with them at `now`.
pub fn alive(set: &SetState, live: &Liveness, now: Instant, detect: Duration) -> Alive {
    let mut out = Alive::default();
    for &inc in set.allocsvrs.keys() {
        let recent = live
            .last_seen(inc)
            .is_some_and(|t| now.saturating_duration_since(t) < detect);
        if recent {
            out.not_dead.insert(inc);
            if live.has_renewed(inc) {
                out.renewing.insert(inc);
            }
        }
    }
    out
}

/// A run of consecutive sections `[begin, end)` the layout gives to one incarnation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub begin: u64,
    pub end: u64,
    pub incarnation: u64,
}

/// Balanced contiguous layout: runs over the set's sections, one per renewing incarnation in
/// node-id order.
pub fn desired_layout(set: &SetState, renewing: &BTreeSet<u64>) -> Vec<Run> {
    let Some(p) = set.params.as_ref() else {
        return Vec::new();
    };
    let mut nodes: Vec<(u64, u64)> = renewing
        .iter()
        .filter_map(|i| set.allocsvrs.get(i))
        .map(|r| (r.node_id, r.incarnation))
        .collect();
    nodes.sort();
    let k = nodes.len() as u64;
    let n = p.section_end - p.section_begin;
    if k == 0 || n == 0 {
        return Vec::new();
    }
    (0..k)
        .map(|i| Run {
            begin: p.section_begin + i * n / k,
            end: p.section_begin + (i + 1) * n / k,
            incarnation: nodes[i as usize].1,
        })
        .filter(|r| r.begin < r.end)
        .collect()
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
    for run in desired_layout(set, &alive.renewing) {
        let want = run.incarnation;
        for section in run.begin..run.end {
            let owner = set.section(section).map_or(0, |s| s.owner);
            if owner == want {
                continue;
            }
            if owner != 0 && alive.renewing.contains(&owner) {
                push_run(out.handover.entry(owner).or_default(), section);
                continue;
            }
            if owner != 0 && alive.not_dead.contains(&owner) {
                continue; // not heard by this leader yet: neither robbed nor asked
            }
            match out.moves.last_mut() {
                Some(m) if m.end == section && m.from == owner && m.to == want => m.end += 1,
                _ => out.moves.push(Move {
                    begin: section,
                    end: section + 1,
                    from: owner,
                    to: want,
                }),
            }
        }
    }
    out
}

fn push_run(runs: &mut Vec<(u64, u64)>, section: u64) {
    match runs.last_mut() {
        Some((_, end)) if *end == section => *end += 1,
        _ => runs.push((section, section + 1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::state::{CommandResult, SetParams};

    fn set_with(nodes: &[u64]) -> (SetState, Vec<u64>) {
        let mut st = SetState::default();
        st.apply(
            &Command::Init(SetParams {
                set_id: 0,
                section_size: 10,
                uid_limit: 100,
                step: 5,
                lease_ms: 3000,
                renew_interval_ms: 500,
                drift_ppm: 10_000,
                margin_ms: 100,
                section_begin: 0,
                section_end: 10,
            }),
            false,
        );
        let incs = nodes
            .iter()
            .map(|n| {
                match st.apply(
                    &Command::Register {
                        node_id: *n,
                        addr: format!("n{n}"),
                        nonce: 0,
                    },
                    false,
                ) {
                    CommandResult::Registered { incarnation } => incarnation,
                    other => panic!("{other:?}"),
                }
            })
            .collect();
        (st, incs)
    }

    /// Every given incarnation renewing.
    fn renewing(incs: &[u64]) -> Alive {
        let set: BTreeSet<u64> = incs.iter().copied().collect();
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

    #[test]
    fn fresh_set_is_split_evenly_without_waits() {
        let (mut st, incs) = set_with(&[2, 1]);
        let alive = renewing(&incs);
        let p = plan(&st, &alive);
        assert!(p.expire.is_empty() && p.handover.is_empty());
        apply(&mut st, &p);
        // Node 1 (registered second) sorts first by node id.
        assert_eq!(st.owner_runs(), vec![(0, 5, incs[1]), (5, 10, incs[0])]);
        assert!(st.sections.iter().all(|s| s.no_wait && s.epoch == 1));
        assert_eq!(plan(&st, &alive), Plan::default(), "a balanced set needs nothing");
    }

    #[test]
    fn dead_owner_sections_are_taken_with_a_lease_wait() {
        let (mut st, incs) = set_with(&[1, 2]);
        let p = plan(&st, &renewing(&incs));
        apply(&mut st, &p);
        let only_b = renewing(&[incs[1]]);
        let p = plan(&st, &only_b);
        assert_eq!(p.expire, vec![incs[0]]);
        assert_eq!(
            p.moves,
            vec![Move {
                begin: 0,
                end: 5,
                from: incs[0],
                to: incs[1]
            }]
        );
        apply(&mut st, &p);
        assert!(!st.section(0).unwrap().no_wait);
        assert_eq!(st.section(0).unwrap().epoch, 2);
    }

    #[test]
    fn joining_node_gets_its_share_by_planned_handover() {
        let (mut st, incs) = set_with(&[1]);
        let p = plan(&st, &renewing(&[incs[0]]));
        apply(&mut st, &p);
        let CommandResult::Registered { incarnation: b } = st.apply(
            &Command::Register {
                node_id: 2,
                addr: "n2".into(),
                nonce: 0,
            },
            false,
        ) else {
            panic!()
        };
        let alive = renewing(&[incs[0], b]);
        let p = plan(&st, &alive);
        assert!(p.moves.is_empty(), "a live owner is never robbed");
        assert_eq!(p.handover.get(&incs[0]), Some(&vec![(5, 10)]));
        st.apply(
            &Command::Release {
                incarnation: incs[0],
                ranges: vec![crate::domain::state::Released {
                    begin: 5,
                    end: 10,
                    epoch: 1,
                }],
                leaving: false,
            },
            false,
        );
        let p = plan(&st, &alive);
        assert_eq!(
            p.moves,
            vec![Move {
                begin: 5,
                end: 10,
                from: 0,
                to: b
            }]
        );
        apply(&mut st, &p);
        assert!(st.section(7).unwrap().no_wait, "released sections move without a wait");
    }

    #[test]
    fn leadership_regained_in_a_later_term_forgets_old_liveness() {
        let (st, incs) = set_with(&[1]);
        let t0 = Instant::now();
        let detect = Duration::from_secs(2);
        let mut live = Liveness::default();
        assert!(live.observe_leadership(true, 3, t0));
        live.record(incs[0], t0 + Duration::from_millis(100));
        // Leadership lost and regained between two ticks: the tick only sees a higher term.
        let t1 = t0 + Duration::from_millis(2050);
        assert!(live.observe_leadership(true, 5, t1), "a new term is a new leadership");
        // The renewal heard in term 3 must not count: nobody is declared dead before t1 + detect.
        let got: Vec<u64> = alive(&st, &live, t1 + Duration::from_millis(100), detect)
            .not_dead
            .into_iter()
            .collect();
        assert_eq!(
            got,
            vec![incs[0]],
            "declared dead on stale liveness from an earlier term"
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
        let CommandResult::Registered { incarnation: ghost } = st.apply(
            &Command::Register {
                node_id: 2,
                addr: "n2".into(),
                nonce: 0,
            },
            false,
        ) else {
            panic!()
        };
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
        assert_eq!(p.handover.get(&incs[0]), Some(&vec![(5, 10)]));
    }

    #[test]
    fn new_leader_waits_a_detection_interval_before_declaring_death() {
        let (st, incs) = set_with(&[1, 2]);
        let t0 = Instant::now();
        let detect = Duration::from_secs(2);
        let mut live = Liveness::default();
        live.become_leader(t0);
        live.record(incs[0], t0 + Duration::from_millis(1500));
        let cases = [
            (Duration::from_millis(1999), vec![incs[0], incs[1]]),
            (Duration::from_millis(2001), vec![incs[0]]),
            (Duration::from_millis(3600), vec![]),
        ];
        for (at, want) in cases {
            let got: Vec<u64> = alive(&st, &live, t0 + at, detect).not_dead.into_iter().collect();
            assert_eq!(got, want, "at {at:?}");
        }
        let now = alive(&st, &live, t0 + Duration::from_millis(1600), detect);
        assert_eq!(
            now.renewing.into_iter().collect::<Vec<_>>(),
            vec![incs[0]],
            "only the one heard renews"
        );
        live.step_down();
        assert!(
            alive(&st, &live, t0, detect).not_dead.is_empty(),
            "a follower knows nobody is alive"
        );
    }
}
