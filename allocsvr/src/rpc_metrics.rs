//! Per-method latency and error counts of the data plane, measured around the generated gRPC
//! service: `allocsvr_rpc_seconds{method}` (a histogram; its `_count` is the request rate) and
//! `allocsvr_rpc_errors_total{method, code}` (calls that ended in a gRPC error status).
//!
//! [`Metered`] wraps `AllocServiceServer` rather than sitting in a tower layer so that it needs
//! nothing beyond tonic and works whatever layers the server builder gets. The handles of the
//! known methods are registered once; a call costs two clock reads, a scan of three names and
//! one histogram record, and allocates nothing (the generated service's future is already boxed,
//! hence `Unpin`, so the wrapper future needs no box of its own).
//!
//! What the latency covers: from the request reaching the service to the handler's response
//! (headers) being ready, including any wait for a bump; not the network, nor the encoding of the
//! body. A handler's error (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, ...) travels in the response
//! headers and is counted by its code; outcomes carried inside an OK reply (NOT_OWNER,
//! NOT_READY) are `allocsvr_fetch_total`'s.
//!
//! Left out: health and reflection calls (not wrapped), and per-caller labels (unbounded).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use metrics::{Histogram, counter, histogram};
use tonic::codegen::{Service, http};
use tonic::server::NamedService;

/// The methods of `AllocService`, as they appear last in a request's path.
const METHODS: [&str; 3] = ["FetchNextSeq", "GetCurSeq", "BatchFetchNextSeq"];

/// The latency histogram of each known method, in [`METHODS`] order, then one for anything else.
struct Handles {
    seconds: [Histogram; METHODS.len() + 1],
}

impl Handles {
    fn new() -> Self {
        let h = |m: &'static str| histogram!("allocsvr_rpc_seconds", "method" => m);
        Self {
            seconds: [h(METHODS[0]), h(METHODS[1]), h(METHODS[2]), h("other")],
        }
    }
}

/// Index into [`Handles::seconds`] of a request path (`/seqsvr.v1.AllocService/FetchNextSeq`).
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

/// A gRPC service whose calls are timed and whose error statuses are counted.
#[derive(Clone)]
pub struct Metered<S> {
    inner: S,
    handles: Arc<Handles>,
}

impl<S> Metered<S> {
    /// Wraps `inner` (the generated `AllocServiceServer`), registering the handles.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            handles: Arc::new(Handles::new()),
        }
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
            handles: self.handles.clone(),
            method,
            started: Instant::now(),
        }
    }
}

/// The future of one metered call.
pub struct Timed<F> {
    inner: F,
    handles: Arc<Handles>,
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
        self.handles.seconds[self.method].record(self.started.elapsed().as_secs_f64());
        if let Ok(response) = &out
            && let Some(code) = header_code(response)
        {
            let method = METHODS.get(self.method).copied().unwrap_or("other");
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
            ("/seqsvr.v1.AllocService/Nope", 3),
            ("", 3),
        ];
        for (path, want) in cases {
            assert_eq!(method_index(path), want, "{path}");
        }
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
