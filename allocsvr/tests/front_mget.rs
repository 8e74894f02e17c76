//! How many RPCs one Redis `MGET` costs: two AllocSvrs in-process on a fake store, each owning
//! half of the sections, and an `MGET` of 1,000 names (uids and counter keys of both halves) sent
//! to the first one's Redis front end. The names it does not own must reach the other AllocSvr as
//! one batched read, not one forwarded read each; the names it owns are answered from memory when
//! its cluster map lets it, otherwise in one read of itself.
//!
//! The RPCs are counted by `allocsvr_front_rpcs_total{to}`, read from a metrics recorder this
//! test installs; the counter is process-wide, so this file holds one test.

mod common;

use std::sync::OnceLock;
use std::time::Duration;

use allocsvr::Node;
use common::resp::{Reply, call};
use common::{FakeStore, config, poll, test_params};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use seqsvr_proto::pb;
use tokio::net::TcpStream;

const SECTIONS: u64 = 10;
const SECTION_SIZE: u64 = 100;
const READY: Duration = Duration::from_secs(10);
const NAMES: usize = 1_000;

/// The front ends' RPCs so far: (to this node, forwarded to another).
fn front_rpcs() -> (u64, u64) {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    let handle = HANDLE.get_or_init(|| {
        PrometheusBuilder::new()
            .install_recorder()
            .expect("the test's metrics recorder")
    });
    let text = handle.render();
    let read = |to: &str| {
        let prefix = format!("allocsvr_front_rpcs_total{{to=\"{to}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .map_or(0, |v| v.trim().parse::<f64>().expect("a counter's value") as u64)
    };
    (read("self"), read("forwarded"))
}

/// A node of the fake store's set with the Redis front end on 127.0.0.1:0.
async fn start_with_resp(node_id: u64, store: &FakeStore) -> Node {
    let mut cfg = config(node_id, store);
    cfg.front.resp = Some("127.0.0.1:0".parse().unwrap());
    Node::start(cfg).await.expect("node starts")
}

/// Waits until `node` answers reads of `uid` (its section held and past any wait).
async fn wait_serving(node: &Node, uid: u64) {
    let c = common::client(node).await;
    poll(&format!("uid {uid} readable"), READY, || {
        let mut c = c.clone();
        async move {
            let r = c
                .get_cur_seq(pb::GetCurSeqRequest { uid, route_version: 0 })
                .await
                .ok()?
                .into_inner();
            (r.outcome == pb::Outcome::Ok as i32).then_some(())
        }
    })
    .await;
}

/// 500 uids spread over every section, and 500 counter keys (placed by their hash).
fn names() -> Vec<String> {
    let uids = (0..NAMES as u64 / 2).map(|i| format!("u:{}", 2 * i));
    let keys = (0..NAMES / 2).map(|i| format!("mget-key-{i}"));
    uids.zip(keys).flat_map(|(u, k)| [u, k]).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_mget_of_1000_names_is_one_batched_read_per_owner() {
    // The recorder first: the nodes register their counters with it as they start.
    front_rpcs();
    let store = FakeStore::start(test_params(SECTIONS, SECTION_SIZE, 1_000), false).await;
    let a = start_with_resp(1, &store).await;
    let b = common::start(2, &store).await;
    let (inc_a, inc_b) = (a.incarnation().0, b.incarnation().0);
    store.with(|s| {
        s.assign(0, SECTIONS / 2, inc_a, true);
        s.assign(SECTIONS / 2, SECTIONS, inc_b, true);
    });
    wait_serving(&a, 0).await;
    wait_serving(&b, (SECTIONS - 1) * SECTION_SIZE).await;

    let mut conn = TcpStream::connect(a.front_addrs().resp.expect("resp front end"))
        .await
        .unwrap();
    let names = names();
    // Every seventh name gets a value (through whichever node owns it); the others never had one.
    let mut want = vec![Reply::Nil; NAMES];
    for (i, name) in names.iter().enumerate().step_by(7) {
        assert_eq!(call(&mut conn, &["INCR", name]).await, Reply::Int(1), "INCR {name}");
        want[i] = Reply::Bulk("1".into());
    }
    let mget: Vec<&str> = std::iter::once("MGET")
        .chain(names.iter().map(String::as_str))
        .collect();

    // No cluster map: the front end answers nothing from memory, every name goes through the
    // client library, to this node in process or forwarded to the other.
    let before = front_rpcs();
    let got = call(&mut conn, &mget).await;
    let after = front_rpcs();
    assert_eq!(got, Reply::Array(want.clone()), "MGET answers each name's last value");
    let (to_self, forwarded) = (after.0 - before.0, after.1 - before.1);
    eprintln!("MGET of {NAMES} names without a map: {to_self} RPCs to self, {forwarded} forwarded");
    // One read per owner; one more allowed for a retry after a renewal that lands late on a
    // loaded machine.
    assert!(
        (1..=2).contains(&forwarded),
        "{forwarded} forwarded RPCs for one MGET: one batched read to the other owner expected"
    );
    assert!(
        (1..=2).contains(&to_self),
        "{to_self} RPCs to this node for one MGET: one batched read expected"
    );

    // With a map that lets this node's set answer, the names it owns are read from memory and
    // only the other owner's are sent, in one RPC.
    let addrs = [a.local_addr().to_string(), b.local_addr().to_string()];
    store.with(|s| s.map = Some(common::one_set_map(2, &addrs, SECTIONS, SECTION_SIZE)));
    // A read the long way brings the map to the front end's client (a reply carries it); from
    // then on a GET of an owned name costs no RPC.
    let deadline = tokio::time::Instant::now() + READY;
    loop {
        let before = front_rpcs();
        assert_eq!(call(&mut conn, &["GET", "u:0"]).await, Reply::Bulk("1".into()));
        if front_rpcs() == before {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the front end never learned the map"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = front_rpcs();
    let got = call(&mut conn, &mget).await;
    let after = front_rpcs();
    assert_eq!(got, Reply::Array(want), "MGET answers each name's last value");
    let (to_self, forwarded) = (after.0 - before.0, after.1 - before.1);
    eprintln!("MGET of {NAMES} names with a map: {to_self} RPCs to self, {forwarded} forwarded");
    assert_eq!(to_self, 0, "this node's own names are answered from memory");
    assert!(
        (1..=2).contains(&forwarded),
        "{forwarded} forwarded RPCs for one MGET: one batched read to the other owner expected"
    );
    a.shutdown().await;
    b.shutdown().await;
}
