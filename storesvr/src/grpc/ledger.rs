//! The `LedgerService` of a StoreSvr replica: ledger counters decided by this set (see
//! `domain::ledger`). Each call goes through the one path every step-decided call takes
//! (`grpc::serve`): writes are committed before they are answered, Show and Gaps pass the read
//! index. A follower answers with `not_leader` set.
//!
//! Deliberately left out: finding the set that owns a key (an AllocSvr does, or the caller's
//! client): a set that does not own the key's section refuses with UNAVAILABLE.

use std::sync::Arc;

use seqsvr_auth::Caller;
use seqsvr_proto::pb;
use tonic::{Request, Response, Status};

use crate::grpc::serve::{Served, respond, serve};
use crate::protocol::Reply;
use crate::protocol::Request as Call;
use crate::protocol::ledger::LedgerCall;
use crate::replica::ReplicaState;

pub struct LedgerSvc {
    pub ctx: Arc<ReplicaState>,
}

impl LedgerSvc {
    async fn call<T: crate::protocol::CallReply>(&self, who: Caller, call: LedgerCall) -> Result<Response<T>, Status> {
        let what = call_name(&call);
        let served = serve(&self.ctx, who, &Call::Ledger(call)).await;
        let outcome = match &served {
            Ok(Served::Committed(Reply::Ledger(r))) if r.repeated => "repeated",
            Ok(Served::Committed(_) | Served::Answered(_)) => "ok",
            Ok(Served::Elsewhere(_)) => "not_leader",
            Err(_) => "refused",
        };
        metrics::counter!("storesvr_ledger_calls_total", "call" => what, "outcome" => outcome).increment(1);
        respond(served)
    }
}

fn call_name(c: &LedgerCall) -> &'static str {
    match c {
        LedgerCall::Create(_) => "create",
        LedgerCall::Reserve(_) => "reserve",
        LedgerCall::Confirm(_) => "confirm",
        LedgerCall::Release(_) => "release",
        LedgerCall::Void(_) => "void",
        LedgerCall::Reconcile(_) => "reconcile",
        LedgerCall::Show(_) => "show",
        LedgerCall::Gaps(_) => "gaps",
    }
}

#[tonic::async_trait]
impl pb::ledger_service_server::LedgerService for LedgerSvc {
    async fn create_ledger(&self, req: Request<pb::CreateLedgerRequest>) -> Result<Response<pb::LedgerReply>, Status> {
        let who = Caller::of(&req);
        self.call(who, LedgerCall::Create(req.into_inner())).await
    }

    async fn reserve(&self, req: Request<pb::LedgerReserveRequest>) -> Result<Response<pb::LedgerReply>, Status> {
        let who = Caller::of(&req);
        self.call(who, LedgerCall::Reserve(req.into_inner())).await
    }

    async fn confirm(&self, req: Request<pb::LedgerConfirmRequest>) -> Result<Response<pb::LedgerReply>, Status> {
        let who = Caller::of(&req);
        self.call(who, LedgerCall::Confirm(req.into_inner())).await
    }

    async fn release(&self, req: Request<pb::LedgerReleaseRequest>) -> Result<Response<pb::LedgerReply>, Status> {
        let who = Caller::of(&req);
        self.call(who, LedgerCall::Release(req.into_inner())).await
    }

    async fn void(&self, req: Request<pb::LedgerVoidRequest>) -> Result<Response<pb::LedgerReply>, Status> {
        let who = Caller::of(&req);
        self.call(who, LedgerCall::Void(req.into_inner())).await
    }

    async fn reconcile(&self, req: Request<pb::LedgerReconcileRequest>) -> Result<Response<pb::LedgerReply>, Status> {
        let who = Caller::of(&req);
        self.call(who, LedgerCall::Reconcile(req.into_inner())).await
    }

    async fn show(&self, req: Request<pb::LedgerShowRequest>) -> Result<Response<pb::LedgerShowReply>, Status> {
        let who = Caller::of(&req);
        self.call(who, LedgerCall::Show(req.into_inner())).await
    }

    async fn gaps(&self, req: Request<pb::LedgerGapsRequest>) -> Result<Response<pb::LedgerGapsReply>, Status> {
        let who = Caller::of(&req);
        self.call(who, LedgerCall::Gaps(req.into_inner())).await
    }
}
