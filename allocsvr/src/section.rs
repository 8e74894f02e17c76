//! The memory of one owned section, pure: no IO, no clock reads, no locks (the caller holds one
//! short `std::sync::Mutex` around it and passes `now` and the lease end read inside that lock:
//! ownership rule 7 of docs/DESIGN.md).
//!
//! Promises kept here:
//! - **P1**: `cur_seq` of a uid only grows; every served seq is `cur_seq + 1`.
//! - **P2**: a seq is served only if it is ≤ `max_seq`, the ceiling the store *acknowledged*; an
//!   in-flight bump raises nothing until its reply is applied with [`Section::bump_acked`].
//! - **P6**: with no faults a uid's consecutive seqs differ by exactly 1.
//! - Ownership rules 4 and 5: nothing is served before the section was loaded, its first bump acknowledged and
//!   `serve_after` passed.
//!
//! Memory: the dense `cur_seq` array (8 bytes per uid) is allocated on the first fetch that
//! touches the section and filled with the loaded base; an untouched section costs only this
//! struct. Eager allocation of every owned section would cost gigabytes with the default
//! `uid_limit` of 2^32.
//!
//! Counter keys (`seqsvr_proto::keys`) placed in the section are held by name, each with its own
//! `cur_seq`, in a map beside the array. A key not in the map starts at the *key floor*: the
//! loaded base, raised to the section's highest issued seq whenever keys are forgotten. Keys
//! are forgotten all at once, by the section that needs room for a new key while the node holds
//! its budget of live keys, in number or in bytes ([`KeyBudget`]): a forgotten key then restarts
//! above everything the section issued (a gap, never a repeat), so memory is bounded without any
//! record of old keys.
//!
//! Deliberately left out: the bump RPC itself, waiting, and ownership decisions (see `grants` and
//! `tasks`); forgetting single idle keys (an LRU would cost a list node and a clock read per key
//! for what a whole section's forgetting gives at the bound).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use compact_str::CompactString;
use tokio::time::Instant;

use seqsvr_proto::{Epoch, SectionId};

/// What a fetch of one uid found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// The seq handed out (now the uid's `cur_seq`).
    Served(u64),
    /// The acknowledged ceiling is reached: a bump must be acknowledged first.
    NeedBump,
    /// Owned, but not servable yet: not loaded, or the gain wait has not passed.
    NotReady,
    /// The lease has run out: nothing may be served.
    LeaseExpired,
    /// The ceiling is reached and no bump can raise it by a step without passing 2^64 - 1:
    /// this section's uids can be given no more numbers.
    Exhausted,
}

/// What a read of a uid's `cur_seq` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peek {
    /// The uid's `cur_seq` (the loaded base when the uid was not fetched under this epoch).
    Value(u64),
    /// Owned, but not readable yet (see [`Next::NotReady`]).
    NotReady,
    /// The lease has run out.
    LeaseExpired,
}

/// Whose number a take or a read is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter<'a> {
    /// A uid, by its offset in the section.
    Uid(usize),
    /// A counter key placed in the section.
    Key(&'a str),
}

/// The live counter keys one AllocSvr may hold, shared by its sections, bounded in number and in
/// bytes: a section that would add a key past either bound forgets its own keys first.
///
/// Bytes are what bounds memory: a key's cost depends on its length (a name of up to 24 bytes
/// lives in its map entry, a longer one on the heap: a 256-byte key costs about six times a short
/// one), so a count alone sizes memory only for one length of key. The bytes counted are each
/// section's key map (its table, sized as `std`'s hash map lays it out) and the names held outside
/// it; `allocsvr/tests/key_memory.rs` holds the count to what the allocator is asked for.
#[derive(Debug, Clone)]
pub struct KeyBudget {
    /// Keys held, over every section.
    pub live: Arc<AtomicUsize>,
    /// Bytes those keys take, over every section.
    pub bytes: Arc<AtomicUsize>,
    pub max: usize,
    pub max_bytes: usize,
}

impl KeyBudget {
    /// At most `max` keys, in any number of bytes.
    pub fn new(max: usize) -> Self {
        Self::with_max_bytes(max, usize::MAX)
    }

    /// At most `max` keys and `max_bytes` bytes of them.
    pub fn with_max_bytes(max: usize, max_bytes: usize) -> Self {
        Self {
            live: Arc::new(AtomicUsize::new(0)),
            bytes: Arc::new(AtomicUsize::new(0)),
            max,
            max_bytes,
        }
    }

    /// Whether one key more, costing `more` bytes, would pass a bound.
    fn would_pass(&self, more: usize) -> bool {
        self.live.load(Ordering::Relaxed) >= self.max
            || self.bytes.load(Ordering::Relaxed).saturating_add(more) > self.max_bytes
    }
}

/// One entry of a section's key map.
type KeyEntry = (CompactString, u64);

/// Bytes of a key map's table with room for `capacity` entries, as `std`'s hash map (hashbrown)
/// allocates it: a power-of-two number of buckets (`capacity + 1` below 8 of them, `capacity ×
/// 8/7` from there), an entry and a control byte each, and 16 control bytes more.
fn table_bytes(capacity: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    let buckets = buckets_of(capacity);
    buckets * size_of::<KeyEntry>() + buckets + 16
}

fn buckets_of(capacity: usize) -> usize {
    if capacity < 8 { capacity + 1 } else { capacity / 7 * 8 }.next_power_of_two()
}

/// The capacity a full table of `capacity` grows to on its next insert: 4 buckets for the first
/// entry, then twice the buckets.
fn grown_capacity(capacity: usize) -> usize {
    let buckets = if capacity == 0 { 4 } else { buckets_of(capacity) * 2 };
    if buckets <= 8 { buckets - 1 } else { buckets / 8 * 7 }
}

/// Fixed properties of a section that come from the set's parameters.
#[derive(Debug, Clone, Copy)]
pub struct SectionSpec {
    /// Uids per section.
    pub section_size: u64,
    /// How much one bump raises `max_seq`.
    pub step: u64,
    /// Negative control `--unsafe-serve-before-bump-ack`: treat an in-flight bump as acknowledged.
    pub unsafe_serve_before_ack: bool,
    /// Negative control `--unsafe-block-overlap`: a block of more than one seq starts at the
    /// uid's `cur_seq` (handed out already) instead of above it.
    pub unsafe_block_overlap: bool,
    /// Negative controls of counter keys: every key of the section shares one `cur_seq`
    /// (`--unsafe-keys-share-seq`); forgotten keys restart at the loaded base, below values they
    /// were given (`--unsafe-keys-forget-to-base`).
    pub unsafe_keys_share_seq: bool,
    pub unsafe_keys_forget_to_base: bool,
}

/// One owned section under one epoch.
#[derive(Debug)]
pub struct Section {
    id: SectionId,
    epoch: Epoch,
    spec: SectionSpec,
    /// `max_seq` as loaded when the section was gained; `None` until the Load reply arrived.
    base: Option<u64>,
    /// The acknowledged ceiling: nothing above it is ever served.
    max_seq: u64,
    /// `cur_seq` per uid offset; empty until the first fetch touches the section.
    cur: Vec<u64>,
    /// `cur_seq` per counter key placed here. A name of up to 24 bytes (most keys) lives inside
    /// its entry: no allocation of its own, and a lookup compares it without a further cache miss
    /// (random keys made that miss a visible share of an `INCR`; perf, docs/journal/benchmarks-2026-11.md).
    keys: HashMap<CompactString, u64>,
    /// Bytes the keys take: the map's table and the names held outside their entries (names
    /// longer than 24 bytes); what `budget` is charged.
    key_bytes: usize,
    /// Where a key not in `keys` starts: the base, raised to `hi` when keys are forgotten.
    key_floor: u64,
    /// The node's budget of live keys, which `keys` counts into.
    budget: Option<KeyBudget>,
    /// Highest seq issued in the section under this epoch (the base before any).
    hi: u64,
    /// `new_max` of the bump in flight, if any: at most one per section.
    bump_in_flight: Option<u64>,
    /// The highest ceiling a block found missing ([`Section::try_take`]): a bump is due while
    /// `max_seq` is below it, even with more than the watermark of headroom left.
    wanted: u64,
    /// Serving starts at this instant (lease wait of a gained section).
    serve_after: Instant,
}

impl Section {
    /// A section just granted under `epoch`, not loaded yet.
    pub fn new(id: SectionId, epoch: Epoch, spec: SectionSpec, serve_after: Instant) -> Self {
        assert!(spec.section_size > 0 && spec.step > 0, "validated parameters");
        Self {
            id,
            epoch,
            spec,
            base: None,
            max_seq: 0,
            cur: Vec::new(),
            keys: HashMap::new(),
            key_bytes: 0,
            key_floor: 0,
            budget: None,
            hi: 0,
            bump_in_flight: None,
            wanted: 0,
            serve_after,
        }
    }

    /// Counts this section's keys into `budget` (until it is dropped).
    pub fn with_key_budget(mut self, budget: KeyBudget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// The Load reply: every uid's `cur_seq` starts at the loaded `max_seq` (rule 5). `kept` is
    /// only ever `Some` under the negative control `--unsafe-keep-memory`: memory of an earlier
    /// epoch, which may lie below seqs another owner has issued since.
    pub fn loaded(&mut self, max_seq: u64, kept: Option<Vec<u64>>) {
        debug_assert!(self.base.is_none(), "a section is loaded once per epoch");
        self.base = Some(max_seq);
        self.max_seq = max_seq;
        self.hi = max_seq;
        self.key_floor = max_seq;
        self.cur = kept
            .filter(|k| k.len() as u64 == self.spec.section_size)
            .unwrap_or_default();
    }

    pub fn id(&self) -> SectionId {
        self.id
    }

    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// The acknowledged ceiling.
    pub fn max_seq(&self) -> u64 {
        self.max_seq
    }

    /// The highest seq issued under this epoch.
    pub fn hi(&self) -> u64 {
        self.hi
    }

    /// `new_max` of the bump in flight.
    pub fn bump_in_flight(&self) -> Option<u64> {
        self.bump_in_flight
    }

    /// Bytes of uid and key memory held (for the ≤ 8.5 bytes/uid budget): the array, the key
    /// map's table and the keys' names.
    pub fn memory_bytes(&self) -> usize {
        self.cur.capacity() * size_of::<u64>() + self.key_bytes
    }

    /// Counter keys held.
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// Forgets every key: each restarts above everything this section issued. Returns how many.
    pub fn forget_keys(&mut self) -> usize {
        let n = self.keys.len();
        if !self.spec.unsafe_keys_forget_to_base {
            self.key_floor = self.key_floor.max(self.hi);
        }
        self.keys = HashMap::new();
        if let Some(b) = &self.budget {
            b.live.fetch_sub(n, Ordering::Relaxed);
            b.bytes.fetch_sub(self.key_bytes, Ordering::Relaxed);
        }
        self.key_bytes = 0;
        n
    }

    fn current(&self, who: Counter<'_>, base: u64) -> u64 {
        let who = self.unsafe_shared(who);
        match who {
            Counter::Uid(offset) => self.cur.get(offset).copied().unwrap_or(base),
            Counter::Key(key) => self.keys.get(key).copied().unwrap_or(self.key_floor),
        }
    }

    /// Every key as one under `--unsafe-keys-share-seq`.
    fn unsafe_shared<'k>(&self, who: Counter<'k>) -> Counter<'k> {
        match who {
            Counter::Key(_) if self.spec.unsafe_keys_share_seq => Counter::Key(""),
            who => who,
        }
    }

    fn set_current(&mut self, who: Counter<'_>, base: u64, value: u64) {
        let who = self.unsafe_shared(who);
        match who {
            Counter::Uid(offset) => {
                if self.cur.is_empty() {
                    self.cur = vec![base; self.spec.section_size as usize];
                }
                self.cur[offset] = value;
            }
            Counter::Key(key) => {
                if let Some(v) = self.keys.get_mut(key) {
                    *v = value;
                    return;
                }
                self.insert_key(key, value);
            }
        }
    }

    /// Starts holding `key`, which the map does not hold, at `value`; a full key budget first
    /// forgets this section's keys.
    fn insert_key(&mut self, key: &str, value: u64) {
        let name = CompactString::from(key);
        let name_bytes = if name.is_heap_allocated() { name.capacity() } else { 0 };
        // A full table doubles on this insert: counted before it is made, so that one section's
        // growth cannot pass the bound by the size of its table.
        let capacity = self.keys.capacity();
        let growth = match self.keys.len() < capacity {
            true => 0,
            false => table_bytes(grown_capacity(capacity)) - table_bytes(capacity),
        };
        if self.budget.as_ref().is_some_and(|b| b.would_pass(growth + name_bytes)) {
            // `hi` covers `value` already: the key restarts above it if it is forgotten again.
            self.forget_keys();
        }
        let table_before = table_bytes(self.keys.capacity());
        self.keys.insert(name, value);
        let added = table_bytes(self.keys.capacity()) - table_before + name_bytes;
        self.key_bytes += added;
        if let Some(b) = &self.budget {
            b.live.fetch_add(1, Ordering::Relaxed);
            b.bytes.fetch_add(added, Ordering::Relaxed);
        }
    }

    /// When serving may start (the end of the gain wait).
    pub fn serve_after(&self) -> Instant {
        self.serve_after
    }

    /// Whether the gain wait has passed: no earlier owner can still be serving the section.
    pub fn waited(&self, now: Instant) -> bool {
        now >= self.serve_after
    }

    fn servable(&self, now: Instant, lease_until: Option<Instant>) -> Result<u64, Next> {
        if lease_until.is_none_or(|until| now >= until) {
            return Err(Next::LeaseExpired);
        }
        match self.base {
            Some(base) if now >= self.serve_after => Ok(base),
            _ => Err(Next::NotReady),
        }
    }

    fn ceiling(&self) -> u64 {
        match self.bump_in_flight {
            Some(target) if self.spec.unsafe_serve_before_ack => self.max_seq.max(target),
            _ => self.max_seq,
        }
    }

    /// Hands out the next seq of the uid at `offset`, checking the lease (`lease_until`, read by
    /// the caller inside the same lock) and the gain wait against `now`.
    ///
    /// The common case, a uid below the ceiling, is served here without [`Section::try_take`]'s
    /// general path (keys, blocks, their negative controls): a batch serves 100 uids a call, and
    /// that path cost about 140 instructions a uid (callgrind) where this costs half. The rest —
    /// a bump needed, the section exhausted or not servable — goes the general way, which checks
    /// everything again.
    pub fn try_next(&mut self, offset: usize, now: Instant, lease_until: Option<Instant>) -> Next {
        if let Ok(base) = self.servable(now, lease_until) {
            let ceiling = self.ceiling();
            if self.cur.is_empty() {
                self.cur = vec![base; self.spec.section_size as usize];
            }
            // `cur < ceiling`, so `cur + 1` cannot overflow; an offset outside the section
            // finds no slot and fails in `try_take`'s check.
            if let Some(cur) = self.cur.get_mut(offset).filter(|cur| **cur < ceiling) {
                *cur += 1;
                let next = *cur;
                self.hi = self.hi.max(next);
                debug_assert!(next <= self.max_seq || self.spec.unsafe_serve_before_ack, "P2");
                return Next::Served(next);
            }
        }
        self.try_take(Counter::Uid(offset), 1, now, lease_until)
    }

    /// Hands out `n` consecutive seqs of `who` (a block): `Served(first)` means
    /// `[first, first + n)`, all above its earlier seqs, and its `cur_seq` is now the last.
    /// `n` is 1 to the step (the caller checks): one bump of a step then always makes room,
    /// since `cur_seq` never passes `max_seq`. The whole block is below the acknowledged ceiling
    /// (P2) or nothing is taken.
    pub fn try_take(&mut self, who: Counter<'_>, n: u64, now: Instant, lease_until: Option<Instant>) -> Next {
        let base = match self.servable(now, lease_until) {
            Ok(base) => base,
            Err(why) => return why,
        };
        if let Counter::Uid(offset) = who {
            assert!(
                (offset as u64) < self.spec.section_size,
                "offset {offset} outside section"
            );
        }
        debug_assert!(
            (1..=self.spec.step).contains(&n),
            "block of {n} with step {}",
            self.spec.step
        );
        let ceiling = self.ceiling();
        // A key not held yet, known from the lookup below: it starts at the key floor and is
        // inserted without being looked up twice more (read, then write) by the general path.
        let mut new_key = None;
        if let Counter::Key(key) = who
            && !(self.spec.unsafe_keys_share_seq || self.spec.unsafe_block_overlap)
        {
            match self.keys.get_mut(key) {
                Some(cur) => {
                    if let Some(last) = cur.checked_add(n).filter(|&last| last <= ceiling) {
                        // A key already held, with room below the ceiling: served by this one
                        // lookup.
                        let first = *cur + 1;
                        *cur = last;
                        self.hi = self.hi.max(last);
                        debug_assert!(last <= self.max_seq || self.spec.unsafe_serve_before_ack, "P2");
                        return Next::Served(first);
                    }
                }
                None => new_key = Some(key),
            }
        }
        let cur = match new_key {
            Some(_) => self.key_floor,
            None => self.current(who, base),
        };
        let last = match cur.checked_add(n) {
            Some(last) if last <= ceiling => last,
            _ if self.max_seq.checked_add(self.spec.step).is_none() => return Next::Exhausted,
            Some(last) => {
                self.wanted = self.wanted.max(last);
                return Next::NeedBump;
            }
            None => return Next::Exhausted,
        };
        self.hi = self.hi.max(last);
        debug_assert!(last <= self.max_seq || self.spec.unsafe_serve_before_ack, "P2");
        if self.spec.unsafe_block_overlap && n > 1 {
            self.set_current(who, base, last - 1);
            return Next::Served(cur);
        }
        match new_key {
            Some(key) => self.insert_key(key, last),
            None => self.set_current(who, base, last),
        }
        Next::Served(cur + 1)
    }

    /// Where the `cur_seq` array lives (0 before the first fetch allocated it), for
    /// [`prefetch`]: the array is allocated once per epoch and never resized, so the address
    /// stays right for as long as the section is held.
    pub fn cur_addr(&self) -> usize {
        if self.cur.is_empty() {
            0
        } else {
            self.cur.as_ptr() as usize
        }
    }

    /// `cur_seq` of `who` (P5), under the same checks as a fetch.
    pub fn cur_seq(&self, who: Counter<'_>, now: Instant, lease_until: Option<Instant>) -> Peek {
        match self.servable(now, lease_until) {
            Ok(base) => Peek::Value(self.current(who, base)),
            Err(Next::LeaseExpired) => Peek::LeaseExpired,
            Err(_) => Peek::NotReady,
        }
    }

    /// Headroom below which the next bump is started in the background (rule 8).
    fn watermark(&self) -> u64 {
        (self.spec.step / 2).max(1)
    }

    /// Starts a bump when the headroom `max_seq - hi` fell below the watermark, or a block found
    /// too little of it, and none is in flight; returns its `new_max` (`max_seq + step`), which the caller must send and, when the
    /// reply is lost, resend unchanged (rule 6).
    pub fn maybe_prefetch(&mut self) -> Option<u64> {
        if self.base.is_none() || self.bump_in_flight.is_some() {
            return None;
        }
        if self.max_seq.saturating_sub(self.hi) >= self.watermark() && self.max_seq >= self.wanted {
            return None;
        }
        let new_max = self.max_seq.checked_add(self.spec.step)?;
        self.bump_in_flight = Some(new_max);
        Some(new_max)
    }

    /// The store acknowledged `max_seq >= new_max` under this section's epoch.
    pub fn bump_acked(&mut self, new_max: u64) {
        self.max_seq = self.max_seq.max(new_max);
        if self.bump_in_flight.is_some_and(|t| t <= new_max) {
            self.bump_in_flight = None;
        }
    }

    /// The bump will not be acknowledged (section lost, lease lost): allow a new one later.
    pub fn bump_abandoned(&mut self) {
        self.bump_in_flight = None;
    }

    /// Takes the uid memory away, for the negative control `--unsafe-keep-memory` only.
    pub fn take_memory(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.cur)
    }
}

impl Drop for Section {
    fn drop(&mut self) {
        if let Some(b) = &self.budget {
            b.live.fetch_sub(self.keys.len(), Ordering::Relaxed);
            b.bytes.fetch_sub(self.key_bytes, Ordering::Relaxed);
        }
    }
}

/// Asks the CPU to start loading the `cur_seq` at `offset` of the array at `cur_addr` (see
/// [`Section::cur_addr`]), without the section's lock: a batch prefetches every slot it will touch
/// before serving any, so that their cache and TLB misses (the arrays are far larger than the
/// caches) overlap instead of coming one after the other. A stale address costs a wasted hint,
/// never a fault.
pub fn prefetch(cur_addr: usize, offset: usize) {
    #[cfg(target_arch = "x86_64")]
    if cur_addr != 0 {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let at = cur_addr.wrapping_add(offset.wrapping_mul(size_of::<u64>()));
        // SAFETY: SSE is part of x86_64's baseline, and a prefetch is a hint that never faults,
        // whatever the address; nothing is dereferenced.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at as *const i8) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (cur_addr, offset);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    const SIZE: u64 = 8;
    const STEP: u64 = 4;

    fn spec(unsafe_serve_before_ack: bool) -> SectionSpec {
        SectionSpec {
            section_size: SIZE,
            step: STEP,
            unsafe_serve_before_ack,
            unsafe_block_overlap: false,
            unsafe_keys_share_seq: false,
            unsafe_keys_forget_to_base: false,
        }
    }

    fn loaded(base: u64, now: Instant) -> Section {
        let mut s = Section::new(SectionId(3), Epoch(1), spec(false), now);
        s.loaded(base, None);
        s
    }

    /// One uid at a time on the common path: a repeated uid rises, a uid at the ceiling asks
    /// for a bump (and keeps its `cur_seq`) while the others are still served, and nothing is
    /// served before the load or after the lease.
    #[test]
    fn uids_below_the_ceiling_rise_one_at_a_time_and_one_at_it_waits_for_a_bump() {
        let t0 = Instant::now();
        let lease = Some(t0 + Duration::from_secs(10));
        let mut unloaded = Section::new(SectionId(3), Epoch(1), spec(false), t0);
        assert_eq!(unloaded.try_next(0, t0, lease), Next::NotReady);
        let mut s = loaded(100, t0);
        s.maybe_prefetch();
        s.bump_acked(103); // a ceiling 3 above the base: uid 0 reaches it below
        let served: Vec<Next> = [0, 0, 5, 0, 0, 5].iter().map(|&o| s.try_next(o, t0, lease)).collect();
        assert_eq!(
            served,
            [
                Next::Served(101),
                Next::Served(102),
                Next::Served(101),
                Next::Served(103),
                Next::NeedBump,
                Next::Served(102)
            ]
        );
        assert_eq!(s.hi(), 103);
        assert_eq!(
            s.cur_seq(Counter::Uid(0), t0, lease),
            Peek::Value(103),
            "nothing taken at the ceiling"
        );
        assert_eq!(s.try_next(5, t0 + Duration::from_secs(10), lease), Next::LeaseExpired);
    }

    /// A key already held is served by one lookup: it rises by one and by blocks as on the
    /// general path, its block at the ceiling asks for a bump and takes nothing, and another key
    /// keeps its own `cur_seq`.
    #[test]
    fn a_held_key_rises_by_ones_and_blocks_and_waits_for_a_bump_at_the_ceiling() {
        let t0 = Instant::now();
        let lease = Some(t0 + Duration::from_secs(10));
        let mut s = loaded(100, t0);
        s.maybe_prefetch();
        s.bump_acked(104);
        let (a, b) = (Counter::Key("orders"), Counter::Key("invoices"));
        assert_eq!(
            s.try_take(a, 1, t0, lease),
            Next::Served(101),
            "first: the general path"
        );
        assert_eq!(s.try_take(a, 1, t0, lease), Next::Served(102), "held: one lookup");
        assert_eq!(s.try_take(a, 3, t0, lease), Next::NeedBump, "103..=105 passes 104");
        assert_eq!(s.cur_seq(a, t0, lease), Peek::Value(102), "nothing taken");
        assert_eq!(s.try_take(a, 2, t0, lease), Next::Served(103), "[103, 105)");
        assert_eq!(s.try_take(b, 1, t0, lease), Next::Served(101), "another key: its own");
        assert_eq!(s.hi(), 104);
        assert_eq!(
            s.try_take(a, 1, t0 + Duration::from_secs(10), lease),
            Next::LeaseExpired
        );
    }

    /// A block is all below the acknowledged ceiling or not taken; one that finds too little
    /// room asks for a bump even with the watermark's headroom left, and one bump makes room.
    #[test]
    fn a_block_is_taken_whole_below_the_ceiling_and_one_bump_makes_room_for_it() {
        let t0 = Instant::now();
        let lease = Some(t0 + Duration::from_secs(10));
        let mut s = loaded(100, t0);
        assert_eq!(s.maybe_prefetch(), Some(104));
        s.bump_acked(104);
        assert_eq!(
            s.try_take(Counter::Uid(0), 2, t0, lease),
            Next::Served(101),
            "[101, 103)"
        );
        assert_eq!(s.cur_seq(Counter::Uid(0), t0, lease), Peek::Value(102));
        assert_eq!(
            s.try_take(Counter::Uid(1), 1, t0, lease),
            Next::Served(101),
            "another uid: its own cur_seq"
        );
        // Headroom 2, the watermark (STEP / 2): no bump for fetches yet.
        assert_eq!(s.maybe_prefetch(), None);
        assert_eq!(
            s.try_take(Counter::Uid(0), 3, t0, lease),
            Next::NeedBump,
            "103..=105 passes 104: nothing taken"
        );
        assert_eq!(s.cur_seq(Counter::Uid(0), t0, lease), Peek::Value(102));
        assert_eq!(s.maybe_prefetch(), Some(108), "the block's need starts a bump");
        assert_eq!(
            s.try_take(Counter::Uid(0), 3, t0, lease),
            Next::NeedBump,
            "not before the ack (P2)"
        );
        s.bump_acked(108);
        assert_eq!(
            s.try_take(Counter::Uid(0), 3, t0, lease),
            Next::Served(103),
            "[103, 106)"
        );
        assert_eq!(
            s.try_next(0, t0, lease),
            Next::Served(106),
            "the next seq follows the block"
        );
        // A whole step from the top of the ceiling: exactly one bump makes room.
        assert_eq!(
            s.try_take(Counter::Uid(1), STEP, t0, lease),
            Next::Served(102),
            "[102, 106)"
        );
        assert_eq!(s.try_take(Counter::Uid(0), STEP, t0, lease), Next::NeedBump);
        assert_eq!(s.maybe_prefetch(), Some(112));
        s.bump_acked(112);
        assert_eq!(
            s.try_take(Counter::Uid(0), STEP, t0, lease),
            Next::Served(107),
            "[107, 111)"
        );
        assert_eq!(s.hi(), 110);
    }

    #[test]
    fn nothing_is_served_before_load_wait_and_first_ack() {
        let t0 = Instant::now();
        let lease = Some(t0 + Duration::from_secs(10));
        let wait = t0 + Duration::from_millis(100);
        let mut s = Section::new(SectionId(1), Epoch(2), spec(false), wait);
        // (step, at, expected)
        assert_eq!(s.try_next(0, t0, lease), Next::NotReady, "not loaded");
        assert_eq!(s.maybe_prefetch(), None, "no bump before load");
        s.loaded(100, None);
        assert_eq!(s.try_next(0, t0, lease), Next::NotReady, "gain wait");
        assert_eq!(
            s.cur_seq(Counter::Uid(0), t0, lease),
            Peek::NotReady,
            "gain wait applies to reads"
        );
        let after = wait;
        assert_eq!(
            s.try_next(0, after, lease),
            Next::NeedBump,
            "loaded base is the ceiling"
        );
        assert_eq!(s.maybe_prefetch(), Some(104));
        assert_eq!(s.maybe_prefetch(), None, "one bump in flight");
        assert_eq!(
            s.try_next(0, after, lease),
            Next::NeedBump,
            "in-flight bump raises nothing"
        );
        s.bump_acked(104);
        assert_eq!(s.try_next(0, after, lease), Next::Served(101));
        assert_eq!(s.cur_seq(Counter::Uid(0), after, lease), Peek::Value(101));
        assert_eq!(
            s.cur_seq(Counter::Uid(1), after, lease),
            Peek::Value(100),
            "untouched uid reads the base"
        );
    }

    #[test]
    fn a_section_at_the_top_of_the_space_says_so() {
        let now = Instant::now();
        let mut s = loaded(u64::MAX - 3, now);
        let lease = Some(now + Duration::from_secs(1));
        // No bump can raise the ceiling by a step any more: nothing to wait for.
        assert_eq!(s.maybe_prefetch(), None);
        let next = s.try_next(0, now, lease);
        assert_eq!(next, Next::Exhausted, "an exhausted section answers {next:?}");
        // Served up to the last ceiling a step fits under, then told apart from "wait for a bump".
        let mut s = loaded(u64::MAX - 6, now);
        assert_eq!(s.maybe_prefetch(), Some(u64::MAX - 2));
        assert_eq!(
            s.try_next(1, now, lease),
            Next::NeedBump,
            "nothing above the loaded ceiling before the ack"
        );
        s.bump_acked(u64::MAX - 2);
        for want in u64::MAX - 5..=u64::MAX - 2 {
            assert_eq!(s.try_next(1, now, lease), Next::Served(want));
        }
        assert_eq!(s.try_next(1, now, lease), Next::Exhausted);
    }

    #[test]
    fn lease_is_checked_at_the_increment() {
        let t0 = Instant::now();
        let mut s = loaded(0, t0);
        s.maybe_prefetch();
        s.bump_acked(STEP);
        let cases = [
            (None, Next::LeaseExpired),
            (Some(t0), Next::LeaseExpired),
            (Some(t0 + Duration::from_nanos(1)), Next::Served(1)),
        ];
        for (lease_until, expected) in cases {
            assert_eq!(s.try_next(0, t0, lease_until), expected, "{lease_until:?}");
        }
        assert_eq!(s.cur_seq(Counter::Uid(0), t0, None), Peek::LeaseExpired);
    }

    #[test]
    fn prefetch_starts_below_half_a_step_and_ceiling_holds() {
        let t0 = Instant::now();
        let lease = Some(t0 + Duration::from_secs(1));
        let mut s = loaded(0, t0);
        assert_eq!(s.maybe_prefetch(), Some(4));
        s.bump_acked(4);
        // (uid, expected outcome, expected prefetch target after it)
        let cases = [
            (0, Next::Served(1), None),
            (0, Next::Served(2), None),
            (1, Next::Served(1), None),
            (0, Next::Served(3), Some(8)),
            (0, Next::Served(4), None),
            (0, Next::NeedBump, None),
        ];
        for (i, (uid, expected, prefetch)) in cases.into_iter().enumerate() {
            assert_eq!(s.try_next(uid, t0, lease), expected, "case {i}");
            assert_eq!(s.maybe_prefetch(), prefetch, "case {i}");
        }
        s.bump_acked(8);
        assert_eq!(s.try_next(0, t0, lease), Next::Served(5));
    }

    #[test]
    fn unsafe_serve_before_ack_serves_above_the_acknowledged_ceiling() {
        let t0 = Instant::now();
        let lease = Some(t0 + Duration::from_secs(1));
        let mut s = Section::new(SectionId(0), Epoch(1), spec(true), t0);
        s.loaded(10, None);
        s.maybe_prefetch();
        assert_eq!(
            s.try_next(0, t0, lease),
            Next::Served(11),
            "negative control serves unacked"
        );
    }

    #[test]
    fn memory_is_allocated_on_first_fetch_and_stays_within_budget() {
        let t0 = Instant::now();
        let lease = Some(t0 + Duration::from_secs(1));
        let mut s = loaded(0, t0);
        assert_eq!(s.memory_bytes(), 0);
        s.maybe_prefetch();
        s.bump_acked(STEP);
        s.try_next(5, t0, lease);
        assert!(s.memory_bytes() as f64 <= 8.5 * SIZE as f64);
        assert!(s.memory_bytes() >= 8 * SIZE as usize);
    }

    #[test]
    fn kept_memory_is_used_only_when_given() {
        let t0 = Instant::now();
        let lease = Some(t0 + Duration::from_secs(1));
        let mut s = Section::new(SectionId(0), Epoch(2), spec(false), t0);
        s.loaded(100, Some(vec![7; SIZE as usize]));
        s.maybe_prefetch();
        s.bump_acked(104);
        assert_eq!(
            s.try_next(0, t0, lease),
            Next::Served(8),
            "old memory reused (negative control)"
        );
    }

    /// The byte bound forgets as the count does, counting a table's doubling before it is made,
    /// and hands every byte back when the keys are forgotten or the section dropped.
    #[test]
    fn a_byte_bound_forgets_long_keys_before_passing_it_and_every_byte_comes_back() {
        let t0 = Instant::now();
        let lease = Some(t0 + Duration::from_secs(10));
        // The smallest table (4 buckets: 4 × 33 + 16 = 148 bytes) and two 256-byte names fit;
        // a third name does not.
        let budget = KeyBudget::with_max_bytes(usize::MAX, 148 + 2 * 256);
        let mut s = Section::new(SectionId(3), Epoch(1), spec(false), t0).with_key_budget(budget.clone());
        s.loaded(100, None);
        s.maybe_prefetch();
        s.bump_acked(104);
        let key = |c: char| c.to_string().repeat(256);
        for c in ['a', 'b'] {
            assert_eq!(s.try_take(Counter::Key(&key(c)), 1, t0, lease), Next::Served(101));
        }
        assert_eq!(budget.bytes.load(Ordering::Relaxed), 148 + 2 * 256);
        assert_eq!(s.memory_bytes(), 148 + 2 * 256);
        // The third is past the bound: "a" and "b" are forgotten first, and restart above 101.
        assert_eq!(s.try_take(Counter::Key(&key('c')), 1, t0, lease), Next::Served(101));
        assert_eq!(s.key_count(), 1);
        assert_eq!(budget.bytes.load(Ordering::Relaxed), 148 + 256);
        assert_eq!(s.try_take(Counter::Key(&key('a')), 1, t0, lease), Next::Served(102));
        drop(s);
        assert_eq!(budget.bytes.load(Ordering::Relaxed), 0);
        assert_eq!(budget.live.load(Ordering::Relaxed), 0);
        // The table's growth is counted before it happens: 3 short keys fill 4 buckets, and a
        // fourth would double them (8 × 33 + 16 = 280 bytes), past a bound of 200.
        assert_eq!((table_bytes(3), table_bytes(grown_capacity(3))), (148, 280));
        assert_eq!((grown_capacity(0), grown_capacity(7), grown_capacity(14)), (3, 14, 28));
        let budget = KeyBudget::with_max_bytes(usize::MAX, 200);
        let mut s = Section::new(SectionId(3), Epoch(1), spec(false), t0).with_key_budget(budget.clone());
        s.loaded(100, None);
        s.maybe_prefetch();
        s.bump_acked(104);
        for k in ["a", "b", "c", "d"] {
            s.try_take(Counter::Key(k), 1, t0, lease);
        }
        assert_eq!((s.key_count(), budget.bytes.load(Ordering::Relaxed)), (1, 148));
    }

    /// Keys in the property test, after the `SIZE` uids; the budget holds fewer, so keys are
    /// forgotten and come back.
    const KEYS: [&str; 3] = ["orders", "conv:8f3a:msg", "zähler"];

    #[test]
    fn keys_count_on_their_own_and_a_forgotten_key_restarts_above_everything_issued() {
        let t0 = Instant::now();
        let lease = Some(t0 + Duration::from_secs(10));
        let budget = KeyBudget::new(2);
        let mut s = Section::new(SectionId(3), Epoch(1), spec(false), t0).with_key_budget(budget.clone());
        s.loaded(100, None);
        s.maybe_prefetch();
        s.bump_acked(104);
        let take = |s: &mut Section, who, n| s.try_take(who, n, t0, lease);
        assert_eq!(take(&mut s, Counter::Key("a"), 1), Next::Served(101));
        assert_eq!(
            take(&mut s, Counter::Key("b"), 1),
            Next::Served(101),
            "its own sequence"
        );
        assert_eq!(take(&mut s, Counter::Uid(0), 1), Next::Served(101), "and a uid its own");
        assert_eq!(take(&mut s, Counter::Key("a"), 2), Next::Served(102), "[102, 104)");
        assert_eq!(s.cur_seq(Counter::Key("a"), t0, lease), Peek::Value(103));
        assert_eq!(s.cur_seq(Counter::Key("new"), t0, lease), Peek::Value(100), "the base");
        assert_eq!(budget.live.load(Ordering::Relaxed), 2);
        // A third key is over the budget: the section forgets "a" and "b" first.
        assert_eq!(take(&mut s, Counter::Key("c"), 1), Next::Served(101));
        assert_eq!((s.key_count(), budget.live.load(Ordering::Relaxed)), (1, 1));
        assert_eq!(
            s.cur_seq(Counter::Key("a"), t0, lease),
            Peek::Value(103),
            "forgotten: the highest seq the section issued"
        );
        assert_eq!(take(&mut s, Counter::Key("a"), 1), Next::Served(104));
        assert!(s.memory_bytes() > 0);
        drop(s);
        assert_eq!(
            budget.live.load(Ordering::Relaxed),
            0,
            "a dropped section gives its keys back"
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        /// A block of this many seqs of a uid, or of a key past the uids (1: a fetch).
        Fetch(usize, u64),
        Prefetch,
        Ack,
        LoseAck,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..SIZE as usize + KEYS.len()).prop_map(|u| Op::Fetch(u, 1)),
            2 => (0..SIZE as usize + KEYS.len(), 1..=STEP).prop_map(|(u, n)| Op::Fetch(u, n)),
            2 => Just(Op::Prefetch),
            2 => Just(Op::Ack),
            1 => Just(Op::LoseAck),
        ]
    }

    proptest! {
        #[test]
        fn seqs_and_blocks_per_uid_and_key_strictly_increase_and_never_exceed_max_seq(
            base in 0u64..1_000,
            ops in proptest::collection::vec(op(), 1..300),
        ) {
            let t0 = Instant::now();
            let lease = Some(t0 + Duration::from_secs(1));
            let mut s = Section::new(SectionId(3), Epoch(1), spec(false), t0).with_key_budget(KeyBudget::new(2));
            s.loaded(base, None);
            let mut last = vec![base; SIZE as usize + KEYS.len()];
            let mut acked = base;
            let mut served = 0;
            let who = |u: usize| if u < SIZE as usize { Counter::Uid(u) } else { Counter::Key(KEYS[u - SIZE as usize]) };
            for op in ops {
                match op {
                    Op::Fetch(uid, n) => match s.try_take(who(uid), n, t0, lease) {
                        Next::Served(first) => {
                            prop_assert!(first > last[uid], "block at {} after {}", first, last[uid]);
                            let end = first + n - 1;
                            prop_assert!(end <= acked, "block to {} above acked {}", end, acked);
                            last[uid] = end;
                            if uid < SIZE as usize {
                                served += n;
                            }
                        }
                        // A forgotten key may need a bump sooner than its own last seq says.
                        Next::NeedBump => prop_assert!(last[uid] + n > acked || uid >= SIZE as usize),
                        other => prop_assert!(false, "unexpected {:?}", other),
                    },
                    Op::Prefetch => {
                        if let Some(target) = s.maybe_prefetch() {
                            prop_assert_eq!(target, acked + STEP);
                        }
                    }
                    Op::Ack => {
                        if let Some(target) = s.bump_in_flight() {
                            s.bump_acked(target);
                            acked = target;
                        }
                    }
                    Op::LoseAck => s.bump_abandoned(),
                }
                prop_assert!(s.hi() <= s.max_seq());
                prop_assert_eq!(s.max_seq(), acked);
            }
            // P6: without faults, no uid skipped a number (keys may have been forgotten).
            prop_assert_eq!(last[..SIZE as usize].iter().map(|l| l - base).sum::<u64>(), served);
        }
    }
}
