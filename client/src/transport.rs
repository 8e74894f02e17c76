//! How the client reaches an AllocSvr: one [`Conn`] per address, either a lazily connected tonic
//! channel (every real deployment) or a caller-supplied in-process transport ([`Connect`]), which
//! the deterministic simulator uses to run this client against AllocSvr services in one thread on
//! simulated time, with its own simulated network in between.
//!
//! Both carry the same encoded gRPC requests and replies, so everything above this module (the
//! generated client, deadlines, codecs, routing, retries) is the same code in both.
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

/// Any error a transport reports.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request in flight over a [`Connect`] transport.
pub type CallFuture = Pin<Box<dyn Future<Output = Result<http::Response<Body>, BoxError>> + Send>>;

/// An in-process transport: sends one encoded gRPC request to the AllocSvr at `addr`.
pub trait Connect: Send + Sync + 'static {
    fn call(&self, addr: &str, req: http::Request<Body>) -> CallFuture;
}

/// The connection to one address.
#[derive(Clone)]
pub enum Conn {
    Tonic(Channel),
    InProcess { addr: Arc<str>, via: Arc<dyn Connect> },
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Conn::Tonic(c) => c.fmt(f),
            Conn::InProcess { addr, .. } => write!(f, "InProcess({addr})"),
        }
    }
}

/// [`Conn`]'s reply future: the channel's own, unboxed, on the production path.
pub enum ConnFuture {
    Tonic(ResponseFuture),
    InProcess(CallFuture),
}

impl Future for ConnFuture {
    type Output = Result<http::Response<Body>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            ConnFuture::Tonic(f) => Pin::new(f).poll(cx).map_err(Into::into),
            ConnFuture::InProcess(f) => f.as_mut().poll(cx),
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
            Conn::InProcess { .. } => Poll::Ready(Ok(())),
        }
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        match self {
            Conn::Tonic(c) => ConnFuture::Tonic(c.call(req)),
            Conn::InProcess { addr, via } => ConnFuture::InProcess(via.call(addr, req)),
        }
    }
}
