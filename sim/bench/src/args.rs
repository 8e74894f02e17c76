//! Flags more than one benchmark takes, declared once: how long each case is measured, and how
//! long to wait for a quiet machine before it. Each binary flattens them into its own `Args`, so
//! the flags keep one name, default and meaning across the benchmarks.
//!
//! Deliberately left out: `--dir` (each binary keeps different things there) and the flags one
//! benchmark has alone.

use std::time::Duration;

/// The measured window of one case (or one point of a curve).
#[derive(clap::Args, Debug, Clone)]
pub struct Window {
    /// Seconds per measured case (one point of a curve, one server of a pair).
    #[arg(long, default_value_t = 5)]
    pub seconds: u64,
    /// Warm-up before each measured window, milliseconds (not counted).
    #[arg(long, default_value_t = 1_000)]
    pub warmup_ms: u64,
}

/// Waiting for a quiet machine: the 2-core machines these run on are shared.
#[derive(clap::Args, Debug, Clone)]
pub struct Quiet {
    /// Before each case, wait until processes this benchmark did not start use less than this much
    /// CPU (percent of one core), for at most --quiet-wait-secs.
    #[arg(long, default_value_t = 30.0)]
    pub quiet_below: f64,
    /// Longest wait for a quiet machine before each case, seconds.
    #[arg(long, default_value_t = 20)]
    pub quiet_wait_secs: u64,
}

impl Quiet {
    /// Refuses values no run needs: an hour's wait, or a threshold above ten cores.
    pub fn validate(&self) -> Result<(), String> {
        if self.quiet_wait_secs > 3_600 || !(0.0..=1_000.0).contains(&self.quiet_below) {
            return Err("--quiet-wait-secs must be at most 3600 and --quiet-below in 0..=1000".into());
        }
        Ok(())
    }

    pub fn wait(&self) -> Duration {
        Duration::from_secs(self.quiet_wait_secs)
    }
}
