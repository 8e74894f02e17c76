//! Acknowledged bumps survive crashes (P2, P3), fencing works (P4), on a real
//! 3-replica group of processes.

mod common;

use common::*;
use seqsvr_proto::pb;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_bump_survives_leader_kill_and_full_restart() {
    let mut c = Cluster::start(3);
    let leader = c.wait_leader(WAIT).await;
    let client = c.client();
    let owner = FakeOwner::register(&client, 1).await;
    let epoch = owner.epoch_of(&client, 3, WAIT).await;

    let acked = bump(&client, owner.incarnation, 3, epoch, 4_000).await;
    assert_eq!(acked.outcome, pb::BumpOutcome::Applied as i32);
    assert_eq!(acked.max_seq, 4_000);

    c.kill(leader);
    let new_leader = c.wait_leader(WAIT).await;
    assert_ne!(new_leader, leader);
    let after_kill = load(&client, 3).await;
    println!(
        "leader {leader} killed, new leader {new_leader}, max_seq {}",
        after_kill.max_seq
    );
    assert!(
        after_kill.max_seq >= 4_000,
        "acknowledged bump lost after leader kill: {after_kill:?}"
    );

    let acked2 = bump(&client, owner.incarnation, 3, epoch, 8_000).await;
    assert_eq!(acked2.max_seq, 8_000);

    for id in [1, 2, 3] {
        c.kill(id);
    }
    for id in [1, 2, 3] {
        c.spawn(id, id == 1); // --bootstrap again on a restart must be harmless
    }
    c.wait_leader(WAIT).await;
    let after_restart = load(&client, 3).await;
    assert!(
        after_restart.max_seq >= 8_000,
        "acknowledged bump lost after full restart: {after_restart:?}"
    );
    assert_eq!(after_restart.epoch, epoch, "a restart changes no epoch");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_seq_never_decreases_across_leader_changes_and_restarts() {
    let mut c = Cluster::start(3);
    c.wait_leader(WAIT).await;
    let client = c.client();
    let owner = FakeOwner::register(&client, 1).await;
    let epoch = owner.epoch_of(&client, 0, WAIT).await;
    let mut seen = 0;
    let mut acked = 0;
    for round in 0..4u64 {
        for k in 1..=5u64 {
            let want = (round * 5 + k) * 1_000;
            let r = bump(&client, owner.incarnation, 0, epoch, want).await;
            assert!(r.max_seq >= want);
            acked = r.max_seq;
        }
        let l = load(&client, 0).await.max_seq;
        assert!(
            l >= seen && l >= acked,
            "max_seq went from {seen} to {l} (acked {acked})"
        );
        seen = l;
        let leader = c.wait_leader(WAIT).await;
        c.restart(leader);
    }
    c.wait_leader(WAIT).await;
    assert!(load(&client, 0).await.max_seq >= acked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_epoch_bump_is_refused_and_lower_bump_changes_nothing() {
    let c = Cluster::start(3);
    c.wait_leader(WAIT).await;
    let client = c.client();
    let owner = FakeOwner::register(&client, 1).await;
    let epoch = owner.epoch_of(&client, 5, WAIT).await;
    assert_eq!(
        bump(&client, owner.incarnation, 5, epoch, 2_000).await.outcome,
        pb::BumpOutcome::Applied as i32
    );

    let lower = bump(&client, owner.incarnation, 5, epoch, 1_500).await;
    assert_eq!((lower.outcome, lower.max_seq), (pb::BumpOutcome::NoOp as i32, 2_000));
    let same = bump(&client, owner.incarnation, 5, epoch, 2_000).await;
    assert_eq!((same.outcome, same.max_seq), (pb::BumpOutcome::NoOp as i32, 2_000));

    let stale = bump(&client, owner.incarnation, 5, epoch - 1, 7_000).await;
    assert_eq!(stale.outcome, pb::BumpOutcome::StaleEpoch as i32);
    let state = load(&client, 5).await;
    assert_eq!(state.max_seq, 2_000, "a refused bump changed the state");

    // Release the section: the old epoch is now stale for its former owner too.
    client
        .release(pb::ReleaseRequest {
            secret: Vec::new(),
            incarnation: owner.incarnation,
            sections: vec![pb::ReleasedRange {
                begin: 5,
                end: 6,
                epoch,
                waited: true,
            }],
            leaving: false,
        })
        .await
        .unwrap();
    let after = bump(&client, owner.incarnation, 5, epoch, 8_000).await;
    assert_eq!(after.outcome, pb::BumpOutcome::StaleEpoch as i32);
    assert_eq!(load(&client, 5).await.max_seq, 2_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_bumps_share_raft_entries() {
    let c = Cluster::start(3);
    let leader = c.wait_leader(WAIT).await;
    let client = c.client();
    let owner = FakeOwner::register(&client, 1).await;
    let mut epochs = Vec::new();
    for s in 0..SECTIONS {
        epochs.push(owner.epoch_of(&client, s, WAIT).await);
    }
    let before = c.status_of(leader).await.unwrap().last_log_index;
    let n = 200u64;
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let client = client.clone();
            let (inc, section) = (owner.incarnation, i % SECTIONS);
            let epoch = epochs[section as usize];
            tokio::spawn(async move { bump(&client, inc, section, epoch, 1_000 + i).await })
        })
        .collect();
    for t in tasks {
        let r = t.await.unwrap();
        assert_ne!(r.outcome, pb::BumpOutcome::StaleEpoch as i32);
    }
    let entries = c.status_of(leader).await.unwrap().last_log_index - before;
    println!("{n} concurrent bumps used {entries} raft entries");
    assert!(
        entries * 4 <= n,
        "{n} concurrent bumps used {entries} entries: not batched"
    );
}

/// P3 on every replica: what a replica's local Status showed, it never shows less of after a
/// SIGKILL and restart (it replays at least as far before answering again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_replica_shows_a_lower_max_seq_after_restart() {
    let mut c = Cluster::start(3);
    c.wait_leader(WAIT).await;
    let client = c.client();
    let owner = FakeOwner::register(&client, 1).await;
    let epoch = owner.epoch_of(&client, 4, WAIT).await;
    let mut seen = [0u64; 4];
    for round in 1..=6u64 {
        bump(&client, owner.incarnation, 4, epoch, round * 1_000).await;
        let victim = 1 + round % 3;
        // Read every replica's view right after the bump (a follower may trail by a heartbeat).
        for id in 1..=3u64 {
            if let Some(s) = c.status_of(id).await {
                assert!(
                    s.max_seq_sum >= seen[id as usize],
                    "replica {id} went back: {} < {}",
                    s.max_seq_sum,
                    seen[id as usize]
                );
                seen[id as usize] = s.max_seq_sum;
            }
        }
        c.kill(victim);
        c.spawn(victim, false);
        let deadline = std::time::Instant::now() + WAIT;
        let s = loop {
            if let Some(s) = c.status_of(victim).await {
                break s;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "replica {victim} did not answer after restart"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(
            s.max_seq_sum >= seen[victim as usize],
            "replica {victim} showed {} before its restart and {} after",
            seen[victim as usize],
            s.max_seq_sum
        );
        seen[victim as usize] = s.max_seq_sum;
        c.wait_leader(WAIT).await;
    }
}
