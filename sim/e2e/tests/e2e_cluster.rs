//! End-to-end tests of the whole serving path: 3 real `storesvr` processes (one Raft group) and 2
//! real `allocsvr` processes on loopback, driven through the real client library and `seqctl`.
//!
//! What they prove, each able to fail:
//! - P1 across an AllocSvr SIGKILL and restart, a StoreSvr leader SIGKILL and a full cluster
//!   restart (every seq of every tracked uid strictly above the last one);
//! - takeover of a dead AllocSvr's sections within lease + detection (and not before the old
//!   lease could have run out: P4's wait), and a graceful SIGTERM handover without a lease wait;
//! - one retry corrects a client's stale route table; bad input gets INVALID_ARGUMENT;
//! - a StoreSvr leader change under load costs no fetch;
//! - `seqctl status --json` shows the cluster as it is.
//!
//! Measured times are printed (`cargo test -- --nocapture` shows them). Needs the `storesvr` and
//! `seqctl` binaries: run `cargo build --workspace --bins` first.
//!
//! Deliberately left out: network partitions and pauses (the simulator's job) and throughput
//! figures (the benchmarks' job: a timed test would be flaky on a shared 2-core machine).

mod e2e;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use e2e::seqctl::{Seqctl, text};
use e2e::{Cluster, LEASE, Role, SECTION_SIZE, SECTIONS, STEP, Tracker, UID_LIMIT, poll, spread_uids};
use seqsvr_client::{Client, ClientError, FailureKind, MAX_UIDS_PER_CALL};
use seqsvr_proto::pb::alloc_service_client::AllocServiceClient;
use seqsvr_proto::{NodeId, Uid, pb};
use tokio::time::Instant;
use tonic::transport::Channel;

/// Tests whose timing must not share the machine with another cluster (the SIGTERM handover's
/// bound, the load test's CPU) take this exclusively; the others share it and run side by side.
static QUIET: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// Start-up of a fresh cluster: bootstrap, election, registration, assignment, load and bump.
const START_WITHIN: Duration = Duration::from_secs(30);

async fn started_cluster() -> Cluster {
    let c = Cluster::start();
    let took = c.wait_settled(START_WITHIN).await;
    eprintln!("cluster serving {took:?} after start");
    c
}

/// One raw FetchNextSeq; the seq when the node answered OK.
async fn raw_fetch(mut c: AllocServiceClient<Channel>, uid: Uid) -> Option<u64> {
    let mut req = tonic::Request::new(pb::FetchNextSeqRequest {
        uid: uid.0,
        route_version: 0,
    });
    req.set_timeout(Duration::from_secs(1));
    let reply = c.fetch_next_seq(req).await.ok()?.into_inner();
    (reply.outcome == pb::Outcome::Ok as i32).then_some(reply.seq)
}

/// A uid that AllocSvr `node` currently serves (per the store's route table), with the seq a
/// fetch through `client` returned from it.
async fn uid_served_by(c: &Cluster, client: &Client, node: u64) -> (Uid, u64) {
    poll("a uid served by the wanted node", Duration::from_secs(10), || async {
        let routes = c.store_routes().await?;
        let entry = routes.entries.iter().find(|e| e.node_id == node)?;
        let uid = Uid(entry.section_begin * SECTION_SIZE + 17);
        let f = client.fetch_next_seq(uid).await.ok()?;
        (f.owner.map(|o| o.node_id) == Some(NodeId(node))).then_some((uid, f.seq))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seqs_increase_across_allocsvr_restart_store_leader_kill_and_full_restart() {
    let _quiet = QUIET.read().await;
    let mut c = started_cluster().await;
    let uids = spread_uids(15);
    assert!(uids.len() >= 300, "{} uids", uids.len());
    let client = c.client().await;
    let mut seen = Tracker::default();
    for _ in 0..3 {
        seen.fetch_each_once(&client, &uids, Duration::from_secs(10)).await;
    }

    c.kill(Role::Alloc, 1);
    c.start_alloc(1);
    let took = seen.fetch_each_once(&client, &uids, Duration::from_secs(20)).await;
    eprintln!("after SIGKILL + restart of allocsvr 1: every uid served again within {took:?}");
    seen.fetch_each_once(&client, &uids, Duration::from_secs(10)).await;

    let leader = c.wait_store_leader(Duration::from_secs(10)).await;
    let before = c.store_status_of(leader).await.expect("leader status");
    c.kill(Role::Store, leader);
    let killed = Instant::now();
    let took = seen.fetch_each_once(&client, &uids, Duration::from_secs(15)).await;
    eprintln!("after SIGKILL of storesvr leader {leader}: every uid served within {took:?}");
    // Push every section past its ceiling: the owners must bump through the new leader.
    for s in 0..SECTIONS {
        seen.fetch_hot(&client, Uid(s * SECTION_SIZE + 1), 2 * STEP as usize)
            .await;
    }
    let new_leader = c.wait_store_leader(Duration::from_secs(10)).await;
    let after = c.store_status_of(new_leader).await.expect("new leader status");
    eprintln!(
        "{} seqs of one uid per section after the kill in {:?}; max_seq_sum {} -> {} (new leader {new_leader})",
        2 * STEP,
        killed.elapsed(),
        before.max_seq_sum,
        after.max_seq_sum
    );
    assert!(
        after.max_seq_sum >= before.max_seq_sum + SECTIONS * STEP,
        "every section was bumped through the new leader"
    );
    c.start_store(leader);
    seen.fetch_each_once(&client, &uids, Duration::from_secs(10)).await;

    c.kill_all();
    let restarted = Instant::now();
    c.start_all();
    let took = seen.fetch_each_once(&client, &uids, Duration::from_secs(30)).await;
    eprintln!("after a full restart of all 5 processes: every uid served within {took:?}");
    assert!(restarted.elapsed() >= took);
    seen.fetch_each_once(&client, &uids, Duration::from_secs(10)).await;
    // 3 + 2 + 2 + 2 rounds, each serving every uid exactly once, and the hot fetches.
    assert_eq!(seen.served, 9 * uids.len() as u64 + 2 * SECTIONS * STEP);
}

/// SIGKILLs allocsvr 1 and polls allocsvr 2 until it serves `uid`: the seq, how long after the
/// kill, and the bound it had (lease + detection + 3 s).
async fn kill_1_until_2_serves(c: &mut Cluster, uid: Uid) -> (u64, Duration, Duration) {
    let other = c.alloc_rpc(2);
    c.kill(Role::Alloc, 1);
    let killed = Instant::now();
    let limit = LEASE + e2e::DETECT + Duration::from_secs(3);
    let seq = poll("allocsvr 2 serves the dead node's uid", limit, || {
        raw_fetch(other.clone(), uid)
    })
    .await;
    (seq, killed.elapsed(), limit)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_allocsvr_sections_are_served_by_the_other_within_lease_plus_detection() {
    let _quiet = QUIET.read().await;
    let mut c = started_cluster().await;
    let client = c.client().await;
    let (uid, before) = uid_served_by(&c, &client, 1).await;
    let (seq, took, limit) = kill_1_until_2_serves(&mut c, uid).await;
    eprintln!("SIGKILL of allocsvr 1 -> allocsvr 2 serves {uid}: {took:?} (lease {LEASE:?}, limit {limit:?})");
    assert!(seq > before, "{uid}: {seq} after {before}");
    // The new owner may serve only once the old owner's lease has certainly run out (rule 4, P4).
    // The old owner renewed at most one renew interval (500 ms) before it died, so its lease ran
    // to at least kill - 500 ms + lease * (1 - 1 %) - margin (100 ms).
    let old_lease_floor = LEASE.mul_f64(0.99) - Duration::from_millis(600);
    assert!(
        took >= old_lease_floor,
        "served {took:?} after the kill, before the old lease ({old_lease_floor:?}) ran out"
    );
    assert!(took <= limit, "took {took:?}, limit {limit:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_follows_a_killed_owners_sections_to_the_new_owner() {
    let _quiet = QUIET.read().await;
    let mut c = started_cluster().await;
    let client = c.client().await;
    let (uid, before) = uid_served_by(&c, &client, 1).await;
    let (seq, _, _) = kill_1_until_2_serves(&mut c, uid).await;
    assert!(seq > before);
    // The client's table still names the dead node; the call must still reach the new owner.
    let f = client.fetch_next_seq(uid).await.expect("the client follows the move");
    assert!(f.seq > seq);
    assert_eq!(f.owner.map(|o| o.node_id), Some(NodeId(2)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hands_sections_over_without_a_lease_wait() {
    let _quiet = QUIET.write().await;
    let mut c = started_cluster().await;
    let client = c.client().await;
    let (uid, before) = uid_served_by(&c, &client, 1).await;
    let other = c.alloc_rpc(2);

    c.sigterm(Role::Alloc, 1);
    let termed = Instant::now();
    let seq = poll("allocsvr 2 serves the leaving node's uid", LEASE * 2, || {
        raw_fetch(other.clone(), uid)
    })
    .await;
    let took = termed.elapsed();
    eprintln!("SIGTERM of allocsvr 1 -> allocsvr 2 serves {uid}: {took:?} (lease {LEASE:?})");
    assert!(seq > before, "{uid}: {seq} after {before}");
    assert!(
        took < LEASE / 2,
        "handover took {took:?}: the release did not spare the lease wait"
    );
    let status = c.wait_exit(Role::Alloc, 1, Duration::from_secs(10)).await;
    assert!(status.success(), "allocsvr 1 exited with {status:?} after SIGTERM");
}

/// `seqctl alloc drain 1` hands node 1's sections to node 2 by planned handover: node 2 serves
/// them well within a lease, node 1 can then be killed with nothing to wait for, and a drain that
/// would leave the set without a live AllocSvr, or names an unknown node, is refused (exit 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seqctl_alloc_drain_hands_a_nodes_sections_over_without_a_lease_wait() {
    let _quiet = QUIET.write().await;
    let mut c = started_cluster().await;
    let client = c.client().await;
    let (uid, before) = uid_served_by(&c, &client, 1).await;
    let seqctl = Seqctl::new(["--store", c.store_seeds_flag().as_str()]);
    let started = Instant::now();
    let out = seqctl.output(&["alloc", "drain", "1"]).await;
    let took = started.elapsed();
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    eprintln!("drain of allocsvr 1: {took:?}: {said}");
    assert!(took < LEASE, "drain took {took:?}: a lease wait crept in");
    let seq = poll("allocsvr 2 serves the drained node's uid", LEASE, || {
        raw_fetch(c.alloc_rpc(2), uid)
    })
    .await;
    assert!(seq > before, "{uid}: {seq} after {before}");
    c.kill(Role::Alloc, 1);
    let again = raw_fetch(c.alloc_rpc(2), uid)
        .await
        .expect("served right after the drained node died");
    assert!(again > seq);
    for (node, says) in [("2", "no other live AllocSvr"), ("9", "not registered")] {
        let out = seqctl.output(&["alloc", "drain", node]).await;
        assert_eq!(out.status.code(), Some(2), "drain {node}: {:?}", out);
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(says),
            "drain {node}: {:?}",
            out
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_route_table_is_corrected_in_one_retry() {
    let _quiet = QUIET.read().await;
    let mut c = started_cluster().await;
    // Move every section to allocsvr 2 and take a client's table while it says so.
    c.sigterm(Role::Alloc, 1);
    c.wait_exit(Role::Alloc, 1, Duration::from_secs(10)).await;
    c.wait_settled(Duration::from_secs(10)).await;
    let stale = poll(
        "a client whose table names only allocsvr 2",
        Duration::from_secs(5),
        || async {
            let client = c.client().await;
            let routes = client.routes().table(0)?;
            routes.entries().iter().all(|e| e.node_id == 2).then_some(client)
        },
    )
    .await;
    let stale_version = stale.routes().table(0).unwrap().version();

    // allocsvr 1 comes back; the arbiter hands it its share with planned moves.
    c.start_alloc(1);
    let (uid, version) = poll(
        "allocsvr 1 serving its share, both nodes on the new table",
        Duration::from_secs(20),
        || async {
            let routes = c.store_routes().await?;
            let mine: Vec<_> = routes.entries.iter().filter(|e| e.node_id == 1).collect();
            if mine.is_empty() || routes.entries.iter().any(|e| e.incarnation == 0) {
                return None;
            }
            let uid = Uid(mine[0].section_begin * SECTION_SIZE + 5);
            for node in [1, 2] {
                let mut req = tonic::Request::new(pb::GetCurSeqRequest {
                    uid: uid.0,
                    route_version: 0,
                });
                req.set_timeout(Duration::from_secs(1));
                let reply = c.alloc_rpc(node).get_cur_seq(req).await.ok()?.into_inner();
                let expected = if node == 1 {
                    pb::Outcome::Ok
                } else {
                    pb::Outcome::NotOwner
                };
                if reply.outcome != expected as i32 || reply.route_version != routes.version {
                    return None;
                }
            }
            Some((uid, routes.version))
        },
    )
    .await;
    assert!(version > stale_version);

    let before = counters(&c).await;
    let f = stale.fetch_next_seq(uid).await.expect("the stale client is corrected");
    let after = counters(&c).await;
    let delta: Vec<u64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
    eprintln!(
        "stale client (table v{stale_version}, current v{version}) fetching {uid}: [ok1, not_owner1, ok2, not_owner2] += {delta:?}"
    );
    assert_eq!(f.owner.map(|o| o.node_id), Some(NodeId(1)));
    assert_eq!(
        delta,
        [1, 0, 0, 1],
        "expected one NOT_OWNER from allocsvr 2, then one OK from allocsvr 1"
    );
    assert_eq!(
        stale.routes().table(0).unwrap().version(),
        version,
        "the client installed the table from the reply"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_invalid_argument_from_the_server_and_a_clear_error_from_the_library() {
    let _quiet = QUIET.read().await;
    let c = started_cluster().await;
    let mut raw = c.alloc_rpc(1);
    for uid in [UID_LIMIT, UID_LIMIT + 1, u64::MAX] {
        let err = raw
            .fetch_next_seq(pb::FetchNextSeqRequest { uid, route_version: 0 })
            .await
            .expect_err("uid outside the space");
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "fetch {uid}: {err}");
        assert!(err.message().contains(&uid.to_string()), "fetch {uid}: {err}");
        let err = raw
            .get_cur_seq(pb::GetCurSeqRequest { uid, route_version: 0 })
            .await
            .expect_err("uid outside the space");
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "get {uid}: {err}");
    }
    let batches: [(&str, Vec<u64>); 3] = [
        ("empty", vec![]),
        ("1,001 uids", (0..1_001).collect()),
        ("one bad uid", vec![1, 2, UID_LIMIT, 3]),
    ];
    for (what, uids) in batches {
        let err = raw
            .batch_fetch_next_seq(pb::BatchFetchNextSeqRequest { uids, route_version: 0 })
            .await
            .expect_err(what);
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{what}: {err}");
    }
    // Control: the limit is exactly 1,000.
    let ok = raw
        .batch_fetch_next_seq(pb::BatchFetchNextSeqRequest {
            uids: (0..1_000).collect(),
            route_version: 0,
        })
        .await
        .expect("a batch of 1,000 is accepted")
        .into_inner();
    assert_eq!(ok.outcomes.len(), 1_000);

    // The library: with a learned table it refuses before sending; without one the server's
    // INVALID_ARGUMENT comes through. Either way a Failed(InvalidArgument) naming the uid.
    let learned = c.client().await;
    let fresh = Client::new(c.client_config()).unwrap();
    for (which, client) in [("learned", &learned), ("fresh", &fresh)] {
        for err in [
            client.fetch_next_seq(Uid(UID_LIMIT)).await.map(|_| ()).unwrap_err(),
            client.get_cur_seq(Uid(u64::MAX)).await.map(|_| ()).unwrap_err(),
            client.batch_fetch(&[Uid(UID_LIMIT)]).await.map(|_| ()).unwrap_err(),
        ] {
            assert_eq!(err.failure_kind(), Some(FailureKind::InvalidArgument), "{which}: {err}");
            assert!(err.to_string().contains("outside"), "{which}: {err}");
        }
    }
    // With a table, one bad uid refuses the whole batch before anything is sent. (Without one,
    // the uids go to different seeds and the good ones are served: an Unknown, partly taken.)
    let err = learned.batch_fetch(&[Uid(1), Uid(UID_LIMIT)]).await.unwrap_err();
    assert_eq!(err.failure_kind(), Some(FailureKind::InvalidArgument), "{err}");
    let too_many = vec![Uid(1); MAX_UIDS_PER_CALL + 1];
    let err = learned.batch_fetch(&too_many).await.unwrap_err();
    assert_eq!(err.failure_kind(), Some(FailureKind::InvalidArgument), "{err}");
    // An empty batch needs no server: it is answered with nothing, not an error.
    assert_eq!(learned.batch_fetch(&[]).await, Ok(vec![]));
    // 1,001 uids are fine for the library: it splits them into RPCs of at most 1,000.
    let many: Vec<Uid> = (0..1_001).map(|i| Uid(i * 1_993)).collect();
    let got = learned
        .batch_fetch(&many)
        .await
        .expect("the library splits big batches");
    assert_eq!(got.len(), 1_001);
    assert!(got.iter().zip(&many).all(|(f, u)| f.uid == *u && f.seq > 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_of_a_uid_repeated_across_rpcs_gets_increasing_seqs_in_request_order() {
    let _quiet = QUIET.read().await;
    let c = started_cluster().await;
    let client = c.client().await;
    // The documented promise of batch_fetch: "a uid listed twice gets two increasing seqs".
    let got = client.batch_fetch(&vec![Uid(7); 2_000]).await.expect("batch fetch");
    let out_of_order = got.windows(2).filter(|w| w[1].seq <= w[0].seq).count();
    assert_eq!(
        out_of_order,
        0,
        "first seqs: {:?}",
        got.iter().take(3).map(|f| f.seq).collect::<Vec<_>>()
    );
}

/// Occurrences of one uid within one batch call are concurrent requests: each gets its own seq,
/// all distinct and above what the uid had before, in no promised order (P1 orders calls, and a
/// NOT_READY occurrence may be retried after later ones were served).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_of_a_repeated_uid_from_a_client_without_a_table_gets_distinct_seqs() {
    let _quiet = QUIET.read().await;
    let c = started_cluster().await;
    let fresh = Client::new(c.client_config()).unwrap();
    let before = fresh.fetch_next_seq(Uid(7)).await.expect("fetch").seq;
    let got = fresh.batch_fetch(&[Uid(7); 4]).await.expect("batch fetch");
    let mut seqs: Vec<u64> = got.iter().map(|f| f.seq).collect();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), 4, "repeated seqs in one call: {got:?}");
    assert!(
        seqs[0] > before,
        "a seq of the call is not above the earlier fetch {before}: {seqs:?}"
    );
}

/// `allocsvr_fetch_total` of [ok, not_owner] on allocsvr 1, then on allocsvr 2.
async fn counters(c: &Cluster) -> [u64; 4] {
    [
        c.fetch_counter(1, "ok").await,
        c.fetch_counter(1, "not_owner").await,
        c.fetch_counter(2, "ok").await,
        c.fetch_counter(2, "not_owner").await,
    ]
}

/// What one load task saw.
#[derive(Default)]
struct LoadReport {
    ok: u64,
    ok_after_kill: u64,
    errors: Vec<ClientError>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_leader_kill_under_load_fails_no_fetch() {
    let _quiet = QUIET.write().await;
    const TASKS: u64 = 8;
    const RUN: Duration = Duration::from_secs(5);
    const MAX_CALLS_PER_TASK: u64 = 200_000;
    /// Copies of the hot uid in each batch call: makes bumps frequent, so some span the kill.
    const HOT_COPIES: usize = 200;

    let mut c = started_cluster().await;
    let client = c.client().await;
    let started = Instant::now();
    let killed_at_ms = Arc::new(AtomicU64::new(u64::MAX));
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let client = client.clone();
        let killed_at_ms = killed_at_ms.clone();
        tasks.push(tokio::spawn(async move {
            // Each task owns its uids, so its calls per uid are sequential.
            let uids: Vec<Uid> = (0..4)
                .map(|k| Uid(((task * 4 + k) % SECTIONS) * SECTION_SIZE + task * 100 + k))
                .collect();
            let mut last: HashMap<Uid, u64> = HashMap::new();
            let mut report = LoadReport::default();
            let mut check = |uid: Uid, seq: u64, report: &mut LoadReport| {
                let prev = last.insert(uid, seq).unwrap_or(0);
                assert!(seq > prev, "P1 violated: {uid} was given {seq} after {prev}");
                report.ok += 1;
                if started.elapsed().as_millis() as u64 > killed_at_ms.load(Ordering::Acquire) {
                    report.ok_after_kill += 1;
                }
            };
            for call in 0..MAX_CALLS_PER_TASK {
                if started.elapsed() >= RUN {
                    break;
                }
                let uid = uids[call as usize % uids.len()];
                if task % 2 == 0 {
                    match client.fetch_next_seq(uid).await {
                        Ok(f) => check(uid, f.seq, &mut report),
                        Err(e) => report.errors.push(e),
                    }
                } else {
                    match client.batch_fetch(&vec![uid; HOT_COPIES]).await {
                        // One call: distinct seqs above the last, in any order (see fetch_hot).
                        Ok(mut got) => {
                            got.sort_unstable_by_key(|f| f.seq);
                            got.iter().for_each(|f| check(uid, f.seq, &mut report));
                        }
                        Err(e) => report.errors.push(e),
                    }
                }
            }
            report
        }));
    }

    tokio::time::sleep(RUN * 2 / 5).await;
    let leader = c.wait_store_leader(Duration::from_secs(5)).await;
    let before = c.store_status_of(leader).await.expect("leader status");
    killed_at_ms.store(started.elapsed().as_millis() as u64, Ordering::Release);
    c.kill(Role::Store, leader);
    let new_leader = c.wait_store_leader(Duration::from_secs(10)).await;
    let elected = started.elapsed().as_millis() as u64 - killed_at_ms.load(Ordering::Acquire);
    let mut total = LoadReport::default();
    for t in tasks {
        let r = t.await.expect("load task");
        total.ok += r.ok;
        total.ok_after_kill += r.ok_after_kill;
        total.errors.extend(r.errors);
    }
    let after = c.store_status_of(new_leader).await.expect("new leader status");
    eprintln!(
        "{TASKS} tasks for {:?}: {} seqs ({} after the kill of storesvr leader {leader}; storesvr {new_leader} \
         leader {elected} ms later), {} errors; max_seq_sum {} -> {}",
        started.elapsed(),
        total.ok,
        total.ok_after_kill,
        total.errors.len(),
        before.max_seq_sum,
        after.max_seq_sum
    );
    assert!(
        total.errors.is_empty(),
        "fetches failed: {:?}",
        &total.errors[..total.errors.len().min(5)]
    );
    assert!(total.ok_after_kill > 0, "no fetch completed after the kill");
    assert!(
        after.max_seq_sum >= before.max_seq_sum + 2 * STEP,
        "no bumps were committed by the new leader during the load"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seqctl_status_json_shows_members_leader_and_every_section_owned() {
    let _quiet = QUIET.read().await;
    let c = started_cluster().await;
    let seqctl = Seqctl::new(["--store", c.store_seeds_flag().as_str()]);
    let mut last;
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        let out = seqctl.output(&["status", "--json"]).await;
        last = text(&out);
        if out.status.success() {
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("seqctl prints JSON");
            let alive = v["allocsvrs"]
                .as_array()
                .map_or(0, |a| a.iter().filter(|a| a["alive"] == true).count());
            if alive == 2 && v["sections_owned"] == SECTIONS {
                break v;
            }
        }
        assert!(
            Instant::now() < deadline,
            "seqctl status never showed the cluster; last: {last}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("seqctl status --json: {status}");

    let members = status["members"].as_array().expect("members");
    assert_eq!(members.len(), 3, "{last}");
    let leader = status["leader_id"].as_u64().expect("leader_id");
    assert!((1..=3).contains(&leader), "leader {leader}: {last}");
    for m in members {
        assert!(m.get("error").is_none(), "member unreachable: {m}");
        assert_eq!(m["voter"], true, "{m}");
        assert_eq!(m["view"]["leader_id"], leader, "every member sees the same leader: {m}");
    }
    assert_eq!(status["sections_total"], SECTIONS);
    assert_eq!(status["params"]["section_size"], SECTION_SIZE);
    assert_eq!(status["params"]["uid_limit"], UID_LIMIT);
    let allocsvrs = status["allocsvrs"].as_array().expect("allocsvrs");
    let mut nodes: Vec<u64> = allocsvrs.iter().map(|a| a["node_id"].as_u64().unwrap()).collect();
    nodes.sort_unstable();
    assert_eq!(nodes, [1, 2], "{last}");
    let owned: u64 = allocsvrs.iter().map(|a| a["sections_owned"].as_u64().unwrap()).sum();
    assert_eq!(owned, SECTIONS, "every section owned by a live AllocSvr: {last}");
    assert!(
        allocsvrs.iter().all(|a| a["sections_owned"].as_u64().unwrap() > 0),
        "both AllocSvrs own sections: {last}"
    );
}

/// Issue 25, item 8: `seqctl sets` shows a set's AllocSvrs as the leader sees them. A follower
/// has no liveness data and called every AllocSvr dead; `sets` asked whichever replica the map
/// lists first, which after a leader change is a follower, while `seqctl status` (which prefers
/// the leader's view) showed the same AllocSvrs alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seqctl_sets_shows_allocsvrs_alive_after_the_leader_moved() {
    let _quiet = QUIET.read().await;
    let mut c = started_cluster().await;
    // The first replica the map lists (node 1) must be a follower.
    let leader = c.wait_store_leader(START_WITHIN).await;
    if leader == 1 {
        c.kill(Role::Store, 1);
        assert_ne!(c.wait_store_leader(START_WITHIN).await, 1);
        c.start_store(1);
    }
    let seqctl = Seqctl::new(["--store", c.store_seeds_flag().as_str()]);
    let alive = poll(
        "both AllocSvrs shown alive by seqctl sets",
        Duration::from_secs(15),
        || {
            let seqctl = seqctl.clone();
            async move {
                let v = seqctl.json(&["sets"]).await?;
                let allocs = v["sets"][0]["health"]["allocsvrs"].as_array()?.clone();
                (allocs.len() == 2 && allocs.iter().all(|a| a["alive"] == true)).then_some(allocs)
            }
        },
    )
    .await;
    eprintln!("seqctl sets: {alive:?}");
}
