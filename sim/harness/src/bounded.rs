//! A command that must end by itself, run with a time limit: a server started with options it
//! must refuse would, after a regression that accepts them, serve forever and hang the test
//! suite. Here it is killed at the limit and the caller is told why.
//!
//! Deliberately left out: input to the command (refusal tests send none).

use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `cmd` to its end and returns its exit status and output, as [`Command::output`] does;
/// when it is still running after `limit`, kills it and panics with what it printed, naming the
/// command: a refusal that never came.
pub fn output_within(cmd: &mut Command, limit: Duration) -> Output {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {what}: {e}"));
    // Drained beside the wait: a child that fills a pipe would otherwise block and never exit.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < limit => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                let err = String::from_utf8_lossy(&stderr.join().unwrap_or_default()).into_owned();
                panic!("{what} was still running after {limit:?} (killed); stderr:\n{err}");
            }
            Err(e) => panic!("wait for {what}: {e}"),
        }
    };
    Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_that_ends_gives_its_output() {
        let out = output_within(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            Duration::from_secs(10),
        );
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
    }

    #[test]
    fn a_command_that_does_not_end_is_killed_and_named() {
        let started = Instant::now();
        let panicked = std::panic::catch_unwind(|| {
            output_within(Command::new("sleep").arg("30"), Duration::from_millis(200));
        })
        .expect_err("a command still running at its limit panics");
        let msg = panicked.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("sleep") && msg.contains("still running"), "{msg}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }
}
