//! The commands of a set's state machine and their results: what one Raft entry carries and what
//! applying it answers, with their payloads, and the same in words for the audit trail
//! ([`describe`] a command, [`outcome`] of a result, [`wrap`] an admin action with its note).
//!
//! The types here are the log's format: postcard stores an enum variant by its position, so a new
//! variant goes last and no field changes (`format_pins` holds bytes written by older code). The
//! sub-machines' own commands (`RangeCommand`, `MapCommand`) and results live with them; this file
//! only wraps them.
//!
//! Left out: applying anything (`state`, `moves`, `cluster_map`).

use std::fmt::Write;

use seqsvr_proto::{Epoch, Incarnation, NodeId, SectionId};
use serde::{Deserialize, Serialize};

use super::audit::{AuditNote, AuditRecord, cut};
use super::binding::SecretHash;
use super::cluster_map::{MapCommand, MapResult, Phase};
use super::ledger::{LedgerCommand, LedgerResult};
use super::moves::RangeCommand;
use super::section::Span;
use super::slots::{SlotCommand, SlotResult};
use seqsvr_proto::params::SetParams;

/// One item of a fenced bump.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BumpItem {
    pub section: SectionId,
    pub epoch: Epoch,
    pub new_max: u64,
}

/// What happened to one bump item.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BumpOutcome {
    Applied,
    NoOp,
    StaleEpoch,
    /// `new_max` is more than [`MAX_BUMP_STEPS`] steps above `max_seq`: refused.
    OutOfRange,
    /// The set does not own the section (it is frozen for a move, or another set's): refused.
    NotOwned,
}

/// One bump item's outcome with the section's ceiling and epoch after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BumpResult {
    pub section: SectionId,
    pub outcome: BumpOutcome,
    pub max_seq: u64,
    pub epoch: Epoch,
}

/// Sections `[begin, end)` that an owner held under `epoch` and dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Released {
    pub begin: SectionId,
    pub end: SectionId,
    pub epoch: Epoch,
    /// The owner had waited out its predecessor's lease (or never had to): nobody else can be
    /// serving these sections, so the next owner need not wait.
    pub waited: bool,
}

/// Move the sections of `[begin, end)` that are owned by `from` ([`NOBODY`] = unowned)
/// to `to`. Sections whose owner changed since the arbiter decided are left alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Move {
    pub begin: SectionId,
    pub end: SectionId,
    pub from: Incarnation,
    pub to: Incarnation,
}

/// A state-machine command. Many commands travel in one Raft entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// First command of a set; later ones are ignored.
    Init(SetParams),
    /// A new incarnation for the node, unless a record with the same `nonce` exists (a retry).
    Register { node_id: NodeId, addr: String, nonce: u64 },
    Bump {
        incarnation: Incarnation,
        items: Vec<BumpItem>,
    },
    /// The owner gives sections up, each under the epoch it held it in; `leaving` also forgets
    /// the incarnation (clean shutdown).
    Release {
        incarnation: Incarnation,
        ranges: Vec<Released>,
        leaving: bool,
    },
    /// Arbiter decision: forget dead incarnations, then apply the moves.
    Assign { expire: Vec<Incarnation>, moves: Vec<Move> },
    /// A step of moving a uid range between sets (see `moves.rs`). New variants go last: the
    /// log stores a variant by its position.
    Range(RangeCommand),
    /// A change of the cluster map; only set 0 keeps it (see `cluster_map.rs`).
    Map(MapCommand),
    /// Hand every section of node `node_id`'s current incarnation to the other AllocSvrs.
    Drain { node_id: NodeId },
    /// Keep a published copy of the cluster map unless the set has this version or a newer one.
    CacheMap(CachedMap),
    /// An admin action with who asked and when: applies `cmd` and appends its record, with the
    /// outcome, to the audit trail in the same step (see `audit.rs`). `cmd` is never itself an
    /// audit command.
    Audited { note: AuditNote, cmd: Box<Command> },
    /// A record alone, for an admin action that is not a command (a membership change).
    Audit(AuditRecord),
    /// `cmd` made under a registration's secret, of which this is the hash: a `Register` binds
    /// the incarnation it mints to it; a `Bump` or `Release` is applied only when it matches what
    /// its incarnation registered with (see `binding`). Any other `cmd` is invalid.
    Bound { secret_hash: SecretHash, cmd: Box<Command> },
    /// A step of the worker-slot sub-machine for time-ordered ids (see `slots.rs`). A `Raise`
    /// and a `Release` are bound like a `Bump` and a `Release` of sections.
    Slots(SlotCommand),
    /// A step of the ledger sub-machine (see `ledger.rs`).
    Ledger(LedgerCommand),
}

/// Result of one command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandResult {
    Initialized {
        fresh: bool,
    },
    Registered {
        incarnation: Incarnation,
    },
    Bumped(Vec<BumpResult>),
    Released {
        count: u64,
    },
    Assigned {
        moved: u64,
        route_version: u64,
    },
    /// The incarnation is not registered (never was, superseded or expired).
    UnknownIncarnation,
    /// The command names a section outside the set, or the set is not initialized.
    Invalid(String),
    /// A range step that this set's range states do not allow (nothing changed).
    Refused(String),
    /// A range step was applied, or had been already (`already`): repeating one changes nothing.
    Stepped {
        already: bool,
    },
    Map(MapResult),
    /// The incarnation now draining, or none when the node is not registered.
    Draining {
        incarnation: Option<Incarnation>,
    },
    /// The version of the cached map after a `CacheMap`; `already` when it was not older.
    MapCached {
        version: u64,
        already: bool,
    },
    /// An `Audit` record was appended under this number.
    Recorded {
        number: u64,
    },
    /// The command named an incarnation bound to a secret and did not carry its hash: nothing
    /// changed.
    NotBound,
    Slots(SlotResult),
    Ledger(LedgerResult),
}

/// A set's cached copy of the cluster map: the encoded `pb::ClusterMap` exactly as published, and
/// its version. The state machine never looks inside (the servers hand it out as they got it), so
/// the log does not depend on the map's wire shape.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CachedMap {
    pub version: u64,
    pub encoded: Vec<u8>,
}

/// `cmd` as an admin action asked for by `who` at `at_ms` (the proposing leader's wall clock).
pub fn wrap(who: &str, at_ms: u64, cmd: Command) -> Command {
    let note = AuditNote {
        who: cut(who),
        at_ms,
        what: cut(&describe(&cmd)),
    };
    Command::Audited {
        note,
        cmd: Box::new(cmd),
    }
}

fn span(s: &Span) -> String {
    format!("sections [{}, {})", s.begin.0, s.end.0)
}

fn phase(p: &Phase) -> String {
    match p {
        Phase::Sealed(c) => format!("SEALED ({} ceilings)", c.len()),
        Phase::Switched { map_version } => format!("SWITCHED (map version {map_version})"),
        other => format!("{other:?}").to_uppercase(),
    }
}

fn describe_map(m: &MapCommand) -> String {
    match m {
        MapCommand::AddSet {
            expect_version,
            set_id,
            stores,
        } => format!(
            "add set {set_id} (stores {}) at map version {expect_version}",
            stores.join(",")
        ),
        MapCommand::Begin {
            expect_version,
            op,
            from,
            to,
            span: s,
            driver,
        } => format!(
            "begin move {op}: {} from set {from} to set {to} (driver {driver}, at map version {expect_version})",
            span(s)
        ),
        MapCommand::Claim { op, driver } => format!("claim move {op} (driver {driver})"),
        MapCommand::Advance { op, driver, phase: p } => {
            format!("advance move {op} to {} (driver {driver})", phase(p))
        }
        MapCommand::Finish { op, driver } => format!("finish move {op} (driver {driver})"),
    }
}

fn describe_slots(c: &SlotCommand) -> String {
    match c {
        SlotCommand::Setup {
            layout,
            per_set,
            max_ahead_ms,
        } => format!(
            "set up time-ordered ids: layout {layout}, {per_set} slots a set, marks at most {max_ahead_ms} ms ahead"
        ),
        SlotCommand::SetupSlots {
            layout,
            per_set,
            max_ahead_ms,
        } => format!(
            "set up time-ordered ids: layout {layout}, {per_set} slots a set, marks at most {max_ahead_ms} ms ahead; \
             counter keys placed by hash slot"
        ),
        SlotCommand::Grant(moves) => format!("grant {} slots", moves.len()),
        SlotCommand::Raise { holder, items, .. } | SlotCommand::RaiseCapped { holder, items, .. } => {
            format!("raise {} slot marks of incarnation {holder}", items.len())
        }
        SlotCommand::Release { holder, items } => format!("release {} slots of incarnation {holder}", items.len()),
    }
}

fn describe_ledger(c: &LedgerCommand) -> String {
    match c {
        LedgerCommand::Create { key, hold_ms } => format!("create ledger {key:?} (hold {hold_ms} ms)"),
        LedgerCommand::Reserve { key, holder, .. } => format!("reserve a number of ledger {key:?} for {holder:?}"),
        LedgerCommand::Confirm { key, number, .. } => format!("confirm number {number} of ledger {key:?}"),
        LedgerCommand::Release { key, number, .. } => format!("release number {number} of ledger {key:?}"),
        LedgerCommand::Void { key, number, who, .. } => format!("void number {number} of ledger {key:?} ({who})"),
        LedgerCommand::Reconcile { key, next, who, .. } => {
            format!("reconcile ledger {key:?}: reserves resume at {next} ({who})")
        }
        LedgerCommand::Expire { now_ms } => format!("expire ledger holds due by {now_ms}"),
        LedgerCommand::Install { op, span: s, ledgers } => {
            format!("install {} ledgers of move {op}: {}", ledgers.len(), span(s))
        }
        LedgerCommand::Issue { key, .. } => format!("issue a confirmed number of ledger {key:?}"),
    }
}

fn describe_range(r: &RangeCommand) -> String {
    match r {
        RangeCommand::Import { op, span: s, from_set } => {
            format!("range step IMPORT of move {op}: {} from set {from_set}", span(s))
        }
        RangeCommand::Freeze { op, span: s, to_set } => {
            format!("range step FREEZE of move {op}: {} to set {to_set}", span(s))
        }
        RangeCommand::Install { op, span: s, ceilings } => format!(
            "range step INSTALL of move {op}: {} with {} ceilings",
            span(s),
            ceilings.len()
        ),
        RangeCommand::Tombstone {
            op,
            span: s,
            to_set,
            map_version,
        } => format!(
            "range step TOMBSTONE of move {op}: {} now set {to_set}'s (map version {map_version})",
            span(s)
        ),
        RangeCommand::Cancel { op, span: s } => format!("range step CANCEL of move {op}: {}", span(s)),
        RangeCommand::Seal { op, span: s } => format!("range step SEAL of move {op}: {}", span(s)),
    }
}

/// The action `cmd` in words, with its arguments (long lists by their length).
pub fn describe(cmd: &Command) -> String {
    match cmd {
        Command::Map(m) => describe_map(m),
        Command::Slots(c) => describe_slots(c),
        Command::Ledger(c) => describe_ledger(c),
        Command::Range(r) => describe_range(r),
        Command::Drain { node_id } => format!("drain AllocSvr node {node_id}"),
        Command::CacheMap(m) => format!("publish map version {} ({} bytes)", m.version, m.encoded.len()),
        Command::Init(p) => format!("initialize set {}", p.set_id),
        Command::Register { node_id, addr, .. } => format!("register AllocSvr node {node_id} at {addr}"),
        Command::Bump { incarnation, items } => format!("bump {} sections of incarnation {incarnation}", items.len()),
        Command::Release {
            incarnation, ranges, ..
        } => {
            format!("release {} ranges of incarnation {incarnation}", ranges.len())
        }
        Command::Assign { expire, moves } => format!("assign: expire {}, {} moves", expire.len(), moves.len()),
        Command::Audited { cmd, .. } => format!("audited {}", describe(cmd)),
        Command::Audit(r) => format!("audit record: {}", r.what),
        Command::Bound { cmd, .. } => format!("{} (bound to its registration)", describe(cmd)),
    }
}

/// What came of a command, in words. Runs during apply: it reads the result only.
pub fn outcome(result: &CommandResult) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = match result {
        CommandResult::Map(MapResult::Ok {
            version,
            already: false,
        }) => write!(out, "done: map version {version}"),
        CommandResult::Map(MapResult::Ok { version, already: true }) => {
            write!(out, "already done: map version {version}")
        }
        CommandResult::Map(MapResult::VersionChanged { version }) => {
            write!(out, "not done: the map is at version {version} now")
        }
        CommandResult::Map(MapResult::Refused(m)) | CommandResult::Refused(m) => write!(out, "refused: {m}"),
        CommandResult::Invalid(m) => write!(out, "invalid: {m}"),
        CommandResult::Stepped { already: false } => write!(out, "done"),
        CommandResult::Stepped { already: true } => write!(out, "already done"),
        CommandResult::Draining { incarnation: Some(i) } => write!(out, "draining incarnation {i}"),
        CommandResult::Draining { incarnation: None } => write!(out, "refused: the node is not registered"),
        CommandResult::MapCached { version, already } => match already {
            false => write!(out, "done: map version {version} kept"),
            true => write!(out, "already had map version {version}"),
        },
        other => write!(out, "{other:?}"),
    };
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::state::SetState;
    use crate::domain::testing::set_with;

    fn note(what: &str) -> AuditNote {
        AuditNote {
            who: "CN=ops".into(),
            at_ms: 1_700_000_000_000,
            what: what.into(),
        }
    }

    fn audited(cmd: Command) -> Command {
        Command::Audited {
            note: note(&describe(&cmd)),
            cmd: Box::new(cmd),
        }
    }

    fn outcomes(st: &SetState) -> Vec<String> {
        st.audit
            .page(0, usize::MAX, false)
            .into_iter()
            .map(|(_, r)| r.outcome.clone())
            .collect()
    }

    #[test]
    fn an_audited_action_is_applied_and_recorded_with_its_outcome_refusals_too() {
        let (mut st, _) = set_with(&[1]);
        let add = Command::Map(MapCommand::AddSet {
            expect_version: 1,
            set_id: 1,
            stores: vec!["a:1".into()],
        });
        let mut plain = st.clone();
        let want = plain.apply(&add, false);
        assert_eq!(st.apply(&audited(add), false), want, "the result is the action's own");
        assert_eq!(st.map, plain.map, "the action was applied");
        let drain = Command::Drain { node_id: NodeId(9) };
        assert_eq!(
            st.apply(&audited(drain), false),
            CommandResult::Draining { incarnation: None }
        );
        assert_eq!(
            outcomes(&st),
            ["done: map version 2", "refused: the node is not registered"]
        );
        let (n, r) = st.audit.page(0, 1, false)[0];
        assert_eq!((n, r.who.as_str(), r.at_ms), (1, "CN=ops", 1_700_000_000_000));
        assert_eq!(r.what, "add set 1 (stores a:1) at map version 1");
    }

    #[test]
    fn a_membership_record_is_appended_alone() {
        let (mut st, _) = set_with(&[]);
        let before = st.clone();
        let r = st.apply(
            &Command::Audit(AuditRecord::new(&note("add replica 4"), "started")),
            false,
        );
        assert_eq!(r, CommandResult::Recorded { number: 1 });
        assert_eq!(outcomes(&st), ["started"]);
        st.audit = before.audit.clone();
        assert_eq!(st, before, "a record alone changes nothing else");
    }

    #[test]
    fn nested_audits_and_uninitialized_sets_record_nothing() {
        let (mut st, _) = set_with(&[]);
        let nested = audited(audited(Command::Drain { node_id: NodeId(1) }));
        assert!(matches!(st.apply(&nested, false), CommandResult::Invalid(_)));
        let alone = Command::Audit(AuditRecord::new(&note("x"), "y"));
        assert!(matches!(
            st.apply(&audited(alone.clone()), false),
            CommandResult::Invalid(_)
        ));
        assert!(st.audit.is_empty(), "{:?}", st.audit);
        let mut empty = SetState::default();
        for cmd in [audited(Command::Drain { node_id: NodeId(1) }), alone] {
            assert!(matches!(empty.apply(&cmd, false), CommandResult::Invalid(_)));
        }
        assert_eq!(empty, SetState::default());
    }

    #[test]
    fn the_trail_is_part_of_the_snapshot() {
        let (mut st, _) = set_with(&[1]);
        for node in 0..3 {
            st.apply(&audited(Command::Drain { node_id: NodeId(node) }), false);
        }
        let bytes = postcard::to_stdvec(&st).unwrap();
        let back: SetState = crate::storage::sm_store::decode_padded(&bytes).unwrap();
        assert_eq!(back.audit, st.audit);
        assert_eq!((back.audit.len(), back.audit.last()), (3, 3));
    }
}
