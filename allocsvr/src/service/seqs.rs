//! The takes of uids: FetchNextSeq (the next seq), Reserve (a block of `count` consecutive seqs)
//! and BatchFetchNextSeq (the next seq of each of up to [`MAX_BATCH`] uids, served grouped by
//! section, with one lock, clock read and lease read per section).
//!
//! Left out: the take itself and its wait for a bump (`take`), and the named counters' takes,
//! which are served in request order by key (`counters`).

use std::sync::atomic::Ordering;

use seqsvr_proto::{SectionId, Uid, pb};

use super::batch::Batch;
use super::check::{Who, batch_len};
use super::reply::{Answer, Answers};
use super::take::Step;
use super::{MAX_BATCH, Service};
use crate::error::Error;
use crate::section::{Next, prefetch};

/// FetchNextSeq: the next seq of one uid.
pub(super) async fn fetch_next_seq(service: &Service, req: pb::FetchNextSeqRequest) -> Result<Answer, Error> {
    let uid = service.check_uid(req.uid)?;
    service.take(Who::uid(uid), 1).await
}

/// Reserve: `count` consecutive seqs of one uid; the answer's value is the first.
pub(super) async fn reserve(service: &Service, req: pb::ReserveRequest) -> Result<Answer, Error> {
    let uid = service.check_uid(req.uid)?;
    let n = service.check_block(req.count)?;
    let taken = service.take(Who::uid(uid), n).await?;
    if taken.0 == pb::Outcome::Ok {
        service.shared.metrics().block_seqs.increment(n);
    }
    Ok(taken)
}

/// BatchFetchNextSeq: the next seq of each uid, by request index.
pub(super) async fn batch_fetch_next_seq(
    service: &Service,
    req: pb::BatchFetchNextSeqRequest,
) -> Result<Answers, Error> {
    batch_len(req.uids.len(), "uids")?;
    service.check_uids(&req.uids)?;
    // Occurrences are served in request order, so a repeated uid gets increasing seqs: once
    // one occurrence waits, every later one of that uid waits too (same `cur_seq`, same
    // ceiling), and the waiting ones are served in request order.
    let who = |i: usize| Who::uid(Uid(req.uids[i]));
    let serve = |batch: &mut Batch| service.serve_by_section(&req.uids, batch);
    let batch = service.take_batch(req.uids.len(), who, serve).await;
    Ok(batch.into_answers())
}

impl Service {
    /// Serves a batch grouped by section: under one read of the section map, one lock, one clock
    /// read and one lease read per section (ownership rule 7 holds per section), after asking
    /// the CPU for every `cur` slot of the batch at once. Uids whose ceiling is reached are left
    /// in `batch.waiting` (in request order) for [`Self::take_batch`], which waits for the bump.
    ///
    /// A uid whose section is exhausted is answered `EXHAUSTED` on its own; the batch's other uids
    /// (some of which already consumed numbers) are answered as usual.
    fn serve_by_section(&self, uids: &[u64], batch: &mut Batch) {
        let size = self.shared.params().section_size;
        let order = by_section(uids, size);
        let owned = self.shared.owned();
        let mut to_bump = Vec::new();
        {
            let view = owned.view();
            let groups = || order.chunk_by(|a, b| a.0 == b.0);
            let offset = |(section, i): (u64, usize)| (uids[i] - section * size) as usize;
            for group in groups() {
                if let Some(slot) = view.slot(SectionId(group[0].0)) {
                    let addr = slot.cur_addr.load(Ordering::Relaxed);
                    group.iter().for_each(|&p| prefetch(addr, offset(p)));
                }
            }
            for group in groups() {
                let section = SectionId(group[0].0);
                let Some(slot) = view.slot(section) else {
                    group.iter().for_each(|&(_, i)| batch.settle(i, Step::NotOwner));
                    continue;
                };
                let mut s = slot.section.lock().unwrap();
                let (now, lease_until) = (self.shared.lease_now(), owned.lease_until());
                let (mut served, mut waits) = (false, false);
                for &p in group {
                    let i = p.1;
                    match s.try_next(offset(p), now, lease_until) {
                        Next::Served(seq) => {
                            served = true;
                            batch.put(i, pb::Outcome::Ok, seq);
                        }
                        Next::NeedBump => {
                            waits = true;
                            batch.waiting.push(i);
                        }
                        Next::NotReady | Next::LeaseExpired => batch.settle(i, Step::NotReady),
                        Next::Exhausted => batch.settle(i, Step::Exhausted(section, s.max_seq())),
                    }
                }
                // Groups are distinct sections, so their owners are distinct: no scan.
                if served {
                    batch.name_new_owner(self.owner(slot));
                    slot.cur_addr.store(s.cur_addr(), Ordering::Relaxed);
                }
                if (served || waits) && s.maybe_prefetch().is_some() {
                    to_bump.push(slot.clone());
                }
            }
        }
        to_bump.into_iter().for_each(|slot| self.shared.queue_prefetch(slot));
        batch.waiting.sort_unstable();
    }
}

/// A batch's uids as (section, position in the batch), grouped by section in ascending order and
/// in request order within a section, with one division per uid. Sorting one `u64` per uid
/// (section above position) takes std's branchless small sort; the (section, position) pairs it
/// replaced took the general one, and that sort with the divisions around it was 3–4 µs of a
/// batch100 call. Pairs remain for sections too large to share a `u64` with a position.
fn by_section(uids: &[u64], size: u64) -> Vec<(u64, usize)> {
    const POS_BITS: u32 = usize::BITS - MAX_BATCH.leading_zeros();
    let sections: Vec<u64> = uids.iter().map(|u| u / size).collect();
    if uids.len() <= MAX_BATCH && sections.iter().all(|s| s >> (u64::BITS - POS_BITS) == 0) {
        let mut keys: Vec<u64> = (sections.iter().zip(0u64..)).map(|(s, i)| s << POS_BITS | i).collect();
        keys.sort_unstable();
        let pos = (1u64 << POS_BITS) - 1;
        return keys.into_iter().map(|k| (k >> POS_BITS, (k & pos) as usize)).collect();
    }
    let mut pairs: Vec<(u64, usize)> = sections.into_iter().zip(0..).collect();
    pairs.sort_unstable();
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_grouped_by_section_in_request_order_within_each() {
        let reference = |uids: &[u64], size: u64| {
            let mut pairs: Vec<(u64, usize)> = uids.iter().map(|u| u / size).zip(0..).collect();
            pairs.sort_by_key(|&(s, _)| s);
            pairs
        };
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for (size, limit) in [(100_000, 6_400_000), (1_000, 50_000), (1, u64::MAX), (7, 1 << 60)] {
            for len in [1, 2, 100, MAX_BATCH] {
                // Repeats included: a small space of uids for some batches.
                let space = if len == 100 { 300 } else { limit };
                let uids: Vec<u64> = (0..len).map(|_| next() % space).collect();
                assert_eq!(
                    by_section(&uids, size),
                    reference(&uids, size),
                    "size {size}, len {len}"
                );
            }
        }
    }
}
