//! Issue 25, item 3: two Raft groups whose peer addresses cross stay apart. Group B reaches group
//! A's replica 3 as its own node 3 (a mis-typed `--dial`/address, or an old copy of a group
//! restarted onto the addresses of the live one; a crossed `--peers` at bootstrap is refused
//! already by the bootstrap's probe). Every Raft message carries its set, group and
//! target node, and A's replica 3 refuses B's before openraft sees them: A's ceilings never drop
//! on any replica and A keeps one leader of its own. The negative control admits B's messages.
//!
//! B is set 0 like A, so only the group id tells the two apart (the hardest case: a crossed
//! entry between different sets is refused on the set id already).

mod common;

use common::*;
use seqsvr_proto::pb;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(20);
/// How long B is given to reach A's replica 3.
const WATCH: Duration = Duration::from_secs(8);

/// A's lowest `max_seq_high` over its replicas while B runs crossed into it, the leaders A's
/// replicas named, and whether A's replica 3 still follows one of A's own at the end (a fresh
/// Raft state, not one that stopped on a fatal error).
async fn crossed(extra: &[&str]) -> (u64, Vec<u64>, bool) {
    let a = Cluster::start_with(3, extra);
    a.wait_leader(WAIT).await;
    let client = a.client();
    let owner = FakeOwner::register(&client, 1).await;
    let epoch = owner.epoch_of(&client, 3, WAIT).await;
    let acked = bump(&client, owner.incarnation, 3, epoch, 4_000).await;
    assert_eq!(acked.outcome, pb::BumpOutcome::Applied as i32);
    for id in 1..=3 {
        let index = a.status_of(a.wait_leader(WAIT).await).await.unwrap().applied_index;
        a.wait_applied(id, index, WAIT).await;
    }

    // B: a second set-0 group (an older copy) whose terms run ahead of A's.
    let mut b = Cluster::start_with(3, extra);
    for _ in 0..3 {
        let leader = b.wait_leader(WAIT).await;
        b.restart(leader);
    }
    b.wait_leader(WAIT).await;
    // Then its node 3 entry is crossed: B dials A's replica 3 for it.
    b.kill(3);
    b.extra_args.push(format!("--dial=3={}", a.addrs[&3]));
    b.restart(1);
    b.restart(2);
    let (mut lowest, mut leaders) = (u64::MAX, Vec::new());
    let started = Instant::now();
    while started.elapsed() < WATCH {
        for id in 1..=3 {
            if let Some(s) = a.status_of(id).await {
                lowest = lowest.min(s.max_seq_high);
                leaders.push(s.leader_id);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A writes on; its replica 3 must apply that write as A's own follower.
    let after = bump(&client, owner.incarnation, 3, epoch, 5_000).await;
    assert_eq!(
        after.outcome,
        pb::BumpOutcome::Applied as i32,
        "A itself lost its quorum"
    );
    let a3_healthy = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if a.status_of(3).await.is_some_and(|s| s.max_seq_high == 5_000) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .is_ok();
    drop(owner);
    (lowest, leaders, a3_healthy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_with_a_crossed_peer_address_never_touches_the_other() {
    let (lowest, leaders, a3_healthy) = crossed(&[]).await;
    assert_eq!(
        lowest, 4_000,
        "a replica of A showed a lower ceiling while B was crossed into it"
    );
    assert!(leaders.iter().all(|l| (1..=3).contains(l) || *l == 0), "{leaders:?}");
    assert!(a3_healthy, "A's replica 3 stopped following A");
}

/// Negative control: with the check off, B's leader reaches A's replica 3 with a higher term and
/// a log that conflicts with A's committed one. Seen here: openraft on that replica stops on a
/// fatal error (it refuses to cut committed entries), so A has lost a replica to another group;
/// a lower ceiling on it counts too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_control_without_the_group_check_a_crossed_group_breaks_a_replica() {
    let (lowest, _, a3_healthy) = crossed(&["--unsafe-skip-group-check"]).await;
    assert!(
        lowest < 4_000 || !a3_healthy,
        "the crossed group never got in: lowest max_seq_high {lowest}, replica 3 healthy"
    );
}
