//! Black-box tests of `Client` against fake AllocService servers on loopback.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{FakeAlloc, dead_addr, table};
use seqsvr_client::{Client, ClientConfig, ClientError, FailureKind};
use seqsvr_proto::Uid;
use tokio::time::Instant;

fn config(seeds: &[&str]) -> ClientConfig {
    ClientConfig {
        deadline: Duration::from_secs(3),
        attempt_timeout: Duration::from_millis(500),
        backoff_base: Duration::from_millis(5),
        backoff_max: Duration::from_millis(50),
        ..ClientConfig::new(seeds.iter().copied())
    }
}

/// One fake owning every section, and a client that learned its table.
async fn one_owner() -> (FakeAlloc, Client) {
    let a = FakeAlloc::start().await;
    a.set_routes(table(1, &[(0, 10, &a.addr)]));
    let client = Client::connect(config(&[&a.addr])).await.expect("connect");
    (a, client)
}

#[tokio::test]
async fn connect_learns_the_route_table_from_a_seed() {
    let (a, client) = one_owner().await;
    let routes = client.routes().table(0).expect("routes learned at connect");
    assert_eq!(routes.version(), 1);
    assert_eq!(routes.lookup(Uid(999)).unwrap().addr, a.addr);
    assert_eq!(a.data_rpcs(), 0, "connect uses a read, never a fetch");
}

#[tokio::test]
async fn stale_route_table_is_corrected_in_one_retry() {
    let a = FakeAlloc::start().await;
    let b = FakeAlloc::start().await;
    a.set_routes(table(1, &[(0, 10, &a.addr)]));
    let client = Client::connect(config(&[&a.addr])).await.unwrap();
    assert_eq!(client.routes().table(0).unwrap().version(), 1);

    // Everything moved to B; A knows, the client does not.
    let moved = table(2, &[(0, 10, &b.addr)]);
    a.set_routes(moved.clone());
    b.set_routes(moved);

    let got = client.fetch_next_seq(Uid(42)).await.unwrap();
    assert_eq!(got.seq, 1);
    assert_eq!(
        (a.data_rpcs(), b.data_rpcs()),
        (1, 1),
        "one NOT_OWNER from A, then B serves"
    );
    assert_eq!(client.routes().table(0).unwrap().version(), 2);
    let owner = got.owner.expect("owner reported");
    assert_eq!(owner.section.0, 0);

    // The corrected table is kept: the next call goes straight to B.
    assert_eq!(client.fetch_next_seq(Uid(42)).await.unwrap().seq, 2);
    assert_eq!((a.data_rpcs(), b.data_rpcs()), (1, 2));
}

#[tokio::test]
async fn batch_splits_uids_by_owner_and_keeps_request_order() {
    let a = FakeAlloc::start().await;
    let b = FakeAlloc::start().await;
    let split = table(1, &[(0, 5, &a.addr), (5, 10, &b.addr)]);
    a.set_routes(split.clone());
    b.set_routes(split);
    let client = Client::connect(config(&[&a.addr])).await.unwrap();

    let uids = [5, 550, 7, 999, 0, 5, 501].map(Uid);
    let got = client.batch_fetch(&uids).await.unwrap();
    let pairs: Vec<(u64, u64)> = got.iter().map(|f| (f.uid.0, f.seq)).collect();
    assert_eq!(pairs, [(5, 1), (550, 1), (7, 1), (999, 1), (0, 1), (5, 2), (501, 1)]);
    assert_eq!(a.batches(), vec![vec![5, 7, 0, 5]], "A gets only its uids, in order");
    assert_eq!(b.batches(), vec![vec![550, 999, 501]], "B gets only its uids, in order");
    assert_eq!(got[1].owner.unwrap().section.0, 5);
    assert_eq!(got[3].owner.unwrap().section.0, 9);
}

#[tokio::test]
async fn batch_of_many_uids_is_sent_in_rpcs_of_at_most_1000() {
    let (a, client) = one_owner().await;
    let uids: Vec<Uid> = (0..2_500).map(|i| Uid(i % 500)).collect();
    let got = client.batch_fetch(&uids).await.unwrap();
    assert_eq!(got.len(), 2_500);
    for (i, f) in got.iter().enumerate() {
        assert_eq!(f.uid, uids[i]);
        assert_eq!(f.seq, i as u64 / 500 + 1, "uid {} occurrence {}", f.uid, i / 500);
    }
    let sizes: Vec<usize> = a.batches().iter().map(Vec::len).collect();
    assert_eq!(sizes.len(), 3, "{sizes:?}");
    assert!(sizes.iter().all(|&n| n <= 1_000), "{sizes:?}");
    assert_eq!(sizes.iter().sum::<usize>(), 2_500);
}

#[tokio::test]
async fn silent_server_gives_unknown_within_the_deadline_never_a_number() {
    let (a, _) = one_owner().await;
    let cfg = ClientConfig {
        deadline: Duration::from_millis(600),
        attempt_timeout: Duration::from_millis(200),
        ..config(&[&a.addr])
    };
    let client = Client::connect(cfg).await.unwrap();
    a.state.hang.store(true, Ordering::SeqCst);

    let started = Instant::now();
    let err = client.fetch_next_seq(Uid(1)).await.unwrap_err();
    let took = started.elapsed();
    assert!(err.is_unknown(), "{err}");
    assert!(took < Duration::from_millis(900), "took {took:?}");
    assert!(took >= Duration::from_millis(400), "gave up early: {took:?}");

    let err = client.batch_fetch(&[Uid(1), Uid(2)]).await.unwrap_err();
    assert!(err.is_unknown(), "{err}");

    // A read that timed out consumed nothing.
    let err = client.get_cur_seq(Uid(1)).await.unwrap_err();
    assert_eq!(err.failure_kind(), Some(FailureKind::Unavailable), "{err}");
}

#[tokio::test]
async fn timed_out_fetch_is_unknown_even_though_the_server_served_it() {
    let (a, _) = one_owner().await;
    let cfg = ClientConfig {
        deadline: Duration::from_millis(500),
        attempt_timeout: Duration::from_millis(100),
        ..config(&[&a.addr])
    };
    let client = Client::connect(cfg).await.unwrap();
    a.state.delay_ms.store(150, Ordering::SeqCst);

    let err = client.fetch_next_seq(Uid(3)).await.unwrap_err();
    assert!(err.is_unknown(), "{err}");
    // The server handed numbers out for requests whose replies the client gave up on.
    let deadline = Instant::now() + Duration::from_secs(2);
    while a.cur_seq(3) == 0 {
        assert!(Instant::now() < deadline, "fake never served the timed-out request");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn unreachable_server_is_a_failure_not_an_unknown() {
    let dead = dead_addr().await;
    let cfg = ClientConfig {
        deadline: Duration::from_millis(500),
        ..config(&[&dead])
    };
    let client = Client::new(cfg.clone()).unwrap();
    let err = client.fetch_next_seq(Uid(1)).await.unwrap_err();
    assert_eq!(err.failure_kind(), Some(FailureKind::Unavailable), "{err}");
    let err = Client::connect(cfg).await.unwrap_err();
    assert_eq!(err.failure_kind(), Some(FailureKind::Unavailable), "{err}");
}

#[tokio::test]
async fn invalid_argument_is_surfaced_and_not_retried() {
    let (a, client) = one_owner().await;
    a.state.invalid.store(true, Ordering::SeqCst);
    let err = client.fetch_next_seq(Uid(1)).await.unwrap_err();
    assert!(
        matches!(&err, ClientError::Failed { kind: FailureKind::InvalidArgument, detail } if detail.contains("fake refuses")),
        "{err}"
    );
    assert_eq!(a.data_rpcs(), 1, "sent once");

    let err = client.batch_fetch(&[Uid(1), Uid(2)]).await.unwrap_err();
    assert_eq!(err.failure_kind(), Some(FailureKind::InvalidArgument), "{err}");
    assert_eq!(a.data_rpcs(), 2, "the batch was sent once");
}

#[tokio::test]
async fn an_overloaded_server_is_retried_after_a_backoff_without_asking_others_for_routes() {
    let (a, client) = one_owner().await;
    let route_reads = a.state.get_rpcs.load(Ordering::SeqCst);
    a.state.overloaded_left.store(3, Ordering::SeqCst);
    let started = Instant::now();
    let got = client.fetch_next_seq(Uid(8)).await.unwrap();
    assert_eq!(got.seq, 1);
    assert_eq!(a.data_rpcs(), 4, "three refusals, then served");
    assert_eq!(
        a.state.get_rpcs.load(Ordering::SeqCst),
        route_reads,
        "no route reads in between"
    );
    // Backoffs of at least 2.5, 5 and 10 ms (base 5 ms, doubling, upper half jittered).
    assert!(
        started.elapsed() >= Duration::from_millis(17),
        "{:?}",
        started.elapsed()
    );

    a.state.overloaded_left.store(2, Ordering::SeqCst);
    let got = client.batch_fetch(&[Uid(8), Uid(9)]).await.unwrap();
    assert_eq!(got.iter().map(|f| f.seq).collect::<Vec<_>>(), [2, 1]);
}

#[tokio::test]
async fn a_used_up_section_fails_at_once_and_is_not_retried() {
    let (a, client) = one_owner().await;
    a.state.exhausted.store(true, Ordering::SeqCst);
    let err = client.fetch_next_seq(Uid(1)).await.unwrap_err();
    assert_eq!(err.failure_kind(), Some(FailureKind::Exhausted), "{err}");
    assert_eq!(a.data_rpcs(), 1, "sent once");
    let err = client.batch_fetch(&[Uid(1), Uid(2)]).await.unwrap_err();
    assert_eq!(err.failure_kind(), Some(FailureKind::Exhausted), "{err}");
    assert_eq!(a.data_rpcs(), 2, "the batch was sent once");
}

#[tokio::test]
async fn uid_outside_the_table_is_refused_before_sending() {
    let (a, client) = one_owner().await;
    let err = client.fetch_next_seq(Uid(1_000)).await.unwrap_err();
    assert_eq!(err.failure_kind(), Some(FailureKind::InvalidArgument), "{err}");
    let err = client.batch_fetch(&[Uid(1), Uid(u64::MAX)]).await.unwrap_err();
    assert_eq!(err.failure_kind(), Some(FailureKind::InvalidArgument), "{err}");
    assert_eq!(a.data_rpcs(), 0, "nothing sent");
}

#[tokio::test]
async fn not_ready_is_retried_until_served() {
    let (a, client) = one_owner().await;
    a.state.not_ready_left.store(3, Ordering::SeqCst);
    let got = client.fetch_next_seq(Uid(8)).await.unwrap();
    assert_eq!(got.seq, 1);
    assert_eq!(a.data_rpcs(), 4, "three NOT_READY, then served");

    a.state.not_ready_left.store(1, Ordering::SeqCst);
    let got = client.batch_fetch(&[Uid(8), Uid(9)]).await.unwrap();
    assert_eq!(got.iter().map(|f| f.seq).collect::<Vec<_>>(), [2, 1]);
    assert_eq!(
        a.batches(),
        vec![vec![8, 9], vec![8]],
        "only the NOT_READY uid is resent"
    );
}

#[tokio::test]
async fn not_owner_without_a_newer_table_fails_at_the_deadline_as_a_failure() {
    let a = FakeAlloc::start().await;
    let b = FakeAlloc::start().await;
    // Both believe B owns everything, but B has no table of its own: it answers NOT_OWNER.
    a.set_routes(table(1, &[(0, 10, &b.addr)]));
    let cfg = ClientConfig {
        deadline: Duration::from_millis(300),
        ..config(&[&a.addr])
    };
    let client = Client::connect(cfg).await.unwrap();
    let err = client.fetch_next_seq(Uid(1)).await.unwrap_err();
    assert_eq!(err.failure_kind(), Some(FailureKind::Unavailable), "{err}");
    assert!(b.data_rpcs() >= 2, "retried with backoff");
    assert!(b.data_rpcs() < 64, "bounded: {}", b.data_rpcs());
}

/// A map of the fakes' 10 sections (section size 100, uid limit 1,000) all given to `set`.
fn cluster_map(version: u64, set: u64, allocsvrs: &[&str]) -> seqsvr_proto::pb::ClusterMap {
    use seqsvr_proto::pb;
    pb::ClusterMap {
        version,
        sets: vec![pb::SetInfo {
            set_id: set,
            stores: vec![],
            allocsvrs: allocsvrs.iter().map(|a| a.to_string()).collect(),
        }],
        ranges: vec![pb::MapRange {
            section_begin: 0,
            section_end: 10,
            set_id: set,
        }],
        section_size: 100,
        uid_limit: 1_000,
        // As every map once set 0 set its ids up: a map without a setup is asked for again.
        ids: Some(pb::IdSetup {
            layout: Some(seqsvr_proto::id_layout::IdLayout::twitter(0).to_pb()),
            slots_per_set: 1,
            max_ahead_ms: 10_000,
            key_placement: 0,
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_stale_client_gets_the_map_once_and_an_up_to_date_one_gets_no_map() {
    let (a, client) = one_owner().await;
    *a.state.map.lock().unwrap() = Some(cluster_map(3, 0, &[&a.addr]));
    assert_eq!(client.map_version(), 0, "connect found no map yet");
    client.fetch_next_seq(Uid(1)).await.unwrap();
    assert_eq!(client.map_version(), 3, "learned from the reply");
    assert_eq!(a.state.maps_sent.load(Ordering::SeqCst), 1);
    for uid in [1, 2, 500] {
        client.fetch_next_seq(Uid(uid)).await.unwrap();
        client.get_cur_seq(Uid(uid)).await.unwrap();
    }
    client.batch_fetch(&[Uid(3), Uid(4)]).await.unwrap();
    assert_eq!(
        a.state.maps_sent.load(Ordering::SeqCst),
        1,
        "up to date: no reply carried the map again"
    );
    *a.state.map.lock().unwrap() = Some(cluster_map(4, 0, &[&a.addr]));
    client.get_cur_seq(Uid(1)).await.unwrap();
    assert_eq!(client.map_version(), 4);
}

/// Every answer comes from a set-0 node while the map gives every section to set 1 and no move is
/// in flight: no number may be returned.
#[tokio::test]
async fn a_number_from_a_set_the_map_does_not_allow_is_never_returned() {
    let (a, client) = one_owner().await;
    *a.state.map.lock().unwrap() = Some(cluster_map(3, 1, &[&a.addr]));
    let err = client.fetch_next_seq(Uid(7)).await.unwrap_err();
    assert!(matches!(err, ClientError::Unknown { .. }), "{err:?}");
    assert!(a.cur_seq(7) > 0, "the fake did hand numbers out");
    let batch = client.batch_fetch_each(&[Uid(8)]).await.unwrap();
    assert!(matches!(batch[0], Err(ClientError::Unknown { .. })), "{batch:?}");
    // The same map giving the sections to set 0: the answers are taken.
    *a.state.map.lock().unwrap() = Some(cluster_map(4, 0, &[&a.addr]));
    client.get_cur_seq(Uid(1)).await.unwrap();
    assert!(client.fetch_next_seq(Uid(7)).await.is_ok());
}

/// A client with seeds in one "set" reaches an AllocSvr it was never told of, through the
/// addresses the map lists for the set a section went to.
#[tokio::test]
async fn a_set_without_seeds_is_reached_through_the_map() {
    use seqsvr_proto::pb;
    let a = FakeAlloc::start().await;
    let b = FakeAlloc::start().await;
    // Set 0 (fake A) gave sections [0, 5) to set 1 (fake B).
    let mut a_table = table(2, &[(0, 5, ""), (5, 10, &a.addr)]);
    a_table.entries[0].set_id = 1;
    a.set_routes(a_table);
    let mut b_table = table(1, &[(0, 5, &b.addr), (5, 10, "")]);
    b_table.set_id = 1;
    b_table.entries[0].set_id = 1;
    b.set_routes(b_table);
    let mut map = cluster_map(5, 0, &[&a.addr]);
    map.sets.push(pb::SetInfo {
        set_id: 1,
        stores: vec![],
        allocsvrs: vec![b.addr.clone()],
    });
    map.ranges = vec![
        pb::MapRange {
            section_begin: 0,
            section_end: 5,
            set_id: 1,
        },
        pb::MapRange {
            section_begin: 5,
            section_end: 10,
            set_id: 0,
        },
    ];
    *a.state.map.lock().unwrap() = Some(map);
    let client = Client::connect(config(&[&a.addr])).await.unwrap();
    assert_eq!(client.map_version(), 5);
    let got = client.fetch_next_seq(Uid(42)).await.unwrap();
    assert_eq!(got.seq, 1);
    assert_eq!(b.cur_seq(42), 1, "set 1's AllocSvr served it");
    assert_eq!(
        client.routes().table(1).unwrap().version(),
        1,
        "and its table was learned"
    );
}

/// Fake B as set 1's AllocSvr, serving sections [1, 10), under a map that gives section 0 (uid 0's)
/// to set 0, whose AllocSvr is not up; and two keys whose positions (under the fakes' uid limit of
/// 1,000) are in set 1's sections.
async fn set_1_serving_keys() -> (FakeAlloc, Vec<String>) {
    use seqsvr_proto::pb;
    let b = FakeAlloc::start().await;
    let mut b_table = table(1, &[(0, 1, ""), (1, 10, &b.addr)]);
    b_table.set_id = 1;
    b_table.entries[1].set_id = 1;
    b.set_routes(b_table);
    let mut map = cluster_map(5, 0, &[&dead_addr().await]);
    map.sets.push(pb::SetInfo {
        set_id: 1,
        stores: vec![],
        allocsvrs: vec![b.addr.clone()],
    });
    let range = |section_begin, section_end, set_id| pb::MapRange {
        section_begin,
        section_end,
        set_id,
    };
    map.ranges = vec![range(0, 1, 0), range(1, 10, 1)];
    *b.state.map.lock().unwrap() = Some(map);
    let keys = (0..)
        .map(|i| format!("orders-{i}"))
        .filter(|k| seqsvr_proto::keys::position(k, 1_000).0 >= 100)
        .take(2)
        .collect();
    (b, keys)
}

/// A fresh client knows no uid limit, so it cannot place a key and asks its seed. The seed owns
/// the key's section in set 1 while the map gives uid 0's section to set 0: its answer is
/// correct and must be taken, not checked as if it were for uid 0 and refused (the value burned).
#[tokio::test]
async fn a_fresh_clients_first_counter_next_takes_the_owners_answer() {
    let (b, keys) = set_1_serving_keys().await;
    let fresh = Client::new(config(&[&b.addr])).unwrap();
    let got = fresh.counter_next(&keys[0]).await.unwrap();
    assert_eq!(got.value, 1, "the first answer was taken, not burned");
    assert_eq!(b.state.counter_rpcs.load(Ordering::SeqCst), 1);
    assert_eq!(got.owner.map(|o| o.set_id), Some(1));
}

/// The same through a batch (`counter_batch`, and the coalescer's counter calls, which send batches).
#[tokio::test]
async fn a_fresh_clients_first_counter_batch_takes_the_owners_answer() {
    let (b, keys) = set_1_serving_keys().await;
    let fresh = Client::new(config(&[&b.addr])).unwrap();
    let got = fresh.counter_batch(&[&keys[0], &keys[1]]).await.unwrap();
    let values: Vec<u64> = got.iter().map(|r| r.as_ref().unwrap().value).collect();
    assert_eq!(values, [1, 1], "the first answers were taken, not burned");
    assert_eq!(b.state.counter_rpcs.load(Ordering::SeqCst), 1);
    // Each answer checked against its key's own section: its owner found, and allowed by the map.
    let sets: Vec<Option<u64>> = got
        .iter()
        .map(|r| r.as_ref().unwrap().owner.map(|o| o.set_id))
        .collect();
    assert_eq!(sets, [Some(1), Some(1)], "the owners of the keys' sections");
}
