//! `seqctl`: fetch and read seqs, inspect a StoreSvr set, and run operator actions.
//!
//! Human tables by default, `--json` for scripts. Exit codes are part of the interface (see
//! `--help`): an unknown outcome has its own code because a script must not retry a fetch that may
//! have taken effect as if it had not.
//!
//! Deliberately left out: authentication (anyone who reaches a StoreSvr may run these).

mod audit;
mod backup;
mod drain;
mod moves;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use seqsvr_client::{Client, ClientConfig, ClientError, CurSeq, FailureKind, Fetched, Owner};
use seqsvr_control::AdminClient;
use seqsvr_control::{ControlError, Seed, StoreClient, StoreTimeouts};
use seqsvr_proto::{NodeId, Uid, pb};
use serde_json::{Value, json};

/// Exit code of a failure that certainly did not take effect (unreachable, refused).
pub(crate) const EXIT_FAILED: u8 = 1;
/// Exit code of bad input: unparsable arguments, a uid outside the cluster's range.
pub(crate) const EXIT_USAGE: u8 = 2;
/// Exit code of an unknown outcome: the request may have taken effect (e.g. a timed-out fetch).
const EXIT_UNKNOWN: u8 = 3;

#[derive(Parser, Debug)]
#[command(
    name = "seqctl",
    version,
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
    /// Fetch the next seq of many uids in one batch (needs --alloc).
    Batch {
        #[arg(required = true)]
        uids: Vec<u64>,
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
            Some(FailureKind::Unavailable | FailureKind::Exhausted) => EXIT_FAILED,
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
    let cli: Cli = seqsvr_proto::cli::parse("SEQCTL");
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
        Cmd::Fetch { uid } => {
            let f = alloc_client(cli)?.fetch_next_seq(Uid(*uid)).await?;
            Ok(render_fetched(cli.json, &[f]))
        }
        Cmd::Get { uid } => {
            let c = alloc_client(cli)?.get_cur_seq(Uid(*uid)).await?;
            Ok(render_cur(cli.json, &c))
        }
        Cmd::Batch { uids } => {
            let uids: Vec<Uid> = uids.iter().map(|&u| Uid(u)).collect();
            let got = alloc_client(cli)?.batch_fetch(&uids).await?;
            Ok(render_fetched(cli.json, &got))
        }
        Cmd::Status => status(cli).await,
        Cmd::Routes => {
            let reply = store_client(cli, &store_seeds(cli)?)?.get_routes().await?;
            let table = reply.routes.ok_or_else(|| Failure {
                code: EXIT_FAILED,
                message: "the store has no route table yet".into(),
            })?;
            Ok(render_routes(cli.json, &table))
        }
        Cmd::Sets => moves::sets(cli).await,
        Cmd::Set { action } => moves::set(cli, action).await,
        Cmd::Move(args) => moves::moves(cli, args).await,
        Cmd::Alloc { action } => drain::alloc(cli, action).await,
        Cmd::Backup(args) => backup::backup(cli, args).await,
        Cmd::Audit(args) => audit::audit(cli, args).await,
        Cmd::Certs { out, hosts, days } => certs(cli.json, out, hosts, *days),
        Cmd::Replica { action } => {
            let admin =
                AdminClient::with_dialer(store_seeds(cli)?, timeouts(cli), &dialer(cli)?).map_err(Failure::usage)?;
            let reply = match action {
                ReplicaCmd::Add { id, addr } => {
                    Seed::parse(addr).map_err(Failure::usage)?;
                    if *id == 0 {
                        return Err(Failure::usage("node id must be > 0"));
                    }
                    admin.add_replica(NodeId(*id), addr).await.map_err(Failure::of_write)?
                }
                ReplicaCmd::Remove { id } => admin.remove_replica(NodeId(*id)).await.map_err(Failure::of_write)?,
            };
            Ok(render_membership(cli.json, &reply))
        }
    }
}

pub(crate) fn timeouts(cli: &Cli) -> StoreTimeouts {
    StoreTimeouts {
        attempt: Duration::from_millis(cli.attempt_timeout_ms),
        overall: Duration::from_millis(cli.timeout_ms),
    }
}

fn alloc_client(cli: &Cli) -> Result<Client, Failure> {
    let seeds: Vec<String> = cli
        .alloc
        .iter()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect();
    if seeds.is_empty() {
        return Err(Failure::usage(
            "no AllocSvr address: pass --alloc ADDR[,ADDR..] or set SEQCTL_ALLOC",
        ));
    }
    let cfg = ClientConfig {
        deadline: Duration::from_millis(cli.timeout_ms),
        attempt_timeout: Duration::from_millis(cli.attempt_timeout_ms),
        connect_timeout: Duration::from_millis(cli.attempt_timeout_ms.div_ceil(2)),
        tls: tls(cli)?,
        ..ClientConfig::new(seeds)
    };
    Ok(Client::new(cfg)?)
}

pub(crate) fn store_seeds(cli: &Cli) -> Result<Vec<Seed>, Failure> {
    let list = cli
        .store
        .as_deref()
        .ok_or_else(|| Failure::usage("no StoreSvr address: pass --store ADDR[,ADDR..] or set SEQCTL_STORE"))?;
    Seed::parse_list(list).map_err(Failure::usage)
}

fn store_client(cli: &Cli, seeds: &[Seed]) -> Result<StoreClient, Failure> {
    StoreClient::with_dialer(seeds.to_vec(), timeouts(cli), &dialer(cli)?).map_err(Failure::usage)
}

/// `seqctl certs`: a development CA and one certificate per role.
fn certs(json: bool, out: &std::path::Path, hosts: &[String], days: i64) -> Result<String, Failure> {
    if !(1..=3650).contains(&days) {
        return Err(Failure::usage("--days must be in 1..=3650"));
    }
    let (_, written) = seqsvr_auth::devca::write_local(out, hosts, days).map_err(|e| Failure {
        code: EXIT_FAILED,
        message: e,
    })?;
    let files: Vec<String> = written.iter().map(|p| p.display().to_string()).collect();
    if json {
        return Ok(json!({ "files": files, "hosts": hosts, "days": days }).to_string());
    }
    Ok(format!(
        "wrote a development CA and certificates for {} (valid {days} days):\n  {}",
        hosts.join(", "),
        files.join("\n  ")
    ))
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

/// The set's status from the leader (when it can be reached), plus each member's own view.
async fn status(cli: &Cli) -> Result<String, Failure> {
    let seeds = store_seeds(cli)?;
    let mut view = store_client(cli, &seeds)?.status().await?;
    if view.leader_id != 0 && view.leader_id != view.node_id && !view.leader_addr.is_empty() {
        // Liveness of AllocSvrs is known only on the leader: prefer its view.
        let addr = configured_addr(&seeds, view.leader_id, &view.leader_addr);
        if let Ok(leader_view) = single_status(cli, &addr).await {
            view = leader_view;
        }
    }
    let mut members = Vec::new();
    for m in &view.members {
        let addr = configured_addr(&seeds, m.node_id, &m.addr);
        let own = if m.node_id == view.node_id {
            Ok(view.clone())
        } else {
            single_status(cli, &addr).await
        };
        members.push((m.clone(), addr, own));
    }
    Ok(render_status(cli.json, &view, &members))
}

/// The address the operator gave for `node_id`, else the one the cluster reports.
fn configured_addr(seeds: &[Seed], node_id: u64, reported: &str) -> String {
    seeds
        .iter()
        .find(|s| s.node_id == Some(NodeId(node_id)))
        .map_or_else(|| reported.to_owned(), |s| s.addr.clone())
}

/// One replica's own status (no hint following: Status is answered by any replica).
async fn single_status(cli: &Cli, addr: &str) -> Result<pb::StatusReply, String> {
    let seed = Seed::parse(addr)?;
    let short = StoreTimeouts {
        attempt: Duration::from_millis(cli.attempt_timeout_ms),
        overall: Duration::from_millis(cli.attempt_timeout_ms),
    };
    let dialer = dialer(cli).map_err(|f| f.message)?;
    let client = StoreClient::with_dialer(vec![seed], short, &dialer)?;
    client.status().await.map_err(|e| e.to_string())
}

fn owner_json(o: &Option<Owner>) -> Value {
    match o {
        Some(o) => json!({
            "section": o.section.0, "node_id": o.node_id.0, "incarnation": o.incarnation.0, "epoch": o.epoch.0,
        }),
        None => Value::Null,
    }
}

fn owner_cells(o: &Option<Owner>) -> [String; 4] {
    match o {
        Some(o) => [o.section.0, o.node_id.0, o.incarnation.0, o.epoch.0].map(|v| v.to_string()),
        None => ["-", "-", "-", "-"].map(String::from),
    }
}

fn render_fetched(as_json: bool, got: &[Fetched]) -> String {
    if as_json {
        let rows: Vec<Value> = got
            .iter()
            .map(|f| json!({"uid": f.uid.0, "seq": f.seq, "owner": owner_json(&f.owner)}))
            .collect();
        return if rows.len() == 1 {
            rows[0].to_string()
        } else {
            Value::Array(rows).to_string()
        };
    }
    let rows = got
        .iter()
        .map(|f| {
            let [s, n, i, e] = owner_cells(&f.owner);
            vec![f.uid.0.to_string(), f.seq.to_string(), s, n, i, e]
        })
        .collect();
    table(&["UID", "SEQ", "SECTION", "NODE", "INCARNATION", "EPOCH"], rows)
}

fn render_cur(as_json: bool, c: &CurSeq) -> String {
    if as_json {
        return json!({"uid": c.uid.0, "cur_seq": c.cur_seq, "owner": owner_json(&c.owner)}).to_string();
    }
    let [s, n, i, e] = owner_cells(&c.owner);
    table(
        &["UID", "CUR_SEQ", "SECTION", "NODE", "INCARNATION", "EPOCH"],
        vec![vec![c.uid.0.to_string(), c.cur_seq.to_string(), s, n, i, e]],
    )
}

fn render_routes(as_json: bool, t: &pb::RouteTable) -> String {
    if as_json {
        let entries: Vec<Value> = t
            .entries
            .iter()
            .map(|e| {
                json!({
                    "set_id": e.set_id, "section_begin": e.section_begin, "section_end": e.section_end,
                    "node_id": e.node_id, "incarnation": e.incarnation, "addr": e.addr,
                })
            })
            .collect();
        return json!({
            "version": t.version, "section_size": t.section_size, "uid_limit": t.uid_limit, "entries": entries,
        })
        .to_string();
    }
    let rows = t
        .entries
        .iter()
        .map(|e| {
            let uid_end = e.section_end.saturating_mul(t.section_size).min(t.uid_limit);
            vec![
                e.set_id.to_string(),
                format!("[{}, {})", e.section_begin, e.section_end),
                format!("[{}, {})", e.section_begin.saturating_mul(t.section_size), uid_end),
                e.node_id.to_string(),
                e.incarnation.to_string(),
                if e.addr.is_empty() {
                    "(unowned)".into()
                } else {
                    e.addr.clone()
                },
            ]
        })
        .collect();
    format!(
        "route version {}, section_size {}, uid_limit {}\n{}",
        t.version,
        t.section_size,
        t.uid_limit,
        table(&["SET", "SECTIONS", "UIDS", "NODE", "INCARNATION", "ADDR"], rows)
    )
}

type MemberView = (pb::ReplicaInfo, String, Result<pb::StatusReply, String>);

fn render_status(as_json: bool, v: &pb::StatusReply, members: &[MemberView]) -> String {
    if as_json {
        status_json(v, members).to_string()
    } else {
        status_tables(v, members)
    }
}

fn member_json((m, addr, own): &MemberView) -> Value {
    let mut o = json!({"node_id": m.node_id, "addr": addr, "voter": m.voter});
    match own {
        Ok(s) => {
            o["view"] = json!({
                "leader_id": s.leader_id, "term": s.term, "committed_index": s.committed_index,
                "applied_index": s.applied_index, "last_log_index": s.last_log_index,
                "route_version": s.route_version,
            })
        }
        Err(e) => o["error"] = json!(e),
    }
    o
}

fn status_json(v: &pb::StatusReply, members: &[MemberView]) -> Value {
    let params = v.params.unwrap_or_default();
    let members: Vec<Value> = members.iter().map(member_json).collect();
    let allocsvrs: Vec<Value> = v
        .allocsvrs
        .iter()
        .map(|a| {
            json!({
                "node_id": a.node_id, "incarnation": a.incarnation, "addr": a.addr, "alive": a.alive,
                "last_renew_ms_ago": a.last_renew_ms_ago, "sections_owned": a.sections_owned,
            })
        })
        .collect();
    json!({
        "answered_by": v.node_id, "set_id": v.set_id, "leader_id": v.leader_id, "leader_addr": v.leader_addr,
        "term": v.term, "committed_index": v.committed_index, "applied_index": v.applied_index,
        "last_log_index": v.last_log_index, "route_version": v.route_version,
        "sections_total": v.sections_total, "sections_owned": v.sections_owned,
        "max_seq_high": v.max_seq_high, "max_seq_sum": v.max_seq_sum,
        "params": {
            "section_size": params.section_size, "uid_limit": params.uid_limit, "step": params.step,
            "lease_ms": params.lease_ms, "renew_interval_ms": params.renew_interval_ms,
        },
        "members": members, "allocsvrs": allocsvrs,
    })
}

fn member_row((m, addr, own): &MemberView) -> Vec<String> {
    let mut row = vec![m.node_id.to_string(), addr.clone(), yes_no(m.voter).into()];
    match own {
        Ok(s) => row.extend([
            if s.leader_id == m.node_id { "leader" } else { "follower" }.into(),
            s.term.to_string(),
            s.committed_index.to_string(),
            s.applied_index.to_string(),
            s.last_log_index.to_string(),
        ]),
        Err(e) => {
            row.push(format!("unreachable: {e}"));
            row.extend(std::iter::repeat_n("-".to_string(), 4));
        }
    }
    row
}

fn status_tables(v: &pb::StatusReply, members: &[MemberView]) -> String {
    let params = v.params.unwrap_or_default();
    let member_rows = members.iter().map(member_row).collect();
    let alloc_rows = v
        .allocsvrs
        .iter()
        .map(|a| {
            vec![
                a.node_id.to_string(),
                a.incarnation.to_string(),
                a.addr.clone(),
                yes_no(a.alive).into(),
                a.last_renew_ms_ago.to_string(),
                a.sections_owned.to_string(),
            ]
        })
        .collect();
    let leader_addr = if v.leader_addr.is_empty() {
        "unknown"
    } else {
        &v.leader_addr
    };
    let members_header = [
        "STORESVR",
        "ADDR",
        "VOTER",
        "ROLE",
        "TERM",
        "COMMITTED",
        "APPLIED",
        "LAST_LOG",
    ];
    let allocs_header = ["ALLOCSVR", "INCARNATION", "ADDR", "ALIVE", "LAST_RENEW_MS", "SECTIONS"];
    format!(
        "set {}: leader {} ({leader_addr}), term {}, committed {}, applied {}, route version {} (answered by node {})\n\
         sections {} owned of {}; max_seq high {}, sum {}; step {}, lease {} ms\n\n{}\n\n{}",
        v.set_id,
        v.leader_id,
        v.term,
        v.committed_index,
        v.applied_index,
        v.route_version,
        v.node_id,
        v.sections_owned,
        v.sections_total,
        v.max_seq_high,
        v.max_seq_sum,
        params.step,
        params.lease_ms,
        table(&members_header, member_rows),
        table(&allocs_header, alloc_rows),
    )
}

fn render_membership(as_json: bool, r: &pb::MembershipReply) -> String {
    if as_json {
        return json!({"voters": r.voters, "learners": r.learners, "log_index": r.log_index}).to_string();
    }
    let list = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    format!(
        "voters {} learners {} (log index {})",
        list(&r.voters),
        if r.learners.is_empty() {
            "-".into()
        } else {
            list(&r.learners)
        },
        r.log_index
    )
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
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
