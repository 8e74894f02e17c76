//! Per-method latency and error counts of the data plane, measured around the generated gRPC
//! service: `allocsvr_rpc_seconds{method}` (a histogram; its `_count` is the request rate) and
//! `allocsvr_rpc_errors_total{method, code}` (calls that ended in a gRPC error status).
//!
//! [`Metered`] wraps `AllocServiceServer` rather than sitting in a tower layer so that it needs
//! nothing beyond tonic and works whatever layers the server builder gets. A call costs two clock
//! reads, a scan of the method names and two relaxed atomic additions on its thread's own shard of
//! [`RPC_SECONDS`], and allocates nothing (the generated service's future is already boxed, hence
//! `Unpin`, so the wrapper future needs no box of its own).
//!
//! Why not the `metrics` crate's histogram, as every other histogram of the AllocSvr: the
//! Prometheus exporter keeps each recorded value (16 bytes in a shared, lock-free list, appended
//! with a clock read and an epoch pin) until its upkeep folds them into buckets every 5 s, on a
//! runtime worker; at 90,000 calls a second that is 450,000 values each time. Measured on
//! `ids-bench` at 64 callers, recording every call so raised the AllocSvr's p99 by about 400 µs
//! of 3,400 (docs/journal/benchmarks-2026-11.md, "p99 at 64 callers"). Here the buckets are counted as calls end,
//! in per-thread shards, and [`RpcSeconds::render`] writes them in the exposition format beside
//! the exporter's page (`crate::metrics_http`).
//!
//! What the latency covers: from the request reaching the service to the handler's response
//! (headers) being ready, including any wait for a bump; not the network, nor the encoding of the
//! body. A handler's error (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, ...) travels in the response
//! headers and is counted by its code; outcomes carried inside an OK reply (NOT_OWNER,
//! NOT_READY) are `allocsvr_fetch_total`'s.
//!
//! Left out: health and reflection calls (not wrapped), per-caller labels (unbounded), and a
//! consistent snapshot across shards (a scrape may see a call in its bucket but not yet in the
//! sum: Prometheus histograms read from atomics are all like that).

use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use metrics::counter;
use seqsvr_plumbing::observe::LATENCY_BUCKETS_SECONDS;
use tonic::codegen::{Service, http};
use tonic::server::NamedService;

/// The histogram's name in the exposition format.
pub const RPC_SECONDS_NAME: &str = "allocsvr_rpc_seconds";

/// The methods of `AllocService`, as they appear last in a request's path (a test checks the list
/// against the proto file, so that a new method is not counted as "other").
const METHODS: [&str; 10] = [
    "FetchNextSeq",
    "GetCurSeq",
    "BatchFetchNextSeq",
    "NextIds",
    "Reserve",
    "CounterNext",
    "CounterReserve",
    "CounterGet",
    "CounterBatch",
    "BatchGet",
];

/// Label of a method index: a name of [`METHODS`], then "other".
fn method_name(i: usize) -> &'static str {
    METHODS.get(i).copied().unwrap_or("other")
}

/// Buckets of [`LATENCY_BUCKETS_SECONDS`] (the one list every latency histogram uses) and one
/// for `+Inf`.
const BUCKETS: usize = LATENCY_BUCKETS_SECONDS.len() + 1;

/// Per method: a count per bucket (not cumulative), then the sum of the latencies, nanoseconds.
const CELLS: usize = BUCKETS + 1;

/// Shards: more than a node's worker threads, so that two threads rarely share one.
const SHARDS: usize = 16;

/// One thread's counts, on cache lines of its own.
#[repr(align(128))]
struct Shard {
    cells: [[AtomicU64; CELLS]; METHODS.len() + 1],
}

/// The per-method latency histograms of this process's data plane.
pub struct RpcSeconds {
    shards: Box<[Shard]>,
    /// Upper bounds of the finite buckets, nanoseconds.
    bounds_ns: [u64; BUCKETS - 1],
}

/// This process's histograms: every [`Metered`] records here, the metrics page renders them.
pub static RPC_SECONDS: LazyLock<RpcSeconds> = LazyLock::new(RpcSeconds::new);

thread_local! {
    /// The shard this thread records in, handed out in turn as threads first record.
    static SHARD: usize = {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS
    };
}

impl RpcSeconds {
    fn new() -> Self {
        Self {
            shards: (0..SHARDS)
                .map(|_| Shard {
                    cells: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
                })
                .collect(),
            bounds_ns: std::array::from_fn(|i| (LATENCY_BUCKETS_SECONDS[i] * 1e9).round() as u64),
        }
    }

    /// Counts one call of method index `method` that took `took`.
    fn record(&self, method: usize, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        // `le` is inclusive: a value equal to a bound is in that bucket.
        let bucket = self.bounds_ns.partition_point(|b| *b < ns);
        let shard = &self.shards[SHARD.with(|s| *s)];
        let cells = &shard.cells[method.min(METHODS.len())];
        cells[bucket].fetch_add(1, Ordering::Relaxed);
        cells[BUCKETS].fetch_add(ns, Ordering::Relaxed);
    }

    /// Totals over the shards of one method: the bucket counts and the sum, nanoseconds.
    fn totals(&self, method: usize) -> ([u64; BUCKETS], u64) {
        let mut counts = [0u64; BUCKETS];
        let mut sum = 0u64;
        for shard in &self.shards {
            let cells = &shard.cells[method];
            for (c, cell) in counts.iter_mut().zip(cells) {
                *c += cell.load(Ordering::Relaxed);
            }
            sum = sum.wrapping_add(cells[BUCKETS].load(Ordering::Relaxed));
        }
        (counts, sum)
    }

    /// Appends the histograms in Prometheus' text format to `out`, every series labelled with
    /// `labels` (`name="value"` pairs, comma-separated, already escaped; may be empty) before
    /// `method`.
    pub fn render(&self, labels: &str, out: &mut String) {
        let sep = if labels.is_empty() { "" } else { "," };
        let _ = writeln!(out, "# TYPE {RPC_SECONDS_NAME} histogram");
        for method in 0..=METHODS.len() {
            let (counts, sum_ns) = self.totals(method);
            let name = method_name(method);
            let mut cumulative = 0u64;
            for (i, count) in counts.iter().enumerate() {
                cumulative += count;
                let le = LATENCY_BUCKETS_SECONDS
                    .get(i)
                    .map_or_else(|| "+Inf".to_owned(), f64::to_string);
                let _ = writeln!(
                    out,
                    "{RPC_SECONDS_NAME}_bucket{{{labels}{sep}method=\"{name}\",le=\"{le}\"}} {cumulative}"
                );
            }
            let sum = sum_ns as f64 / 1e9;
            let _ = writeln!(out, "{RPC_SECONDS_NAME}_sum{{{labels}{sep}method=\"{name}\"}} {sum}");
            let _ = writeln!(
                out,
                "{RPC_SECONDS_NAME}_count{{{labels}{sep}method=\"{name}\"}} {cumulative}"
            );
        }
    }
}

/// Index into [`METHODS`] of a request path (`/seqsvr.v1.AllocService/FetchNextSeq`);
/// `METHODS.len()` for any other.
fn method_index(path: &str) -> usize {
    // A plain byte loop from the end: the name is a few bytes, and `rsplit`'s general search
    // (memrchr) cost more than the rest of the lookup (callgrind).
    let name = match path.bytes().rposition(|b| b == b'/') {
        Some(at) => &path[at + 1..],
        None => path,
    };
    METHODS.iter().position(|m| *m == name).unwrap_or(METHODS.len())
}

/// The gRPC status a response carries in its headers (a handler's error); `None` for a reply
/// whose status comes in the trailers, which for a unary call means OK.
fn header_code<B>(response: &http::Response<B>) -> Option<tonic::Code> {
    let code = response.headers().get("grpc-status")?;
    Some(tonic::Code::from_bytes(code.as_bytes())).filter(|c| *c != tonic::Code::Ok)
}

/// A gRPC service whose calls are timed (in [`RPC_SECONDS`]) and whose error statuses are counted.
#[derive(Clone)]
pub struct Metered<S> {
    inner: S,
}

impl<S> Metered<S> {
    /// Wraps `inner` (the generated `AllocServiceServer`).
    pub fn new(inner: S) -> Self {
        Self { inner }
    }
}

impl<S: NamedService> NamedService for Metered<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B, R> Service<http::Request<B>> for Metered<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Unpin,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Timed<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = method_index(request.uri().path());
        Timed {
            inner: self.inner.call(request),
            method,
            started: Instant::now(),
        }
    }
}

/// The future of one metered call.
pub struct Timed<F> {
    inner: F,
    method: usize,
    started: Instant,
}

impl<F, R, E> Future for Timed<F>
where
    F: Future<Output = Result<http::Response<R>, E>> + Unpin,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let out = ready!(Pin::new(&mut self.inner).poll(cx));
        RPC_SECONDS.record(self.method, self.started.elapsed());
        if let Ok(response) = &out
            && let Some(code) = header_code(response)
        {
            let method = method_name(self.method);
            // Errors are rare; the registry lookup and the code's name are paid only here.
            counter!("allocsvr_rpc_errors_total", "method" => method, "code" => format!("{code:?}")).increment(1);
        }
        Poll::Ready(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_names_its_method_or_other() {
        let cases = [
            ("/seqsvr.v1.AllocService/FetchNextSeq", 0),
            ("/seqsvr.v1.AllocService/GetCurSeq", 1),
            ("/seqsvr.v1.AllocService/BatchFetchNextSeq", 2),
            ("/seqsvr.v1.AllocService/NextIds", 3),
            ("/seqsvr.v1.AllocService/CounterBatch", 8),
            ("/seqsvr.v1.AllocService/BatchGet", 9),
            ("/seqsvr.v1.AllocService/Nope", 10),
            ("", 10),
        ];
        for (path, want) in cases {
            assert_eq!(method_index(path), want, "{path}");
        }
    }

    #[test]
    fn every_method_of_the_proto_service_has_its_own_label() {
        let proto = include_str!("../../proto/proto/seqsvr/v1/alloc.proto");
        let service = proto
            .split("service AllocService")
            .nth(1)
            .and_then(|s| s.split('}').next())
            .expect("alloc.proto declares AllocService");
        let declared: Vec<&str> = service
            .lines()
            .filter_map(|l| l.trim().strip_prefix("rpc "))
            .filter_map(|l| l.split('(').next())
            .map(str::trim)
            .collect();
        assert_eq!(
            declared, METHODS,
            "METHODS must list AllocService's rpcs in proto order"
        );
    }

    #[test]
    fn the_histogram_renders_cumulative_buckets_with_inclusive_bounds() {
        let h = RpcSeconds::new();
        let next_ids = method_index("/seqsvr.v1.AllocService/NextIds");
        // 50 µs is the first bound: a call of exactly 50 µs is in it, one of 50.001 µs is not.
        h.record(next_ids, Duration::from_micros(50));
        h.record(next_ids, Duration::from_nanos(50_001));
        h.record(next_ids, Duration::from_secs(11));
        h.record(METHODS.len(), Duration::from_micros(1));
        let mut page = String::new();
        h.render("node=\"7\"", &mut page);
        let line = |series: &str| {
            page.lines()
                .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
                .unwrap_or_else(|| panic!("no {series} in\n{page}"))
                .to_owned()
        };
        let bucket = |le: &str| {
            line(&format!(
                "allocsvr_rpc_seconds_bucket{{node=\"7\",method=\"NextIds\",le=\"{le}\"}}"
            ))
        };
        assert_eq!(bucket("0.00005"), "1");
        assert_eq!(bucket("0.0001"), "2");
        assert_eq!(bucket("10"), "2");
        assert_eq!(bucket("+Inf"), "3");
        assert_eq!(line("allocsvr_rpc_seconds_count{node=\"7\",method=\"NextIds\"}"), "3");
        assert_eq!(
            line("allocsvr_rpc_seconds_sum{node=\"7\",method=\"NextIds\"}"),
            "11.000100001"
        );
        assert_eq!(line("allocsvr_rpc_seconds_count{node=\"7\",method=\"other\"}"), "1");
        assert_eq!(
            line("allocsvr_rpc_seconds_count{node=\"7\",method=\"FetchNextSeq\"}"),
            "0"
        );
        assert_eq!(page.matches("# TYPE allocsvr_rpc_seconds histogram").count(), 1);
        // Without labels the method comes first.
        let mut bare = String::new();
        h.render("", &mut bare);
        assert!(
            bare.contains("allocsvr_rpc_seconds_count{method=\"NextIds\"} 3"),
            "{bare}"
        );
    }

    #[test]
    fn threads_that_record_at_once_lose_nothing() {
        let h = RpcSeconds::new();
        std::thread::scope(|s| {
            for t in 0..4 {
                let h = &h;
                s.spawn(move || {
                    for i in 0..10_000u64 {
                        h.record(t % 2, Duration::from_micros(i % 300));
                    }
                });
            }
        });
        let (counts, _) = h.totals(0);
        assert_eq!(counts.iter().sum::<u64>(), 20_000);
        let (counts, _) = h.totals(1);
        assert_eq!(counts.iter().sum::<u64>(), 20_000);
    }

    #[test]
    fn only_an_error_status_in_the_headers_is_counted() {
        let with = |v: Option<&str>| {
            let mut b = http::Response::builder();
            if let Some(v) = v {
                b = b.header("grpc-status", v);
            }
            header_code(&b.body(()).unwrap())
        };
        assert_eq!(with(None), None);
        assert_eq!(with(Some("0")), None);
        assert_eq!(with(Some("14")), Some(tonic::Code::Unavailable));
        assert_eq!(with(Some("3")), Some(tonic::Code::InvalidArgument));
    }
}
