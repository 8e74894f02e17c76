//! The one path through this replica of the calls the protocol's step decides
//! (`protocol::step`): a linearizable read passes the read index first; the step decides under
//! the state lock, with this replica's memory behind its locks; a write is committed and its
//! result answered; and the outcome becomes its call's tonic response in one place ([`respond`]).
//!
//! Deliberately left out: what each call logs and counts (its handler in `store.rs` or `admin.rs`
//! does, from the [`Served`] outcome), and the calls the step does not decide (GetRoutes, Status,
//! Drain, membership changes, Backup, GetAudit), which their handlers serve themselves.

use std::sync::OnceLock;

use seqsvr_auth::Caller;
use seqsvr_proto::pb;
use tonic::{Response, Status};

use crate::domain::state::{Command, SetState};
use crate::error::RpcError;
use crate::grpc::audit::stamped;
use crate::protocol::moves::FrozenSeen;
use crate::protocol::{self, CallReply, LeaderView, ReplicaView, Reply, Request, Step, Switches};
use crate::replica::{Led, ReplicaState};

/// How a call ended, short of an error.
pub(crate) enum Served {
    /// Answered without a write: a read, or a raise that would change no mark.
    Answered(Reply),
    /// Answered once its write committed.
    Committed(Reply),
    /// This replica does not lead; the hint names the one that does, if it knows.
    Elsewhere(pb::LeaderHint),
}

/// `req`, sent by `who`, through this replica.
pub(crate) async fn serve(ctx: &ReplicaState, who: Caller, req: &Request) -> Result<Served, RpcError> {
    if req.reads()
        && let Led::Elsewhere(hint) = ctx.linearizable().await?
    {
        return Ok(Served::Elsewhere(hint));
    }
    let here = Here {
        ctx,
        who,
        clock_ms: OnceLock::new(),
    };
    let c = &ctx.config;
    let switches = Switches {
        rules: c.unsafe_rules(),
        skip_move_wait: c.unsafe_skip_move_wait,
        carry_map: true,
        key_placement: c.key_placement,
    };
    let cmd = match ctx.data(|d| protocol::step(&d.set, &here, req, ReplicaState::lease_now(), switches))? {
        Step::Commit(cmd) => cmd,
        Step::Answer(reply) if req.reads() || ctx.leads() => return Ok(Served::Answered(reply)),
        // A write's answer from the applied state (a raise that changes nothing), but only by the
        // leader: its clock is the one a holder compares its own with.
        Step::Answer(_) => return Ok(Served::Elsewhere(ctx.leader_hint(None))),
    };
    match ctx.write(cmd).await? {
        Led::Elsewhere(hint) => Ok(Served::Elsewhere(hint)),
        Led::Here(result) => {
            let now = ReplicaState::lease_now();
            ctx.data(|d| protocol::committed(&d.set, &here, req, result, now))
                .map(Served::Committed)
        }
    }
}

/// The response to a served call: its reply, a not-leader reply of its kind, or the status of
/// its error (the one place where these calls' errors become statuses).
pub(crate) fn respond<T: CallReply>(served: Result<Served, RpcError>) -> Result<Response<T>, Status> {
    let reply = served.and_then(|s| match s {
        Served::Elsewhere(hint) => Ok(T::not_leader(hint)),
        Served::Answered(r) | Served::Committed(r) => {
            T::take(r).ok_or_else(|| RpcError::Internal("the step answered with the reply of another call".into()))
        }
    });
    reply.map(Response::new).map_err(Status::from)
}

/// This replica as a step sees it: the leader view and the frozen-move memory behind their locks,
/// the members, the route cache, the id clock and the caller who stamps admin writes.
struct Here<'a> {
    ctx: &'a ReplicaState,
    who: Caller,
    /// Read at most once a call: a raise is capped and answered with one value.
    clock_ms: OnceLock<u64>,
}

impl ReplicaView for Here<'_> {
    fn with_view<T>(&self, f: impl FnOnce(&mut LeaderView) -> T) -> T {
        f(&mut self.ctx.view())
    }

    fn with_frozen<T>(&self, f: impl FnOnce(&mut FrozenSeen, u64) -> T) -> T {
        let term = self.ctx.raft.metrics().borrow().current_term;
        f(
            &mut self.ctx.frozen_seen.lock().expect("frozen_seen lock poisoned"),
            term,
        )
    }

    /// The Raft voters' addresses.
    fn stores(&self) -> Vec<String> {
        let m = self.ctx.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        membership
            .voter_ids()
            .filter_map(|id| membership.get_node(&id).map(|n| n.addr.clone()))
            .collect()
    }

    fn route_table(&self, set: &SetState) -> Result<pb::RouteTable, RpcError> {
        self.ctx.route_table(set)
    }

    fn clock_ms(&self, set: &SetState) -> u64 {
        // Without ids set up, the flag's allowance: it only sets when a disagreement is logged.
        let max_ahead_ms = set
            .ids
            .as_ref()
            .map_or(self.ctx.config.id_max_ahead_ms, |i| i.max_ahead_ms);
        *self.clock_ms.get_or_init(|| self.ctx.id_clock_ms(max_ahead_ms))
    }

    fn audited(&self, cmd: Command) -> Command {
        stamped(&self.who, cmd)
    }
}
