//! The CI simulation: `sim run` as a process against the real binaries, with a fixed seed and
//! the `--ci` profile, which guarantees a SIGKILL of a section owner, a SIGKILL of the StoreSvr
//! leader, a SIGSTOP of an owner longer than the lease (3 s lease, 4.5 s pause), an owner
//! terminated twice while every Release is repeated 1–2 s late, and a SIGKILL right after a
//! registration, followed by seeded faults of every kind. It must pass every check, and the summary must show those three
//! faults hitting the intended targets (an owner with its sections, a self-declared leader).
//!
//! About 2 minutes on a debug build (120 s of workload, about 12 faults). Needs `cargo build --workspace --bins` first.
//!
//! A third, shorter run (60 s of workload) issues time-ordered ids beside the sequences (`--ids`)
//! through an AllocSvr restarted on a clock 2 s behind, an owner killed, a clock stepped 10 s
//! back and an owner paused past its lease, and checks U1–U4 over every id.

mod common;

use std::sync::Mutex;
use std::time::Duration;

/// The two runs take turns: two clusters side by side on a 2-core CI machine would stretch the
/// timings both depend on.
static ONE_CLUSTER_AT_A_TIME: Mutex<()> = Mutex::new(());

const SEED: &str = "20250101";

#[test]
fn ci_profile_run_keeps_every_promise_through_owner_kill_leader_kill_and_long_pause() {
    let _one = ONE_CLUSTER_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let run = common::sim_run(
        "ci",
        &["--seed", SEED, "--duration", "120s", "--ci"],
        Duration::from_secs(360),
    );
    assert_eq!(run.code, Some(0), "{}", run.explain());
    let out = &run.stdout;
    assert!(out.contains(&format!("sim: PASS (seed {SEED})")), "{}", run.explain());
    assert!(out.contains("violations: 0 "), "{}", run.explain());
    assert!(
        common::ok_calls(out) > 10_000,
        "too few ok calls to mean anything: {}",
        run.explain()
    );
    let fault_lines: Vec<&str> = out.lines().filter(|l| l.trim_start().starts_with("fault ")).collect();
    let has = |kind: &str, target: &str| {
        fault_lines
            .iter()
            .any(|l| l.contains(&format!(" {kind} ")) && l.contains(target))
    };
    assert!(
        has("kill-alloc-owner", "(owner of sections "),
        "no SIGKILL of a section owner: {}",
        run.explain()
    );
    assert!(
        has("kill-store-leader", "(leader)"),
        "no SIGKILL of the StoreSvr leader: {}",
        run.explain()
    );
    assert!(
        has("pause-alloc-1.5-lease", "(owner of sections "),
        "no pause of an owner longer than the lease: {}",
        run.explain()
    );
    assert!(
        has("term-alloc-twice", "(owner of sections "),
        "no owner terminated twice under repeated Releases: {}",
        run.explain()
    );
    assert!(
        has("kill-alloc-registered", "killed again right after it registered"),
        "no SIGKILL right after a registration: {}",
        run.explain()
    );
    run.clean_up();
}

/// Two sets under the CI profile plus one of each move: a plain move, a move whose `seqctl` is
/// SIGKILLed mid-way and then resumed (or cancelled), a move while the source's owner is paused,
/// and a move overlapping a second fault. Ledger callers run beside (`--ledger`: their ledgers
/// move with their ranges). Every promise must hold, the OneSet checker and the ledger's G1–G3
/// included, and every move must end done or cancelled.
#[test]
fn two_sets_with_moves_keep_every_promise() {
    let _one = ONE_CLUSTER_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let run = common::sim_run(
        "ci-sets",
        &["--seed", SEED, "--duration", "120s", "--sets", "2", "--ci", "--ledger"],
        Duration::from_secs(420),
    );
    assert_eq!(run.code, Some(0), "{}", run.explain());
    let out = &run.stdout;
    assert!(
        out.contains("\"OneSet\": 0"),
        "the OneSet checker did not run: {}",
        run.explain()
    );
    for promise in ["G1", "G2", "G3", "Holds"] {
        assert!(
            out.contains(&format!("\"{promise}\": 0")),
            "the ledger checker {promise} did not run: {}",
            run.explain()
        );
    }
    assert!(common::ok_calls(out) > 10_000, "too few ok calls: {}", run.explain());
    let moves: Vec<&str> = out
        .lines()
        .filter(|l| l.trim_start().starts_with("fault ") && l.contains(" move-"))
        .collect();
    for kind in ["move-range", "move-kill-cli", "move-paused-owner", "move-under-fault"] {
        assert!(
            moves.iter().any(|l| l.contains(&format!(" {kind} "))),
            "no {kind}: {}",
            run.explain()
        );
    }
    assert!(
        moves.iter().filter(|l| l.contains(", done)")).count() >= 3,
        "fewer than 3 moves done: {}",
        run.explain()
    );
    run.clean_up();
}

/// Time-ordered ids (`--ids`) through the id clock faults: an AllocSvr SIGKILLed and restarted on a
/// clock 2 s behind (the classic Snowflake duplicate: its new incarnation must issue above the
/// slot's floor), an owner killed, an AllocSvr's clock stepped 10 s back (beyond the 3 s
/// allowance: it must stop issuing) and an owner paused past its lease, then the seed's draws.
/// Every promise must hold, U1–U4 over every id included, and ids must be issued again after the
/// heal. About 90 s on a debug build.
#[test]
fn ids_keep_u1_to_u4_through_a_restart_behind_and_clock_steps() {
    let _one = ONE_CLUSTER_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let run = common::sim_run(
        "ci-ids",
        &[
            "--seed",
            "5",
            "--duration",
            "60s",
            "--ids",
            "--must-include",
            "id-clock-restart-behind,kill-alloc-owner,id-clock-step,pause-alloc-1.5-lease",
        ],
        Duration::from_secs(300),
    );
    assert_eq!(run.code, Some(0), "{}", run.explain());
    let out = &run.stdout;
    assert!(out.contains("sim: PASS (seed 5)"), "{}", run.explain());
    for promise in ["U1", "U2", "U3", "U4"] {
        assert!(
            out.contains(&format!("\"{promise}\": 0")),
            "the {promise} checker did not run: {}",
            run.explain()
        );
    }
    let (ok, ids) = common::ids_checked(out);
    assert!(
        ok > 500 && ids > 10_000,
        "too few NextIds calls or ids to mean anything ({ok} ok, {ids} ids): {}",
        run.explain()
    );
    assert!(out.contains("sim: ids are issued again"), "{}", run.explain());
    let faults: Vec<&str> = out.lines().filter(|l| l.trim_start().starts_with("fault ")).collect();
    for (kind, target) in [
        ("id-clock-restart-behind", "(restarted, id clock -2000 ms)"),
        ("id-clock-step", "(id clock -10000 ms)"),
        ("kill-alloc-owner", "(owner of sections "),
        ("pause-alloc-1.5-lease", "(owner of sections "),
    ] {
        assert!(
            faults
                .iter()
                .any(|l| l.contains(&format!(" {kind} ")) && l.contains(target)),
            "no {kind} on {target}: {}",
            run.explain()
        );
    }
    run.clean_up();
}
