//! Flags more than one `sim` command takes, declared once: the cluster's shape (`run`, `plan`,
//! `load`), the negative controls (`run`, `plan`, `dst`) and the hostile mode (`run`, `plan`).
//! Each command flattens the group it takes, so a flag has one name, one default and one help text
//! everywhere.
//!
//! Deliberately left out: the workload's flags (`--clients`, `--rate`), whose defaults differ on
//! purpose (`sim load` is pointed at clusters someone else runs, so it asks for less), and flags
//! one command has alone.

/// The cluster's uid space and timing, as its processes are (or were) started with.
#[derive(clap::Args, Debug, Clone)]
pub struct ClusterShape {
    /// Uids per section.
    #[arg(long, default_value_t = 100_000)]
    pub section_size: u64,
    /// The uid space, [0, uid_limit).
    #[arg(long, default_value_t = 2_000_000)]
    pub uid_limit: u64,
    /// The bump step.
    #[arg(long, default_value_t = 10_000)]
    pub step: u64,
    /// The lease.
    #[arg(long, default_value_t = 3_000)]
    pub lease_ms: u64,
}

/// The hostile mode of `sim run --front http|resp` (`sim::run::hostile`): floods of the front ends
/// beside the workload, and the bounds the run fails on.
#[derive(clap::Args, Debug, Clone)]
pub struct Hostile {
    /// Flood every AllocSvr's front end beside the workload (nested and trickled commands, idle
    /// sockets, partial commands, header floods, unread replies) after a first phase without
    /// floods; fail when a process dies, an AllocSvr's memory passes `--hostile-max-rss-mib`, or a
    /// well-behaved caller's p99 passes 3x its p99 of the first phase. Needs `--front http|resp`.
    #[arg(long)]
    pub hostile: bool,
    /// The resident memory (VmRSS, and its high-water mark VmHWM) no AllocSvr may pass in a hostile
    /// run, in MiB. 256: about 4x what a debug AllocSvr reaches under the normal front-end workload
    /// (docs/simulator/workloads.md), and below what one round of the floods holds when a server keeps every
    /// partial command it is sent.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(16..=65_536))]
    pub hostile_max_rss_mib: u64,
    /// The first phase of a hostile run: the workload and the well-behaved caller without floods
    /// or faults, whose p99 the floods' phase is held to. Before `--duration`, not part of it.
    #[arg(long, default_value = "10s", value_parser = crate::parse_duration)]
    pub hostile_baseline: std::time::Duration,
    /// Floods left out of a hostile run (comma-separated): to tell which one a failure comes
    /// from, or, all of them, to see the bounds hold through the faults without floods.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub hostile_skip: Vec<sim::run::hostile::FloodGroup>,
    /// The nice value of the floods' thread (0 to 19). An attacker's CPU is its own host's, not
    /// the server's: at 19 the flood generator takes only CPU the cluster leaves idle, so the
    /// p99 rule measures what the floods cost the servers rather than what generating them costs
    /// a two-core machine. 0 shows the latter.
    #[arg(long, default_value_t = 19, value_parser = clap::value_parser!(i32).range(0..=19))]
    pub hostile_flood_nice: i32,
}

/// Switches that turn one safety rule off, to show that the checkers catch what it prevents: each
/// must make a run that exercises the rule fail (docs/SIMULATOR.md and docs/simulator/dst.md list where each first fails).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct NegativeControls {
    /// AllocSvr: serve a gained section at once (rule 4, the lease wait, off).
    #[arg(long)]
    pub unsafe_skip_lease_wait: bool,
    /// AllocSvr: an in-flight bump counts as acknowledged (rule 6 off).
    #[arg(long)]
    pub unsafe_serve_before_bump_ack: bool,
    /// AllocSvr: memory of an earlier epoch is reused on regain (rule 5 off).
    #[arg(long)]
    pub unsafe_keep_memory: bool,
    /// StoreSvr: bumps are applied whatever their epoch (the fence off).
    #[arg(long)]
    pub unsafe_skip_epoch_fence: bool,
    /// StoreSvr: a Release ignores the epoch it names (rule 9's fence off).
    #[arg(long)]
    pub unsafe_unfenced_release: bool,
    /// StoreSvr (with two sets or more): a move's source hands out its final ceilings without
    /// waiting for its owners' leases, so the target may serve while the source's owner still does.
    #[arg(long)]
    pub unsafe_skip_move_wait: bool,
    /// StoreSvr: a Renew, Release or Bump need not carry its incarnation's secret (`sim dst`'s
    /// forger then gets through).
    #[arg(long)]
    pub unsafe_skip_binding: bool,
    /// `sim dst` only: a suspended AllocSvr's lease clock does not count the suspension (what
    /// leases on CLOCK_MONOTONIC did): on resume it serves on a lease the store gave away.
    #[arg(long)]
    pub unsafe_monotonic_lease_clock: bool,
    /// `sim dst` only: every `drift-alloc` fault runs its lease clock this many ppm fast (> 0) or
    /// slow (< 0) instead of the drawn rate within the set's bound (10,000 ppm).
    #[arg(long, allow_hyphen_values = true, value_parser = clap::value_parser!(i64).range(-1_000_000..=1_000_000))]
    pub unsafe_clock_drift_ppm: Option<i64>,
    /// `sim dst` only (with `--sets 2`): a restore does not check its backup against the live
    /// cluster map, so a range moved since the backup is served by two sets (or by none).
    #[arg(long)]
    pub unsafe_skip_restore_map_check: bool,
    /// `sim dst` only: the wait a StoreSvr leader sends with a forced grant counts from the first
    /// renewal it heard from each gone owner, not the last, so the new owner serves while the
    /// old owner's lease from a later renewal still runs.
    #[arg(long)]
    pub unsafe_predecessor_wait_from_first_renewal: bool,
    /// StoreSvr (with time-ordered ids): a raise of an id slot's mark is applied whatever its
    /// epoch (bumps keep their fence), so a woken old holder raises beside the new one.
    #[arg(long)]
    pub unsafe_skip_slot_fence: bool,
    /// AllocSvr (with time-ordered ids): a new holder starts issuing at its own clock, not above
    /// the slot's floor.
    #[arg(long)]
    pub unsafe_ids_ignore_floor: bool,
    /// AllocSvr (with time-ordered ids): ids are issued above the acknowledged mark.
    #[arg(long)]
    pub unsafe_ids_ignore_mark: bool,
    /// AllocSvr (with `--blocks`): a block starts at the uid's last seq instead of above it.
    #[arg(long)]
    pub unsafe_block_overlap: bool,
    /// AllocSvr (with `--keys`): every counter key of a section shares one `cur_seq`.
    #[arg(long)]
    pub unsafe_keys_share_seq: bool,
    /// AllocSvr (with `--keys`): keys forgotten for the memory bound restart at the section's
    /// loaded base instead of above everything it issued.
    #[arg(long)]
    pub unsafe_keys_forget_to_base: bool,
    /// `sim dst` only (with `--ledger`): a ledger reserve is answered with the number the leader
    /// predicts, before its entry commits, so a leader change hands the number out again.
    #[arg(long)]
    pub unsafe_ledger_answer_before_commit: bool,
}

impl NegativeControls {
    /// The flags every StoreSvr of a real cluster is started with.
    pub fn store_flags(&self) -> Vec<String> {
        on(&[
            (self.unsafe_skip_epoch_fence, "--unsafe-skip-epoch-fence"),
            (self.unsafe_unfenced_release, "--unsafe-unfenced-release"),
            (self.unsafe_skip_move_wait, "--unsafe-skip-move-wait"),
            (self.unsafe_skip_binding, "--unsafe-skip-binding"),
            (self.unsafe_skip_slot_fence, "--unsafe-skip-slot-fence"),
        ])
    }

    /// The flags every AllocSvr of a real cluster is started with.
    pub fn alloc_flags(&self) -> Vec<String> {
        on(&[
            (self.unsafe_skip_lease_wait, "--unsafe-skip-lease-wait"),
            (self.unsafe_serve_before_bump_ack, "--unsafe-serve-before-bump-ack"),
            (self.unsafe_keep_memory, "--unsafe-keep-memory"),
            (self.unsafe_ids_ignore_floor, "--unsafe-ids-ignore-floor"),
            (self.unsafe_ids_ignore_mark, "--unsafe-ids-ignore-mark"),
            (self.unsafe_block_overlap, "--unsafe-block-overlap"),
            (self.unsafe_keys_share_seq, "--unsafe-keys-share-seq"),
            (self.unsafe_keys_forget_to_base, "--unsafe-keys-forget-to-base"),
        ])
    }

    /// The first switch given that breaks a rule of time-ordered ids: only a run that issues ids
    /// (`sim dst --ids`) can show what it breaks.
    pub fn needs_ids(&self) -> Option<&'static str> {
        [
            (self.unsafe_skip_slot_fence, "--unsafe-skip-slot-fence"),
            (self.unsafe_ids_ignore_floor, "--unsafe-ids-ignore-floor"),
            (self.unsafe_ids_ignore_mark, "--unsafe-ids-ignore-mark"),
        ]
        .into_iter()
        .find_map(|(set, name)| set.then_some(name))
    }

    /// The first switch given that breaks a rule of counter keys: only a run that asks keys
    /// (`--keys`) can show what it breaks.
    pub fn needs_keys(&self) -> Option<&'static str> {
        [
            (self.unsafe_keys_share_seq, "--unsafe-keys-share-seq"),
            (self.unsafe_keys_forget_to_base, "--unsafe-keys-forget-to-base"),
        ]
        .into_iter()
        .find_map(|(set, name)| set.then_some(name))
    }

    /// The first switch given that breaks a rule of ledger counters: only a run that calls
    /// ledgers (`--ledger`) can show what it breaks.
    pub fn needs_ledger(&self) -> Option<&'static str> {
        self.unsafe_ledger_answer_before_commit
            .then_some("--unsafe-ledger-answer-before-commit")
    }

    /// The first switch given that only the deterministic simulator can honour (it belongs to
    /// what `sim dst` simulates: lease clocks, restores and its ledger driver), for `sim run` to
    /// refuse.
    pub fn dst_only(&self) -> Option<&'static str> {
        [
            (self.unsafe_monotonic_lease_clock, "--unsafe-monotonic-lease-clock"),
            (self.unsafe_clock_drift_ppm.is_some(), "--unsafe-clock-drift-ppm"),
            (self.unsafe_skip_restore_map_check, "--unsafe-skip-restore-map-check"),
            (
                self.unsafe_ledger_answer_before_commit,
                "--unsafe-ledger-answer-before-commit",
            ),
        ]
        .into_iter()
        .find_map(|(set, name)| set.then_some(name))
    }

    /// The first switch given that needs moves, hence two sets.
    pub fn needs_two_sets(&self) -> Option<&'static str> {
        [
            (self.unsafe_skip_move_wait, "--unsafe-skip-move-wait"),
            (self.unsafe_skip_restore_map_check, "--unsafe-skip-restore-map-check"),
        ]
        .into_iter()
        .find_map(|(set, name)| set.then_some(name))
    }
}

fn on(flags: &[(bool, &str)]) -> Vec<String> {
    flags
        .iter()
        .filter(|(set, _)| *set)
        .map(|(_, name)| name.to_string())
        .collect()
}
