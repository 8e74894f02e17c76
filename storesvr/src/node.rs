//! The composition root of one StoreSvr replica: [`StoreNode::start`] checks the data dir
//! (`startup`), opens storage, starts Raft (bootstrapping the group once if asked), builds the
//! [`ReplicaState`] state, starts the arbiter task and serves StoreService, RaftService, AdminService,
//! health and reflection on one listener; [`StoreNode::shutdown`] stops them, and
//! [`StoreNode::stop`] (SIGTERM) hands a leader's leadership over first.
//!
//! `--bootstrap` initializes the group only when this replica has no Raft state, so repeating it
//! on a restart is harmless; the first leader then writes the set's parameters (`Init`).
//!
//! With `--tls-*`, every port speaks mutual TLS and every request passes the role check of
//! `seqsvr_auth` first.
//!
//! Left out: several sets per process.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::storage::RaftLogStorage;
use openraft::{BasicNode, SnapshotPolicy};
use seqsvr_plumbing::{reflection, serve_limits};
use seqsvr_proto::limits;
use seqsvr_proto::pb;
use seqsvr_proto::pb::admin_service_server::AdminServiceServer;
use seqsvr_proto::pb::raft_service_server::RaftServiceServer;
use seqsvr_proto::pb::store_service_server::StoreServiceServer;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::grpc::admin::AdminSvc;
use crate::grpc::ledger::LedgerSvc;
use crate::grpc::store::StoreSvc;
use crate::raft::clocks::PeerClocks;
use crate::raft::identity::Identity;
use crate::raft::network::{MAX_PEER_MESSAGE, Network, RaftPeerService};
use crate::raft::types::{Node, Raft};
use crate::raft::writer::Writer;
use crate::replica::FrozenSeen;
use crate::replica::ReplicaState;
use crate::startup::{StartError, claim_data_dir, refuse_bootstrap_over_a_group, refuse_sled_era};
use crate::storage::durability::Durability;
use crate::storage::fault::DiskFault;
use crate::storage::kv::{FileKv, KvStore};
use crate::storage::log_store::LogStore;
use crate::storage::sm_store::{SharedState, StateMachineStore};
use crate::tasks::arbiter::arbiter_loop;
use crate::tasks::handoff::{Handoff, step_aside};
use seqsvr_auth::{Role, Tls};

/// A running replica.
pub struct StoreNode {
    pub ctx: Arc<ReplicaState>,
    pub local_addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    arbiter: JoinHandle<()>,
    /// This replica's mutual TLS, for the `Campaign` call of a handoff.
    tls: Option<Arc<Tls>>,
}

/// What opening the data dir yields.
struct Opened {
    log_store: LogStore,
    sm: StateMachineStore,
    durability: Durability,
    /// The committed index found on disk, plus one (see `ReplicaState::replay_to`).
    replay_to: u64,
}

fn storage_error(e: impl std::fmt::Display) -> StartError {
    StartError::Storage(e.to_string())
}

fn raft_error(e: impl std::fmt::Display) -> StartError {
    StartError::Raft(e.to_string())
}

/// Checks and opens the data dir: meta files, log segments, state machine.
async fn open_storage(config: &Config) -> Result<Opened, StartError> {
    refuse_sled_era(&config.data_dir)?;
    claim_data_dir(&config.data_dir, config.node_id, config.new_replica)?;
    let dir_error = |source| StartError::DataDir {
        dir: config.data_dir.display().to_string(),
        source,
    };
    let fault = match &config.unsafe_disk_fault_file {
        Some(file) => {
            tracing::warn!(file = %file.display(), "UNSAFE: --unsafe-disk-fault-file is on; storage fails while it exists (tests only)");
            DiskFault::from_file(file)
        }
        None => DiskFault::default(),
    };
    let kv = FileKv::open(&config.data_dir.join("meta")).map_err(dir_error)?;
    let kv: Arc<dyn KvStore> = Arc::new(kv.with_fault(fault.clone()));
    let mut log_store =
        LogStore::open_with_fault(kv.clone(), &config.data_dir.join("log"), fault).map_err(storage_error)?;
    let durability = log_store.durability();
    let committed = log_store.read_committed().await.map_err(storage_error)?;
    log_store.demote_vote_for_startup().await.map_err(storage_error)?;
    let sm = StateMachineStore::open(kv, config.unsafe_rules()).map_err(storage_error)?;
    Ok(Opened {
        log_store,
        sm,
        durability,
        replay_to: committed.map_or(0, |c| c.index + 1),
    })
}

/// Starts the Raft node over opened storage.
async fn start_raft(
    config: &Config,
    tls: Option<Arc<Tls>>,
    identity: Arc<Identity>,
    clocks: Arc<PeerClocks>,
    log_store: LogStore,
    sm: StateMachineStore,
) -> Result<Raft, StartError> {
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
        tls,
        identity: identity.clone(),
        clocks,
    };
    let raft = Raft::new(config.node_id, Arc::new(raft_config), network, log_store, sm)
        .await
        .map_err(raft_error)?;
    if !raft.is_initialized().await.map_err(raft_error)? {
        // No Raft state: a new replica, which learns its group from the leader that reaches it.
        identity.allow_adoption();
    }
    Ok(raft)
}

/// Refuses a data dir that holds another set's replica (its stored parameters say so).
fn check_set_id(config: &Config, state: &SharedState) -> Result<(), StartError> {
    let stored = state
        .read()
        .expect("state lock poisoned")
        .set
        .params
        .as_ref()
        .map(|p| p.set_id);
    match stored {
        Some(s) if s != config.set_id => Err(StartError::Config(format!(
            "--set-id {} given, but data dir {} holds a replica of set {s}",
            config.set_id,
            config.data_dir.display()
        ))),
        _ => Ok(()),
    }
}

/// Why this replica must not run with its `--key-placement`: its set's stored id setup (set 0's
/// own, adopted by the others from the map) records another placement. `None` while the set has
/// no setup yet or the two agree.
fn placement_conflict(config: &Config, state: &SharedState) -> Option<String> {
    let st = state.read().expect("state lock poisoned");
    let stored = st.set.ids.as_ref()?.key_placement;
    (stored != config.key_placement).then(|| {
        format!(
            "--key-placement {} given, but set {}'s stored id setup places counter keys by {stored}: the \
             placement is chosen when the cluster is set up and never changes (a key placed two ways would \
             have two sequences). Start this replica with --key-placement {stored}",
            config.key_placement, config.set_id
        )
    })
}

/// With `--bootstrap`, initializes the group from `--peers` unless this replica has Raft state.
async fn maybe_bootstrap(
    config: &Config,
    tls: Option<&Tls>,
    raft: &Raft,
    identity: &Identity,
) -> Result<(), StartError> {
    if !config.bootstrap {
        return Ok(());
    }
    if raft.is_initialized().await.map_err(raft_error)? {
        tracing::info!("--bootstrap ignored: this replica already has Raft state");
        return Ok(());
    }
    refuse_bootstrap_over_a_group(config, tls).await?;
    // Before the first message goes out: every one carries the group id.
    identity.mint().map_err(|source| StartError::DataDir {
        dir: config.data_dir.display().to_string(),
        source,
    })?;
    let members: BTreeMap<u64, Node> = config
        .peer_map()
        .into_iter()
        .map(|(id, a)| (id, BasicNode::new(a)))
        .collect();
    raft.initialize(members.clone()).await.map_err(raft_error)?;
    tracing::info!(?members, "bootstrapped a new Raft group");
    Ok(())
}

/// Services never shed under overload: a peer's heartbeat refused would start an election and
/// make the overload worse; a health check refused would get the replica restarted.
const EXEMPT: &[&str] = &[
    pb::raft_service_server::SERVICE_NAME,
    tonic_health::pb::health_server::SERVICE_NAME,
];

/// Counts the calls refused as overloaded (`storesvr_shed_total`) and those that waited for a
/// slot of the in-flight limit (`storesvr_parked_total`).
fn admission_counters() -> serve_limits::Hooks {
    let shed = metrics::counter!("storesvr_shed_total");
    let parked = metrics::counter!("storesvr_parked_total");
    serve_limits::Hooks {
        shed: Arc::new(move || shed.increment(1)),
        parked: Arc::new(move || parked.increment(1)),
    }
}

/// Serves every service of the replica on `listener` until `stopped` fires.
async fn serve(
    shared: Arc<ReplicaState>,
    tls: Option<&Tls>,
    listener: tokio::net::TcpListener,
    stopped: oneshot::Receiver<()>,
) -> Result<JoinHandle<Result<(), tonic::transport::Error>>, StartError> {
    let limits = shared.config.serve_limits();
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter.set_serving::<StoreServiceServer<StoreSvc>>().await;
    let served = [
        pb::store_service_server::SERVICE_NAME,
        pb::raft_service_server::SERVICE_NAME,
        pb::admin_service_server::SERVICE_NAME,
        pb::ledger_service_server::SERVICE_NAME,
    ];
    let (reflection_v1, reflection_v1alpha) = reflection::services(&served);
    let store = StoreServiceServer::new(StoreSvc { ctx: shared.clone() })
        .max_decoding_message_size(limits::STORE_MESSAGE_BYTES)
        .max_encoding_message_size(limits::STORE_MESSAGE_BYTES);
    let peers = RaftServiceServer::new(RaftPeerService {
        raft: shared.raft.clone(),
        identity: shared.identity.clone(),
    })
    .max_decoding_message_size(MAX_PEER_MESSAGE)
    .max_encoding_message_size(MAX_PEER_MESSAGE);
    let ledger = pb::ledger_service_server::LedgerServiceServer::new(LedgerSvc::new(shared.clone()))
        .max_decoding_message_size(limits::STORE_MESSAGE_BYTES)
        .max_encoding_message_size(limits::STORE_MESSAGE_BYTES);
    let admin = AdminServiceServer::new(AdminSvc { ctx: shared })
        .max_decoding_message_size(limits::STORE_MESSAGE_BYTES)
        .max_encoding_message_size(limits::STORE_MESSAGE_BYTES);
    let incoming = serve_limits::incoming(listener);
    let server = seqsvr_auth::server(tls).map_err(StartError::Tls)?;
    let mut server = serve_limits::apply(server, &limits, EXEMPT, admission_counters());
    Ok(tokio::spawn(
        server
            .add_service(health)
            .add_optional_service(reflection_v1)
            .add_optional_service(reflection_v1alpha)
            .add_service(store)
            .add_service(peers)
            .add_service(admin)
            .add_service(ledger)
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stopped.await;
            }),
    ))
}

/// This replica's identity in its group, from its data dir; with `--unsafe-skip-group-check`, one
/// that admits the Raft messages of any group.
fn load_identity(config: &Config) -> Result<Identity, StartError> {
    let identity =
        Identity::load(&config.data_dir, config.node_id, config.set_id).map_err(|source| StartError::DataDir {
            dir: config.data_dir.display().to_string(),
            source,
        })?;
    Ok(if config.unsafe_skip_group_check {
        tracing::warn!("UNSAFE: --unsafe-skip-group-check is on; Raft messages of other groups are admitted");
        identity.without_check()
    } else {
        identity
    })
}

impl StoreNode {
    /// Opens storage, starts Raft and serves on `config.listen`.
    pub async fn start(config: Config) -> Result<Self, StartError> {
        config.validate().map_err(StartError::Config)?;
        if config.test_clock_offset_ms != 0 {
            tracing::warn!(
                offset_ms = config.test_clock_offset_ms,
                "TEST: this replica's wall clock is offset"
            );
            crate::config::set_test_clock_offset_ms(config.test_clock_offset_ms);
        }
        let tls = config.tls.load(Some(Role::StoreSvr))?.map(Arc::new);
        let opened = open_storage(&config).await?;
        let state: SharedState = opened.sm.shared();
        check_set_id(&config, &state)?;
        if let Some(why) = placement_conflict(&config, &state) {
            return Err(StartError::Config(why));
        }
        let identity = Arc::new(load_identity(&config)?);
        let clocks = Arc::new(PeerClocks::default());
        let raft = start_raft(
            &config,
            tls.clone(),
            identity.clone(),
            clocks.clone(),
            opened.log_store,
            opened.sm,
        )
        .await?;
        maybe_bootstrap(&config, tls.as_deref(), &raft, &identity).await?;
        let listen_error = |source| StartError::Listen {
            addr: config.listen,
            source,
        };
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(listen_error)?;
        let local_addr = listener.local_addr().map_err(listen_error)?;
        let ctx = Arc::new(ReplicaState {
            node_id: config.node_id,
            writer: Writer::start(raft.clone()),
            raft,
            state,
            config,
            identity,
            clocks,
            clock_warned: Mutex::new(None),
            view: Mutex::new(Default::default()),
            routes: Mutex::new(None),
            frozen_seen: Mutex::new(FrozenSeen::default()),
            arbiter_wake: Default::default(),
            durability: opened.durability,
            replay_to: opened.replay_to,
            restored: AtomicBool::new(false),
            handing_over: AtomicU64::new(0),
        });
        let (stop, stopped) = oneshot::channel::<()>();
        let server = serve(ctx.clone(), tls.as_deref(), listener, stopped).await?;
        let arbiter = tokio::spawn(arbiter_loop(ctx.clone()));
        tracing::info!(node_id = ctx.node_id, %local_addr, "storesvr serving");
        Ok(Self {
            ctx,
            local_addr,
            stop: Some(stop),
            server,
            arbiter,
            tls,
        })
    }

    /// Returns once the Raft node stopped on its own, with why: openraft stops on any storage error
    /// (a failed write or sync of the log, vote or snapshot) and on nothing else but a shutdown.
    /// A replica whose Raft node stopped serves no reads or writes; the process exits then
    /// (`main.rs`), so that a restart reopens the data dir from what is on disk.
    pub async fn raft_stopped(&self) -> String {
        let mut metrics = self.ctx.raft.metrics();
        loop {
            if let Err(fatal) = &metrics.borrow().running_state {
                return fatal.to_string();
            }
            if metrics.changed().await.is_err() {
                return "the Raft node's metrics channel closed".to_string();
            }
        }
    }

    /// Returns, with why, once the set's stored id setup (in the snapshot, or applied from the log
    /// since) disagrees with `--key-placement`; `main.rs` then exits. Checked every half second.
    pub async fn placement_refused(&self) -> String {
        loop {
            if let Some(why) = placement_conflict(&self.ctx.config, &self.ctx.state) {
                return why;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Stops as asked (SIGTERM): a leader first hands its leadership to a caught-up follower,
    /// within `--handoff-ms` (`tasks::handoff`), then everything stops as in [`Self::shutdown`].
    pub async fn stop(self) -> Handoff {
        self.arbiter.abort();
        let budget = Duration::from_millis(self.ctx.config.handoff_ms);
        let handoff = if budget.is_zero() {
            Handoff::NotLeader
        } else {
            step_aside(&self.ctx, self.tls.as_deref(), budget).await
        };
        match &handoff {
            Handoff::NotLeader => {}
            Handoff::Handed { .. } => tracing::info!("{handoff}"),
            Handoff::TimedOut { .. } => tracing::warn!("{handoff}; stopping anyway"),
        }
        self.shutdown().await;
        handoff
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
