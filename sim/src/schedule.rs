//! The seeded fault schedule: which fault, when, for how long. Pure: the same seed and parameters
//! always give the same schedule, so a failing run can be replayed with its seed.
//!
//! Faults run one at a time, each followed by a quiet period long enough for the cluster to
//! recover (a lease plus a detection interval), so every fault's effect can be told apart in the
//! statistics. Targets are chosen at injection time from a seeded `pick` (e.g. "the owner of
//! section `pick % sections`"), because who leads or owns what is only known then.
//!
//! Two knobs shape a schedule without giving up the seed: `must_include` puts given kinds first,
//! in order, so that a CI run is guaranteed to contain them instead of hoping the seed draws them;
//! `kinds` narrows the seeded draws to the kinds that exercise one rule (negative controls).
//!
//! Operator moves (runs of two sets or more) are fault kinds too: a move of a seeded range from
//! the set that owns it to another, alone, with its `seqctl` killed mid-way and resumed, with the
//! source's owner paused (the forced path), or overlapping a second fault (a kill, pause, cut or
//! partition) drawn with it. Those are the only faults that overlap.
//!
//! With time-ordered ids (`sim run --ids`), a share of the seeded draws are faults of an
//! AllocSvr's id clock ([`ID_CLOCK`]): steps, drifts and a restart on a clock behind. They and
//! their parameters are drawn from a generator of their own, so the other faults of an `--ids`
//! run are those the seed draws without it, in the same order, and a seed without `--ids` keeps
//! its plan.
//!
//! Deliberately left out: overlapping faults other than a move and its companion. They find more
//! bugs but make each one harder to explain; a later version can add a "storm" phase.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::time::Duration;

/// Every kind of fault the simulator injects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// SIGKILL the AllocSvr owning a section; restart it after the hold.
    KillAllocOwner,
    /// SIGKILL the StoreSvr leader; restart it after the hold.
    KillStoreLeader,
    /// SIGKILL a StoreSvr follower; restart it after the hold.
    KillStoreFollower,
    /// SIGSTOP an owner AllocSvr for half a lease (keeps its sections).
    PauseAllocShort,
    /// SIGSTOP an owner AllocSvr for 1.5 leases (loses its sections).
    PauseAllocLong,
    /// SIGSTOP an owner AllocSvr for 3 leases.
    PauseAllocVeryLong,
    /// SIGSTOP the StoreSvr leader for twice the election timeout.
    PauseStoreLeader,
    /// Drop every AllocSvr→StoreSvr link of one AllocSvr while clients still reach it.
    CutAllocFromStore,
    /// A bump delayed in the network: every AllocSvr→StoreSvr link of one owner drops for the
    /// detection interval (renewals lost, the arbiter moves its sections), holds (buffers) for
    /// 0.8–1.5 s, passes for [`RELEASE_WINDOW`] (the held bytes land in order, after the new
    /// owner's Load, while the old owner's lease still runs), then drops again for a lease plus
    /// a second (the old owner cannot rejoin and take its range back before the new owner has
    /// served). See [`HoldPhases`].
    HoldAllocToStore,
    /// Late requests: every AllocSvr→StoreSvr request of one owner arrives the detection interval
    /// plus a second late (replies flow), for that delay plus [`LAG_SEND_WINDOW`]; then its
    /// requests drop for a lease plus a second, then pass. Everything the owner sends lands after
    /// the arbiter moved its sections: renewals are refused, bumps are applied or refused by the
    /// epoch fence — and calls that wait less than the lag have timed out by then (unknown
    /// outcomes applied late).
    LagAllocToStore,
    /// Drop every link between the StoreSvr leader and the other replicas (both ways).
    PartitionStoreLeader,
    /// Delay every link by a few hundred ms.
    DelayLinks,
    /// SIGTERM an AllocSvr (graceful shutdown, release) and start it again.
    TermAlloc,
    /// SIGTERM the StoreSvr leader (it hands its leadership to a caught-up follower first) and
    /// start it again after the hold.
    TermStoreLeader,
    /// SIGTERM an owner AllocSvr and restart it; while the others hand its range back (and
    /// every Release is repeated 1–2 s late, see `Topology::alloc_spec`), SIGTERM and restart
    /// it again: a late Release lands after the range changed hands twice.
    TermAllocTwice,
    /// SIGKILL an owner AllocSvr, restart it, and SIGKILL it again as soon as its log says it
    /// registered (before its first renewal); restart it after the hold.
    KillAllocRegistered,
    /// `seqctl move` of a seeded section range from the set that owns it to another set.
    MoveRange,
    /// `seqctl move`, SIGKILLed `delay` after it started; `seqctl move resume` after the hold
    /// (or, for odd picks, `seqctl move cancel` first, which the map refuses past the seal).
    MoveKillCli,
    /// A move while the source's owner of the range is paused for 1.5 leases: it cannot release,
    /// so the move takes the forced path and waits out its lease.
    MovePausedOwner,
    /// A move overlapping a [`Companion`] fault that starts with it.
    MoveUnderFault,
    /// An AllocSvr's id clock (the wall clock ids are stamped with) steps by
    /// [`PlannedFault::clock_ms`] ms, back (< 0) or forward, and back to the true time after the
    /// hold (`--ids` only).
    IdClockStep,
    /// An AllocSvr's id clock runs [`PlannedFault::clock_ms`] parts per thousand fast (> 0) or
    /// slow for the hold, then steps back to the true time (`--ids` only).
    IdClockDrift,
    /// SIGKILL an AllocSvr and start it again at once on an id clock [`PlannedFault::clock_ms`]
    /// behind (< 0): the classic Snowflake duplicate, a restart on a host whose clock is behind.
    /// The clock is put right after the hold (`--ids` only).
    IdClockRestartBehind,
}

/// The second fault of a [`FaultKind::MoveUnderFault`], started together with the move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Companion {
    pub kind: FaultKind,
    pub hold: Duration,
}

/// Kinds a move overlaps: a process killed or paused in either set, an owner cut from its store,
/// a Raft leader cut from its group.
pub const COMPANIONS: [FaultKind; 5] = [
    FaultKind::KillAllocOwner,
    FaultKind::KillStoreLeader,
    FaultKind::PauseAllocLong,
    FaultKind::CutAllocFromStore,
    FaultKind::PartitionStoreLeader,
];

/// The kinds that move ranges between sets (they need two sets or more).
pub const MOVES: [FaultKind; 4] = [
    FaultKind::MoveRange,
    FaultKind::MoveKillCli,
    FaultKind::MovePausedOwner,
    FaultKind::MoveUnderFault,
];

/// The kinds that move an AllocSvr's id clock (`--ids` only). Not in [`FaultKind::ALL`]: the
/// seeded draws of a run without ids never pick them.
pub const ID_CLOCK: [FaultKind; 3] = [
    FaultKind::IdClockStep,
    FaultKind::IdClockDrift,
    FaultKind::IdClockRestartBehind,
];

/// The steps of an [`FaultKind::IdClockStep`], ms: within the allowance between an AllocSvr's
/// clock and the store leader's (3 s in `sim run --ids`) and beyond it.
pub const ID_CLOCK_STEPS_MS: [i64; 8] = [-3_600_000, -10_000, -2_000, -500, 500, 2_000, 10_000, 3_600_000];
/// The rates of an [`FaultKind::IdClockDrift`], parts per thousand.
pub const ID_CLOCK_DRIFTS: [i64; 4] = [-500, -50, 50, 500];
/// How far behind an [`FaultKind::IdClockRestartBehind`] restarts, ms.
pub const ID_CLOCK_BEHIND_MS: [i64; 3] = [-3_600_000, -10_000, -2_000];
/// Share of the seeded draws of an `--ids` run that are id clock faults.
const ID_CLOCK_SHARE: f64 = 0.25;

impl FaultKind {
    /// Every kind the seeded draws pick from (moves only with two sets or more); the id clock
    /// kinds, drawn apart, are in [`ID_CLOCK`].
    pub const ALL: [FaultKind; 20] = [
        FaultKind::KillAllocOwner,
        FaultKind::KillStoreLeader,
        FaultKind::KillStoreFollower,
        FaultKind::PauseAllocShort,
        FaultKind::PauseAllocLong,
        FaultKind::PauseAllocVeryLong,
        FaultKind::PauseStoreLeader,
        FaultKind::CutAllocFromStore,
        FaultKind::PartitionStoreLeader,
        FaultKind::DelayLinks,
        FaultKind::TermAlloc,
        FaultKind::HoldAllocToStore,
        FaultKind::LagAllocToStore,
        FaultKind::TermAllocTwice,
        FaultKind::KillAllocRegistered,
        FaultKind::MoveRange,
        FaultKind::MoveKillCli,
        FaultKind::MovePausedOwner,
        FaultKind::MoveUnderFault,
        FaultKind::TermStoreLeader,
    ];

    /// Every kind there is: [`FaultKind::ALL`], then [`ID_CLOCK`].
    pub const EVERY: [FaultKind; 23] = {
        let mut every = [FaultKind::KillAllocOwner; 23];
        let mut i = 0;
        while i < 20 {
            every[i] = Self::ALL[i];
            i += 1;
        }
        while i < 23 {
            every[i] = ID_CLOCK[i - 20];
            i += 1;
        }
        every
    };

    /// True for the kinds that move ranges between sets.
    pub fn is_move(self) -> bool {
        MOVES.contains(&self)
    }

    /// True for the kinds that move an AllocSvr's id clock (they need ids).
    pub fn is_id_clock(self) -> bool {
        ID_CLOCK.contains(&self)
    }

    /// The kind with this [`FaultKind::name`].
    pub fn from_name(name: &str) -> Option<Self> {
        Self::EVERY.into_iter().find(|k| k.name() == name)
    }

    /// Stable name used in histories, reports and options.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillAllocOwner => "kill-alloc-owner",
            FaultKind::KillStoreLeader => "kill-store-leader",
            FaultKind::KillStoreFollower => "kill-store-follower",
            FaultKind::PauseAllocShort => "pause-alloc-0.5-lease",
            FaultKind::PauseAllocLong => "pause-alloc-1.5-lease",
            FaultKind::PauseAllocVeryLong => "pause-alloc-3-lease",
            FaultKind::PauseStoreLeader => "pause-store-leader",
            FaultKind::CutAllocFromStore => "cut-alloc-from-store",
            FaultKind::HoldAllocToStore => "hold-alloc-to-store",
            FaultKind::LagAllocToStore => "lag-alloc-to-store",
            FaultKind::PartitionStoreLeader => "partition-store-leader",
            FaultKind::DelayLinks => "delay-links",
            FaultKind::TermAlloc => "term-alloc",
            FaultKind::TermStoreLeader => "term-store-leader",
            FaultKind::TermAllocTwice => "term-alloc-twice",
            FaultKind::KillAllocRegistered => "kill-alloc-registered",
            FaultKind::MoveRange => "move-range",
            FaultKind::MoveKillCli => "move-kill-cli",
            FaultKind::MovePausedOwner => "move-paused-owner",
            FaultKind::MoveUnderFault => "move-under-fault",
            // `checks::ids` reports a repeat after a fault named `id-clock…` as U4.
            FaultKind::IdClockStep => "id-clock-step",
            FaultKind::IdClockDrift => "id-clock-drift",
            FaultKind::IdClockRestartBehind => "id-clock-restart-behind",
        }
    }
}

/// Fault kinds as option values (`--fault-kinds kill-alloc-owner,…`), named by [`FaultKind::name`].
impl clap::ValueEnum for FaultKind {
    fn value_variants<'a>() -> &'a [Self] {
        &Self::EVERY
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.name()))
    }
}

/// The kinds a CI run must contain: a SIGKILL of a section owner, a SIGKILL of the StoreSvr
/// leader, a SIGTERM of it (its handoff), a SIGSTOP of an owner longer than the lease, a range
/// handed back and forth under late repeated Releases, and a SIGKILL right after a registration.
pub const CI_PROFILE: [FaultKind; 6] = [
    FaultKind::KillAllocOwner,
    FaultKind::KillStoreLeader,
    FaultKind::TermStoreLeader,
    FaultKind::PauseAllocLong,
    FaultKind::TermAllocTwice,
    FaultKind::KillAllocRegistered,
];

/// The moves a CI run of two sets must contain, after [`CI_PROFILE`]: one of each move kind.
pub const CI_MOVES_PROFILE: [FaultKind; 4] = MOVES;

/// Timing and shape parameters the schedule is derived from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduleParams {
    pub duration: Duration,
    pub lease: Duration,
    /// Upper end of the Raft election timeout.
    pub election_max: Duration,
    /// How long an AllocSvr may stay silent before the arbiter moves its sections.
    pub detect: Duration,
    /// No fault starts before this (cluster warm-up under load).
    pub warmup: Duration,
    /// No fault is active in the last part of the run (heal, then verify).
    pub cooldown: Duration,
    /// Kinds scheduled first, in this order, before any seeded draw.
    pub must_include: Vec<FaultKind>,
    /// Kinds the seeded draws pick from; every kind when empty (moves only with two sets or more).
    pub kinds: Vec<FaultKind>,
    /// Sets in the cluster.
    pub sets: u64,
    /// The run issues time-ordered ids: id clock faults join the seeded draws.
    pub ids: bool,
}

/// One planned fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlannedFault {
    /// Offset from the start of the workload.
    pub at: Duration,
    pub kind: FaultKind,
    /// How long the fault stays before it is healed (process restarted, link passed again).
    pub hold: Duration,
    /// Seeded choice of target, resolved at injection time (e.g. `pick % candidates`).
    pub pick: u64,
    /// Link delay for [`FaultKind::DelayLinks`]; zero otherwise.
    pub delay: Duration,
    /// The phases of a [`FaultKind::HoldAllocToStore`] (they add up to `hold`); `None` otherwise.
    pub phases: Option<HoldPhases>,
    /// The overlapping fault of a [`FaultKind::MoveUnderFault`]; `None` otherwise.
    pub companion: Option<Companion>,
    /// An id clock fault's step or restart offset (ms) or drift (parts per thousand); 0 otherwise.
    pub clock_ms: i64,
}

/// How long requests are sent into the lag of a [`FaultKind::LagAllocToStore`] before the links
/// drop: about one renew interval, so that a renewal is among the late requests.
pub const LAG_SEND_WINDOW: Duration = Duration::from_millis(500);

/// How long the held bytes of a [`FaultKind::HoldAllocToStore`] flow before the links drop again.
pub const RELEASE_WINDOW: Duration = Duration::from_millis(200);

/// Phases of a [`FaultKind::HoldAllocToStore`], in order: drop, hold, pass for
/// [`RELEASE_WINDOW`], drop again, then pass for good.
///
/// Why this shape: a hold from the start would also buffer the renewal in flight, whose answer
/// (UNKNOWN_INCARNATION, a ReadIndex) reaches the owner before the bump's (a Raft write), and the
/// owner would stop at once; dropping first loses that renewal. And if the links simply passed
/// after the release, the old owner would register again at once and the arbiter would hand its
/// range back to it before the new owner's lease wait is over, so nobody who loaded the old
/// `max_seq` would ever serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HoldPhases {
    pub drop_first: Duration,
    pub hold: Duration,
    pub drop_after: Duration,
}

/// Builds the schedule for one seed. Faults are sorted, never overlap, and all end (hold plus
/// the recovery quiet time) before `duration - cooldown`. The `must_include` kinds come first;
/// [`missing`] tells whether they all fitted.
pub fn plan(seed: u64, p: &ScheduleParams) -> Vec<PlannedFault> {
    let mut rng = StdRng::seed_from_u64(seed);
    let recovery = p.lease + p.detect;
    let end = p.duration.saturating_sub(p.cooldown);
    // Without a second set the pool is the kinds of one-set runs, in the order of `ALL`.
    let one_set: Vec<FaultKind> = FaultKind::ALL.into_iter().filter(|k| !k.is_move()).collect();
    let pool: &[FaultKind] = match (p.kinds.is_empty(), p.sets > 1) {
        (false, _) => &p.kinds,
        (true, true) => &FaultKind::ALL,
        (true, false) => &one_set,
    };
    let mut forced = p.must_include.iter().copied();
    // The id clock faults' own generator: the other draws stay what they are without ids.
    let mut clock_rng = StdRng::seed_from_u64(seed ^ 0x1dc1_0c00_0000_0000);
    let mut t = p.warmup;
    let mut out = Vec::new();
    loop {
        let kind = forced.next().unwrap_or_else(|| {
            if p.ids && p.kinds.is_empty() && clock_rng.random_bool(ID_CLOCK_SHARE) {
                ID_CLOCK[clock_rng.random_range(0..ID_CLOCK.len())]
            } else {
                pool[rng.random_range(0..pool.len())]
            }
        });
        if kind.is_id_clock() {
            let (f, quiet) = id_clock_fault(kind, t, recovery, &mut clock_rng);
            if t + f.hold + quiet > end {
                break;
            }
            out.push(f);
            t += f.hold + quiet;
            continue;
        }
        let base_ms = hold_ms(kind, p, &mut rng);
        // The hold ends past the detection interval by enough for the arbiter to move the
        // sections and the new owner to load them (a renew interval, 500 ms by default, plus an
        // arbiter tick); the second drop outlasts the new owner's lease wait.
        let phases = (kind == FaultKind::HoldAllocToStore).then(|| HoldPhases {
            drop_first: p.detect,
            hold: Duration::from_millis(rng.random_range(800..=1_500)),
            drop_after: p.lease + Duration::from_secs(1),
        });
        let mut hold = match phases {
            Some(h) => h.drop_first + h.hold + RELEASE_WINDOW + h.drop_after,
            None => Duration::from_millis(base_ms),
        };
        let delay = match kind {
            FaultKind::DelayLinks => Duration::from_millis(rng.random_range(20..=300)),
            FaultKind::LagAllocToStore => p.detect + Duration::from_secs(1),
            // How long the killed `seqctl` ran.
            FaultKind::MoveKillCli => Duration::from_millis(rng.random_range(50..=1_500)),
            _ => Duration::ZERO,
        };
        let companion = (kind == FaultKind::MoveUnderFault).then(|| {
            let kind = COMPANIONS[rng.random_range(0..COMPANIONS.len())];
            let hold = Duration::from_millis(hold_ms(kind, p, &mut rng));
            Companion { kind, hold }
        });
        if kind.is_move() {
            // Room for the move itself: the forced path waits out a lease.
            hold = hold.max(companion.map_or(Duration::ZERO, |c| c.hold)) + delay + p.lease;
        }
        let pick = rng.random::<u64>();
        let quiet = recovery + Duration::from_millis(rng.random_range(500..=2_000));
        if t + hold + quiet > end {
            break;
        }
        out.push(PlannedFault {
            at: t,
            kind,
            hold,
            pick,
            delay,
            phases,
            companion,
            clock_ms: 0,
        });
        t += hold + quiet;
    }
    out
}

/// An id clock fault at `t` and the quiet time after it, all drawn from `rng` (the id clock
/// faults' generator).
fn id_clock_fault(kind: FaultKind, t: Duration, recovery: Duration, rng: &mut StdRng) -> (PlannedFault, Duration) {
    let clock_ms = match kind {
        FaultKind::IdClockStep => ID_CLOCK_STEPS_MS[rng.random_range(0..ID_CLOCK_STEPS_MS.len())],
        FaultKind::IdClockDrift => ID_CLOCK_DRIFTS[rng.random_range(0..ID_CLOCK_DRIFTS.len())],
        _ => ID_CLOCK_BEHIND_MS[rng.random_range(0..ID_CLOCK_BEHIND_MS.len())],
    };
    // Long enough for a 500 ‰ drift to pass the 3 s allowance, and for a restarted AllocSvr to
    // register, take a slot and issue on its clock behind.
    let hold = Duration::from_millis(rng.random_range(1_000..=8_000));
    let pick = rng.random::<u64>();
    let quiet = recovery + Duration::from_millis(rng.random_range(500..=2_000));
    let f = PlannedFault {
        at: t,
        kind,
        hold,
        pick,
        delay: Duration::ZERO,
        phases: None,
        companion: None,
        clock_ms,
    };
    (f, quiet)
}

/// How long a fault of `kind` stays (for a move: what it waits for besides the move itself).
fn hold_ms(kind: FaultKind, p: &ScheduleParams, rng: &mut StdRng) -> u64 {
    let ms = |d: Duration| d.as_millis() as u64;
    let lease = ms(p.lease);
    match kind {
        FaultKind::KillAllocOwner
        | FaultKind::KillStoreLeader
        | FaultKind::KillStoreFollower
        | FaultKind::KillAllocRegistered => rng.random_range(300..=3_000),
        FaultKind::PauseAllocShort => lease / 2,
        FaultKind::PauseAllocLong => lease * 3 / 2,
        // Shorter than the lease: the owner wakes while the move waits for it, still holding a
        // lease, with its stale clients' requests queued (what a move must not let it serve).
        FaultKind::MovePausedOwner => lease / 2,
        FaultKind::PauseAllocVeryLong => lease * 3,
        FaultKind::PauseStoreLeader => 2 * ms(p.election_max),
        FaultKind::CutAllocFromStore => rng.random_range(lease / 2..=lease * 2),
        FaultKind::HoldAllocToStore => 0, // from its phases
        // The lag (in `delay`), the send window, then a drop that outlasts the new owner's
        // lease wait (so the old owner cannot take its range back before that owner served).
        FaultKind::LagAllocToStore => ms(p.detect) + 1_000 + ms(LAG_SEND_WINDOW) + lease + 1_000,
        FaultKind::PartitionStoreLeader => rng.random_range(1_000..=4_000),
        FaultKind::DelayLinks => rng.random_range(1_000..=4_000),
        FaultKind::TermAlloc => rng.random_range(0..=1_000),
        FaultKind::TermStoreLeader => rng.random_range(300..=3_000),
        // Between the two SIGTERMs: long enough for the range to be handed back (a renew
        // interval and an arbiter tick), short enough that the repeated Releases land after.
        FaultKind::TermAllocTwice => rng.random_range(500..=1_200),
        FaultKind::MoveRange | FaultKind::MoveUnderFault => 0,
        // Between the kill of `seqctl` and the resume.
        FaultKind::MoveKillCli => rng.random_range(500..=3_000),
        // Drawn by `id_clock_fault` from the id clock faults' generator.
        FaultKind::IdClockStep | FaultKind::IdClockDrift | FaultKind::IdClockRestartBehind => 0,
    }
}

/// The `must_include` kinds a schedule lacks (the run was too short to fit them), in order.
pub fn missing(schedule: &[PlannedFault], must_include: &[FaultKind]) -> Vec<FaultKind> {
    must_include
        .iter()
        .enumerate()
        .filter(|&(i, k)| schedule.get(i).is_none_or(|f| f.kind != *k))
        .map(|(_, &k)| k)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(duration_s: u64) -> ScheduleParams {
        ScheduleParams {
            duration: Duration::from_secs(duration_s),
            lease: Duration::from_millis(3_000),
            election_max: Duration::from_millis(600),
            detect: Duration::from_millis(2_000),
            warmup: Duration::from_secs(3),
            cooldown: Duration::from_secs(5),
            must_include: vec![],
            kinds: vec![],
            sets: 1,
            ids: false,
        }
    }

    #[test]
    fn same_seed_same_schedule() {
        assert_eq!(plan(42, &params(300)), plan(42, &params(300)));
    }

    #[test]
    fn different_seeds_differ() {
        assert_ne!(plan(1, &params(300)), plan(2, &params(300)));
    }

    #[test]
    fn faults_are_sorted_apart_and_inside_the_run() {
        for seed in 0..50 {
            let p = params(300);
            let s = plan(seed, &p);
            assert!(!s.is_empty());
            assert!(s[0].at >= p.warmup);
            for w in s.windows(2) {
                assert!(
                    w[0].at + w[0].hold + p.lease + p.detect <= w[1].at,
                    "seed {seed}: overlap {w:?}"
                );
            }
            let last = s.last().unwrap();
            assert!(
                last.at + last.hold + p.lease + p.detect <= p.duration - p.cooldown,
                "seed {seed}"
            );
        }
    }

    #[test]
    fn pauses_are_sized_from_the_lease_and_election_timeout() {
        let p = params(3_000);
        let s = plan(7, &p);
        for f in &s {
            let want = match f.kind {
                FaultKind::PauseAllocShort => Some(1_500),
                FaultKind::PauseAllocLong => Some(4_500),
                FaultKind::PauseAllocVeryLong => Some(9_000),
                FaultKind::PauseStoreLeader => Some(1_200),
                _ => None,
            };
            if let Some(ms) = want {
                assert_eq!(f.hold, Duration::from_millis(ms), "{f:?}");
            }
        }
    }

    #[test]
    fn holds_drop_for_detection_then_hold_then_drop_for_more_than_a_lease() {
        let p = ScheduleParams {
            kinds: vec![FaultKind::HoldAllocToStore],
            ..params(600)
        };
        let s = plan(9, &p);
        assert!(s.len() > 10);
        for f in &s {
            assert_eq!(f.kind, FaultKind::HoldAllocToStore);
            let h = f.phases.expect("phases of a hold");
            assert_eq!(h.drop_first, p.detect);
            assert!(
                h.hold >= Duration::from_millis(800) && h.hold <= Duration::from_millis(1_500),
                "{f:?}"
            );
            assert!(h.drop_after > p.lease, "{f:?}");
            assert_eq!(f.hold, h.drop_first + h.hold + RELEASE_WINDOW + h.drop_after);
        }
    }

    #[test]
    fn lags_outlast_the_detection_and_then_drop_for_more_than_a_lease() {
        let p = ScheduleParams {
            kinds: vec![FaultKind::LagAllocToStore],
            ..params(600)
        };
        let s = plan(9, &p);
        assert!(s.len() > 10);
        for f in &s {
            assert_eq!(f.delay, p.detect + Duration::from_secs(1), "{f:?}");
            assert!(f.hold > f.delay + LAG_SEND_WINDOW + p.lease, "{f:?}");
        }
    }

    #[test]
    fn a_long_run_uses_every_kind_and_moves_only_with_two_sets() {
        let s = plan(3, &params(3_000));
        for k in FaultKind::ALL {
            assert_eq!(s.iter().any(|f| f.kind == k), !k.is_move(), "{k:?}");
        }
        let two = ScheduleParams {
            sets: 2,
            ..params(3_000)
        };
        let s = plan(3, &two);
        for k in FaultKind::ALL {
            assert!(s.iter().any(|f| f.kind == k), "{k:?} never scheduled with two sets");
        }
        for f in &s {
            assert_eq!(f.companion.is_some(), f.kind == FaultKind::MoveUnderFault, "{f:?}");
            if let Some(c) = f.companion {
                assert!(COMPANIONS.contains(&c.kind) && f.hold >= c.hold + two.lease, "{f:?}");
            }
            if f.kind == FaultKind::MoveKillCli {
                assert!(
                    f.delay >= Duration::from_millis(50) && f.hold > f.delay + two.lease,
                    "{f:?}"
                );
            }
        }
    }

    #[test]
    fn one_set_schedules_leave_out_the_move_kinds() {
        // Seed 42, 300 s, one set: what `sim plan` printed once `term-store-leader` joined the
        // kinds (the move kinds never enter a one-set pool; a new kind changes the draws, so a
        // seed replays with the release that printed it).
        let s = plan(42, &params(300));
        let kinds: Vec<&str> = s.iter().take(4).map(|f| f.kind.name()).collect();
        assert_eq!(
            kinds,
            [
                "kill-store-follower",
                "pause-store-leader",
                "pause-alloc-3-lease",
                "kill-store-follower"
            ]
        );
        assert_eq!(s[0].hold, Duration::from_millis(971));
    }

    #[test]
    fn must_include_kinds_come_first_in_order_for_every_seed() {
        let p = ScheduleParams {
            must_include: CI_PROFILE.to_vec(),
            ..params(90)
        };
        for seed in 0..50 {
            let s = plan(seed, &p);
            let head: Vec<FaultKind> = s.iter().take(CI_PROFILE.len()).map(|f| f.kind).collect();
            assert_eq!(head, CI_PROFILE, "seed {seed}");
            assert!(missing(&s, &CI_PROFILE).is_empty(), "seed {seed}");
            assert_eq!(s[0].at, p.warmup);
        }
    }

    #[test]
    fn must_include_that_does_not_fit_is_reported_missing() {
        let p = ScheduleParams {
            must_include: CI_PROFILE.to_vec(),
            ..params(20)
        };
        let s = plan(1, &p);
        assert!(s.len() < 3);
        assert_eq!(missing(&s, &CI_PROFILE), CI_PROFILE[s.len()..].to_vec());
    }

    #[test]
    fn draws_stay_inside_the_given_kinds() {
        let kinds = vec![FaultKind::CutAllocFromStore, FaultKind::PauseAllocShort];
        let p = ScheduleParams {
            kinds: kinds.clone(),
            ..params(600)
        };
        let s = plan(5, &p);
        assert!(s.len() > 10);
        assert!(s.iter().all(|f| kinds.contains(&f.kind)), "{s:?}");
        assert!(kinds.iter().all(|k| s.iter().any(|f| f.kind == *k)));
    }

    #[test]
    fn kind_names_round_trip() {
        for k in FaultKind::EVERY {
            assert_eq!(FaultKind::from_name(k.name()), Some(k));
        }
        assert_eq!(FaultKind::from_name("nope"), None);
        for k in ID_CLOCK {
            // What `checks::ids` reports a repeat after as U4.
            assert!(crate::checks::ids::is_clock_fault(k.name()), "{k:?}");
        }
    }

    #[test]
    fn with_ids_the_other_faults_are_those_drawn_without_and_clock_faults_join_them() {
        let strip = |s: &[PlannedFault]| -> Vec<(FaultKind, Duration, u64, Duration)> {
            s.iter()
                .filter(|f| !f.kind.is_id_clock())
                .map(|f| (f.kind, f.hold, f.pick, f.delay))
                .collect()
        };
        for sets in [1, 2] {
            let p = ScheduleParams { sets, ..params(1_800) };
            let with = ScheduleParams { ids: true, ..p.clone() };
            for seed in 0..20 {
                let (plain, ids) = (plan(seed, &p), plan(seed, &with));
                assert!(plain.iter().all(|f| !f.kind.is_id_clock()), "seed {seed}");
                let others = strip(&ids);
                assert_eq!(others[..], strip(&plain)[..others.len()], "seed {seed}");
                for w in ids.windows(2) {
                    assert!(
                        w[0].at + w[0].hold + p.lease + p.detect <= w[1].at,
                        "seed {seed}: {w:?}"
                    );
                }
                for f in &ids {
                    let table: &[i64] = match f.kind {
                        FaultKind::IdClockStep => &ID_CLOCK_STEPS_MS,
                        FaultKind::IdClockDrift => &ID_CLOCK_DRIFTS,
                        FaultKind::IdClockRestartBehind => &ID_CLOCK_BEHIND_MS,
                        _ => &[0],
                    };
                    assert!(table.contains(&f.clock_ms), "seed {seed}: {f:?}");
                }
            }
            let long = plan(
                3,
                &ScheduleParams {
                    ids: true,
                    ..params(3_000)
                },
            );
            for k in ID_CLOCK {
                assert!(long.iter().any(|f| f.kind == k), "{k:?} never drawn");
            }
        }
    }

    #[test]
    fn id_clock_kinds_can_be_required_and_are_drawn_when_given() {
        let p = ScheduleParams {
            ids: true,
            must_include: ID_CLOCK.to_vec(),
            kinds: vec![FaultKind::IdClockStep],
            ..params(300)
        };
        let s = plan(1, &p);
        let head: Vec<FaultKind> = s.iter().take(3).map(|f| f.kind).collect();
        assert_eq!(head, ID_CLOCK);
        assert!(
            s.len() > 10 && s[3..].iter().all(|f| f.kind == FaultKind::IdClockStep),
            "{s:?}"
        );
    }

    #[test]
    fn a_run_too_short_for_any_fault_has_none() {
        assert!(plan(1, &params(8)).is_empty());
    }
}
