//! The batching writer: many concurrent commands, few Raft entries.
//!
//! openraft 0.9 pays one awaited log flush per `client_write` and does not
//! group concurrent writes. Every write of this server goes through one task
//! that takes everything queued (up to a bound) and proposes it as ONE entry,
//! then hands each caller its own result. With one entry in flight, the
//! commands that arrive meanwhile form the next entry, so the batch size grows
//! with load and a single caller pays no extra latency.
//!
//! Left out: more than one entry in flight (a pipeline); one already exceeds
//! the disk's serial sync rate by the batch factor.

use crate::raft_types::{Raft, Request};
use crate::state::{Command, CommandResult};
use openraft::error::{ClientWriteError, RaftError};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// Most commands in one entry; bounds entry size and apply time.
pub const MAX_BATCH_COMMANDS: usize = 4_096;
/// Most commands waiting; beyond it callers wait (backpressure).
pub const QUEUE_DEPTH: usize = 16_384;

/// Why a write did not produce a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteError {
    /// This replica is not the leader; the leader's id, if known.
    NotLeader(Option<u64>),
    /// The write may or may not have been committed (Raft stopped, timed out, quorum lost).
    Unavailable(String),
}

struct Pending {
    cmd: Command,
    reply: oneshot::Sender<Result<CommandResult, WriteError>>,
}

/// Handle to the writer task.
#[derive(Clone)]
pub struct Writer {
    tx: mpsc::Sender<Pending>,
}

impl Writer {
    pub fn start(raft: Raft) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
        tokio::spawn(run(raft, rx));
        Self { tx }
    }

    /// Proposes one command and waits for its result, at most `timeout`.
    pub async fn write(&self, cmd: Command, timeout: Duration) -> Result<CommandResult, WriteError> {
        let (reply, rx) = oneshot::channel();
        let send = self.tx.send(Pending { cmd, reply });
        match tokio::time::timeout(timeout, async {
            send.await
                .map_err(|_| WriteError::Unavailable("writer stopped".into()))?;
            rx.await
                .map_err(|_| WriteError::Unavailable("writer dropped the request".into()))?
        })
        .await
        {
            Ok(r) => r,
            Err(_) => Err(WriteError::Unavailable(format!("no commit within {timeout:?}"))),
        }
    }
}

async fn run(raft: Raft, mut rx: mpsc::Receiver<Pending>) {
    let mut batch: Vec<Pending> = Vec::with_capacity(MAX_BATCH_COMMANDS);
    while rx.recv_many(&mut batch, MAX_BATCH_COMMANDS).await > 0 {
        let (cmds, replies): (Vec<Command>, Vec<_>) = batch.drain(..).map(|p| (p.cmd, p.reply)).unzip();
        let n = cmds.len();
        metrics::histogram!("storesvr_entry_commands").record(n as f64);
        match raft.client_write(Request { cmds }).await {
            Ok(resp) => {
                debug_assert_eq!(resp.data.results.len(), n);
                for (reply, result) in replies.into_iter().zip(resp.data.results) {
                    let _ = reply.send(Ok(result));
                }
            }
            Err(e) => {
                let err = match e {
                    RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => WriteError::NotLeader(f.leader_id),
                    other => WriteError::Unavailable(other.to_string()),
                };
                for reply in replies {
                    let _ = reply.send(Err(err.clone()));
                }
            }
        }
    }
}
