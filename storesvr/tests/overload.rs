//! StoreSvrs under a flood of client calls, started with `--max-in-flight 1`: the flood's calls
//! wait for the one slot (and would be refused as overloaded past 200 ms or 4,096 waiting, which
//! this flood does not reach) while the Raft group keeps its leader and its term, and health checks
//! are still answered.
//!
//! What keeps the term here is admission's fairness as much as the peers' exemption: with the
//! exemption taken out of `storesvr::node` this test still passes (checked 2026-11-24, also with 64
//! one-caller connections per replica added to the flood), most likely because a peer's connection
//! waits at most one grant per other connection, which should be milliseconds against the 300 ms
//! election timeout (not measured). The exemption is for what this flood cannot make: slots held
//! by handlers that themselves wait for a Raft commit (Bump, Register), whose commit would then
//! queue behind them.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::Cluster;
use seqsvr_proto::pb;
use seqsvr_proto::refusal::{self, Refusal};

/// Floods every replica: `connections` × `callers` Status calls in a closed loop until `until`.
/// Returns (answered, refused as overloaded, other errors).
async fn flood(c: &Cluster, connections: usize, callers: usize, until: Instant) -> [u64; 3] {
    let counts = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let mut tasks = Vec::new();
    for &id in c.addrs.keys() {
        for _ in 0..connections {
            let client = c.client_of(id);
            for _ in 0..callers {
                let (mut client, counts) = (client.clone(), counts.clone());
                tasks.push(tokio::spawn(async move {
                    // Bounded in count as well as in time.
                    for _ in 0..100_000 {
                        if Instant::now() >= until {
                            break;
                        }
                        let mut req = tonic::Request::new(pb::StatusRequest {});
                        req.set_timeout(Duration::from_secs(2));
                        let i = match client.status(req).await {
                            Ok(_) => 0,
                            Err(s) if refusal::of(&s) == Some(Refusal::Overloaded) => 1,
                            Err(_) => 2,
                        };
                        counts[i].fetch_add(1, Ordering::Relaxed);
                    }
                }));
            }
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    counts.each_ref().map(|c| c.load(Ordering::Relaxed))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_flood_of_client_calls_raft_keeps_its_leader_and_term() {
    let c = Cluster::start_with(3, &["--max-in-flight", "1"]);
    let leader = c.wait_leader(Duration::from_secs(20)).await;
    let before = c.status_of(leader).await.expect("status");

    let seen = flood(&c, 4, 32, Instant::now() + Duration::from_secs(3)).await;
    // Calls above the limit wait rather than being refused at once, so refusals are allowed but
    // not required; every call is answered or refused as overloaded, nothing else.
    let [answered, _overloaded, other] = seen;
    assert!(answered > 0, "the flood was served: {seen:?}");
    assert_eq!(other, 0, "{seen:?}");

    let after = c.status_of(leader).await.expect("status after the flood");
    assert_eq!(
        (after.leader_id, after.term),
        (leader, before.term),
        "no election during the flood: peers are never shed"
    );
    for addr in c.addrs.values() {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_lazy();
        let health = tonic_health::pb::health_client::HealthClient::new(ch)
            .check(tonic_health::pb::HealthCheckRequest::default())
            .await
            .expect("health answered");
        assert_eq!(health.into_inner().status, 1, "SERVING");
    }
}
