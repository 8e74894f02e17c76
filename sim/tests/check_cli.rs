//! `sim check` as a black box: exit codes on a clean history, a planted violation, a missing file
//! and bad options.

use sim::history::{Call, CallKind, HistoryWriter, Outcome, Record, RunClock, RunInfo, write_max_seqs};
use std::path::Path;
use std::process::Command;

fn fetch(id: u64, invoke: u64, complete: u64, value: u64) -> Record {
    Record::Call(Call {
        id,
        client: 0,
        kind: CallKind::Fetch,
        uids: vec![42],
        invoke_ns: invoke,
        complete_ns: complete,
        outcome: Outcome::Ok,
        values: vec![value],
        owners: vec![],
        error: None,
    })
}

fn write_history(path: &Path, records: &[Record]) {
    let info = RunInfo {
        seed: 7,
        section_size: 100,
        uid_limit: 1000,
        replay: "sim run --seed 7".into(),
        ..Default::default()
    };
    let w = HistoryWriter::create(path, RunClock::start(), &info).unwrap();
    for r in records {
        w.write(r).unwrap();
    }
    w.flush().unwrap();
}

fn sim() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sim"))
}

#[test]
fn clean_history_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let h = dir.path().join("h.jsonl");
    write_history(&h, &[fetch(1, 0, 10, 1), fetch(2, 20, 30, 2)]);
    let m = dir.path().join("m.json");
    write_max_seqs(&m, &[(0, 10)].into()).unwrap();
    let out = sim().arg("check").arg(&h).arg("--max-seqs").arg(&m).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn planted_decrease_exits_one_and_prints_the_calls() {
    let dir = tempfile::tempdir().unwrap();
    let h = dir.path().join("h.jsonl");
    write_history(&h, &[fetch(1, 0, 10, 5), fetch(2, 20, 30, 4)]);
    let out = sim().arg("check").arg(&h).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("VIOLATION P1"), "{text}");
    assert!(text.contains("\"id\":2"), "{text}");
    assert!(text.contains("replay: sim run --seed 7"), "{text}");
}

#[test]
fn value_above_final_max_seq_exits_one() {
    let dir = tempfile::tempdir().unwrap();
    let h = dir.path().join("h.jsonl");
    write_history(&h, &[fetch(1, 0, 10, 11)]);
    let m = dir.path().join("m.json");
    write_max_seqs(&m, &[(0, 10)].into()).unwrap();
    let out = sim().arg("check").arg(&h).arg("--max-seqs").arg(&m).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("VIOLATION P2"));
}

#[test]
fn missing_file_is_a_harness_failure() {
    let out = sim().arg("check").arg("/nonexistent/h.jsonl").output().unwrap();
    assert_eq!(out.status.code(), Some(3));
}

#[test]
fn bad_options_exit_two() {
    let out = sim().arg("check").arg("--no-such-flag").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn moves_without_a_second_set_and_too_many_sets_exit_two() {
    let cases: [&[&str]; 3] = [
        &["--fault-kinds", "move-range"],
        &["--must-include", "move-kill-cli"],
        &["--sets", "5"],
    ];
    for args in cases {
        let out = sim().args(["plan", "--seed", "1"]).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(!String::from_utf8_lossy(&out.stderr).is_empty(), "{args:?}: no message");
    }
    let ok = sim()
        .args(["plan", "--seed", "1", "--sets", "2", "--fault-kinds", "move-range"])
        .output()
        .unwrap();
    assert_eq!(ok.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&ok.stdout).contains("move-range"));
}

#[test]
fn id_controls_clock_faults_and_layouts_need_ids() {
    let cases: [&[&str]; 5] = [
        &["--unsafe-ids-ignore-floor"],
        &["--unsafe-skip-slot-fence"],
        &["--fault-kinds", "id-clock-step"],
        &["--must-include", "id-clock-restart-behind"],
        &["--id-layout", "sonyflake"],
    ];
    for args in cases {
        let out = sim().args(["plan", "--seed", "1"]).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(!String::from_utf8_lossy(&out.stderr).is_empty(), "{args:?}: no message");
        let ok = sim()
            .args(["plan", "--seed", "1", "--ids"])
            .args(args)
            .output()
            .unwrap();
        assert_eq!(ok.status.code(), Some(0), "--ids {args:?}");
    }
    // 16 slots cannot give 3 sets 8 each.
    let out = sim()
        .args(["plan", "--seed", "1", "--ids", "--sets", "3", "--id-layout", "4/8/1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let plan = sim()
        .args(["plan", "--seed", "1", "--ids", "--duration", "300s"])
        .output()
        .unwrap();
    let plan = String::from_utf8_lossy(&plan.stdout);
    assert!(plan.contains("id-clock-") && plan.contains(" clock "), "{plan}");
}
