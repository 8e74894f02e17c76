//! P5 read consistency: an ok `GetCurSeq(uid)` returns a value ≥ every seq fetched for that uid by
//! ok fetches that completed before the get was invoked. Only *completed ok* fetches constrain a
//! get; an unknown fetch may or may not have happened and constrains nothing.
//!
//! After an ownership change a get may return the loaded base, above anything issued: that is
//! allowed (≥), and is why this check has no upper bound.

use super::{Promise, Violation, ok_obs_by_uid, sweep_completed_before};
use crate::history::Call;
use crate::keys::label;

pub fn check(calls: &[Call]) -> Vec<Violation> {
    let fetches = ok_obs_by_uid(calls, true);
    let gets = ok_obs_by_uid(calls, false);
    let mut uids: Vec<_> = gets.keys().copied().collect();
    uids.sort_unstable();
    let mut out = Vec::new();
    for uid in uids {
        let Some(done) = fetches.get(&uid) else { continue };
        for (g, f) in sweep_completed_before(done, &gets[&uid]) {
            if let Some(f) = f
                && g.value < f.value
            {
                out.push(Violation::new(
                    Promise::P5,
                    format!(
                        "{}: get returned {} below seq {} fetched by call {} before the get began",
                        label(uid),
                        g.value,
                        f.value,
                        f.call
                    ),
                    vec![f.call, g.call],
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checks::test_util::*;

    #[test]
    fn table() {
        let cases: Vec<Case> = vec![
            (
                "get sees the last fetch",
                vec![fetch(1, 5, 0, 10, 7), get(2, 5, 11, 12, 7)],
                vec![],
            ),
            (
                "loaded base above anything issued",
                vec![fetch(1, 5, 0, 10, 7), get(2, 5, 11, 12, 10_000)],
                vec![],
            ),
            (
                "planted stale get",
                vec![fetch(1, 5, 0, 10, 7), get(2, 5, 11, 12, 6)],
                vec![vec![1, 2]],
            ),
            (
                "concurrent fetch does not constrain",
                vec![fetch(1, 5, 0, 20, 7), get(2, 5, 11, 12, 6)],
                vec![],
            ),
            (
                "unknown fetch does not constrain",
                vec![fetch(1, 5, 0, 10, 7), unknown(2, 5, 11, 12), get(3, 5, 13, 14, 7)],
                vec![],
            ),
            (
                "other uid does not constrain",
                vec![fetch(1, 6, 0, 10, 7), get(2, 5, 11, 12, 1)],
                vec![],
            ),
            (
                "batch fetch constrains",
                vec![batch(1, &[5, 6], 0, 10, &[3, 9]), get(2, 6, 11, 12, 8)],
                vec![vec![1, 2]],
            ),
            (
                "get before the fetch began is not constrained by it",
                vec![get(2, 5, 0, 5, 1), fetch(1, 5, 6, 10, 7)],
                vec![],
            ),
        ];
        for (name, calls, want) in cases {
            assert_eq!(ids(&check(&calls)), want, "{name}");
        }
    }
}
