//! `seqctl` run as a binary against fake servers: output formats and exit codes.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{FakeAlloc, dead_addr, table};
use serde_json::Value;

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

async fn seqctl(args: &[&str], env: &[(&str, &str)]) -> Run {
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

async fn owner_of_everything() -> FakeAlloc {
    let a = FakeAlloc::start().await;
    a.set_routes(table(1, &[(0, 10, &a.addr)]));
    a
}

#[tokio::test]
async fn fetch_prints_a_table_by_default_and_json_on_request() {
    let a = owner_of_everything().await;
    let run = seqctl(&["--alloc", &a.addr, "fetch", "42"], &[]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{}", run.stdout);
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(header, ["UID", "SEQ", "SECTION", "NODE", "INCARNATION", "EPOCH"]);
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(row, ["42", "1", "0", "1", "11", "1"]);

    let run = seqctl(&["--alloc", &a.addr, "--json", "fetch", "42"], &[]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let v: Value = serde_json::from_str(&run.stdout).expect("valid JSON");
    assert_eq!(v["uid"], 42);
    assert_eq!(v["seq"], 2);
    assert_eq!(v["owner"]["section"], 0);
    assert_eq!(v["owner"]["incarnation"], 11);

    let run = seqctl(&["--alloc", &a.addr, "--json", "get", "42"], &[]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let v: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(v["cur_seq"], 2);
}

#[tokio::test]
async fn batch_json_keeps_request_order_and_env_gives_the_address() {
    let a = owner_of_everything().await;
    let run = seqctl(&["--json", "batch", "5", "900", "5"], &[("SEQCTL_ALLOC", &a.addr)]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let v: Value = serde_json::from_str(&run.stdout).unwrap();
    let pairs: Vec<(u64, u64)> = v
        .as_array()
        .expect("an array")
        .iter()
        .map(|r| (r["uid"].as_u64().unwrap(), r["seq"].as_u64().unwrap()))
        .collect();
    assert_eq!(pairs, [(5, 1), (900, 1), (5, 2)]);
}

#[tokio::test]
async fn bad_input_exits_2_with_a_message() {
    let a = owner_of_everything().await;
    let cases: [&[&str]; 4] = [
        &["--alloc", &a.addr, "fetch", "abc"],
        &["--alloc", &a.addr, "fetch", "99999999999999999999999"],
        &["--alloc", &a.addr, "fetch", "5000"], // outside uid_limit 1000
        &["fetch", "1"],                        // no address
    ];
    for args in cases {
        let run = seqctl(args, &[]).await;
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
        assert!(!run.stderr.trim().is_empty(), "{args:?}: no message");
        assert!(run.stdout.is_empty(), "{args:?}: printed {}", run.stdout);
    }
    let run = seqctl(&["--alloc", &a.addr, "fetch", "5000"], &[]).await;
    assert!(run.stderr.contains("invalid argument"), "{}", run.stderr);
    assert_eq!(a.cur_seq(5000), 0);
}

#[tokio::test]
async fn unreachable_server_exits_1_with_one_line() {
    let dead = dead_addr().await;
    let run = seqctl(&["--alloc", &dead, "--timeout-ms", "500", "fetch", "1"], &[]).await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(run.stderr.trim().lines().count(), 1, "{}", run.stderr);
    assert!(run.stderr.starts_with("seqctl: error: unavailable"), "{}", run.stderr);
    assert!(run.stdout.is_empty());
}

#[tokio::test]
async fn timed_out_fetch_exits_3_unknown_outcome() {
    let a = owner_of_everything().await;
    a.state.hang.store(true, Ordering::SeqCst);
    let args = [
        "--alloc",
        &a.addr,
        "--timeout-ms",
        "500",
        "--attempt-timeout-ms",
        "200",
        "fetch",
        "1",
    ];
    let run = seqctl(&args, &[]).await;
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert!(run.stderr.contains("outcome unknown"), "{}", run.stderr);
    assert!(run.stdout.is_empty(), "never a number: {}", run.stdout);
}
