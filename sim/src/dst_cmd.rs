//! `sim dst`: the command line of the deterministic mode (see `sim::dst`).

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use sim::dst::{self, Options};
use sim::history::Record;

#[derive(clap::Args, Debug)]
pub struct DstArgs {
    /// Seeds to run, `A..B` (B excluded).
    #[arg(long, value_parser = parse_range, conflicts_with = "seed")]
    seeds: Option<std::ops::Range<u64>>,
    /// One seed: print its faults, its report and, when it fails, the trace and the replay.
    #[arg(long)]
    seed: Option<u64>,
    /// Threads (each runs whole seeds; default: the machine's cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Stop at the first failing seed of the range (negative controls: how far it had to look).
    #[arg(long)]
    stop_at_first: bool,
    /// Keep only these faults of the seed's schedule (indices, as `--seed` lists them).
    #[arg(long, value_delimiter = ',')]
    faults: Option<Vec<usize>>,
    /// With `--seed` that fails: drop faults while it still fails and print the shorter replay.
    #[arg(long)]
    shrink: bool,
    /// With `--seed`: write the history as JSON lines (readable by `sim check`).
    #[arg(long)]
    history: Option<PathBuf>,
    /// Sets: 1 (default), or 2 with operator moves between them by the production move driver.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=2))]
    sets: u64,
    /// Time-ordered ids beside the sequences: slots, marks, id clients, id clock faults and the
    /// U1–U4 checkers (a seed's schedule then differs from its schedule without).
    #[arg(long)]
    ids: bool,
    /// Blocks of seqs: a share of the routing clients' fetches are `Reserve(uid, n)`, checked as
    /// n fetches each (a seed's schedule then differs from its schedule without).
    #[arg(long)]
    blocks: bool,
    /// Named counters: a share of the routing clients' single calls ask one of 24 keys instead of
    /// a uid, each checked as a sequence of its own (a seed's schedule then differs from its
    /// schedule without).
    #[arg(long)]
    keys: bool,
    /// Ledger counters beside the sequences: callers reserve, confirm, release and abandon numbers
    /// of three ledgers through the store's LedgerService logic, and G1–G3 are checked (a seed's
    /// schedule then differs from its schedule without).
    #[arg(long)]
    ledger: bool,
    #[command(flatten)]
    controls: crate::flags::NegativeControls,
}

fn parse_range(s: &str) -> Result<std::ops::Range<u64>, String> {
    let (a, b) = s.split_once("..").ok_or_else(|| format!("expected A..B, got {s:?}"))?;
    let a: u64 = a.trim().parse().map_err(|e| format!("bad range start {a:?}: {e}"))?;
    let b: u64 = b.trim().parse().map_err(|e| format!("bad range end {b:?}: {e}"))?;
    if a >= b {
        return Err(format!("empty range {s:?}"));
    }
    Ok(a..b)
}

impl DstArgs {
    fn options(&self) -> Options {
        let mut o = Options::default();
        let c = &self.controls;
        o.alloc.skip_lease_wait = c.unsafe_skip_lease_wait;
        o.alloc.serve_before_bump_ack = c.unsafe_serve_before_bump_ack;
        o.alloc.keep_memory = c.unsafe_keep_memory;
        o.store.skip_epoch_fence = c.unsafe_skip_epoch_fence;
        o.store.unfenced_release = c.unsafe_unfenced_release;
        o.store.skip_binding = c.unsafe_skip_binding;
        o.two_sets = self.sets == 2;
        o.skip_move_wait = c.unsafe_skip_move_wait;
        o.clock.monotonic = c.unsafe_monotonic_lease_clock;
        o.clock.drift_ppm = c.unsafe_clock_drift_ppm;
        o.skip_restore_map_check = c.unsafe_skip_restore_map_check;
        o.store.skip_slot_fence = c.unsafe_skip_slot_fence;
        o.store.predecessor_wait_from_first_renewal = c.unsafe_predecessor_wait_from_first_renewal;
        o.alloc.ids.ignore_floor = c.unsafe_ids_ignore_floor;
        o.alloc.ids.ignore_mark = c.unsafe_ids_ignore_mark;
        o.ids = self.ids;
        o.blocks = self.blocks;
        o.alloc.block_overlap = c.unsafe_block_overlap;
        o.keys = self.keys;
        o.alloc.keys_share_seq = c.unsafe_keys_share_seq;
        o.alloc.keys_forget_to_base = c.unsafe_keys_forget_to_base;
        o.ledger = self.ledger;
        o.ledger_answer_before_commit = c.unsafe_ledger_answer_before_commit;
        o.only_faults = self.faults.as_ref().map(|f| f.iter().copied().collect::<BTreeSet<_>>());
        o
    }
}

pub fn run(args: DstArgs) -> ExitCode {
    if args.sets != 2
        && let Some(f) = args.controls.needs_two_sets()
    {
        eprintln!("sim dst: {f} needs --sets 2 (with one set there is no move, and no other set's map)");
        return ExitCode::from(2);
    }
    if !args.blocks && args.controls.unsafe_block_overlap {
        eprintln!("sim dst: --unsafe-block-overlap needs --blocks (without it no block is served)");
        return ExitCode::from(2);
    }
    if !args.keys
        && let Some(f) = args.controls.needs_keys()
    {
        eprintln!("sim dst: {f} needs --keys (without it no counter key is asked for)");
        return ExitCode::from(2);
    }
    if !args.ids
        && let Some(f) = args.controls.needs_ids()
    {
        eprintln!("sim dst: {f} needs --ids (without it no id is issued, and no rule of ids is exercised)");
        return ExitCode::from(2);
    }
    if !args.ledger
        && let Some(f) = args.controls.needs_ledger()
    {
        eprintln!("sim dst: {f} needs --ledger (without it no ledger number is handed out)");
        return ExitCode::from(2);
    }
    let opts = args.options();
    match (args.seed, &args.seeds) {
        (Some(seed), _) => one(seed, &args, opts),
        (None, Some(range)) => many(range.clone(), &args, &opts),
        (None, None) => {
            eprintln!("sim dst: give --seeds A..B or --seed S");
            ExitCode::from(2)
        }
    }
}

fn many(range: std::ops::Range<u64>, args: &DstArgs, opts: &Options) -> ExitCode {
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let r = dst::run_range(range.clone(), threads, opts, args.stop_at_first);
    for o in &r.failures {
        println!(
            "FAIL seed {}: {} violations {:?}\n  replay: sim dst --seed {}{}",
            o.seed,
            o.report.total_violations(),
            o.report.counts,
            o.seed,
            opts.flags()
        );
    }
    println!(
        "seeds: {} run, {} failed, {:.1} s, {:.1} seeds/s ({} threads)",
        r.seeds_run,
        r.failures.len(),
        r.elapsed.as_secs_f64(),
        r.seeds_per_second(),
        threads
    );
    println!(
        "seeds where the Release epoch fence refused a section: {}",
        r.stale_release_seeds
    );
    println!(
        "forged Releases, Renews and Bumps: {} sent in {} seeds, {} refused",
        r.forged.sent, r.forger_seeds, r.forged.refused
    );
    println!(
        "seeds with faults on set 1: {}; restores: {} seeds restored, {} refused ({} by the check against the map)",
        r.set1_fault_seeds, r.restored_seeds, r.refused_restore_seeds, r.map_refused_restore_seeds
    );
    println!(
        "P6 gaps across an owner change: {} checked against their section's reserve, {} beyond it (a statistic with faults)",
        r.p6_bounded, r.p6_beyond
    );
    if opts.ledger {
        print_ledger(&r.ledger);
    }
    match r.failures.first() {
        Some(o) => {
            println!(
                "first failing seed: {} (after {} seeds from {})",
                o.seed,
                o.seed - range.start + 1,
                range.start
            );
            ExitCode::from(1)
        }
        None => {
            println!("dst: PASS (seeds {}..{})", range.start, range.end);
            ExitCode::SUCCESS
        }
    }
}

fn print_ledger(l: &sim::checks::ledger::LedgerStats) {
    println!(
        "ledger calls: {} reserved, {} confirmed, {} released, {} issued, {} repeats answered, \
         {} other references refused, {} confirms refused as voided, {} unknown; numbers expired {}, \
         lost with a restore {}",
        l.reserved,
        l.confirmed,
        l.released,
        l.issued,
        l.repeated,
        l.already_exists,
        l.refused_voided,
        l.unknown,
        l.expired,
        l.lost_with_restore
    );
}

fn one(seed: u64, args: &DstArgs, mut opts: Options) -> ExitCode {
    opts.keep_history = true;
    let o = dst::run_seed(seed, &opts);
    let history = o.history.as_ref().expect("kept");
    for (i, f) in o.faults.iter().enumerate() {
        let set1 = if f.hits_set(1) { " on set 1" } else { "" };
        println!("fault {i}: {}{set1} at {} ms for {} ms", f.name(), f.at_ms, f.for_ms);
    }
    for m in &history.moves {
        println!(
            "move {}: sections {}..{} from set {} to set {}, started at {} ms, {}",
            m.op,
            m.sections.0,
            m.sections.1,
            m.from,
            m.to,
            m.start_ns / 1_000_000,
            if m.done {
                format!("done at {} ms", m.end_ns / 1_000_000)
            } else {
                "not done".into()
            }
        );
    }
    print!("{}", o.report.render(history));
    println!("history hash: {:016x}", o.hash);
    println!("sections refused by the Release epoch fence: {}", o.stale_releases);
    println!(
        "forged Releases, Renews and Bumps: {} sent, {} refused",
        o.forged.sent, o.forged.refused
    );
    for note in &o.restores.notes {
        println!("restore: {note}");
    }
    if let Some(l) = &o.ledger {
        println!("ledger: {l:?}");
    }
    if let Some(path) = &args.history
        && let Err(e) = write_history(path, history)
    {
        eprintln!("sim dst: cannot write {}: {e}", path.display());
        return ExitCode::from(3);
    }
    if o.passed() {
        println!("dst: PASS (seed {seed})");
        return ExitCode::SUCCESS;
    }
    print!("{}", dst::trace::render(&o));
    println!("replay: sim dst --seed {seed}{}", opts.flags());
    if args.shrink {
        let shorter = dst::shrink(seed, &opts);
        println!("shrunk: sim dst --seed {seed}{}", shorter.flags());
    }
    println!("dst: FAIL (seed {seed})");
    ExitCode::from(1)
}

fn write_history(path: &std::path::Path, h: &sim::history::History) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    let records = std::iter::once(Record::Info(h.info.clone()))
        .chain(h.calls.iter().cloned().map(Record::Call))
        .chain(h.polls.iter().cloned().map(Record::Poll))
        .chain(h.faults.iter().cloned().map(Record::Fault))
        .chain(h.moves.iter().cloned().map(Record::Move))
        .chain(h.ids.iter().cloned().map(Record::Ids));
    for r in records {
        serde_json::to_writer(&mut out, &r)?;
        out.write_all(b"\n")?;
    }
    out.flush()
}
