//! P1 no duplicate, no decrease: for every uid, if ok fetch A completed before ok fetch B was
//! invoked then `seq(A) < seq(B)`; no two ok fetches of a uid share a seq; an ok seq is never 0.
//!
//! Per uid: one sweep over fetches sorted by complete and by invoke with a running maximum
//! (O(n log n)), and one sort by value for duplicates. Unknown and failed fetches give no value;
//! they can neither be "A" nor "B".

use seqsvr_promises::order::{Finding, check_subject};

use super::{Obs, Promise, Violation, ok_obs_by_uid};
use crate::history::Call;
use crate::keys::label;

/// All P1 violations of the history, ordered by uid then time.
pub fn check(calls: &[Call]) -> Vec<Violation> {
    let by_uid = ok_obs_by_uid(calls, true);
    let mut uids: Vec<_> = by_uid.keys().copied().collect();
    uids.sort_unstable();
    let mut out = Vec::new();
    for uid in uids {
        check_uid(uid, &by_uid[&uid], &mut out);
    }
    out
}

fn check_uid(uid: u64, obs: &[Obs], out: &mut Vec<Violation>) {
    for f in check_subject(obs) {
        out.push(match f {
            Finding::Zero(o) => Violation::new(
                Promise::P1,
                format!("{}: ok fetch returned seq 0", label(uid)),
                vec![o.call],
            ),
            Finding::NotAbove { earlier: a, later: b } => Violation::new(
                Promise::P1,
                format!(
                    "{}: seq went from {} (call {} completed at {} ns) to {} (call {} invoked at {} ns)",
                    label(uid),
                    a.value,
                    a.call,
                    a.complete_ns,
                    b.value,
                    b.call,
                    b.invoke_ns
                ),
                vec![a.call, b.call],
            ),
            Finding::Twice { first, second } => Violation::new(
                Promise::P1,
                format!("{}: seq {} handed out twice", label(uid), first.value),
                vec![first.call, second.call],
            ),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checks::test_util::*;

    #[test]
    fn table() {
        // (name, history, expected offending call-id groups)
        let cases: Vec<Case> = vec![
            (
                "sequential increasing",
                vec![fetch(1, 5, 0, 10, 1), fetch(2, 5, 11, 20, 2)],
                vec![],
            ),
            (
                "planted decrease",
                vec![fetch(1, 5, 0, 10, 7), fetch(2, 5, 11, 20, 3)],
                vec![vec![1, 2]],
            ),
            (
                "planted repeat in sequence",
                vec![fetch(1, 5, 0, 10, 7), fetch(2, 5, 11, 20, 7)],
                vec![vec![1, 2], vec![1, 2]],
            ),
            (
                "concurrent calls may return in any order",
                vec![fetch(1, 5, 0, 100, 9), fetch(2, 5, 50, 60, 8), fetch(3, 5, 10, 200, 3)],
                vec![],
            ),
            (
                "concurrent calls must still not share a seq",
                vec![fetch(1, 5, 0, 100, 9), fetch(2, 5, 50, 60, 9)],
                vec![vec![1, 2]],
            ),
            (
                "complete equal to invoke is concurrent",
                vec![fetch(1, 5, 0, 10, 9), fetch(2, 5, 10, 20, 3)],
                vec![],
            ),
            (
                "uids are independent",
                vec![fetch(1, 5, 0, 10, 9), fetch(2, 6, 11, 20, 3)],
                vec![],
            ),
            (
                "unknown outcome is not an earlier value",
                vec![fetch(1, 5, 0, 10, 4), unknown(2, 5, 11, 20), fetch(3, 5, 21, 30, 5)],
                vec![],
            ),
            (
                "failed call between is ignored",
                vec![failed(2, 5, 0, 5), fetch(3, 5, 6, 30, 5)],
                vec![],
            ),
            (
                "batch values count per uid",
                vec![
                    batch(1, &[5, 6], 0, 10, &[4, 40]),
                    fetch(2, 6, 11, 20, 39),
                    fetch(3, 5, 11, 20, 5),
                ],
                vec![vec![1, 2]],
            ),
            ("zero seq is refused", vec![fetch(1, 5, 0, 10, 0)], vec![vec![1]]),
            (
                "decrease against the max of many earlier calls",
                vec![
                    fetch(1, 5, 0, 10, 50),
                    fetch(2, 5, 20, 30, 60),
                    fetch(3, 5, 5, 100, 10),
                    fetch(4, 5, 40, 50, 55),
                ],
                vec![vec![2, 4]],
            ),
        ];
        for (name, calls, want) in cases {
            assert_eq!(ids(&check(&calls)), want, "{name}");
        }
    }

    #[test]
    fn large_history_is_checked_quickly() {
        // 200k strictly increasing sequential fetches of one uid plus one planted decrease.
        let mut calls: Vec<Call> = (0..200_000u64)
            .map(|i| fetch(i, 1, i * 10, i * 10 + 5, i + 1))
            .collect();
        calls.push(fetch(999_999, 1, 2_000_001, 2_000_002, 3));
        let t = std::time::Instant::now();
        let v = check(&calls);
        assert!(t.elapsed() < std::time::Duration::from_secs(5));
        assert_eq!(v.len(), 2, "one decrease and one duplicate of seq 3: {v:?}");
    }
}
