//! A Renew, Release or Bump is bound to the process that registered the incarnation: a third
//! party that knows the incarnation and the epoch (both are in every Load reply) but not the
//! registration's secret cannot end, renew or raise the owner's grant. Real processes on loopback.

mod common;

use common::*;
use seqsvr_proto::pb;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(20);
const SECTION: u64 = 3;

/// An AllocSvr that registered with `secret` and renews with it in the background.
struct BoundOwner {
    incarnation: u64,
    secret: Vec<u8>,
    renew: tokio::task::JoinHandle<()>,
}

impl BoundOwner {
    async fn register(client: &seqsvr_control::StoreClient, node_id: u64, secret: &[u8]) -> Self {
        let reply = client
            .register(pb::RegisterRequest {
                node_id,
                addr: format!("127.0.0.1:{}", 41_000 + node_id),
                nonce: 7,
                secret: secret.to_vec(),
            })
            .await
            .expect("register");
        let (incarnation, c, s) = (reply.incarnation, client.clone(), secret.to_vec());
        let renew = tokio::spawn(async move {
            loop {
                let _ = c.renew(renew_req(incarnation, &s)).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        });
        Self {
            incarnation,
            secret: secret.to_vec(),
            renew,
        }
    }
}

impl Drop for BoundOwner {
    fn drop(&mut self) {
        self.renew.abort();
    }
}

fn renew_req(incarnation: u64, secret: &[u8]) -> pb::RenewRequest {
    pb::RenewRequest {
        incarnation,
        route_version: 0,
        map_version: u64::MAX,
        secret: secret.to_vec(),
        id_slots_wanted: 0,
        version: String::new(),
    }
}

fn release_req(incarnation: u64, epoch: u64, leaving: bool, secret: &[u8]) -> pb::ReleaseRequest {
    pb::ReleaseRequest {
        incarnation,
        sections: vec![pb::ReleasedRange {
            begin: SECTION,
            end: SECTION + 1,
            epoch,
            waited: true,
        }],
        leaving,
        secret: secret.to_vec(),
    }
}

/// The code of a refused call, or a panic naming what was answered instead.
fn refused<T: std::fmt::Debug>(what: &str, r: Result<tonic::Response<T>, tonic::Status>) -> tonic::Status {
    match r {
        Err(s) => s,
        Ok(reply) => panic!("{what} was accepted: {:?}", reply.into_inner()),
    }
}

/// The leader's own client (one connection, no retries elsewhere): the forger's third connection.
async fn leader_conn(c: &Cluster) -> pb::store_service_client::StoreServiceClient<tonic::transport::Channel> {
    c.client_of(c.wait_leader(WAIT).await)
}

/// Waits until the owner holds `SECTION` in the leader's state; its epoch.
async fn granted(client: &seqsvr_control::StoreClient, owner: &BoundOwner) -> u64 {
    let deadline = Instant::now() + WAIT;
    loop {
        let s = load(client, SECTION).await;
        if s.owner_incarnation == owner.incarnation {
            return s.epoch;
        }
        assert!(Instant::now() < deadline, "section {SECTION} never granted: {s:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_release_renew_bump_or_leaving_is_refused_and_the_owner_keeps_its_grant() {
    let c = Cluster::start(1);
    let client = c.client();
    c.wait_leader(WAIT).await;
    let owner = BoundOwner::register(&client, 1, b"the owner's 16+ byte secret").await;
    let epoch = granted(&client, &owner).await;
    let inc = owner.incarnation;
    let mut forger = leader_conn(&c).await;
    let wrong = b"not the owner's secret, guessed".to_vec();

    for secret in [Vec::new(), wrong.clone()] {
        let s = refused(
            "a forged Release",
            forger.release(release_req(inc, epoch, false, &secret)).await,
        );
        assert_eq!(s.code(), tonic::Code::Unauthenticated, "{s:?}");
        assert!(s.message().contains(&format!("incarnation {inc}")), "{s:?}");

        let s = refused(
            "a forged leaving Release",
            forger.release(release_req(inc, epoch, true, &secret)).await,
        );
        assert_eq!(s.code(), tonic::Code::Unauthenticated, "{s:?}");

        let s = refused("a forged Renew", forger.renew(renew_req(inc, &secret)).await);
        assert_eq!(s.code(), tonic::Code::Unauthenticated, "{s:?}");

        let bump = pb::BumpRequest {
            incarnation: inc,
            items: vec![pb::BumpItem {
                section: SECTION,
                epoch,
                new_max: 1_000,
            }],
            secret,
        };
        let s = refused("a forged Bump", forger.bump(bump).await);
        assert_eq!(s.code(), tonic::Code::Unauthenticated, "{s:?}");
    }

    let s = load(&client, SECTION).await;
    assert_eq!(
        (s.owner_incarnation, s.epoch, s.max_seq),
        (inc, epoch, 0),
        "the owner lost its grant or its ceiling moved"
    );
    let status = c.status_of(c.wait_leader(WAIT).await).await.expect("status");
    assert!(
        status.allocsvrs.iter().any(|a| a.incarnation == inc),
        "a forged leaving Release deregistered the owner: {status:?}"
    );

    // Each refusal left a warning naming the incarnation in the leader's log.
    let deadline = Instant::now() + WAIT;
    loop {
        let log = std::fs::read_to_string(c.log_path(1)).unwrap_or_default();
        let warned = log
            .lines()
            .filter(|l| {
                l.contains("WARN")
                    && l.contains("does not carry the secret")
                    && l.contains(&format!("incarnation={inc}"))
            })
            .count();
        if warned >= 8 {
            break;
        }
        assert!(Instant::now() < deadline, "{warned} warnings of 8 in the store's log");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The owner itself, with its secret, still renews, bumps and releases.
    let mine = client.renew(renew_req(inc, &owner.secret)).await.expect("own renew");
    assert_eq!(mine.status, pb::RenewStatus::Ok as i32);
    let r = client
        .release(release_req(inc, epoch, false, &owner.secret))
        .await
        .expect("own release");
    assert_eq!(r.released, 1);
}

/// An incarnation registered without a secret (an AllocSvr from before the binding) keeps working
/// without one: the legacy path, forgeable until that process restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_incarnation_registered_without_a_secret_still_works_without_one() {
    let c = Cluster::start(1);
    let client = c.client();
    c.wait_leader(WAIT).await;
    let legacy = FakeOwner::register(&client, 2).await;
    let epoch = legacy.epoch_of(&client, SECTION, WAIT).await;
    let r = bump(&client, legacy.incarnation, SECTION, epoch, 500).await;
    assert_eq!(r.outcome, pb::BumpOutcome::Applied as i32, "{r:?}");
    let r = client
        .release(release_req(legacy.incarnation, epoch, false, &[]))
        .await
        .expect("legacy release");
    assert_eq!(r.released, 1);
}
