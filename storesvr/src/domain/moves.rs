//! A set's half of moving a uid range to another set: the range steps, as a sub-machine with its
//! own command ([`RangeCommand`]) and result ([`StepResult`]) over the parts of the set's state it
//! borrows ([`MoveSteps`]); `SetState` only wraps it, as it wraps the cluster map's.
//!
//! A move of sections `[begin, end)` from set A to set B is driven by an operator's tool, one
//! step at a time, each step a Raft command keyed by the move's op id:
//!
//! ```text
//!   B: Import   absent/tombstoned ──▶ importing(op)
//!   A: Freeze   owned ──▶ migrating(op)      epoch +1, bumps refused, owners asked to hand over
//!   A: (read)   the final max_seq of every section, once the owners are provably gone
//!   A: Seal     migrating(op), phase sealed: its ceilings are in the map's record; no Cancel
//!   B: Install  importing(op) ──▶ owned      max_seq = max(own, A's), epoch +1, no owner yet
//!   A: Tombstone migrating(op) ──▶ tombstoned(op, B, map version)   epoch +1, owner dropped
//!   A or B: Cancel (before the point of no return) importing(op) ──▶ absent,
//!                                                    migrating(op) ──▶ owned (epoch +1)
//! ```
//!
//! The seal is the point of no return, and the source must know it has passed: the driver records
//! the ceilings in the map's record first and then seals the source, and installs on the target
//! only once the source is sealed. A set-level Cancel that reaches the source after that (an older
//! driver, a hand-made RangeStep) is refused, so the range is never given back while the target
//! may serve it. One that reaches the source between the map's seal and the source's makes the
//! source's Seal fail, and the driver stops before the install: the move is stuck, not duplicated.
//!
//! Each step checks the range states of every section it names and either changes all of them
//! or none (`Refused`); repeating a step that was applied answers `Stepped { already: true }`
//! and changes nothing, so a driver that died after sending a step can send it again.
//!
//! What makes the move safe is split between this file and the driver: here, a set never bumps,
//! grants or routes a section it does not own, and the target starts at or above the source's
//! ceiling; the driver orders the steps (the target's state is written before the source's is
//! removed) and waits until the source's owners are provably gone before it reads the final
//! ceilings ([`SetState::export_status`] says whether the fast path applies).
//!
//! Left out: the cluster map and the op record (they live in the map's home, see
//! `cluster_map.rs`), and time: the lease wait is measured by the source's leader, not here.

use super::ranges::{OpId, RangeState};
use std::collections::BTreeMap;

use seqsvr_proto::Epoch;
use seqsvr_proto::params::SetParams;
use serde::{Deserialize, Serialize};

use super::ranges::RangeTable;
use super::section::{NOBODY, SectionState, Span, clamp, sections_of, slot};

/// One range step (see the module docs for the order).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RangeCommand {
    Import {
        op: OpId,
        span: Span,
        from_set: u64,
    },
    Freeze {
        op: OpId,
        span: Span,
        to_set: u64,
    },
    /// `ceilings[i]` is the source's final `max_seq` of section `span.begin + i`.
    Install {
        op: OpId,
        span: Span,
        ceilings: Vec<u64>,
    },
    Tombstone {
        op: OpId,
        span: Span,
        to_set: u64,
        map_version: u64,
    },
    Cancel {
        op: OpId,
        span: Span,
    },
    /// The source's ceilings went into the map's record: from here on this set refuses a Cancel.
    /// Appended last: the log stores a variant by position.
    Seal {
        op: OpId,
        span: Span,
    },
}

/// This set's side of one move.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalMove {
    pub span: Span,
    pub role: Role,
    pub phase: SidePhase,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// Cancelled before any step reached this set.
    Unseen,
    Import {
        from_set: u64,
    },
    Export {
        to_set: u64,
    },
}

/// How far this set's side of a move got. Not the move's phase (that is the record's,
/// `cluster_map::Phase`, kept by set 0): a set sees only the steps sent to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SidePhase {
    /// Imported range marked, or exported range frozen.
    Started,
    /// Installed (import) or tombstoned (export): this set's part is done.
    Done,
    Cancelled,
    /// Exported and sealed: the range is still migrating here, but can only end tombstoned.
    /// Appended last: snapshots store a variant by position.
    Sealed,
}

/// How far the owners of a frozen range have let go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExportStatus {
    pub span: Span,
    pub to_set: u64,
    /// Sections that still have an owner (it has not released them yet).
    pub held: u64,
    /// Sections whose last owner let go without having waited out its predecessor's lease (a
    /// forced takeover): that predecessor may still be serving until its lease ends.
    pub forced: u64,
}

impl ExportStatus {
    /// Every owner released and none could still be serving under an older lease: the range
    /// may be read and installed elsewhere without waiting out a lease.
    pub fn released(&self) -> bool {
        self.held == 0 && self.forced == 0
    }
}

/// The move steps as a machine of their own, over the parts of a set's state they touch: the
/// range states, this set's side of each move, and the sections (their epochs, owners and
/// ceilings). `SetState` lends them for one step and wraps the result.
pub struct MoveSteps<'a> {
    pub ranges: &'a mut RangeTable,
    pub moves: &'a mut BTreeMap<OpId, LocalMove>,
    pub sections: &'a mut [SectionState],
    /// Set by a step that changed which sections the set serves: the set's route version must
    /// rise so that AllocSvrs and clients learn it.
    pub routes_changed: bool,
}

/// What a range step did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepResult {
    /// Applied now, or (`already`) before: a repeated step changes nothing.
    Stepped { already: bool },
    /// The set's state does not allow it (out of order, another move's sections, cancelled).
    Refused(String),
    /// Malformed: sections outside the set's space, ceilings that do not match the span.
    Invalid(String),
}

/// The same parts, read only: what a move's driver asks of the source.
pub struct MoveView<'a> {
    pub ranges: &'a RangeTable,
    pub moves: &'a BTreeMap<OpId, LocalMove>,
    pub sections: &'a [SectionState],
}

impl MoveSteps<'_> {
    /// Applies one range step; a step that is refused or invalid changes nothing.
    pub fn apply(&mut self, p: &SetParams, step: &RangeCommand) -> StepResult {
        let span = step.span();
        if span.begin >= span.end || span.end.0 > p.total_sections() {
            return StepResult::Invalid(format!(
                "sections [{}, {}) are empty or past the last section {}",
                span.begin,
                span.end,
                p.total_sections().saturating_sub(1)
            ));
        }
        if let Some(m) = self.moves.get(&step.op())
            && m.span != span
        {
            return StepResult::Refused(format!(
                "move {} is about sections [{}, {}), not [{}, {})",
                step.op(),
                m.span.begin,
                m.span.end,
                span.begin,
                span.end
            ));
        }
        match step {
            RangeCommand::Import { op, from_set, .. } => self.import(p, *op, span, *from_set),
            RangeCommand::Freeze { op, to_set, .. } => self.freeze(p, *op, span, *to_set),
            RangeCommand::Install { op, ceilings, .. } => self.install(p, *op, span, ceilings),
            RangeCommand::Tombstone {
                op,
                to_set,
                map_version,
                ..
            } => self.tombstone(p, *op, span, *to_set, *map_version),
            RangeCommand::Cancel { op, .. } => self.cancel(p, *op, span),
            RangeCommand::Seal { op, .. } => self.seal(*op, span),
        }
    }

    /// Marks this set's side of move `op` sealed: its range must be frozen here for `op`.
    fn seal(&mut self, op: OpId, span: Span) -> StepResult {
        let frozen = |s: Option<RangeState>| matches!(s, Some(RangeState::Migrating { op: o, .. }) if o == op);
        if let Some(done) = self.repeated(op, SidePhase::Sealed, frozen) {
            return done;
        }
        let exporting = self
            .moves
            .get(&op)
            .is_some_and(|m| matches!(m.role, Role::Export { .. }) && m.phase == SidePhase::Started);
        if !exporting || !self.ranges.all(span.begin, span.end, frozen) {
            return self.refuse(op, span, "seal");
        }
        self.set_phase(op, SidePhase::Sealed);
        StepResult::Stepped { already: false }
    }

    fn import(&mut self, p: &SetParams, op: OpId, span: Span, from_set: u64) -> StepResult {
        if from_set == p.set_id {
            return StepResult::Refused(format!("set {from_set} cannot move a range to itself"));
        }
        let importing = RangeState::Importing { op };
        if let Some(done) = self.repeated(op, SidePhase::Started, |s| s == Some(importing)) {
            return done;
        }
        let free = |s: Option<RangeState>| matches!(s, None | Some(RangeState::Tombstoned { .. }));
        if self.moves.contains_key(&op) || !self.ranges.all(span.begin, span.end, free) {
            return self.refuse(op, span, "import");
        }
        self.ranges.set(span.begin, span.end, Some(importing));
        self.record(op, span, Role::Import { from_set });
        StepResult::Stepped { already: false }
    }

    fn freeze(&mut self, p: &SetParams, op: OpId, span: Span, to_set: u64) -> StepResult {
        if to_set == p.set_id {
            return StepResult::Refused(format!("set {to_set} cannot move a range to itself"));
        }
        let migrating = RangeState::Migrating { op, to_set };
        if let Some(done) = self.repeated(op, SidePhase::Started, |s| s == Some(migrating)) {
            return done;
        }
        if self.moves.contains_key(&op) || !self.ranges.all(span.begin, span.end, |s| s == Some(RangeState::Owned)) {
            return self.refuse(op, span, "freeze");
        }
        for section in clamp(p, span.begin, span.end) {
            let s = &mut self.sections[slot(section)];
            // The owner keeps the section under a new epoch: its next renewal sees the grant
            // change, is asked to hand it over, drops it and releases it (the fast path).
            s.epoch = Epoch(s.epoch.0 + 1);
        }
        self.ranges.set(span.begin, span.end, Some(migrating));
        self.record(op, span, Role::Export { to_set });
        self.routes_changed = true;
        StepResult::Stepped { already: false }
    }

    fn install(&mut self, p: &SetParams, op: OpId, span: Span, ceilings: &[u64]) -> StepResult {
        if ceilings.len() as u64 != span.end.0 - span.begin.0 {
            return StepResult::Invalid(format!(
                "{} ceilings for {} sections",
                ceilings.len(),
                span.end.0 - span.begin.0
            ));
        }
        if let Some(done) = self.repeated(op, SidePhase::Done, |s| s == Some(RangeState::Owned)) {
            return done;
        }
        let importing = RangeState::Importing { op };
        if !self.ranges.all(span.begin, span.end, |s| s == Some(importing)) {
            return self.refuse(op, span, "install");
        }
        for (section, &ceiling) in clamp(p, span.begin, span.end).zip(ceilings) {
            let s = &mut self.sections[slot(section)];
            // max, never the source's value alone: this set may have served the range before
            // (a range that comes back), and its own ceiling must not go down (P3).
            s.max_seq = s.max_seq.max(ceiling);
            s.change_owner(NOBODY);
            s.no_wait = true;
        }
        self.ranges.set(span.begin, span.end, Some(RangeState::Owned));
        self.set_phase(op, SidePhase::Done);
        self.routes_changed = true;
        StepResult::Stepped { already: false }
    }

    fn tombstone(&mut self, p: &SetParams, op: OpId, span: Span, to_set: u64, map_version: u64) -> StepResult {
        let gone = RangeState::Tombstoned {
            op,
            to_set,
            map_version,
        };
        if let Some(done) = self.repeated(op, SidePhase::Done, |s| s == Some(gone)) {
            return done;
        }
        if !self.ranges.all(span.begin, span.end, |s| {
            s == Some(RangeState::Migrating { op, to_set })
        }) {
            return self.refuse(op, span, "tombstone");
        }
        for section in clamp(p, span.begin, span.end) {
            let s = &mut self.sections[slot(section)];
            // An owner that never released (dead, or cut off past its lease) is fenced for good.
            if s.owner != NOBODY {
                s.change_owner(NOBODY);
            }
            s.no_wait = true;
        }
        self.ranges.set(span.begin, span.end, Some(gone));
        self.set_phase(op, SidePhase::Done);
        self.routes_changed = true;
        StepResult::Stepped { already: false }
    }

    fn cancel(&mut self, p: &SetParams, op: OpId, span: Span) -> StepResult {
        match self.moves.get(&op).map(|m| m.phase) {
            Some(SidePhase::Cancelled) => return StepResult::Stepped { already: true },
            Some(SidePhase::Done) => return self.refuse(op, span, "cancel"),
            // Past the point of no return: the target may already serve the range.
            Some(SidePhase::Sealed) => {
                return StepResult::Refused(format!(
                    "move {op} is sealed on this set (its final ceilings are in the cluster map's record and \
                     the target may serve the range): it cannot be cancelled, only finished (seqctl move resume {op})"
                ));
            }
            None => {
                // Cancelled before this set saw the move: remember it, so that a late step of the
                // same op is refused rather than started.
                self.moves.insert(
                    op,
                    LocalMove {
                        span,
                        role: Role::Unseen,
                        phase: SidePhase::Cancelled,
                    },
                );
                return StepResult::Stepped { already: false };
            }
            Some(SidePhase::Started) => {}
        }
        for run in self.ranges.runs_in(span.begin, span.end) {
            match run.state {
                RangeState::Importing { op: o } if o == op => self.ranges.set(run.begin, run.end, None),
                RangeState::Migrating { op: o, .. } if o == op => {
                    for section in clamp(p, run.begin, run.end) {
                        let s = &mut self.sections[slot(section)];
                        s.epoch = Epoch(s.epoch.0 + 1);
                    }
                    self.ranges.set(run.begin, run.end, Some(RangeState::Owned));
                }
                _ => {}
            }
        }
        self.set_phase(op, SidePhase::Cancelled);
        self.routes_changed = true;
        StepResult::Stepped { already: false }
    }

    /// `Some(already)` when the op has reached `phase` and every section of its span is as
    /// `done` expects; `Some(refused)` when it was cancelled.
    fn repeated(&self, op: OpId, phase: SidePhase, done: impl Fn(Option<RangeState>) -> bool) -> Option<StepResult> {
        let m = self.moves.get(&op)?;
        if m.phase == SidePhase::Cancelled {
            return Some(StepResult::Refused(format!("move {op} was cancelled")));
        }
        (m.phase == phase && self.ranges.all(m.span.begin, m.span.end, done))
            .then_some(StepResult::Stepped { already: true })
    }

    fn refuse(&self, op: OpId, span: Span, step: &str) -> StepResult {
        let states: Vec<String> = self
            .ranges
            .runs_in(span.begin, span.end)
            .iter()
            .map(|r| format!("[{}, {}) {:?}", r.begin, r.end, r.state))
            .collect();
        let phase = self.moves.get(&op).map(|m| format!("{:?}", m.phase));
        StepResult::Refused(format!(
            "cannot {step} sections [{}, {}) for move {op} (its phase here: {}); their states: {}",
            span.begin,
            span.end,
            phase.as_deref().unwrap_or("none"),
            if states.is_empty() {
                "none (not this set's)".to_string()
            } else {
                states.join(", ")
            }
        ))
    }

    fn record(&mut self, op: OpId, span: Span, role: Role) {
        self.moves.insert(
            op,
            LocalMove {
                span,
                role,
                phase: SidePhase::Started,
            },
        );
    }

    fn set_phase(&mut self, op: OpId, phase: SidePhase) {
        if let Some(m) = self.moves.get_mut(&op) {
            m.phase = phase;
        }
    }
}

impl MoveView<'_> {
    /// How far the owners of move `op`'s frozen range have let go; `None` unless it is frozen here.
    pub fn export_status(&self, op: OpId) -> Option<ExportStatus> {
        let m = self.moves.get(&op)?;
        let Role::Export { to_set } = m.role else {
            return None;
        };
        if !matches!(m.phase, SidePhase::Started | SidePhase::Sealed) {
            return None;
        }
        let (mut held, mut forced) = (0, 0);
        for (_, s) in sections_of(self.sections, m.span.begin, m.span.end) {
            held += u64::from(s.owner != NOBODY);
            forced += u64::from(!s.no_wait);
        }
        Some(ExportStatus {
            span: m.span,
            to_set,
            held,
            forced,
        })
    }

    /// The final ceilings of move `op`'s range, section by section: only once it is frozen here
    /// (no bump can raise them any more) or tombstoned.
    pub fn final_ceilings(&self, op: OpId) -> Option<Vec<u64>> {
        let m = self.moves.get(&op)?;
        let frozen = |s: Option<RangeState>| match s {
            Some(RangeState::Migrating { op: o, .. } | RangeState::Tombstoned { op: o, .. }) => o == op,
            _ => false,
        };
        (matches!(m.role, Role::Export { .. }) && self.ranges.all(m.span.begin, m.span.end, frozen)).then(|| {
            sections_of(self.sections, m.span.begin, m.span.end)
                .map(|(_, s)| s.max_seq)
                .collect()
        })
    }
}

impl RangeCommand {
    pub fn op(&self) -> OpId {
        match self {
            Self::Import { op, .. }
            | Self::Freeze { op, .. }
            | Self::Install { op, .. }
            | Self::Tombstone { op, .. }
            | Self::Cancel { op, .. }
            | Self::Seal { op, .. } => *op,
        }
    }

    pub fn span(&self) -> Span {
        match self {
            Self::Import { span, .. }
            | Self::Freeze { span, .. }
            | Self::Install { span, .. }
            | Self::Tombstone { span, .. }
            | Self::Cancel { span, .. }
            | Self::Seal { span, .. } => *span,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::state::{Command, CommandResult, Move, SetState};
    use crate::domain::testing::{set_with, small_params};
    use seqsvr_proto::{Incarnation, SectionId};

    const OP: OpId = 41;

    fn span(begin: u64, end: u64) -> Span {
        Span {
            begin: SectionId(begin),
            end: SectionId(end),
        }
    }

    /// An initialized set with id `set_id` that owns nothing yet.
    fn empty_set(set_id: u64) -> SetState {
        let mut p = small_params();
        p.set_id = set_id;
        p.section_begin = 0;
        p.section_end = 0;
        let mut st = SetState::default();
        st.apply(&Command::Init(p), false);
        st
    }

    fn step(st: &mut SetState, cmd: RangeCommand) -> CommandResult {
        st.apply(&Command::Range(cmd), false)
    }

    fn assign_all(st: &mut SetState, to: Incarnation) {
        let moves = vec![Move {
            begin: SectionId(0),
            end: SectionId(10),
            from: NOBODY,
            to,
        }];
        st.apply(&Command::Assign { expire: vec![], moves }, false);
    }

    fn ok(already: bool) -> CommandResult {
        CommandResult::Stepped { already }
    }

    fn refused(r: &CommandResult) -> bool {
        matches!(r, CommandResult::Refused(_))
    }

    /// Sections 2..5 of set 0, owned and bumped by `a`, moved to set 1 on the released path.
    // The whole hand-over, each step repeated, and a range coming back above both ceilings, are
    // told as golden scripts: testscripts/every_move_step_repeats_harmlessly and
    // a_range_coming_back_starts_above_both_ceilings.

    #[test]
    fn steps_out_of_order_or_over_foreign_sections_are_refused_and_change_nothing() {
        let (mut src, _) = set_with(&[1]);
        let mut dst = empty_set(1);
        let before = (src.clone(), dst.clone());
        let import_owned = RangeCommand::Import {
            op: OP,
            span: span(0, 3),
            from_set: 1,
        };
        let install_unimported = RangeCommand::Install {
            op: OP,
            span: span(0, 3),
            ceilings: vec![0; 3],
        };
        let tombstone_unfrozen = RangeCommand::Tombstone {
            op: OP,
            span: span(0, 3),
            to_set: 1,
            map_version: 1,
        };
        let freeze_foreign = RangeCommand::Freeze {
            op: OP,
            span: span(0, 3),
            to_set: 0,
        };
        assert!(refused(&step(&mut src, import_owned)));
        assert!(refused(&step(&mut src, install_unimported)));
        assert!(refused(&step(&mut src, tombstone_unfrozen)));
        assert!(refused(&step(&mut dst, freeze_foreign)));
        assert_eq!((src.clone(), dst.clone()), before);
        let to_self = RangeCommand::Freeze {
            op: OP,
            span: span(0, 3),
            to_set: 0,
        };
        assert!(refused(&step(&mut src, to_self)));
        let past_the_end = RangeCommand::Freeze {
            op: OP,
            span: span(8, 11),
            to_set: 1,
        };
        assert!(matches!(step(&mut src, past_the_end), CommandResult::Invalid(_)));
        let wrong_count = RangeCommand::Install {
            op: OP,
            span: span(0, 3),
            ceilings: vec![0; 2],
        };
        assert!(matches!(step(&mut dst, wrong_count), CommandResult::Invalid(_)));
    }

    #[test]
    fn overlapping_moves_are_refused_and_a_span_cannot_change_under_an_op() {
        let (mut src, _) = set_with(&[1]);
        let freeze = |op, b, e| RangeCommand::Freeze {
            op,
            span: span(b, e),
            to_set: 1,
        };
        assert_eq!(step(&mut src, freeze(1, 0, 4)), ok(false));
        assert!(
            refused(&step(&mut src, freeze(2, 3, 6))),
            "sections 3 is frozen by move 1"
        );
        assert!(refused(&step(&mut src, freeze(1, 0, 5))), "move 1 is about [0, 4)");
        assert_eq!(
            step(&mut src, freeze(2, 4, 6)),
            ok(false),
            "disjoint moves may run at once"
        );
    }

    /// Once sealed, the source never gives the range back: a set-level Cancel (a hand-made
    /// RangeStep, an older driver) is refused and leaves the range frozen, and the move can still
    /// end by its tombstone. A Seal needs the range frozen for its op; it repeats harmlessly.
    #[test]
    fn a_sealed_source_refuses_a_cancel_and_still_tombstones() {
        let (mut src, incs) = set_with(&[1]);
        assign_all(&mut src, incs[0]);
        let (freeze, seal, cancel) = (
            RangeCommand::Freeze {
                op: OP,
                span: span(0, 2),
                to_set: 1,
            },
            RangeCommand::Seal {
                op: OP,
                span: span(0, 2),
            },
            RangeCommand::Cancel {
                op: OP,
                span: span(0, 2),
            },
        );
        assert!(refused(&step(&mut src, seal.clone())), "nothing frozen to seal");
        assert_eq!(step(&mut src, freeze), ok(false));
        assert!(
            refused(&step(
                &mut src,
                RangeCommand::Seal {
                    op: OP,
                    span: span(0, 3)
                }
            )),
            "another span"
        );
        assert_eq!(step(&mut src, seal.clone()), ok(false));
        assert_eq!(step(&mut src, seal.clone()), ok(true));
        let before = src.clone();
        let r = step(&mut src, cancel);
        assert!(refused(&r) && format!("{r:?}").contains("sealed"), "{r:?}");
        assert_eq!(src, before, "a refused cancel changed the set");
        assert!(matches!(
            src.ranges.state_at(SectionId(1)),
            Some(RangeState::Migrating { op: OP, .. })
        ));
        let tombstone = RangeCommand::Tombstone {
            op: OP,
            span: span(0, 2),
            to_set: 1,
            map_version: 7,
        };
        assert_eq!(step(&mut src, tombstone), ok(false));
        assert!(refused(&step(&mut src, seal)), "a tombstoned move is past its seal");
    }

    /// `Seal` and the local `Sealed` phase were appended: older variants keep their positions.
    #[test]
    fn the_seal_step_and_phase_are_appended() {
        let seal = postcard::to_stdvec(&RangeCommand::Seal {
            op: 1,
            span: span(0, 1),
        })
        .unwrap();
        assert_eq!(seal[0], 5, "Seal must follow Cancel (4)");
        assert_eq!(postcard::to_stdvec(&SidePhase::Sealed).unwrap(), [3]);
        assert_eq!(postcard::to_stdvec(&SidePhase::Cancelled).unwrap(), [2]);
    }

    #[test]
    fn cancel_gives_a_frozen_range_back_under_a_new_epoch_and_forgets_an_import() {
        let (mut src, incs) = set_with(&[1]);
        assign_all(&mut src, incs[0]);
        let epoch = |st: &SetState| st.section(SectionId(1)).unwrap().epoch;
        let e0 = epoch(&src);
        let freeze = RangeCommand::Freeze {
            op: OP,
            span: span(0, 2),
            to_set: 1,
        };
        step(&mut src, freeze.clone());
        let cancel = RangeCommand::Cancel {
            op: OP,
            span: span(0, 2),
        };
        assert_eq!(step(&mut src, cancel.clone()), ok(false));
        assert_eq!(step(&mut src, cancel.clone()), ok(true));
        assert!(src.ranges.is_owned(SectionId(1)));
        assert_eq!(epoch(&src), Epoch(e0.0 + 2), "frozen and given back: two new epochs");
        assert!(
            refused(&step(&mut src, freeze)),
            "a cancelled move does not start again"
        );

        // The target never saw the move: the cancel is remembered, a late import refused.
        let mut dst = empty_set(1);
        assert_eq!(step(&mut dst, cancel), ok(false));
        let late = RangeCommand::Import {
            op: OP,
            span: span(0, 2),
            from_set: 0,
        };
        assert!(refused(&step(&mut dst, late)));
        assert_eq!(dst.ranges.state_at(SectionId(0)), None);
    }

    #[test]
    fn a_range_frozen_during_a_forced_takeover_must_wait_out_the_lease() {
        let (mut src, incs) = set_with(&[1, 2]);
        assign_all(&mut src, incs[0]);
        // The arbiter takes the sections from a dead owner: the new one waits a lease.
        let moves = vec![Move {
            begin: SectionId(0),
            end: SectionId(10),
            from: incs[0],
            to: incs[1],
        }];
        src.apply(
            &Command::Assign {
                expire: vec![incs[0]],
                moves,
            },
            false,
        );
        step(
            &mut src,
            RangeCommand::Freeze {
                op: OP,
                span: span(0, 2),
                to_set: 1,
            },
        );
        let status = src.export_status(OP).unwrap();
        assert!(status.forced == 2 && !status.released());
    }
}
