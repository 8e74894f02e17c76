//! One replica's step, as toydb steps its nodes: what a replica does with a request of the
//! StoreService or the AdminService, given the set's committed state, what the replica keeps in
//! memory (a [`ReplicaView`]), `now` and the negative controls ([`Switches`]) — a command for Raft
//! to commit first, or the answer at once — and, once that command committed, the answer its
//! result makes ([`committed`]). The gRPC services (`grpc::serve`) and the deterministic simulator
//! (`sim dst`) drive their replicas through these two functions, so one dispatch decides what an
//! AllocSvr or the move driver is told.
//!
//! Deliberately left out: Raft (the read index a linearizable read waits for, see
//! [`Request::reads`]; committing; where the leader is), the replica's IO, for which the caller's
//! [`ReplicaView`] stands, the services' logs and metrics, and the calls that read only a
//! replica's local state or that the simulator does not model (GetRoutes, Status, Drain,
//! membership changes, Backup, GetAudit).

use std::time::Instant;

use seqsvr_proto::pb;

use crate::domain::state::{Command, CommandResult, SetState, UnsafeRules};
use crate::error::RpcError;
use crate::protocol::ids::{self, RaiseStep};
use crate::protocol::ledger::{self, LedgerCall};
use crate::protocol::moves::{self, FrozenSeen};
use crate::protocol::{
    LeaderView, bump_command, bumped, load_ranges, load_reply, params_of, register_command, registered,
    release_command, released, renew_reply, routes, unexpected,
};

/// A request, as the services receive it.
#[derive(Clone, Debug)]
pub enum Request {
    Register(pb::RegisterRequest),
    Renew(pb::RenewRequest),
    Release(pb::ReleaseRequest),
    Bump(pb::BumpRequest),
    Load(pb::LoadRequest),
    GetClusterMap,
    ChangeMap(pb::ChangeMapRequest),
    RangeStep(pb::RangeStepRequest),
    PublishMap(pb::PublishMapRequest),
    ExportStatus(pb::ExportStatusRequest),
    RaiseMarks(pb::RaiseMarksRequest),
    Ledger(LedgerCall),
}

impl Request {
    /// A linearizable read: stepped only once the read index passed, so that a deposed or
    /// cut-off leader never answers from a stale view. Every other request is a write, committed
    /// before it is answered, or a RaiseMarks that would change nothing, which only the leader
    /// answers from its applied state.
    pub fn reads(&self) -> bool {
        match self {
            Request::Ledger(c) => c.reads(),
            other => matches!(
                other,
                Request::Renew(_) | Request::Load(_) | Request::GetClusterMap | Request::ExportStatus(_)
            ),
        }
    }
}

/// The reply to a [`Request`].
#[derive(Debug)]
pub enum Reply {
    Register(pb::RegisterReply),
    /// Boxed: the largest reply, and most answers are not renewals.
    Renew(Box<pb::RenewReply>),
    Release(pb::ReleaseReply),
    Bump(pb::BumpReply),
    Load(pb::LoadReply),
    ClusterMap(pb::ClusterMapReply),
    ChangeMap(pb::ChangeMapReply),
    RangeStep(pb::RangeStepReply),
    PublishMap(pb::PublishMapReply),
    ExportStatus(pb::ExportStatusReply),
    RaiseMarks(pb::RaiseMarksReply),
    /// Boxed, as a renewal: larger than most replies.
    Ledger(Box<pb::LedgerReply>),
    LedgerShow(Box<pb::LedgerShowReply>),
    LedgerGaps(Box<pb::LedgerGapsReply>),
}

/// What a replica does with a request.
#[derive(Debug)]
pub enum Step {
    /// A write for Raft to commit; [`committed`] answers its result.
    Commit(Command),
    /// The answer, at once.
    Answer(Reply),
}

/// What a replica knows beyond the committed state, and who asked: the parts of its memory a
/// step reads and changes, behind whatever guards the replica keeps them. Every method takes
/// `&self`, so that a step may build the route table while it holds the leader view.
pub trait ReplicaView {
    /// `f` of the leader's in-memory view (whom it heard from, its arbiter's plan).
    fn with_view<T>(&self, f: impl FnOnce(&mut LeaderView) -> T) -> T;
    /// `f` of when this leadership first saw each move frozen, and of its Raft term.
    fn with_frozen<T>(&self, f: impl FnOnce(&mut FrozenSeen, u64) -> T) -> T;
    /// The addresses of this group's replicas (set 0's stores in the cluster map).
    fn stores(&self) -> Vec<String>;
    /// The route table of `set`; a replica may hand out the last one it built for that version.
    fn route_table(&self, set: &SetState) -> Result<pb::RouteTable, RpcError> {
        routes::table(set)
    }
    /// The clock the leader caps and stamps slot raises with, Unix ms: its own wall clock moved to
    /// the quorum's (`raft::clocks`).
    fn clock_ms(&self, set: &SetState) -> u64;
    /// `cmd`, an admin action, stamped with who asked and when: applied and recorded in the audit
    /// trail in one Raft entry.
    fn audited(&self, cmd: Command) -> Command;
}

/// What a step runs under besides the state: the negative controls (each removes one rule, for a
/// checker to catch) and how much a renewal says.
#[derive(Clone, Copy, Debug)]
pub struct Switches {
    /// The state machine's rules to skip, the same that every replica applies with.
    pub rules: UnsafeRules,
    /// `--unsafe-skip-move-wait`: a move's source hands out its ceilings without the lease wait.
    pub skip_move_wait: bool,
    /// Renewals carry the cluster map (`moves::map_for`). Always in production; the simulator's
    /// one-set runs predate it and leave it out, so that their seeds keep their schedules.
    pub carry_map: bool,
    /// The replica's `--key-placement`. Under `Slots`, a renewal is granted no sections before the
    /// set's stored id setup places keys by slot: an AllocSvr holding a map from before the setup
    /// would take a key's placement to be SHA-256 (what a map without one means) and could serve
    /// it in another section than every AllocSvr after (two sequences).
    pub key_placement: seqsvr_proto::keys::KeyPlacement,
}

/// What a replica does with `req` at `now`: the command to commit first, or the answer. A
/// refusal (bad input, a state that does not allow the call) is the error.
pub fn step(
    set: &SetState,
    replica: &impl ReplicaView,
    req: &Request,
    now: Instant,
    switches: Switches,
) -> Result<Step, RpcError> {
    let rules = switches.rules;
    Ok(match req {
        Request::Register(q) => {
            let cmd = register_command(q)?;
            // Its reply carries the set's params: a set that has none yet registers nobody.
            params_of(set)?;
            Step::Commit(cmd)
        }
        Request::Release(q) => Step::Commit(release_command(set, q, rules.skip_binding)?),
        Request::Bump(q) => Step::Commit(bump_command(set, q, rules.skip_epoch_fence, rules.skip_binding)?),
        Request::RaiseMarks(q) => {
            let skips = (rules.slots_unfenced(), rules.skip_binding);
            match ids::raise_step(set, q, replica.clock_ms(set), skips)? {
                RaiseStep::Propose(cmd) => Step::Commit(cmd),
                RaiseStep::Answer(reply) => Step::Answer(Reply::RaiseMarks(reply)),
            }
        }
        Request::Renew(q) => Step::Answer(Reply::Renew(Box::new(renew(set, replica, q, now, switches)?))),
        Request::Load(q) => {
            let p = params_of(set)?;
            let ranges = load_ranges(&p, q)?;
            Step::Answer(Reply::Load(load_reply(set, &p, &ranges)?))
        }
        Request::GetClusterMap => {
            let p = params_of(set)?;
            Step::Answer(Reply::ClusterMap(moves::cluster_map_reply(set, &p, &replica.stores())?))
        }
        Request::ExportStatus(q) => {
            let p = params_of(set)?;
            let skip_wait = switches.skip_move_wait;
            let reply =
                replica.with_frozen(|seen, term| moves::export_reply(set, &p, q.op, now, seen, term, skip_wait))?;
            Step::Answer(Reply::ExportStatus(reply))
        }
        // The moves' writes are admin actions: each is recorded in the audit trail as it applies.
        Request::ChangeMap(q) => Step::Commit(replica.audited(moves::map_command(&params_of(set)?, q.clone())?)),
        Request::RangeStep(q) => Step::Commit(replica.audited(moves::range_command(&params_of(set)?, q.clone())?)),
        Request::PublishMap(q) => Step::Commit(replica.audited(moves::publish_command(&params_of(set)?, q.clone())?)),
        Request::Ledger(c) if c.reads() => Step::Answer(match ledger::read(set, c)? {
            ledger::ReadReply::Show(r) => Reply::LedgerShow(Box::new(r)),
            ledger::ReadReply::Gaps(r) => Reply::LedgerGaps(Box::new(r)),
        }),
        Request::Ledger(c) => {
            let cmd = ledger::write_command(set, c, replica.clock_ms(set))?;
            // An operator's void or reconcile is recorded in the audit trail as it applies.
            Step::Commit(if c.is_admin() { replica.audited(cmd) } else { cmd })
        }
    })
}

/// A renewal's reply: the cluster map part (when renewals carry it), then the grants.
fn renew(
    set: &SetState,
    replica: &impl ReplicaView,
    q: &pb::RenewRequest,
    now: Instant,
    switches: Switches,
) -> Result<pb::RenewReply, RpcError> {
    let map = if switches.carry_map {
        let p = params_of(set)?;
        // Two integers compared unless the AllocSvr is behind (after a map change only). A copy
        // that cannot be handed out must not cost the owner its lease: the renewal goes on without.
        moves::map_for(set, &p, q.map_version, || replica.stores()).unwrap_or_else(|e| {
            tracing::error!(error = %e, "cluster map not handed out with a renewal");
            (q.map_version, None)
        })
    } else {
        (0, None)
    };
    let rules = switches.rules;
    // The term this renewal is answered in: a leadership lost and regained since the last arbiter
    // tick must not bound a lease by what it heard before (`Liveness::note_term`).
    let term = replica.with_frozen(|_, term| term);
    let mut reply = replica.with_view(|view| {
        view.liveness.note_term(term);
        renew_reply(set, view, q, map, || replica.route_table(set), now, rules)
    })?;
    let placed = set.ids.as_ref().map(|i| i.key_placement);
    if switches.key_placement == seqsvr_proto::keys::KeyPlacement::Slots && placed != Some(switches.key_placement) {
        // Not serving is always safe; the setup comes with the leader's next arbiter tick.
        reply.grants.clear();
        reply.renew_soon = true;
    }
    Ok(reply)
}

/// The answer to `req` once the command its step asked for committed with `result`, at `now`.
pub fn committed(
    set: &SetState,
    replica: &impl ReplicaView,
    req: &Request,
    result: CommandResult,
    now: Instant,
) -> Result<Reply, RpcError> {
    Ok(match req {
        Request::Register(_) => {
            let p = params_of(set)?;
            let (_, reply) = replica.with_view(|view| registered(result, &p, &mut view.liveness, now))?;
            Reply::Register(reply)
        }
        Request::Release(q) => Reply::Release(released(q, result)?),
        Request::Bump(q) => Reply::Bump(bumped(q, result)?),
        Request::RaiseMarks(q) => Reply::RaiseMarks(ids::raised(q, result, replica.clock_ms(set))?),
        Request::ChangeMap(_) => Reply::ChangeMap(moves::map_changed(result)?),
        Request::RangeStep(_) => Reply::RangeStep(moves::stepped(result)?),
        Request::PublishMap(_) => Reply::PublishMap(moves::published(result)?),
        Request::Ledger(c) if !c.reads() => Reply::Ledger(Box::new(ledger::committed(set, c, result)?)),
        Request::Renew(_)
        | Request::Load(_)
        | Request::GetClusterMap
        | Request::ExportStatus(_)
        | Request::Ledger(_) => {
            return Err(unexpected(result));
        }
    })
}

/// The wire reply of one call: taken out of a [`Reply`], or made to name the leader instead.
pub trait CallReply: Sized {
    /// The reply, when `reply` is of this call.
    fn take(reply: Reply) -> Option<Self>;
    /// The reply of a replica that does not lead: `hint` says which one does.
    fn not_leader(hint: pb::LeaderHint) -> Self;
}

/// One entry per call: its [`Reply`] variant and its wire reply.
macro_rules! call_replies {
    ($($variant:ident: $reply:ty),* $(,)?) => {$(
        impl CallReply for $reply {
            fn take(reply: Reply) -> Option<Self> {
                match reply {
                    // `Box::from` boxes a reply, and keeps a boxed one (a renewal) as it is.
                    Reply::$variant(r) => Some(*Box::<Self>::from(r)),
                    _ => None,
                }
            }

            fn not_leader(hint: pb::LeaderHint) -> Self {
                Self {
                    not_leader: Some(hint),
                    ..Default::default()
                }
            }
        }
    )*};
}

call_replies!(
    Register: pb::RegisterReply,
    Renew: pb::RenewReply,
    Release: pb::ReleaseReply,
    Bump: pb::BumpReply,
    Load: pb::LoadReply,
    ClusterMap: pb::ClusterMapReply,
    ChangeMap: pb::ChangeMapReply,
    RangeStep: pb::RangeStepReply,
    PublishMap: pb::PublishMapReply,
    ExportStatus: pb::ExportStatusReply,
    RaiseMarks: pb::RaiseMarksReply,
    Ledger: pb::LedgerReply,
    LedgerShow: pb::LedgerShowReply,
    LedgerGaps: pb::LedgerGapsReply,
);
