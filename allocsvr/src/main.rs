//! The `allocsvr` binary: options (flags, `ALLOCSVR_*` variables, `--config` file) → validated
//! config → logging and metrics → [`allocsvr::Node`] until SIGTERM/SIGINT, then release every
//! section and exit 0.

use std::process::ExitCode;

use allocsvr::config::ENV_PREFIX;
use allocsvr::{Cli, Node};
use seqsvr_plumbing::observe;
use tracing::{error, info};

mod trim;

fn main() -> ExitCode {
    let cli: Cli = seqsvr_plumbing::cli::parse(ENV_PREFIX);
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    trim::after_floods();
    // Make every panic visible in the log (the simulator greps for "panicked").
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        error!("panicked: {info}");
        default_hook(info);
    }));
    let config = match cli.validate() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("allocsvr: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match allocsvr::node::runtime(None, config.event_interval) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("allocsvr: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        if let Some(addr) = config.metrics_listen {
            let builder = metrics_exporter_prometheus::PrometheusBuilder::new().set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Suffix(observe::LATENCY_SUFFIX.into()),
                observe::LATENCY_BUCKETS_SECONDS,
            );
            let served = match builder {
                Ok(b) => allocsvr::metrics_http::serve(b, addr, config.node.node_id.0).await,
                Err(e) => Err(e.into()),
            };
            if let Err(e) = served {
                error!(%addr, error = %e, "cannot serve metrics");
                return ExitCode::FAILURE;
            }
            info!(%addr, "serving Prometheus metrics");
            seqsvr_plumbing::version::record_build_info();
        }
        let node = match Node::start(config.node).await {
            Ok(n) => n,
            Err(e) => {
                error!(error = %e, "cannot start");
                return ExitCode::FAILURE;
            }
        };
        info!(addr = %node.local_addr(), incarnation = %node.incarnation(), "serving");
        if let Err(e) = wait_for_signal().await {
            error!(error = %e, "cannot wait for signals");
        }
        info!("signal received, shutting down");
        node.shutdown().await;
        info!("stopped");
        ExitCode::SUCCESS
    })
}

async fn wait_for_signal() -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}
