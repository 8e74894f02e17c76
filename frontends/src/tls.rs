//! Mutual TLS on the front ends' connections: the handshake (bounded in time) against the
//! process's `rustls` server config, which requires a client certificate signed by the cluster's
//! CA, then the caller's role, which must be one that may take numbers
//! (`seqsvr_auth::tls::peer_caller`: the gRPC data plane's rule).
//!
//! Deliberately left out: anything but the role from the certificate (no per-key permissions).

use std::sync::Arc;

use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::server::TlsStream;

/// What came of a TLS connection.
pub enum Accepted {
    /// The handshake passed and the caller may take numbers.
    Caller(Box<TlsStream<TcpStream>>, seqsvr_auth::Caller),
    /// The handshake passed but the caller's certificate may not take numbers: the stream, to
    /// tell it why in the protocol's words, and why.
    Refused(Box<TlsStream<TcpStream>>, String),
    /// No TLS connection (the handshake failed or timed out): nothing to answer on.
    Failed(String),
}

/// Runs the server side of the handshake on `tcp` and checks the caller's role.
pub async fn accept(config: &Arc<rustls::ServerConfig>, tcp: TcpStream) -> Accepted {
    let acceptor = TlsAcceptor::from(config.clone());
    let stream = match tokio::time::timeout(seqsvr_auth::tls::HANDSHAKE_LIMIT, acceptor.accept(tcp)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Accepted::Failed(format!("TLS handshake: {e}")),
        Err(_) => return Accepted::Failed("TLS handshake timed out".into()),
    };
    match seqsvr_auth::tls::peer_caller(stream.get_ref().1.peer_certificates()) {
        Ok(caller) => Accepted::Caller(Box::new(stream), caller),
        Err(why) => {
            tracing::warn!(%why, "front end refused a caller");
            Accepted::Refused(Box::new(stream), why)
        }
    }
}
