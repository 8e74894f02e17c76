//! The well-behaved caller of a hostile run: one connection to one front end, one take at a time at
//! a steady pace, each call timed (and recorded in the history like every workload call, so the
//! checkers judge its values too). Its p99 without floods is the bar — the first phase (no faults)
//! and the pauses between rounds of floods (the same faults around them as around the rounds, and
//! the same load of the machine) together; in the rounds it must stay within [`P99_FACTOR`] of it.
//!
//! A failed call counts as [`FAILED_COUNTS_AS`] (a caller refused is a caller not served, however
//! fast the refusal). Calls that began inside a fault or a move, or within a settling time after
//! one, are left out of the floods' p99: a killed owner makes every caller wait, floods or not,
//! and the first phase has no faults to compare with.
//!
//! Deliberately left out: more than one well-behaved caller, and pipelines (the normal workload
//! sends those).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::front_workload::{Conns, Front, Subject};
use crate::history::{CallKind, RunClock};
use crate::workload::Recorder;

/// The caller's client id in the history (apart from the workload's, pinned and id clients').
pub(super) const CALLER_ID: u32 = 4_000;
/// One call every this long: 100 a second, 1,000 samples in the default first phase.
const PACE: Duration = Duration::from_millis(10);
/// Most samples kept (over an hour at the pace); the calls go on, their samples are dropped.
const MAX_SAMPLES: usize = 400_000;
/// A failed call's latency for the p99: the front-end client's own call timeout.
pub(super) const FAILED_COUNTS_AS: Duration = Duration::from_secs(5);
/// With floods, the p99 may be at most this many times the first phase's.
pub(super) const P99_FACTOR: u32 = 3;
/// Fewer samples than this in a phase judge nothing: the run fails rather than pass on them.
pub(super) const MIN_SAMPLES: usize = 200;

/// One timed call.
#[derive(Clone, Copy, Debug)]
pub(super) struct Sample {
    /// When it began, on the run's clock.
    pub at_ns: u64,
    /// How long it took; [`FAILED_COUNTS_AS`] at least when it failed.
    pub latency: Duration,
    pub ok: bool,
}

/// Takes `uid`'s next value at `addr` every [`PACE`] until `stop`; the samples.
pub(super) async fn run(
    front: Front,
    addr: SocketAddr,
    uid: u64,
    rec: Arc<Recorder>,
    clock: RunClock,
    stop: Arc<AtomicBool>,
) -> Vec<Sample> {
    let mut conns = Conns::new(front, vec![addr]);
    let mut samples = Vec::new();
    let mut tick = tokio::time::interval(PACE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let at_ns = clock.now_ns();
        let mut took = (Duration::ZERO, false);
        let call = async {
            let began = Instant::now();
            let r = conns.take(addr, Subject::Uid(uid), 1).await;
            took = (began.elapsed(), r.is_ok());
            r
        };
        rec.record_values(CALLER_ID, vec![uid], CallKind::Fetch, call).await;
        let (latency, ok) = took;
        if samples.len() < MAX_SAMPLES {
            samples.push(Sample {
                at_ns,
                latency: if ok { latency } else { latency.max(FAILED_COUNTS_AS) },
                ok,
            });
        }
    }
    samples
}

/// The p99 of some samples and how many there were; `None` without samples.
pub(super) fn p99<'a>(samples: impl Iterator<Item = &'a Sample>) -> Option<(Duration, usize)> {
    percentile(samples, 99)
}

/// The nearest-rank `pct`th percentile (1..=100): the smallest latency at least `pct` % of the
/// calls did not exceed; and how many calls there were.
pub(super) fn percentile<'a>(samples: impl Iterator<Item = &'a Sample>, pct: usize) -> Option<(Duration, usize)> {
    let mut l: Vec<Duration> = samples.map(|s| s.latency).collect();
    if l.is_empty() {
        return None;
    }
    l.sort_unstable();
    let rank = (l.len() * pct.clamp(1, 100)).div_ceil(100);
    Some((l[rank - 1], l.len()))
}

/// The caller's samples split by phase: the first phase's (`[0, floods_from)`), then, outside
/// every `quiet_out` window (`[start, end)` on the run's clock), those in a round of floods (or
/// just after it) and those between rounds, with how many were left out for those windows.
pub(super) fn phases(
    samples: &[Sample],
    floods_from_ns: u64,
    rounds: &[(u64, u64)],
    quiet_out: &[(u64, u64)],
) -> Phases {
    let mut p = Phases::default();
    for s in samples {
        if s.at_ns < floods_from_ns {
            p.first.push(*s);
        } else if quiet_out.iter().any(|&(a, b)| (a..b).contains(&s.at_ns)) {
            p.left_out += 1;
        } else if rounds.iter().any(|&(a, b)| (a..b + AFTER_ROUND_NS).contains(&s.at_ns)) {
            p.with.push(*s);
        } else {
            p.between.push(*s);
        }
    }
    p
}

/// The caller's samples by phase.
#[derive(Debug, Default)]
pub(super) struct Phases {
    /// Before the floods and the faults.
    pub first: Vec<Sample>,
    /// In the pauses between rounds of floods (faults around them as around the rounds).
    pub between: Vec<Sample>,
    /// In a round of floods, or within [`AFTER_ROUND_NS`] of its end.
    pub with: Vec<Sample>,
    /// Begun in a fault or a move, or within the settling time after one.
    pub left_out: usize,
}

/// How long after a round its floods still count: the servers close thousands of connections
/// as it ends.
const AFTER_ROUND_NS: u64 = 2_000_000_000;

/// Why the floods' p99 fails the run, if it does: too few samples in a phase to judge, or a p99
/// past [`P99_FACTOR`] times the first phase's.
pub(super) fn judge(before: &[Sample], during: &[Sample]) -> Option<String> {
    let (Some((p_before, n_before)), Some((p_during, n_during))) = (p99(before.iter()), p99(during.iter())) else {
        return Some(format!(
            "the well-behaved caller has {} samples without floods and {} with: nothing to judge",
            before.len(),
            during.len()
        ));
    };
    if n_before < MIN_SAMPLES || n_during < MIN_SAMPLES {
        return Some(format!(
            "the well-behaved caller has {n_before} samples without floods and {n_during} with \
             (outside faults); fewer than {MIN_SAMPLES} judge nothing"
        ));
    }
    (p_during > p_before * P99_FACTOR).then(|| {
        format!("the well-behaved caller's p99 went from {p_before:?} without floods to {p_during:?} with them (more than {P99_FACTOR}x)")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(at_ns: u64, ms: u64) -> Sample {
        Sample {
            at_ns,
            latency: Duration::from_millis(ms),
            ok: true,
        }
    }

    #[test]
    fn p99_is_the_nearest_rank() {
        let cases: [(&[u64], u64); 4] = [
            (&[5], 5),
            (&[1, 2, 3], 3),
            // 100 samples: the 99th smallest.
            (&[1; 99], 1),
            (&[7; 1], 7),
        ];
        for (ms, want) in cases {
            let samples: Vec<Sample> = ms.iter().map(|&m| s(0, m)).collect();
            assert_eq!(
                p99(samples.iter()),
                Some((Duration::from_millis(want), ms.len())),
                "{ms:?}"
            );
        }
        let mut hundred: Vec<Sample> = (1..=100).map(|m| s(0, m)).collect();
        assert_eq!(p99(hundred.iter()).unwrap().0, Duration::from_millis(99));
        hundred.push(s(0, 1_000));
        assert_eq!(p99(hundred.iter()).unwrap().0, Duration::from_millis(100));
        assert_eq!(p99([].iter()), None);
        assert_eq!(percentile(hundred.iter(), 50).unwrap().0, Duration::from_millis(51));
    }

    #[test]
    fn phases_split_at_the_rounds_and_leave_out_fault_windows() {
        let second = 1_000_000_000;
        let samples: Vec<Sample> = (0..12).map(|i| s(i * second, 1)).collect();
        // Floods from 2 s; rounds 2–3 s and 8–9 s (each counting 2 s past its end); a fault 4–6 s.
        let p = phases(
            &samples,
            2 * second,
            &[(2 * second, 3 * second), (8 * second, 9 * second)],
            &[(4 * second, 6 * second)],
        );
        let at = |v: &[Sample]| v.iter().map(|s| s.at_ns / second).collect::<Vec<_>>();
        assert_eq!(at(&p.first), [0, 1]);
        assert_eq!(at(&p.with), [2, 3, 8, 9, 10]);
        assert_eq!(at(&p.between), [6, 7, 11]);
        assert_eq!(p.left_out, 2);
    }

    #[test]
    fn the_floods_p99_fails_past_three_times_the_first_phases() {
        let n = MIN_SAMPLES;
        let before: Vec<Sample> = (0..n).map(|_| s(0, 2)).collect();
        let same: Vec<Sample> = (0..n).map(|_| s(0, 6)).collect();
        assert_eq!(judge(&before, &same), None, "3x is within the bound");
        let slow: Vec<Sample> = (0..n).map(|_| s(0, 7)).collect();
        let why = judge(&before, &slow).expect("past 3x");
        assert!(why.contains("2ms without floods to 7ms"), "{why}");
        assert!(judge(&before, &slow[..n - 1]).unwrap().contains("judge nothing"));
        assert!(judge(&[], &slow).unwrap().contains("nothing to judge"));
    }
}
