//! The bumper: raises sections' durable ceilings through the store.
//!
//! It drains the bounded bump queue into Bump RPCs of at most [`BUMP_CHUNK_ITEMS`] sections and
//! retries a Bump whose outcome is unknown with the same `new_max` (so a retry can never raise a
//! ceiling twice) until it is acknowledged, refused, or the section is no longer this node's to
//! bump: lease gone, slot dropped or replaced, another incarnation, shutting down. A section is
//! served above its old ceiling only after the acknowledgement (P2).
//!
//! Deliberately left out: deciding when to bump (the section's prefetch at half a step, and the
//! first bump of a gain) and any bump not carrying the slot's own epoch (the store fences on it).

use std::sync::Arc;
use std::time::Duration;

use seqsvr_proto::limits::BUMP_CHUNK_ITEMS;
use seqsvr_proto::{Incarnation, pb};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use super::{backoff_after, store_reply_wait};
use crate::owned::Slot;
use crate::state::{AllocState, BumpQueue};
use crate::store::StoreFailure;

/// Sends the queued bumps until `stop`.
pub async fn bumper(shared: Arc<AllocState>, mut queue: BumpQueue, mut stop: watch::Receiver<bool>) {
    let wait = store_reply_wait(shared.params());
    loop {
        // Biased, stop first: a stop wins over work ready at the same time, and the choice never
        // depends on the runtime's random numbers (the deterministic simulator replays a seed).
        let mut batch = tokio::select! {
            biased;
            _ = stop.changed() => return,
            m = queue.recv() => match m { Some(m) => m, None => return },
        };
        while batch.len() < BUMP_CHUNK_ITEMS {
            match queue.try_recv() {
                Ok(more) => batch.extend(more),
                Err(_) => break,
            }
        }
        for chunk in batch.chunks(BUMP_CHUNK_ITEMS) {
            run_bump(&shared, chunk, wait).await;
        }
    }
}

/// Sends one Bump for `slots` and retries it unchanged until it is answered.
pub async fn run_bump(shared: &AllocState, slots: &[Arc<Slot>], wait: Duration) {
    let mut pending: Vec<(Arc<Slot>, u64)> = slots
        .iter()
        .filter_map(|s| s.section.lock().unwrap().bump_in_flight().map(|t| (s.clone(), t)))
        .collect();
    let mut backoff = Duration::from_millis(20);
    loop {
        let incarnation = keep_bumpable(shared, &mut pending);
        if pending.is_empty() {
            return;
        }
        let req = pb::BumpRequest {
            secret: Vec::new(),
            incarnation: incarnation.0,
            items: pending
                .iter()
                .map(|(slot, new_max)| pb::BumpItem {
                    section: slot.id.0,
                    epoch: slot.epoch.0,
                    new_max: *new_max,
                })
                .collect(),
        };
        let sent = Instant::now();
        shared.metrics().bump_rpcs.increment(1);
        match shared.store().bump(req, wait).await {
            Ok(reply) if reply.results.len() == pending.len() => {
                shared.metrics().bump_latency.record(sent.elapsed().as_secs_f64());
                for ((slot, new_max), r) in pending.iter().zip(&reply.results) {
                    settle(shared, slot, *new_max, r);
                }
                return;
            }
            Ok(reply) => {
                error!(
                    items = pending.len(),
                    results = reply.results.len(),
                    "bump reply does not match the request"
                );
                shared.metrics().bump_failures.increment(1);
            }
            Err(StoreFailure::Refused(why)) => {
                warn!(%why, "bump refused; letting the sections go");
                for (slot, _) in &pending {
                    shared.abandon_bump(slot, true);
                }
                return;
            }
            Err(e @ StoreFailure::Unknown(_)) => {
                shared.metrics().bump_failures.increment(1);
                warn!(error = %e, items = pending.len(), "bump outcome unknown; retrying with the same new_max");
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = backoff_after(backoff);
    }
}

/// Keeps only the bumps this node may still send: held slots of the current incarnation, under
/// a valid lease, while not stopping. The others are abandoned (their waiters woken). Returns the
/// incarnation the kept ones are held under.
fn keep_bumpable(shared: &AllocState, pending: &mut Vec<(Arc<Slot>, u64)>) -> Incarnation {
    let incarnation = shared.incarnation();
    let allowed = !shared.is_stopping() && shared.owned().lease_valid(shared.lease_now());
    pending.retain(|(slot, _)| {
        let keep = allowed && slot.incarnation == incarnation && shared.owned().is_held(slot);
        if !keep {
            shared.abandon_bump(slot, false);
        }
        keep
    });
    incarnation
}

/// Records, at a gained section's first acknowledged bump, how long after its grant it could
/// serve: the takeover time callers see, apart from their own retries.
fn note_ready(shared: &AllocState, slot: &Slot, serve_after: Instant) {
    if slot.ready_noted.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let ready = shared.lease_now().max(serve_after);
    let took = ready.saturating_duration_since(slot.gained_at).as_secs_f64();
    let m = shared.metrics();
    if serve_after > slot.gained_at {
        m.gain_ready_lease_wait.record(took);
    } else {
        m.gain_ready_release.record(took);
    }
}

/// One section's result of an answered Bump.
fn settle(shared: &AllocState, slot: &Arc<Slot>, new_max: u64, r: &pb::BumpResult) {
    // Only the epoch the slot holds vouches for the bump: a reply without it (epoch 0) is not an
    // acknowledgement.
    let same_epoch = r.epoch == slot.epoch.0 && r.section == slot.id.0;
    match pb::BumpOutcome::try_from(r.outcome) {
        Ok(pb::BumpOutcome::Applied | pb::BumpOutcome::NoOp) if same_epoch => {
            let serve_after = {
                let mut s = slot.section.lock().unwrap();
                s.bump_acked(new_max);
                s.serve_after()
            };
            shared.metrics().bump_sections.increment(1);
            note_ready(shared, slot, serve_after);
            debug!(section = %slot.id, new_max, "bump acknowledged");
            slot.bumped.notify_waiters();
        }
        Ok(pb::BumpOutcome::StaleEpoch) => {
            info!(section = %slot.id, epoch = %slot.epoch, "bump refused: stale epoch, letting go");
            shared.abandon_bump(slot, true);
        }
        Ok(pb::BumpOutcome::NotOwned) => {
            info!(section = %slot.id, "bump refused: the set is moving the section away, letting go");
            shared.abandon_bump(slot, true);
        }
        Ok(pb::BumpOutcome::OutOfRange) => {
            error!(
                section = %slot.id, new_max, max_seq = r.max_seq,
                "bump refused as too far above the ceiling (this node's view of the ceiling is wrong); letting go"
            );
            shared.abandon_bump(slot, true);
        }
        other => {
            warn!(section = %slot.id, outcome = ?other, result = ?r, "unexpected bump result, letting go");
            shared.abandon_bump(slot, true);
        }
    }
}
