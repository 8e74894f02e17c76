//! Runs the `sim` binary as CI does: against the real `storesvr` and `allocsvr` binaries that
//! `cargo build --workspace --bins` put next to it, bounded in time, output kept on failure.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What one `sim run` left behind.
pub struct SimRun {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// The run's data dir (history, logs); removed by [`SimRun::clean_up`] when the test passed.
    pub dir: PathBuf,
}

impl SimRun {
    /// Everything a failing assertion should show: exit code, where the history is, the output.
    pub fn explain(&self) -> String {
        format!(
            "exit {:?}; data dir (history, logs) kept at {}\n--- stdout\n{}\n--- stderr (tail)\n{}",
            self.code,
            self.dir.display(),
            self.stdout,
            tail(&self.stderr, 4_000)
        )
    }

    pub fn clean_up(self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn tail(s: &str, n: usize) -> &str {
    let mut start = s.len().saturating_sub(n);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// The directory of the server binaries: where cargo put `sim` (`target/<profile>`).
fn bin_dir() -> PathBuf {
    let sim = PathBuf::from(env!("CARGO_BIN_EXE_sim"));
    let dir = sim.parent().expect("sim binary has a directory").to_path_buf();
    for name in ["storesvr", "allocsvr"] {
        assert!(
            dir.join(name).is_file(),
            "{} is missing: run `cargo build --workspace --bins` before `cargo test -p sim`",
            dir.join(name).display()
        );
    }
    dir
}

/// Runs `sim run <args>` and waits at most `limit` (then kills it: its servers die with it,
/// through their parent-death signal) and fails the test.
pub fn sim_run(label: &str, args: &[&str], limit: Duration) -> SimRun {
    let dir = std::env::temp_dir().join(format!("seqsvr-sim-test-{label}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create data dir");
    let out_path = dir.join("sim.stdout");
    let err_path = dir.join("sim.stderr");
    let mut child = Command::new(env!("CARGO_BIN_EXE_sim"))
        .arg("run")
        .args(args)
        .arg("--data-dir")
        .arg(&dir)
        .arg("--bin-dir")
        .arg(bin_dir())
        .stdin(Stdio::null())
        .stdout(File::create(&out_path).expect("stdout file"))
        .stderr(File::create(&err_path).expect("stderr file"))
        .spawn()
        .expect("start sim");
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for sim") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let run = SimRun {
        code: status.and_then(|s| s.code()),
        stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
        dir,
    };
    assert!(
        status.is_some(),
        "sim run did not finish within {limit:?}: {}",
        run.explain()
    );
    run
}

/// The number of ok calls from the `checked:` line, so that a test can refuse a vacuous pass.
pub fn ok_calls(stdout: &str) -> u64 {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("checked: "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// `(ok NextIds calls, ids)` from the `checked: N ok / M failed NextIds calls, K ids` line.
#[allow(dead_code)] // `ci_run` uses it, `negative_controls` (which shares this module) does not
pub fn ids_checked(stdout: &str) -> (u64, u64) {
    let Some(line) = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("checked: "))
        .find(|l| l.contains("NextIds"))
    else {
        return (0, 0);
    };
    let words: Vec<&str> = line.split_whitespace().collect();
    let num = |i: usize| {
        words
            .get(i)
            .and_then(|w| w.trim_end_matches(',').parse().ok())
            .unwrap_or(0)
    };
    // "N ok / M failed NextIds calls, K ids"
    (num(0), num(words.len().saturating_sub(2)))
}
