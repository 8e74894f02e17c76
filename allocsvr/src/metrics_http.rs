//! The AllocSvr's Prometheus page (`--metrics-listen`): the exporter's metrics followed by the
//! data plane's latency histograms ([`crate::rpc_metrics`]), which are kept outside the exporter
//! because recording every call through it cost the tail latency (that module says how much).
//!
//! The exporter is installed as the process's recorder without its own listener; this module runs
//! its upkeep (folding the other histograms' values into buckets) every [`UPKEEP_EVERY`], as the
//! exporter's listener would, and answers every request on the port with the page, whatever its
//! path, as that listener did.
//!
//! Left out: TLS and access control on this port (bind it to a private address; the page holds
//! no secrets), and HTTP/2.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::CONTENT_TYPE;
use metrics_exporter_prometheus::{BuildError, PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tracing::{debug, warn};

use crate::rpc_metrics::RPC_SECONDS;

/// How often the exporter's histograms are folded (the exporter's own default).
pub const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Longest a client may take to send a request's headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// The content type of the text exposition format.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4";

/// Why the page cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("cannot install the metrics recorder: {0}")]
    Recorder(#[from] BuildError),
    #[error("cannot listen for metrics on {addr}: {source}")]
    Listen { addr: SocketAddr, source: std::io::Error },
}

/// Installs `builder`'s recorder for the process, then serves the page on `addr` with every
/// series of the latency histograms labelled `node="node_id"` (the exporter's global label).
/// Returns once listening; the serving runs on the current runtime until the process ends.
pub async fn serve(builder: PrometheusBuilder, addr: SocketAddr, node_id: u64) -> Result<(), MetricsError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| MetricsError::Listen { addr, source })?;
    let handle = builder
        .add_global_label("node", node_id.to_string())
        .install_recorder()?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(UPKEEP_EVERY).await;
            upkeep.run_upkeep();
        }
    });
    let labels = format!("node=\"{node_id}\"");
    tokio::spawn(accept(listener, handle, labels));
    Ok(())
}

/// The whole page.
pub fn page(handle: &PrometheusHandle, labels: &str) -> String {
    let mut page = handle.render();
    if !page.is_empty() && !page.ends_with('\n') {
        page.push('\n');
    }
    RPC_SECONDS.render(labels, &mut page);
    page
}

async fn accept(listener: TcpListener, handle: PrometheusHandle, labels: String) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors, say: try again shortly rather than spin.
                warn!(error = %e, "cannot accept a metrics connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (handle, labels) = (handle.clone(), labels.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |_request| {
                let body = page(&handle, &labels);
                async move {
                    let mut response = hyper::Response::new(Full::new(Bytes::from(body)));
                    response
                        .headers_mut()
                        .insert(CONTENT_TYPE, hyper::header::HeaderValue::from_static(TEXT_FORMAT));
                    Ok::<_, Infallible>(response)
                }
            });
            let served = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
            if let Err(e) = served {
                debug!(%peer, error = %e, "metrics connection ended");
            }
        });
    }
}
