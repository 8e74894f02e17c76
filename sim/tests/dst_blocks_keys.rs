//! `sim dst --blocks` and `--keys` in CI: blocks of seqs (`Reserve`) and named counters beside
//! fetches, batches and gets, in one set and two. A block is recorded as its uid (or key) n times
//! with its n values, so every sequence checker (P1's order and uniqueness above all) sees it as n
//! fetches that completed together; a key is recorded as a subject of its own
//! (`sim::keys::subject`), so each key is checked as a sequence. Seeds keep every promise with
//! blocks and keys served, and the negative controls — a block that starts at the last seq, keys
//! forgotten for the memory bound that restart at the section's base — are caught, in the library
//! and by the binary with exit status 1. (The control that lets keys share a `cur_seq` breaks only
//! P6, which `sim dst` never enforces: `negative_controls.rs` catches it in a `sim run` without
//! faults.)

use std::process::Command;

use sim::dst::{self, Options};
use sim::history::CallKind;
use sim::keys::KEY_SUBJECT;

fn blocks() -> Options {
    Options {
        blocks: true,
        ..Options::default()
    }
}

fn all_pass(label: &str, range: std::ops::Range<u64>, opts: &Options) -> dst::RangeResult {
    let r = dst::run_range(range.clone(), 2, opts, false);
    println!("{}", r.summary(label));
    r.all_passed(&range, opts).unwrap_or_else(|e| panic!("{label}: {e}"));
    r
}

#[test]
fn blocks_are_served_and_checked_and_seeds_keep_every_promise() {
    let mut keep = blocks();
    keep.keep_history = true;
    let o = dst::run_seed(3, &keep);
    assert!(o.passed(), "{:?}", o.report.counts);
    let h = o.history.expect("kept");
    let served: Vec<_> = h
        .calls
        .iter()
        .filter(|c| c.kind == CallKind::Reserve && !c.values.is_empty())
        .collect();
    assert!(served.len() > 50, "{} blocks served", served.len());
    assert!(
        served.iter().any(|c| c.values.len() > 1),
        "no block of more than one seq"
    );
    for c in &served {
        assert!(
            c.values.windows(2).all(|w| w[1] == w[0] + 1),
            "a block's values are consecutive: {:?}",
            c.values
        );
    }
    all_pass("dst --blocks", 0..40, &blocks());
}

fn keys() -> Options {
    Options {
        keys: true,
        blocks: true,
        ..Options::default()
    }
}

#[test]
fn keys_are_served_and_checked_each_on_its_own_and_seeds_keep_every_promise() {
    let mut keep = keys();
    keep.keep_history = true;
    let o = dst::run_seed(3, &keep);
    assert!(o.passed(), "{:?}", o.report.counts);
    let h = o.history.expect("kept");
    let on_keys: Vec<_> = h
        .calls
        .iter()
        .filter(|c| !c.values.is_empty() && c.uids.iter().all(|&u| u & KEY_SUBJECT != 0))
        .collect();
    let kinds = |k: CallKind| on_keys.iter().filter(|c| c.kind == k).count();
    assert!(
        kinds(CallKind::Fetch) > 50 && kinds(CallKind::Reserve) > 10 && kinds(CallKind::Get) > 10,
        "keys served: {} next, {} blocks, {} gets",
        kinds(CallKind::Fetch),
        kinds(CallKind::Reserve),
        kinds(CallKind::Get)
    );
    let distinct: std::collections::BTreeSet<u64> = on_keys.iter().flat_map(|c| c.uids.iter().copied()).collect();
    assert!(distinct.len() > 16, "{} keys asked", distinct.len());
    all_pass("dst --keys --blocks", 0..50, &keys());
    all_pass(
        "dst --keys --blocks --sets 2",
        0..25,
        &Options {
            two_sets: true,
            ..keys()
        },
    );
}

#[test]
fn keys_forgotten_for_memory_that_restart_at_the_base_are_caught() {
    let mut broken = keys();
    broken.alloc.keys_forget_to_base = true;
    let r = dst::run_range(0..20, 2, &broken, true);
    let first = r.failures.first().unwrap_or_else(|| {
        panic!("no violation in seeds 0..20 with --unsafe-keys-forget-to-base: the checkers missed a key going back")
    });
    let on_a_key = first.report.violations.iter().any(|v| v.what.contains("key \""));
    assert!(on_a_key, "{:?}", first.report.violations);
    let seed = first.seed.to_string();
    let sim = env!("CARGO_BIN_EXE_sim");
    let run = |extra: &[&str]| {
        Command::new(sim)
            .args(["dst", "--seed", seed.as_str(), "--keys", "--blocks"])
            .args(extra)
            .output()
            .expect("run sim")
    };
    assert_eq!(run(&["--unsafe-keys-forget-to-base"]).status.code(), Some(1));
    assert_eq!(
        run(&[]).status.code(),
        Some(0),
        "the same seed passes with the floor kept"
    );
    let refused = Command::new(sim)
        .args(["dst", "--seed", "1", "--unsafe-keys-forget-to-base"])
        .output()
        .expect("run sim");
    assert_eq!(refused.status.code(), Some(2), "the control without --keys is refused");
}

#[test]
fn a_block_that_overlaps_the_last_seq_is_caught() {
    let mut broken = blocks();
    broken.alloc.block_overlap = true;
    let r = dst::run_range(0..20, 2, &broken, true);
    let first = r.failures.first().unwrap_or_else(|| {
        panic!("no violation in seeds 0..20 with --unsafe-block-overlap: the checkers missed overlapping blocks")
    });
    println!(
        "block-overlap: first failing seed {}: {:?}",
        first.seed, first.report.counts
    );
    assert!(
        first.report.counts.get("P1").copied().unwrap_or(0) > 0,
        "{:?}",
        first.report.counts
    );
    let seed = first.seed.to_string();
    let sim = env!("CARGO_BIN_EXE_sim");
    let run = |extra: &[&str]| {
        Command::new(sim)
            .args(["dst", "--seed", seed.as_str(), "--blocks"])
            .args(extra)
            .output()
            .expect("run sim")
    };
    assert_eq!(run(&["--unsafe-block-overlap"]).status.code(), Some(1));
    assert_eq!(
        run(&[]).status.code(),
        Some(0),
        "the same seed passes with blocks served right"
    );
    let refused = Command::new(sim)
        .args(["dst", "--seed", "1", "--unsafe-block-overlap"])
        .output()
        .expect("run sim");
    assert_eq!(
        refused.status.code(),
        Some(2),
        "the control without --blocks is refused"
    );
}
