//! The faults of one seed, drawn before the run from the seed alone (so a replay with a subset of
//! them, `--faults`, keeps the others where they were), and how each is injected and healed.
//!
//! Set 0's processes and the network draw from the seed's first generators; with two sets, set
//! 1's AllocSvrs and StoreSvr leader draw from one of their own ([`set1_faults`]), so a one-set
//! seed's faults are the same in both modes. A fault of an AllocSvr acts on the links to its own
//! set's StoreSvrs.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use seqsvr_plumbing::lease_clock::SAME_RATE_PPM;
use serde::Serialize;

use super::addrs::REPLICAS;
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
    /// Kill the leader of set `.0` (its disk wiped when `.1`); it restarts when the fault heals.
    KillStoreLeader(u64, bool),
    /// Cut the leader of set `.0` from the other replicas.
    IsolateStoreLeader(u64),
    /// Lose this share of every message.
    Lossy(f64),
    /// Deliver this share of store requests twice.
    Duplicate(f64),
    /// Delay every message by up to this many ms more (messages overtake each other).
    Slow(u64),
    /// Suspend an AllocSvr's host for `.1` ms: its process is paused as by [`Kind::PauseAlloc`]
    /// and its lease clock stands still, then jumps forward by the whole suspension on resume, as
    /// `CLOCK_BOOTTIME` does (under [`super::world::ClockControl::monotonic`] it never catches up). Its links to
    /// the store are cut from the start to the fault's end, some time after the resume (a resumed
    /// host's network is often not up at once): clients reach it before its renewals do, so what
    /// it serves then rests on its lease clock alone.
    SuspendAlloc(usize, u64),
    /// An AllocSvr's lease clock runs this many ppm fast (> 0) or slow (< 0) for the fault, within
    /// the set's drift bound (unless [`super::world::ClockControl::drift_ppm`] says otherwise), while the
    /// others keep the simulated time. Its links to the store are cut for the fault's second
    /// half: a drift matters only to an owner that cannot renew, whose lease then runs out on its
    /// own clock while the store's detection and the next owner's wait run on theirs.
    DriftAlloc(usize, i64),
    /// A forger sends Releases, Renews and Bumps in other incarnations' names (`forger`), drawn
    /// from this seed of its own.
    Forge(u64),
    /// Back up a set now, lose it later and restore it from that backup (`super::restore`).
    RestoreSet(super::restore::Plan),
    /// An AllocSvr's wall clock (the one ids are stamped with) steps by this many ms, back (< 0)
    /// or forward, and steps back to the true time when the fault heals (`--ids` only).
    IdClockStep(usize, i64),
    /// An AllocSvr's wall clock runs this many parts per thousand fast (> 0) or slow for the
    /// fault, then steps back to the true time (`--ids` only).
    IdClockDrift(usize, i64),
    /// An AllocSvr is killed and started again at once on a clock this many ms behind: the
    /// classic Snowflake duplicate (a restart on a host whose clock is behind, reusing its
    /// worker id). The clock is put right when the fault heals (`--ids` only).
    IdClockRestartBehind(usize, i64),
    /// A StoreSvr replica's wall clock (set `.0`; replica `.1`, or the leader at the time when
    /// `None`) steps by `.2` ms and steps back when the fault heals (`--ids` only).
    StoreClockStep(u64, Option<usize>, i64),
    /// A StoreSvr replica's wall clock runs `.2` parts per thousand fast or slow for the fault,
    /// then steps back to the true time (`--ids` only).
    StoreClockDrift(u64, Option<usize>, i64),
    /// A StoreSvr replica is killed and started again at once on a clock `.2` ms behind (put right
    /// when the fault heals; `--ids` only).
    StoreClockRestartBehind(u64, Option<usize>, i64),
}

/// Share of seeds that draw one clock fault, on top of the others.
const CLOCK_FAULT_SHARE: f64 = 0.3;

/// One fault: what, when (ms after the start) and for how long.
#[derive(Clone, Debug, Serialize)]
pub struct Fault {
    pub kind: Kind,
    pub at_ms: u64,
    pub for_ms: u64,
}

impl Fault {
    /// Whether it hits a process of `set` (network-wide faults hit every set and count for none).
    pub fn hits_set(&self, set: u64) -> bool {
        let alloc_set = |i: usize| u64::from(i >= super::ALLOCS);
        match self.kind {
            Kind::KillAlloc(i)
            | Kind::TermAllocTwice(i)
            | Kind::PauseAlloc(i)
            | Kind::CutAllocStore(i)
            | Kind::CutAllocStoreOneWay(i, _)
            | Kind::LagAllocStore(i, _)
            | Kind::CutClientsAlloc(i)
            | Kind::SuspendAlloc(i, _)
            | Kind::DriftAlloc(i, _)
            | Kind::IdClockStep(i, _)
            | Kind::IdClockDrift(i, _)
            | Kind::IdClockRestartBehind(i, _) => alloc_set(i) == set,
            Kind::KillStoreLeader(s, _) | Kind::IsolateStoreLeader(s) => s == set,
            Kind::StoreClockStep(s, ..) | Kind::StoreClockDrift(s, ..) | Kind::StoreClockRestartBehind(s, ..) => {
                s == set
            }
            Kind::RestoreSet(p) => p.set == set,
            Kind::Forge(_) => set == 0,
            Kind::Lossy(_) | Kind::Duplicate(_) | Kind::Slow(_) => false,
        }
    }

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
/// two and a half leases (long enough to outlive a lease or not); then, in a share of the seeds,
/// one clock fault (see [`clock_fault`]); in half the seeds, a forger after them (see
/// [`forger_of`]); with two sets, up to three faults of set 1's processes ([`set1_faults`]); in
/// a share of the seeds, a restore (`super::restore::plan`); with `--ids`, one to three faults of
/// the AllocSvrs' id clocks ([`id_clock_faults`]). Each later group is drawn from a generator of
/// its own and listed after the earlier ones, so adding it left every earlier fault of every
/// seed, and its index for `--faults`, where it was.
pub fn schedule(seed: u64, load_ms: u64, allocs: usize, lease_ms: u64, two_sets: bool, ids: bool) -> Vec<Fault> {
    let mut all = process_and_network(seed, load_ms, allocs, lease_ms);
    all.extend(clock_fault(seed, load_ms, allocs, lease_ms));
    all.extend(forger_of(seed, load_ms));
    if two_sets {
        all.extend(set1_faults(seed, load_ms, allocs, lease_ms));
    }
    all.extend(
        super::restore::plan(seed, load_ms, two_sets).map(|(plan, at_ms, for_ms)| Fault {
            kind: Kind::RestoreSet(plan),
            at_ms,
            for_ms,
        }),
    );
    if ids {
        let all_allocs = allocs + if two_sets { super::moves::SET1_ALLOCS } else { 0 };
        all.extend(id_clock_faults(seed, load_ms, all_allocs));
        all.extend(store_clock_faults(seed, load_ms, if two_sets { 2 } else { 1 }));
    }
    all
}

/// Zero to two faults of the StoreSvrs' wall clocks (`--ids` only, issue 47): a replica — the
/// leader at the time in two draws of three — stepped by ±0.5 s, ±2 s, ±10 s or ±1 h, drifting
/// 5 % or 50 % fast or slow, or restarted on a clock 2 s, 10 s or an hour behind. Raises are
/// stamped with the quorum's clock (`storesvr::raft::clocks`), so one wrong clock of three
/// moves nothing while the three answer; with one of them down, the leader cannot tell and uses
/// its own. Drawn from a generator of its own, listed last.
pub fn store_clock_faults(seed: u64, load_ms: u64, sets: u64) -> Vec<Fault> {
    const STEPS_MS: [i64; 8] = [-3_600_000, -10_000, -2_000, -500, 500, 2_000, 10_000, 3_600_000];
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5c10_c4f0_0000_0000);
    let n = rng.random_range(0..=2);
    (0..n)
        .map(|_| {
            let set = rng.random_range(0..sets);
            let replica = match rng.random_range(0..3) {
                0 => Some(rng.random_range(0..REPLICAS)),
                _ => None,
            };
            let at_ms = rng.random_range(300..load_ms.saturating_sub(300).max(301));
            let for_ms = rng.random_range(100..load_ms.saturating_sub(at_ms).max(101));
            let kind = match rng.random_range(0..5) {
                0 | 1 => Kind::StoreClockStep(set, replica, STEPS_MS[rng.random_range(0..STEPS_MS.len())]),
                2 => Kind::StoreClockDrift(set, replica, [-500, -50, 50, 500][rng.random_range(0..4)]),
                _ => Kind::StoreClockRestartBehind(set, replica, [-3_600_000, -10_000, -2_000][rng.random_range(0..3)]),
            };
            Fault { kind, at_ms, for_ms }
        })
        .collect()
}

/// How far a StoreSvr clock fault can put a replica's clock off the true time, ms: what the U3
/// checker widens its bound by for the calls it may have reached (`checks::ids`). It reads it
/// back from the fault's target, which says "off by up to N ms".
pub fn store_clock_bound_ms(kind: &Kind, for_ms: u64) -> u64 {
    match *kind {
        Kind::StoreClockStep(_, _, ms) | Kind::StoreClockRestartBehind(_, _, ms) => ms.unsigned_abs(),
        Kind::StoreClockDrift(_, _, per_mille) => per_mille.unsigned_abs() * for_ms / 1_000,
        _ => 0,
    }
}

/// One to three faults of the AllocSvrs' id clocks (any set's): steps back and forward, small
/// (within the allowance between an AllocSvr's clock and the store leader's, 3 s here) and large
/// (10 s, an hour), slow and fast drift, and a restart on a clock behind.
pub fn id_clock_faults(seed: u64, load_ms: u64, allocs: usize) -> Vec<Fault> {
    const STEPS_MS: [i64; 8] = [-3_600_000, -10_000, -2_000, -500, 500, 2_000, 10_000, 3_600_000];
    let mut rng = StdRng::seed_from_u64(seed ^ 0x1dc1_0c00_0000_0000);
    let n = rng.random_range(1..=3);
    (0..n)
        .map(|_| {
            let a = rng.random_range(0..allocs);
            let at_ms = rng.random_range(300..load_ms.saturating_sub(300).max(301));
            let for_ms = rng.random_range(100..load_ms.saturating_sub(at_ms).max(101));
            let kind = match rng.random_range(0..5) {
                0 | 1 => Kind::IdClockStep(a, STEPS_MS[rng.random_range(0..STEPS_MS.len())]),
                2 => Kind::IdClockDrift(a, [-500, -50, 50, 500][rng.random_range(0..4)]),
                _ => Kind::IdClockRestartBehind(a, [-3_600_000, -10_000, -2_000][rng.random_range(0..3)]),
            };
            Fault { kind, at_ms, for_ms }
        })
        .collect()
}

/// Up to three faults of set 1's processes (0–3, uniform): its AllocSvrs (slots `allocs..`, kills,
/// pauses, SIGTERMs, cuts, lags, a suspended host or a drifting lease clock) and its StoreSvr
/// leader (killed, perhaps wiped, or cut off), timed like set 0's. Network-wide faults (loss,
/// duplication, delay) are set 0's draws only: they already hit every link of every set.
pub fn set1_faults(seed: u64, load_ms: u64, allocs: usize, lease_ms: u64) -> Vec<Fault> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5e71_fa17_0000_0000);
    let n = rng.random_range(0..=3);
    let bound = i64::try_from(super::params(seed).drift_ppm).unwrap_or(0);
    (0..n)
        .map(|_| {
            let a = allocs + rng.random_range(0..super::moves::SET1_ALLOCS);
            let at_ms = rng.random_range(300..load_ms.saturating_sub(300).max(301));
            let longest = (lease_ms * 5 / 2).min(load_ms.saturating_sub(at_ms)).max(101);
            let for_ms = rng.random_range(100..longest);
            let kind = match rng.random_range(0..12) {
                0 | 1 => Kind::KillAlloc(a),
                2 | 3 => Kind::PauseAlloc(a),
                4 => Kind::TermAllocTwice(a),
                5 => Kind::CutAllocStore(a),
                6 => Kind::CutAllocStoreOneWay(a, rng.random_bool(0.5)),
                7 => Kind::LagAllocStore(a, rng.random_range(500..2_500)),
                8 => Kind::CutClientsAlloc(a),
                9 => Kind::KillStoreLeader(1, rng.random_bool(0.3)),
                10 => Kind::IsolateStoreLeader(1),
                _ => clock_kind(&mut rng, a, for_ms, lease_ms, bound),
            };
            Fault { kind, at_ms, for_ms }
        })
        .collect()
}

/// A clock fault in [`CLOCK_FAULT_SHARE`] of the seeds, drawn with a generator of its own so that
/// every seed keeps the other faults it drew before clock faults existed (the seeds quoted in
/// tests and docs replay their schedules). It ends within the load, where everything is healed.
/// A drift stays within the set's bound, `drift_ppm` (the same for every seed).
pub fn clock_fault(seed: u64, load_ms: u64, allocs: usize, lease_ms: u64) -> Option<Fault> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xc10c_5eed_0000_0000);
    if !rng.random_bool(CLOCK_FAULT_SHARE) {
        return None;
    }
    let a = rng.random_range(0..allocs);
    let bound = i64::try_from(super::params(seed).drift_ppm).unwrap_or(0);
    let at_ms = rng.random_range(300..load_ms.saturating_sub(300).max(301));
    let longest = (lease_ms * 5 / 2).min(load_ms.saturating_sub(at_ms)).max(101);
    let for_ms = rng.random_range(100..longest);
    let kind = clock_kind(&mut rng, a, for_ms, lease_ms, bound);
    Some(Fault { kind, at_ms, for_ms })
}

/// A suspension or a drift (within `bound` ppm) of AllocSvr `a`'s host for a fault of `for_ms`.
fn clock_kind(rng: &mut StdRng, a: usize, for_ms: u64, lease_ms: u64, bound: i64) -> Kind {
    if rng.random_bool(0.5) {
        // The store comes back up to a lease after the resume, within the fault.
        let offline_ms = rng.random_range(0..=lease_ms.min(for_ms / 2));
        Kind::SuspendAlloc(a, for_ms - offline_ms)
    } else {
        Kind::DriftAlloc(a, rng.random_range(-bound..=bound))
    }
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
                8 => Kind::KillStoreLeader(0, rng.random_bool(0.3)),
                9 => Kind::IsolateStoreLeader(0),
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
            let set = st.allocs[i].set;
            for r in 0..REPLICAS {
                st.net
                    .lag
                    .insert((Ep::Alloc(i), Ep::Store(set, r)), Duration::from_millis(ms));
            }
            format!("allocsvr-{i}/store")
        }
        Kind::CutClientsAlloc(i) => {
            let mut st = world.lock();
            st.net.cut.insert((Ep::Clients, Ep::Alloc(i)));
            st.net.cut.insert((Ep::Alloc(i), Ep::Clients));
            format!("clients/allocsvr-{i}")
        }
        Kind::KillStoreLeader(set, wipe) => {
            let mut st = world.lock();
            let g = &mut st.groups[set as usize];
            let leader = g.leader().unwrap_or(0);
            g.crash(leader, wipe);
            replica_name(set, leader)
        }
        Kind::IsolateStoreLeader(set) => {
            let mut st = world.lock();
            let g = &mut st.groups[set as usize];
            let leader = g.leader().unwrap_or(0);
            g.replicas[leader].isolated = true;
            replica_name(set, leader)
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
        Kind::SuspendAlloc(i, ms) => {
            cut_store(world, i, true, true);
            suspend(world, i, Duration::from_millis(ms))
        }
        Kind::DriftAlloc(i, ppm) => drift(world, i, ppm, Duration::from_millis(f.for_ms)),
        Kind::Forge(seed) => {
            let forger = tokio::spawn(super::forger::forge(world.clone(), seed));
            world.lock().forger = Some(forger.abort_handle());
            "storesvr leader".into()
        }
        Kind::RestoreSet(plan) => super::restore::start(world, plan),
        Kind::IdClockStep(i, ms) => {
            let clock = world.id_clock(i);
            clock.set_offset(clock.offset_ms() + ms);
            format!("allocsvr-{i} (id clock {ms:+} ms)")
        }
        Kind::IdClockDrift(i, per_mille) => id_clock_drift(world, i, per_mille, Duration::from_millis(f.for_ms)),
        Kind::IdClockRestartBehind(i, ms) => {
            world.kill_alloc(i);
            let clock = world.id_clock(i);
            clock.set_offset(clock.offset_ms() + ms);
            world.start_alloc(i);
            format!("allocsvr-{i} (restarted, id clock {ms:+} ms)")
        }
        Kind::StoreClockStep(set, r, ms) | Kind::StoreClockRestartBehind(set, r, ms) => {
            let restart = matches!(f.kind, Kind::StoreClockRestartBehind(..));
            let mut st = world.lock();
            let g = &mut st.groups[set as usize];
            let r = r.or(g.leader()).unwrap_or(0);
            if restart {
                g.crash(r, false);
            }
            g.replicas[r].clock_offset_ms += ms;
            if restart {
                g.restart(r);
            }
            let bound = store_clock_bound_ms(&f.kind, f.for_ms);
            format!("{} (clock {ms:+} ms, off by up to {bound} ms)", replica_name(set, r))
        }
        Kind::StoreClockDrift(set, r, per_mille) => {
            let r = {
                let st = world.lock();
                r.or(st.groups[set as usize].leader()).unwrap_or(0)
            };
            store_clock_drift(world, set, r, per_mille, Duration::from_millis(f.for_ms));
            let bound = store_clock_bound_ms(&f.kind, f.for_ms);
            format!(
                "{} (clock {per_mille:+}‰, off by up to {bound} ms)",
                replica_name(set, r)
            )
        }
    }
}

/// Replica `r` of `set` gains (or loses) `per_mille` ms a second for `d`, every 50 ms.
fn store_clock_drift(world: &std::sync::Arc<World>, set: u64, r: usize, per_mille: i64, d: Duration) {
    let world = world.clone();
    tokio::spawn(async move {
        let end = tokio::time::Instant::now() + d;
        let every = Duration::from_millis(50);
        while tokio::time::Instant::now() + every <= end {
            tokio::time::sleep(every).await;
            world.lock().groups[set as usize].replicas[r].clock_offset_ms +=
                per_mille * every.as_millis() as i64 / 1_000;
        }
    });
}

/// AllocSvr `i`'s id clock gains (or loses) `per_mille` ms a second for `d`: an offset that grows
/// every 50 ms (the real clock file is read as often).
fn id_clock_drift(world: &std::sync::Arc<World>, i: usize, per_mille: i64, d: Duration) -> String {
    let clock = world.id_clock(i);
    tokio::spawn(async move {
        let end = tokio::time::Instant::now() + d;
        let every = allocsvr::ids::clock::FOLLOW_EVERY;
        while tokio::time::Instant::now() + every <= end {
            tokio::time::sleep(every).await;
            clock.set_offset(clock.offset_ms() + per_mille * every.as_millis() as i64 / 1_000);
        }
    });
    format!("allocsvr-{i} (id clock {per_mille:+}‰)")
}

/// A store replica's name in the history: `storesvr-R` in set 0 (as before there were sets),
/// `storesvr-S-R` in another set. [`heal`] reads the replica back from its last number.
fn replica_name(set: u64, r: usize) -> String {
    if set == 0 {
        format!("storesvr-{r}")
    } else {
        format!("storesvr-{set}-{r}")
    }
}

/// Cuts AllocSvr `i` from the store `after` from now on, until the fault heals.
fn cut_store_after(world: &std::sync::Arc<World>, i: usize, after: Duration) {
    let world = world.clone();
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        cut_store(&world, i, true, true);
    });
}

/// Pauses AllocSvr `i` for `d` and scripts its lease clock over the same span: frozen, then on
/// resume forward by `d` (unless the monotonic control is on). The whole span is scripted now,
/// so that the jump is there whichever task runs first at the resume.
fn suspend(world: &std::sync::Arc<World>, i: usize, d: Duration) -> String {
    let (now, clock) = (tokio::time::Instant::now(), world.lease_clock(i));
    world.suspend_host(i, now + d);
    clock.set_rate_from(now, 0);
    clock.set_rate_from(now + d, SAME_RATE_PPM);
    let ms = d.as_millis();
    if world.clock_control().monotonic {
        return format!("allocsvr-{i} (suspended {ms} ms, its lease clock not told)");
    }
    clock.jump_at(now + d, d);
    format!("allocsvr-{i} (suspended {ms} ms)")
}

/// AllocSvr `i`'s lease clock runs `ppm` fast or slow for `d` (the control's rate when it sets one).
fn drift(world: &std::sync::Arc<World>, i: usize, ppm: i64, d: Duration) -> String {
    let ppm = world.clock_control().drift_ppm.unwrap_or(ppm);
    let rate = (SAME_RATE_PPM as i64).saturating_add(ppm).max(0) as u64;
    let (now, clock) = (tokio::time::Instant::now(), world.lease_clock(i));
    clock.set_rate_from(now, rate);
    clock.set_rate_from(now + d, SAME_RATE_PPM);
    cut_store_after(world, i, d / 2);
    format!("allocsvr-{i} (lease clock {ppm:+} ppm)")
}

fn cut_store(world: &World, i: usize, requests: bool, replies: bool) -> String {
    let mut st = world.lock();
    let set = st.allocs[i].set;
    for r in 0..REPLICAS {
        if requests {
            st.net.cut.insert((Ep::Alloc(i), Ep::Store(set, r)));
        }
        if replies {
            st.net.cut.insert((Ep::Store(set, r), Ep::Alloc(i)));
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
        // A drift's cut begins half-way (`cut_store_after`), before this heal at its end.
        Kind::CutAllocStore(i)
        | Kind::CutAllocStoreOneWay(i, _)
        | Kind::SuspendAlloc(i, _)
        | Kind::DriftAlloc(i, _) => {
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
        Kind::KillStoreLeader(set, _) | Kind::IsolateStoreLeader(set) => {
            let r: usize = target.rsplit('-').next().and_then(|r| r.parse().ok()).unwrap_or(0);
            let mut st = world.lock();
            let g = &mut st.groups[set as usize];
            g.restart(r);
            g.replicas[r].isolated = false;
        }
        Kind::Lossy(_) => world.lock().net.drop = 0.0,
        Kind::Duplicate(_) => world.lock().net.dup = 0.0,
        Kind::Slow(_) => world.lock().net.jitter = Duration::ZERO,
        Kind::Forge(_) => stop_forger(world),
        // The restore runs on its own (`super::restore::start`); the span only dates it.
        Kind::RestoreSet(_) => {}
        // Put right by a step (the drift's task has ended by now: it stops at the fault's end).
        Kind::IdClockStep(i, _) | Kind::IdClockDrift(i, _) | Kind::IdClockRestartBehind(i, _) => {
            world.id_clock(i).set_offset(0);
        }
        Kind::StoreClockStep(set, ..) | Kind::StoreClockDrift(set, ..) | Kind::StoreClockRestartBehind(set, ..) => {
            // The target starts with the replica's name: `storesvr-R (…)` or `storesvr-S-R (…)`.
            let name = target.split(' ').next().unwrap_or_default();
            let r: usize = name.rsplit('-').next().and_then(|r| r.parse().ok()).unwrap_or(0);
            world.lock().groups[set as usize].replicas[r].clock_offset_ms = 0;
        }
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
        for g in &mut st.groups {
            for r in 0..REPLICAS {
                g.restart(r);
                g.replicas[r].isolated = false;
                g.replicas[r].clock_offset_ms = 0;
            }
        }
        for (i, s) in st.allocs.iter_mut().enumerate() {
            s.host_suspended_until = None;
            s.proc.resume();
            world.id_clock(i).set_offset(0);
        }
        (0..st.allocs.len())
            .filter(|&i| !st.allocs[i].proc.is_alive())
            .collect()
    };
    for i in dead {
        world.start_alloc(i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With `--ids`, the StoreSvr clock faults come after everything a seed drew before them, which
    /// stays where it was.
    #[test]
    fn store_clock_faults_come_last_and_leave_the_earlier_faults_where_they_were() {
        let json = |f: &[Fault]| serde_json::to_string(f).unwrap();
        let mut drawn = 0;
        for seed in 0..500 {
            let lease_ms = super::super::params(seed).lease_ms;
            for two_sets in [false, true] {
                let mut before = schedule(seed, 8_000, 3, lease_ms, two_sets, false);
                let all_allocs = 3 + if two_sets { super::super::moves::SET1_ALLOCS } else { 0 };
                before.extend(id_clock_faults(seed, 8_000, all_allocs));
                let now = schedule(seed, 8_000, 3, lease_ms, two_sets, true);
                assert_eq!(json(&now[..before.len()]), json(&before), "seed {seed}");
                let added = &now[before.len()..];
                assert!(
                    added.iter().all(|f| store_clock_bound_ms(&f.kind, f.for_ms) > 0),
                    "seed {seed}"
                );
                assert!(added.iter().all(|f| two_sets || f.hits_set(0)), "seed {seed}");
                drawn += added.len();
            }
        }
        assert!(drawn > 500, "{drawn} StoreSvr clock faults in 1,000 schedules");
    }

    /// The faults a seed drew before set 1's faults and restores existed stay first, the same and
    /// at the same indices, in both modes; what follows them is set 1's (two sets only) or a
    /// restore. So the one-set seeds quoted in tests and docs replay what they did.
    #[test]
    fn a_seed_keeps_the_faults_it_drew_before_set_1_faults_and_restores() {
        let json = |f: &[Fault]| serde_json::to_string(f).unwrap();
        for seed in 0..500 {
            let lease_ms = super::super::params(seed).lease_ms;
            let mut before = process_and_network(seed, 8_000, 3, lease_ms);
            before.extend(clock_fault(seed, 8_000, 3, lease_ms));
            before.extend(forger_of(seed, 8_000));
            for two_sets in [false, true] {
                let now = schedule(seed, 8_000, 3, lease_ms, two_sets, false);
                assert_eq!(json(&now[..before.len()]), json(&before), "seed {seed}");
                let added_ok = |f: &Fault| matches!(f.kind, Kind::RestoreSet(_)) || (two_sets && f.hits_set(1));
                assert!(now[before.len()..].iter().all(added_ok), "seed {seed}: {now:?}");
            }
        }
    }
}
