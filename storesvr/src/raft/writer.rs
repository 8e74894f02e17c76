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
//! proposed in queue order.
//!
//! An entry holds at most `MAX_ENTRY_COMMANDS` commands and `MAX_ENTRY_BYTES` of them (postcard,
//! measured once per command as it is queued): an entry that the peer link cannot carry would
//! never replicate, and one above the log's record limit would stop the leader. The entry is
//! closed before the command that would pass the cap, which then starts the next one; a command
//! alone above the cap is refused to its caller before anything is proposed.
//!
//! Left out: adapting batch size or pipeline depth to measured latency.

use crate::domain::state::{Command, CommandResult};
use crate::raft::types::{NodeId, Raft, Request, TypeConfig};
use openraft::error::ClientWriteError;
use openraft::raft::responder::Responder;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

/// Most commands and most bytes of commands in one entry (see `seqsvr_proto::limits`, which
/// asserts that an entry at the byte cap fits a peer message and a log record).
pub use seqsvr_proto::limits::{MAX_ENTRY_BYTES, MAX_ENTRY_COMMANDS};
/// Entries proposed but not yet committed. Measured with `store-bench` (docs/benchmarks/store-bench.md): one
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
    /// The command alone is larger than an entry may be; it was not proposed.
    TooLarge(String),
}

struct Pending {
    cmd: Command,
    /// Encoded size of `cmd`.
    bytes: usize,
    reply: oneshot::Sender<Result<CommandResult, WriteError>>,
}

/// Handle to the writer task.
#[derive(Clone)]
pub struct Writer {
    tx: mpsc::Sender<Pending>,
    /// How a caller proposes by itself; `None` only in unit tests without a Raft.
    alone: Option<Alone>,
}

#[derive(Clone)]
struct Alone {
    raft: Raft,
    /// Entries in flight: held by the writer task's wait for a commit, or by a caller that
    /// proposed alone.
    in_flight: Arc<Semaphore>,
}

impl Writer {
    pub fn start(raft: Raft) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE_DEPTH);
        let in_flight = Arc::new(Semaphore::new(MAX_ENTRIES_IN_FLIGHT));
        tokio::spawn(run(raft.clone(), rx, in_flight.clone()));
        Self {
            tx,
            alone: Some(Alone { raft, in_flight }),
        }
    }

    /// Proposes one command and waits for its result, at most `timeout`.
    ///
    /// With nothing queued and no entry in flight the caller proposes its command itself: at one
    /// caller at a time the writer task would only add two task hand-offs (to it, and from the
    /// task waiting for the commit back) to every write.
    pub async fn write(&self, cmd: Command, timeout: Duration) -> Result<CommandResult, WriteError> {
        let bytes = command_bytes(&cmd)?;
        let write = async {
            if let Some((raft, permit)) = self.idle_slot() {
                let _permit = permit;
                metrics::histogram!("storesvr_entry_commands").record(1.0);
                let committed = raft.client_write_ff(Request { cmds: vec![cmd] }).await;
                let mut results = committed_results(committed, 1).await?;
                return results
                    .pop()
                    .ok_or_else(|| WriteError::Unavailable("an entry without its result".into()));
            }
            let (reply, rx) = oneshot::channel();
            self.tx
                .send(Pending { cmd, bytes, reply })
                .await
                .map_err(|_| WriteError::Unavailable("writer stopped".into()))?;
            rx.await
                .map_err(|_| WriteError::Unavailable("writer dropped the request".into()))?
        };
        match tokio::time::timeout(timeout, write).await {
            Ok(r) => r,
            Err(_) => Err(WriteError::Unavailable(format!("no commit within {timeout:?}"))),
        }
    }

    /// Whether nothing is queued and no entry is in flight (a handing-over leader waits for it).
    pub fn idle(&self) -> bool {
        let quiet = self.tx.capacity() == self.tx.max_capacity();
        quiet
            && self
                .alone
                .as_ref()
                .is_none_or(|a| a.in_flight.available_permits() == MAX_ENTRIES_IN_FLIGHT)
    }

    /// An entry slot, when the writer is idle: nothing queued and nothing in flight. The
    /// semaphore is fair, so this never takes a slot that the writer task is waiting for.
    fn idle_slot(&self) -> Option<(&Raft, OwnedSemaphorePermit)> {
        let alone = self.alone.as_ref()?;
        if self.tx.capacity() < self.tx.max_capacity() {
            return None;
        }
        Some((&alone.raft, alone.in_flight.clone().try_acquire_owned().ok()?))
    }
}

async fn run(raft: Raft, mut rx: mpsc::Receiver<Pending>, in_flight: Arc<Semaphore>) {
    // Queued commands not yet proposed, in queue order: what did not fit the last entry first.
    let mut batch: Vec<Pending> = Vec::with_capacity(MAX_ENTRY_COMMANDS);
    loop {
        // Commands first, then a slot: an idle writer holds no slot, so that a lone caller can
        // propose by itself; while every slot is busy the queue grows into the next entry.
        if batch.is_empty() && rx.recv_many(&mut batch, MAX_ENTRY_COMMANDS).await == 0 {
            return;
        }
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        while batch.len() < MAX_ENTRY_COMMANDS
            && let Ok(p) = rx.try_recv()
        {
            batch.push(p);
        }
        let n = entry_len(batch.iter().map(|p| p.bytes));
        let (cmds, replies): (Vec<Command>, Vec<_>) = batch.drain(..n).map(|p| (p.cmd, p.reply)).unzip();
        metrics::histogram!("storesvr_entry_commands").record(cmds.len() as f64);
        // Submitting in this loop keeps entries in queue order; waiting for each commit happens
        // in its own task so that the next entry can be proposed meanwhile.
        let committed = raft.client_write_ff(Request { cmds }).await;
        tokio::spawn(async move {
            let _permit = permit;
            match committed_results(committed, replies.len()).await {
                Ok(results) => {
                    for (reply, result) in replies.into_iter().zip(results) {
                        let _ = reply.send(Ok(result));
                    }
                }
                Err(e) => fail_all(replies, e),
            }
        });
    }
}

/// What `client_write_ff` hands back: the receiver of the entry's commit and apply.
type Committed = <<TypeConfig as openraft::RaftTypeConfig>::Responder as Responder<TypeConfig>>::Receiver;

/// The results of a proposed entry of `n` commands, once it is committed and applied.
async fn committed_results(
    proposed: Result<Committed, openraft::error::Fatal<NodeId>>,
    n: usize,
) -> Result<Vec<CommandResult>, WriteError> {
    let committed = proposed.map_err(|fatal| WriteError::Unavailable(fatal.to_string()))?;
    match committed.await {
        Ok(Ok(resp)) => {
            debug_assert_eq!(resp.data.results.len(), n);
            Ok(resp.data.results)
        }
        Ok(Err(ClientWriteError::ForwardToLeader(f))) => Err(WriteError::NotLeader(f.leader_id)),
        Ok(Err(e)) => Err(WriteError::Unavailable(e.to_string())),
        Err(_) => Err(WriteError::Unavailable("raft dropped the write".into())),
    }
}

/// Encoded size of one command, or why it can never be proposed.
fn command_bytes(cmd: &Command) -> Result<usize, WriteError> {
    let bytes = postcard::experimental::serialized_size(cmd)
        .map_err(|e| WriteError::TooLarge(format!("the command cannot be encoded: {e}")))?;
    if bytes > MAX_ENTRY_BYTES {
        return Err(WriteError::TooLarge(format!(
            "the command encodes to {bytes} bytes, more than the {MAX_ENTRY_BYTES} one Raft entry may hold; \
             split it into smaller requests"
        )));
    }
    Ok(bytes)
}

/// How many of the queued commands (their encoded sizes, in queue order) the next entry takes:
/// at least one, then as many as fit both caps.
fn entry_len(sizes: impl Iterator<Item = usize>) -> usize {
    let mut total = 0;
    let mut n = 0;
    for bytes in sizes.take(MAX_ENTRY_COMMANDS) {
        debug_assert!(bytes <= MAX_ENTRY_BYTES, "an oversized command was queued");
        if n > 0 && total + bytes > MAX_ENTRY_BYTES {
            break;
        }
        total += bytes;
        n += 1;
    }
    n
}

fn fail_all(replies: Vec<oneshot::Sender<Result<CommandResult, WriteError>>>, err: WriteError) {
    for reply in replies {
        let _ = reply.send(Err(err.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn register(addr_bytes: usize) -> Command {
        Command::Register {
            node_id: seqsvr_proto::NodeId(1),
            addr: "a".repeat(addr_bytes),
            nonce: 0,
        }
    }

    /// Splits the queue the way `run` does; the sizes of each entry's commands.
    fn entries(sizes: &[usize]) -> Vec<Vec<usize>> {
        let mut queue = sizes.to_vec();
        let mut out = Vec::new();
        while !queue.is_empty() {
            let n = entry_len(queue.iter().copied());
            assert!(n >= 1);
            out.push(queue.drain(..n).collect());
        }
        out
    }

    #[test]
    fn commands_past_the_byte_cap_are_split_into_several_entries() {
        // 40 commands of a tenth of the cap each: 10 per entry (the 11th would pass it).
        let cmds: Vec<Command> = (0..40).map(|_| register(MAX_ENTRY_BYTES / 10 - 16)).collect();
        let sizes: Vec<usize> = cmds.iter().map(|c| command_bytes(c).unwrap()).collect();
        let split = entries(&sizes);
        assert_eq!(split.len(), 4, "{:?}", split.iter().map(Vec::len).collect::<Vec<_>>());
        for entry in &split {
            assert_eq!(entry.len(), 10);
            let request = Request {
                cmds: vec![register(MAX_ENTRY_BYTES / 10 - 16); entry.len()],
            };
            let encoded = postcard::to_stdvec(&request).unwrap().len();
            assert!(encoded <= MAX_ENTRY_BYTES + seqsvr_proto::limits::ENTRY_FRAMING_BYTES);
        }
        // Nothing lost or reordered.
        assert_eq!(split.concat(), sizes);
    }

    #[test]
    fn entries_are_bounded_by_count_and_bytes() {
        type Case = (&'static str, Vec<usize>, Vec<usize>);
        let cases: [Case; 5] = [
            ("one small", vec![10], vec![1]),
            (
                "count cap",
                vec![10; MAX_ENTRY_COMMANDS + 5],
                vec![MAX_ENTRY_COMMANDS, 5],
            ),
            ("exactly the cap", vec![MAX_ENTRY_BYTES / 2; 3], vec![2, 1]),
            ("one at the cap each", vec![MAX_ENTRY_BYTES; 3], vec![1, 1, 1]),
            ("big after small", vec![1, MAX_ENTRY_BYTES, 1], vec![1, 1, 1]),
        ];
        for (name, sizes, want) in cases {
            let got: Vec<usize> = entries(&sizes).iter().map(Vec::len).collect();
            assert_eq!(got, want, "{name}");
        }
    }

    #[tokio::test]
    async fn a_command_above_the_cap_is_refused_before_it_is_queued() {
        let (tx, mut rx) = mpsc::channel(1);
        let writer = Writer { tx, alone: None };
        let err = writer
            .write(register(MAX_ENTRY_BYTES + 1), Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, WriteError::TooLarge(m) if m.contains("split it")),
            "{err:?}"
        );
        assert!(rx.try_recv().is_err(), "the oversized command was queued");
        // One that fits is queued.
        let ok = register(MAX_ENTRY_BYTES - 16);
        let _pending = tokio::spawn(async move { writer.write(ok, Duration::from_secs(1)).await });
        let queued = rx.recv().await.expect("queued");
        assert!(queued.bytes <= MAX_ENTRY_BYTES);
    }
}
