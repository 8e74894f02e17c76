//! Pure retry decisions: how long to wait and how long an attempt may take. What a gRPC error says
//! about whether the request may have taken effect is decided by `seqsvr_rpc::classify`, which
//! the control-plane clients share.
//!
//! No IO and no clock reads here: callers pass `now` and a jitter value.
//! Deliberately left out: hedged requests (sending a second copy before the first fails) — they would
//! double the unknown outcomes for a latency gain this service does not need.

use std::time::Duration;

use tokio::time::Instant;

use crate::config::ClientConfig;

/// Shortest attempt worth starting: below this the RPC cannot complete anyway.
const MIN_ATTEMPT: Duration = Duration::from_millis(1);

/// The longest backoff after a server *answered* that it cannot serve yet (NOT_OWNER with nothing
/// new to route by, NOT_READY): a live server in a short transition — a move installing a range, a
/// new owner loading its sections — that usually ends within tens of milliseconds. Waiting the
/// full `backoff_max` there would make a caller wait up to that long after the range is served
/// again; unreachable servers keep the full backoff.
pub(crate) const ANSWERED_BACKOFF_MAX: Duration = Duration::from_millis(100);

/// Backoff before retry number `retry` (0 = first retry): `base · 2^retry` capped at `max`, of which the
/// upper half is jittered (`jitter` in `[0, 1)`), so that many clients that failed together spread out.
pub(crate) fn backoff_delay(retry: u32, base: Duration, max: Duration, jitter: f64) -> Duration {
    let exp = base.saturating_mul(1u32 << retry.min(20)).min(max);
    let half = exp / 2;
    half + half.mul_f64(jitter.clamp(0.0, 1.0))
}

/// The time and attempts left to one call.
#[derive(Debug, Clone)]
pub(crate) struct Budget {
    deadline: Instant,
    attempts: u32,
    retries_slept: u32,
    max_attempts: u32,
    attempt_timeout: Duration,
    backoff_base: Duration,
    backoff_max: Duration,
}

impl Budget {
    /// A budget that ends at `deadline`.
    pub(crate) fn until(cfg: &ClientConfig, deadline: Instant) -> Self {
        Self {
            deadline,
            attempts: 0,
            retries_slept: 0,
            max_attempts: cfg.max_attempts,
            attempt_timeout: cfg.attempt_timeout,
            backoff_base: cfg.backoff_base,
            backoff_max: cfg.backoff_max,
        }
    }

    /// Starts an attempt: its timeout, or `None` when the deadline or the attempt count is used up.
    pub(crate) fn start_attempt(&mut self, now: Instant) -> Option<Duration> {
        if self.attempts >= self.max_attempts {
            return None;
        }
        let left = self.deadline.saturating_duration_since(now);
        if left < MIN_ATTEMPT {
            return None;
        }
        self.attempts += 1;
        Some(self.attempt_timeout.min(left))
    }

    /// When to start the next attempt after a retryable failure; never later than the deadline.
    /// `answered`: the server answered that it cannot serve yet (capped at
    /// [`ANSWERED_BACKOFF_MAX`]), rather than not answering at all.
    pub(crate) fn next_try_at(&mut self, now: Instant, jitter: f64, answered: bool) -> Instant {
        let max = if answered {
            self.backoff_max.min(ANSWERED_BACKOFF_MAX)
        } else {
            self.backoff_max
        };
        let delay = backoff_delay(self.retries_slept, self.backoff_base.min(max), max, jitter);
        self.retries_slept += 1;
        (now + delay).min(self.deadline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_and_jitters_the_upper_half() {
        let ms = Duration::from_millis;
        let cases = [
            (0, 0.0, ms(5)),
            (0, 0.999_999, ms(10)),
            (1, 0.0, ms(10)),
            (3, 0.5, ms(60)),
            (10, 0.0, ms(250)),
            (10, 1.0, ms(500)),
            (u32::MAX, 1.0, ms(500)),
            (4, 7.0, ms(160)), // jitter out of range is clamped
        ];
        for (retry, jitter, want) in cases {
            let got = backoff_delay(retry, ms(10), ms(500), jitter);
            let diff = got.abs_diff(want);
            assert!(
                diff < Duration::from_micros(10),
                "retry {retry} jitter {jitter}: {got:?} != {want:?}"
            );
        }
    }

    #[test]
    fn budget_stops_at_the_deadline_and_at_max_attempts() {
        let cfg = ClientConfig {
            attempt_timeout: Duration::from_millis(100),
            max_attempts: 3,
            ..ClientConfig::new(["a:1"])
        };
        let t0 = Instant::now();
        let mut b = Budget::until(&cfg, t0 + Duration::from_millis(250));
        assert_eq!(b.start_attempt(t0), Some(Duration::from_millis(100)));
        // The last attempt is cut to what is left of the deadline.
        assert_eq!(
            b.start_attempt(t0 + Duration::from_millis(200)),
            Some(Duration::from_millis(50))
        );
        assert_eq!(
            b.start_attempt(t0 + Duration::from_millis(250)),
            None,
            "deadline passed"
        );
        assert_eq!(
            b.start_attempt(t0 + Duration::from_millis(210)),
            Some(Duration::from_millis(40))
        );
        assert_eq!(b.start_attempt(t0), None, "three attempts used");
    }

    #[test]
    fn backoff_never_sleeps_past_the_deadline() {
        let cfg = ClientConfig {
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            ..ClientConfig::new(["a:1"])
        };
        let t0 = Instant::now();
        let mut b = Budget::until(&cfg, t0 + Duration::from_millis(120));
        assert_eq!(b.next_try_at(t0, 0.0, false), t0 + Duration::from_millis(50));
        assert_eq!(
            b.next_try_at(t0, 1.0, false),
            t0 + Duration::from_millis(120),
            "capped at the deadline"
        );
    }

    #[test]
    fn a_server_that_answered_not_yet_is_asked_again_within_the_short_cap() {
        let cfg = ClientConfig::new(["a:1"]);
        let t0 = Instant::now();
        let mut unreachable = Budget::until(&cfg, t0 + Duration::from_secs(60));
        let mut answered = unreachable.clone();
        let mut longest = (Duration::ZERO, Duration::ZERO);
        for _ in 0..12 {
            longest.0 = longest.0.max(unreachable.next_try_at(t0, 1.0, false) - t0);
            longest.1 = longest.1.max(answered.next_try_at(t0, 1.0, true) - t0);
        }
        assert_eq!(longest.0, cfg.backoff_max, "unreachable servers keep the full backoff");
        assert_eq!(longest.1, ANSWERED_BACKOFF_MAX);
    }
}
