//! The AllocSvr runtime: registration, lease renewal, gaining and letting go of sections, the
//! background bumper, the gRPC server and shutdown (DESIGN.md §4 rules 1–10).
//!
//! Tasks and what they own:
//! - the **renewal task** owns the [`Lease`]: every `renew_interval` it notes `t_send`, sends
//!   Renew, and on a confirming reply extends the lease from `t_send`, publishes it, and diffs
//!   the grants against the held sections: a section no longer granted (or granted under another
//!   epoch, or handed over) is dropped at once; a new one is inserted as not-ready and handed to a
//!   gain task. When the lease runs out everything is dropped; UNKNOWN_INCARNATION drops
//!   everything and registers again.
//! - a **gain task** loads the new sections linearizably, sets every uid's base to the loaded
//!   `max_seq` and queues all of them for ONE Bump (rule 5).
//! - the **bumper** drains the queue into Bump RPCs (≤ 65,536 items each, the store's limit), retries a lost bump
//!   with the same `new_max` until it is acknowledged, refused as stale, or the lease is lost
//!   (rule 6), and wakes the fetches waiting for it.
//!
//! Deliberately left out: the arbiter (on the StoreSvr leader) and any persistence: an AllocSvr
//! is stateless between restarts, a restart is a new incarnation.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use seqsvr_client::store::{StoreClient, StoreError, StoreTimeouts};
use seqsvr_proto::pb;
use seqsvr_proto::pb::alloc_service_server::AllocServiceServer;
use seqsvr_proto::{Epoch, Incarnation, SectionId, limits};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn};

use crate::config::{NodeConfig, Params};
use crate::error::Error;
use crate::lease::Lease;
use crate::metrics::Metrics;
use crate::owned::{Owned, Slot};
use crate::section::{Section, SectionSpec};
use crate::service::Service;

/// Most items in one Bump RPC: the store's own limit, from the shared table.
const MAX_BUMP_ITEMS: usize = limits::MAX_BUMP_ITEMS;
/// Most sections in one Load of newly gained sections; each reply stays under 3 MiB (see the table).
const LOAD_CHUNK_SECTIONS: u64 = limits::LOAD_CHUNK_SECTIONS;
/// Attempts of the Load of newly gained sections before giving them up until the next renewal.
const LOAD_ATTEMPTS: u32 = 5;
/// Longest wait between two attempts of a registration or a bump retry.
const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Deadline of the Release sent at shutdown.
const SHUTDOWN_RELEASE_DEADLINE: Duration = Duration::from_secs(2);

/// State shared by the service and the background tasks.
pub(crate) struct Inner {
    pub cfg: NodeConfig,
    pub params: Params,
    /// Address registered in the route table.
    pub advertise: String,
    pub store: StoreClient,
    pub owned: Owned,
    pub incarnation: AtomicU64,
    pub routes: RwLock<Option<Arc<pb::RouteTable>>>,
    pub route_version: AtomicU64,
    pub bump_tx: mpsc::UnboundedSender<Vec<Arc<Slot>>>,
    /// Memory of dropped sections, only under `--unsafe-keep-memory`.
    kept: Mutex<HashMap<SectionId, Vec<u64>>>,
    pub metrics: Metrics,
    stopping: AtomicBool,
}

/// A running AllocSvr.
pub struct Node {
    inner: Arc<Inner>,
    local_addr: SocketAddr,
    stop_tx: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    server: JoinHandle<()>,
}

impl Node {
    /// Binds the data-plane address, registers with the store (retrying until
    /// `cfg.start_timeout`), and starts serving. Sections are served once granted by renewals.
    pub async fn start(cfg: NodeConfig) -> Result<Node, Error> {
        let listener = tokio::net::TcpListener::bind(cfg.listen)
            .await
            .map_err(|e| Error::Startup(format!("cannot bind {}: {e}", cfg.listen)))?;
        let local_addr = listener
            .local_addr()
            .map_err(|e| Error::Startup(format!("no local address: {e}")))?;
        let advertise = cfg.advertise.clone().unwrap_or_else(|| local_addr.to_string());
        let store = StoreClient::new(cfg.store.clone(), StoreTimeouts::default()).map_err(Error::Startup)?;
        let switches = cfg.unsafe_switches;
        if switches.any() {
            warn!(
                ?switches,
                "!!! UNSAFE TEST SWITCHES ON: this AllocSvr deliberately breaks the ownership protocol !!!"
            );
        }

        let deadline = tokio::time::Instant::now() + cfg.start_timeout;
        let (incarnation, params) = register(&store, &cfg, &advertise, Some(deadline)).await?;
        info!(
            node_id = %cfg.node_id, %incarnation, set_id = params.set_id, sections = ?params.sections,
            %local_addr, %advertise, "registered"
        );
        let (bump_tx, bump_rx) = mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            owned: Owned::new(params.sections.start, params.section_count()),
            cfg,
            params,
            advertise,
            store,
            incarnation: AtomicU64::new(incarnation.0),
            routes: RwLock::new(None),
            route_version: AtomicU64::new(0),
            bump_tx,
            kept: Mutex::new(HashMap::new()),
            metrics: Metrics::new(),
            stopping: AtomicBool::new(false),
        });

        let (stop_tx, stop_rx) = watch::channel(false);
        let tasks = vec![
            tokio::spawn(renew_loop(inner.clone(), stop_rx.clone())),
            tokio::spawn(bumper(inner.clone(), bump_rx, stop_rx.clone())),
        ];
        let server = spawn_server(inner.clone(), listener, stop_rx).await;
        Ok(Node {
            inner,
            local_addr,
            stop_tx,
            tasks,
            server,
        })
    }

    /// The bound data-plane address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The current incarnation.
    pub fn incarnation(&self) -> Incarnation {
        Incarnation(self.inner.incarnation.load(Ordering::Acquire))
    }

    /// Number of sections currently held (any state).
    pub fn sections_held(&self) -> usize {
        self.inner.owned.held_count()
    }

    /// Stops serving every section at once, releases them (bounded deadline) and stops the server.
    pub async fn shutdown(self) {
        self.inner.stopping.store(true, Ordering::Release);
        let _ = self.stop_tx.send(true);
        // No renewal may re-grant or re-extend after this point: stop the tasks first.
        for t in self.tasks {
            t.abort();
            let _ = tokio::time::timeout(Duration::from_secs(1), t).await;
        }
        self.inner.owned.set_lease_until(None);
        let dropped = self.inner.owned.drop_all();
        wake(&dropped);
        info!(sections = dropped.len(), "shutting down: stopped serving every section");
        // Always tell the store we are leaving, even with nothing held: it then forgets this
        // incarnation and reassigns at once instead of waiting to detect our death.
        let store = self.inner.store.with_timeouts(StoreTimeouts {
            attempt: SHUTDOWN_RELEASE_DEADLINE,
            overall: SHUTDOWN_RELEASE_DEADLINE,
        });
        let incarnation = self.inner.incarnation.load(Ordering::Acquire);
        let ranges = released(dropped.iter().map(|s| (s.id.0, s.epoch.0)).collect());
        for req in release_requests(incarnation, ranges, true) {
            match store.release(req).await {
                Ok(r) => info!(released = r.released, "released sections"),
                Err(e) => warn!(error = %e, "release at shutdown failed; the sections wait out the lease"),
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), self.server).await;
    }
}

async fn spawn_server(
    inner: Arc<Inner>,
    listener: tokio::net::TcpListener,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<AllocServiceServer<Service>>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(seqsvr_proto::FILE_DESCRIPTOR_SET)
        .build_v1();
    let service = AllocServiceServer::new(Service::new(inner))
        .max_decoding_message_size(limits::DATA_PLANE_MESSAGE_BYTES)
        .max_encoding_message_size(limits::DATA_PLANE_MESSAGE_BYTES);
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    tokio::spawn(async move {
        let mut builder = tonic::transport::Server::builder();
        let router = builder.add_service(health_service).add_service(service);
        let router = match reflection {
            Ok(r) => router.add_service(r),
            Err(e) => {
                warn!(error = %e, "gRPC reflection unavailable");
                router
            }
        };
        let shutdown = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        if let Err(e) = router.serve_with_incoming_shutdown(incoming, shutdown).await {
            error!(error = %e, "gRPC server failed");
        }
    })
}

/// Registers until the store answers (or `deadline` passes): a new incarnation and the set's
/// validated parameters.
async fn register(
    store: &StoreClient,
    cfg: &NodeConfig,
    advertise: &str,
    deadline: Option<tokio::time::Instant>,
) -> Result<(Incarnation, Params), Error> {
    let mut backoff = Duration::from_millis(50);
    // One nonce for every attempt of this registration: an attempt that committed but whose
    // reply was lost, or that lands after a later one, yields the same incarnation.
    let nonce = rand::random_range(1..=u64::MAX);
    loop {
        let req = pb::RegisterRequest {
            node_id: cfg.node_id.0,
            addr: advertise.to_string(),
            nonce,
        };
        let last = match store.register(req).await {
            Ok(reply) => {
                let params = reply
                    .params
                    .as_ref()
                    .ok_or_else(|| Error::Startup("register reply without params".into()))
                    .and_then(|p| Params::from_proto(p).map_err(Error::Startup))?;
                if reply.incarnation == 0 {
                    return Err(Error::Startup("register reply with incarnation 0".into()));
                }
                return Ok((Incarnation(reply.incarnation), params));
            }
            Err(StoreError::Rejected(status)) => {
                return Err(Error::Startup(format!("store refused registration: {status}")));
            }
            Err(e @ StoreError::Unavailable { .. }) => e.to_string(),
        };
        if deadline.is_some_and(|d| tokio::time::Instant::now() + backoff >= d) {
            return Err(Error::Unavailable(format!(
                "no store accepted the registration: {last}"
            )));
        }
        warn!(%last, "registration failed, retrying");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(RETRY_BACKOFF_MAX);
    }
}

/// What a Release names: `(section, epoch)` pairs in runs of consecutive sections under the same
/// epoch (the store releases a section only while it is still granted under that epoch).
fn released(mut held: Vec<(u64, u64)>) -> Vec<pb::ReleasedRange> {
    held.sort_unstable();
    held.dedup();
    let mut out: Vec<pb::ReleasedRange> = Vec::new();
    for (id, epoch) in held {
        match out.last_mut() {
            Some(r) if r.end == id && r.epoch == epoch => r.end += 1,
            _ => out.push(pb::ReleasedRange {
                begin: id,
                end: id + 1,
                epoch,
            }),
        }
    }
    out
}

/// Most ranges in one Release: each encodes in at most 35 bytes, so a request stays near 2 MiB,
/// under both the store's message limit and the Raft entry byte cap (sections held under many
/// different epochs make many ranges).
const RELEASE_CHUNK_RANGES: usize = 65_536;

/// The Releases that give `ranges` up, in chunks; `leaving` is set on the last one only, so the
/// incarnation is forgotten after everything it names was released.
fn release_requests(incarnation: u64, ranges: Vec<pb::ReleasedRange>, leaving: bool) -> Vec<pb::ReleaseRequest> {
    let mut out: Vec<pb::ReleaseRequest> = ranges
        .chunks(RELEASE_CHUNK_RANGES)
        .map(|c| pb::ReleaseRequest {
            incarnation,
            sections: c.to_vec(),
            leaving: false,
        })
        .collect();
    if leaving {
        match out.last_mut() {
            Some(last) => last.leaving = true,
            None => out.push(pb::ReleaseRequest {
                incarnation,
                sections: vec![],
                leaving: true,
            }),
        }
    }
    out
}

/// Compresses section ids (any order) into sorted half-open ranges.
fn ranges(ids: impl Iterator<Item = SectionId>) -> Vec<pb::SectionRange> {
    let mut ids: Vec<u64> = ids.map(|s| s.0).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut out: Vec<pb::SectionRange> = Vec::new();
    for id in ids {
        match out.last_mut() {
            Some(r) if r.end == id => r.end += 1,
            _ => out.push(pb::SectionRange { begin: id, end: id + 1 }),
        }
    }
    out
}

/// Wakes every fetch waiting on a bump of these slots (they will find the slot gone).
fn wake(slots: &[Arc<Slot>]) {
    for s in slots {
        s.bumped.notify_waiters();
    }
}

impl Inner {
    fn incarnation(&self) -> Incarnation {
        Incarnation(self.incarnation.load(Ordering::Acquire))
    }

    /// Lets dropped slots go: under `--unsafe-keep-memory` their memory is kept for a regain.
    fn let_go(&self, dropped: &[Arc<Slot>]) {
        if self.cfg.unsafe_switches.keep_memory {
            let mut kept = self.kept.lock().unwrap();
            for slot in dropped {
                let memory = slot.section.lock().unwrap().take_memory();
                if !memory.is_empty() {
                    kept.insert(slot.id, memory);
                }
            }
        }
        wake(dropped);
        self.metrics.sections_held.set(self.owned.held_count() as f64);
    }

    fn drop_everything(&self, why: &str) {
        let dropped = self.owned.drop_all();
        if !dropped.is_empty() {
            warn!(sections = dropped.len(), why, "stopped serving every section");
        }
        self.let_go(&dropped);
    }

    fn store_routes(&self, version: u64, routes: Option<pb::RouteTable>) {
        if let Some(table) = routes {
            let old = self.route_version.load(Ordering::Acquire);
            if table.version >= old {
                if table.version != old {
                    info!(from = old, to = table.version, "route version changed");
                }
                *self.routes.write().unwrap() = Some(Arc::new(table));
                self.route_version.store(version.max(old), Ordering::Release);
            }
        }
    }

    /// Diffs a confirming renewal's grants against the held sections (rule 9), inserts newly
    /// gained ones as not-ready and returns them, with the `(section, epoch)` grants to release
    /// for a handover: every handed-over section still granted, under the granted epoch. Once
    /// this returns no slot of ours serves such a section under that epoch (a slot held under
    /// it was just dropped; none is ever created for it), so releasing it is safe even when it
    /// was granted and handed over before this node ever took it.
    fn apply_grants(&self, reply: &pb::RenewReply, t_obs: Instant) -> (Vec<Arc<Slot>>, Vec<(u64, u64)>) {
        let p = &self.params;
        let first = p.sections.start;
        let mut desired: Vec<Option<(Epoch, bool)>> = vec![None; p.section_count()];
        for g in &reply.grants {
            let (begin, end) = (g.section_begin.max(first), g.section_end.min(p.sections.end));
            if begin != g.section_begin || end != g.section_end {
                warn!(?g, set = ?p.sections, "grant outside the set's sections ignored in part");
            }
            for s in begin..end {
                desired[(s - first) as usize] = Some((Epoch(g.epoch), g.no_wait));
            }
        }
        // The epoch under which each section is to be handed over: only a section still granted
        // can be (the arbiter's handover list may be older than the grants).
        let mut handed_over: Vec<Option<Epoch>> = vec![None; p.section_count()];
        for h in &reply.handover {
            for s in h.begin.max(first)..h.end.min(p.sections.end) {
                let i = (s - first) as usize;
                if let Some((epoch, _)) = desired[i].take() {
                    handed_over[i] = Some(epoch);
                }
            }
        }

        let held = self.owned.snapshot();
        let incarnation = self.incarnation();
        let to_release: Vec<(u64, u64)> = handed_over
            .iter()
            .enumerate()
            .filter_map(|(i, e)| e.map(|e| (first + i as u64, e.0)))
            .collect();
        let mut changes = Vec::new();
        let mut gained = Vec::new();
        for (i, (held, want)) in held.into_iter().zip(desired).enumerate() {
            let id = SectionId(first + i as u64);
            match (held, want) {
                (Some((epoch, _)), Some((want_epoch, _))) if epoch == want_epoch => {}
                (None, None) => {}
                (_, None) => changes.push((id, None)),
                (_, Some((epoch, no_wait))) => {
                    let serve_after = if self.cfg.unsafe_switches.skip_lease_wait {
                        t_obs
                    } else {
                        p.timings.serve_after(t_obs, no_wait)
                    };
                    let spec = SectionSpec {
                        section_size: p.section_size,
                        step: p.step,
                        unsafe_serve_before_ack: self.cfg.unsafe_switches.serve_before_bump_ack,
                    };
                    let slot = Arc::new(Slot::new(Section::new(id, epoch, spec, serve_after), incarnation));
                    gained.push(slot.clone());
                    changes.push((id, Some(slot)));
                }
            }
        }
        if !changes.is_empty() {
            let dropped = self.owned.replace(changes);
            if !dropped.is_empty() {
                info!(sections = ?ranges(dropped.iter().map(|s| s.id)), "let go of sections");
            }
            if !gained.is_empty() {
                info!(sections = ?ranges(gained.iter().map(|s| s.id)), "gained sections (loading)");
            }
            self.let_go(&dropped);
        }
        (gained, to_release)
    }
}

/// How long a renewal or a bump waits for its reply.
///
/// Either may take longer than the renew interval (slow links, a ReadIndex round or a replicated
/// commit): the lease counts from `t_send`, so a late renewal still extends it (giving up after
/// one interval lost leases in the simulator's delay-links fault), and a late bump acknowledgement
/// is still a committed ceiling — the epoch fence, not a timeout, vouches that the section was
/// ours when it was applied. (With bumps cut off at 1 s, a bump that was merely late was never
/// acknowledged, which also hid the fence from the simulator's negative control.) The cost: a
/// bump sent to a leader that was cut off waits this long before the next replica is tried; the
/// prefetch at half a step leaves headroom for that (simulator, partition-store-leader: 17.6 ms
/// p50 unavailability with this wait, 15.1 ms with 1 s, 8 faults each, seed 7).
fn store_reply_wait(p: &Params) -> Duration {
    p.renew_interval.max(p.timings.lease / 2)
}

async fn renew_loop(inner: Arc<Inner>, mut stop: watch::Receiver<bool>) {
    let p = inner.params.clone();
    let renew_timeout = store_reply_wait(&p);
    let store = inner.store.with_timeouts(StoreTimeouts {
        attempt: renew_timeout,
        overall: renew_timeout,
    });
    let mut lease = Lease::default();
    // Grants and map generation after the last diff: an unchanged renewal skips the diff.
    let mut last_applied: Option<(Vec<pb::Grant>, Vec<pb::SectionRange>, u64)> = None;
    let mut next = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = stop.changed() => return,
        }
        next += p.renew_interval;
        let now = tokio::time::Instant::now();
        if next < now {
            next = now + p.renew_interval;
        }
        if inner.stopping.load(Ordering::Acquire) {
            return;
        }
        let t_send = Instant::now();
        // The grants answered are this incarnation's: a Release built from them names it (not
        // whatever this process is registered as when the Release is finally sent).
        let req_incarnation = inner.incarnation().0;
        let req = pb::RenewRequest {
            incarnation: req_incarnation,
            route_version: inner.route_version.load(Ordering::Acquire),
        };
        match store.renew(req).await {
            Ok(reply) if reply.status == pb::RenewStatus::Ok as i32 => {
                if inner.stopping.load(Ordering::Acquire) {
                    return;
                }
                inner.store_routes(reply.route_version, reply.routes.clone());
                // Drop what the reply no longer grants BEFORE the extended lease is published:
                // otherwise a fetch could serve a section the store has moved on under a lease
                // this very reply extended.
                let unchanged = last_applied.as_ref().is_some_and(|(g, h, generation)| {
                    *g == reply.grants && *h == reply.handover && *generation == inner.owned.generation()
                });
                if !unchanged {
                    let (gained, handed_over) = inner.apply_grants(&reply, Instant::now());
                    // While a handover is asked for, diff every renewal again: a Release that
                    // failed is then sent again (it is idempotent under its epochs).
                    last_applied = handed_over
                        .is_empty()
                        .then(|| (reply.grants, reply.handover, inner.owned.generation()));
                    if !gained.is_empty() {
                        tokio::spawn(gain(inner.clone(), gained));
                    }
                    for req in release_requests(req_incarnation, released(handed_over), false) {
                        tokio::spawn(release(inner.clone(), req));
                    }
                }
                let was_valid = lease.is_valid(t_send);
                lease.confirmed(t_send, &p.timings);
                inner.owned.set_lease_until(lease.valid_until());
                if !was_valid {
                    info!(until_ms = p.timings.owner_validity().as_millis() as u64, "lease gained");
                }
                inner.metrics.lease_valid.set(1.0);
            }
            Ok(reply) if reply.status == pb::RenewStatus::UnknownIncarnation as i32 => {
                warn!(incarnation = %inner.incarnation(), "store does not know this incarnation any more");
                lease.revoke();
                inner.owned.set_lease_until(None);
                inner.metrics.lease_valid.set(0.0);
                inner.drop_everything("unknown incarnation");
                let registered = tokio::select! {
                    r = register(&inner.store, &inner.cfg, &inner.advertise, None) => r,
                    _ = stop.changed() => return,
                };
                match registered {
                    Ok((incarnation, params)) => {
                        if params != inner.params {
                            error!(old = ?inner.params, new = ?params, "set parameters changed; keeping the old ones");
                        }
                        inner.incarnation.store(incarnation.0, Ordering::Release);
                        info!(%incarnation, "registered again");
                    }
                    Err(e) => error!(error = %e, "registration failed"),
                }
                next = tokio::time::Instant::now();
            }
            Ok(reply) => warn!(status = reply.status, "renewal with unknown status ignored"),
            Err(e) => debug!(error = %e, "renewal failed"),
        }
        let now = Instant::now();
        if !lease.is_valid(now) && inner.owned.held_count() > 0 {
            inner.metrics.lease_lost.increment(1);
            inner.metrics.lease_valid.set(0.0);
            lease.revoke();
            inner.owned.set_lease_until(None);
            inner.drop_everything("lease ran out");
        }
    }
}

/// Loads newly gained sections, sets their base and queues them for Bumps (rule 5).
///
/// One Load per [`LOAD_CHUNK_SECTIONS`] sections, one after the other: a Load of every section of
/// a large set would not fit a reply (2^20 sections make 10–46 MiB). Each chunk is queued for its
/// bump as soon as it is loaded, so the first sections serve while the later ones load; a chunk
/// is a Bump of its own (the chunk size is at most the bump limit). The default 42,950 sections
/// are one chunk, as before.
async fn gain(inner: Arc<Inner>, slots: Vec<Arc<Slot>>) {
    for chunk in load_chunks(slots) {
        gain_chunk(&inner, chunk).await;
    }
}

/// Splits gained slots into runs of at most [`LOAD_CHUNK_SECTIONS`], in section order.
fn load_chunks(mut slots: Vec<Arc<Slot>>) -> Vec<Vec<Arc<Slot>>> {
    const _: () = assert!(LOAD_CHUNK_SECTIONS as usize <= MAX_BUMP_ITEMS);
    slots.sort_unstable_by_key(|s| s.id);
    let mut chunks = Vec::with_capacity(slots.len().div_ceil(LOAD_CHUNK_SECTIONS as usize));
    let mut rest = slots.into_iter().peekable();
    while rest.peek().is_some() {
        chunks.push(rest.by_ref().take(LOAD_CHUNK_SECTIONS as usize).collect());
    }
    chunks
}

/// Loads one chunk of gained sections (a single Load), sets their base and queues them for a Bump.
async fn gain_chunk(inner: &Arc<Inner>, slots: Vec<Arc<Slot>>) {
    let req = pb::LoadRequest {
        sections: ranges(slots.iter().map(|s| s.id)),
    };
    let mut backoff = Duration::from_millis(50);
    let mut reply = None;
    for attempt in 1..=LOAD_ATTEMPTS {
        if !slots.iter().any(|s| inner.owned.is_held(s)) {
            return;
        }
        match inner.store.load(req.clone()).await {
            Ok(r) => {
                reply = Some(r);
                break;
            }
            Err(e) => {
                warn!(attempt, error = %e, "load of gained sections failed");
                if matches!(e, StoreError::Rejected(_)) {
                    break;
                }
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(RETRY_BACKOFF_MAX);
    }
    let Some(reply) = reply else {
        // Give them up; the next renewal gains them again through the normal path.
        let dropped: Vec<_> = slots.into_iter().filter(|s| inner.owned.remove_if_held(s)).collect();
        inner.let_go(&dropped);
        return;
    };
    let states: HashMap<u64, &pb::SectionState> = reply.sections.iter().map(|s| (s.section, s)).collect();
    let mut to_bump = Vec::with_capacity(slots.len());
    let mut lost = Vec::new();
    for slot in slots {
        let Some(st) = states.get(&slot.id.0) else {
            warn!(section = %slot.id, "load reply lacks a section");
            lost.push(slot);
            continue;
        };
        if st.epoch != slot.epoch.0 || st.owner_incarnation != slot.incarnation.0 {
            info!(section = %slot.id, epoch = st.epoch, owner = st.owner_incarnation, "grant moved on before load");
            lost.push(slot);
            continue;
        }
        let kept = if inner.cfg.unsafe_switches.keep_memory {
            inner.kept.lock().unwrap().remove(&slot.id)
        } else {
            None
        };
        let started = {
            let mut s = slot.section.lock().unwrap();
            s.loaded(st.max_seq, kept);
            s.maybe_prefetch().is_some()
        };
        if started {
            to_bump.push(slot);
        }
    }
    let dropped: Vec<_> = lost.into_iter().filter(|s| inner.owned.remove_if_held(s)).collect();
    inner.let_go(&dropped);
    if !to_bump.is_empty() {
        let _ = inner.bump_tx.send(to_bump);
    }
}

/// Releases handed-over sections (already dropped) so their next owner need not wait.
async fn release(inner: Arc<Inner>, req: pb::ReleaseRequest) {
    if let Some(after) = inner.cfg.repeat_releases_after {
        // Test-only network fault: the same Release arrives once more, late.
        let late = after + after.mul_f64(rand::random::<f64>());
        let (store, again) = (inner.store.clone(), req.clone());
        tokio::spawn(async move {
            tokio::time::sleep(late).await;
            match store.release(again).await {
                Ok(r) => info!(
                    released = r.released,
                    late_ms = late.as_millis() as u64,
                    "repeated release landed"
                ),
                Err(e) => debug!(error = %e, "repeated release failed"),
            }
        });
    }
    match inner.store.release(req).await {
        Ok(r) => info!(released = r.released, "handed sections over"),
        Err(e) => warn!(error = %e, "release after handover failed; the next owner waits out the lease"),
    }
}

async fn bumper(inner: Arc<Inner>, mut rx: mpsc::UnboundedReceiver<Vec<Arc<Slot>>>, mut stop: watch::Receiver<bool>) {
    let wait = store_reply_wait(&inner.params);
    // One attempt per call: `run_bump` itself retries an unknown outcome with the same new_max.
    let store = inner.store.with_timeouts(StoreTimeouts {
        attempt: wait,
        overall: wait,
    });
    loop {
        let mut batch = tokio::select! {
            m = rx.recv() => match m { Some(m) => m, None => return },
            _ = stop.changed() => return,
        };
        while batch.len() < MAX_BUMP_ITEMS {
            match rx.try_recv() {
                Ok(more) => batch.extend(more),
                Err(_) => break,
            }
        }
        for chunk in batch.chunks(MAX_BUMP_ITEMS) {
            run_bump(&inner, &store, chunk).await;
        }
    }
}

fn abandon(inner: &Inner, slot: &Arc<Slot>, drop_it: bool) {
    slot.section.lock().unwrap().bump_abandoned();
    if drop_it && inner.owned.remove_if_held(slot) {
        inner.let_go(std::slice::from_ref(slot));
    }
    slot.bumped.notify_waiters();
}

/// Sends one Bump for `slots` and retries it unchanged until it is answered (rule 6).
async fn run_bump(inner: &Inner, store: &StoreClient, slots: &[Arc<Slot>]) {
    let mut pending: Vec<(Arc<Slot>, u64)> = slots
        .iter()
        .filter_map(|s| s.section.lock().unwrap().bump_in_flight().map(|t| (s.clone(), t)))
        .collect();
    let mut backoff = Duration::from_millis(20);
    loop {
        let incarnation = inner.incarnation();
        let stopping = inner.stopping.load(Ordering::Acquire);
        let lease_ok = inner.owned.lease_valid(Instant::now());
        pending.retain(|(slot, _)| {
            let keep = !stopping && lease_ok && slot.incarnation == incarnation && inner.owned.is_held(slot);
            if !keep {
                abandon(inner, slot, false);
            }
            keep
        });
        if pending.is_empty() {
            return;
        }
        let req = pb::BumpRequest {
            incarnation: incarnation.0,
            items: pending
                .iter()
                .map(|(slot, new_max)| pb::BumpItem {
                    section: slot.id.0,
                    epoch: slot.epoch.0,
                    new_max: *new_max,
                })
                .collect(),
        };
        let sent = Instant::now();
        inner.metrics.bump_rpcs.increment(1);
        match store.bump(req).await {
            Ok(reply) if reply.results.len() == pending.len() => {
                inner.metrics.bump_latency.record(sent.elapsed().as_secs_f64());
                for ((slot, new_max), r) in pending.iter().zip(&reply.results) {
                    // Only the epoch the slot holds vouches for the bump: a reply without it
                    // (epoch 0) is not an acknowledgement.
                    let same_epoch = r.epoch == slot.epoch.0;
                    match pb::BumpOutcome::try_from(r.outcome) {
                        Ok(pb::BumpOutcome::Applied | pb::BumpOutcome::NoOp)
                            if same_epoch && r.section == slot.id.0 =>
                        {
                            slot.section.lock().unwrap().bump_acked(*new_max);
                            inner.metrics.bump_sections.increment(1);
                            debug!(section = %slot.id, new_max, "bump acknowledged");
                            slot.bumped.notify_waiters();
                        }
                        Ok(pb::BumpOutcome::StaleEpoch) => {
                            info!(section = %slot.id, epoch = %slot.epoch, "bump refused: stale epoch, letting go");
                            abandon(inner, slot, true);
                        }
                        Ok(pb::BumpOutcome::OutOfRange) => {
                            error!(
                                section = %slot.id, new_max, max_seq = r.max_seq,
                                "bump refused as too far above the ceiling (this node's view of the ceiling is wrong); letting go"
                            );
                            abandon(inner, slot, true);
                        }
                        other => {
                            warn!(section = %slot.id, outcome = ?other, result = ?r, "unexpected bump result, letting go");
                            abandon(inner, slot, true);
                        }
                    }
                }
                return;
            }
            Ok(reply) => {
                error!(
                    items = pending.len(),
                    results = reply.results.len(),
                    "bump reply does not match the request"
                );
                inner.metrics.bump_failures.increment(1);
            }
            Err(StoreError::Rejected(status)) => {
                warn!(%status, "bump refused; letting the sections go");
                for (slot, _) in &pending {
                    abandon(inner, slot, true);
                }
                return;
            }
            Err(e @ StoreError::Unavailable { .. }) => {
                inner.metrics.bump_failures.increment(1);
                warn!(error = %e, items = pending.len(), "bump outcome unknown; retrying with the same new_max");
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(RETRY_BACKOFF_MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gain_of_2_pow_20_sections_loads_in_chunks_whose_replies_fit() {
        use prost::Message;
        let spec = SectionSpec {
            section_size: 4_096,
            step: 10_000,
            unsafe_serve_before_ack: false,
        };
        let now = Instant::now();
        let total = 1u64 << 20;
        // Out of order, as a diff may hand them over.
        let slots: Vec<Arc<Slot>> = (0..total)
            .rev()
            .map(|i| {
                Arc::new(Slot::new(
                    Section::new(SectionId(i), Epoch(1), spec, now),
                    Incarnation(1),
                ))
            })
            .collect();
        let chunks = load_chunks(slots);
        assert_eq!(chunks.len(), 16);
        let mut next = 0;
        for chunk in &chunks {
            assert!(chunk.len() as u64 <= LOAD_CHUNK_SECTIONS && chunk.len() <= MAX_BUMP_ITEMS);
            let req = ranges(chunk.iter().map(|s| s.id));
            assert_eq!(req.len(), 1, "a contiguous chunk is one range");
            assert_eq!(req[0].begin, next);
            next = req[0].end;
            // The store's reply to it, every field at its largest encoding, fits the client limit.
            let worst = pb::SectionState {
                section: u64::MAX,
                max_seq: u64::MAX,
                epoch: u64::MAX,
                owner_incarnation: u64::MAX,
            };
            let reply = pb::LoadReply {
                not_leader: None,
                sections: vec![worst; chunk.len()],
            };
            assert!(
                reply.encoded_len() < limits::STORE_MESSAGE_BYTES / 4,
                "{}",
                reply.encoded_len()
            );
        }
        assert_eq!(next, total, "every section is loaded once");
    }

    #[test]
    fn releases_are_chunked_and_only_the_last_one_leaves() {
        let range = |i: u64| pb::ReleasedRange {
            begin: i,
            end: i + 1,
            epoch: i % 2,
        };
        let many: Vec<pb::ReleasedRange> = (0..(RELEASE_CHUNK_RANGES as u64 * 2 + 1)).map(range).collect();
        let reqs = release_requests(7, many.clone(), true);
        assert_eq!(reqs.len(), 3);
        assert!(reqs.iter().all(|r| r.incarnation == 7));
        assert_eq!(reqs.iter().map(|r| r.leaving).collect::<Vec<_>>(), [false, false, true]);
        let all: Vec<pb::ReleasedRange> = reqs.iter().flat_map(|r| r.sections.clone()).collect();
        assert_eq!(all, many);
        let worst = pb::ReleaseRequest {
            incarnation: u64::MAX,
            sections: vec![
                pb::ReleasedRange {
                    begin: u64::MAX,
                    end: u64::MAX,
                    epoch: u64::MAX,
                };
                RELEASE_CHUNK_RANGES
            ],
            leaving: true,
        };
        assert!(prost::Message::encoded_len(&worst) < seqsvr_proto::limits::MAX_ENTRY_BYTES);
        // Nothing held: a leaving Release still goes out; not leaving, nothing does.
        let empty = release_requests(7, vec![], true);
        assert_eq!((empty.len(), empty[0].leaving, empty[0].sections.len()), (1, true, 0));
        assert!(release_requests(7, vec![], false).is_empty());
    }

    #[test]
    fn ranges_compress_sorted_runs() {
        type Case = (&'static [u64], &'static [(u64, u64)]);
        let cases: [Case; 4] = [
            (&[], &[]),
            (&[3], &[(3, 4)]),
            (&[5, 3, 4, 9, 10, 4], &[(3, 6), (9, 11)]),
            (&[0, 2, 4], &[(0, 1), (2, 3), (4, 5)]),
        ];
        for (ids, expected) in cases {
            let got: Vec<(u64, u64)> = ranges(ids.iter().map(|i| SectionId(*i)))
                .into_iter()
                .map(|r| (r.begin, r.end))
                .collect();
            assert_eq!(got, expected, "{ids:?}");
        }
    }
}
