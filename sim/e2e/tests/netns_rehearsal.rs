//! The multi-host rehearsal (`scripts/netns-cluster.sh`): a two-set cluster with every process in
//! its own network namespace on one bridge, a partition and a one-way cut under load, a move, and
//! the checkers over the history. It needs root, `ip netns` and `nft` (`scripts/test.sh` installs
//! iproute2 and nftables); without them it fails and says why.
//!
//! Needs the `storesvr`, `allocsvr`, `seqctl` and `sim` binaries: `cargo build --workspace --bins`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The script's load runs this long; with start-up, verify and teardown the test stays under 3 min.
const LOAD_SECS: &str = "45";
const WHOLE_RUN: Duration = Duration::from_secs(170);

/// Why the rehearsal cannot run here, if it cannot.
fn missing_prerequisite() -> Option<String> {
    let uid = Command::new("id").arg("-u").output().ok()?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Some("not root (network namespaces need it)".into());
    }
    let netns = Command::new("ip").args(["netns", "list"]).output();
    if !netns.is_ok_and(|o| o.status.success()) {
        return Some("`ip netns` does not work here (iproute2 missing or no permission)".into());
    }
    let nft = Command::new("nft").arg("--version").output();
    if !nft.is_ok_and(|o| o.status.success()) {
        return Some("`nft` not found (apt-get install nftables)".into());
    }
    None
}

fn bin_dir() -> PathBuf {
    let storesvr = seqsvr_harness::find_binary("storesvr", None)
        .unwrap_or_else(|e| panic!("{e}: run `cargo build --workspace --bins` first"));
    let dir = storesvr.parent().expect("a binary has a directory").to_path_buf();
    for b in ["allocsvr", "seqctl", "sim"] {
        assert!(
            dir.join(b).is_file(),
            "{b} missing next to {}: cargo build --workspace --bins",
            storesvr.display()
        );
    }
    dir
}

#[test]
fn two_sets_in_network_namespaces_survive_a_partition_and_a_one_way_cut() {
    // Fails loudly: a rehearsal that cannot run has shown nothing, and must not pass.
    if let Some(why) = missing_prerequisite() {
        panic!("the netns rehearsal cannot run: {why}; scripts/test.sh (as root) installs what it needs");
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = tempfile::tempdir().expect("temp dir");
    let mut child = Command::new("bash")
        .arg(root.join("scripts/netns-cluster.sh"))
        .args(["--duration", LOAD_SECS])
        .env("BIN_DIR", bin_dir())
        .env("OUT", out.path())
        .env("SEED", "14")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start scripts/netns-cluster.sh");
    let stdout = child.stdout.take().expect("piped stdout");
    // Read the output on a thread so that the deadline below holds even if the script stalls.
    let reader = std::thread::spawn(move || std::io::read_to_string(stdout).unwrap_or_default());
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for the script") {
            break s;
        }
        if started.elapsed() > WHOLE_RUN {
            // SIGTERM: the script's trap stops every process and deletes its namespaces.
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
            let _ = child.wait();
            panic!(
                "the rehearsal took longer than {WHOLE_RUN:?}; logs in {}",
                out.keep().display()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let text = reader.join().unwrap_or_default();
    print!("{text}");
    if !status.success() {
        panic!("rehearsal failed ({status}); logs in {}", out.keep().display());
    }
    // The run must have been judged over a real history: calls, the faults and the move in it.
    for want in ["netns-cluster: PASS", "violations: 0", "partition", "one-way", "move "] {
        assert!(text.contains(want), "no {want:?} in the output");
    }
    let left = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    let prefix = format!("nsr{}-", child.id());
    assert!(
        !String::from_utf8_lossy(&left.stdout).contains(&prefix),
        "namespaces {prefix}* left behind"
    );
}
