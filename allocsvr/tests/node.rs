//! Black-box tests of the AllocSvr: a real node in-process on 127.0.0.1:0 against a fake
//! StoreService (tests/common/fake_store.rs).

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{FakeStore, client, fetch, fetch_ok, poll, start, test_params};
use seqsvr_proto::pb;
use seqsvr_proto::pb::alloc_service_client::AllocServiceClient;
use tonic::Code;
use tonic::transport::Channel;

const SECTIONS: u64 = 10;
const SECTION_SIZE: u64 = 10;
const STEP: u64 = 5;
const READY: Duration = Duration::from_secs(5);
/// lease 600 ms, drift 1 %, margin 50 ms: what a gained section waits and what a renewal buys.
const GAIN_WAIT: Duration = Duration::from_millis(656);
const OWNER_VALIDITY: Duration = Duration::from_millis(544);

async fn store(auto_assign: bool) -> FakeStore {
    FakeStore::start(test_params(SECTIONS, SECTION_SIZE, STEP), auto_assign).await
}

/// The first seq of each of `uids`, once the node serves them.
async fn first_seqs(c: &mut AllocServiceClient<Channel>, uids: &[u64]) -> HashMap<u64, u64> {
    let mut first = HashMap::new();
    for &uid in uids {
        first.insert(uid, fetch_ok(c, uid, READY).await);
    }
    first
}

/// A batch is served grouped by section, and a uid whose ceiling is reached mid-batch waits for
/// the bump: still, every occurrence of a uid gets the next seq in request order, across
/// sections interleaved in the request and across step boundaries inside one batch.
#[tokio::test]
async fn a_batch_across_sections_and_step_boundaries_serves_each_uid_in_request_order() {
    let store = store(true).await;
    let node = start(1, &store).await;
    let mut c = client(&node).await;
    let uids = [0u64, 1, 9, 10, 55, 99];
    let mut last = first_seqs(&mut c, &uids).await;
    // uid 0 six times per batch (more than a step of 5), interleaved with other sections.
    let batch = vec![0u64, 55, 0, 99, 1, 0, 9, 0, 55, 0, 10, 0, 99];
    for round in 0..20 {
        let reply = c
            .batch_fetch_next_seq(pb::BatchFetchNextSeqRequest {
                uids: batch.clone(),
                route_version: 0,
            })
            .await
            .unwrap()
            .into_inner();
        assert!(
            reply.outcomes.iter().all(|o| *o == pb::Outcome::Ok as i32),
            "round {round}: {reply:?}"
        );
        for (uid, seq) in batch.iter().zip(&reply.seqs) {
            let prev = last.insert(*uid, *seq).unwrap();
            assert_eq!(*seq, prev + 1, "round {round}: uid {uid}");
            assert!(*seq <= store.max_seq(uid / SECTION_SIZE), "P2: uid {uid} seq {seq}");
        }
        let mut sections: Vec<u64> = reply.owners.iter().map(|o| o.section).collect();
        sections.sort_unstable();
        assert_eq!(sections, vec![0, 1, 5, 9], "one owner per section: {:?}", reply.owners);
    }
}

#[tokio::test]
async fn seqs_per_uid_strictly_increase_across_step_boundaries() {
    let store = store(true).await;
    let node = start(1, &store).await;
    let mut c = client(&node).await;
    let uids = [0u64, 1, 9, 10, 55, 99];
    let mut last = first_seqs(&mut c, &uids).await;
    // Many fetches per uid cross many step boundaries (step 5); every seq is exactly one more
    // than the previous one (P1, P6) and never above the committed ceiling (P2).
    for round in 0..60 {
        for &uid in &uids {
            let seq = fetch_ok(&mut c, uid, READY).await;
            let prev = last.insert(uid, seq).unwrap();
            assert_eq!(seq, prev + 1, "uid {uid} round {round}");
            assert!(seq <= store.max_seq(uid / SECTION_SIZE), "P2: uid {uid} seq {seq}");
        }
    }
    // A batch may repeat a uid: each occurrence gets its own, increasing seq.
    let reply = c
        .batch_fetch_next_seq(pb::BatchFetchNextSeqRequest {
            uids: vec![0, 0, 55, 0],
            route_version: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(reply.outcomes.iter().all(|o| *o == pb::Outcome::Ok as i32), "{reply:?}");
    let s0 = last[&0];
    assert_eq!(reply.seqs, vec![s0 + 1, s0 + 2, last[&55] + 1, s0 + 3]);
    assert_eq!(
        reply.owners.len(),
        2,
        "one owner per served section: {:?}",
        reply.owners
    );
    assert!(reply.routes.is_some(), "route version 0 is older: table embedded");
    // GetCurSeq reads the last seq handed out (P5), or the base for an untouched uid.
    let cur = c
        .get_cur_seq(pb::GetCurSeqRequest {
            uid: 0,
            route_version: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((cur.outcome, cur.cur_seq), (pb::Outcome::Ok as i32, s0 + 3));
    // Bumps are batched and prefetched: far fewer store writes than fetches.
    let bumps = store.with(|s| s.bump_rpcs);
    assert!(bumps <= 6 * 61 / STEP + 2, "{bumps} bump rpcs");
    node.shutdown().await;
}

#[tokio::test]
async fn gained_section_waits_the_lease_unless_released() {
    let store = store(false).await;
    let node = start(1, &store).await;
    let mut c = client(&node).await;
    let inc = store.last_incarnation();
    assert_eq!(fetch(&mut c, 0).await.outcome, pb::Outcome::NotOwner as i32);
    let assigned = Instant::now();
    store.with(|s| {
        s.assign(0, 5, inc, false);
        s.assign(5, 10, inc, true);
    });
    // The released half is served as soon as it is loaded and bumped.
    fetch_ok(&mut c, 50, READY).await;
    let released_served = assigned.elapsed();
    // The other half is not served before the gain wait (t_obs is after `assigned`).
    let waited = {
        fetch_ok(&mut c, 0, READY).await;
        assigned.elapsed()
    };
    assert!(waited >= GAIN_WAIT, "served after {waited:?}, before the gain wait");
    assert!(
        released_served < GAIN_WAIT,
        "released section waited {released_served:?}"
    );
    node.shutdown().await;
}

#[tokio::test]
async fn section_removed_from_grants_answers_not_owner_with_routes() {
    let store = store(true).await;
    let node = start(1, &store).await;
    let mut c = client(&node).await;
    fetch_ok(&mut c, 15, READY).await;
    store.with(|s| s.unassign(1, 2));
    let version = store.with(|s| s.route_version);
    // A bump refused as stale can drop the section before the renewal brings the new table, so
    // poll until the reply carries the new version; every non-OK answer must be NOT_OWNER + routes.
    let routes = poll("section 1 dropped with new routes", READY, || {
        let mut c = c.clone();
        async move {
            let r = fetch(&mut c, 15).await;
            if r.outcome == pb::Outcome::Ok as i32 {
                return None;
            }
            assert_eq!(r.outcome, pb::Outcome::NotOwner as i32, "{r:?}");
            let routes = r.routes.expect("NOT_OWNER embeds the route table");
            (routes.version >= version).then_some(routes)
        }
    })
    .await;
    let routes = seqsvr_proto::Routes::new(routes).unwrap();
    assert_eq!(routes.lookup(seqsvr_proto::Uid(15)).unwrap().incarnation.0, 0);
    // Other sections are still served; a caller with the current version gets no table.
    let r = c
        .fetch_next_seq(pb::FetchNextSeqRequest {
            uid: 25,
            route_version: version,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.outcome, pb::Outcome::Ok as i32);
    assert!(r.routes.is_none());
    let owner = r.owner.unwrap();
    assert_eq!(
        (owner.section, owner.node_id, owner.incarnation),
        (2, 1, store.last_incarnation())
    );
    node.shutdown().await;
}

#[tokio::test]
async fn restart_resumes_above_every_seq_given_before() {
    let store = store(true).await;
    let node = start(1, &store).await;
    let mut c = client(&node).await;
    let mut last: HashMap<u64, u64> = HashMap::new();
    for i in 0..40 {
        let uid = (i * 7) % (SECTIONS * SECTION_SIZE);
        last.insert(uid, fetch_ok(&mut c, uid, READY).await);
    }
    let first_incarnation = node.incarnation();
    node.shutdown().await;
    assert!(
        store.with(|s| s.sections.iter().all(|x| x.owner == 0)),
        "shutdown releases"
    );

    let node = start(1, &store).await;
    assert_ne!(node.incarnation(), first_incarnation);
    let mut c = client(&node).await;
    for (&uid, &before) in &last {
        let seq = fetch_ok(&mut c, uid, READY).await;
        assert!(seq > before, "uid {uid}: {seq} after restart, {before} before");
    }
    node.shutdown().await;
}

#[tokio::test]
async fn lost_bump_reply_is_retried_with_the_same_new_max() {
    let store = store(true).await;
    let node = start(1, &store).await;
    let mut c = client(&node).await;
    fetch_ok(&mut c, 3, READY).await;
    store.with(|s| s.lose_bump_replies = 2);
    let mut prev = 0;
    for _ in 0..(3 * STEP) {
        let seq = fetch_ok(&mut c, 3, READY).await;
        assert!(seq > prev);
        assert!(seq <= store.max_seq(0), "P2: {seq} above the committed ceiling");
        prev = seq;
    }
    let log: Vec<u64> = store.with(|s| s.bump_log.iter().filter(|b| b.0 == 0).map(|b| b.2).collect());
    let repeated = log.windows(2).filter(|w| w[0] == w[1]).count();
    assert!(repeated >= 2, "lost replies were retried unchanged: {log:?}");
    assert!(log.windows(2).all(|w| w[0] <= w[1]), "{log:?}");
    node.shutdown().await;
}

#[tokio::test]
async fn invalid_requests_get_invalid_argument() {
    let store = store(true).await;
    let node = start(1, &store).await;
    let mut c = client(&node).await;
    let limit = SECTIONS * SECTION_SIZE;
    let err = c
        .fetch_next_seq(pb::FetchNextSeqRequest {
            uid: limit,
            route_version: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("outside"), "{}", err.message());
    let err = c
        .get_cur_seq(pb::GetCurSeqRequest {
            uid: u64::MAX,
            route_version: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let batches: [(Vec<u64>, &str); 3] = [
        (vec![], "1..=1000"),
        (vec![1; 1_001], "1..=1000"),
        (vec![1, 2, limit], "uids[2]"),
    ];
    for (uids, message) in batches {
        let n = uids.len();
        let err = c
            .batch_fetch_next_seq(pb::BatchFetchNextSeqRequest { uids, route_version: 0 })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "batch of {n}");
        assert!(err.message().contains(message), "{}", err.message());
    }
    node.shutdown().await;
}

#[tokio::test]
async fn renewal_failure_stops_serving_once_the_lease_runs_out() {
    let store = store(true).await;
    let node = start(1, &store).await;
    let mut c = client(&node).await;
    let before = fetch_ok(&mut c, 42, READY).await;
    store.with(|s| s.unavailable = true);
    let cut = Instant::now();
    // No renewal sent after `cut` is confirmed, so the lease ends before cut + OWNER_VALIDITY.
    tokio::time::sleep_until((cut + OWNER_VALIDITY).into()).await;
    for uid in [42, 0, 99] {
        let r = fetch(&mut c, uid).await;
        assert_ne!(
            r.outcome,
            pb::Outcome::Ok as i32,
            "uid {uid} served after the lease ran out: {r:?}"
        );
    }
    poll("memory dropped", READY, || async {
        (node.sections_held() == 0).then_some(())
    })
    .await;
    // Renewals succeed again: sections are regained through the normal path, above the old seqs.
    store.with(|s| s.unavailable = false);
    let after = fetch_ok(&mut c, 42, READY).await;
    assert!(after > before, "{after} after regain, {before} before");
    node.shutdown().await;
}

#[tokio::test]
async fn handover_stops_serving_and_releases() {
    let store = store(true).await;
    let node = start(1, &store).await;
    let mut c = client(&node).await;
    fetch_ok(&mut c, 20, READY).await;
    store.with(|s| s.handover = vec![pb::SectionRange { begin: 2, end: 4 }]);
    poll("sections 2..4 released", READY, || async {
        store.with(|s| (s.sections[2].owner == 0 && s.sections[3].owner == 0).then_some(()))
    })
    .await;
    assert_ne!(fetch(&mut c, 20).await.outcome, pb::Outcome::Ok as i32);
    assert_ne!(fetch(&mut c, 39).await.outcome, pb::Outcome::Ok as i32);
    assert_eq!(
        fetch(&mut c, 40).await.outcome,
        pb::Outcome::Ok as i32,
        "other sections still served"
    );
    node.shutdown().await;
}

#[tokio::test]
async fn unknown_incarnation_drops_everything_and_registers_again() {
    let store = store(true).await;
    let node = start(1, &store).await;
    let mut c = client(&node).await;
    let before = fetch_ok(&mut c, 77, READY).await;
    let old = node.incarnation();
    // The store declares the incarnation dead and gives its sections to nobody; the node must
    // re-register (a new incarnation, auto-assigned the unowned sections) and reload.
    store.with(|s| {
        s.nodes.remove(&old.0);
        s.unassign(0, SECTIONS);
    });
    poll("registered again", READY, || async {
        (node.incarnation() != old).then_some(())
    })
    .await;
    let after = fetch_ok(&mut c, 77, READY).await;
    assert!(after > before, "{after} after re-registration, {before} before");
    let owner = fetch(&mut c, 77).await.owner.unwrap();
    assert_eq!(owner.incarnation, node.incarnation().0);
    node.shutdown().await;
}

#[tokio::test]
async fn a_bump_reply_without_the_epoch_is_not_an_acknowledgement() {
    let store = store(true).await;
    let node = start(1, &store).await;
    let mut c = client(&node).await;
    fetch_ok(&mut c, 3, READY).await;
    // From now on every bump is answered APPLIED with epoch 0 and not applied.
    store.with(|s| s.zero_epoch_bump_replies = true);
    for _ in 0..(3 * STEP) {
        let r = fetch(&mut c, 3).await;
        if r.outcome == pb::Outcome::Ok as i32 {
            assert!(
                r.seq <= store.max_seq(0),
                "P2: seq {} served above the committed ceiling {}",
                r.seq,
                store.max_seq(0)
            );
        }
    }
    node.shutdown().await;
}

#[tokio::test]
async fn a_handover_release_names_only_the_sections_dropped() {
    let store = store(true).await;
    let node = start(1, &store).await;
    let mut c = client(&node).await;
    fetch_ok(&mut c, 20, READY).await;
    // Sections 5..10 go to another owner while the arbiter asks for 0..10 to be handed over:
    // the node drops 0..5 and must release exactly those, under the epochs it held them in.
    store.with(|s| {
        s.nodes.insert(99, (2, "127.0.0.1:9".into()));
        s.assign(5, 10, 99, false);
        s.handover = vec![pb::SectionRange { begin: 0, end: 10 }];
    });
    poll("sections 0..5 released", READY, || async {
        store.with(|s| (0..5).all(|i| s.sections[i].owner == 0).then_some(()))
    })
    .await;
    let named: Vec<u64> = store.with(|s| {
        s.release_log
            .iter()
            .flat_map(|r| r.sections.iter().flat_map(|x| x.begin..x.end))
            .collect()
    });
    assert_eq!(
        named,
        (0..5).collect::<Vec<u64>>(),
        "the Release named sections it did not hold"
    );
    assert!(
        store.with(|s| (5..10).all(|i| s.sections[i].owner == 99)),
        "the other owner kept its sections"
    );
    node.shutdown().await;
}

#[tokio::test]
async fn a_section_handed_over_before_it_was_taken_is_still_released() {
    let store = store(true).await;
    let node = start(1, &store).await;
    let mut c = client(&node).await;
    fetch_ok(&mut c, 95, READY).await;
    // Section 9 is granted again under a new epoch and, in the same renewal, asked back: the
    // node never takes the new grant, and must still release it or nobody else ever gets it.
    let inc = node.incarnation().0;
    store.with(|s| {
        s.assign(9, 10, inc, true);
        s.handover = vec![pb::SectionRange { begin: 9, end: 10 }];
    });
    poll("section 9 released", READY, || async {
        store.with(|s| (s.sections[9].owner == 0).then_some(()))
    })
    .await;
    node.shutdown().await;
}

#[tokio::test]
async fn reflection_lists_exactly_the_data_plane_and_ledgers_in_v1_and_v1alpha() {
    let store = store(true).await;
    let node = start(1, &store).await;
    let addr = node.local_addr().to_string();
    let (v1, v1alpha) = seqsvr_harness::reflection::listed_services(&addr).await.unwrap();
    let expected = [
        "grpc.health.v1.Health",
        "seqsvr.v1.AllocService",
        "seqsvr.v1.LedgerService",
    ];
    assert_eq!(v1, expected);
    assert_eq!(v1alpha, expected);
    // Health says both are served.
    let mut health = tonic_health::pb::health_client::HealthClient::new(
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    for service in expected.into_iter().skip(1) {
        let req = tonic_health::pb::HealthCheckRequest {
            service: service.into(),
        };
        let status = health.check(req).await.unwrap().into_inner().status;
        assert_eq!(
            status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
            "{service}"
        );
    }
}

/// The data plane hands the cluster map (learned from renewals) to a caller whose
/// `seqsvr-map-version` header is older, and nothing to one that is up to date or sends none.
#[tokio::test]
async fn a_stale_caller_gets_the_map_in_the_reply_and_an_up_to_date_one_does_not() {
    let store = store(true).await;
    let map = |version| pb::ClusterMap {
        version,
        sets: vec![pb::SetInfo {
            set_id: 0,
            stores: vec!["127.0.0.1:1".into()],
            allocsvrs: vec!["127.0.0.1:2".into()],
        }],
        section_size: SECTION_SIZE,
        uid_limit: SECTIONS * SECTION_SIZE,
        ..Default::default()
    };
    store.with(|s| s.map = Some(map(3)));
    let node = start(1, &store).await;
    let mut c = client(&node).await;
    fetch_ok(&mut c, 5, READY).await;
    let with_header = |version: Option<u64>| {
        let mut req = tonic::Request::new(pb::FetchNextSeqRequest {
            uid: 5,
            route_version: 0,
        });
        if let Some(v) = version {
            seqsvr_proto::map_header::write(req.metadata_mut(), v);
        }
        req
    };
    let stale = poll("the node to learn map v3", READY, || {
        let mut c = c.clone();
        async move {
            let r = c.fetch_next_seq(with_header(Some(0))).await.unwrap().into_inner();
            (r.map_version == 3).then_some(r)
        }
    })
    .await;
    assert_eq!(stale.map, Some(map(3)), "a caller at version 0 gets the map");
    for (header, what) in [(Some(3), "up to date"), (Some(9), "ahead"), (None, "not tracking")] {
        let r = c.fetch_next_seq(with_header(header)).await.unwrap().into_inner();
        assert_eq!((r.outcome, r.map_version), (pb::Outcome::Ok as i32, 3), "{what}");
        assert_eq!(r.map, None, "{what}: no map in the reply");
    }
    let mut get = tonic::Request::new(pb::GetCurSeqRequest {
        uid: 5,
        route_version: 0,
    });
    seqsvr_proto::map_header::write(get.metadata_mut(), 2);
    assert_eq!(c.get_cur_seq(get).await.unwrap().into_inner().map, Some(map(3)));
    let mut batch = tonic::Request::new(pb::BatchFetchNextSeqRequest {
        uids: vec![5],
        route_version: 0,
    });
    seqsvr_proto::map_header::write(batch.metadata_mut(), 3);
    let b = c.batch_fetch_next_seq(batch).await.unwrap().into_inner();
    assert_eq!((b.map_version, b.map), (3, None));
    // A newer map reaches the node with the next renewals; an older one never replaces it.
    store.with(|s| s.map = Some(map(4)));
    poll("map v4", READY, || {
        let mut c = c.clone();
        async move {
            (c.fetch_next_seq(with_header(Some(3)))
                .await
                .unwrap()
                .into_inner()
                .map_version
                == 4)
                .then_some(())
        }
    })
    .await;
    node.shutdown().await;
}

/// A `BatchGet` item's answer: (outcome, value, owner's section and incarnation).
type Read = (i32, u64, Option<(u64, u64)>);

fn read_of(outcome: i32, value: u64, owner: Option<pb::Owner>) -> Read {
    (outcome, value, owner.map(|o| (o.section, o.incarnation)))
}

/// BatchGet reads uids and keys together, each as its single read (GetCurSeq, CounterGet)
/// answers it: the ones it owns from memory, NOT_OWNER — with the route table — for a section it
/// no longer holds, and nothing is taken.
#[tokio::test]
async fn batch_get_answers_each_item_as_its_single_read_does() {
    let store = store(true).await;
    let node = start(1, &store).await;
    let mut c = client(&node).await;
    let limit = SECTIONS * SECTION_SIZE;
    let section_of = |key: &str| seqsvr_proto::keys::position(key, limit).0 / SECTION_SIZE;
    // A key in a section the node keeps, one in the section it will lose.
    let kept = (0..).map(|i| format!("kept-{i}")).find(|k| section_of(k) != 1).unwrap();
    let lost = (0..).map(|i| format!("lost-{i}")).find(|k| section_of(k) == 1).unwrap();
    fetch_ok(&mut c, 5, READY).await;
    fetch_ok(&mut c, 5, READY).await;
    fetch_ok(&mut c, 15, READY).await;
    for key in [&kept, &lost] {
        poll("a key's first value", READY, || {
            let mut c = c.clone();
            let req = pb::CounterRequest {
                key: key.as_bytes().to_vec(),
                count: 0,
                route_version: 0,
            };
            async move {
                let r = c.counter_next(req).await.unwrap().into_inner();
                (r.outcome == pb::Outcome::Ok as i32).then_some(())
            }
        })
        .await;
    }
    store.with(|s| s.unassign(1, 2));
    poll("section 1 dropped", READY, || {
        let mut c = c.clone();
        async move {
            let r = c
                .get_cur_seq(pb::GetCurSeqRequest {
                    uid: 15,
                    route_version: 0,
                })
                .await
                .unwrap()
                .into_inner();
            (r.outcome == pb::Outcome::NotOwner as i32).then_some(())
        }
    })
    .await;
    let uids = vec![5, 15, 7, 5, 99];
    let keys = vec![kept.clone(), lost.clone(), "never-used".to_string()];
    let reply = c
        .batch_get(pb::BatchGetRequest {
            uids: uids.clone(),
            keys: keys.iter().map(|k| k.as_bytes().to_vec()).collect(),
            route_version: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let mut single = Vec::new();
    for &uid in &uids {
        let r = c
            .get_cur_seq(pb::GetCurSeqRequest { uid, route_version: 0 })
            .await
            .unwrap()
            .into_inner();
        single.push(read_of(r.outcome, r.cur_seq, r.owner));
    }
    for key in &keys {
        let r = c
            .counter_get(pb::CounterRequest {
                key: key.as_bytes().to_vec(),
                count: 0,
                route_version: 0,
            })
            .await
            .unwrap()
            .into_inner();
        single.push(read_of(r.outcome, r.value, r.owner));
    }
    assert_eq!(
        (reply.outcomes.len(), reply.values.len()),
        (8, 8),
        "one answer per item: {reply:?}"
    );
    let owner_of = |i: usize| -> Option<(u64, u64)> {
        let section = if i < uids.len() {
            uids[i] / SECTION_SIZE
        } else {
            section_of(&keys[i - uids.len()])
        };
        (reply.outcomes[i] == pb::Outcome::Ok as i32).then(|| {
            let o = reply.owners.iter().find(|o| o.section == section).expect("owner named");
            (o.section, o.incarnation)
        })
    };
    let batched: Vec<Read> = (0..8)
        .map(|i| (reply.outcomes[i], reply.values[i], owner_of(i)))
        .collect();
    assert_eq!(batched, single, "each item as its single read answers it");
    let ok = pb::Outcome::Ok as i32;
    let not_owner = pb::Outcome::NotOwner as i32;
    let outcomes: Vec<i32> = batched.iter().map(|r| r.0).collect();
    assert_eq!(outcomes, [ok, not_owner, ok, ok, ok, ok, not_owner, ok]);
    assert_eq!(
        (batched[0].1, batched[3].1, batched[4].1),
        (2, 2, 0),
        "uid 5 twice, 99 never used"
    );
    assert_eq!(
        (batched[5].1, batched[7].1),
        (1, 0),
        "a key's last value, 0 for one never used"
    );
    let routes = reply.routes.expect("a NOT_OWNER item brings the route table");
    let routes = seqsvr_proto::Routes::new(routes).unwrap();
    assert_eq!(routes.lookup(seqsvr_proto::Uid(15)).unwrap().incarnation.0, 0);
    // A read takes nothing: the next fetch of uid 5 is the third.
    assert_eq!(fetch_ok(&mut c, 5, READY).await, 3);
    node.shutdown().await;
}

/// A BatchGet with a bad item is refused as a whole, naming the item; so is one of no items or
/// of more than 1,000 (uids and keys counted together).
#[tokio::test]
async fn batch_get_refuses_a_bad_uid_or_key_naming_it() {
    let store = store(true).await;
    let node = start(1, &store).await;
    let mut c = client(&node).await;
    let limit = SECTIONS * SECTION_SIZE;
    let key = |k: &str| k.as_bytes().to_vec();
    // (uids, keys, what the refusal names)
    type Case = (Vec<u64>, Vec<Vec<u8>>, &'static str);
    let cases: [Case; 6] = [
        (vec![], vec![], "1..=1000"),
        (vec![1; 500], vec![key("k"); 501], "1..=1000"),
        (vec![1, limit], vec![], "uids[1]"),
        (vec![1], vec![key("ok"), key("")], "keys[1]"),
        (vec![], vec![vec![0xff, 0xfe]], "keys[0]"),
        (vec![], vec![vec![b'x'; 257]], "keys[0]"),
    ];
    for (uids, keys, message) in cases {
        let what = format!("{} uids, {} keys", uids.len(), keys.len());
        let err = c
            .batch_get(pb::BatchGetRequest {
                uids,
                keys,
                route_version: 0,
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{what}: {err:?}");
        assert!(err.message().contains(message), "{what}: {}", err.message());
    }
    // 1,000 items in all is within the limit.
    let reply = c
        .batch_get(pb::BatchGetRequest {
            uids: vec![1; 500],
            keys: vec![key("k"); 500],
            route_version: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.outcomes.len(), 1_000);
    node.shutdown().await;
}
