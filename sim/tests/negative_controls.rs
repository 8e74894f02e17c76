//! Negative controls: each test runs `sim run` with one unsafe switch that breaks one rule of the
//! ownership protocol (DESIGN.md §4), timings and a fault schedule aimed at that rule, and demands
//! exit 1 with the violation the broken rule must cause. They prove the checkers can fail.
//!
//! The tests run one at a time (a lock): two clusters side by side on a 2-core CI machine would
//! stretch the timings both depend on. Each takes about a minute on a debug build. Needs
//! `cargo build --workspace --bins` first.

mod common;

use std::sync::Mutex;
use std::time::Duration;

static ONE_CLUSTER_AT_A_TIME: Mutex<()> = Mutex::new(());

const LIMIT: Duration = Duration::from_secs(240);

/// Runs one control and asserts exit 1 with a violation of one of `promises`.
fn expect_violation(label: &str, args: &[&str], promises: &[&str]) {
    let _one = ONE_CLUSTER_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let run = common::sim_run(label, args, LIMIT);
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
