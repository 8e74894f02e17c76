//! After the final heal every uid touched during the run must be served again: an ok fetch of it
//! invoked at or after the start of the verify phase. A uid left unserved means a section was
//! stranded (no owner, a fence never lifted), which no per-call promise would notice. Likewise,
//! a run that asked for time-ordered ids must get some again after the heal: a slot no holder can
//! raise, or a clock check that never lets go, would otherwise pass every U-promise by issuing
//! nothing.

use super::{Promise, Violation};
use crate::history::{Call, IdCall, Outcome};
use crate::keys::label;
use std::collections::{BTreeMap, HashSet};

pub fn check(calls: &[Call], verify_from_ns: u64) -> Vec<Violation> {
    let mut touched: BTreeMap<u64, u64> = BTreeMap::new();
    let mut served: HashSet<u64> = HashSet::new();
    for c in calls {
        if c.invoke_ns < verify_from_ns {
            for &uid in &c.uids {
                touched.insert(uid, c.id);
            }
        } else if c.outcome == Outcome::Ok && c.is_fetch() {
            served.extend(c.uids.iter().copied());
        }
    }
    touched
        .into_iter()
        .filter(|(uid, _)| !served.contains(uid))
        .map(|(uid, last)| {
            Violation::new(
                Promise::Liveness,
                format!("{} was not served again after the final heal", label(uid)),
                vec![last],
            )
        })
        .collect()
}

/// Time-ordered ids: when any `NextIds` call ran before the verify phase, one must succeed in it.
pub fn check_ids(calls: &[IdCall], verify_from_ns: u64) -> Vec<Violation> {
    let Some(before) = calls.iter().rfind(|c| c.invoke_ns < verify_from_ns) else {
        return Vec::new();
    };
    let served = calls
        .iter()
        .any(|c| c.invoke_ns >= verify_from_ns && c.outcome == Outcome::Ok);
    if served {
        return Vec::new();
    }
    vec![Violation::new(
        Promise::Liveness,
        "no NextIds call succeeded after the final heal",
        vec![before.id],
    )]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checks::test_util::*;

    #[test]
    fn table() {
        let cases: Vec<Case> = vec![
            (
                "served again",
                vec![fetch(1, 5, 0, 1, 1), batch(2, &[5], 100, 101, &[2])],
                vec![],
            ),
            (
                "planted stranded uid",
                vec![
                    fetch(1, 5, 0, 1, 1),
                    unknown(2, 6, 2, 3),
                    batch(3, &[5], 100, 101, &[2]),
                ],
                vec![vec![2]],
            ),
            (
                "a failed verify call does not count",
                vec![fetch(1, 5, 0, 1, 1), failed(2, 5, 100, 101)],
                vec![vec![1]],
            ),
            (
                "a get does not count",
                vec![fetch(1, 5, 0, 1, 1), get(2, 5, 100, 101, 1)],
                vec![vec![1]],
            ),
        ];
        for (name, calls, want) in cases {
            assert_eq!(ids(&check(&calls, 100)), want, "{name}");
        }
    }
}
