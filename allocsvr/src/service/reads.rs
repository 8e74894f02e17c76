//! The reads: GetCurSeq (a uid's `cur_seq`), CounterGet (a key's value) and BatchGet (uids and
//! keys together, by request index), all answered by the same code ([`Service::peek_slot`]) and
//! none of them waiting: a section not ready is NOT_READY at once.
//!
//! P5: a read answers the uid's or key's `cur_seq`, or the loaded base for one not taken since this
//! node gained the section — which can be above anything ever issued (the base is a ceiling).
//!
//! Left out: the takes (`seqs`, `counters`).

use std::sync::Arc;

use seqsvr_proto::{Uid, pb};

use super::Service;
use super::batch::Batch;
use super::check::{Who, batch_len, no_count};
use super::reply::{Answer, Answers};
use crate::error::Error;
use crate::owned::Slot;
use crate::section::Peek;

/// GetCurSeq: one uid's `cur_seq` (P5).
pub(super) async fn get_cur_seq(service: &Service, req: pb::GetCurSeqRequest) -> Result<Answer, Error> {
    let uid = service.check_uid(req.uid)?;
    Ok(service.peek(Who::uid(uid)))
}

/// CounterGet: one key's value, as GetCurSeq reads a uid's.
pub(super) async fn counter_get(service: &Service, req: pb::CounterRequest) -> Result<Answer, Error> {
    let who = service.check_key(&req.key)?;
    no_count(req.count, "CounterGet")?;
    Ok(service.peek(who))
}

/// BatchGet: the uids' values, then the keys', by request index (uids first).
pub(super) async fn batch_get(service: &Service, req: pb::BatchGetRequest) -> Result<Answers, Error> {
    batch_len(req.uids.len() + req.keys.len(), "uids and keys")?;
    service.check_uids(&req.uids)?;
    let mut whos = Vec::with_capacity(req.uids.len() + req.keys.len());
    whos.extend(req.uids.iter().map(|&uid| Who::uid(Uid(uid))));
    service.check_keys(&req.keys, &mut whos)?;
    let mut batch = Batch::new(whos.len());
    service.peek_each(&whos, &mut batch);
    Ok(batch.into_answers())
}

impl Service {
    /// `cur_seq` of `who` (P5): the outcome, the value and the owner.
    pub(super) fn peek(&self, who: Who<'_>) -> Answer {
        let section = who.pos.section(self.shared.params().section_size);
        self.shared.owned().with(section, |slot| self.peek_slot(slot, who))
    }

    /// [`Self::peek`] of `who` in `slot`, the section map's entry for its section, looked up by
    /// the caller: a batch looks every item up under one read of the map.
    fn peek_slot(&self, slot: Option<&Arc<Slot>>, who: Who<'_>) -> Answer {
        let Some(slot) = slot else {
            return (pb::Outcome::NotOwner, 0, None);
        };
        let counter = who.counter(self.shared.params().section_size);
        let s = slot.section.lock().unwrap();
        match s.cur_seq(counter, self.shared.lease_now(), self.shared.owned().lease_until()) {
            Peek::Value(v) => (pb::Outcome::Ok, v, Some(self.owner(slot))),
            Peek::NotReady | Peek::LeaseExpired => (pb::Outcome::NotReady, 0, None),
        }
    }

    /// Reads every item of a batch as [`Self::peek`] does, under one read of the section map
    /// (as `serve_keys`, whose profile showed a lookup of the map per item to cost the most):
    /// one lock, clock read and lease read per item.
    fn peek_each(&self, whos: &[Who<'_>], batch: &mut Batch) {
        let size = self.shared.params().section_size;
        let view = self.shared.owned().view();
        for (i, &who) in whos.iter().enumerate() {
            batch.read(i, self.peek_slot(view.slot(who.pos.section(size)), who));
        }
    }
}
