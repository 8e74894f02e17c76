//! The cached cluster map of a set: `PublishMap` keeps only a newer copy, a renewal gets the map
//! only when the AllocSvr's version is older, and set 0's own map is not touched by a copy.

mod common;

use common::*;
use seqsvr_proto::pb;
use seqsvr_proto::pb::admin_service_client::AdminServiceClient;
use std::time::Duration;
use tonic::transport::Channel;

const WAIT: Duration = Duration::from_secs(30);

fn admin(c: &Cluster) -> AdminServiceClient<Channel> {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", c.addrs[&1]))
        .unwrap()
        .connect_lazy();
    AdminServiceClient::new(ch)
}

/// A map of this test cluster's shape (see `set_args`) at `version`, naming `alloc` as set 1's.
fn map(version: u64, alloc: &str) -> pb::ClusterMap {
    pb::ClusterMap {
        version,
        sets: vec![pb::SetInfo {
            set_id: 1,
            stores: vec!["127.0.0.1:1".into()],
            allocsvrs: vec![alloc.into()],
        }],
        ranges: vec![pb::MapRange {
            section_begin: 0,
            section_end: SECTIONS,
            set_id: 1,
        }],
        moves: vec![],
        section_size: 100_000,
        uid_limit: 1_000_000,
        ids: None,
    }
}

async fn publish(a: &mut AdminServiceClient<Channel>, m: pb::ClusterMap) -> Result<pb::PublishMapReply, tonic::Status> {
    a.publish_map(pb::PublishMapRequest {
        // Some tests publish to a group of set 1: the set-id check has a test of its own below.
        map: Some(m),
        for_set: None,
    })
    .await
    .map(|r| r.into_inner())
}

async fn renew(c: &seqsvr_control::StoreClient, incarnation: u64, map_version: u64) -> pb::RenewReply {
    c.renew(pb::RenewRequest {
        secret: Vec::new(),
        incarnation,
        route_version: u64::MAX,
        map_version,
        id_slots_wanted: 0,
        version: String::new(),
    })
    .await
    .expect("renew")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_keeps_the_newest_published_map_and_hands_it_only_to_renewals_that_are_behind() {
    let set1 = Cluster::start_with(1, &["--set-id=1"]);
    set1.wait_leader(WAIT).await;
    let mut a = admin(&set1);
    let client = set1.client();
    let owner = FakeOwner::register(&client, 1).await;

    let none = renew(&client, owner.incarnation, 0).await;
    assert_eq!(
        (none.map_version, none.map.is_some()),
        (0, false),
        "nothing published yet"
    );

    let r = publish(&mut a, map(3, "10.0.0.1:7")).await.unwrap();
    assert_eq!((r.version, r.already), (3, false));
    let again = publish(&mut a, map(3, "10.0.0.9:7")).await.unwrap();
    assert_eq!(
        (again.version, again.already),
        (3, true),
        "same version: nothing changes"
    );
    let older = publish(&mut a, map(2, "10.0.0.9:7")).await.unwrap();
    assert_eq!((older.version, older.already), (3, true), "older: nothing changes");

    let behind = renew(&client, owner.incarnation, 1).await;
    assert_eq!(behind.map_version, 3);
    assert_eq!(
        behind.map,
        Some(map(3, "10.0.0.1:7")),
        "the first v3 is kept, as published"
    );
    let current = renew(&client, owner.incarnation, 3).await;
    assert_eq!(
        (current.map_version, current.map),
        (3, None),
        "up to date: no map in the reply"
    );

    let copy = a
        .get_cluster_map(pb::GetClusterMapRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(copy.map.map(|m| m.version), Some(3), "set 1 answers with its copy");

    let mut other = map(4, "10.0.0.1:7");
    other.uid_limit = 7;
    let refused = publish(&mut a, other).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    let empty = a
        .publish_map(pb::PublishMapRequest {
            map: None,
            for_set: None,
        })
        .await
        .unwrap_err();
    // Issue 25: a map published to this group as another set (a crossed address) is refused.
    let crossed = a
        .publish_map(pb::PublishMapRequest {
            map: Some(map(9, "127.0.0.1:1")),
            for_set: Some(4),
        })
        .await
        .unwrap_err();
    assert_eq!(crossed.code(), tonic::Code::FailedPrecondition, "{crossed:?}");
    assert!(
        crossed.message().contains("this is set 1") && crossed.message().contains("as set 4"),
        "{crossed:?}"
    );
    assert_eq!(empty.code(), tonic::Code::InvalidArgument, "{empty:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_0_hands_out_the_newer_of_its_own_map_and_the_copy_and_keeps_its_own() {
    let set0 = Cluster::start(1);
    set0.wait_leader(WAIT).await;
    let mut a = admin(&set0);
    let client = set0.client();
    let owner = FakeOwner::register(&client, 1).await;

    let own = renew(&client, owner.incarnation, 0).await;
    assert_eq!(own.map_version, 1, "set 0's own map, before any publish");
    assert_eq!(
        own.map.expect("behind: the map").sets[0].stores,
        vec![set0.addrs[&1].clone()]
    );

    publish(&mut a, map(5, "10.0.0.1:7")).await.unwrap();
    let copy = renew(&client, owner.incarnation, 1).await;
    assert_eq!(copy.map, Some(map(5, "10.0.0.1:7")));
    let authoritative = a
        .get_cluster_map(pb::GetClusterMapRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        authoritative.map.map(|m| m.version),
        Some(1),
        "a published copy never changes set 0's own map"
    );
}
