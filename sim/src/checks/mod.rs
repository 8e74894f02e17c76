//! Checkers: one pure function per promise of docs/DESIGN.md, each over a [`History`] (plus the
//! extra inputs it needs), each returning the violations it found with the offending call ids.
//!
//! Rules every checker follows:
//! - a call whose outcome is unknown or failed contributes no value, and is never assumed absent:
//!   it can explain a gap (P6), it can never be the "earlier" call of an ordering (P1, P5);
//! - "A completed before B began" means `A.complete_ns < B.invoke_ns` on the run's one clock;
//! - every sweep is O(n log n) per key (sort, then one pass with a running maximum).
//!
//! Deliberately left out: any IO (the caller reads the history) and availability, which is a
//! statistic ([`crate::stats`]) except for the final "served again after heal" check here.

pub mod ids;
pub mod ledger;
pub mod liveness;
pub mod one_set;
pub mod p1_order;
pub mod p2_durable;
pub mod p3_monotonic;
pub mod p4_one_owner;
pub mod p5_read;
pub mod p6_waste;

use crate::history::{Call, CallKind, History};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

/// Which promise a violation breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Promise {
    P1,
    P2,
    P3,
    P4,
    P5,
    P6,
    /// Two sets served one section at once, or a set served a section it had left.
    OneSet,
    /// A uid touched during the run was not served again after the final heal.
    Liveness,
    /// Time-ordered ids (docs/design/time-ordered-ids.md): no id twice; one slot's ids increase; ids' times within
    /// the allowance of the true time; no repeat after a clock step.
    U1,
    U2,
    U3,
    U4,
    /// Ledger counters (docs/decisions/0004-ledger-counters.md, [`ledger`]): no number twice or skipped; every number
    /// in exactly one state; a confirmed number never changes; a held number ends only by its
    /// holder's word or its deadline.
    G1,
    G2,
    G3,
    Holds,
}

/// One broken promise, with the calls that show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub promise: Promise,
    pub what: String,
    /// Offending call ids, earliest evidence first.
    pub calls: Vec<u64>,
}

impl Violation {
    pub fn new(promise: Promise, what: impl Into<String>, calls: Vec<u64>) -> Self {
        Self {
            promise,
            what: what.into(),
            calls,
        }
    }
}

// The ordering checkers' observation and sweep are shared with `seqctl verify`.
pub use seqsvr_promises::order::{Obs, sweep_completed_before};

/// Ok values of calls of the given kinds, grouped by uid.
pub fn ok_obs_by_uid(calls: &[Call], fetches: bool) -> HashMap<u64, Vec<Obs>> {
    let mut by_uid: HashMap<u64, Vec<Obs>> = HashMap::new();
    for c in calls.iter().filter(|c| c.is_fetch() == fetches) {
        for (uid, value) in c.ok_values() {
            by_uid.entry(uid).or_default().push(Obs {
                call: c.id,
                invoke_ns: c.invoke_ns,
                complete_ns: c.complete_ns,
                value,
            });
        }
    }
    by_uid
}

/// Violations are capped per promise in the report so that one bad run prints a readable page;
/// the counts stay exact.
pub const MAX_REPORTED_PER_PROMISE: usize = 20;

/// Everything the checkers found over one history.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// Exact number of violations per promise.
    pub counts: BTreeMap<String, usize>,
    /// The first few violations per promise.
    pub violations: Vec<Violation>,
    /// Calls examined, by outcome.
    pub calls_ok: usize,
    pub calls_failed: usize,
    pub calls_unknown: usize,
    pub values_checked: usize,
    pub gets_checked: usize,
    pub p6: p6_waste::GapStats,
    /// `NextIds` calls by outcome, and the ids they returned.
    pub ids_ok: usize,
    pub ids_failed: usize,
    pub ids_checked: usize,
}

impl Report {
    pub fn total_violations(&self) -> usize {
        self.counts.values().sum()
    }

    /// Counts `found` under `promise` and keeps the first few (a promise added with nothing found
    /// shows as checked, with 0).
    pub fn add(&mut self, promise: Promise, found: Vec<Violation>) {
        let name = format!("{promise:?}");
        *self.counts.entry(name).or_default() += found.len();
        self.violations.extend(found.into_iter().take(MAX_REPORTED_PER_PROMISE));
    }

    /// Human text: counts, then each reported violation with its calls as JSON lines.
    pub fn render(&self, history: &History) -> String {
        let index = history.call_index();
        let id_index: HashMap<u64, &crate::history::IdCall> = history.ids.iter().map(|c| (c.id, c)).collect();
        let mut s = String::new();
        for v in &self.violations {
            let _ = writeln!(s, "VIOLATION {:?}: {}", v.promise, v.what);
            let is_id_promise = matches!(v.promise, Promise::U1 | Promise::U2 | Promise::U3 | Promise::U4)
                || (v.promise == Promise::Liveness && v.what.contains("NextIds"));
            for id in &v.calls {
                let json = if is_id_promise {
                    id_index.get(id).map(|c| serde_json::to_string(c).unwrap_or_default())
                } else {
                    index.get(id).map(|c| serde_json::to_string(c).unwrap_or_default())
                };
                match json {
                    Some(j) => {
                        let _ = writeln!(s, "    {j}");
                    }
                    None => {
                        let _ = writeln!(s, "    call {id} (not in history)");
                    }
                }
            }
        }
        let _ = writeln!(
            s,
            "checked: {} ok / {} failed / {} unknown calls, {} fetched values, {} gets; P6 gaps {} (excused {}, unexplained {}, max {}; across owners {} within the reserve, {} beyond)",
            self.calls_ok,
            self.calls_failed,
            self.calls_unknown,
            self.values_checked,
            self.gets_checked,
            self.p6.gaps,
            self.p6.excused,
            self.p6.unexplained,
            self.p6.max_gap,
            self.p6.bounded - self.p6.beyond_reserve,
            self.p6.beyond_reserve
        );
        if self.ids_ok + self.ids_failed > 0 {
            let _ = writeln!(
                s,
                "checked: {} ok / {} failed NextIds calls, {} ids",
                self.ids_ok, self.ids_failed, self.ids_checked
            );
        }
        let _ = writeln!(s, "violations: {} {:?}", self.total_violations(), self.counts);
        s
    }
}

/// Why the checkers could not judge a history at all (a harness problem, exit 3).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CheckError {
    #[error("no final max_seq for section {0} (the final Load did not cover it)")]
    MissingMaxSeq(u64),
    #[error("history info has section_size 0")]
    NoSectionSize,
}

/// Runs every checker. `final_max_seqs` (section → linearizable max_seq read at the end) enables
/// P2; without it P2 is skipped (e.g. `sim check` without `--max-seqs`).
pub fn check_all(history: &History, final_max_seqs: Option<&BTreeMap<u64, u64>>) -> Result<Report, CheckError> {
    let mut r = Report::default();
    for c in &history.calls {
        match c.outcome {
            crate::history::Outcome::Ok => r.calls_ok += 1,
            crate::history::Outcome::Failed => r.calls_failed += 1,
            crate::history::Outcome::Unknown => r.calls_unknown += 1,
        }
        if c.outcome == crate::history::Outcome::Ok {
            match c.kind {
                CallKind::Fetch | CallKind::BatchFetch | CallKind::Reserve => r.values_checked += c.values.len(),
                CallKind::Get => r.gets_checked += 1,
            }
        }
    }
    r.add(Promise::P1, p1_order::check(&history.calls));
    if let Some(max) = final_max_seqs {
        if history.info.section_size == 0 {
            return Err(CheckError::NoSectionSize);
        }
        r.add(
            Promise::P2,
            p2_durable::check(
                &history.calls,
                history.info.section_size,
                history.info.uid_limit,
                history.info.key_placement,
                max,
            )?,
        );
    }
    r.add(Promise::P3, p3_monotonic::check(&history.polls));
    r.add(Promise::P4, p4_one_owner::check(&history.calls));
    r.add(Promise::OneSet, one_set::check(&history.calls, &history.moves));
    r.add(Promise::P5, p5_read::check(&history.calls));
    let layout = p6_waste::Layout {
        section_size: history.info.section_size,
        uid_limit: history.info.uid_limit,
        step: history.info.step,
        key_placement: history.info.key_placement,
    };
    let (p6, stats) = p6_waste::check_with_sections(&history.calls, &history.faults, history.info.fault_free, layout);
    r.p6 = stats;
    r.add(Promise::P6, p6);
    if let Some(from) = history.info.verify_from_ns {
        r.add(Promise::Liveness, liveness::check(&history.calls, from));
    }
    if let Some(info) = &history.info.ids {
        r.ids_ok = history
            .ids
            .iter()
            .filter(|c| c.outcome == crate::history::Outcome::Ok)
            .count();
        r.ids_failed = history.ids.len() - r.ids_ok;
        r.ids_checked = history.ids.iter().map(|c| c.ids().count()).sum();
        for (promise, found) in ids::check(&history.ids, info, &history.faults) {
            r.add(promise, found);
        }
        if let Some(from) = history.info.verify_from_ns {
            r.add(Promise::Liveness, liveness::check_ids(&history.ids, from));
        }
    }
    Ok(r)
}

#[cfg(test)]
pub(crate) mod test_util {
    //! Compact constructors for table-driven checker tests.
    use crate::history::{Call, CallKind, Outcome, OwnerTag};

    /// An ok single fetch: `fetch(id, uid, invoke, complete, value)`.
    pub fn fetch(id: u64, uid: u64, invoke: u64, complete: u64, value: u64) -> Call {
        Call {
            id,
            client: id as u32,
            kind: CallKind::Fetch,
            uids: vec![uid],
            invoke_ns: invoke,
            complete_ns: complete,
            outcome: Outcome::Ok,
            values: vec![value],
            owners: vec![],
            error: None,
        }
    }

    pub fn get(id: u64, uid: u64, invoke: u64, complete: u64, value: u64) -> Call {
        Call {
            kind: CallKind::Get,
            ..fetch(id, uid, invoke, complete, value)
        }
    }

    pub fn unknown(id: u64, uid: u64, invoke: u64, complete: u64) -> Call {
        Call {
            outcome: Outcome::Unknown,
            values: vec![],
            ..fetch(id, uid, invoke, complete, 0)
        }
    }

    pub fn failed(id: u64, uid: u64, invoke: u64, complete: u64) -> Call {
        Call {
            outcome: Outcome::Failed,
            values: vec![],
            ..fetch(id, uid, invoke, complete, 0)
        }
    }

    pub fn batch(id: u64, uids: &[u64], invoke: u64, complete: u64, values: &[u64]) -> Call {
        Call {
            kind: CallKind::BatchFetch,
            uids: uids.to_vec(),
            values: values.to_vec(),
            ..fetch(id, 0, invoke, complete, 0)
        }
    }

    /// Adds the owner that answered for `section`.
    pub fn owned(mut c: Call, section: u64, node_id: u64, incarnation: u64, epoch: u64) -> Call {
        c.owners.push(OwnerTag {
            section,
            node_id,
            incarnation,
            epoch,
            set_id: 0,
        });
        c
    }

    /// Marks every owner tag of `c` as from set `set`.
    pub fn in_set(mut c: Call, set: u64) -> Call {
        for o in &mut c.owners {
            o.set_id = set;
        }
        c
    }

    /// One table row: name, history, expected offending call-id groups.
    pub type Case = (&'static str, Vec<Call>, Vec<Vec<u64>>);

    pub fn ids(v: &[super::Violation]) -> Vec<Vec<u64>> {
        v.iter().map(|v| v.calls.clone()).collect()
    }
}
