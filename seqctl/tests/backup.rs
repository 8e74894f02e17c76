//! `seqctl backup` against fake replicas: a whole stream is checked and written atomically through
//! the leader's hint; a cut, damaged or oversized one exits 1 and leaves `--out` as it was.

// The fake AllocSvr and StoreSvr replicas the client library's tests use too.
#[path = "../../client/tests/common/mod.rs"]
mod common;
mod run;

use std::path::Path;

use common::store::FakeReplica;
use run::seqctl;
use seqsvr_proto::backup::{self, Header};
use seqsvr_proto::{limits, pb};

fn file() -> Vec<u8> {
    let header = Header {
        state_format: 2,
        set_id: 4,
        log_index: 99,
        log_term: 3,
        taken_at_unix_ms: 1_700_000_000_000,
        sections: 12,
    };
    backup::encode(&header, &[7u8; 3000]).unwrap()
}

/// `bytes` as the server would send them, in chunks of `size`, announcing `total`.
fn chunks(bytes: &[u8], size: usize, total: u64) -> Vec<pb::BackupChunk> {
    bytes
        .chunks(size)
        .enumerate()
        .map(|(i, c)| pb::BackupChunk {
            not_leader: None,
            data: c.to_vec(),
            total_bytes: if i == 0 { total } else { 0 },
        })
        .collect()
}

/// A follower (r1) that points at the leader (r2), which streams `stream`.
async fn set_streaming(stream: Vec<pb::BackupChunk>) -> (FakeReplica, FakeReplica) {
    let r1 = FakeReplica::start(1).await;
    let r2 = FakeReplica::start(2).await;
    *r1.state.not_leader.lock().unwrap() = Some(pb::LeaderHint {
        leader_id: 2,
        leader_addr: r2.addr.clone(),
    });
    *r2.state.backup.lock().unwrap() = stream;
    (r1, r2)
}

fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "old.backup")
        .collect()
}

#[tokio::test]
async fn a_whole_backup_is_written_through_the_leaders_hint() {
    let f = file();
    let (r1, _r2) = set_streaming(chunks(&f, 1000, f.len() as u64)).await;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("set4.backup");
    let run = seqctl(&["--store", &r1.addr, "backup", "--out", out.to_str().unwrap()], &[]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(std::fs::read(&out).unwrap(), f);
    assert!(
        run.stdout.contains("set 4, 12 sections, log index 99 (term 3)"),
        "{}",
        run.stdout
    );
    assert_eq!(leftovers(dir.path()), ["set4.backup"], "a temp file was left behind");

    let run = seqctl(
        &["--store", &r1.addr, "--json", "backup", "--out", out.to_str().unwrap()],
        &[],
    )
    .await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let v: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(
        (v["set_id"].as_u64(), v["bytes"].as_u64()),
        (Some(4), Some(f.len() as u64))
    );
}

#[tokio::test]
async fn a_cut_damaged_or_oversized_stream_exits_1_and_leaves_the_old_file() {
    let f = file();
    let mut damaged = f.clone();
    damaged[backup::HEADER_BYTES + 10] ^= 1;
    let cases = [
        (chunks(&f[..2000], 1000, f.len() as u64), "ended after 2000"),
        (chunks(&damaged, 1000, f.len() as u64), "damaged"),
        (chunks(&f, 1000, 10), "more than the 10 bytes"),
        (chunks(&f, 1000, limits::MAX_BACKUP_BYTES as u64 + 1), "above the"),
        (Vec::new(), "ended after 0"),
    ];
    for (stream, says) in cases {
        // Straight to the leader: with a follower seed too, the last attempt's error (a hint)
        // would be the one reported when the deadline passes.
        let (_r1, r2) = set_streaming(stream).await;
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("old.backup");
        std::fs::write(&out, b"the previous backup").unwrap();
        let args = [
            "--store",
            &r2.addr,
            "--timeout-ms",
            "1500",
            "backup",
            "--out",
            out.to_str().unwrap(),
        ];
        let run = seqctl(&args, &[]).await;
        assert_eq!(run.code, 1, "{says}: {}", run.stderr);
        assert!(run.stderr.contains(says), "wanted {says:?}: {}", run.stderr);
        assert_eq!(std::fs::read(&out).unwrap(), b"the previous backup", "{says}");
        assert!(leftovers(dir.path()).is_empty(), "{says}: {:?}", leftovers(dir.path()));
    }
    let run = seqctl(&["--store", "127.0.0.1:1", "backup"], &[]).await;
    assert_eq!(run.code, 2, "no --out: {}", run.stderr);
}
