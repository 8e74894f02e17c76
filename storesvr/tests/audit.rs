//! The audit trail through the real service: admin actions sent over gRPC (map changes, a refused
//! range step, a drain, a membership change, map publications) are read back with GetAudit, in
//! order, as `anonymous` (no TLS), with their outcomes and the leader's time; requests refused
//! before they are proposed leave no record; a follower points at the leader; the trail survives
//! a restart of the leader (snapshot and log replay).

mod common;

use common::*;
use seqsvr_proto::pb;
use seqsvr_proto::pb::admin_service_client::AdminServiceClient;
use seqsvr_proto::pb::change_map_request::Change;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tonic::transport::Channel;

const WAIT: Duration = Duration::from_secs(30);
/// Map publications: more entries than `--snapshot-logs=20`, so the trail is in a snapshot.
const PUBLISHED: u64 = 25;

fn admin(c: &Cluster, id: u64) -> AdminServiceClient<Channel> {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", c.addrs[&id]))
        .unwrap()
        .connect_lazy();
    AdminServiceClient::new(ch)
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

async fn trail(a: &mut AdminServiceClient<Channel>, after: u64, limit: u32, newest: bool) -> pb::GetAuditReply {
    a.get_audit(pb::GetAuditRequest { after, limit, newest })
        .await
        .expect("GetAudit")
        .into_inner()
}

fn add_set(expect_version: u64, set_id: u64) -> pb::ChangeMapRequest {
    pb::ChangeMapRequest {
        change: Some(Change::AddSet(pb::AddSet {
            expect_version,
            set_id,
            stores: vec!["127.0.0.1:1".into()],
        })),
    }
}

/// A map of this test cluster's shape (see `set_args`) at `version`.
fn map(version: u64) -> pb::ClusterMap {
    pb::ClusterMap {
        version,
        sets: vec![],
        ranges: vec![],
        moves: vec![],
        section_size: 100_000,
        uid_limit: 1_000_000,
        ids: None,
    }
}

/// Map changes (one done, one on a stale version), a refused range step, a request refused before
/// it was proposed; the (what, outcome) pairs expected for them.
async fn map_actions(a: &mut AdminServiceClient<Channel>) -> Vec<(String, String)> {
    let done = a.change_map(add_set(1, 1)).await.unwrap().into_inner();
    assert_eq!((done.version, done.version_changed), (2, false));
    let stale = a.change_map(add_set(1, 2)).await.unwrap().into_inner();
    assert!(stale.version_changed);
    let step = pb::RangeStepRequest {
        op: 7,
        step: pb::RangeStep::Tombstone as i32,
        sections: Some(pb::SectionRange { begin: 0, end: 2 }),
        other_set: 1,
        ceilings: vec![],
        map_version: 3,
        ..Default::default()
    };
    let refused = a
        .range_step(step)
        .await
        .expect_err("a tombstone of a move never frozen");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
    let bad = a.change_map(pb::ChangeMapRequest { change: None }).await.unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument, "refused before proposing");
    vec![
        (
            "add set 1 (stores 127.0.0.1:1) at map version 1".into(),
            "done: map version 2".into(),
        ),
        (
            "add set 2 (stores 127.0.0.1:1) at map version 1".into(),
            "not done: the map is at version 2 now".into(),
        ),
        (
            "range step TOMBSTONE of move 7: sections [0, 2) now set 1's (map version 3)".into(),
            format!("refused: {}", refused.message()),
        ),
    ]
}

/// Drains AllocSvr node 2 once another one (node 1) renews; refusals before that are not proposed.
async fn drain_node_2(c: &Cluster, a: &mut AdminServiceClient<Channel>) -> (String, String) {
    let client = c.client();
    let _one = FakeOwner::register(&client, 1).await;
    let two = FakeOwner::register(&client, 2).await;
    let deadline = Instant::now() + WAIT;
    loop {
        match a.drain_alloc_svr(pb::DrainAllocSvrRequest { node_id: 2 }).await {
            Ok(r) => {
                assert_eq!(r.get_ref().incarnation, two.incarnation);
                let outcome = format!("draining incarnation {}", two.incarnation);
                return ("drain AllocSvr node 2".into(), outcome);
            }
            Err(e) if e.code() == tonic::Code::FailedPrecondition && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("drain: {e:?}"),
        }
    }
}

fn pairs(reply: &pb::GetAuditReply) -> Vec<(String, String)> {
    reply
        .records
        .iter()
        .map(|r| (r.what.clone(), r.outcome.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_actions_are_read_back_in_order_with_who_when_and_outcome() {
    let mut c = Cluster::start(1);
    assert_eq!(c.wait_leader(WAIT).await, 1);
    let mut a = admin(&c, 1);
    let t0 = now_ms();
    let mut want = map_actions(&mut a).await;
    want.push(drain_node_2(&c, &mut a).await);

    let addr = c.spawn_new(2);
    let added = a
        .add_replica(pb::AddReplicaRequest {
            node_id: 2,
            addr: addr.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let what = format!("add replica 2 at {addr}");
    want.push((what.clone(), "started".into()));
    let done = format!(
        "done: voters {:?}, learners [] (log index {})",
        added.voters, added.log_index
    );
    want.push((what, done));
    for version in 1..=PUBLISHED {
        a.publish_map(pb::PublishMapRequest {
            map: Some(map(version)),
            for_set: None,
        })
        .await
        .unwrap();
        let bytes = prost::Message::encoded_len(&map(version));
        want.push((
            format!("publish map version {version} ({bytes} bytes)"),
            format!("done: map version {version} kept"),
        ));
    }
    let t1 = now_ms();

    let all = trail(&mut a, 0, 0, false).await;
    assert_eq!(pairs(&all), want);
    assert_eq!((all.dropped, all.last), (0, want.len() as u64));
    for (i, r) in all.records.iter().enumerate() {
        assert_eq!(r.number, i as u64 + 1);
        assert_eq!(r.who, "anonymous");
        assert!(
            (t0..=t1).contains(&r.at_ms),
            "record {} at {} not in [{t0}, {t1}]",
            r.number,
            r.at_ms
        );
    }
    let newest = trail(&mut a, 0, 2, true).await;
    let numbers: Vec<u64> = newest.records.iter().map(|r| r.number).collect();
    assert_eq!(numbers, [all.last - 1, all.last]);
    let too_many = a
        .get_audit(pb::GetAuditRequest {
            after: 0,
            limit: 1_001,
            newest: false,
        })
        .await
        .unwrap_err();
    assert_eq!(too_many.code(), tonic::Code::InvalidArgument, "{too_many:?}");

    let follower = trail(&mut admin(&c, 2), 0, 0, false).await;
    assert_eq!(follower.not_leader.map(|h| h.leader_id), Some(1));
    assert!(follower.records.is_empty());

    // The trail is replicated state: after the leader restarts (snapshot, then the log after
    // it), the set answers with the same records.
    c.restart(1);
    let deadline = Instant::now() + WAIT;
    let again = loop {
        let leader = c.wait_leader(WAIT).await;
        if let Ok(r) = admin(&c, leader)
            .get_audit(pb::GetAuditRequest::default())
            .await
            .map(|r| r.into_inner())
            && r.not_leader.is_none()
        {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "no leader answered GetAudit after the restart"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(again.records, all.records);
}
