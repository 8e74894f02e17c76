//! Lease arithmetic (docs/DESIGN.md, Ownership), pure: every function is handed `now` or the
//! instants it needs and reads no clock.
//!
//! - A renewal is timed from `t_send`, noted on the lease clock *before* the request left; a
//!   confirming reply makes the lease valid until `t_send + lease·(1−drift) − margin`. The store
//!   measures its side from when it received the request, which is later, so the owner always
//!   believes in a shorter lease than the store grants (P4).
//! - A section gained at `t_obs` is served only after `t_obs + lease·(1+drift) + margin`: by then
//!   any previous owner's lease has run out even if that owner renewed just before the move.
//!   A release recorded by the previous owner (`no_wait`) lifts the wait. When the store leader
//!   says how much of that is left (`Grant.wait_ms`, measured on its clock from the last renewal
//!   it heard from the earlier owners), the section waits that instead, stretched by the drift
//!   bound for this clock and never more than the whole wait, counted from `t_obs` (after the
//!   reply arrived).
//!
//! Deliberately left out: wall-clock time of any kind (a jump of the wall clock changes nothing)
//! and the renewal loop itself (see `tasks::renew`). Instants are tokio's, so that the tasks that
//! use this can be tested on a paused clock; they are read on `seqsvr_plumbing::lease_clock` (via
//! `AllocState::lease_now`), which adds the time the host was suspended to tokio's monotonic clock: a
//! suspend longer than the lease ends the lease on resume.

use std::time::Duration;

use seqsvr_proto::params::SetParams;
use tokio::time::Instant;

/// Timings of a lease, from the set's validated parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTimings {
    /// How long the store keeps a grant alive after a renewal.
    pub lease: Duration,
    /// Bound on the relative clock-rate difference between two machines, in parts per million.
    pub drift_ppm: u64,
    /// Safety margin subtracted from (or added to) every lease computation.
    pub margin: Duration,
}

impl LeaseTimings {
    /// The timings of a set.
    pub fn of(p: &SetParams) -> Self {
        Self {
            lease: p.lease(),
            drift_ppm: p.drift_ppm,
            margin: p.margin(),
        }
    }

    fn drift(&self) -> Duration {
        // lease * drift_ppm / 1e6, computed in nanoseconds to keep precision.
        let nanos = self.lease.as_nanos() * u128::from(self.drift_ppm) / 1_000_000;
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// How long after `t_send` a confirmed renewal keeps this owner's lease valid.
    pub fn owner_validity(&self) -> Duration {
        self.lease.saturating_sub(self.drift()).saturating_sub(self.margin)
    }

    /// How long a newly gained section must wait before it is served (unless `no_wait`).
    pub fn gain_wait(&self) -> Duration {
        self.lease + self.drift() + self.margin
    }

    /// How long a section must wait when the store leader says `left` (on its clock) of the
    /// earlier owners' leases remains: `left·(1+drift)`, at most [`Self::gain_wait`].
    pub fn predecessor_wait(&self, left: Duration) -> Duration {
        let nanos = left.as_nanos() * u128::from(self.drift_ppm) / 1_000_000;
        let stretched = left.saturating_add(Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX)));
        stretched.min(self.gain_wait())
    }

    /// The instant from which a section first observed at `t_obs` may be served; `left` is what
    /// the leader said remains of earlier owners' leases (`None`: it did not say).
    pub fn serve_after(&self, t_obs: Instant, no_wait: bool, left: Option<Duration>) -> Instant {
        match (no_wait, left) {
            (true, _) => t_obs,
            (false, Some(left)) => t_obs + self.predecessor_wait(left),
            (false, None) => t_obs + self.gain_wait(),
        }
    }
}

/// This owner's view of its lease.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lease {
    valid_until: Option<Instant>,
}

impl Lease {
    /// A confirming renewal reply for a request sent at `t_send`. Never shortens the lease (a late
    /// reply to an older request carries less information than a newer one).
    pub fn confirmed(&mut self, t_send: Instant, timings: &LeaseTimings) {
        let until = t_send + timings.owner_validity();
        self.valid_until = Some(self.valid_until.map_or(until, |v| v.max(until)));
    }

    /// The lease is gone (superseded incarnation, shutdown): nothing may be served any more.
    pub fn revoke(&mut self) {
        self.valid_until = None;
    }

    /// Whether serving is allowed at `now`.
    pub fn is_valid(&self, now: Instant) -> bool {
        self.valid_until.is_some_and(|v| now < v)
    }

    /// The end of the lease, if there is one.
    pub fn valid_until(&self) -> Option<Instant> {
        self.valid_until
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn timings(lease_ms: u64, drift_ppm: u64, margin_ms: u64) -> LeaseTimings {
        LeaseTimings {
            lease: MS(lease_ms),
            drift_ppm,
            margin: MS(margin_ms),
        }
    }

    #[test]
    fn owner_validity_and_gain_wait_follow_the_formulas() {
        // (lease, drift_ppm, margin) -> (owner validity, gain wait), in ms.
        let cases = [
            ((3_000, 10_000, 100), (2_870, 3_130)),
            ((3_000, 0, 0), (3_000, 3_000)),
            ((1_000, 1_000_000, 0), (0, 2_000)),
            ((500, 10_000, 600), (0, 1_105)),
        ];
        for ((lease, drift, margin), (valid, wait)) in cases {
            let t = timings(lease, drift, margin);
            assert_eq!(t.owner_validity(), MS(valid), "{lease}/{drift}/{margin}");
            assert_eq!(t.gain_wait(), MS(wait), "{lease}/{drift}/{margin}");
            // The owner's own view is never longer than what any later owner waits.
            assert!(t.owner_validity() <= t.gain_wait());
        }
    }

    #[test]
    fn lease_is_measured_from_send_time_and_only_a_reply_extends_it() {
        let t = timings(3_000, 10_000, 100);
        let t0 = Instant::now();
        let mut lease = Lease::default();
        // (event, at ms, expect valid at probes (ms, valid))
        assert!(!lease.is_valid(t0), "no lease before the first reply");
        lease.confirmed(t0, &t);
        let cases = [(0, true), (2_869, true), (2_870, false), (5_000, false)];
        for (at, valid) in cases {
            assert_eq!(lease.is_valid(t0 + MS(at)), valid, "at {at} ms");
        }
        // A later renewal sent at 500 ms extends from its own send time.
        lease.confirmed(t0 + MS(500), &t);
        assert!(lease.is_valid(t0 + MS(3_369)));
        assert!(!lease.is_valid(t0 + MS(3_370)));
        // A late reply to an older request never shortens it.
        lease.confirmed(t0 + MS(100), &t);
        assert!(lease.is_valid(t0 + MS(3_369)));
        lease.revoke();
        assert!(!lease.is_valid(t0 + MS(1)));
    }

    #[test]
    fn gained_section_waits_unless_released() {
        let t = timings(3_000, 10_000, 100);
        let t_obs = Instant::now();
        // (no_wait, what the leader said is left, ms) -> wait, ms.
        let cases = [
            ((false, None), 3_130),
            ((true, None), 0),
            ((true, Some(500)), 0),
            ((false, Some(0)), 0),
            // Stretched by the 1 % drift bound for this clock.
            ((false, Some(1_000)), 1_010),
            // Never more than the whole wait, whatever the leader says.
            ((false, Some(3_130)), 3_130),
            ((false, Some(60_000)), 3_130),
        ];
        for ((no_wait, left), wait) in cases {
            let left = left.map(MS);
            assert_eq!(
                t.serve_after(t_obs, no_wait, left),
                t_obs + MS(wait),
                "{no_wait} {left:?}"
            );
        }
    }
}
