//! Blocks of seqs (`Reserve`) end to end: 3 real `storesvr` processes and 2 real `allocsvr`
//! processes on loopback, through the real client library and `seqctl`.
//!
//! What it proves, each able to fail:
//! - a block is above every earlier seq of its uid, and the uid's next seq and block are above
//!   it, mixed with single fetches, for blocks of 1 up to the set's step (which needs a bump);
//! - blocks asked for at once by many callers of one uid never overlap, and a block completed
//!   before another began is entirely below it;
//! - all of it across a SIGKILL of the uid's owner (the next owner starts above every block);
//! - `ProcessOrderedBlocks` (blocks reserved ahead, values handed out from memory): two of them
//!   on one uid hand out values that are unique and increasing within each, and — what its name
//!   warns of — not ordered between them;
//! - bad input (a block of 0 or above the step, a uid outside the space) gets INVALID_ARGUMENT
//!   from the server and exit 2 from `seqctl`, and takes nothing.
//!
//! Needs the `storesvr`, `allocsvr` and `seqctl` binaries: run `cargo build --workspace --bins` first.
//!
//! Deliberately left out: named counters (their own issue) and the simulators' checks of blocks.

mod e2e;

use std::sync::Arc;
use std::time::Duration;

use e2e::seqctl::{Seqctl, text};
use e2e::{Cluster, Role, SECTION_SIZE, STEP, UID_LIMIT, poll};
use seqsvr_client::{Block, Client, FailureKind, ProcessOrderedBlocks};
use seqsvr_proto::{NodeId, Uid, pb};
use tokio::sync::Mutex;
use tokio::time::Instant;

const START_WITHIN: Duration = Duration::from_secs(30);

/// A uid that AllocSvr `node` serves (per the store's route table).
async fn uid_of(c: &Cluster, client: &Client, node: u64) -> Uid {
    poll("a uid served by the wanted node", Duration::from_secs(10), || async {
        let routes = c.store_routes().await?;
        let entry = routes.entries.iter().find(|e| e.node_id == node)?;
        let uid = Uid(entry.section_begin * SECTION_SIZE + 5);
        let f = client.fetch_next_seq(uid).await.ok()?;
        (f.owner.map(|o| o.node_id) == Some(NodeId(node))).then_some(uid)
    })
    .await
}

/// Checks `b` against the uid's last seq and returns the block's last seq.
fn above(last: u64, b: &Block, what: &str) -> u64 {
    assert!(b.first > last, "{what}: block {:?} not above {last}", b.seqs());
    b.seqs().end - 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_stay_above_every_earlier_seq_across_an_owner_kill_and_never_overlap() {
    let mut c = Cluster::start();
    c.wait_settled(START_WITHIN).await;
    let client = c.client().await;
    let uid = uid_of(&c, &client, 1).await;
    let mut last = client.get_cur_seq(uid).await.expect("get").cur_seq;

    // Blocks of every size class mixed with fetches: 1, small, half a step, a whole step (more
    // than the headroom left: a bump must make room first).
    let step = u32::try_from(STEP).unwrap();
    for (i, n) in [1, 7, step / 2, step, 3, step, 1].into_iter().enumerate() {
        let b = client.reserve(uid, n).await.expect("reserve");
        assert_eq!(b.count, n);
        last = above(last, &b, &format!("block {i} of {n}"));
        let f = client.fetch_next_seq(uid).await.expect("fetch");
        assert_eq!(f.seq, last + 1, "with no fault the next seq follows the block (P6)");
        last = f.seq;
    }

    // Concurrent callers on one uid: the blocks never overlap, and each caller's blocks rise.
    let blocks: Arc<Mutex<Vec<(Instant, Instant, Block)>>> = Arc::default();
    let mut tasks = Vec::new();
    for t in 0..8u32 {
        let (client, blocks) = (client.clone(), blocks.clone());
        tasks.push(tokio::spawn(async move {
            for k in 0..20u32 {
                let began = Instant::now();
                let b = client.reserve(uid, 1 + (t * 7 + k * 13) % 100).await.expect("reserve");
                blocks.lock().await.push((began, Instant::now(), b));
            }
        }));
    }
    for t in tasks {
        t.await.expect("caller");
    }
    let mut all = std::mem::take(&mut *blocks.lock().await);
    all.sort_by_key(|(_, _, b)| b.first);
    for w in all.windows(2) {
        assert!(
            w[0].2.seqs().end <= w[1].2.first,
            "overlap: {:?} and {:?}",
            w[0].2,
            w[1].2
        );
    }
    for (began, _, b) in &all {
        assert!(
            b.first > last,
            "block {:?} not above {last}, the last seq before the callers",
            b.seqs()
        );
        for (_, done, earlier) in &all {
            if done < began {
                assert!(
                    earlier.seqs().end <= b.first,
                    "{earlier:?} completed before {b:?} began"
                );
            }
        }
    }
    last = all.last().map(|(_, _, b)| b.seqs().end - 1).unwrap();

    // The owner dies: the next owner serves blocks above everything handed out.
    c.kill(Role::Alloc, 1);
    let b = poll("a block from the next owner", Duration::from_secs(15), || async {
        client.reserve(uid, 10).await.ok()
    })
    .await;
    assert_eq!(b.owner.map(|o| o.node_id), Some(NodeId(2)));
    last = above(last, &b, "after the kill");
    let f = client.fetch_next_seq(uid).await.expect("fetch");
    assert!(f.seq > last);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_blocks_get_invalid_argument_and_exit_2_and_take_nothing() {
    let c = Cluster::start();
    c.wait_settled(START_WITHIN).await;
    let client = c.client().await;
    let uid = uid_of(&c, &client, 1).await;
    let before = client.get_cur_seq(uid).await.expect("get").cur_seq;
    let mut raw = c.alloc_rpc(1);
    let step = u32::try_from(STEP).unwrap();
    for (u, count, names) in [
        (uid.0, 0, "1..=1000"),
        (uid.0, step + 1, "step 1000"),
        (uid.0, u32::MAX, "step 1000"),
        (UID_LIMIT, 1, "outside"),
    ] {
        let err = raw
            .reserve(pb::ReserveRequest {
                uid: u,
                count,
                route_version: 0,
            })
            .await
            .expect_err("bad block");
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{u} x {count}: {err}");
        assert!(err.message().contains(names), "{u} x {count}: {err}");
    }
    let err = client.reserve(uid, step + 1).await.expect_err("too big");
    assert_eq!(err.failure_kind(), Some(FailureKind::InvalidArgument), "{err}");

    let seqctl = Seqctl::new(["--alloc", c.alloc_seeds_flag().as_str()]);
    for args in [["reserve", "5", "0"], ["reserve", "5", "1001"], ["reserve", "5", "x"]] {
        let out = seqctl.output(&args).await;
        assert_eq!(out.status.code(), Some(2), "seqctl {args:?}: {}", text(&out));
    }
    assert_eq!(
        client.get_cur_seq(uid).await.expect("get").cur_seq,
        before,
        "a refused block took nothing"
    );
    let uid_s = uid.0.to_string();
    let b = seqctl
        .json(&["reserve", uid_s.as_str(), "1000"])
        .await
        .expect("seqctl reserve --json");
    assert_eq!(b["count"], 1000);
    assert!(b["first"].as_u64().unwrap() > before, "{b}");
    assert_eq!(b["last"].as_u64().unwrap(), b["first"].as_u64().unwrap() + 999, "{b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_ordered_blocks_are_unique_and_increase_within_each_process_only() {
    let c = Cluster::start();
    c.wait_settled(START_WITHIN).await;
    let uid = Uid(123);
    // Two "processes": each its own client and buffers, on the same uid, at the same time.
    let order: Arc<Mutex<Vec<(usize, u64)>>> = Arc::default();
    let mut tasks = Vec::new();
    for p in 0..2 {
        let blocks = ProcessOrderedBlocks::new(c.client().await, 50).expect("config");
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let mut last = 0;
            for _ in 0..300 {
                let v = blocks.next(uid).await.expect("next");
                assert!(v > last, "process {p}: {v} after {last}");
                last = v;
                order.lock().await.push((p, v));
                tokio::task::yield_now().await;
            }
        }));
    }
    for t in tasks {
        t.await.expect("process");
    }
    let order = order.lock().await.clone();
    let mut values: Vec<u64> = order.iter().map(|(_, v)| *v).collect();
    values.sort_unstable();
    values.dedup();
    assert_eq!(values.len(), 600, "a value handed out twice");
    // What the name warns of: in the order the values were handed out, one process's value can
    // be below a value the other handed out earlier.
    let crossed = order.windows(2).any(|w| w[0].0 != w[1].0 && w[1].1 < w[0].1);
    assert!(
        crossed,
        "the two processes never went out of order: the test shows nothing"
    );
    // The cluster handed out whole blocks: the uid's next fetch is above every buffered value.
    let f = c.client().await.fetch_next_seq(uid).await.expect("fetch");
    assert!(f.seq > *values.last().unwrap());
}
