//! A data dir from the sled era (its vote, commit index, purge point and snapshot in a sled 0.34
//! database under `raft/`) is refused with a message that says what it is and what to do. The
//! fixture is such a directory that sled itself could no longer open after repeated SIGKILLs.

mod common;

use common::free_addr;
use std::process::Command;

#[test]
fn a_sled_era_data_dir_is_refused_with_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/sled-corrupt-after-sigkill.tar.gz"
    );
    let untar = Command::new("tar")
        .arg("xzf")
        .arg(fixture)
        .arg("-C")
        .arg(tmp.path())
        .status()
        .expect("run tar");
    assert!(untar.success(), "tar failed: {untar}");
    let node_id = std::fs::read_to_string(tmp.path().join("NODE_ID")).unwrap();
    let out = seqsvr_harness::output_within(
        Command::new(env!("CARGO_BIN_EXE_storesvr"))
            .arg(format!("--node-id={}", node_id.trim()))
            .arg("--set-id=0")
            .arg(format!("--listen={}", free_addr()))
            .arg(format!("--data-dir={}", tmp.path().display()))
            .env("RUST_LOG", "info,openraft=warn"),
        std::time::Duration::from_secs(60),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    println!("exit {:?}; stderr:\n{err}", out.status.code());
    assert!(!out.status.success(), "a sled-era data dir was accepted:\n{err}");
    for needle in ["sled", "no longer reads", "new node id", "seqctl replica add"] {
        assert!(err.contains(needle), "the refusal does not say {needle:?}:\n{err}");
    }
    assert!(tmp.path().join("raft/db").exists(), "the refused dir was changed");
}
