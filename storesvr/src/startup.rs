//! What a replica checks before it opens anything: that the data dir is its own (or, with
//! `--new-replica`, empty), that it is not from the sled era, and that `--bootstrap` does not found a
//! second group over one that exists — with the errors that say what to do instead.
//!
//! A data dir belongs to one node id for good: a copied directory must not come back under another
//! identity, and a wiped one must not come back under its old one (it would have lost its vote and
//! log, could vote a lagging replica leader, and committed bumps would be lost).
//!
//! Limitation: the bootstrap check only sees peers that answer within a second; if every other
//! member is down at that moment a second group can still be founded. `--new-replica` is the guard
//! that does not depend on the network.

use seqsvr_auth::Tls;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use seqsvr_proto::pb;

use crate::config::Config;
use crate::storage::dirs::create_dir_synced;

/// Why a replica could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Tls(#[from] seqsvr_auth::TlsError),
    #[error("data dir {dir}: {source}")]
    DataDir { dir: String, source: std::io::Error },
    #[error("data dir {dir} belongs to node {found}, not {wanted}: node ids are never reused")]
    WrongNode { dir: String, found: String, wanted: u64 },
    #[error(
        "data dir {dir} is empty (no NODE_ID marker) and --new-replica was not given. If replica {node_id}'s \
         data was lost, do not restart it under id {node_id}: ids are never reused. Bring the replica back \
         under a NEW node id: start it with --new-replica --node-id=<new id> on an empty dir, then run \
         `seqctl replica add <new id> <addr>` (and `seqctl replica remove {node_id}`). Give --new-replica only \
         to an initial member of a brand-new group or to a replica being added under a never-used id."
    )]
    EmptyDataDir { dir: String, node_id: u64 },
    #[error(
        "--new-replica given, but data dir {dir} already holds node {node_id}'s data: drop --new-replica \
         (it is only for a replica's first start)"
    )]
    NotNew { dir: String, node_id: u64 },
    #[error(
        "--new-replica given, but data dir {dir} is not empty and has no NODE_ID marker (found {leftovers:?}): \
         give a new replica an empty directory"
    )]
    Unclaimed { dir: String, leftovers: Vec<String> },
    #[error(
        "--bootstrap refused: peer {peer} at {addr} already has an initialized group ({why}). A group is \
         bootstrapped once; to bring back a replica whose data was lost, start it under a NEW node id with \
         --new-replica (no --bootstrap) and run `seqctl replica add`"
    )]
    BootstrapOverGroup { peer: u64, addr: String, why: String },
    #[error(
        "data dir {dir} is from an earlier storesvr that kept the vote, commit index and snapshots in a \
         sled database (raft/db); this version no longer reads it (sled 0.34 could fail to open it after a \
         SIGKILL). Leave it as it is, and bring this replica back under a new node id: start it with \
         --new-replica on an empty data dir, then `seqctl replica add <new id> <addr>` and \
         `seqctl replica remove <old id>`"
    )]
    SledEra { dir: String },
    #[error(
        "data dir {dir} holds data format {found}; this storesvr reads format {DATA_FORMAT} only (format 2 \
         added range states and the cluster map to the log and snapshots, which format 1 cannot be read as). \
         Leave the dir as it is and run the build that wrote it, or bring up a new group on empty dirs"
    )]
    OldFormat { dir: String, found: String },
    #[error("storage: {0}")]
    Storage(String),
    #[error("raft: {0}")]
    Raft(String),
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
}

/// The layout of the log entries and snapshots this build writes, recorded in `FORMAT` when a
/// data dir is claimed. A dir without it (format 1) or with another number is refused: its
/// entries would be decoded as something they are not.
pub const DATA_FORMAT: u32 = 2;

/// Refuses a claimed data dir written in another data format.
fn check_format(dir: &Path) -> Result<(), StartError> {
    let found = match std::fs::read_to_string(dir.join("FORMAT")) {
        Ok(s) => s.trim().to_string(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "1".to_string(),
        Err(source) => {
            return Err(StartError::DataDir {
                dir: dir.display().to_string(),
                source,
            });
        }
    };
    if found == DATA_FORMAT.to_string() {
        return Ok(());
    }
    Err(StartError::OldFormat {
        dir: dir.display().to_string(),
        found,
    })
}

/// Claims `dir` for `node_id`, or refuses it.
///
/// A data dir without a `NODE_ID` marker is accepted only with `--new-replica`: a replica whose
/// disk was lost would otherwise rejoin under its old id with no vote and no log, could vote a
/// lagging replica leader, and committed bumps would be lost (P3, then P1).
pub fn claim_data_dir(dir: &Path, node_id: u64, new_replica: bool) -> Result<(), StartError> {
    let shown = dir.display().to_string();
    let io = |source| StartError::DataDir {
        dir: dir.display().to_string(),
        source,
    };
    let marker = dir.join("NODE_ID");
    match std::fs::read_to_string(&marker) {
        Ok(found) if found.trim() == node_id.to_string() => {
            if new_replica {
                return Err(StartError::NotNew { dir: shown, node_id });
            }
            check_format(dir)
        }
        Ok(found) => Err(StartError::WrongNode {
            dir: shown,
            found: found.trim().into(),
            wanted: node_id,
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if !new_replica {
                return Err(StartError::EmptyDataDir { dir: shown, node_id });
            }
            // Its name must survive a power loss, like the files in it.
            create_dir_synced(dir).map_err(io)?;
            let leftovers: Vec<String> = std::fs::read_dir(dir)
                .map_err(io)?
                .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect();
            if !leftovers.is_empty() {
                return Err(StartError::Unclaimed { dir: shown, leftovers });
            }
            // FORMAT first: a dir with NODE_ID is a claimed one, and must say its format.
            let format = dir.join("FORMAT");
            std::fs::write(&format, format!("{DATA_FORMAT}\n")).map_err(io)?;
            std::fs::File::open(&format).and_then(|f| f.sync_all()).map_err(io)?;
            std::fs::write(&marker, format!("{node_id}\n")).map_err(io)?;
            std::fs::File::open(&marker).and_then(|f| f.sync_all()).map_err(io)?;
            // The marker's directory entry must be durable too.
            std::fs::File::open(dir).and_then(|f| f.sync_all()).map_err(io)
        }
        Err(e) => Err(io(e)),
    }
}

/// Refuses a data dir whose Raft metadata is in a sled database (`raft/db`, before key files).
pub fn refuse_sled_era(dir: &Path) -> Result<(), StartError> {
    let db = dir.join("raft").join("db");
    if db.exists() {
        return Err(StartError::SledEra {
            dir: dir.display().to_string(),
        });
    }
    Ok(())
}

/// How long `--bootstrap` waits for each peer's answer to "do you hold a group?".
const BOOTSTRAP_PROBE: Duration = Duration::from_millis(1_000);

/// Refuses `--bootstrap` when a reachable peer already holds an initialized group.
///
/// Peers that do not answer within [`BOOTSTRAP_PROBE`] are skipped (logged): this check catches
/// the common mistake (re-founding a group that is running), not one whose other members are all
/// down at that moment.
pub async fn refuse_bootstrap_over_a_group(config: &Config, tls: Option<&Tls>) -> Result<(), StartError> {
    let dial = config.dial_map();
    let peers = config.peer_map();
    for (id, addr) in peers.into_iter().filter(|(id, _)| *id != config.node_id) {
        let addr = dial.get(&id).cloned().unwrap_or(addr);
        match probe_peer(&addr, tls).await {
            PeerGroup::Initialized(why) => {
                return Err(StartError::BootstrapOverGroup { peer: id, addr, why });
            }
            PeerGroup::Empty => tracing::info!(peer = id, %addr, "--bootstrap: peer holds no group"),
            PeerGroup::Unknown(e) => {
                tracing::warn!(peer = id, %addr, error = %e, "--bootstrap: peer did not answer; cannot tell whether it holds a group")
            }
        }
    }
    Ok(())
}

enum PeerGroup {
    Initialized(String),
    Empty,
    Unknown(String),
}

async fn probe_peer(addr: &str, tls: Option<&Tls>) -> PeerGroup {
    let endpoint = match seqsvr_auth::endpoint(addr, tls) {
        Ok(e) => e.connect_timeout(BOOTSTRAP_PROBE).timeout(BOOTSTRAP_PROBE),
        Err(e) => return PeerGroup::Unknown(e.to_string()),
    };
    let channel = match tokio::time::timeout(BOOTSTRAP_PROBE, endpoint.connect()).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return PeerGroup::Unknown(e.to_string()),
        Err(_) => return PeerGroup::Unknown("connect timed out".into()),
    };
    let mut client = pb::store_service_client::StoreServiceClient::new(channel)
        .max_decoding_message_size(seqsvr_proto::limits::STORE_MESSAGE_BYTES)
        .max_encoding_message_size(seqsvr_proto::limits::STORE_MESSAGE_BYTES);
    let mut req = tonic::Request::new(pb::StatusRequest {});
    req.set_timeout(BOOTSTRAP_PROBE);
    match client.status(req).await {
        Ok(r) => {
            let r = r.into_inner();
            if !r.members.is_empty() || r.last_log_index > 0 || r.term > 0 {
                PeerGroup::Initialized(format!(
                    "term {}, last log index {}, {} members",
                    r.term,
                    r.last_log_index,
                    r.members.len()
                ))
            } else {
                PeerGroup::Empty
            }
        }
        // A replica that is replaying its committed log after a restart holds a group.
        Err(s) if s.code() == tonic::Code::Unavailable && s.message().contains("restoring") => {
            PeerGroup::Initialized(s.message().to_string())
        }
        Err(s) => PeerGroup::Unknown(s.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_dir_is_claimed_only_by_a_new_replica_and_only_once() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("d");
        assert!(matches!(
            claim_data_dir(&dir, 2, false),
            Err(StartError::EmptyDataDir { .. })
        ));
        assert!(!dir.exists(), "a refused start created the dir");
        claim_data_dir(&dir, 2, true).unwrap();
        claim_data_dir(&dir, 2, false).unwrap(); // a restart
        std::fs::remove_file(dir.join("FORMAT")).unwrap();
        assert!(
            matches!(claim_data_dir(&dir, 2, false), Err(StartError::OldFormat { found, .. }) if found == "1"),
            "a dir written before FORMAT existed is format 1 and refused"
        );
        std::fs::write(dir.join("FORMAT"), format!("{DATA_FORMAT}\n")).unwrap();
        assert!(matches!(claim_data_dir(&dir, 2, true), Err(StartError::NotNew { .. })));
        assert!(matches!(
            claim_data_dir(&dir, 3, false),
            Err(StartError::WrongNode { .. })
        ));
        let other = tmp.path().join("e");
        std::fs::create_dir_all(other.join("raft")).unwrap();
        assert!(matches!(
            claim_data_dir(&other, 4, true),
            Err(StartError::Unclaimed { .. })
        ));
    }
}
