//! `seqctl`: fetch and read seqs, inspect a StoreSvr set, and run operator actions.
//!
//! Human tables by default, `--json` for scripts. Exit codes are part of the interface (see
//! `--help`): an unknown outcome has its own code because a script must not retry a fetch that may
//! have taken effect as if it had not.
//!
//! Deliberately left out: authentication (anyone who reaches a StoreSvr may run these).

//! One file per command group: `data` (fetch, get, batch, routes), `ledger`, `status`, `moves` (sets, set
//! add, move), `drain`, `backup`, `audit`, `replica`, `certs`, `verify`; this file declares the commands,
//! dispatches them, and holds what they share (connections, exit codes, tables).

mod audit;
mod backup;
mod certs;
mod counters;
mod data;
mod drain;
mod ids;
mod ledger;
mod moves;
mod replica;
mod status;
mod verify;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use seqsvr_client::{ClientError, FailureKind};
use seqsvr_control::{ControlError, Seed, StoreClient, StoreTimeouts};
use seqsvr_proto::Uid;

/// Exit code of a failure that certainly did not take effect (unreachable, refused).
pub(crate) const EXIT_FAILED: u8 = 1;
/// Exit code of bad input: unparsable arguments, a uid outside the cluster's range.
pub(crate) const EXIT_USAGE: u8 = 2;
/// Exit code of an unknown outcome: the request may have taken effect (e.g. a timed-out fetch).
const EXIT_UNKNOWN: u8 = 3;

#[derive(Parser, Debug)]
#[command(
    name = "seqctl",
    version = seqsvr_plumbing::version::LONG,
    about = "Fetch sequence numbers and operate a seqsvr-rs cluster",
    after_help = "Exit codes: 0 success; 1 failed (certainly did not take effect); \
                  2 bad input or usage; 3 unknown outcome (may have taken effect, e.g. a timed-out fetch)."
)]
pub(crate) struct Cli {
    /// Read options from this TOML file (`some_option = value`); flags and environment variables
    /// override it.
    #[arg(long, value_name = "FILE", global = true)]
    config: Option<std::path::PathBuf>,
    /// AllocSvr data-plane addresses, host:port, comma-separated.
    #[arg(long, value_delimiter = ',', global = true)]
    alloc: Vec<String>,
    /// StoreSvr addresses, host:port or id=host:port, comma-separated.
    #[arg(long, global = true)]
    store: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// Overall deadline of one command, in milliseconds.
    #[arg(long, default_value_t = 5_000, global = true)]
    timeout_ms: u64,
    /// Deadline of one RPC attempt, in milliseconds.
    #[arg(long, default_value_t = 1_000, global = true)]
    attempt_timeout_ms: u64,
    /// Mutual TLS: an `admin` certificate may do everything, a `client` one only fetch and read.
    #[command(flatten)]
    tls: seqsvr_auth::TlsArgs,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Fetch the next seq of a uid (needs --alloc).
    Fetch { uid: u64 },
    /// Read the current seq of a uid (needs --alloc).
    Get { uid: u64 },
    /// Reserve a block of COUNT consecutive seqs of a uid, all above its earlier ones (needs
    /// --alloc). COUNT is 1 to the smaller of the set's step and 1,000,000.
    Reserve {
        uid: u64,
        #[arg(value_parser = clap::value_parser!(u32).range(1..))]
        count: u32,
    },
    /// Fetch the next seq of many uids in one batch (needs --alloc).
    Batch {
        #[arg(required = true)]
        uids: Vec<u64>,
    },
    /// Named counters: `next KEY`, `reserve KEY COUNT`, `get KEY` (needs --alloc).
    Counter {
        #[command(subcommand)]
        action: counters::CounterCmd,
    },
    /// Ledger counters, numbers with no gaps (needs --alloc): `create`, `reserve`, `confirm`,
    /// `release`, `void`, `reconcile`, `show`, `gaps`.
    Ledger {
        #[command(subcommand)]
        action: ledger::LedgerCmd,
    },
    /// Time-ordered ids: `next [N]` (needs --alloc), `decode ID` (--store, or the layout flags).
    Id {
        #[command(subcommand)]
        action: ids::IdCmd,
    },
    /// Status of the StoreSvr set: members, leader, log indexes, AllocSvrs (needs --store).
    Status,
    /// The current route table (needs --store).
    Routes,
    /// StoreSvr membership (needs --store).
    Replica {
        #[command(subcommand)]
        action: ReplicaCmd,
    },
    /// Every set of the cluster map: its StoreSvrs and the uids it serves (--store: set 0).
    Sets,
    /// Add a set to the cluster map (--store: set 0).
    Set {
        #[command(subcommand)]
        action: moves::SetCmd,
    },
    /// Move a uid range between sets, or show, resume or cancel moves (--store: set 0).
    Move(moves::MoveArgs),
    /// AllocSvr operations (--store: the node's set).
    Alloc {
        #[command(subcommand)]
        action: drain::AllocCmd,
    },
    /// Write a consistent backup of the set's replicated state to --out, taken on its leader
    /// (--store: the set's StoreSvrs). Restore with `storesvr restore` (docs/BACKUP.md).
    Backup(backup::BackupArgs),
    /// The set's audit trail of admin actions: who did what, when, and the outcome (--store: the
    /// set's StoreSvrs; newest last).
    Audit(audit::AuditArgs),
    /// Check the promises against the live cluster: drive a bounded load through the given front
    /// ends on reserved uids and keys, record every call, judge the history (exit 0 pass, 1
    /// violation, 2 usage or nothing answered). docs/operations/verify.md.
    Verify(verify::VerifyArgs),
    /// Make a DEVELOPMENT certificate authority and one certificate per role (client, allocsvr,
    /// storesvr, admin) for a local cluster: DIR/ca.pem, DIR/<role>.pem, DIR/<role>.key. Not for
    /// production: the CA key is not kept, so no more certificates can be signed later.
    Certs {
        /// Directory to write into (created; must not hold a ca.pem already).
        #[arg(long)]
        out: std::path::PathBuf,
        /// Hosts the servers are dialled at (IP addresses or DNS names), comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "127.0.0.1,localhost")]
        hosts: Vec<String>,
        /// Days every certificate stays valid.
        #[arg(long, default_value_t = 30)]
        days: i64,
    },
}

#[derive(Subcommand, Debug)]
enum ReplicaCmd {
    /// Add a replica under a never-used node id.
    Add { id: u64, addr: String },
    /// Remove a replica; its node id is retired.
    Remove { id: u64 },
}

/// Why a command failed, with the exit code it maps to.
pub(crate) struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    pub(crate) fn usage(message: impl Into<String>) -> Self {
        Self {
            code: EXIT_USAGE,
            message: message.into(),
        }
    }
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Self {
        let code = match e.failure_kind() {
            None => EXIT_UNKNOWN,
            Some(FailureKind::InvalidArgument | FailureKind::BadConfig) => EXIT_USAGE,
            Some(
                FailureKind::Unavailable
                | FailureKind::Overloaded
                | FailureKind::Exhausted
                | FailureKind::NotFound
                | FailureKind::Conflict
                | FailureKind::Refused
                | FailureKind::Forbidden,
            ) => EXIT_FAILED,
        };
        Self {
            code,
            message: e.to_string(),
        }
    }
}

impl From<ControlError> for Failure {
    fn from(e: ControlError) -> Self {
        let code = match &e {
            ControlError::Rejected(s) if s.code() == tonic::Code::InvalidArgument => EXIT_USAGE,
            _ => EXIT_FAILED,
        };
        Self {
            code,
            message: e.to_string(),
        }
    }
}

impl Failure {
    /// A failed write: when an attempt may have been applied its outcome is unknown.
    pub(crate) fn of_write(e: ControlError) -> Self {
        match e {
            ControlError::Unavailable {
                last,
                maybe_taken: true,
            } => Self {
                code: EXIT_UNKNOWN,
                message: format!("outcome unknown (an attempt may have taken effect): {last}"),
            },
            e => e.into(),
        }
    }
}

fn main() -> ExitCode {
    let cli: Cli = seqsvr_plumbing::cli::parse("SEQCTL");
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("seqctl: error: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_FAILED);
        }
    };
    match runtime.block_on(run(&cli)) {
        Ok(out) => {
            println!("{out}");
            ExitCode::SUCCESS
        }
        Err(f) => {
            eprintln!("seqctl: error: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

async fn run(cli: &Cli) -> Result<String, Failure> {
    if cli.timeout_ms == 0 || cli.attempt_timeout_ms == 0 {
        return Err(Failure::usage("--timeout-ms and --attempt-timeout-ms must be positive"));
    }
    match &cli.cmd {
        Cmd::Fetch { uid } => data::fetch(cli, &[Uid(*uid)], false).await,
        Cmd::Get { uid } => data::get(cli, Uid(*uid)).await,
        Cmd::Reserve { uid, count } => data::reserve(cli, Uid(*uid), *count).await,
        Cmd::Batch { uids } => data::fetch(cli, &uids.iter().map(|&u| Uid(u)).collect::<Vec<_>>(), true).await,
        Cmd::Counter { action } => counters::counter(cli, action).await,
        Cmd::Id { action } => ids::id(cli, action).await,
        Cmd::Ledger { action } => ledger::ledger(cli, action).await,
        Cmd::Status => status::status(cli).await,
        Cmd::Routes => data::routes(cli).await,
        Cmd::Sets => moves::sets(cli).await,
        Cmd::Set { action } => moves::set(cli, action).await,
        Cmd::Move(args) => moves::moves(cli, args).await,
        Cmd::Alloc { action } => drain::alloc(cli, action).await,
        Cmd::Backup(args) => backup::backup(cli, args).await,
        Cmd::Audit(args) => audit::audit(cli, args).await,
        Cmd::Verify(args) => verify::verify(cli, args).await,
        Cmd::Certs { out, hosts, days } => certs::certs(cli.json, out, hosts, *days),
        Cmd::Replica { action } => replica::replica(cli, action).await,
    }
}

pub(crate) fn timeouts(cli: &Cli) -> StoreTimeouts {
    StoreTimeouts {
        attempt: Duration::from_millis(cli.attempt_timeout_ms),
        overall: Duration::from_millis(cli.timeout_ms),
    }
}

pub(crate) fn store_seeds(cli: &Cli) -> Result<Vec<Seed>, Failure> {
    let list = cli
        .store
        .as_deref()
        .ok_or_else(|| Failure::usage("no StoreSvr address: pass --store ADDR[,ADDR..] or set SEQCTL_STORE"))?;
    Seed::parse_list(list).map_err(Failure::usage)
}

pub(crate) fn store_client(cli: &Cli, seeds: &[Seed]) -> Result<StoreClient, Failure> {
    StoreClient::with_dialer(seeds.to_vec(), timeouts(cli), &dialer(cli)?).map_err(Failure::usage)
}

/// This invocation's certificate, loaded on first use; `None` without `--tls-ca`.
pub(crate) fn tls(cli: &Cli) -> Result<Option<std::sync::Arc<seqsvr_auth::Tls>>, Failure> {
    // Read once per invocation: `status` dials every replica, and each dial asks for it.
    static LOADED: std::sync::OnceLock<Result<Option<std::sync::Arc<seqsvr_auth::Tls>>, String>> =
        std::sync::OnceLock::new();
    let loaded = LOADED.get_or_init(|| {
        let tls = cli.tls.load(None).map_err(|e| e.to_string())?;
        Ok(tls.map(std::sync::Arc::new))
    });
    loaded.clone().map_err(Failure::usage)
}

/// How this invocation reaches StoreSvrs: with its certificate when `--tls-ca` is given.
pub(crate) fn dialer(cli: &Cli) -> Result<seqsvr_control::Dialer, Failure> {
    Ok(seqsvr_control::Dialer::with_tls(tls(cli)?))
}

/// A left-aligned text table with a header row.
pub(crate) fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        padded.join("  ").trim_end().to_owned()
    };
    let mut out = vec![line(header.to_vec())];
    out.extend(rows.iter().map(|r| line(r.iter().map(String::as_str).collect())));
    out.join("\n")
}
