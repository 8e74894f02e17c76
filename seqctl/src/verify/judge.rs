//! The verdict over a [`History`]: the promises of docs/DESIGN.md that a caller outside the
//! cluster can see, checked by the functions the simulator uses (package `seqsvr-promises`).
//!
//! - **order** (P1, and U1 of counters): per uid and per key, no value twice, no value 0, and each
//!   value above every value of the same subject whose call completed before this call began.
//! - **ids**: no id twice in the whole run (U1); the ids of one reply strictly increase (a reply
//!   comes from one slot); each id stamped within the allowance of this host's clock while its
//!   call ran (U3).
//!
//! Failed and unknown calls give no value; an unknown one is never assumed not to have happened.
//! Deliberately left out: what the cluster's inside must show (durability against the store's
//! ceilings, one owner per section, waste): `sim run` checks those.

use std::collections::BTreeMap;

use seqsvr_promises::ids::{Stamp, judge_stamp, repeated, stamp_window};
use seqsvr_promises::order::{Finding, Obs, check_subject};

use super::history::{Call, History, Op, Outcome, Subject};

/// One broken promise with the calls that show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Violation {
    /// `order` or `ids`.
    pub promise: &'static str,
    pub what: String,
    /// Call ids, earliest evidence first.
    pub calls: Vec<u64>,
}

fn violation(promise: &'static str, what: String, calls: Vec<u64>) -> Violation {
    Violation { promise, what, calls }
}

/// Every violation of the history: order first (by subject), then ids.
pub(crate) fn judge(h: &History) -> Vec<Violation> {
    let mut out = order(&h.calls);
    out.extend(ids(h));
    out
}

fn obs(c: &Call, value: u64) -> Obs {
    Obs {
        call: c.id,
        invoke_ns: c.invoke_ns,
        complete_ns: c.complete_ns,
        value,
    }
}

fn order(calls: &[Call]) -> Vec<Violation> {
    let mut by_subject: BTreeMap<&Subject, Vec<Obs>> = BTreeMap::new();
    for c in calls.iter().filter(|c| c.outcome == Outcome::Ok && c.op != Op::NextIds) {
        for (s, v) in c.subjects.iter().zip(&c.values) {
            by_subject.entry(s).or_default().push(obs(c, *v));
        }
    }
    let mut out = Vec::new();
    for (subject, list) in by_subject {
        out.extend(check_subject(&list).into_iter().map(|f| match f {
            Finding::Zero(o) => violation("order", format!("{subject}: value 0 (call {})", o.call), vec![o.call]),
            Finding::NotAbove { earlier: a, later: b } => violation(
                "order",
                format!(
                    "{subject}: got {} (call {}, began at {} ns) after {} (call {}, completed at {} ns)",
                    b.value, b.call, b.invoke_ns, a.value, a.call, a.complete_ns
                ),
                vec![a.call, b.call],
            ),
            Finding::Twice { first, second } => violation(
                "order",
                format!(
                    "{subject}: value {} handed out twice (calls {} and {})",
                    first.value, first.call, second.call
                ),
                vec![first.call, second.call],
            ),
        }));
    }
    out
}

fn ids(h: &History) -> Vec<Violation> {
    let ok: Vec<&Call> = h
        .calls
        .iter()
        .filter(|c| c.outcome == Outcome::Ok && c.op == Op::NextIds)
        .collect();
    let all: Vec<(u64, &Call)> = ok
        .iter()
        .flat_map(|c| c.values.iter().map(move |&id| (id, *c)))
        .collect();
    let mut out: Vec<Violation> = repeated(all, |c| (c.invoke_ns, c.id))
        .into_iter()
        .map(|(id, a, b)| {
            violation(
                "ids",
                format!("id {id} returned twice (calls {} and {})", a.id, b.id),
                vec![a.id, b.id],
            )
        })
        .collect();
    let true_ms = |ns: u64| i128::from(h.started_unix_ms) + i128::from(ns / 1_000_000);
    for c in ok {
        if let Some(w) = c.values.windows(2).find(|w| w[1] <= w[0]) {
            out.push(violation(
                "ids",
                format!("call {}: id {} follows {} within one reply", c.id, w[1], w[0]),
                vec![c.id],
            ));
        }
        let window = stamp_window(
            &h.id_layout,
            true_ms(c.invoke_ns),
            true_ms(c.complete_ns),
            i128::from(h.id_allowance_ms),
        );
        let bad = c.values.iter().map(|&id| (id, judge_stamp(&h.id_layout, id, window)));
        if let Some((id, stamp)) = bad.into_iter().find(|(_, s)| *s != Stamp::Within) {
            let why = match stamp {
                Stamp::TooEarly { stamp_ms, bound_ms } => {
                    format!("stamped {} ms before the allowance", bound_ms - stamp_ms)
                }
                Stamp::TooLate { stamp_ms, bound_ms } => {
                    format!("stamped {} ms past the allowance", stamp_ms - bound_ms)
                }
                _ => format!("does not decode under {}", h.id_layout),
            };
            out.push(violation("ids", format!("call {}: id {id} {why}", c.id), vec![c.id]));
        }
    }
    out
}

/// What `--self-test` planted.
pub(crate) struct Planted {
    /// The id of the planted call.
    pub call: u64,
    pub what: String,
}

/// A copy of `h` with one duplicate planted: a call that began after an ok call completed and
/// got that call's first value again (or, in a run with ids only, its first id). `None` when the
/// history has no ok call to copy.
pub(crate) fn plant_duplicate(h: &History) -> Option<(History, Planted)> {
    let source = h
        .calls
        .iter()
        .find(|c| c.outcome == Outcome::Ok && c.op != Op::NextIds)
        .or_else(|| h.calls.iter().find(|c| c.outcome == Outcome::Ok))?;
    let end = h.calls.iter().map(|c| c.complete_ns).max().unwrap_or(0);
    let id = h.calls.iter().map(|c| c.id).max().unwrap_or(0) + 1;
    let planted = Call {
        id,
        invoke_ns: end + 1,
        complete_ns: end + 2,
        subjects: source.subjects.iter().take(1).cloned().collect(),
        values: source.values.iter().take(1).copied().collect(),
        ..source.clone()
    };
    let what = match planted.subjects.first() {
        Some(s) => format!(
            "{s} value {} of call {} again, as call {id}",
            planted.values[0], source.id
        ),
        None => format!("id {} of call {} again, as call {id}", planted.values[0], source.id),
    };
    let mut copy = h.clone();
    copy.calls.push(planted);
    Some((copy, Planted { call: id, what }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::history::{FORMAT, Front};
    use seqsvr_proto::id_layout::{IdLayout, IdParts};

    const START_MS: u64 = 1_800_000_000_000;

    fn layout() -> IdLayout {
        IdLayout::twitter(1_700_000_000_000)
    }

    fn call(id: u64, op: Op, subjects: Vec<Subject>, at_ms: u64, values: Vec<u64>) -> Call {
        Call {
            id,
            caller: 0,
            front: Front::Grpc,
            addr: "127.0.0.1:1".into(),
            op,
            subjects,
            invoke_ns: at_ms * 1_000_000,
            complete_ns: at_ms * 1_000_000 + 500_000,
            outcome: Outcome::Ok,
            values,
            error: None,
        }
    }

    fn id_at(ms: u64, seq: u64) -> u64 {
        let l = layout();
        let tick = l.tick_of(ms).unwrap();
        l.compose(IdParts { tick, slot: 1, seq }).unwrap()
    }

    fn history(calls: Vec<Call>) -> History {
        History {
            format: FORMAT.into(),
            started_unix_ms: START_MS,
            id_allowance_ms: 3_000,
            id_layout: layout(),
            calls,
        }
    }

    fn clean() -> History {
        let (u, k) = (Subject::Uid(7), Subject::Key("seqctl-verify:0".into()));
        history(vec![
            call(1, Op::Fetch, vec![u.clone()], 10, vec![3]),
            call(2, Op::Reserve, vec![u.clone(), u.clone()], 20, vec![4, 5]),
            call(3, Op::CounterNext, vec![k.clone()], 20, vec![4]),
            call(
                4,
                Op::NextIds,
                vec![],
                30,
                vec![id_at(START_MS + 30, 0), id_at(START_MS + 30, 1)],
            ),
            call(5, Op::Batch, vec![u, k], 40, vec![6, 5]),
        ])
    }

    #[test]
    fn a_clean_history_passes_and_each_planted_fault_is_found() {
        assert_eq!(judge(&clean()), vec![]);
        let mut h = clean();
        h.calls[1].values = vec![3, 4];
        let v = judge(&h);
        assert!(v.iter().any(|v| v.what.contains("handed out twice")), "{v:?}");
        assert!(v.iter().any(|v| v.what.contains("after 3")), "{v:?}");
        let mut h = clean();
        h.calls[3].values.reverse();
        assert!(judge(&h)[0].what.contains("within one reply"));
        let mut h = clean();
        h.calls[3].values = vec![id_at(START_MS + 30 + 4_000, 0)];
        assert!(judge(&h)[0].what.contains("past the allowance"));
        let mut h = clean();
        h.calls
            .push(call(6, Op::NextIds, vec![], 50, vec![h.calls[3].values[1]]));
        assert!(judge(&h)[0].what.contains("returned twice"));
        // An unknown call gives no value: it is never the earlier call of an ordering.
        let mut h = clean();
        h.calls[0].outcome = Outcome::Unknown;
        h.calls[0].values = vec![];
        assert_eq!(judge(&h), vec![]);
    }

    #[test]
    fn the_planted_duplicate_is_reported_and_an_empty_history_plants_nothing() {
        let (copy, planted) = plant_duplicate(&clean()).unwrap();
        assert!(planted.what.contains("uid 7 value 3"), "{}", planted.what);
        let v = judge(&copy);
        assert!(v.iter().any(|v| v.calls.contains(&planted.call)), "{v:?}");
        let ids_only = history(vec![call(1, Op::NextIds, vec![], 30, vec![id_at(START_MS + 30, 0)])]);
        let (copy, planted) = plant_duplicate(&ids_only).unwrap();
        assert!(judge(&copy).iter().any(|v| v.calls.contains(&planted.call)));
        assert!(plant_duplicate(&history(vec![])).is_none());
    }
}
