//! The audit trail: which admin action was asked for, by whom, when, and what came of it.
//!
//! Every admin write (map change, range step, drain, map publication) travels as
//! `Command::Audited { note, cmd }`: the note (who, the leader's wall clock, what) rides in the
//! same Raft entry as the action, and applying it applies `cmd` and appends one [`AuditRecord`]
//! with the outcome, so an action is never applied without its record, nor recorded without
//! being applied. Membership changes go through openraft's `change_membership`, not a command:
//! the leader records them with two `Command::Audit` records of their own, the intent before the
//! change and the outcome after it (see `grpc::admin`).
//!
//! The time is carried in the note, read once on the proposing leader: applying reads no clock,
//! so every replica keeps the same trail (deterministic apply). The outcome text is made during
//! apply from the result, by [`outcome`], which is plain code of the result alone.
//!
//! The trail is bounded: [`MAX_AUDIT_RECORDS`] records, the oldest dropped first and counted;
//! every text field is cut to [`MAX_AUDIT_FIELD_BYTES`]. It is part of the set's state and so of
//! every snapshot.
//!
//! Left out on purpose: requests refused before they are proposed (bad input, not the leader),
//! which change nothing and would let a caller fill the log; reads; the AllocSvrs' and the
//! arbiter's own writes (ownership, not admin actions); signing the trail against a replica's
//! owner who edits its disk.

use std::collections::VecDeque;
use std::fmt::Write;

use serde::{Deserialize, Serialize};

use super::cluster_map::{MapCommand, MapResult, Phase};
use super::moves::RangeCommand;
use super::state::{Command, CommandResult, Span};

pub use seqsvr_proto::limits::{MAX_AUDIT_FIELD_BYTES, MAX_AUDIT_RECORDS};

/// Who asked for an action and when, as the proposing leader saw it, and the action in words.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditNote {
    /// The caller's certificate subject, or `anonymous` without TLS.
    pub who: String,
    /// The proposing leader's wall clock, milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The action and its arguments (see [`describe`]).
    pub what: String,
}

/// One admin action in the trail.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    pub who: String,
    pub at_ms: u64,
    pub what: String,
    /// What came of it (see [`outcome`]).
    pub outcome: String,
}

impl AuditRecord {
    /// The record of `note`'s action with its outcome, every field cut to the cap.
    pub fn new(note: &AuditNote, outcome: &str) -> Self {
        Self {
            who: cut(&note.who),
            at_ms: note.at_ms,
            what: cut(&note.what),
            outcome: cut(outcome),
        }
    }
}

/// The last [`MAX_AUDIT_RECORDS`] admin actions of a set. Records are numbered from 1 in the
/// order they were applied; the number is not stored: the oldest kept is `dropped + 1`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditTrail {
    dropped: u64,
    records: VecDeque<AuditRecord>,
}

impl AuditTrail {
    /// Appends `record` (fields cut to the cap), dropping the oldest when the trail is full.
    pub fn push(&mut self, record: AuditRecord) {
        if self.records.len() >= MAX_AUDIT_RECORDS {
            self.records.pop_front();
            self.dropped += 1;
        }
        let record = AuditRecord {
            who: cut(&record.who),
            what: cut(&record.what),
            outcome: cut(&record.outcome),
            ..record
        };
        self.records.push_back(record);
        debug_assert!(self.records.len() <= MAX_AUDIT_RECORDS);
    }

    /// How many records were dropped from the front to keep the trail bounded.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The number of the newest record; 0 when there is none.
    pub fn last(&self) -> u64 {
        self.dropped + self.records.len() as u64
    }

    /// Records kept now.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The kept records numbered above `after`, oldest first, at most `limit` of them: the oldest
    /// such, or with `newest` the newest such. Each comes with its number.
    pub fn page(&self, after: u64, limit: usize, newest: bool) -> Vec<(u64, &AuditRecord)> {
        let skip = after.saturating_sub(self.dropped).min(self.records.len() as u64) as usize;
        let above = self.records.len() - skip;
        let start = if newest {
            skip + above.saturating_sub(limit)
        } else {
            skip
        };
        (start..self.records.len())
            .take(limit)
            .map(|i| (self.dropped + i as u64 + 1, &self.records[i]))
            .collect()
    }
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

/// `s` cut to at most [`MAX_AUDIT_FIELD_BYTES`] at a character boundary, with `…` marking a cut.
pub fn cut(s: &str) -> String {
    if s.len() <= MAX_AUDIT_FIELD_BYTES {
        return s.to_owned();
    }
    let mark = "…";
    let mut end = MAX_AUDIT_FIELD_BYTES - mark.len();
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{mark}", &s[..end])
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

fn describe_range(r: &RangeCommand) -> String {
    match r {
        RangeCommand::Import { op, span: s, from_set } => {
            format!("range step IMPORTING of move {op}: {} from set {from_set}", span(s))
        }
        RangeCommand::Freeze { op, span: s, to_set } => {
            format!("range step FROZEN of move {op}: {} to set {to_set}", span(s))
        }
        RangeCommand::Install { op, span: s, ceilings } => format!(
            "range step INSTALLED of move {op}: {} with {} ceilings",
            span(s),
            ceilings.len()
        ),
        RangeCommand::Tombstone {
            op,
            span: s,
            to_set,
            map_version,
        } => format!(
            "range step DONE of move {op}: {} now set {to_set}'s (map version {map_version})",
            span(s)
        ),
        RangeCommand::Cancel { op, span: s } => format!("range step CANCELLED of move {op}: {}", span(s)),
        RangeCommand::Seal { op, span: s } => format!("range step SEALED of move {op}: {}", span(s)),
    }
}

/// The action `cmd` in words, with its arguments (long lists by their length).
pub fn describe(cmd: &Command) -> String {
    match cmd {
        Command::Map(m) => describe_map(m),
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
    use seqsvr_proto::NodeId;

    fn record(n: u64) -> AuditRecord {
        AuditRecord {
            who: "anonymous".into(),
            at_ms: n,
            what: format!("action {n}"),
            outcome: "done".into(),
        }
    }

    fn numbers(page: Vec<(u64, &AuditRecord)>) -> Vec<u64> {
        page.into_iter()
            .map(|(n, r)| {
                assert_eq!(r.at_ms, n, "record {n} is another's");
                n
            })
            .collect()
    }

    #[test]
    fn a_full_trail_drops_the_oldest_and_counts_them() {
        let mut t = AuditTrail::default();
        for n in 1..=(MAX_AUDIT_RECORDS as u64 + 5) {
            t.push(record(n));
        }
        assert_eq!(t.len(), MAX_AUDIT_RECORDS);
        assert_eq!(t.dropped(), 5);
        assert_eq!(t.last(), MAX_AUDIT_RECORDS as u64 + 5);
        assert_eq!(numbers(t.page(0, 2, false)), [6, 7], "the oldest kept is dropped + 1");
    }

    #[test]
    fn pages_are_numbered_and_cut_by_after_limit_and_newest() {
        let mut t = AuditTrail::default();
        for n in 1..=10 {
            t.push(record(n));
        }
        type Case = (u64, usize, bool, &'static [u64]);
        let cases: [Case; 7] = [
            (0, 3, false, &[1, 2, 3]),
            (0, 3, true, &[8, 9, 10]),
            (7, 10, false, &[8, 9, 10]),
            (7, 2, true, &[9, 10]),
            (10, 5, false, &[]),
            (u64::MAX, 5, true, &[]),
            (4, 0, false, &[]),
        ];
        for (after, limit, newest, want) in cases {
            assert_eq!(
                numbers(t.page(after, limit, newest)),
                want,
                "after {after} limit {limit} newest {newest}"
            );
        }
    }

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
        let back: SetState = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back.audit, st.audit);
        assert_eq!((back.audit.len(), back.audit.last()), (3, 3));
    }

    #[test]
    fn long_fields_are_cut_at_a_character_boundary() {
        let long = "é".repeat(MAX_AUDIT_FIELD_BYTES);
        let cut_text = cut(&long);
        assert!(cut_text.len() <= MAX_AUDIT_FIELD_BYTES, "{}", cut_text.len());
        assert!(cut_text.ends_with('…'));
        let mut t = AuditTrail::default();
        t.push(AuditRecord {
            who: long.clone(),
            at_ms: 1,
            what: long.clone(),
            outcome: long,
        });
        let (_, r) = t.page(0, 1, false)[0];
        assert!(
            [&r.who, &r.what, &r.outcome]
                .iter()
                .all(|f| f.len() <= MAX_AUDIT_FIELD_BYTES)
        );
        assert_eq!(cut("short"), "short");
    }
}
