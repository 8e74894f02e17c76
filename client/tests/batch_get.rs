//! `Client::batch_get` against fake AllocService servers on loopback: one `BatchGet` per owner,
//! answers in request order, NOT_OWNER and NOT_READY items asked again, and a read that gets no
//! answer failing, never "unknown".

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{FakeAlloc, table};
use seqsvr_client::{Client, ClientConfig, FailureKind, Subject};
use seqsvr_proto::Uid;

fn config(seeds: &[&str]) -> ClientConfig {
    ClientConfig {
        deadline: Duration::from_secs(3),
        attempt_timeout: Duration::from_millis(500),
        backoff_base: Duration::from_millis(5),
        backoff_max: Duration::from_millis(50),
        ..ClientConfig::new(seeds.iter().copied())
    }
}

/// Where the fakes' table (uid limit 1,000) places `key`.
fn place(key: &str) -> u64 {
    seqsvr_proto::keys::position(key, 1_000).0
}

/// The last values of `subjects` (each must be answered).
async fn values(client: &Client, subjects: &[Subject<'_>]) -> Vec<u64> {
    client
        .batch_get(subjects)
        .await
        .expect("the call is sent")
        .into_iter()
        .map(|r| r.expect("every item answered").value)
        .collect()
}

#[tokio::test]
async fn a_read_of_1000_uids_and_keys_is_one_batch_get_per_owner_in_request_order() {
    let a = FakeAlloc::start().await;
    let b = FakeAlloc::start().await;
    let split = table(1, &[(0, 5, &a.addr), (5, 10, &b.addr)]);
    a.set_routes(split.clone());
    b.set_routes(split);
    let client = Client::connect(config(&[&a.addr])).await.unwrap();
    // Some uids of both owners have values; some keys too.
    for uid in [3u64, 3, 640, 999] {
        client.fetch_next_seq(Uid(uid)).await.unwrap();
    }
    let keys: Vec<String> = (0..500).map(|i| format!("key-{i}")).collect();
    for (i, key) in keys.iter().enumerate().step_by(5) {
        let owner = if place(key) < 500 { &a } else { &b };
        owner.set_key(key, i as u64 + 7);
    }
    let gets_before = (
        a.state.get_rpcs.load(Ordering::SeqCst),
        b.state.get_rpcs.load(Ordering::SeqCst),
    );
    let mut subjects = Vec::new();
    let mut want = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let uid = (i as u64 * 2 + 1) % 1_000;
        subjects.push(Subject::Uid(Uid(uid)));
        want.push(match uid {
            3 => 2,
            640 | 999 => 1,
            _ => 0,
        });
        subjects.push(Subject::Key(key));
        want.push(if i % 5 == 0 { i as u64 + 7 } else { 0 });
    }
    // 3 and 999 are odd: in the list above; 640 is not, so ask for it too.
    subjects[0] = Subject::Uid(Uid(640));
    want[0] = 1;
    let got = client.batch_get(&subjects).await.unwrap();
    assert_eq!(got.len(), 1_000);
    let got_values: Vec<u64> = got.iter().map(|r| r.as_ref().unwrap().value).collect();
    assert_eq!(got_values, want, "each item's last value, in request order");
    let owner_of_640 = got[0].as_ref().unwrap().owner.expect("owner named");
    assert_eq!(owner_of_640.section.0, 6);
    let (reads_a, reads_b) = (a.reads(), b.reads());
    assert_eq!((reads_a.len(), reads_b.len()), (1, 1), "one BatchGet per owner");
    let items = |r: &[(Vec<u64>, Vec<String>)]| r[0].0.len() + r[0].1.len();
    assert_eq!(items(&reads_a) + items(&reads_b), 1_000);
    assert!(reads_a[0].0.iter().all(|&u| u < 500), "A gets only its uids");
    assert!(reads_a[0].1.iter().all(|k| place(k) < 500), "A gets only its keys");
    assert!(reads_b[0].0.iter().all(|&u| u >= 500), "B gets only its uids");
    let gets_after = (
        a.state.get_rpcs.load(Ordering::SeqCst),
        b.state.get_rpcs.load(Ordering::SeqCst),
    );
    assert_eq!(gets_after, gets_before, "no single read");
}

#[tokio::test]
async fn not_owner_items_are_read_again_at_their_new_owner() {
    let a = FakeAlloc::start().await;
    let b = FakeAlloc::start().await;
    a.set_routes(table(1, &[(0, 10, &a.addr)]));
    let client = Client::connect(config(&[&a.addr])).await.unwrap();
    client.fetch_next_seq(Uid(1)).await.unwrap();
    // Sections 5..10 move to B (uid 600 has had two seqs there); the client does not know yet.
    let moved = table(2, &[(0, 5, &a.addr), (5, 10, &b.addr)]);
    a.set_routes(moved.clone());
    b.set_routes(moved);
    b.set_seq(600, 2);
    let key = (0..).map(|i| format!("moved-{i}")).find(|k| place(k) >= 500).unwrap();
    b.set_key(&key, 41);

    let subjects = [
        Subject::Uid(Uid(1)),
        Subject::Uid(Uid(600)),
        Subject::Key(&key),
        Subject::Uid(Uid(2)),
        Subject::Uid(Uid(700)),
    ];
    assert_eq!(values(&client, &subjects).await, [1, 2, 41, 0, 0]);
    assert_eq!(
        client.routes().table(0).unwrap().version(),
        2,
        "the newer table learned"
    );
    assert_eq!(
        a.reads().len(),
        1,
        "A read once: its items served, the moved ones NOT_OWNER"
    );
    assert_eq!(
        b.reads(),
        vec![(vec![600, 700], vec![key.clone()])],
        "only the NOT_OWNER items are sent again, to B, in one call"
    );
}

#[tokio::test]
async fn not_ready_items_are_read_again_and_a_read_without_an_answer_fails_as_a_failure() {
    let a = FakeAlloc::start().await;
    a.set_routes(table(1, &[(0, 10, &a.addr)]));
    let cfg = ClientConfig {
        deadline: Duration::from_millis(600),
        attempt_timeout: Duration::from_millis(200),
        ..config(&[&a.addr])
    };
    let client = Client::connect(cfg).await.unwrap();
    client.fetch_next_seq(Uid(8)).await.unwrap();
    a.state.not_ready_left.store(1, Ordering::SeqCst);
    let subjects = [Subject::Uid(Uid(8)), Subject::Uid(Uid(9))];
    assert_eq!(values(&client, &subjects).await, [1, 0]);
    assert_eq!(
        a.reads(),
        vec![(vec![8, 9], vec![]), (vec![8], vec![])],
        "only the NOT_READY item is asked again"
    );

    // A read whose attempts all timed out took nothing: it failed, it is not "unknown".
    a.state.hang.store(true, Ordering::SeqCst);
    let got = client.batch_get(&subjects).await.unwrap();
    for r in got {
        let err = r.unwrap_err();
        assert_eq!(err.failure_kind(), Some(FailureKind::Unavailable), "{err}");
    }
}

#[tokio::test]
async fn a_bad_uid_or_key_refuses_the_whole_read_before_sending() {
    let a = FakeAlloc::start().await;
    a.set_routes(table(1, &[(0, 10, &a.addr)]));
    let client = Client::connect(config(&[&a.addr])).await.unwrap();
    let too_long = "k".repeat(257);
    let cases: [&[Subject<'_>]; 3] = [
        &[Subject::Uid(Uid(1)), Subject::Uid(Uid(1_000))],
        &[Subject::Key("ok"), Subject::Key("")],
        &[Subject::Key(&too_long)],
    ];
    for subjects in cases {
        let err = client.batch_get(subjects).await.unwrap_err();
        assert_eq!(err.failure_kind(), Some(FailureKind::InvalidArgument), "{err}");
    }
    assert!(a.reads().is_empty(), "nothing sent");
    assert!(client.batch_get(&[]).await.unwrap().is_empty(), "no items, no call");
    assert!(a.reads().is_empty());
}
