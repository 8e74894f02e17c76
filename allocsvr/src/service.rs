//! The data plane: `AllocService` (FetchNextSeq, GetCurSeq, BatchFetchNextSeq, Reserve, and the
//! named counters' CounterNext, CounterReserve, CounterGet, CounterBatch; BatchGet, the reads of
//! uids and keys together; NextIds in `ids::service`).
//!
//! A counter key is served exactly as a uid is, at its position in the uid space
//! (`seqsvr_proto::keys`), which this server computes itself from the key (a caller's idea of it
//! is never trusted: a key placed in two sections would have two sequences); the section holds
//! the key's own `cur_seq` by name.
//!
//! Hot path of a fetch: read lock on the section map, one short lock of the section, in which the
//! lease end and `now` are read and the seq is incremented (ownership rule 7), reply. No `.await` while a
//! lock is held. When the acknowledged ceiling is reached the fetch waits, without any lock, for
//! the section's in-flight bump — at most [`BUMP_WAIT`] — then answers NOT_READY.
//!
//! Every reply carries the node's route version, the route table when the caller's version is
//! older, and always with NOT_OWNER. Likewise the cluster map: every reply carries the node's map
//! version, and the map when the caller's `seqsvr-map-version` header names an older one (an
//! atomic load and a compare otherwise; no lock on the steady-state path). `owner` names (section,
//! node, incarnation, epoch, set) so callers and the simulator can check P4.
//!
//! P5: GetCurSeq answers the uid's `cur_seq`, or the loaded base for a uid not fetched since this
//! node gained the section — which can be above anything ever issued (the base is a ceiling).
//! CounterGet and every item of BatchGet are answered by the same code (`peek_slot`).
//!
//! Deliberately left out: forwarding to the owner (the client routes) and waiting for the lease
//! wait of a gained section (NOT_READY tells the caller to come back).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use seqsvr_proto::pb::alloc_service_server::AllocService;
use seqsvr_proto::{SectionId, Uid};
use seqsvr_proto::{map_header, pb};
use seqsvr_server::serve_limits::InFlight;
use tonic::{Request, Response, Status};

use crate::error::Error;
use crate::owned::Slot;
use crate::section::{Counter, Next, Peek, prefetch};
use crate::state::AllocState;

/// Longest time a fetch waits for an in-flight bump before answering NOT_READY.
pub const BUMP_WAIT: Duration = Duration::from_millis(500);
/// Most uids in one BatchFetchNextSeq: the shared table's, which the client library splits by.
pub const MAX_BATCH: usize = seqsvr_proto::limits::MAX_UIDS_PER_BATCH;
use seqsvr_proto::limits::MAX_BLOCK;
/// Bound on re-checks while waiting for a bump (each is woken by an ack or an abandon).
const MAX_WAKEUPS: u32 = 8;

/// Outcome of one fetch attempt.
enum Step {
    Served {
        seq: u64,
        owner: pb::Owner,
    },
    NotOwner,
    NotReady,
    /// The ceiling is reached; a bump is in flight on this slot.
    Wait(Arc<Slot>),
    /// The section's sequence space is used up (its `max_seq`).
    Exhausted(SectionId, u64),
}

impl Step {
    /// The error for a uid or key whose section cannot hand out any more numbers.
    fn exhausted(who: Who<'_>, section: SectionId, max_seq: u64) -> Error {
        Error::Exhausted(format!(
            "{who} (section {}) has used up the 64-bit sequence space (max_seq {max_seq}): \
             no further seq can be handed out for it",
            section.0
        ))
    }
}

/// A read's answer: the outcome, the value (0 unless OK) and the owner (when OK).
type Read = (pb::Outcome, u64, Option<pb::Owner>);

/// Whose number a call asks for: a uid, or a counter key at its position in the uid space.
#[derive(Debug, Clone, Copy)]
struct Who<'a> {
    pos: Uid,
    key: Option<&'a str>,
}

impl<'a> Who<'a> {
    fn uid(uid: Uid) -> Self {
        Self { pos: uid, key: None }
    }

    fn counter(&self, section_size: u64) -> Counter<'a> {
        match self.key {
            Some(key) => Counter::Key(key),
            None => Counter::Uid(self.pos.offset(section_size)),
        }
    }
}

impl std::fmt::Display for Who<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.key {
            Some(key) => write!(f, "key {key:?}"),
            None => write!(f, "uid {}", self.pos.0),
        }
    }
}

/// The `AllocService` implementation.
pub struct Service {
    shared: Arc<AllocState>,
}

impl Service {
    pub(crate) fn new(shared: Arc<AllocState>) -> Self {
        Self { shared }
    }

    fn check_uid(&self, uid: u64) -> Result<Uid, Error> {
        let limit = self.shared.params().uid_limit;
        if uid >= limit {
            return Err(Error::InvalidArgument(format!("uid {uid} is outside [0, {limit})")));
        }
        Ok(Uid(uid))
    }

    /// A block's size: 1 to the smaller of [`MAX_BLOCK`] and the set's step (one bump's room).
    fn check_block(&self, count: u32) -> Result<u64, Error> {
        let step = self.shared.params().step;
        let most = step.min(u64::from(MAX_BLOCK));
        let n = u64::from(count);
        if n == 0 || n > most {
            return Err(Error::InvalidArgument(format!(
                "a block needs 1..={most} seqs (the smaller of the limit {MAX_BLOCK} and the set's step {step}), got {count}"
            )));
        }
        Ok(n)
    }

    fn owner(&self, slot: &Slot) -> pb::Owner {
        pb::Owner {
            section: slot.id.0,
            node_id: self.shared.node_id().0,
            incarnation: slot.incarnation.0,
            epoch: slot.epoch.0,
            set_id: self.shared.params().set_id,
        }
    }

    /// The counter key in `bytes` and its place, or INVALID_ARGUMENT naming the rule it broke.
    fn check_key<'k>(&self, bytes: &'k [u8]) -> Result<Who<'k>, Error> {
        let key = seqsvr_proto::keys::check_key(bytes).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        Ok(self.key_who(key))
    }

    /// A key that is a string already (the front ends'): its length checked, not its UTF-8.
    fn check_key_str<'k>(&self, key: &'k str) -> Result<Who<'k>, Error> {
        let key = seqsvr_proto::keys::check_key_str(key).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        Ok(self.key_who(key))
    }

    fn key_who<'k>(&self, key: &'k str) -> Who<'k> {
        Who {
            pos: seqsvr_proto::keys::position(key, self.shared.params().uid_limit),
            key: Some(key),
        }
    }

    /// Takes `n` seqs of `who` (1 for a fetch, more for a block): `Served` names the first.
    fn fetch_once(&self, who: Who<'_>, n: u64) -> Step {
        let size = self.shared.params().section_size;
        let (section, counter) = (who.pos.section(size), who.counter(size));
        let (step, prefetch) = self.shared.owned().with(section, |slot| {
            let Some(slot) = slot else {
                return (Step::NotOwner, None);
            };
            let mut s = slot.section.lock().unwrap();
            let next = s.try_take(counter, n, self.shared.lease_now(), self.shared.owned().lease_until());
            let step = match next {
                Next::Served(seq) => Step::Served {
                    seq,
                    owner: self.owner(slot),
                },
                Next::NeedBump => Step::Wait(slot.clone()),
                Next::Exhausted => return (Step::Exhausted(section, s.max_seq()), None),
                Next::NotReady | Next::LeaseExpired => return (Step::NotReady, None),
            };
            let prefetch = s.maybe_prefetch().map(|_| slot.clone());
            (step, prefetch)
        });
        if let Some(slot) = prefetch {
            self.shared.queue_prefetch(slot);
        }
        step
    }

    /// Fetches one uid, waiting for an in-flight bump until `deadline` at most. A call that waits
    /// gives back its slot of the server's in-flight limit first ([`InFlight::step_out`]): the
    /// limit is kept small to bound the calls competing for the CPU, and a wait for the store uses
    /// none.
    async fn fetch(&self, who: Who<'_>, n: u64, deadline: tokio::time::Instant) -> Step {
        for wakeup in 0..MAX_WAKEUPS {
            let slot = match self.fetch_once(who, n) {
                Step::Wait(slot) => slot,
                other => return other,
            };
            if wakeup == 0 {
                self.shared.metrics().ceiling_waits.increment(1);
            }
            let notified = slot.bumped.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // The bump may have been acknowledged between the first try and `enable`.
            match self.fetch_once(who, n) {
                Step::Wait(_) => {}
                other => return other,
            }
            InFlight::step_out();
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                break;
            }
        }
        Step::NotReady
    }

    /// Serves a batch grouped by section: under one read of the section map, one lock, one clock
    /// read and one lease read per section (ownership rule 7 holds per section), after asking
    /// the CPU for every `cur` slot of the batch at once. Uids whose ceiling is reached are left
    /// in `batch.waiting` (in request order) for [`Self::fetch`], which waits for the bump.
    ///
    /// A uid whose section is exhausted is answered `EXHAUSTED` on its own; the batch's other uids
    /// (some of which already consumed numbers) are answered as usual.
    fn serve_by_section(&self, uids: &[u64], batch: &mut Batch) -> Result<(), Status> {
        let size = self.shared.params().section_size;
        let order = by_section(uids, size);
        let owned = self.shared.owned();
        let mut to_bump = Vec::new();
        {
            let view = owned.view();
            let groups = || order.chunk_by(|a, b| a.0 == b.0);
            let offset = |(section, i): (u64, usize)| (uids[i] - section * size) as usize;
            for group in groups() {
                if let Some(slot) = view.slot(SectionId(group[0].0)) {
                    let addr = slot.cur_addr.load(Ordering::Relaxed);
                    group.iter().for_each(|&p| prefetch(addr, offset(p)));
                }
            }
            for group in groups() {
                let section = SectionId(group[0].0);
                let Some(slot) = view.slot(section) else {
                    group.iter().for_each(|&(_, i)| batch.settle(i, Step::NotOwner));
                    continue;
                };
                let mut s = slot.section.lock().unwrap();
                let (now, lease_until) = (self.shared.lease_now(), owned.lease_until());
                let (mut served, mut waits) = (false, false);
                for &p in group {
                    let i = p.1;
                    match s.try_next(offset(p), now, lease_until) {
                        Next::Served(seq) => {
                            served = true;
                            batch.put(i, pb::Outcome::Ok, seq);
                        }
                        Next::NeedBump => {
                            waits = true;
                            batch.waiting.push(i);
                        }
                        Next::NotReady | Next::LeaseExpired => batch.settle(i, Step::NotReady),
                        Next::Exhausted => batch.settle(i, Step::Exhausted(section, s.max_seq())),
                    }
                }
                // Groups are distinct sections, so their owners are distinct: no scan.
                if served {
                    batch.name_new_owner(self.owner(slot));
                    slot.cur_addr.store(s.cur_addr(), Ordering::Relaxed);
                }
                if (served || waits) && s.maybe_prefetch().is_some() {
                    to_bump.push(slot.clone());
                }
            }
        }
        to_bump.into_iter().for_each(|slot| self.shared.queue_prefetch(slot));
        batch.waiting.sort_unstable();
        Ok(())
    }

    /// Serves a batch of keys in request order under one read of the section map (a lookup of the
    /// map per key was the largest cost of `CounterBatch` in a profile), one lock, clock read and
    /// lease read per key (rule 7). Keys whose ceiling is reached are left in `batch.waiting`; a
    /// later occurrence of such a key waits too, so that a repeated key still gets increasing
    /// values in request order even if the bump lands in between.
    fn serve_keys(&self, whos: &[Who<'_>], batch: &mut Batch) {
        let size = self.shared.params().section_size;
        let owned = self.shared.owned();
        let mut waiting_keys: std::collections::HashSet<&str> = std::collections::HashSet::new();
        let mut to_bump = Vec::new();
        {
            let view = owned.view();
            for (i, who) in whos.iter().enumerate() {
                let key = who.key.unwrap_or_default();
                if waiting_keys.contains(&key) {
                    batch.waiting.push(i);
                    continue;
                }
                let section = who.pos.section(size);
                let Some(slot) = view.slot(section) else {
                    batch.settle(i, Step::NotOwner);
                    continue;
                };
                let mut s = slot.section.lock().unwrap();
                match s.try_take(who.counter(size), 1, self.shared.lease_now(), owned.lease_until()) {
                    Next::Served(seq) => batch.settle(
                        i,
                        Step::Served {
                            seq,
                            owner: self.owner(slot),
                        },
                    ),
                    Next::NeedBump => {
                        waiting_keys.insert(key);
                        batch.waiting.push(i);
                    }
                    Next::NotReady | Next::LeaseExpired => batch.settle(i, Step::NotReady),
                    Next::Exhausted => batch.settle(i, Step::Exhausted(section, s.max_seq())),
                }
                if s.maybe_prefetch().is_some() {
                    to_bump.push(slot.clone());
                }
            }
        }
        to_bump.into_iter().for_each(|slot| self.shared.queue_prefetch(slot));
    }

    /// A front end's take of `n` numbers of `uid` or `key`, answered from memory when this node
    /// can at once: the section is held, ready and below its ceiling, and `may_answer` (the
    /// front end's cluster map) lets this node's set answer for it. `None` sends the call the
    /// long way, through the client library, which waits for a bump, forwards, or refuses with
    /// the reason, as for any caller; so does input this path does not check in full.
    pub(crate) fn take_now(
        &self,
        uid: u64,
        key: Option<&str>,
        n: u32,
        may_answer: impl FnOnce(SectionId) -> bool,
    ) -> Option<Result<(u64, pb::Owner), Error>> {
        let who = self.front_who(uid, key)?;
        let n = self.check_block(n).ok()?;
        if !may_answer(who.pos.section(self.shared.params().section_size)) {
            return None;
        }
        match self.fetch_once(who, n) {
            Step::Served { seq, owner } => {
                let m = self.shared.metrics();
                m.fetch_ok.increment(1);
                if key.is_some() {
                    m.key_seqs.increment(n);
                }
                if n > 1 {
                    m.block_seqs.increment(n);
                }
                Some(Ok((seq, owner)))
            }
            Step::Exhausted(section, max_seq) => Some(Err(Step::exhausted(who, section, max_seq))),
            Step::NotOwner | Step::NotReady | Step::Wait(_) => None,
        }
    }

    /// A front end's read of `uid` or `key` from memory, on the terms of [`Self::take_now`].
    pub(crate) fn current_now(
        &self,
        uid: u64,
        key: Option<&str>,
        may_answer: impl FnOnce(SectionId) -> bool,
    ) -> Option<(u64, pb::Owner)> {
        let who = self.front_who(uid, key)?;
        if !may_answer(who.pos.section(self.shared.params().section_size)) {
            return None;
        }
        match self.peek(who) {
            (pb::Outcome::Ok, value, Some(owner)) => Some((value, owner)),
            _ => None,
        }
    }

    fn front_who<'k>(&self, uid: u64, key: Option<&'k str>) -> Option<Who<'k>> {
        match key {
            Some(k) => self.check_key_str(k).ok(),
            None => self.check_uid(uid).ok().map(Who::uid),
        }
    }

    /// One metrics increment per outcome kind of a batch, not one per uid.
    fn count_batch(&self, batch: &Batch) {
        let m = self.shared.metrics();
        let ok = batch.outcomes.iter().filter(|&&o| o == pb::Outcome::Ok as i32).count();
        let not_owner = batch
            .outcomes
            .iter()
            .filter(|&&o| o == pb::Outcome::NotOwner as i32)
            .count();
        m.fetch_ok.increment(ok as u64);
        m.fetch_not_owner.increment(not_owner as u64);
        m.fetch_not_ready
            .increment((batch.outcomes.len() - ok - not_owner) as u64);
    }

    /// One FetchNextSeq (`n` = 1) or Reserve: waits for a bump until [`BUMP_WAIT`], counts the
    /// outcome, and gives the reply's outcome, first seq (0 unless OK) and owner; an exhausted
    /// section is RESOURCE_EXHAUSTED.
    async fn take(&self, who: Who<'_>, n: u64) -> Result<(pb::Outcome, u64, Option<pb::Owner>), Status> {
        let step = self.fetch(who, n, tokio::time::Instant::now() + BUMP_WAIT).await;
        self.count(&step);
        Ok(match step {
            Step::Served { seq, owner } => (pb::Outcome::Ok, seq, Some(owner)),
            Step::NotOwner => (pb::Outcome::NotOwner, 0, None),
            Step::NotReady | Step::Wait(_) => (pb::Outcome::NotReady, 0, None),
            Step::Exhausted(section, max_seq) => return Err(Step::exhausted(who, section, max_seq).into()),
        })
    }

    /// `cur_seq` of `who` (P5): the outcome, the value and the owner.
    fn peek(&self, who: Who<'_>) -> Read {
        let section = who.pos.section(self.shared.params().section_size);
        self.shared.owned().with(section, |slot| self.peek_slot(slot, who))
    }

    /// [`Self::peek`] of `who` in `slot`, the section map's entry for its section, looked up by
    /// the caller: a batch looks every item up under one read of the map.
    fn peek_slot(&self, slot: Option<&Arc<Slot>>, who: Who<'_>) -> Read {
        let Some(slot) = slot else {
            return (pb::Outcome::NotOwner, 0, None);
        };
        let counter = who.counter(self.shared.params().section_size);
        let s = slot.section.lock().unwrap();
        match s.cur_seq(counter, self.shared.lease_now(), self.shared.owned().lease_until()) {
            Peek::Value(v) => (pb::Outcome::Ok, v, Some(self.owner(slot))),
            Peek::NotReady | Peek::LeaseExpired => (pb::Outcome::NotReady, 0, None),
        }
    }

    /// Reads every item of a batch as [`Self::peek`] does, under one read of the section map
    /// (as `serve_keys`, whose profile showed a lookup of the map per item to cost the most):
    /// one lock, clock read and lease read per item.
    fn peek_each(&self, whos: &[Who<'_>], batch: &mut Batch) {
        let size = self.shared.params().section_size;
        let view = self.shared.owned().view();
        for (i, &who) in whos.iter().enumerate() {
            batch.read(i, self.peek_slot(view.slot(who.pos.section(size)), who));
        }
    }

    /// A counter call's reply around its outcome, value and owner.
    fn counter_reply(
        &self,
        (map_version, map): (u64, Option<pb::ClusterMap>),
        caller_routes: u64,
        (outcome, value, owner): (pb::Outcome, u64, Option<pb::Owner>),
    ) -> pb::CounterReply {
        let (route_version, routes) = self.shared.routes_for(caller_routes, outcome == pb::Outcome::NotOwner);
        pb::CounterReply {
            outcome: outcome as i32,
            value,
            route_version,
            routes,
            owner,
            map_version,
            map,
        }
    }

    fn count(&self, step: &Step) {
        let m = self.shared.metrics();
        match step {
            Step::Served { .. } => m.fetch_ok.increment(1),
            Step::NotOwner => m.fetch_not_owner.increment(1),
            Step::NotReady | Step::Wait(_) | Step::Exhausted(..) => m.fetch_not_ready.increment(1),
        }
    }
}

#[tonic::async_trait]
impl AllocService for Service {
    async fn next_ids(&self, request: Request<pb::NextIdsRequest>) -> Result<Response<pb::NextIdsReply>, Status> {
        let reply = crate::ids::service::next_ids(&self.shared, request.into_inner()).await?;
        Ok(Response::new(reply))
    }

    async fn fetch_next_seq(
        &self,
        request: Request<pb::FetchNextSeqRequest>,
    ) -> Result<Response<pb::FetchNextSeqReply>, Status> {
        let (map_version, map) = self.shared.map_for(map_header::read(request.metadata()));
        let req = request.into_inner();
        let uid = self.check_uid(req.uid)?;
        let (outcome, seq, owner) = self.take(Who::uid(uid), 1).await?;
        let (route_version, routes) = self
            .shared
            .routes_for(req.route_version, outcome == pb::Outcome::NotOwner);
        Ok(Response::new(pb::FetchNextSeqReply {
            outcome: outcome as i32,
            seq,
            route_version,
            routes,
            owner,
            map_version,
            map,
        }))
    }

    async fn reserve(&self, request: Request<pb::ReserveRequest>) -> Result<Response<pb::ReserveReply>, Status> {
        let (map_version, map) = self.shared.map_for(map_header::read(request.metadata()));
        let req = request.into_inner();
        let uid = self.check_uid(req.uid)?;
        let n = self.check_block(req.count)?;
        let (outcome, first, owner) = self.take(Who::uid(uid), n).await?;
        if outcome == pb::Outcome::Ok {
            self.shared.metrics().block_seqs.increment(n);
        }
        let (route_version, routes) = self
            .shared
            .routes_for(req.route_version, outcome == pb::Outcome::NotOwner);
        Ok(Response::new(pb::ReserveReply {
            outcome: outcome as i32,
            first,
            route_version,
            routes,
            owner,
            map_version,
            map,
        }))
    }

    async fn counter_next(&self, request: Request<pb::CounterRequest>) -> Result<Response<pb::CounterReply>, Status> {
        let map = self.shared.map_for(map_header::read(request.metadata()));
        let req = request.into_inner();
        let who = self.check_key(&req.key)?;
        no_count(req.count, "CounterNext")?;
        let taken = self.take(who, 1).await?;
        if taken.0 == pb::Outcome::Ok {
            self.shared.metrics().key_seqs.increment(1);
        }
        Ok(Response::new(self.counter_reply(map, req.route_version, taken)))
    }

    async fn counter_reserve(
        &self,
        request: Request<pb::CounterRequest>,
    ) -> Result<Response<pb::CounterReply>, Status> {
        let map = self.shared.map_for(map_header::read(request.metadata()));
        let req = request.into_inner();
        let who = self.check_key(&req.key)?;
        let n = self.check_block(req.count)?;
        let taken = self.take(who, n).await?;
        if taken.0 == pb::Outcome::Ok {
            self.shared.metrics().key_seqs.increment(n);
            self.shared.metrics().block_seqs.increment(n);
        }
        Ok(Response::new(self.counter_reply(map, req.route_version, taken)))
    }

    async fn counter_get(&self, request: Request<pb::CounterRequest>) -> Result<Response<pb::CounterReply>, Status> {
        let map = self.shared.map_for(map_header::read(request.metadata()));
        let req = request.into_inner();
        let who = self.check_key(&req.key)?;
        no_count(req.count, "CounterGet")?;
        let peeked = self.peek(who);
        Ok(Response::new(self.counter_reply(map, req.route_version, peeked)))
    }

    async fn counter_batch(
        &self,
        request: Request<pb::CounterBatchRequest>,
    ) -> Result<Response<pb::CounterBatchReply>, Status> {
        let (map_version, map) = self.shared.map_for(map_header::read(request.metadata()));
        let req = request.into_inner();
        batch_len(req.keys.len(), "keys")?;
        let mut whos = Vec::with_capacity(req.keys.len());
        for (i, key) in req.keys.iter().enumerate() {
            whos.push(
                self.check_key(key)
                    .map_err(|e| Error::InvalidArgument(format!("keys[{i}]: {e}")))?,
            );
        }
        let deadline = tokio::time::Instant::now() + BUMP_WAIT;
        let mut batch = Batch::new(whos.len());
        self.serve_keys(&whos, &mut batch);
        // Keys whose ceiling was reached wait for the bump, in request order, within the batch's
        // one BUMP_WAIT.
        for i in std::mem::take(&mut batch.waiting) {
            let step = self.fetch(whos[i], 1, deadline).await;
            batch.settle(i, step);
        }
        self.count_batch(&batch);
        let ok = batch.outcomes.iter().filter(|&&o| o == pb::Outcome::Ok as i32).count();
        self.shared.metrics().key_seqs.increment(ok as u64);
        let Batch {
            outcomes,
            seqs,
            owners,
            any_not_owner,
            ..
        } = batch;
        let (route_version, routes) = self.shared.routes_for(req.route_version, any_not_owner);
        Ok(Response::new(pb::CounterBatchReply {
            outcomes,
            values: seqs,
            route_version,
            routes,
            owners,
            map_version,
            map,
        }))
    }

    async fn batch_get(&self, request: Request<pb::BatchGetRequest>) -> Result<Response<pb::BatchGetReply>, Status> {
        let (map_version, map) = self.shared.map_for(map_header::read(request.metadata()));
        let req = request.into_inner();
        batch_len(req.uids.len() + req.keys.len(), "uids and keys")?;
        let mut whos = Vec::with_capacity(req.uids.len() + req.keys.len());
        for (i, uid) in req.uids.iter().enumerate() {
            let uid = self
                .check_uid(*uid)
                .map_err(|e| Error::InvalidArgument(format!("uids[{i}]: {e}")))?;
            whos.push(Who::uid(uid));
        }
        for (i, key) in req.keys.iter().enumerate() {
            whos.push(
                self.check_key(key)
                    .map_err(|e| Error::InvalidArgument(format!("keys[{i}]: {e}")))?,
            );
        }
        let mut batch = Batch::new(whos.len());
        self.peek_each(&whos, &mut batch);
        let Batch {
            outcomes,
            seqs,
            owners,
            any_not_owner,
            ..
        } = batch;
        let (route_version, routes) = self.shared.routes_for(req.route_version, any_not_owner);
        Ok(Response::new(pb::BatchGetReply {
            outcomes,
            values: seqs,
            route_version,
            routes,
            owners,
            map_version,
            map,
        }))
    }

    async fn get_cur_seq(
        &self,
        request: Request<pb::GetCurSeqRequest>,
    ) -> Result<Response<pb::GetCurSeqReply>, Status> {
        let (map_version, map) = self.shared.map_for(map_header::read(request.metadata()));
        let req = request.into_inner();
        let uid = self.check_uid(req.uid)?;
        let (outcome, cur_seq, owner) = self.peek(Who::uid(uid));
        let (route_version, routes) = self
            .shared
            .routes_for(req.route_version, outcome == pb::Outcome::NotOwner);
        Ok(Response::new(pb::GetCurSeqReply {
            outcome: outcome as i32,
            cur_seq,
            route_version,
            routes,
            owner,
            map_version,
            map,
        }))
    }

    async fn batch_fetch_next_seq(
        &self,
        request: Request<pb::BatchFetchNextSeqRequest>,
    ) -> Result<Response<pb::BatchFetchNextSeqReply>, Status> {
        let (map_version, map) = self.shared.map_for(map_header::read(request.metadata()));
        let req = request.into_inner();
        batch_len(req.uids.len(), "uids")?;
        for (i, uid) in req.uids.iter().enumerate() {
            self.check_uid(*uid)
                .map_err(|e| Error::InvalidArgument(format!("uids[{i}]: {e}")))?;
        }
        let deadline = tokio::time::Instant::now() + BUMP_WAIT;
        let mut batch = Batch::new(req.uids.len());
        self.serve_by_section(&req.uids, &mut batch)?;
        // Occurrences are served in request order, so a repeated uid gets increasing seqs: once
        // one occurrence waits, every later one of that uid waits too (same `cur_seq`, same
        // ceiling), and the waiting ones are served here in request order.
        for i in std::mem::take(&mut batch.waiting) {
            let uid = req.uids[i];
            let step = self.fetch(Who::uid(Uid(uid)), 1, deadline).await;
            batch.settle(i, step);
        }
        self.count_batch(&batch);
        let Batch {
            outcomes,
            seqs,
            owners,
            any_not_owner,
            ..
        } = batch;
        let (route_version, routes) = self.shared.routes_for(req.route_version, any_not_owner);
        Ok(Response::new(pb::BatchFetchNextSeqReply {
            outcomes,
            seqs,
            route_version,
            routes,
            owners,
            map_version,
            map,
        }))
    }
}

/// A batch's uids as (section, position in the batch), grouped by section in ascending order and
/// in request order within a section, with one division per uid. Sorting one `u64` per uid
/// (section above position) takes std's branchless small sort; the (section, position) pairs it
/// replaced took the general one, and that sort with the divisions around it was 3–4 µs of a
/// batch100 call. Pairs remain for sections too large to share a `u64` with a position.
fn by_section(uids: &[u64], size: u64) -> Vec<(u64, usize)> {
    const POS_BITS: u32 = usize::BITS - MAX_BATCH.leading_zeros();
    let sections: Vec<u64> = uids.iter().map(|u| u / size).collect();
    if uids.len() <= MAX_BATCH && sections.iter().all(|s| s >> (u64::BITS - POS_BITS) == 0) {
        let mut keys: Vec<u64> = (sections.iter().zip(0u64..)).map(|(s, i)| s << POS_BITS | i).collect();
        keys.sort_unstable();
        let pos = (1u64 << POS_BITS) - 1;
        return keys.into_iter().map(|k| (k >> POS_BITS, (k & pos) as usize)).collect();
    }
    let mut pairs: Vec<(u64, usize)> = sections.into_iter().zip(0..).collect();
    pairs.sort_unstable();
    pairs
}

/// A batch holds 1 to [`MAX_BATCH`] uids or keys.
fn batch_len(n: usize, what: &str) -> Result<(), Error> {
    if n == 0 || n > MAX_BATCH {
        return Err(Error::InvalidArgument(format!(
            "a batch needs 1..={MAX_BATCH} {what}, got {n}"
        )));
    }
    Ok(())
}

/// CounterNext and CounterGet take no count: a caller that sends one meant CounterReserve.
fn no_count(count: u32, rpc: &str) -> Result<(), Error> {
    if count != 0 {
        return Err(Error::InvalidArgument(format!(
            "{rpc} takes no count (got {count}): a block of values is CounterReserve"
        )));
    }
    Ok(())
}

/// A batch reply being filled in, by request index.
struct Batch {
    outcomes: Vec<i32>,
    seqs: Vec<u64>,
    owners: Vec<pb::Owner>,
    /// `owners` as a set, made once they are too many to scan for each served item (a batch of
    /// 1,000 keys in as many sections scanned the list for every key: 2.5 million instructions a
    /// call under callgrind, more than the rest of the serving), then kept in step with them.
    named: Option<HashSet<OwnerKey, foldhash::fast::RandomState>>,
    any_not_owner: bool,
    /// Indexes whose uid waits for a bump, in request order.
    waiting: Vec<usize>,
}

/// Every field of an owner: two entries that differ in any of them are two owners.
type OwnerKey = (u64, u64, u64, u64, u64);

fn owner_key(o: &pb::Owner) -> OwnerKey {
    (o.section, o.node_id, o.incarnation, o.epoch, o.set_id)
}

/// Owners a batch scans for a repeat before it keeps them in a set instead (callgrind: a scan of
/// 30 costs less than making and filling the set).
const SCAN_OWNERS: usize = 32;

impl Batch {
    fn new(len: usize) -> Self {
        Self {
            outcomes: vec![pb::Outcome::NotReady as i32; len],
            seqs: vec![0; len],
            owners: Vec::new(),
            named: None,
            any_not_owner: false,
            waiting: Vec::new(),
        }
    }

    fn put(&mut self, i: usize, outcome: pb::Outcome, seq: u64) {
        self.outcomes[i] = outcome as i32;
        self.seqs[i] = seq;
    }

    /// Records the answer for index `i`.
    fn settle(&mut self, i: usize, step: Step) {
        match step {
            Step::Served { seq, owner } => {
                self.put(i, pb::Outcome::Ok, seq);
                self.note_owner(owner);
            }
            Step::NotOwner => {
                self.any_not_owner = true;
                self.put(i, pb::Outcome::NotOwner, 0);
            }
            Step::Exhausted(..) => self.put(i, pb::Outcome::Exhausted, 0),
            Step::NotReady | Step::Wait(_) => self.put(i, pb::Outcome::NotReady, 0),
        }
    }

    /// Records a read's answer for index `i` (a read takes nothing, so it is never EXHAUSTED).
    fn read(&mut self, i: usize, (outcome, value, owner): Read) {
        self.put(i, outcome, value);
        self.any_not_owner |= outcome == pb::Outcome::NotOwner;
        if let Some(owner) = owner {
            self.note_owner(owner);
        }
    }

    /// Adds `owner` to the reply's owners unless the same one is already named, keeping their
    /// order of first appearance. A section can be served under two owners in one batch (dropped
    /// and regained mid-batch, or a new incarnation): each (section, incarnation, epoch) is named,
    /// so that no seq is attributed to the wrong one.
    fn note_owner(&mut self, owner: pb::Owner) {
        if self.named.is_none() && self.owners.len() < SCAN_OWNERS {
            if !self.owners.contains(&owner) {
                self.owners.push(owner);
            }
            return;
        }
        let (owners, items) = (&self.owners, self.outcomes.len());
        let named = self.named.get_or_insert_with(|| {
            // Sized for the most owners the batch can name (one per item): it never grows.
            let mut named = HashSet::with_capacity_and_hasher(items, Default::default());
            named.extend(owners.iter().map(owner_key));
            named
        });
        if named.insert(owner_key(&owner)) {
            self.owners.push(owner);
        }
    }

    /// Adds an owner the caller knows is not named yet (a section's group, each served once).
    fn name_new_owner(&mut self, owner: pb::Owner) {
        if let Some(named) = &mut self.named {
            named.insert(owner_key(&owner));
        }
        self.owners.push(owner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_names_every_owner_of_a_section_it_was_served_under() {
        let owner = |incarnation, epoch| pb::Owner {
            section: 3,
            node_id: 1,
            incarnation,
            epoch,
            set_id: 0,
        };
        let mut batch = Batch::new(0);
        for o in [owner(7, 2), owner(7, 2), owner(7, 3), owner(9, 4)] {
            batch.note_owner(o);
        }
        assert_eq!(batch.owners, vec![owner(7, 2), owner(7, 3), owner(9, 4)]);
    }

    #[test]
    fn a_long_batch_names_each_owner_once_in_order_of_first_appearance() {
        let owner = |section, epoch| pb::Owner {
            section,
            node_id: 1,
            incarnation: 7,
            epoch,
            set_id: 0,
        };
        // Past SCAN_OWNERS the set takes over, including owners named before it was made.
        let distinct: Vec<pb::Owner> = (0..3 * SCAN_OWNERS as u64).map(|s| owner(s, 2)).collect();
        let mut batch = Batch::new(0);
        batch.name_new_owner(distinct[0]);
        for (i, o) in distinct.iter().enumerate().skip(1) {
            batch.note_owner(*o);
            batch.note_owner(distinct[i / 2]);
        }
        batch.note_owner(owner(5, 3));
        batch.name_new_owner(owner(99, 2));
        batch.note_owner(owner(99, 2));
        batch.note_owner(owner(5, 3));
        let mut want = distinct;
        want.extend([owner(5, 3), owner(99, 2)]);
        assert_eq!(batch.owners, want);
    }

    #[test]
    fn a_batch_is_grouped_by_section_in_request_order_within_each() {
        let reference = |uids: &[u64], size: u64| {
            let mut pairs: Vec<(u64, usize)> = uids.iter().map(|u| u / size).zip(0..).collect();
            pairs.sort_by_key(|&(s, _)| s);
            pairs
        };
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for (size, limit) in [(100_000, 6_400_000), (1_000, 50_000), (1, u64::MAX), (7, 1 << 60)] {
            for len in [1, 2, 100, MAX_BATCH] {
                // Repeats included: a small space of uids for some batches.
                let space = if len == 100 { 300 } else { limit };
                let uids: Vec<u64> = (0..len).map(|_| next() % space).collect();
                assert_eq!(
                    by_section(&uids, size),
                    reference(&uids, size),
                    "size {size}, len {len}"
                );
            }
        }
    }
}
