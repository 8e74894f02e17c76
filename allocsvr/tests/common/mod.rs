//! Helpers shared by the AllocSvr black-box tests: a fake store, a node started in-process on
//! 127.0.0.1:0, a data-plane client, and polling with a deadline.

#![allow(dead_code)]

pub mod fake_store;
pub mod resp;

use std::future::Future;
use std::time::Duration;

use allocsvr::{Node, NodeConfig};
use seqsvr_control::Seed;
use seqsvr_proto::NodeId;
use seqsvr_proto::pb;
use seqsvr_proto::pb::alloc_service_client::AllocServiceClient;
use tonic::transport::Channel;

pub use fake_store::{FakeStore, test_params};

pub fn config(node_id: u64, store: &FakeStore) -> NodeConfig {
    let mut cfg = NodeConfig::new(
        NodeId(node_id),
        "127.0.0.1:0".parse().unwrap(),
        vec![Seed {
            node_id: Some(NodeId(1)),
            addr: store.addr.to_string(),
        }],
    );
    cfg.start_timeout = Duration::from_secs(5);
    cfg
}

pub async fn start(node_id: u64, store: &FakeStore) -> Node {
    Node::start(config(node_id, store)).await.expect("node starts")
}

pub async fn client(node: &Node) -> AllocServiceClient<Channel> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", node.local_addr()))
        .unwrap()
        .timeout(Duration::from_secs(5));
    AllocServiceClient::new(endpoint.connect().await.expect("connect to allocsvr"))
}

/// Polls `f` until it returns `Some`, or panics after `within`.
pub async fn poll<T, F, Fut>(what: &str, within: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub async fn fetch(c: &mut AllocServiceClient<Channel>, uid: u64) -> pb::FetchNextSeqReply {
    c.fetch_next_seq(pb::FetchNextSeqRequest { uid, route_version: 0 })
        .await
        .expect("fetch rpc")
        .into_inner()
}

/// Fetches `uid` until it is served (polling through NOT_READY / NOT_OWNER).
pub async fn fetch_ok(c: &mut AllocServiceClient<Channel>, uid: u64, within: Duration) -> u64 {
    poll(&format!("uid {uid} served"), within, || {
        let mut c = c.clone();
        async move {
            let r = fetch(&mut c, uid).await;
            (r.outcome == pb::Outcome::Ok as i32).then_some(r.seq)
        }
    })
    .await
}

/// A cluster map of the fake store's one set (set 0) over `sections` sections of `section_size`,
/// served by `allocsvrs`.
pub fn one_set_map(version: u64, allocsvrs: &[String], sections: u64, section_size: u64) -> pb::ClusterMap {
    pb::ClusterMap {
        version,
        sets: vec![pb::SetInfo {
            set_id: 0,
            stores: vec![],
            allocsvrs: allocsvrs.to_vec(),
        }],
        ranges: vec![pb::MapRange {
            section_begin: 0,
            section_end: sections,
            set_id: 0,
        }],
        section_size,
        uid_limit: sections * section_size,
        ..Default::default()
    }
}
