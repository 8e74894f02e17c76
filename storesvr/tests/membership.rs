//! Membership: a replica added under a new id catches up by snapshot, a
//! restarted replica rejoins, node ids are never reused.

mod common;

use common::*;
use seqsvr_proto::pb;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(30);

async fn admin(c: &Cluster, leader: u64) -> pb::admin_service_client::AdminServiceClient<tonic::transport::Channel> {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", c.addrs[&leader]))
        .unwrap()
        .connect_lazy();
    pb::admin_service_client::AdminServiceClient::new(ch)
}

/// Enough bumps (each its own entry) that the log is snapshotted and purged (`--snapshot-logs=20`).
async fn churn(c: &Cluster, rounds: u64) -> u64 {
    let client = c.client();
    let owner = FakeOwner::register(&client, 1).await;
    let epoch = owner.epoch_of(&client, 2, WAIT).await;
    let mut last = 0;
    for i in 1..=rounds {
        last = bump(&client, owner.incarnation, 2, epoch, i * 100).await.max_seq;
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn added_replica_catches_up_through_a_snapshot_and_ids_are_never_reused() {
    let mut c = Cluster::start(3);
    let leader = c.wait_leader(WAIT).await;
    let top = churn(&c, 60).await;
    let leader_status = c.status_of(leader).await.unwrap();

    let addr = c.spawn_new(4);
    let reply = admin(&c, leader)
        .await
        .add_replica(pb::AddReplicaRequest { node_id: 4, addr })
        .await
        .unwrap()
        .into_inner();
    assert!(reply.not_leader.is_none());
    assert_eq!(reply.voters, vec![1, 2, 3, 4]);

    let s4 = c.wait_applied(4, leader_status.applied_index, WAIT).await;
    assert_eq!(
        s4.max_seq_high, top,
        "the new replica's state differs from the leader's"
    );
    let log = std::fs::read_to_string(c.log_path(4)).unwrap();
    assert!(
        log.contains("installed snapshot"),
        "replica 4 did not catch up by snapshot:\n{log}"
    );

    // Remove it again; its id can never come back.
    let leader = c.wait_leader(WAIT).await;
    let removed = admin(&c, leader)
        .await
        .remove_replica(pb::RemoveReplicaRequest { node_id: 4 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(removed.voters, vec![1, 2, 3]);
    let again = admin(&c, leader)
        .await
        .add_replica(pb::AddReplicaRequest {
            node_id: 4,
            addr: c.addrs[&4].clone(),
        })
        .await;
    let err = again.expect_err("a reused node id was accepted");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("never reused"), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_replica_rejoins_and_catches_up() {
    let mut c = Cluster::start(3);
    let leader = c.wait_leader(WAIT).await;
    let follower = [1, 2, 3].into_iter().find(|i| *i != leader).unwrap();
    c.kill(follower);
    let top = churn(&c, 40).await;
    let applied = c.status_of(c.wait_leader(WAIT).await).await.unwrap().applied_index;
    c.spawn(follower, false);
    let s = c.wait_applied(follower, applied, WAIT).await;
    assert_eq!(s.max_seq_high, top);
    assert!(s.leader_id != 0, "the rejoined replica does not know the leader");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_dir_of_another_node_is_refused() {
    let c = Cluster::start(1);
    c.wait_leader(WAIT).await;
    let out = seqsvr_harness::output_within(
        std::process::Command::new(env!("CARGO_BIN_EXE_storesvr"))
            .arg("--node-id=9")
            .arg("--set-id=0")
            .arg(format!("--listen={}", free_addr()))
            .arg(format!("--data-dir={}", c.data_dir(1).display())),
        WAIT,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("belongs to node 1"), "{err}");
}
