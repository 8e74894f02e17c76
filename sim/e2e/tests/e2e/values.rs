//! What the front-end tests (`fronts.rs`, `redis_cluster.rs`) share: the values clients got, the
//! check that each name's values are unique and rise across calls (P1/U1 on CLOCK_MONOTONIC),
//! the Python `redis` package they run, and an AllocSvr's metrics page.
//!
//! Deliberately left out: any client of its own; each test drives the ones it is about.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

/// One value a client got, or none.
#[derive(Debug, Clone)]
pub struct Obs {
    pub client: String,
    pub name: String,
    pub start: u64,
    pub end: u64,
    pub value: u64,
}

pub fn monotonic_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

/// The Python `redis` package in `target/pydeps`, installed there when missing; the directory
/// to put on PYTHONPATH.
pub fn python_redis() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/pydeps");
    if !dir.join("redis").exists() {
        let out = std::process::Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--target",
            ])
            .arg(&dir)
            // Pinned: the test checks this client's behaviour, which a new release may change.
            .arg("redis==6.4.0")
            .output();
        // Fails loudly: a run without the package would check the front ends without the client
        // the test is for, and pass.
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => panic!(
                "pip could not install redis==6.4.0 into {}: {}",
                dir.display(),
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => panic!("pip could not run (python3 -m pip): {e}"),
        }
    }
    dir
}

/// Values each client got, printed with how many calls got none (and the first ten of those),
/// for the test's log; returned for the test's own per-client checks.
pub fn per_client<'a>(obs: &'a [Obs], errors: &[String], also: &str) -> std::collections::HashMap<&'a str, usize> {
    let mut per_client: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for o in obs {
        *per_client.entry(o.client.as_str()).or_default() += 1;
    }
    eprintln!(
        "values per client: {per_client:?}; {} calls without a value{also}",
        errors.len()
    );
    for e in errors.iter().take(10) {
        eprintln!("  {e}");
    }
    per_client
}

/// Every name's values are unique, and each is above every value of the name whose call ended
/// before its call began.
pub fn check(obs: &[Obs]) {
    let mut by_name: HashMap<&str, Vec<&Obs>> = HashMap::new();
    for o in obs {
        by_name.entry(&o.name).or_default().push(o);
    }
    for (name, list) in by_name {
        let mut seen = HashSet::new();
        for o in &list {
            assert!(o.value > 0, "{name}: a value of 0 from {}", o.client);
            assert!(seen.insert(o.value), "{name}: value {} handed out twice", o.value);
        }
        let mut by_end = list.clone();
        by_end.sort_by_key(|o| o.end);
        let mut by_start = list.clone();
        by_start.sort_by_key(|o| o.start);
        let (mut j, mut highest): (usize, Option<&Obs>) = (0, None);
        for o in by_start {
            while j < by_end.len() && by_end[j].end < o.start {
                if highest.is_none_or(|h| by_end[j].value > h.value) {
                    highest = Some(by_end[j]);
                }
                j += 1;
            }
            if let Some(h) = highest {
                assert!(
                    o.value > h.value,
                    "{name}: {} got {} after {} had got {} (P1/U1)",
                    o.client,
                    o.value,
                    h.client,
                    h.value
                );
            }
        }
    }
}

/// The metrics page of `addr`, through Python's HTTP client (no HTTP client crate needed here).
pub async fn metrics_page(addr: &str) -> String {
    let out = tokio::process::Command::new("python3")
        .args([
            "-c",
            &format!(
                "import urllib.request as u; print(u.urlopen('http://{addr}/metrics', timeout=5).read().decode())"
            ),
        ])
        .output()
        .await
        .expect("python3 runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}
