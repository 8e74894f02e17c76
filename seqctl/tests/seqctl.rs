//! `seqctl` run as a binary against fake servers: output formats and exit codes.

// The fake AllocSvr and StoreSvr replicas the client library's tests use too.
#[path = "../../client/tests/common/mod.rs"]
mod common;
mod run;

use std::sync::atomic::Ordering;

use common::store::FakeReplica;
use common::{FakeAlloc, dead_addr, table};
use run::seqctl;
use seqsvr_proto::pb;
use serde_json::Value;

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

/// A two-replica set: node 1 follows, node 2 leads; node 3 is listed as a member but unreachable.
async fn store_set() -> (FakeReplica, FakeReplica, String) {
    let r1 = FakeReplica::start(1).await;
    let r2 = FakeReplica::start(2).await;
    let dead = dead_addr().await;
    let members = vec![
        pb::ReplicaInfo {
            node_id: 1,
            addr: r1.addr.clone(),
            voter: true,
        },
        pb::ReplicaInfo {
            node_id: 2,
            addr: r2.addr.clone(),
            voter: true,
        },
        pb::ReplicaInfo {
            node_id: 3,
            addr: dead.clone(),
            voter: true,
        },
    ];
    let alloc = pb::AllocSvrInfo {
        node_id: 7,
        incarnation: 70,
        addr: "127.0.0.1:7100".into(),
        alive: true,
        last_renew_ms_ago: 120,
        sections_owned: 10,
        version: "0.2.0 (commit 0123456789ab)".into(),
    };
    for (r, alive) in [(&r1, false), (&r2, true)] {
        *r.state.status.lock().unwrap() = pb::StatusReply {
            node_id: r.state.node_id,
            set_id: 0,
            leader_id: 2,
            leader_addr: r2.addr.clone(),
            term: 4,
            committed_index: 90 + r.state.node_id,
            applied_index: 90 + r.state.node_id,
            last_log_index: 95,
            members: members.clone(),
            allocsvrs: vec![pb::AllocSvrInfo { alive, ..alloc.clone() }],
            route_version: 3,
            sections_total: 10,
            sections_owned: 10,
            ..Default::default()
        };
        *r.state.routes.lock().unwrap() = Some(table(3, &[(0, 4, "127.0.0.1:7100"), (4, 10, "")]));
        *r.state.voters.lock().unwrap() = vec![1, 2, 3];
    }
    *r1.state.not_leader.lock().unwrap() = Some(pb::LeaderHint {
        leader_id: 2,
        leader_addr: r2.addr.clone(),
    });
    (r1, r2, dead)
}

#[tokio::test]
async fn status_shows_the_leaders_view_and_each_members_own() {
    // The dead member refuses connections at once, so a long attempt deadline costs nothing; a
    // short one (300 ms) let a live member time out while the other tests loaded the machine.
    let (r1, r2, _dead) = store_set().await;
    let store = r1.addr.clone();
    let run = seqctl(
        &["--store", &store, "--json", "--attempt-timeout-ms", "3000", "status"],
        &[],
    )
    .await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let v: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(v["answered_by"], 2, "the leader's view is preferred");
    assert_eq!(v["term"], 4);
    assert_eq!(v["allocsvrs"][0]["alive"], true);
    assert_eq!(v["allocsvrs"][0]["incarnation"], 70);
    let members = v["members"].as_array().unwrap();
    assert_eq!(members.len(), 3);
    assert_eq!(members[0]["view"]["committed_index"], 91);
    assert_eq!(members[1]["view"]["committed_index"], 92);
    assert!(members[2]["error"].is_string(), "unreachable member: {}", members[2]);

    let run = seqctl(&["--store", &store, "--attempt-timeout-ms", "3000", "status"], &[]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout.contains(&format!("leader 2 ({})", r2.addr)),
        "{}",
        run.stdout
    );
    let row = |id: &str| {
        run.stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(id))
            .unwrap_or_else(|| panic!("no row {id}: {}", run.stdout))
            .to_owned()
    };
    assert!(row("2").contains("leader"), "{}", run.stdout);
    assert!(row("1").contains("follower"), "{}", run.stdout);
    assert!(row("3").contains("unreachable"), "{}", run.stdout);
    assert!(row("7").contains("127.0.0.1:7100"), "allocsvr row: {}", run.stdout);
}

#[tokio::test]
async fn routes_prints_owners_and_unowned_ranges() {
    let (r1, _r2, _dead) = store_set().await;
    let run = seqctl(&["--routes-never-a-flag"], &[]).await;
    assert_eq!(run.code, 2, "unknown flags are usage errors");

    let run = seqctl(&["routes"], &[("SEQCTL_STORE", &r1.addr)]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout
            .starts_with("route version 3, section_size 100, uid_limit 1000"),
        "{}",
        run.stdout
    );
    let first = run.stdout.lines().nth(2).expect("a first entry row");
    assert!(
        first.contains("[0, 4)") && first.contains("[0, 400)") && first.contains("127.0.0.1:7100"),
        "{first}"
    );
    assert!(run.stdout.contains("(unowned)"), "{}", run.stdout);

    let run = seqctl(&["--json", "routes"], &[("SEQCTL_STORE", &r1.addr)]).await;
    let v: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(v["version"], 3);
    assert_eq!(v["entries"][1]["section_begin"], 4);
    assert_eq!(v["entries"][1]["addr"], "");
}

#[tokio::test]
async fn replica_commands_follow_the_leader_hint() {
    let (r1, r2, _dead) = store_set().await;
    let run = seqctl(
        &["--store", &r1.addr, "--json", "replica", "add", "4", "127.0.0.1:7004"],
        &[],
    )
    .await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let v: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(v["voters"], serde_json::json!([1, 2, 3, 4]));
    assert_eq!(
        (r1.admin_calls(), r2.admin_calls()),
        (1, 1),
        "one hop from follower to leader"
    );

    let run = seqctl(&["--store", &r2.addr, "replica", "remove", "3"], &[]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.starts_with("voters 1,2,4"), "{}", run.stdout);

    // Refused by the leader as a bad request: exit 2, not retried.
    let run = seqctl(&["--store", &r2.addr, "replica", "add", "2", "127.0.0.1:7002"], &[]).await;
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert_eq!(r2.admin_calls(), 2, "the refused add was not retried");
    let run = seqctl(&["--store", &r2.addr, "replica", "add", "5", "not an address"], &[]).await;
    assert_eq!(run.code, 2, "{}", run.stderr);
}

#[tokio::test]
async fn audit_prints_one_line_per_record_and_json_on_request() {
    let (r1, r2, _dead) = store_set().await;
    let record = |number, at_ms, what: &str, outcome: &str| pb::AuditRecord {
        number,
        at_ms,
        who: "CN=ops".into(),
        what: what.into(),
        outcome: outcome.into(),
    };
    *r2.state.audit.lock().unwrap() = pb::GetAuditReply {
        not_leader: None,
        records: vec![
            record(8, 1_700_000_000_123, "drain AllocSvr node 3", "draining incarnation 5"),
            record(9, 1_700_000_001_000, "remove replica 3", "started"),
        ],
        dropped: 7,
        last: 9,
    };
    let run = seqctl(&["--store", &r1.addr, "audit", "--limit", "2"], &[]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "#8 2023-11-14T22:13:20.123Z CN=ops: drain AllocSvr node 3 -> draining incarnation 5",
            "#9 2023-11-14T22:13:21Z CN=ops: remove replica 3 -> started",
            "(7 older records were dropped to keep the trail bounded)",
        ]
    );
    let asked = r2.state.audit_asked.lock().unwrap().expect("the leader was asked");
    assert_eq!((asked.after, asked.limit, asked.newest), (0, 2, true), "the newest two");
    assert_eq!(r1.admin_calls(), 1, "the follower's hint was followed");

    let run = seqctl(&["--store", &r2.addr, "--json", "audit", "--after", "8"], &[]).await;
    assert_eq!(run.code, 0, "{}", run.stderr);
    let v: Value = serde_json::from_str(&run.stdout).expect("valid JSON");
    assert_eq!((v["dropped"].as_u64(), v["last"].as_u64()), (Some(7), Some(9)));
    assert_eq!(v["records"][0]["at"], "2023-11-14T22:13:20.123Z");
    assert_eq!(v["records"][0]["at_ms"], 1_700_000_000_123u64);
    assert_eq!(v["records"][1]["what"], "remove replica 3");
    assert_eq!(v["records"][1]["who"], "CN=ops");
    let asked = r2.state.audit_asked.lock().unwrap().unwrap();
    assert_eq!(
        (asked.after, asked.limit, asked.newest),
        (8, 50, false),
        "oldest above 8"
    );

    for bad in ["0", "1001"] {
        let run = seqctl(&["--store", &r2.addr, "audit", "--limit", bad], &[]).await;
        assert_eq!(run.code, 2, "--limit {bad}: {}", run.stderr);
        assert!(run.stderr.contains("--limit must be in 1..=1000"), "{}", run.stderr);
    }
}

/// `seqctl verify` without a verdict to give exits 2 with one clear line: nothing to verify, no
/// reserved uids named, a front end that answered no call, gRPC seeds that do not answer.
#[tokio::test]
async fn verify_without_a_cluster_to_judge_exits_2() {
    let dead = dead_addr().await;
    let cases: [(&[&str], &str); 4] = [
        (&["verify", "--duration", "1s"], "nothing to verify"),
        (
            &["verify", "--duration", "1s", "--http", &dead],
            "--uids FIRST..END is required",
        ),
        (
            &["verify", "--duration", "1s", "--resp", &dead, "--uids", "5..10"],
            "no call through resp succeeded",
        ),
        (
            &["--timeout-ms", "500", "verify", "--duration", "1s", "--grpc", &dead],
            "cannot reach the AllocSvrs",
        ),
    ];
    for (args, want) in cases {
        let run = seqctl(args, &[]).await;
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
        assert!(run.stderr.contains(want), "{args:?}: {}", run.stderr);
    }
    let run = seqctl(&["verify", "--uids", "9..3", "--http", &dead], &[]).await;
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("the range is empty"), "{}", run.stderr);
}
