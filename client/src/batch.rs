//! Batch fetch: many uids, split by owner, at most [`MAX_UIDS_PER_RPC`] per `BatchFetchNextSeq`, sent
//! concurrently, reassembled in request order.
//!
//! Each uid keeps its own outcome. A uid whose owner answered NOT_OWNER or NOT_READY goes into the next
//! round (re-split with the newest route table); a uid in an RPC that timed out or lost its reply is
//! marked *maybe taken* and retried, and if no later round gives it a value it ends as
//! [`ClientError::Unknown`]. Rounds are bounded by the deadline and `max_attempts`.
//!
//! Named counters' keys go the same way (`CounterBatch`), routed by their place in the uid space
//! (`seqsvr_proto::keys::position`, under the newest table's uid limit), or sent to a seed while
//! no table or map gave the limit; each answer is checked against its key's place under the
//! view its reply taught. So do reads of uids and
//! keys together (`BatchGet`, see `batch_get`), with a read's rules: 0 is a value, and a lost
//! reply took nothing, so a read that gets no value ends `Failed`, never `Unknown`.
//!
//! Deliberately left out: retrying only the part of a batch that a transport error hit more finely
//! than per RPC — the whole RPC's uids are retried, which is safe because gaps are allowed (P6 counts
//! them as waste only under faults).

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::join_all;
use seqsvr_proto::{Uid, pb};
use tokio::time::Instant;

use crate::client::{AttemptError, Client, Counted, Fetched, Owner, Unsettled};
use crate::error::{ClientError, FailureKind};
use crate::retry::Budget;
use crate::routing::{RouteSet, target_of};
use seqsvr_proto::refusal::Refusal;
use seqsvr_rpc::classify::{Delivery, classify};

/// Most uids in one `BatchFetchNextSeq` RPC: the server's limit, from the shared table.
pub const MAX_UIDS_PER_RPC: usize = seqsvr_proto::limits::MAX_UIDS_PER_BATCH;

/// What one item of a batched read names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Subject<'a> {
    /// A uid's sequence, as [`Client::get_cur_seq`] reads it.
    Uid(Uid),
    /// A named counter, as [`Client::counter_get`] reads it.
    Key(&'a str),
}

/// Most uids in one call of [`Client::batch_fetch`]: bounds the memory and the RPCs of one call.
pub const MAX_UIDS_PER_CALL: usize = 100_000;

/// What one batch asks for: the next value of uids, or of counter keys; or the last value of
/// uids and keys together.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Items<'a> {
    Uids(&'a [Uid]),
    Keys(&'a [&'a str]),
    Reads(&'a [Subject<'a>]),
}

impl Items<'_> {
    /// Whether the batch only reads: a value of 0 is an answer, and no attempt takes a number.
    fn reads(&self) -> bool {
        matches!(self, Items::Reads(_))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn len(&self) -> usize {
        match self {
            Items::Uids(u) => u.len(),
            Items::Keys(k) => k.len(),
            Items::Reads(r) => r.len(),
        }
    }

    /// The uid item `i` is routed by and its answer checked against: a key's position under the
    /// uid limit `routes` know, `None` while they know none (a fresh client: a seed is asked).
    fn place(&self, i: usize, routes: &RouteSet) -> Option<Uid> {
        match self {
            Items::Uids(u) => Some(u[i]),
            Items::Keys(k) => routes.key_place(k[i]),
            Items::Reads(r) => match r[i] {
                Subject::Uid(uid) => Some(uid),
                Subject::Key(key) => routes.key_place(key),
            },
        }
    }

    /// How item `i` reads in an error.
    fn label(&self, i: usize) -> String {
        match self {
            Items::Uids(u) => format!("uid {}", u[i]),
            Items::Keys(k) => format!("key {:?}", k[i]),
            Items::Reads(r) => match r[i] {
                Subject::Uid(uid) => format!("uid {uid}"),
                Subject::Key(key) => format!("key {key:?}"),
            },
        }
    }
}

/// The part of a `BatchFetchNextSeqReply` or `CounterBatchReply` a round reads.
struct BatchReply {
    outcomes: Vec<i32>,
    values: Vec<u64>,
    routes: Option<pb::RouteTable>,
    owners: Vec<pb::Owner>,
    map: Option<pb::ClusterMap>,
}

impl BatchReply {
    /// Why the reply cannot answer a chunk of `items` items (one outcome and one value each).
    fn malformed(&self, addr: &str, items: usize) -> Option<String> {
        (self.outcomes.len() != items || self.values.len() != items).then(|| {
            format!(
                "{addr}: malformed batch reply ({} outcomes, {} values for {items} items)",
                self.outcomes.len(),
                self.values.len(),
            )
        })
    }
}

/// One uid's progress through the rounds.
#[derive(Default)]
struct Slot {
    done: Option<Result<Fetched, ClientError>>,
    state: Unsettled,
}

impl Client {
    /// The next seq of every uid, results in request order. A uid listed twice gets two distinct
    /// seqs, both above every seq of calls that completed before this one; the occurrences of one
    /// call are concurrent requests, so which of them gets the larger seq is not promised.
    ///
    /// All or nothing for the caller: on error no seq is returned. The error is
    /// [`ClientError::Unknown`] when any uid may have consumed a number — including when some uids were
    /// served and others failed, since the call then partly took effect — and `Failed` only when
    /// nothing took effect. Use [`Client::batch_fetch_each`] for per-uid results.
    pub async fn batch_fetch(&self, uids: &[Uid]) -> Result<Vec<Fetched>, ClientError> {
        let results = self.batch_fetch_each(uids).await?;
        let served = results.iter().filter(|r| r.is_ok()).count();
        let mut first_failure = None;
        for r in &results {
            match r {
                Ok(_) => {}
                Err(e @ ClientError::Unknown { .. }) => return Err(e.clone()),
                Err(e) => {
                    first_failure.get_or_insert_with(|| e.clone());
                }
            }
        }
        match first_failure {
            None => Ok(results.into_iter().map(|r| r.expect("checked above")).collect()),
            Some(e) if served == 0 => Err(e),
            Some(e) => Err(ClientError::unknown(format!(
                "{served} of {} uids were served, the others failed: {e}",
                results.len()
            ))),
        }
    }

    /// The next seq of every uid with one result per uid, in request order.
    ///
    /// The outer error is for the call as a whole (oversized input, a uid outside the cached table):
    /// nothing was sent.
    pub async fn batch_fetch_each(&self, uids: &[Uid]) -> Result<Vec<Result<Fetched, ClientError>>, ClientError> {
        if uids.len() > MAX_UIDS_PER_CALL {
            return Err(ClientError::failed(
                FailureKind::InvalidArgument,
                format!("{} uids in one call; at most {MAX_UIDS_PER_CALL}", uids.len()),
            ));
        }
        // Refuse the whole call before anything is sent rather than serve part of it.
        if let Some(limit) = self.routes().uid_limit()
            && let Some(bad) = uids.iter().find(|u| u.0 >= limit)
        {
            return Err(ClientError::failed(
                FailureKind::InvalidArgument,
                format!("uid {bad} is outside [0, {limit})"),
            ));
        }
        let deadline = Instant::now() + self.inner.cfg.deadline;
        Ok(self.batch_fetch_until(Items::Uids(uids), deadline).await)
    }

    /// The next value of every named counter in `keys`, one result per key, in request order
    /// (`CounterBatch`, split by owner like [`Client::batch_fetch_each`]). A key listed twice gets
    /// two distinct values. The outer error is for the call as a whole: nothing was sent.
    pub async fn counter_batch(&self, keys: &[&str]) -> Result<Vec<Result<Counted, ClientError>>, ClientError> {
        if keys.len() > MAX_UIDS_PER_CALL {
            return Err(ClientError::failed(
                FailureKind::InvalidArgument,
                format!("{} keys in one call; at most {MAX_UIDS_PER_CALL}", keys.len()),
            ));
        }
        if let Some(Err(e)) = keys
            .iter()
            .map(|k| seqsvr_proto::keys::check_key_str(k))
            .find(Result::is_err)
        {
            return Err(ClientError::failed(FailureKind::InvalidArgument, e.to_string()));
        }
        let deadline = Instant::now() + self.inner.cfg.deadline;
        let results = self.batch_fetch_until(Items::Keys(keys), deadline).await;
        Ok(results.into_iter().map(|r| r.map(Counted::from)).collect())
    }

    /// The rounds of a batch fetch (or read), ending at `deadline` (used by the coalescer with its
    /// callers' own).
    pub(crate) async fn batch_fetch_until(
        &self,
        items: Items<'_>,
        deadline: Instant,
    ) -> Vec<Result<Fetched, ClientError>> {
        let mut slots: Vec<Slot> = (0..items.len()).map(|_| Slot::default()).collect();
        let mut pending: Vec<usize> = (0..items.len()).collect();
        let mut budget = Budget::until(&self.inner.cfg, deadline);
        while !pending.is_empty() {
            let routes = self.routes();
            let groups = self.group_by_owner(&routes, items, &pending, &mut slots);
            let map_version = routes.map_version_to_send();
            pending.clear();
            if groups.is_empty() {
                break;
            }
            let Some(timeout) = budget.start_attempt(Instant::now()) else {
                pending = groups.into_values().flat_map(|(_, idx)| idx).collect();
                break;
            };
            // Owners are asked concurrently, but the RPCs of one owner one after another: every
            // occurrence of a uid goes to the same owner, so repeated uids get increasing seqs in
            // request order even when they span several RPCs.
            let per_owner = groups.iter().map(|(addr, (version, idx))| async move {
                let mut out = Vec::new();
                for chunk in idx.chunks(MAX_UIDS_PER_RPC) {
                    out.push((
                        *addr,
                        chunk,
                        self.send_batch(addr, items, chunk, (*version, map_version), timeout)
                            .await,
                    ));
                }
                out
            });
            let mut round = Round::default();
            let mut unreachable: Vec<&str> = Vec::new();
            for (addr, chunk, result) in join_all(per_owner).await.into_iter().flatten() {
                if result.is_err() && !unreachable.contains(&addr) {
                    unreachable.push(addr);
                }
                match result {
                    Ok(reply) => self.on_reply(addr, items, chunk, reply, &mut slots, &mut round),
                    Err(e) => round.on_failed_attempt(addr, (chunk, !items.reads()), e, timeout, &mut slots),
                }
            }
            // Every owner asked answered (not ready, not the owner): a short transition, retried soon.
            let answered = unreachable.is_empty();
            // An owner that cannot be reached may be dead: its sections may have moved.
            for addr in unreachable {
                round.rerouted |= self.learn_routes_elsewhere(addr, timeout).await;
            }
            pending = round.pending;
            if !pending.is_empty() && (round.wait || !round.rerouted) {
                self.back_off(&mut budget, answered).await;
            }
        }
        for i in pending {
            slots[i].done = Some(Err(
                std::mem::take(&mut slots[i].state).into_error(FailureKind::Unavailable)
            ));
        }
        slots
            .into_iter()
            .map(|s| s.done.expect("every uid is settled when the rounds end"))
            .collect()
    }

    /// The pending uids by owner address, with the route version of the owner's set; a uid with
    /// no owner to ask is settled as refused.
    fn group_by_owner<'a>(
        &'a self,
        routes: &'a RouteSet,
        items: Items<'_>,
        pending: &[usize],
        slots: &mut [Slot],
    ) -> BTreeMap<&'a str, (u64, Vec<usize>)> {
        // Ordered, so that the RPCs go out in the same order every time (the deterministic
        // simulator replays a seed bit for bit); a batch spans a few owners, so this costs nothing.
        let mut groups: BTreeMap<&str, (u64, Vec<usize>)> = BTreeMap::new();
        for &i in pending {
            match target_of(routes, items.place(i, routes), &self.inner.seeds, |n| {
                self.random_index(n)
            }) {
                Ok(t) => groups.entry(t.addr).or_insert((t.version, Vec::new())).1.push(i),
                Err(e) => slots[i].done = Some(Err(settle_refused(&slots[i].state, e))),
            }
        }
        groups
    }

    /// Settles the uids of `chunk` from an owner's reply, or puts them back for the next round.
    fn on_reply(
        &self,
        addr: &str,
        items: Items<'_>,
        chunk: &[usize],
        mut reply: BatchReply,
        slots: &mut [Slot],
        round: &mut Round,
    ) {
        round.rerouted |= self.inner.routes.offer_map(reply.map.as_ref());
        round.rerouted |= self.inner.routes.offer(reply.routes.take());
        if let Some(why) = reply.malformed(addr, chunk.len()) {
            round.retry_maybe_taken((chunk, !items.reads()), &why, slots);
            return;
        }
        // Read after the reply was learnt from: a fresh client places its keys only now, and each
        // answer is checked against its own item's section.
        let routes = self.routes();
        let owners = OwnerIndex::new(&reply.owners, routes.section_size());
        for (k, &i) in chunk.iter().enumerate() {
            let (place, seq) = (items.place(i, &routes), reply.values[k]);
            // Only a refusal names its item: formatting it for every served one cost about a
            // percent of a coalescing caller's CPU (perf, counter-bench).
            let what = || items.label(i);
            let state = &mut slots[i].state;
            match pb::Outcome::try_from(reply.outcomes[k]).unwrap_or(pb::Outcome::Unspecified) {
                pb::Outcome::Ok if seq != 0 || items.reads() => {
                    let why = match place {
                        Some(uid) => {
                            let (owner, raw) = owners.find(uid);
                            let Some(why) = Self::refused_answer(&routes, uid, raw) else {
                                slots[i].done = Some(Ok(Fetched { uid, seq, owner }));
                                continue;
                            };
                            why
                        }
                        // Only a server with no table leaves a fresh client without one; it owns
                        // nothing, so its answer breaks the contract.
                        None => format!("answered for {} but sent no route table", what()),
                    };
                    // Not from a set the map allows: the number is lost, the uid asked again.
                    state.maybe_taken |= !items.reads();
                    state.last = format!("{addr}: {why}");
                    round.wait = true;
                }
                pb::Outcome::Exhausted => {
                    // Final for this uid alone: its section can never serve it again.
                    let why = format!("{addr}: {}'s section has used up its sequence space", what());
                    slots[i].done = Some(Err(ClientError::failed(FailureKind::Exhausted, why)));
                    continue;
                }
                pb::Outcome::NotOwner => state.last = format!("{addr}: not the owner of {}", what()),
                pb::Outcome::NotReady => {
                    state.last = format!("{addr}: owner of {} is not ready", what());
                    round.wait = true;
                }
                pb::Outcome::Ok | pb::Outcome::Unspecified => {
                    state.maybe_taken |= !items.reads();
                    state.last = format!("{addr}: malformed outcome for {}", what());
                    round.wait = true;
                }
            }
            round.pending.push(i);
        }
    }

    async fn send_batch(
        &self,
        addr: &str,
        items: Items<'_>,
        chunk: &[usize],
        (route_version, map_version): (u64, u64),
        timeout: Duration,
    ) -> Result<BatchReply, AttemptError> {
        let mut client = self.client_for(addr).map_err(AttemptError::Status)?;
        let call = async {
            match items {
                Items::Uids(uids) => {
                    let uids = chunk.iter().map(|&i| uids[i].0).collect();
                    let mut req = tonic::Request::new(pb::BatchFetchNextSeqRequest { uids, route_version });
                    req.set_timeout(timeout);
                    seqsvr_proto::map_header::write(req.metadata_mut(), map_version);
                    client.batch_fetch_next_seq(req).await.map(|r| {
                        let r = r.into_inner();
                        BatchReply {
                            outcomes: r.outcomes,
                            values: r.seqs,
                            routes: r.routes,
                            owners: r.owners,
                            map: r.map,
                        }
                    })
                }
                Items::Reads(subjects) => {
                    let (req, order) = read_request(subjects, chunk, route_version);
                    let mut req = tonic::Request::new(req);
                    req.set_timeout(timeout);
                    seqsvr_proto::map_header::write(req.metadata_mut(), map_version);
                    client.batch_get(req).await.map(|r| {
                        let r = r.into_inner();
                        BatchReply {
                            outcomes: in_chunk_order(&order, r.outcomes),
                            values: in_chunk_order(&order, r.values),
                            routes: r.routes,
                            owners: r.owners,
                            map: r.map,
                        }
                    })
                }
                Items::Keys(keys) => {
                    let keys = chunk.iter().map(|&i| keys[i].as_bytes().to_vec()).collect();
                    let mut req = tonic::Request::new(pb::CounterBatchRequest { keys, route_version });
                    req.set_timeout(timeout);
                    seqsvr_proto::map_header::write(req.metadata_mut(), map_version);
                    client.counter_batch(req).await.map(|r| {
                        let r = r.into_inner();
                        BatchReply {
                            outcomes: r.outcomes,
                            values: r.values,
                            routes: r.routes,
                            owners: r.owners,
                            map: r.map,
                        }
                    })
                }
            }
        };
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(status)) => Err(AttemptError::Status(status)),
            Err(_) => Err(AttemptError::TimedOut),
        }
    }
}

/// The `BatchGet` of `chunk`'s subjects, uids and keys in two lists, and where each of the reply's
/// answers (the uids' first, then the keys') belongs in the chunk.
fn read_request(subjects: &[Subject<'_>], chunk: &[usize], route_version: u64) -> (pb::BatchGetRequest, Vec<usize>) {
    let mut req = pb::BatchGetRequest {
        route_version,
        ..Default::default()
    };
    let (mut uid_at, mut key_at) = (Vec::new(), Vec::new());
    for (k, &i) in chunk.iter().enumerate() {
        match subjects[i] {
            Subject::Uid(uid) => {
                req.uids.push(uid.0);
                uid_at.push(k);
            }
            Subject::Key(key) => {
                req.keys.push(key.as_bytes().to_vec());
                key_at.push(k);
            }
        }
    }
    uid_at.extend(key_at);
    (req, uid_at)
}

/// A `BatchGet` reply's list in the chunk's order; one of the wrong length is left as it is, for
/// [`Client::on_reply`] to refuse as malformed.
fn in_chunk_order<T: Copy + Default>(order: &[usize], answers: Vec<T>) -> Vec<T> {
    if answers.len() != order.len() {
        return answers;
    }
    let mut out = vec![T::default(); answers.len()];
    for (&k, a) in order.iter().zip(answers) {
        out[k] = a;
    }
    out
}

/// A uid refused before sending (outside the table): unknown if an earlier round may have served it.
fn settle_refused(state: &Unsettled, e: ClientError) -> ClientError {
    if state.maybe_taken {
        ClientError::unknown(format!("{}; earlier: {}", e, state.last))
    } else {
        e
    }
}

/// The owners of one batch reply, by section: sorted once and searched, not hashed (a reply names
/// at most one owner per item, and a hash map cost more to build than the lookups it saved).
struct OwnerIndex<'a> {
    /// By section; stable-sorted, so that among entries of one section the reply's last wins.
    by_section: Vec<(u64, &'a pb::Owner)>,
    section_size: Option<u64>,
}

impl<'a> OwnerIndex<'a> {
    fn new(owners: &'a [pb::Owner], section_size: Option<u64>) -> Self {
        let mut by_section: Vec<(u64, &pb::Owner)> = owners.iter().map(|o| (o.section, o)).collect();
        by_section.sort_by_key(|(section, _)| *section);
        Self {
            by_section,
            section_size,
        }
    }

    /// The owner named for `uid`'s section, as the caller sees it and as sent.
    fn find(&self, uid: Uid) -> (Option<Owner>, Option<&'a pb::Owner>) {
        let Some(size) = self.section_size.filter(|&s| s > 0) else {
            return (None, None);
        };
        let section = uid.section(size).0;
        let end = self.by_section.partition_point(|(s, _)| *s <= section);
        let raw = end
            .checked_sub(1)
            .map(|i| self.by_section[i])
            .filter(|(s, _)| *s == section)
            .map(|(_, o)| o);
        (raw.map(Owner::from), raw)
    }
}

/// What one round of a batch fetch leaves for the next.
#[derive(Default)]
struct Round {
    /// Uids to ask again.
    pending: Vec<usize>,
    /// Back off before the next round (a failure or NOT_READY, not just a moved owner).
    wait: bool,
    /// A newer route table arrived: moved uids can be resent at once.
    rerouted: bool,
}

impl Round {
    /// An attempt that produced no reply: retried, and settled as unknown or failed at the end.
    /// `consumes`: whether the attempt could have taken numbers (false for a read).
    fn on_failed_attempt(
        &mut self,
        addr: &str,
        (chunk, consumes): (&[usize], bool),
        e: AttemptError,
        timeout: Duration,
        slots: &mut [Slot],
    ) {
        self.wait = true;
        let s = match e {
            AttemptError::TimedOut => {
                let why = format!("{addr}: attempt timed out after {timeout:?}");
                self.retry_maybe_taken((chunk, consumes), &why, slots);
                return;
            }
            AttemptError::Status(s) => s,
        };
        let verdict = classify(&s);
        for &i in chunk {
            let state = &mut slots[i].state;
            state.maybe_taken |= consumes && verdict.delivery == Delivery::Maybe;
            state.last = format!("{addr}: {}: {}", s.code(), s.message());
            if verdict.invalid_argument {
                slots[i].done = Some(Err(std::mem::take(state).into_error(FailureKind::InvalidArgument)));
            } else if verdict.refusal == Some(Refusal::Exhausted) {
                slots[i].done = Some(Err(std::mem::take(state).into_error(FailureKind::Exhausted)));
            } else if !verdict.retry {
                slots[i].done = Some(Err(std::mem::take(state).into_error(FailureKind::Unavailable)));
            } else {
                self.pending.push(i);
            }
        }
    }

    /// Retries `chunk` after an attempt that may have taken effect (taken numbers, if it
    /// `consumes`).
    fn retry_maybe_taken(&mut self, (chunk, consumes): (&[usize], bool), why: &str, slots: &mut [Slot]) {
        for &i in chunk {
            slots[i].state.maybe_taken |= consumes;
            slots[i].state.last = why.to_string();
        }
        self.pending.extend_from_slice(chunk);
        self.wait = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(section: u64, epoch: u64) -> pb::Owner {
        pb::Owner {
            section,
            node_id: 1,
            incarnation: 1,
            epoch,
            set_id: 0,
        }
    }

    #[test]
    fn an_owner_is_found_by_its_uids_section_and_the_replys_last_entry_of_a_section_wins() {
        let owners = [owner(7, 1), owner(2, 1), owner(7, 3), owner(5, 1)];
        let index = OwnerIndex::new(&owners, Some(100));
        let epoch = |uid| index.find(Uid(uid)).0.map(|o| o.epoch.0);
        assert_eq!(epoch(205), Some(1));
        assert_eq!(epoch(799), Some(3), "two entries of section 7: the later one");
        assert_eq!(epoch(500), Some(1));
        assert_eq!(epoch(0), None, "section 0 is not named");
        assert_eq!(epoch(650), None, "between named sections");
        assert_eq!(epoch(900), None, "above every named section");
        let unsized_index = OwnerIndex::new(&owners, None);
        assert_eq!(unsized_index.find(Uid(205)), (None, None), "no section size: no owner");
    }
}
