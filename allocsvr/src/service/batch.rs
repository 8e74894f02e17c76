//! A batch's answers being filled in by request index ([`Batch`]), for BatchFetchNextSeq,
//! CounterBatch and BatchGet, and the way a batch of takes ends: the items whose ceiling was
//! reached wait for their bumps, in request order, within the batch's one [`BUMP_WAIT`].
//!
//! A section can be served under two owners in one batch (dropped and regained mid-batch, or a
//! new incarnation): each owner is named once, in order of first appearance, so that no seq is
//! attributed to the wrong one, and without a scan of the list per item in a long batch.
//!
//! Left out: how a batch is served before any wait (by section in `seqs`, in request order in
//! `counters`, by reads in `reads`).

use std::collections::HashSet;

use seqsvr_proto::pb;

use super::check::Who;
use super::reply::{Answer, Answers};
use super::take::Step;
use super::{BUMP_WAIT, Service};

/// A batch reply being filled in, by request index.
pub(super) struct Batch {
    outcomes: Vec<i32>,
    values: Vec<u64>,
    owners: Vec<pb::Owner>,
    /// `owners` as a set, made once they are too many to scan for each served item (a batch of
    /// 1,000 keys in as many sections scanned the list for every key: 2.5 million instructions a
    /// call under callgrind, more than the rest of the serving), then kept in step with them.
    named: Option<HashSet<OwnerKey, foldhash::fast::RandomState>>,
    any_not_owner: bool,
    /// Indexes whose uid waits for a bump, in request order.
    pub(super) waiting: Vec<usize>,
}

/// Every field of an owner: two entries that differ in any of them are two owners.
type OwnerKey = (u64, u64, u64, u64, u64);

fn owner_key(o: &pb::Owner) -> OwnerKey {
    (o.section, o.node_id, o.incarnation, o.epoch, o.set_id)
}

/// Owners a batch scans for a repeat before it keeps them in a set instead (callgrind: a scan of
/// 30 costs less than making and filling the set).
const SCAN_OWNERS: usize = 32;

impl Batch {
    pub(super) fn new(len: usize) -> Self {
        Self {
            outcomes: vec![pb::Outcome::NotReady as i32; len],
            values: vec![0; len],
            owners: Vec::new(),
            named: None,
            any_not_owner: false,
            waiting: Vec::new(),
        }
    }

    pub(super) fn put(&mut self, i: usize, outcome: pb::Outcome, value: u64) {
        self.outcomes[i] = outcome as i32;
        self.values[i] = value;
    }

    /// Records the answer for index `i`.
    pub(super) fn settle(&mut self, i: usize, step: Step) {
        match step {
            Step::Served { seq, owner } => {
                self.put(i, pb::Outcome::Ok, seq);
                self.note_owner(owner);
            }
            Step::NotOwner => {
                self.any_not_owner = true;
                self.put(i, pb::Outcome::NotOwner, 0);
            }
            Step::Exhausted(..) => self.put(i, pb::Outcome::Exhausted, 0),
            Step::NotReady | Step::Wait(_) => self.put(i, pb::Outcome::NotReady, 0),
        }
    }

    /// Records a read's answer for index `i` (a read takes nothing, so it is never EXHAUSTED).
    pub(super) fn read(&mut self, i: usize, (outcome, value, owner): Answer) {
        self.put(i, outcome, value);
        self.any_not_owner |= outcome == pb::Outcome::NotOwner;
        if let Some(owner) = owner {
            self.note_owner(owner);
        }
    }

    /// Adds `owner` to the reply's owners unless the same one is already named, keeping their
    /// order of first appearance. A section can be served under two owners in one batch (dropped
    /// and regained mid-batch, or a new incarnation): each (section, incarnation, epoch) is named,
    /// so that no seq is attributed to the wrong one.
    fn note_owner(&mut self, owner: pb::Owner) {
        if self.named.is_none() && self.owners.len() < SCAN_OWNERS {
            if !self.owners.contains(&owner) {
                self.owners.push(owner);
            }
            return;
        }
        let (owners, items) = (&self.owners, self.outcomes.len());
        let named = self.named.get_or_insert_with(|| {
            // Sized for the most owners the batch can name (one per item): it never grows.
            let mut named = HashSet::with_capacity_and_hasher(items, Default::default());
            named.extend(owners.iter().map(owner_key));
            named
        });
        if named.insert(owner_key(&owner)) {
            self.owners.push(owner);
        }
    }

    /// Adds an owner the caller knows is not named yet (a section's group, each served once).
    pub(super) fn name_new_owner(&mut self, owner: pb::Owner) {
        if let Some(named) = &mut self.named {
            named.insert(owner_key(&owner));
        }
        self.owners.push(owner);
    }

    /// How many items are answered `outcome`.
    pub(super) fn count_of(&self, outcome: pb::Outcome) -> usize {
        self.outcomes.iter().filter(|&&o| o == outcome as i32).count()
    }

    pub(super) fn into_answers(self) -> Answers {
        Answers {
            outcomes: self.outcomes,
            values: self.values,
            owners: self.owners,
            any_not_owner: self.any_not_owner,
        }
    }
}

impl Service {
    /// Serves a batch of `len` takes of one number each: `serve` answers what it can at once and
    /// leaves in `batch.waiting`, in request order, the items whose ceiling is reached; those then
    /// wait for the bump, in request order, within the batch's one [`BUMP_WAIT`] (`who` names
    /// item `i`). The outcomes are counted, once per kind.
    pub(super) async fn take_batch<'k>(
        &self,
        len: usize,
        who: impl Fn(usize) -> Who<'k>,
        serve: impl FnOnce(&mut Batch),
    ) -> Batch {
        let deadline = tokio::time::Instant::now() + BUMP_WAIT;
        let mut batch = Batch::new(len);
        serve(&mut batch);
        for i in std::mem::take(&mut batch.waiting) {
            let step = self.fetch(who(i), 1, deadline).await;
            batch.settle(i, step);
        }
        self.count_batch(&batch);
        batch
    }

    /// One metrics increment per outcome kind of a batch, not one per uid.
    fn count_batch(&self, batch: &Batch) {
        let m = self.shared.metrics();
        let ok = batch.count_of(pb::Outcome::Ok);
        let not_owner = batch.count_of(pb::Outcome::NotOwner);
        m.fetch_ok.increment(ok as u64);
        m.fetch_not_owner.increment(not_owner as u64);
        m.fetch_not_ready
            .increment((batch.outcomes.len() - ok - not_owner) as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_names_every_owner_of_a_section_it_was_served_under() {
        let owner = |incarnation, epoch| pb::Owner {
            section: 3,
            node_id: 1,
            incarnation,
            epoch,
            set_id: 0,
        };
        let mut batch = Batch::new(0);
        for o in [owner(7, 2), owner(7, 2), owner(7, 3), owner(9, 4)] {
            batch.note_owner(o);
        }
        assert_eq!(batch.owners, vec![owner(7, 2), owner(7, 3), owner(9, 4)]);
    }

    #[test]
    fn a_long_batch_names_each_owner_once_in_order_of_first_appearance() {
        let owner = |section, epoch| pb::Owner {
            section,
            node_id: 1,
            incarnation: 7,
            epoch,
            set_id: 0,
        };
        // Past SCAN_OWNERS the set takes over, including owners named before it was made.
        let distinct: Vec<pb::Owner> = (0..3 * SCAN_OWNERS as u64).map(|s| owner(s, 2)).collect();
        let mut batch = Batch::new(0);
        batch.name_new_owner(distinct[0]);
        for (i, o) in distinct.iter().enumerate().skip(1) {
            batch.note_owner(*o);
            batch.note_owner(distinct[i / 2]);
        }
        batch.note_owner(owner(5, 3));
        batch.name_new_owner(owner(99, 2));
        batch.note_owner(owner(99, 2));
        batch.note_owner(owner(5, 3));
        let mut want = distinct;
        want.extend([owner(5, 3), owner(99, 2)]);
        assert_eq!(batch.owners, want);
    }
}
