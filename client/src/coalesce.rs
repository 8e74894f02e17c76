//! [`Coalescer`]: many concurrent `fetch_next_seq` callers share `BatchFetchNextSeq` RPCs.
//!
//! Per owner address, callers join a bounded queue; a drain task takes up to `max_batch` waiting
//! callers at a time and runs one batch fetch for them, with at most `max_in_flight` batches per owner.
//! Under light load a caller's request goes out alone and at once (no timer, no added latency); under
//! heavy load requests pile up while the batches in flight run, and a further batch starts only
//! once `busy_batch` callers wait, so batches grow with the load (see `drain`).
//! A uid asked twice in one batch is fine: the server serves each occurrence in order.
//!
//! Keeps the client's promise: each caller gets its own seq from an OK reply or an error; a caller
//! whose request was handed to a batch that did not answer in time gets [`ClientError::Unknown`].
//!
//! Deliberately left out: a linger timer to grow batches at low load (it would add latency to every
//! call to save RPCs that are cheap at that load).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use seqsvr_proto::Uid;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;

use crate::batch::MAX_UIDS_PER_RPC;
use crate::client::{Client, Fetched};
use crate::error::{ClientError, FailureKind};
use crate::routing::target_addr;

/// Limits of a [`Coalescer`].
#[derive(Debug, Clone)]
pub struct CoalescerConfig {
    /// Callers that may wait per owner; past it a call fails at once (nothing sent) instead of
    /// queueing without bound.
    pub queue_capacity: usize,
    /// Most callers served by one batch (at most 1,000: the RPC limit).
    pub max_batch: usize,
    /// Batches in flight per owner at once.
    pub max_in_flight: usize,
    /// While a batch of an owner is in flight, the next one waits for this many callers (or for
    /// a batch to finish); a caller alone is always sent at once.
    pub busy_batch: usize,
}

impl Default for CoalescerConfig {
    fn default() -> Self {
        Self {
            queue_capacity: 10_000,
            max_batch: MAX_UIDS_PER_RPC,
            max_in_flight: 4,
            busy_batch: 32,
        }
    }
}

/// One waiting caller.
struct Waiter {
    uid: Uid,
    deadline: Instant,
    reply: oneshot::Sender<Result<Fetched, ClientError>>,
}

/// Most distinct owner queues kept; past it, queues of addresses no longer routed are closed.
const MAX_QUEUES: usize = 256;

/// Extra time a caller waits past its deadline for the batch's answer: the batch itself stops at the
/// deadline, this only covers the reply's way back.
const ANSWER_GRACE: Duration = Duration::from_millis(200);

/// Shares batch RPCs among concurrent callers of [`Coalescer::fetch_next_seq`]. Must be used inside a
/// tokio runtime (drain tasks are spawned on first use of an owner); they end when it is dropped.
#[derive(Debug)]
pub struct Coalescer {
    client: Client,
    cfg: CoalescerConfig,
    queues: Mutex<HashMap<String, mpsc::Sender<Waiter>>>,
}

impl std::fmt::Debug for Waiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiter").field("uid", &self.uid).finish()
    }
}

impl Coalescer {
    /// A coalescer over `client`; refuses limits that are zero or above the RPC limit.
    pub fn new(client: Client, cfg: CoalescerConfig) -> Result<Self, ClientError> {
        if cfg.queue_capacity == 0
            || cfg.max_in_flight == 0
            || cfg.busy_batch == 0
            || !(1..=MAX_UIDS_PER_RPC).contains(&cfg.max_batch)
        {
            return Err(ClientError::failed(
                FailureKind::BadConfig,
                format!("coalescer limits must be positive and max_batch <= {MAX_UIDS_PER_RPC}: {cfg:?}"),
            ));
        }
        Ok(Self {
            client,
            cfg,
            queues: Mutex::new(HashMap::new()),
        })
    }

    /// The client this coalescer sends through.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The next seq of `uid`, sent in a batch with other callers' uids for the same owner.
    pub async fn fetch_next_seq(&self, uid: Uid) -> Result<Fetched, ClientError> {
        let deadline = Instant::now() + self.client.config().deadline;
        let routes = self.client.routes();
        let target = target_addr(&routes, uid, &self.client.inner.seeds, |n| self.client.random_index(n))?;
        let queue = self.queue_for(target.addr);
        let (tx, rx) = oneshot::channel();
        queue
            .try_send(Waiter {
                uid,
                deadline,
                reply: tx,
            })
            .map_err(|e| {
                let why = match e {
                    mpsc::error::TrySendError::Full(_) => "coalescer queue is full",
                    mpsc::error::TrySendError::Closed(_) => "coalescer queue is closed",
                };
                ClientError::failed(FailureKind::Unavailable, why)
            })?;
        match tokio::time::timeout_at(deadline + ANSWER_GRACE, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(ClientError::unknown(
                "the batch carrying this request ended without an answer",
            )),
            Err(_) => Err(ClientError::unknown(
                "no answer from the batch carrying this request before the deadline",
            )),
        }
    }

    fn queue_for(&self, addr: &str) -> mpsc::Sender<Waiter> {
        let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(q) = queues.get(addr) {
            return q.clone();
        }
        if queues.len() >= MAX_QUEUES {
            // Dropping a sender closes that queue once its drain task has answered what is in it.
            let routes = self.client.routes();
            queues.retain(|a, _| routes.routes_to(a));
        }
        let (tx, rx) = mpsc::channel(self.cfg.queue_capacity);
        tokio::spawn(drain(self.client.clone(), rx, self.cfg.clone()));
        queues.insert(addr.to_owned(), tx.clone());
        tx
    }
}

/// Takes waiting callers off one owner's queue in batches.
///
/// A batch goes out at once when no other batch of this owner is in flight (a lone caller waits
/// for nothing), and while others are in flight only once `busy_batch` callers are waiting (or
/// `max_batch`). Otherwise the callers wait for the next batch to finish: every RPC costs both
/// sides a few tens of microseconds of syscalls and HTTP/2 framing, whatever its size, so under
/// load fewer, larger batches carry more seqs per core than many small ones.
async fn drain(client: Client, mut rx: mpsc::Receiver<Waiter>, cfg: CoalescerConfig) {
    let in_flight = Arc::new(AtomicUsize::new(0));
    let finished = Arc::new(Notify::new());
    let mut batch: Vec<Waiter> = Vec::new();
    let mut open = true;
    loop {
        if batch.is_empty() {
            match rx.recv().await {
                Some(w) => batch.push(w),
                None => return,
            }
        }
        while open && batch.len() < cfg.max_batch {
            match rx.try_recv() {
                Ok(w) => batch.push(w),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => open = false,
            }
        }
        let running = in_flight.load(Ordering::Acquire);
        let worth_it = batch.len() >= cfg.busy_batch.min(cfg.max_batch) || !open;
        if running == 0 || (running < cfg.max_in_flight && worth_it) {
            in_flight.fetch_add(1, Ordering::AcqRel);
            let (client, in_flight, finished) = (client.clone(), in_flight.clone(), finished.clone());
            let full = std::mem::replace(&mut batch, Vec::with_capacity(cfg.max_batch.min(64)));
            tokio::spawn(async move {
                serve(&client, full).await;
                in_flight.fetch_sub(1, Ordering::AcqRel);
                // A stored permit when the drain is not waiting yet: no finish is missed.
                finished.notify_one();
            });
            continue;
        }
        // Wait for a batch to finish, or for another caller while there is room.
        let room = open && batch.len() < cfg.max_batch;
        tokio::select! {
            () = finished.notified() => {}
            w = rx.recv(), if room => match w {
                Some(w) => batch.push(w),
                None => open = false,
            },
        }
    }
}

/// Runs one batch and answers each caller with its own result.
async fn serve(client: &Client, batch: Vec<Waiter>) {
    let now = Instant::now();
    let (live, expired): (Vec<Waiter>, Vec<Waiter>) = batch.into_iter().partition(|w| w.deadline > now);
    for w in expired {
        // Never sent: the caller's deadline passed while it waited in the queue.
        let _ = w.reply.send(Err(ClientError::failed(
            FailureKind::Unavailable,
            "deadline passed while queued; not sent",
        )));
    }
    let Some(deadline) = live.iter().map(|w| w.deadline).min() else {
        return;
    };
    let uids: Vec<Uid> = live.iter().map(|w| w.uid).collect();
    let results = client.batch_fetch_until(&uids, deadline).await;
    debug_assert_eq!(results.len(), live.len());
    for (w, r) in live.into_iter().zip(results) {
        let _ = w.reply.send(r);
    }
}
