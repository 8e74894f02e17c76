//! `storesvr`: run one StoreSvr replica until SIGTERM or Ctrl-C. Options come as flags,
//! `STORESVR_*` environment variables or a TOML `--config` file (see `config`). `storesvr restore`
//! builds a new set's first data dir from a backup instead (see `restore`).

use seqsvr_plumbing::observe;
use std::process::ExitCode;
use storesvr::config::Config;
use storesvr::node::StoreNode;

fn main() -> ExitCode {
    // `storesvr restore ...` is a one-off command with its own flags (see `storesvr::restore`).
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == "restore") {
        return storesvr::restore::main(args[1..].to_vec());
    }
    // clap prints help and version (exit 0) and usage errors (exit 2) itself.
    let config: Config = seqsvr_plumbing::cli::parse(storesvr::config::ENV_PREFIX);
    if let Err(e) = config.validate() {
        eprintln!("storesvr: invalid configuration: {e}");
        return ExitCode::from(2);
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,openraft=warn".into()),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("storesvr: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(config))
}

/// Says loudly which negative controls are on.
fn warn_unsafe(config: &Config) {
    if config.unsafe_skip_epoch_fence {
        tracing::warn!("UNSAFE: --unsafe-skip-epoch-fence is on; bumps are not fenced (negative control only)");
    }
    if config.unsafe_skip_binding {
        tracing::warn!(
            "UNSAFE: --unsafe-skip-binding is on; anyone may renew, release or bump in an AllocSvr's name (negative control only)"
        );
    }
    if config.unsafe_skip_slot_fence {
        tracing::warn!(
            "UNSAFE: --unsafe-skip-slot-fence is on; id slot marks are raised unfenced (negative control only)"
        );
    }
    if config.unsafe_ledger_answer_before_commit {
        tracing::warn!(
            "UNSAFE: --unsafe-ledger-answer-before-commit is on; ledger reserves are answered before they commit (negative control only)"
        );
    }
    if config.unsafe_unfenced_release {
        tracing::warn!("UNSAFE: --unsafe-unfenced-release is on; releases ignore epochs (negative control only)");
    }
}

async fn run(config: Config) -> ExitCode {
    warn_unsafe(&config);
    if let Some(addr) = config.metrics_listen
        && let Err(e) = metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(addr)
            .add_global_label("set", config.set_id.to_string())
            .add_global_label("node", config.node_id.to_string())
            .set_buckets_for_metric(
                metrics_exporter_prometheus::Matcher::Suffix(observe::LATENCY_SUFFIX.into()),
                observe::LATENCY_BUCKETS_SECONDS,
            )
            .and_then(|b| b.install())
    {
        eprintln!("storesvr: cannot serve metrics on {addr}: {e}");
        return ExitCode::FAILURE;
    }
    let metered = config.metrics_listen.is_some();
    seqsvr_plumbing::version::record_build_info();
    let node = match StoreNode::start(config).await {
        Ok(n) => n,
        Err(e) => {
            eprintln!("storesvr: {e}");
            return ExitCode::FAILURE;
        }
    };
    if metered {
        // Only with an exporter: without one every gauge is a no-op.
        let replica = std::sync::Arc::downgrade(&node.ctx);
        tokio::spawn(storesvr::tasks::metrics::metrics_loop(replica));
    }
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("storesvr: cannot listen for SIGTERM: {e}");
            return ExitCode::FAILURE;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
        why = node.raft_stopped() => {
            // A failed write or sync leaves the page cache's state unknown: trust nothing in memory,
            // stop, and let the restart (systemd, Kubernetes, the operator) reopen the data dir.
            tracing::error!(error = %why, "the Raft node stopped on a storage error; exiting");
            eprintln!(
                "storesvr: the Raft node stopped on a storage error ({why}); exiting with status 1 so \
                 that a restart reopens the data dir from what is on disk (docs/OPERATIONS.md, \
                 \"A full or failing disk\")"
            );
            node.shutdown().await;
            return ExitCode::FAILURE;
        }
        why = node.placement_refused() => {
            tracing::error!(error = %why, "refusing to run");
            eprintln!("storesvr: {why}");
            node.shutdown().await;
            return ExitCode::FAILURE;
        }
    }
    tracing::info!("shutting down");
    node.stop().await;
    ExitCode::SUCCESS
}
