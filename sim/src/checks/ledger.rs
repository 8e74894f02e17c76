//! Ledger counters (docs/decisions/0004-ledger-counters.md): G1–G3 judged from the history of ledger calls and the
//! ledgers' final replicated state.
//!
//! - G1, none twice and none skipped: two reserves answered with one number must carry one request
//!   id; every number answered is at most the final `high`; a retry with the same request id gets
//!   a new number only once the first is no longer held (it expired); and every number `1..=high`
//!   is in a state (below). An issue counts as a reserve whose request id is its reference (the
//!   workloads draw the two from different alphabets), and a retry of it gets a new number only
//!   once the first's reference is no longer kept (the checker cannot tell then: it excuses).
//! - G2, exactly one state: `Ledger::check` on the final state, and each ledger is found in
//!   exactly one set.
//! - G3, a confirmed number never changes: a confirm or an issue answered OK is confirmed at the
//!   end with its reference (or one no longer kept); no release answered OK, no confirm answered "voided" and
//!   no other reference answered OK for it; a repeat with the same reference is not refused.
//! - Holds: a number answered to a reserve ends held by that request (never, after the heal: the
//!   expiry tick must have voided it), confirmed by one of that caller's confirms, released by
//!   its release, or expired no earlier than its hold allowed; nobody else ends it.
//!
//! A number voided "lost with a restore" is excused from G3 and Holds: a backup cannot know the
//! numbers handed out after it (docs/decisions/0004-ledger-counters.md); the operator's reconcile
//! starts above every number a caller was answered, so G1 still holds across the restore.
//!
//! Deliberately left out: IO (the dst hands the calls and the final state in), calls whose outcome
//! is unknown (they may have happened: they excuse, never accuse), and the gap report's text.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use storesvr::domain::ledger::{Ledger, NumberState, VoidReason};

use super::{Promise, Violation};

/// Every ledger at the end of a run, by key: one copy per set that keeps it (one, when all is well).
pub type Ledgers = BTreeMap<String, Vec<Ledger>>;

/// What a ledger call asked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LedgerAsk {
    Reserve {
        request_id: String,
    },
    Confirm {
        number: u64,
        reference: String,
    },
    Release {
        number: u64,
    },
    /// A reserve with a reference: the next number, confirmed in the same write.
    Issue {
        reference: String,
    },
}

/// How a ledger call ended, as far as its caller knows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LedgerAnswer {
    /// Done: the number the reply names; `repeated` when it repeated a call already applied.
    Ok { number: u64, repeated: bool },
    /// ALREADY_EXISTS: confirmed with another reference.
    AlreadyExists,
    /// FAILED_PRECONDITION naming a voided number.
    Voided,
    /// Any other refusal, with its message (restored, not found, exhausted, not owned).
    Refused(String),
    /// No answer in time, or one that says the write may have happened.
    Unknown,
}

/// One ledger call of the history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerOp {
    pub id: u64,
    pub caller: u32,
    /// The set that answered (the one asked last, for a call with no answer).
    pub set: u64,
    pub key: String,
    pub ask: LedgerAsk,
    pub invoke_ns: u64,
    pub complete_ns: u64,
    pub answer: LedgerAnswer,
}

/// What the checker is handed besides the calls.
pub struct Final<'a> {
    /// Each ledger key, with every set's copy of it at the end (one, when all is well).
    pub ledgers: &'a BTreeMap<String, Vec<Ledger>>,
    /// The true Unix ms at run time 0, when the leaders' clocks are the true time (no StoreSvr
    /// clock fault): expiries are then checked against the holds' length.
    pub wall_origin_ms: Option<u64>,
    /// Run time from which the verify calls ran (each ledger must serve a reserve and a confirm).
    pub verify_from_ns: u64,
    /// Sets restored from a backup: (set, backup taken, restored), run time in ns. A write a set
    /// answered in between may be gone with the restore.
    pub rewinds: &'a [(u64, u64, u64)],
}

/// How far an expiry may seem early: the leader stamps a hold at its step, after the call's
/// invocation, so an expiry is never early by the true clock; the slack covers rounding to ms.
const EXPIRY_SLACK_MS: u64 = 1;

/// Every violation, by promise (G1, G2, G3, Holds, Liveness).
pub fn check(ops: &[LedgerOp], end: &Final<'_>) -> Vec<(Promise, Vec<Violation>)> {
    let mut out: BTreeMap<Promise, Vec<Violation>> = BTreeMap::new();
    let mut add =
        |p: Promise, what: String, calls: Vec<u64>| out.entry(p).or_default().push(Violation::new(p, what, calls));
    let mut finals: BTreeMap<&str, &Ledger> = BTreeMap::new();
    for (key, copies) in end.ledgers {
        match copies.as_slice() {
            [one] => {
                if let Err(e) = one.check() {
                    add(Promise::G2, format!("ledger {key}: {e}"), vec![]);
                }
                finals.insert(key, one);
            }
            [] => {} // Named below, with the calls on it.
            many => add(
                Promise::G2,
                format!("ledger {key} is kept by {} sets at the end", many.len()),
                vec![],
            ),
        }
    }
    let by_key = group(ops);
    for (key, ops) in &by_key {
        let Some(l) = finals.get(key.as_str()) else {
            if end.ledgers.get(key).is_none_or(|c| c.is_empty()) {
                add(Promise::G2, format!("ledger {key} is in no set at the end"), vec![]);
            }
            continue;
        };
        let k = Keyed {
            key,
            ops,
            l,
            wall_origin_ms: end.wall_origin_ms,
            rewinds: end.rewinds,
        };
        k.g1(&mut add);
        k.holds(&mut add);
        k.g3(&mut add);
        let served = |f: fn(&LedgerAsk) -> bool| {
            ops.iter()
                .any(|o| o.invoke_ns >= end.verify_from_ns && f(&o.ask) && matches!(o.answer, LedgerAnswer::Ok { .. }))
        };
        if !served(|a| matches!(a, LedgerAsk::Reserve { .. })) || !served(|a| matches!(a, LedgerAsk::Confirm { .. })) {
            add(
                Promise::Liveness,
                format!("ledger {key} served no reserve and confirm after the heal"),
                vec![],
            );
        }
    }
    out.into_iter().collect()
}

fn group(ops: &[LedgerOp]) -> BTreeMap<String, Vec<&LedgerOp>> {
    let mut by_key: BTreeMap<String, Vec<&LedgerOp>> = BTreeMap::new();
    for o in ops {
        by_key.entry(o.key.clone()).or_default().push(o);
    }
    by_key
}

/// One ledger's calls and final record.
struct Keyed<'a> {
    key: &'a str,
    ops: &'a [&'a LedgerOp],
    l: &'a Ledger,
    wall_origin_ms: Option<u64>,
    rewinds: &'a [(u64, u64, u64)],
}

type Add<'f> = dyn FnMut(Promise, String, Vec<u64>) + 'f;

impl Keyed<'_> {
    /// The reserves answered OK: (number, request id, call).
    fn reserved(&self) -> impl Iterator<Item = (u64, &str, &LedgerOp)> {
        self.ops.iter().filter_map(|o| match (&o.ask, &o.answer) {
            (LedgerAsk::Reserve { request_id }, LedgerAnswer::Ok { number, .. }) => {
                Some((*number, request_id.as_str(), *o))
            }
            _ => None,
        })
    }

    /// Every number handed out and answered OK, to a reserve or an issue: (number, the request id
    /// or the issue's reference, call).
    fn handed_out(&self) -> impl Iterator<Item = (u64, &str, &LedgerOp)> {
        let issued = self.ops.iter().filter_map(|o| match (&o.ask, &o.answer) {
            (LedgerAsk::Issue { reference }, LedgerAnswer::Ok { number, .. }) => {
                Some((*number, reference.as_str(), *o))
            }
            _ => None,
        });
        self.reserved().chain(issued)
    }

    /// Whether `o`'s write may have applied after a backup of its set that was then restored: it
    /// completed after the backup and began before the restore.
    fn undone(&self, o: &LedgerOp) -> bool {
        self.rewinds
            .iter()
            .any(|&(set, backup, restored)| set == o.set && o.complete_ns >= backup && o.invoke_ns <= restored)
    }

    fn lost_with_restore(&self, n: u64) -> bool {
        matches!(self.l.state_of(n), NumberState::Voided { void, .. } if void.reason == VoidReason::LostWithRestore)
    }

    fn g1(&self, add: &mut Add<'_>) {
        let key = self.key;
        let mut owners: BTreeMap<u64, BTreeMap<&str, u64>> = BTreeMap::new();
        let mut numbers: BTreeMap<&str, Vec<(u64, &LedgerOp)>> = BTreeMap::new();
        for (n, rid, o) in self.handed_out() {
            if n == 0 || n > self.l.high {
                add(
                    Promise::G1,
                    format!("ledger {key}: number {n} answered, the highest is {}", self.l.high),
                    vec![o.id],
                );
            }
            owners.entry(n).or_default().entry(rid).or_insert(o.id);
            numbers.entry(rid).or_default().push((n, o));
        }
        for (n, rids) in owners.iter().filter(|(_, r)| r.len() > 1) {
            let names: Vec<&str> = rids.keys().copied().collect();
            add(
                Promise::G1,
                format!("ledger {key}: number {n} handed out to requests {names:?}"),
                rids.values().copied().collect(),
            );
        }
        for (rid, mut got) in numbers {
            got.sort_by_key(|(_, o)| o.complete_ns);
            for w in got.windows(2) {
                let ((a, oa), (b, ob)) = (w[0], w[1]);
                // The retry may have come after the first hold's deadline (by the leader's clock:
                // known to be the true one only without clock faults): the store then hands out
                // a new number and the first stays held until the tick expires it or its caller
                // releases it — voided either way, never handed out again.
                let hold_ns = self.l.hold_ms.saturating_mul(1_000_000);
                let past_hold = self.wall_origin_ms.is_none() || ob.complete_ns.saturating_sub(oa.invoke_ns) >= hold_ns;
                let ended = match self.l.state_of(a) {
                    NumberState::Voided { void, .. } => {
                        matches!(void.reason, VoidReason::Expired | VoidReason::LostWithRestore) || past_hold
                    }
                    // An issue's retry answers the first number only while its reference is kept.
                    NumberState::Confirmed(None) => matches!(oa.ask, LedgerAsk::Issue { .. }),
                    _ => false,
                };
                if a != b && !ended {
                    add(
                        Promise::G1,
                        format!(
                            "ledger {key}: request {rid} got {a} (answered at {} ms), then {b} (asked at {} ms, \
                             answered at {} ms) while {a} had not expired; {a} ends {:?}",
                            oa.complete_ns / 1_000_000,
                            ob.invoke_ns / 1_000_000,
                            ob.complete_ns / 1_000_000,
                            self.l.state_of(a)
                        ),
                        vec![oa.id, ob.id],
                    );
                }
            }
        }
    }

    fn holds(&self, add: &mut Add<'_>) {
        let mut first_invoke: BTreeMap<&str, u64> = BTreeMap::new();
        for o in self.ops {
            if let LedgerAsk::Reserve { request_id } = &o.ask {
                let e = first_invoke.entry(request_id).or_insert(o.invoke_ns);
                *e = (*e).min(o.invoke_ns);
            }
        }
        let mut seen = BTreeSet::new();
        for (n, rid, o) in self.reserved() {
            if !seen.insert(n) {
                continue;
            }
            let since_ns = first_invoke.get(rid).copied().unwrap_or(o.invoke_ns);
            if let Some(what) = self.hold_end(n, rid, o.caller, since_ns) {
                let what = format!("ledger {}: number {n}, answered to request {rid}, {what}", self.key);
                add(Promise::Holds, what, vec![o.id]);
            }
        }
    }

    /// What is wrong with how number `n`, answered to request `rid` of `caller` (first asked at
    /// `since_ns`), ended, if anything.
    fn hold_end(&self, n: u64, rid: &str, caller: u32, since_ns: u64) -> Option<String> {
        let sent = |f: &dyn Fn(&LedgerAsk) -> bool| {
            self.ops.iter().any(|o| {
                o.caller == caller
                    && f(&o.ask)
                    && matches!(o.ask, LedgerAsk::Confirm { number, .. } | LedgerAsk::Release { number } if number == n)
            })
        };
        match self.l.state_of(n) {
            NumberState::Held(h) if h.request_id != rid => Some(format!("is held by request {}", h.request_id)),
            NumberState::Held(_) => Some("is still held after the heal and its hold".into()),
            NumberState::Confirmed(r) => {
                let mine = |a: &LedgerAsk| match (a, &r) {
                    (LedgerAsk::Confirm { reference, .. }, Some(r)) => *reference == r.reference,
                    (LedgerAsk::Confirm { .. }, None) => true,
                    _ => false,
                };
                (!sent(&mine)).then(|| format!("is confirmed ({r:?}) by no confirm of its caller"))
            }
            NumberState::Voided { void, .. } => match void.reason {
                VoidReason::Released => (!sent(&|a| matches!(a, LedgerAsk::Release { .. })))
                    .then(|| "is released by no release of its caller".into()),
                VoidReason::Expired => {
                    let earliest = self.wall_origin_ms? + since_ns / 1_000_000 + self.l.hold_ms;
                    (void.at_ms + EXPIRY_SLACK_MS < earliest).then(|| {
                        format!(
                            "expired at {} ms, before its hold could end ({earliest} ms)",
                            void.at_ms
                        )
                    })
                }
                VoidReason::Operator => Some("was voided by an operator nobody ran".into()),
                VoidReason::LostWithRestore => None,
            },
            NumberState::NotIssued => None, // G1 names it.
        }
    }

    fn g3(&self, add: &mut Add<'_>) {
        let key = self.key;
        let mut confirmed: BTreeMap<u64, Vec<(&str, u64)>> = BTreeMap::new();
        for o in self.ops {
            // A confirm a restore undid left its number held again: the restore's known loss
            // (docs/decisions/0004-ledger-counters.md), not a change the set made.
            let done = match (&o.ask, &o.answer) {
                (LedgerAsk::Confirm { number, reference }, LedgerAnswer::Ok { .. })
                | (LedgerAsk::Issue { reference }, LedgerAnswer::Ok { number, .. }) => Some((*number, reference)),
                _ => None,
            };
            if let Some((number, reference)) = done
                && !self.undone(o)
            {
                confirmed.entry(number).or_default().push((reference, o.id));
            }
        }
        for (&n, refs) in &confirmed {
            if self.lost_with_restore(n) {
                continue;
            }
            let (first, first_id) = refs[0];
            let distinct: BTreeSet<&str> = refs.iter().map(|(r, _)| *r).collect();
            if distinct.len() > 1 {
                add(
                    Promise::G3,
                    format!("ledger {key}: number {n} confirmed OK with references {distinct:?}"),
                    refs.iter().map(|r| r.1).collect(),
                );
            }
            let kept = match self.l.state_of(n) {
                NumberState::Confirmed(Some(r)) if r.reference == first => true,
                NumberState::Confirmed(None) => true,
                other => {
                    add(
                        Promise::G3,
                        format!("ledger {key}: number {n} confirmed OK with {first:?} ends as {other:?}"),
                        vec![first_id],
                    );
                    false
                }
            };
            for o in self.ops {
                let about = match &o.ask {
                    LedgerAsk::Confirm { number, reference } if *number == n => Some(Some(reference.as_str())),
                    LedgerAsk::Release { number } if *number == n => Some(None),
                    _ => None,
                };
                let broken = match (about, &o.answer) {
                    (Some(None), LedgerAnswer::Ok { .. }) => Some("a release answered OK"),
                    (Some(Some(_)), LedgerAnswer::Voided) => Some("a confirm answered \"voided\""),
                    (Some(Some(r)), LedgerAnswer::AlreadyExists)
                        if r == first && kept && self.l.references.contains_key(&n) =>
                    {
                        Some("a repeat with its reference refused")
                    }
                    _ => None,
                };
                if let Some(what) = broken {
                    add(
                        Promise::G3,
                        format!("ledger {key}: number {n} confirmed OK with {first:?}, then {what}"),
                        vec![first_id, o.id],
                    );
                }
            }
        }
    }
}

/// Counts of a run's ledger calls, for the summary line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LedgerStats {
    pub reserved: u64,
    pub confirmed: u64,
    pub released: u64,
    /// Issues answered with a new number (confirmed in the same write).
    pub issued: u64,
    /// Reserves and confirms answered as repeats (same request id, same reference).
    pub repeated: u64,
    /// Other-reference confirms refused with ALREADY_EXISTS, and confirms refused as voided.
    pub already_exists: u64,
    pub refused_voided: u64,
    pub unknown: u64,
    /// Numbers voided as expired and lost with a restore in the final state.
    pub expired: u64,
    pub lost_with_restore: u64,
}

impl LedgerStats {
    /// The counts of `ops` and of the final ledgers.
    pub fn of(ops: &[LedgerOp], ledgers: &BTreeMap<String, Vec<Ledger>>) -> Self {
        let mut s = LedgerStats::default();
        for o in ops {
            match (&o.ask, &o.answer) {
                (_, LedgerAnswer::Ok { repeated: true, .. }) => s.repeated += 1,
                (LedgerAsk::Reserve { .. }, LedgerAnswer::Ok { .. }) => s.reserved += 1,
                (LedgerAsk::Confirm { .. }, LedgerAnswer::Ok { .. }) => s.confirmed += 1,
                (LedgerAsk::Release { .. }, LedgerAnswer::Ok { .. }) => s.released += 1,
                (LedgerAsk::Issue { .. }, LedgerAnswer::Ok { .. }) => s.issued += 1,
                (_, LedgerAnswer::AlreadyExists) => s.already_exists += 1,
                (_, LedgerAnswer::Voided) => s.refused_voided += 1,
                (_, LedgerAnswer::Unknown) => s.unknown += 1,
                (_, LedgerAnswer::Refused(_)) => {}
            }
        }
        for l in ledgers.values().flatten() {
            for (&first, v) in &l.voided {
                let count = v.through - first + 1;
                match v.reason {
                    VoidReason::Expired => s.expired += count,
                    VoidReason::LostWithRestore => s.lost_with_restore += count,
                    _ => {}
                }
            }
        }
        s
    }

    /// Adds another seed's counts.
    pub fn add(&mut self, o: &LedgerStats) {
        self.reserved += o.reserved;
        self.confirmed += o.confirmed;
        self.released += o.released;
        self.issued += o.issued;
        self.repeated += o.repeated;
        self.already_exists += o.already_exists;
        self.refused_voided += o.refused_voided;
        self.unknown += o.unknown;
        self.expired += o.expired;
        self.lost_with_restore += o.lost_with_restore;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use storesvr::domain::ledger::{Hold, Reference, Void};

    /// A ledger of `high` numbers: `confirmed` with their references, `expired`, the rest held
    /// by request "r{n}".
    fn ledger(high: u64, confirmed: &[(u64, &str)], expired: &[u64]) -> Ledger {
        let mut l = Ledger {
            section: seqsvr_proto::SectionId(0),
            hold_ms: 1_000,
            high,
            held: BTreeMap::new(),
            voided: BTreeMap::new(),
            confirmed: BTreeMap::new(),
            references: BTreeMap::new(),
            requests: BTreeMap::new(),
            confirmed_count: 0,
            voided_count: 0,
            voided_by: [0; 4],
            clock_ms: 0,
            restored: false,
        };
        for n in 1..=high {
            if let Some((_, r)) = confirmed.iter().find(|(c, _)| *c == n) {
                l.confirmed.insert(n, n);
                l.confirmed_count += 1;
                let reference = Reference {
                    reference: r.to_string(),
                    at_ms: 0,
                };
                l.references.insert(n, reference);
            } else if expired.contains(&n) {
                let void = Void {
                    through: n,
                    reason: VoidReason::Expired,
                    who: String::new(),
                    note: String::new(),
                    at_ms: 10_000,
                };
                l.voided.insert(n, void);
                l.voided_count += 1;
                l.voided_by[1] += 1;
            } else {
                let hold = Hold {
                    holder: String::new(),
                    request_id: format!("r{n}"),
                    at_ms: 0,
                    deadline_ms: 1_000,
                };
                l.held.insert(n, hold);
                l.requests.insert(format!("r{n}"), n);
            }
        }
        l
    }

    fn op(id: u64, ask: LedgerAsk, answer: LedgerAnswer) -> LedgerOp {
        LedgerOp {
            id,
            caller: 0,
            set: 0,
            key: "k".into(),
            ask,
            invoke_ns: id * 1_000_000,
            complete_ns: id * 1_000_000 + 500_000,
            answer,
        }
    }

    fn reserve(id: u64, rid: &str, number: u64) -> LedgerOp {
        let ask = LedgerAsk::Reserve { request_id: rid.into() };
        op(
            id,
            ask,
            LedgerAnswer::Ok {
                number,
                repeated: false,
            },
        )
    }

    fn confirm(id: u64, number: u64, reference: &str, answer: LedgerAnswer) -> LedgerOp {
        let ask = LedgerAsk::Confirm {
            number,
            reference: reference.into(),
        };
        op(id, ask, answer)
    }

    const OK: LedgerAnswer = LedgerAnswer::Ok {
        number: 1,
        repeated: false,
    };

    /// The promises `ops` break against `l` (the verify calls are not asked for).
    fn broken(ops: &[LedgerOp], l: Ledger) -> Vec<Promise> {
        let ledgers = BTreeMap::from([("k".to_string(), vec![l])]);
        let end = Final {
            ledgers: &ledgers,
            wall_origin_ms: Some(0),
            verify_from_ns: 0,
            rewinds: &[],
        };
        let found = check(ops, &end);
        found
            .into_iter()
            .filter(|(p, v)| *p != Promise::Liveness && !v.is_empty())
            .map(|(p, _)| p)
            .collect()
    }

    #[test]
    fn a_confirmed_and_an_expired_number_keep_every_promise() {
        let ops = [reserve(1, "r1", 1), confirm(2, 1, "a", OK), reserve(3, "r2", 2)];
        assert_eq!(broken(&ops, ledger(2, &[(1, "a")], &[2])), vec![]);
    }

    fn issue(id: u64, reference: &str, number: u64) -> LedgerOp {
        let ask = LedgerAsk::Issue {
            reference: reference.into(),
        };
        op(
            id,
            ask,
            LedgerAnswer::Ok {
                number,
                repeated: false,
            },
        )
    }

    #[test]
    fn issues_answered_once_each_keep_every_promise_and_a_retry_on_a_new_number_breaks_g1() {
        let l = || ledger(2, &[(1, "INV-1"), (2, "INV-2")], &[]);
        assert_eq!(broken(&[issue(1, "INV-1", 1), issue(2, "INV-2", 2)], l()), vec![]);
        // The same reference again, answered the same: a repeat, not a second number.
        assert_eq!(broken(&[issue(1, "INV-1", 1), issue(2, "INV-1", 1)], l()), vec![]);
        // Answered a new number while the first still carries its reference.
        let twice = [issue(1, "INV-1", 1), issue(2, "INV-1", 2)];
        assert!(broken(&twice, l()).contains(&Promise::G1));
        // One number answered to an issue and to a reserve.
        let both = [issue(1, "INV-1", 1), reserve(2, "r1", 1)];
        assert!(broken(&both, l()).contains(&Promise::G1));
    }

    #[test]
    fn an_issued_number_that_ends_otherwise_than_confirmed_with_its_reference_breaks_g3() {
        let other = ledger(1, &[(1, "INV-9")], &[]);
        assert_eq!(broken(&[issue(1, "INV-1", 1)], other), vec![Promise::G3]);
        let expired = ledger(1, &[], &[1]);
        assert!(broken(&[issue(1, "INV-1", 1)], expired).contains(&Promise::G3));
    }

    #[test]
    fn a_retry_after_the_hold_gets_a_new_number_and_the_first_may_end_released() {
        let mut l = ledger(2, &[], &[]);
        let hold = l.held.remove(&1).expect("held");
        l.requests.remove(&hold.request_id);
        l.voided_by[0] += 1;
        l.voided_count += 1;
        let void = Void {
            through: 1,
            reason: VoidReason::Released,
            who: String::new(),
            note: String::new(),
            at_ms: 0,
        };
        l.voided.insert(1, void);
        let mut late = reserve(5, "r1", 2);
        late.complete_ns = 1_500_000_000; // the hold is 1 s
        let soon = reserve(2, "r1", 2);
        let release = op(3, LedgerAsk::Release { number: 1 }, OK);
        let ops = |second: LedgerOp| [reserve(1, "r1", 1), second, release.clone()];
        assert!(!broken(&ops(late), l.clone()).contains(&Promise::G1));
        // Within the hold, by the true clock: the first number was live, the retry had to get it.
        assert!(broken(&ops(soon), l).contains(&Promise::G1));
    }

    #[test]
    fn one_number_answered_to_two_requests_breaks_g1() {
        let ops = [reserve(1, "r1", 1), reserve(2, "rx", 1)];
        assert!(broken(&ops, ledger(1, &[], &[1])).contains(&Promise::G1));
    }

    #[test]
    fn a_number_answered_above_high_breaks_g1() {
        let ops = [reserve(1, "r1", 3)];
        assert!(broken(&ops, ledger(2, &[], &[1, 2])).contains(&Promise::G1));
    }

    #[test]
    fn a_confirmed_number_that_ends_expired_breaks_g3() {
        let ops = [reserve(1, "r1", 1), confirm(2, 1, "a", OK)];
        assert_eq!(broken(&ops, ledger(1, &[], &[1])), vec![Promise::G3]);
    }

    #[test]
    fn a_confirm_answered_voided_after_one_answered_ok_breaks_g3() {
        let ops = [
            reserve(1, "r1", 1),
            confirm(2, 1, "a", OK),
            confirm(3, 1, "a", LedgerAnswer::Voided),
        ];
        assert_eq!(broken(&ops, ledger(1, &[(1, "a")], &[])), vec![Promise::G3]);
    }

    #[test]
    fn a_number_still_held_or_expired_too_early_breaks_holds() {
        assert_eq!(
            broken(&[reserve(1, "r1", 1)], ledger(1, &[], &[])),
            vec![Promise::Holds]
        );
        let mut early = ledger(1, &[], &[1]);
        early.voided.get_mut(&1).expect("voided").at_ms = 500;
        assert_eq!(broken(&[reserve(1, "r1", 1)], early), vec![Promise::Holds]);
    }

    #[test]
    fn a_ledger_whose_states_do_not_cover_high_breaks_g2() {
        let mut l = ledger(2, &[], &[1, 2]);
        l.voided.remove(&2);
        l.voided_count = 1;
        assert!(broken(&[reserve(1, "r1", 1)], l).contains(&Promise::G2));
    }
}
