//! The takes of named counters' keys: CounterNext (the next value), CounterReserve (a block of
//! `count` values) and CounterBatch (the next value of each of up to
//! [`MAX_BATCH`](super::MAX_BATCH) keys, served in request order). A key is checked and placed in
//! the uid space by `check`, then taken exactly as a uid is, with `Counter::Key(key)` where a uid
//! has its offset.
//!
//! CounterGet, which takes nothing, is in `reads`.
//!
//! Left out: the take itself and its wait for a bump (`take`).

use seqsvr_proto::pb;

use super::Service;
use super::batch::Batch;
use super::check::{Who, batch_len, no_count};
use super::reply::{Answer, Answers};
use super::take::Step;
use crate::error::Error;
use crate::section::Next;

/// CounterNext: the next value of one key.
pub(super) async fn counter_next(service: &Service, req: pb::CounterRequest) -> Result<Answer, Error> {
    let who = service.check_key(&req.key)?;
    no_count(req.count, "CounterNext")?;
    let taken = service.take(who, 1).await?;
    if taken.0 == pb::Outcome::Ok {
        service.shared.metrics().key_seqs.increment(1);
    }
    Ok(taken)
}

/// CounterReserve: `count` consecutive values of one key; the answer's value is the first.
pub(super) async fn counter_reserve(service: &Service, req: pb::CounterRequest) -> Result<Answer, Error> {
    let who = service.check_key(&req.key)?;
    let n = service.check_block(req.count)?;
    let taken = service.take(who, n).await?;
    if taken.0 == pb::Outcome::Ok {
        service.shared.metrics().key_seqs.increment(n);
        service.shared.metrics().block_seqs.increment(n);
    }
    Ok(taken)
}

/// CounterBatch: the next value of each key, by request index.
pub(super) async fn counter_batch(service: &Service, req: pb::CounterBatchRequest) -> Result<Answers, Error> {
    batch_len(req.keys.len(), "keys")?;
    let mut whos = Vec::with_capacity(req.keys.len());
    service.check_keys(&req.keys, &mut whos)?;
    let serve = |batch: &mut Batch| service.serve_keys(&whos, batch);
    let batch = service.take_batch(whos.len(), |i| whos[i], serve).await;
    let ok = batch.count_of(pb::Outcome::Ok);
    service.shared.metrics().key_seqs.increment(ok as u64);
    Ok(batch.into_answers())
}

impl Service {
    /// Serves a batch of keys in request order under one read of the section map (a lookup of the
    /// map per key was the largest cost of `CounterBatch` in a profile), one lock, clock read and
    /// lease read per key (rule 7). Keys whose ceiling is reached are left in `batch.waiting`; a
    /// later occurrence of such a key waits too, so that a repeated key still gets increasing
    /// values in request order even if the bump lands in between.
    fn serve_keys(&self, whos: &[Who<'_>], batch: &mut Batch) {
        let size = self.shared.params().section_size;
        let owned = self.shared.owned();
        let mut waiting_keys: std::collections::HashSet<&str> = std::collections::HashSet::new();
        let mut to_bump = Vec::new();
        {
            let view = owned.view();
            for (i, who) in whos.iter().enumerate() {
                let key = who.key.unwrap_or_default();
                if waiting_keys.contains(&key) {
                    batch.waiting.push(i);
                    continue;
                }
                let section = who.pos.section(size);
                let Some(slot) = view.slot(section) else {
                    batch.settle(i, Step::NotOwner);
                    continue;
                };
                let mut s = slot.section.lock().unwrap();
                match s.try_take(who.counter(size), 1, self.shared.lease_now(), owned.lease_until()) {
                    Next::Served(seq) => batch.settle(
                        i,
                        Step::Served {
                            seq,
                            owner: self.owner(slot),
                        },
                    ),
                    Next::NeedBump => {
                        waiting_keys.insert(key);
                        batch.waiting.push(i);
                    }
                    Next::NotReady | Next::LeaseExpired => batch.settle(i, Step::NotReady),
                    Next::Exhausted => batch.settle(i, Step::Exhausted(section, s.max_seq())),
                }
                if s.maybe_prefetch().is_some() {
                    to_bump.push(slot.clone());
                }
            }
        }
        to_bump.into_iter().for_each(|slot| self.shared.queue_prefetch(slot));
    }
}
