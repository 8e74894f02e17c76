//! The map of owned sections and the published lease end, read on every fetch.
//!
//! The map is a `RwLock<Vec<Option<Arc<Slot>>>>` indexed by `section - first section of the
//! set`: a fetch takes the read lock, indexes, and locks one section's short `std::sync::Mutex`;
//! the renewal task takes the write lock only when ownership actually changes. The lease end is
//! an atomic (nanoseconds since a base instant of the lease clock), read inside the section lock so that the check
//! and the increment are one critical section (docs/DESIGN.md, Ownership).
//!
//! Deliberately left out: deciding what to own (see `grants`, `tasks::renew`) and how to serve
//! (see `service`).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use tokio::time::Instant;

use seqsvr_proto::{Epoch, Incarnation, SectionId};
use tokio::sync::Notify;

use crate::section::Section;

/// One owned section: fixed identity outside the lock, memory inside it.
#[derive(Debug)]
pub struct Slot {
    pub id: SectionId,
    /// The epoch it was granted under; a different epoch in a later grant means a new slot.
    pub epoch: Epoch,
    /// The incarnation that holds it (bumps are sent under it).
    pub incarnation: Incarnation,
    pub section: Mutex<Section>,
    /// Woken when a bump of this section was acknowledged or abandoned.
    pub bumped: Notify,
    /// [`Section::cur_addr`], published for lock-free prefetching by batches (0 = not yet).
    pub cur_addr: AtomicUsize,
    /// When the renewal that granted it was sent (the gain wait counts from there).
    pub gained_at: Instant,
    /// Whether the time from the grant to servable has been recorded (once per slot).
    pub ready_noted: AtomicBool,
}

impl Slot {
    pub fn new(section: Section, incarnation: Incarnation, gained_at: Instant) -> Self {
        Self {
            id: section.id(),
            epoch: section.epoch(),
            incarnation,
            section: Mutex::new(section),
            bumped: Notify::new(),
            cur_addr: AtomicUsize::new(0),
            gained_at,
            ready_noted: AtomicBool::new(false),
        }
    }
}

/// The section map under its read lock (see [`Owned::view`]); keep it for microseconds only, the
/// renewal task's ownership changes wait for it.
pub struct View<'a> {
    slots: std::sync::RwLockReadGuard<'a, Vec<Option<Arc<Slot>>>>,
    first_section: u64,
}

impl View<'_> {
    /// The slot held for `section`, if any.
    pub fn slot(&self, section: SectionId) -> Option<&Arc<Slot>> {
        let i = section.0.checked_sub(self.first_section)?;
        self.slots.get(i as usize)?.as_ref()
    }
}

/// All sections of the set this node may hold, and its lease.
pub struct Owned {
    first_section: u64,
    slots: RwLock<Vec<Option<Arc<Slot>>>>,
    clock_base: Instant,
    /// Lease end as nanoseconds since `clock_base`; 0 = no lease.
    lease_until_nanos: AtomicU64,
    /// Counts every change of the map, so that the renewal can skip diffing unchanged grants.
    generation: AtomicU64,
    /// Held sections, kept under the write lock: counting 2^20 slots on every renewal cost a
    /// debug build 50–100 ms, enough to miss a renewal while gaining a large set.
    held: AtomicUsize,
}

impl Owned {
    /// An empty map for the sections `[first_section, first_section + count)`; `now` is on the
    /// lease clock, which every lease end published here is read on.
    pub fn new(first_section: u64, count: usize, now: Instant) -> Self {
        Self {
            first_section,
            slots: RwLock::new(vec![None; count]),
            clock_base: now,
            lease_until_nanos: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            held: AtomicUsize::new(0),
        }
    }

    fn index(&self, section: SectionId) -> Option<usize> {
        section.0.checked_sub(self.first_section).map(|i| i as usize)
    }

    /// Runs `f` on the slot of `section` (None when not held) under the map's read lock.
    pub fn with<R>(&self, section: SectionId, f: impl FnOnce(Option<&Arc<Slot>>) -> R) -> R {
        let slots = self.slots.read().unwrap();
        f(self.index(section).and_then(|i| slots.get(i)).and_then(Option::as_ref))
    }

    /// Holds the map's read lock for several lookups (a batch serves all its sections under one).
    pub fn view(&self) -> View<'_> {
        View {
            slots: self.slots.read().unwrap(),
            first_section: self.first_section,
        }
    }

    /// Whether this node holds `section` under `epoch` and has waited out its predecessor's
    /// lease (what a Release tells the store, so that the next owner need not wait).
    pub fn waited(&self, section: SectionId, epoch: Epoch, now: Instant) -> bool {
        self.with(section, |held| {
            held.is_some_and(|s| s.epoch == epoch && s.section.lock().unwrap().waited(now))
        })
    }

    /// The end of the lease, if there is one.
    pub fn lease_until(&self) -> Option<Instant> {
        match self.lease_until_nanos.load(Ordering::Acquire) {
            0 => None,
            n => Some(self.clock_base + std::time::Duration::from_nanos(n)),
        }
    }

    /// Publishes the lease end (None = revoked).
    pub fn set_lease_until(&self, until: Option<Instant>) {
        let nanos = until.map_or(0, |u| {
            u64::try_from(u.saturating_duration_since(self.clock_base).as_nanos())
                .unwrap_or(u64::MAX)
                .max(1)
        });
        self.lease_until_nanos.store(nanos, Ordering::Release);
    }

    /// Whether the lease is valid at `now`.
    pub fn lease_valid(&self, now: Instant) -> bool {
        self.lease_until().is_some_and(|u| now < u)
    }

    /// Changes whenever a slot is inserted or removed.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Whether `slot` is still the held slot of its section (not dropped or replaced).
    pub fn is_held(&self, slot: &Arc<Slot>) -> bool {
        self.with(slot.id, |held| held.is_some_and(|h| Arc::ptr_eq(h, slot)))
    }

    /// Number of held sections.
    pub fn held_count(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// The epoch of the slot held for each section of the set, by position (for diffing grants).
    pub fn held_epochs(&self) -> Vec<Option<Epoch>> {
        self.slots
            .read()
            .unwrap()
            .iter()
            .map(|s| s.as_ref().map(|s| s.epoch))
            .collect()
    }

    /// Applies ownership changes in one write: `(section, new slot or None)`. Returns the slots
    /// that were replaced or dropped.
    pub fn replace(&self, changes: Vec<(SectionId, Option<Arc<Slot>>)>) -> Vec<Arc<Slot>> {
        let mut slots = self.slots.write().unwrap();
        self.generation.fetch_add(1, Ordering::AcqRel);
        let mut dropped = Vec::new();
        for (section, new) in changes {
            let Some(i) = self.index(section).filter(|i| *i < slots.len()) else {
                continue;
            };
            let gains = new.is_some();
            match std::mem::replace(&mut slots[i], new) {
                Some(old) => {
                    dropped.push(old);
                    if !gains {
                        self.held.fetch_sub(1, Ordering::AcqRel);
                    }
                }
                None if gains => {
                    self.held.fetch_add(1, Ordering::AcqRel);
                }
                None => {}
            }
        }
        dropped
    }

    /// Drops `slot` if it is still the held one; true when it was.
    pub fn remove_if_held(&self, slot: &Arc<Slot>) -> bool {
        let mut slots = self.slots.write().unwrap();
        match self.index(slot.id).and_then(|i| slots.get_mut(i)) {
            Some(held) if held.as_ref().is_some_and(|h| Arc::ptr_eq(h, slot)) => {
                *held = None;
                self.generation.fetch_add(1, Ordering::AcqRel);
                self.held.fetch_sub(1, Ordering::AcqRel);
                true
            }
            _ => false,
        }
    }

    /// Drops every held section at once (lease lost, superseded, shutdown).
    pub fn drop_all(&self) -> Vec<Arc<Slot>> {
        let mut slots = self.slots.write().unwrap();
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.held.store(0, Ordering::Release);
        slots.iter_mut().filter_map(Option::take).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::section::SectionSpec;

    fn slot(section: u64, epoch: u64, now: Instant) -> Arc<Slot> {
        let spec = SectionSpec {
            section_size: 10,
            step: 100,
            unsafe_serve_before_ack: false,
            unsafe_block_overlap: false,
            unsafe_keys_share_seq: false,
            unsafe_keys_forget_to_base: false,
        };
        Arc::new(Slot::new(
            Section::new(SectionId(section), Epoch(epoch), spec, now),
            Incarnation(1),
            now,
        ))
    }

    /// The count is kept, not counted: every way in and out of the map must move it.
    #[test]
    fn the_held_count_follows_gains_replacements_drops_and_removals() {
        let now = Instant::now();
        let owned = Owned::new(10, 4, now);
        let a = slot(10, 1, now);
        owned.replace(vec![
            (SectionId(10), Some(a.clone())),
            (SectionId(11), Some(slot(11, 1, now))),
        ]);
        assert_eq!(owned.held_count(), 2);
        // Outside the set's range: ignored, not counted.
        owned.replace(vec![(SectionId(99), Some(slot(99, 1, now)))]);
        assert_eq!(owned.held_count(), 2);
        // A new epoch replaces a slot: still two.
        owned.replace(vec![(SectionId(10), Some(slot(10, 2, now)))]);
        assert_eq!(owned.held_count(), 2);
        assert!(!owned.remove_if_held(&a), "a replaced slot is not held");
        assert_eq!(owned.held_count(), 2);
        owned.replace(vec![(SectionId(11), None), (SectionId(12), None)]);
        assert_eq!(owned.held_count(), 1);
        owned.replace(vec![(SectionId(13), Some(slot(13, 1, now)))]);
        assert_eq!(owned.drop_all().len(), 2);
        assert_eq!(owned.held_count(), 0);
    }
}
