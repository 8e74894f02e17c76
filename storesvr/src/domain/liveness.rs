//! Liveness as seen by the leader: when it last heard from each AllocSvr incarnation.
//!
//! Liveness is in-memory and belongs to one leadership. A new leader trusts no liveness data
//! from the old one (a leadership regained in a later term is a new leadership, even when no tick
//! saw it lost): it starts every incarnation's clock at the moment it became leader, so nobody is
//! declared dead before one full detection interval has passed under the new leader.
//!
//! An incarnation may draw sections only once this leader has heard a renewal from it within the
//! detection interval ([`Alive::renewing`]): a process that dies right after registering is never
//! planned anything, and is expired one detection interval after its registration. One that is
//! merely not declared dead yet ([`Alive::not_dead`]: just registered, or not heard by a new
//! leader yet) keeps what it owns but gets nothing new.
//!
//! It also bounds how long an owner this leader heard may still hold a lease
//! ([`Liveness::predecessor_wait`], docs/DESIGN.md, ownership rule 4): an owner's lease from a
//! renewal ends, on the leader's lease clock, at most `lease·(1+drift)+margin` after the leader
//! received that renewal, and "heard" is recorded before the reply that confirms it is built.
//!
//! Pure: every method is handed `now`; nothing here reads a clock.
//!
//! Left out: liveness of StoreSvr replicas (Raft's business) and any persistence (a new leader
//! starts over on purpose).

use super::state::{SetParams, SetState};
use seqsvr_proto::Incarnation;
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// Liveness as seen by this leader.
#[derive(Debug, Default)]
pub struct Liveness {
    leader_since: Option<Instant>,
    /// The Raft term this node leads in.
    term: u64,
    /// When this leader last heard of each incarnation, and whether that was a renewal (true)
    /// or only its registration (false).
    last_renew: HashMap<Incarnation, (Instant, bool)>,
    /// How many time-ordered id slots each incarnation asked for in its last renewal (absent: one).
    slots_wanted: HashMap<Incarnation, usize>,
    /// The release each incarnation said it runs in its last renewal (Status shows it; absent
    /// from AllocSvrs older than 0.2.0).
    versions: HashMap<Incarnation, String>,
    /// From when this leader can bound every earlier owner's lease by what it heard: its
    /// leadership's start, moved later when the arbiter takes sections whose earlier owners it
    /// never heard ([`Liveness::mark_unknown`]).
    known_since: Option<Instant>,
    /// When this leader first heard each incarnation's renewal: used only by the negative
    /// control `--unsafe-predecessor-wait-from-first-renewal`.
    first_renew: HashMap<Incarnation, Instant>,
}

/// Who the arbiter may plan with, at one instant.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Alive {
    /// Renewed with this leader within the detection interval: may gain sections.
    pub renewing: BTreeSet<Incarnation>,
    /// Not declared dead (a superset of `renewing`): keeps what it owns.
    pub not_dead: BTreeSet<Incarnation>,
}

impl Liveness {
    /// Called when this node becomes leader: forget everything heard before.
    pub fn become_leader(&mut self, now: Instant) {
        self.leader_since = Some(now);
        self.known_since = Some(now);
        self.last_renew.clear();
        self.slots_wanted.clear();
        self.versions.clear();
        self.first_renew.clear();
    }

    /// Called when this node stops leading: what it heard is of no use to the next leader.
    pub fn step_down(&mut self) {
        self.leader_since = None;
        self.known_since = None;
        self.last_renew.clear();
        self.slots_wanted.clear();
        self.versions.clear();
        self.first_renew.clear();
    }

    fn is_leader(&self) -> bool {
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

    /// A renewal is answered in Raft term `term`. When that is not the term this liveness was
    /// gathered in, leadership was lost and regained since the last arbiter tick (which resets
    /// it): another leader may have confirmed renewals this one never heard, so what it heard
    /// bounds no lease, and no grant carries a shorter wait until that tick starts afresh.
    pub fn note_term(&mut self, term: u64) {
        if self.leader_since.is_some() && term != self.term {
            self.known_since = None;
        }
    }

    /// A renewal from the incarnation reached this leader.
    pub fn record(&mut self, incarnation: Incarnation, now: Instant) {
        if self.leader_since.is_some() {
            self.last_renew.insert(incarnation, (now, true));
            self.first_renew.entry(incarnation).or_insert(now);
        }
    }

    /// The arbiter is taking sections whose earlier owners this leader may never have heard (a
    /// restored set's, or behind an owner that released without having waited): until a whole
    /// wait has passed from `now`, no grant carries a shorter one.
    pub fn mark_unknown(&mut self, now: Instant) {
        if self.leader_since.is_some() {
            self.known_since = Some(now);
        }
    }

    /// What is left at `now` of the longest lease that an incarnation no longer registered may
    /// still hold, `whole` (= `lease·(1+drift)+margin`) after this leader last heard it; `None`
    /// when this leader cannot bound it: not the leader, or less than `whole` since it became
    /// leader or since [`Liveness::mark_unknown`] (an owner it never heard may have renewed with
    /// an earlier leader until then).
    ///
    /// Every incarnation gone from the set counts, not only the section's previous owner: that
    /// covers chains (an owner that took a section by force and released it before its wait
    /// ended, or died, leaves the one before it still to be waited out) at the cost of waiting
    /// for an unrelated death of the last `whole`. An incarnation still registered is either the
    /// grantee, a live owner that released (having waited, so no wait is asked, or without
    /// having served), or one the arbiter does not take from.
    pub fn predecessor_wait(
        &self,
        registered: impl Fn(Incarnation) -> bool,
        now: Instant,
        whole: Duration,
        unsafe_from_first: bool,
    ) -> Option<Duration> {
        let since = self.known_since?;
        if now.saturating_duration_since(since) < whole {
            return None;
        }
        let heard: Box<dyn Iterator<Item = (&Incarnation, Instant)>> = if unsafe_from_first {
            Box::new(self.first_renew.iter().map(|(i, t)| (i, *t)))
        } else {
            Box::new(self.last_renew.iter().map(|(i, (t, _))| (i, *t)))
        };
        Some(
            heard
                .filter(|(i, _)| !registered(**i))
                .map(|(_, t)| whole.saturating_sub(now.saturating_duration_since(t)))
                .max()
                .unwrap_or(Duration::ZERO),
        )
    }

    /// The id slots the incarnation asked for in a renewal that reached this leader (0: one).
    pub fn want_slots(&mut self, incarnation: Incarnation, slots: u32) {
        if self.leader_since.is_some() {
            self.slots_wanted.insert(incarnation, (slots as usize).max(1));
        }
    }

    /// The release the incarnation reported in a renewal that reached this leader ("" from
    /// AllocSvrs older than 0.2.0); the string is replaced only when it changes.
    pub fn report_version(&mut self, incarnation: Incarnation, version: &str) {
        if self.leader_since.is_some() && self.versions.get(&incarnation).is_none_or(|v| v != version) {
            self.versions.insert(incarnation, version.to_owned());
        }
    }

    /// What the incarnation last reported as its release; "" when unknown.
    pub fn version(&self, incarnation: Incarnation) -> &str {
        self.versions.get(&incarnation).map_or("", String::as_str)
    }

    /// The id slots the incarnation last asked for: at least one.
    pub fn slots_wanted(&self, incarnation: Incarnation) -> usize {
        self.slots_wanted.get(&incarnation).copied().unwrap_or(1)
    }

    /// The incarnation registered through this leader: its detection clock starts, but it is not
    /// renewing until its first renewal arrives.
    pub fn registered(&mut self, incarnation: Incarnation, now: Instant) {
        if self.leader_since.is_some() {
            self.last_renew.entry(incarnation).or_insert((now, false));
        }
    }

    /// When this leader last heard from the incarnation (or became leader).
    pub fn last_seen(&self, incarnation: Incarnation) -> Option<Instant> {
        self.last_renew.get(&incarnation).map(|(t, _)| *t).or(self.leader_since)
    }

    /// Whether this leader heard a renewal from the incarnation.
    pub fn has_renewed(&self, incarnation: Incarnation) -> bool {
        self.last_renew.get(&incarnation).is_some_and(|(_, renewed)| *renewed)
    }
}

/// How long after the leader heard a renewal no lease it confirmed can still run: the lease
/// stretched by the drift bound, plus the margin (what a gaining owner waits when it knows
/// nothing better, and a move's wait after a freeze).
pub fn whole_wait(p: &SetParams) -> Duration {
    p.lease().mul_f64(1.0 + p.drift_ppm as f64 / 1e6) + p.margin()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::testing::set_with;

    #[test]
    fn versions_are_recorded_only_by_a_leader_and_forgotten_when_it_steps_down() {
        let (_, incs) = set_with(&[1]);
        let t0 = Instant::now();
        let mut live = Liveness::default();
        live.report_version(incs[0], "0.2.0 (commit x)");
        assert_eq!(live.version(incs[0]), "", "a follower records nothing");
        assert!(live.observe_leadership(true, 1, t0));
        live.report_version(incs[0], "0.2.0 (commit x)");
        assert_eq!(live.version(incs[0]), "0.2.0 (commit x)");
        // An AllocSvr rolled back to a release that does not say: unknown again.
        live.report_version(incs[0], "");
        assert_eq!(live.version(incs[0]), "");
        live.report_version(incs[0], "0.2.0 (commit x)");
        assert!(!live.observe_leadership(false, 1, t0));
        assert_eq!(live.version(incs[0]), "", "what a former leader heard is of no use");
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
        let got: Vec<Incarnation> = alive(&st, &live, t1 + Duration::from_millis(100), detect)
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
            let got: Vec<Incarnation> = alive(&st, &live, t0 + at, detect).not_dead.into_iter().collect();
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

    #[test]
    fn a_renewal_answered_in_a_later_term_bounds_no_lease_until_the_next_tick() {
        let t0 = Instant::now();
        let whole = Duration::from_millis(3_130);
        let gone = |_| false;
        let mut live = Liveness::default();
        assert!(live.observe_leadership(true, 1, t0));
        live.record(Incarnation(7), t0 + whole);
        let at = t0 + whole + Duration::from_millis(100);
        assert_eq!(
            live.predecessor_wait(gone, at, whole, false),
            Some(whole - Duration::from_millis(100))
        );
        // Leadership lost and regained before the arbiter's next tick: nothing heard counts.
        live.note_term(2);
        assert_eq!(live.predecessor_wait(gone, at, whole, false), None);
        // The tick in term 2 starts afresh: a whole wait must pass before any shorter one.
        assert!(live.observe_leadership(true, 2, at));
        assert_eq!(
            live.predecessor_wait(gone, at + whole - Duration::from_millis(1), whole, false),
            None
        );
        live.note_term(2);
        assert_eq!(
            live.predecessor_wait(gone, at + whole, whole, false),
            Some(Duration::ZERO)
        );
    }
}
