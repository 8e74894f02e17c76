//! Negative controls: each test runs `sim run` with one unsafe switch that breaks one rule of the
//! ownership protocol (docs/DESIGN.md), timings and a fault schedule aimed at that rule, and demands
//! exit 1 with the violation the broken rule must cause. They prove the checkers can fail. Each
//! then runs its twin, the same arguments without the switch, and demands a pass: they prove the
//! checkers do not fire regardless.
//!
//! The tests run one at a time (a lock): two clusters side by side on a 2-core CI machine would
//! stretch the timings both depend on. Each takes about two minutes on a debug build (the
//! control and its twin). Needs
//! `cargo build --workspace --bins` first.

mod common;

use std::sync::Mutex;
use std::time::Duration;

static ONE_CLUSTER_AT_A_TIME: Mutex<()> = Mutex::new(());

const LIMIT: Duration = Duration::from_secs(240);

/// Runs one control and asserts exit 1 with a violation of one of `promises`.
fn expect_violation(label: &str, args: &[&str], promises: &[&str]) {
    expect_violation_in_one_of(label, &[], args, promises);
}

/// As [`expect_violation`], for a control whose trip depends on how the OS schedules a race
/// that the fault opens: `args` first as given, then with each of `other_seeds` in place of its
/// `--seed` for as long as a run ends with the rule unnoticed (exit 0). Only the last attempt may
/// pass unnoticed for the test to fail, so a checker that stopped seeing the rule fails every
/// attempt and still fails the test; any other exit fails at once.
fn expect_violation_in_one_of(label: &str, other_seeds: &[&str], args: &[&str], promises: &[&str]) {
    let _one = ONE_CLUSTER_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut run = common::sim_run(label, args, LIMIT);
    for seed in other_seeds {
        if run.code != Some(0) {
            break;
        }
        eprintln!("{label}: the rule went unnoticed with {args:?}; trying seed {seed}");
        run.clean_up();
        let mut again: Vec<&str> = args.to_vec();
        let at = again
            .iter()
            .position(|a| *a == "--seed")
            .expect("a control names its seed")
            + 1;
        again[at] = seed;
        run = common::sim_run(label, &again, LIMIT);
    }
    assert_eq!(run.code, Some(1), "the broken rule went unnoticed: {}", run.explain());
    assert!(
        promises.iter().any(|p| run.stdout.contains(&format!("VIOLATION {p}:"))),
        "exit 1 without a violation of {promises:?}: {}",
        run.explain()
    );
    assert!(
        common::ok_calls(&run.stdout) > 1_000,
        "no workload ran: {}",
        run.explain()
    );
    run.clean_up();
    expect_pass_without_the_switch(label, args);
}

/// The control's twin: the same seed, timings and faults with the unsafe switch left out must
/// pass, or the control shows nothing (a checker that always fires would trip it too; for P6,
/// this is where a fault-free run is shown to pass it).
fn expect_pass_without_the_switch(label: &str, args: &[&str]) {
    let mut safe = Vec::new();
    let mut rest = args.iter().peekable();
    while let Some(a) = rest.next() {
        if a.starts_with("--unsafe-") {
            // A switch with a value (`--unsafe-clock-drift-ppm 200000`) takes it along.
            if rest.peek().is_some_and(|v| !v.starts_with("--")) {
                rest.next();
            }
            continue;
        }
        safe.push(*a);
    }
    assert!(
        safe.len() < args.len(),
        "{label}: no --unsafe- switch to leave out in {args:?}"
    );
    let twin = format!("{label}-safe");
    let run = common::sim_run(&twin, &safe, LIMIT);
    assert_eq!(
        run.code,
        Some(0),
        "the same run without the unsafe switch failed, so the control proves nothing: {}",
        run.explain()
    );
    assert!(run.stdout.contains("sim: PASS"), "{}", run.explain());
    assert!(
        common::ok_calls(&run.stdout) > 1_000,
        "no workload ran: {}",
        run.explain()
    );
    run.clean_up();
}

/// Rule 4 broken: a new owner serves at once while the old one, cut from the store (so it
/// learns nothing) but still reached by clients, serves on from its lease. A 1 s detection
/// interval under a 5 s lease opens a window of a few seconds on every long enough cut; seed 3
/// draws cuts of 3.2 s and 5.7 s (`sim plan` shows them), and the second one trips.
/// A pause shorter than the lease rarely trips it: the resumed owner renews at once and learns
/// that its sections moved.
#[test]
fn skipping_the_lease_wait_lets_two_owners_serve_and_is_caught() {
    expect_violation(
        "neg-lease-wait",
        &[
            "--seed",
            "3",
            "--duration",
            "45s",
            "--lease-ms",
            "5000",
            "--detect-ms",
            "1000",
            "--must-include",
            "cut-alloc-from-store,cut-alloc-from-store",
            "--fault-kinds",
            "cut-alloc-from-store",
            "--unsafe-skip-lease-wait",
        ],
        &["P1", "P4"],
    );
}

/// Rule 5 broken: an AllocSvr that loses its sections (paused for 3 leases, so another owner
/// serves them meanwhile) and gets them back, or other sections it once owned, reuses its old
/// `cur_seq` memory, below what the other owners handed out. (A 1.5-lease pause is not enough:
/// the resumed node takes its sections back before the new owner's lease wait is over, so nobody
/// served them in between.)
#[test]
fn keeping_memory_across_epochs_goes_backwards_and_is_caught() {
    let kinds = "pause-alloc-3-lease";
    expect_violation(
        "neg-keep-memory",
        &[
            "--seed",
            "3",
            "--duration",
            "40s",
            "--must-include",
            kinds,
            "--fault-kinds",
            kinds,
            "--unsafe-keep-memory",
        ],
        &["P1"],
    );
}

/// Rule 6 broken (serve nothing above an unacknowledged ceiling): an owner cut from the store
/// (clients still reach it) starts a prefetch bump that never lands and, with the switch, serves
/// up to its target; its lease runs out; the new owner loads the old `max_seq` M and serves from
/// M + 1 again. A step of 10 makes a hot uid cross M within a second of the cut; a 5 s lease with
/// 1 s detection leaves the cut owner about 4 s of serving, and the new owner loads M long before
/// the cut ends, so even a cut that ends inside the old lease cannot save it (the late bump is
/// refused as stale). Seed 5 draws cuts of 5.1 s, 7.4 s and 3.9 s (`sim plan`).
#[test]
fn serving_before_the_bump_is_acknowledged_repeats_seqs_and_is_caught() {
    let kinds = "cut-alloc-from-store";
    expect_violation(
        "neg-serve-before-ack",
        &[
            "--seed",
            "5",
            "--duration",
            "50s",
            "--step",
            "10",
            "--lease-ms",
            "5000",
            "--detect-ms",
            "1000",
            "--must-include",
            "cut-alloc-from-store,cut-alloc-from-store,cut-alloc-from-store",
            "--fault-kinds",
            kinds,
            "--unsafe-serve-before-bump-ack",
        ],
        &["P1", "P2"],
    );
}

/// Rule 6 broken (fenced bumps), `--unsafe-skip-epoch-fence` on every StoreSvr: the store applies
/// any bump and echoes its epoch. `lag-alloc-to-store` makes every request of one owner arrive 2 s
/// late (the 1 s detection interval + 1 s; replies on time): its renewals stop arriving, the
/// arbiter moves its sections, the new owner loads M at once but waits out the 5 s lease. A bump
/// the old owner sent just before its next renewal lands after that Load, is applied without the
/// fence, and its acknowledgement (a bump waits up to half a lease for its reply) reaches the old
/// owner before the late renewal's refusal does: the old owner serves above M until then, and the
/// new owner later serves from M + 1 again. `--step 20` keeps a bump in flight all the time.
/// (The first shape tried, `hold-alloc-to-store`, tripped in 1 of 13 holds: there the renewal's
/// refusal came first; docs/SIMULATOR.md.) Whether the acknowledgement beats the refusal is a
/// race of a few milliseconds on a loaded machine: seed 1's two lags once went unnoticed in a
/// full CI run (and tripped when run again), so seeds 2 and 4 get two more lags each if it does
/// (both tripped on debug binaries with a release build running beside them; seed 3 did not).
#[test]
fn skipping_the_epoch_fence_lets_a_late_bump_through_and_is_caught() {
    let kinds = "lag-alloc-to-store";
    expect_violation_in_one_of(
        "neg-epoch-fence",
        &["2", "4"],
        &[
            "--seed",
            "1",
            "--duration",
            "40s",
            "--step",
            "20",
            "--lease-ms",
            "5000",
            "--detect-ms",
            "1000",
            "--must-include",
            "lag-alloc-to-store,lag-alloc-to-store",
            "--fault-kinds",
            kinds,
            "--unsafe-skip-epoch-fence",
        ],
        &["P1", "P2"],
    );
}

/// The move protocol broken: with `--unsafe-skip-move-wait` the source hands out its final
/// ceilings right after the freeze, while its owner (paused for half a lease, so it wakes with its
/// lease still running and its stale clients' requests queued) has not let go. The target serves
/// the range; the woken owner answers from memory after it: two sets serve one section (OneSet),
/// and a uid served by both goes back (P1). Every move of seed 3 trips: the fault queues stale
/// callers for every moved section, so the control does not hang on which uid one call asks for,
/// and holds the owner's links to its store until they are answered, so its overdue renewal cannot
/// tell it to let go first (that race let the control pass once in CI).
#[test]
fn a_target_serving_before_the_source_owner_is_gone_is_caught() {
    expect_violation(
        "neg-move-wait",
        &[
            "--seed",
            "3",
            "--duration",
            "40s",
            "--sets",
            "2",
            "--fault-kinds",
            "move-paused-owner",
            "--unsafe-skip-move-wait",
        ],
        &["OneSet", "P1"],
    );
}

/// Named counters broken: with `--unsafe-keys-share-seq` every key of a section counts on one
/// shared `cur_seq`, so a key's values skip what the section's other keys took. No value repeats
/// and each key still rises, so only P6 can see it: a run without faults (where every AllocSvr
/// keeps every key, and a gap is a violation) must find a key whose value jumped.
#[test]
fn keys_sharing_one_cur_seq_skip_values_and_are_caught() {
    expect_violation(
        "neg-keys-share-seq",
        &[
            "--seed",
            "7",
            "--duration",
            "15s",
            "--no-faults",
            "--keys",
            "--unsafe-keys-share-seq",
        ],
        &["P6"],
    );
}

/// G1 broken (a ledger number is decided by its entry, answered only once that entry committed):
/// with the switch the store leader answers a reserve with the number it predicts and writes it
/// in the background; a paused leader is deposed, its unwritten reserves are lost, and the next
/// leader hands their numbers out again. Caught as one number answered to two requests.
#[test]
fn answering_a_ledger_reserve_before_it_commits_hands_a_number_out_twice_and_is_caught() {
    let kinds = "pause-store-leader";
    expect_violation(
        "neg-ledger-answer-before-commit",
        &[
            "--seed",
            "7",
            "--duration",
            "30s",
            "--ledger",
            "--must-include",
            kinds,
            "--fault-kinds",
            kinds,
            "--unsafe-ledger-answer-before-commit",
        ],
        &["G1"],
    );
}
