//! How every seqsvr gRPC server limits its work: one function, [`apply`], sets them on a tonic
//! `Server` builder, so the AllocSvr and the StoreSvr cannot drift apart.
//!
//! What a server is held to, and why each bound is where it is:
//!
//! - **Calls in flight, whole server** ([`ServeLimits::max_in_flight`]): counted from the moment a
//!   call reaches the router to the moment its reply headers are ready, or until its handler
//!   steps out to wait for something other than the CPU ([`InFlight::step_out`]). A call above
//!   the limit **waits** for a slot (parked: no CPU) rather than being refused at once: a refusal
//!   costs about what a cheap call does, and a client that retries at once turns refusals into a
//!   churn that keeps the server saturated. A parked call holds one of its connection's HTTP/2
//!   streams, so a connection whose streams all wait cannot send more, and a flood slows to the
//!   rate the server completes calls. Slots are granted **round-robin over connections**
//!   ([`admission`]): a call waits behind at most one grant per other connection, not behind a
//!   flood's backlog. The limit is small (the AllocSvr's is 32 per CPU): granted calls are runnable
//!   tasks, and every new call waits behind them in the runtime's queue.
//! - **Shedding**: a call that finds [`MAX_PARKED`] calls waiting, or waits [`MAX_PARK_WAIT`]
//!   without a slot, is refused with RESOURCE_EXHAUSTED marked overloaded ([`seqsvr_proto::refusal`]),
//!   which the client library retries after a backoff. A caller that gives up (deadline, reset
//!   stream) leaves the queue. Some services are exempt and never wait (the StoreSvr's Raft peers,
//!   health checks): a heartbeat held up by a flood of client calls would start an election.
//! - **A reserve for light connections** ([`CONNECTION_RESERVE`]): over the limit, a call is
//!   still admitted at once when its connection has no other call in flight or waiting, up to
//!   twice the limit in all: a caller that waits for each reply before the next never waits for a
//!   slot. Connections are told apart by their peer address.
//! - **Streams per connection** ([`ServeLimits::max_streams_per_connection`]): HTTP/2's
//!   `SETTINGS_MAX_CONCURRENT_STREAMS`. A well-behaved client queues calls above it on its own side
//!   (tonic does), so one connection can park at most this many calls, and a client that ignores it
//!   gets its extra streams refused by the HTTP/2 layer. It also bounds a slow reader: a stream
//!   whose reply is not read stays open (its reply buffered, at most one message) but no longer
//!   counts as in flight.
//! - **Deadlines** ([`ServeLimits::rpc_timeout`]): every call, waiting or running, is cut at the
//!   shorter of the caller's `grpc-timeout` and this bound (tonic's server does both), answering
//!   CANCELLED; the call's future is dropped, so a caller that gave up costs no more work. The
//!   bound catches callers that send no deadline.
//! - **Dead peers**: TCP keepalive on every accepted connection ([`incoming`]): a peer whose host
//!   died or was cut off loses its connection, and the streams it held, within
//!   [`KEEPALIVE_TIME`] + [`KEEPALIVE_PROBES`] × [`KEEPALIVE_PROBE_INTERVAL`] of its last packet.
//!   Not HTTP/2 pings: with them hyper stamps every frame it reads with a clock read under a lock
//!   and polls its pinger at every wake-up of the connection, about 1,700 instructions per call
//!   (callgrind, docs/journal/benchmarks-2026-11.md), where the kernel's probes cost a call nothing. What pings
//!   would add — a peer whose host answers TCP but whose process has stopped reading — holds at
//!   most its stream limit of calls, each cut at its deadline.
//! - **Message sizes**: not here; each service sets them from [`seqsvr_proto::limits`].
//!
//! Deliberately left out: a limit on the number of connections (the process's file descriptor
//! limit is that bound; each connection costs a few kilobytes and at most its stream limit in
//! replies), rate limits per caller (no caller identity on a plaintext server), priorities between
//! connections beyond the round-robin, and any control over the HTTP/2 work a flooding connection
//! costs before its calls reach the limit (reading and answering its frames): under a flood the
//! server's CPU is still shared by every connection that sends (docs/benchmarks/overload.md).

mod admission;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tonic::transport::Server;
use tonic::transport::server::{TcpConnectInfo, TcpIncoming, TlsConnectInfo};
use tower::layer::util::Stack;
use tower::{Layer, Service};

pub use admission::Bounds;
use admission::{Admission, Connection, Entry, Slot};
use seqsvr_proto::refusal;

/// Silence on a connection after which the kernel starts probing its peer (TCP keepalive): a dead
/// peer's connection is dropped about 40 s after its last packet, instead of holding its streams
/// until TCP gives up on its own (hours, for a connection with nothing to send).
pub const KEEPALIVE_TIME: Duration = Duration::from_secs(20);

/// Time between two unanswered keepalive probes.
pub const KEEPALIVE_PROBE_INTERVAL: Duration = Duration::from_secs(5);

/// Unanswered probes after which the connection is closed.
pub const KEEPALIVE_PROBES: u32 = 4;

/// The accepted connections of `listener` as every seqsvr gRPC server takes them: `TCP_NODELAY`
/// (Nagle's algorithm with delayed ACKs would add ~40 ms to small RPCs) and TCP keepalive.
pub fn incoming(listener: tokio::net::TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .with_keepalive(Some(KEEPALIVE_TIME))
        .with_keepalive_interval(Some(KEEPALIVE_PROBE_INTERVAL))
        .with_keepalive_retries(Some(KEEPALIVE_PROBES))
}

/// Calls a connection may have in flight and still be admitted over the server's limit (up to
/// twice the limit): one, so that a caller that waits for each reply before the next never waits
/// for a slot, while a connection with many calls at once does. A larger reserve lets every
/// flooding connection past the limit too: the 40 flooding connections of allocsvr/tests/flood.rs
/// would get up to 160 calls over the limit with a reserve of 4.
pub const CONNECTION_RESERVE: usize = 1;

/// Calls that may wait for a slot at once, whole server; more are refused at once. A waiting call
/// costs no CPU, only its stream's memory (a task, the headers, at most one stream window of
/// body): a few thousand are a few megabytes. Each connection can hold at most its stream limit of
/// them, so this bounds what many connections together can pin.
pub const MAX_PARKED: usize = 4_096;

/// Longest a call waits for a slot before it is refused as overloaded. Well under the client
/// library's 1 s attempt timeout, so the caller hears "overloaded" (and backs off) with time left
/// to retry inside its deadline, instead of its attempt timing out; long enough to ride out a
/// burst, which a server turning calls around in microseconds drains in a few milliseconds.
pub const MAX_PARK_WAIT: Duration = Duration::from_millis(200);

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

/// Calls in flight per CPU, the AllocSvr's default limit ([`allocsvr`]). A fetch takes
/// microseconds of CPU, and a fetch that waits for a bump gives its slot back while it waits
/// ([`InFlight::step_out`]), so the calls holding slots are calls using the CPU: a few per core
/// keep every worker busy, and more only lengthen the run queue every new call waits in. Under
/// flood (b) of docs/benchmarks/overload.md, one core: a well-behaved caller's p99 was 0.4–0.9
/// ms at 4 in flight, 0.9 ms at 8, 1.3 ms at 16, 2.3 ms at 32 and 2.8 ms at 256, against 0.3–0.5
/// ms unloaded. But each call above the limit waits and is woken, and with 4 per CPU that cost the
/// data plane a quarter of its batch100 throughput at 256 callers (alloc-bench, 0.74 of the echo
/// against 0.96 with no effective limit, 2026-11-23); at 32 per CPU it was 0.91, within noise of no
/// limit. A sequence service is first a throughput service, so the default is 32; an operator who
/// expects floods from callers they do not control sets `--max-in-flight` to 4 per CPU for the
/// tighter tail (docs/operations/alerts.md, SeqsvrOverloaded).
pub const ALLOCSVR_IN_FLIGHT_PER_CPU: usize = 32;

/// Calls in flight per CPU for an AllocSvr that expects floods from callers it does not control
/// (`--max-in-flight` set to this times the CPUs). Fewer calls holding slots means fewer runnable
/// tasks a light caller's request queues behind: under flood (b) with the flood off the server's
/// core, a well-behaved caller's p99 was 1.2–1.6× unloaded at 4 per CPU and about 4× at 32
/// (docs/benchmarks/overload.md), for a quarter of batch100's throughput at 256 callers.
pub const ALLOCSVR_FLOOD_HARDENED_IN_FLIGHT_PER_CPU: usize = 4;

/// AllocSvr defaults: [`ALLOCSVR_IN_FLIGHT_PER_CPU`] calls in flight for each CPU the process may
/// run on; 256 streams per connection, twice what the benchmark's busiest channel uses (128
/// callers); 10 s, twenty times the longest a fetch waits.
pub fn allocsvr() -> ServeLimits {
    ServeLimits {
        max_in_flight: in_flight_for_cpus(ALLOCSVR_IN_FLIGHT_PER_CPU),
        max_streams_per_connection: 256,
        rpc_timeout: Duration::from_secs(10),
    }
}

/// `per_cpu` calls in flight for each CPU the calling thread may run on.
pub fn in_flight_for_cpus(per_cpu: usize) -> usize {
    per_cpu * std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// StoreSvr defaults. Its callers are a set's AllocSvrs (a few renewals, bumps and loads each),
/// operators and peers (exempt); a thousand calls in flight means something is wrong. Handlers
/// wait for Raft commits and may Load 2^18 sections, so the bound on one call is longer.
pub const STORESVR: ServeLimits = ServeLimits {
    max_in_flight: 1_024,
    max_streams_per_connection: 128,
    rpc_timeout: Duration::from_secs(30),
};

impl ServeLimits {
    /// The admission bounds these limits give: the in-flight limit, with the reserve and the
    /// waiting bounds every server shares.
    pub fn bounds(&self) -> Bounds {
        Bounds {
            limit: self.max_in_flight,
            reserve: CONNECTION_RESERVE,
            max_parked: MAX_PARKED,
            max_wait: MAX_PARK_WAIT,
        }
    }

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

/// What a server counts of its admission (each server counts them in its metrics).
#[derive(Clone)]
pub struct Hooks {
    /// Called once for every call refused as overloaded.
    pub shed: Arc<dyn Fn() + Send + Sync>,
    /// Called once for every call that had to wait for a slot.
    pub parked: Arc<dyn Fn() + Send + Sync>,
}

impl Hooks {
    /// Hooks that count nothing.
    pub fn none() -> Self {
        Self {
            shed: Arc::new(|| {}),
            parked: Arc::new(|| {}),
        }
    }
}

/// The layers of a `Server<L>` after [`apply`]: name it as `Server<Limited<L>>`.
pub type Limited<L> = Stack<ShedLayer, L>;

/// Sets `limits` on `server`: the HTTP/2 stream limit, the handler deadline, and the in-flight
/// limit as the layer closest to the network of those added after this call (a layer added before
/// it, e.g. authentication, runs first). Keepalive is the listener's ([`incoming`]). Calls to the
/// gRPC services named in `exempt` (full names, such as `seqsvr.v1.RaftService`) are never shed.
pub fn apply<L>(
    server: Server<L>,
    limits: &ServeLimits,
    exempt: &'static [&'static str],
    hooks: Hooks,
) -> Server<Limited<L>> {
    apply_with(server, limits, ShedLayer::new(limits.bounds(), exempt, hooks))
}

/// [`apply`] with an admission layer the caller keeps: a clone of `shed` wrapped around the same
/// service called in process shares its count (an AllocSvr's front ends call its gRPC service so).
pub fn apply_with<L>(server: Server<L>, limits: &ServeLimits, shed: ShedLayer) -> Server<Limited<L>> {
    server
        .max_concurrent_streams(limits.max_streams_per_connection)
        .timeout(limits.rpc_timeout)
        .layer(shed)
}

/// The tower layer that admits, parks or refuses calls against the in-flight limit
/// ([`admission`]). Its clones (one per connection and per call, as tonic makes them) share one
/// count.
#[derive(Clone)]
pub struct ShedLayer {
    shared: Arc<ShedState>,
}

struct ShedState {
    admission: Arc<Admission>,
    exempt: &'static [&'static str],
    hooks: Hooks,
}

impl ShedLayer {
    /// Admission within `bounds`; the services in `exempt` are never parked or refused.
    pub fn new(bounds: Bounds, exempt: &'static [&'static str], hooks: Hooks) -> Self {
        Self {
            shared: Arc::new(ShedState {
                admission: Arc::new(Admission::new(bounds)),
                exempt,
                hooks,
            }),
        }
    }

    /// Calls holding a slot now (exempt services are not counted).
    pub fn in_flight(&self) -> usize {
        self.shared.admission.in_flight()
    }

    /// Calls waiting for a slot now.
    pub fn parked(&self) -> usize {
        self.shared.admission.parked()
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
    shared: Arc<ShedState>,
}

/// The peer address of the connection `req` came on (tonic puts it in the extensions), if any.
fn connection_of<B>(req: &http::Request<B>) -> Connection {
    let ext = req.extensions();
    if let Some(tcp) = ext.get::<TcpConnectInfo>() {
        return tcp.remote_addr();
    }
    ext.get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(|tls| tls.get_ref().remote_addr())
}

impl ShedState {
    fn is_exempt(&self, path: &str) -> bool {
        let Some(path) = path.strip_prefix('/') else {
            return false;
        };
        self.exempt
            .iter()
            .any(|svc| path.strip_prefix(svc).is_some_and(|rest| rest.starts_with('/')))
    }

    /// Counts a refusal and builds its answer.
    fn shed<RB: Default>(&self) -> http::Response<RB> {
        (self.hooks.shed)();
        let status = refusal::overloaded(format!(
            "server overloaded: {} calls in flight and more waiting; retry after a backoff",
            self.admission.bounds().limit
        ));
        status.into_http()
    }
}

tokio::task_local! {
    /// The slot of the call being served on this task: [`Shed`] sets it around the call.
    static HELD: std::cell::Cell<Option<Slot>>;
}

/// The slot the call being served holds. A handler about to wait for something other than the
/// CPU (an AllocSvr fetch waiting for its section's bump, up to 500 ms) gives its slot back with
/// [`InFlight::step_out`], so that a wait elsewhere does not keep every other call parked: the
/// in-flight limit bounds calls that are using the CPU, and can then be small. The call runs on
/// without a slot; what is left of it is the reply.
///
/// The slot lives in a task-local that [`Shed`] sets around the call (tonic polls a call's
/// handler inside the future of the layers around it), not in the request's extensions: an
/// extension is a shared, locked allocation plus an insert that grows the request's map, about
/// 700 instructions a call (callgrind, docs/journal/benchmarks-2026-11.md), and this costs two swaps per poll.
/// So `step_out` works only on the call's own task, which is where handlers await their waits.
pub struct InFlight;

impl InFlight {
    /// Gives back the slot of the call being served on this task now: nothing if it holds none
    /// (an exempt service, a handler called directly in a test) or gave it back already.
    pub fn step_out() {
        // Outside a call (no scope set) there is nothing to give back.
        let _ = HELD.try_with(|held| drop(held.take()));
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, RB> Service<http::Request<B>> for Shed<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<tower::BoxError>,
    B: Send + 'static,
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
        let entry = if self.shared.is_exempt(req.uri().path()) {
            None
        } else {
            Some(self.shared.admission.enter(connection_of(&req)))
        };
        match entry {
            Some(Entry::Refused) => return Box::pin(std::future::ready(Ok(self.shared.shed()))),
            Some(Entry::Parked(_)) => (self.shared.hooks.parked)(),
            Some(Entry::Admitted(_)) | None => {}
        }
        // The instance that was polled ready serves; a fresh clone waits for the next call.
        let clone = self.inner.clone();
        let mut ready = std::mem::replace(&mut self.inner, clone);
        let shared = self.shared.clone();
        Box::pin(async move {
            let slot = match entry {
                Some(Entry::Parked(ticket)) => match ticket.wait().await {
                    Some(slot) => Some(slot),
                    None => return Ok(shared.shed()),
                },
                Some(Entry::Admitted(slot)) => Some(slot),
                Some(Entry::Refused) | None => None,
            };
            // The handler starts only once the call holds its slot: a parked call has done no
            // work but reading its headers. The slot goes back when the scope's future is
            // dropped, at the end of this statement, unless the handler stepped out before.
            let reply = HELD.scope(std::cell::Cell::new(slot), ready.call(req)).await;
            reply.map_err(Into::into)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicU64, Ordering};
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

    /// Bounds for a test: no call waits longer than the test runs unless it says so.
    fn bounds(limit: usize, reserve: usize, max_parked: usize) -> Bounds {
        Bounds {
            limit,
            reserve,
            max_parked,
            max_wait: Duration::from_secs(3_600),
        }
    }

    /// Hooks that count refusals and waits into `counts`.
    fn counting(counts: &Arc<[AtomicU64; 2]>) -> Hooks {
        let (shed, parked) = (counts.clone(), counts.clone());
        Hooks {
            shed: Arc::new(move || _ = shed[0].fetch_add(1, Ordering::Relaxed)),
            parked: Arc::new(move || _ = parked[1].fetch_add(1, Ordering::Relaxed)),
        }
    }

    #[tokio::test]
    async fn with_no_room_to_wait_calls_above_the_limit_are_refused_as_overloaded() {
        let gate = Arc::new(Semaphore::new(0));
        let counts = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let shed = &counts[0];
        let layer = ShedLayer::new(bounds(2, 0, 0), EXEMPT, counting(&counts));
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
        let layer = ShedLayer::new(bounds(1, 0, 0), EXEMPT, Hooks::none());
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
        let layer = ShedLayer::new(bounds(4, 2, 0), EXEMPT, Hooks::none());
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
        assert_eq!(layer.shared.admission.connections(), 0, "no entry outlives its calls");
    }

    #[tokio::test]
    async fn a_call_over_the_limit_waits_for_a_slot_and_is_served() {
        let gate = Arc::new(Semaphore::new(0));
        let counts = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let layer = ShedLayer::new(bounds(1, 0, 10), EXEMPT, counting(&counts));
        let svc = layer.layer(router(gate.clone()));
        let path = "/seqsvr.v1.AllocService/FetchNextSeq";
        let first = tokio::spawn(svc.clone().oneshot(on(1, path)));
        wait_until(|| layer.in_flight() == 1).await;
        let second = tokio::spawn(svc.clone().oneshot(on(2, path)));
        wait_until(|| layer.parked() == 1).await;
        // Peers neither wait nor take a slot: the peer's call reaches the router's gate.
        let peer = tokio::spawn(svc.clone().oneshot(on(3, "/seqsvr.v1.RaftService/Vote")));
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert_eq!((layer.in_flight(), layer.parked()), (1, 1));
        gate.add_permits(3);
        for call in [first, second, peer] {
            assert_eq!(refusal_of(&call.await.unwrap().unwrap()), None);
        }
        assert_eq!((layer.in_flight(), layer.parked()), (0, 0));
        let [shed, parked] = counts.each_ref().map(|c| c.load(Ordering::Relaxed));
        assert_eq!((shed, parked), (0, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_that_waits_longer_than_the_bound_is_refused_as_overloaded() {
        let gate = Arc::new(Semaphore::new(0));
        let counts = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let b = Bounds {
            max_wait: Duration::from_millis(200),
            ..bounds(1, 0, 10)
        };
        let layer = ShedLayer::new(b, EXEMPT, counting(&counts));
        let svc = layer.layer(router(gate.clone()));
        let held = tokio::spawn(svc.clone().oneshot(on(1, "/a.B/C")));
        wait_until(|| layer.in_flight() == 1).await;
        let started = tokio::time::Instant::now();
        let refused = svc.clone().oneshot(on(2, "/a.B/C")).await.unwrap();
        assert_eq!(refusal_of(&refused), Some(refusal::Refusal::Overloaded));
        assert_eq!(started.elapsed(), Duration::from_millis(200));
        let [shed, parked] = counts.each_ref().map(|c| c.load(Ordering::Relaxed));
        assert_eq!((shed, parked, layer.parked()), (1, 1, 0));
        gate.add_permits(1);
        assert_eq!(refusal_of(&held.await.unwrap().unwrap()), None);
        assert_eq!(layer.in_flight(), 0);
    }

    #[tokio::test]
    async fn a_handler_that_steps_out_gives_its_slot_to_a_waiting_call() {
        let gate = Arc::new(Semaphore::new(0));
        let layer = ShedLayer::new(bounds(1, 0, 10), EXEMPT, Hooks::none());
        // A handler that waits for something else than the CPU: it steps out first.
        let waits_elsewhere = {
            let gate = gate.clone();
            tower::service_fn(move |req: http::Request<()>| {
                let gate = gate.clone();
                async move {
                    if req.uri().path() == "/a.B/Wait" {
                        InFlight::step_out();
                    }
                    gate.acquire().await.unwrap().forget();
                    Ok::<_, Infallible>(http::Response::new(()))
                }
            })
        };
        let svc = layer.layer(waits_elsewhere);
        let waiting = tokio::spawn(svc.clone().oneshot(on(1, "/a.B/Wait")));
        wait_until(|| layer.in_flight() == 0).await;
        let next = tokio::spawn(svc.clone().oneshot(on(1, "/a.B/C")));
        wait_until(|| layer.in_flight() == 1).await;
        assert_eq!(layer.parked(), 0, "admitted at once");
        gate.add_permits(2);
        for call in [waiting, next] {
            assert_eq!(refusal_of(&call.await.unwrap().unwrap()), None);
        }
        assert_eq!(layer.in_flight(), 0, "a slot given back early is not given back twice");
    }

    #[tokio::test]
    async fn a_call_holds_its_slot_until_its_reply_and_stepping_out_elsewhere_is_harmless() {
        // No call on this task: nothing to give back, and no panic.
        InFlight::step_out();
        let gate = Arc::new(Semaphore::new(0));
        let layer = ShedLayer::new(bounds(1, 0, 10), EXEMPT, Hooks::none());
        let svc = layer.layer(router(gate.clone()));
        let call = tokio::spawn(svc.clone().oneshot(on(1, "/a.B/C")));
        wait_until(|| layer.in_flight() == 1).await;
        // Another task stepping out does not release the call's slot: it is the call's own.
        tokio::spawn(async { InFlight::step_out() }).await.unwrap();
        assert_eq!(layer.in_flight(), 1);
        gate.add_permits(1);
        assert_eq!(refusal_of(&call.await.unwrap().unwrap()), None);
        assert_eq!(layer.in_flight(), 0, "given back with the reply");
    }

    #[test]
    fn only_whole_service_names_are_exempt() {
        let layer = ShedLayer::new(
            bounds(1, 0, 0),
            &["seqsvr.v1.RaftService", "grpc.health.v1.Health"],
            Hooks::none(),
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
        allocsvr().check().unwrap();
        STORESVR.check().unwrap();
        let zeros = [
            (
                ServeLimits {
                    max_in_flight: 0,
                    ..allocsvr()
                },
                "--max-in-flight",
            ),
            (
                ServeLimits {
                    max_streams_per_connection: 0,
                    ..allocsvr()
                },
                "--max-streams-per-connection",
            ),
            (
                ServeLimits {
                    rpc_timeout: Duration::ZERO,
                    ..allocsvr()
                },
                "--rpc-timeout-ms",
            ),
        ];
        for (limits, flag) in zeros {
            assert!(limits.check().unwrap_err().contains(flag), "{limits:?}");
        }
    }
}
