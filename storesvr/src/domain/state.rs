//! The replicated state of one set: per-section `max_seq`, epochs and owners,
//! the AllocSvr registry and the route version.
//!
//! This is the pure half of the state machine: `apply` takes one command and
//! returns its result, with no clock, no randomness and no hash-map iteration
//! (only `Vec` and `BTreeMap`), so every replica that applies the same log
//! reaches the same state. It keeps:
//! - P3: `max_seq` only grows (a bump with `new_max <= max_seq` is a no-op);
//! - U1 (time-ordered ids): a slot's mark is raised only under its current epoch and holder
//!   (`slots`), which the negative control `skip_epoch_fence` removes as it removes the bumps';
//! - P4: a bump is applied only with the section's current epoch, and every
//!   ownership change raises the epoch; a release takes effect only under the
//!   epoch it names, so a late or repeated Release cannot touch a later grant;
//! - a bump may raise a section by at most [`MAX_BUMP_STEPS`] steps: until
//!   callers are authenticated, anyone who can reach the leader could otherwise
//!   raise a ceiling to the top of the 64-bit space and end the section for good;
//! - a Bump or Release of an incarnation that registered with a secret is applied
//!   only when it carries that secret's hash (`binding`), so the log itself refuses
//!   a forged one, whatever the leader checked before proposing it.
//!
//! Identifiers are the newtypes of `seqsvr_proto::types`; they serialize as the bare `u64`
//! they wrap, so the log and snapshot formats do not depend on them.
//!
//! Left out on purpose: liveness (who is alive is the leader's in-memory
//! business, see `liveness`), and moving sections between sets.

use super::audit::{AuditNote, AuditRecord, AuditTrail};
use super::binding::{Bindings, SecretHash, Verdict};
use super::cluster_map::ClusterMap;
pub use super::command::{
    BumpItem, BumpOutcome, BumpResult, CachedMap, Command, CommandResult, Move, Released, outcome,
};
use super::ledger::{Context, LedgerCommand, Ledgers};
use super::moves::{ExportStatus, LocalMove, MoveSteps, MoveView, RangeCommand, StepResult};
use super::ranges::{OpId, RangeState, RangeTable};
pub use super::section::{NOBODY, OwnerRun, Run, SectionState, Span, sections};
pub(super) use super::section::{clamp, sections_of, slot};
use super::slots::{IdState, SlotCommand};
use seqsvr_proto::{Incarnation, NodeId, SectionId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// How many steps above its current `max_seq` one bump may raise a section. An owner asks for one
/// step above the ceiling it holds (gain and prefetch), and a retried bump repeats its `new_max`,
/// so one step would do; four leave room for a future owner that prefetches further ahead
/// without letting a forged bump spend more than a few steps of the 64-bit space.
pub const MAX_BUMP_STEPS: u64 = 4;

/// Test-only switches that remove one rule from `apply` (negative controls: the simulator must
/// catch each). Every replica of a group must run with the same ones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnsafeRules {
    /// `--unsafe-skip-epoch-fence`: bumps, and raises of id slot marks, are applied whatever their
    /// epoch or incarnation.
    pub skip_epoch_fence: bool,
    /// `--unsafe-unfenced-release`: a Release ignores the epoch it names (the old rule, under
    /// which a late or repeated Release could end a later grant to the same incarnation).
    pub unfenced_release: bool,
    /// `--unsafe-skip-binding`: Renews, Releases and Bumps are not checked against the secret
    /// their incarnation registered with (anyone may act in its name, as before the binding).
    pub skip_binding: bool,
    /// `--unsafe-skip-slot-fence`: raises of id slot marks alone are applied whatever their epoch
    /// or holder (bumps keep their fence): the control that only the id checkers can catch.
    pub skip_slot_fence: bool,
    /// `--unsafe-predecessor-wait-from-first-renewal`: the wait a forced grant carries counts
    /// from the first renewal this leader heard from each gone owner, not the last (the lease of
    /// a later renewal is not waited out).
    pub predecessor_wait_from_first_renewal: bool,
}

impl UnsafeRules {
    /// Whether a raise of an id slot's mark skips its epoch and holder check.
    pub fn slots_unfenced(&self) -> bool {
        self.skip_epoch_fence || self.skip_slot_fence
    }
}

/// Parameters fixed when the set is bootstrapped (one type and one rule set for every crate).
pub use seqsvr_proto::params::SetParams;

/// A registered AllocSvr incarnation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocSvrRecord {
    pub node_id: NodeId,
    pub incarnation: Incarnation,
    pub addr: String,
    /// The registering process's nonce: a retry of the same registration finds this record.
    pub nonce: u64,
    /// An operator asked for this node's sections to go to the set's other AllocSvrs: the arbiter
    /// plans it nothing, so it hands everything over and can then be stopped.
    pub draining: bool,
}

/// The whole replicated state of a set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct SetState {
    pub params: Option<SetParams>,
    /// Indexed by `section - params.section_begin`.
    pub sections: Vec<SectionState>,
    /// Live registrations by incarnation.
    pub allocsvrs: BTreeMap<Incarnation, AllocSvrRecord>,
    pub last_incarnation: Incarnation,
    /// Raised on every change of any section's owner.
    pub route_version: u64,
    /// Every StoreSvr node id that was ever a member: ids are never reused.
    pub replica_ids_ever: BTreeSet<NodeId>,
    /// Which sections this set owns, is importing, has frozen or has given away.
    pub ranges: RangeTable,
    /// Every move that touched this set, by op id (kept after it ends, so that a repeated step
    /// is recognised; one small record per move).
    pub moves: BTreeMap<OpId, LocalMove>,
    /// The cluster map, in set 0 (its home) only.
    pub map: Option<ClusterMap>,
    /// The newest published copy of the cluster map, in every set (set 0 too: the copy lists the
    /// sets' AllocSvr addresses, which its own map does not). A snapshot written before it
    /// existed is read with `None` here (see `storage::sm_store`).
    pub cached_map: Option<CachedMap>,
    /// The last admin actions (bounded). Last but one on purpose, like `cached_map`: a snapshot
    /// written before it existed is read with an empty trail.
    pub audit: AuditTrail,
    /// The secret hash of every live incarnation that registered with one. Last field on
    /// purpose: a snapshot written before it existed is read with none (see `storage::sm_store`),
    /// and its incarnations stay unbound, as they registered.
    pub bindings: Bindings,
    /// Worker slots for time-ordered ids, once set up (see `slots`). Last field on purpose: a
    /// snapshot or backup written before it existed is read with none.
    pub ids: Option<IdState>,
    /// Ledger counters (see `ledger`). Last, and not written when there are none, so that a
    /// state without ledgers encodes byte for byte as before (see the `Serialize` below).
    #[serde(default)]
    pub ledgers: Ledgers,
}

/// `SetState` as it is written: every field as derived, but `ledgers` only when there are some,
/// and then the key placement of `ids` always (that placement is otherwise left out when it is
/// SHA-256, and postcard has no field tags: the ledgers' first byte would be read as it).
impl Serialize for SetState {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Written<'a> {
            params: &'a Option<SetParams>,
            sections: &'a Vec<SectionState>,
            allocsvrs: &'a BTreeMap<Incarnation, AllocSvrRecord>,
            last_incarnation: &'a Incarnation,
            route_version: &'a u64,
            replica_ids_ever: &'a BTreeSet<NodeId>,
            ranges: &'a RangeTable,
            moves: &'a BTreeMap<OpId, LocalMove>,
            map: &'a Option<ClusterMap>,
            cached_map: &'a Option<CachedMap>,
            audit: &'a AuditTrail,
            bindings: &'a Bindings,
            ids: IdsWritten<'a>,
            #[serde(skip_serializing_if = "no_ledgers")]
            ledgers: &'a Ledgers,
        }
        let with_ledgers = !self.ledgers.is_empty();
        Written {
            params: &self.params,
            sections: &self.sections,
            allocsvrs: &self.allocsvrs,
            last_incarnation: &self.last_incarnation,
            route_version: &self.route_version,
            replica_ids_ever: &self.replica_ids_ever,
            ranges: &self.ranges,
            moves: &self.moves,
            map: &self.map,
            cached_map: &self.cached_map,
            audit: &self.audit,
            bindings: &self.bindings,
            ids: IdsWritten {
                ids: self.ids.as_ref(),
                whole: with_ledgers,
            },
            ledgers: &self.ledgers,
        }
        .serialize(s)
    }
}

fn no_ledgers(l: &&Ledgers) -> bool {
    l.is_empty()
}

/// The `ids` field: as derived, or with every field (`whole`) when more follows it.
struct IdsWritten<'a> {
    ids: Option<&'a IdState>,
    whole: bool,
}

impl Serialize for IdsWritten<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match (self.ids, self.whole) {
            (Some(ids), true) => s.serialize_some(&ids.whole()),
            (ids, _) => ids.serialize(s),
        }
    }
}

impl SetState {
    /// Applies one command with every rule on, except the fence on bumps when `skip_epoch_fence`.
    pub fn apply(&mut self, cmd: &Command, skip_epoch_fence: bool) -> CommandResult {
        self.apply_with(
            cmd,
            UnsafeRules {
                skip_epoch_fence,
                ..UnsafeRules::default()
            },
        )
    }

    /// Applies one command; `rules` are the negative controls (all off in production). A Bump or
    /// Release of a bound incarnation must come as [`Command::Bound`] with the hash it registered
    /// with; the hashes of incarnations that went away are forgotten.
    pub fn apply_with(&mut self, cmd: &Command, rules: UnsafeRules) -> CommandResult {
        let (cmd, presented) = match cmd {
            Command::Bound { secret_hash, cmd } => (&**cmd, Some(secret_hash)),
            cmd => (cmd, None),
        };
        let acting = match cmd {
            Command::Bump { incarnation, .. } | Command::Release { incarnation, .. } => Some(*incarnation),
            Command::Slots(
                SlotCommand::Raise { holder, .. }
                | SlotCommand::RaiseCapped { holder, .. }
                | SlotCommand::Release { holder, .. },
            ) => Some(*holder),
            _ => None,
        };
        if presented.is_some() && acting.is_none() && !matches!(cmd, Command::Register { .. }) {
            // The words predate slots (a slot's Raise and Release count as its Bump and Release);
            // results are pinned by `format_pins`.
            return CommandResult::Invalid("only a Register, Bump or Release can be bound to a secret".into());
        }
        if let Some(incarnation) = acting
            && !rules.skip_binding
            && self.bindings.check(incarnation, presented) == Verdict::Refused
        {
            return CommandResult::NotBound;
        }
        let result = match (cmd, presented) {
            (Command::Register { node_id, addr, nonce }, hash) if self.params.is_some() => {
                self.register(*node_id, addr, *nonce, hash.copied())
            }
            _ => self.apply_unbound(cmd, rules),
        };
        if matches!(
            cmd,
            Command::Register { .. } | Command::Release { .. } | Command::Assign { .. }
        ) {
            self.bindings.keep_only(&self.allocsvrs);
            if let Some(ids) = self.ids.as_mut() {
                ids.forget_gone(&self.allocsvrs);
            }
        }
        result
    }

    /// Applies one command whose binding, if any, was checked.
    fn apply_unbound(&mut self, cmd: &Command, rules: UnsafeRules) -> CommandResult {
        let Some(params) = self.params.clone() else {
            return match cmd {
                Command::Init(p) => self.init(p),
                _ => CommandResult::Invalid("set is not initialized".into()),
            };
        };
        match cmd {
            Command::Init(_) => CommandResult::Initialized { fresh: false },
            Command::Register { node_id, addr, nonce } => self.register(*node_id, addr, *nonce, None),
            Command::Bump { incarnation, items } => self.bump(&params, *incarnation, items, rules.skip_epoch_fence),
            Command::Release {
                incarnation,
                ranges,
                leaving,
            } => self.release(&params, *incarnation, ranges, *leaving, rules.unfenced_release),
            Command::Assign { expire, moves } => self.assign(&params, expire, moves),
            Command::Range(step) => self.range_step(&params, step),
            Command::Drain { node_id } => {
                let rec = self.allocsvrs.values_mut().find(|r| r.node_id == *node_id);
                CommandResult::Draining {
                    incarnation: rec.map(|r| {
                        r.draining = true;
                        r.incarnation
                    }),
                }
            }
            Command::CacheMap(m) => self.cache_map(m),
            Command::Slots(c) => {
                let registered = self.allocsvrs.keys().copied().collect();
                let skip = rules.slots_unfenced();
                CommandResult::Slots(super::slots::apply_with(
                    &mut self.ids,
                    params.set_id,
                    c,
                    &registered,
                    skip,
                ))
            }
            Command::Ledger(c) => self.ledger(&params, c),
            Command::Audited { note, cmd } => self.audited(note, cmd, rules),
            // `apply_with` unwraps one level; a second is not a command anyone sends.
            Command::Bound { .. } => CommandResult::Invalid("a bound command cannot hold another one".into()),
            Command::Audit(record) => {
                self.audit.push(record.clone());
                CommandResult::Recorded {
                    number: self.audit.last(),
                }
            }
            Command::Map(change) => match self.map.as_mut() {
                Some(map) => CommandResult::Map(map.apply(change)),
                None => CommandResult::Refused(format!(
                    "set {} does not keep the cluster map; set 0 does",
                    params.set_id
                )),
            },
        }
    }

    /// Applies an admin action and appends its record with the outcome, whatever the outcome (a
    /// refusal is worth recording too). A nested audit command is refused and not recorded, so
    /// apply never recurses more than once.
    fn audited(&mut self, note: &AuditNote, cmd: &Command, rules: UnsafeRules) -> CommandResult {
        if matches!(cmd, Command::Audited { .. } | Command::Audit(_)) {
            return CommandResult::Invalid("an audited command cannot hold another audit command".into());
        }
        let result = self.apply_with(cmd, rules);
        self.audit.push(AuditRecord::new(note, &outcome(&result)));
        result
    }

    /// Keeps `m` unless the cached copy is as new or newer, so that a late or repeated publish never
    /// takes the set back to an older map. Set 0's authoritative map is not touched.
    fn cache_map(&mut self, m: &CachedMap) -> CommandResult {
        let have = self.cached_map.as_ref().map_or(0, |c| c.version);
        if m.version <= have {
            return CommandResult::MapCached {
                version: have,
                already: true,
            };
        }
        self.cached_map = Some(m.clone());
        CommandResult::MapCached {
            version: m.version,
            already: false,
        }
    }

    /// Sections cover the whole section space (so that ranges can move in); the set owns the
    /// parameters' own range from the start.
    fn init(&mut self, p: &SetParams) -> CommandResult {
        let n = p.total_sections() as usize;
        self.sections = vec![
            SectionState {
                no_wait: true,
                ..Default::default()
            };
            n
        ];
        self.params = Some(p.clone());
        self.ranges
            .set(p.first_section(), p.end_section(), Some(RangeState::Owned));
        if p.set_id == 0 {
            // Set 0's own addresses are its Raft members', filled in when the map is handed out.
            self.map = Some(ClusterMap::first(p.section_end, Vec::new()));
        }
        CommandResult::Initialized { fresh: true }
    }

    /// Registers `node_id`, bound to `hash` when given (see `binding`).
    fn register(&mut self, node_id: NodeId, addr: &str, nonce: u64, hash: Option<SecretHash>) -> CommandResult {
        // A retry of a registration that already committed (its reply was lost or late) must not
        // supersede the incarnation the process may already be using. A retry carries the same
        // secret as the attempt that committed; a Register that reuses the nonce with another one
        // (someone who saw the nonce on the wire) is a new process and gets a new incarnation.
        if let Some(r) = self.allocsvrs.values().find(|r| {
            nonce != 0
                && r.node_id == node_id
                && r.nonce == nonce
                && self.bindings.check(r.incarnation, hash.as_ref()) != Verdict::Refused
        }) {
            return CommandResult::Registered {
                incarnation: r.incarnation,
            };
        }
        // Otherwise a node that registers again is a new process: its older incarnations are
        // superseded at once (their bumps and renewals are refused from now on).
        self.allocsvrs.retain(|_, r| r.node_id != node_id);
        self.last_incarnation = Incarnation(self.last_incarnation.0 + 1);
        let incarnation = self.last_incarnation;
        self.allocsvrs.insert(
            incarnation,
            AllocSvrRecord {
                node_id,
                incarnation,
                addr: addr.to_string(),
                nonce,
                draining: false,
            },
        );
        if let Some(hash) = hash {
            self.bindings.bind(incarnation, hash);
        }
        CommandResult::Registered { incarnation }
    }

    /// Applies a fenced bump. Under `skip_fence` (the `--unsafe-skip-epoch-fence` negative control)
    /// the store has no fence at all: it applies any bump that raises `max_seq`, whatever the
    /// item's epoch, the section's owner or whether the incarnation is still registered, and,
    /// knowing no epochs, echoes each item's own epoch in its result (so the caller cannot tell).
    fn bump(&mut self, p: &SetParams, incarnation: Incarnation, items: &[BumpItem], skip_fence: bool) -> CommandResult {
        if !skip_fence && !self.allocsvrs.contains_key(&incarnation) {
            return CommandResult::UnknownIncarnation;
        }
        if let Some(bad) = items.iter().find(|i| i.section.0 >= p.total_sections()) {
            return CommandResult::Invalid(format!(
                "section {} is past the last section {}",
                bad.section,
                p.total_sections().saturating_sub(1)
            ));
        }
        let results = items
            .iter()
            .map(|item| {
                // Range states hold under every negative control: a set never raises a ceiling of
                // a section it does not own (a frozen one is on its way to another set).
                let owned = self.ranges.is_owned(item.section);
                let s = &mut self.sections[slot(item.section)];
                let fenced_out = s.epoch != item.epoch || s.owner != incarnation;
                let outcome = if !owned {
                    BumpOutcome::NotOwned
                } else if fenced_out && !skip_fence {
                    BumpOutcome::StaleEpoch
                } else if item.new_max > s.max_seq.saturating_add(MAX_BUMP_STEPS.saturating_mul(p.step)) {
                    BumpOutcome::OutOfRange
                } else if item.new_max <= s.max_seq {
                    BumpOutcome::NoOp
                } else {
                    s.max_seq = item.new_max;
                    BumpOutcome::Applied
                };
                BumpResult {
                    section: item.section,
                    outcome,
                    max_seq: s.max_seq,
                    epoch: if skip_fence { item.epoch } else { s.epoch },
                }
            })
            .collect();
        CommandResult::Bumped(results)
    }

    fn release(
        &mut self,
        p: &SetParams,
        incarnation: Incarnation,
        ranges: &[Released],
        leaving: bool,
        unfenced: bool,
    ) -> CommandResult {
        if !self.allocsvrs.contains_key(&incarnation) {
            return CommandResult::UnknownIncarnation;
        }
        let mut count = 0;
        for r in ranges {
            for section in clamp(p, r.begin, r.end) {
                let s = &mut self.sections[slot(section)];
                // The epoch pins the grant the owner dropped: the same incarnation may hold the
                // section again under a later epoch, which this Release must not end.
                if s.owner == incarnation && (s.epoch == r.epoch || unfenced) {
                    s.change_owner(NOBODY);
                    // An owner still inside its wait after a forced takeover proves nothing about
                    // the owner before it, whose lease may still run: the next one waits too.
                    s.no_wait = s.no_wait || r.waited;
                    count += 1;
                }
            }
        }
        if leaving {
            self.allocsvrs.remove(&incarnation);
        }
        if count > 0 || leaving {
            self.route_version += 1;
        }
        CommandResult::Released { count }
    }

    fn assign(&mut self, p: &SetParams, expire: &[Incarnation], moves: &[Move]) -> CommandResult {
        let mut expired = false;
        for inc in expire {
            expired |= self.allocsvrs.remove(inc).is_some();
        }
        let mut moved = 0;
        for m in moves {
            if m.to != NOBODY && !self.allocsvrs.contains_key(&m.to) {
                continue; // the target went away after the arbiter decided
            }
            for section in clamp(p, m.begin, m.end) {
                // The arbiter may have decided before a range step froze or removed the section.
                if !self.ranges.is_owned(section) {
                    continue;
                }
                let s = &mut self.sections[slot(section)];
                if s.owner != m.from || s.owner == m.to {
                    continue;
                }
                // Only an unowned section that was released (or never owned) may be
                // served at once; taking it from a live or dead owner means waiting
                // out that owner's lease.
                s.no_wait = s.owner == NOBODY && s.no_wait;
                s.change_owner(m.to);
                moved += 1;
            }
        }
        // An expired owner's address leaves the route table too.
        if moved > 0 || expired {
            self.route_version += 1;
        }
        CommandResult::Assigned {
            moved,
            route_version: self.route_version,
        }
    }

    /// The section's state, if the set has a say over it (owned, importing, frozen or moved).
    pub fn section(&self, section: SectionId) -> Option<&SectionState> {
        self.ranges.state_at(section)?;
        self.sections.get(slot(section))
    }

    /// The sections of `[begin, end)`, whatever their range state, with their states, in order.
    /// One slice walk: the arbiter runs this over every owned section on each tick.
    pub fn sections_in(&self, begin: SectionId, end: SectionId) -> impl Iterator<Item = (SectionId, &SectionState)> {
        sections_of(&self.sections, begin, end)
    }

    /// Applies one range step of a move (see `moves`); a step that changes what the set serves
    /// raises the route version.
    fn range_step(&mut self, p: &SetParams, step: &RangeCommand) -> CommandResult {
        let mut steps = MoveSteps {
            ranges: &mut self.ranges,
            moves: &mut self.moves,
            sections: &mut self.sections,
            routes_changed: false,
        };
        let result = steps.apply(p, step);
        if steps.routes_changed {
            self.route_version += 1;
        }
        if let StepResult::Stepped { already: false } = result {
            match step {
                // The target has the span's ledgers (the driver installs them before the range).
                RangeCommand::Tombstone { span, .. } => self.ledgers.drop_span(*span),
                // A cancelled import forgets the copies it took; a source's cancel keeps its own.
                RangeCommand::Cancel { span, .. } if !self.ranges.all(span.begin, span.end, |s| s.is_some()) => {
                    self.ledgers.drop_span(*span)
                }
                _ => {}
            }
        }
        match result {
            StepResult::Stepped { already } => CommandResult::Stepped { already },
            StepResult::Refused(m) => CommandResult::Refused(m),
            StepResult::Invalid(m) => CommandResult::Invalid(m),
        }
    }

    /// Applies a ledger command: keys are placed as the set's id setup says (SHA-256 without one).
    fn ledger(&mut self, p: &SetParams, c: &LedgerCommand) -> CommandResult {
        if let LedgerCommand::Install { op, .. } = c
            && self.moves.get(op).is_some_and(|m| {
                matches!(m.role, super::moves::Role::Import { .. }) && m.phase == super::moves::SidePhase::Done
            })
        {
            // A driver that died after the range's install repeats this step: the ledgers went in
            // before the range did, and may have changed since (the range is served here now).
            return CommandResult::Ledger(super::ledger::LedgerResult::Count(0));
        }
        let cx = Context {
            params: p,
            placement: self.ids.as_ref().map(|i| i.key_placement).unwrap_or_default(),
            ranges: &self.ranges,
        };
        CommandResult::Ledger(self.ledgers.apply(&cx, c))
    }

    /// The move steps' parts of the state, to read.
    pub fn move_view(&self) -> MoveView<'_> {
        MoveView {
            ranges: &self.ranges,
            moves: &self.moves,
            sections: &self.sections,
        }
    }

    /// How far the owners of move `op`'s frozen range have let go (see [`MoveView::export_status`]).
    pub fn export_status(&self, op: OpId) -> Option<ExportStatus> {
        self.move_view().export_status(op)
    }

    /// The final ceilings of move `op`'s range (see [`MoveView::final_ceilings`]).
    pub fn final_ceilings(&self, op: OpId) -> Option<Vec<u64>> {
        self.move_view().final_ceilings(op)
    }

    /// The first section of `span` the set does not own, with its range state.
    pub fn first_not_owned(&self, span: Span) -> Option<(SectionId, Option<RangeState>)> {
        let mut at = span.begin;
        for run in self.ranges.runs_in(span.begin, span.end) {
            if run.begin > at {
                return Some((at, None));
            }
            if run.state != RangeState::Owned {
                return Some((run.begin, Some(run.state)));
            }
            at = run.end;
        }
        (at < span.end).then_some((at, None))
    }

    /// Sum of every section's `max_seq`, saturating (a progress signal for operators).
    pub fn max_seq_sum(&self) -> u64 {
        self.sections.iter().fold(0u64, |a, s| a.saturating_add(s.max_seq))
    }

    /// Runs of consecutive sections with the same range state, owner, epoch and no_wait; sections
    /// the set has no say over are left out.
    pub fn runs(&self) -> Vec<Run<'_>> {
        let mut out: Vec<Run<'_>> = Vec::new();
        for range in self.ranges.runs() {
            for (section, s) in self.sections_in(range.begin, range.end) {
                let next = SectionId(section.0 + 1);
                match out.last_mut() {
                    Some(run)
                        if run.end == section
                            && run.range == range.state
                            && run.state.owner == s.owner
                            && run.state.epoch == s.epoch
                            && run.state.no_wait == s.no_wait =>
                    {
                        run.end = next
                    }
                    _ => out.push(Run {
                        begin: section,
                        end: next,
                        state: s,
                        range: range.state,
                    }),
                }
            }
        }
        out
    }

    /// Runs of consecutive owned sections with the same owner (epochs may differ): the route
    /// table. Frozen, importing and moved sections are nobody's to route to.
    pub fn owner_runs(&self) -> Vec<OwnerRun> {
        let mut out: Vec<OwnerRun> = Vec::new();
        for run in self.runs().into_iter().filter(|r| r.range == RangeState::Owned) {
            match out.last_mut() {
                Some(last) if last.owner == run.state.owner && last.end == run.begin => last.end = run.end,
                _ => out.push(OwnerRun {
                    begin: run.begin,
                    end: run.end,
                    owner: run.state.owner,
                }),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::testing::register_with;
    use seqsvr_proto::Epoch;

    fn params() -> SetParams {
        SetParams {
            set_id: 0,
            section_size: 100,
            uid_limit: 1_000,
            step: 10,
            lease_ms: 3_000,
            renew_interval_ms: 500,
            drift_ppm: 10_000,
            margin_ms: 100,
            section_begin: 0,
            section_end: 10,
        }
    }

    /// Registers `node_id` as a new process (a nonce never used before).
    fn register(st: &mut SetState, node_id: u64) -> Incarnation {
        let nonce = 1_000_000 + st.last_incarnation.0;
        register_with(st, node_id, nonce)
    }

    fn ready() -> (SetState, Incarnation) {
        let mut st = SetState::default();
        st.apply(&Command::Init(params()), false);
        let incarnation = register(&mut st, 1);
        assign(&mut st, vec![], 0..10, NOBODY, incarnation);
        (st, incarnation)
    }

    /// A Release of `[begin, end)` under the epochs the sections have now (what their owner holds).
    fn held(st: &SetState, begin: u64, end: u64) -> Vec<Released> {
        sections(SectionId(begin), SectionId(end))
            .map(|section| Released {
                begin: section,
                end: SectionId(section.0 + 1),
                epoch: st.section(section).unwrap().epoch,
                waited: false,
            })
            .collect()
    }

    /// The arbiter's command: expire `expire`, move `sections` from `from` to `to`.
    fn assign(
        st: &mut SetState,
        expire: Vec<Incarnation>,
        sections: std::ops::Range<u64>,
        from: Incarnation,
        to: Incarnation,
    ) -> CommandResult {
        let moves = vec![Move {
            begin: SectionId(sections.start),
            end: SectionId(sections.end),
            from,
            to,
        }];
        st.apply(&Command::Assign { expire, moves }, false)
    }

    fn run(begin: u64, end: u64, owner: Incarnation) -> OwnerRun {
        OwnerRun {
            begin: SectionId(begin),
            end: SectionId(end),
            owner,
        }
    }

    fn bump(st: &mut SetState, inc: Incarnation, section: u64, epoch: u64, new_max: u64) -> CommandResult {
        st.apply(
            &Command::Bump {
                incarnation: inc,
                items: vec![BumpItem {
                    section: SectionId(section),
                    epoch: Epoch(epoch),
                    new_max,
                }],
            },
            false,
        )
    }

    /// The newtypes must not change the log format: a command encodes as the bare numbers it did
    /// when these fields were `u64` (variant index, then each field as a varint).
    #[test]
    fn newtypes_encode_as_the_bare_numbers_they_wrap() {
        let cmd = Command::Bump {
            incarnation: Incarnation(17),
            items: vec![BumpItem {
                section: SectionId(3),
                epoch: Epoch(2),
                new_max: 300,
            }],
        };
        let bytes = postcard::to_stdvec(&cmd).unwrap();
        assert_eq!(bytes, [2, 17, 1, 3, 2, 0xAC, 0x02]);
        assert_eq!(postcard::from_bytes::<Command>(&bytes).unwrap(), cmd);
    }

    fn cache(st: &mut SetState, version: u64, tag: u8) -> CommandResult {
        let m = CachedMap {
            version,
            encoded: vec![tag],
        };
        st.apply(&Command::CacheMap(m), false)
    }

    #[test]
    fn a_cached_map_is_replaced_only_by_a_newer_one() {
        let mut st = SetState::default();
        st.apply(&Command::Init(SetParams { set_id: 1, ..params() }), false);
        let cases = [
            (3, 1, false, 3, 1),
            (3, 2, true, 3, 1), // a repeated publish changes nothing
            (2, 3, true, 3, 1), // a late, older one neither
            (5, 4, false, 5, 4),
        ];
        for (version, tag, already, have, kept) in cases {
            assert_eq!(
                cache(&mut st, version, tag),
                CommandResult::MapCached { version: have, already },
                "publish v{version}"
            );
            let c = st.cached_map.as_ref().unwrap();
            assert_eq!((c.version, c.encoded[0]), (have, kept), "after v{version}");
        }
        assert_eq!(st.map, None, "set 1 has no authoritative map");
    }

    #[test]
    fn set_0_caches_a_copy_and_keeps_its_own_map_unchanged() {
        let mut st = SetState::default();
        st.apply(&Command::Init(params()), false);
        let before = st.map.clone().expect("set 0 keeps the map");
        assert!(matches!(
            cache(&mut st, 9, 1),
            CommandResult::MapCached { already: false, .. }
        ));
        assert_eq!(st.map.as_ref(), Some(&before), "the authoritative map moved");
        assert_eq!(st.cached_map.as_ref().map(|c| c.version), Some(9));
    }

    #[test]
    fn an_uninitialized_set_caches_nothing() {
        let mut st = SetState::default();
        assert!(matches!(cache(&mut st, 1, 1), CommandResult::Invalid(_)));
        assert_eq!(st.cached_map, None);
    }

    #[test]
    fn first_assignment_needs_no_wait_and_raises_epoch() {
        let (st, inc) = ready();
        let s = st.section(SectionId(3)).unwrap();
        assert_eq!((s.owner, s.epoch, s.no_wait), (inc, Epoch(1), true));
        assert_eq!(st.route_version, 1);
    }

    #[test]
    fn sections_in_walks_only_the_sets_sections() {
        let (st, _) = ready();
        let ids = |b, e| {
            st.sections_in(SectionId(b), SectionId(e))
                .map(|(s, _)| s.0)
                .collect::<Vec<u64>>()
        };
        let cases: [(u64, u64, &[u64]); 4] = [(3, 6, &[3, 4, 5]), (8, 20, &[8, 9]), (12, 20, &[]), (5, 2, &[])];
        for (begin, end, want) in cases {
            assert_eq!(ids(begin, end), want, "[{begin}, {end})");
        }
    }

    #[test]
    fn bump_outcomes() {
        let (mut st, inc) = ready();
        let cases = [
            (1, 30, BumpOutcome::Applied, 30),
            (1, 30, BumpOutcome::NoOp, 30),
            (1, 15, BumpOutcome::NoOp, 30),
            (0, 50, BumpOutcome::StaleEpoch, 30),
            (2, 50, BumpOutcome::StaleEpoch, 30),
            (1, 60, BumpOutcome::Applied, 60),
        ];
        for (epoch, new_max, outcome, max_seq) in cases {
            let CommandResult::Bumped(r) = bump(&mut st, inc, 4, epoch, new_max) else {
                panic!()
            };
            assert_eq!(
                (r[0].outcome, r[0].max_seq),
                (outcome, max_seq),
                "epoch {epoch} new_max {new_max}"
            );
        }
    }

    #[test]
    fn stale_epoch_bump_is_refused_after_a_move() {
        let (mut st, a) = ready();
        let b = register(&mut st, 2);
        assign(&mut st, vec![], 0..5, a, b);
        let s = st.section(SectionId(2)).unwrap().clone();
        assert_eq!(
            (s.owner, s.epoch, s.no_wait),
            (b, Epoch(2), false),
            "forced move must wait a lease"
        );
        let CommandResult::Bumped(r) = bump(&mut st, a, 2, 1, 1_000) else {
            panic!()
        };
        assert_eq!(r[0].outcome, BumpOutcome::StaleEpoch);
        assert_eq!(st.section(SectionId(2)).unwrap().max_seq, 0);
        // The unsafe switch lets the stale owner through and echoes its own epoch, so that the
        // stale owner takes the bump as acknowledged: the negative control works.
        let r = st.apply(
            &Command::Bump {
                incarnation: a,
                items: vec![BumpItem {
                    section: SectionId(2),
                    epoch: Epoch(1),
                    new_max: 9,
                }],
            },
            true,
        );
        let CommandResult::Bumped(r) = r else { panic!("{r:?}") };
        assert_eq!(
            (r[0].outcome, r[0].epoch, r[0].max_seq),
            (BumpOutcome::Applied, Epoch(1), 9)
        );
        assert_eq!(st.section(SectionId(2)).unwrap().max_seq, 9);
    }

    #[test]
    fn without_the_fence_an_expired_incarnation_still_bumps() {
        let (mut st, a) = ready();
        let b = register(&mut st, 2);
        assign(&mut st, vec![a], 0..10, a, b);
        let late = Command::Bump {
            incarnation: a,
            items: vec![BumpItem {
                section: SectionId(4),
                epoch: Epoch(1),
                new_max: 40,
            }],
        };
        assert_eq!(st.clone().apply(&late, false), CommandResult::UnknownIncarnation);
        let CommandResult::Bumped(r) = st.apply(&late, true) else {
            panic!()
        };
        assert_eq!(
            (r[0].outcome, r[0].epoch, r[0].max_seq),
            (BumpOutcome::Applied, Epoch(1), 40)
        );
        assert_eq!(
            st.section(SectionId(4)).unwrap().epoch,
            Epoch(2),
            "the fence-less store leaves the epoch alone"
        );
    }

    /// A forced takeover (the old owner may still be inside its lease) followed by a handover
    /// before the new owner waited that lease out: the next owner must still wait. Only a
    /// release by an owner that had waited (or never had to) lets the next one serve at once.
    #[test]
    fn a_release_before_the_lease_wait_ended_keeps_the_next_owner_waiting() {
        let (mut st, a) = ready();
        let b = register(&mut st, 2);
        let c = register(&mut st, 3);
        assign(&mut st, vec![a], 0..2, a, b);
        assert!(!st.section(SectionId(0)).unwrap().no_wait, "forced: b waits a lease");
        let mut early = held(&st, 0, 2);
        early[1].waited = true;
        let release = Command::Release {
            incarnation: b,
            ranges: early,
            leaving: false,
        };
        assert_eq!(st.apply(&release, false), CommandResult::Released { count: 2 });
        assign(&mut st, vec![], 0..2, NOBODY, c);
        let no_wait = |s| st.section(SectionId(s)).unwrap().no_wait;
        assert!(!no_wait(0), "b released section 0 inside its wait: c must wait too");
        assert!(no_wait(1), "b had waited section 1 out: c serves at once");
    }

    #[test]
    fn release_then_assign_needs_no_wait() {
        let (mut st, a) = ready();
        let b = register(&mut st, 2);
        assert_eq!(
            st.apply(
                &Command::Release {
                    incarnation: a,
                    ranges: held(&st, 5, 10),
                    leaving: false,
                },
                false
            ),
            CommandResult::Released { count: 5 }
        );
        assign(&mut st, vec![], 5..10, NOBODY, b);
        let s = st.section(SectionId(7)).unwrap();
        assert_eq!((s.owner, s.epoch, s.no_wait), (b, Epoch(3), true));
        assert_eq!(st.owner_runs(), vec![run(0, 5, a), run(5, 10, b)]);
    }

    #[test]
    fn leaving_release_forgets_the_incarnation() {
        let (mut st, a) = ready();
        let v = st.route_version;
        let r = st.apply(
            &Command::Release {
                incarnation: a,
                ranges: held(&st, 0, 10),
                leaving: true,
            },
            false,
        );
        assert_eq!(r, CommandResult::Released { count: 10 });
        assert!(st.allocsvrs.is_empty());
        assert!(st.route_version > v);
        assert!(st.sections.iter().all(|s| s.owner == NOBODY && s.no_wait));
        assert_eq!(bump(&mut st, a, 0, 2, 10), CommandResult::UnknownIncarnation);
    }

    #[test]
    fn re_registration_supersedes_the_old_incarnation() {
        let (mut st, a) = ready();
        let a2 = register(&mut st, 1);
        assert!(a2 > a);
        assert_eq!(bump(&mut st, a, 0, 1, 10), CommandResult::UnknownIncarnation);
    }

    #[test]
    fn unknown_section_and_uninitialized_set_are_invalid() {
        let (mut st, a) = ready();
        assert!(matches!(bump(&mut st, a, 10, 1, 10), CommandResult::Invalid(_)));
        let mut empty = SetState::default();
        assert!(matches!(
            empty.apply(
                &Command::Register {
                    node_id: NodeId(1),
                    addr: "a".into(),
                    nonce: 0,
                },
                false
            ),
            CommandResult::Invalid(_)
        ));
    }

    #[test]
    fn init_is_applied_once() {
        let (mut st, _) = ready();
        let before = st.clone();
        assert_eq!(
            st.apply(&Command::Init(SetParams { step: 99, ..params() }), false),
            CommandResult::Initialized { fresh: false }
        );
        assert_eq!(st, before);
    }

    #[test]
    fn a_late_release_does_not_take_a_section_back_from_its_current_owner() {
        let (mut st, a) = ready();
        let c = register(&mut st, 2);
        // A hands sections 0..5 over with Release R; R commits but its reply is lost.
        let r = Command::Release {
            incarnation: a,
            ranges: held(&st, 0, 5),
            leaving: false,
        };
        st.apply(&r, false);
        assign(&mut st, vec![], 0..5, NOBODY, c);
        // C leaves cleanly, the sections come back to A (no wait), C restarts as C2.
        st.apply(
            &Command::Release {
                incarnation: c,
                ranges: held(&st, 0, 5),
                leaving: true,
            },
            false,
        );
        assign(&mut st, vec![], 0..5, NOBODY, a);
        let before = st.section(SectionId(2)).unwrap().clone();
        assert_eq!(before.owner, a);
        let _c2 = register(&mut st, 2);
        // The resent R lands now: it must change nothing.
        let mut unfenced = st.clone();
        st.apply(&r, false);
        assert_eq!(
            st.section(SectionId(2)).unwrap(),
            &before,
            "a stale Release took the section from its owner"
        );
        // The negative control restores the old rule, and with it the hole.
        let rules = UnsafeRules {
            unfenced_release: true,
            ..UnsafeRules::default()
        };
        unfenced.apply_with(&r, rules);
        assert_eq!(
            unfenced.section(SectionId(2)).unwrap().owner,
            NOBODY,
            "--unsafe-unfenced-release lets R end A's grant"
        );
    }

    #[test]
    fn a_bump_far_above_the_ceiling_is_refused() {
        let (mut st, a) = ready();
        let CommandResult::Bumped(r) = bump(&mut st, a, 0, 1, u64::MAX - 1) else {
            panic!()
        };
        assert_eq!(
            r[0].outcome,
            BumpOutcome::OutOfRange,
            "a forged bump to 2^64-2 was applied"
        );
        assert_eq!(st.section(SectionId(0)).unwrap().max_seq, 0);
        // An owner's own bumps (one step above the ceiling, a retry of the same) pass; the bound
        // is MAX_BUMP_STEPS steps above the current ceiling, inclusive.
        let step = params().step;
        let cases = [
            (step, BumpOutcome::Applied),
            (step, BumpOutcome::NoOp),
            (step + MAX_BUMP_STEPS * step + 1, BumpOutcome::OutOfRange),
            (step + MAX_BUMP_STEPS * step, BumpOutcome::Applied),
        ];
        for (new_max, want) in cases {
            let CommandResult::Bumped(r) = bump(&mut st, a, 0, 1, new_max) else {
                panic!()
            };
            assert_eq!(r[0].outcome, want, "new_max {new_max}");
        }
        assert_eq!(st.max_seq_sum(), (1 + MAX_BUMP_STEPS) * step);
        st.sections[1].max_seq = u64::MAX;
        assert_eq!(st.max_seq_sum(), u64::MAX, "the sum saturates");
    }

    #[test]
    fn a_retried_register_of_the_same_process_keeps_its_incarnation() {
        let mut st = SetState::default();
        st.apply(&Command::Init(params()), false);
        let first = register_with(&mut st, 1, 42);
        // The same process's Register, retried after its first attempt committed, lands late.
        let again = register_with(&mut st, 1, 42);
        assert_eq!(again, first, "a retried Register minted a new incarnation");
        assert!(
            st.allocsvrs.contains_key(&first),
            "the incarnation in use was superseded"
        );
    }

    fn bound(secret: &[u8], cmd: Command) -> Command {
        Command::Bound {
            secret_hash: SecretHash::of(secret),
            cmd: Box::new(cmd),
        }
    }

    /// A set whose only AllocSvr registered bound to `secret` and owns every section.
    fn ready_bound(secret: &[u8]) -> (SetState, Incarnation) {
        let mut st = SetState::default();
        st.apply(&Command::Init(params()), false);
        let reg = Command::Register {
            node_id: NodeId(1),
            addr: "a".into(),
            nonce: 5,
        };
        let CommandResult::Registered { incarnation } = st.apply(&bound(secret, reg), false) else {
            panic!("register")
        };
        assign(&mut st, vec![], 0..10, NOBODY, incarnation);
        (st, incarnation)
    }

    /// The log itself refuses a forged Bump or Release of a bound incarnation, whatever the leader
    /// checked before it proposed: without the hash, or with another one, nothing changes.
    #[test]
    fn a_bound_incarnations_release_or_bump_without_its_secret_changes_nothing() {
        let (mut st, a) = ready_bound(b"the owner's secret");
        let release = |leaving| Command::Release {
            incarnation: a,
            ranges: vec![Released {
                begin: SectionId(3),
                end: SectionId(4),
                epoch: Epoch(1),
                waited: true,
            }],
            leaving,
        };
        let bump = Command::Bump {
            incarnation: a,
            items: vec![BumpItem {
                section: SectionId(3),
                epoch: Epoch(1),
                new_max: 10,
            }],
        };
        let before = st.clone();
        for forged in [release(false), release(true), bump.clone()] {
            assert_eq!(st.apply(&forged, false), CommandResult::NotBound, "bare {forged:?}");
            let guessed = bound(b"a guess", forged.clone());
            assert_eq!(st.apply(&guessed, false), CommandResult::NotBound, "guessed {forged:?}");
            assert_eq!(st, before, "{forged:?} changed the state");
        }
        // The owner's own calls, and the negative control that lets anyone through.
        let own = st.apply(&bound(b"the owner's secret", bump.clone()), false);
        assert!(matches!(own, CommandResult::Bumped(_)), "{own:?}");
        let mut open = st.clone();
        let rules = UnsafeRules {
            skip_binding: true,
            ..UnsafeRules::default()
        };
        assert_eq!(
            open.apply_with(&release(true), rules),
            CommandResult::Released { count: 1 }
        );
        assert!(
            open.allocsvrs.is_empty(),
            "--unsafe-skip-binding lets a forged leaving through"
        );
        assert!(open.bindings.is_empty(), "the hash of a gone incarnation is forgotten");
    }

    /// A retry of a bound registration (same nonce, same secret) gets the incarnation of the
    /// attempt that committed; the same nonce with another secret is somebody else, who gets a
    /// new incarnation rather than the one in use.
    #[test]
    fn a_retried_bound_register_keeps_its_incarnation_and_a_stolen_nonce_does_not() {
        let (mut st, a) = ready_bound(b"the owner's secret");
        let reg = |secret: &[u8]| {
            bound(
                secret,
                Command::Register {
                    node_id: NodeId(1),
                    addr: "a".into(),
                    nonce: 5,
                },
            )
        };
        assert_eq!(
            st.apply(&reg(b"the owner's secret"), false),
            CommandResult::Registered { incarnation: a }
        );
        let CommandResult::Registered { incarnation: b } = st.apply(&reg(b"a thief's secret"), false) else {
            panic!()
        };
        assert!(b > a, "the stolen nonce got the incarnation in use");
        assert_eq!(st.bindings.len(), 1, "the superseded incarnation's hash stayed");
    }

    /// Incarnations registered without a secret (older AllocSvrs, older log entries) keep working
    /// without one, and a Bound wrapper around anything but Register, Bump or Release is invalid.
    #[test]
    fn unbound_incarnations_need_no_secret_and_only_incarnation_calls_can_be_bound() {
        let (mut st, a) = ready();
        assert!(matches!(bump(&mut st, a, 0, 1, 10), CommandResult::Bumped(_)));
        let drain = bound(b"x", Command::Drain { node_id: NodeId(1) });
        assert!(matches!(st.apply(&drain, false), CommandResult::Invalid(_)));
        let twice = bound(b"x", bound(b"x", Command::Drain { node_id: NodeId(1) }));
        assert!(matches!(st.apply(&twice, false), CommandResult::Invalid(_)));
    }

    /// `Bound` was appended: every older variant keeps its position in the log's encoding.
    #[test]
    fn the_bound_command_is_the_last_variant() {
        let cmd = bound(b"s", Command::Drain { node_id: NodeId(1) });
        let bytes = postcard::to_stdvec(&cmd).unwrap();
        assert_eq!(bytes[0], 11, "Bound must follow Audit (10)");
        let note = AuditNote {
            who: "w".into(),
            at_ms: 0,
            what: "x".into(),
        };
        let audit = Command::Audit(AuditRecord::new(&note, "done"));
        assert_eq!(postcard::to_stdvec(&audit).unwrap()[0], 10);
        assert_eq!(postcard::from_bytes::<Command>(&bytes).unwrap(), cmd);
    }

    proptest::proptest! {
        /// P3: whatever sequence of commands is applied, no section's max_seq decreases.
        #[test]
        fn max_seq_never_decreases(ops in proptest::collection::vec((0u8..4, 0u64..12, 0u64..4, 0u64..300), 1..200)) {
            let (mut st, _) = ready();
            for (kind, section, epoch, val) in ops {
                let before: Vec<u64> = st.sections.iter().map(|s| s.max_seq).collect();
                let inc = st.allocsvrs.keys().next().copied().unwrap_or(NOBODY);
                let (s, e) = (SectionId(section), Epoch(epoch));
                let cmd = match kind {
                    0 => Command::Bump { incarnation: inc, items: vec![BumpItem { section: s, epoch: e, new_max: val }] },
                    1 => Command::Release { incarnation: inc, ranges: vec![Released { begin: s, end: SectionId(section + 2), epoch: Epoch(val % 4), waited: val % 2 == 0 }], leaving: epoch == 3 },
                    2 => Command::Register { node_id: NodeId(epoch), addr: "x".into(), nonce: val },
                    _ => Command::Assign { expire: vec![], moves: vec![Move { begin: SectionId(0), end: SectionId(10), from: NOBODY, to: inc }] },
                };
                st.apply(&cmd, false);
                for (b, s) in before.iter().zip(&st.sections) {
                    proptest::prop_assert!(s.max_seq >= *b);
                }
            }
        }
    }
}
