//! `storesvr restore` as an operator runs it: bad backup files and bad choices end with a clear
//! message and a non-zero exit, never a panic and never a half-written data dir; a good one
//! writes a data dir (once) and reports every ceiling it raised. The restored set serving above
//! everything served before is `sim/e2e/tests/backup_restore.rs`.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{SystemTime, UNIX_EPOCH};

use seqsvr_proto::backup;
use seqsvr_proto::{NodeId, SectionId};
use storesvr::domain::state::{Command as StateCommand, SetParams, SetState};
use storesvr::storage::sm_store::SmData;

fn params() -> SetParams {
    SetParams {
        set_id: 0,
        section_size: 100_000,
        uid_limit: 1_000_000,
        step: 1_000,
        lease_ms: 3_000,
        renew_interval_ms: 500,
        drift_ppm: 10_000,
        margin_ms: 100,
        section_begin: 0,
        section_end: 10,
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// A backup file of an initialized 10-section set that had replica 1, taken at `at_ms`.
fn backup_file(set: impl FnOnce(&mut SetState), at_ms: u64) -> Vec<u8> {
    let mut data = SmData::default();
    data.set.apply(&StateCommand::Init(params()), false);
    data.set.replica_ids_ever.insert(NodeId(1));
    set(&mut data.set);
    storesvr::backup::capture(&data, at_ms).unwrap()
}

fn restore(dir: &Path, file: &[u8], extra: &[&str]) -> Output {
    let path = dir.join("set.backup");
    std::fs::write(&path, file).unwrap();
    let mut args = vec![
        "restore".to_string(),
        format!("--backup={}", path.display()),
        format!("--data-dir={}", dir.join("data").display()),
        "--node-id=7".into(),
        "--addr=127.0.0.1:7007".into(),
        // These tests are about the file: no live map to ask (tests/restore_map.rs in sim/e2e is).
        "--skip-map-check".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    Command::new(env!("CARGO_BIN_EXE_storesvr"))
        .args(&args)
        .output()
        .unwrap()
}

/// Asserts a refusal: exit 1, the message names the problem, no panic, no data dir.
fn assert_refused(dir: &Path, out: &Output, says: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{says}: {stderr}");
    assert!(stderr.contains(says), "wanted {says:?} in: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!dir.join("data").exists(), "{says}: a data dir was left behind");
}

#[test]
fn a_damaged_truncated_or_foreign_backup_file_is_refused_with_what_is_wrong() {
    let tmp = tempfile::tempdir().unwrap();
    let good = backup_file(|_| {}, now_ms());
    let mut corrupt = good.clone();
    corrupt[backup::HEADER_BYTES + 3] ^= 0x40;
    let mut version = good.clone();
    version[8..12].copy_from_slice(&9u32.to_le_bytes());
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (good[..good.len() / 2].to_vec(), "truncated"),
        (good[..good.len() - 1].to_vec(), "truncated"),
        (corrupt, "damaged"),
        (version, "format version 9"),
        (b"hello, not a backup".to_vec(), "not a seqsvr backup"),
        (Vec::new(), "not a seqsvr backup"),
    ];
    for (file, says) in cases {
        let out = restore(tmp.path(), &file, &["--margin-steps=3"]);
        assert_refused(tmp.path(), &out, says);
    }
    let missing = Command::new(env!("CARGO_BIN_EXE_storesvr"))
        .args([
            "restore",
            "--backup=/nonexistent/x",
            "--data-dir=/tmp/never",
            "--node-id=7",
        ])
        .args(["--addr=127.0.0.1:1", "--margin-steps=1"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/x"));
}

/// Issue 25, item 2: a restore checks the backup against a live cluster map unless told, in so
/// many words, that there is none to ask.
#[test]
fn a_restore_without_a_map_to_check_against_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("set.backup");
    std::fs::write(&path, backup_file(|_| {}, now_ms())).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_storesvr"))
        .arg("restore")
        .arg(format!("--backup={}", path.display()))
        .arg(format!("--data-dir={}", tmp.path().join("data").display()))
        .args(["--node-id=7", "--addr=127.0.0.1:7007", "--margin-steps=1"])
        .output()
        .unwrap();
    assert_refused(tmp.path(), &out, "give --map-from");
    let unreachable = Command::new(env!("CARGO_BIN_EXE_storesvr"))
        .arg("restore")
        .arg(format!("--backup={}", path.display()))
        .arg(format!("--data-dir={}", tmp.path().join("data").display()))
        .args([
            "--node-id=7",
            "--addr=127.0.0.1:7007",
            "--margin-steps=1",
            "--map-from=127.0.0.1:1",
        ])
        .output()
        .unwrap();
    assert_refused(tmp.path(), &unreachable, "cannot read the cluster map");
}

#[test]
fn bad_choices_are_refused_naming_the_section_or_the_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let near_top = backup_file(|s| s.sections[6].max_seq = u64::MAX - 500, now_ms());
    assert_refused(
        tmp.path(),
        &restore(tmp.path(), &near_top, &["--margin-steps=1"]),
        "section 6",
    );
    let good = backup_file(|_| {}, now_ms());
    assert_refused(tmp.path(), &restore(tmp.path(), &good, &[]), "no margin given");
    let future = backup_file(|_| {}, now_ms() + 3_600_000);
    let out = restore(tmp.path(), &future, &["--max-bumps-per-sec=5"]);
    assert_refused(tmp.path(), &out, "give --margin-steps");
    let out = restore(tmp.path(), &good, &["--margin-steps=1", "--node-id=1"]);
    assert_refused(tmp.path(), &out, "node id 1 was a member");
    let moving = backup_file(
        |s| {
            let frozen = storesvr::domain::ranges::RangeState::Migrating { op: 4, to_set: 2 };
            s.ranges.set(SectionId(2), SectionId(5), Some(frozen));
        },
        now_ms(),
    );
    assert_refused(
        tmp.path(),
        &restore(tmp.path(), &moving, &["--margin-steps=1"]),
        "move 4",
    );
    let out = restore(tmp.path(), &good, &["--margin-steps=-1"]);
    assert_eq!(out.status.code(), Some(2), "clap refuses a negative count");
}

#[test]
fn a_good_backup_is_restored_once_with_every_ceiling_raised_and_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let file = backup_file(|s| s.sections[3].max_seq = 5_000, now_ms() - 10_000);
    let dry = restore(tmp.path(), &file, &["--margin-steps=2", "--dry-run"]);
    assert!(dry.status.success(), "{dry:?}");
    assert!(!tmp.path().join("data").exists(), "a dry run wrote a data dir");

    // 10 s (and the time this takes) at 3 bumps/s: at least 31 bumps of 4 steps, above 2 steps.
    let out = restore(tmp.path(), &file, &["--margin-steps=2", "--max-bumps-per-sec=3"]);
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let margin: u64 = report
        .split("margin: ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no margin in {report}"));
    assert!((124_000..=140_000).contains(&margin), "{report}");
    let raised = format!("max_seq 0..=5000 -> {margin}..={}", margin + 5_000);
    assert!(report.contains(&raised), "{report}");
    let data = tmp.path().join("data");
    assert_eq!(std::fs::read_to_string(data.join("NODE_ID")).unwrap().trim(), "7");
    assert!(data.join("meta").is_dir());
    assert!(!tmp.path().join("data.restoring").exists());

    let again = restore(tmp.path(), &file, &["--margin-steps=2"]);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert_eq!(again.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("is not empty"), "{stderr}");
}

/// The tick the report says every slot mark was raised to.
fn marks_raised_to(report: &str) -> u64 {
    report
        .split("every slot mark raised to at least tick ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no slot marks in {report}"))
}

/// Issue 47, item 9: a restore must not trust the restoring host's clock alone. A clock that
/// reads before the backup was taken is wrong for sure, and refused even with `--margin-steps`
/// (which needs no age); and the marks rise past the backup's highest mark moved on by the
/// backup's age, not only past this clock: the lost set's holders raised their marks up to its
/// leader's clock plus the allowance, which may be ahead of this host's.
#[test]
fn a_restore_refuses_a_clock_before_the_backup_and_raises_marks_past_the_backups_own() {
    use seqsvr_proto::id_layout::IdLayout;
    use storesvr::domain::slots::SlotCommand;
    let tmp = tempfile::tempdir().unwrap();
    let future = backup_file(|_| {}, now_ms() + 3_600_000);
    let out = restore(tmp.path(), &future, &["--margin-steps=1"]);
    assert_refused(tmp.path(), &out, "before the backup was taken");

    // Twitter's layout from 1970, so that a tick is a Unix millisecond; a slot of the lost set was
    // raised an hour past this clock (its leader's clock ran that far ahead).
    let age_ms = 10_000;
    let high = now_ms() + 3_600_000;
    let with_ids = backup_file(
        |s| {
            let setup = SlotCommand::Setup {
                layout: IdLayout::twitter(0),
                per_set: 4,
                max_ahead_ms: 3_000,
            };
            s.apply(&StateCommand::Slots(setup), false);
            s.ids.as_mut().unwrap().slots[1].mark = high;
        },
        now_ms() - age_ms,
    );
    let out = restore(tmp.path(), &with_ids, &["--margin-steps=1", "--dry-run"]);
    assert!(out.status.success(), "{out:?}");
    let tick = marks_raised_to(&String::from_utf8_lossy(&out.stdout));
    assert!(
        tick >= high + age_ms + 6_000,
        "marks raised to {tick}, below the backup's highest {high} plus its age and twice the allowance"
    );
}
