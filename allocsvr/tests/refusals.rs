//! The two RESOURCE_EXHAUSTED answers end to end: a section whose sequence space is used up is
//! refused with the `exhausted` mark, and the client library gives up on it at once instead of
//! retrying until its deadline (an overloaded server's refusal, unmarked or marked `overloaded`,
//! is retried: client/tests/data_plane.rs and allocsvr/tests/flood.rs).

mod common;

use std::time::{Duration, Instant};

use common::{FakeStore, client, fetch_ok, poll, start, test_params};
use seqsvr_client::{Client, ClientConfig, FailureKind};
use seqsvr_proto::Uid;
use seqsvr_proto::pb;
use seqsvr_proto::refusal::{self, Refusal};

const READY: Duration = Duration::from_secs(5);

#[tokio::test]
async fn a_used_up_section_is_refused_as_exhausted_and_the_client_gives_up_at_once() {
    // Four sections of ten uids, step 5; section 0's ceiling cannot take another step.
    let store = FakeStore::start(test_params(4, 10, 5), true).await;
    store.with(|s| s.sections[0].max_seq = u64::MAX - 2);
    let node = start(1, &store).await;
    let mut c = client(&node).await;
    fetch_ok(&mut c, 15, READY).await;
    let refused = poll("uid 3 refused", READY, || {
        let mut c = c.clone();
        async move {
            let req = pb::FetchNextSeqRequest {
                uid: 3,
                route_version: 0,
            };
            c.fetch_next_seq(req).await.err()
        }
    })
    .await;
    assert_eq!(refusal::of(&refused), Some(Refusal::Exhausted), "{refused:?}");
    let req = pb::BatchFetchNextSeqRequest {
        uids: vec![15, 3],
        route_version: 0,
    };
    let reply = c
        .batch_fetch_next_seq(req)
        .await
        .expect("a batch is answered per uid")
        .into_inner();
    assert_eq!(
        reply.outcomes,
        vec![pb::Outcome::Ok as i32, pb::Outcome::Exhausted as i32],
        "{reply:?}"
    );
    assert!(reply.seqs[0] > 0 && reply.seqs[1] == 0, "{reply:?}");

    let cfg = ClientConfig {
        deadline: Duration::from_secs(5),
        ..ClientConfig::new([node.local_addr().to_string()])
    };
    let client = Client::connect(cfg).await.expect("connect");
    let started = Instant::now();
    let err = client.fetch_next_seq(Uid(3)).await.unwrap_err();
    assert_eq!(err.failure_kind(), Some(FailureKind::Exhausted), "{err}");
    let err = client.batch_fetch(&[Uid(3)]).await.unwrap_err();
    assert_eq!(err.failure_kind(), Some(FailureKind::Exhausted), "{err}");
    // Issue 25, item 8: with another uid beside it, that uid is served and says so; the
    // exhausted one fails on its own. (The whole call used to be refused RESOURCE_EXHAUSTED after
    // uid 15 had consumed a number, and read as "did not happen" for both.)
    let each = client.batch_fetch_each(&[Uid(15), Uid(3)]).await.expect("sent");
    assert!(each[0].is_ok(), "{each:?}");
    assert_eq!(
        each[1].as_ref().unwrap_err().failure_kind(),
        Some(FailureKind::Exhausted)
    );
    let err = client.batch_fetch(&[Uid(15), Uid(3)]).await.unwrap_err();
    assert!(err.is_unknown(), "part of the call was served: {err}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "given up at once: {:?}",
        started.elapsed()
    );
    node.shutdown().await;
}
