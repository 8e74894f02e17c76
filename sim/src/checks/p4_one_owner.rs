//! P4 one owner, as clients can see it: per section,
//! - once a reply from epoch `e` was received, no reply from an epoch `< e` may come from a call
//!   invoked after that (a stale owner answered after a newer one had served);
//! - one epoch of a section belongs to one (node, incarnation): two owners answering under the
//!   same epoch means the fence is broken.
//!
//! Epochs count per set (a set that takes a range over starts its own), so both rules hold per
//! (set, section); whether two sets served a section at once is [`super::one_set`]'s question.
//! A restored set's epochs start 2^32 above its backup's (`storesvr::domain::restore`), above any
//! the lost set granted after the backup, so both rules hold across a restore too.
//!
//! Sweep per section over replies sorted by complete and by invoke with a running maximum epoch,
//! O(n log n). Calls without owner tags (failed, unknown, or a client that does not report them)
//! are not judged.

use super::{Promise, Violation};
use crate::history::Call;
use std::collections::{BTreeMap, HashMap};

#[derive(Clone, Copy)]
struct Reply {
    call: u64,
    invoke_ns: u64,
    complete_ns: u64,
    epoch: u64,
    owner: (u64, u64),
}

pub fn check(calls: &[Call]) -> Vec<Violation> {
    let mut by_section: BTreeMap<(u64, u64), Vec<Reply>> = BTreeMap::new();
    for c in calls.iter().filter(|c| c.outcome == crate::history::Outcome::Ok) {
        for o in &c.owners {
            by_section.entry((o.set_id, o.section)).or_default().push(Reply {
                call: c.id,
                invoke_ns: c.invoke_ns,
                complete_ns: c.complete_ns,
                epoch: o.epoch,
                owner: (o.node_id, o.incarnation),
            });
        }
    }
    let mut out = Vec::new();
    for ((set, section), replies) in &by_section {
        let name = if *set == 0 {
            format!("section {section}")
        } else {
            format!("set {set} section {section}")
        };
        check_section(&name, replies, &mut out);
    }
    out
}

fn check_section(section: &str, replies: &[Reply], out: &mut Vec<Violation>) {
    let mut owner_of_epoch: HashMap<u64, &Reply> = HashMap::new();
    for r in replies {
        let first = *owner_of_epoch.entry(r.epoch).or_insert(r);
        if first.owner != r.owner {
            out.push(Violation::new(
                Promise::P4,
                format!(
                    "{section}: epoch {} answered by node {} incarnation {} and by node {} incarnation {}",
                    r.epoch, first.owner.0, first.owner.1, r.owner.0, r.owner.1
                ),
                vec![first.call, r.call],
            ));
        }
    }
    let mut by_complete: Vec<&Reply> = replies.iter().collect();
    by_complete.sort_by_key(|r| r.complete_ns);
    let mut by_invoke: Vec<&Reply> = replies.iter().collect();
    by_invoke.sort_by_key(|r| r.invoke_ns);
    let mut newest: Option<&Reply> = None;
    let mut next = 0;
    for probe in by_invoke {
        while next < by_complete.len() && by_complete[next].complete_ns < probe.invoke_ns {
            let cand = by_complete[next];
            if newest.is_none_or(|n| cand.epoch > n.epoch) {
                newest = Some(cand);
            }
            next += 1;
        }
        if let Some(n) = newest
            && n.epoch > probe.epoch
        {
            out.push(Violation::new(
                Promise::P4,
                format!(
                    "{section}: epoch {} (node {} incarnation {}) answered after epoch {} had answered (call {})",
                    probe.epoch, probe.owner.0, probe.owner.1, n.epoch, n.call
                ),
                vec![n.call, probe.call],
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checks::test_util::*;

    #[test]
    fn table() {
        let cases: Vec<Case> = vec![
            (
                "handover to a newer epoch",
                vec![
                    owned(fetch(1, 5, 0, 10, 1), 0, 1, 11, 1),
                    owned(fetch(2, 5, 20, 30, 900), 0, 2, 22, 2),
                ],
                vec![],
            ),
            (
                "planted stale owner after newer served",
                vec![
                    owned(fetch(1, 5, 0, 10, 1), 0, 1, 11, 1),
                    owned(fetch(2, 5, 20, 30, 900), 0, 2, 22, 2),
                    owned(fetch(3, 6, 31, 40, 2), 0, 1, 11, 1),
                ],
                vec![vec![2, 3]],
            ),
            (
                "overlapping old and new replies are not ordered",
                vec![
                    owned(fetch(1, 5, 0, 100, 1), 0, 1, 11, 1),
                    owned(fetch(2, 6, 20, 30, 900), 0, 2, 22, 2),
                ],
                vec![],
            ),
            (
                "old reply invoked before new completed is fine even if it completes later",
                vec![
                    owned(fetch(2, 6, 20, 30, 900), 0, 2, 22, 2),
                    owned(fetch(1, 5, 25, 100, 1), 0, 1, 11, 1),
                ],
                vec![],
            ),
            (
                "planted two owners in one epoch",
                vec![
                    owned(fetch(1, 5, 0, 10, 1), 0, 1, 11, 3),
                    owned(fetch(2, 6, 0, 10, 1), 0, 2, 22, 3),
                ],
                vec![vec![1, 2]],
            ),
            (
                "sections are independent",
                vec![
                    owned(fetch(1, 5, 0, 10, 1), 0, 2, 22, 2),
                    owned(fetch(2, 15, 20, 30, 1), 1, 1, 11, 1),
                ],
                vec![],
            ),
            (
                "epochs of different sets are not compared",
                vec![
                    owned(fetch(1, 5, 0, 10, 1), 0, 1, 11, 7),
                    in_set(owned(fetch(2, 5, 20, 30, 900), 0, 4, 44, 1), 1),
                ],
                vec![],
            ),
            (
                "unknown calls carry no owner",
                vec![
                    owned(fetch(1, 5, 0, 10, 1), 0, 2, 22, 2),
                    owned(unknown(2, 5, 20, 30), 0, 1, 11, 1),
                ],
                vec![],
            ),
        ];
        for (name, calls, want) in cases {
            assert_eq!(ids(&check(&calls)), want, "{name}");
        }
    }
}
