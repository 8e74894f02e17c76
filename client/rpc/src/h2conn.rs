//! A gRPC connection straight over the `h2` crate ([`H2Conn`]), plaintext or mutual TLS, which
//! the data-plane client uses instead of tonic's channel.
//!
//! Why: a unary call through tonic's `Channel` goes from the caller's task to a tower buffer
//! task, then through hyper's dispatch to its connection task, and hyper's HTTP/2 client sends the
//! request's body from yet another task once the stream has flow-control capacity: the request
//! leaves in two writes (HEADERS, then DATA) and the server wakes up twice for it. Here the caller's
//! task hands the headers and the whole encoded body to the `h2` connection at once, so the
//! request leaves in one write. Measured against tonic's echo, the caller's CPU per call fell by
//! a quarter to a third (docs/benchmarks/examples.md, `transport_cost`).
//!
//! What it keeps of the channel's behaviour: lazy connection on first use; a connect timeout, one
//! attempt at a time, whose failure every caller waiting on it gets; `TCP_NODELAY`; mutual TLS
//! with the same certificates and checks (`seqsvr_auth::Tls`, HTTP/2 offered by ALPN); a new
//! connection after the old one ends; and the failure classes `classify` relies on: an error
//! while connecting, or a stream the connection would not open, is a [`ConnectError`] (no byte of
//! the request was sent; a connection found closed before the stream opens is replaced once
//! first); anything after the stream opened may have reached the server.
//!
//! Deliberately left out: request bodies that stream (the body is read whole before the request
//! goes out; every call this is used for is unary), and HTTP/2 keepalive pings (callers bound
//! every attempt with a timeout).

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use tonic::body::Body;
use tonic::codegen::http;

use crate::call::{BoxError, CallFuture};

/// Flow-control windows the connection advertises: hyper's client defaults, which tonic's channel
/// used, so that a large batch reply never waits for a window update.
const STREAM_WINDOW: u32 = 2 * 1024 * 1024;
const CONNECTION_WINDOW: u32 = 5 * 1024 * 1024;

/// The connection could not be made: no request bytes were sent on it.
#[derive(Debug)]
pub struct ConnectError(BoxError);

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot connect: {}", self.0)
    }
}

impl std::error::Error for ConnectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

/// One HTTP/2 connection to `host:port`, plaintext or mutual TLS, made on first use and again
/// after it ends.
/// Cheap to clone: clones share the connection.
#[derive(Clone)]
pub struct H2Conn {
    inner: Arc<Inner>,
}

struct Inner {
    addr: String,
    authority: http::uri::Authority,
    /// `https` under TLS.
    scheme: http::uri::Scheme,
    tls: Option<(tokio_rustls::TlsConnector, rustls::pki_types::ServerName<'static>)>,
    connect_timeout: Duration,
    live: Mutex<Option<Live>>,
    /// Held while connecting, so that callers arriving meanwhile wait for that connection
    /// instead of each opening one; holds how the attempts so far ended.
    connecting: tokio::sync::Mutex<Attempts>,
    /// `Attempts::done`, readable without waiting for the lock.
    attempts_done: AtomicU64,
}

/// The connection attempts of an [`H2Conn`] so far.
#[derive(Default)]
struct Attempts {
    done: u64,
    /// Why the last one failed (none: it succeeded, or none was made).
    last_error: Option<String>,
}

/// An open connection: its handle for new streams and whether its task has ended.
#[derive(Clone)]
struct Live {
    send: h2::client::SendRequest<Bytes>,
    closed: Arc<AtomicBool>,
}

impl std::fmt::Debug for H2Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "H2Conn({})", self.inner.addr)
    }
}

impl H2Conn {
    /// A plaintext connection to `addr` (`host:port`), not yet opened: no IO.
    pub fn lazy(addr: &str, connect_timeout: Duration) -> Result<Self, String> {
        Self::new(addr, connect_timeout, None)
    }

    /// A connection to `addr` (`host:port`) under mutual TLS with `tls`, not yet opened: no IO.
    /// The server's certificate must name the address's host.
    pub fn lazy_tls(addr: &str, connect_timeout: Duration, tls: &seqsvr_auth::Tls) -> Result<Self, String> {
        let config = tls.rustls_client().map_err(|e| format!("TLS for {addr}: {e}"))?;
        Self::new(addr, connect_timeout, Some(tokio_rustls::TlsConnector::from(config)))
    }

    /// [`H2Conn::lazy_tls`] when `tls` is set, [`H2Conn::lazy`] otherwise.
    pub fn dial(addr: &str, connect_timeout: Duration, tls: Option<&seqsvr_auth::Tls>) -> Result<Self, String> {
        match tls {
            Some(tls) => Self::lazy_tls(addr, connect_timeout, tls),
            None => Self::lazy(addr, connect_timeout),
        }
    }

    fn new(addr: &str, connect_timeout: Duration, tls: Option<tokio_rustls::TlsConnector>) -> Result<Self, String> {
        let authority: http::uri::Authority = addr.parse().map_err(|e| format!("bad address {addr:?}: {e}"))?;
        if authority.port_u16().is_none() {
            return Err(format!("bad address {addr:?}: no port"));
        }
        let (scheme, tls) = match tls {
            None => (http::uri::Scheme::HTTP, None),
            Some(connector) => {
                let host = authority
                    .host()
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_owned();
                let name = rustls::pki_types::ServerName::try_from(host)
                    .map_err(|e| format!("bad address {addr:?} for TLS: {e}"))?;
                (http::uri::Scheme::HTTPS, Some((connector, name)))
            }
        };
        Ok(Self {
            inner: Arc::new(Inner {
                addr: addr.to_owned(),
                authority,
                scheme,
                tls,
                connect_timeout,
                live: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(Attempts::default()),
                attempts_done: AtomicU64::new(0),
            }),
        })
    }

    /// Sends one gRPC request and answers its response, whose body streams as it arrives.
    pub fn call(&self, req: http::Request<Body>) -> CallFuture {
        let this = self.clone();
        Box::pin(async move {
            let (mut parts, body) = req.into_parts();
            let data = read_whole(body).await?;
            let mut uri = http::uri::Parts::default();
            uri.scheme = Some(this.inner.scheme.clone());
            uri.authority = Some(this.inner.authority.clone());
            uri.path_and_query = parts.uri.path_and_query().cloned();
            parts.uri = http::Uri::from_parts(uri)?;
            let head = http::Request::from_parts(parts, ());
            let (response, mut stream) = this.open(head).await?;
            // From here on the server may have the request.
            stream.send_data(data, true)?;
            let response = response.await?;
            Ok(response.map(|recv| Body::new(RecvBody { recv, data_done: false })))
        })
    }

    /// Opens the request's stream on the live connection, or on a new one when the live one is
    /// found closed (it ended, or the server sent GOAWAY): a stream that was not opened sent nothing.
    async fn open(
        &self,
        head: http::Request<()>,
    ) -> Result<(h2::client::ResponseFuture, h2::SendStream<Bytes>), BoxError> {
        let mut last = None;
        for _ in 0..2 {
            let live = self.live().await?;
            match live.send.clone().ready().await {
                Ok(mut send) => {
                    return send.send_request(head, false).map_err(|e| {
                        self.forget(&live);
                        ConnectError(e.into()).into_box()
                    });
                }
                Err(e) => {
                    self.forget(&live);
                    last = Some(e);
                }
            }
        }
        let closed = last.map_or_else(|| BoxError::from("connection closed"), Into::into);
        Err(ConnectError(closed).into_box())
    }

    /// The live connection, connecting first when there is none. Callers that waited while
    /// another's attempt failed get its error at once instead of trying in turn (behind an
    /// address that does not answer, each would otherwise wait out the connect timeout once more
    /// for every caller ahead of it), as tonic's channel fails every waiting request with its
    /// one failed connect.
    async fn live(&self) -> Result<Live, BoxError> {
        if let Some(live) = self.cached() {
            return Ok(live);
        }
        let seen = self.inner.attempts_done.load(Ordering::Acquire);
        let mut attempts = self.inner.connecting.lock().await;
        if let Some(live) = self.cached() {
            return Ok(live);
        }
        if attempts.done != seen
            && let Some(error) = &attempts.last_error
        {
            return Err(ConnectError(error.clone().into()).into_box());
        }
        let result = self.connect().await;
        attempts.done += 1;
        self.inner.attempts_done.store(attempts.done, Ordering::Release);
        match result {
            Ok(live) => {
                attempts.last_error = None;
                *self.inner.live.lock().unwrap_or_else(|e| e.into_inner()) = Some(live.clone());
                Ok(live)
            }
            Err(e) => {
                attempts.last_error = Some(e.to_string());
                Err(ConnectError(e).into_box())
            }
        }
    }

    fn cached(&self) -> Option<Live> {
        let live = self.inner.live.lock().unwrap_or_else(|e| e.into_inner());
        live.as_ref().filter(|l| !l.closed.load(Ordering::Acquire)).cloned()
    }

    /// Drops the live connection if it is still `dead` (another caller may have replaced it).
    fn forget(&self, dead: &Live) {
        let mut live = self.inner.live.lock().unwrap_or_else(|e| e.into_inner());
        if live.as_ref().is_some_and(|l| Arc::ptr_eq(&l.closed, &dead.closed)) {
            *live = None;
        }
    }

    async fn connect(&self) -> Result<Live, BoxError> {
        let closed = Arc::new(AtomicBool::new(false));
        let flag = closed.clone();
        let handshake = async {
            let tcp = tokio::net::TcpStream::connect(&self.inner.addr).await?;
            tcp.set_nodelay(true)?;
            let send = match &self.inner.tls {
                None => run(handshake(tcp).await?, flag),
                Some((connector, name)) => {
                    let tls = connector.connect(name.clone(), tcp).await?;
                    run(handshake(tls).await?, flag)
                }
            };
            Ok::<_, BoxError>(send)
        };
        let send = tokio::time::timeout(self.inner.connect_timeout, handshake)
            .await
            .map_err(|_| {
                format!(
                    "no connection to {} within {:?}",
                    self.inner.addr, self.inner.connect_timeout
                )
            })??;
        Ok(Live { send, closed })
    }
}

impl ConnectError {
    fn into_box(self) -> BoxError {
        Box::new(self)
    }
}

type Handshaken<T> = (h2::client::SendRequest<Bytes>, h2::client::Connection<T, Bytes>);

/// The HTTP/2 handshake over `io`, with this module's windows.
async fn handshake<T>(io: T) -> Result<Handshaken<T>, h2::Error>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    h2::client::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .handshake::<_, Bytes>(io)
        .await
}

/// Runs the connection's IO in a task of its own until the connection ends (an error, the
/// server's GOAWAY, or every handle dropped), then sets `closed`: the next call connects anew.
fn run<T>((send, connection): Handshaken<T>, closed: Arc<AtomicBool>) -> h2::client::SendRequest<Bytes>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let _ = connection.await;
        closed.store(true, Ordering::Release);
    });
    send
}

/// A request body read to its end: one chunk as it is (a unary request's encoded message), more
/// joined.
async fn read_whole(mut body: Body) -> Result<Bytes, BoxError> {
    let mut first: Option<Bytes> = None;
    let mut rest: Option<BytesMut> = None;
    while let Some(frame) = body.frame().await {
        let Ok(chunk) = frame?.into_data() else {
            continue; // request trailers: gRPC requests have none
        };
        match (&mut first, &mut rest) {
            (None, _) => first = Some(chunk),
            (Some(f), None) => {
                let mut joined = BytesMut::with_capacity(f.len() + chunk.len());
                joined.extend_from_slice(f);
                joined.extend_from_slice(&chunk);
                rest = Some(joined);
            }
            (Some(_), Some(joined)) => joined.extend_from_slice(&chunk),
        }
    }
    Ok(match rest {
        Some(joined) => joined.freeze(),
        None => first.unwrap_or_default(),
    })
}

/// A response body over an `h2` stream: its data, then its trailers (where gRPC puts the status).
/// Received bytes are given back to the flow-control window as they are handed on.
struct RecvBody {
    recv: h2::RecvStream,
    data_done: bool,
}

impl http_body::Body for RecvBody {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, h2::Error>>> {
        let this = &mut *self;
        if !this.data_done {
            match std::task::ready!(this.recv.poll_data(cx)) {
                Some(Ok(data)) => {
                    // Only fails for a stream already reset, which the next poll reports.
                    let _ = this.recv.flow_control().release_capacity(data.len());
                    return Poll::Ready(Some(Ok(http_body::Frame::data(data))));
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => this.data_done = true,
            }
        }
        match std::task::ready!(this.recv.poll_trailers(cx)) {
            Ok(Some(trailers)) => Poll::Ready(Some(Ok(http_body::Frame::trailers(trailers)))),
            Ok(None) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(e))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.recv.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bare HTTP/2 server on loopback answering every request with `reply_bytes` of data and
    /// gRPC's OK trailers, under TLS with `tls` when set; counts the connections it accepts.
    async fn big_replies_over(
        reply_bytes: usize,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                let tls = tls.clone();
                tokio::spawn(async move {
                    match tls {
                        None => answer(tcp, reply_bytes).await,
                        Some(config) => {
                            // A client that does not trust this server drops the handshake.
                            if let Ok(tls) = tokio_rustls::TlsAcceptor::from(config).accept(tcp).await {
                                answer(tls, reply_bytes).await;
                            }
                        }
                    }
                });
            }
        });
        (addr, accepted)
    }

    async fn big_replies(reply_bytes: usize) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        big_replies_over(reply_bytes, None).await
    }

    async fn answer<T>(io: T, reply_bytes: usize)
    where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let Ok(mut conn) = h2::server::handshake(io).await else {
            return;
        };
        while let Some(Ok((_req, mut respond))) = conn.accept().await {
            let head = http::Response::builder()
                .header("content-type", "application/grpc")
                .body(())
                .unwrap();
            let mut stream = respond.send_response(head, false).unwrap();
            stream.send_data(Bytes::from(vec![0u8; reply_bytes]), false).unwrap();
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
            stream.send_trailers(trailers).unwrap();
        }
    }

    /// A certificate of `role` for 127.0.0.1 from `ca`, as the processes load theirs.
    fn tls_of(ca: &seqsvr_auth::devca::DevCa, role: seqsvr_auth::Role) -> seqsvr_auth::Tls {
        use seqsvr_auth::devca::Spec;
        let issued = ca
            .issue(&Spec::new(role.name(), role, &["127.0.0.1".to_string()], 1))
            .unwrap();
        seqsvr_auth::Tls::from_pem(
            ca.cert_pem.as_bytes(),
            issued.cert_pem.as_bytes(),
            issued.key_pem.as_bytes(),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn under_tls_a_call_reaches_a_server_of_the_same_ca_and_never_one_of_another() {
        use seqsvr_auth::Role;
        let ours = seqsvr_auth::devca::DevCa::new("ours", 1).unwrap();
        let theirs = seqsvr_auth::devca::DevCa::new("theirs", 1).unwrap();
        let client = tls_of(&ours, Role::Client);

        let (addr, _) = big_replies_over(10, Some(tls_of(&ours, Role::AllocSvr).rustls_server().unwrap())).await;
        let conn = H2Conn::lazy_tls(&addr, Duration::from_secs(2), &client).unwrap();
        let response = conn.call(request(b"x")).await.expect("a call over TLS");
        let reply = response.into_body().collect().await.expect("body");
        assert_eq!(reply.to_bytes().len(), 10);

        let (addr, _) = big_replies_over(10, Some(tls_of(&theirs, Role::AllocSvr).rustls_server().unwrap())).await;
        let conn = H2Conn::lazy_tls(&addr, Duration::from_secs(2), &client).unwrap();
        let err = conn
            .call(request(b"x"))
            .await
            .expect_err("a server our CA did not sign");
        assert!(err.is::<ConnectError>(), "a failed handshake sent nothing: {err:?}");
    }

    fn request(body: &'static [u8]) -> http::Request<Body> {
        http::Request::builder()
            .method("POST")
            .uri("/seqsvr.v1.AllocService/FetchNextSeq")
            .body(Body::new(http_body_util::Full::new(Bytes::from_static(body))))
            .unwrap()
    }

    #[tokio::test]
    async fn replies_beyond_both_flow_control_windows_keep_arriving() {
        // 6 MiB a reply: past the stream's 2 MiB window and the connection's 5 MiB. Without the
        // capacity given back as data is read, the first reply would stop at 2 MiB (h2 returns
        // a stream's unread capacity only when the stream is dropped), and the timeout turns
        // that into a failure.
        const REPLY: usize = 6 * 1024 * 1024;
        let (addr, accepted) = big_replies(REPLY).await;
        let conn = H2Conn::lazy(&addr, Duration::from_secs(1)).unwrap();
        for i in 0..3 {
            let reply = tokio::time::timeout(Duration::from_secs(10), async {
                let response = conn.call(request(b"x")).await.expect("call");
                response.into_body().collect().await.expect("body")
            })
            .await
            .unwrap_or_else(|_| panic!("reply {i} stalled"));
            let trailers = reply.trailers().cloned().expect("trailers");
            assert_eq!(trailers["grpc-status"], "0");
            assert_eq!(reply.to_bytes().len(), REPLY);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "one connection for every call");
    }

    #[tokio::test]
    async fn nothing_listening_is_a_connect_error() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        let conn = H2Conn::lazy(&addr, Duration::from_secs(1)).unwrap();
        let err = conn.call(request(b"x")).await.expect_err("nothing listens");
        assert!(err.is::<ConnectError>(), "{err:?}");
    }

    #[tokio::test]
    async fn callers_waiting_on_a_failed_connect_fail_with_it_instead_of_each_trying_again() {
        // A server that accepts and never answers the TLS handshake: each connect attempt takes
        // the whole connect timeout.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((tcp, _)) = listener.accept().await {
                held.push(tcp);
            }
        });
        let ca = seqsvr_auth::devca::DevCa::new("ours", 1).unwrap();
        let timeout = Duration::from_millis(300);
        let conn = H2Conn::lazy_tls(&addr, timeout, &tls_of(&ca, seqsvr_auth::Role::Client)).unwrap();
        let started = tokio::time::Instant::now();
        let calls: Vec<_> = (0..5).map(|_| tokio::spawn(conn.call(request(b"x")))).collect();
        for call in calls {
            let err = call.await.unwrap().expect_err("the handshake never completes");
            assert!(err.is::<ConnectError>(), "{err:?}");
        }
        // One attempt for all five (each trying in turn would take five timeouts).
        assert!(started.elapsed() < timeout * 3, "took {:?}", started.elapsed());
    }

    #[test]
    fn an_address_without_a_port_is_refused_before_any_io() {
        assert!(H2Conn::lazy("127.0.0.1", Duration::from_secs(1)).is_err());
        assert!(H2Conn::lazy("not an address", Duration::from_secs(1)).is_err());
        assert!(H2Conn::lazy("localhost:7300", Duration::from_secs(1)).is_ok());
    }
}
