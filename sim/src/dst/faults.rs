//! The faults of one seed, drawn before the run from the seed alone (so a replay with a subset of
//! them, `--faults`, keeps the others where they were), and how each is injected and healed.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::group::REPLICAS;
use super::world::{Ep, World};

/// What a fault does.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Kill an AllocSvr; a new process starts when the fault heals.
    KillAlloc(usize),
    /// SIGTERM an AllocSvr (it releases what it holds) and start it again, twice: at the start
    /// and at the end of the fault.
    TermAllocTwice(usize),
    /// SIGSTOP an AllocSvr until the fault heals.
    PauseAlloc(usize),
    /// Cut an AllocSvr from every StoreSvr, both ways.
    CutAllocStore(usize),
    /// Cut one direction only: requests (true) or replies (false) are lost.
    CutAllocStoreOneWay(usize, bool),
    /// Every request of an AllocSvr to the store arrives this many ms late (replies on time).
    LagAllocStore(usize, u64),
    /// Cut the clients from an AllocSvr, both ways.
    CutClientsAlloc(usize),
    /// Kill the store leader (its disk wiped when true); it restarts when the fault heals.
    KillStoreLeader(bool),
    /// Cut the store leader from the other replicas.
    IsolateStoreLeader,
    /// Lose this share of every message.
    Lossy(f64),
    /// Deliver this share of store requests twice.
    Duplicate(f64),
    /// Delay every message by up to this many ms more (messages overtake each other).
    Slow(u64),
    /// A forger sends Releases, Renews and Bumps in other incarnations' names (`forger`), drawn
    /// from this seed of its own.
    Forge(u64),
}

/// One fault: what, when (ms after the start) and for how long.
#[derive(Clone, Debug, Serialize)]
pub struct Fault {
    pub kind: Kind,
    pub at_ms: u64,
    pub for_ms: u64,
}

impl Fault {
    pub fn name(&self) -> String {
        let s = serde_json::to_value(self.kind).unwrap_or_default();
        match s {
            serde_json::Value::String(n) => n,
            serde_json::Value::Object(m) => m.keys().next().cloned().unwrap_or_default(),
            _ => String::new(),
        }
    }
}

/// Between 2 and 6 faults over the first `load_ms`, drawn from `seed` alone, each lasting up to
/// two and a half leases (long enough to outlive a lease or not); in half the seeds, a forger
/// after them (see [`forger_of`]).
pub fn schedule(seed: u64, load_ms: u64, allocs: usize, lease_ms: u64) -> Vec<Fault> {
    let mut faults = process_and_network(seed, load_ms, allocs, lease_ms);
    faults.extend(forger_of(seed, load_ms));
    faults
}

/// The forger of a seed, if it has one: from the second quarter of the load on, for the rest of
/// it or less. Drawn from a generator of its own and listed last, so that adding it left every
/// other fault of every seed (and its index for `--faults`) where it was.
fn forger_of(seed: u64, load_ms: u64) -> Option<Fault> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xf0e6_e500_0000_0000);
    if !rng.random_bool(0.5) {
        return None;
    }
    let at_ms = rng.random_range(load_ms / 8..load_ms / 2);
    Some(Fault {
        kind: Kind::Forge(rng.random()),
        at_ms,
        for_ms: rng.random_range(load_ms / 4..=load_ms - at_ms),
    })
}

fn process_and_network(seed: u64, load_ms: u64, allocs: usize, lease_ms: u64) -> Vec<Fault> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xfa17_5eed_0000_0000);
    let n = rng.random_range(2..=6);
    (0..n)
        .map(|_| {
            let a = rng.random_range(0..allocs);
            let kind = match rng.random_range(0..14) {
                13 => Kind::TermAllocTwice(a),
                0 | 1 => Kind::KillAlloc(a),
                2 | 3 => Kind::PauseAlloc(a),
                4 => Kind::CutAllocStore(a),
                5 => Kind::CutAllocStoreOneWay(a, rng.random_bool(0.5)),
                6 => Kind::LagAllocStore(a, rng.random_range(500..2_500)),
                7 => Kind::CutClientsAlloc(a),
                8 => Kind::KillStoreLeader(rng.random_bool(0.3)),
                9 => Kind::IsolateStoreLeader,
                10 => Kind::Lossy(rng.random_range(0.05..0.4)),
                11 => Kind::Duplicate(rng.random_range(0.2..0.8)),
                _ => Kind::Slow(rng.random_range(5..400)),
            };
            Fault {
                kind,
                at_ms: rng.random_range(300..load_ms.saturating_sub(300).max(301)),
                for_ms: rng.random_range(100..lease_ms * 5 / 2),
            }
        })
        .collect()
}

/// Injects `f`; returns what it hit, for the history.
pub fn inject(world: &std::sync::Arc<World>, f: &Fault) -> String {
    match f.kind {
        Kind::KillAlloc(i) => {
            world.kill_alloc(i);
            format!("allocsvr-{i}")
        }
        Kind::TermAllocTwice(i) => {
            world.restart_alloc(i);
            format!("allocsvr-{i}")
        }
        Kind::PauseAlloc(i) => {
            world.pause_alloc(i, tokio::time::Instant::now() + Duration::from_millis(f.for_ms));
            format!("allocsvr-{i}")
        }
        Kind::CutAllocStore(i) => cut_store(world, i, true, true),
        Kind::CutAllocStoreOneWay(i, requests) => cut_store(world, i, requests, !requests),
        Kind::LagAllocStore(i, ms) => {
            let mut st = world.lock();
            for r in 0..REPLICAS {
                st.net
                    .lag
                    .insert((Ep::Alloc(i), Ep::Store(0, r)), Duration::from_millis(ms));
            }
            format!("allocsvr-{i}/store")
        }
        Kind::CutClientsAlloc(i) => {
            let mut st = world.lock();
            st.net.cut.insert((Ep::Clients, Ep::Alloc(i)));
            st.net.cut.insert((Ep::Alloc(i), Ep::Clients));
            format!("clients/allocsvr-{i}")
        }
        Kind::KillStoreLeader(wipe) => {
            let mut st = world.lock();
            let leader = st.groups[0].leader().unwrap_or(0);
            st.groups[0].crash(leader, wipe);
            format!("storesvr-{leader}")
        }
        Kind::IsolateStoreLeader => {
            let mut st = world.lock();
            let leader = st.groups[0].leader().unwrap_or(0);
            st.groups[0].replicas[leader].isolated = true;
            format!("storesvr-{leader}")
        }
        Kind::Lossy(p) => {
            world.lock().net.drop = p;
            "network".into()
        }
        Kind::Duplicate(p) => {
            world.lock().net.dup = p;
            "network".into()
        }
        Kind::Slow(ms) => {
            world.lock().net.jitter = Duration::from_millis(ms);
            "network".into()
        }
        Kind::Forge(seed) => {
            let forger = tokio::spawn(super::forger::forge(world.clone(), seed));
            world.lock().forger = Some(forger.abort_handle());
            "storesvr leader".into()
        }
    }
}

fn cut_store(world: &World, i: usize, requests: bool, replies: bool) -> String {
    let mut st = world.lock();
    for r in 0..REPLICAS {
        if requests {
            st.net.cut.insert((Ep::Alloc(i), Ep::Store(0, r)));
        }
        if replies {
            st.net.cut.insert((Ep::Store(0, r), Ep::Alloc(i)));
        }
    }
    format!("allocsvr-{i}/store")
}

/// Heals `f` (a killed process starts again; `target` is what [`inject`] returned).
pub fn heal(world: &std::sync::Arc<World>, f: &Fault, target: &str) {
    match f.kind {
        Kind::KillAlloc(i) => world.start_alloc(i),
        Kind::TermAllocTwice(i) => world.restart_alloc(i),
        Kind::PauseAlloc(_) => {}
        Kind::CutAllocStore(i) | Kind::CutAllocStoreOneWay(i, _) => {
            world
                .lock()
                .net
                .cut
                .retain(|&(a, b)| a != Ep::Alloc(i) && b != Ep::Alloc(i) || a == Ep::Clients || b == Ep::Clients);
        }
        Kind::LagAllocStore(i, _) => world.lock().net.lag.retain(|&(a, _), _| a != Ep::Alloc(i)),
        Kind::CutClientsAlloc(i) => {
            let mut st = world.lock();
            st.net.cut.remove(&(Ep::Clients, Ep::Alloc(i)));
            st.net.cut.remove(&(Ep::Alloc(i), Ep::Clients));
        }
        Kind::KillStoreLeader(_) | Kind::IsolateStoreLeader => {
            let r: usize = target.trim_start_matches("storesvr-").parse().unwrap_or(0);
            let mut st = world.lock();
            st.groups[0].restart(r);
            st.groups[0].replicas[r].isolated = false;
        }
        Kind::Lossy(_) => world.lock().net.drop = 0.0,
        Kind::Duplicate(_) => world.lock().net.dup = 0.0,
        Kind::Slow(_) => world.lock().net.jitter = Duration::ZERO,
        Kind::Forge(_) => stop_forger(world),
    }
}

fn stop_forger(world: &World) {
    if let Some(f) = world.lock().forger.take() {
        f.abort();
    }
}

/// Heals everything at the end of the load: every link, every process, every replica.
pub fn heal_all(world: &std::sync::Arc<World>) {
    stop_forger(world);
    let dead: Vec<usize> = {
        let mut st = world.lock();
        st.net = Default::default();
        for r in 0..REPLICAS {
            st.groups[0].restart(r);
            st.groups[0].replicas[r].isolated = false;
        }
        let now = tokio::time::Instant::now();
        for s in &st.allocs {
            s.proc.pause_until(now);
        }
        (0..st.allocs.len())
            .filter(|&i| !st.allocs[i].proc.is_alive())
            .collect()
    };
    for i in dead {
        world.start_alloc(i);
    }
}
