//! The AllocSvr's background tasks, on tokio time (so that tests can run them on a paused clock):
//!
//! - [`renew`]: registration, and the renewal loop that owns the [`Lease`](crate::lease::Lease):
//!   every `renew_interval` it notes `t_send`, sends Renew and, on a confirming reply, applies the
//!   grants (see `grants`) *before* it publishes the extended lease, starts a gain for what was
//!   gained and a release for what was handed over. When the lease runs out everything is dropped;
//!   an unknown incarnation drops everything and registers again.
//! - [`gain`]: loads newly gained sections linearizably in chunks, sets every uid's base to the
//!   loaded `max_seq` and queues them for one Bump per chunk.
//! - [`bump`]: drains the bounded bump queue into Bump RPCs, retries an unknown outcome with the
//!   same `new_max` until it is acknowledged, refused, or the grant is gone, and wakes the fetches
//!   waiting for it.
//! - [`raise`]: raises the marks of the node's id slots a window ahead of the clock.
//! - [`release`]: hands sections over (after a handover request, and at shutdown).
//!
//! Deliberately left out: what the grants mean (pure, in `grants`), the section arithmetic (pure,
//! in `section`) and the lease arithmetic (pure, in `lease`). The tasks only sequence them with IO.

pub mod bump;
pub mod gain;
pub mod raise;
pub mod release;
pub mod renew;

#[cfg(test)]
mod tests;

use std::time::Duration;

use seqsvr_proto::params::SetParams;

/// Longest wait between two attempts of a registration, a load or a bump retry.
const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// How long a renewal or a bump waits for its reply.
///
/// Either may take longer than the renew interval (slow links, a ReadIndex round or a replicated
/// commit): the lease counts from `t_send`, so a late renewal still extends it (giving up after
/// one interval lost leases in the simulator's delay-links fault), and a late bump acknowledgement
/// is still a committed ceiling — the epoch fence, not a timeout, vouches that the section was
/// ours when it was applied. The cost: a bump sent to a leader that was cut off waits this long
/// before the next replica is tried; the prefetch at half a step leaves headroom for that.
pub fn store_reply_wait(p: &SetParams) -> Duration {
    p.renew_interval().max(p.lease() / 2)
}

/// The next backoff after `current`, doubling up to [`RETRY_BACKOFF_MAX`].
fn backoff_after(current: Duration) -> Duration {
    (current * 2).min(RETRY_BACKOFF_MAX)
}
