//! The clock every lease deadline is read on (docs/DESIGN.md, ownership rule 10), on both sides
//! of the lease: the AllocSvr's validity check, gain wait and renewal send time, and the
//! StoreSvr's liveness, arbiter and a move's lease wait.
//!
//! `Instant` reads `CLOCK_MONOTONIC`, which stands still while the host or VM is suspended: an
//! owner that resumed would believe in a lease the store has long given away, and serve while the
//! new owner does. `CLOCK_BOOTTIME` counts the suspension (and is slewed by NTP exactly as
//! `MONOTONIC` is). So [`LeaseClock::now`] is the monotonic instant at the process's start plus
//! the `BOOTTIME` elapsed since: a tokio `Instant` (the lease arithmetic, pure and handed `now`,
//! is unchanged) that runs ahead of tokio's clock by exactly the time the host was suspended, and
//! never goes backwards because `BOOTTIME` does not.
//!
//! Cost: one vDSO clock read per call, made once per fetch and once per section of a batch (the
//! lease is checked inside each section's critical section, ownership rule 7): a batch of 100
//! random uids reads it about 50 times. It used to be three reads (tokio's `Instant::now`, then
//! `MONOTONIC` and `BOOTTIME` for the suspended part), 5–7 µs of a batch100 call's ~110 µs of
//! server CPU; `cargo test --release -p seqsvr-plumbing --lib host_now -- --nocapture` prints a
//! read's cost.
//!
//! Tests that pause tokio's clock use a [`Script`], which reads tokio's clock: the host clock is
//! the real one even then.
//!
//! It lives here, not in each server, because both ends of a lease must read the same clock the
//! same way; this module is the one place that reads it.
//!
//! Cost: three vDSO clock reads (tokio's `Instant::now`, `MONOTONIC`, `BOOTTIME`) and an atomic
//! load, once per fetch and once per section of a batch: 113 ns against 31 ns for tokio's
//! `Instant::now` alone (release build, 2-core VM, `cargo test --release -p seqsvr-proto --lib
//! host_now -- --nocapture`), next to the microseconds a fetch costs. No syscall, so not cached.
//!
//! Deliberately left out: a stop the guest kernel is not told about (a hypervisor pausing the VM
//! for a live migration or a snapshot restores the guest's clocks so that neither jumps): no clock
//! inside the guest can see it, see docs/DESIGN.md for what protects the sections then. Outside
//! Linux there is no `CLOCK_BOOTTIME` and the suspended part is always 0 (the monotonic clock of
//! before). The wall clock, never.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

/// Where lease time comes from.
#[derive(Clone, Debug, Default)]
pub struct LeaseClock(Source);

#[derive(Clone, Debug, Default)]
enum Source {
    /// tokio's clock plus the host's suspended time since the process started.
    #[default]
    Host,
    /// A function of tokio's clock that a test or the simulator scripts.
    Script(Script),
}

impl LeaseClock {
    /// The host's clock, counting suspended time (the default).
    pub fn host() -> Self {
        // Fix the origin now rather than at the first lease read.
        let _ = host_origin();
        Self(Source::Host)
    }

    /// Lease time now.
    pub fn now(&self) -> Instant {
        match &self.0 {
            Source::Host => host_now(),
            Source::Script(s) => s.at(Instant::now()),
        }
    }

    /// [`Self::now`] as a `std` instant (the StoreSvr's pure code takes those).
    pub fn now_std(&self) -> std::time::Instant {
        self.now().into_std()
    }
}

impl From<Script> for LeaseClock {
    fn from(s: Script) -> Self {
        Self(Source::Script(s))
    }
}

/// Where the host's lease time starts: `BOOTTIME` and the monotonic instant read right after it.
#[derive(Debug)]
struct HostOrigin {
    boot: Duration,
    mono: Instant,
}

/// The origin, or `None` where the host has no `BOOTTIME` (then lease time is the monotonic clock
/// and counts no suspension).
fn host_origin() -> Option<&'static HostOrigin> {
    static ORIGIN: OnceLock<Option<HostOrigin>> = OnceLock::new();
    ORIGIN
        .get_or_init(|| {
            // BOOTTIME first: the monotonic instant is then read a few ns later than the origin's
            // BOOTTIME, so every reading is that much ahead of the true one, which shortens a lease
            // rather than lengthening it.
            let boot = boottime()?;
            Some(HostOrigin {
                boot,
                mono: Instant::from_std(std::time::Instant::now()),
            })
        })
        .as_ref()
}

fn host_now() -> Instant {
    match host_origin().and_then(|o| Some(o.mono + boottime()?.saturating_sub(o.boot))) {
        Some(now) => now,
        // A read that failed after one at start worked (the kernel has the clock, so this does not
        // happen): the monotonic clock, counting no suspension, rather than refusing to serve.
        None => Instant::from_std(std::time::Instant::now()),
    }
}

#[cfg(target_os = "linux")]
fn boottime() -> Option<Duration> {
    use nix::time::{ClockId, clock_gettime};
    clock_gettime(ClockId::CLOCK_BOOTTIME).ok().map(Duration::from)
}

#[cfg(not(target_os = "linux"))]
fn boottime() -> Option<Duration> {
    None
}

/// A lease clock as a piecewise-linear function of tokio's clock, for tests and the simulator:
/// it runs at tokio's rate until told otherwise; from a change's instant on it jumps forward and
/// runs at another rate (0: frozen). Changes are given ahead of time with their instants, so what
/// the clock reads at any tokio instant does not depend on the order tasks run in.
#[derive(Clone, Debug)]
pub struct Script(Arc<Mutex<ScriptState>>);

#[derive(Debug)]
struct ScriptState {
    origin: Instant,
    /// Sorted by instant (equal instants in the order given).
    changes: Vec<Change>,
}

#[derive(Clone, Copy, Debug)]
struct Change {
    at: Instant,
    /// The new rate in millionths of tokio's (`None`: keep the current one).
    rate_ppm: Option<u64>,
    /// Added at `at`.
    jump: Duration,
}

/// Rate of a clock that runs with tokio's, in millionths.
pub const SAME_RATE_PPM: u64 = 1_000_000;

impl Default for Script {
    fn default() -> Self {
        Self::new()
    }
}

impl Script {
    /// A clock equal to tokio's from now on, until changed.
    pub fn new() -> Self {
        Self(Arc::new(Mutex::new(ScriptState {
            origin: Instant::now(),
            changes: Vec::new(),
        })))
    }

    /// From `at` on, the clock runs at `rate_ppm` millionths of tokio's rate (0 freezes it).
    pub fn set_rate_from(&self, at: Instant, rate_ppm: u64) {
        self.add(Change {
            at,
            rate_ppm: Some(rate_ppm),
            jump: Duration::ZERO,
        });
    }

    /// At `at` the clock jumps forward by `by` (a suspension it learns of on resume).
    pub fn jump_at(&self, at: Instant, by: Duration) {
        self.add(Change {
            at,
            rate_ppm: None,
            jump: by,
        });
    }

    fn add(&self, c: Change) {
        let mut st = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let i = st.changes.partition_point(|x| x.at <= c.at);
        st.changes.insert(i, c);
    }

    /// The clock's reading at tokio instant `t`.
    pub fn at(&self, t: Instant) -> Instant {
        let st = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (mut reading, mut prev, mut rate) = (st.origin, st.origin, SAME_RATE_PPM);
        for c in st.changes.iter().take_while(|c| c.at <= t) {
            reading += scaled(c.at.saturating_duration_since(prev), rate) + c.jump;
            prev = prev.max(c.at);
            rate = c.rate_ppm.unwrap_or(rate);
        }
        reading + scaled(t.saturating_duration_since(prev), rate)
    }
}

/// `d · rate_ppm / 10⁶`, saturating.
fn scaled(d: Duration, rate_ppm: u64) -> Duration {
    let nanos = d.as_nanos().saturating_mul(u128::from(rate_ppm)) / u128::from(SAME_RATE_PPM);
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn the_host_clock_runs_with_the_monotonic_one_while_the_host_is_not_suspended() {
        let clock = LeaseClock::host();
        let (t0, l0) = (std::time::Instant::now(), clock.now_std());
        std::thread::sleep(MS(30));
        let (t1, l1) = (std::time::Instant::now(), clock.now_std());
        // This test machine is not suspended in between (if it were, lease time would run ahead).
        let drift = (l1 - l0).abs_diff(t1 - t0);
        assert!(drift < MS(1), "lease time moved {:?} against {:?}", l1 - l0, t1 - t0);
        assert!(l0 >= t0 && l1 >= t1, "never behind the monotonic clock");
        let mut last = clock.now();
        for _ in 0..10_000 {
            let now = clock.now();
            assert!(now >= last, "went back");
            last = now;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_script_freezes_jumps_and_drifts_at_the_instants_given() {
        let s = Script::new();
        let t0 = Instant::now();
        let at = |ms| t0 + MS(ms);
        // Suspended from 1 s to 3 s: frozen, then the whole suspension counted on resume.
        s.set_rate_from(at(1_000), 0);
        s.set_rate_from(at(3_000), SAME_RATE_PPM);
        s.jump_at(at(3_000), MS(2_000));
        // Then 10 % fast from 4 s to 5 s.
        s.set_rate_from(at(4_000), 1_100_000);
        s.set_rate_from(at(5_000), SAME_RATE_PPM);
        let cases = [
            (0, 0),
            (500, 500),
            (1_000, 1_000),
            (2_999, 1_000),
            (3_000, 3_000),
            (4_000, 4_000),
            (4_500, 4_550),
            (5_000, 5_100),
            (6_000, 6_100),
        ];
        for (t, want) in cases {
            assert_eq!(s.at(at(t)), at(want), "at {t} ms");
        }
        // The reading never goes back, whatever the script.
        let mut last = s.at(t0);
        for ms in (0..7_000).step_by(7) {
            let r = s.at(at(ms));
            assert!(r >= last, "went back at {ms} ms");
            last = r;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_scripted_lease_clock_reads_the_script_at_tokios_now() {
        let s = Script::new();
        let clock = LeaseClock::from(s.clone());
        let t0 = Instant::now();
        s.jump_at(t0, MS(4_000));
        assert_eq!(clock.now(), t0 + MS(4_000));
        tokio::time::advance(MS(10)).await;
        assert_eq!(clock.now(), t0 + MS(4_010));
    }

    /// Prints what one host reading costs (`cargo test -p seqsvr-proto --release host_now -- --nocapture`).
    #[test]
    fn host_now_is_cheap() {
        let clock = LeaseClock::host();
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build();
        let Ok(rt) = rt else { return };
        rt.block_on(async {
            const N: u32 = 1_000_000;
            let started = std::time::Instant::now();
            let mut last = clock.now();
            for _ in 0..N {
                let now = clock.now();
                assert!(now >= last);
                last = now;
            }
            let host = started.elapsed() / N;
            let started = std::time::Instant::now();
            for _ in 0..N {
                std::hint::black_box(Instant::now());
            }
            let tokio_only = started.elapsed() / N;
            println!("lease clock now(): {host:?} per read; tokio Instant::now(): {tokio_only:?}");
            // Generous: a debug build on a loaded CI machine; the point is no syscall per read.
            assert!(host < Duration::from_micros(5), "{host:?} per read");
        });
    }
}
