//! Time-ordered ids: `NextIds` from any AllocSvr that holds a slot. No routing: ids are unique in
//! the whole cluster whichever AllocSvr issues them, so a call goes to a random known AllocSvr
//! (seeds, route-table owners and the map's AllocSvrs of every set) and, when that one cannot
//! answer (no slot yet, its clock behind, unreachable), to another, under the call's deadline.
//!
//! A lost reply only wastes ids (they were never seen by anyone), so a timed-out attempt is simply
//! retried: a call that fails is [`ClientError::Failed`], never `Unknown`.
//!
//! Left out: buffering ids ahead of the callers (each id a caller gets was issued for its call, so
//! ids from one process sort the way its calls completed, within the layout's tick).

use std::time::Duration;

use seqsvr_proto::id_layout::IdLayout;
use seqsvr_proto::limits::MAX_IDS_PER_CALL;
use seqsvr_proto::{pb, refusal};
use tokio::time::Instant;
use tonic::Code;

use crate::client::Client;
use crate::error::{ClientError, FailureKind};
use crate::retry::Budget;

/// Ids one call returned, in increasing order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ids {
    pub ids: Vec<u64>,
    /// The layout they decode under.
    pub layout: IdLayout,
    /// The set that leases the slot they came from.
    pub set_id: u64,
    /// The epoch of the slot's grant to the issuing AllocSvr (0 from one that does not say):
    /// with the slot, it names the holder.
    pub slot_epoch: u64,
    /// The AllocSvr that issued them.
    pub addr: String,
}

impl Client {
    /// One time-ordered id, unique in the whole cluster.
    pub async fn next_id(&self) -> Result<u64, ClientError> {
        Ok(self.next_ids(1).await?.ids[0])
    }

    /// `count` (1 to 4,096) time-ordered ids from one AllocSvr, in increasing order. A count above
    /// what one call can be handed under the cluster's layout ([`IdLayout::most_ids_per_call`]:
    /// 4,096 for Twitter's and Sonyflake's) is refused by the AllocSvr as `InvalidArgument`.
    pub async fn next_ids(&self, count: u32) -> Result<Ids, ClientError> {
        if count == 0 || count > MAX_IDS_PER_CALL {
            return Err(ClientError::failed(
                FailureKind::InvalidArgument,
                format!("count must be 1 to {MAX_IDS_PER_CALL}, got {count}"),
            ));
        }
        let cfg = self.config();
        let mut budget = Budget::until(cfg, Instant::now() + cfg.deadline);
        let mut last = String::new();
        let mut avoid: Option<String> = None;
        while let Some(timeout) = budget.start_attempt(Instant::now()) {
            let addr = self.any_allocsvr(avoid.as_deref());
            match self.next_ids_at(&addr, count, timeout).await {
                Ok(reply) => return unpack(reply, count, addr),
                Err(status) if status.code() == Code::InvalidArgument => {
                    return Err(ClientError::failed(FailureKind::InvalidArgument, status.message()));
                }
                Err(status) if refusal::of(&status) == Some(refusal::Refusal::Exhausted) => {
                    return Err(ClientError::failed(FailureKind::Exhausted, status.message()));
                }
                Err(status) => last = format!("{addr}: {}", status.message()),
            }
            avoid = Some(addr);
            self.back_off(&mut budget, true).await;
        }
        Err(ClientError::failed(
            FailureKind::Unavailable,
            if last.is_empty() {
                "no attempt before the deadline".into()
            } else {
                last
            },
        ))
    }

    /// A random AllocSvr address other than `avoid` when there is another.
    pub(crate) fn any_allocsvr(&self, avoid: Option<&str>) -> String {
        let routes = self.routes();
        let mut addrs: Vec<&str> = routes.owner_addrs();
        addrs.extend(self.inner.seeds.all().iter().map(String::as_str));
        addrs.sort_unstable();
        addrs.dedup();
        if addrs.len() > 1
            && let Some(a) = avoid
        {
            addrs.retain(|x| *x != a);
        }
        addrs[self.random_index(addrs.len())].to_string()
    }

    async fn next_ids_at(&self, addr: &str, count: u32, timeout: Duration) -> Result<pb::NextIdsReply, tonic::Status> {
        let mut client = self.client_for(addr)?;
        let mut req = tonic::Request::new(pb::NextIdsRequest { count });
        req.set_timeout(timeout);
        match tokio::time::timeout(timeout, client.next_ids(req)).await {
            Ok(reply) => reply.map(tonic::Response::into_inner),
            Err(_) => Err(tonic::Status::deadline_exceeded("timed out")),
        }
    }
}

/// The ids of a reply, checked: as many as asked for, in increasing order, under a layout.
fn unpack(reply: pb::NextIdsReply, count: u32, addr: String) -> Result<Ids, ClientError> {
    let bad = |why: String| ClientError::failed(FailureKind::Unavailable, format!("{addr} sent a bad reply: {why}"));
    let layout = reply
        .layout
        .as_ref()
        .ok_or_else(|| bad("no layout".into()))
        .and_then(|l| IdLayout::from_pb(l).map_err(|e| bad(e.to_string())))?;
    let ids: Vec<u64> = reply
        .runs
        .iter()
        .flat_map(|r| (0..u64::from(r.count)).map(move |i| r.first.saturating_add(i)))
        .collect();
    if ids.len() != count as usize || ids.windows(2).any(|w| w[0] >= w[1]) {
        return Err(bad(format!(
            "{} ids not in increasing order for a count of {count}",
            ids.len()
        )));
    }
    Ok(Ids {
        ids,
        layout,
        set_id: reply.set_id,
        slot_epoch: reply.slot_epoch,
        addr,
    })
}

/// The waiters of [`crate::Coalescer::next_id`]: callers of any uid share one queue, since any
/// AllocSvr answers for ids. A drain task takes up to as many of them as one call can be handed
/// (at most [`MAX_IDS_PER_CALL`], fewer under a layout with few sequence bits and long ticks:
/// [`IdLayout::most_ids_per_call`]) into one `NextIds`, under the same policy as the seq batches
/// (a lone caller goes out at once; while batches are in flight the next waits for `busy_batch`
/// callers).
#[derive(Debug, Default)]
pub(crate) struct IdQueue {
    /// The most ids one call can be handed under the layout of the last reply; 0 before one
    /// came, when [`FEWEST_PER_CALL`] is sent at most.
    most_per_call: std::sync::atomic::AtomicU32,
    waiting: std::sync::Mutex<Vec<IdWaiter>>,
    wake: tokio::sync::Notify,
    in_flight: std::sync::atomic::AtomicUsize,
    started: std::sync::atomic::AtomicBool,
    closed: std::sync::atomic::AtomicBool,
}

#[derive(Debug)]
struct IdWaiter {
    deadline: Instant,
    reply: tokio::sync::oneshot::Sender<Result<u64, ClientError>>,
}

/// Ids one call is handed under any valid layout: 2 a tick (one sequence bit) over the clock's
/// tick and one borrowed (ticks are at most a second, borrowing reaches a second ahead). A batch
/// sent before the layout is known is no larger, so that no caller of one id is refused as if it
/// had asked for too many.
const FEWEST_PER_CALL: u32 = 4;

impl IdQueue {
    /// The most callers one `NextIds` may carry now.
    fn most_per_call(&self) -> usize {
        match self.most_per_call.load(std::sync::atomic::Ordering::Relaxed) {
            0 => FEWEST_PER_CALL as usize,
            n => n as usize,
        }
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, Vec<IdWaiter>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One id for a caller, sent with the other callers waiting now.
    pub(crate) async fn next_id(
        self: &std::sync::Arc<Self>,
        client: &Client,
        limits: (usize, usize, usize),
    ) -> Result<u64, ClientError> {
        use std::sync::atomic::Ordering;
        let (capacity, busy, _) = limits;
        if !self.started.swap(true, Ordering::AcqRel) {
            tokio::spawn(drain_ids(client.clone(), self.clone(), limits));
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        {
            let mut waiting = self.waiting();
            if waiting.len() >= capacity {
                return Err(ClientError::failed(FailureKind::Unavailable, "coalescer queue is full"));
            }
            waiting.push(IdWaiter {
                deadline: Instant::now() + client.config().deadline,
                reply: tx,
            });
            let n = waiting.len();
            if n == 1 || n == busy {
                self.wake.notify_one();
            }
        }
        rx.await.unwrap_or_else(|_| {
            Err(ClientError::failed(
                FailureKind::Unavailable,
                "the id batch ended without an answer",
            ))
        })
    }

    /// Ends the drain task.
    pub(crate) fn close(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::Release);
        self.wake.notify_one();
    }
}

/// Takes waiting id callers off the queue in batches until the queue is closed.
async fn drain_ids(client: Client, q: std::sync::Arc<IdQueue>, (_, busy, max_in_flight): (usize, usize, usize)) {
    use std::sync::atomic::Ordering;
    loop {
        if q.closed.load(Ordering::Acquire) {
            return;
        }
        let max = q.most_per_call();
        let batch = {
            let mut waiting = q.waiting();
            let running = q.in_flight.load(Ordering::Acquire);
            let ready =
                !waiting.is_empty() && (running == 0 || (running < max_in_flight && waiting.len() >= busy.min(max)));
            ready.then(|| {
                let take = waiting.len().min(max);
                let rest = waiting.split_off(take);
                std::mem::replace(&mut *waiting, rest)
            })
        };
        let Some(batch) = batch else {
            q.wake.notified().await;
            continue;
        };
        q.in_flight.fetch_add(1, Ordering::AcqRel);
        let (client, q) = (client.clone(), q.clone());
        tokio::spawn(async move {
            serve_ids(&client, &q, batch).await;
            q.in_flight.fetch_sub(1, Ordering::AcqRel);
            q.wake.notify_one();
        });
    }
}

/// One `NextIds` for a batch of callers; each gets its own id, in the order they joined.
async fn serve_ids(client: &Client, q: &IdQueue, batch: Vec<IdWaiter>) {
    let now = Instant::now();
    let (live, expired): (Vec<IdWaiter>, Vec<IdWaiter>) = batch.into_iter().partition(|w| w.deadline > now);
    for w in expired {
        let _ = w.reply.send(Err(ClientError::failed(
            FailureKind::Unavailable,
            "deadline passed while queued; not sent",
        )));
    }
    if live.is_empty() {
        return;
    }
    match client.next_ids(live.len() as u32).await {
        Ok(got) => {
            let most = got.layout.most_ids_per_call();
            q.most_per_call.store(most, std::sync::atomic::Ordering::Relaxed);
            for (w, id) in live.into_iter().zip(got.ids) {
                let _ = w.reply.send(Ok(id));
            }
        }
        Err(e) => {
            for w in live {
                let _ = w.reply.send(Err(e.clone()));
            }
        }
    }
}
