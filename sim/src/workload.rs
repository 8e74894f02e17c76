//! The seeded workload: concurrent clients of the real client library calling fetch, batch fetch
//! and get over hot uids (a few in every section, hit again and again, where ordering bugs show)
//! and cold uids (anywhere in the uid space), every call recorded in the history.
//!
//! A call's outcome comes straight from the client library: `Ok`, `ClientError::Failed` (certainly
//! not taken) or `ClientError::Unknown` (may have taken a number). A batch is recorded per outcome
//! group (`batch_fetch_each`), so the uids that were served keep their values.
//!
//! Deliberately left out: open-loop load. Each client waits for its call before the next, at a
//! bounded rate, so that the history stays a few hundred MB at most on a long run.

use crate::history::{Call, CallKind, HistoryWriter, Outcome, OwnerTag, Record};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use seqsvr_client::{Client, ClientError, Fetched, Owner};
use seqsvr_proto::Uid;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Shape of the workload.
#[derive(Clone, Debug)]
pub struct WorkloadParams {
    pub seed: u64,
    pub clients: u32,
    /// Calls per second per client (upper bound).
    pub rate_per_client: f64,
    pub section_size: u64,
    pub uid_limit: u64,
    /// Hot uids per section.
    pub hot_per_section: u64,
    /// Largest batch.
    pub max_batch: usize,
    /// Largest block (`Reserve`); 0: no blocks, and the calls drawn are those of before blocks.
    pub max_block: u32,
    /// Named counters asked for ([`crate::keys`]); 0: none, and the calls drawn are those of
    /// before keys.
    pub keys: u32,
}

/// Counters for the progress line.
#[derive(Default, Debug)]
pub struct Counters {
    pub calls: AtomicU64,
    pub failed: AtomicU64,
    pub unknown: AtomicU64,
}

/// The hot uids: `hot_per_section` seeded offsets in every section.
pub fn hot_uids(p: &WorkloadParams) -> Vec<u64> {
    let mut rng = StdRng::seed_from_u64(p.seed ^ 0x5eed_0000_0000_0001);
    let sections = p.uid_limit.div_ceil(p.section_size);
    let mut out = Vec::new();
    for s in 0..sections {
        let first = s * p.section_size;
        let size = p.section_size.min(p.uid_limit - first);
        for _ in 0..p.hot_per_section {
            out.push(first + rng.random_range(0..size));
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

fn owner_tag(o: &Owner) -> OwnerTag {
    OwnerTag {
        section: o.section.0,
        node_id: o.node_id.0,
        incarnation: o.incarnation.0,
        epoch: o.epoch.0,
        set_id: o.set_id,
    }
}

fn error_outcome(e: &ClientError) -> Outcome {
    if e.is_unknown() {
        Outcome::Unknown
    } else {
        Outcome::Failed
    }
}

/// One result per subject of a batch call: its value and owner, or its error.
pub(crate) type BatchResults = Vec<Result<(u64, Option<Owner>), ClientError>>;

/// Records calls and keeps the set of touched uids (for the final liveness check).
pub struct Recorder {
    pub history: Arc<HistoryWriter>,
    pub counters: Arc<Counters>,
    pub touched: Arc<Mutex<HashSet<u64>>>,
}

impl Recorder {
    /// A recorder writing to `history`, with fresh counters and no uid touched yet.
    pub fn new(history: Arc<HistoryWriter>) -> Self {
        Self {
            history,
            counters: Arc::default(),
            touched: Arc::default(),
        }
    }

    fn record(&self, call: Call) {
        self.counters.calls.fetch_add(1, Ordering::Relaxed);
        match call.outcome {
            Outcome::Ok => {}
            Outcome::Failed => {
                self.counters.failed.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Unknown => {
                self.counters.unknown.fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Err(e) = self.history.write(&Record::Call(call)) {
            tracing::error!(error = %e, "history write failed");
        }
    }

    fn touch(&self, uids: &[u64]) {
        let mut t = self.touched.lock().unwrap_or_else(|e| e.into_inner());
        t.extend(uids.iter().copied());
    }

    /// One `FetchNextSeq`, recorded.
    pub async fn fetch(&self, client: &Client, client_id: u32, uid: u64) {
        self.single(client_id, uid, CallKind::Fetch, client.fetch_next_seq(Uid(uid)), |f| {
            (f.seq, f.owner)
        })
        .await;
    }

    /// One `Reserve(uid, n)`, recorded as the uid n times with the block's values.
    pub async fn reserve(&self, client: &Client, client_id: u32, uid: u64, n: u32) {
        let call = client.reserve(Uid(uid), n);
        self.record_one(client_id, vec![uid; n as usize], CallKind::Reserve, call, |b| {
            (b.seqs().collect(), b.owner)
        })
        .await;
    }

    /// One `CounterNext` of key `i`, recorded under the key's subject.
    pub async fn counter_next(&self, client: &Client, client_id: u32, i: u64) {
        let key = crate::keys::name(i);
        self.single(
            client_id,
            crate::keys::subject(i),
            CallKind::Fetch,
            client.counter_next(&key),
            |c| (c.value, c.owner),
        )
        .await;
    }

    /// One `CounterReserve(key i, n)`, recorded as the key's subject n times with the values.
    pub async fn counter_reserve(&self, client: &Client, client_id: u32, i: u64, n: u32) {
        let key = crate::keys::name(i);
        let call = client.counter_reserve(&key, n);
        let subject = crate::keys::subject(i);
        self.record_one(client_id, vec![subject; n as usize], CallKind::Reserve, call, |b| {
            (b.values().collect(), b.owner)
        })
        .await;
    }

    /// One `CounterGet` of key `i`, recorded.
    pub async fn counter_get(&self, client: &Client, client_id: u32, i: u64) {
        let key = crate::keys::name(i);
        self.single(
            client_id,
            crate::keys::subject(i),
            CallKind::Get,
            client.counter_get(&key),
            |c| (c.value, c.owner),
        )
        .await;
    }

    /// The next value of a uid or key subject (the verify phase's fetch).
    pub async fn fetch_subject(&self, client: &Client, client_id: u32, subject: u64) {
        if subject & crate::keys::KEY_SUBJECT != 0 {
            self.counter_next(client, client_id, subject & !crate::keys::KEY_SUBJECT)
                .await;
        } else {
            self.fetch(client, client_id, subject).await;
        }
    }

    /// One `GetCurSeq`, recorded.
    pub async fn get(&self, client: &Client, client_id: u32, uid: u64) {
        self.single(client_id, uid, CallKind::Get, client.get_cur_seq(Uid(uid)), |c| {
            (c.cur_seq, c.owner)
        })
        .await;
    }

    /// Runs one call that answers its values and, when it says, their owner (a front end's) and
    /// records it.
    pub async fn record_values(
        &self,
        client_id: u32,
        subjects: Vec<u64>,
        kind: CallKind,
        call: impl std::future::Future<Output = Result<(Vec<u64>, Option<Owner>), ClientError>>,
    ) {
        self.record_one(client_id, subjects, kind, call, |v| v).await;
    }

    /// Runs one single-uid call and records it with its value and owner (or its error).
    async fn single<T>(
        &self,
        client_id: u32,
        uid: u64,
        kind: CallKind,
        call: impl std::future::Future<Output = Result<T, ClientError>>,
        value_and_owner: impl FnOnce(T) -> (u64, Option<Owner>),
    ) {
        self.record_one(client_id, vec![uid], kind, call, |v| {
            let (value, owner) = value_and_owner(v);
            (vec![value], owner)
        })
        .await;
    }

    /// Runs one call and records it with its values (one per entry of `uids`) and owner, or its
    /// error.
    async fn record_one<T>(
        &self,
        client_id: u32,
        uids: Vec<u64>,
        kind: CallKind,
        call: impl std::future::Future<Output = Result<T, ClientError>>,
        values_and_owner: impl FnOnce(T) -> (Vec<u64>, Option<Owner>),
    ) {
        self.touch(&uids);
        let (id, invoke_ns) = self.history.begin();
        let r = call.await;
        let complete_ns = self.history.clock().now_ns();
        let base = Call {
            id,
            client: client_id,
            kind,
            uids,
            invoke_ns,
            complete_ns,
            outcome: Outcome::Ok,
            values: vec![],
            owners: vec![],
            error: None,
        };
        self.record(match r {
            Ok(v) => {
                let (values, owner) = values_and_owner(v);
                Call {
                    values,
                    owners: owner.iter().map(owner_tag).collect(),
                    ..base
                }
            }
            Err(e) => Call {
                outcome: error_outcome(&e),
                error: Some(e.to_string()),
                ..base
            },
        });
    }

    /// One batch fetch, recorded as up to three calls (ok / failed / unknown uids) sharing the
    /// same times. Returns the uids that were served.
    pub async fn batch(&self, client: &Client, client_id: u32, uids: &[u64]) -> Vec<u64> {
        let wanted: Vec<Uid> = uids.iter().map(|&u| Uid(u)).collect();
        let call = async {
            let each = client.batch_fetch_each(&wanted).await?;
            Ok(each
                .into_iter()
                .map(|r| r.map(|Fetched { seq, owner, .. }| (seq, owner)))
                .collect())
        };
        self.record_batch(client_id, uids, call).await
    }

    /// One `CounterBatch` of keys `indices`, recorded under the keys' subjects as [`Self::batch`]
    /// records uids.
    pub async fn counter_batch(&self, client: &Client, client_id: u32, indices: &[u64]) -> Vec<u64> {
        let names: Vec<String> = indices.iter().map(|&i| crate::keys::name(i)).collect();
        let keys: Vec<&str> = names.iter().map(String::as_str).collect();
        let subjects: Vec<u64> = indices.iter().map(|&i| crate::keys::subject(i)).collect();
        let call = async {
            let each = client.counter_batch(&keys).await?;
            Ok(each.into_iter().map(|r| r.map(|c| (c.value, c.owner))).collect())
        };
        self.record_batch(client_id, &subjects, call).await
    }

    /// Runs one batch call (one result per subject) and records it as up to three calls (ok /
    /// failed / unknown subjects) sharing the same times. Returns the subjects that were served.
    pub(crate) async fn record_batch(
        &self,
        client_id: u32,
        uids: &[u64],
        call: impl std::future::Future<Output = Result<BatchResults, ClientError>>,
    ) -> Vec<u64> {
        self.touch(uids);
        let (id, invoke_ns) = self.history.begin();
        let r = call.await;
        let complete_ns = self.history.clock().now_ns();
        let base = Call {
            id,
            client: client_id,
            kind: CallKind::BatchFetch,
            uids: vec![],
            invoke_ns,
            complete_ns,
            outcome: Outcome::Ok,
            values: vec![],
            owners: vec![],
            error: None,
        };
        let each = match r {
            Ok(each) => each,
            Err(e) => {
                self.record(Call {
                    uids: uids.to_vec(),
                    outcome: error_outcome(&e),
                    error: Some(e.to_string()),
                    ..base
                });
                return vec![];
            }
        };
        let [ok, failed, unknown] = split_by_outcome(base, uids, each);
        let served = ok.uids.clone();
        for (n, mut c) in [ok, failed, unknown]
            .into_iter()
            .filter(|c| !c.uids.is_empty())
            .enumerate()
        {
            if n > 0 {
                c.id = self.history.begin().0;
            }
            self.record(c);
        }
        served
    }
}

/// One batch's answers as three calls sharing `base`'s times: the subjects served (with their
/// values and owners), those that failed, and those whose outcome is unknown.
fn split_by_outcome(base: Call, uids: &[u64], each: BatchResults) -> [Call; 3] {
    let mut ok = base.clone();
    let mut failed = Call {
        outcome: Outcome::Failed,
        ..base.clone()
    };
    let mut unknown = Call {
        outcome: Outcome::Unknown,
        ..base
    };
    for (uid, r) in uids.iter().zip(each) {
        match r {
            Ok((seq, owner)) => {
                ok.uids.push(*uid);
                ok.values.push(seq);
                if let Some(o) = owner.as_ref().map(owner_tag)
                    && !ok.owners.contains(&o)
                {
                    ok.owners.push(o);
                }
            }
            Err(e) => {
                let target = if e.is_unknown() { &mut unknown } else { &mut failed };
                target.uids.push(*uid);
                target.error.get_or_insert_with(|| e.to_string());
            }
        }
    }
    [ok, failed, unknown]
}

/// A client's pace: at most `rate_per_client` calls a second, late ticks not caught up.
pub(crate) fn pacer(p: &WorkloadParams) -> tokio::time::Interval {
    let period = Duration::from_secs_f64(1.0 / p.rate_per_client.max(0.1));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick
}

/// A uid to call: a hot one 80 % of the time, else any below `uid_limit`.
pub(crate) fn pick_uid(rng: &mut StdRng, hot: &[u64], uid_limit: u64) -> u64 {
    if rng.random_bool(0.8) && !hot.is_empty() {
        hot[rng.random_range(0..hot.len())]
    } else {
        rng.random_range(0..uid_limit)
    }
}

/// Runs one client until `stop` is set.
pub async fn run_client(
    client: Client,
    client_id: u32,
    p: WorkloadParams,
    hot: Arc<Vec<u64>>,
    rec: Arc<Recorder>,
    stop: Arc<AtomicBool>,
) {
    let mut rng = StdRng::seed_from_u64(
        p.seed
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .wrapping_add(client_id as u64),
    );
    let mut tick = pacer(&p);
    let pick_uid = |rng: &mut StdRng| pick_uid(rng, &hot, p.uid_limit);
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let roll = rng.random_range(0..100);
        // Drawn only with keys on, so that runs without them keep their schedules.
        let key = (p.keys > 0 && rng.random_bool(0.4)).then(|| rng.random_range(0..u64::from(p.keys)));
        if let Some(i) = key
            && roll < 60
        {
            if p.max_block > 0 && rng.random_bool(0.3) {
                let n = rng.random_range(1..=p.max_block);
                rec.counter_reserve(&client, client_id, i, n).await;
            } else {
                rec.counter_next(&client, client_id, i).await;
            }
        } else if let Some(i) = key
            && roll >= 80
        {
            rec.counter_get(&client, client_id, i).await;
        } else if key.is_some() {
            // A batch of keys (a key may repeat: it then gets increasing values).
            let n = rng.random_range(2..=p.max_batch.max(2));
            let keys: Vec<u64> = (0..n).map(|_| rng.random_range(0..u64::from(p.keys))).collect();
            rec.counter_batch(&client, client_id, &keys).await;
        } else if roll < 60 {
            let uid = pick_uid(&mut rng);
            // Drawn only with blocks on, so that runs without them keep their schedules.
            if p.max_block > 0 && rng.random_bool(0.3) {
                let n = rng.random_range(1..=p.max_block);
                rec.reserve(&client, client_id, uid, n).await;
            } else {
                rec.fetch(&client, client_id, uid).await;
            }
        } else if roll < 80 {
            let n = rng.random_range(2..=p.max_batch.max(2));
            let uids: Vec<u64> = (0..n).map(|_| pick_uid(&mut rng)).collect();
            rec.batch(&client, client_id, &uids).await;
        } else {
            let uid = hot[rng.random_range(0..hot.len().max(1))];
            rec.get(&client, client_id, uid).await;
        }
    }
}

/// Client ids of pinned clients start here (their NOT_OWNER answers are expected, so the
/// unavailability statistics leave them out).
pub const PINNED_CLIENT_BASE: u32 = 1000;
/// Client ids of one-call stale callers that a fault starts (one id per call) start here.
pub const STALE_CLIENT_BASE: u32 = 2000;

/// A client pinned to one AllocSvr that ignores routing: it keeps asking that node for hot uids of
/// every section, as a client with a stale route cache (or a request stuck in the network) would.
/// This is what lets a stale owner show itself: the routing client library learns new routes
/// within a reply or two and stops asking the old owner, so without a pinned client a broken
/// lease (negative control `--unsafe-skip-lease-wait`) would rarely be exercised.
pub async fn run_pinned(
    mut alloc: seqsvr_proto::pb::alloc_service_client::AllocServiceClient<seqsvr_client::Conn>,
    client_id: u32,
    p: WorkloadParams,
    hot: Arc<Vec<u64>>,
    rec: Arc<Recorder>,
    stop: Arc<AtomicBool>,
) {
    let mut rng = StdRng::seed_from_u64(p.seed.wrapping_add(0xa110c).wrapping_add(client_id as u64));
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / p.rate_per_client.max(0.1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !stop.load(Ordering::Relaxed) && !hot.is_empty() {
        tick.tick().await;
        let uid = hot[rng.random_range(0..hot.len())];
        pinned_call(&mut alloc, client_id, uid, Duration::from_secs(1), &rec).await;
    }
}

/// One call of a pinned client: `FetchNextSeq(uid)` straight to the node behind `alloc`, given up
/// after `wait`, recorded in the history.
pub async fn pinned_call(
    alloc: &mut seqsvr_proto::pb::alloc_service_client::AllocServiceClient<seqsvr_client::Conn>,
    client_id: u32,
    uid: u64,
    wait: Duration,
    rec: &Recorder,
) {
    use seqsvr_proto::pb;
    rec.touch(&[uid]);
    let (id, invoke_ns) = rec.history.begin();
    let r = tokio::time::timeout(
        wait,
        alloc.fetch_next_seq(pb::FetchNextSeqRequest { uid, route_version: 0 }),
    )
    .await;
    let complete_ns = rec.history.clock().now_ns();
    let mut call = Call {
        id,
        client: client_id,
        kind: CallKind::Fetch,
        uids: vec![uid],
        invoke_ns,
        complete_ns,
        outcome: Outcome::Unknown,
        values: vec![],
        owners: vec![],
        error: None,
    };
    settle_pinned(&mut call, r);
    rec.record(call);
}

/// The connection of a pinned client to `addr` over TCP (`None` for an address that is not
/// `host:port`); a call is given up after `timeout`.
pub fn pinned_conn(
    addr: &str,
    timeout: Duration,
) -> Option<seqsvr_proto::pb::alloc_service_client::AllocServiceClient<seqsvr_client::Conn>> {
    let ep = seqsvr_auth::endpoint(addr, crate::tls::client().as_deref()).ok()?;
    let channel = ep
        .connect_timeout(Duration::from_millis(300))
        .timeout(timeout)
        .connect_lazy();
    Some(
        seqsvr_proto::pb::alloc_service_client::AllocServiceClient::new(seqsvr_client::Conn::Tonic(channel))
            .max_decoding_message_size(seqsvr_proto::limits::DATA_PLANE_MESSAGE_BYTES)
            .max_encoding_message_size(seqsvr_proto::limits::DATA_PLANE_MESSAGE_BYTES),
    )
}

/// Fills a pinned client's call from the outcome of its one attempt.
fn settle_pinned(
    call: &mut Call,
    r: Result<Result<tonic::Response<seqsvr_proto::pb::FetchNextSeqReply>, tonic::Status>, tokio::time::error::Elapsed>,
) {
    use seqsvr_proto::pb;
    match r {
        Ok(Ok(reply)) => {
            let reply = reply.into_inner();
            if reply.outcome == pb::Outcome::Ok as i32 {
                call.outcome = Outcome::Ok;
                call.values = vec![reply.seq];
                call.owners = reply
                    .owner
                    .iter()
                    .map(|o| OwnerTag {
                        section: o.section,
                        node_id: o.node_id,
                        incarnation: o.incarnation,
                        epoch: o.epoch,
                        set_id: o.set_id,
                    })
                    .collect();
            } else {
                // NOT_OWNER / NOT_READY: an answer that says nothing was handed out.
                call.outcome = Outcome::Failed;
                call.error = Some(format!("outcome {}", reply.outcome));
            }
        }
        // A transport error or a timeout may have reached the server: unknown, never "absent".
        Ok(Err(status)) => call.error = Some(status.to_string()),
        Err(_) => call.error = Some("timed out".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> WorkloadParams {
        WorkloadParams {
            seed: 9,
            clients: 2,
            rate_per_client: 10.0,
            section_size: 100,
            uid_limit: 1_050,
            hot_per_section: 3,
            max_batch: 8,
            max_block: 0,
            keys: 0,
        }
    }

    #[test]
    fn hot_uids_cover_every_section_and_depend_only_on_the_seed() {
        let p = params();
        let a = hot_uids(&p);
        assert_eq!(a, hot_uids(&p));
        let sections: HashSet<u64> = a.iter().map(|u| u / p.section_size).collect();
        assert_eq!(sections.len(), 11, "the short last section too");
        assert!(a.iter().all(|&u| u < p.uid_limit));
        assert_ne!(a, hot_uids(&WorkloadParams { seed: 10, ..p }));
    }
}
