//! `sim dst --blocks` in CI: blocks of seqs (`Reserve`) beside fetches, batches and gets, in one
//! set and two. A block is recorded as its uid n times with its n values, so every sequence
//! checker (P1's order and uniqueness above all) sees it as n fetches that completed together.
//! Seeds keep every promise with blocks served, and the negative control that starts a block at
//! the uid's last seq is caught, in the library and by the binary with exit status 1.

use std::process::Command;

use sim::dst::{self, Options};
use sim::history::CallKind;

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
    all_pass("dst --blocks", 0..150, &blocks());
    all_pass(
        "dst --blocks --sets 2",
        0..50,
        &Options {
            two_sets: true,
            ..blocks()
        },
    );
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
