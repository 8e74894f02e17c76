//! Taking newly gained sections: a linearizable Load of their `max_seq`, the base of every uid set
//! to it (memory never crosses epochs), and the first Bump queued.
//!
//! One Load per [`LOAD_CHUNK_SECTIONS`] sections, one after the other: a Load of every section of
//! a large set would not fit a reply (2^20 sections make 10–46 MiB). Each chunk is queued for its
//! bump as soon as it is loaded, so the first sections serve while the later ones load.
//!
//! Deliberately left out: the lease wait (the slot carries its `serve_after`, checked on every
//! fetch) and retrying for ever: after [`LOAD_ATTEMPTS`] the sections are given up and the next
//! renewal gains them again through the normal path.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use seqsvr_proto::limits::LOAD_CHUNK_SECTIONS;
use seqsvr_proto::pb;
use tracing::{info, warn};

use super::backoff_after;
use crate::grants::ranges;
use crate::owned::Slot;
use crate::state::AllocState;
use crate::store::StoreFailure;

/// Attempts of the Load of newly gained sections before giving them up until the next renewal.
pub const LOAD_ATTEMPTS: u32 = 5;

/// Loads gained sections chunk by chunk, sets their base and queues them for Bumps.
pub async fn gain(shared: Arc<AllocState>, slots: Vec<Arc<Slot>>) {
    for chunk in load_chunks(slots) {
        gain_chunk(&shared, chunk).await;
    }
}

/// Splits gained slots into runs of at most [`LOAD_CHUNK_SECTIONS`], in section order.
pub fn load_chunks(mut slots: Vec<Arc<Slot>>) -> Vec<Vec<Arc<Slot>>> {
    slots.sort_unstable_by_key(|s| s.id);
    let mut chunks = Vec::with_capacity(slots.len().div_ceil(LOAD_CHUNK_SECTIONS as usize));
    let mut rest = slots.into_iter().peekable();
    while rest.peek().is_some() {
        chunks.push(rest.by_ref().take(LOAD_CHUNK_SECTIONS as usize).collect());
    }
    chunks
}

/// Loads one chunk (a single Load), sets the bases and queues the chunk for its Bumps (the bumper splits it).
async fn gain_chunk(shared: &Arc<AllocState>, slots: Vec<Arc<Slot>>) {
    let Some(reply) = load(shared, &slots).await else {
        let dropped: Vec<_> = slots.into_iter().filter(|s| shared.owned().remove_if_held(s)).collect();
        shared.let_go(&dropped);
        return;
    };
    let states: HashMap<u64, &pb::SectionState> = reply.sections.iter().map(|s| (s.section, s)).collect();
    let mut to_bump = Vec::with_capacity(slots.len());
    let mut lost = Vec::new();
    for slot in slots {
        match states.get(&slot.id.0) {
            Some(st) if st.epoch == slot.epoch.0 && st.owner_incarnation == slot.incarnation.0 => {
                let kept = shared.take_kept(slot.id);
                let started = {
                    let mut s = slot.section.lock().unwrap();
                    s.loaded(st.max_seq, kept);
                    s.maybe_prefetch().is_some()
                };
                if started {
                    to_bump.push(slot);
                }
            }
            Some(st) => {
                info!(section = %slot.id, epoch = st.epoch, owner = st.owner_incarnation, "grant moved on before load");
                lost.push(slot);
            }
            None => {
                warn!(section = %slot.id, "load reply lacks a section");
                lost.push(slot);
            }
        }
    }
    let dropped: Vec<_> = lost.into_iter().filter(|s| shared.owned().remove_if_held(s)).collect();
    shared.let_go(&dropped);
    if !to_bump.is_empty() {
        shared.queue_bumps(to_bump).await;
    }
}

/// The Load of `slots`, retried with backoff while any of them is still held.
async fn load(shared: &AllocState, slots: &[Arc<Slot>]) -> Option<pb::LoadReply> {
    let req = pb::LoadRequest {
        sections: ranges(slots.iter().map(|s| s.id)),
    };
    let mut backoff = Duration::from_millis(50);
    for attempt in 1..=LOAD_ATTEMPTS {
        if !slots.iter().any(|s| shared.owned().is_held(s)) {
            return None;
        }
        match shared.store().load(req.clone()).await {
            Ok(r) => return Some(r),
            Err(e) => {
                warn!(attempt, error = %e, "load of gained sections failed");
                if matches!(e, StoreFailure::Refused(_)) {
                    return None;
                }
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = backoff_after(backoff);
    }
    None
}
