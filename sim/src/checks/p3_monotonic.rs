//! P3 `max_seq` only grows: per source (the leader's linearizable Load, or one replica's local
//! Status) and per section, successive polls never show a smaller `max_seq`; the per-replica sum
//! never shrinks either (a replica that restarts and answers from a half-restored state shows up
//! here).
//!
//! Polls are ordered by their time; two polls of one source are never concurrent (the poller is
//! one task per source).

use super::{Promise, Violation};
use crate::history::Poll;
use std::collections::{BTreeMap, HashMap};

pub fn check(polls: &[Poll]) -> Vec<Violation> {
    let mut sorted: Vec<&Poll> = polls.iter().collect();
    sorted.sort_by_key(|p| p.at_ns);
    let mut last_section: HashMap<(&str, u64), (u64, u64)> = HashMap::new();
    let mut last_sum: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    let mut out = Vec::new();
    for p in sorted {
        for &(section, max) in &p.max_seqs {
            if let Some(&(prev, at)) = last_section.get(&(p.source.as_str(), section))
                && max < prev
            {
                out.push(Violation::new(
                    Promise::P3,
                    format!(
                        "{}: section {section} max_seq went from {prev} (at {at} ns) to {max} (at {} ns)",
                        p.source, p.at_ns
                    ),
                    vec![],
                ));
            }
            last_section.insert((p.source.as_str(), section), (max, p.at_ns));
        }
        if let Some(sum) = p.sum {
            if let Some(&(prev, at)) = last_sum.get(p.source.as_str())
                && sum < prev
            {
                out.push(Violation::new(
                    Promise::P3,
                    format!(
                        "{}: max_seq sum went from {prev} (at {at} ns) to {sum} (at {} ns)",
                        p.source, p.at_ns
                    ),
                    vec![],
                ));
            }
            last_sum.insert(p.source.as_str(), (sum, p.at_ns));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(at: u64, m: &[(u64, u64)]) -> Poll {
        Poll {
            at_ns: at,
            source: "leader".into(),
            max_seqs: m.to_vec(),
            sum: None,
        }
    }

    fn status(at: u64, replica: u64, sum: u64) -> Poll {
        Poll {
            at_ns: at,
            source: format!("replica-{replica}"),
            max_seqs: vec![],
            sum: Some(sum),
        }
    }

    #[test]
    fn table() {
        let cases: Vec<(&str, Vec<Poll>, usize)> = vec![
            (
                "growing and equal",
                vec![load(1, &[(0, 10), (1, 5)]), load(2, &[(0, 10), (1, 9)])],
                0,
            ),
            ("planted decrease", vec![load(1, &[(0, 10)]), load(2, &[(0, 9)])], 1),
            (
                "order by time, not by input order",
                vec![load(2, &[(0, 10)]), load(1, &[(0, 5)])],
                0,
            ),
            (
                "sections absent from a poll are fine",
                vec![load(1, &[(0, 10)]), load(2, &[(1, 1)])],
                0,
            ),
            (
                "replicas are judged apart",
                vec![status(1, 1, 100), status(2, 2, 50), status(3, 1, 100)],
                0,
            ),
            (
                "planted replica sum decrease",
                vec![status(1, 1, 100), status(2, 1, 99)],
                1,
            ),
        ];
        for (name, polls, want) in cases {
            assert_eq!(check(&polls).len(), want, "{name}");
        }
    }
}
