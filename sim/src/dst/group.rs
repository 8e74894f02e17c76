//! One set's StoreSvr group as `sim dst` runs it: three replicas around one committed state (the
//! production state machine, `SetState::apply_with`), each with its own leader-only view, and
//! every request answered by the production service logic (`storesvr::serve`).
//!
//! What is modelled rather than run is Raft itself, by what it guarantees and how it fails:
//! - one committed log, applied in order; a leader is a replica that is up, was elected in the
//!   highest term and reaches a majority; elections take a seeded 300–600 ms;
//! - a write is committed after a short delay only while its leader keeps that leadership; when it
//!   loses it first, the entry is committed or lost (a coin), and the caller hears nothing;
//! - a linearizable read (Renew, Load) is answered only by a leader that reaches a majority, so a
//!   deposed or cut-off leader never answers from a stale view;
//! - a crash loses a replica's leader view (liveness, plan), never its log; a wiped replica
//!   cannot be elected until a leader has sent it a snapshot.
//!
//! Deliberately left out: openraft's own timing and code (elections, replication, snapshots and
//! the segment log are tested by openraft, by `storesvr`'s tests and by `sim run`), membership
//! changes, and per-replica lag of local reads (the polls here are linearizable).

use std::time::{Duration, Instant};

use seqsvr_proto::pb;
use storesvr::domain::state::{Command, CommandResult, SetParams, SetState, UnsafeRules};
use storesvr::error::RpcError;
use storesvr::serve::{self, LeaderView, Tick};

/// Replicas in the group.
pub const REPLICAS: usize = 3;

/// A request from an AllocSvr, as the StoreService receives it.
#[derive(Clone, Debug)]
pub enum Req {
    Register(pb::RegisterRequest),
    Renew(pb::RenewRequest),
    Release(pb::ReleaseRequest),
    Bump(pb::BumpRequest),
    Load(pb::LoadRequest),
}

/// Its answer: a reply, "the leader is elsewhere", or an error status.
#[derive(Debug)]
pub enum Rep {
    Register(pb::RegisterReply),
    Renew(pb::RenewReply),
    Release(pb::ReleaseReply),
    Bump(pb::BumpReply),
    Load(pb::LoadReply),
    /// Index of the replica believed to lead (`None`: no leader known).
    NotLeader(Option<usize>),
    Error(RpcError),
}

/// One replica's condition and what it keeps in memory.
#[derive(Debug, Default)]
pub struct Replica {
    pub up: bool,
    /// Cut off from every other replica (and so from any majority).
    pub isolated: bool,
    /// Its disk was wiped: it holds no log until a leader sends it a snapshot.
    pub empty: bool,
    pub term: u64,
    /// It believes it leads in `term` (a cut-off old leader still does).
    pub leading: bool,
    pub view: LeaderView,
}

/// A change of a section's owner or epoch, for the trace of a failing seed.
#[derive(Clone, Debug)]
pub struct OwnerChange {
    pub at_ns: u64,
    pub section: u64,
    pub owner: u64,
    pub epoch: u64,
    pub max_seq: u64,
    pub cause: &'static str,
}

/// The group.
pub struct Group {
    pub set: SetState,
    pub replicas: Vec<Replica>,
    rules: UnsafeRules,
    bootstrap: SetParams,
    detect: Duration,
    /// When the group was last seen without a leader (the election timer runs from there).
    leaderless_since: Option<Instant>,
    election_timeout: Duration,
    pub changes: Vec<OwnerChange>,
    /// Sections a committed Release named while their owner was the releasing incarnation under a
    /// later epoch: what the Release's epoch fence is for (coverage of the unfenced-Release hole).
    pub stale_releases: u64,
}

impl Group {
    pub fn new(bootstrap: SetParams, detect: Duration, rules: UnsafeRules) -> Self {
        let replicas = (0..REPLICAS)
            .map(|_| Replica {
                up: true,
                ..Default::default()
            })
            .collect();
        Self {
            set: SetState::default(),
            replicas,
            rules,
            bootstrap,
            detect,
            leaderless_since: None,
            election_timeout: Duration::from_millis(300),
            changes: Vec::new(),
            stale_releases: 0,
        }
    }

    fn reaches_majority(&self, r: usize) -> bool {
        let rep = &self.replicas[r];
        if !rep.up || rep.isolated {
            return false;
        }
        let connected = self.replicas.iter().filter(|x| x.up && !x.isolated).count();
        connected * 2 > REPLICAS
    }

    fn max_term(&self) -> u64 {
        self.replicas.iter().map(|r| r.term).max().unwrap_or(0)
    }

    /// The replica that leads and can act as leader now.
    pub fn leader(&self) -> Option<usize> {
        let top = self.max_term();
        (0..REPLICAS).find(|&r| {
            let rep = &self.replicas[r];
            rep.leading && rep.term == top && self.reaches_majority(r)
        })
    }

    /// Raft's housekeeping, called every few ms: step down leaders that see a higher term, send
    /// snapshots to wiped replicas, elect a leader after the election timeout. `pick` draws the
    /// candidate and the next timeout.
    pub fn raft_tick(&mut self, now: Instant, mut pick: impl FnMut(u64) -> u64) {
        let top = self.max_term();
        let has_leader = self.leader().is_some();
        for r in 0..REPLICAS {
            let reachable = self.replicas[r].up && !self.replicas[r].isolated;
            let rep = &mut self.replicas[r];
            if reachable && rep.term < top {
                rep.term = top;
                rep.leading = false;
            }
            if reachable && has_leader {
                rep.empty = false;
            }
        }
        if has_leader {
            self.leaderless_since = None;
            return;
        }
        let since = *self.leaderless_since.get_or_insert(now);
        if now.saturating_duration_since(since) < self.election_timeout {
            return;
        }
        let candidates: Vec<usize> = (0..REPLICAS)
            .filter(|&r| self.reaches_majority(r) && !self.replicas[r].empty)
            .collect();
        if candidates.is_empty() {
            return;
        }
        let winner = candidates[pick(candidates.len() as u64) as usize];
        let term = top + 1;
        for r in 0..REPLICAS {
            if self.replicas[r].up && !self.replicas[r].isolated {
                self.replicas[r].term = term;
                self.replicas[r].leading = r == winner;
            }
        }
        self.leaderless_since = None;
        self.election_timeout = Duration::from_millis(300 + pick(300));
    }

    /// A replica's process dies: its leader view (memory) is lost, its log is not.
    pub fn crash(&mut self, r: usize, wipe: bool) {
        let rep = &mut self.replicas[r];
        rep.up = false;
        rep.leading = false;
        rep.view = LeaderView::default();
        rep.empty |= wipe;
    }

    pub fn restart(&mut self, r: usize) {
        self.replicas[r].up = true;
    }

    /// What replica `r` does with a request now: the answer of a read or a refusal at once, or
    /// the command a write must commit first.
    pub fn receive(&mut self, r: usize, req: &Req, skip_fence: bool, now: Instant) -> Step {
        if !self.replicas[r].up {
            return Step::Silent;
        }
        if !self.replicas[r].leading {
            return Step::Answer(Rep::NotLeader(self.leader()));
        }
        if !self.reaches_majority(r) {
            // A cut-off leader's writes never commit and its read index never returns.
            return Step::Silent;
        }
        match self.decide(r, req, skip_fence, now) {
            Ok(step) => step,
            Err(e) => Step::Answer(Rep::Error(e)),
        }
    }

    fn decide(&mut self, r: usize, req: &Req, skip_fence: bool, now: Instant) -> Result<Step, RpcError> {
        Ok(match req {
            Req::Register(q) => {
                let cmd = serve::register_command(q)?;
                serve::params_of(&self.set)?;
                Step::Commit(cmd)
            }
            Req::Release(q) => Step::Commit(serve::release_command(&serve::params_of(&self.set)?, q)?),
            Req::Bump(q) => Step::Commit(serve::bump_command(&self.set, q, skip_fence)?),
            Req::Renew(q) => {
                let (set, view) = (&self.set, &mut self.replicas[r].view);
                let table = || {
                    storesvr::grpc::store::build_routes(set).ok_or_else(|| RpcError::Unavailable("no params".into()))
                };
                Step::Answer(Rep::Renew(serve::renew_reply(set, view, q, (0, None), table, now)?))
            }
            Req::Load(q) => {
                let p = serve::params_of(&self.set)?;
                let ranges = serve::load_ranges(&p, q)?;
                Step::Answer(Rep::Load(serve::load_reply(&self.set, &p, &ranges)?))
            }
        })
    }

    /// Whether replica `r` still leads in `term` with a majority (a write it started commits).
    pub fn still_leads(&self, r: usize, term: u64) -> bool {
        self.leader() == Some(r) && self.replicas[r].term == term
    }

    /// Applies a committed command (the production state machine) and notes ownership changes.
    pub fn apply(&mut self, cmd: &Command, at_ns: u64) -> CommandResult {
        let before: Vec<(u64, u64)> = self.set.sections.iter().map(|s| (s.owner.0, s.epoch.0)).collect();
        if let Command::Release {
            incarnation, ranges, ..
        } = cmd
        {
            for r in ranges {
                let held = (r.begin.0..r.end.0).filter_map(|i| before.get(i as usize));
                self.stale_releases += held
                    .filter(|&&(owner, epoch)| owner == incarnation.0 && epoch != r.epoch.0)
                    .count() as u64;
            }
        }
        let result = self.set.apply_with(cmd, self.rules);
        let cause = match cmd {
            Command::Assign { .. } => "arbiter",
            Command::Release { .. } => "release",
            Command::Register { .. } => "register",
            _ => "other",
        };
        for (i, s) in self.set.sections.iter().enumerate() {
            if before.get(i) != Some(&(s.owner.0, s.epoch.0)) {
                self.changes.push(OwnerChange {
                    at_ns,
                    section: i as u64,
                    owner: s.owner.0,
                    epoch: s.epoch.0,
                    max_seq: s.max_seq,
                    cause,
                });
            }
        }
        result
    }

    /// The reply to a committed write of `req`, from replica `r`.
    pub fn reply(&mut self, r: usize, req: &Req, result: CommandResult, now: Instant) -> Rep {
        let answer = match req {
            Req::Register(_) => serve::params_of(&self.set).and_then(|p| {
                serve::registered(result, &p, &mut self.replicas[r].view.liveness, now)
                    .map(|(_, rep)| Rep::Register(rep))
            }),
            Req::Release(q) => serve::released(q, result).map(Rep::Release),
            Req::Bump(q) => serve::bumped(q, result).map(Rep::Bump),
            Req::Renew(_) | Req::Load(_) => Err(serve::unexpected(result)),
        };
        answer.unwrap_or_else(Rep::Error)
    }

    /// One arbiter tick on replica `r` (production `serve::arbiter_tick`): the command to write.
    pub fn arbiter(&mut self, r: usize, now: Instant) -> Option<Command> {
        let rep = &mut self.replicas[r];
        if !rep.up {
            return None;
        }
        let role = (rep.leading, rep.term);
        match serve::arbiter_tick(&self.set, &mut rep.view, role, now, self.detect, &self.bootstrap).1 {
            Tick::Follower => None,
            Tick::Init(p) => Some(Command::Init(p)),
            Tick::Plan(cmd) => cmd,
        }
    }

    pub fn term_of(&self, r: usize) -> u64 {
        self.replicas[r].term
    }
}

/// What a replica does with a request.
pub enum Step {
    /// No answer ever (down, or a leader that cannot reach a majority).
    Silent,
    Answer(Rep),
    /// A write to commit before answering.
    Commit(Command),
}
