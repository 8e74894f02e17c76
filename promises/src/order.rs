//! One subject's values in real-time order (P1): for every subject, if ok call A completed before
//! ok call B began then `value(A) < value(B)`; no two ok calls share a value; no value is 0.
//!
//! A call whose outcome is unknown or failed gives no value, so it is never an observation here:
//! it can be neither the earlier nor the later call of an ordering.

/// One ok value of one subject.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Obs {
    /// The call's id in its history.
    pub call: u64,
    pub invoke_ns: u64,
    pub complete_ns: u64,
    pub value: u64,
}

/// One broken rule of one subject's values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finding {
    /// An ok call returned 0.
    Zero(Obs),
    /// `later` began after `earlier` completed, and is not above it.
    NotAbove { earlier: Obs, later: Obs },
    /// Two ok calls got the same value.
    Twice { first: Obs, second: Obs },
}

/// For each probe (sorted by invoke), the largest value among `done` that completed strictly
/// before the probe was invoked. Returns `(probe, Some(max earlier obs))` in probe invoke order.
pub fn sweep_completed_before<'a>(done: &'a [Obs], probes: &'a [Obs]) -> Vec<(&'a Obs, Option<&'a Obs>)> {
    let mut by_complete: Vec<&Obs> = done.iter().collect();
    by_complete.sort_by_key(|o| o.complete_ns);
    let mut by_invoke: Vec<&Obs> = probes.iter().collect();
    by_invoke.sort_by_key(|o| o.invoke_ns);
    let mut best: Option<&Obs> = None;
    let mut next = 0;
    let mut out = Vec::with_capacity(by_invoke.len());
    for probe in by_invoke {
        while next < by_complete.len() && by_complete[next].complete_ns < probe.invoke_ns {
            let cand = by_complete[next];
            if best.is_none_or(|b| cand.value > b.value) {
                best = Some(cand);
            }
            next += 1;
        }
        out.push((probe, best));
    }
    out
}

/// Every finding over one subject's ok values: zeros, then orderings in invoke order, then
/// repeats in value order.
pub fn check_subject(obs: &[Obs]) -> Vec<Finding> {
    let mut out: Vec<Finding> = obs.iter().filter(|o| o.value == 0).map(|o| Finding::Zero(*o)).collect();
    for (later, earlier) in sweep_completed_before(obs, obs) {
        if let Some(earlier) = earlier
            && earlier.value >= later.value
        {
            out.push(Finding::NotAbove {
                earlier: *earlier,
                later: *later,
            });
        }
    }
    let mut by_value: Vec<&Obs> = obs.iter().collect();
    by_value.sort_by_key(|o| (o.value, o.call));
    for w in by_value.windows(2) {
        if w[0].value == w[1].value {
            out.push(Finding::Twice {
                first: *w[0],
                second: *w[1],
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(call: u64, invoke_ns: u64, complete_ns: u64, value: u64) -> Obs {
        Obs {
            call,
            invoke_ns,
            complete_ns,
            value,
        }
    }

    #[test]
    fn each_rule_is_found_and_overlapping_calls_may_return_in_any_order() {
        assert!(check_subject(&[o(1, 0, 100, 9), o(2, 50, 60, 8), o(3, 10, 200, 3)]).is_empty());
        assert!(
            check_subject(&[o(1, 0, 10, 9), o(2, 10, 20, 3)]).is_empty(),
            "equal times overlap"
        );
        assert_eq!(check_subject(&[o(1, 0, 10, 0)]), vec![Finding::Zero(o(1, 0, 10, 0))]);
        assert_eq!(
            check_subject(&[o(1, 0, 10, 7), o(2, 11, 20, 3)]),
            vec![Finding::NotAbove {
                earlier: o(1, 0, 10, 7),
                later: o(2, 11, 20, 3)
            }]
        );
        assert_eq!(
            check_subject(&[o(1, 0, 100, 9), o(2, 50, 60, 9)]),
            vec![Finding::Twice {
                first: o(1, 0, 100, 9),
                second: o(2, 50, 60, 9)
            }]
        );
    }

    #[test]
    fn the_earlier_value_is_the_largest_of_all_completed_calls() {
        let found = check_subject(&[o(1, 0, 10, 50), o(2, 20, 30, 60), o(3, 5, 100, 10), o(4, 40, 50, 55)]);
        assert_eq!(
            found,
            vec![Finding::NotAbove {
                earlier: o(2, 20, 30, 60),
                later: o(4, 40, 50, 55)
            }]
        );
    }
}
