//! A move of sections between two real StoreSvr groups (set 0, the map's home, and set 1), driven
//! step by step over the admin RPCs the way `seqctl move` drives it: the map records the move,
//! the target imports, the source freezes, the owner's lease is waited out (it never releases),
//! the final ceilings go to the target, the map switches, the source tombstones. Every step is
//! repeated once and changes nothing the second time; refusals change nothing at all.

mod common;

use common::*;
use seqsvr_proto::pb;
use seqsvr_proto::pb::admin_service_client::AdminServiceClient;
use std::time::{Duration, Instant};
use tonic::transport::Channel;

const WAIT: Duration = Duration::from_secs(30);
const OP: u64 = 7;
const DRIVER: u64 = 99;

fn admin(c: &Cluster) -> AdminServiceClient<Channel> {
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", c.addrs[&1]))
        .unwrap()
        .connect_lazy();
    AdminServiceClient::new(ch)
}

fn sections(begin: u64, end: u64) -> Option<pb::SectionRange> {
    Some(pb::SectionRange { begin, end })
}

async fn change(a: &mut AdminServiceClient<Channel>, change: pb::change_map_request::Change) -> pb::ChangeMapReply {
    a.change_map(pb::ChangeMapRequest { change: Some(change) })
        .await
        .expect("change map")
        .into_inner()
}

async fn advance(a: &mut AdminServiceClient<Channel>, phase: pb::MovePhase, ceilings: Vec<u64>) -> pb::ChangeMapReply {
    change(
        a,
        pb::change_map_request::Change::AdvanceMove(pb::AdvanceMove {
            op: OP,
            driver: DRIVER,
            phase: phase as i32,
            ceilings,
        }),
    )
    .await
}

fn step(kind: pb::RangeStep, other_set: u64) -> pb::RangeStepRequest {
    pb::RangeStepRequest {
        op: OP,
        step: kind as i32,
        sections: sections(2, 4),
        other_set,
        ceilings: vec![],
        map_version: 0,
        // As common::set_args starts every replica.
        section_size: 100_000,
        uid_limit: 1_000_000,
        ledgers: vec![],
    }
}

async fn cluster_map(a: &mut AdminServiceClient<Channel>) -> pb::ClusterMap {
    let reply = a
        .get_cluster_map(pb::GetClusterMapRequest {})
        .await
        .expect("cluster map");
    reply.into_inner().map.expect("set 0 keeps the map")
}

/// Sends a range step twice: applied the first time, recognised the second.
async fn step_twice(a: &mut AdminServiceClient<Channel>, req: pb::RangeStepRequest) {
    let first = a.range_step(req.clone()).await.expect("range step").into_inner();
    assert!(!first.already, "{req:?}");
    let again = a.range_step(req.clone()).await.expect("range step again").into_inner();
    assert!(again.already, "{req:?} repeated");
}

/// Polls the source until the frozen range's owners are provably gone; the final ceilings.
async fn wait_ready(a: &mut AdminServiceClient<Channel>) -> (Vec<u64>, Duration) {
    let start = Instant::now();
    loop {
        let r = a
            .export_status(pb::ExportStatusRequest { op: OP })
            .await
            .expect("export status")
            .into_inner();
        if r.ready {
            return (r.ceilings, start.elapsed());
        }
        assert!(r.held > 0 && r.wait_ms > 0, "not ready without a reason: {r:?}");
        assert!(start.elapsed() < WAIT, "never ready: {r:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One renewal of `incarnation`; whether the store asks for the next one soon.
async fn renew_soon(c: &seqsvr_control::StoreClient, incarnation: u64) -> bool {
    let r = c
        .renew(pb::RenewRequest {
            secret: Vec::new(),
            incarnation,
            route_version: u64::MAX,
            map_version: u64::MAX,
            id_slots_wanted: 0,
            version: String::new(),
        })
        .await
        .expect("renew");
    r.renew_soon
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_moves_to_another_set_after_its_owner_lease_and_every_step_is_idempotent() {
    let set0 = Cluster::start(1);
    let set1 = Cluster::start_with(1, &["--set-id=1"]);
    set0.wait_leader(WAIT).await;
    set1.wait_leader(WAIT).await;
    let (mut a0, mut a1) = (admin(&set0), admin(&set1));
    let client0 = set0.client();
    let owner = FakeOwner::register(&client0, 1).await;
    let epoch = owner.epoch_of(&client0, 2, WAIT).await;
    assert_eq!(bump(&client0, owner.incarnation, 2, epoch, 777).await.max_seq, 777);
    // A set whose ownership has not changed for a second lets its owners renew at their interval.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    renew_soon(&client0, owner.incarnation).await;
    assert!(
        !renew_soon(&client0, owner.incarnation).await,
        "a steady set asks for soon renewals"
    );

    // The map: set 0 serves everything; set 1 joins; a stale version changes nothing.
    let map = cluster_map(&mut a0).await;
    assert_eq!((map.version, map.ranges.len()), (1, 1));
    let add = |v| {
        pb::change_map_request::Change::AddSet(pb::AddSet {
            expect_version: v,
            set_id: 1,
            stores: vec![set1.addrs[&1].clone()],
        })
    };
    let r = change(&mut a0, add(1)).await;
    assert_eq!((r.version, r.already, r.version_changed), (2, false, false));
    assert!(change(&mut a0, add(1)).await.already);
    let begin = |v, b, e| {
        pb::change_map_request::Change::BeginMove(pb::BeginMove {
            expect_version: v,
            op: OP,
            from_set: 0,
            to_set: 1,
            sections: sections(b, e),
            driver: DRIVER,
        })
    };
    let stale = change(&mut a0, begin(1, 2, 4)).await;
    assert!(stale.version_changed && stale.version == 2);
    assert_eq!(change(&mut a0, begin(2, 2, 4)).await.version, 3);
    let mut other = begin(3, 3, 5);
    if let pb::change_map_request::Change::BeginMove(b) = &mut other {
        b.op = OP + 1;
    }
    let overlap = a0
        .change_map(pb::ChangeMapRequest { change: Some(other) })
        .await
        .unwrap_err();
    assert_eq!(overlap.code(), tonic::Code::FailedPrecondition, "{overlap:?}");
    assert!(overlap.message().contains("overlaps"), "{overlap:?}");

    step_twice(&mut a1, step(pb::RangeStep::Import, 0)).await;
    advance(&mut a0, pb::MovePhase::Importing, vec![]).await;
    step_twice(&mut a0, step(pb::RangeStep::Freeze, 1)).await;
    advance(&mut a0, pb::MovePhase::Frozen, vec![]).await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert!(
        renew_soon(&client0, owner.incarnation).await,
        "while a range is frozen for a move its owners must renew soon"
    );
    let refused = bump(&client0, owner.incarnation, 2, epoch, 800).await;
    assert_eq!(
        refused.outcome,
        pb::BumpOutcome::NotOwned as i32,
        "a frozen section is never bumped"
    );

    // The fake owner never hands the sections over: only its lease proves it gone.
    let (ceilings, waited) = wait_ready(&mut a0).await;
    assert_eq!(ceilings, vec![777, 0]);
    assert!(
        waited >= Duration::from_millis(2_500),
        "waited only {waited:?} of a 3 s lease"
    );
    advance(&mut a0, pb::MovePhase::Sealed, ceilings.clone()).await;
    let cancel = a0
        .change_map(pb::ChangeMapRequest {
            change: Some(pb::change_map_request::Change::AdvanceMove(pb::AdvanceMove {
                op: OP,
                driver: DRIVER,
                phase: pb::MovePhase::Cancelled as i32,
                ceilings: vec![],
            })),
        })
        .await
        .unwrap_err();
    assert!(
        cancel.message().contains("sealed"),
        "no cancel past the seal: {cancel:?}"
    );

    let mut install = step(pb::RangeStep::Install, 0);
    install.ceilings = ceilings;
    step_twice(&mut a1, install).await;
    advance(&mut a0, pb::MovePhase::Installed, vec![]).await;
    let switched = advance(&mut a0, pb::MovePhase::Switched, vec![]).await;
    assert_eq!(switched.version, 4);
    let mut tombstone = step(pb::RangeStep::Tombstone, 1);
    tombstone.map_version = switched.version;
    step_twice(&mut a0, tombstone).await;
    advance(&mut a0, pb::MovePhase::Done, vec![]).await;

    let map = cluster_map(&mut a0).await;
    let ranges: Vec<(u64, u64, u64)> = map
        .ranges
        .iter()
        .map(|r| (r.section_begin, r.section_end, r.set_id))
        .collect();
    assert_eq!(ranges, vec![(0, 2, 0), (2, 4, 1), (4, SECTIONS, 0)]);
    assert_eq!(map.moves[0].phase, pb::MovePhase::Done as i32);
    let moved = client0
        .load(pb::LoadRequest {
            sections: sections(2, 3).into_iter().collect(),
        })
        .await
        .unwrap_err();
    assert!(
        moved.to_string().contains("moved from set 0 to set 1"),
        "the source says where the section went: {moved}"
    );

    // Both sets' route tables still cover the whole uid space (clients refuse one with holes); the
    // moved sections are nobody's in set 0's table and say they went to set 1.
    let table0 = client0.get_routes().await.unwrap().routes.unwrap();
    let routes0 = seqsvr_proto::Routes::new(table0.clone()).expect("set 0's table is complete");
    let moved_entry = table0
        .entries
        .iter()
        .find(|e| e.section_begin <= 2 && 2 < e.section_end)
        .unwrap();
    assert_eq!((moved_entry.set_id, moved_entry.addr.as_str()), (1, ""), "{table0:?}");
    assert!(routes0.lookup(seqsvr_proto::Uid(0)).is_some());

    // The target serves the range from above the source's ceiling.
    let client1 = set1.client();
    let owner1 = FakeOwner::register(&client1, 5).await;
    let epoch1 = owner1.epoch_of(&client1, 2, WAIT).await;
    assert_eq!(load(&client1, 2).await.max_seq, 777);
    let r = bump(&client1, owner1.incarnation, 2, epoch1, 1_777).await;
    assert_eq!((r.outcome, r.max_seq), (pb::BumpOutcome::Applied as i32, 1_777));
    let table1 = client1.get_routes().await.unwrap().routes.unwrap();
    seqsvr_proto::Routes::new(table1.clone()).expect("set 1's table is complete");
    let owned: Vec<(u64, u64)> = table1
        .entries
        .iter()
        .filter(|e| e.set_id == 1 && !e.addr.is_empty())
        .map(|e| (e.section_begin, e.section_end))
        .collect();
    assert_eq!(owned, vec![(2, 4)], "{table1:?}");
}
