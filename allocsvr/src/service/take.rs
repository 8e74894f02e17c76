//! One take of `n` numbers of a uid or key (1 for a fetch, more for a block), as FetchNextSeq,
//! Reserve, CounterNext and CounterReserve do, and as a batch does for an item that waits.
//!
//! Hot path: read lock on the section map, one short lock of the section, in which the lease end
//! and `now` are read and the seq is incremented (ownership rule 7), reply. No `.await` while a
//! lock is held. When the acknowledged ceiling is reached the take waits, without any lock, for
//! the section's in-flight bump — at most [`BUMP_WAIT`] — then answers NOT_READY. An exhausted
//! section (its `max_seq` at the end of the 64-bit space) is a refusal, RESOURCE_EXHAUSTED.
//!
//! Left out: a batch's serving under one read of the map (`seqs`, `counters`) and reads, which
//! never wait (`reads`).

use std::sync::Arc;

use seqsvr_plumbing::serve_limits::InFlight;
use seqsvr_proto::{SectionId, pb};

use super::check::Who;
use super::reply::Answer;
use super::{BUMP_WAIT, Service};
use crate::error::Error;
use crate::owned::Slot;
use crate::section::Next;

/// Bound on re-checks while waiting for a bump (each is woken by an ack or an abandon).
const MAX_WAKEUPS: u32 = 8;

/// Outcome of one fetch attempt.
pub(super) enum Step {
    Served {
        seq: u64,
        owner: pb::Owner,
    },
    NotOwner,
    NotReady,
    /// The ceiling is reached; a bump is in flight on this slot.
    Wait(Arc<Slot>),
    /// The section's sequence space is used up (its `max_seq`).
    Exhausted(SectionId, u64),
}

impl Step {
    /// The error for a uid or key whose section cannot hand out any more numbers.
    pub(super) fn exhausted(who: Who<'_>, section: SectionId, max_seq: u64) -> Error {
        Error::Exhausted(format!(
            "{who} (section {}) has used up the 64-bit sequence space (max_seq {max_seq}): \
             no further seq can be handed out for it",
            section.0
        ))
    }
}

impl Service {
    /// Takes `n` seqs of `who` (1 for a fetch, more for a block): `Served` names the first.
    pub(super) fn fetch_once(&self, who: Who<'_>, n: u64) -> Step {
        let size = self.shared.params().section_size;
        let (section, counter) = (who.pos.section(size), who.counter(size));
        let (step, prefetch) = self.shared.owned().with(section, |slot| {
            let Some(slot) = slot else {
                return (Step::NotOwner, None);
            };
            let mut s = slot.section.lock().unwrap();
            let next = s.try_take(counter, n, self.shared.lease_now(), self.shared.owned().lease_until());
            let step = match next {
                Next::Served(seq) => Step::Served {
                    seq,
                    owner: self.owner(slot),
                },
                Next::NeedBump => Step::Wait(slot.clone()),
                Next::Exhausted => return (Step::Exhausted(section, s.max_seq()), None),
                Next::NotReady | Next::LeaseExpired => return (Step::NotReady, None),
            };
            let prefetch = s.maybe_prefetch().map(|_| slot.clone());
            (step, prefetch)
        });
        if let Some(slot) = prefetch {
            self.shared.queue_prefetch(slot);
        }
        step
    }

    /// Fetches one uid, waiting for an in-flight bump until `deadline` at most. A call that waits
    /// gives back its slot of the server's in-flight limit first ([`InFlight::step_out`]): the
    /// limit is kept small to bound the calls competing for the CPU, and a wait for the store uses
    /// none.
    pub(super) async fn fetch(&self, who: Who<'_>, n: u64, deadline: tokio::time::Instant) -> Step {
        for wakeup in 0..MAX_WAKEUPS {
            let slot = match self.fetch_once(who, n) {
                Step::Wait(slot) => slot,
                other => return other,
            };
            if wakeup == 0 {
                self.shared.metrics().ceiling_waits.increment(1);
            }
            let notified = slot.bumped.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // The bump may have been acknowledged between the first try and `enable`.
            match self.fetch_once(who, n) {
                Step::Wait(_) => {}
                other => return other,
            }
            InFlight::step_out();
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                break;
            }
        }
        Step::NotReady
    }

    /// One FetchNextSeq (`n` = 1) or Reserve: waits for a bump until [`BUMP_WAIT`], counts the
    /// outcome, and gives the reply's outcome, first seq (0 unless OK) and owner; an exhausted
    /// section is RESOURCE_EXHAUSTED.
    pub(super) async fn take(&self, who: Who<'_>, n: u64) -> Result<Answer, Error> {
        let step = self.fetch(who, n, tokio::time::Instant::now() + BUMP_WAIT).await;
        self.count(&step);
        Ok(match step {
            Step::Served { seq, owner } => (pb::Outcome::Ok, seq, Some(owner)),
            Step::NotOwner => (pb::Outcome::NotOwner, 0, None),
            Step::NotReady | Step::Wait(_) => (pb::Outcome::NotReady, 0, None),
            Step::Exhausted(section, max_seq) => return Err(Step::exhausted(who, section, max_seq)),
        })
    }

    fn count(&self, step: &Step) {
        let m = self.shared.metrics();
        match step {
            Step::Served { .. } => m.fetch_ok.increment(1),
            Step::NotOwner => m.fetch_not_owner.increment(1),
            Step::NotReady | Step::Wait(_) | Step::Exhausted(..) => m.fetch_not_ready.increment(1),
        }
    }
}
