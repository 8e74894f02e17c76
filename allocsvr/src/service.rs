//! The data plane: `AllocService` (FetchNextSeq, GetCurSeq, BatchFetchNextSeq).
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
//!
//! Deliberately left out: forwarding to the owner (the client routes) and waiting for the lease
//! wait of a gained section (NOT_READY tells the caller to come back).

use std::sync::Arc;
use std::time::Duration;

use seqsvr_proto::pb::alloc_service_server::AllocService;
use seqsvr_proto::{SectionId, Uid};
use seqsvr_proto::{map_header, pb};
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use crate::error::Error;
use crate::owned::Slot;
use crate::section::{Next, Peek};
use crate::shared::Shared;

/// Longest time a fetch waits for an in-flight bump before answering NOT_READY.
pub const BUMP_WAIT: Duration = Duration::from_millis(500);
/// Most uids in one BatchFetchNextSeq: the shared table's, which the client library splits by.
pub const MAX_BATCH: usize = seqsvr_proto::limits::MAX_UIDS_PER_BATCH;
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
    /// The error for a uid whose section cannot hand out any more numbers.
    fn exhausted(uid: Uid, section: SectionId, max_seq: u64) -> Error {
        Error::Exhausted(format!(
            "uid {} (section {}) has used up the 64-bit sequence space (max_seq {max_seq}): \
             no further seq can be handed out for it",
            uid.0, section.0
        ))
    }
}

/// The `AllocService` implementation.
pub struct Service {
    shared: Arc<Shared>,
}

impl Service {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    fn check_uid(&self, uid: u64) -> Result<Uid, Error> {
        let limit = self.shared.params().uid_limit;
        if uid >= limit {
            return Err(Error::InvalidArgument(format!("uid {uid} is outside [0, {limit})")));
        }
        Ok(Uid(uid))
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

    fn fetch_once(&self, uid: Uid) -> Step {
        let size = self.shared.params().section_size;
        let (section, offset) = (uid.section(size), uid.offset(size));
        let (step, prefetch) = self.shared.owned().with(section, |slot| {
            let Some(slot) = slot else {
                return (Step::NotOwner, None);
            };
            let mut s = slot.section.lock().unwrap();
            let now = Instant::now();
            let next = s.try_next(offset, now, self.shared.owned().lease_until());
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

    /// Fetches one uid, waiting for an in-flight bump until `deadline` at most.
    async fn fetch(&self, uid: Uid, deadline: tokio::time::Instant) -> Step {
        for _ in 0..MAX_WAKEUPS {
            let slot = match self.fetch_once(uid) {
                Step::Wait(slot) => slot,
                other => return other,
            };
            let notified = slot.bumped.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // The bump may have been acknowledged between the first try and `enable`.
            match self.fetch_once(uid) {
                Step::Wait(_) => {}
                other => return other,
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                break;
            }
        }
        Step::NotReady
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
    async fn fetch_next_seq(
        &self,
        request: Request<pb::FetchNextSeqRequest>,
    ) -> Result<Response<pb::FetchNextSeqReply>, Status> {
        let (map_version, map) = self.shared.map_for(map_header::read(request.metadata()));
        let req = request.into_inner();
        let uid = self.check_uid(req.uid)?;
        let step = self.fetch(uid, tokio::time::Instant::now() + BUMP_WAIT).await;
        self.count(&step);
        let (outcome, seq, owner) = match step {
            Step::Served { seq, owner } => (pb::Outcome::Ok, seq, Some(owner)),
            Step::NotOwner => (pb::Outcome::NotOwner, 0, None),
            Step::NotReady | Step::Wait(_) => (pb::Outcome::NotReady, 0, None),
            Step::Exhausted(section, max_seq) => return Err(Step::exhausted(uid, section, max_seq).into()),
        };
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

    async fn get_cur_seq(
        &self,
        request: Request<pb::GetCurSeqRequest>,
    ) -> Result<Response<pb::GetCurSeqReply>, Status> {
        let (map_version, map) = self.shared.map_for(map_header::read(request.metadata()));
        let req = request.into_inner();
        let uid = self.check_uid(req.uid)?;
        let size = self.shared.params().section_size;
        let (section, offset) = (uid.section(size), uid.offset(size));
        let (outcome, cur_seq, owner) = self.shared.owned().with(section, |slot| {
            let Some(slot) = slot else {
                return (pb::Outcome::NotOwner, 0, None);
            };
            let s = slot.section.lock().unwrap();
            match s.cur_seq(offset, Instant::now(), self.shared.owned().lease_until()) {
                Peek::Value(v) => (pb::Outcome::Ok, v, Some(self.owner(slot))),
                Peek::NotReady | Peek::LeaseExpired => (pb::Outcome::NotReady, 0, None),
            }
        });
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
        if req.uids.is_empty() || req.uids.len() > MAX_BATCH {
            return Err(
                Error::InvalidArgument(format!("a batch needs 1..={MAX_BATCH} uids, got {}", req.uids.len())).into(),
            );
        }
        for (i, uid) in req.uids.iter().enumerate() {
            self.check_uid(*uid)
                .map_err(|e| Error::InvalidArgument(format!("uids[{i}]: {e}")))?;
        }
        let deadline = tokio::time::Instant::now() + BUMP_WAIT;
        let mut outcomes = Vec::with_capacity(req.uids.len());
        let mut seqs = Vec::with_capacity(req.uids.len());
        let mut owners: Vec<pb::Owner> = Vec::new();
        let mut any_not_owner = false;
        // Occurrences are served in request order, so a repeated uid gets increasing seqs.
        for uid in &req.uids {
            let step = self.fetch(Uid(*uid), deadline).await;
            self.count(&step);
            match step {
                Step::Served { seq, owner } => {
                    outcomes.push(pb::Outcome::Ok as i32);
                    seqs.push(seq);
                    note_owner(&mut owners, owner);
                }
                Step::NotOwner => {
                    any_not_owner = true;
                    outcomes.push(pb::Outcome::NotOwner as i32);
                    seqs.push(0);
                }
                Step::NotReady | Step::Wait(_) => {
                    outcomes.push(pb::Outcome::NotReady as i32);
                    seqs.push(0);
                }
                // Numbers already taken by earlier uids of this batch are lost (gaps are
                // allowed); the caller must hear that this uid can never be served.
                Step::Exhausted(section, max_seq) => {
                    return Err(Step::exhausted(Uid(*uid), section, max_seq).into());
                }
            }
        }
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

/// Adds `owner` to a batch reply's owners unless the same one is already named. A section can be
/// served under two owners in one batch (dropped and regained mid-batch, or a new incarnation):
/// each (section, incarnation, epoch) is named, so that no seq is attributed to the wrong one.
fn note_owner(owners: &mut Vec<pb::Owner>, owner: pb::Owner) {
    if !owners.contains(&owner) {
        owners.push(owner);
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
        let mut owners = Vec::new();
        for o in [owner(7, 2), owner(7, 2), owner(7, 3), owner(9, 4)] {
            note_owner(&mut owners, o);
        }
        assert_eq!(owners, vec![owner(7, 2), owner(7, 3), owner(9, 4)]);
    }
}
