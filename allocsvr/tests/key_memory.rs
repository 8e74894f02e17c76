//! What live counter keys cost an AllocSvr's heap, counted by a global allocator that tallies
//! every byte this test binary holds, and whether the bound on them holds for long keys.
//!
//! One test in the binary, on purpose: nothing else allocates while it counts (the harness's own
//! threads are idle while a lone test runs). The counts are of the bytes asked of the allocator;
//! the allocator's own rounding and headers (glibc: 8 bytes, 16-byte granules) come on top in RSS.

use std::alloc::{GlobalAlloc, Layout, System};
use std::fmt::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use allocsvr::section::{Counter, KeyBudget, Next, Section, SectionSpec};
use seqsvr_proto::{Epoch, SectionId};
use tokio::time::Instant;

/// Bytes held, over every allocation of this process.
static HELD: AtomicUsize = AtomicUsize::new(0);

struct Counting;

// SAFETY: every call is handed to `System` unchanged; only the tally is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HELD.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        HELD.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        HELD.fetch_add(new_size, Ordering::Relaxed);
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

fn held() -> usize {
    HELD.load(Ordering::Relaxed)
}

/// Sections the keys spread over, as positions spread them over an AllocSvr's sections.
const SECTIONS: usize = 64;

/// `SECTIONS` loaded sections under `budget`, each with a ceiling far above what the test takes.
fn sections(budget: &KeyBudget, t0: Instant) -> Vec<Section> {
    let spec = SectionSpec {
        section_size: 10,
        step: 1_000_000,
        unsafe_serve_before_ack: false,
        unsafe_block_overlap: false,
        unsafe_keys_share_seq: false,
        unsafe_keys_forget_to_base: false,
    };
    (0..SECTIONS as u64)
        .map(|i| {
            let mut s = Section::new(SectionId(i), Epoch(1), spec, t0).with_key_budget(budget.clone());
            s.loaded(0, None);
            let ceiling = s.maybe_prefetch().expect("a fresh section wants a bump");
            s.bump_acked(ceiling);
            s
        })
        .collect()
}

/// Takes a value of `n` distinct keys of `len` bytes, spread over the sections; returns the most
/// bytes held above `baseline` after any of them.
fn take_keys(sections: &mut [Section], t0: Instant, len: usize, n: usize, baseline: usize) -> usize {
    let lease = Some(t0 + Duration::from_secs(60));
    // One buffer for every key: only the sections' allocations are counted.
    let mut key = String::with_capacity(len);
    let mut peak = 0;
    for i in 0..n {
        key.clear();
        write!(key, "{i:0len$}").unwrap();
        let s = &mut sections[i % SECTIONS];
        let got = s.try_take(Counter::Key(&key), 1, t0, lease);
        assert!(matches!(got, Next::Served(_)), "{got:?}");
        peak = peak.max(held().saturating_sub(baseline));
    }
    peak
}

/// What an operator sets to give live keys `bytes` of memory.
fn budget_for(bytes: usize) -> KeyBudget {
    KeyBudget::with_max_bytes(usize::MAX, bytes)
}

#[test]
fn key_bytes_are_counted_as_allocated_and_long_keys_stay_within_the_byte_bound() {
    let t0 = Instant::now();
    // What one key costs, with no bound: short names live in their entries, long ones on the heap.
    for (len, n) in [(10, 200_000), (24, 200_000), (25, 200_000), (256, 50_000)] {
        let budget = KeyBudget::with_max_bytes(usize::MAX, usize::MAX);
        let mut s = sections(&budget, t0);
        let before = held();
        take_keys(&mut s, t0, len, n, before);
        let per_key = (held() - before) as f64 / n as f64;
        let charged = budget.bytes.load(Ordering::Relaxed) as f64 / n as f64;
        println!("{len:>3}-byte keys: {per_key:.1} bytes held a key, {charged:.1} charged to the budget");
        // The budget's charge is the sections' own count of their memory: what the allocator was
        // asked for, within a percent (the harness's own few allocations are counted too).
        assert!(
            (charged - per_key).abs() <= per_key / 100.0,
            "{len}: {per_key} held, {charged} charged"
        );
    }

    // A bound of 4 MiB with 256-byte keys: the memory held stays within it (plus the smallest
    // table of each section, which a section that forgot its keys still needs for the new one).
    let bound = 4 << 20;
    let budget = budget_for(bound);
    let mut s = sections(&budget, t0);
    let before = held();
    let peak = take_keys(&mut s, t0, 256, 100_000, before);
    let slack = SECTIONS * 512;
    println!("256-byte keys under a bound of {bound} bytes: at most {peak} bytes held");
    assert!(peak <= bound + slack, "{peak} bytes held under a bound of {bound}");
    assert!(peak >= bound / 2, "the bound is used, not merely respected: {peak}");
}
