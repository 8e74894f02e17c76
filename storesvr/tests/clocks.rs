//! A StoreSvr leader whose wall clock is wrong, among followers whose clocks are right (issue 47,
//! item 8), on real processes: the followers' Raft replies carry their clocks, and the leader
//! stamps id raises with the quorum's clock, so the set keeps raising marks to the holders' clocks;
//! a raise that would change no mark is answered without a Raft entry (item 7).
//!
//! Node 1 runs 30 s behind (`--test-clock-offset-ms`) with the shortest election timeout, so that
//! it is the leader; a pretend AllocSvr holds a slot and raises its mark as the raiser would, 2 s
//! ahead of the true clock. Before the comparison of clocks the leader capped that raise at its
//! own clock plus the allowance, 20 s in the past, and every id of the set stopped.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{Cluster, FakeOwner};
use seqsvr_proto::id_layout::IdLayout;
use seqsvr_proto::pb;

fn true_now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_30_s_behind_its_followers_raises_marks_by_the_quorums_clock_and_writes_no_repeat() {
    let mut c = Cluster::unstarted(3, &[]);
    c.extra_args = [
        "--test-clock-offset-ms=-30000",
        "--election-min-ms=110",
        "--election-max-ms=200",
        "--heartbeat-ms=50",
    ]
    .map(String::from)
    .to_vec();
    c.spawn(1, true);
    c.extra_args.clear();
    c.spawn(2, false);
    c.spawn(3, false);
    let leader = c.wait_leader(Duration::from_secs(20)).await;
    assert_eq!(leader, 1, "node 1 has the shortest election timeout");
    let client = c.client();
    let owner = FakeOwner::register(&client, 1).await;

    // The arbiter sets the ids up and grants the renewing owner a slot.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let (layout, grant) = loop {
        let r = client
            .renew(pb::RenewRequest {
                secret: Vec::new(),
                incarnation: owner.incarnation,
                route_version: 0,
                map_version: u64::MAX,
                id_slots_wanted: 1,
                version: String::new(),
            })
            .await
            .expect("renew");
        if let (Some(l), Some(g)) = (r.id_layout.as_ref(), r.slots.first()) {
            break (IdLayout::from_pb(l).unwrap(), *g);
        }
        assert!(std::time::Instant::now() < deadline, "no slot granted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The followers' clocks reach the leader with their heartbeat replies (every 50 ms).
    tokio::time::sleep(Duration::from_millis(500)).await;

    let raise = |mark| pb::RaiseMarksRequest {
        incarnation: owner.incarnation,
        items: vec![pb::SlotMark {
            slot: grant.slot,
            epoch: grant.epoch,
            mark,
        }],
        secret: Vec::new(),
    };
    let sent_ms = true_now_ms();
    let target = layout.tick_of(sent_ms + 2_000).unwrap();
    let reply = client.raise_marks(raise(target)).await.expect("raise");
    let r = reply.results[0];
    assert!(
        reply.leader_ms + 2_000 >= sent_ms && reply.leader_ms <= true_now_ms() + 2_000,
        "the leader stamped the raise with {} ms, {} ms off the true clock: its own, not the quorum's",
        reply.leader_ms,
        reply.leader_ms as i64 - sent_ms as i64
    );
    assert_eq!(
        (r.outcome, r.mark),
        (pb::RaiseOutcome::Applied as i32, target),
        "the raise to 2 s ahead of the true clock was not applied"
    );

    // The same raise again, twenty times: nothing to write, nothing written.
    let before = c.status_of(1).await.unwrap().last_log_index;
    for _ in 0..20 {
        let again = client.raise_marks(raise(target)).await.expect("raise again");
        assert_eq!(again.results[0].outcome, pb::RaiseOutcome::NoOp as i32);
    }
    let after = c.status_of(1).await.unwrap().last_log_index;
    assert!(
        after - before <= 2,
        "{} log entries for 20 raises that changed nothing",
        after - before
    );
}
