//! Wiring of one StoreSvr replica: storage, Raft, the writer, the arbiter
//! loop and the gRPC server (StoreService, RaftService, AdminService, health,
//! reflection) on one listener.
//!
//! Start-up refuses a data dir that belongs to another node id (a copied
//! directory must not come back under another identity) and an empty data dir
//! unless `--new-replica` says this is a replica's first start (a wiped
//! directory must not come back under its old identity: it would have lost its
//! vote and log). `--bootstrap` initializes the group only when the log is
//! empty, so repeating it on a restart is harmless, and refuses when a
//! reachable peer already holds a group; the first leader then writes the
//! set's parameters (`Init`), which every later leader finds already present.
//!
//! Limitation: the bootstrap check only sees peers that answer within a second;
//! if every other member is down at that moment a second group can still be
//! founded. `--new-replica` is the guard that does not depend on the network.
//!
//! Left out: TLS, authentication, and several sets per process.

use crate::arbiter::{self, Liveness, Plan};
use crate::config::Config;
use crate::kv::{FileKv, KvStore};
use crate::log_store::{Durability, LogStore};
use crate::network::{MAX_PEER_MESSAGE, Network, RaftPeerService};
use crate::raft_types::{Node, Raft};
use crate::segment_log::SegmentLog;
use crate::sm_store::{SharedState, StateMachineStore};
use crate::state::Command;
use crate::writer::Writer;
use openraft::storage::RaftLogStorage;
use openraft::{BasicNode, ServerState, SnapshotPolicy};
use seqsvr_proto::pb;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long one Raft write may take before the caller hears "unavailable".
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(3);
/// How often the arbiter looks at liveness and ownership.
pub const ARBITER_TICK: Duration = Duration::from_millis(100);

/// Everything the services need, shared.
pub struct Ctx {
    pub node_id: u64,
    pub config: Config,
    pub raft: Raft,
    pub state: SharedState,
    pub writer: Writer,
    pub liveness: Mutex<Liveness>,
    /// The arbiter's latest plan (its `handover` part is read by renewals).
    pub plan: Mutex<Plan>,
    /// Route table cached by route version.
    pub routes: Mutex<Option<pb::RouteTable>>,
    /// Makes the committed index durable before a local read exposes state applied up to it.
    pub durability: Durability,
    /// The committed index found on disk at start, plus one: local reads wait until the state
    /// machine has replayed that far.
    pub replay_to: u64,
    /// Set once the state machine has replayed to `replay_to`.
    pub restored: AtomicBool,
}

/// A running replica.
pub struct StoreNode {
    pub ctx: Arc<Ctx>,
    pub local_addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    arbiter: JoinHandle<()>,
}

/// Why a replica could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid configuration: {0}")]
    Config(String),
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
    #[error("storage: {0}")]
    Storage(String),
    #[error("raft: {0}")]
    Raft(String),
    #[error("cannot listen on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
}

/// Claims `dir` for `node_id`, or refuses it.
///
/// A data dir without a `NODE_ID` marker is accepted only with `--new-replica`: a replica whose
/// disk was lost would otherwise rejoin under its old id with no vote and no log, could vote a
/// lagging replica leader, and committed bumps would be lost (P3, then P1).
fn claim_data_dir(dir: &Path, node_id: u64, new_replica: bool) -> Result<(), StartError> {
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
            Ok(())
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
            std::fs::create_dir_all(dir).map_err(io)?;
            let leftovers: Vec<String> = std::fs::read_dir(dir)
                .map_err(io)?
                .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect();
            if !leftovers.is_empty() {
                return Err(StartError::Unclaimed { dir: shown, leftovers });
            }
            std::fs::write(&marker, format!("{node_id}\n")).map_err(io)?;
            std::fs::File::open(&marker).and_then(|f| f.sync_all()).map_err(io)?;
            // The marker's directory entry must be durable too.
            std::fs::File::open(dir).and_then(|f| f.sync_all()).map_err(io)
        }
        Err(e) => Err(io(e)),
    }
}

/// Refuses a data dir whose Raft metadata is in a sled database (`raft/db`, before key files).
fn refuse_sled_era(dir: &Path) -> Result<(), StartError> {
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
async fn refuse_bootstrap_over_a_group(config: &Config) -> Result<(), StartError> {
    let dial = config.dial_map();
    let peers = config.peer_map();
    for (id, addr) in peers.into_iter().filter(|(id, _)| *id != config.node_id) {
        let addr = dial.get(&id).cloned().unwrap_or(addr);
        match probe_peer(&addr).await {
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

async fn probe_peer(addr: &str) -> PeerGroup {
    let endpoint = match tonic::transport::Endpoint::from_shared(format!("http://{addr}")) {
        Ok(e) => e.connect_timeout(BOOTSTRAP_PROBE).timeout(BOOTSTRAP_PROBE),
        Err(e) => return PeerGroup::Unknown(e.to_string()),
    };
    let channel = match tokio::time::timeout(BOOTSTRAP_PROBE, endpoint.connect()).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return PeerGroup::Unknown(e.to_string()),
        Err(_) => return PeerGroup::Unknown("connect timed out".into()),
    };
    let mut client = pb::store_service_client::StoreServiceClient::new(channel);
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

impl StoreNode {
    /// Opens storage, starts Raft and serves on `config.listen`.
    pub async fn start(config: Config) -> Result<Self, StartError> {
        config.validate().map_err(StartError::Config)?;
        refuse_sled_era(&config.data_dir)?;
        claim_data_dir(&config.data_dir, config.node_id, config.new_replica)?;
        let kv: Arc<dyn KvStore> =
            Arc::new(
                FileKv::open(&config.data_dir.join("meta")).map_err(|source| StartError::DataDir {
                    dir: config.data_dir.display().to_string(),
                    source,
                })?,
            );
        let log = SegmentLog::open(&config.data_dir.join("log")).map_err(|source| StartError::DataDir {
            dir: config.data_dir.display().to_string(),
            source,
        })?;
        let mut log_store = LogStore::new(kv.clone(), log).map_err(|e| StartError::Storage(e.to_string()))?;
        let durability = log_store.durability();
        let startup_committed = log_store
            .read_committed()
            .await
            .map_err(|e| StartError::Storage(e.to_string()))?;
        log_store
            .demote_vote_for_startup()
            .await
            .map_err(|e| StartError::Storage(e.to_string()))?;
        let sm = StateMachineStore::open(kv, config.unsafe_rules()).map_err(|e| StartError::Storage(e.to_string()))?;
        let state = sm.shared();
        let raft_config = openraft::Config {
            cluster_name: format!("seqsvr-set-{}", config.set_id),
            election_timeout_min: config.election_min_ms,
            election_timeout_max: config.election_max_ms,
            heartbeat_interval: config.heartbeat_ms,
            install_snapshot_timeout: 2_000,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_logs),
            max_in_snapshot_log_to_keep: config.keep_logs,
            ..Default::default()
        }
        .validate()
        .map_err(|e| StartError::Config(e.to_string()))?;
        let network = Network {
            dial: Arc::new(config.dial_map()),
        };
        let raft = Raft::new(config.node_id, Arc::new(raft_config), network, log_store, sm)
            .await
            .map_err(|e| StartError::Raft(e.to_string()))?;

        if config.bootstrap {
            let initialized = raft
                .is_initialized()
                .await
                .map_err(|e| StartError::Raft(e.to_string()))?;
            if initialized {
                tracing::info!("--bootstrap ignored: this replica already has Raft state");
            } else {
                refuse_bootstrap_over_a_group(&config).await?;
                let members: BTreeMap<u64, Node> = config
                    .peer_map()
                    .into_iter()
                    .map(|(id, a)| (id, BasicNode::new(a)))
                    .collect();
                raft.initialize(members.clone())
                    .await
                    .map_err(|e| StartError::Raft(e.to_string()))?;
                tracing::info!(?members, "bootstrapped a new Raft group");
            }
        }

        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|source| StartError::Listen {
                addr: config.listen,
                source,
            })?;
        let local_addr = listener.local_addr().map_err(|source| StartError::Listen {
            addr: config.listen,
            source,
        })?;

        let ctx = Arc::new(Ctx {
            node_id: config.node_id,
            writer: Writer::start(raft.clone()),
            raft: raft.clone(),
            state,
            config,
            liveness: Mutex::new(Liveness::default()),
            plan: Mutex::new(Plan::default()),
            routes: Mutex::new(None),
            durability,
            replay_to: startup_committed.map_or(0, |c| c.index + 1),
            restored: AtomicBool::new(false),
        });

        let (health_reporter, health) = tonic_health::server::health_reporter();
        health_reporter
            .set_serving::<pb::store_service_server::StoreServiceServer<crate::service::StoreSvc>>()
            .await;
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(seqsvr_proto::FILE_DESCRIPTOR_SET)
            .build_v1()
            .map_err(|e| StartError::Raft(format!("reflection: {e}")))?;
        let store = pb::store_service_server::StoreServiceServer::new(crate::service::StoreSvc { ctx: ctx.clone() })
            .max_decoding_message_size(seqsvr_proto::limits::STORE_MESSAGE_BYTES)
            .max_encoding_message_size(seqsvr_proto::limits::STORE_MESSAGE_BYTES);
        let peers = pb::raft_service_server::RaftServiceServer::new(RaftPeerService { raft: raft.clone() })
            .max_decoding_message_size(MAX_PEER_MESSAGE)
            .max_encoding_message_size(MAX_PEER_MESSAGE);
        let admin = pb::admin_service_server::AdminServiceServer::new(crate::admin::AdminSvc { ctx: ctx.clone() })
            .max_decoding_message_size(seqsvr_proto::limits::STORE_MESSAGE_BYTES)
            .max_encoding_message_size(seqsvr_proto::limits::STORE_MESSAGE_BYTES);
        let (stop, stopped) = oneshot::channel::<()>();
        // Nagle's algorithm with delayed ACKs would add ~40 ms to small RPCs.
        let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(health)
                .add_service(reflection)
                .add_service(store)
                .add_service(peers)
                .add_service(admin)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                }),
        );
        let arbiter = tokio::spawn(arbiter_loop(ctx.clone()));
        tracing::info!(node_id = ctx.node_id, %local_addr, "storesvr serving");
        Ok(Self {
            ctx,
            local_addr,
            stop: Some(stop),
            server,
            arbiter,
        })
    }

    /// Stops serving and shuts Raft down.
    pub async fn shutdown(mut self) {
        self.arbiter.abort();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), &mut self.server).await;
        let _ = self.ctx.raft.shutdown().await;
    }
}

impl Ctx {
    /// Where a caller should send leader-only requests.
    pub fn leader_hint(&self, leader_id: Option<u64>) -> pb::LeaderHint {
        let m = self.raft.metrics().borrow().clone();
        let id = leader_id.or(m.current_leader).unwrap_or(0);
        let addr = m
            .membership_config
            .membership()
            .get_node(&id)
            .map(|n| n.addr.clone())
            .unwrap_or_default();
        pb::LeaderHint {
            leader_id: id,
            leader_addr: addr,
        }
    }

    /// Whether local reads may be served. Before a local read exposes applied state its commit
    /// index is made durable (`Durability::make_durable`), so after a restart the replica must
    /// first replay to the committed index it found on disk: until then a local read could show
    /// an older state than it showed before the crash (P3 on every replica).
    pub fn is_restored(&self) -> bool {
        if self.restored.load(Ordering::Acquire) {
            return true;
        }
        let applied = self
            .state
            .read()
            .expect("state lock poisoned")
            .last_applied
            .map_or(0, |l| l.index + 1);
        let caught_up = applied >= self.replay_to;
        if caught_up {
            self.restored.store(true, Ordering::Release);
        }
        caught_up
    }

    pub fn detect(&self) -> Duration {
        Duration::from_millis(self.config.detect_ms)
    }
}

/// Leadership bookkeeping plus one arbiter decision per tick, on the leader only.
async fn arbiter_loop(ctx: Arc<Ctx>) {
    let mut tick = tokio::time::interval(ARBITER_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (is_leader, term) = {
            let metrics = ctx.raft.metrics();
            let m = metrics.borrow();
            (
                m.state == ServerState::Leader && m.current_leader == Some(ctx.node_id),
                m.current_term,
            )
        };
        let became_leader =
            ctx.liveness
                .lock()
                .expect("liveness lock poisoned")
                .observe_leadership(is_leader, term, Instant::now());
        if became_leader {
            tracing::info!(
                term,
                "became leader: liveness restarts now, nobody is declared dead for one detection interval"
            );
        }
        if !is_leader {
            continue;
        }
        let needs_init = ctx.state.read().expect("state lock poisoned").set.params.is_none();
        if needs_init {
            let params = ctx.config.set_params();
            match ctx.writer.write(Command::Init(params.clone()), WRITE_TIMEOUT).await {
                Ok(r) => tracing::info!(?params, ?r, "set initialized"),
                Err(e) => tracing::warn!(?e, "writing the set parameters failed; retrying"),
            }
            continue;
        }
        let (plan, warn) = {
            let st = ctx.state.read().expect("state lock poisoned");
            let live = ctx.liveness.lock().expect("liveness lock poisoned");
            let alive = arbiter::alive(&st.set, &live, Instant::now(), ctx.detect());
            let p = arbiter::plan(&st.set, &alive);
            let warn = st.set.params.as_ref() != Some(&ctx.config.set_params());
            (p, warn)
        };
        if warn {
            tracing::debug!(
                "this replica's set flags differ from the parameters stored at bootstrap; the stored ones apply"
            );
        }
        let cmd = plan.command();
        if !plan.expire.is_empty() {
            tracing::info!(expire = ?plan.expire, "declaring AllocSvr incarnations dead");
        }
        if !plan.moves.is_empty() {
            tracing::info!(moves = ?plan.moves, "moving sections");
        }
        *ctx.plan.lock().expect("plan lock poisoned") = plan;
        if let Some(cmd) = cmd
            && let Err(e) = ctx.writer.write(cmd, WRITE_TIMEOUT).await
        {
            tracing::warn!(?e, "arbiter write failed; retrying next tick");
        }
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
