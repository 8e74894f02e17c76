//! P6 bounded waste: with no faults, a uid's consecutive ok seqs differ by exactly 1.
//!
//! A gap between consecutive ok seqs `a < b` of a uid is *excused* when something that may skip
//! numbers happened between the two calls:
//! - the owners that answered differ (restart or ownership change: reserved-but-unused numbers
//!   are skipped by design), or an owner is not known;
//! - a fault window overlaps the span of the two calls;
//! - unknown or failed fetches of that uid, invoked before `b` completed, may have consumed the
//!   missing numbers (each accounts for one number per occurrence of the uid, counted greedily).
//!
//! Unexplained gaps are violations only in a fault-free run; in a run with faults they are a
//! statistic (the timing of a fault's effect on a server is not exactly known).

use super::{Promise, Violation};
use crate::history::{Call, FaultSpan, Outcome, OwnerTag};
use crate::keys::{label, section_of};
use serde::Serialize;
use std::collections::HashMap;

/// Gap statistics over a whole history.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GapStats {
    /// Pairs of consecutive ok seqs that differ by more than 1.
    pub gaps: usize,
    pub excused: usize,
    pub unexplained: usize,
    /// Largest difference between consecutive ok seqs.
    pub max_gap: u64,
}

#[derive(Clone, Copy)]
struct Seen {
    call: u64,
    invoke_ns: u64,
    complete_ns: u64,
    value: u64,
    owner: Option<(u64, u64)>,
}

fn owner_for(owners: &[OwnerTag], section: Option<u64>) -> Option<(u64, u64)> {
    let pick = match section {
        Some(s) => owners.iter().find(|o| o.section == s),
        None if owners.len() == 1 => owners.first(),
        None => None,
    };
    pick.map(|o| (o.incarnation, o.epoch))
}

/// Without sections: a batch reply's owners are matched to a uid only when there is one.
pub fn check(calls: &[Call], faults: &[FaultSpan], fault_free: bool) -> (Vec<Violation>, GapStats) {
    check_with_sections(calls, faults, fault_free, 0, 0)
}

/// Every ok value per uid (with who served it), and the invoke times of the calls per uid that
/// failed or whose outcome is unknown (each may have used up a number).
fn collect(calls: &[Call], section_size: u64, uid_limit: u64) -> (HashMap<u64, Vec<Seen>>, HashMap<u64, Vec<u64>>) {
    let mut seen: HashMap<u64, Vec<Seen>> = HashMap::new();
    let mut doubtful: HashMap<u64, Vec<u64>> = HashMap::new();
    for c in calls.iter().filter(|c| c.is_fetch()) {
        match c.outcome {
            Outcome::Ok => {
                for (uid, value) in c.ok_values() {
                    let section = (section_size > 0).then(|| section_of(uid, section_size, uid_limit));
                    seen.entry(uid).or_default().push(Seen {
                        call: c.id,
                        invoke_ns: c.invoke_ns,
                        complete_ns: c.complete_ns,
                        value,
                        owner: owner_for(&c.owners, section),
                    });
                }
            }
            Outcome::Failed | Outcome::Unknown => {
                for &uid in &c.uids {
                    doubtful.entry(uid).or_default().push(c.invoke_ns);
                }
            }
        }
    }
    (seen, doubtful)
}

/// `section_size` (0 = unknown) and `uid_limit` (where keys are placed) let a batch reply's
/// owners be matched to a uid or key.
pub fn check_with_sections(
    calls: &[Call],
    faults: &[FaultSpan],
    fault_free: bool,
    section_size: u64,
    uid_limit: u64,
) -> (Vec<Violation>, GapStats) {
    let (mut seen, mut doubtful) = collect(calls, section_size, uid_limit);
    let mut stats = GapStats::default();
    let mut out = Vec::new();
    let mut uids: Vec<_> = seen.keys().copied().collect();
    uids.sort_unstable();
    for uid in uids {
        let list = seen.get_mut(&uid).expect("key from map");
        list.sort_by_key(|s| s.value);
        let mut doubts = doubtful.remove(&uid).unwrap_or_default();
        doubts.sort_unstable();
        let mut used = 0usize;
        for w in list.windows(2) {
            let (a, b) = (w[0], w[1]);
            let diff = b.value - a.value;
            stats.max_gap = stats.max_gap.max(diff);
            if diff <= 1 {
                continue;
            }
            stats.gaps += 1;
            let missing = (diff - 1) as usize;
            let owner_changed = a.owner.is_none() || a.owner != b.owner;
            let lo = a.invoke_ns.min(b.invoke_ns);
            let hi = a.complete_ns.max(b.complete_ns);
            let faulted = faults.iter().any(|f| f.start_ns <= hi && f.end_ns >= lo);
            let eligible = doubts.partition_point(|&t| t < b.complete_ns).saturating_sub(used);
            let by_doubt = eligible >= missing;
            if by_doubt {
                used += missing;
            }
            if owner_changed || faulted || by_doubt {
                stats.excused += 1;
                continue;
            }
            stats.unexplained += 1;
            if fault_free {
                out.push(Violation::new(
                    Promise::P6,
                    format!(
                        "{}: seq jumped from {} to {} under one owner with no fault",
                        label(uid),
                        a.value,
                        b.value
                    ),
                    vec![a.call, b.call],
                ));
            }
        }
    }
    (out, stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checks::test_util::*;

    fn fault(start: u64, end: u64) -> FaultSpan {
        FaultSpan {
            id: 1,
            kind: "kill".into(),
            target: "x".into(),
            start_ns: start,
            end_ns: end,
        }
    }

    #[test]
    fn table() {
        let o = |c, e| owned(c, 0, 1, 11, e);
        // (name, calls, faults, fault_free, violations, stats (gaps, excused, unexplained, max_gap))
        #[allow(clippy::type_complexity)]
        let cases: Vec<(&str, Vec<Call>, Vec<FaultSpan>, bool, usize, (usize, usize, usize, u64))> = vec![
            (
                "dense",
                vec![o(fetch(1, 5, 0, 1, 1), 1), o(fetch(2, 5, 2, 3, 2), 1)],
                vec![],
                true,
                0,
                (0, 0, 0, 1),
            ),
            (
                "planted gap",
                vec![o(fetch(1, 5, 0, 1, 1), 1), o(fetch(2, 5, 2, 3, 3), 1)],
                vec![],
                true,
                1,
                (1, 0, 1, 2),
            ),
            (
                "gap is only a stat with faults elsewhere",
                vec![o(fetch(1, 5, 0, 1, 1), 1), o(fetch(2, 5, 2, 3, 3), 1)],
                vec![],
                false,
                0,
                (1, 0, 1, 2),
            ),
            (
                "owner change excuses",
                vec![o(fetch(1, 5, 0, 1, 1), 1), o(fetch(2, 5, 2, 3, 10_001), 2)],
                vec![],
                true,
                0,
                (1, 1, 0, 10_000),
            ),
            (
                "fault in between excuses",
                vec![o(fetch(1, 5, 0, 1, 1), 1), o(fetch(2, 5, 10, 11, 50), 1)],
                vec![fault(5, 6)],
                true,
                0,
                (1, 1, 0, 49),
            ),
            (
                "unknown fetch explains one missing number",
                vec![
                    o(fetch(1, 5, 0, 1, 1), 1),
                    unknown(2, 5, 2, 3),
                    o(fetch(3, 5, 4, 5, 3), 1),
                ],
                vec![],
                true,
                0,
                (1, 1, 0, 2),
            ),
            (
                "one unknown does not explain two missing numbers",
                vec![
                    o(fetch(1, 5, 0, 1, 1), 1),
                    unknown(2, 5, 2, 3),
                    o(fetch(3, 5, 4, 5, 4), 1),
                ],
                vec![],
                true,
                1,
                (1, 0, 1, 3),
            ),
            (
                "values are ordered by value, not time",
                vec![o(fetch(1, 5, 0, 10, 2), 1), o(fetch(2, 5, 1, 9, 1), 1)],
                vec![],
                true,
                0,
                (0, 0, 0, 1),
            ),
        ];
        for (name, calls, faults, fault_free, want_v, (g, e, u, m)) in cases {
            let (v, s) = check(&calls, &faults, fault_free);
            assert_eq!(v.len(), want_v, "{name}: {v:?}");
            assert_eq!(
                s,
                GapStats {
                    gaps: g,
                    excused: e,
                    unexplained: u,
                    max_gap: m
                },
                "{name}"
            );
        }
    }
}
