//! A set's parameters: one type and one set of rules for every place that holds them.
//!
//! The StoreSvr fixes them when the set is bootstrapped (they are a Raft entry, so this struct's
//! serde form is part of the log and snapshot format: do not reorder its fields) and hands them to
//! every AllocSvr at registration, which checks them again before it serves: an AllocSvr must not
//! run a lease protocol on numbers that make it unsafe, whoever sent them.
//!
//! The rules tie the lease timings together (see docs/DESIGN.md, Ownership): renewals come often
//! enough that one lost renewal does not end a lease; the margin and the drift bound leave an owner
//! most of its lease; a step can always be added to a ceiling below `u64::MAX / 4` without overflow.
//!
//! Deliberately left out: Raft timings (election, heartbeat) and failure detection, which concern
//! only the StoreSvr replicas and are checked with their flags.

use std::ops::Range;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::pb;
use crate::types::{SectionId, section_count};

/// Largest `section_size`: one touched section costs 8 bytes per uid of AllocSvr memory.
pub const MAX_SECTION_SIZE: u64 = 1 << 24;

/// Most sections of the whole uid space. Every set keeps a slot for each (a range may move into
/// any set), so this bounds each replica's memory, snapshot size and the size of a Raft entry.
pub const MAX_SECTIONS: u64 = 1 << 20;

/// Largest `step`: a ceiling plus a few steps never overflows.
pub const MAX_STEP: u64 = u64::MAX / 4;

/// Largest clock-rate difference assumed between nodes (10 %).
pub const MAX_DRIFT_PPM: u64 = 100_000;

/// Parameters fixed when a set is bootstrapped; every replica and AllocSvr of the set uses these.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetParams {
    pub set_id: u64,
    /// Uids per section; a section shares one `max_seq`.
    pub section_size: u64,
    /// The cluster serves uids in `[0, uid_limit)`.
    pub uid_limit: u64,
    /// How much one bump raises a section's `max_seq`.
    pub step: u64,
    pub lease_ms: u64,
    pub renew_interval_ms: u64,
    /// Clock-rate difference bound, parts per million.
    pub drift_ppm: u64,
    /// Safety margin of the lease arithmetic.
    pub margin_ms: u64,
    /// First section of the set (inclusive).
    pub section_begin: u64,
    /// End of the set's sections (exclusive).
    pub section_end: u64,
}

/// A rule a [`SetParams`] broke, naming the field (flags are the field with dashes).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {why}")]
pub struct ParamsError {
    pub field: &'static str,
    pub why: String,
}

fn refuse(field: &'static str, why: impl Into<String>) -> Result<(), ParamsError> {
    Err(ParamsError { field, why: why.into() })
}

impl SetParams {
    /// The defaults of a single set over the whole 32-bit uid space.
    pub fn single_set(set_id: u64) -> Self {
        let (section_size, uid_limit) = (100_000, 1 << 32);
        Self {
            set_id,
            section_size,
            uid_limit,
            step: 10_000,
            lease_ms: 3_000,
            renew_interval_ms: 500,
            drift_ppm: 10_000,
            margin_ms: 100,
            section_begin: 0,
            section_end: section_count(uid_limit, section_size),
        }
    }

    /// Checks every rule; the first broken one is returned.
    pub fn validate(&self) -> Result<(), ParamsError> {
        self.validate_sizes()?;
        self.validate_timings()
    }

    fn validate_sizes(&self) -> Result<(), ParamsError> {
        if self.section_size == 0 || self.section_size > MAX_SECTION_SIZE {
            return refuse("section_size", format!("must be in 1..={MAX_SECTION_SIZE}"));
        }
        if self.uid_limit == 0 {
            return refuse("uid_limit", "must be > 0");
        }
        if self.step == 0 || self.step > MAX_STEP {
            return refuse("step", format!("must be in 1..={MAX_STEP}"));
        }
        let total = self.total_sections();
        if total > MAX_SECTIONS {
            return refuse(
                "section_size",
                format!("the uid space has {total} sections, more than {MAX_SECTIONS}; raise section_size"),
            );
        }
        // An empty range is a set that starts with nothing and gets its ranges by moves.
        if self.section_begin > self.section_end || self.section_end > total {
            return refuse(
                "sections",
                format!(
                    "the set's section range {}..{} must lie within 0..{total}",
                    self.section_begin, self.section_end
                ),
            );
        }
        Ok(())
    }

    fn validate_timings(&self) -> Result<(), ParamsError> {
        if self.lease_ms == 0 {
            return refuse("lease_ms", "must be > 0");
        }
        if self.drift_ppm >= MAX_DRIFT_PPM {
            return refuse("drift_ppm", format!("must be below {MAX_DRIFT_PPM} (10 %)"));
        }
        // A third leaves two more renewals before the lease ends when one is lost.
        if self.renew_interval_ms == 0 || self.renew_interval_ms.saturating_mul(3) > self.lease_ms {
            return refuse(
                "renew_interval_ms",
                format!(
                    "({}) must be > 0 and at most a third of lease_ms ({})",
                    self.renew_interval_ms, self.lease_ms
                ),
            );
        }
        if self.margin_ms.saturating_mul(4) > self.lease_ms {
            return refuse(
                "margin_ms",
                format!(
                    "({}) must be at most a quarter of lease_ms ({})",
                    self.margin_ms, self.lease_ms
                ),
            );
        }
        Ok(())
    }

    /// Sections needed to cover the whole uid space (all sets).
    pub fn total_sections(&self) -> u64 {
        section_count(self.uid_limit, self.section_size)
    }

    /// Every section of the uid space: any of them may be moved into any set.
    pub fn all_sections(&self) -> Range<u64> {
        0..self.total_sections()
    }

    /// The sections this set serves from its bootstrap on (moves add and remove others).
    pub fn sections(&self) -> Range<u64> {
        self.section_begin..self.section_end
    }

    pub fn first_section(&self) -> SectionId {
        SectionId(self.section_begin)
    }

    pub fn end_section(&self) -> SectionId {
        SectionId(self.section_end)
    }

    pub fn section_count(&self) -> u64 {
        self.section_end.saturating_sub(self.section_begin)
    }

    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms)
    }

    pub fn renew_interval(&self) -> Duration {
        Duration::from_millis(self.renew_interval_ms)
    }

    pub fn margin(&self) -> Duration {
        Duration::from_millis(self.margin_ms)
    }

    /// The wire form.
    pub fn to_pb(&self) -> pb::SetParams {
        pb::SetParams {
            set_id: self.set_id,
            section_size: self.section_size,
            uid_limit: self.uid_limit,
            step: self.step,
            lease_ms: self.lease_ms,
            renew_interval_ms: self.renew_interval_ms,
            drift_ppm: self.drift_ppm,
            margin_ms: self.margin_ms,
            sections: Some(pb::SectionRange {
                begin: self.section_begin,
                end: self.section_end,
            }),
        }
    }

    /// Reads the wire form and checks every rule.
    pub fn from_pb(p: &pb::SetParams) -> Result<Self, ParamsError> {
        let Some(range) = &p.sections else {
            return Err(ParamsError {
                field: "sections",
                why: "no section range".into(),
            });
        };
        let params = Self {
            set_id: p.set_id,
            section_size: p.section_size,
            uid_limit: p.uid_limit,
            step: p.step,
            lease_ms: p.lease_ms,
            renew_interval_ms: p.renew_interval_ms,
            drift_ppm: p.drift_ppm,
            margin_ms: p.margin_ms,
            section_begin: range.begin,
            section_end: range.end,
        };
        params.validate()?;
        Ok(params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_defaults_are_valid_and_cover_the_uid_space() {
        let p = SetParams::single_set(0);
        assert_eq!(p.validate(), Ok(()));
        assert_eq!(p.section_count(), 42_950);
        assert_eq!(SetParams::from_pb(&p.to_pb()), Ok(p));
    }

    #[test]
    fn each_rule_names_its_field() {
        type Mutate = fn(&mut SetParams);
        let cases: [(Mutate, &str); 13] = [
            (|p| p.section_size = 0, "section_size"),
            (|p| p.section_size = MAX_SECTION_SIZE + 1, "section_size"),
            (|p| (p.section_size, p.section_end) = (1, 1 << 32), "section_size"),
            (|p| p.uid_limit = 0, "uid_limit"),
            (|p| p.step = 0, "step"),
            (|p| p.step = MAX_STEP + 1, "step"),
            (|p| p.section_end = 42_951, "sections"),
            (|p| p.section_begin = p.section_end + 1, "sections"),
            (|p| p.lease_ms = 0, "lease_ms"),
            (|p| p.drift_ppm = MAX_DRIFT_PPM, "drift_ppm"),
            (|p| p.renew_interval_ms = 1_001, "renew_interval_ms"),
            (|p| p.renew_interval_ms = 0, "renew_interval_ms"),
            (|p| p.margin_ms = 751, "margin_ms"),
        ];
        for (mutate, field) in cases {
            let mut p = SetParams::single_set(0);
            mutate(&mut p);
            let e = p.validate().unwrap_err();
            assert_eq!(e.field, field, "{e}");
            assert_eq!(SetParams::from_pb(&p.to_pb()).unwrap_err().field, field);
        }
        let mut empty = SetParams::single_set(1);
        empty.section_begin = empty.section_end;
        assert_eq!(empty.validate(), Ok(()), "a set may start empty and import its ranges");
        let mut no_range = SetParams::single_set(0).to_pb();
        no_range.sections = None;
        assert!(
            SetParams::from_pb(&no_range)
                .unwrap_err()
                .to_string()
                .contains("section range")
        );
    }

    proptest! {
        /// Timings drawn inside the rules (so every case checks something) pass, and leave an
        /// owner more usable lease than one renewal interval.
        #[test]
        fn valid_timings_leave_room_for_renewals(
            (lease, renew, margin) in (3u64..20_000).prop_flat_map(|l| (Just(l), 1..=l / 3, 0..=l / 4)),
            drift in 0..MAX_DRIFT_PPM,
        ) {
            let p = SetParams { lease_ms: lease, renew_interval_ms: renew, margin_ms: margin, drift_ppm: drift,
                ..SetParams::single_set(0) };
            prop_assert!(p.validate().is_ok(), "{:?}", p.validate());
            let usable = lease as f64 * (1.0 - drift as f64 / 1e6) - margin as f64;
            prop_assert!(usable > renew as f64, "usable {usable} ms, renew {renew} ms");
        }

        /// Any timings: accepted exactly when every rule holds, and a refusal names a timing.
        #[test]
        fn timings_are_accepted_exactly_by_the_rules(
            lease in 0u64..20_000, renew in 0u64..8_000, margin in 0u64..6_000, drift in 0u64..120_000,
        ) {
            let p = SetParams { lease_ms: lease, renew_interval_ms: renew, margin_ms: margin, drift_ppm: drift,
                ..SetParams::single_set(0) };
            let rules = lease > 0 && drift < MAX_DRIFT_PPM && renew > 0 && renew * 3 <= lease && margin * 4 <= lease;
            match p.validate() {
                Ok(()) => prop_assert!(rules, "accepted {p:?}"),
                Err(e) => {
                    prop_assert!(!rules, "refused {p:?}: {e}");
                    let timings = ["lease_ms", "drift_ppm", "renew_interval_ms", "margin_ms"];
                    prop_assert!(timings.contains(&e.field), "the refusal names no timing: {e}");
                }
            }
        }
    }
}
