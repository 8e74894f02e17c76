//! Which of the cluster's sections a set may serve: its range states.
//!
//! Every set keeps a [`RangeTable`] over the whole section space. A section is in exactly one of:
//!
//! - absent (no entry): another set's, or nobody's; the set never serves, bumps or grants it;
//! - [`RangeState::Owned`]: the set serves it (its arbiter grants it, its owners bump it);
//! - [`RangeState::Importing`]: a move into this set has begun; nothing is served yet;
//! - [`RangeState::Migrating`]: a move out of this set has frozen it: bumps and grants are refused
//!   and the owners are asked to hand it over;
//! - [`RangeState::Tombstoned`]: it moved to another set; requests are answered with where to go.
//!
//! The table is a map of maximal runs `[begin, end)` with one state each; neighbours with equal
//! states are merged, so its size is the number of state changes along the section space, not the
//! number of sections.
//!
//! Left out: the transitions' rules (which state may follow which). They belong to the commands
//! in `state.rs`, which check them before they call [`RangeTable::set`].

use seqsvr_proto::SectionId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Identifies one move of a uid range between sets; chosen by the operator's tool, unique.
pub type OpId = u64;

/// What a set may do with a run of sections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RangeState {
    Owned,
    /// Move `op` will install the range here.
    Importing {
        op: OpId,
    },
    /// Move `op` froze the range here on its way to `to_set`.
    Migrating {
        op: OpId,
        to_set: u64,
    },
    /// Move `op` took the range to `to_set`; the cluster map says so from `map_version` on.
    Tombstoned {
        op: OpId,
        to_set: u64,
        map_version: u64,
    },
}

/// A run of sections `[begin, end)` in one state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RangeRun<S = RangeState> {
    pub begin: SectionId,
    pub end: SectionId,
    pub state: S,
}

/// Values over the section space as maximal runs keyed by their first section: a set's range
/// states, or the cluster map's set per section.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RangeTable<S = RangeState> {
    /// begin → (end, state); runs do not overlap, and touching runs have different states.
    runs: BTreeMap<SectionId, (SectionId, S)>,
}

impl<S> Default for RangeTable<S> {
    fn default() -> Self {
        Self { runs: BTreeMap::new() }
    }
}

impl RangeTable<RangeState> {
    pub fn is_owned(&self, section: SectionId) -> bool {
        self.state_at(section) == Some(RangeState::Owned)
    }

    /// The owned runs, in order.
    pub fn owned(&self) -> impl Iterator<Item = RangeRun> + '_ {
        self.runs().filter(|r| r.state == RangeState::Owned)
    }
}

impl<S: Copy + Eq> RangeTable<S> {
    /// The state of `section`, or `None` when it has none.
    pub fn state_at(&self, section: SectionId) -> Option<S> {
        let (_, &(end, state)) = self.runs.range(..=section).next_back()?;
        (section < end).then_some(state)
    }

    /// The runs that overlap `[begin, end)`, clipped to it, absent parts left out, in order.
    pub fn runs_in(&self, begin: SectionId, end: SectionId) -> Vec<RangeRun<S>> {
        if begin >= end {
            return Vec::new();
        }
        let first = self.runs.range(..=begin).next_back().map_or(begin, |(&b, _)| b);
        self.runs
            .range(first..end)
            .filter(|(_, (e, _))| *e > begin)
            .map(|(&b, &(e, state))| RangeRun {
                begin: b.max(begin),
                end: e.min(end),
                state,
            })
            .collect()
    }

    /// Every run, in order.
    pub fn runs(&self) -> impl Iterator<Item = RangeRun<S>> + '_ {
        self.runs
            .iter()
            .map(|(&begin, &(end, state))| RangeRun { begin, end, state })
    }

    /// Whether every section of `[begin, end)` satisfies `pred` (an absent section gives `None`).
    pub fn all(&self, begin: SectionId, end: SectionId, pred: impl Fn(Option<S>) -> bool) -> bool {
        let mut at = begin;
        for run in self.runs_in(begin, end) {
            if run.begin > at && !pred(None) {
                return false;
            }
            if !pred(Some(run.state)) {
                return false;
            }
            at = run.end;
        }
        at >= end || pred(None)
    }

    /// Puts `[begin, end)` into `state` (`None` removes it), splitting and merging runs.
    pub fn set(&mut self, begin: SectionId, end: SectionId, state: Option<S>) {
        if begin >= end {
            return;
        }
        self.split_at(begin);
        self.split_at(end);
        let inside: Vec<SectionId> = self.runs.range(begin..end).map(|(&b, _)| b).collect();
        for b in inside {
            self.runs.remove(&b);
        }
        if let Some(state) = state {
            self.runs.insert(begin, (end, state));
        }
        self.merge_around(begin);
        self.merge_around(end);
    }

    /// Makes `at` a run boundary (no run crosses it).
    fn split_at(&mut self, at: SectionId) {
        let Some((&b, &(e, state))) = self.runs.range(..at).next_back() else {
            return;
        };
        if e > at {
            self.runs.insert(b, (at, state));
            self.runs.insert(at, (e, state));
        }
    }

    /// Joins the run ending at `at` with the one starting there when their states are equal.
    fn merge_around(&mut self, at: SectionId) {
        let Some((&b, &(e, left))) = self.runs.range(..at).next_back() else {
            return;
        };
        if e != at {
            return;
        }
        if let Some(&(right_end, right)) = self.runs.get(&at)
            && right == left
        {
            self.runs.remove(&at);
            self.runs.insert(b, (right_end, left));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIGRATING: RangeState = RangeState::Migrating { op: 7, to_set: 2 };

    fn s(n: u64) -> SectionId {
        SectionId(n)
    }

    #[test]
    fn set_splits_and_merges_runs() {
        let mut t = RangeTable::default();
        t.set(s(0), s(10), Some(RangeState::Owned));
        t.set(s(3), s(5), Some(MIGRATING));
        assert_eq!(t.state_at(s(2)), Some(RangeState::Owned));
        assert_eq!(t.state_at(s(4)), Some(MIGRATING));
        assert_eq!(t.runs().count(), 3);
        t.set(s(3), s(5), Some(RangeState::Owned));
        assert_eq!(t.runs().count(), 1, "equal neighbours merge back into one run");
        t.set(s(8), s(12), None);
        assert_eq!(t.state_at(s(8)), None);
        assert_eq!(t.runs_in(s(5), s(20)).len(), 1);
        assert!(t.all(s(0), s(8), |st| st == Some(RangeState::Owned)));
        assert!(!t.all(s(0), s(9), |st| st == Some(RangeState::Owned)), "8 is absent");
        assert!(t.all(s(8), s(30), |st| st.is_none()));
    }

    /// The table against a plain array of per-section states.
    fn check(ops: &[(u64, u64, u8)]) {
        const N: u64 = 40;
        let state = |k: u8| match k % 4 {
            0 => None,
            1 => Some(RangeState::Owned),
            2 => Some(MIGRATING),
            _ => Some(RangeState::Importing { op: 7 }),
        };
        let mut t = RangeTable::default();
        let mut model = vec![None; N as usize];
        for &(a, b, k) in ops {
            let (begin, end) = (a.min(b), a.max(b));
            t.set(s(begin), s(end), state(k));
            for slot in &mut model[begin as usize..end as usize] {
                *slot = state(k);
            }
        }
        for (i, want) in model.iter().enumerate() {
            assert_eq!(t.state_at(s(i as u64)), *want, "section {i}");
        }
        // Maximal runs: no two touching runs share a state, none is empty.
        let runs: Vec<RangeRun> = t.runs().collect();
        for pair in runs.windows(2) {
            assert!(pair[0].end <= pair[1].begin);
            assert!(pair[0].end < pair[1].begin || pair[0].state != pair[1].state);
        }
        assert!(runs.iter().all(|r| r.begin < r.end));
        for (b, e) in [(0, N), (5, 17), (39, 40), (12, 12), (20, 10)] {
            let runs = t.runs_in(s(b), s(e));
            assert!(
                runs.iter().all(|r| r.begin < r.end),
                "runs_in({b}, {e}) has an empty run"
            );
            let covered: u64 = runs.iter().map(|r| r.end.0 - r.begin.0).sum();
            let want = model[b as usize..e.max(b) as usize]
                .iter()
                .filter(|x| x.is_some())
                .count() as u64;
            assert_eq!(covered, want, "runs_in({b}, {e})");
        }
    }

    proptest! {
        #[test]
        fn table_matches_a_per_section_model(ops in proptest::collection::vec((0u64..40, 0u64..40, 0u8..4), 0..30)) {
            check(&ops);
        }
    }
}
