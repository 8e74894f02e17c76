//! Ledger counters end to end: 3 real `storesvr` processes and 2 real `allocsvr` processes on
//! loopback, driven through the client library, raw gRPC, HTTP/JSON (`curl`) and `seqctl`.
//!
//! What it proves, each able to fail:
//! - any AllocSvr answers: every call goes first to the AllocSvr that does *not* own the key's
//!   section, and the numbers follow each other 1, 2, 3, … whichever front and AllocSvr takes
//!   them (no gap, no repeat: G1);
//! - a reply never carries `not_leader` (the AllocSvr follows the store's hints itself);
//! - a lost reserve reply costs no number: the same request id sent again — to the other
//!   AllocSvr — answers the same number, marked repeated;
//! - a confirm repeated with the same reference answers the same; another reference is a conflict
//!   (gRPC ALREADY_EXISTS, HTTP 409), a release of a confirmed number is refused (HTTP 412);
//! - an issue (a reserve with a reference) answers the next number confirmed through every front,
//!   and the same reference again answers that number;
//! - the gap report (`seqctl ledger gaps`) lists every voided number with its reason, who, note
//!   and time, as CSV and JSON, and a hold that runs out is voided "expired";
//! - bad input gets a clear refusal: `seqctl` exits 2 on a bad key, 1 on a number never handed
//!   out;
//! - with mutual TLS, ledger calls are forwarded over TLS with the AllocSvr's certificate, and
//!   only an `admin` certificate voids: a `client`'s is refused by the role check, another
//!   AllocSvr's by the AllocSvr's own check (the store admits that role for forwarded voids).
//!
//! Needs the `storesvr`, `allocsvr` and `seqctl` binaries (`cargo build --workspace --bins`) and
//! `curl`.
//!
//! Deliberately left out: moves of a ledger's section between sets and restores (the store's
//! tests and the simulator cover them; the AllocSvr's following of a moved section is a unit test
//! of `allocsvr::ledger::forward`).

mod e2e;

use std::time::Duration;

use e2e::seqctl::{Seqctl, text};
use e2e::{Cluster, poll};
use seqsvr_client::{Client, ClientConfig, FailureKind};
use seqsvr_proto::pb;
use serde_json::Value;

const START_WITHIN: Duration = Duration::from_secs(30);
const KEY: &str = "invoices-2026";

/// A client seeded with one AllocSvr only.
fn client_of(addr: &str) -> Client {
    Client::new(ClientConfig::new([addr.to_owned()])).expect("client")
}

/// `curl` METHOD URL [BODY]: the status and the JSON body.
async fn curl(method: &str, url: &str, body: Option<&str>) -> (u16, Value) {
    let mut cmd = tokio::process::Command::new("curl");
    cmd.args(["-sS", "--max-time", "10", "-X", method, "-w", "\n%{http_code}"]);
    if let Some(b) = body {
        cmd.args(["-H", "content-type: application/json", "--data", b]);
    }
    let out = cmd
        .arg(url)
        .output()
        .await
        .expect("curl is installed (Debian package curl; scripts/test.sh installs it)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let (json, code) = stdout
        .rsplit_once('\n')
        .unwrap_or_else(|| panic!("curl {url}: {stdout:?}"));
    let code: u16 = code.trim().parse().unwrap_or_else(|_| panic!("curl {url}: {stdout:?}"));
    let v = serde_json::from_str(json).unwrap_or_else(|e| panic!("curl {method} {url}: {e}: {json:?}"));
    (code, v)
}

/// An AllocSvr's `allocsvr_front_rpcs_total{to}`: the RPCs its front ends' calls made the long
/// way, to itself in process (`self`) or over the network (`forwarded`).
async fn front_rpcs(c: &Cluster, id: u64, to: &str) -> u64 {
    let label = format!("to=\"{to}\"}}");
    c.alloc_metrics_page(id)
        .await
        .lines()
        .find(|l| l.starts_with("allocsvr_front_rpcs_total{") && l.contains(&label))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_front_reaches_ledgers_through_any_allocsvr() {
    let c = Cluster::start();
    c.wait_settled(START_WITHIN).await;
    let both = c.client().await;

    // The AllocSvr that owns the key's section as a counter, and the other one: every call below
    // goes to the other first.
    let owner = both
        .counter_get(KEY)
        .await
        .expect("counter get")
        .owner
        .expect("owner")
        .node_id
        .0;
    let other = if owner == 1 { 2 } else { 1 };
    let (owner_addr, other_addr) = (&c.alloc_addrs[&owner], &c.alloc_addrs[&other]);
    let via_other = client_of(other_addr);
    let via_owner = client_of(owner_addr);

    // gRPC through the client library.
    let info = via_other
        .ledger_create(KEY, Duration::from_secs(60))
        .await
        .expect("create");
    assert_eq!((info.key.as_str(), info.hold_ms, info.high), (KEY, 60_000, 0));
    let again = via_owner
        .ledger_create(KEY, Duration::from_secs(60))
        .await
        .expect("create again");
    assert_eq!(again.hold_ms, 60_000, "a repeated create answers the same");
    let e = via_other.ledger_create(KEY, Duration::from_secs(5)).await.unwrap_err();
    assert_eq!(e.failure_kind(), Some(FailureKind::Conflict), "{e}");

    let n1 = via_other.ledger_reserve(KEY, "till-1").await.expect("reserve");
    assert_eq!(n1, 1, "numbers start at 1");
    let r = via_other.ledger_confirm(KEY, n1, "INV-1").await.expect("confirm");
    assert!(!r.repeated);
    let r = via_owner.ledger_confirm(KEY, n1, "INV-1").await.expect("confirm again");
    assert!(r.repeated, "the same reference again answers the same");
    let e = via_other.ledger_confirm(KEY, n1, "INV-X").await.unwrap_err();
    assert_eq!(e.failure_kind(), Some(FailureKind::Conflict), "{e}");
    assert!(
        e.to_string().contains("INV-1"),
        "the refusal names the first reference: {e}"
    );

    // A reserve whose reply was lost, retried with the same request id on the other AllocSvr.
    let first = via_other
        .ledger_reserve_with_id(KEY, "till-2", "req-42")
        .await
        .expect("reserve");
    let retry = via_owner
        .ledger_reserve_with_id(KEY, "till-2", "req-42")
        .await
        .expect("retry");
    let n2 = first.entry.as_ref().unwrap().number;
    assert_eq!(n2, 2);
    assert_eq!(retry.entry.as_ref().unwrap().number, n2, "same request id, same number");
    assert!(retry.repeated && !first.repeated);
    via_other
        .ledger_release(KEY, n2, "customer left")
        .await
        .expect("release");

    // Raw gRPC: no `not_leader` ever reaches the caller of an AllocSvr.
    let mut raw = pb::ledger_service_client::LedgerServiceClient::connect(format!("http://{other_addr}"))
        .await
        .expect("connect");
    let show = raw
        .show(pb::LedgerShowRequest {
            key: KEY.as_bytes().to_vec(),
            from: 1,
            count: 10,
        })
        .await
        .expect("show")
        .into_inner();
    assert!(show.not_leader.is_none(), "{show:?}");
    let states: Vec<pb::LedgerState> = show.entries.iter().map(|e| e.state()).collect();
    assert_eq!(states, [pb::LedgerState::Confirmed, pb::LedgerState::Voided]);

    // HTTP/JSON on the other AllocSvr's front end. A counter call first, for the key its peer
    // owns: forwarded to the peer, it teaches the front end's client library the route table, so
    // that the ledger calls below could go to the peer too — they must not: any AllocSvr answers,
    // and the front end's own does without a hop.
    let counter = format!("http://{}/v1/counter/{KEY}/next", c.alloc_http[&other]);
    assert_eq!(curl("POST", &counter, None).await.0, 200);
    let forwarded = front_rpcs(&c, other, "forwarded").await;
    assert!(forwarded >= 1, "the counter call was forwarded to the owner");
    let http = format!("http://{}/v1/ledger/{KEY}", c.alloc_http[&other]);
    let (code, v) = curl("POST", &format!("{http}/reserve"), Some(r#"{"holder":"web"}"#)).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["number"], "3", "{v}");
    assert!(v["request_id"].is_string(), "{v}");
    let (code, v) = curl("POST", &format!("{http}/3/confirm"), Some(r#"{"reference":"INV-3"}"#)).await;
    assert_eq!((code, &v["entry"]["state"]), (200, &Value::from("confirmed")), "{v}");
    let (code, v) = curl("POST", &format!("{http}/3/confirm"), Some(r#"{"reference":"INV-3"}"#)).await;
    assert_eq!((code, &v["repeated"]), (200, &Value::from(true)), "{v}");
    let (code, v) = curl("POST", &format!("{http}/3/confirm"), Some(r#"{"reference":"other"}"#)).await;
    assert_eq!((code, &v["error"]["code"]), (409, &Value::from("conflict")), "{v}");
    let (code, v) = curl("POST", &format!("{http}/3/release"), None).await;
    assert_eq!(
        (code, &v["error"]["code"]),
        (412, &Value::from("precondition_failed")),
        "{v}"
    );
    let (code, v) = curl("POST", &format!("{http}/99/confirm"), Some(r#"{"reference":"x"}"#)).await;
    assert_eq!(code, 404, "a number never handed out: {v}");
    let (code, v) = curl("GET", &http, None).await;
    assert_eq!((code, &v["ledger"]["high"]), (200, &Value::from("3")), "{v}");
    let (code, v) = curl("GET", &format!("{http}/2"), None).await;
    assert_eq!((code, &v["entry"]["reason"]), (200, &Value::from("released")), "{v}");
    let (code, v) = curl("GET", &format!("{http}?from=1&count=5"), None).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["entries"].as_array().map(Vec::len), Some(3), "{v}");
    let (code, v) = curl("GET", &format!("{http}/gaps"), None).await;
    assert_eq!(code, 200, "{v}");
    assert_eq!(v["voided"][0]["number"], "2", "{v}");
    assert_eq!(v["voided"][0]["note"], "customer left", "{v}");
    let (code, v) = curl(
        "PUT",
        &format!("http://{}/v1/ledger/receipts", c.alloc_http[&other]),
        Some(r#"{"hold_ms":1000}"#),
    )
    .await;
    assert_eq!((code, &v["ledger"]["hold_ms"]), (200, &Value::from("1000")), "{v}");
    assert_eq!(
        front_rpcs(&c, other, "forwarded").await,
        forwarded,
        "the front end's ledger calls went to its own AllocSvr in process"
    );

    // seqctl, through the other AllocSvr only.
    let seqctl = Seqctl::new(["--alloc", other_addr.as_str()]);
    let v = seqctl
        .json(&["ledger", "reserve", KEY, "--holder", "cli"])
        .await
        .expect("seqctl reserve");
    assert_eq!(v["number"], 4, "{v}");
    seqctl
        .ok(&["ledger", "release", KEY, "4", "--note", "typo, retyped"])
        .await;
    let v = seqctl.json(&["ledger", "reserve", KEY]).await.expect("seqctl reserve");
    assert_eq!(v["number"], 5, "{v}");
    seqctl
        .ok(&["ledger", "void", KEY, "5", "--why", "printer jam", "--who", "alice"])
        .await;
    let v = seqctl.json(&["ledger", "show", KEY, "5"]).await.expect("seqctl show");
    assert_eq!(v["entries"][0]["reason"], "operator", "{v}");
    let out = seqctl.output(&["ledger", "confirm", KEY, "99", "X"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("never handed out"), "{}", text(&out));
    let out = seqctl.output(&["ledger", "show", ""]).await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));

    // An issue (a reserve with a reference): the next number confirmed in the same write, through
    // each front; the same reference again answers the same number, nothing new handed out.
    let v = seqctl
        .json(&["ledger", "issue", KEY, "INV-6"])
        .await
        .expect("seqctl issue");
    assert_eq!(
        (&v["number"], &v["entry"]["state"]),
        (&Value::from(6), &Value::from("confirmed")),
        "{v}"
    );
    let (code, v) = curl("POST", &format!("{http}/reserve"), Some(r#"{"reference":"INV-6"}"#)).await;
    assert_eq!(
        (code, &v["number"], &v["repeated"]),
        (200, &Value::from("6"), &Value::from(true)),
        "{v}"
    );
    let r = via_other.ledger_issue(KEY, "INV-7").await.expect("issue");
    assert_eq!(
        r.entry.as_ref().map(|e| (e.number, e.state())),
        Some((7, pb::LedgerState::Confirmed))
    );
    let r = via_owner.ledger_issue(KEY, "INV-7").await.expect("issue again");
    assert_eq!((r.entry.map(|e| e.number), r.repeated), (Some(7), true));

    // The auditor's report: every voided number, with reason, who, note and time.
    let csv = String::from_utf8(seqctl.ok(&["ledger", "gaps", KEY, "--format", "csv"]).await.stdout).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], "first,last,count,reason,by,note,time", "{csv}");
    assert_eq!(lines.len(), 4, "{csv}");
    assert!(lines[1].starts_with("2,2,1,released,till-2,customer left,20"), "{csv}");
    assert!(lines[2].starts_with("4,4,1,released,cli,\"typo, retyped\",20"), "{csv}");
    assert!(lines[3].starts_with("5,5,1,operator,alice,printer jam,20"), "{csv}");
    let json = String::from_utf8(seqctl.ok(&["ledger", "gaps", KEY, "--format", "json"]).await.stdout).unwrap();
    let j: Value = serde_json::from_str(&json).expect("gaps json");
    let firsts: Vec<u64> = j["voided"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["first"].as_u64().unwrap())
        .collect();
    assert_eq!(firsts, [2, 4, 5], "{j}");
    assert_eq!(j["ledger"]["high"], 7, "{j}");
    assert!(j["voided"][2]["time"].as_str().unwrap().ends_with('Z'), "{j}");

    // Every AllocSvr counts the ledger calls it forwarded, by call and code.
    let page = c.alloc_metrics_page(other).await;
    for line in [
        "call=\"reserve\",code=\"Ok\"}",
        "call=\"confirm\",code=\"AlreadyExists\"}",
    ] {
        let found = page
            .lines()
            .any(|l| l.starts_with("allocsvr_ledger_calls_total{") && l.contains(line));
        assert!(found, "no {line} on the metrics page of AllocSvr {other}:\n{page}");
    }

    // A hold that runs out: voided "expired" by the store leader, shown in the report.
    let n = via_other
        .ledger_reserve("receipts", "slow-till")
        .await
        .expect("reserve");
    let expired = poll("the held number to expire", Duration::from_secs(15), || async {
        let g = via_owner.ledger_gaps("receipts").await.ok()?;
        g.voided
            .into_iter()
            .find(|e| e.number == n && e.reason() == pb::VoidReason::Expired)
    })
    .await;
    assert_eq!(expired.holder, "slow-till");
    let e = via_other.ledger_confirm("receipts", n, "late").await.unwrap_err();
    assert_eq!(e.failure_kind(), Some(FailureKind::Refused), "{e}");
}

/// A client of AllocSvr 1 holding `role`'s certificate.
fn tls_client(c: &Cluster, role: seqsvr_auth::Role) -> Client {
    let cfg = ClientConfig {
        tls: c.tls(role),
        ..ClientConfig::new([c.alloc_addrs[&1].clone()])
    };
    Client::new(cfg).expect("client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_mutual_tls_ledger_calls_are_forwarded_and_only_an_admin_voids() {
    use seqsvr_auth::Role;
    let c = Cluster::start_tls();
    c.wait_settled(START_WITHIN).await;
    let client = tls_client(&c, Role::Client);
    client
        .ledger_create(KEY, Duration::from_secs(60))
        .await
        .expect("create over TLS");
    let n = client.ledger_reserve(KEY, "till").await.expect("reserve over TLS");
    assert_eq!(n, 1);
    let m = client.ledger_reserve(KEY, "till").await.expect("reserve over TLS");

    // A client's certificate may not void (the AllocSvr's role check), nor may another
    // AllocSvr's (this AllocSvr's own check: the store admits the allocsvr role for Void because
    // AllocSvrs forward an admin's call).
    for role in [Role::Client, Role::AllocSvr] {
        let e = tls_client(&c, role)
            .ledger_void(KEY, n, "mallory", "x")
            .await
            .unwrap_err();
        assert_eq!(e.failure_kind(), Some(FailureKind::Forbidden), "{role}: {e}");
    }
    let admin = tls_client(&c, Role::Admin);
    admin
        .ledger_void(KEY, n, "alice", "duplicate print")
        .await
        .expect("an admin voids");
    let seqctl = Seqctl::new(["--alloc", c.alloc_addrs[&2].as_str()]).with(c.tls_flags(Role::Admin));
    seqctl
        .ok(&["ledger", "void", KEY, &m.to_string(), "--why", "test", "--who", "bob"])
        .await;
    let g = client.ledger_gaps(KEY).await.expect("gaps");
    let by: Vec<&str> = g.voided.iter().map(|e| e.holder.as_str()).collect();
    assert_eq!(by, ["alice", "bob"], "{g:?}");
    assert!(g.voided.iter().all(|e| e.reason() == pb::VoidReason::Operator), "{g:?}");
}
