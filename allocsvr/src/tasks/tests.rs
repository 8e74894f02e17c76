//! The tasks on a paused tokio clock against an in-process store: the renewal, gain, bump and
//! handover logic under timings that real time could only hit by luck.
//!
//! Set of 4 sections of 10 uids, step 100; lease 3,000 ms, drift 1 %, margin 100 ms, so a renewal
//! buys 2,870 ms from its send time and a section gained without a release waits 3,130 ms.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use seqsvr_plumbing::lease_clock::{self, LeaseClock};
use seqsvr_proto::params::SetParams;
use seqsvr_proto::pb::alloc_service_server::AllocService;
use seqsvr_proto::{Epoch, Incarnation, NodeId, SectionId, pb};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use super::{bump, renew};
use crate::config::NodeConfig;
use crate::service::Service;
use crate::state::{AllocState, BUMP_QUEUE_MESSAGES};
use crate::store::{Call, Store, StoreFailure};

const INCARNATION: u64 = 7;
const OWNER_VALIDITY: Duration = Duration::from_millis(2_870);

fn params() -> SetParams {
    SetParams {
        section_size: 10,
        uid_limit: 40,
        step: 100,
        section_begin: 0,
        section_end: 4,
        ..SetParams::single_set(0)
    }
}

/// What the in-process store does and has seen.
#[derive(Default)]
struct Script {
    /// Section → (epoch, owner incarnation, max_seq).
    sections: BTreeMap<u64, (u64, u64, u64)>,
    handover: Vec<pb::SectionRange>,
    /// How long a renewal takes to answer.
    renew_delay: Duration,
    /// Send times of the renewals answered OK (the lease counts from these).
    renewals_ok: Vec<Instant>,
    /// Bumps wait for `bump_gate` while this is set.
    hold_bumps: bool,
    /// Renewals answer `renew_soon` while this is set.
    renew_soon: bool,
    releases: Vec<pb::ReleaseRequest>,
    /// Releases are recorded but fail (as lost) while this is set.
    lose_releases: bool,
    /// Time-ordered ids: marks above this tick are refused as too far ahead (an old store's
    /// answer to a holder whose clock is ahead of its leader's); `None`, every raise applies.
    raise_limit: Option<u64>,
    /// Per slot, the mark the store holds.
    marks: BTreeMap<u64, u64>,
    /// RaiseMarks received.
    raises: u64,
}

#[derive(Default)]
struct FakeStore {
    script: Mutex<Script>,
    bump_gate: Notify,
}

impl FakeStore {
    fn granting_all(no_wait_epoch: u64) -> Arc<Self> {
        let store = FakeStore::default();
        let sections = (0..4).map(|s| (s, (no_wait_epoch, INCARNATION, 0))).collect();
        store.script.lock().unwrap().sections = sections;
        Arc::new(store)
    }

    fn with<R>(&self, f: impl FnOnce(&mut Script) -> R) -> R {
        f(&mut self.script.lock().unwrap())
    }

    fn grants(&self) -> Vec<pb::Grant> {
        self.with(|s| {
            s.sections
                .iter()
                .filter(|(_, (_, owner, _))| *owner == INCARNATION)
                .map(|(&id, &(epoch, _, _))| pb::Grant {
                    section_begin: id,
                    section_end: id + 1,
                    epoch,
                    no_wait: true,
                    wait_ms: None,
                })
                .collect()
        })
    }

    fn bump_item(&self, incarnation: u64, item: &pb::BumpItem) -> pb::BumpResult {
        self.with(|s| {
            let (epoch, owner, max_seq) = s.sections.get_mut(&item.section).expect("known section");
            let outcome = if *epoch != item.epoch || *owner != incarnation {
                pb::BumpOutcome::StaleEpoch
            } else {
                *max_seq = (*max_seq).max(item.new_max);
                pb::BumpOutcome::Applied
            };
            pb::BumpResult {
                section: item.section,
                outcome: outcome as i32,
                max_seq: *max_seq,
                epoch: *epoch,
            }
        })
    }
}

impl Store for FakeStore {
    fn register(&self, _req: pb::RegisterRequest) -> Call<'_, pb::RegisterReply> {
        Box::pin(async move {
            Ok(pb::RegisterReply {
                not_leader: None,
                incarnation: INCARNATION,
                params: Some(params().to_pb()),
            })
        })
    }

    fn renew(&self, _req: pb::RenewRequest, wait: Duration) -> Call<'_, pb::RenewReply> {
        Box::pin(async move {
            let t_send = Instant::now();
            let delay = self.with(|s| s.renew_delay);
            if delay >= wait {
                tokio::time::sleep(wait).await;
                return Err(StoreFailure::Unknown("renewal timed out".into()));
            }
            tokio::time::sleep(delay).await;
            self.with(|s| s.renewals_ok.push(t_send));
            Ok(pb::RenewReply {
                status: pb::RenewStatus::Ok as i32,
                grants: self.grants(),
                handover: self.with(|s| s.handover.clone()),
                renew_soon: self.with(|s| s.renew_soon),
                ..Default::default()
            })
        })
    }

    fn release(&self, req: pb::ReleaseRequest, _wait: Option<Duration>) -> Call<'_, pb::ReleaseReply> {
        Box::pin(async move {
            let lost = self.with(|s| {
                s.releases.push(req);
                s.lose_releases
            });
            if lost {
                return Err(StoreFailure::Unknown("release lost".into()));
            }
            Ok(pb::ReleaseReply::default())
        })
    }

    fn bump(&self, req: pb::BumpRequest, _wait: Duration) -> Call<'_, pb::BumpReply> {
        Box::pin(async move {
            while self.with(|s| s.hold_bumps) {
                self.bump_gate.notified().await;
            }
            let results = req.items.iter().map(|i| self.bump_item(req.incarnation, i)).collect();
            Ok(pb::BumpReply {
                not_leader: None,
                results,
            })
        })
    }

    fn raise_marks(&self, req: pb::RaiseMarksRequest, _: Duration) -> Call<'_, pb::RaiseMarksReply> {
        // Only the raiser's own tests hand the node a slot (`id_holder`); a round trip takes 1 ms,
        // so that a raiser that asks again at once still lets time pass.
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            let results = self.with(|s| {
                s.raises += 1;
                req.items
                    .iter()
                    .map(|i| {
                        let mark = s.marks.entry(i.slot).or_default();
                        let too_far = s.raise_limit.filter(|&limit| i.mark > limit);
                        if too_far.is_none() {
                            *mark = (*mark).max(i.mark);
                        }
                        let outcome = match too_far {
                            Some(_) => pb::RaiseOutcome::TooFarAhead,
                            None => pb::RaiseOutcome::Applied,
                        };
                        pb::RaiseResult {
                            slot: i.slot,
                            outcome: outcome as i32,
                            mark: *mark,
                            epoch: i.epoch,
                            limit: too_far.unwrap_or(0),
                        }
                    })
                    .collect()
            });
            Ok(pb::RaiseMarksReply {
                not_leader: None,
                leader_ms: 0,
                results,
            })
        })
    }

    fn load(&self, req: pb::LoadRequest) -> Call<'_, pb::LoadReply> {
        Box::pin(async move {
            let sections = req
                .sections
                .iter()
                .flat_map(|r| r.begin..r.end)
                .map(|id| {
                    let (epoch, owner, max_seq) = self.with(|s| s.sections[&id]);
                    pb::SectionState {
                        section: id,
                        max_seq,
                        epoch,
                        owner_incarnation: owner,
                    }
                })
                .collect();
            Ok(pb::LoadReply {
                not_leader: None,
                sections,
            })
        })
    }
}

/// A node's tasks and service over `store`, without a network listener.
struct Harness {
    shared: Arc<AllocState>,
    service: Service,
    _stop: watch::Sender<bool>,
}

/// A node whose lease clock is tokio's (a script with no change): the host's own suspensions
/// cannot reach these tests.
async fn start(store: Arc<FakeStore>) -> Harness {
    start_on(store, lease_clock::Script::new().into()).await
}

/// [`start`] with its leases read on `clock`.
async fn start_on(store: Arc<FakeStore>, clock: LeaseClock) -> Harness {
    let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut cfg = NodeConfig::new(NodeId(1), listen, vec![]);
    cfg.lease_clock = clock;
    let (incarnation, params) = renew::register(&*store, cfg.node_id, "a:1", None).await.unwrap();
    let (shared, queue) = AllocState::new(&cfg, params, "a:1".into(), store, incarnation);
    let (stop, stop_rx) = watch::channel(false);
    tokio::spawn(renew::renew_loop(shared.clone(), stop_rx.clone()));
    tokio::spawn(bump::bumper(shared.clone(), queue, stop_rx));
    let service = Service::new(shared.clone());
    Harness {
        shared,
        service,
        _stop: stop,
    }
}

impl Harness {
    /// One fetch: the outcome and the seq.
    async fn fetch(&self, uid: u64) -> (pb::Outcome, u64) {
        let req = tonic::Request::new(pb::FetchNextSeqRequest { uid, route_version: 0 });
        let reply = self.service.fetch_next_seq(req).await.unwrap().into_inner();
        (reply.outcome(), reply.seq)
    }

    /// Fetches `uid` every 10 ms until it is served; panics after `within`.
    async fn served(&self, uid: u64, within: Duration) -> u64 {
        let deadline = Instant::now() + within;
        loop {
            if let (pb::Outcome::Ok, seq) = self.fetch(uid).await {
                return seq;
            }
            assert!(Instant::now() < deadline, "uid {uid} not served within {within:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[tokio::test(start_paused = true)]
async fn the_lease_runs_out_during_a_slow_renewal_at_send_time_plus_validity() {
    let store = FakeStore::granting_all(1);
    let node = start(store.clone()).await;
    node.served(0, Duration::from_secs(5)).await;
    // From now on renewals take longer than the node waits for them.
    store.with(|s| s.renew_delay = Duration::from_secs(10));
    let lease_end = *store.with(|s| s.renewals_ok.clone()).last().unwrap() + OWNER_VALIDITY;
    let mut served_at = Vec::new();
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        if node.fetch(0).await.0 == pb::Outcome::Ok {
            served_at.push(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let last = *served_at.last().expect("served while the lease held");
    assert!(last < lease_end, "served {:?} after the lease ended", last - lease_end);
    assert!(
        lease_end - last <= Duration::from_millis(20),
        "stopped {:?} early",
        lease_end - last
    );
    assert_eq!(
        node.shared.owned().held_count(),
        0,
        "everything dropped once the lease ran out"
    );
    assert_eq!(node.shared.owned().lease_until(), None);
}

/// A host suspended for longer than the lease (CLOCK_MONOTONIC, and so tokio's clock, stands still
/// meanwhile): on resume the owner's lease is over, although no monotonic time passed. The store
/// may have granted its sections to another owner in between; serving on would make two owners.
#[tokio::test(start_paused = true)]
async fn an_owner_resumed_from_a_suspend_longer_than_the_lease_refuses_to_serve() {
    let store = FakeStore::granting_all(1);
    let script = lease_clock::Script::new();
    let node = start_on(store.clone(), script.clone().into()).await;
    node.served(0, Duration::from_secs(5)).await;
    node.served(10, Duration::from_secs(5)).await;
    let monotonic = Instant::now();
    // Suspended for a lease and a second: what BOOTTIME − MONOTONIC grew by, seen on resume.
    script.jump_at(monotonic, Duration::from_secs(4));
    assert_eq!(Instant::now(), monotonic, "no monotonic time passed");
    for uid in [0, 10] {
        assert_eq!(
            node.fetch(uid).await.0,
            pb::Outcome::NotReady,
            "uid {uid}: the lease ran out while suspended"
        );
    }
    let batch = tonic::Request::new(pb::BatchFetchNextSeqRequest {
        uids: vec![1, 11, 21],
        route_version: 0,
    });
    let reply = node.service.batch_fetch_next_seq(batch).await.unwrap().into_inner();
    assert!(
        reply.outcomes.iter().all(|&o| o == pb::Outcome::NotReady as i32),
        "a batch checks the same lease: {:?}",
        reply.outcomes
    );
    // The next renewal, sent after the resume, is what gives a lease back.
    node.served(0, Duration::from_secs(1)).await;
}

/// While the store says ownership is about to change, renewals come every [`renew::RENEW_SOON`]
/// instead of every renew interval (500 ms), and go back to the interval when it stops saying so.
#[tokio::test(start_paused = true)]
async fn renewals_come_soon_while_the_store_asks_and_at_the_interval_otherwise() {
    let store = FakeStore::granting_all(1);
    let node = start(store.clone()).await;
    node.served(0, Duration::from_secs(5)).await;
    let gaps = |from: usize| {
        let at = store.with(|s| s.renewals_ok.clone());
        at[from..].windows(2).map(|w| w[1] - w[0]).collect::<Vec<_>>()
    };
    store.with(|s| s.renew_soon = true);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let soon_from = store.with(|s| s.renewals_ok.len());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let soon = gaps(soon_from);
    assert!(soon.len() >= 8, "{soon:?}");
    assert!(soon.iter().all(|&g| g <= renew::RENEW_SOON), "{soon:?}");
    store.with(|s| s.renew_soon = false);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let steady_from = store.with(|s| s.renewals_ok.len());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let steady = gaps(steady_from);
    assert!(
        !steady.is_empty() && steady.iter().all(|&g| g == Duration::from_millis(500)),
        "{steady:?}"
    );
    drop(node);
}

#[tokio::test(start_paused = true)]
async fn a_late_renewal_reply_extends_the_lease_from_its_send_time() {
    let store = FakeStore::granting_all(1);
    let node = start(store.clone()).await;
    node.served(0, Duration::from_secs(5)).await;
    // Replies arrive 1.2 s after the request: later than the renew interval, within the wait.
    store.with(|s| s.renew_delay = Duration::from_millis(1_200));
    let before = store.with(|s| s.renewals_ok.len());
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        assert_eq!(node.fetch(0).await.0, pb::Outcome::Ok, "the lease never lapsed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let sent = store.with(|s| s.renewals_ok.clone());
    assert!(sent.len() >= before + 5, "{} late renewals", sent.len() - before);
    // The published end is the last confirmed send time plus the validity — not the reply time.
    let lease_until = node.shared.owned().lease_until().unwrap();
    assert_eq!(lease_until, *sent.last().unwrap() + OWNER_VALIDITY);
}

#[tokio::test(start_paused = true)]
async fn a_grant_revoked_while_its_bump_is_in_flight_stops_serving_at_once() {
    let store = FakeStore::granting_all(1);
    let node = Arc::new(start(store.clone()).await);
    let first = node.served(0, Duration::from_secs(5)).await;
    store.with(|s| s.hold_bumps = true);
    // Use up the step: the prefetch at half a step is held, so the ceiling is reached.
    let mut last = first;
    while let (pb::Outcome::Ok, seq) = node.fetch(0).await {
        last = seq;
    }
    assert_eq!(last, 100, "served up to the acknowledged ceiling and no further");
    let waiting = tokio::spawn({
        let node = node.clone();
        async move { node.fetch(0).await }
    });
    // The section moves to another owner under a higher epoch while the bump is in flight.
    tokio::time::sleep(Duration::from_millis(50)).await;
    store.with(|s| s.sections.insert(0, (2, INCARNATION + 1, 100)));
    let revoked_by = Instant::now() + Duration::from_millis(600);
    let (outcome, _) = waiting.await.unwrap();
    assert_eq!(
        outcome,
        pb::Outcome::NotOwner,
        "the waiting fetch was woken by the drop"
    );
    assert!(Instant::now() <= revoked_by, "dropped at the next renewal");
    // Letting the old bump through changes nothing: it is stale, and the slot is gone.
    store.with(|s| s.hold_bumps = false);
    store.bump_gate.notify_waiters();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(node.fetch(0).await.0, pb::Outcome::NotOwner);
    assert_eq!(
        store.with(|s| s.sections[&0]),
        (2, INCARNATION + 1, 100),
        "no bump of the new epoch"
    );
    assert_eq!(
        node.fetch(10).await.0,
        pb::Outcome::Ok,
        "the other sections still serve"
    );
}

#[tokio::test(start_paused = true)]
async fn a_handover_request_drops_then_releases_under_the_granted_epoch() {
    let store = FakeStore::granting_all(3);
    let node = start(store.clone()).await;
    node.served(0, Duration::from_secs(5)).await;
    node.served(10, Duration::from_secs(5)).await;
    store.with(|s| s.handover = vec![pb::SectionRange { begin: 0, end: 2 }]);
    let asked = Instant::now();
    while store.with(|s| s.releases.is_empty()) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        Instant::now() - asked <= Duration::from_millis(520),
        "released at the next renewal"
    );
    let release = store.with(|s| s.releases[0].clone());
    assert_eq!(release.incarnation, INCARNATION);
    assert!(!release.leaving);
    assert_eq!(
        release.sections,
        vec![pb::ReleasedRange {
            begin: 0,
            end: 2,
            epoch: 3,
            waited: true,
        }],
        "served sections: the next owner need not wait"
    );
    assert_eq!(node.fetch(0).await.0, pb::Outcome::NotOwner);
    assert_eq!(node.fetch(10).await.0, pb::Outcome::NotOwner);
    assert_eq!(
        node.fetch(20).await.0,
        pb::Outcome::Ok,
        "sections not handed over keep serving"
    );
    assert_eq!(node.shared.owned().held_count(), 2);
}

/// Seed 69646 of `sim dst`, reduced: the handover's Release is lost, the arbiter withdraws the
/// handover while the section is still granted under the same epoch, and the lost Release may land
/// any time later. The section must stay unserved under that epoch, released again each renewal.
#[tokio::test(start_paused = true)]
async fn a_withdrawn_handover_never_serves_the_released_epoch_again() {
    let store = FakeStore::granting_all(3);
    let node = start(store.clone()).await;
    node.served(0, Duration::from_secs(5)).await;
    store.with(|s| {
        s.lose_releases = true;
        s.handover = vec![pb::SectionRange { begin: 0, end: 1 }];
    });
    while store.with(|s| s.releases.is_empty()) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    store.with(|s| s.handover.clear());
    // Several renewals later (interval 500 ms) the grant of (0, epoch 3) is unchanged.
    let before = store.with(|s| s.releases.len());
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        node.fetch(0).await.0,
        pb::Outcome::NotOwner,
        "a handed-over (section, epoch) is not served again"
    );
    let again: Vec<pb::ReleaseRequest> = store.with(|s| s.releases[before..].to_vec());
    assert!(again.len() >= 4, "released again at every renewal: {}", again.len());
    for r in &again {
        assert_eq!(
            r.sections,
            vec![pb::ReleasedRange {
                begin: 0,
                end: 1,
                epoch: 3,
                waited: true,
            }],
            "the same Release, still saying the wait had passed"
        );
    }
    // The store finally takes a Release and grants the section back under a new epoch: served.
    store.with(|s| {
        s.lose_releases = false;
        s.sections.insert(0, (4, INCARNATION, 100));
    });
    node.served(0, Duration::from_secs(5)).await;
    let after = store.with(|s| s.releases.len());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(store.with(|s| s.releases.len()), after, "nothing more to release");
}

#[tokio::test(start_paused = true)]
async fn a_full_bump_queue_gives_the_prefetch_up_instead_of_growing() {
    let store = FakeStore::granting_all(1);
    let cfg = NodeConfig::new(NodeId(1), "127.0.0.1:0".parse().unwrap(), vec![]);
    // No bumper drains this queue.
    let (shared, _queue) = AllocState::new(&cfg, params(), "a:1".into(), store, Incarnation(INCARNATION));
    let diff = crate::grants::GrantDiff {
        gain: vec![crate::grants::Gain {
            id: SectionId(0),
            epoch: Epoch(1),
            no_wait: true,
            wait: None,
        }],
        ..Default::default()
    };
    let slot = shared.apply_grants(&diff, Instant::now()).pop().unwrap();
    slot.section.lock().unwrap().loaded(0, None);
    for _ in 0..BUMP_QUEUE_MESSAGES {
        assert!(slot.section.lock().unwrap().maybe_prefetch().is_some());
        shared.queue_prefetch(slot.clone());
        slot.section.lock().unwrap().bump_abandoned();
    }
    assert!(slot.section.lock().unwrap().maybe_prefetch().is_some());
    shared.queue_prefetch(slot.clone());
    assert_eq!(
        slot.section.lock().unwrap().bump_in_flight(),
        None,
        "given up, so the next fetch asks again"
    );
}

/// A node that holds id slot 0 of Twitter's layout (from 2020) under epoch 1 with a floor of 0, its
/// raiser running; no renewal loop (it would drop the slot: this store sets no ids up).
async fn id_holder(store: Arc<FakeStore>) -> (Arc<AllocState>, watch::Sender<bool>) {
    let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut cfg = NodeConfig::new(NodeId(1), listen, vec![]);
    cfg.id_clock = crate::ids::clock::IdClock::on_tokio_time(1_800_000_000_000);
    let (incarnation, params) = renew::register(&*store, cfg.node_id, "a:1", None).await.unwrap();
    let (shared, _queue) = AllocState::new(&cfg, params, "a:1".into(), store, incarnation);
    let layout = seqsvr_proto::id_layout::IdLayout::twitter(seqsvr_proto::id_layout::DEFAULT_EPOCH_MS);
    let grant = pb::SlotGrant {
        slot: 0,
        epoch: 1,
        mark: 0,
    };
    shared.ids().apply_renewal(Some(&layout.to_pb()), 10_000, &[grant]);
    let (stop, stop_rx) = watch::channel(false);
    tokio::spawn(super::raise::raiser(shared.clone(), stop_rx));
    (shared, stop)
}

/// Issue 47, item 7: a store whose leader's clock is behind refuses every raise this holder asks
/// for. Three callers that ask again at once, then nobody: the raiser backs off instead of
/// sending a RaiseMarks (a Raft entry, fsynced on every replica) for every refused call, and
/// calls stop waking each other on every refusal.
#[tokio::test(start_paused = true)]
async fn a_refused_raise_backs_off_instead_of_flooding_the_store() {
    let store = FakeStore::granting_all(1);
    store.with(|s| s.raise_limit = Some(0));
    let (shared, _stop) = id_holder(store.clone()).await;
    let busy_until = Instant::now() + Duration::from_secs(5);
    let callers: Vec<_> = (0..3)
        .map(|_| {
            let shared = shared.clone();
            tokio::spawn(async move {
                let mut calls = 0u64;
                while Instant::now() < busy_until {
                    let req = pb::NextIdsRequest { count: 1 };
                    assert!(crate::ids::service::next_ids(&shared, req).await.is_err());
                    calls += 1;
                }
                calls
            })
        })
        .collect();
    let mut calls = 0;
    for c in callers {
        calls += c.await.unwrap();
    }
    let busy = store.with(|s| s.raises);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let idle = store.with(|s| s.raises) - busy;
    assert!(
        busy <= 15,
        "{busy} refused RaiseMarks in 5 s under {calls} calls (each one a Raft entry on a real store)"
    );
    assert!(idle <= 6, "{idle} refused RaiseMarks in 10 idle seconds");
    println!("{busy} raises under {calls} calls in 5 s, {idle} in 10 idle seconds");
    // The store's clock catches up: the next raise is applied and ids are issued again.
    store.with(|s| s.raise_limit = None);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        crate::ids::service::next_ids(&shared, pb::NextIdsRequest { count: 1 })
            .await
            .is_ok()
    );
}
