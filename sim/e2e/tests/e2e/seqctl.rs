//! `seqctl` as the end-to-end tests run it: the real binary from the target directory, with the
//! options every call of one test shares (`--store`, `--alloc`, certificates) given once.
//!
//! Deliberately left out: parsing `seqctl`'s human output (tests ask for `--json` and read fields).

use std::process::{Output, Stdio};

use super::sibling_bin;

/// `seqctl` with fixed leading options.
#[derive(Clone, Debug)]
pub struct Seqctl {
    base: Vec<String>,
}

impl Seqctl {
    /// `seqctl BASE...`, e.g. `Seqctl::new(["--store", seeds])`.
    pub fn new<S: AsRef<str>>(base: impl IntoIterator<Item = S>) -> Self {
        Self {
            base: base.into_iter().map(|s| s.as_ref().to_string()).collect(),
        }
    }

    /// The same with more leading options (certificates, a timeout).
    pub fn with<S: AsRef<str>>(&self, more: impl IntoIterator<Item = S>) -> Self {
        let mut base = self.base.clone();
        base.extend(more.into_iter().map(|s| s.as_ref().to_string()));
        Self { base }
    }

    /// The command, for a test that needs the child itself (to read its stderr as it runs, to
    /// kill it); killed when dropped.
    pub fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(sibling_bin("seqctl"));
        c.args(&self.base).args(args).stdin(Stdio::null()).kill_on_drop(true);
        c
    }

    /// Runs it to the end, whatever its exit.
    pub async fn output(&self, args: &[&str]) -> Output {
        self.command(args).output().await.expect("run seqctl")
    }

    /// Runs it to the end from a test that is not async.
    pub fn output_blocking(&self, args: &[&str]) -> Output {
        std::process::Command::new(sibling_bin("seqctl"))
            .args(&self.base)
            .args(args)
            .output()
            .expect("run seqctl")
    }

    /// Runs it and fails the test, with everything it said, unless it exits 0.
    pub async fn ok(&self, args: &[&str]) -> Output {
        let out = self.output(args).await;
        assert!(out.status.success(), "seqctl {args:?}: {}", text(&out));
        out
    }

    /// `--json` ARGS: the document it printed, `None` unless it exited 0 with valid JSON (for
    /// polls that retry).
    pub async fn json(&self, args: &[&str]) -> Option<serde_json::Value> {
        let out = self.output(&[&["--json"], args].concat()).await;
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }
}

/// Exit code, stdout and stderr, for assertion messages.
pub fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
