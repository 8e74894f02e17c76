//! `AdminService.Backup` on a 3-replica group: asked through a follower, the client follows the
//! hint to the leader; the file checks out and holds every bump acknowledged before it was asked
//! for (the ReadIndex makes it linearizable), at the log index it names.

mod common;

use std::time::Duration;

use common::{Cluster, FakeOwner, bump};
use seqsvr_control::{BackupClient, Seed, StoreTimeouts};
use seqsvr_proto::{NodeId, pb};

const WAIT: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_through_a_follower_holds_every_acknowledged_bump() {
    let c = Cluster::start(3);
    let leader = c.wait_leader(WAIT).await;
    let client = c.client();
    let owner = FakeOwner::register(&client, 1).await;
    let epoch = owner.epoch_of(&client, 4, WAIT).await;
    let acked = bump(&client, owner.incarnation, 4, epoch, 3_000).await;
    assert_eq!(acked.outcome, pb::BumpOutcome::Applied as i32);

    let follower = *c.addrs.keys().find(|id| **id != leader).unwrap();
    let seed = Seed {
        node_id: Some(NodeId(follower)),
        addr: c.addrs[&follower].clone(),
    };
    let timeouts = StoreTimeouts {
        attempt: Duration::from_secs(5),
        overall: Duration::from_secs(10),
    };
    // Only the follower is a seed: the leader's address comes from its hint.
    let file = BackupClient::new(vec![seed], timeouts)
        .unwrap()
        .backup()
        .await
        .expect("backup");
    let (header, set) = storesvr::backup::read(&file).expect("the file checks out");
    let leader_status = c.status_of(leader).await.expect("leader status");
    println!(
        "backup of {} bytes at log index {} (leader applied {})",
        file.len(),
        header.log_index,
        leader_status.applied_index
    );
    assert_eq!(set.sections[4].max_seq, 3_000, "the acknowledged bump is in the backup");
    assert_eq!(set.sections[4].epoch.0, epoch);
    assert!(header.log_index > 0 && header.log_index <= leader_status.applied_index);
    assert_eq!(header.sections, common::SECTIONS);
    assert!(set.allocsvrs.values().any(|r| r.incarnation.0 == owner.incarnation));
}
