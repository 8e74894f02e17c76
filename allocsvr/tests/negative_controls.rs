//! Each test-only `--unsafe-*` switch breaks exactly the rule it names, and the safe default
//! keeps it: the same scenario is run both ways, so these tests also show that the checks in
//! them can fail.

mod common;

use std::time::{Duration, Instant};

use allocsvr::{Node, UnsafeRules};
use common::{FakeStore, client, config, fetch, fetch_ok, poll, test_params};
use seqsvr_proto::pb;

const READY: Duration = Duration::from_secs(5);
const GAIN_WAIT: Duration = Duration::from_millis(656);

async fn start(store: &FakeStore, switches: UnsafeRules) -> Node {
    let mut cfg = config(1, store);
    cfg.unsafe_rules = switches;
    Node::start(cfg).await.expect("node starts")
}

#[tokio::test]
async fn regain_reloads_memory_unless_keep_memory_control_is_on() {
    for keep_memory in [false, true] {
        let store = FakeStore::start(test_params(4, 10, 5), true).await;
        let node = start(
            &store,
            UnsafeRules {
                keep_memory,
                ..Default::default()
            },
        )
        .await;
        let mut c = client(&node).await;
        let mut last = 0;
        for _ in 0..3 {
            last = fetch_ok(&mut c, 0, READY).await;
        }
        store.with(|s| s.unassign(0, 1));
        poll("section 0 dropped", READY, || {
            let mut c = c.clone();
            async move { (fetch(&mut c, 0).await.outcome == pb::Outcome::NotOwner as i32).then_some(()) }
        })
        .await;
        // Meanwhile another owner raised the ceiling (and may have served up to it).
        let other_owner_ceiling = store.with(|s| {
            s.sections[0].max_seq += 1_000;
            let inc = s.next_incarnation - 1;
            s.assign(0, 1, inc, true);
            s.sections[0].max_seq
        });
        let seq = fetch_ok(&mut c, 0, READY).await;
        if keep_memory {
            // Old memory (the poll above may have fetched one more) lies below the loaded base.
            assert!(
                seq > last && seq <= other_owner_ceiling,
                "control served {seq}, loaded {other_owner_ceiling}"
            );
        } else {
            assert!(
                seq > other_owner_ceiling,
                "regain served {seq} <= loaded {other_owner_ceiling}"
            );
        }
        node.shutdown().await;
    }
}

#[tokio::test]
async fn nothing_above_the_acknowledged_ceiling_unless_serve_before_ack_control_is_on() {
    for serve_before_bump_ack in [false, true] {
        let store = FakeStore::start(test_params(4, 10, 5), true).await;
        let node = start(
            &store,
            UnsafeRules {
                serve_before_bump_ack,
                ..Default::default()
            },
        )
        .await;
        let mut c = client(&node).await;
        fetch_ok(&mut c, 0, READY).await;
        store.with(|s| s.bump_unavailable = true);
        let mut highest = 0;
        for _ in 0..30 {
            let r = fetch(&mut c, 0).await;
            if r.outcome != pb::Outcome::Ok as i32 {
                assert_eq!(r.outcome, pb::Outcome::NotReady as i32, "{r:?}");
                break;
            }
            highest = r.seq;
        }
        let ceiling = store.max_seq(0);
        if serve_before_bump_ack {
            assert!(highest > ceiling, "control served {highest}, ceiling {ceiling}");
        } else {
            assert!(highest <= ceiling, "served {highest} above committed {ceiling}");
        }
        node.shutdown().await;
    }
}

#[tokio::test]
async fn gain_wait_is_skipped_only_by_its_control() {
    for skip_lease_wait in [false, true] {
        let store = FakeStore::start(test_params(4, 10, 5), false).await;
        let node = start(
            &store,
            UnsafeRules {
                skip_lease_wait,
                ..Default::default()
            },
        )
        .await;
        let mut c = client(&node).await;
        let assigned = Instant::now();
        store.with(|s| {
            let inc = s.next_incarnation - 1;
            s.assign(0, 4, inc, false)
        });
        fetch_ok(&mut c, 0, READY).await;
        let waited = assigned.elapsed();
        if skip_lease_wait {
            assert!(waited < GAIN_WAIT, "control waited {waited:?}");
        } else {
            assert!(waited >= GAIN_WAIT, "served after {waited:?}");
        }
        node.shutdown().await;
    }
}
