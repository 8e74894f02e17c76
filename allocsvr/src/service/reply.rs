//! The way every data-plane call but `NextIds` goes, written once ([`Service::answer`]): the
//! cluster map for the reply, the call's own function, then the answers wrapped with the route
//! and map versions, the table and the map when they are due; a refusal is the call's status.
//!
//! A call's function answers with one [`Answer`] (a take or a read) or a batch's [`Answers`]; the
//! reply types are filled from those here, by two macros, because they differ only in the names
//! of their value fields (`seq`, `first`, `cur_seq`, `value`; `seqs`, `values`). The owner of a
//! served answer is [`Service::owner`].
//!
//! Left out: the request's checks (`check`) and serving (the calls' files).

use seqsvr_proto::{map_header, pb};
use tonic::{Request, Response, Status};

use super::Service;
use crate::error::Error;
use crate::owned::Slot;

/// One take's or read's answer: the outcome, the value (0 unless OK) and the owner (when OK).
pub(super) type Answer = (pb::Outcome, u64, Option<pb::Owner>);

/// A batch's answers by request index, and the owners they were served under, each named once.
pub(super) struct Answers {
    pub(super) outcomes: Vec<i32>,
    pub(super) values: Vec<u64>,
    pub(super) owners: Vec<pb::Owner>,
    /// Whether any item was answered NOT_OWNER.
    pub(super) any_not_owner: bool,
}

/// What every reply carries besides its answers.
pub(super) struct Tail {
    route_version: u64,
    routes: Option<pb::RouteTable>,
    map_version: u64,
    map: Option<pb::ClusterMap>,
}

/// A request of the data plane: the reply it gets, and the route version the caller holds.
pub(super) trait Call {
    type Reply: Reply;
    fn route_version(&self) -> u64;
}

/// A reply, made of its answers (`Body`) and the [`Tail`].
pub(super) trait Reply {
    type Body;
    /// Whether any answer is NOT_OWNER: the route table then goes along whatever the caller holds.
    fn not_owner(body: &Self::Body) -> bool;
    fn assemble(body: Self::Body, tail: Tail) -> Self;
}

impl Service {
    /// Answers one call: reads the cluster map the caller's `seqsvr-map-version` header asks for,
    /// hands the request to `serve` (which checks it and serves it), and wraps what it answers
    /// with this node's route version (and table when the caller's is older or an answer is
    /// NOT_OWNER) and map version (and map). An error of `serve` is the call's status, with no
    /// routes or map.
    pub(super) async fn answer<'s, Q, F>(
        &'s self,
        request: Request<Q>,
        serve: impl FnOnce(&'s Service, Q) -> F,
    ) -> Result<Response<Q::Reply>, Status>
    where
        Q: Call,
        F: Future<Output = Result<<Q::Reply as Reply>::Body, Error>>,
    {
        let (map_version, map) = self.shared.map_for(map_header::read(request.metadata()));
        let req = request.into_inner();
        let caller_routes = req.route_version();
        let body = serve(self, req).await?;
        // After serving: whether the table must go along depends on the answers.
        let (route_version, routes) = self
            .shared
            .routes_for(caller_routes, <Q::Reply as Reply>::not_owner(&body));
        let tail = Tail {
            route_version,
            routes,
            map_version,
            map,
        };
        Ok(Response::new(<Q::Reply as Reply>::assemble(body, tail)))
    }

    /// The owner a number taken or read from `slot` is attributed to.
    pub(super) fn owner(&self, slot: &Slot) -> pb::Owner {
        pb::Owner {
            section: slot.id.0,
            node_id: self.shared.node_id().0,
            incarnation: slot.incarnation.0,
            epoch: slot.epoch.0,
            set_id: self.shared.params().set_id,
        }
    }
}

/// [`Call`] for each request type: the reply it gets.
macro_rules! calls {
    ($($request:ty => $reply:ty),* $(,)?) => {$(
        impl Call for $request {
            type Reply = $reply;
            fn route_version(&self) -> u64 {
                self.route_version
            }
        }
    )*};
}

calls!(
    pb::FetchNextSeqRequest => pb::FetchNextSeqReply,
    pb::ReserveRequest => pb::ReserveReply,
    pb::BatchFetchNextSeqRequest => pb::BatchFetchNextSeqReply,
    pb::CounterRequest => pb::CounterReply,
    pb::CounterBatchRequest => pb::CounterBatchReply,
    pb::GetCurSeqRequest => pb::GetCurSeqReply,
    pb::BatchGetRequest => pb::BatchGetReply,
);

/// [`Reply`] for the replies of one [`Answer`], each with the name of its value field.
macro_rules! one_answer {
    ($($reply:ty => $value:ident),* $(,)?) => {$(
        impl Reply for $reply {
            type Body = Answer;
            fn not_owner((outcome, ..): &Answer) -> bool {
                *outcome == pb::Outcome::NotOwner
            }
            fn assemble((outcome, value, owner): Answer, tail: Tail) -> Self {
                Self {
                    outcome: outcome as i32,
                    $value: value,
                    route_version: tail.route_version,
                    routes: tail.routes,
                    owner,
                    map_version: tail.map_version,
                    map: tail.map,
                }
            }
        }
    )*};
}

one_answer!(
    pb::FetchNextSeqReply => seq,
    pb::ReserveReply => first,
    pb::GetCurSeqReply => cur_seq,
    pb::CounterReply => value,
);

/// [`Reply`] for the replies of a batch's [`Answers`], each with the name of its values field.
macro_rules! batch_answers {
    ($($reply:ty => $values:ident),* $(,)?) => {$(
        impl Reply for $reply {
            type Body = Answers;
            fn not_owner(body: &Answers) -> bool {
                body.any_not_owner
            }
            fn assemble(body: Answers, tail: Tail) -> Self {
                Self {
                    outcomes: body.outcomes,
                    $values: body.values,
                    route_version: tail.route_version,
                    routes: tail.routes,
                    owners: body.owners,
                    map_version: tail.map_version,
                    map: tail.map,
                }
            }
        }
    )*};
}

batch_answers!(
    pb::BatchFetchNextSeqReply => seqs,
    pb::CounterBatchReply => values,
    pb::BatchGetReply => values,
);
