//! A StoreSvr port lists over gRPC reflection exactly the services it serves, in both protocol
//! versions (v1, and v1alpha for older tools).

mod common;

use common::Cluster;
use std::time::Duration;

#[tokio::test]
async fn reflection_lists_exactly_the_services_of_the_port_in_v1_and_v1alpha() {
    let c = Cluster::start(1);
    c.wait_leader(Duration::from_secs(20)).await;
    let (v1, v1alpha) = seqsvr_harness::reflection::listed_services(&c.addrs[&1]).await.unwrap();
    let expected = [
        "grpc.health.v1.Health",
        "seqsvr.v1.AdminService",
        "seqsvr.v1.LedgerService",
        "seqsvr.v1.RaftService",
        "seqsvr.v1.StoreService",
    ];
    assert_eq!(v1, expected);
    assert_eq!(v1alpha, expected);
}
