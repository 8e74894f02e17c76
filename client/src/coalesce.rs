//! [`Coalescer`]: many concurrent `fetch_next_seq` callers share `BatchFetchNextSeq` RPCs (and
//! `counter_next` callers `CounterBatch` RPCs, in the same owner queues), and
//! many concurrent `next_id` callers share `NextIds` RPCs (one queue for all: no routing).
//!
//! Per owner address, callers join a bounded list of waiters; a drain task takes up to `max_batch`
//! of them at a time and runs one batch fetch for them, with at most `max_in_flight` batches per
//! owner. Under light load a caller's request goes out alone and at once, sent from the caller's
//! own task (no timer, no hand-off to the drain); under heavy load requests pile up while the
//! batches in flight run, and a further batch starts only once `busy_batch` callers wait, so
//! batches grow with the load (see `drain`).
//! A uid asked twice in one batch is fine: the server serves each occurrence in order.
//!
//! What a caller costs is what limits this under load (the server spends about a microsecond per
//! seq), so the path is kept short: one lock for the owner's list (the same lock finds the owner's
//! queue and joins it), one oneshot for the answer, the drain woken only when its next batch may
//! be ready, and a batch taken off the list whole instead of one receive per caller.
//!
//! Keeps the client's promise: each caller gets its own seq from an OK reply or an error; a caller
//! whose request was handed to a batch that did not answer in time gets [`ClientError::Unknown`].
//! Every caller is answered by its batch, which ends at the earliest deadline of its callers (the
//! rounds of [`Client::batch_fetch_each`] are bounded by it), so a caller arms no timer of its own.
//!
//! Deliberately left out: a linger timer to grow batches at low load (it would add latency to every
//! call to save RPCs that are cheap at that load).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use seqsvr_proto::Uid;
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use crate::batch::{Items, MAX_UIDS_PER_RPC};
use crate::client::{Client, Counted, Fetched};
use crate::error::{ClientError, FailureKind};
use crate::routing::target_of;

/// What a [`Coalescer`] has sent so far (uid and key batches; ids are counted apart): callers per
/// batch is the figure to watch when tuning [`CoalescerConfig`] — a batch costs both sides about
/// what tens of single values do, so small batches under load mean the limits hold them back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoalescerStats {
    /// Batches sent, a lone caller's batch of one included.
    pub batches: u64,
    /// Callers those batches carried.
    pub callers: u64,
}

/// The counts behind [`CoalescerStats`], shared with the drain tasks.
#[derive(Debug, Default)]
struct Sent {
    batches: AtomicU64,
    callers: AtomicU64,
}

impl Sent {
    fn batch(&self, callers: usize) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.callers.fetch_add(callers as u64, Ordering::Relaxed);
    }
}

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

/// What a waiting caller asks for.
#[derive(Debug)]
enum Item {
    Uid(Uid),
    Key(Box<str>),
}

/// One waiting caller.
struct Waiter {
    item: Item,
    deadline: Instant,
    reply: oneshot::Sender<Result<Fetched, ClientError>>,
}

impl std::fmt::Debug for Waiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiter").field("item", &self.item).finish()
    }
}

/// Most distinct owner queues kept; past it, idle queues of addresses no longer routed are closed.
const MAX_QUEUES: usize = 256;

/// One owner's callers, waiting for a batch.
#[derive(Debug)]
struct Queue {
    waiting: Vec<Waiter>,
    /// Shared with the owner's drain task.
    drain: Arc<DrainState>,
}

/// How a caller joined its owner's queue.
enum Joined {
    /// Waiting for a batch; its answer comes on this channel.
    Queued(oneshot::Receiver<Result<Fetched, ClientError>>),
    /// Nothing in flight, nobody waiting: the caller sends its item itself.
    Alone(Running, Item),
}

/// A lone caller's batch of one, counted in flight until it ends — answered or dropped with its
/// caller — and then the drain is woken for the callers who gathered meanwhile.
struct Running(Arc<DrainState>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.finished();
    }
}

/// What a drain task and the callers of its owner share outside the lock.
#[derive(Debug, Default)]
struct DrainState {
    /// Woken when the drain's next batch may be ready: the first caller, the `busy_batch`-th
    /// caller, a finished batch, or the queue closed. A permit is stored when the drain is busy,
    /// so no wake-up is lost.
    wake: Notify,
    in_flight: AtomicUsize,
    /// Callers in the owner's list, counted beside it so that a batch ending can tell without
    /// the lock whether anyone waits for the drain.
    waiting: AtomicUsize,
}

impl DrainState {
    /// A batch of this owner ended: wakes the drain only when callers wait for it. At low load
    /// every call is a lone caller's batch of one, and waking the drain after each would add a
    /// task wake-up (often another worker thread's) to every forwarded call for nothing.
    ///
    /// No wake-up is lost: a caller joins (`waiting` raised) before it wakes the drain, and the
    /// drain reads `in_flight` after that wake-up; so either the drain sees this batch gone, or
    /// this load (after the decrement, both sequentially consistent) sees the caller.
    fn finished(&self) {
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.wake.notify_one();
        }
    }
}

/// Every owner's queue, by owner address, behind one lock: a caller finds its owner's queue and
/// joins it in one short critical section. Hashed with foldhash: the address is hashed for every
/// caller, and SipHash showed in a caller's instruction count (`sim/bench/callgrind-coalescer.sh`);
/// the addresses come from the route table, not from whoever calls.
type QueueMap = HashMap<String, Queue, foldhash::fast::RandomState>;
type Queues = Arc<Mutex<QueueMap>>;

fn lock(queues: &Queues) -> MutexGuard<'_, QueueMap> {
    queues.lock().unwrap_or_else(|e| e.into_inner())
}

/// Shares batch RPCs among concurrent callers of [`Coalescer::fetch_next_seq`]. Must be used inside a
/// tokio runtime (drain tasks are spawned on first use of an owner); they end when it is dropped.
#[derive(Debug)]
pub struct Coalescer {
    client: Client,
    cfg: CoalescerConfig,
    queues: Queues,
    sent: Arc<Sent>,
    /// Callers of [`Coalescer::next_id`] (one queue: any AllocSvr answers for ids).
    ids: Arc<crate::ids::IdQueue>,
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
            queues: Arc::new(Mutex::new(QueueMap::default())),
            sent: Arc::default(),
            ids: Arc::default(),
        })
    }

    /// The batches sent so far and the callers they carried.
    pub fn stats(&self) -> CoalescerStats {
        CoalescerStats {
            batches: self.sent.batches.load(Ordering::Relaxed),
            callers: self.sent.callers.load(Ordering::Relaxed),
        }
    }

    /// The client this coalescer sends through.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The next seq of `uid`, sent in a batch with other callers' uids for the same owner.
    pub async fn fetch_next_seq(&self, uid: Uid) -> Result<Fetched, ClientError> {
        self.enqueue(Item::Uid(uid)).await
    }

    /// The next value of the named counter `key`, sent in a `CounterBatch` with other callers'
    /// keys for the same owner. A bad key is refused here, before it joins a batch.
    pub async fn counter_next(&self, key: &str) -> Result<Counted, ClientError> {
        seqsvr_proto::keys::check_key_str(key)
            .map_err(|e| ClientError::failed(FailureKind::InvalidArgument, e.to_string()))?;
        self.enqueue(Item::Key(key.into())).await.map(Counted::from)
    }

    async fn enqueue(&self, item: Item) -> Result<Fetched, ClientError> {
        let deadline = Instant::now() + self.client.config().deadline;
        let joined = self.client.with_routes(|routes| {
            let place = match &item {
                Item::Uid(uid) => Some(*uid),
                Item::Key(key) => routes.key_place(key),
            };
            let target = target_of(routes, place, &self.client.inner.seeds, |n| self.client.random_index(n))?;
            self.join(target.addr, item, deadline)
        })?;
        let unanswered = || {
            Err(ClientError::unknown(
                "the batch carrying this request ended without an answer",
            ))
        };
        match joined {
            Joined::Queued(rx) => rx.await.unwrap_or_else(|_| unanswered()),
            // `_running` is held to the end of the call, dropped or not.
            Joined::Alone(_running, item) => {
                self.sent.batch(1);
                let mut results = match &item {
                    Item::Uid(uid) => batch_of(&self.client, Items::Uids(std::slice::from_ref(uid)), deadline).await,
                    Item::Key(key) => batch_of(&self.client, Items::Keys(&[&**key]), deadline).await,
                };
                results.pop().unwrap_or_else(unanswered)
            }
        }
    }

    /// One time-ordered id, sent in one `NextIds` with the other callers waiting now (up to 4,096
    /// a call). Ids of one batch are handed out in the order the callers joined.
    pub async fn next_id(&self) -> Result<u64, ClientError> {
        let c = &self.cfg;
        let limits = (c.queue_capacity, c.busy_batch, c.max_in_flight);
        self.ids.next_id(&self.client, limits).await
    }

    /// Joins the queue of `addr` (made on first use, with its drain task), waking the drain when
    /// its next batch may now be ready. A caller that finds nothing in flight and nobody waiting
    /// is sent by itself, from its own task ([`Joined::Alone`]): going through the drain would add
    /// two task wake-ups to the round trip of every call at low load, for a batch of one anyway.
    /// It counts as a batch in flight, so callers arriving meanwhile gather behind it as behind
    /// any batch.
    fn join(&self, addr: &str, item: Item, deadline: Instant) -> Result<Joined, ClientError> {
        let mut queues = lock(&self.queues);
        if !queues.contains_key(addr) {
            if queues.len() >= MAX_QUEUES {
                self.close_unrouted(&mut queues);
            }
            let drain_state = Arc::new(DrainState::default());
            let (owner, state, cfg) = (addr.to_owned(), drain_state.clone(), self.cfg.clone());
            let (client, all, sent) = (self.client.clone(), self.queues.clone(), self.sent.clone());
            tokio::spawn(drain(client, all, sent, owner, state, cfg));
            queues.insert(
                addr.to_owned(),
                Queue {
                    waiting: Vec::new(),
                    drain: drain_state,
                },
            );
        }
        let queue = queues.get_mut(addr).expect("inserted above");
        if queue.waiting.is_empty() && queue.drain.in_flight.load(Ordering::SeqCst) == 0 {
            queue.drain.in_flight.fetch_add(1, Ordering::SeqCst);
            return Ok(Joined::Alone(Running(queue.drain.clone()), item));
        }
        if queue.waiting.len() >= self.cfg.queue_capacity {
            return Err(ClientError::failed(FailureKind::Unavailable, "coalescer queue is full"));
        }
        let (reply, rx) = oneshot::channel();
        queue.waiting.push(Waiter { item, deadline, reply });
        queue.drain.waiting.fetch_add(1, Ordering::SeqCst);
        let n = queue.waiting.len();
        if n == 1 || n == self.cfg.busy_batch.min(self.cfg.max_batch) {
            queue.drain.wake.notify_one();
        }
        Ok(Joined::Queued(rx))
    }

    /// Closes the idle queues of addresses the route table no longer sends to: their drains end.
    fn close_unrouted(&self, queues: &mut QueueMap) {
        let routes = self.client.routes();
        queues.retain(|addr, q| {
            let keep = !q.waiting.is_empty() || routes.routes_to(addr);
            if !keep {
                q.drain.wake.notify_one();
            }
            keep
        });
    }
}

impl Drop for Coalescer {
    /// Ends every drain task: each finds its queue gone. Callers still waiting hold a borrow of
    /// the coalescer, so there are none; a waiter left by a cancelled caller is dropped unanswered.
    fn drop(&mut self) {
        for (_, q) in lock(&self.queues).drain() {
            q.drain.wake.notify_one();
        }
        self.ids.close();
    }
}

/// Takes waiting callers off one owner's queue in batches, until the queue is closed.
///
/// A batch goes out at once when no other batch of this owner is in flight (a lone caller waits
/// for nothing), and while others are in flight only once `busy_batch` callers are waiting (or
/// `max_batch`). Otherwise the callers wait for the next batch to finish: every RPC costs both
/// sides a few tens of microseconds of syscalls and HTTP/2 framing, whatever its size, so under
/// load fewer, larger batches carry more seqs per core than many small ones.
async fn drain(
    client: Client,
    queues: Queues,
    sent: Arc<Sent>,
    owner: String,
    state: Arc<DrainState>,
    cfg: CoalescerConfig,
) {
    let busy = cfg.busy_batch.min(cfg.max_batch);
    loop {
        let batch = {
            let mut queues = lock(&queues);
            let Some(queue) = queues.get_mut(&owner).filter(|q| Arc::ptr_eq(&q.drain, &state)) else {
                return; // closed: the coalescer is gone, or the address is no longer routed to
            };
            let (waiting, running) = (queue.waiting.len(), state.in_flight.load(Ordering::SeqCst));
            let ready = waiting > 0 && (running == 0 || (running < cfg.max_in_flight && waiting >= busy));
            ready.then(|| {
                let batch = take_batch(&mut queue.waiting, cfg.max_batch);
                state.waiting.fetch_sub(batch.len(), Ordering::SeqCst);
                batch
            })
        };
        let Some(batch) = batch else {
            state.wake.notified().await;
            continue;
        };
        state.in_flight.fetch_add(1, Ordering::SeqCst);
        sent.batch(batch.len());
        let (client, state) = (client.clone(), state.clone());
        tokio::spawn(async move {
            serve(&client, batch).await;
            state.finished();
        });
    }
}

/// The first `max` waiters, in arrival order, leaving the rest.
fn take_batch(waiting: &mut Vec<Waiter>, max: usize) -> Vec<Waiter> {
    if waiting.len() <= max {
        return std::mem::take(waiting);
    }
    let rest = waiting.split_off(max);
    std::mem::replace(waiting, rest)
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
    // Uids and keys of one owner go out side by side, one RPC kind each.
    let (uid_waiters, key_waiters): (Vec<Waiter>, Vec<Waiter>) =
        live.into_iter().partition(|w| matches!(w.item, Item::Uid(_)));
    let uids: Vec<Uid> = uid_waiters
        .iter()
        .filter_map(|w| match w.item {
            Item::Uid(u) => Some(u),
            Item::Key(_) => None,
        })
        .collect();
    let keys: Vec<&str> = key_waiters
        .iter()
        .filter_map(|w| match &w.item {
            Item::Key(k) => Some(&**k),
            Item::Uid(_) => None,
        })
        .collect();
    let (by_uid, by_key) = tokio::join!(
        batch_of(client, Items::Uids(&uids), deadline),
        batch_of(client, Items::Keys(&keys), deadline)
    );
    debug_assert_eq!(by_uid.len() + by_key.len(), uid_waiters.len() + key_waiters.len());
    let answers = uid_waiters
        .into_iter()
        .zip(by_uid)
        .chain(key_waiters.into_iter().zip(by_key));
    for (w, r) in answers {
        let _ = w.reply.send(r);
    }
}

/// One batch fetch of `items`, or nothing for none.
async fn batch_of(client: &Client, items: Items<'_>, deadline: Instant) -> Vec<Result<Fetched, ClientError>> {
    if items.is_empty() {
        return Vec::new();
    }
    client.batch_fetch_until(items, deadline).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether a wake-up of the drain is stored (a `notify_one` with nobody waiting keeps one).
    async fn woken(state: &DrainState) -> bool {
        tokio::time::timeout(std::time::Duration::ZERO, state.wake.notified())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_lone_batch_ending_wakes_the_drain_only_when_callers_wait() {
        let state = Arc::new(DrainState::default());
        state.in_flight.fetch_add(1, Ordering::SeqCst);
        drop(Running(state.clone()));
        assert_eq!(state.in_flight.load(Ordering::SeqCst), 0);
        assert!(!woken(&state).await, "nobody waits: the drain sleeps on");

        state.in_flight.fetch_add(1, Ordering::SeqCst);
        state.waiting.fetch_add(1, Ordering::SeqCst);
        drop(Running(state.clone()));
        assert!(woken(&state).await, "a caller waits: the drain must look");
    }
}
