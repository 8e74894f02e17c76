//! Pure retry decisions: how long to wait, how long an attempt may take, and what a gRPC error says
//! about whether the request may have taken effect.
//!
//! Keeps the client's half of DESIGN.md §3 ("a timed-out call has an unknown outcome"): an attempt
//! counts as *certainly not taken* only when the request never left this process (the connection could
//! not be made) or a server explicitly refused it; a timeout, a reset stream or an undecodable reply may
//! have consumed a number.
//!
//! No IO and no clock reads here: callers pass `now` and a jitter value.
//! Deliberately left out: hedged requests (sending a second copy before the first fails) — they would
//! double the unknown outcomes for a latency gain this service does not need.

use std::error::Error as _;
use std::time::Duration;

use tokio::time::Instant;
use tonic::{Code, Status};

use crate::config::ClientConfig;

/// Shortest attempt worth starting: below this the RPC cannot complete anyway.
const MIN_ATTEMPT: Duration = Duration::from_millis(1);

/// What a failed attempt tells about the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delivery {
    /// The request certainly did not take effect: never sent, or refused by the server.
    NotTaken,
    /// The request may have been executed by a server.
    Maybe,
}

/// The decision about one gRPC error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub delivery: Delivery,
    /// Worth another attempt (possibly elsewhere, after a backoff).
    pub retry: bool,
    /// The server said the input is wrong: surface it, never retry.
    pub invalid_argument: bool,
}

/// Classifies a gRPC error from one attempt.
///
/// A `Status` that carries a `source` was made in this process from a transport error; one without was
/// decoded from the server's reply (or synthesized by tonic after the response started).
pub(crate) fn classify(status: &Status) -> Verdict {
    if status.source().is_some() {
        return Verdict {
            delivery: if is_connect_error(status) {
                Delivery::NotTaken
            } else {
                Delivery::Maybe
            },
            retry: true,
            invalid_argument: false,
        };
    }
    match status.code() {
        Code::InvalidArgument => Verdict {
            delivery: Delivery::NotTaken,
            retry: false,
            invalid_argument: true,
        },
        // The server may have done the work before the call was cut or failed.
        Code::Unknown | Code::Internal | Code::DataLoss | Code::DeadlineExceeded | Code::Cancelled => Verdict {
            delivery: Delivery::Maybe,
            retry: true,
            invalid_argument: false,
        },
        // An explicit refusal that may pass: shutting down, overloaded, conflict.
        Code::Unavailable | Code::ResourceExhausted | Code::Aborted => Verdict {
            delivery: Delivery::NotTaken,
            retry: true,
            invalid_argument: false,
        },
        // An explicit refusal that will not pass by retrying (wrong server, wrong service, no access).
        Code::Ok
        | Code::NotFound
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::FailedPrecondition
        | Code::OutOfRange
        | Code::Unimplemented
        | Code::Unauthenticated => Verdict {
            delivery: Delivery::NotTaken,
            retry: false,
            invalid_argument: false,
        },
    }
}

/// True when the error chain says the connection was never made, so no request bytes were sent.
fn is_connect_error(status: &Status) -> bool {
    let mut next = status.source();
    while let Some(err) = next {
        if err.is::<tonic::ConnectError>() {
            return true;
        }
        next = err.source();
    }
    false
}

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

    /// A budget with the default backoff and attempt bound of [`ClientConfig`].
    pub(crate) fn with_timeouts(attempt_timeout: Duration, deadline: Instant) -> Self {
        let defaults = ClientConfig::default();
        Self {
            attempt_timeout,
            ..Self::until(&defaults, deadline)
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
    pub(crate) fn next_try_at(&mut self, now: Instant, jitter: f64) -> Instant {
        let delay = backoff_delay(self.retries_slept, self.backoff_base, self.backoff_max, jitter);
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
        assert_eq!(b.next_try_at(t0, 0.0), t0 + Duration::from_millis(50));
        assert_eq!(
            b.next_try_at(t0, 1.0),
            t0 + Duration::from_millis(120),
            "capped at the deadline"
        );
    }

    #[test]
    fn server_statuses_are_classified_by_what_they_say_about_delivery() {
        use Delivery::*;
        let cases = [
            (Code::InvalidArgument, NotTaken, false, true),
            (Code::Unavailable, NotTaken, true, false),
            (Code::ResourceExhausted, NotTaken, true, false),
            (Code::Internal, Maybe, true, false),
            (Code::Unknown, Maybe, true, false),
            (Code::DeadlineExceeded, Maybe, true, false),
            (Code::Cancelled, Maybe, true, false),
            (Code::Unimplemented, NotTaken, false, false),
            (Code::FailedPrecondition, NotTaken, false, false),
        ];
        for (code, delivery, retry, invalid_argument) in cases {
            let got = classify(&Status::new(code, "x"));
            let want = Verdict {
                delivery,
                retry,
                invalid_argument,
            };
            assert_eq!(got, want, "{code:?}");
        }
    }

    #[test]
    fn transport_errors_are_maybe_delivered_unless_the_connection_never_opened() {
        let connect = Status::from_error(Box::new(tonic::ConnectError("refused".into())));
        assert_eq!(connect.code(), Code::Unavailable);
        assert_eq!(classify(&connect).delivery, Delivery::NotTaken);
        assert!(classify(&connect).retry);

        let reset = Status::from_error(Box::new(std::io::Error::other("connection reset")));
        assert_eq!(classify(&reset).delivery, Delivery::Maybe);
        assert!(classify(&reset).retry);
    }
}
