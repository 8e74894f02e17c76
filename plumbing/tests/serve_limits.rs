//! The limits of `seqsvr_plumbing::serve_limits` on a real tonic server over loopback, driven by a raw
//! HTTP/2 client (hyper), which enforces no deadline of its own: what the test sees is what the
//! server did.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use seqsvr_plumbing::serve_limits::{self, ServeLimits};
use tonic::server::NamedService;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tower::Service;

/// The test's gRPC method: runs `F`'s future, then answers OK.
#[derive(Clone)]
struct Method<F>(F);

type Work = Pin<Box<dyn Future<Output = ()> + Send>>;

impl<F> NamedService for Method<F> {
    const NAME: &'static str = "seqsvr.test.Slow";
}

impl<F: Fn() -> Work> Service<http::Request<tonic::body::Body>> for Method<F> {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<tonic::body::Body>) -> Self::Future {
        let work = (self.0)();
        Box::pin(async move {
            work.await;
            Ok(tonic::Status::new(tonic::Code::Ok, "").into_http())
        })
    }
}

/// A method that answers OK after sleeping `delay`.
fn slow(delay: Duration) -> Method<impl Fn() -> Work + Clone + Send + 'static> {
    Method(move || -> Work { Box::pin(tokio::time::sleep(delay)) })
}

async fn serve(limits: ServeLimits, handler: Duration) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router =
        serve_limits::apply(Server::builder(), &limits, &[], serve_limits::Hooks::none()).add_service(slow(handler));
    tokio::spawn(router.serve_with_incoming(TcpIncoming::from(listener)));
    addr
}

async fn connect(addr: SocketAddr) -> SendRequest<Full<Bytes>> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    send
}

/// One call; its time and the `grpc-status` the server answered (trailers-only answers carry it
/// in the headers, which is how both OK and a cut deadline come back from `slow`).
async fn call(send: &mut SendRequest<Full<Bytes>>, grpc_timeout: Option<&str>) -> (Duration, String) {
    let mut req = http::Request::post("http://test/seqsvr.test.Slow/Call")
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(t) = grpc_timeout {
        req = req.header("grpc-timeout", t);
    }
    // One empty message: no compression flag, length 0.
    let req = req.body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0]))).unwrap();
    let started = Instant::now();
    send.ready().await.unwrap();
    let reply = send.send_request(req).await.unwrap();
    let status = reply
        .headers()
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().to_string());
    (started.elapsed(), status.unwrap_or_default())
}

const LONG: ServeLimits = ServeLimits {
    max_in_flight: 1_024,
    max_streams_per_connection: 256,
    rpc_timeout: Duration::from_secs(10),
};

#[tokio::test]
async fn the_callers_grpc_timeout_ends_the_call_on_the_server() {
    let addr = serve(LONG, Duration::from_secs(3)).await;
    let mut send = connect(addr).await;
    let (took, status) = call(&mut send, Some("100m")).await;
    assert_eq!(status, "1", "CANCELLED");
    assert!(
        took >= Duration::from_millis(95) && took < Duration::from_secs(2),
        "{took:?}"
    );
}

#[tokio::test]
async fn the_server_bound_ends_a_call_that_sent_no_deadline() {
    let limits = ServeLimits {
        rpc_timeout: Duration::from_millis(150),
        ..LONG
    };
    let addr = serve(limits, Duration::from_secs(3)).await;
    let mut send = connect(addr).await;
    let (took, status) = call(&mut send, None).await;
    assert_eq!(status, "1", "CANCELLED");
    assert!(
        took >= Duration::from_millis(145) && took < Duration::from_secs(2),
        "{took:?}"
    );
    // The shorter of the two wins: a caller cannot lengthen the server's bound.
    let (took, status) = call(&mut send, Some("20S")).await;
    assert_eq!(status, "1");
    assert!(took < Duration::from_secs(2), "{took:?}");
}

#[tokio::test]
async fn a_call_within_both_deadlines_is_answered() {
    let addr = serve(LONG, Duration::from_millis(20)).await;
    let mut send = connect(addr).await;
    let (_, status) = call(&mut send, Some("5S")).await;
    assert_eq!(status, "0", "OK");
}

#[tokio::test]
async fn streams_above_the_per_connection_limit_wait_on_the_callers_side() {
    let handler = Duration::from_millis(300);
    let limits = ServeLimits {
        max_streams_per_connection: 2,
        ..LONG
    };
    let addr = serve(limits, handler).await;
    let send = connect(addr).await;
    // One call first, so the client has the server's SETTINGS before it opens more streams.
    call(&mut send.clone(), None).await;
    let calls: Vec<_> = (0..3)
        .map(|_| {
            let mut send = send.clone();
            tokio::spawn(async move { call(&mut send, None).await })
        })
        .collect();
    let mut took = Vec::new();
    for c in calls {
        let (t, status) = c.await.unwrap();
        assert_eq!(status, "0");
        took.push(t);
    }
    took.sort();
    // Two run at once; the third starts when one of them ends.
    assert!(took[2] >= handler * 2 - Duration::from_millis(20), "{took:?}");
}

/// The slot lives in a task-local the admission layer sets around the call: a handler served by
/// a real tonic server, over the listener every seqsvr server uses, reaches it. With a limit of 1
/// (and the reserve of one call per quiet connection, so 2 at most), four calls on four
/// connections all get in while every one of them waits, because each gives its slot back;
/// without the step-out the third and fourth would stay parked until the gate opens.
#[tokio::test]
async fn handlers_that_step_out_let_the_next_calls_in_on_a_real_server() {
    let limits = ServeLimits {
        max_in_flight: 1,
        ..LONG
    };
    let shed = serve_limits::ShedLayer::new(limits.bounds(), &[], serve_limits::Hooks::none());
    let entered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    // Gives its in-flight slot back, counts itself in, and waits for `gate`.
    let svc = {
        let (entered, gate) = (entered.clone(), gate.clone());
        Method(move || -> Work {
            let (entered, gate) = (entered.clone(), gate.clone());
            Box::pin(async move {
                serve_limits::InFlight::step_out();
                entered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                gate.acquire().await.unwrap().forget();
            })
        })
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = serve_limits::apply_with(Server::builder(), &limits, shed.clone()).add_service(svc);
    tokio::spawn(router.serve_with_incoming(serve_limits::incoming(listener)));
    let mut calls = Vec::new();
    for _ in 0..4 {
        let mut send = connect(addr).await;
        calls.push(tokio::spawn(async move { call(&mut send, None).await }));
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while entered.load(std::sync::atomic::Ordering::SeqCst) < 4 {
        assert!(
            Instant::now() < deadline,
            "only {} of 4 calls got in ({} parked)",
            entered.load(std::sync::atomic::Ordering::SeqCst),
            shed.parked()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        (shed.in_flight(), shed.parked()),
        (0, 0),
        "every slot given back while waiting"
    );
    gate.add_permits(4);
    for c in calls {
        assert_eq!(c.await.unwrap().1, "0", "OK");
    }
}
