//! The HTTP/JSON and Redis-protocol front ends of this node (`seqsvr_frontends`), and the way
//! their calls reach an owner: through the client library, with [`Forwarder`] as its transport.
//!
//! A call for a uid or key this node owns and can answer at once is served from memory by the
//! same code as a gRPC fetch ([`NodeCalls`]), after the same cluster-map check the client library
//! makes of every reply. Any other call goes through the client library: to this node's own gRPC
//! service in process — through the same in-flight limit, handler and metrics as a call from the
//! network, without a socket — when it is the owner (a fetch waiting for a bump, say). A single
//! take for one another node owns goes first over the direct hop (`crate::hop`), which sends back
//! what the owner cannot answer at once from memory; the rest is forwarded over gRPC (mTLS when on), found
//! with the route table and cluster map the client library follows; NOT_OWNER, NOT_READY, a
//! move or a dead owner are retried by the same code as for any Rust caller, within the front
//! end's deadline. `allocsvr_front_rpcs_total{to="self"|"forwarded"}` counts the two, and
//! `allocsvr_front_forward_seconds` times the hop. The reads of many names at once (a Redis
//! `MGET`) are answered from memory where they can be, and the rest sent as one `BatchGet` per
//! owner ([`NodeCalls`]'s `current_many`), not one RPC per name.
//!
//! With mutual TLS on, both ports take only callers whose certificate may take numbers, and the
//! forwarded calls carry this AllocSvr's certificate (the data plane admits the `allocsvr` role).
//!
//! Ledger calls take the same client library to this node's own `LedgerService` in process (the
//! service forwards to the set that keeps the ledger: see `crate::ledger`).
//!
//! Deliberately left out: forwarding of gRPC calls (a gRPC caller routes itself with the table
//! the replies carry).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use seqsvr_client::transport::{BoxError, CallFuture, Conn, Connect};
use seqsvr_client::{Client, ClientConfig, Coalescer, CoalescerConfig};
use seqsvr_frontends::calls::{CallError, Calls, ClientCalls, ErrorKind, LedgerAnswer, LedgerCall, Owner, Taken, Who};
use seqsvr_frontends::{http, resp};
use seqsvr_proto::SectionId;
use tonic::body::Body;
use tonic::codegen::{Service as _, http as h};
use tracing::info;

use crate::config::FrontConfig;
use crate::error::Error;
use crate::service::Service;
use crate::state::AllocState;

/// The in-process gRPC service of this node, as the front ends' calls to it see it.
pub type LocalService = Arc<dyn Fn(h::Request<Body>) -> CallFuture + Send + Sync>;

/// The client library's transport for the front ends: this node in process, every other over gRPC.
pub struct Forwarder {
    own: String,
    local: LocalService,
    dialer: seqsvr_client::transport::Dialer,
    conns: Mutex<HashMap<String, Conn>>,
    to_self: metrics::Counter,
    forwarded: metrics::Counter,
    hop: metrics::Histogram,
}

/// How long a connection to another AllocSvr may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

impl Forwarder {
    pub fn new(own: String, local: LocalService, tls: Option<Arc<seqsvr_auth::Tls>>) -> Self {
        Self {
            own,
            local,
            dialer: seqsvr_client::transport::Dialer::with_tls(tls),
            conns: Mutex::new(HashMap::new()),
            to_self: metrics::counter!("allocsvr_front_rpcs_total", "to" => "self"),
            forwarded: metrics::counter!("allocsvr_front_rpcs_total", "to" => "forwarded"),
            hop: metrics::histogram!("allocsvr_front_forward_seconds"),
        }
    }

    fn conn(&self, addr: &str) -> Result<Conn, BoxError> {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = conns.get(addr) {
            return Ok(c.clone());
        }
        let c = self.dialer.dial_data(addr, CONNECT_TIMEOUT)?;
        conns.insert(addr.to_owned(), c.clone());
        Ok(c)
    }
}

impl Connect for Forwarder {
    fn call(&self, addr: &str, req: h::Request<Body>) -> CallFuture {
        if addr == self.own {
            self.to_self.increment(1);
            return (self.local)(req);
        }
        self.forwarded.increment(1);
        let conn = self.conn(addr);
        let hop = self.hop.clone();
        Box::pin(async move {
            let mut conn = conn?;
            let started = std::time::Instant::now();
            std::future::poll_fn(|cx| conn.poll_ready(cx)).await?;
            let r = conn.call(req).await;
            hop.record(started.elapsed().as_secs_f64());
            r
        })
    }
}

/// The client the front ends call through: seeded with this node, reaching it in process.
pub fn client(cfg: &FrontConfig, forwarder: Arc<Forwarder>) -> Result<Client, String> {
    let mut c = ClientConfig::new([forwarder.own.clone()]);
    if let Some(d) = cfg.deadline {
        c.deadline = d;
        c.attempt_timeout = c.attempt_timeout.min(d);
        c.connect_timeout = c.connect_timeout.min(d / 2).max(Duration::from_millis(1));
    }
    Client::in_process(c, forwarder, rand::random()).map_err(|e| e.to_string())
}

/// The bound addresses of the front ends that run.
#[derive(Debug, Clone, Copy, Default)]
pub struct FrontAddrs {
    pub http: Option<SocketAddr>,
    pub resp: Option<SocketAddr>,
    /// The Redis Cluster port (`crate::cluster`).
    pub resp_cluster: Option<SocketAddr>,
}

/// Binds the configured front ends and serves them until `stop` turns true.
pub async fn start<C: Calls>(
    cfg: &FrontConfig,
    calls: Arc<C>,
    tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<(FrontAddrs, Vec<tokio::task::JoinHandle<()>>)> {
    let mut addrs = FrontAddrs::default();
    let mut tasks = Vec::new();
    if let Some(addr) = cfg.http {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let bound = listener.local_addr()?;
        info!(addr = %bound, tls = tls.is_some(), "HTTP/JSON front end listening");
        addrs.http = Some(bound);
        tasks.push(tokio::spawn(http::serve(
            listener,
            calls.clone(),
            http::HttpConfig {
                tls: tls.clone(),
                ..http::HttpConfig::default()
            },
            stop.clone(),
        )));
    }
    if let Some(addr) = cfg.resp {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let bound = listener.local_addr()?;
        info!(addr = %bound, tls = tls.is_some(), auth = cfg.resp_password.is_some(), "Redis-protocol front end listening");
        addrs.resp = Some(bound);
        let rc = resp::RespConfig {
            password: cfg.resp_password.clone(),
            idle_timeout: cfg.resp_idle_timeout,
            max_unauthenticated: cfg.resp_max_unauthenticated,
            tls: tls.clone(),
            ..resp::RespConfig::default()
        };
        tasks.push(tokio::spawn(resp::serve(
            listener,
            calls.clone(),
            Arc::new(rc),
            stop.clone(),
        )));
    }
    Ok((addrs, tasks))
}

/// The front ends' [`Calls`]: from this node's memory when it can answer at once
/// ([`Service::take_now`]), otherwise through the client library ([`ClientCalls`]), which
/// reaches this node in process or forwards to the owner.
pub struct NodeCalls {
    service: Service,
    shared: Arc<AllocState>,
    slow: ClientCalls,
    /// Single takes the long way share batch RPCs per owner: the front ends' callers are many
    /// and concurrent, and a forwarded call alone costs a whole gRPC round trip.
    coalescer: Coalescer,
    /// The Redis Cluster view, when this node runs a cluster port.
    cluster: Option<Arc<crate::cluster::ClusterFront>>,
    /// Single takes for another owner go over the direct hop first, when it runs.
    hop: Option<Arc<crate::hop::Hop>>,
}

impl NodeCalls {
    pub(crate) fn new(
        shared: Arc<AllocState>,
        client: Client,
        cluster: Option<Arc<crate::cluster::ClusterFront>>,
        hop: Option<Arc<crate::hop::Hop>>,
    ) -> Result<Self, String> {
        let coalescer = Coalescer::new(client.clone(), CoalescerConfig::default()).map_err(|e| e.to_string())?;
        Ok(Self {
            service: Service::new(shared.clone()),
            shared,
            slow: ClientCalls::new(client),
            coalescer,
            cluster,
            hop,
        })
    }

    /// Whether this node's set may answer for `section` under the front end's cluster map — the
    /// check the client library makes of every reply — and that map is the one this node has
    /// (otherwise the long way brings the client the newer one).
    fn may_answer(&self, section: SectionId) -> bool {
        self.slow.client().with_routes(|routes| {
            routes.map().is_some_and(|map| {
                map.version() == self.shared.map_version() && map.may_answer(section, self.shared.params().set_id)
            })
        })
    }
}

fn split(who: Who<'_>) -> (u64, Option<&str>) {
    match who {
        Who::Uid(uid) => (uid, None),
        Who::Key(key) => (0, Some(key)),
    }
}

fn call_error(e: Error) -> CallError {
    match e {
        Error::InvalidArgument(m) => CallError::new(ErrorKind::BadInput, m),
        Error::Exhausted(m) => CallError::new(ErrorKind::Exhausted, m),
        Error::Unavailable(m) => CallError::new(ErrorKind::Unavailable, m),
    }
}

impl Calls for NodeCalls {
    async fn take(&self, who: Who<'_>, count: u32) -> Result<Taken, CallError> {
        let (uid, key) = split(who);
        if let Some(r) = self.service.take_now(uid, key, count, |s| self.may_answer(s)) {
            let (value, owner) = r.map_err(call_error)?;
            return Ok(Taken {
                value,
                owner: Some(Owner::from(&owner)),
            });
        }
        if count == 1
            && let Some(hop) = &self.hop
            && let Some(answer) = hop.take(who).await
        {
            return answer;
        }
        let (value, owner) = match (who, count) {
            (Who::Uid(uid), 1) => {
                let f = self.coalescer.fetch_next_seq(seqsvr_proto::Uid(uid)).await?;
                (f.seq, f.owner)
            }
            (Who::Key(key), 1) => {
                let c = self.coalescer.counter_next(key).await?;
                (c.value, c.owner)
            }
            _ => return self.slow.take(who, count).await,
        };
        Ok(Taken { value, owner })
    }

    async fn current(&self, who: Who<'_>) -> Result<Taken, CallError> {
        let (uid, key) = split(who);
        if let Some((value, owner)) = self.service.current_now(uid, key, |s| self.may_answer(s)) {
            return Ok(Taken {
                value,
                owner: Some(Owner::from(&owner)),
            });
        }
        self.slow.current(who).await
    }

    /// The names this node can answer at once from memory (as [`Calls::current`] would), the
    /// rest in one batched read through the client library: one `BatchGet` per owner, to this
    /// node in process or forwarded.
    async fn current_many(&self, whos: &[Who<'_>]) -> Result<Vec<Result<Taken, CallError>>, CallError> {
        let from_memory: Vec<Option<Taken>> = whos
            .iter()
            .map(|&who| {
                let (uid, key) = split(who);
                let (value, owner) = self.service.current_now(uid, key, |s| self.may_answer(s))?;
                Some(Taken {
                    value,
                    owner: Some(Owner::from(&owner)),
                })
            })
            .collect();
        // The rest, in request order: their answers fill the gaps in the same order.
        let rest: Vec<Who<'_>> = whos
            .iter()
            .zip(&from_memory)
            .filter(|(_, m)| m.is_none())
            .map(|(&w, _)| w)
            .collect();
        let read = if rest.is_empty() {
            Vec::new()
        } else {
            self.slow.current_many(&rest).await?
        };
        if read.len() != rest.len() {
            return Err(CallError::new(
                ErrorKind::Internal,
                format!("{} answers for a read of {} names", read.len(), rest.len()),
            ));
        }
        let mut read = read.into_iter();
        Ok(from_memory
            .into_iter()
            .map(|m| match m {
                Some(taken) => Ok(taken),
                None => read
                    .next()
                    .unwrap_or_else(|| Err(CallError::new(ErrorKind::Internal, "a name went unread"))),
            })
            .collect())
    }

    async fn batch(&self, uids: &[u64]) -> Result<Vec<Result<Taken, CallError>>, CallError> {
        self.slow.batch(uids).await
    }

    fn slot_home(&self, slot: u16) -> seqsvr_frontends::calls::SlotHome {
        self.cluster
            .as_ref()
            .map_or(seqsvr_frontends::calls::SlotHome::Forward, |c| c.slot_home(slot))
    }

    fn cluster_view(&self) -> Result<seqsvr_frontends::calls::ClusterView, CallError> {
        match &self.cluster {
            Some(c) => c.view(),
            None => Err(CallError::bad_input(
                "this AllocSvr runs no Redis Cluster port (allocsvr --resp-cluster-listen)",
            )),
        }
    }

    async fn ids(&self, count: u32) -> Result<Vec<u64>, CallError> {
        // Any AllocSvr's ids are good: this one's first, another's (the client's choice) when it
        // holds no slot or cannot issue now.
        let req = seqsvr_proto::pb::NextIdsRequest { count };
        match crate::ids::service::next_ids(&self.shared, req).await {
            Ok(reply) => Ok(reply
                .runs
                .iter()
                .flat_map(|r| r.first..r.first + u64::from(r.count))
                .collect()),
            Err(Error::InvalidArgument(m)) => Err(CallError::bad_input(m)),
            Err(_) => self.slow.ids(count).await,
        }
    }

    fn id_decoding(&self) -> Option<(seqsvr_proto::id_layout::IdLayout, u64)> {
        self.shared.ids().decoding()
    }

    /// Through the client library, which reaches this node's own `LedgerService` in process (it
    /// forwards to the set that keeps the ledger; no AllocSvr is nearer to it than another).
    async fn ledger(&self, call: LedgerCall<'_>) -> Result<LedgerAnswer, CallError> {
        self.slow.ledger(call).await
    }
}
