//! The batching writer: many concurrent commands, few Raft entries.
//!
//! openraft 0.9 pays one awaited log flush per `client_write` and does not
//! group concurrent writes. Every write of this server goes through one task
//! that takes everything queued (up to a bound) and proposes it as ONE entry,
//! then hands each caller its own result. While the in-flight slots are busy,
//! the commands that arrive meanwhile form the next entry, so the batch size
//! grows with load and a single caller pays no extra latency.
//!
//! Up to `MAX_ENTRIES_IN_FLIGHT` entries (one, measured best here) are in flight at once,
//! proposed in queue order. Left out: adapting batch size or pipeline depth to measured latency.

use crate::raft_types::{Raft, Request};
use crate::state::{Command, CommandResult};
use openraft::error::ClientWriteError;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc, oneshot};

/// Most commands in one entry; bounds entry size and apply time.
pub const MAX_BATCH_COMMANDS: usize = 4_096;
/// Entries proposed but not yet committed. Measured with `store-bench` (docs/BENCHMARKS.md): one
/// entry in flight gave 14.1–14.5k single bumps/s at c=64 against 10–11k with four, because the
/// group is CPU-bound and bigger entries (29 requests each instead of 10) cost less per request;
/// c=1 is the same either way. Kept as a constant so the pipeline can be deepened when that changes.
pub const MAX_ENTRIES_IN_FLIGHT: usize = 1;
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
    let in_flight = Arc::new(Semaphore::new(MAX_ENTRIES_IN_FLIGHT));
    let mut batch: Vec<Pending> = Vec::with_capacity(MAX_BATCH_COMMANDS);
    loop {
        // Take a slot first, then whatever is queued: while every slot is busy the queue grows
        // into the next entry, and a lone command with a free slot goes out at once.
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        if rx.recv_many(&mut batch, MAX_BATCH_COMMANDS).await == 0 {
            return;
        }
        let (cmds, replies): (Vec<Command>, Vec<_>) = batch.drain(..).map(|p| (p.cmd, p.reply)).unzip();
        metrics::histogram!("storesvr_entry_commands").record(cmds.len() as f64);
        // Submitting in this loop keeps entries in queue order; waiting for each commit happens
        // in its own task so that the next entry can be proposed meanwhile.
        match raft.client_write_ff(Request { cmds }).await {
            Err(fatal) => fail_all(replies, WriteError::Unavailable(fatal.to_string())),
            Ok(committed) => {
                tokio::spawn(async move {
                    let _permit = permit;
                    match committed.await {
                        Ok(Ok(resp)) => {
                            debug_assert_eq!(resp.data.results.len(), replies.len());
                            for (reply, result) in replies.into_iter().zip(resp.data.results) {
                                let _ = reply.send(Ok(result));
                            }
                        }
                        Ok(Err(ClientWriteError::ForwardToLeader(f))) => {
                            fail_all(replies, WriteError::NotLeader(f.leader_id))
                        }
                        Ok(Err(e)) => fail_all(replies, WriteError::Unavailable(e.to_string())),
                        Err(_) => fail_all(replies, WriteError::Unavailable("raft dropped the write".into())),
                    }
                });
            }
        }
    }
}

fn fail_all(replies: Vec<oneshot::Sender<Result<CommandResult, WriteError>>>, err: WriteError) {
    for reply in replies {
        let _ = reply.send(Err(err.clone()));
    }
}
