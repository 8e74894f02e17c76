//! How a client reaches a server: one [`Conn`] per address, either a lazily connected tonic
//! channel (every real deployment) or a caller-supplied in-process transport ([`Connect`]), which
//! the deterministic simulator uses to run the clients (the data-plane client, the control-plane
//! clients and the move driver) against services in one thread on simulated time, with its own
//! simulated network in between.
//!
//! Both carry the same encoded gRPC requests and replies, so everything above this module (the
//! generated clients, deadlines, codecs, routing, leader following, retries) is the same code in
//! both.
//!
//! In production a connection is HTTP/2 over TCP, plaintext or mutual TLS: [`Dialer::dial_data`]
//! gives the data plane an [`H2Conn`] (one write per request); the control plane dials tonic
//! channels ([`Dialer::dial`]).
//!
//! Deliberately left out: any transport other than HTTP/2 over TCP in production.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codegen::{Service, http};
use tonic::transport::Channel;
use tonic::transport::channel::ResponseFuture;

pub use crate::call::{BoxError, CallFuture};
pub use crate::h2conn::H2Conn;

/// An in-process transport: sends one encoded gRPC request to the server at `addr`.
pub trait Connect: Send + Sync + 'static {
    fn call(&self, addr: &str, req: http::Request<Body>) -> CallFuture;
}

/// The connection to one address.
#[derive(Clone)]
pub enum Conn {
    Tonic(Channel),
    H2(H2Conn),
    InProcess { addr: Arc<str>, via: Arc<dyn Connect> },
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Conn::Tonic(c) => c.fmt(f),
            Conn::H2(c) => c.fmt(f),
            Conn::InProcess { addr, .. } => write!(f, "InProcess({addr})"),
        }
    }
}

/// [`Conn`]'s reply future: a tonic channel's own, unboxed; the others' boxed.
pub enum ConnFuture {
    Tonic(ResponseFuture),
    /// An [`H2Conn`]'s or an in-process transport's.
    Boxed(CallFuture),
}

impl Future for ConnFuture {
    type Output = Result<http::Response<Body>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            ConnFuture::Tonic(f) => Pin::new(f).poll(cx).map_err(Into::into),
            ConnFuture::Boxed(f) => f.as_mut().poll(cx),
        }
    }
}

impl Service<http::Request<Body>> for Conn {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = ConnFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        match self {
            Conn::Tonic(c) => c.poll_ready(cx).map_err(Into::into),
            Conn::H2(_) | Conn::InProcess { .. } => Poll::Ready(Ok(())),
        }
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        match self {
            Conn::Tonic(c) => ConnFuture::Tonic(c.call(req)),
            Conn::H2(c) => ConnFuture::Boxed(c.call(req)),
            Conn::InProcess { addr, via } => ConnFuture::Boxed(via.call(addr, req)),
        }
    }
}

/// How the control-plane clients open a [`Conn`]: tonic (production) or an in-process transport.
#[derive(Clone, Default)]
pub struct Dialer {
    via: Option<Arc<dyn Connect>>,
    /// Mutual TLS for every tonic connection; plaintext when unset.
    tls: Option<Arc<seqsvr_auth::Tls>>,
    /// Seed of the clients' random choices (backoff jitter); from the OS when unset.
    seed: Option<u64>,
}

impl std::fmt::Debug for Dialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.via.is_some() {
            "Dialer(in-process)"
        } else {
            "Dialer(tonic)"
        })
    }
}

impl Dialer {
    /// Every connection through `via`, every random choice drawn from `seed`: the same calls
    /// make the same attempts at the same (simulated) times.
    pub fn in_process(via: Arc<dyn Connect>, seed: u64) -> Self {
        Self {
            via: Some(via),
            tls: None,
            seed: Some(seed),
        }
    }

    /// Tonic connections with mutual TLS when `tls` is set, plaintext otherwise.
    pub fn with_tls(tls: Option<Arc<seqsvr_auth::Tls>>) -> Self {
        Self { tls, ..Self::default() }
    }

    /// The generator of one client's random choices.
    pub fn rng(&self) -> rand::rngs::StdRng {
        use rand::SeedableRng;
        match self.seed {
            Some(seed) => rand::rngs::StdRng::seed_from_u64(seed),
            None => rand::rngs::StdRng::from_rng(&mut rand::rng()),
        }
    }

    /// A lazily connected `Conn` to `addr` (`host:port`); no IO.
    pub fn dial(&self, addr: &str, connect_timeout: std::time::Duration) -> Result<Conn, String> {
        if let Some(via) = &self.via {
            return Ok(Conn::InProcess {
                addr: addr.into(),
                via: via.clone(),
            });
        }
        let endpoint = seqsvr_auth::endpoint(addr, self.tls.as_deref())
            .map_err(|e| format!("store address: {e}"))?
            .connect_timeout(connect_timeout)
            .tcp_nodelay(true);
        Ok(Conn::Tonic(endpoint.connect_lazy()))
    }

    /// A lazily connected data-plane `Conn` to `addr` (`host:port`); no IO: an [`H2Conn`] (a
    /// unary request in one write; see its module), under mutual TLS when this dialer has it.
    pub fn dial_data(&self, addr: &str, connect_timeout: std::time::Duration) -> Result<Conn, String> {
        if self.via.is_some() {
            return self.dial(addr, connect_timeout);
        }
        Ok(Conn::H2(H2Conn::dial(addr, connect_timeout, self.tls.as_deref())?))
    }
}
