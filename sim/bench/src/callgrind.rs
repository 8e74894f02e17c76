//! What the callgrind drivers (`examples/call_cost.rs`, `examples/coal_cost.rs`) share: asking a
//! process under `valgrind --tool=callgrind` to zero or dump its counts, and their `main`.
//!
//! Left out: reading the dumps (`sim/bench/callgrind_calls.py`).

use std::future::Future;
use std::process::{Command, ExitCode};

/// `callgrind_control ARG PID` (`--zero`, `--dump=NAME`); fails unless it succeeded.
pub fn control(pid: u32, arg: &str) -> Result<(), String> {
    let out = Command::new("callgrind_control")
        .args([arg, &pid.to_string()])
        .output()
        .map_err(|e| format!("callgrind_control: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "callgrind_control {arg} {pid} failed (is that process under callgrind?)"
        ));
    }
    Ok(())
}

/// Runs a driver on a new runtime: exit 0 when it finished, 1 with its error printed after `name: `.
pub fn main(name: &str, driver: impl Future<Output = Result<(), String>>) -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{name}: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(driver) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::FAILURE
        }
    }
}
