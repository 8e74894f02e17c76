//! The composition root: [`Core`] registers and runs the background tasks; [`Node::start`] binds the data-plane address, registers with the store,
//! builds the [`AllocState`] state and starts the background tasks and the gRPC server;
//! [`Node::shutdown`] stops them and releases every section.
//!
//! Nothing here decides anything about ownership; see `tasks` for the loops and `grants`,
//! `section` and `lease` for the decisions.
//!
//! Deliberately left out: the arbiter (on the StoreSvr leader) and any persistence: an AllocSvr
//! is stateless between restarts, a restart is a new incarnation.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use seqsvr_control::{StoreClient, StoreTimeouts};
use seqsvr_plumbing::reflection;
use seqsvr_plumbing::serve_limits::{self, Limited, ShedLayer};
use seqsvr_proto::Incarnation;
use seqsvr_proto::limits;
use seqsvr_proto::pb::alloc_service_server::{AllocServiceServer, SERVICE_NAME};
use seqsvr_proto::pb::ledger_service_server::{LedgerServiceServer, SERVICE_NAME as LEDGER};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic_health::pb::health_server::SERVICE_NAME as HEALTH;
use tower::Layer as _;
use tracing::{error, info, warn};

use crate::config::NodeConfig;
use crate::error::StartError;
use crate::front;
use crate::grants::{release_requests, released};
use crate::ledger::LedgerFront;
use crate::service::Service;
use crate::state::{AllocState, wake};
use crate::store::Store;
use crate::tasks::{bump, raise, release, renew};

/// A running AllocSvr: its [`Core`] behind a gRPC server.
pub struct Node {
    core: Core,
    local_addr: SocketAddr,
    server: JoinHandle<()>,
    fronts: front::FrontAddrs,
    front_tasks: Vec<JoinHandle<()>>,
    hop_addr: Option<SocketAddr>,
}

/// A registered AllocSvr's state and background tasks, without a listener: [`Node`] puts a gRPC
/// server in front of it; the deterministic simulator calls its [`Service`] in process.
pub struct Core {
    shared: Arc<AllocState>,
    stop_tx: watch::Sender<bool>,
    stop_rx: watch::Receiver<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Node {
    /// Binds the data-plane address, registers with the store (retrying until
    /// `cfg.start_timeout`), and starts serving. Sections are served once granted by renewals.
    pub async fn start(cfg: NodeConfig) -> Result<Node, StartError> {
        let seeds = cfg.store.clone();
        let dialer = seqsvr_control::Dialer::with_tls(cfg.tls.clone());
        let store =
            StoreClient::with_dialer(seeds, StoreTimeouts::default(), &dialer).map_err(StartError::StoreAddrs)?;
        Self::start_with_store(cfg, Arc::new(store)).await
    }

    /// [`Node::start`] against any [`Store`] (tests drive a node with an in-process store).
    pub async fn start_with_store(cfg: NodeConfig, store: Arc<dyn Store>) -> Result<Node, StartError> {
        let listener = tokio::net::TcpListener::bind(cfg.listen)
            .await
            .map_err(|source| StartError::Bind {
                addr: cfg.listen,
                source,
            })?;
        let local_addr = listener.local_addr().map_err(|source| StartError::Bind {
            addr: cfg.listen,
            source,
        })?;
        let advertise = cfg
            .advertise
            .as_ref()
            .map_or_else(|| local_addr.to_string(), |a| a.to_string());
        let core = Core::start(&cfg, store, advertise).await?;
        info!(%local_addr, "data plane listening");
        let cluster_port = crate::cluster::bind(cfg.front.resp_cluster, core.shared.advertise())
            .await
            .map_err(|e| StartError::Front(format!("cannot bind --resp-cluster-listen: {e}")))?;
        let hop = match cfg.hop_listen {
            Some(at) => Some(
                crate::hop::server::bind(at, core.shared.advertise())
                    .await
                    .map_err(|e| StartError::Front(format!("cannot bind --hop-listen {at}: {e}")))?,
            ),
            None => None,
        };
        let front_info = crate::cluster::FrontInfoSvc::new(
            core.shared.clone(),
            cluster_port.as_ref().map(|p| p.advertised.clone()),
            hop.as_ref().map(|(_, advertised)| advertised.clone()),
        );
        let hop_addr = hop.as_ref().and_then(|(l, _)| l.local_addr().ok());
        let hop_task =
            hop.map(|(listener, _)| crate::hop::server::serve(listener, core.shared.clone(), core.stop_rx.clone()));
        let server = seqsvr_auth::server(cfg.tls.as_deref()).map_err(|e| StartError::Tls(e.to_string()))?;
        let shed = ShedLayer::new(cfg.serve_limits.bounds(), &[HEALTH], admission_counters());
        let server = serve_limits::apply_with(server, &cfg.serve_limits, shed.clone());
        let ledgers = Arc::new(LedgerFront::new(
            core.shared.clone(),
            cfg.store.clone(),
            seqsvr_control::Dialer::with_tls(cfg.tls.clone()),
        ));
        let server = spawn_server(
            core.shared.clone(),
            server,
            listener,
            core.stop_rx.clone(),
            (front_info, ledgers.clone()),
        )
        .await;
        let (fronts, mut front_tasks) = if cfg.front.any() {
            start_fronts(&cfg, &core, shed, cluster_port, ledgers).await?
        } else {
            Default::default()
        };
        front_tasks.extend(hop_task);
        Ok(Node {
            core,
            local_addr,
            server,
            fronts,
            front_tasks,
            hop_addr,
        })
    }

    /// Where the HTTP/JSON and Redis-protocol front ends listen, those that run.
    pub fn front_addrs(&self) -> front::FrontAddrs {
        self.fronts
    }

    /// Where the direct forwarding hop listens (`crate::hop`), when it runs.
    pub fn hop_addr(&self) -> Option<SocketAddr> {
        self.hop_addr
    }

    /// The bound data-plane address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The current incarnation.
    pub fn incarnation(&self) -> Incarnation {
        self.core.incarnation()
    }

    /// Number of sections currently held (any state).
    pub fn sections_held(&self) -> usize {
        self.core.sections_held()
    }

    /// Stops serving every section at once, releases them (bounded deadline) and stops the server.
    pub async fn shutdown(self) {
        self.core.shutdown().await;
        let _ = tokio::time::timeout(Duration::from_secs(2), self.server).await;
        for t in self.front_tasks {
            let _ = tokio::time::timeout(Duration::from_secs(1), t).await;
        }
    }
}

impl Core {
    /// Registers with the store as `advertise` (retrying until `cfg.start_timeout`) and starts
    /// the renewal and bump tasks.
    pub async fn start(cfg: &NodeConfig, store: Arc<dyn Store>, advertise: String) -> Result<Core, StartError> {
        let switches = cfg.unsafe_rules;
        if switches.any() {
            warn!(
                ?switches,
                "!!! UNSAFE TEST SWITCHES ON: this AllocSvr deliberately breaks the ownership protocol !!!"
            );
        }
        // Every call after the Register carries the secret it registered with (memory only).
        let store: Arc<dyn Store> = Arc::new(crate::store::Bound::new(store));
        let deadline = Instant::now() + cfg.start_timeout;
        let (incarnation, params) = renew::register(&*store, cfg.node_id, &advertise, Some(deadline)).await?;
        info!(
            node_id = %cfg.node_id, %incarnation, set_id = params.set_id, sections = ?params.sections(),
            %advertise, "registered"
        );
        let (shared, bump_queue) = AllocState::new(cfg, params, advertise, store, incarnation);
        if let Some(path) = &cfg.id_clock_file {
            cfg.id_clock.follow(path.clone());
        }
        let (stop_tx, stop_rx) = watch::channel(false);
        let tasks = vec![
            tokio::spawn(renew::renew_loop(shared.clone(), stop_rx.clone())),
            tokio::spawn(bump::bumper(shared.clone(), bump_queue, stop_rx.clone())),
            tokio::spawn(raise::raiser(shared.clone(), stop_rx.clone())),
        ];
        Ok(Core {
            shared,
            stop_tx,
            stop_rx,
            tasks,
        })
    }

    /// The data-plane service over this node's state.
    pub fn service(&self) -> Service {
        Service::new(self.shared.clone())
    }

    /// The current incarnation.
    pub fn incarnation(&self) -> Incarnation {
        self.shared.incarnation()
    }

    /// Number of sections currently held (any state).
    pub fn sections_held(&self) -> usize {
        self.shared.owned().held_count()
    }

    /// What a killed process does: its loops stop where they are, nothing is released and nothing
    /// more is served. Calls already handed to the store (a gain's Load, a hand-over) are the
    /// store transport's to cut off, as a dead process's sockets would be.
    pub fn crash(self) {
        self.shared.begin_stopping();
        for t in &self.tasks {
            t.abort();
        }
        self.shared.owned().set_lease_until(None);
        self.shared.ids().drop_all("crashed");
        wake(&self.shared.owned().drop_all());
    }

    /// Stops serving every section at once and releases them (bounded deadline).
    pub async fn shutdown(self) {
        self.shared.begin_stopping();
        let _ = self.stop_tx.send(true);
        // No renewal may re-grant or re-extend after this point: stop the tasks first.
        for t in self.tasks {
            t.abort();
            let _ = tokio::time::timeout(Duration::from_secs(1), t).await;
        }
        self.shared.owned().set_lease_until(None);
        // Its slots go with the incarnation: the leaving Release below makes the store forget it,
        // which frees them for the next holder.
        self.shared.ids().drop_all("shutting down");
        let dropped = self.shared.owned().drop_all();
        wake(&dropped);
        info!(sections = dropped.len(), "shutting down: stopped serving every section");
        // Always tell the store we are leaving, even with nothing held: it then forgets this
        // incarnation and reassigns at once instead of waiting to detect our death.
        let now = self.shared.lease_now();
        let ranges = released(
            dropped
                .iter()
                .map(|s| (s.id, s.epoch, s.section.lock().unwrap().waited(now)))
                .collect(),
        );
        let reqs = release_requests(self.shared.incarnation().0, ranges, true);
        release::leave(&self.shared, reqs).await;
    }
}

/// The runtime the `allocsvr` binary serves on: `workers` worker threads (`None`: one per CPU the
/// process may run on) looking for IO every `event_interval` tasks
/// ([`EVENT_INTERVAL`](crate::config::EVENT_INTERVAL) unless an operator chose otherwise). Tests
/// that measure the server build theirs here.
pub fn runtime(workers: Option<usize>, event_interval: u32) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all().event_interval(event_interval);
    if let Some(n) = workers {
        builder.worker_threads(n);
    }
    builder.build()
}

/// Counts the calls refused as overloaded (`allocsvr_shed_total`) and those that waited for a
/// slot of the in-flight limit (`allocsvr_parked_total`).
fn admission_counters() -> serve_limits::Hooks {
    let shed = metrics::counter!("allocsvr_shed_total");
    let parked = metrics::counter!("allocsvr_parked_total");
    serve_limits::Hooks {
        shed: Arc::new(move || shed.increment(1)),
        parked: Arc::new(move || parked.increment(1)),
    }
}

/// The data-plane service as the network sees it below authentication: timed and counted.
fn data_plane(shared: Arc<AllocState>) -> crate::rpc_metrics::Metered<AllocServiceServer<Service>> {
    crate::rpc_metrics::Metered::new(
        AllocServiceServer::new(Service::new(shared))
            .max_decoding_message_size(limits::DATA_PLANE_MESSAGE_BYTES)
            .max_encoding_message_size(limits::DATA_PLANE_MESSAGE_BYTES),
    )
}

/// Starts the front ends; their calls to this node pass `shed`, the gRPC server's own admission.
async fn start_fronts(
    cfg: &NodeConfig,
    core: &Core,
    shed: ShedLayer,
    cluster_port: Option<crate::cluster::Port>,
    ledgers: Arc<LedgerFront>,
) -> Result<(front::FrontAddrs, Vec<JoinHandle<()>>), StartError> {
    use tonic::codegen::Service as _;
    let local = shed.layer(data_plane(core.shared.clone()));
    let ledger = shed.layer(LedgerServiceServer::from_arc(ledgers));
    // The client library reaches this node's ledger service in process too: by the path's
    // service, as the gRPC server routes it.
    let ledger_prefix = format!("/{LEDGER}/");
    let local: front::LocalService = Arc::new(move |req| {
        if req.uri().path().starts_with(&ledger_prefix) {
            let mut svc = ledger.clone();
            return Box::pin(async move { svc.call(req).await });
        }
        let mut svc = local.clone();
        Box::pin(async move { svc.call(req).await })
    });
    let own = core.shared.advertise().to_owned();
    let forwarder = Arc::new(front::Forwarder::new(own, local, cfg.tls.clone()));
    let client = front::client(&cfg.front, forwarder).map_err(StartError::Front)?;
    let peers = Arc::new(crate::peers::Peers::new(cfg.tls.clone()));
    let cluster = cluster_port.as_ref().map(|p| {
        let c =
            crate::cluster::ClusterFront::new(core.shared.clone(), client.clone(), p.advertised.clone(), peers.clone());
        Arc::new(c)
    });
    let refresh = cluster.clone().map(|c| c.refresh(core.stop_rx.clone()));
    // The hop is this node's way to reach others' hop ports, which run wherever TLS does not.
    let hop = cfg.tls.is_none().then(|| {
        let deadline = client.config().deadline;
        Arc::new(crate::hop::Hop::new(
            core.shared.clone(),
            client.clone(),
            peers,
            deadline,
        ))
    });
    let calls = Arc::new(front::NodeCalls::new(core.shared.clone(), client, cluster, hop).map_err(StartError::Front)?);
    let tls = match &cfg.tls {
        Some(t) => Some(t.rustls_server().map_err(|e| StartError::Tls(e.to_string()))?),
        None => None,
    };
    let (mut addrs, mut tasks) = front::start(&cfg.front, calls.clone(), tls.clone(), core.stop_rx.clone())
        .await
        .map_err(|e| StartError::Front(format!("cannot bind a front end: {e}")))?;
    if let Some(port) = cluster_port {
        addrs.resp_cluster = Some(port.bound);
        tasks.push(crate::cluster::serve(
            port,
            &cfg.front,
            calls,
            tls,
            core.stop_rx.clone(),
        ));
    }
    tasks.extend(refresh);
    Ok((addrs, tasks))
}

async fn spawn_server(
    shared: Arc<AllocState>,
    mut server: tonic::transport::Server<Limited<seqsvr_auth::Layered>>,
    listener: tokio::net::TcpListener,
    mut stop: watch::Receiver<bool>,
    (front_info, ledgers): (crate::cluster::FrontInfoSvc, Arc<LedgerFront>),
) -> JoinHandle<()> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<AllocServiceServer<Service>>().await;
    health.set_serving::<LedgerServiceServer<LedgerFront>>().await;
    let (reflection_v1, reflection_v1alpha) = reflection::services(&[SERVICE_NAME, LEDGER]);
    let ledger = LedgerServiceServer::from_arc(ledgers)
        .max_decoding_message_size(limits::DATA_PLANE_MESSAGE_BYTES)
        .max_encoding_message_size(limits::DATA_PLANE_MESSAGE_BYTES);
    let service = data_plane(shared);
    let incoming = serve_limits::incoming(listener);
    tokio::spawn(async move {
        let router = server
            .add_service(health_service)
            .add_service(service)
            .add_service(ledger)
            // Peers ask it for this node's Redis Cluster port; not listed by reflection (no caller
            // but a peer has a use for it).
            .add_service(seqsvr_proto::pb::front_info_server::FrontInfoServer::new(front_info))
            .add_optional_service(reflection_v1)
            .add_optional_service(reflection_v1alpha);
        let shutdown = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        if let Err(e) = router.serve_with_incoming_shutdown(incoming, shutdown).await {
            error!(error = %e, "gRPC server failed");
        }
    })
}
