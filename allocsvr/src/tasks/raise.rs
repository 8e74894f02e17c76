//! Raising the marks of the id slots this node holds, ahead of use, as a bump raises a ceiling:
//! every [`RAISE_TICK`], or at once when a call found too little headroom, every slot with less
//! than half a window left is raised a window ahead of the clock, in one RaiseMarks (fenced by
//! each slot's epoch and bound to the registration by `store::Bound`).
//!
//! An unknown outcome is simply asked again: a raise is idempotent (applied only upward under its
//! epoch), and nothing is issued above a mark until its acknowledgement arrives.
//! A raise answered as too far ahead of the store leader's clock means this host's clock runs
//! ahead of the store's: the store caps the mark (an older one refuses it), the holder issues up
//! to the cap, and the raise is logged (at most every [`WARN_EVERY`]) and counted.
//!
//! **Backing off.** A raise that leaves some slot still due (refused, capped short of what it
//! needs, or failed) is not asked again at once, even when a call wants one: the next attempt
//! waits [`RAISE_TICK`], doubling up to [`MAX_BACKOFF`], until a raise leaves nothing due. Without
//! that a holder whose clock is ahead of the store leader's sent a RaiseMarks — a Raft entry,
//! fsynced on every replica — for every call it refused, thousands a second (issue 47).
//!
//! Left out: which marks are due (`ids::slots`) and issuing.

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

/// Longest wait between two raises while they leave slots due.
pub const MAX_BACKOFF: Duration = Duration::from_millis(3_200);

/// At most one warning about a capped raise per this interval.
pub const WARN_EVERY: Duration = Duration::from_secs(10);

/// Raises due marks until `stop`.
pub async fn raiser(shared: Arc<AllocState>, mut stop: watch::Receiver<bool>) {
    let mut backoff = Backoff::default();
    loop {
        // Holding no slot (the set has no ids yet, or none was granted), there is nothing to raise
        // until a renewal brings one; it wakes the raiser.
        let idle = shared.ids().held() == 0;
        let pause = backoff.pause();
        tokio::select! {
            biased;
            _ = stop.changed() => return,
            () = shared.ids().raise_wanted.notified(), if pause.is_none() => {}
            () = tokio::time::sleep(pause.unwrap_or(RAISE_TICK)), if !idle || pause.is_some() => {}
        }
        if shared.is_stopping() {
            return;
        }
        let sent = raise_once(&shared).await;
        backoff.after(sent && !shared.ids().raises_due().is_empty());
        if let Some(headroom) = shared.ids().min_headroom() {
            shared.metrics().id_mark_headroom_ticks.set(headroom as f64);
        }
        if let Some(layout) = shared.ids().layout() {
            let years = layout.years_left(shared.ids().now_ms());
            shared.metrics().id_years_left.set(years);
        }
    }
}

/// The raiser's wait after raises that left slots due: none after one that left nothing due,
/// then [`RAISE_TICK`], doubling up to [`MAX_BACKOFF`].
#[derive(Debug, Default)]
struct Backoff {
    next: Option<Duration>,
}

impl Backoff {
    /// How long to wait before the next raise, whatever wakes the raiser (`None`: raise when
    /// asked, or at the next tick).
    fn pause(&self) -> Option<Duration> {
        self.next
    }

    /// After a raise: `short`, it left some slot due.
    fn after(&mut self, short: bool) {
        self.next = short.then(|| self.next.map_or(RAISE_TICK, |d| (d * 2).min(MAX_BACKOFF)));
    }
}

/// One RaiseMarks for every slot that is due, if any; whether one was sent.
pub async fn raise_once(shared: &AllocState) -> bool {
    let items = shared.ids().raises_due();
    if items.is_empty() {
        return false;
    }
    let req = pb::RaiseMarksRequest {
        incarnation: shared.incarnation().0,
        items,
        secret: Vec::new(),
    };
    let sent = tokio::time::Instant::now();
    match shared.store().raise_marks(req, RAISE_WAIT).await {
        Ok(reply) => {
            let applied = shared.ids().on_raised(&reply.results, reply.leader_ms, sent);
            if let Some(r) = applied.too_far.first() {
                shared
                    .metrics()
                    .id_raises_too_far_ahead
                    .increment(applied.too_far.len() as u64);
                if shared.ids().warn_due(WARN_EVERY) {
                    warn!(
                        slot = r.slot,
                        limit = r.limit,
                        mark = r.mark,
                        max_ahead_ms = shared.ids().max_ahead_ms(),
                        "the store capped a mark at its leader's clock plus the allowance: this AllocSvr's clock \
                         runs ahead of the store's (the StoreSvr quorum's, or its leader's when the leader cannot \
                         compare; its storesvr_clock_skew_ms says which); no id is issued past the cap"
                    );
                }
            }
        }
        Err(e) => {
            shared.metrics().id_raise_failures.increment(1);
            debug!(error = %e, "raising id slot marks failed; asked again after a pause");
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_doubles_while_raises_fall_short_and_ends_with_one_that_does_not() {
        let mut b = Backoff::default();
        assert_eq!(b.pause(), None);
        let mut pauses = Vec::new();
        for _ in 0..7 {
            b.after(true);
            pauses.push(b.pause().unwrap().as_millis());
        }
        assert_eq!(pauses, [100, 200, 400, 800, 1_600, 3_200, 3_200]);
        b.after(false);
        assert_eq!(b.pause(), None);
    }
}
