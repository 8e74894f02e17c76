//! [`Client`]: routes each uid to its owner and retries until an answer or the deadline.
//!
//! Keeps the client-side rule of docs/DESIGN.md (Promises): a call whose attempts all failed and of which any attempt may
//! have reached a server ends in [`ClientError::Unknown`], never in a number and never in "did not
//! happen". A value is returned only from an OK reply, and a fetched seq of 0 is treated as a broken
//! reply, not a value.
//!
//! Retries: NOT_OWNER installs the table (and map) carried by the reply and resends at once when
//! they changed (otherwise it asks another AllocSvr for both, then backs off); NOT_READY, UNAVAILABLE and transport errors back off with jitter;
//! INVALID_ARGUMENT is never retried. Every loop is bounded by the deadline and `max_attempts`.
//!
//! An OK reply whose owner's set the cluster map does not allow to answer for the uid (see `map`)
//! is not returned: the number is treated as lost (the call may end `Unknown`), the map is
//! refreshed elsewhere and the call tries again. A reply that carries a newer map is checked
//! against that map.
//!
//! Deliberately left out: caching seqs, or answering from anything but an owner's reply.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use seqsvr_proto::pb::alloc_service_client::AllocServiceClient;
use seqsvr_proto::{Epoch, Incarnation, NodeId, SectionId, Uid, map_header, pb};
use tokio::time::Instant;
use tonic::Status;

use crate::config::ClientConfig;
use crate::error::{ClientError, FailureKind};
use crate::retry::Budget;
use crate::routing::{Channels, InProcess, RouteCache, RouteSet, Seeds, Target, target_of};
use crate::transport::{Conn, Connect};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use seqsvr_proto::refusal::Refusal;
use seqsvr_rpc::classify::{Delivery, classify};

/// The longest wait for another server's route table and map (see `learn_routes_elsewhere`).
const ROUTE_READ_TIMEOUT: Duration = Duration::from_millis(250);
/// Who served a value: lets callers (and the simulator) check that one section had one owner (P4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Owner {
    /// The section of the uid.
    pub section: SectionId,
    /// The AllocSvr's stable node id.
    pub node_id: NodeId,
    /// The AllocSvr process that served (a restart is a new incarnation).
    pub incarnation: Incarnation,
    /// The section's ownership epoch at the time (epochs count per set).
    pub epoch: Epoch,
    /// The set the AllocSvr belongs to.
    pub set_id: u64,
}

impl From<&pb::Owner> for Owner {
    fn from(o: &pb::Owner) -> Self {
        Self {
            section: SectionId(o.section),
            node_id: NodeId(o.node_id),
            incarnation: Incarnation(o.incarnation),
            epoch: Epoch(o.epoch),
            set_id: o.set_id,
        }
    }
}

/// A seq handed out by `FetchNextSeq`: valid, never 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fetched {
    /// The uid it was asked for.
    pub uid: Uid,
    /// Strictly above every seq this uid was given before.
    pub seq: u64,
    /// Who served it, when the server said.
    pub owner: Option<Owner>,
}

/// A block of seqs handed out by `Reserve`: `[first, first + count)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// The uid it was asked for.
    pub uid: Uid,
    /// The first seq of the block, never 0; every seq of the block is strictly above every seq
    /// this uid was given before, and the uid's next seq is above the block.
    pub first: u64,
    /// How many seqs the block holds.
    pub count: u32,
    /// Who served it, when the server said.
    pub owner: Option<Owner>,
}

impl Block {
    /// The seqs of the block, in order.
    pub fn seqs(&self) -> std::ops::Range<u64> {
        self.first..self.first + u64::from(self.count)
    }
}

/// A value of a named counter (`CounterNext`, `CounterGet`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counted {
    /// From `counter_next`: strictly above every value the key was given before, never 0. From
    /// `counter_get`: the key's last value, or a ceiling of its section after an ownership
    /// change (0 if never served).
    pub value: u64,
    /// Who answered, when the server said.
    pub owner: Option<Owner>,
}

impl From<Fetched> for Counted {
    /// A batch's answer for a key (its `uid` is the key's position, which the caller never needs).
    fn from(f: Fetched) -> Self {
        Self {
            value: f.seq,
            owner: f.owner,
        }
    }
}

/// A block of a named counter's values (`CounterReserve`): `[first, first + count)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterBlock {
    /// Never 0; every value of the block is above every value the key was given before, and the
    /// key's next value is above the block.
    pub first: u64,
    pub count: u32,
    /// Who served it, when the server said.
    pub owner: Option<Owner>,
}

impl CounterBlock {
    /// The values of the block, in order.
    pub fn values(&self) -> std::ops::Range<u64> {
        self.first..self.first + u64::from(self.count)
    }
}

/// The answer of `GetCurSeq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CurSeq {
    /// The uid it was asked for.
    pub uid: Uid,
    /// Last seq handed out, or the loaded base after an ownership change (P5); 0 if never served.
    pub cur_seq: u64,
    /// Who answered, when the server said.
    pub owner: Option<Owner>,
}

/// A data-plane client. Cheap to clone: clones share the route table and the channels.
#[derive(Debug, Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) cfg: ClientConfig,
    pub(crate) routes: RouteCache,
    pub(crate) seeds: Seeds,
    pub(crate) channels: Channels,
    /// Every random choice (backoff jitter, which server to ask): seeded when the caller asks
    /// for a reproducible client (the deterministic simulator), from the OS otherwise.
    pub(crate) rng: Mutex<StdRng>,
}

/// The single-uid and single-key RPCs, which share one reply shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op<'a> {
    Fetch,
    Get,
    /// A block of this many seqs.
    Reserve(u32),
    /// The named counter's next value, a block of its values, its last value.
    KeyNext(&'a str),
    KeyReserve(&'a str, u32),
    KeyGet(&'a str),
}

impl Op<'_> {
    /// Whether executing the RPC may consume a number (then a lost reply is an unknown outcome).
    fn consumes(self) -> bool {
        !self.reads()
    }

    /// A read: 0 is a valid answer.
    fn reads(self) -> bool {
        matches!(self, Op::Get | Op::KeyGet(_))
    }

    /// The uid the call is routed by and its answer checked against: a key's position under the
    /// known uid space, `None` before any table or map is known (the server places the key
    /// itself; a seed is asked, and its reply brings the table).
    fn routed_by(self, uid: Uid, routes: &RouteSet) -> Option<Uid> {
        match self {
            Op::KeyNext(key) | Op::KeyReserve(key, _) | Op::KeyGet(key) => routes.key_place(key),
            Op::Fetch | Op::Get | Op::Reserve(_) => Some(uid),
        }
    }

    /// What the call is for, in an error.
    fn subject(self, uid: Uid) -> String {
        match self {
            Op::KeyNext(key) | Op::KeyReserve(key, _) | Op::KeyGet(key) => format!("key {key:?}"),
            Op::Fetch | Op::Get | Op::Reserve(_) => format!("uid {uid}"),
        }
    }
}

/// The common part of `FetchNextSeqReply` and `GetCurSeqReply`.
struct SingleReply {
    outcome: pb::Outcome,
    value: u64,
    routes: Option<pb::RouteTable>,
    owner: Option<pb::Owner>,
    map: Option<pb::ClusterMap>,
}

/// The common part of a single call's reply, as each wire reply type names the field that
/// carries the number: one entry per reply type.
macro_rules! single_replies {
    ($($reply:ty => $value:ident),* $(,)?) => {$(
        impl From<$reply> for SingleReply {
            fn from(r: $reply) -> Self {
                Self {
                    outcome: r.outcome(),
                    value: r.$value,
                    routes: r.routes,
                    owner: r.owner,
                    map: r.map,
                }
            }
        }
    )*};
}

single_replies!(
    pb::FetchNextSeqReply => seq,
    pb::ReserveReply => first,
    pb::GetCurSeqReply => cur_seq,
    pb::CounterReply => value,
);

/// A reply's common part, out of its response.
fn single<R: Into<SingleReply>>(reply: tonic::Response<R>) -> SingleReply {
    reply.into_inner().into()
}

/// What every single call's request carries besides its body.
struct Envelope {
    /// The attempt's deadline, which the server sees too.
    timeout: Duration,
    /// The caller's cluster map version (`map_header`).
    map_version: u64,
}

impl Envelope {
    fn wrap<T>(&self, body: T) -> tonic::Request<T> {
        let mut req = tonic::Request::new(body);
        req.set_timeout(self.timeout);
        map_header::write(req.metadata_mut(), self.map_version);
        req
    }
}

/// Why one attempt produced no reply.
pub(crate) enum AttemptError {
    /// The RPC failed with a status (from the server or the transport).
    Status(Status),
    /// Our per-attempt timer fired: the request may be executing right now.
    TimedOut,
}

/// What the retry loop knows so far about a call that has no value yet.
#[derive(Debug, Default)]
pub(crate) struct Unsettled {
    /// Some attempt may have taken effect.
    pub(crate) maybe_taken: bool,
    /// The last reason an attempt did not produce a value.
    pub(crate) last: String,
    /// That reason was the owner's overload.
    pub(crate) overloaded: bool,
}

impl Unsettled {
    /// The final error once no more attempts will be made.
    pub(crate) fn into_error(self, kind: FailureKind) -> ClientError {
        let detail = if self.last.is_empty() {
            "no attempt was made before the deadline".into()
        } else {
            self.last
        };
        if self.maybe_taken {
            ClientError::unknown(detail)
        } else if kind == FailureKind::Unavailable && self.overloaded {
            ClientError::failed(FailureKind::Overloaded, detail)
        } else {
            ClientError::failed(kind, detail)
        }
    }
}

impl Client {
    /// A client that learns the route table on its first call; does no IO.
    pub fn new(cfg: ClientConfig) -> Result<Self, ClientError> {
        Self::build(cfg, None, StdRng::from_os_rng())
    }

    /// A client that reaches AllocSvrs through `via` instead of TCP and draws its random choices
    /// from `seed`: the deterministic simulator's client, the same code as every other.
    pub fn in_process(cfg: ClientConfig, via: Arc<dyn Connect>, seed: u64) -> Result<Self, ClientError> {
        Self::build(cfg, Some(InProcess(via)), StdRng::seed_from_u64(seed))
    }

    fn build(cfg: ClientConfig, in_process: Option<InProcess>, rng: StdRng) -> Result<Self, ClientError> {
        cfg.validate()?;
        let inner = Inner {
            routes: RouteCache::default(),
            seeds: Seeds::new(cfg.seeds.clone()),
            channels: Channels::new(cfg.connect_timeout, in_process, cfg.tls.clone()),
            cfg,
            rng: Mutex::new(rng),
        };
        Ok(Self { inner: Arc::new(inner) })
    }

    /// A random index below `n` (> 0).
    pub(crate) fn random_index(&self, n: usize) -> usize {
        self.inner
            .rng
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .random_range(0..n)
    }

    /// A random number in [0, 1).
    fn random_unit(&self) -> f64 {
        self.inner.rng.lock().unwrap_or_else(|e| e.into_inner()).random::<f64>()
    }

    /// A client that has learned the route table from a seed, or an error if none answered in time.
    pub async fn connect(cfg: ClientConfig) -> Result<Self, ClientError> {
        let client = Self::new(cfg)?;
        client.refresh_routes().await?;
        Ok(client)
    }

    /// Asks the seeds (round-robin, with backoff) for their route table; keeps it when newer than ours.
    ///
    /// Uses `GetCurSeq(0)` with `route_version = 0`: a read, so a lost reply consumes nothing.
    pub async fn refresh_routes(&self) -> Result<Arc<RouteSet>, ClientError> {
        let cfg = &self.inner.cfg;
        let mut budget = Budget::until(cfg, Instant::now() + cfg.deadline);
        let mut state = Unsettled::default();
        while let Some(timeout) = budget.start_attempt(Instant::now()) {
            let addr = self.inner.seeds.next().to_owned();
            match self.send_single(Op::Get, &addr, Uid(0), (0, 0), timeout).await {
                Ok(reply) => {
                    self.inner.routes.offer_map(reply.map.as_ref());
                    self.inner.routes.offer(reply.routes);
                    let routes = self.routes();
                    if !routes.is_empty() {
                        return Ok(routes);
                    }
                    state.last = format!("{addr} has no route table yet");
                }
                Err(AttemptError::Status(s)) => state.last = format!("{addr}: {}", s.message()),
                Err(AttemptError::TimedOut) => state.last = format!("{addr}: timed out"),
            }
            self.back_off(&mut budget, false).await;
        }
        Err(state.into_error(FailureKind::Unavailable))
    }

    /// The cached route tables, one per set heard from, and the cluster map.
    pub fn routes(&self) -> Arc<RouteSet> {
        self.inner.routes.get()
    }

    /// `f` of the cached route tables and map: cheaper than [`Self::routes`] when nothing is kept
    /// (no reference count is touched), for a check on every call.
    pub fn with_routes<R>(&self, f: impl FnOnce(&RouteSet) -> R) -> R {
        self.inner.routes.with(f)
    }

    /// The version of the cluster map the client has (0 = none yet).
    pub fn map_version(&self) -> u64 {
        self.with_routes(RouteSet::map_version)
    }

    /// Why an OK reply for `uid` from `owner`'s set is not accepted, if it is not: the client's
    /// map (already updated from the reply) neither gives the uid's section to that set nor has
    /// a move of it in flight from or to it. Without a map or an owner there is nothing to check.
    /// `routes` is the client's view after the reply was learnt from (read once per reply, not
    /// once per uid of a batch).
    pub(crate) fn refused_answer(routes: &RouteSet, uid: Uid, owner: Option<&pb::Owner>) -> Option<String> {
        let (map, owner) = (routes.map()?, owner?);
        let section = uid.section(map.section_size());
        if map.may_answer(section, owner.set_id) {
            return None;
        }
        let why = format!(
            "set {} answered for uid {uid}, which cluster map version {} gives to set {:?}",
            owner.set_id,
            map.version(),
            map.set_of(section)
        );
        tracing::warn!(%why, "answer refused");
        Some(why)
    }

    /// Installs the map and the route table a reply carries (or that a server holding its own
    /// hands in: an AllocSvr's front ends route with its renewals' table and map before any
    /// reply brought them); true when either changed the view. Older ones are ignored.
    pub fn learn_from(&self, map: Option<&pb::ClusterMap>, routes: Option<pb::RouteTable>) -> bool {
        let new_map = self.inner.routes.offer_map(map);
        self.inner.routes.offer(routes) || new_map
    }

    /// The configuration this client runs with.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.cfg
    }

    /// The next seq of `uid`. On error no number is returned; see [`ClientError`] for whether one may
    /// have been consumed.
    pub async fn fetch_next_seq(&self, uid: Uid) -> Result<Fetched, ClientError> {
        let (value, owner) = self.single(Op::Fetch, uid).await?;
        Ok(Fetched { uid, seq: value, owner })
    }

    /// A block of `count` consecutive seqs of `uid` (1 to the smaller of the set's step and
    /// [`seqsvr_proto::limits::MAX_BLOCK`]; larger is INVALID_ARGUMENT from the server). Errors
    /// as for [`Self::fetch_next_seq`]: an unknown outcome may have taken the block.
    pub async fn reserve(&self, uid: Uid, count: u32) -> Result<Block, ClientError> {
        let (first, owner) = self.single(Op::Reserve(count), uid).await?;
        Ok(Block {
            uid,
            first,
            count,
            owner,
        })
    }

    /// The last seq handed out for `uid` (P5). A read: a lost reply is a `Failed`, never `Unknown`.
    pub async fn get_cur_seq(&self, uid: Uid) -> Result<CurSeq, ClientError> {
        let (value, owner) = self.single(Op::Get, uid).await?;
        Ok(CurSeq {
            uid,
            cur_seq: value,
            owner,
        })
    }

    /// The next value of the named counter `key` (1 to 256 bytes of UTF-8; otherwise
    /// INVALID_ARGUMENT from the server). Errors as for [`Self::fetch_next_seq`].
    pub async fn counter_next(&self, key: &str) -> Result<Counted, ClientError> {
        let (value, owner) = self.single(Op::KeyNext(key), Uid(0)).await?;
        Ok(Counted { value, owner })
    }

    /// A block of `count` values of the named counter `key` (count as for [`Self::reserve`]).
    /// Errors as for [`Self::fetch_next_seq`]: an unknown outcome may have taken the block.
    pub async fn counter_reserve(&self, key: &str, count: u32) -> Result<CounterBlock, ClientError> {
        let (first, owner) = self.single(Op::KeyReserve(key, count), Uid(0)).await?;
        Ok(CounterBlock { first, count, owner })
    }

    /// The last value of the named counter `key` (P5). A read: a lost reply is a `Failed`.
    pub async fn counter_get(&self, key: &str) -> Result<Counted, ClientError> {
        let (value, owner) = self.single(Op::KeyGet(key), Uid(0)).await?;
        Ok(Counted { value, owner })
    }

    async fn single(&self, op: Op<'_>, uid: Uid) -> Result<(u64, Option<Owner>), ClientError> {
        let cfg = &self.inner.cfg;
        let mut budget = Budget::until(cfg, Instant::now() + cfg.deadline);
        let mut state = Unsettled::default();
        loop {
            let routes = self.routes();
            let place = op.routed_by(uid, &routes);
            let Target { addr, version } = match target_of(&routes, place, &self.inner.seeds, |n| self.random_index(n))
            {
                Ok(t) => t,
                Err(e) if state.maybe_taken => return Err(ClientError::unknown(e.to_string())),
                Err(e) => return Err(e),
            };
            let Some(timeout) = budget.start_attempt(Instant::now()) else {
                break;
            };
            let versions = (version, routes.map_version_to_send());
            // A key's request carries the key, not a uid: the place only chose the address.
            let reply = match self
                .send_single(op, addr, place.unwrap_or(uid), versions, timeout)
                .await
            {
                Ok(r) => r,
                Err(e) => {
                    self.after_failed_attempt(op, addr, e, timeout, &mut state, &mut budget)
                        .await?;
                    continue;
                }
            };
            state.overloaded = false;
            let changed = self.learn_from(reply.map.as_ref(), reply.routes);
            let answered = matches!(reply.outcome, pb::Outcome::NotOwner | pb::Outcome::NotReady);
            match reply.outcome {
                pb::Outcome::Ok if op.reads() || reply.value != 0 => {
                    // Checked where the answer is for, under the view the reply just taught: a
                    // fresh client places its key only now.
                    let refused = self.with_routes(|r| match op.routed_by(uid, r) {
                        Some(place) => Self::refused_answer(r, place, reply.owner.as_ref()),
                        None => Some(format!("answered for {} but sent no route table", op.subject(uid))),
                    });
                    let Some(why) = refused else {
                        return Ok((reply.value, reply.owner.as_ref().map(Owner::from)));
                    };
                    state.maybe_taken |= op.consumes();
                    state.last = format!("{addr}: {why}");
                    self.learn_routes_elsewhere(addr, timeout).await;
                }
                pb::Outcome::NotOwner => {
                    state.last = format!("{addr}: not the owner of {}", op.subject(uid));
                    // The reply's table or map changed the route, or another server's may.
                    if changed || self.learn_routes_elsewhere(addr, timeout).await {
                        tracing::debug!(?place, %addr, "not owner; resending with the new route table");
                        continue;
                    }
                }
                pb::Outcome::NotReady => state.last = format!("{addr}: owner of {} is not ready", op.subject(uid)),
                // Only batch replies say EXHAUSTED (a single fetch is refused with a status);
                // from a single call it breaks the contract like the outcomes below.
                pb::Outcome::Ok | pb::Outcome::Unspecified | pb::Outcome::Exhausted => {
                    // A reply that breaks the contract: the server did something, we cannot tell what.
                    state.maybe_taken |= op.consumes();
                    state.last = format!("{addr}: malformed reply (outcome {:?}, value 0)", reply.outcome);
                }
            }
            self.back_off(&mut budget, answered).await;
        }
        Err(state.into_error(FailureKind::Unavailable))
    }

    /// Notes an attempt that produced no reply; `Err` ends the call (a refusal retrying cannot
    /// change). Otherwise asks another server for routes (the owner may be dead and its sections
    /// moved), backing off when that changed nothing.
    async fn after_failed_attempt(
        &self,
        op: Op<'_>,
        addr: &str,
        e: AttemptError,
        timeout: Duration,
        state: &mut Unsettled,
        budget: &mut Budget,
    ) -> Result<(), ClientError> {
        match e {
            AttemptError::TimedOut => {
                state.maybe_taken |= op.consumes();
                state.overloaded = false;
                state.last = format!("{addr}: attempt timed out after {timeout:?}");
            }
            AttemptError::Status(s) => {
                let verdict = classify(&s);
                state.maybe_taken |= op.consumes() && verdict.delivery == Delivery::Maybe;
                state.last = format!("{addr}: {}: {}", s.code(), s.message());
                state.overloaded = verdict.refusal == Some(Refusal::Overloaded);
                if verdict.invalid_argument {
                    return Err(std::mem::take(state).into_error(FailureKind::InvalidArgument));
                }
                if verdict.refusal == Some(Refusal::Exhausted) {
                    return Err(std::mem::take(state).into_error(FailureKind::Exhausted));
                }
                if !verdict.retry {
                    return Err(std::mem::take(state).into_error(FailureKind::Unavailable));
                }
                if verdict.refusal == Some(Refusal::Overloaded) {
                    // The owner is alive and answering: asking others for routes would only add
                    // load. The full backoff, not the short one of "not ready yet", gives it air.
                    self.back_off(budget, false).await;
                    return Ok(());
                }
            }
        }
        if !self.learn_routes_elsewhere(addr, timeout).await {
            self.back_off(budget, false).await;
        }
        Ok(())
    }

    /// After `avoid` failed, asks one other known AllocSvr (a seed, a routed owner or one the map
    /// lists) for its route table and the cluster map (sending map version 0, so the map always
    /// comes back), so that a client whose table names a dead owner, or whose map does not know a
    /// set, learns where its sections went. Returns whether the cached table or map changed. One
    /// bounded attempt; a read, so nothing is consumed.
    pub(crate) async fn learn_routes_elsewhere(&self, avoid: &str, timeout: Duration) -> bool {
        let routes = self.routes();
        let mut candidates: Vec<&str> = self.inner.seeds.all().iter().map(String::as_str).collect();
        candidates.extend(routes.owner_addrs());
        candidates.retain(|a| !a.is_empty() && *a != avoid);
        candidates.sort_unstable();
        candidates.dedup();
        if candidates.is_empty() {
            return false;
        }
        let addr = candidates[self.random_index(candidates.len())].to_owned();
        // A live server answers a route read in about a millisecond; the candidate may be the
        // paused or dead node a caller just gave up on, and waiting a whole attempt for it would
        // add that much to the caller's wait.
        let timeout = timeout.min(ROUTE_READ_TIMEOUT);
        match self.send_single(Op::Get, &addr, Uid(0), (0, 0), timeout).await {
            Ok(reply) => self.learn_from(reply.map.as_ref(), reply.routes),
            Err(_) => false,
        }
    }

    /// Sleeps a jittered backoff, never past the budget's deadline; a short one when the server
    /// `answered` that it cannot serve yet (see [`crate::retry::ANSWERED_BACKOFF_MAX`]).
    pub(crate) async fn back_off(&self, budget: &mut Budget, answered: bool) {
        let jitter = self.random_unit();
        tokio::time::sleep_until(budget.next_try_at(Instant::now(), jitter, answered)).await;
    }

    /// The channel to `addr`; channels to addresses that are neither seeds nor routed may be dropped.
    pub(crate) fn client_for(&self, addr: &str) -> Result<AllocServiceClient<Conn>, Status> {
        let channel = self.channel_for(addr)?;
        // The AllocSvr's own limits, both ways (a reply may carry a whole route table).
        Ok(AllocServiceClient::new(channel)
            .max_decoding_message_size(seqsvr_proto::limits::DATA_PLANE_MESSAGE_BYTES)
            .max_encoding_message_size(seqsvr_proto::limits::DATA_PLANE_MESSAGE_BYTES))
    }

    /// The one reused channel to `addr`, for any of its services.
    pub(crate) fn channel_for(&self, addr: &str) -> Result<Conn, Status> {
        let seeds = self.inner.seeds.all();
        // A bad address is refused before anything is sent.
        let channel = self
            .with_routes(|routes| {
                let keep = |a: &str| seeds.iter().any(|s| s == a) || routes.routes_to(a);
                self.inner.channels.get(addr, keep)
            })
            .map_err(|e| Status::failed_precondition(e.to_string()))?;
        Ok(channel)
    }

    /// One RPC to `addr` with the caller's `(route_version, map_version)`: one line per call, its
    /// request body to its wire method; the envelope and the reply's common part are shared.
    async fn send_single(
        &self,
        op: Op<'_>,
        addr: &str,
        uid: Uid,
        (route_version, map_version): (u64, u64),
        timeout: Duration,
    ) -> Result<SingleReply, AttemptError> {
        let mut client = self.client_for(addr).map_err(AttemptError::Status)?;
        let wire = Envelope { timeout, map_version };
        let uid = uid.0;
        let counter = |key: &str, count| pb::CounterRequest {
            key: key.as_bytes().to_vec(),
            count,
            route_version,
        };
        let call = async {
            match op {
                Op::Fetch => {
                    let req = wire.wrap(pb::FetchNextSeqRequest { uid, route_version });
                    client.fetch_next_seq(req).await.map(single)
                }
                Op::Reserve(count) => {
                    let req = wire.wrap(pb::ReserveRequest {
                        uid,
                        count,
                        route_version,
                    });
                    client.reserve(req).await.map(single)
                }
                Op::Get => {
                    let req = wire.wrap(pb::GetCurSeqRequest { uid, route_version });
                    client.get_cur_seq(req).await.map(single)
                }
                Op::KeyNext(key) => client.counter_next(wire.wrap(counter(key, 0))).await.map(single),
                Op::KeyReserve(key, count) => client.counter_reserve(wire.wrap(counter(key, count))).await.map(single),
                Op::KeyGet(key) => client.counter_get(wire.wrap(counter(key, 0))).await.map(single),
            }
        };
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(status)) => Err(AttemptError::Status(status)),
            Err(_) => Err(AttemptError::TimedOut),
        }
    }
}
