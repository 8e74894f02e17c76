//! The `LedgerService` of a StoreSvr replica: ledger counters decided by this set (see
//! `domain::ledger`). Each call goes through the one path every step-decided call takes
//! (`grpc::serve`): writes are committed before they are answered, Show and Gaps pass the read
//! index. A follower answers with `not_leader` set.
//!
//! Deliberately left out: finding the set that owns a key (an AllocSvr does, or the caller's
//! client): a set that does not own the key's section refuses with UNAVAILABLE.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

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
    /// `--unsafe-ledger-answer-before-commit` only: the last number this replica answered per key.
    pub predicted: Mutex<HashMap<String, u64>>,
}

impl LedgerSvc {
    pub fn new(ctx: Arc<ReplicaState>) -> Self {
        Self {
            ctx,
            predicted: Mutex::default(),
        }
    }

    async fn call<T: crate::protocol::CallReply>(&self, who: Caller, call: LedgerCall) -> Result<Response<T>, Status> {
        if self.ctx.config.unsafe_ledger_answer_before_commit
            && let Some(reply) = self.answer_before_commit(&who, &call)
        {
            return respond(Ok(Served::Answered(Reply::Ledger(Box::new(reply)))));
        }
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

impl LedgerSvc {
    /// The negative control: a reserve on the leader answered with a predicted number while its
    /// write is still to commit (`None`: not a reserve, or not the leader: served as usual).
    fn answer_before_commit(&self, who: &Caller, call: &LedgerCall) -> Option<pb::LedgerReply> {
        let LedgerCall::Reserve(q) = call else { return None };
        let key = String::from_utf8(q.key.clone()).ok()?;
        if !self.ctx.leads() {
            return None;
        }
        let applied = self.ctx.data(|d| d.set.ledgers.by_key.get(&key).map(|l| l.high))?;
        let number = {
            let mut predicted = self.predicted.lock().unwrap_or_else(|e| e.into_inner());
            let n = predicted.get(&key).copied().unwrap_or(0).max(applied) + 1;
            predicted.insert(key, n);
            n
        };
        let (ctx, who, call) = (self.ctx.clone(), who.clone(), call.clone());
        tokio::spawn(async move {
            let _ = serve(&ctx, who, &Call::Ledger(call)).await;
        });
        let mut entry = pb::LedgerEntry {
            number,
            holder: q.holder.clone(),
            reference: q.reference.clone(),
            ..Default::default()
        };
        // A reserve with a reference (an issue) is answered confirmed, as the store would.
        entry.set_state(if q.reference.is_empty() {
            pb::LedgerState::Held
        } else {
            pb::LedgerState::Confirmed
        });
        Some(pb::LedgerReply {
            entry: Some(entry),
            ..Default::default()
        })
    }
}

fn call_name(c: &LedgerCall) -> &'static str {
    match c {
        LedgerCall::Create(_) => "create",
        LedgerCall::Reserve(q) if !q.reference.is_empty() => "issue",
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
