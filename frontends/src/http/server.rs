//! The connections: the accept loop with its bound on connections, TLS, and hyper's HTTP/1.1
//! on each connection with this front end's limits in time and bytes.
//!
//! What one connection holds is bounded: hyper's read buffer ([`MAX_BUFFERED_BYTES`], which a
//! head must fit: [`MAX_HEAD_BYTES`]), the reply being written (hyper answers pipelined requests
//! one at a time and reads the next only when the last reply is flushed), and the request in
//! service. A reply left unread for [`WRITE_TIMEOUT`] ends the connection ([`WriteDeadline`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, watch};
use tracing::{debug, warn};

use super::errors::{JsonErrors, refused};
use super::io::WriteDeadline;
use super::{HEADER_TIMEOUT, HttpConfig, MAX_BUFFERED_BYTES, MAX_HEAD_BYTES, WRITE_TIMEOUT, router};
use crate::calls::Calls;
use crate::stopped;

/// Serves HTTP/1.1 on one connection with this front end's limits until the caller closes it,
/// it breaks a limit, or it breaks the protocol (the error says which).
pub async fn connection<S>(stream: S, app: axum::Router) -> std::io::Result<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper_util::service::TowerToHyperService::new(app);
    let stream = WriteDeadline::new(stream, WRITE_TIMEOUT);
    hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        // Hyper's default is ~400 KiB per connection, read and kept for the header timeout's
        // 10 s: 500 such callers held 186 MiB. A head over the bound is answered 431.
        .max_header_size(MAX_HEAD_BYTES)
        .max_buf_size(MAX_BUFFERED_BYTES)
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
        .await
        .map_err(io_error)
}

/// The IO error under hyper's, or hyper's as one: a timeout as `TimedOut`, anything else the
/// caller sent as `InvalidData`.
fn io_error(e: hyper::Error) -> std::io::Error {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return std::io::Error::new(io.kind(), e.to_string());
        }
        source = s.source();
    }
    let kind = if e.is_timeout() {
        std::io::ErrorKind::TimedOut
    } else {
        std::io::ErrorKind::InvalidData
    };
    std::io::Error::new(kind, e.to_string())
}

/// [`connection`], with how it ended in the log.
async fn serve_connection<S>(stream: S, app: axum::Router, peer: std::net::SocketAddr)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    if let Err(e) = connection(stream, app).await {
        debug!(%peer, error = %e, "HTTP connection ended");
    }
}

/// Serves HTTP/1.1 on the connections `listener` accepts until `stop` turns true.
pub async fn serve<C: Calls>(
    listener: tokio::net::TcpListener,
    calls: Arc<C>,
    cfg: HttpConfig,
    stop: watch::Receiver<bool>,
) {
    serve_router(listener, router(calls), cfg, stop).await;
}

/// Serves `app` over HTTP/1.1 on the connections `listener` accepts, at most
/// `cfg.max_connections` at once, each with this front end's header timeout and TLS, until `stop`
/// turns true. The AllocSvr's metrics page is served by it too.
pub async fn serve_router(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    cfg: HttpConfig,
    mut stop: watch::Receiver<bool>,
) {
    // Whatever routes it is given (the metrics page's too), every error reply is our JSON.
    let app = app.layer(JsonErrors);
    let slots = Arc::new(Semaphore::new(cfg.max_connections));
    loop {
        // At the bound, stop accepting: callers wait in the listen queue, not in memory.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = tokio::select! {
            () = stopped(&mut stop) => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    warn!(error = %e, "HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let (app, tls) = (app.clone(), cfg.tls.clone());
        tokio::spawn(async move {
            match tls {
                None => serve_connection(stream, app, peer).await,
                Some(tls) => match crate::tls::accept(&tls, stream).await {
                    crate::tls::Accepted::Caller(stream, _) => serve_connection(stream, app, peer).await,
                    crate::tls::Accepted::Refused(stream, why) => serve_connection(stream, refused(why), peer).await,
                    crate::tls::Accepted::Failed(why) => debug!(%peer, %why, "HTTP connection ended"),
                },
            }
            drop(slot);
        });
    }
}
