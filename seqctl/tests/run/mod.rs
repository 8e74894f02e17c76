//! Runs the `seqctl` binary under test, with no address taken from the environment but `env`.
// Each test file uses its own part of it.
#![allow(dead_code)]

use std::time::Duration;

/// What one run of `seqctl` gave.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

pub async fn seqctl(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_seqctl"));
    cmd.args(args)
        .env_remove("SEQCTL_ALLOC")
        .env_remove("SEQCTL_STORE")
        .envs(env.iter().copied())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("seqctl did not exit in 30 s")
        .expect("run seqctl");
    Run {
        code: out.status.code().expect("exited, not killed"),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}
