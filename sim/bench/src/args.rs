//! Flags more than one benchmark takes, declared once: the config file, how long each case is
//! measured, how long to wait for a quiet machine before it, and where the run's data goes; and
//! the checks of list flags the benchmarks share. Each binary flattens the groups into its own
//! `Args`, so the flags keep one name, default, help text and meaning across the benchmarks. Each
//! group sets `about = None`: clap would otherwise show a group's doc as the description of a
//! binary that has none of its own (`store-bench`).
//!
//! Deliberately left out: `--runs`, `--callers` and `--only` themselves (each binary says in its
//! own help what a run, a caller or a case is there; only their checks are here), `store-bench`'s
//! and `takeover-bench`'s `--dir` (they keep other things there, with other defaults), and the
//! flags one benchmark has alone.

use std::fmt::{Debug, Display};
use std::path::PathBuf;
use std::time::Duration;

/// `--config FILE`, which `seqsvr_plumbing::cli::parse` reads before the other flags.
#[derive(clap::Args, Debug, Clone)]
#[command(about = None, long_about = None)]
pub struct Config {
    /// Read options from this TOML file (`some_option = value`); flags and environment variables
    /// override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// The measured window of one case (or one point of a curve).
#[derive(clap::Args, Debug, Clone)]
#[command(about = None, long_about = None)]
pub struct Window {
    /// Seconds per measured case (one point of a curve, one server of a pair).
    #[arg(long, default_value_t = 5)]
    pub seconds: u64,
    /// Warm-up before each measured window, milliseconds (not counted).
    #[arg(long, default_value_t = 1_000)]
    pub warmup_ms: u64,
}

impl Window {
    /// Refuses a window longer than the benchmark allows (its cases times its points must end
    /// within a run someone waits for).
    pub fn validate(&self, max_seconds: u64, max_warmup_ms: u64) -> Result<(), String> {
        if !(1..=max_seconds).contains(&self.seconds) {
            return Err(format!("--seconds must be in 1..={max_seconds}"));
        }
        if self.warmup_ms > max_warmup_ms {
            return Err(format!("--warmup-ms must be at most {max_warmup_ms}"));
        }
        Ok(())
    }

    /// The window as the load loops take it.
    pub fn durations(&self) -> crate::load::Window {
        crate::load::Window {
            warmup: Duration::from_millis(self.warmup_ms),
            measure: Duration::from_secs(self.seconds),
        }
    }
}

/// Waiting for a quiet machine: the 2-core machines these run on are shared.
#[derive(clap::Args, Debug, Clone)]
#[command(about = None, long_about = None)]
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

/// The flags of a benchmark that starts its own cluster in a temp dir and measures it in windows
/// (`alloc-bench`, `cost-curves`, `counter-bench`, `ids-bench`).
#[derive(clap::Args, Debug, Clone)]
#[command(about = None, long_about = None)]
pub struct Common {
    #[command(flatten)]
    pub config: Config,
    #[command(flatten)]
    pub window: Window,
    #[command(flatten)]
    pub quiet: Quiet,
    /// Where the StoreSvr replicas keep their data (default: a temp dir next to the target dir).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

impl Common {
    /// The window within the benchmark's bounds and a sane quiet wait.
    pub fn validate(&self, max_seconds: u64, max_warmup_ms: u64) -> Result<(), String> {
        self.window.validate(max_seconds, max_warmup_ms)?;
        self.quiet.validate()
    }
}

/// `--runs` of a benchmark that reports medians over its runs: at least one, and few enough that
/// a run of every point ends the same hour.
pub fn check_runs(runs: usize) -> Result<(), String> {
    if !(1..=9).contains(&runs) {
        return Err("--runs must be in 1..=9".into());
    }
    Ok(())
}

/// Every value `flag` was given is one of `allowed` (the points a benchmark knows).
pub fn check_subset<T: PartialEq + Display + Debug>(flag: &str, given: &[T], allowed: &[T]) -> Result<(), String> {
    match given.iter().find(|v| !allowed.contains(v)) {
        Some(bad) => Err(format!("{flag}: {bad} is not one of {allowed:?}")),
        None => Ok(()),
    }
}

/// The values of `all` that `wanted` names, in `all`'s order; all of them when it names none (a
/// subset flag left empty measures every point).
pub fn chosen<T: Copy + PartialEq>(all: &[T], wanted: &[T]) -> Vec<T> {
    all.iter()
        .copied()
        .filter(|v| wanted.is_empty() || wanted.contains(v))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A benchmark's `Args` in small: the shared group flattened in.
    #[derive(clap::Parser, Debug)]
    struct Bench {
        #[command(flatten)]
        common: Common,
    }

    #[test]
    fn the_config_file_of_the_flattened_group_sets_its_flags() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("bench.toml");
        std::fs::write(&file, "seconds = 7\nquiet_below = 12.5\n").expect("write the file");
        let file = file.to_str().expect("a UTF-8 path");
        let args = ["bench", "--config", file, "--seconds", "9"];
        let b: Bench = seqsvr_plumbing::cli::try_parse_from("SEQSVR_BENCH_ARGS_TEST", args).expect("parses");
        assert_eq!(b.common.window.seconds, 9, "a flag overrides the file");
        assert_eq!(b.common.quiet.quiet_below, 12.5, "the file sets what no flag does");
        assert_eq!(b.common.window.warmup_ms, 1_000, "the default stays");
        assert_eq!(b.common.dir, None);
    }

    #[test]
    fn subsets_keep_the_order_of_all_and_refuse_strangers() {
        assert_eq!(chosen(&[1, 16, 64, 256], &[]), vec![1, 16, 64, 256]);
        assert_eq!(chosen(&[1, 16, 64, 256], &[256, 1]), vec![1, 256]);
        assert!(check_subset("--callers", &[16, 64], &[1, 16, 64, 256]).is_ok());
        assert_eq!(
            check_subset("--callers", &[16, 32], &[1, 16, 64, 256]),
            Err("--callers: 32 is not one of [1, 16, 64, 256]".to_string())
        );
    }

    #[test]
    fn the_window_is_bounded_by_the_caller() {
        let w = Window {
            seconds: 60,
            warmup_ms: 10_000,
        };
        assert!(w.validate(60, 10_000).is_ok());
        assert!(w.validate(59, 10_000).is_err());
        assert!(w.validate(60, 9_999).is_err());
        let zero = Window { seconds: 0, ..w };
        assert!(zero.validate(600, 60_000).is_err());
        assert_eq!(w.durations().measure, Duration::from_secs(60));
        assert_eq!(w.durations().warmup, Duration::from_secs(10));
    }
}
