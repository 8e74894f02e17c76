//! `storesvr restore`: builds the data dir of a NEW set's first replica from a backup file.
//!
//! Steps: read and check the file (`backup::read`), choose the margin from what the operator
//! states (`domain::restore::choose_margin`), raise every ceiling and clear every owner
//! (`domain::restore::restore`, which says why), then write a data dir that holds that state as
//! its only snapshot, with a one-voter membership of this replica. The replica then starts like
//! any restarted one (no `--bootstrap`, no `--new-replica`), elects itself, and the operator adds
//! the other replicas under new ids with `seqctl replica add`: they catch up by snapshot, so
//! every replica holds the same restored state by construction. Restoring each replica's dir
//! separately would let two replicas be restored with different margins and disagree.
//!
//! The dir is built beside its final path (`<data-dir>.restoring`) and renamed into place, then
//! the parent directory is synced: a crash leaves either no data dir or a whole one.
//!
//! Options are flags only (no `STORESVR_*` variables, no config file): a restore is a one-off
//! command, and a replica's environment must not supply its data dir or node id by accident.
//!
//! Left out: restoring into a running group (the new set is always a new group), and choosing
//! the margin for the operator (only they know how the old set was used after the backup).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use openraft::{BasicNode, CommittedLeaderId, LogId, Membership, RaftSnapshotBuilder, StoredMembership};
use seqsvr_proto::addr::HostPort;
use seqsvr_proto::backup::Header;
use seqsvr_proto::limits::MAX_BACKUP_BYTES;
use seqsvr_proto::{NodeId, SectionId};

use crate::backup;
use crate::domain::ranges::{RangeRun, RangeState};
use crate::domain::restore::{
    LiveMap, LiveMove, Margin, MarginArgs, Raised, RestoreAt, check_against_map, choose_margin, restore,
};
use crate::startup::claim_data_dir;
use crate::storage::kv::{FileKv, KvStore};
use crate::storage::sm_store::{SmData, StateMachineStore};
use seqsvr_control::{AdminClient, Seed, StoreTimeouts};
use seqsvr_proto::pb;
use seqsvr_rpc::Dialer;

/// `storesvr restore`: a new set's first replica from a backup, every ceiling raised by a margin.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "storesvr restore",
    args_override_self = true,
    about = "Build the data dir of a new set's first replica from a backup file, every section's max_seq \
             raised by a margin (docs/BACKUP.md)"
)]
pub struct RestoreArgs {
    /// The backup file (`seqctl backup --out FILE`).
    #[arg(long, value_name = "FILE")]
    pub backup: PathBuf,
    /// The new replica's data dir: must not exist, or be empty.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// The new replica's node id: never one the backed-up set used.
    #[arg(long)]
    pub node_id: u64,
    /// The address the new replica will listen on (its --listen), host:port, as peers reach it.
    #[arg(long)]
    pub addr: HostPort,
    /// Raise every section's max_seq by this many steps: at least how far any section's ceiling
    /// can have grown since the backup was taken.
    #[arg(long)]
    pub margin_steps: Option<u64>,
    /// Derive the margin from the backup's age instead: at most this many bumps per second of one
    /// section since the backup (each bump at most 4 steps). With --margin-steps too, the larger wins.
    #[arg(long)]
    pub max_bumps_per_sec: Option<u64>,
    /// StoreSvrs (ID=ADDR or ADDR, comma-separated) of a live set that holds the cluster map: set
    /// 0, or any other set (its published copy). The backup is checked against it: a range whose
    /// owner changed since the backup is refused, naming the move.
    #[arg(long, value_delimiter = ',', value_name = "ADDRS")]
    pub map_from: Vec<String>,
    /// Restore without checking the backup against a live cluster map: only for a cluster with no
    /// other set left to ask (a single-set cluster), after checking `seqctl move list` by hand.
    #[arg(long)]
    pub skip_map_check: bool,
    /// Print what would be raised and write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Mutual TLS for `--map-from` (an `admin` certificate).
    #[command(flatten)]
    pub tls: seqsvr_auth::TlsArgs,
}

/// Why a restore stopped before writing a data dir.
#[derive(Debug, thiserror::Error)]
pub enum RestoreFailure {
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}: {source}")]
    Backup { path: String, source: backup::BackupError },
    #[error("{0}")]
    Refused(#[from] crate::domain::restore::RestoreError),
    #[error("data dir {0}: {1}")]
    DataDir(String, String),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> RestoreFailure + '_ {
    move |source| RestoreFailure::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Runs `storesvr restore` over `args` (the first is the program name); the exit code.
pub fn main(args: Vec<std::ffi::OsString>) -> ExitCode {
    let args = match RestoreArgs::try_parse_from(args) {
        Ok(a) => a,
        Err(e) => e.exit(),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("storesvr restore: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&args)) {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("storesvr restore: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Reads the backup, raises it and (unless `--dry-run`) writes the data dir; the report.
pub async fn run(args: &RestoreArgs) -> Result<String, RestoreFailure> {
    if args.node_id == 0 {
        return Err(RestoreFailure::DataDir(
            args.data_dir.display().to_string(),
            "--node-id must be > 0".into(),
        ));
    }
    let file = read_bounded(&args.backup)?;
    let (header, set) = backup::read(&file).map_err(|source| RestoreFailure::Backup {
        path: args.backup.display().to_string(),
        source,
    })?;
    let restored_set = set.params.as_ref().map_or(0, |p| p.set_id);
    let live_ids = match live_map(args, restored_set).await? {
        Some(live) => {
            check_against_map(&set, &live)?;
            live.ids
        }
        None => {
            tracing::warn!("--skip-map-check: the backup is not checked against the cluster map");
            None
        }
    };
    let step = set.params.as_ref().map_or(0, |p| p.step);
    let margin_args = MarginArgs {
        steps: args.margin_steps,
        max_bumps_per_sec: args.max_bumps_per_sec,
    };
    let margin = choose_margin(step, margin_args, age_of(&header))?;
    let at = RestoreAt {
        now_ms: crate::config::unix_now_ms(),
        taken_at_ms: header.taken_at_unix_ms,
        live_ids,
    };
    let (restored, raised) = restore(&set, margin.seqs, NodeId(args.node_id), &at)?;
    let unchecked_ids = args.map_from.is_empty() && set.ids.is_none();
    let report = report(args, &header, &margin, &raised, unchecked_ids);
    if args.dry_run {
        return Ok(format!("DRY RUN, nothing written\n{report}"));
    }
    let data = initial_data(restored, args);
    write_data_dir(args, data).await?;
    Ok(report)
}

/// The live cluster map from `--map-from` with the range states of every set but `restored`
/// (the one asked, then each other set the map lists), or `None` with `--skip-map-check`.
async fn live_map(args: &RestoreArgs, restored: u64) -> Result<Option<LiveMap>, RestoreFailure> {
    let refuse = |m: String| RestoreFailure::DataDir(args.data_dir.display().to_string(), m);
    if args.map_from.is_empty() {
        return if args.skip_map_check {
            Ok(None)
        } else {
            Err(refuse(
                "give --map-from with the StoreSvrs of set 0 (or of any live set) so that the backup is checked \
                 against the cluster map, or --skip-map-check when no set is left to ask"
                    .into(),
            ))
        };
    }
    let tls = args.tls.load(None).map_err(|e| refuse(e.to_string()))?.map(Arc::new);
    let dialer = &Dialer::with_tls(tls);
    let ask = |addrs: &[String]| {
        let seeds = addrs.iter().map(|a| Seed::parse(a)).collect::<Result<Vec<_>, _>>();
        let timeouts = StoreTimeouts {
            attempt: Duration::from_secs(2),
            overall: Duration::from_secs(10),
        };
        async move {
            let admin = AdminClient::with_dialer(seeds?, timeouts, dialer)?;
            admin.cluster_map_reply().await.map_err(|e| e.to_string())
        }
    };
    let first = ask(&args.map_from)
        .await
        .map_err(|e| refuse(format!("cannot read the cluster map from --map-from: {e}")))?;
    let mut live = live_map_of(&first);
    for (other, stores) in others_to_ask(&first, restored) {
        let reply = ask(&stores).await.map_err(|e| {
            refuse(format!(
                "cannot read set {other}'s range states from its StoreSvrs {}: {e}; every live set is asked, \
                 so that a range one of them serves now is not restored here as well (--skip-map-check \
                 skips the whole check)",
                stores.join(",")
            ))
        })?;
        live.held.extend(live_map_of(&reply).held);
    }
    Ok(Some(live))
}

/// The sets the map lists besides the restored one and the one that answered, with their
/// StoreSvrs: each is asked for its own range states too.
fn others_to_ask(first: &pb::ClusterMapReply, restored: u64) -> Vec<(u64, Vec<String>)> {
    let sets = first.map.as_ref().map_or(&[][..], |m| &m.sets[..]);
    sets.iter()
        .filter(|s| s.set_id != restored && s.set_id != first.set_id && !s.stores.is_empty())
        .map(|s| (s.set_id, s.stores.clone()))
        .collect()
}

/// What [`check_against_map`] needs of a GetClusterMap reply from a live set: the map and the
/// set's own range states (the deterministic simulator reads it over its own transport and
/// converts it here too).
pub fn live_map_of(reply: &pb::ClusterMapReply) -> LiveMap {
    let map = reply.map.clone().unwrap_or_default();
    LiveMap {
        ranges: map
            .ranges
            .iter()
            .map(|r| (r.section_begin, r.section_end, r.set_id))
            .collect(),
        moves: map
            .moves
            .iter()
            .filter_map(|m| {
                let s = m.sections?;
                let phase = pb::MovePhase::try_from(m.phase).map_or("unknown", |p| p.as_str_name());
                Some(LiveMove {
                    op: m.op,
                    from: m.from_set,
                    to: m.to_set,
                    begin: s.begin,
                    end: s.end,
                    phase: phase.trim_start_matches("MOVE_PHASE_").to_lowercase(),
                })
            })
            .collect(),
        held: reply
            .held
            .iter()
            .filter_map(|h| Some((reply.set_id, held_run(h)?)))
            .collect(),
        ids: map.ids.as_ref().and_then(crate::domain::slots::setup_from_pb),
    }
}

/// One reported range state; `None` for a state this build does not know (a newer server's),
/// which the check then does not see: the map's own check still applies to it.
fn held_run(h: &pb::HeldRange) -> Option<RangeRun> {
    let s = h.sections?;
    let state = match pb::HeldState::try_from(h.state).ok()? {
        pb::HeldState::Owned => RangeState::Owned,
        pb::HeldState::Importing => RangeState::Importing { op: h.op },
        pb::HeldState::Frozen => RangeState::Migrating {
            op: h.op,
            to_set: h.to_set,
        },
        pb::HeldState::Tombstoned => RangeState::Tombstoned {
            op: h.op,
            to_set: h.to_set,
            map_version: 0,
        },
        pb::HeldState::Unspecified => return None,
    };
    Some(RangeRun {
        begin: SectionId(s.begin),
        end: SectionId(s.end),
        state,
    })
}

/// The whole file, refusing one above the limit before reading it.
fn read_bounded(path: &Path) -> Result<Vec<u8>, RestoreFailure> {
    let len = std::fs::metadata(path).map_err(io_err(path))?.len();
    if len > MAX_BACKUP_BYTES as u64 {
        return Err(RestoreFailure::Backup {
            path: path.display().to_string(),
            source: seqsvr_proto::backup::BackupFileError::TooLarge(len as usize).into(),
        });
    }
    std::fs::read(path).map_err(io_err(path))
}

/// The backup's age by this machine's clock, or how far in the future it claims to be (ms).
fn age_of(header: &Header) -> Result<Duration, u64> {
    let now_ms = crate::config::unix_now_ms();
    now_ms
        .checked_sub(header.taken_at_unix_ms)
        .map(Duration::from_millis)
        .ok_or_else(|| header.taken_at_unix_ms - now_ms)
}

/// The restored state as the new replica's applied state: applied at index 1 of term 0 (before
/// any election of the new group), with this replica as the only voter.
fn initial_data(set: crate::domain::state::SetState, args: &RestoreArgs) -> SmData {
    let log_id = LogId::new(CommittedLeaderId::new(0, args.node_id), 1);
    let voters = [args.node_id].into_iter().collect();
    let nodes = [(args.node_id, BasicNode::new(args.addr.to_string()))]
        .into_iter()
        .collect::<std::collections::BTreeMap<_, _>>();
    SmData {
        last_applied: Some(log_id),
        membership: StoredMembership::new(Some(log_id), Membership::new(vec![voters], nodes)),
        set,
    }
}

/// Builds the data dir beside its final path and renames it into place.
async fn write_data_dir(args: &RestoreArgs, data: SmData) -> Result<(), RestoreFailure> {
    let dir = &args.data_dir;
    let shown = dir.display().to_string();
    if let Ok(mut entries) = std::fs::read_dir(dir) {
        if entries.next().is_some() {
            return Err(RestoreFailure::DataDir(
                shown,
                "is not empty: a restore builds a new replica; give it an empty or new directory".into(),
            ));
        }
        std::fs::remove_dir(dir).map_err(io_err(dir))?;
    }
    let mut building = dir.as_os_str().to_owned();
    building.push(".restoring");
    let building = PathBuf::from(building);
    if building.exists() {
        std::fs::remove_dir_all(&building).map_err(io_err(&building))?;
    }
    claim_data_dir(&building, args.node_id, true).map_err(|e| RestoreFailure::DataDir(shown.clone(), e.to_string()))?;
    // A new group id: a replica of the old group restarted onto the same address later is a
    // stranger to this group, and its older ceilings never take part in its elections.
    crate::raft::identity::write_new_group(&building).map_err(io_err(&building))?;
    let kv: Arc<dyn KvStore> = Arc::new(FileKv::open(&building.join("meta")).map_err(io_err(&building))?);
    let mut sm = StateMachineStore::open(kv, Default::default())
        .map_err(|e| RestoreFailure::DataDir(shown.clone(), e.to_string()))?;
    *sm.shared().write().expect("state lock poisoned") = data;
    sm.build_snapshot()
        .await
        .map_err(|e| RestoreFailure::DataDir(shown.clone(), e.to_string()))?;
    drop(sm);
    std::fs::rename(&building, dir).map_err(io_err(dir))?;
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::File::open(parent)
        .and_then(|f| f.sync_all())
        .map_err(io_err(parent))
}

/// What the restore did to the set's ledgers, if it has any.
fn ledger_line(r: &Raised) -> Option<String> {
    (r.ledgers_restored > 0).then(|| {
        format!(
            "ledgers: {} marked restored; their reserves are refused until `seqctl ledger reconcile KEY --next N` \
             with N above every number your own records show (the numbers between are voided as lost with the restore)",
            r.ledgers_restored
        )
    })
}

fn report(args: &RestoreArgs, h: &Header, m: &Margin, r: &Raised, unchecked_ids: bool) -> String {
    let age = age_of(h).map_or_else(
        |ahead| format!("{ahead} ms in the future"),
        |a| format!("{:.1} s ago", a.as_secs_f64()),
    );
    let mut lines = vec![
        format!(
            "backup {}: set {}, log index {} (term {}), taken at {} ms since the Unix epoch ({age})",
            args.backup.display(),
            h.set_id,
            h.log_index,
            h.log_term,
            h.taken_at_unix_ms
        ),
        format!("margin: {} seqs ({})", m.seqs, m.why),
        format!(
            "raised every one of {} sections by {}: max_seq {}..={} -> {}..={}",
            r.sections, r.margin, r.max_seq_before.0, r.max_seq_before.1, r.max_seq_after.0, r.max_seq_after.1
        ),
        format!(
            "owners cleared: {} sections (every epoch +1; the first new owners wait out a lease); AllocSvr \
             registrations forgotten: {}",
            r.owners_cleared, r.allocsvrs_forgotten
        ),
        format!(
            "route version {} -> {}; incarnation counter {} -> {}",
            r.route_version.0, r.route_version.1, r.last_incarnation.0, r.last_incarnation.1
        ),
    ];
    lines.extend(ledger_line(r));
    if r.ids_adopted {
        lines.push("time-ordered ids: the backup predates the set's id setup; it takes the live map's setup".into());
    }
    if let Some(tick) = r.slot_marks_at_least {
        lines.push(format!(
            "time-ordered ids: every slot mark raised to at least tick {tick} (the latest of this clock and \
             the backup's highest mark, each moved on by the backup's age, plus twice the set's allowance); \
             holders cleared"
        ));
    }
    if unchecked_ids {
        lines.push(
            "WARNING: the backup has no time-ordered id setup and --skip-map-check left the live one unread: if \
             the lost set set its ids up after the backup, restore with --map-from so that the restored set \
             takes that setup and raises its marks (set 0 would otherwise set up again from its own flags and \
             issue from mark 0)"
                .into(),
        );
    }
    if r.margin == 0 {
        lines.push(
            "WARNING: margin 0: safe only if the backed-up set committed no bump after the backup; otherwise \
             numbers already served will be served again"
                .into(),
        );
    }
    lines.push(format!(
        "data dir {} for node {} at {}: start it with `storesvr --node-id {} --listen {} --data-dir {} --set-id {}` \
         (no --bootstrap, no --new-replica), then add replicas under new ids with `seqctl replica add`",
        args.data_dir.display(),
        args.node_id,
        args.addr,
        args.node_id,
        args.addr,
        args.data_dir.display(),
        h.set_id
    ));
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_set_but_the_restored_one_and_the_one_that_answered_is_asked() {
        let set = |id: u64, stores: &[&str]| pb::SetInfo {
            set_id: id,
            stores: stores.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        let reply = pb::ClusterMapReply {
            set_id: 1,
            map: Some(pb::ClusterMap {
                sets: vec![set(0, &["a:1"]), set(1, &["b:1"]), set(2, &["c:1", "c:2"]), set(3, &[])],
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            others_to_ask(&reply, 0),
            vec![(2, vec!["c:1".to_string(), "c:2".to_string()])]
        );
        assert_eq!(
            others_to_ask(&reply, 2).iter().map(|o| o.0).collect::<Vec<_>>(),
            vec![0]
        );
    }
}
