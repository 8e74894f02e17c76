//! How every benchmark binary ends: one error type for "bad options" against "the harness failed",
//! and one `main` body that runs the benchmark on a runtime and maps its outcome to an exit code
//! (0 done, 1 done but a target not met, 2 bad options or missing binaries, 3 harness failure).
//!
//! Left out: parsing and validating each binary's own options (they differ per binary; the checks
//! they share are in [`crate::args`]).

use std::future::Future;
use std::process::ExitCode;

/// Why a benchmark could not finish.
pub enum Failure {
    /// Bad options or missing binaries: exit 2.
    Usage(String),
    /// The harness or the cluster failed: exit 3.
    Harness(String),
}

/// A harness failure with this message.
pub fn harness(msg: impl Into<String>) -> Failure {
    Failure::Harness(msg.into())
}

/// [`run`] when the options are `valid`; otherwise prints `name: why` and exits 2 without starting
/// anything (`bench` is a future, not yet polled: nothing of it has run).
pub fn run_valid<F>(name: &str, valid: Result<(), String>, bench: F) -> ExitCode
where
    F: Future<Output = Result<bool, Failure>>,
{
    match valid {
        Ok(()) => run(name, bench),
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::from(2)
        }
    }
}

/// Runs `bench` on a new multi-thread runtime. `Ok(true)` exits 0, `Ok(false)` (a target not met)
/// 1; a failure is printed after `name: ` and exits 2 or 3.
pub fn run<F>(name: &str, bench: F) -> ExitCode
where
    F: Future<Output = Result<bool, Failure>>,
{
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{name}: cannot start the runtime: {e}");
            return ExitCode::from(3);
        }
    };
    match runtime.block_on(bench) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(Failure::Usage(e)) => {
            eprintln!("{name}: {e}");
            ExitCode::from(2)
        }
        Err(Failure::Harness(e)) => {
            eprintln!("{name}: {e}");
            ExitCode::from(3)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn invalid_options_exit_2_and_start_nothing() {
        let started = Cell::new(false);
        let bench = async {
            started.set(true);
            Ok(true)
        };
        assert_eq!(
            run_valid("t", Err("--runs must be in 1..=9".into()), bench),
            ExitCode::from(2)
        );
        assert!(!started.get(), "the benchmark ran although its options were refused");
    }

    #[test]
    fn valid_options_run_the_benchmark() {
        let started = Cell::new(false);
        let bench = async {
            started.set(true);
            Ok(false)
        };
        assert_eq!(run_valid("t", Ok(()), bench), ExitCode::FAILURE);
        assert!(started.get());
    }
}
