//! Unavailability per fault, computed from the history after the run.
//!
//! For one fault, each section's outage is the time from the invoke of its first call in the
//! fault's window that did not succeed to the first ok completion for that section after it (or
//! the end of the window); the fault's unavailability is the largest outage over sections. A
//! fault no call noticed costs zero. The window runs from the fault's start to the next fault's
//! start (or the end of the history).
//!
//! Calls of pinned clients ([`crate::workload::run_pinned`]) are left out: their NOT_OWNER answers
//! are expected.
//!
//! Deliberately left out: client-side retry time inside a call that finally succeeded; it shows
//! as latency, not unavailability.

use crate::history::{Call, FaultSpan, Outcome};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// Unavailability of each fault, in the order of `faults`.
pub fn unavailability(calls: &[Call], faults: &[FaultSpan], section_size: u64) -> Vec<Duration> {
    let mut sorted: Vec<&FaultSpan> = faults.iter().collect();
    sorted.sort_by_key(|f| f.start_ns);
    let history_end = calls.iter().map(|c| c.complete_ns).max().unwrap_or(0);
    let mut by_id: HashMap<u64, Duration> = HashMap::new();
    for (i, f) in sorted.iter().enumerate() {
        let window_end = sorted.get(i + 1).map_or(history_end, |n| n.start_ns).max(f.start_ns);
        by_id.insert(f.id, outage(calls, f.start_ns, window_end, section_size.max(1)));
    }
    faults.iter().map(|f| by_id[&f.id]).collect()
}

fn outage(calls: &[Call], from: u64, to: u64, section_size: u64) -> Duration {
    // section → (first failure invoke, first ok completion after it)
    let mut per_section: HashMap<u64, (u64, Option<u64>)> = HashMap::new();
    let mut in_window: Vec<&Call> = calls
        .iter()
        .filter(|c| c.invoke_ns >= from && c.invoke_ns < to)
        .collect();
    in_window.sort_by_key(|c| c.invoke_ns);
    for c in &in_window {
        if c.outcome != Outcome::Ok {
            // Keys are placed by a hash; their sections are the uids' (which the workload asks too).
            for uid in c.uids.iter().filter(|&&u| u & crate::keys::KEY_SUBJECT == 0) {
                per_section.entry(uid / section_size).or_insert((c.invoke_ns, None));
            }
        }
    }
    for c in calls.iter().filter(|c| c.outcome == Outcome::Ok) {
        for uid in &c.uids {
            if let Some((fail, ok)) = per_section.get_mut(&(uid / section_size))
                && c.complete_ns > *fail
                && ok.is_none_or(|o| c.complete_ns < o)
            {
                *ok = Some(c.complete_ns);
            }
        }
    }
    per_section
        .values()
        .map(|&(fail, ok)| Duration::from_nanos(ok.unwrap_or(to).min(to.max(fail)).saturating_sub(fail)))
        .max()
        .unwrap_or(Duration::ZERO)
}

/// p50, p99 and max of some durations (zero when empty).
pub fn percentiles(mut v: Vec<Duration>) -> (Duration, Duration, Duration) {
    if v.is_empty() {
        return (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    }
    v.sort();
    let at = |q: f64| v[(((v.len() - 1) as f64) * q).round() as usize];
    (at(0.5), at(0.99), *v.last().expect("non-empty"))
}

/// One line per fault kind: count, p50/p99/max unavailability.
pub fn per_kind(faults: &[FaultSpan], unavail: &[Duration]) -> BTreeMap<String, (usize, Duration, Duration, Duration)> {
    let mut groups: BTreeMap<String, Vec<Duration>> = BTreeMap::new();
    for (f, u) in faults.iter().zip(unavail) {
        groups.entry(f.kind.clone()).or_default().push(*u);
    }
    groups
        .into_iter()
        .map(|(k, v)| {
            let n = v.len();
            let (p50, p99, max) = percentiles(v);
            (k, (n, p50, p99, max))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checks::test_util::*;

    fn fault(id: u64, start: u64) -> FaultSpan {
        FaultSpan {
            id,
            kind: "k".into(),
            target: "t".into(),
            start_ns: start,
            end_ns: start + 1,
        }
    }

    #[test]
    fn outage_runs_from_first_failure_to_next_success() {
        // Section 0 (uids 0..10) fails at 100, recovers at 350; section 1 never fails.
        let calls = vec![
            fetch(1, 1, 50, 60, 1),
            failed(2, 1, 100, 150),
            unknown(3, 2, 160, 300),
            fetch(4, 1, 310, 350, 2),
            fetch(5, 15, 120, 130, 1),
        ];
        let u = unavailability(&calls, &[fault(1, 90)], 10);
        assert_eq!(u, vec![Duration::from_nanos(250)]);
    }

    #[test]
    fn unnoticed_fault_costs_nothing_and_windows_split_at_the_next_fault() {
        let calls = vec![fetch(1, 1, 50, 60, 1), failed(2, 1, 500, 510), fetch(3, 1, 520, 530, 2)];
        let u = unavailability(&calls, &[fault(1, 0), fault(2, 400)], 10);
        assert_eq!(u, vec![Duration::ZERO, Duration::from_nanos(30)]);
    }

    #[test]
    fn never_recovered_counts_to_the_window_end() {
        let calls = vec![failed(1, 1, 100, 110), fetch(2, 15, 100, 1_000, 1)];
        let u = unavailability(&calls, &[fault(1, 0)], 10);
        assert_eq!(u, vec![Duration::from_nanos(900)]);
    }

    #[test]
    fn percentiles_of_a_small_set() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(
            percentiles(v),
            (
                Duration::from_millis(51),
                Duration::from_millis(99),
                Duration::from_millis(100)
            )
        );
        assert_eq!(percentiles(vec![]), (Duration::ZERO, Duration::ZERO, Duration::ZERO));
    }
}
