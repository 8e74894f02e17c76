//! The coalescer shares batch RPCs among concurrent callers, and each caller still gets its own seq.

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{FakeAlloc, table};
use seqsvr_client::{Client, ClientConfig, Coalescer, CoalescerConfig, FailureKind};
use seqsvr_proto::Uid;

async fn client_for(seed: &str) -> Client {
    let cfg = ClientConfig {
        deadline: Duration::from_secs(5),
        ..ClientConfig::new([seed])
    };
    Client::connect(cfg).await.expect("connect")
}

/// A fake owning uids 0..10 and a coalescer over it whose first call (uid 1) has been served.
async fn warmed() -> (FakeAlloc, Arc<Coalescer>) {
    let a = FakeAlloc::start().await;
    a.set_routes(table(1, &[(0, 10, &a.addr)]));
    let coalescer = Arc::new(Coalescer::new(client_for(&a.addr).await, CoalescerConfig::default()).unwrap());
    coalescer.fetch_next_seq(Uid(1)).await.expect("warm-up");
    (a, coalescer)
}

/// A caller of `uid` in a task of its own.
fn spawn_caller(
    coalescer: &Arc<Coalescer>,
    uid: u64,
) -> tokio::task::JoinHandle<Result<seqsvr_client::Fetched, seqsvr_client::ClientError>> {
    let c = coalescer.clone();
    tokio::spawn(async move { c.fetch_next_seq(Uid(uid)).await })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_share_rpcs_and_each_gets_its_own_seq() {
    let a = FakeAlloc::start().await;
    a.set_routes(table(1, &[(0, 10, &a.addr)]));
    a.state.delay_ms.store(20, Ordering::SeqCst);
    let coalescer = Arc::new(Coalescer::new(client_for(&a.addr).await, CoalescerConfig::default()).unwrap());

    let callers: Vec<_> = (0..200)
        .map(|_| {
            let c = coalescer.clone();
            tokio::spawn(async move { c.fetch_next_seq(Uid(7)).await })
        })
        .collect();
    let mut seqs = Vec::new();
    for c in callers {
        seqs.push(c.await.unwrap().expect("every caller is served").seq);
    }
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=200).collect::<Vec<u64>>(), "each caller got a distinct seq");
    let rpcs = a.data_rpcs();
    assert_eq!(a.state.fetch_rpcs.load(Ordering::SeqCst), 0, "only batch RPCs");
    assert!(rpcs <= 20, "200 calls took {rpcs} RPCs");
    eprintln!("200 coalesced calls took {rpcs} batch RPCs");
    assert_eq!(a.batches().iter().map(Vec::len).sum::<usize>(), 200);
}

#[tokio::test]
async fn coalesced_callers_of_two_owners_get_their_own_uids_seqs() {
    let a = FakeAlloc::start().await;
    let b = FakeAlloc::start().await;
    let split = table(1, &[(0, 5, &a.addr), (5, 10, &b.addr)]);
    a.set_routes(split.clone());
    b.set_routes(split);
    let coalescer = Arc::new(Coalescer::new(client_for(&a.addr).await, CoalescerConfig::default()).unwrap());

    let callers: Vec<_> = (0..100u64)
        .map(|i| {
            let c = coalescer.clone();
            let uid = Uid(i * 10); // 0..990: half on A, half on B
            tokio::spawn(async move { (uid, c.fetch_next_seq(uid).await) })
        })
        .collect();
    for c in callers {
        let (uid, got) = c.await.unwrap();
        let got = got.unwrap();
        assert_eq!((got.uid, got.seq), (uid, 1));
    }
    assert!(a.batches().iter().flatten().all(|&u| u < 500));
    assert!(b.batches().iter().flatten().all(|&u| u >= 500));
}

#[tokio::test]
async fn full_queue_refuses_at_once_without_sending() {
    let a = FakeAlloc::start().await;
    a.set_routes(table(1, &[(0, 10, &a.addr)]));
    let client = client_for(&a.addr).await;
    a.state.delay_ms.store(300, Ordering::SeqCst);
    let cfg = CoalescerConfig {
        queue_capacity: 1,
        max_batch: 1,
        max_in_flight: 1,
        busy_batch: 1,
    };
    let coalescer = Arc::new(Coalescer::new(client, cfg).unwrap());
    let callers: Vec<_> = (0..5)
        .map(|_| {
            let c = coalescer.clone();
            tokio::spawn(async move { c.fetch_next_seq(Uid(1)).await })
        })
        .collect();
    let mut served = 0;
    let mut refused = 0;
    for c in callers {
        match c.await.unwrap() {
            Ok(_) => served += 1,
            Err(e) => {
                assert_eq!(e.failure_kind(), Some(FailureKind::Unavailable), "{e}");
                refused += 1;
            }
        }
    }
    assert!(refused >= 1 && served >= 1, "served {served}, refused {refused}");
    assert_eq!(a.cur_seq(1), served, "refused calls consumed nothing");
}

/// While a batch of an owner is in flight, callers fewer than `busy_batch` wait for it to finish
/// and then go out together: one more RPC, not one each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_arriving_during_a_batch_wait_for_it_and_share_the_next() {
    let (a, coalescer) = warmed().await;
    // Long enough that the later callers all arrive while the first batch is held, and below
    // the client's per-attempt timeout.
    a.state.delay_ms.store(300, Ordering::SeqCst);
    let first = spawn_caller(&coalescer, 2);
    wait_for_batches(&a, 2).await;
    let mut later = Vec::new();
    // Apart from each other, so that none finds another already queued.
    for uid in 3..6u64 {
        later.push(spawn_caller(&coalescer, uid));
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    first.await.unwrap().expect("the lone caller is served");
    for c in later {
        c.await.unwrap().expect("every later caller is served");
    }
    let mut batches = a.batches();
    batches.iter_mut().for_each(|b| b.sort_unstable());
    assert_eq!(batches, vec![vec![1], vec![2], vec![3, 4, 5]], "RPCs sent");
}

/// Callers that give up while their request waits (their future dropped) leave the queue working:
/// the batch still goes out, the callers still waiting are served, and later callers too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_that_give_up_while_queued_do_not_stall_the_others() {
    let (a, coalescer) = warmed().await;
    a.state.delay_ms.store(200, Ordering::SeqCst);
    let spawn = |uid: u64| spawn_caller(&coalescer, uid);
    let held = spawn(2); // goes out alone and is held by the fake
    wait_for_batches(&a, 2).await;
    let quitters: Vec<_> = (3..8).map(spawn).collect();
    let stayers: Vec<_> = (8..10).map(spawn).collect();
    // Nothing outside the Coalescer shows its queue: a moment for the spawned callers to join it
    // while the held batch is in flight (a shorter moment would only test less, not fail).
    tokio::time::sleep(Duration::from_millis(20)).await;
    quitters.iter().for_each(|q| q.abort());
    held.await.unwrap().expect("the held caller is served");
    for s in stayers {
        s.await.unwrap().expect("a caller that waited is served");
    }
    a.state.delay_ms.store(0, Ordering::SeqCst);
    coalescer
        .fetch_next_seq(Uid(1))
        .await
        .expect("a later caller is served");
}

/// A lone caller sends its request from its own task; when it gives up mid-flight (its future
/// dropped), the callers who gathered behind it are sent at once, and a later lone caller goes
/// alone again: nothing stays counted in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_caller_that_gives_up_in_flight_leaves_the_queue_working() {
    let (a, coalescer) = warmed().await;
    a.state.delay_ms.store(2_000, Ordering::SeqCst);
    let spawn = |uid: u64| spawn_caller(&coalescer, uid);
    let lone = spawn(2);
    wait_for_batches(&a, 2).await;
    let behind = spawn(3);
    // A moment for the caller behind to join the queue (a shorter one only tests less).
    tokio::time::sleep(Duration::from_millis(20)).await;
    a.state.delay_ms.store(0, Ordering::SeqCst);
    lone.abort();
    let served = tokio::time::timeout(Duration::from_millis(1_500), behind).await;
    served
        .expect("the caller behind is sent when the lone one gives up, not after its 2 s")
        .unwrap()
        .expect("and served");
    let later = tokio::time::timeout(Duration::from_millis(1_500), coalescer.fetch_next_seq(Uid(4))).await;
    later
        .expect("a later lone caller is not held behind a batch that ended")
        .expect("served");
    let batches = a.batches();
    assert_eq!(
        batches[2..],
        [vec![3], vec![4]],
        "RPCs after the lone caller's: {batches:?}"
    );
}

/// Waits (at most 5 s) until the fake has received `n` batches; it records a batch on arrival,
/// before it holds the reply, so the last of them is then in flight.
async fn wait_for_batches(a: &FakeAlloc, n: usize) {
    let limit = tokio::time::Instant::now() + Duration::from_secs(5);
    while a.batches().len() < n {
        assert!(tokio::time::Instant::now() < limit, "batch {n} never arrived");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_id_callers_share_next_ids_calls_and_each_gets_its_own_id() {
    let a = FakeAlloc::start().await;
    a.set_routes(table(1, &[(0, 10, &a.addr)]));
    a.state.delay_ms.store(20, Ordering::SeqCst);
    let coalescer = Arc::new(Coalescer::new(client_for(&a.addr).await, CoalescerConfig::default()).unwrap());
    let callers: Vec<_> = (0..300)
        .map(|_| {
            let c = coalescer.clone();
            tokio::spawn(async move { c.next_id().await })
        })
        .collect();
    let mut ids = Vec::new();
    for c in callers {
        ids.push(c.await.unwrap().expect("every caller gets an id"));
    }
    ids.sort_unstable();
    assert_eq!(ids, (1..=300).collect::<Vec<u64>>(), "each caller got a distinct id");
    let rpcs = a.state.id_rpcs.load(Ordering::SeqCst);
    assert!(rpcs <= 30, "300 calls took {rpcs} NextIds calls");
    eprintln!(
        "300 coalesced id calls took {rpcs} NextIds calls: {:?}",
        a.state.id_counts.lock().unwrap()
    );
}

/// Under a layout of 4 ids a tick of a second one call can be handed at most 8 ids, and the
/// AllocSvr refuses a larger count as bad input: the coalescer must not put more of its callers
/// into one NextIds than the layout serves (each caller asked for one id, which is no bad input).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn id_callers_are_batched_no_larger_than_the_layout_serves() {
    let a = FakeAlloc::start().await;
    a.set_routes(table(1, &[(0, 10, &a.addr)]));
    a.state.delay_ms.store(20, Ordering::SeqCst);
    let small = seqsvr_proto::id_layout::IdLayout {
        tick_ms: 1_000,
        epoch_ms: 0,
        slot_bits: 4,
        seq_bits: 2,
    };
    *a.state.id_layout.lock().unwrap() = Some(small);
    let coalescer = Arc::new(Coalescer::new(client_for(&a.addr).await, CoalescerConfig::default()).unwrap());
    let callers: Vec<_> = (0..100)
        .map(|_| {
            let c = coalescer.clone();
            tokio::spawn(async move { c.next_id().await })
        })
        .collect();
    let mut ids = Vec::new();
    for c in callers {
        ids.push(c.await.unwrap().expect("every caller gets an id"));
    }
    ids.sort_unstable();
    assert_eq!(ids, (1..=100).collect::<Vec<u64>>(), "each caller got a distinct id");
    let counts = a.state.id_counts.lock().unwrap().clone();
    assert!(counts.iter().all(|&n| n <= 8), "{counts:?}");
}
