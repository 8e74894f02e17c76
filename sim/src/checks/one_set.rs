//! One set at a time: a section is served by one set, then (after a move) by the next, never by
//! two at once and never by a set it had already left. Replies name their set (`Owner.set_id`),
//! the history names every move the simulator drove ([`MoveSpan`]), and from those each section
//! has a sequence of *tenures*: set 0 from the start, then the target of each completed move, in
//! the order the moves ran (moves of one section never overlap: the map refuses that).
//!
//! Each ok reply must fit a tenure of its own set such that
//! - tenures never go back in real time: a reply invoked after another completed sits in the same
//!   tenure or a later one;
//! - the reply could have happened inside the tenure: it completed after the move that opened the
//!   tenure began, and was invoked before the move that closed it ended.
//!
//! Replies are taken in invoke order and each gets the earliest tenure that fits (the earliest
//! leaves the most room for the replies after it), so a history passes exactly when some
//! assignment exists. A target that serves before the source's owners are gone shows up as a
//! source reply invoked after a target reply completed: no later tenure of the source fits it.
//!
//! Moves the simulator cancelled change nothing and are ignored. Calls without owner tags are not
//! judged.

use super::{Promise, Violation};
use crate::history::{Call, MoveSpan, Outcome};
use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug)]
struct Tenure {
    set: u64,
    /// The move that opened it began here (0 for the first).
    from_ns: u64,
    /// The move that closed it ended here (`u64::MAX` for the last).
    until_ns: u64,
    /// The op that opened it (0 for the first).
    op: u64,
}

#[derive(Clone, Copy)]
struct Reply {
    call: u64,
    invoke_ns: u64,
    complete_ns: u64,
    set: u64,
}

/// The tenures of `section` under the completed moves, in order.
fn tenures(section: u64, moves: &[&MoveSpan]) -> Vec<Tenure> {
    let mut out = vec![Tenure {
        set: 0,
        from_ns: 0,
        until_ns: u64::MAX,
        op: 0,
    }];
    for m in moves
        .iter()
        .filter(|m| m.sections.0 <= section && section < m.sections.1)
    {
        if let Some(last) = out.last_mut() {
            last.until_ns = m.end_ns;
        }
        out.push(Tenure {
            set: m.to,
            from_ns: m.start_ns,
            until_ns: u64::MAX,
            op: m.op,
        });
    }
    out
}

pub fn check(calls: &[Call], moves: &[MoveSpan]) -> Vec<Violation> {
    let mut done: Vec<&MoveSpan> = moves.iter().filter(|m| m.done).collect();
    done.sort_by_key(|m| m.start_ns);
    let mut by_section: BTreeMap<u64, Vec<Reply>> = BTreeMap::new();
    for c in calls.iter().filter(|c| c.outcome == Outcome::Ok) {
        for o in &c.owners {
            by_section.entry(o.section).or_default().push(Reply {
                call: c.id,
                invoke_ns: c.invoke_ns,
                complete_ns: c.complete_ns,
                set: o.set_id,
            });
        }
    }
    let mut out = Vec::new();
    for (section, replies) in &by_section {
        check_section(*section, &tenures(*section, &done), replies, &mut out);
    }
    out
}

fn check_section(section: u64, tenures: &[Tenure], replies: &[Reply], out: &mut Vec<Violation>) {
    let mut by_invoke: Vec<&Reply> = replies.iter().collect();
    by_invoke.sort_by_key(|r| r.invoke_ns);
    // (complete_ns, tenure, call) of every reply placed so far, taken in complete order.
    let mut pending = std::collections::BinaryHeap::new();
    // The latest tenure among replies that completed before the current one was invoked.
    let mut floor: Option<(usize, u64)> = None;
    for r in by_invoke {
        while let Some(&std::cmp::Reverse((complete, tenure, call))) = pending.peek() {
            if complete >= r.invoke_ns {
                break;
            }
            pending.pop();
            if floor.is_none_or(|(t, _)| tenure > t) {
                floor = Some((tenure, call));
            }
        }
        let lowest = floor.map_or(0, |(t, _)| t);
        let fits = (lowest..tenures.len()).find(|&k| {
            let t = &tenures[k];
            t.set == r.set && r.complete_ns > t.from_ns && r.invoke_ns < t.until_ns
        });
        match fits {
            Some(k) => {
                pending.push(std::cmp::Reverse((r.complete_ns, k, r.call)));
            }
            None => out.push(misplaced(section, tenures, r, floor)),
        }
    }
}

/// The violation for a reply that fits no tenure, naming what it conflicts with.
fn misplaced(section: u64, tenures: &[Tenure], r: &Reply, floor: Option<(usize, u64)>) -> Violation {
    match floor {
        Some((k, call)) if tenures[k].set != r.set => Violation::new(
            Promise::OneSet,
            format!(
                "section {section}: set {} answered after set {} had answered (call {call}, tenure of move {}), and never held the section again",
                r.set, tenures[k].set, tenures[k].op
            ),
            vec![call, r.call],
        ),
        _ => {
            let holders: Vec<String> = tenures
                .iter()
                .map(|t| format!("set {} until {} ns", t.set, t.until_ns))
                .collect();
            Violation::new(
                Promise::OneSet,
                format!(
                    "section {section}: set {} answered (invoked {} ns, completed {} ns) outside every time it held the section ({})",
                    r.set,
                    r.invoke_ns,
                    r.complete_ns,
                    holders.join(", ")
                ),
                vec![r.call],
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checks::test_util::*;

    fn mv(op: u64, sections: (u64, u64), from: u64, to: u64, start: u64, end: u64) -> MoveSpan {
        MoveSpan {
            op,
            sections,
            from,
            to,
            start_ns: start,
            end_ns: end,
            done: true,
        }
    }

    /// An ok fetch of a uid in section 0 answered by `set`.
    fn served(id: u64, invoke: u64, complete: u64, set: u64) -> Call {
        in_set(owned(fetch(id, 5, invoke, complete, id), 0, 1, 1, 1), set)
    }

    #[test]
    fn table() {
        let cancelled = MoveSpan {
            done: false,
            ..mv(8, (0, 1), 0, 1, 50, 60)
        };
        type Row = (&'static str, Vec<Call>, Vec<MoveSpan>, Vec<Vec<u64>>);
        let cases: Vec<Row> = vec![
            (
                "one set, no moves",
                vec![served(1, 0, 10, 0), served(2, 20, 30, 0)],
                vec![],
                vec![],
            ),
            (
                "a move hands the section over",
                vec![served(1, 0, 10, 0), served(2, 120, 130, 1)],
                vec![mv(7, (0, 1), 0, 1, 50, 100)],
                vec![],
            ),
            (
                "the target may serve inside the move, before it ends",
                vec![served(1, 0, 10, 0), served(2, 60, 70, 1), served(3, 80, 90, 1)],
                vec![mv(7, (0, 1), 0, 1, 50, 100)],
                vec![],
            ),
            (
                "planted: the source answers after the target did",
                vec![served(1, 0, 10, 0), served(2, 60, 70, 1), served(3, 80, 90, 0)],
                vec![mv(7, (0, 1), 0, 1, 50, 100)],
                vec![vec![2, 3]],
            ),
            (
                "planted: the source answers after the move ended",
                vec![served(1, 0, 10, 0), served(3, 150, 160, 0)],
                vec![mv(7, (0, 1), 0, 1, 50, 100)],
                vec![vec![3]],
            ),
            (
                "planted: a set that never held the section answers",
                vec![served(1, 0, 10, 2)],
                vec![mv(7, (0, 1), 0, 1, 50, 100)],
                vec![vec![1]],
            ),
            (
                "there and back again",
                vec![served(1, 0, 10, 0), served(2, 120, 130, 1), served(3, 320, 330, 0)],
                vec![mv(7, (0, 1), 0, 1, 50, 100), mv(9, (0, 4), 1, 0, 200, 300)],
                vec![],
            ),
            (
                "overlapping replies of two sets are not ordered",
                vec![served(1, 40, 90, 0), served(2, 60, 70, 1)],
                vec![mv(7, (0, 1), 0, 1, 50, 100)],
                vec![],
            ),
            (
                "a cancelled move hands nothing over",
                vec![served(1, 0, 10, 0), served(2, 70, 80, 1)],
                vec![cancelled],
                vec![vec![1, 2]],
            ),
            (
                "a move of other sections changes nothing here",
                vec![served(1, 0, 10, 0), served(2, 120, 130, 0)],
                vec![mv(7, (1, 3), 0, 1, 50, 100)],
                vec![],
            ),
        ];
        for (name, calls, moves, want) in cases {
            assert_eq!(ids(&check(&calls, &moves)), want, "{name}");
        }
    }
}
