//! The AllocSvr's Prometheus page (`--metrics-listen`): the exporter's metrics followed by the
//! data plane's latency histograms ([`crate::rpc_metrics`]), which are kept outside the exporter
//! because recording every call through it cost the tail latency (that module says how much).
//!
//! The exporter is installed as the process's recorder without its own listener; this module runs
//! its upkeep (folding the other histograms' values into buckets) every [`UPKEEP_EVERY`], as the
//! exporter's listener would, and answers every request on the port with the page, whatever its
//! path, as that listener did. The connections are served by the HTTP front end's code
//! (`seqsvr_frontends::http::serve_router`): its header timeout and connection bound.
//!
//! Left out: TLS and access control on this port (bind it to a private address; the page holds
//! no secrets), and HTTP/2.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::http::header::CONTENT_TYPE;
use metrics_exporter_prometheus::{BuildError, PrometheusBuilder, PrometheusHandle};
use seqsvr_frontends::http::{HttpConfig, serve_router};
use tokio::net::TcpListener;

use crate::rpc_metrics::RPC_SECONDS;

/// How often the exporter's histograms are folded (the exporter's own default).
pub const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Scrapers connected at once; more wait in the listen queue.
const MAX_CONNECTIONS: usize = 64;

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
    let page = Arc::new((handle, format!("node=\"{node_id}\"")));
    let app = axum::Router::new().fallback(move || {
        let page = page.clone();
        async move { ([(CONTENT_TYPE, TEXT_FORMAT)], render(&page.0, &page.1)) }
    });
    let cfg = HttpConfig {
        max_connections: MAX_CONNECTIONS,
        tls: None,
    };
    // Never stopped: the page is served for as long as the process runs.
    let (keep, stop) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        serve_router(listener, app, cfg, stop).await;
        drop(keep);
    });
    Ok(())
}

/// The whole page: the exporter's metrics, then the latency histograms labelled with `labels`.
pub fn render(handle: &PrometheusHandle, labels: &str) -> String {
    let mut page = handle.render();
    if !page.is_empty() && !page.ends_with('\n') {
        page.push('\n');
    }
    RPC_SECONDS.render(labels, &mut page);
    page
}
