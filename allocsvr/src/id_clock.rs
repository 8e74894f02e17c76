//! The wall clock time-ordered ids are stamped with: the host's, plus an offset that only tests
//! set — from the start (`--test-clock-offset-ms`) or while the process runs, from a file it
//! re-reads every [`FOLLOW_EVERY`] (`--test-clock-file`: the simulator steps a running AllocSvr's
//! clock back and forth by writing a number of milliseconds into it).
//!
//! Ids never rest on this clock for uniqueness (`issuer`); it decides which tick an id gets, and
//! whether this host is too far from the store leader's clock to issue at all.
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

    pub fn set_offset(&self, offset_ms: i64) {
        self.offset_ms.store(offset_ms, Ordering::Relaxed);
    }

    pub fn offset_ms(&self) -> i64 {
        self.offset_ms.load(Ordering::Relaxed)
    }

    /// Now, Unix milliseconds (0 before 1970).
    pub fn now_ms(&self) -> u64 {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        wall.saturating_add(self.offset_ms()).max(0) as u64
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
                    tracing::warn!(from = clock.offset_ms(), to = ms, "TEST: the ids' clock steps");
                    clock.set_offset(ms);
                }
                tokio::time::sleep(FOLLOW_EVERY).await;
            }
        });
    }
}
