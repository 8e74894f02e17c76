//! The check every server runs before any service: may this caller's role call this method?
//!
//! The TLS handshake has already proven the certificate (chain to the CA, validity period); this
//! layer reads its role and subject, answers PERMISSION_DENIED with a log line naming the peer when
//! [`policy::allowed`] says no, and otherwise records the [`Caller`] in the request's extensions for
//! the handlers (the audit trail).
//!
//! On a plaintext server there is no certificate: every caller is [`Caller::anonymous`] and may call
//! everything, as before TLS existed.
//!
//! Parsing a certificate costs microseconds, a data-plane call about a hundred: the parsed caller
//! is cached per connection, keyed by the address of the connection's shared certificate list.
//! The cache holds a clone of that `Arc`, so the address cannot be reused by another connection
//! while its entry exists; entries go only all at once, when the cache is full.
//!
//! Deliberately left out: rate-limiting the refusal log (a refused caller is a misconfiguration or
//! an attack; both deserve every line, and the connection limits bound the rate).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};

use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tower::{Layer, Service};
use tracing::warn;

use crate::{Caller, identity, policy};

/// Connections remembered; past it the cache starts over.
const CACHE_CONNECTIONS: usize = 4096;

/// What a certificate's bytes were found to be: a caller, or why it has no usable role.
type Checked = Result<Caller, String>;

/// A connection's peer certificates, as tonic shares them between its requests.
type PeerCerts = Arc<Vec<tonic::transport::CertificateDer<'static>>>;

/// Checked callers by the address of their connection's [`PeerCerts`] (kept alive here).
type Cache = Arc<RwLock<HashMap<usize, (PeerCerts, Checked)>>>;

/// The tower layer of the check. One per server; its clones share the cache.
#[derive(Clone, Debug, Default)]
pub struct AuthLayer {
    cache: Cache,
}

impl<S> Layer<S> for AuthLayer {
    type Service = Auth<S>;

    fn layer(&self, inner: S) -> Auth<S> {
        Auth {
            inner,
            cache: self.cache.clone(),
        }
    }
}

/// The service the layer wraps around a server's router.
#[derive(Clone, Debug)]
pub struct Auth<S> {
    inner: S,
    cache: Cache,
}

impl<S, B, RB> Service<http::Request<B>> for Auth<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>> + Clone,
    S::Future: Send + 'static,
    S::Error: Into<tower::BoxError>,
    RB: Default + Send + 'static,
{
    type Response = http::Response<RB>;
    type Error = tower::BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<RB>, tower::BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        match self.caller(&req) {
            Ok(caller) => {
                req.extensions_mut().insert(caller);
                // The instance that was polled ready serves; a fresh clone waits for the next call.
                let clone = self.inner.clone();
                let mut ready = std::mem::replace(&mut self.inner, clone);
                let served = ready.call(req);
                Box::pin(async move { served.await.map_err(Into::into) })
            }
            Err(status) => Box::pin(std::future::ready(Ok(status.into_http()))),
        }
    }
}

impl<S> Auth<S> {
    /// The caller of `req`, or the refusal to send.
    fn caller<B>(&self, req: &http::Request<B>) -> Result<Caller, tonic::Status> {
        let Some(info) = req.extensions().get::<TlsConnectInfo<TcpConnectInfo>>() else {
            return Ok(Caller::anonymous());
        };
        let path = req.uri().path();
        let remote = info.get_ref().remote_addr();
        let refuse = |subject: &str, why: String| {
            warn!(peer = subject, remote = ?remote, method = path, "refused: {why}");
            tonic::Status::permission_denied(format!("{path}: {why}"))
        };
        // Servers require a client certificate; a connection without one never gets here.
        let Some(certs) = info.peer_certs().filter(|c| !c.is_empty()) else {
            return Err(refuse("(none)", "no client certificate".into()));
        };
        let caller = self.checked(certs).map_err(|why| refuse("(unreadable)", why))?;
        match caller.role {
            Some(role) if policy::allowed(role, path) => Ok(caller),
            Some(role) => Err(refuse(&caller.subject, format!("role {role} may not call this method"))),
            None => Err(refuse(&caller.subject, "certificate carries no role".into())),
        }
    }

    fn checked(&self, certs: PeerCerts) -> Checked {
        let key = Arc::as_ptr(&certs) as usize;
        if let Some((_, hit)) = self.cache.read().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return hit.clone();
        }
        let checked = identity::from_der(certs[0].as_ref()).and_then(|who| {
            let subject = who.subject;
            who.role.map(|role| Caller {
                subject: subject.into(),
                role: Some(role),
            })
        });
        let mut cache = self.cache.write().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= CACHE_CONNECTIONS {
            cache.clear();
        }
        cache.insert(key, (certs, checked.clone()));
        checked
    }
}
