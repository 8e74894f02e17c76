//! Raising the marks of the id slots this node holds, ahead of use, as a bump raises a ceiling:
//! every [`RAISE_TICK`], or at once when a call found too little headroom, every slot with less
//! than half a window left is raised a window ahead of the clock, in one RaiseMarks (fenced by
//! each slot's epoch and bound to the registration by `store::Bound`).
//!
//! An unknown outcome is simply asked again at the next tick: a raise is idempotent (applied only
//! upward under its epoch), and nothing is issued above a mark until its acknowledgement arrives.
//! A raise refused as too far ahead of the store leader's clock means this host's clock runs
//! ahead: it is logged and counted, and ids stay refused until the clocks agree again.
//!
//! Left out: which marks are due (`ids`) and issuing.

use std::sync::Arc;
use std::time::Duration;

use seqsvr_proto::pb;
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::state::AllocState;

/// How often the raiser looks at its slots' headroom without being asked.
pub const RAISE_TICK: Duration = Duration::from_millis(100);

/// How long one RaiseMarks may take before the next tick asks again.
const RAISE_WAIT: Duration = Duration::from_secs(2);

/// Raises due marks until `stop`.
pub async fn raiser(shared: Arc<AllocState>, mut stop: watch::Receiver<bool>) {
    loop {
        // Holding no slot (the set has no ids yet, or none was granted), there is nothing to raise
        // until a renewal brings one; it wakes the raiser.
        let idle = shared.ids().held() == 0;
        tokio::select! {
            biased;
            _ = stop.changed() => return,
            () = shared.ids().raise_wanted.notified() => {}
            () = tokio::time::sleep(RAISE_TICK), if !idle => {}
        }
        if shared.is_stopping() {
            return;
        }
        raise_once(&shared).await;
        if let Some(headroom) = shared.ids().min_headroom() {
            shared.metrics().id_mark_headroom_ticks.set(headroom as f64);
        }
        if let Some(layout) = shared.ids().layout() {
            let years = layout.years_left(shared.ids().now_ms());
            shared.metrics().id_years_left.set(years);
        }
    }
}

/// One RaiseMarks for every slot that is due, if any.
pub async fn raise_once(shared: &AllocState) {
    let items = shared.ids().raises_due();
    if items.is_empty() {
        return;
    }
    let req = pb::RaiseMarksRequest {
        incarnation: shared.incarnation().0,
        items,
        secret: Vec::new(),
    };
    let sent = tokio::time::Instant::now();
    match shared.store().raise_marks(req, RAISE_WAIT).await {
        Ok(reply) => {
            let too_far = shared.ids().on_raised(&reply.results, reply.leader_ms, sent);
            if let Some(r) = too_far.first() {
                shared.metrics().id_raises_too_far_ahead.increment(too_far.len() as u64);
                warn!(
                    slot = r.slot,
                    limit = r.limit,
                    max_ahead_ms = shared.ids().max_ahead_ms(),
                    "the store refused a mark this far ahead of its leader's clock: this host's clock runs ahead; \
                     no ids are issued past the limit"
                );
            }
        }
        Err(e) => {
            shared.metrics().id_raise_failures.increment(1);
            debug!(error = %e, "raising id slot marks failed; asked again at the next tick");
        }
    }
}
