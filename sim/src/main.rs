//! `sim`: run a seeded fault-injection simulation against real seqsvr processes, or re-check a
//! saved history offline.
//!
//! Exit codes (DESIGN.md §7): 0 every promise held, 1 a promise was violated (the offending calls
//! are printed), 2 bad options, 3 the harness itself failed.

use clap::{Parser, Subcommand};
use sim::checks::{self, Report};
use sim::history::History;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "sim",
    about = "seqsvr-rs simulator: faults on real processes, promise checkers"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Re-check a saved history (JSON lines) offline.
    Check {
        /// History file written by `sim run`.
        file: PathBuf,
        /// Final max_seq per section (written by `sim run` as max_seqs.json); enables P2.
        #[arg(long)]
        max_seqs: Option<PathBuf>,
    },
}

const EXIT_VIOLATION: u8 = 1;
const EXIT_BAD_OPTIONS: u8 = 2;
const EXIT_HARNESS: u8 = 3;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
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
fn judge(history: &History, max: Option<&BTreeMap<u64, u64>>) -> ExitCode {
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
