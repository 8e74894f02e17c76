//! The HTTP/JSON and Redis-protocol front ends of this node (`seqsvr_frontends`), and the way
//! their calls reach an owner: through the client library, with [`Forwarder`] as its transport.
//!
//! A call for a uid or key this node owns goes to this node's own gRPC service in process —
//! through the same in-flight limit, handler and metrics as a call from the network, without a
//! socket. A call for one another node owns is forwarded to it over gRPC (mTLS when on), found
//! with the route table and cluster map the client library follows; NOT_OWNER, NOT_READY, a
//! move or a dead owner are retried by the same code as for any Rust caller, within the front
//! end's deadline. `allocsvr_front_rpcs_total{to="self"|"forwarded"}` counts the two, and
//! `allocsvr_front_forward_seconds` times the hop.
//!
//! Deliberately left out: forwarding of gRPC calls (a gRPC caller routes itself with the table
//! the replies carry), and TLS on the front ends' own ports.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use seqsvr_client::transport::{BoxError, CallFuture, Conn, Connect};
use seqsvr_client::{Client, ClientConfig};
use seqsvr_frontends::calls::ClientCalls;
use seqsvr_frontends::{http, resp};
use tonic::body::Body;
use tonic::codegen::{Service as _, http as h};
use tracing::info;

/// What the front ends of one node are: where they listen, how long a call may take.
#[derive(Debug, Clone, Default)]
pub struct FrontConfig {
    /// HTTP/JSON on this address.
    pub http: Option<SocketAddr>,
    /// The Redis protocol on this address.
    pub resp: Option<SocketAddr>,
    /// The Redis front end's `default` user's password.
    pub resp_password: Option<String>,
    /// Longest one front-end call may take, retries and forwarding included (`None`: the client
    /// library's default of 5 s).
    pub deadline: Option<Duration>,
}

impl FrontConfig {
    pub fn any(&self) -> bool {
        self.http.is_some() || self.resp.is_some()
    }
}

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
        let c = self.dialer.dial(addr, CONNECT_TIMEOUT)?;
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
}

/// Binds the configured front ends and serves them until `stop` turns true.
pub async fn start(
    cfg: &FrontConfig,
    client: Client,
    stop: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<(FrontAddrs, Vec<tokio::task::JoinHandle<()>>)> {
    let calls = Arc::new(ClientCalls::new(client));
    let mut addrs = FrontAddrs::default();
    let mut tasks = Vec::new();
    if let Some(addr) = cfg.http {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let bound = listener.local_addr()?;
        info!(addr = %bound, "HTTP/JSON front end listening");
        addrs.http = Some(bound);
        tasks.push(tokio::spawn(http::serve(
            listener,
            calls.clone(),
            http::HttpConfig::default(),
            stop.clone(),
        )));
    }
    if let Some(addr) = cfg.resp {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let bound = listener.local_addr()?;
        info!(addr = %bound, auth = cfg.resp_password.is_some(), "Redis-protocol front end listening");
        addrs.resp = Some(bound);
        let rc = resp::RespConfig {
            password: cfg.resp_password.clone(),
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
