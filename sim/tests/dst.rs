//! The deterministic simulator (`sim dst`) in CI: a seed replays bit for bit, 200 one-set and 100
//! two-set seeds keep every promise (`dst_ids` runs 110 more with time-ordered ids beside), and each negative control it can see is found within a bounded number of
//! seeds (the first failing seed is printed; run with `--nocapture` to see the numbers).
//!
//! Each test runs seeds on two threads. On the 2-core CI machine, in a debug build, one-set seeds
//! run at about 12 a second. Long runs (100,000 seeds) are commands in docs/simulator/dst.md.

use std::collections::BTreeSet;

use sim::dst::{self, Options};

#[test]
fn a_seed_replays_bit_for_bit() {
    let opts = Options::default();
    for seed in [3, 7, 340] {
        let a = dst::run_seed(seed, &opts);
        let b = dst::run_seed(seed, &opts);
        assert_eq!(a.hash, b.hash, "seed {seed} gave two different histories");
        assert!(
            a.report.calls_ok > 100,
            "seed {seed}: no workload ran ({} ok calls)",
            a.report.calls_ok
        );
    }
    let (x, y) = (dst::run_seed(1, &opts), dst::run_seed(2, &opts));
    assert_ne!(
        x.hash, y.hash,
        "two seeds gave the same history: the seed does not reach the run"
    );
}

/// Runs `range` with `opts` and asserts that no seed broke a promise; prints the rate.
fn all_pass(label: &str, range: std::ops::Range<u64>, opts: &Options) -> dst::RangeResult {
    let r = dst::run_range(range.clone(), 2, opts, false);
    println!("{}", r.summary(label));
    r.all_passed(&range, opts).unwrap_or_else(|e| panic!("{label}: {e}"));
    r
}

/// One set: with the restores (no map to check: `--skip-map-check`'s path), every promise holds.
#[test]
fn one_set_seeds_keep_every_promise() {
    let r = all_pass("dst", 0..200, &Options::default());
    assert!(r.restored_seeds > 50, "too few one-set restores: {}", r.restored_seeds);
    assert_eq!(r.set1_fault_seeds, 0, "one set has no set 1 to hit");
}

/// Seeds that once broke a promise in the production protocol, kept as regression tests.
/// 69646: a handed-over section re-gained under the same epoch when the arbiter withdrew the
/// handover, then freed for a next owner by the first Release's late retry (two owners, P1).
const FOUND_HOLES: &[u64] = &[69_646];

#[test]
fn seeds_that_found_holes_stay_green() {
    for &seed in FOUND_HOLES {
        let o = dst::run_seed(seed, &Options::default());
        assert!(
            o.passed(),
            "seed {seed} fails again: {:?} (replay with `sim dst --seed {seed}`)",
            o.report.counts
        );
    }
}

/// Runs seeds from 0 with `opts` until one fails; asserts it is found below `bound`.
fn found_within(label: &str, opts: Options, bound: u64, promises: &[&str]) {
    let r = dst::run_range(0..bound, 2, &opts, true);
    let Some(o) = r.failures.first() else {
        panic!("{label}: no violation in seeds 0..{bound}: the checkers missed a broken rule");
    };
    println!(
        "{label}: first failing seed {} ({} seeds run, {:.1} s): {:?}",
        o.seed,
        r.seeds_run,
        r.elapsed.as_secs_f64(),
        o.report.counts
    );
    let hit: BTreeSet<&str> = o
        .report
        .counts
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(p, _)| p.as_str())
        .collect();
    assert!(
        promises.iter().any(|p| hit.contains(p)),
        "{label}: seed {} broke {hit:?}, expected one of {promises:?}",
        o.seed
    );
    // The failure is the seed's, not the schedule's luck: it replays.
    assert!(
        !dst::run_seed(o.seed, &opts).passed(),
        "{label}: seed {} did not fail again",
        o.seed
    );
}

#[test]
fn skipping_the_lease_wait_is_found() {
    let mut o = Options::default();
    o.alloc.skip_lease_wait = true;
    found_within("skip-lease-wait", o, 100, &["P1", "P4"]);
}

#[test]
fn serving_before_the_bump_ack_is_found() {
    let mut o = Options::default();
    o.alloc.serve_before_bump_ack = true;
    found_within("serve-before-bump-ack", o, 100, &["P1", "P2"]);
}

#[test]
fn keeping_memory_across_epochs_is_found() {
    let mut o = Options::default();
    o.alloc.keep_memory = true;
    found_within("keep-memory", o, 100, &["P1"]);
}

#[test]
fn skipping_the_epoch_fence_is_found() {
    let mut o = Options::default();
    o.store.skip_epoch_fence = true;
    found_within("skip-epoch-fence", o, 600, &["P1", "P2"]);
}

/// The unfenced Release is too rare to search for in CI: CI replays a known failing seed instead.
/// It fails with the switch and passes without it, so the failure is the switch's. The seed is
/// 200,062, found by `sim dst --seeds 80000..700000 --stop-at-first --threads 1
/// --unsafe-unfenced-release` (81 min, release build; docs/journal/simulator-runs.md). The earlier seed,
/// 42,823, stopped failing when `cdd45cf` changed the renewal timing around handovers; a timing
/// change can move this one too, and the assertion below says how to search again.
#[test]
fn an_unfenced_release_fails_its_known_seed() {
    const SEED: u64 = 200_062;
    let mut unsafe_opts = Options::default();
    unsafe_opts.store.unfenced_release = true;
    let o = dst::run_seed(SEED, &unsafe_opts);
    println!("unfenced-release: seed {SEED}: {:?}", o.report.counts);
    let broken = |p: &str| o.report.counts.get(p).copied().unwrap_or(0) > 0;
    assert!(
        broken("P1") || broken("P4"),
        "seed {SEED} no longer breaks P1 or P4 with the Release fence off: {:?}; search again with \
         `sim dst --seeds 0..300000 --stop-at-first --unsafe-unfenced-release`",
        o.report.counts
    );
    assert!(
        dst::run_seed(SEED, &Options::default()).passed(),
        "seed {SEED} fails with the fence on too"
    );
}

/// Issue 49 item 3: the wait a forced grant carries counts from the last renewal the store leader
/// heard from the dead owner. Counting it from the first one (`--unsafe-predecessor-wait-from-first-renewal`)
/// lets the new owner serve while the old owner, cut from the store but not from its callers,
/// still holds the lease of a later renewal: seed 3 breaks P1 and P4. Found by `sim dst --seeds
/// 0..400 --stop-at-first --unsafe-predecessor-wait-from-first-renewal` (the first of 4 seeds,
/// release build), replayed here; the twin without the switch passes.
#[test]
fn a_predecessor_wait_from_the_first_renewal_fails_its_known_seed() {
    const SEED: u64 = 3;
    let mut unsafe_opts = Options::default();
    unsafe_opts.store.predecessor_wait_from_first_renewal = true;
    let o = dst::run_seed(SEED, &unsafe_opts);
    println!(
        "predecessor-wait-from-first-renewal: seed {SEED}: {:?}",
        o.report.counts
    );
    let broken = |p: &str| o.report.counts.get(p).copied().unwrap_or(0) > 0;
    assert!(
        broken("P1") || broken("P4"),
        "seed {SEED} no longer breaks P1 or P4 with the wait counted from the first renewal: {:?}; \
         search again with `sim dst --seeds 0..2000 --stop-at-first --unsafe-predecessor-wait-from-first-renewal`",
        o.report.counts
    );
    assert!(
        dst::run_seed(SEED, &Options::default()).passed(),
        "seed {SEED} fails with the wait counted from the last renewal too"
    );
}

/// A lease clock far slower than the set's drift bound: every `drift-alloc` fault runs the
/// AllocSvr's lease clock at a tenth of real time (`--unsafe-clock-drift-ppm=-900000`), so a
/// drifting owner counts its lease as running long after the store gave its sections away; seed
/// 397 has such an owner serve beside the new one. Found by `sim dst --seeds 0..3000
/// --stop-at-first --unsafe-clock-drift-ppm=-900000` (the first of 398 seeds; at -300000 none of
/// 3,000 seeds failed: a slow clock matters only to an owner cut from the store while its
/// callers still reach it), replayed here rather than searched for.
#[test]
fn a_lease_clock_drifting_past_the_bound_fails_its_known_seed() {
    const SEED: u64 = 397;
    let mut unsafe_opts = Options::default();
    unsafe_opts.clock.drift_ppm = Some(-900_000);
    let o = dst::run_seed(SEED, &unsafe_opts);
    println!("clock-drift-ppm: seed {SEED}: {:?}", o.report.counts);
    let broken = |p: &str| o.report.counts.get(p).copied().unwrap_or(0) > 0;
    assert!(
        broken("P1") || broken("P4"),
        "seed {SEED} no longer breaks P1 or P4 with a lease clock at a tenth of real time: {:?}; \
         search again with `sim dst --seeds 0..3000 --stop-at-first --unsafe-clock-drift-ppm=-900000`",
        o.report.counts
    );
    assert!(
        dst::run_seed(SEED, &Options::default()).passed(),
        "seed {SEED} fails with drift within the bound too"
    );
}

/// A suspended host whose lease clock does not count the suspension (leases on CLOCK_MONOTONIC,
/// as before the lease clock): seed 304's `suspend-alloc` (fault 2; alone it fails too) resumes
/// an owner whose sections were granted elsewhere while it slept, its store links still down,
/// and it serves on its old lease next to the new owner. Found by `sim dst --seeds 0..400
/// --stop-at-first --unsafe-monotonic-lease-clock` (the first of 305 seeds; about 2 minutes in a
/// debug build), replayed here rather than searched for.
#[test]
fn a_lease_clock_that_misses_a_suspend_fails_its_known_seed() {
    const SEED: u64 = 304;
    let mut unsafe_opts = Options::default();
    unsafe_opts.clock.monotonic = true;
    let o = dst::run_seed(SEED, &unsafe_opts);
    println!("monotonic-lease-clock: seed {SEED}: {:?}", o.report.counts);
    let broken = |p: &str| o.report.counts.get(p).copied().unwrap_or(0) > 0;
    assert!(
        broken("P1") || broken("P4"),
        "seed {SEED} no longer breaks P1 or P4 with a lease clock that misses the suspension: {:?}; \
         search again with `sim dst --seeds 0..2000 --stop-at-first --unsafe-monotonic-lease-clock`",
        o.report.counts
    );
    assert!(
        dst::run_seed(SEED, &Options::default()).passed(),
        "seed {SEED} fails with the suspension counted too"
    );
}

/// The forger (issue 25 item 5) sends Releases, Renews and Bumps in live incarnations' names with
/// the epochs Load shows and made-up secrets. Without the binding it breaks P1 and P4 (a forged
/// `Release{waited}` lets the next owner serve while the owner still does).
#[test]
fn forged_calls_are_found_without_the_binding() {
    let mut o = Options::default();
    o.store.skip_binding = true;
    found_within("skip-binding", o, 100, &["P1", "P4"]);
}

/// With the binding the store refuses every forged call before proposing anything, so the forger
/// changes nothing: seed 13 (which breaks P1 and P4 without the binding) records the same calls
/// and polls with and without its forger.
#[test]
fn a_refused_forger_changes_nothing_else() {
    const SEED: u64 = 13;
    let kept = Options {
        keep_history: true,
        ..Options::default()
    };
    let with = dst::run_seed(SEED, &kept);
    assert!(
        with.passed(),
        "seed {SEED} fails with the binding on: {:?}",
        with.report.counts
    );
    let forger = with.faults.iter().position(|f| f.name() == "forge");
    let forger = forger.unwrap_or_else(|| panic!("seed {SEED} has no forger: {:?}", with.faults));
    println!("seed {SEED}: forged {:?}", with.forged);
    assert!(with.forged.refused > 10, "the forger hardly ran: {:?}", with.forged);
    let without = dst::run_seed(
        SEED,
        &Options {
            only_faults: Some((0..with.faults.len()).filter(|&i| i != forger).collect()),
            ..kept
        },
    );
    let (a, b) = (with.history.expect("kept"), without.history.expect("kept"));
    let same = |x: &dyn Fn(&sim::history::History) -> String| x(&a) == x(&b);
    assert!(
        same(&|h| serde_json::to_string(&h.calls).unwrap_or_default()),
        "the refused forger changed the calls"
    );
    assert!(
        same(&|h| serde_json::to_string(&h.polls).unwrap_or_default()),
        "the refused forger changed the ceilings"
    );
}

fn two_sets() -> Options {
    Options {
        two_sets: true,
        ..Options::default()
    }
}

/// `--sets 2`: the production move driver moves ranges between two sets under the faults; 150
/// seeds keep every promise (one set at a time included), and the moves do happen and finish:
/// every move not cancelled by its plan ends done, and some planned cancels do cancel (the others
/// came after the seal, and the move was resumed to its end).
#[test]
fn two_sets_with_moves_keep_every_promise() {
    let r = all_pass("dst --sets 2", 0..100, &two_sets());
    // Set 1 is hit too, and restores both go ahead (no move since the backup) and are refused
    // (a move since the backup, or one running).
    assert!(r.set1_fault_seeds > 60, "set 1 hit in {} seeds", r.set1_fault_seeds);
    assert!(
        r.restored_seeds > 10 && r.refused_restore_seeds > 10,
        "restores: {} seeds restored, {} refused",
        r.restored_seeds,
        r.refused_restore_seeds
    );
    let kept = Options {
        keep_history: true,
        ..two_sets()
    };
    let (mut moves, mut uncancelled_done, mut uncancelled, mut cancelled) = (0, 0, 0, 0);
    for seed in 0..20 {
        let plans = dst::moves::schedule(seed, dst::LOAD_MS);
        let o = dst::run_seed(seed, &kept);
        let h = o.history.expect("kept");
        moves += h.moves.len();
        for m in &h.moves {
            let planned_cancel = plans.get(m.op as usize - 1).is_some_and(|p| p.cancel.is_some());
            if planned_cancel {
                cancelled += usize::from(!m.done);
            } else {
                uncancelled += 1;
                uncancelled_done += usize::from(m.done);
            }
        }
    }
    println!(
        "dst --sets 2: seeds 0..20 ran {moves} moves; {uncancelled_done} of {uncancelled} without a cancel done, {cancelled} cancelled"
    );
    assert!(
        moves >= 20 && uncancelled_done == uncancelled,
        "{uncancelled_done} of {uncancelled} moves done"
    );
    assert!(cancelled > 0, "no planned cancel ever cancelled a move");
}

#[test]
fn a_target_serving_before_the_source_is_gone_is_found() {
    let o = Options {
        skip_move_wait: true,
        ..two_sets()
    };
    found_within("skip-move-wait", o, 100, &["P1", "P4", "OneSet"]);
}

/// A restore that skips the check against the live map (issue 25 item 2): seed 406 backs set 0
/// up at 2.2 s, move 1 then takes sections 5..8 to set 1, and set 0, lost at 4.6 s, is restored
/// from that backup at 5.1 s: it serves the moved sections again beside set 1 (P1: numbers repeat
/// and go back; OneSet). With the check the restore is refused, naming the move, the set comes
/// back as it was and the seed passes. The first seed of `sim dst --seeds 0..500 --sets 2
/// --unsafe-skip-restore-map-check` that breaks P1 (the earlier failing ones, from seed 28 on,
/// lose a range moved into set 1 after its backup: Liveness, or answer from the wrong set:
/// OneSet); replayed here rather than searched for.
#[test]
fn a_restore_without_the_map_check_fails_its_known_seed() {
    const SEED: u64 = 406;
    let unsafe_opts = Options {
        skip_restore_map_check: true,
        ..two_sets()
    };
    let o = dst::run_seed(SEED, &unsafe_opts);
    println!(
        "skip-restore-map-check: seed {SEED}: {:?} {:?}",
        o.report.counts, o.restores.notes
    );
    assert_eq!(o.restores.unchecked, 1, "{:?}", o.restores.notes);
    let broken = |p: &str| o.report.counts.get(p).copied().unwrap_or(0) > 0;
    assert!(
        broken("P1"),
        "seed {SEED} no longer repeats numbers with the restore's map check off: {:?}; take a seed \
         that breaks P1 from `sim dst --seeds 0..1000 --sets 2 --unsafe-skip-restore-map-check`",
        o.report.counts
    );
    let safe = dst::run_seed(SEED, &two_sets());
    assert!(
        safe.passed(),
        "seed {SEED} fails with the check on too: {:?}",
        safe.report.counts
    );
    assert_eq!(
        (safe.restores.restored, safe.restores.refused),
        (0, 1),
        "{:?}",
        safe.restores.notes
    );
    assert!(
        safe.restores.notes[0].contains("after the backup (move"),
        "the refusal names the move: {:?}",
        safe.restores.notes
    );
}
