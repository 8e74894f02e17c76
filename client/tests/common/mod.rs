//! In-process fake AllocService servers on 127.0.0.1:0 for the client's black-box tests.
//!
//! A fake serves the uids its own route table assigns to its address (a per-uid counter from 1),
//! answers NOT_OWNER (with its table when the caller's is older) for the rest, and can be told to
//! answer NOT_READY a number of times, to never answer, to refuse every call with INVALID_ARGUMENT
//! (or as overloaded a number of times, or as a used-up section), or
//! to delay every reply. It counts RPCs and records the uids of every batch it receives. A
//! counter key is served as the uid at its position (`seqsvr_proto::keys::position`).

#![allow(dead_code)]

pub mod store;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use seqsvr_proto::pb::alloc_service_server::{AllocService, AllocServiceServer};
use seqsvr_proto::{Routes, Uid, pb};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

/// A route table of `section_size` 100 and `uid_limit` 1,000 (10 sections) from `(begin, end, addr)`.
pub fn table(version: u64, entries: &[(u64, u64, &str)]) -> pb::RouteTable {
    pb::RouteTable {
        set_id: 0,
        version,
        section_size: 100,
        uid_limit: 1_000,
        entries: entries
            .iter()
            .enumerate()
            .map(|(i, &(begin, end, addr))| pb::RouteEntry {
                set_id: 0,
                section_begin: begin,
                section_end: end,
                node_id: i as u64 + 1,
                incarnation: i as u64 + 11,
                addr: addr.into(),
            })
            .collect(),
    }
}

/// What a fake does and saw.
#[derive(Default)]
pub struct FakeState {
    pub addr: String,
    routes: Mutex<Option<pb::RouteTable>>,
    seqs: Mutex<HashMap<u64, u64>>,
    /// Every RPC received, of any kind.
    pub rpcs: AtomicU64,
    pub fetch_rpcs: AtomicU64,
    pub get_rpcs: AtomicU64,
    pub batch_rpcs: AtomicU64,
    /// CounterNext and CounterBatch calls received.
    pub counter_rpcs: AtomicU64,
    /// The uids of every batch RPC, in arrival order.
    pub batches: Mutex<Vec<Vec<u64>>>,
    /// BatchGet calls received, and the uids and keys of each, in arrival order.
    pub batch_get_rpcs: AtomicU64,
    pub reads: Mutex<Vec<(Vec<u64>, Vec<String>)>>,
    /// The last value of each named counter (0 if absent): this fake reads counters, never
    /// takes from them.
    pub key_values: Mutex<HashMap<String, u64>>,
    /// Answer NOT_READY this many more times (per uid asked).
    pub not_ready_left: AtomicU64,
    /// Never answer.
    pub hang: AtomicBool,
    /// Refuse every call with INVALID_ARGUMENT.
    pub invalid: AtomicBool,
    /// Refuse this many more calls as overloaded (RESOURCE_EXHAUSTED, retry later).
    pub overloaded_left: AtomicU64,
    /// Refuse every call as a used-up section (RESOURCE_EXHAUSTED, permanent).
    pub exhausted: AtomicBool,
    /// Delay every reply by this many milliseconds, after its numbers were handed out.
    pub delay_ms: AtomicU64,
    /// The cluster map, handed to callers whose `seqsvr-map-version` header is older.
    pub map: Mutex<Option<pb::ClusterMap>>,
    /// How many replies carried the map.
    pub maps_sent: AtomicU64,
    /// NextIds calls received, and the ids each asked for.
    pub id_rpcs: AtomicU64,
    pub id_counts: Mutex<Vec<u32>>,
    /// The next time-ordered id this fake hands out (consecutive, from 1).
    pub next_id: AtomicU64,
    /// The id layout NextIds replies name (Twitter's when unset); a count above what one call can
    /// be handed under it is refused as INVALID_ARGUMENT, as the AllocSvr does.
    pub id_layout: Mutex<Option<seqsvr_proto::id_layout::IdLayout>>,
}

/// A running fake server; stopped when dropped.
pub struct FakeAlloc {
    pub addr: String,
    pub state: Arc<FakeState>,
    task: JoinHandle<()>,
    /// Accepted connections.
    pub accepted: Arc<AtomicU64>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for FakeAlloc {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeAlloc {
    /// Starts a fake with no route table (it answers NOT_OWNER to everything until one is set).
    pub async fn start() -> Self {
        Self::start_on("127.0.0.1:0").await
    }

    /// [`FakeAlloc::start`] on `addr` (a stopped fake's address, say).
    pub async fn start_on(addr: &str) -> Self {
        let listener = TcpListener::bind(addr).await.expect("bind loopback");
        let addr = listener.local_addr().unwrap().to_string();
        let state = Arc::new(FakeState {
            addr: addr.clone(),
            ..FakeState::default()
        });
        let svc = AllocServiceServer::new(Svc(state.clone()));
        let accepted = Arc::new(AtomicU64::new(0));
        let counted = accepted.clone();
        let incoming = tokio_stream::StreamExt::map(TcpListenerStream::new(listener), move |conn| {
            counted.fetch_add(1, Ordering::SeqCst);
            conn
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await
                .expect("fake server");
        });
        Self {
            addr,
            state,
            task,
            accepted,
            stop: Some(stop),
        }
    }

    /// Stops the way a server shutting down does: GOAWAY on every connection, calls in flight
    /// finished, the port closed.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }

    pub fn set_routes(&self, table: pb::RouteTable) {
        *self.state.routes.lock().unwrap() = Some(table);
    }

    pub fn rpcs(&self) -> u64 {
        self.state.rpcs.load(Ordering::SeqCst)
    }

    pub fn data_rpcs(&self) -> u64 {
        self.state.fetch_rpcs.load(Ordering::SeqCst) + self.state.batch_rpcs.load(Ordering::SeqCst)
    }

    pub fn batches(&self) -> Vec<Vec<u64>> {
        self.state.batches.lock().unwrap().clone()
    }

    /// The uids and keys of every BatchGet received.
    pub fn reads(&self) -> Vec<(Vec<u64>, Vec<String>)> {
        self.state.reads.lock().unwrap().clone()
    }

    /// Sets the last value of the named counter `key`.
    pub fn set_key(&self, key: &str, value: u64) {
        self.state.key_values.lock().unwrap().insert(key.to_string(), value);
    }

    /// Sets the last seq handed out for `uid`, as if this fake had served it.
    pub fn set_seq(&self, uid: u64, seq: u64) {
        self.state.seqs.lock().unwrap().insert(uid, seq);
    }

    /// Last seq handed out for `uid` (0 if none).
    pub fn cur_seq(&self, uid: u64) -> u64 {
        self.state.seqs.lock().unwrap().get(&uid).copied().unwrap_or(0)
    }
}

/// The answer for one uid.
struct Decision {
    outcome: pb::Outcome,
    seq: u64,
    owner: Option<pb::Owner>,
}

impl FakeState {
    async fn gate(&self) -> Result<(), Status> {
        self.rpcs.fetch_add(1, Ordering::SeqCst);
        if self.hang.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        if self.invalid.load(Ordering::SeqCst) {
            return Err(Status::invalid_argument("fake refuses everything"));
        }
        if self.exhausted.load(Ordering::SeqCst) {
            return Err(seqsvr_proto::refusal::exhausted("fake section is used up"));
        }
        let overload = self
            .overloaded_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if overload.is_ok() {
            return Err(seqsvr_proto::refusal::overloaded("fake is overloaded"));
        }
        Ok(())
    }

    /// The server's map version and, for a caller whose header names an older one, the map.
    fn map_for(&self, metadata: &tonic::metadata::MetadataMap) -> (u64, Option<pb::ClusterMap>) {
        let map = self.map.lock().unwrap().clone();
        let version = map.as_ref().map_or(0, |m| m.version);
        match seqsvr_proto::map_header::read(metadata) {
            Some(v) if v < version => {
                self.maps_sent.fetch_add(1, Ordering::SeqCst);
                (version, map)
            }
            _ => (version, None),
        }
    }

    /// Holds a reply that was already decided (numbers consumed) for `delay_ms`.
    async fn slow_reply(&self) {
        let delay = self.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
    }

    /// The table to embed for a caller at `version`, and the server's version.
    fn routes_for(&self, version: u64) -> (u64, Option<pb::RouteTable>) {
        let routes = self.routes.lock().unwrap();
        match routes.as_ref() {
            Some(t) => (t.version, (version < t.version).then(|| t.clone())),
            None => (0, None),
        }
    }

    /// [`Self::decide`] of a key's next value, placed as the server places it: at its position
    /// under the fake's own table (NOT_OWNER without one).
    fn decide_key(&self, key: &[u8]) -> Result<Decision, Status> {
        let key = seqsvr_proto::keys::check_key(key).map_err(|e| Status::invalid_argument(e.to_string()))?;
        let limit = self.routes.lock().unwrap().as_ref().map(|t| t.uid_limit);
        match limit {
            Some(limit) => self.decide(seqsvr_proto::keys::position(key, limit).0, true),
            None => Ok(Decision {
                outcome: pb::Outcome::NotOwner,
                seq: 0,
                owner: None,
            }),
        }
    }

    fn decide(&self, uid: u64, consume: bool) -> Result<Decision, Status> {
        let table = self.routes.lock().unwrap().clone();
        let Some(table) = table else {
            return Ok(Decision {
                outcome: pb::Outcome::NotOwner,
                seq: 0,
                owner: None,
            });
        };
        if uid >= table.uid_limit {
            return Err(Status::invalid_argument(format!(
                "uid {uid} outside [0, {})",
                table.uid_limit
            )));
        }
        let set_id = table.set_id;
        let routes = Routes::new(table).expect("test tables are valid");
        let target = routes.lookup(Uid(uid)).unwrap();
        if target.addr != self.addr {
            return Ok(Decision {
                outcome: pb::Outcome::NotOwner,
                seq: 0,
                owner: None,
            });
        }
        let ready = self
            .not_ready_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_err();
        if !ready {
            return Ok(Decision {
                outcome: pb::Outcome::NotReady,
                seq: 0,
                owner: None,
            });
        }
        let mut seqs = self.seqs.lock().unwrap();
        let cur = seqs.entry(uid).or_insert(0);
        if consume {
            *cur += 1;
        }
        Ok(Decision {
            outcome: pb::Outcome::Ok,
            seq: *cur,
            owner: Some(pb::Owner {
                section: target.section.0,
                node_id: target.node_id.0,
                incarnation: target.incarnation.0,
                epoch: 1,
                set_id,
            }),
        })
    }
}

struct Svc(Arc<FakeState>);

#[tonic::async_trait]
impl AllocService for Svc {
    async fn fetch_next_seq(
        &self,
        req: Request<pb::FetchNextSeqRequest>,
    ) -> Result<Response<pb::FetchNextSeqReply>, Status> {
        let s = &self.0;
        s.fetch_rpcs.fetch_add(1, Ordering::SeqCst);
        s.gate().await?;
        let (map_version, map) = s.map_for(req.metadata());
        let req = req.into_inner();
        let d = s.decide(req.uid, true)?;
        s.slow_reply().await;
        let (route_version, routes) = s.routes_for(req.route_version);
        Ok(Response::new(pb::FetchNextSeqReply {
            outcome: d.outcome as i32,
            seq: d.seq,
            route_version,
            routes,
            owner: d.owner,
            map_version,
            map,
        }))
    }

    /// Blocks are the real AllocSvr's to test (sim/e2e); this fake's callers never ask for one.
    async fn reserve(&self, _req: Request<pb::ReserveRequest>) -> Result<Response<pb::ReserveReply>, Status> {
        Err(Status::unimplemented("the fake AllocSvr serves no blocks"))
    }

    /// A key is served as the uid at its position (the fake keeps no names): enough to test how
    /// the client routes keys and checks the answers. Reserve and Get of a key are the real
    /// AllocSvr's to test (sim/e2e).
    async fn counter_next(&self, req: Request<pb::CounterRequest>) -> Result<Response<pb::CounterReply>, Status> {
        let s = &self.0;
        s.counter_rpcs.fetch_add(1, Ordering::SeqCst);
        s.gate().await?;
        let (map_version, map) = s.map_for(req.metadata());
        let req = req.into_inner();
        let d = s.decide_key(&req.key)?;
        let (route_version, routes) = s.routes_for(req.route_version);
        Ok(Response::new(pb::CounterReply {
            outcome: d.outcome as i32,
            value: d.seq,
            route_version,
            routes,
            owner: d.owner,
            map_version,
            map,
        }))
    }

    async fn counter_reserve(&self, _req: Request<pb::CounterRequest>) -> Result<Response<pb::CounterReply>, Status> {
        Err(Status::unimplemented("the fake AllocSvr serves no counters"))
    }

    async fn counter_get(&self, _req: Request<pb::CounterRequest>) -> Result<Response<pb::CounterReply>, Status> {
        Err(Status::unimplemented("the fake AllocSvr serves no counters"))
    }

    /// As `counter_next`, for each key.
    async fn counter_batch(
        &self,
        req: Request<pb::CounterBatchRequest>,
    ) -> Result<Response<pb::CounterBatchReply>, Status> {
        let s = &self.0;
        s.counter_rpcs.fetch_add(1, Ordering::SeqCst);
        s.gate().await?;
        let (map_version, map) = s.map_for(req.metadata());
        let req = req.into_inner();
        let mut reply = pb::CounterBatchReply::default();
        for key in &req.keys {
            let d = s.decide_key(key)?;
            reply.outcomes.push(d.outcome as i32);
            reply.values.push(d.seq);
            if let Some(o) = d.owner
                && !reply.owners.iter().any(|x| x.section == o.section)
            {
                reply.owners.push(o);
            }
        }
        let (route_version, routes) = s.routes_for(req.route_version);
        reply.route_version = route_version;
        reply.routes = routes;
        reply.map_version = map_version;
        reply.map = map;
        Ok(Response::new(reply))
    }

    async fn get_cur_seq(&self, req: Request<pb::GetCurSeqRequest>) -> Result<Response<pb::GetCurSeqReply>, Status> {
        let s = &self.0;
        s.get_rpcs.fetch_add(1, Ordering::SeqCst);
        s.gate().await?;
        let (map_version, map) = s.map_for(req.metadata());
        let req = req.into_inner();
        let d = s.decide(req.uid, false)?;
        let (route_version, routes) = s.routes_for(req.route_version);
        Ok(Response::new(pb::GetCurSeqReply {
            outcome: d.outcome as i32,
            cur_seq: d.seq,
            route_version,
            routes,
            owner: d.owner,
            map_version,
            map,
        }))
    }

    /// Consecutive ids from a counter, after the configured delay: enough to see callers share calls.
    async fn next_ids(&self, req: Request<pb::NextIdsRequest>) -> Result<Response<pb::NextIdsReply>, Status> {
        let s = &self.0;
        s.id_rpcs.fetch_add(1, Ordering::SeqCst);
        s.gate().await?;
        let count = req.into_inner().count;
        s.id_counts.lock().unwrap().push(count);
        let layout = s
            .id_layout
            .lock()
            .unwrap()
            .unwrap_or(seqsvr_proto::id_layout::IdLayout::twitter(0));
        if count > layout.most_ids_per_call() {
            return Err(Status::invalid_argument(format!(
                "count must be at most {}",
                layout.most_ids_per_call()
            )));
        }
        let first = s.next_id.fetch_add(u64::from(count), Ordering::SeqCst) + 1;
        s.slow_reply().await;
        Ok(Response::new(pb::NextIdsReply {
            runs: vec![pb::IdRun { first, count }],
            layout: Some(layout.to_pb()),
            set_id: 0,
            slot_epoch: 1,
        }))
    }

    /// Reads uids as GetCurSeq does, and keys at their position under the table's uid limit
    /// (their values set with `set_key`).
    async fn batch_get(&self, req: Request<pb::BatchGetRequest>) -> Result<Response<pb::BatchGetReply>, Status> {
        let s = &self.0;
        s.batch_get_rpcs.fetch_add(1, Ordering::SeqCst);
        s.gate().await?;
        let (map_version, map) = s.map_for(req.metadata());
        let req = req.into_inner();
        let n = req.uids.len() + req.keys.len();
        if n == 0 || n > 1_000 {
            return Err(Status::invalid_argument(format!("{n} items in a batch")));
        }
        let keys: Vec<String> = req
            .keys
            .iter()
            .map(|k| String::from_utf8(k.clone()).map_err(|_| Status::invalid_argument("a key is not UTF-8")))
            .collect::<Result<_, _>>()?;
        s.reads.lock().unwrap().push((req.uids.clone(), keys.clone()));
        let limit = s.routes.lock().unwrap().as_ref().map_or(1, |t| t.uid_limit);
        let mut reply = pb::BatchGetReply::default();
        let mut answer = |d: Decision, value: u64| {
            reply.outcomes.push(d.outcome as i32);
            reply.values.push(if d.outcome == pb::Outcome::Ok { value } else { 0 });
            if let Some(o) = d.owner
                && !reply.owners.iter().any(|x| x.section == o.section)
            {
                reply.owners.push(o);
            }
        };
        for &uid in &req.uids {
            let d = s.decide(uid, false)?;
            let seq = d.seq;
            answer(d, seq);
        }
        for key in &keys {
            let d = s.decide(seqsvr_proto::keys::position(key, limit).0, false)?;
            let value = s.key_values.lock().unwrap().get(key).copied().unwrap_or(0);
            answer(d, value);
        }
        let (route_version, routes) = s.routes_for(req.route_version);
        reply.route_version = route_version;
        reply.routes = routes;
        reply.map_version = map_version;
        reply.map = map;
        Ok(Response::new(reply))
    }

    async fn batch_fetch_next_seq(
        &self,
        req: Request<pb::BatchFetchNextSeqRequest>,
    ) -> Result<Response<pb::BatchFetchNextSeqReply>, Status> {
        let s = &self.0;
        s.batch_rpcs.fetch_add(1, Ordering::SeqCst);
        s.gate().await?;
        let (map_version, map) = s.map_for(req.metadata());
        let req = req.into_inner();
        if req.uids.is_empty() || req.uids.len() > 1_000 {
            return Err(Status::invalid_argument(format!("{} uids in a batch", req.uids.len())));
        }
        s.batches.lock().unwrap().push(req.uids.clone());
        let mut reply = pb::BatchFetchNextSeqReply::default();
        for &uid in &req.uids {
            let d = s.decide(uid, true)?;
            reply.outcomes.push(d.outcome as i32);
            reply.seqs.push(d.seq);
            if let Some(o) = d.owner
                && !reply.owners.iter().any(|x| x.section == o.section)
            {
                reply.owners.push(o);
            }
        }
        s.slow_reply().await;
        let (route_version, routes) = s.routes_for(req.route_version);
        reply.route_version = route_version;
        reply.routes = routes;
        reply.map_version = map_version;
        reply.map = map;
        Ok(Response::new(reply))
    }
}

/// An address on which nothing listens (bound, then closed).
pub async fn dead_addr() -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    l.local_addr().unwrap().to_string()
}
