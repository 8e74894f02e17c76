//! The wall clock time-ordered ids are stamped with: the host's, plus an offset that only tests
//! set — from the start (`--test-clock-offset-ms`) or while the process runs, from a file it
//! re-reads every [`FOLLOW_EVERY`] (`--test-clock-file`: the simulator steps a running AllocSvr's
//! clock back and forth by writing a number of milliseconds into it).
//!
//! Ids never rest on this clock for uniqueness (`issuer`); it decides which tick an id gets, and
//! whether this host is too far from the store leader's clock to issue at all.
//!
//! The deterministic simulator runs the AllocSvr on tokio's paused clock: there the wall clock is
//! [`IdClock::on_tokio_time`], a fixed Unix time plus tokio's elapsed time, so that a seed's ids
//! are the same on every replay.
//!
//! Left out: slewing (a step is all a test needs to break a Snowflake), and the lease clock, which
//! is monotonic and never this one.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How often a followed clock file is read.
pub const FOLLOW_EVERY: Duration = Duration::from_millis(50);

/// The ids' clock; clones share the offset.
#[derive(Clone, Debug, Default)]
pub struct IdClock {
    offset_ms: Arc<AtomicI64>,
    /// `None`: the host's wall clock. `Some((at, unix_ms))`: the clock read `unix_ms` at tokio's
    /// instant `at` and runs with tokio's time (the simulator's).
    origin: Option<(tokio::time::Instant, u64)>,
}

impl IdClock {
    /// The host's wall clock.
    pub fn host() -> Self {
        Self::default()
    }

    /// The host's wall clock `offset_ms` off (negative: behind).
    pub fn with_offset(offset_ms: i64) -> Self {
        let c = Self::default();
        c.set_offset(offset_ms);
        c
    }

    /// A clock that reads `unix_ms` now and runs with tokio's time (paused in the simulator).
    pub fn on_tokio_time(unix_ms: u64) -> Self {
        Self::on_tokio_time_since(tokio::time::Instant::now(), unix_ms)
    }

    /// A clock that read `unix_ms` at `at` and runs with tokio's time.
    pub fn on_tokio_time_since(at: tokio::time::Instant, unix_ms: u64) -> Self {
        Self {
            offset_ms: Arc::default(),
            origin: Some((at, unix_ms)),
        }
    }

    pub fn set_offset(&self, offset_ms: i64) {
        self.offset_ms.store(offset_ms, Ordering::Relaxed);
    }

    pub fn offset_ms(&self) -> i64 {
        self.offset_ms.load(Ordering::Relaxed)
    }

    /// Now, Unix milliseconds (0 before 1970).
    pub fn now_ms(&self) -> u64 {
        self.true_ms().saturating_add(self.offset_ms()).max(0) as u64
    }

    /// The time source without this clock's offset: the host's wall clock, or the simulation's
    /// true time.
    pub fn true_ms(&self) -> i64 {
        match self.origin {
            Some((at, unix_ms)) => unix_ms.saturating_add(at.elapsed().as_millis() as u64) as i64,
            None => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64),
        }
    }

    /// Follows `path` for the life of the process: whenever it holds a (signed) number of
    /// milliseconds that differs from the offset, that is the offset from then on. A file that is
    /// missing or does not parse leaves the offset as it is.
    pub fn follow(&self, path: PathBuf) {
        let clock = self.clone();
        tokio::spawn(async move {
            loop {
                if let Ok(text) = tokio::fs::read_to_string(&path).await
                    && let Ok(ms) = text.trim().parse::<i64>()
                    && ms != clock.offset_ms()
                {
                    // Stepped before the line is written: a test that waits for the line may
                    // count on the new clock from then on.
                    let from = clock.offset_ms();
                    clock.set_offset(ms);
                    tracing::warn!(from, to = ms, "TEST: the ids' clock steps");
                }
                tokio::time::sleep(FOLLOW_EVERY).await;
            }
        });
    }
}
