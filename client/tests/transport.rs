//! The plaintext data-plane connection (`H2Conn`) against a real tonic server on loopback: one
//! connection for many concurrent calls, and a new connection after the server went away (its
//! flow-control windows are tested in `seqsvr-rpc`, against a server that sends large replies).

mod common;

use std::time::Duration;

use common::{FakeAlloc, table};
use seqsvr_client::transport::{Conn, H2Conn};
use seqsvr_proto::pb;
use seqsvr_proto::pb::alloc_service_client::AllocServiceClient;
use seqsvr_rpc::classify::Delivery;

fn client(addr: &str) -> AllocServiceClient<Conn> {
    AllocServiceClient::new(Conn::H2(H2Conn::lazy(addr, Duration::from_secs(1)).unwrap()))
}

/// One `FetchNextSeq` of `uid`: its seq, or the status it failed with.
async fn fetch(c: &mut AllocServiceClient<Conn>, uid: u64) -> Result<u64, tonic::Status> {
    let request = pb::FetchNextSeqRequest {
        uid,
        ..Default::default()
    };
    Ok(c.fetch_next_seq(request).await?.into_inner().seq)
}

async fn owner() -> FakeAlloc {
    let a = FakeAlloc::start().await;
    a.set_routes(table(1, &[(0, 10, &a.addr)]));
    a
}

#[tokio::test]
async fn concurrent_calls_share_one_connection_and_each_gets_its_own_reply() {
    let a = owner().await;
    let c = client(&a.addr);
    let calls = (0..200u64).map(|i| {
        let mut c = c.clone();
        tokio::spawn(async move {
            let r = fetch(&mut c, i % 50).await;
            (i % 50, r.expect("fetch"))
        })
    });
    let mut seen = std::collections::HashMap::<u64, Vec<u64>>::new();
    for call in calls {
        let (uid, seq) = call.await.unwrap();
        seen.entry(uid).or_default().push(seq);
    }
    for (uid, mut seqs) in seen {
        seqs.sort();
        assert_eq!(seqs, vec![1, 2, 3, 4], "uid {uid}");
    }
    assert_eq!(a.accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_server_restarted_on_the_same_address_is_reached_on_a_new_connection() {
    let a = owner().await;
    let addr = a.addr.clone();
    let mut c = client(&addr);
    let first = fetch(&mut c, 1).await;
    assert_eq!(first.expect("before the restart"), 1);
    a.stop().await;

    // Down: the call fails as never sent (nothing listens), not as an unknown outcome.
    let down = fetch(&mut c, 1).await;
    let status = down.expect_err("nothing listens");
    let verdict = seqsvr_rpc::classify::classify(&status);
    assert_eq!(verdict.delivery, Delivery::NotTaken, "a refused connection: {status:?}");

    let b = FakeAlloc::start_on(&addr).await;
    b.set_routes(table(1, &[(0, 10, &b.addr)]));
    let again = fetch(&mut c, 1).await;
    assert_eq!(again.expect("after the restart"), 1);
    assert_eq!(b.accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
}
