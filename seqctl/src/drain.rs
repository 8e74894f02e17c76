//! `seqctl alloc drain NODE`: hand every section of an AllocSvr to the other AllocSvrs of its set
//! (planned handovers, so nobody waits out a lease), then say the node can be stopped.
//!
//! `--store` names StoreSvrs of the node's set. Refusals (no other live AllocSvr, an unknown node)
//! exit 2 and change nothing. Left out: undoing a drain (restarting the node registers it anew,
//! and it draws sections again).

use std::time::{Duration, Instant};

use clap::Subcommand;
use seqsvr_control::AdminClient;
use serde_json::json;

use crate::{EXIT_FAILED, EXIT_USAGE, Failure, dialer, store_seeds, timeouts};

/// Longest a drain is followed before `seqctl` gives up (it can be run again).
const DRAIN_WITHIN: Duration = Duration::from_secs(60);

#[derive(Subcommand, Debug)]
pub enum AllocCmd {
    /// Hand every section of AllocSvr node NODE to the set's other AllocSvrs (no lease wait).
    Drain { node: u64 },
}

pub async fn alloc(cli: &crate::Cli, cmd: &AllocCmd) -> Result<String, Failure> {
    let AllocCmd::Drain { node } = cmd;
    let admin = AdminClient::with_dialer(store_seeds(cli)?, timeouts(cli), &dialer(cli)?).map_err(Failure::usage)?;
    let started = Instant::now();
    let mut last_line = started - Duration::from_secs(1);
    loop {
        let r = admin.drain_alloc_svr(*node).await.map_err(|e| match e {
            seqsvr_control::ControlError::Rejected(s) if s.code() == tonic::Code::FailedPrecondition => Failure {
                code: EXIT_USAGE,
                message: s.message().to_string(),
            },
            e => Failure::of_write(e),
        })?;
        if r.held == 0 {
            let took = started.elapsed().as_millis();
            return Ok(if cli.json {
                json!({"node_id": node, "incarnation": r.incarnation, "held": 0, "millis": took}).to_string()
            } else {
                format!(
                    "node {node} (incarnation {}) holds no sections after {took} ms: it can be stopped",
                    r.incarnation
                )
            });
        }
        if started.elapsed() > DRAIN_WITHIN {
            return Err(Failure {
                code: EXIT_FAILED,
                message: format!(
                    "node {node} still holds {} sections after {DRAIN_WITHIN:?} (is it renewing?); run the drain again",
                    r.held
                ),
            });
        }
        if last_line.elapsed() >= Duration::from_secs(1) {
            last_line = Instant::now();
            eprintln!("node {node}: {} sections still held", r.held);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
