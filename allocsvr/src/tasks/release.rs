//! Giving sections up: after a handover request (so that the next owner need not wait out this
//! node's lease), and every section at shutdown.
//!
//! A Release names each section with the epoch it was granted under and the incarnation that held
//! it, captured when the release is decided (not when it is sent): the store releases a section
//! only while both still match, so a late or repeated Release never takes a section from a later
//! owner.
//!
//! Deliberately left out: retries. A lost handover Release is sent again by the next renewal (the
//! renewal diffs again while a handover is pending); a lost Release at shutdown costs the next owner
//! one lease of waiting.

use std::sync::Arc;
use std::time::Duration;

use seqsvr_proto::pb;
use tracing::{debug, info, warn};

use crate::state::AllocState;

/// Deadline of the Releases sent at shutdown.
pub const SHUTDOWN_RELEASE_DEADLINE: Duration = Duration::from_secs(2);

/// Sends one handover Release. Under the test-only `repeat_releases_after`, the same Release is
/// sent once more, 1–2× that later, as a retry after a lost reply would be.
pub async fn hand_over(shared: Arc<AllocState>, req: pb::ReleaseRequest) {
    if let Some(after) = shared.repeat_releases_after() {
        let late = after + after.mul_f64(rand::random::<f64>());
        let (shared, again) = (shared.clone(), req.clone());
        tokio::spawn(async move {
            tokio::time::sleep(late).await;
            match shared.store().release(again, None).await {
                Ok(r) => info!(
                    released = r.released,
                    late_ms = late.as_millis() as u64,
                    "repeated release landed"
                ),
                Err(e) => debug!(error = %e, "repeated release failed"),
            }
        });
    }
    match shared.store().release(req, None).await {
        Ok(r) => info!(released = r.released, "handed sections over"),
        Err(e) => warn!(error = %e, "release after handover failed; the next owner waits out the lease"),
    }
}

/// Sends the Releases of a leaving node, each within [`SHUTDOWN_RELEASE_DEADLINE`].
pub async fn leave(shared: &AllocState, reqs: Vec<pb::ReleaseRequest>) {
    for req in reqs {
        match shared.store().release(req, Some(SHUTDOWN_RELEASE_DEADLINE)).await {
            Ok(r) => info!(released = r.released, "released sections"),
            Err(e) => warn!(error = %e, "release at shutdown failed; the sections wait out the lease"),
        }
    }
}
