//! P2 served ≤ durable: every ok value (fetched or read) is ≤ the final `max_seq` of its section,
//! read linearizably after the run. `max_seq` only grows (P3), so a value above the final ceiling
//! was above every ceiling the Raft group ever committed.
//!
//! Left out on purpose: checking against the ceiling *at the time* of the call; the store does
//! not expose that history, and the final ceiling is the weaker bound that always holds.

use super::{CheckError, Promise, Violation};
use crate::history::Call;
use crate::keys::{label, section_of};
use std::collections::BTreeMap;

/// All P2 violations. A section with no final `max_seq` is a harness problem, not a violation.
pub fn check(
    calls: &[Call],
    section_size: u64,
    uid_limit: u64,
    placement: seqsvr_proto::keys::KeyPlacement,
    final_max_seqs: &BTreeMap<u64, u64>,
) -> Result<Vec<Violation>, CheckError> {
    let mut out = Vec::new();
    for c in calls {
        for (uid, value) in c.ok_values() {
            let section = section_of(uid, section_size, uid_limit, placement);
            let max = *final_max_seqs.get(&section).ok_or(CheckError::MissingMaxSeq(section))?;
            if value > max {
                out.push(Violation::new(
                    Promise::P2,
                    format!(
                        "{}: value {value} above the final max_seq {max} of section {section}",
                        label(uid)
                    ),
                    vec![c.id],
                ));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checks::test_util::*;

    #[test]
    fn table() {
        let max: BTreeMap<u64, u64> = [(0, 100), (1, 50)].into();
        let cases: Vec<Case> = vec![
            (
                "at the ceiling is fine",
                vec![fetch(1, 5, 0, 1, 100), fetch(2, 15, 0, 1, 50)],
                vec![],
            ),
            (
                "planted value above its section's ceiling",
                vec![fetch(1, 15, 0, 1, 51)],
                vec![vec![1]],
            ),
            ("gets count too", vec![get(1, 5, 0, 1, 101)], vec![vec![1]]),
            ("unknown calls carry no value", vec![unknown(1, 5, 0, 1)], vec![]),
            (
                "batch spanning sections",
                vec![batch(1, &[5, 15], 0, 1, &[99, 60])],
                vec![vec![1]],
            ),
        ];
        for (name, calls, want) in cases {
            assert_eq!(
                ids(&check(&calls, 10, 1_000, Default::default(), &max).unwrap()),
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn missing_section_is_a_harness_error() {
        let max: BTreeMap<u64, u64> = [(0, 100)].into();
        assert_eq!(
            check(&[fetch(1, 25, 0, 1, 1)], 10, 1_000, Default::default(), &max),
            Err(CheckError::MissingMaxSeq(2))
        );
    }
}
