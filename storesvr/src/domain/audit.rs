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

use serde::{Deserialize, Serialize};

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

#[cfg(test)]
mod tests {
    use super::*;

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
