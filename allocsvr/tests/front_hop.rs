//! The direct forwarding hop (`allocsvr::hop`): two AllocSvrs in-process on a fake store, each
//! owning half of the sections under a cluster map, and `INCR`s of the second one's uids sent to
//! the first one's Redis front end.
//!
//! Once the first has learned where the second's hop port is, those calls must be answered over
//! the hop (`allocsvr_front_hop_total{answer="served"}`), every uid's values still rising; the
//! owner's side must answer a take it cannot serve from memory with "the long way", and close a
//! connection that does not speak the framing without harm to the others.
//!
//! The counters are read from a metrics recorder this test installs; they are process-wide, so
//! this file holds one test.

mod common;

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use allocsvr::Node;
use allocsvr::hop::wire::{self, Answer, Subject};
use common::resp::{Reply, call};
use common::{FakeStore, config, poll, test_params};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SECTIONS: u64 = 10;
const SECTION_SIZE: u64 = 100;
const READY: Duration = Duration::from_secs(10);

/// `allocsvr_front_hop_total{answer}` so far.
fn hop_answers(answer: &str) -> u64 {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    let handle = HANDLE.get_or_init(|| {
        PrometheusBuilder::new()
            .install_recorder()
            .expect("the test's metrics recorder")
    });
    let prefix = format!("allocsvr_front_hop_total{{answer=\"{answer}\"}} ");
    handle
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .map_or(0, |v| v.trim().parse::<f64>().expect("a counter's value") as u64)
}

/// Sends `frames` after the preface on a new connection to `hop` and reads `n` answers.
async fn ask(hop: std::net::SocketAddr, subjects: &[Subject<'_>]) -> Vec<Answer> {
    let mut conn = TcpStream::connect(hop).await.unwrap();
    let mut out = wire::PREFACE.to_vec();
    for (id, s) in subjects.iter().enumerate() {
        wire::put_request(&mut out, id as u64, *s);
    }
    conn.write_all(&out).await.unwrap();
    let mut answers = vec![None; subjects.len()];
    let mut buf = Vec::new();
    tokio::time::timeout(READY, async {
        while answers.iter().any(Option::is_none) {
            let mut chunk = [0u8; 4096];
            let n = conn.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the hop closed a connection that spoke its framing");
            buf.extend_from_slice(&chunk[..n]);
            while let Some((id, a, used)) = wire::take_answer(&buf).unwrap() {
                answers[id as usize] = Some(a);
                buf.drain(..used);
            }
        }
    })
    .await
    .expect("answers within the deadline");
    answers.into_iter().map(Option::unwrap).collect()
}

/// Sends `bytes` on a new connection to `hop`; true when the hop then closes it.
async fn closes_after(hop: std::net::SocketAddr, bytes: &[u8]) -> bool {
    let mut conn = TcpStream::connect(hop).await.unwrap();
    conn.write_all(bytes).await.unwrap();
    let mut chunk = [0u8; 64];
    matches!(
        tokio::time::timeout(Duration::from_secs(8), conn.read(&mut chunk)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takes_for_another_owner_go_over_the_hop_and_stay_in_order() {
    hop_answers("served");
    let store = FakeStore::start(test_params(SECTIONS, SECTION_SIZE, 1_000), false).await;
    let mut cfg = config(1, &store);
    cfg.front.resp = Some("127.0.0.1:0".parse().unwrap());
    let a = Node::start(cfg).await.expect("node starts");
    let b = common::start(2, &store).await;
    let addrs = [a.local_addr().to_string(), b.local_addr().to_string()];
    let (inc_a, inc_b) = (a.incarnation().0, b.incarnation().0);
    store.with(|s| {
        s.assign(0, SECTIONS / 2, inc_a, true);
        s.assign(SECTIONS / 2, SECTIONS, inc_b, true);
        s.map = Some(common::one_set_map(2, &addrs, SECTIONS, SECTION_SIZE));
    });
    let hop = b.hop_addr().expect("the hop runs by default");

    // The owner's side alone: a uid it owns is served from memory once its map is in, one it
    // does not own goes the long way, a bad key is refused.
    let theirs = (SECTIONS - 1) * SECTION_SIZE;
    let first = poll("the owner serves over the hop", READY, || async move {
        match ask(hop, &[Subject::Uid(theirs)]).await.remove(0) {
            Answer::Served { value, owner } => Some((value, owner)),
            _ => None,
        }
    })
    .await;
    assert_eq!((first.1.set_id, first.1.incarnation), (0, inc_b));
    let answers = ask(
        hop,
        &[Subject::Uid(0), Subject::Key(&[0xff, 0xfe]), Subject::Uid(theirs)],
    )
    .await;
    assert_eq!(answers[0], Answer::LongWay, "uid 0 is the other node's");
    assert!(
        matches!(&answers[1], Answer::BadInput(m) if m.contains("UTF-8")),
        "{:?}",
        answers[1]
    );
    assert!(matches!(answers[2], Answer::Served { value, .. } if value > first.0));

    // Through the other node's Redis front end: once it knows the hop port, its INCRs of the
    // owner's uids are answered over the hop.
    let mut conn = TcpStream::connect(a.front_addrs().resp.expect("resp front end"))
        .await
        .unwrap();
    let uids: Vec<u64> = (0..20).map(|i| (SECTIONS / 2) * SECTION_SIZE + i * 17).collect();
    let mut last: HashMap<u64, u64> = HashMap::new();
    let mut incr = async |conn: &mut TcpStream, uid: u64| {
        let Reply::Int(v) = call(conn, &["INCR", &format!("u:{uid}")]).await else {
            panic!("INCR u:{uid} did not answer a number")
        };
        let before = last.insert(uid, v).unwrap_or(0);
        assert!(v > before, "u:{uid} went from {before} to {v}");
    };
    let deadline = tokio::time::Instant::now() + READY;
    while hop_answers("served") < 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no INCR was answered over the hop"
        );
        incr(&mut conn, uids[0]).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = hop_answers("served");
    for round in 0..5 {
        for &uid in &uids {
            incr(&mut conn, uid).await;
        }
        // Strangers on the hop port: closed, and the calls go on.
        let junk: &[u8] = match round {
            0 => b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
            1 => &[wire::PREFACE.as_slice(), &u32::MAX.to_le_bytes(), &[0; 12]].concat(),
            _ => &[wire::PREFACE.as_slice(), &9u32.to_le_bytes(), &[0; 8], &[99]].concat(),
        };
        assert!(
            closes_after(hop, junk).await,
            "round {round}: junk left the connection open"
        );
    }
    let served = hop_answers("served") - before;
    eprintln!("{served} of 100 INCRs answered over the hop");
    assert!(served >= 90, "only {served} of 100 INCRs went over the hop");
    a.shutdown().await;
    b.shutdown().await;
}
