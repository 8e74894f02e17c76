//! The time-ordered id workload, beside the per-uid one: clients of the client library asking any
//! AllocSvr for `NextIds`, and one client pinned to each AllocSvr that waits for its answer however
//! long the node takes (a request held by a paused holder is answered when it wakes: what shows
//! whether a woken old holder can still issue). Every call is recorded in the history for U1–U4.
//!
//! Counts are mostly small, sometimes hundreds and now and then thousands, so that a small layout
//! runs out of a tick's sequence numbers and borrows ahead.
//!
//! Deliberately left out: the Coalescer (it only merges calls; what it hands out are the replies
//! recorded here) and open-loop load (each client waits for its call, at a bounded rate).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use seqsvr_client::{Client, Conn};
use seqsvr_proto::pb;
use seqsvr_proto::pb::alloc_service_client::AllocServiceClient;

use crate::history::{IdCall, Outcome, Record};
use crate::workload::Recorder;

/// Client ids of the routing id clients start here.
pub const ID_CLIENT_BASE: u32 = 3000;
/// Client ids of the id clients pinned to one AllocSvr start here.
pub const PINNED_ID_CLIENT_BASE: u32 = 3100;

/// Shape of the id workload.
#[derive(Clone, Copy, Debug)]
pub struct IdWorkload {
    pub seed: u64,
    /// Calls per second per client (upper bound).
    pub rate_per_client: f64,
}

impl IdWorkload {
    fn rng(&self, client_id: u32) -> StdRng {
        StdRng::seed_from_u64(self.seed.wrapping_mul(0x1d5).wrapping_add(client_id as u64))
    }

    fn tick(&self) -> tokio::time::Interval {
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / self.rate_per_client.max(0.1)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick
    }
}

/// How many ids one call asks for.
fn count(rng: &mut StdRng) -> u32 {
    match rng.random_range(0..100) {
        0..85 => rng.random_range(1..=8),
        85..97 => rng.random_range(9..=200),
        _ => rng.random_range(201..=2_000),
    }
}

/// Consecutive ids as `(first, count)` runs.
fn runs_of(ids: &[u64]) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &id in ids {
        match runs.last_mut() {
            Some((first, n)) if first.checked_add(*n) == Some(id) => *n += 1,
            _ => runs.push((id, 1)),
        }
    }
    runs
}

fn record(rec: &Recorder, call: IdCall) {
    rec.counters.calls.fetch_add(1, Ordering::Relaxed);
    if call.outcome != Outcome::Ok {
        rec.counters.failed.fetch_add(1, Ordering::Relaxed);
    }
    if let Err(e) = rec.history.write(&Record::Ids(call)) {
        tracing::error!(error = %e, "history write failed");
    }
}

/// One `next_ids` through the client library, recorded; whether it got ids.
pub async fn next_ids(rec: &Recorder, client: &Client, client_id: u32, n: u32) -> bool {
    let (id, invoke_ns) = rec.history.begin();
    let r = client.next_ids(n).await;
    let complete_ns = rec.history.clock().now_ns();
    let mut call = IdCall {
        id,
        client: client_id,
        count: n.into(),
        invoke_ns,
        complete_ns,
        outcome: Outcome::Ok,
        runs: Vec::new(),
        set_id: 0,
        slot_epoch: 0,
        error: None,
    };
    match r {
        Ok(got) => {
            call.runs = runs_of(&got.ids);
            call.set_id = got.set_id;
            call.slot_epoch = got.slot_epoch;
        }
        Err(e) => {
            call.outcome = Outcome::Failed;
            call.error = Some(e.to_string());
        }
    }
    let ok = call.outcome == Outcome::Ok;
    record(rec, call);
    ok
}

/// A routing id client until `stop`.
pub async fn run_client(client: Client, client_id: u32, w: IdWorkload, rec: Arc<Recorder>, stop: Arc<AtomicBool>) {
    let mut rng = w.rng(client_id);
    let mut tick = w.tick();
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let n = count(&mut rng);
        next_ids(&rec, &client, client_id, n).await;
    }
}

/// An id client pinned to the AllocSvr behind `alloc`: each call waits up to `wait` (long: a
/// paused node answers when it wakes), until `stop`.
pub async fn run_pinned(
    mut alloc: AllocServiceClient<Conn>,
    client_id: u32,
    w: IdWorkload,
    wait: Duration,
    rec: Arc<Recorder>,
    stop: Arc<AtomicBool>,
) {
    let mut rng = w.rng(client_id);
    let mut tick = w.tick();
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let n = count(&mut rng);
        let (id, invoke_ns) = rec.history.begin();
        let r = tokio::time::timeout(wait, alloc.next_ids(pb::NextIdsRequest { count: n })).await;
        let complete_ns = rec.history.clock().now_ns();
        let mut call = IdCall {
            id,
            client: client_id,
            count: n.into(),
            invoke_ns,
            complete_ns,
            outcome: Outcome::Failed,
            runs: Vec::new(),
            set_id: 0,
            slot_epoch: 0,
            error: None,
        };
        match r {
            Ok(Ok(reply)) => {
                let reply = reply.into_inner();
                call.outcome = Outcome::Ok;
                call.runs = reply.runs.iter().map(|r| (r.first, u64::from(r.count))).collect();
                call.set_id = reply.set_id;
                call.slot_epoch = reply.slot_epoch;
            }
            Ok(Err(status)) => call.error = Some(format!("{:?}: {}", status.code(), status.message())),
            Err(_) => call.error = Some(format!("no answer in {wait:?}")),
        }
        record(&rec, call);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_ids_fold_into_runs() {
        assert_eq!(runs_of(&[]), vec![]);
        assert_eq!(runs_of(&[5, 6, 7, 9, 10, 4]), vec![(5, 3), (9, 2), (4, 1)]);
        assert_eq!(runs_of(&[u64::MAX, 0]), vec![(u64::MAX, 1), (0, 1)]);
    }
}
