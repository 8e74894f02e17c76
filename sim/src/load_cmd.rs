//! `sim load`: the command line of the external-cluster mode (see `sim::load`): record a
//! history against a running cluster, then judge it with every checker that needs no store access.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use sim::history::History;
use sim::load::{self, LoadOpts};

#[derive(clap::Args, Debug)]
pub struct LoadArgs {
    /// AllocSvr addresses, host:port, comma-separated, as the cluster advertises them.
    #[arg(long, value_delimiter = ',', required = true)]
    alloc: Vec<String>,
    /// Seed of the workload (random when absent; always printed).
    #[arg(long)]
    seed: Option<u64>,
    /// How long the workload runs, e.g. 45s.
    #[arg(long, default_value = "30s", value_parser = crate::parse_duration)]
    duration: Duration,
    /// Concurrent routing clients (one pinned client per AllocSvr comes on top).
    #[arg(long, default_value_t = 4)]
    clients: u32,
    /// Calls per second per client (upper bound).
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    /// The cluster's shape, as it was started (step and lease are recorded for the report).
    #[command(flatten)]
    shape: crate::flags::ClusterShape,
    /// Where the history goes (JSON lines, readable by `sim check`).
    #[arg(long)]
    history: PathBuf,
    /// The faults and moves the operator injected, read after the workload: lines
    /// `fault KIND TARGET START END` and `move OP FROM TO SECTION_BEGIN SECTION_END START END`,
    /// times in ns since the Unix epoch. Without it the run counts as fault-free.
    #[arg(long)]
    events: Option<PathBuf>,
}

impl LoadArgs {
    fn validate(&self) -> Result<(), String> {
        crate::check_workload(self.clients, self.rate, self.shape.section_size, self.shape.uid_limit)?;
        for a in &self.alloc {
            a.parse::<seqsvr_proto::addr::HostPort>()
                .map_err(|e| format!("--alloc: {e}"))?;
        }
        Ok(())
    }
}

pub fn run(args: LoadArgs) -> ExitCode {
    if let Err(e) = args.validate() {
        eprintln!("sim load: {e}");
        return ExitCode::from(crate::EXIT_BAD_OPTIONS);
    }
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let mut replay: Vec<String> = std::env::args().collect();
    if args.seed.is_none() {
        replay.push(format!("--seed={seed}"));
    }
    println!("sim load: seed {seed}");
    let opts = LoadOpts {
        seed,
        alloc: args.alloc,
        duration: args.duration,
        clients: args.clients,
        rate_per_client: args.rate,
        section_size: args.shape.section_size,
        uid_limit: args.shape.uid_limit,
        step: args.shape.step,
        lease_ms: args.shape.lease_ms,
        history: args.history,
        events: args.events,
        replay: replay.join(" "),
    };
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sim load: cannot start the runtime: {e}");
            return ExitCode::from(crate::EXIT_HARNESS);
        }
    };
    let recorded = rt.block_on(async {
        tokio::select! {
            r = load::record(&opts) => r,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        }
    });
    drop(rt);
    let path = match recorded {
        Ok(p) => p,
        Err(e) => {
            eprintln!("sim load: harness failure (seed {seed}): {e:#}");
            return ExitCode::from(crate::EXIT_HARNESS);
        }
    };
    let history = match History::read(&path) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("sim load: cannot read {}: {e}", path.display());
            return ExitCode::from(crate::EXIT_HARNESS);
        }
    };
    print_faults(&history);
    println!("re-check with: sim check {}", path.display());
    crate::judge(&history, None)
}

/// The injected faults with the unavailability each caused (as `sim run` prints them).
fn print_faults(h: &History) {
    let unavail = sim::stats::unavailability(&h.calls, &h.faults, h.info.section_size);
    for (f, u) in h.faults.iter().zip(&unavail) {
        println!(
            "fault {:<2} at {:>7.1?} {:<12} on {:<28} for {:.1?}; unavailability {:.1?}",
            f.id,
            Duration::from_nanos(f.start_ns),
            f.kind,
            f.target,
            Duration::from_nanos(f.end_ns.saturating_sub(f.start_ns)),
            u
        );
    }
    for m in &h.moves {
        println!(
            "move {} of sections [{}, {}) from set {} to set {}, {:.1?} to {:.1?}",
            m.op,
            m.sections.0,
            m.sections.1,
            m.from,
            m.to,
            Duration::from_nanos(m.start_ns),
            Duration::from_nanos(m.end_ns)
        );
    }
}
