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

/// Rule 4 broken: a new owner serves at once while the old one, cut from the store or paused for
/// less than its lease, still serves from its lease. A 1 s detection interval (under the 3 s
/// lease) opens that window on every cut and every half-lease pause.
#[test]
fn skipping_the_lease_wait_lets_two_owners_serve_and_is_caught() {
    let kinds = "pause-alloc-0.5-lease,cut-alloc-from-store";
    expect_violation(
        "neg-lease-wait",
        &[
            "--seed",
            "3",
            "--duration",
            "40s",
            "--detect-ms",
            "1000",
            "--must-include",
            kinds,
            "--fault-kinds",
            kinds,
            "--unsafe-skip-lease-wait",
        ],
        &["P1", "P4"],
    );
}

/// Rule 5 broken: an AllocSvr that loses its sections (paused for 3 leases, so another owner
/// serves them meanwhile) and gets them back reuses its old `cur_seq` memory, below what the
/// other owner handed out.
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
