//! The data plane: `AllocService`, the gRPC calls that take and read sequence numbers of uids and
//! of named counters' keys, and `NextIds`.
//!
//! Every call but `NextIds` goes one way, written once in `reply`: the cluster map the caller's
//! `seqsvr-map-version` header asks for is read; the call's own function checks the request and
//! serves it from memory; its answers go out with the node's route version (the table too when the
//! caller's is older, and always with NOT_OWNER), its map version (the map too when the caller's
//! header names an older one: an atomic load and a compare otherwise, no lock on the steady-state
//! path), and `owner` (section, node, incarnation, epoch, set) for each answer served, so that
//! callers and the simulator can check P4. A refusal (a bad request, an exhausted section) is the
//! call's status instead, by `Error`'s one mapping to it. `NextIds` shares none of that: any
//! AllocSvr that holds an id slot answers, with no routes (`crate::ids::service`).
//!
//! The calls, by what they do to a number (the `AllocService` impl below is the index):
//! - `seqs`: FetchNextSeq, Reserve, BatchFetchNextSeq: takes of uids.
//! - `counters`: CounterNext, CounterReserve, CounterBatch: takes of counter keys.
//! - `reads`: GetCurSeq, CounterGet, BatchGet: reads of uids and keys alike (P5).
//!
//! A take may wait for a bump and a read never does, so that is the line between the files;
//! CounterGet, a read, is in `reads` with the others. What they share:
//! - `check`: the request's rules (uid range, key rules and the key's place, block and batch
//!   sizes) and `Who`, the uid or key a call asks about.
//! - `take`: one take of a uid or key from memory, waiting for an in-flight bump.
//! - `batch`: a batch's answers filled in by request index, each owner named once; a batch of
//!   takes' wait for its bumps.
//! - `reply`: the way every call goes (above), the reply types and the owner fields.
//! - `now`: the front ends' takes and reads from memory, answered at once or not at all
//!   (`crate::front`).
//!
//! Deliberately left out: forwarding to the owner (the client routes) and waiting for the lease
//! wait of a gained section (NOT_READY tells the caller to come back).

mod batch;
mod check;
mod counters;
mod now;
mod reads;
mod reply;
mod seqs;
mod take;

use std::sync::Arc;
use std::time::Duration;

use seqsvr_proto::pb;
use seqsvr_proto::pb::alloc_service_server::AllocService;
use tonic::{Request, Response, Status};

use crate::state::AllocState;

/// Longest time a fetch waits for an in-flight bump before answering NOT_READY.
pub const BUMP_WAIT: Duration = Duration::from_millis(500);
/// Most uids in one BatchFetchNextSeq: the shared table's, which the client library splits by.
pub const MAX_BATCH: usize = seqsvr_proto::limits::MAX_UIDS_PER_BATCH;

/// The `AllocService` implementation.
pub struct Service {
    shared: Arc<AllocState>,
}

impl Service {
    pub(crate) fn new(shared: Arc<AllocState>) -> Self {
        Self { shared }
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
        self.answer(request, seqs::fetch_next_seq).await
    }

    async fn reserve(&self, request: Request<pb::ReserveRequest>) -> Result<Response<pb::ReserveReply>, Status> {
        self.answer(request, seqs::reserve).await
    }

    async fn batch_fetch_next_seq(
        &self,
        request: Request<pb::BatchFetchNextSeqRequest>,
    ) -> Result<Response<pb::BatchFetchNextSeqReply>, Status> {
        self.answer(request, seqs::batch_fetch_next_seq).await
    }

    async fn counter_next(&self, request: Request<pb::CounterRequest>) -> Result<Response<pb::CounterReply>, Status> {
        self.answer(request, counters::counter_next).await
    }

    async fn counter_reserve(
        &self,
        request: Request<pb::CounterRequest>,
    ) -> Result<Response<pb::CounterReply>, Status> {
        self.answer(request, counters::counter_reserve).await
    }

    async fn counter_batch(
        &self,
        request: Request<pb::CounterBatchRequest>,
    ) -> Result<Response<pb::CounterBatchReply>, Status> {
        self.answer(request, counters::counter_batch).await
    }

    async fn get_cur_seq(
        &self,
        request: Request<pb::GetCurSeqRequest>,
    ) -> Result<Response<pb::GetCurSeqReply>, Status> {
        self.answer(request, reads::get_cur_seq).await
    }

    async fn counter_get(&self, request: Request<pb::CounterRequest>) -> Result<Response<pb::CounterReply>, Status> {
        self.answer(request, reads::counter_get).await
    }

    async fn batch_get(&self, request: Request<pb::BatchGetRequest>) -> Result<Response<pb::BatchGetReply>, Status> {
        self.answer(request, reads::batch_get).await
    }
}
