//! SIGKILL one replica of a 3-replica group at random (seeded) moments while the group writes,
//! and restart it each time: every restart must succeed and no acknowledged bump may be lost
//! (`max_seq` of every section stays >= the highest acknowledged one: P2, P3).
//!
//! Bumps go through a fake owner (as in `durability.rs`); about a third of the kills hit the
//! leader, so elections happen; `--snapshot-logs=5` makes snapshot builds (and log purges)
//! frequent, so kills land during snapshot writes too.
//!
//! `cargo test -p storesvr --test kill_loop` runs a bounded number of cycles (CI);
//! `KILL_LOOP_CYCLES=500 cargo test --release -p storesvr --test kill_loop -- --nocapture` the
//! long version; `KILL_LOOP_SEED=N` replays another seed.

mod common;

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use seqsvr_proto::pb;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(30);
const CI_CYCLES: u64 = 20;
const STEP: u64 = 100;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Bumps every section in turn through one fake owner until `stop`; records acknowledged ceilings
/// and counts acknowledgements in `ok_count` (the kill loop waits for one between kills).
async fn write_until(
    c_client: seqsvr_control::StoreClient,
    owner: FakeOwner,
    acked: Arc<Vec<AtomicU64>>,
    stop: Arc<AtomicBool>,
    ok_count: Arc<AtomicU64>,
) -> u64 {
    let mut epochs = Vec::new();
    for s in 0..SECTIONS {
        epochs.push(owner.epoch_of(&c_client, s, WAIT).await);
    }
    // Like an owner: one step above the last acknowledged ceiling, and an unknown outcome is
    // retried with the same target (the store refuses a bump more than a few steps up).
    let mut next: Vec<u64> = vec![STEP; SECTIONS as usize];
    let mut ok = 0u64;
    let mut s = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let req = common::bump_request(owner.incarnation, s as u64, epochs[s], next[s]);
        // An error or a timeout is an unknown outcome: it proves nothing, so nothing is recorded.
        if let Ok(r) = c_client.bump(req).await {
            let r = r.results[0];
            if r.outcome == pb::BumpOutcome::StaleEpoch as i32 {
                epochs[s] = owner.epoch_of(&c_client, s as u64, WAIT).await;
            } else {
                assert!(r.max_seq >= next[s], "bump to {} acknowledged with {r:?}", next[s]);
                acked[s].fetch_max(r.max_seq, Ordering::AcqRel);
                ok += 1;
                ok_count.store(ok, Ordering::Release);
            }
            next[s] = next[s].max(r.max_seq + STEP);
        }
        s = (s + 1) % SECTIONS as usize;
    }
    ok
}

async fn check_nothing_lost(c: &Cluster, acked: &[AtomicU64], when: &str) {
    let client = c.client();
    for (s, a) in acked.iter().enumerate() {
        let want = a.load(Ordering::Acquire);
        let got = load(&client, s as u64).await.max_seq;
        assert!(
            got >= want,
            "{when}: section {s} has max_seq {got} < acknowledged {want}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_killed_at_random_moments_restart_and_lose_no_acknowledged_bump() {
    let cycles = env_u64("KILL_LOOP_CYCLES", CI_CYCLES);
    let seed = env_u64("KILL_LOOP_SEED", 42);
    println!("kill loop: {cycles} cycles, seed {seed} (replay: KILL_LOOP_SEED={seed} KILL_LOOP_CYCLES={cycles})");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut c = Cluster::start_with(3, &["--snapshot-logs=5", "--keep-logs=0"]);
    c.wait_leader(WAIT).await;
    let client = c.client();
    let owner = FakeOwner::register(&client, 1).await;
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..SECTIONS).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let ok_count = Arc::new(AtomicU64::new(0));
    let writer = tokio::spawn(write_until(
        client.clone(),
        owner,
        acked.clone(),
        stop.clone(),
        ok_count.clone(),
    ));

    let started = Instant::now();
    let (mut leader_kills, mut restart_total, mut restart_max) = (0u64, Duration::ZERO, Duration::ZERO);
    let mut acked_before = 0;
    for cycle in 1..=cycles {
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..300))).await;
        // Every kill comes after a bump acknowledged since the last one, so that every cycle
        // has something to lose: on a loaded machine, elections after leader kills once left 19
        // bumps for 20 kills. The group must have recovered by now; not within WAIT is a failure.
        let t = Instant::now();
        while ok_count.load(Ordering::Acquire) <= acked_before {
            assert!(
                t.elapsed() < WAIT,
                "cycle {cycle} (seed {seed}): no bump acknowledged within {WAIT:?} of the last restart"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        acked_before = ok_count.load(Ordering::Acquire);
        let leader = {
            let mut found = None;
            for id in c.running() {
                if let Some(s) = c.status_of(id).await
                    && s.leader_id != 0
                {
                    found = Some(s.leader_id);
                    break;
                }
            }
            found
        };
        let victim = match leader {
            Some(l) if rng.random_range(0..3) == 0 => l,
            _ => rng.random_range(1..=3u64),
        };
        if Some(victim) == leader {
            leader_kills += 1;
        }
        c.kill(victim);
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..100))).await;
        let t = Instant::now();
        c.spawn(victim, false);
        // The restart succeeded once the replica answers Status (it has replayed its log).
        loop {
            if c.status_of(victim).await.is_some() {
                break;
            }
            if let Some(status) = c.wait_exit(victim, Duration::ZERO) {
                let log = std::fs::read_to_string(c.log_path(victim)).unwrap_or_default();
                let tail: Vec<&str> = log
                    .lines()
                    .rev()
                    .take(20)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                panic!(
                    "cycle {cycle} (seed {seed}): replica {victim} did not start again ({status}); data dir {}:\n{}",
                    c.data_dir(victim).display(),
                    tail.join("\n")
                );
            }
            assert!(
                t.elapsed() < WAIT,
                "cycle {cycle} (seed {seed}): replica {victim} did not answer within {WAIT:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        restart_total += t.elapsed();
        restart_max = restart_max.max(t.elapsed());
        if cycle % 10 == 0 {
            check_nothing_lost(&c, &acked, &format!("after cycle {cycle}")).await;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let bumps = writer.await.unwrap();
    c.wait_leader(WAIT).await;
    check_nothing_lost(&c, &acked, "at the end").await;
    let top: u64 = acked.iter().map(|a| a.load(Ordering::Acquire)).max().unwrap_or(0);
    println!(
        "kill loop: {cycles} kills ({leader_kills} of the leader) in {:.1} s, every restart succeeded \
         (mean {:.0} ms, max {:.0} ms to answer Status); {bumps} bumps acknowledged, none lost \
         (highest acknowledged max_seq {top})",
        started.elapsed().as_secs_f64(),
        restart_total.as_secs_f64() * 1e3 / cycles.max(1) as f64,
        restart_max.as_secs_f64() * 1e3,
    );
    assert!(
        bumps >= cycles,
        "too few bumps acknowledged ({bumps}) for the test to mean anything"
    );
}
