//! Named counters end to end: 3 real `storesvr` processes and 2 real `allocsvr` processes on
//! loopback, through the real client library, raw gRPC and `seqctl`.
//!
//! What it proves, each able to fail:
//! - every key has its own sequence: hundreds of keys (ASCII, `:`-separated, non-ASCII) placed
//!   over every section each count 1, 2, … on their own with no fault (P6 for keys), and a key
//!   never shares values with another key of its section or with a uid;
//! - one hot key asked by many callers at once, single values and blocks mixed, never repeats a
//!   value and keeps completed-before order (P1 for keys, blocks as ranges);
//! - all of it across a SIGKILL of the hot key's owner: the next owner hands every key values
//!   above everything it was given;
//! - `Client::counter_batch` (a key listed twice gets two values, in request order) and the
//!   `Coalescer`'s `counter_next`, mixed with uid fetches in the same owner queues: 64 callers at
//!   once, every key's values distinct and each caller's rising;
//! - bad input (an empty key, one of 257 bytes, invalid UTF-8, a count where none belongs, a block
//!   of 0 or above the step) gets INVALID_ARGUMENT from the server and exit 2 from `seqctl`, and
//!   takes nothing.
//!
//! Needs the `storesvr`, `allocsvr` and `seqctl` binaries: run `cargo build --workspace --bins` first.
//!
//! Deliberately left out: moves of keys between sets (a key is in a uid section, which the sets
//! tests and `sim dst --sets 2 --keys` move) and the simulators' checks.

mod e2e;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use e2e::seqctl::{Seqctl, text};
use e2e::{Cluster, Role, STEP, poll};
use seqsvr_client::{Client, Coalescer, CoalescerConfig, FailureKind, ProcessOrderedBlocks};
use seqsvr_proto::{NodeId, pb};
use tokio::sync::Mutex;
use tokio::time::Instant;

const START_WITHIN: Duration = Duration::from_secs(30);

/// Keys of every kind a user writes: plain, `:`-separated with a hex id, non-ASCII.
fn keys(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| match i % 3 {
            0 => format!("orders-{i}"),
            1 => format!("conv:{:016x}:msg", i * 7919),
            _ => format!("zähler-{i}-😀"),
        })
        .collect()
}

/// One value or block of the hot key: when its call began and ended, and its range.
type Taken = (Instant, Instant, std::ops::Range<u64>);

async fn take_hot(client: &Client, key: &str, i: u32) -> Taken {
    let began = Instant::now();
    let range = if i.is_multiple_of(3) {
        client.counter_reserve(key, 1 + i % 50).await.expect("reserve").values()
    } else {
        let v = client.counter_next(key).await.expect("next").value;
        v..v + 1
    };
    (began, Instant::now(), range)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_counts_on_its_own_and_stays_above_itself_across_an_owner_kill() {
    let mut c = Cluster::start();
    c.wait_settled(START_WITHIN).await;
    let client = c.client().await;

    // Each key its own sequence: two values in a row follow each other, whatever the other keys
    // of the section (and its uids) took in between.
    let keys = keys(300);
    let mut last: BTreeMap<&str, u64> = BTreeMap::new();
    for round in 0..2 {
        for k in &keys {
            let v = client.counter_next(k).await.expect("next").value;
            if let Some(&before) = last.get(k.as_str()) {
                assert_eq!(v, before + 1, "round {round}: key {k:?} skipped with no fault (P6)");
            }
            last.insert(k, v);
            // A uid at the key's position is another sequence: fetching it moves nothing of the key.
            let _ = client
                .fetch_next_seq(seqsvr_proto::keys::position(k, e2e::UID_LIMIT))
                .await;
        }
    }
    let sections: std::collections::BTreeSet<u64> = keys
        .iter()
        .map(|k| seqsvr_proto::keys::position(k, e2e::UID_LIMIT).0 / e2e::SECTION_SIZE)
        .collect();
    assert_eq!(sections.len() as u64, e2e::SECTIONS, "300 keys land in every section");

    // One hot key, 8 callers at once, values and blocks mixed.
    let hot = "orders";
    let before = client.counter_get(hot).await.expect("get").value;
    let taken: Arc<Mutex<Vec<Taken>>> = Arc::default();
    let mut tasks = Vec::new();
    for t in 0..8u32 {
        let (client, taken) = (client.clone(), taken.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..40u32 {
                let got = take_hot(&client, hot, t * 40 + i).await;
                taken.lock().await.push(got);
            }
        }));
    }
    for t in tasks {
        t.await.expect("caller");
    }
    let all = std::mem::take(&mut *taken.lock().await);
    check_ranges(&all, before);
    let hot_last = all.iter().map(|(_, _, r)| r.end - 1).max().unwrap();
    assert_eq!(
        client.counter_get(hot).await.expect("get").value,
        hot_last,
        "P5 for a key"
    );

    // The hot key's owner dies: the next owner starts every key above what it was given.
    let owner = client
        .counter_next(hot)
        .await
        .expect("next")
        .owner
        .expect("owner")
        .node_id;
    c.kill(Role::Alloc, owner.0);
    let other = NodeId(if owner.0 == 1 { 2 } else { 1 });
    let v = poll(
        "a value of the hot key from the next owner",
        Duration::from_secs(15),
        || async { client.counter_next(hot).await.ok() },
    )
    .await;
    assert_eq!(v.owner.map(|o| o.node_id), Some(other));
    assert!(v.value > hot_last + 1, "{} after {}", v.value, hot_last + 1);
    for k in &keys {
        let v = client.counter_next(k).await.expect("next after the kill").value;
        assert!(v > last[k.as_str()], "key {k:?}: {v} after {}", last[k.as_str()]);
    }
}

/// No two ranges overlap, all are above `before`, and a range whose call completed before another
/// began is entirely below it.
fn check_ranges(all: &[Taken], before: u64) {
    let mut sorted: Vec<&Taken> = all.iter().collect();
    sorted.sort_by_key(|(_, _, r)| r.start);
    for w in sorted.windows(2) {
        assert!(w[0].2.end <= w[1].2.start, "overlap: {:?} and {:?}", w[0].2, w[1].2);
    }
    for (began, _, r) in all {
        assert!(r.start > before, "{r:?} not above {before}");
        for (_, done, earlier) in all {
            if done < began {
                assert!(earlier.end <= r.start, "{earlier:?} completed before {r:?} began");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_keys_and_counts_get_invalid_argument_and_exit_2_and_take_nothing() {
    let c = Cluster::start();
    c.wait_settled(START_WITHIN).await;
    let client = c.client().await;
    let key = "invoices";
    let first = client.counter_next(key).await.expect("next").value;
    let mut raw = c.alloc_rpc(1);
    let step = u32::try_from(STEP).unwrap();
    let req = |key: &[u8], count| pb::CounterRequest {
        key: key.to_vec(),
        count,
        route_version: 0,
    };
    let long = vec![b'k'; 257];
    for (r, names) in [
        (req(b"", 0), "empty"),
        (req(&long, 0), "at most 256 bytes, got 257"),
        (req(&[0x66, 0xff, 0x6f], 0), "UTF-8"),
        (req(key.as_bytes(), 3), "takes no count"),
    ] {
        let next = raw.counter_next(r.clone()).await.expect_err("bad next");
        assert_eq!(next.code(), tonic::Code::InvalidArgument, "{next}");
        assert!(next.message().contains(names), "{next}");
        if r.count == 0 {
            let get = raw.counter_get(r.clone()).await.expect_err("bad get");
            assert!(get.message().contains(names), "{get}");
        }
    }
    for (count, names) in [(0, "1..=1000"), (step + 1, "step 1000"), (u32::MAX, "step 1000")] {
        let err = raw
            .counter_reserve(req(key.as_bytes(), count))
            .await
            .expect_err("bad block");
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
        assert!(err.message().contains(names), "{err}");
    }
    let batch = raw
        .counter_batch(pb::CounterBatchRequest {
            keys: vec![key.as_bytes().to_vec(), Vec::new()],
            route_version: 0,
        })
        .await
        .expect_err("a batch with an empty key");
    assert!(batch.message().contains("keys[1]"), "{batch}");
    let err = client.counter_reserve(key, step + 1).await.expect_err("too big");
    assert_eq!(err.failure_kind(), Some(FailureKind::InvalidArgument), "{err}");

    let seqctl = Seqctl::new(["--alloc", c.alloc_seeds_flag().as_str()]);
    let long_s = "k".repeat(257);
    for args in [
        vec!["counter", "next", ""],
        vec!["counter", "get", long_s.as_str()],
        vec!["counter", "reserve", key, "0"],
        vec!["counter", "reserve", key, "1001"],
    ] {
        let out = seqctl.output(&args).await;
        assert_eq!(out.status.code(), Some(2), "seqctl {args:?}: {}", text(&out));
    }
    assert_eq!(
        client.counter_get(key).await.expect("get").value,
        first,
        "refused calls took nothing"
    );

    // And the good calls, as JSON.
    let n = seqctl
        .json(&["counter", "next", key])
        .await
        .expect("counter next --json");
    assert_eq!(
        (n["key"].as_str(), n["value"].as_u64()),
        (Some(key), Some(first + 1)),
        "{n}"
    );
    let b = seqctl
        .json(&["counter", "reserve", key, "1000"])
        .await
        .expect("counter reserve --json");
    assert_eq!(b["count"], 1000);
    assert_eq!(b["first"].as_u64(), Some(first + 2), "{b}");
    assert_eq!(b["last"].as_u64(), Some(first + 1001), "{b}");
    let g = seqctl.json(&["counter", "get", key]).await.expect("counter get --json");
    assert_eq!(g["value"].as_u64(), Some(first + 1001), "{g}");
    assert!(g["owner"]["section"].is_u64(), "{g}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_and_the_coalescer_serve_keys_beside_uids() {
    let c = Cluster::start();
    c.wait_settled(START_WITHIN).await;
    let client = c.client().await;
    let keys = keys(40);
    let mut asked: Vec<&str> = keys.iter().map(String::as_str).collect();
    asked.extend(["twice", "twice"]);
    let got = client.counter_batch(&asked).await.expect("batch");
    let values: Vec<u64> = got.into_iter().map(|r| r.expect("served").value).collect();
    let n = values.len();
    assert!(values[n - 1] > values[n - 2], "a repeated key: {:?}", &values[n - 2..]);
    let err = client.counter_batch(&["ok", ""]).await.expect_err("an empty key");
    assert_eq!(err.failure_kind(), Some(FailureKind::InvalidArgument), "{err}");

    let co = Arc::new(Coalescer::new(client.clone(), CoalescerConfig::default()).expect("coalescer"));
    let seen: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let mut tasks = Vec::new();
    for t in 0..64u64 {
        let (co, seen, keys) = (co.clone(), seen.clone(), keys.clone());
        tasks.push(tokio::spawn(async move {
            let mut last: BTreeMap<String, u64> = BTreeMap::new();
            for i in 0..20u64 {
                let key = &keys[((t + i) % 8) as usize];
                if i % 4 == 3 {
                    co.fetch_next_seq(seqsvr_proto::Uid(t * 1000 + i))
                        .await
                        .expect("uid beside keys");
                    continue;
                }
                let v = co.counter_next(key).await.expect("coalesced next").value;
                if let Some(&before) = last.get(key) {
                    assert!(v > before, "caller {t}, key {key:?}: {v} after {before}");
                }
                last.insert(key.clone(), v);
                seen.lock().await.push((key.clone(), v));
            }
        }));
    }
    for t in tasks {
        t.await.expect("caller");
    }
    let mut all = std::mem::take(&mut *seen.lock().await);
    let total = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), total, "a key's value was handed out twice");
    assert_eq!(total, 64 * 15);

    // Leaf's client mode on a key: two "processes" hand out values from blocks reserved ahead,
    // unique between them, increasing within each.
    let mut handed = Vec::new();
    for p in 0..2 {
        let blocks = ProcessOrderedBlocks::new(c.client().await, 30).expect("config");
        let mut last = 0;
        for _ in 0..100 {
            let v = blocks.next_of_key("leaf-mode").await.expect("next");
            assert!(v > last, "process {p}: {v} after {last}");
            last = v;
            handed.push(v);
        }
    }
    let n = handed.len();
    handed.sort_unstable();
    handed.dedup();
    assert_eq!(handed.len(), n, "two processes handed out one value");
}
