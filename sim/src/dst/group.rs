//! One set's StoreSvr group as `sim dst` runs it: three replicas around one committed state (the
//! production state machine, `SetState::apply_with`), each with its own leader-only view, and
//! every request answered by the production service logic: `storesvr::protocol::step` and
//! `committed`, the dispatch the gRPC services run, over each replica's memory (`Here`).
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

use std::cell::RefCell;
use std::time::{Duration, Instant};

use storesvr::domain::command;
use storesvr::domain::state::{Command, CommandResult, SetParams, SetState, UnsafeRules};
use storesvr::error::RpcError;
use storesvr::protocol::moves::FrozenSeen;
use storesvr::protocol::{self, CallReply, LeaderView, ReplicaView, Reply, Switches, Tick};

use super::addrs::{REPLICAS, store_addr};

/// A request from an AllocSvr, as the StoreService receives it, or from the move driver, as the
/// AdminService receives it: the production step's own.
pub use storesvr::protocol::Request as Req;

/// Its answer: a reply, "the leader is elsewhere", or an error status.
#[derive(Debug)]
pub enum Rep {
    Reply(Reply),
    /// Index of the replica believed to lead (`None`: no leader known).
    NotLeader(Option<usize>),
    Error(RpcError),
}

impl Rep {
    /// The reply, when it is one of type `T`.
    pub fn take<T: CallReply>(self) -> Option<T> {
        match self {
            Rep::Reply(r) => T::take(r),
            Rep::NotLeader(_) | Rep::Error(_) => None,
        }
    }
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
    /// When this leader first saw each move frozen (leader memory, like `view`).
    pub frozen: FrozenSeen,
    /// Its wall clock minus the true time, ms (StoreSvr clock faults, `--ids` only).
    pub clock_offset_ms: i64,
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
    /// Negative control: the source of a move hands out its ceilings without the lease wait (as
    /// `storesvr --unsafe-skip-move-wait`).
    pub skip_move_wait: bool,
    /// Renewals carry the cluster map (`protocol::moves::map_for`), as in production. Off in one-set
    /// runs, which predate it: their seeds keep their schedules (and the regression seeds theirs).
    pub carry_map: bool,
    /// Sections a committed Release named while their owner was the releasing incarnation under a
    /// later epoch: what the Release's epoch fence is for (coverage of the unfenced-Release hole).
    pub stale_releases: u64,
    /// Every replica is gone (a lost set): none restarts until the set is restored.
    pub lost: bool,
    /// How many times the set was restored: a new group each time, and a write of an earlier
    /// group that was still in flight never commits in a later one (`World::commit`).
    pub generation: u64,
    /// Time-ordered ids: set 0's setup (as its `--id-*` flags give it; the other sets adopt it
    /// from the cluster map).
    pub ids: Option<GroupIds>,
    /// The true Unix time at an instant, which every replica's wall clock reads plus its own
    /// offset (`Replica::clock_offset_ms`): what slot raises and ledger holds are stamped with.
    /// `None` (no ids, no ledgers) reads 0: nothing then looks at the wall clock.
    pub wall: Option<Wall>,
}

/// What a group needs to run time-ordered ids.
#[derive(Clone, Debug)]
pub struct GroupIds {
    pub setup: Option<storesvr::domain::slots::SlotCommand>,
}

/// The replicas' true wall clock: the Unix ms `.1` at the instant `.0`.
#[derive(Clone, Copy, Debug)]
pub struct Wall(pub Instant, pub u64);

impl Wall {
    /// The true wall clock at `now`, Unix ms.
    pub fn unix_ms(&self, now: Instant) -> u64 {
        self.1 + now.saturating_duration_since(self.0).as_millis() as u64
    }
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
            skip_move_wait: false,
            carry_map: false,
            stale_releases: 0,
            lost: false,
            generation: 0,
            ids: None,
            wall: None,
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

    /// A replica's process dies: its leader view (memory) is lost, its log is not. With `wipe` its
    /// disk is lost too, but only while another replica still holds the log: losing the last copy
    /// is losing the set, which is a fault of its own (`lose`, then a restore), not a crash. (Two
    /// wipes in a row before any leader had re-filled the first wiped every copy in seed 56570 of
    /// `--sets 2 --ids`: set 0 stayed leaderless forever.)
    pub fn crash(&mut self, r: usize, wipe: bool) {
        let log_elsewhere = (0..REPLICAS).any(|o| o != r && !self.replicas[o].empty);
        let rep = &mut self.replicas[r];
        rep.up = false;
        rep.leading = false;
        rep.view = LeaderView::default();
        rep.frozen = FrozenSeen::default();
        rep.empty |= wipe && log_elsewhere;
    }

    /// Replica `r` starts again with its log (not in a lost set: its replicas are gone).
    pub fn restart(&mut self, r: usize) {
        if !self.lost {
            self.replicas[r].up = true;
        }
    }

    /// The whole set is lost: every replica crashes and none comes back by itself.
    pub fn lose(&mut self) {
        for r in 0..REPLICAS {
            self.crash(r, false);
        }
        self.lost = true;
    }

    /// The lost set comes back as it was (its disks survived after all).
    pub fn recover(&mut self) {
        self.lost = false;
        for r in 0..REPLICAS {
            self.restart(r);
        }
    }

    /// A new group in place of the lost one, from a restored state: fresh replicas that all
    /// hold it (the first one restored, the others caught up by snapshot, as `seqctl replica
    /// add` does), no leader yet, and a new generation so that nothing of the old group lands.
    pub fn replace(&mut self, restored: SetState) {
        self.set = restored;
        self.replicas = (0..REPLICAS)
            .map(|_| Replica {
                up: true,
                ..Default::default()
            })
            .collect();
        self.leaderless_since = None;
        self.lost = false;
        self.generation += 1;
    }

    /// What replica `r` does with a request now: the answer of a read or a refusal at once, or
    /// the command a write must commit first.
    pub fn receive(&mut self, r: usize, req: &Req, now: Instant) -> Step {
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
        let switches = Switches {
            rules: self.rules,
            skip_move_wait: self.skip_move_wait,
            carry_map: self.carry_map,
            key_placement: Default::default(),
        };
        let (set, here) = self.at(r, now);
        match protocol::step(set, &here, req, now, switches) {
            Ok(protocol::Step::Commit(cmd)) => Step::Commit(cmd),
            Ok(protocol::Step::Answer(reply)) => Step::Answer(Rep::Reply(reply)),
            Err(e) => Step::Answer(Rep::Error(e)),
        }
    }

    /// The committed state and replica `r` as the production step sees it at `now`.
    fn at(&mut self, r: usize, now: Instant) -> (&SetState, Here<'_>) {
        let clock_ms = self.leader_ms(r, now);
        let set_id = self.set.params.as_ref().map_or(0, |p| p.set_id);
        let replica = RefCell::new(&mut self.replicas[r]);
        (
            &self.set,
            Here {
                replica,
                set_id,
                clock_ms,
            },
        )
    }

    /// Whether replica `r` still leads in `term` with a majority (a write it started commits).
    pub fn still_leads(&self, r: usize, term: u64) -> bool {
        self.leader() == Some(r) && self.replicas[r].term == term
    }

    /// Applies a committed command (the production state machine) and notes ownership changes.
    pub fn apply(&mut self, cmd: &Command, at_ns: u64) -> CommandResult {
        let before: Vec<(u64, u64)> = self.set.sections.iter().map(|s| (s.owner.0, s.epoch.0)).collect();
        let inner = match cmd {
            Command::Bound { cmd, .. } => &**cmd,
            cmd => cmd,
        };
        if let Command::Release {
            incarnation, ranges, ..
        } = inner
        {
            for r in ranges {
                let held = (r.begin.0..r.end.0).filter_map(|i| before.get(i as usize));
                self.stale_releases += held
                    .filter(|&&(owner, epoch)| owner == incarnation.0 && epoch != r.epoch.0)
                    .count() as u64;
            }
        }
        let result = self.set.apply_with(cmd, self.rules);
        let cause = match inner {
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
        let (set, here) = self.at(r, now);
        protocol::committed(set, &here, req, result, now).map_or_else(Rep::Error, Rep::Reply)
    }

    /// The clock leader `r` stamps a raise or a ledger hold with (0 without a wall clock: nothing
    /// reads it then): its own wall clock moved to the quorum's, as production's `raft::clocks`
    /// does it, over the replicas it reaches (their heartbeat replies carry their clocks).
    fn leader_ms(&self, r: usize, now: Instant) -> u64 {
        let Some(wall) = self.wall else { return 0 };
        let own = self.replicas[r].clock_offset_ms;
        let peers: Vec<i64> = (0..REPLICAS)
            .filter(|&p| p != r && self.replicas[p].up && !self.replicas[p].isolated)
            .map(|p| self.replicas[p].clock_offset_ms - own)
            .collect();
        let quorum = storesvr::raft::clocks::quorum_offset(&peers, REPLICAS).unwrap_or(0);
        wall.unix_ms(now).saturating_add_signed(own + quorum)
    }

    /// One arbiter tick on replica `r` (production `tasks::arbiter`): the commands to write, in
    /// order — the plan, then the slot decision for time-ordered ids, then the expiry of ledger
    /// holds past their deadline by the leader's clock. Without `--ids` no set sets ids up, the
    /// AllocSvrs hold no slot and their raisers stay idle; without `--ledger` there is no ledger
    /// to expire: the seeds' schedules are those of before either.
    pub fn arbiter(&mut self, r: usize, now: Instant) -> Vec<Command> {
        let clock_ms = self.leader_ms(r, now);
        let rep = &mut self.replicas[r];
        if !rep.up {
            return Vec::new();
        }
        let role = (rep.leading, rep.term);
        match protocol::arbiter_tick(&self.set, &mut rep.view, role, now, self.detect, &self.bootstrap).1 {
            Tick::Follower => Vec::new(),
            Tick::Init(p) => vec![Command::Init(p)],
            Tick::Plan(cmd) => {
                let setup = self.ids.as_ref().and_then(|i| i.setup.clone());
                let slots = self
                    .ids
                    .as_ref()
                    .and_then(|_| protocol::ids::slots_tick(&self.set, &rep.view, now, self.detect, setup));
                let expire = protocol::ledger::expire_tick(&self.set, clock_ms);
                cmd.into_iter().chain(slots).chain(expire).collect()
            }
        }
    }

    pub fn term_of(&self, r: usize) -> u64 {
        self.replicas[r].term
    }
}

/// One replica as the production step sees it (`protocol::ReplicaView`): its leader view and
/// frozen-move memory, the group's addresses, its leader clock at the step's instant, and the
/// simulator as the caller of every admin write.
struct Here<'a> {
    replica: RefCell<&'a mut Replica>,
    set_id: u64,
    clock_ms: u64,
}

impl ReplicaView for Here<'_> {
    fn with_view<T>(&self, f: impl FnOnce(&mut LeaderView) -> T) -> T {
        f(&mut self.replica.borrow_mut().view)
    }

    fn with_frozen<T>(&self, f: impl FnOnce(&mut FrozenSeen, u64) -> T) -> T {
        let mut replica = self.replica.borrow_mut();
        let term = replica.term;
        f(&mut replica.frozen, term)
    }

    /// The replicas' addresses as the cluster map lists them.
    fn stores(&self) -> Vec<String> {
        (0..REPLICAS).map(|r| store_addr(self.set_id, r)).collect()
    }

    fn clock_ms(&self, _: &SetState) -> u64 {
        self.clock_ms
    }

    /// As the gRPC service stamps them (`audit`), so that the moves here run through the same
    /// apply. Who and when are fixed: the trail's contents are checked by storesvr's own tests.
    fn audited(&self, cmd: Command) -> Command {
        command::wrap("sim", 0, cmd)
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Set 0 of 8 sections of 10 uids, or an empty set `set_id` that ranges move into.
    pub(crate) fn params(set_id: u64) -> SetParams {
        SetParams {
            set_id,
            section_size: 10,
            uid_limit: 80,
            step: 10,
            lease_ms: 1_000,
            renew_interval_ms: 250,
            section_begin: 0,
            section_end: if set_id == 0 { 8 } else { 0 },
            ..SetParams::single_set(set_id)
        }
    }

    /// A group with a leader, initialized by its arbiter's first tick.
    fn group(set_id: u64, now: Instant) -> (Group, usize) {
        let mut g = Group::new(params(set_id), Duration::from_secs(1), UnsafeRules::default());
        g.raft_tick(now, |_| 0);
        g.raft_tick(now + Duration::from_secs(1), |_| 0);
        let leader = g.leader().expect("a leader after the election timeout");
        let init = g
            .arbiter(leader, now)
            .into_iter()
            .next()
            .expect("the first tick initializes the set");
        g.apply(&init, 0);
        (g, leader)
    }

    #[test]
    fn wiping_every_replica_in_turn_leaves_one_copy_of_the_log_to_elect() {
        let now = Instant::now();
        let (mut g, leader) = group(0, now);
        // Each replica crashes with its disk wiped before any leader could re-fill the others.
        for r in (0..REPLICAS).map(|i| (leader + i) % REPLICAS) {
            g.crash(r, true);
        }
        let full: Vec<usize> = (0..REPLICAS).filter(|&r| !g.replicas[r].empty).collect();
        assert_eq!(full.len(), 1, "the last crash keeps its disk: {full:?}");
        for r in 0..REPLICAS {
            g.restart(r);
        }
        g.raft_tick(now + Duration::from_secs(2), |_| 0);
        g.raft_tick(now + Duration::from_secs(4), |_| 0);
        assert_eq!(g.leader(), Some(full[0]), "the replica with the log leads");
        g.raft_tick(now + Duration::from_secs(5), |_| 0);
        assert!(
            g.replicas.iter().all(|r| !r.empty),
            "the leader re-filled the wiped ones"
        );
    }

    // The move protocol through the leader's decisions is told as a golden script:
    // testscripts/a_move_through_the_leaders_decisions (scripts.rs).
}
