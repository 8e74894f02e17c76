//! How every seqsvr gRPC server limits its work: one function, [`apply`], sets them on a tonic
//! `Server` builder, so the AllocSvr and the StoreSvr cannot drift apart.
//!
//! What a server is held to, and why each bound is where it is:
//!
//! - **Calls in flight, whole server** ([`ServeLimits::max_in_flight`]): counted from the moment a
//!   call reaches the router to the moment its reply headers are ready. A call above the limit is
//!   refused at once with RESOURCE_EXHAUSTED marked overloaded ([`crate::refusal`]), which the
//!   client library retries after a backoff: an early, cheap refusal instead of a queue that grows
//!   until every caller's latency collapses. Some services are exempt (the StoreSvr's Raft peers and
//!   health checks): shedding a heartbeat under a flood of client calls would start an election and
//!   make the overload worse.
//! - **A reserve for light connections** ([`CONNECTION_RESERVE`]): over the limit, a call is
//!   still admitted when its connection has no other call in flight, up to twice the limit in
//!   all. Shedding hits the connections that send many calls at once — a flood, or a busy
//!   multiplexed channel, whose client backs off — and a caller that waits for each reply before
//!   the next keeps being served. Connections are told apart by their peer address.
//! - **Streams per connection** ([`ServeLimits::max_streams_per_connection`]): HTTP/2's
//!   `SETTINGS_MAX_CONCURRENT_STREAMS`. A well-behaved client queues calls above it on its own side
//!   (tonic does), so one busy connection cannot take the whole in-flight budget, and a client that
//!   ignores it gets its extra streams refused by the HTTP/2 layer. It is also what bounds a slow
//!   reader: a stream whose reply is not read stays open (its reply buffered, at most one message)
//!   but no longer counts as in flight. This is the per-connection limit; tonic's separate
//!   per-connection handler limit would only repeat it.
//! - **Deadlines** ([`ServeLimits::rpc_timeout`]): every handler is cut at the shorter of the
//!   caller's `grpc-timeout` and this bound (tonic's server does both), answering CANCELLED; the
//!   handler's future is dropped, so a caller that gave up costs no more work. The bound catches
//!   callers that send no deadline.
//! - **Dead peers**: HTTP/2 keepalive pings every [`KEEPALIVE_INTERVAL`]; a peer that does not
//!   answer within [`KEEPALIVE_TIMEOUT`] loses its connection and the streams it held.
//! - **Message sizes**: not here; each service sets them from [`crate::limits`].
//!
//! Deliberately left out: a limit on the number of connections (the process's file descriptor
//! limit is that bound; each connection costs a few kilobytes and at most its stream limit in
//! replies), rate limits per caller (no caller identity on a plaintext server), and priorities
//! between well-behaved and flooding callers: under a flood that is cheap to serve, the server's
//! CPU is shared by everyone who reaches it (docs/BENCHMARKS.md has what that costs).

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::transport::Server;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tower::layer::util::Stack;
use tower::{Layer, Service};

use crate::refusal;

/// Interval of HTTP/2 keepalive pings to every peer: a dead peer's connection is dropped within
/// this plus [`KEEPALIVE_TIMEOUT`], instead of holding its streams until TCP gives up (minutes).
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);

/// How long a peer may take to answer a keepalive ping before its connection is closed.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Calls a connection may have in flight and still be admitted over the server's limit (up to
/// twice the limit): one, so that a caller that waits for each reply before the next is never
/// shed, while a connection with many calls at once is. A larger reserve lets every flooding
/// connection past the limit too: the 40 flooding connections of allocsvr/tests/flood.rs would
/// get up to 160 calls over the limit with a reserve of 4.
pub const CONNECTION_RESERVE: usize = 1;

/// The limits one server runs with (flags of each binary; defaults below).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// Calls being handled at once, over all connections; more are refused as overloaded.
    pub max_in_flight: usize,
    /// HTTP/2 streams one connection may have open at once.
    pub max_streams_per_connection: u32,
    /// Longest a handler may run, whatever deadline the caller sent (or none).
    pub rpc_timeout: Duration,
}

/// AllocSvr defaults. A fetch takes microseconds of CPU and at most 500 ms waiting for a bump, so
/// a few thousand in flight is already far more than two cores can turn around quickly; 256
/// streams per connection is twice what the benchmark's busiest channel uses (128 callers); 10 s
/// is twenty times the longest a fetch waits.
pub const ALLOCSVR: ServeLimits = ServeLimits {
    max_in_flight: 4_096,
    max_streams_per_connection: 256,
    rpc_timeout: Duration::from_secs(10),
};

/// StoreSvr defaults. Its callers are a set's AllocSvrs (a few renewals, bumps and loads each),
/// operators and peers (exempt); a thousand calls in flight means something is wrong. Handlers
/// wait for Raft commits and may Load 2^18 sections, so the bound on one call is longer.
pub const STORESVR: ServeLimits = ServeLimits {
    max_in_flight: 1_024,
    max_streams_per_connection: 128,
    rpc_timeout: Duration::from_secs(30),
};

impl ServeLimits {
    /// Checks that every limit allows some work; the error names the flag.
    pub fn check(&self) -> Result<(), String> {
        if self.max_in_flight == 0 {
            return Err("--max-in-flight must be > 0".into());
        }
        if self.max_streams_per_connection == 0 {
            return Err("--max-streams-per-connection must be > 0".into());
        }
        if self.rpc_timeout.is_zero() {
            return Err("--rpc-timeout-ms must be > 0".into());
        }
        Ok(())
    }
}

/// Called once for every call refused as overloaded (each server counts them in its metrics).
pub type ShedHook = Arc<dyn Fn() + Send + Sync>;

/// The layers of a `Server<L>` after [`apply`]: name it as `Server<Limited<L>>`.
pub type Limited<L> = Stack<ShedLayer, L>;

/// Sets `limits` on `server`: the HTTP/2 stream limit, the handler deadline, keepalive, and the
/// in-flight limit as the layer closest to the network of those added after this call (a layer
/// added before it, e.g. authentication, runs first). Calls to the gRPC services named in
/// `exempt` (full names, such as `seqsvr.v1.RaftService`) are never shed.
pub fn apply<L>(
    server: Server<L>,
    limits: &ServeLimits,
    exempt: &'static [&'static str],
    on_shed: ShedHook,
) -> Server<Limited<L>> {
    server
        .max_concurrent_streams(limits.max_streams_per_connection)
        .timeout(limits.rpc_timeout)
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .layer(ShedLayer::new(
            limits.max_in_flight,
            CONNECTION_RESERVE,
            exempt,
            on_shed,
        ))
}

/// The tower layer that refuses calls above the in-flight limit. Its clones (one per connection
/// and per call, as tonic makes them) share one count.
#[derive(Clone)]
pub struct ShedLayer {
    shared: Arc<Shared>,
}

struct Shared {
    in_flight: AtomicUsize,
    /// Calls in flight per connection (by peer address); a connection with none has no entry.
    per_connection: Mutex<HashMap<Option<SocketAddr>, usize>>,
    limit: usize,
    reserve: usize,
    exempt: &'static [&'static str],
    on_shed: ShedHook,
}

impl ShedLayer {
    /// A limit of `limit` calls in flight, over which a connection with fewer than `reserve` in
    /// flight is still admitted (up to `2 × limit`); the services in `exempt` are never refused.
    pub fn new(limit: usize, reserve: usize, exempt: &'static [&'static str], on_shed: ShedHook) -> Self {
        Self {
            shared: Arc::new(Shared {
                in_flight: AtomicUsize::new(0),
                per_connection: Mutex::new(HashMap::new()),
                limit,
                reserve,
                exempt,
                on_shed,
            }),
        }
    }

    /// Calls counted in flight now (exempt services are not counted).
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::Acquire)
    }
}

impl<S> Layer<S> for ShedLayer {
    type Service = Shed<S>;

    fn layer(&self, inner: S) -> Shed<S> {
        Shed {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service [`ShedLayer`] wraps around a server's router.
#[derive(Clone)]
pub struct Shed<S> {
    inner: S,
    shared: Arc<Shared>,
}

/// A slot of the in-flight counts, given back when the call's future ends or is dropped (a
/// deadline, a reset stream).
struct Slot {
    shared: Arc<Shared>,
    connection: Option<SocketAddr>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.shared.in_flight.fetch_sub(1, Ordering::AcqRel);
        let mut per = self.shared.per_connection();
        if let Some(n) = per.get_mut(&self.connection) {
            *n -= 1;
            if *n == 0 {
                per.remove(&self.connection);
            }
        }
    }
}

/// The peer address of the connection `req` came on (tonic puts it in the extensions), if any.
fn connection_of<B>(req: &http::Request<B>) -> Option<SocketAddr> {
    let ext = req.extensions();
    if let Some(tcp) = ext.get::<TcpConnectInfo>() {
        return tcp.remote_addr();
    }
    ext.get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(|tls| tls.get_ref().remote_addr())
}

impl Shared {
    fn is_exempt(&self, path: &str) -> bool {
        let Some(path) = path.strip_prefix('/') else {
            return false;
        };
        self.exempt
            .iter()
            .any(|svc| path.strip_prefix(svc).is_some_and(|rest| rest.starts_with('/')))
    }

    fn per_connection(&self) -> std::sync::MutexGuard<'_, HashMap<Option<SocketAddr>, usize>> {
        // The map holds plain counts: a panic elsewhere cannot leave it half-updated.
        self.per_connection.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for a call on `connection`, or `None` when it must be shed: `limit` calls are in
    /// flight and this connection has its reserve's worth, or twice `limit` are.
    fn try_enter(self: &Arc<Self>, connection: Option<SocketAddr>) -> Option<Slot> {
        let before = self.in_flight.fetch_add(1, Ordering::AcqRel);
        let mine = {
            let mut per = self.per_connection();
            let n = per.entry(connection).or_insert(0);
            *n += 1;
            *n - 1
        };
        let slot = Slot {
            shared: self.clone(),
            connection,
        };
        let admit = before < self.limit || (mine < self.reserve && before < 2 * self.limit);
        admit.then_some(slot)
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, RB> Service<http::Request<B>> for Shed<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>> + Clone,
    S::Future: Send + 'static,
    S::Error: Into<tower::BoxError>,
    RB: Default + Send + 'static,
{
    type Response = http::Response<RB>;
    type Error = tower::BoxError;
    // Boxed like tonic's own router futures: one allocation next to the dozens of a gRPC call.
    type Future = BoxFuture<Result<http::Response<RB>, tower::BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let slot = if self.shared.is_exempt(req.uri().path()) {
            None
        } else {
            match self.shared.try_enter(connection_of(&req)) {
                Some(slot) => Some(slot),
                None => {
                    (self.shared.on_shed)();
                    let status = refusal::overloaded(format!(
                        "server overloaded: {} calls in flight; retry after a backoff",
                        self.shared.limit
                    ));
                    return Box::pin(std::future::ready(Ok(status.into_http())));
                }
            }
        };
        // The instance that was polled ready serves; a fresh clone waits for the next call.
        let clone = self.inner.clone();
        let mut ready = std::mem::replace(&mut self.inner, clone);
        let served = ready.call(req);
        Box::pin(async move {
            let reply = served.await.map_err(Into::into);
            drop(slot);
            reply
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::sync::atomic::AtomicU64;
    use tokio::sync::Semaphore;
    use tower::ServiceExt;

    /// A stand-in router: each call waits for a permit of `gate`, then answers 200.
    fn router(
        gate: Arc<Semaphore>,
    ) -> impl Service<
        http::Request<()>,
        Response = http::Response<()>,
        Error = Infallible,
        Future = impl Future<Output = Result<http::Response<()>, Infallible>> + Send,
    > + Clone {
        tower::service_fn(move |_req: http::Request<()>| {
            let gate = gate.clone();
            async move {
                gate.acquire().await.unwrap().forget();
                Ok::<_, Infallible>(http::Response::new(()))
            }
        })
    }

    fn call(path: &str) -> http::Request<()> {
        http::Request::builder().uri(path).body(()).unwrap()
    }

    /// Yields until `done`, or fails the test after 5 s (a call refused that should have been
    /// admitted never raises the count).
    async fn wait_until(done: impl Fn() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while !done() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for the in-flight count"
            );
            tokio::task::yield_now().await;
        }
    }

    /// The answer of a call that must not wait (a refusal): a call wrongly admitted would wait
    /// for the gate forever, so the test fails instead of hanging.
    async fn at_once<F, E>(call: F) -> http::Response<()>
    where
        F: Future<Output = Result<http::Response<()>, E>>,
        E: std::fmt::Debug,
    {
        let answered = tokio::time::timeout(Duration::from_secs(5), call).await;
        answered.expect("answered at once").unwrap()
    }

    fn refusal_of(r: &http::Response<()>) -> Option<refusal::Refusal> {
        tonic::Status::from_header_map(r.headers()).and_then(|s| refusal::of(&s))
    }

    const EXEMPT: &[&str] = &["seqsvr.v1.RaftService"];

    #[tokio::test]
    async fn calls_above_the_limit_are_refused_as_overloaded_until_one_ends() {
        let gate = Arc::new(Semaphore::new(0));
        let shed = Arc::new(AtomicU64::new(0));
        let counted = shed.clone();
        let hook: ShedHook = Arc::new(move || _ = counted.fetch_add(1, Ordering::Relaxed));
        let layer = ShedLayer::new(2, 0, EXEMPT, hook);
        let svc = layer.layer(router(gate.clone()));
        let first = tokio::spawn(svc.clone().oneshot(call("/seqsvr.v1.AllocService/FetchNextSeq")));
        let second = tokio::spawn(svc.clone().oneshot(call("/seqsvr.v1.AllocService/GetCurSeq")));
        wait_until(|| layer.in_flight() >= 2).await;
        let refused = at_once(svc.clone().oneshot(call("/seqsvr.v1.AllocService/FetchNextSeq"))).await;
        assert_eq!(refusal_of(&refused), Some(refusal::Refusal::Overloaded));
        assert_eq!(
            (shed.load(Ordering::Relaxed), layer.in_flight()),
            (1, 2),
            "a refusal holds no slot"
        );

        // Peers are never shed, and are not counted.
        let peer = tokio::spawn(svc.clone().oneshot(call("/seqsvr.v1.RaftService/Vote")));
        gate.add_permits(1);
        let done = tokio::select! { r = first => r, r = second => r, r = peer => r };
        assert_eq!(refusal_of(&done.unwrap().unwrap()), None);
        gate.add_permits(2);
        wait_until(|| layer.in_flight() == 0).await;
        let admitted = tokio::spawn(svc.clone().oneshot(call("/seqsvr.v1.AllocService/FetchNextSeq")));
        gate.add_permits(1);
        assert_eq!(refusal_of(&admitted.await.unwrap().unwrap()), None);
        assert_eq!(shed.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn a_dropped_call_gives_its_slot_back() {
        let gate = Arc::new(Semaphore::new(0));
        let layer = ShedLayer::new(1, 0, EXEMPT, Arc::new(|| {}));
        let mut svc = layer.layer(router(gate.clone()));
        let pending = svc.ready().await.unwrap().call(call("/a.B/C"));
        assert_eq!(layer.in_flight(), 1);
        // What tonic does when the caller's deadline passes or its stream is reset.
        drop(pending);
        assert_eq!(layer.in_flight(), 0);
        gate.add_permits(1);
        let r = svc.oneshot(call("/a.B/C")).await.unwrap();
        assert_eq!(refusal_of(&r), None);
    }

    fn on(connection: u16, path: &str) -> http::Request<()> {
        let mut req = call(path);
        let remote = SocketAddr::from(([127, 0, 0, 1], connection));
        req.extensions_mut().insert(TcpConnectInfo {
            local_addr: None,
            remote_addr: Some(remote),
        });
        req
    }

    #[tokio::test]
    async fn over_the_limit_a_light_connection_is_served_and_a_heavy_one_shed() {
        let gate = Arc::new(Semaphore::new(0));
        let layer = ShedLayer::new(4, 2, EXEMPT, Arc::new(|| {}));
        let svc = layer.layer(router(gate.clone()));
        let path = "/seqsvr.v1.AllocService/FetchNextSeq";
        // The heavy connection fills the limit on its own.
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(tokio::spawn(svc.clone().oneshot(on(1, path))));
        }
        wait_until(|| layer.in_flight() >= 4).await;
        let heavy = at_once(svc.clone().oneshot(on(1, path))).await;
        assert_eq!(refusal_of(&heavy), Some(refusal::Refusal::Overloaded));
        // A light connection still gets its reserve of two, then is shed too.
        for _ in 0..2 {
            held.push(tokio::spawn(svc.clone().oneshot(on(2, path))));
        }
        wait_until(|| layer.in_flight() >= 6).await;
        let third = at_once(svc.clone().oneshot(on(2, path))).await;
        assert_eq!(refusal_of(&third), Some(refusal::Refusal::Overloaded));
        // At twice the limit even a connection with nothing in flight is shed.
        for c in 3..5 {
            held.push(tokio::spawn(svc.clone().oneshot(on(c, path))));
        }
        wait_until(|| layer.in_flight() >= 8).await;
        let capped = at_once(svc.clone().oneshot(on(5, path))).await;
        assert_eq!(refusal_of(&capped), Some(refusal::Refusal::Overloaded));
        gate.add_permits(held.len());
        for h in held {
            assert_eq!(refusal_of(&h.await.unwrap().unwrap()), None);
        }
        assert_eq!(layer.in_flight(), 0);
        assert!(layer.shared.per_connection().is_empty(), "no entry outlives its calls");
    }

    #[test]
    fn only_whole_service_names_are_exempt() {
        let layer = ShedLayer::new(
            1,
            0,
            &["seqsvr.v1.RaftService", "grpc.health.v1.Health"],
            Arc::new(|| {}),
        );
        let cases = [
            ("/seqsvr.v1.RaftService/AppendEntries", true),
            ("/grpc.health.v1.Health/Check", true),
            ("/seqsvr.v1.RaftServiceX/Vote", false),
            ("/seqsvr.v1.StoreService/Bump", false),
            ("seqsvr.v1.RaftService/Vote", false),
            ("/seqsvr.v1.RaftService", false),
            ("/", false),
        ];
        for (path, exempt) in cases {
            assert_eq!(layer.shared.is_exempt(path), exempt, "{path}");
        }
    }

    #[test]
    fn defaults_pass_their_own_check_and_zeros_name_the_flag() {
        ALLOCSVR.check().unwrap();
        STORESVR.check().unwrap();
        let zeros = [
            (
                ServeLimits {
                    max_in_flight: 0,
                    ..ALLOCSVR
                },
                "--max-in-flight",
            ),
            (
                ServeLimits {
                    max_streams_per_connection: 0,
                    ..ALLOCSVR
                },
                "--max-streams-per-connection",
            ),
            (
                ServeLimits {
                    rpc_timeout: Duration::ZERO,
                    ..ALLOCSVR
                },
                "--rpc-timeout-ms",
            ),
        ];
        for (limits, flag) in zeros {
            assert!(limits.check().unwrap_err().contains(flag), "{limits:?}");
        }
    }
}
