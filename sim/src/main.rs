//! `sim`: run a seeded fault-injection simulation against real seqsvr processes (`run`) or in
//! one thread on simulated time (`dst`), or re-check a saved history offline.
//!
//! Options come as flags, `SIM_*` environment variables or a TOML `--config` file.
//!
//! Exit codes: 0 every promise held, 1 a promise was violated (the offending calls
//! are printed), 2 bad options, 3 the harness itself failed.

mod dst_cmd;
mod flags;
mod load_cmd;

use clap::{Parser, Subcommand};
use seqsvr_proto::id_layout::DEFAULT_EPOCH_MS;
use sim::checks::{self, Report};
use sim::history::History;
use sim::run::RunOpts;
use sim::schedule::{CI_MOVES_PROFILE, CI_PROFILE, FaultKind};
use sim::topology::SetArgs;
use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(name = "sim", version = seqsvr_plumbing::version::LONG,
    about = "seqsvr-rs simulator: faults on real processes, promise checkers"
)]
struct Cli {
    /// Read options from this TOML file (`some_option = value`); flags and environment variables
    /// override it.
    #[arg(long, value_name = "FILE", global = true)]
    config: Option<std::path::PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Print the fault schedule a `run` with these options would follow, without running it.
    Plan(RunArgs),
    /// Start a real cluster behind proxies, run a seeded workload and fault schedule, check P1–P6.
    Run(RunArgs),
    /// Deterministic simulation: the production protocol code of one set (or two, with moves) in
    /// one thread on simulated time, many seeds a second, each replayable bit for bit.
    Dst(dst_cmd::DstArgs),
    /// Drive the workload against a cluster started elsewhere (network namespaces, other hosts),
    /// with the faults its operator injected, and judge the history (P1, P4, P5, P6, one set,
    /// liveness; not P2/P3, which need the store).
    Load(load_cmd::LoadArgs),
    /// Re-check a saved history (JSON lines) offline.
    Check {
        /// History file written by `sim run`.
        file: PathBuf,
        /// Final max_seq per section (written by `sim run` as max_seqs.json); enables P2.
        #[arg(long)]
        max_seqs: Option<PathBuf>,
    },
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Seed of the workload and the fault schedule (random when absent; always printed).
    #[arg(long)]
    seed: Option<u64>,
    /// How long the workload runs, e.g. 90s, 5m, 1500ms.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    duration: Duration,
    /// Where logs, data dirs and the history go (default: a fresh dir under the temp dir).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Mutual TLS with roles on every link: a development CA and certificates in the data dir.
    #[arg(long)]
    tls: bool,
    /// Where the storesvr and allocsvr binaries are (default: next to sim, then target/release,
    /// then target/debug).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Concurrent workload clients.
    #[arg(long, default_value_t = 8)]
    clients: u32,
    /// Calls per second per client (upper bound).
    #[arg(long, default_value_t = 200.0)]
    rate: f64,
    /// Inject no faults: P6 gaps become violations.
    #[arg(long)]
    no_faults: bool,
    /// Fault kinds scheduled first, in this order (comma-separated names as `sim plan` prints
    /// them); the run is refused (exit 2) when the duration cannot fit them.
    #[arg(long, value_delimiter = ',')]
    must_include: Vec<FaultKind>,
    /// The CI profile: `--must-include kill-alloc-owner,kill-store-leader,term-store-leader,
    /// pause-alloc-1.5-lease,term-alloc-twice,kill-alloc-registered`.
    #[arg(long, conflicts_with = "must_include")]
    ci: bool,
    /// Draw the seeded faults only from these kinds (comma-separated); every kind when absent.
    #[arg(long, value_delimiter = ',')]
    fault_kinds: Vec<FaultKind>,
    /// StoreSvr groups (sets), each with 3 StoreSvrs and 3 AllocSvrs. With two or more, the move
    /// fault kinds move ranges between them (`--ci` then also includes one of each).
    #[arg(long, default_value_t = 1)]
    sets: u64,
    #[command(flatten)]
    shape: flags::ClusterShape,
    #[arg(long, default_value_t = 2_000)]
    detect_ms: u64,
    #[arg(long, default_value_t = 300)]
    election_min_ms: u64,
    #[arg(long, default_value_t = 600)]
    election_max_ms: u64,
    /// Time-ordered ids beside the sequences: set 0 sets ids up (3 s allowance, 8 slots a set),
    /// id clients call `NextIds`, each AllocSvr's id clock follows a file the id clock faults
    /// step, drift and restart behind, and U1–U4 are checked.
    #[arg(long)]
    ids: bool,
    /// Blocks of seqs beside the fetches: 30 % of the routing clients' fetches are
    /// `Reserve(uid, n)` of up to 16 seqs (or the step), each checked as n fetches.
    #[arg(long)]
    blocks: bool,
    /// Named counters beside the uids: 40 % of the routing clients' single calls ask one of 24
    /// keys (next, blocks with `--blocks`, get), each checked as a sequence of its own; with faults,
    /// every AllocSvr holds at most 8 keys (`--max-live-keys`), so keys are forgotten and come back.
    #[arg(long)]
    keys: bool,
    /// Ledger counters beside the workload: up to 8 callers reserve numbers of 4 ledgers (5 s
    /// holds) through any AllocSvr, then confirm, release, repeat a confirm or abandon them; the
    /// ledgers' final state is read from each set's backup and G1–G3 and holds are checked.
    #[arg(long)]
    ledger: bool,
    /// Which front end the routing clients call: the client library over gRPC, or every
    /// AllocSvr's HTTP/JSON (`http`) or Redis-protocol (`resp`) front end, a random one per call
    /// (the calls are forwarded to the owner there), or its Redis Cluster port (`resp-cluster`:
    /// the cluster places keys by hash slot, and the clients follow `-MOVED` to each key's
    /// owner). Not with `--tls`.
    #[arg(long, value_enum, default_value = "grpc")]
    front: sim::front_workload::Front,
    /// The ids' layout with `--ids`: `twitter`, `sonyflake` or SLOT_BITS/SEQ_BITS/TICK_MS.
    #[arg(long, default_value = "twitter", requires = "ids")]
    id_layout: seqsvr_proto::id_layout::LayoutShape,
    #[command(flatten)]
    hostile: flags::Hostile,
    #[command(flatten)]
    controls: flags::NegativeControls,
}

// `90s`, `5m`, `1500ms`: the parser `seqctl verify --duration` shares.
pub(crate) use seqsvr_plumbing::cli::parse_duration;

/// The workload options `sim run` and `sim load` share: clients, rate, and the uid space they
/// spread over (the history keeps one record per section, so it stays bounded).
pub(crate) fn check_workload(clients: u32, rate: f64, section_size: u64, uid_limit: u64) -> Result<(), String> {
    if clients == 0 || clients > 256 {
        return Err("--clients must be in 1..=256".into());
    }
    if !(rate > 0.0 && rate <= 100_000.0) {
        return Err("--rate must be in (0, 100000]".into());
    }
    if section_size == 0 || uid_limit < section_size {
        return Err("--uid-limit must be at least --section-size (> 0)".into());
    }
    if uid_limit / section_size > 10_000 {
        return Err("at most 10,000 sections in a simulation".into());
    }
    Ok(())
}

impl RunArgs {
    /// Semantic checks clap cannot do; a failure is exit 2.
    fn validate(&self) -> Result<(), String> {
        check_workload(self.clients, self.rate, self.shape.section_size, self.shape.uid_limit)?;
        if let Some(f) = self.controls.dst_only() {
            return Err(format!(
                "{f} is a switch of `sim dst` (it changes what that mode simulates)"
            ));
        }
        self.check_switches_have_their_workload()?;
        if self.hostile.hostile && self.front == sim::front_workload::Front::Grpc {
            return Err("--hostile floods the HTTP or Redis front end: give --front http|resp".into());
        }
        if self.hostile.hostile && self.front == sim::front_workload::Front::RespCluster {
            return Err("--hostile floods the plain ports: give --front http|resp".into());
        }
        if self.tls && self.front != sim::front_workload::Front::Grpc {
            return Err("--front http|resp runs without --tls (its clients speak plaintext)".into());
        }
        if self.sets == 1
            && let Some(f) = self.controls.needs_two_sets()
        {
            return Err(format!("{f} needs moves: give --sets 2 or more"));
        }
        if !self.ids
            && let Some(k) = self
                .must_include
                .iter()
                .chain(&self.fault_kinds)
                .find(|k| k.is_id_clock())
        {
            return Err(format!("{} moves an id clock: it needs --ids", k.name()));
        }
        if self.ids {
            self.check_id_layout()?;
        }
        if self.election_min_ms == 0 || self.election_min_ms > self.election_max_ms {
            return Err("--election-min-ms must be in 1..=--election-max-ms".into());
        }
        if !(1..=4).contains(&self.sets) {
            return Err("--sets must be in 1..=4".into());
        }
        let moves = self
            .must_include
            .iter()
            .chain(&self.fault_kinds)
            .filter(|k| k.is_move());
        if self.sets == 1
            && let Some(k) = moves.into_iter().next()
        {
            return Err(format!(
                "{} moves ranges between sets: it needs --sets 2 or more",
                k.name()
            ));
        }
        if self.no_faults && (self.ci || !self.must_include.is_empty() || !self.fault_kinds.is_empty()) {
            return Err("--no-faults excludes --ci, --must-include and --fault-kinds".into());
        }
        Ok(())
    }

    /// A negative control that breaks a rule of blocks, keys, ledgers or ids needs the workload
    /// that exercises that rule, or the run shows nothing.
    fn check_switches_have_their_workload(&self) -> Result<(), String> {
        if self.controls.unsafe_block_overlap && !self.blocks {
            return Err("--unsafe-block-overlap needs --blocks (without it no block is served)".into());
        }
        if !self.keys
            && let Some(f) = self.controls.needs_keys()
        {
            return Err(format!("{f} breaks a rule of counter keys: give --keys"));
        }
        if !self.ledger
            && let Some(f) = self.controls.needs_ledger()
        {
            return Err(format!("{f} breaks a rule of ledger counters: give --ledger"));
        }
        if !self.ids
            && let Some(f) = self.controls.needs_ids()
        {
            return Err(format!("{f} breaks a rule of time-ordered ids: give --ids"));
        }
        Ok(())
    }

    /// The `--id-layout` must be one the StoreSvrs accept, with room for every set's slots.
    fn check_id_layout(&self) -> Result<(), String> {
        let layout = self.id_layout.with_epoch(DEFAULT_EPOCH_MS);
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        layout.validate(now_ms).map_err(|e| format!("--id-layout: {e}"))?;
        let per_set = sim::run::ids::SLOTS_PER_SET;
        if layout.slots() < per_set * self.sets {
            return Err(format!(
                "--id-layout: {} slots do not give {} sets {per_set} each",
                layout.slots(),
                self.sets
            ));
        }
        Ok(())
    }

    fn into_opts(self, seed: u64, replay: String) -> RunOpts {
        RunOpts {
            seed,
            duration: self.duration,
            data_dir: self.data_dir,
            tls: self.tls,
            bin_dir: self.bin_dir,
            clients: self.clients,
            rate_per_client: self.rate,
            faults: !self.no_faults,
            must_include: if self.ci && self.sets > 1 {
                CI_PROFILE.iter().chain(&CI_MOVES_PROFILE).copied().collect()
            } else if self.ci {
                CI_PROFILE.to_vec()
            } else {
                self.must_include
            },
            fault_kinds: self.fault_kinds,
            set: SetArgs {
                section_size: self.shape.section_size,
                uid_limit: self.shape.uid_limit,
                step: self.shape.step,
                lease_ms: self.shape.lease_ms,
                detect_ms: self.detect_ms,
                election_min_ms: self.election_min_ms,
                election_max_ms: self.election_max_ms,
                store_extra: {
                    let mut flags = self.controls.store_flags();
                    if self.front == sim::front_workload::Front::RespCluster {
                        flags.push("--key-placement=slots".into());
                    }
                    flags
                },
                alloc_extra: {
                    let mut flags = self.controls.alloc_flags();
                    // Keys forgotten for the bound come back above a gap: only with faults,
                    // where gaps are a statistic; a run without them checks every key's P6.
                    if self.keys && !self.no_faults {
                        flags.push(format!("--max-live-keys={}", sim::keys::MAX_LIVE_KEYS));
                    }
                    flags
                },
                id_clock_dir: None,
                front: self.front,
            },
            sets: self.sets,
            replay,
            ids: self.ids.then(|| self.id_layout.with_epoch(DEFAULT_EPOCH_MS)),
            max_block: if self.blocks {
                self.shape.step.min(sim::dst::MAX_BLOCK) as u32
            } else {
                0
            },
            keys: if self.keys { sim::keys::KEYS } else { 0 },
            ledger: self.ledger,
            hostile: self.hostile.hostile.then_some(sim::run::hostile::HostileOpts {
                max_rss_bytes: self.hostile.hostile_max_rss_mib * 1024 * 1024,
                baseline: self.hostile.hostile_baseline,
                skip: self.hostile.hostile_skip,
                flood_nice: self.hostile.hostile_flood_nice,
            }),
        }
    }
}

/// The run's schedule, refused when the `--must-include` kinds do not fit in the duration.
fn checked_schedule(opts: &RunOpts) -> Result<Vec<sim::schedule::PlannedFault>, String> {
    let schedule = sim::run::schedule_for(opts);
    let missing = sim::schedule::missing(&schedule, &opts.must_include);
    if missing.is_empty() {
        Ok(schedule)
    } else {
        let names: Vec<&str> = missing.iter().map(|k| k.name()).collect();
        Err(format!(
            "--duration {:?} is too short to fit the required faults {}",
            opts.duration,
            names.join(", ")
        ))
    }
}

const EXIT_VIOLATION: u8 = 1;
pub(crate) const EXIT_BAD_OPTIONS: u8 = 2;
pub(crate) const EXIT_HARNESS: u8 = 3;

fn main() -> ExitCode {
    let cli = match seqsvr_plumbing::cli::try_parse_from::<Cli, _, _>("SIM", std::env::args_os()) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(EXIT_BAD_OPTIONS)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match cli.cmd {
        Cmd::Check { file, max_seqs } => check(&file, max_seqs.as_deref()),
        Cmd::Run(args) => run(args),
        Cmd::Plan(args) => print_plan(args),
        Cmd::Dst(args) => dst_cmd::run(args),
        Cmd::Load(args) => load_cmd::run(args),
    }
}

fn print_plan(args: RunArgs) -> ExitCode {
    if let Err(e) = args.validate() {
        eprintln!("sim plan: {e}");
        return ExitCode::from(EXIT_BAD_OPTIONS);
    }
    let Some(seed) = args.seed else {
        eprintln!("sim plan: --seed is required");
        return ExitCode::from(EXIT_BAD_OPTIONS);
    };
    let opts = args.into_opts(seed, String::new());
    let schedule = match checked_schedule(&opts) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sim plan: {e}");
            return ExitCode::from(EXIT_BAD_OPTIONS);
        }
    };
    let mut out = std::io::stdout().lock();
    for f in schedule {
        let delay = if f.delay.is_zero() {
            String::new()
        } else {
            format!(" delay {:?}", f.delay)
        };
        let delay = match f.kind {
            FaultKind::IdClockDrift => format!("{delay} clock {:+}‰", f.clock_ms),
            k if k.is_id_clock() => format!("{delay} clock {:+} ms", f.clock_ms),
            _ => delay,
        };
        let delay = match f.phases {
            None => delay,
            Some(h) => format!(
                "{delay} (drop {:?}, hold {:?}, pass {:?}, drop {:?})",
                h.drop_first,
                h.hold,
                sim::schedule::RELEASE_WINDOW,
                h.drop_after
            ),
        };
        // A closed pipe (`| head`) just ends the listing.
        if writeln!(out, "{:>8.1?} {:<24} hold {:?}{delay}", f.at, f.kind.name(), f.hold).is_err() {
            break;
        }
    }
    ExitCode::SUCCESS
}

fn run(args: RunArgs) -> ExitCode {
    if let Err(e) = args.validate() {
        eprintln!("sim run: {e}");
        return ExitCode::from(EXIT_BAD_OPTIONS);
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let mut replay: Vec<String> = std::env::args().collect();
    if args.seed.is_none() {
        replay.push(format!("--seed={seed}"));
    }
    let opts = args.into_opts(seed, replay.join(" "));
    if let Err(e) = checked_schedule(&opts) {
        eprintln!("sim run: {e}");
        return ExitCode::from(EXIT_BAD_OPTIONS);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sim run: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_HARNESS);
        }
    };
    // Dropping the run (Ctrl-C) and then the runtime drops the cluster, which kills every process.
    let result = rt.block_on(async {
        tokio::select! {
            r = sim::run::run(opts) => r,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        }
    });
    drop(rt);
    match result {
        Ok(v) if v.passed() => {
            println!("sim: PASS (seed {seed})");
            ExitCode::SUCCESS
        }
        Ok(v) => {
            println!(
                "sim: FAIL (seed {seed}): {} violations, {} crashes, {} panics, {} hostile-mode failures",
                v.violations,
                v.crashes.len(),
                v.panics,
                v.hostile.len()
            );
            ExitCode::from(EXIT_VIOLATION)
        }
        Err(e) => {
            eprintln!("sim run: harness failure (seed {seed}): {e:#}");
            ExitCode::from(EXIT_HARNESS)
        }
    }
}

fn check(file: &Path, max_seqs: Option<&Path>) -> ExitCode {
    let history = match History::read(file) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("sim check: cannot read {}: {e}", file.display());
            return ExitCode::from(EXIT_HARNESS);
        }
    };
    let max = match max_seqs.map(sim::history::read_max_seqs).transpose() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("sim check: cannot read max_seqs: {e}");
            return ExitCode::from(EXIT_HARNESS);
        }
    };
    judge(&history, max.as_ref())
}

/// Runs the checkers and turns the report into an exit code.
pub(crate) fn judge(history: &History, max: Option<&BTreeMap<u64, u64>>) -> ExitCode {
    let report: Report = match checks::check_all(history, max) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sim: cannot judge the history: {e}");
            return ExitCode::from(EXIT_HARNESS);
        }
    };
    print!("{}", report.render(history));
    if !history.info.replay.is_empty() {
        println!("replay: {}", history.info.replay);
    }
    if report.total_violations() > 0 {
        ExitCode::from(EXIT_VIOLATION)
    } else {
        ExitCode::SUCCESS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        let cases = [
            ("90s", 90_000),
            ("5m", 300_000),
            ("1500ms", 1_500),
            ("2", 2_000),
            ("1h", 3_600_000),
        ];
        for (s, ms) in cases {
            assert_eq!(parse_duration(s), Ok(Duration::from_millis(ms)), "{s}");
        }
        for bad in ["", "s", "5x", "0s", "-1s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
