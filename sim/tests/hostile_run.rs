//! The short form of the hostile mode (`sim run --front resp|http --hostile`, docs/simulator/workloads.md):
//! one round of every flood — nested and trickled commands, 2,000 idle sockets, partial commands,
//! header floods, unread replies — against every AllocSvr's front end beside the normal workload,
//! after a first phase without floods. Each run must keep every promise, no process may die, no
//! AllocSvr may pass 256 MiB, and the well-behaved caller's p99 may not pass 3x its first phase's.
//!
//! Faults are off here: the floods are what is under test, and a fault's outage would leave too
//! few of the caller's calls to judge its p99 in a run this short (the long runs by hand have both).
//! A third run sets a memory bound no AllocSvr can keep, to show that the bound is enforced.
//!
//! About 45 s per run on a debug build (10 s without floods, 25 s with). Needs
//! `cargo build --workspace --bins` first.

mod common;

use std::sync::Mutex;
use std::time::Duration;

/// The runs take turns: the p99 bound compares two phases of one run, and a second cluster beside
/// it on a 2-core machine would load one phase and not the other.
static ONE_CLUSTER_AT_A_TIME: Mutex<()> = Mutex::new(());

const LIMIT: Duration = Duration::from_secs(180);

fn hostile_args<'a>(front: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "--seed",
        "47",
        "--front",
        front,
        "--hostile",
        "--duration",
        "25s",
        "--no-faults",
        "--keys",
    ];
    args.extend_from_slice(extra);
    args
}

/// The report's numbers that show the floods ran and the caller was judged.
fn assert_floods_ran(run: &common::SimRun) {
    let out = &run.stdout;
    assert!(
        out.contains("hostile: 1 rounds of floods"),
        "no round of floods: {}",
        run.explain()
    );
    for line in ["p99 without floods", "p99 with floods", "hostile: AllocSvr memory"] {
        assert!(out.contains(line), "no {line:?} in the report: {}", run.explain());
    }
    assert!(
        common::ok_calls(out) > 1_000,
        "too few ok calls to mean anything: {}",
        run.explain()
    );
}

fn expect_pass(front: &str) {
    let _one = ONE_CLUSTER_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let run = common::sim_run(&format!("hostile-{front}"), &hostile_args(front, &[]), LIMIT);
    assert_floods_ran(&run);
    assert_eq!(run.code, Some(0), "{}", run.explain());
    assert!(run.stdout.contains("sim: PASS (seed 47)"), "{}", run.explain());
    run.clean_up();
}

#[test]
fn resp_front_ends_survive_floods_within_memory_and_latency_bounds() {
    expect_pass("resp");
}

#[test]
fn http_front_ends_survive_floods_within_memory_and_latency_bounds() {
    expect_pass("http");
}

/// The memory bound bites: 16 MiB is below what any AllocSvr needs at rest.
#[test]
fn a_memory_bound_below_an_allocsvrs_needs_fails_the_run() {
    let _one = ONE_CLUSTER_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let args = [
        "--seed",
        "47",
        "--front",
        "http",
        "--hostile",
        "--hostile-baseline",
        "2s",
        "--duration",
        "13s",
        "--no-faults",
        "--hostile-max-rss-mib",
        "16",
    ];
    let run = common::sim_run("hostile-rss-control", &args, LIMIT);
    assert_eq!(run.code, Some(1), "the memory bound went unnoticed: {}", run.explain());
    assert!(
        run.stdout.contains("(bound 16 MiB)") && run.stdout.contains("HOSTILE: allocsvr-"),
        "exit 1 without the memory failure: {}",
        run.explain()
    );
    run.clean_up();
}
