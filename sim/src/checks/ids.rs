//! U1–U4 over every time-ordered id any `NextIds` call returned (docs/design/time-ordered-ids.md):
//!
//! - **U1**: no id twice, anywhere: across sets, restarts and slot handovers. A repeat whose later
//!   call completed after a clock fault began is reported as **U4** instead (no clock step may
//!   cause a repeat), so that a report says which promise the seed broke.
//! - **U2**: the ids of one holder strictly increase in issue order. A holder is a slot under one
//!   grant's epoch (the reply names the epoch, every id its slot). Issue order is only known
//!   between calls that did not overlap, so: within a call, and whenever call A completed before
//!   call B began, every id A got from a holder is below every id B got from it. Not across
//!   holders: an old holder that is cut off or paused may still issue ids below its mark while the
//!   slot's next holder issues above it (unique, by the floor, but not in completion order; the
//!   lease bounds how long, and U3 how far back in time).
//! - **U3**: an id's time is within `max_skew` of the true time while its call ran,
//!   `[true(invoke) − max_skew − tick, true(complete) + max_skew]`, and if A completed before B
//!   began then `time(B) ≥ time(A) − 2·max_skew`. The allowance bounds both sides: a holder
//!   whose clock lags the leader's by more issues nothing, and no mark is acknowledged past the
//!   leader's clock plus the allowance, so borrowing never reaches beyond it either (the store's
//!   clocks read the true time in the simulators but for the faults below). One tick of slack below: a tick starts at
//!   or before the clock that chose it.
//!
//!   While a StoreSvr clock fault (`store-clock-*`) may have moved the store leader's reference
//!   clock — the quorum's is used, but with a replica down the leader cannot tell which of two
//!   clocks is wrong — both bounds are widened by the fault's size, from its start until its
//!   size, the allowance and 5 s more after its end (a mark raised under a fast clock stays usable
//!   until the true time reaches it). U1, U2 and U4 are never widened: no clock may cause a
//!   repeat.
//!
//! Deliberately left out: density (ids are not dense; a slot's unused ticks are simply skipped).

use std::collections::BTreeMap;

use seqsvr_proto::id_layout::IdLayout;

use super::{Promise, Violation};
use crate::history::{FaultSpan, IdCall, IdsInfo, Outcome};

/// Fault kinds that move an AllocSvr's id clock (`sim dst` and `sim run` name them so).
pub fn is_clock_fault(kind: &str) -> bool {
    kind.starts_with("id-clock")
}

/// One ok call's ids from one slot, as the ordering sweeps see them.
#[derive(Clone, Copy, Debug)]
struct Span {
    call: u64,
    invoke_ns: u64,
    complete_ns: u64,
    min: u64,
    max: u64,
}

/// Runs U1–U4; returns the violations per promise.
pub fn check(calls: &[IdCall], info: &IdsInfo, faults: &[FaultSpan]) -> Vec<(Promise, Vec<Violation>)> {
    vec![
        repeats(calls, faults),
        (Promise::U2, per_holder_order(calls, &info.layout)),
        (Promise::U3, times(calls, info, faults)),
    ]
    .into_iter()
    .flat_map(|(p, v): (Promise, Vec<Violation>)| {
        // `repeats` sorts its findings into U1 and U4 itself.
        if p == Promise::U1 {
            let (u4, u1): (Vec<_>, Vec<_>) = v.into_iter().partition(|x| x.promise == Promise::U4);
            vec![(Promise::U1, u1), (Promise::U4, u4)]
        } else {
            vec![(p, v)]
        }
    })
    .collect()
}

/// U1 and U4: every id once.
fn repeats(calls: &[IdCall], faults: &[FaultSpan]) -> (Promise, Vec<Violation>) {
    let first_clock_fault = faults
        .iter()
        .filter(|f| is_clock_fault(&f.kind))
        .map(|f| f.start_ns)
        .min();
    let all: Vec<(u64, &IdCall)> = calls.iter().flat_map(|c| c.ids().map(move |id| (id, c))).collect();
    let mut found = Vec::new();
    for (id, a, b) in seqsvr_promises::ids::repeated(all, |c| (c.invoke_ns, c.id)) {
        let later_done = a.complete_ns.max(b.complete_ns);
        let promise = match first_clock_fault {
            Some(at) if at <= later_done => Promise::U4,
            _ => Promise::U1,
        };
        found.push(Violation::new(
            promise,
            format!("id {id} was returned twice (sets {} and {})", a.set_id, b.set_id),
            vec![a.id, b.id],
        ));
    }
    (Promise::U1, found)
}

/// U2: within a call and between calls that did not overlap, one holder's ids increase.
fn per_holder_order(calls: &[IdCall], layout: &IdLayout) -> Vec<Violation> {
    let mut found = Vec::new();
    let mut by_holder: BTreeMap<(u64, u64), Vec<Span>> = BTreeMap::new();
    for c in calls.iter().filter(|c| c.outcome == Outcome::Ok) {
        for (slot, span) in spans_of(c, layout, &mut found) {
            by_holder.entry((slot, c.slot_epoch)).or_default().push(span);
        }
    }
    for ((slot, epoch), spans) in by_holder {
        let mut done: Vec<Span> = spans.clone();
        done.sort_by_key(|s| s.complete_ns);
        let mut probes = spans;
        probes.sort_by_key(|s| s.invoke_ns);
        let (mut next, mut best): (usize, Option<Span>) = (0, None);
        for p in probes {
            while next < done.len() && done[next].complete_ns < p.invoke_ns {
                if best.is_none_or(|b| done[next].max > b.max) {
                    best = Some(done[next]);
                }
                next += 1;
            }
            if let Some(b) = best
                && p.min <= b.max
            {
                found.push(Violation::new(
                    Promise::U2,
                    format!(
                        "slot {slot} under epoch {epoch}: id {} was issued after id {} of a call that had completed",
                        p.min, b.max
                    ),
                    vec![b.call, p.call],
                ));
            }
        }
    }
    found
}

/// The span of ids one successful call got per slot; ids out of order within the reply, or that do
/// not decode, are U2 violations added to `found`.
fn spans_of(c: &IdCall, layout: &IdLayout, found: &mut Vec<Violation>) -> BTreeMap<u64, Span> {
    let mut spans: BTreeMap<u64, Span> = BTreeMap::new();
    let mut last: BTreeMap<u64, u64> = BTreeMap::new();
    for id in c.ids() {
        let Some(parts) = layout.decompose(id) else {
            found.push(Violation::new(
                Promise::U2,
                format!("id {id} does not decode under {layout}"),
                vec![c.id],
            ));
            continue;
        };
        if let Some(&prev) = last.get(&parts.slot)
            && id <= prev
        {
            found.push(Violation::new(
                Promise::U2,
                format!("slot {}: id {id} follows {prev} within one reply", parts.slot),
                vec![c.id],
            ));
        }
        last.insert(parts.slot, id);
        spans
            .entry(parts.slot)
            .and_modify(|s| {
                s.min = s.min.min(id);
                s.max = s.max.max(id);
            })
            .or_insert(Span {
                call: c.id,
                invoke_ns: c.invoke_ns,
                complete_ns: c.complete_ns,
                min: id,
                max: id,
            });
    }
    spans
}

/// Kind names of the faults that put a StoreSvr replica's wall clock off (`sim dst --ids`).
pub fn is_store_clock_fault(kind: &str) -> bool {
    kind.starts_with("store-clock")
}

/// How long after a StoreSvr clock fault ends its effect may last beyond the fault's own size: a
/// holder's reading of the leader's clock is renewed at its next raise (within a few seconds,
/// backing off), and a mark raised under a fast clock stays usable until the true time reaches it.
const STORE_CLOCK_SETTLE_MS: u64 = 5_000;

/// For each StoreSvr clock fault, `(from_ns, to_ns, off_ms)`: while a call overlaps the span, U3
/// holds only within the allowance plus `off_ms`. A leader stamps raises with the quorum's clock,
/// so one wrong clock of three moves nothing while all three answer; with one of them down the
/// leader cannot tell which of two is wrong and uses its own, so the reference U3 is measured
/// against is then off by as much as the fault (docs/design/time-ordered-ids.md). The size is read back from the
/// fault's target, which says "off by up to N ms" (`dst::faults::inject`).
fn store_clock_windows(faults: &[FaultSpan], skew_ms: u64) -> Vec<(u64, u64, i128)> {
    faults
        .iter()
        .filter(|f| is_store_clock_fault(&f.kind))
        .filter_map(|f| {
            let off: u64 = f
                .target
                .split("off by up to ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse()
                .ok()?;
            let tail_ms = off + skew_ms + STORE_CLOCK_SETTLE_MS;
            Some((f.start_ns, f.end_ns + tail_ms * 1_000_000, off as i128))
        })
        .collect()
}

/// U3: each call's ids within the allowance of the true time, and completed-before order within
/// twice it (each widened while a StoreSvr clock fault may have moved the reference).
fn times(calls: &[IdCall], info: &IdsInfo, faults: &[FaultSpan]) -> Vec<Violation> {
    let layout = info.layout;
    let skew = info.max_skew_ms as i128;
    let windows = store_clock_windows(faults, info.max_skew_ms);
    let extra = |invoke_ns: u64, complete_ns: u64| -> i128 {
        windows
            .iter()
            .filter(|(from, to, _)| invoke_ns <= *to && complete_ns >= *from)
            .map(|w| w.2)
            .max()
            .unwrap_or(0)
    };
    let true_ms = |ns: u64| info.origin_ms as i128 + (ns / 1_000_000) as i128;
    let mut found = Vec::new();
    // (invoke, complete, min time, max time, call, widening)
    let mut spans: Vec<(u64, u64, i128, i128, u64, i128)> = Vec::new();
    for c in calls.iter().filter(|c| c.outcome == Outcome::Ok) {
        let stamped: Vec<i128> = c
            .ids()
            .filter_map(|id| layout.decompose(id))
            .map(|p| layout.ms_of(p.tick) as i128)
            .collect();
        let (Some(&lo), Some(&hi)) = (stamped.iter().min(), stamped.iter().max()) else {
            continue;
        };
        let widening = extra(c.invoke_ns, c.complete_ns);
        let wide = skew + widening;
        let (earliest, latest) =
            seqsvr_promises::ids::stamp_window(&layout, true_ms(c.invoke_ns), true_ms(c.complete_ns), wide);
        if lo < earliest || hi > latest {
            let (t, bound) = if lo < earliest { (lo, earliest) } else { (hi, latest) };
            found.push(Violation::new(
                Promise::U3,
                format!(
                    "an id stamped {} ms {} the true time allows (bound {bound}, stamped {t}; allowance {skew} ms)",
                    (t - bound).abs(),
                    if lo < earliest { "earlier than" } else { "later than" },
                ),
                vec![c.id],
            ));
        }
        spans.push((c.invoke_ns, c.complete_ns, lo, hi, c.id, widening));
    }
    let mut done = spans.clone();
    done.sort_by_key(|s| s.1);
    spans.sort_by_key(|s| s.0);
    let (mut next, mut best): (usize, Option<(i128, u64, i128)>) = (0, None);
    for (invoke, _, lo, _, call, this_extra) in spans {
        while next < done.len() && done[next].1 < invoke {
            if best.is_none_or(|(t, ..)| done[next].3 > t) {
                best = Some((done[next].3, done[next].4, done[next].5));
            }
            next += 1;
        }
        if let Some((t, earlier, earlier_extra)) = best
            && lo < t - 2 * skew - earlier_extra - this_extra
        {
            found.push(Violation::new(
                Promise::U3,
                format!(
                    "an id stamped {lo} came after a completed call's id stamped {t}: more than twice the allowance back"
                ),
                vec![earlier, call],
            ));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORIGIN: u64 = 1_800_000_000_000;

    fn info() -> IdsInfo {
        IdsInfo {
            layout: IdLayout::twitter(1_700_000_000_000),
            origin_ms: ORIGIN,
            max_skew_ms: 3_000,
        }
    }

    /// An ok call at run time `[at_ms, at_ms + 1]` of `n` ids from `slot` stamped `stamp_ms`.
    fn call(id: u64, at_ms: u64, slot: u64, stamp_ms: u64, seq: u64, n: u64) -> IdCall {
        let l = info().layout;
        let first = l
            .compose(seqsvr_proto::id_layout::IdParts {
                tick: l.tick_of(stamp_ms).unwrap(),
                slot,
                seq,
            })
            .unwrap();
        IdCall {
            id,
            client: 0,
            count: n,
            invoke_ns: at_ms * 1_000_000,
            complete_ns: (at_ms + 1) * 1_000_000,
            outcome: Outcome::Ok,
            runs: vec![(first, n)],
            set_id: 0,
            slot_epoch: 1,
            error: None,
        }
    }

    fn counts(calls: &[IdCall], faults: &[FaultSpan]) -> BTreeMap<Promise, usize> {
        check(calls, &info(), faults)
            .into_iter()
            .map(|(p, v)| (p, v.len()))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    #[test]
    fn clean_ids_from_two_slots_pass() {
        let calls = [
            call(1, 10, 0, ORIGIN + 10, 0, 5),
            call(2, 20, 1, ORIGIN + 20, 0, 5),
            call(3, 30, 0, ORIGIN + 30, 0, 5),
        ];
        assert!(counts(&calls, &[]).is_empty());
    }

    #[test]
    fn a_planted_duplicate_is_caught_as_u1_and_after_a_clock_fault_as_u4() {
        let calls = [call(1, 10, 0, ORIGIN + 10, 0, 5), call(2, 20, 1, ORIGIN + 20, 0, 5), {
            let mut c = call(3, 30, 2, ORIGIN + 30, 0, 1);
            c.runs = vec![(call(1, 10, 0, ORIGIN + 10, 0, 5).runs[0].0 + 2, 1)];
            c
        }];
        let found = counts(&calls, &[]);
        assert_eq!(found.get(&Promise::U1), Some(&1), "{found:?}");
        let fault = FaultSpan {
            id: 0,
            kind: "id-clock-step".into(),
            target: "allocsvr-0".into(),
            start_ns: 25_000_000,
            end_ns: 26_000_000,
        };
        let found = counts(&calls, &[fault]);
        assert_eq!(found.get(&Promise::U4), Some(&1), "{found:?}");
        assert_eq!(found.get(&Promise::U1), None);
    }

    #[test]
    fn a_holder_going_back_after_a_completed_call_breaks_u2() {
        let calls = [call(1, 10, 0, ORIGIN + 10, 0, 5), call(2, 20, 0, ORIGIN + 9, 0, 5)];
        let found = counts(&calls, &[]);
        assert_eq!(found.get(&Promise::U2), Some(&1), "{found:?}");
        // The slot's next holder (another epoch) may be above an old holder still issuing.
        let mut handed_over = calls.clone();
        handed_over[0].slot_epoch = 2;
        assert!(counts(&handed_over, &[]).is_empty());
        // Overlapping calls may take a slot's ids in either order.
        let mut overlapping = calls.clone();
        overlapping[1].invoke_ns = 10_500_000;
        assert!(counts(&overlapping, &[]).is_empty());
    }

    #[test]
    fn a_planted_time_error_is_caught_as_u3() {
        // 5 s behind the true time against a 3 s allowance.
        let calls = [call(1, 10_000, 0, ORIGIN + 5_000, 0, 1)];
        let found = counts(&calls, &[]);
        assert_eq!(found.get(&Promise::U3), Some(&1), "{found:?}");
        // 4 s ahead.
        let calls = [call(1, 10_000, 0, ORIGIN + 14_000, 0, 1)];
        assert_eq!(counts(&calls, &[]).get(&Promise::U3), Some(&1));
        // Within the allowance either way.
        let calls = [
            call(1, 10_000, 0, ORIGIN + 7_500, 0, 1),
            call(2, 20_000, 1, ORIGIN + 22_900, 0, 1),
        ];
        assert!(counts(&calls, &[]).is_empty());
    }

    /// While a StoreSvr clock fault may have moved the leader's reference clock, U3 is widened by
    /// the fault's size, and only then: the same call outside the fault's window is caught.
    #[test]
    fn a_store_clock_fault_widens_u3_by_its_size_for_the_calls_it_reaches() {
        // 5 s behind the true time against a 3 s allowance, at 20 s.
        let calls = [call(1, 20_000, 0, ORIGIN + 15_000, 0, 1)];
        let fault = |start_ms: u64, off_ms: u64| FaultSpan {
            id: 0,
            kind: "store-clock-step".into(),
            target: format!("storesvr-1 (clock -{off_ms} ms, off by up to {off_ms} ms)"),
            start_ns: start_ms * 1_000_000,
            end_ns: (start_ms + 1_000) * 1_000_000,
        };
        assert!(counts(&calls, &[fault(19_000, 2_000)]).is_empty(), "within 3 s + 2 s");
        assert_eq!(counts(&calls, &[fault(19_000, 1_000)]).get(&Promise::U3), Some(&1));
        // Still in its tail: 1 s long, then 2 s + 3 s + 5 s.
        assert!(counts(&calls, &[fault(9_500, 2_000)]).is_empty());
        // Over by then: no widening.
        assert_eq!(counts(&calls, &[fault(8_000, 2_000)]).get(&Promise::U3), Some(&1));
    }
}
