//! P6 bounded waste: with no faults, a uid's consecutive ok seqs differ by exactly 1, and an owner
//! change skips at most what was reserved and not handed out.
//!
//! A gap between consecutive ok seqs `a < b` of a uid is *excused* when something that may skip
//! numbers happened between the two calls:
//! - the owners that answered differ (restart or ownership change: reserved-but-unused numbers
//!   are skipped by design), or an owner is not known;
//! - a fault window overlaps the span of the two calls;
//! - unknown or failed fetches of that uid, invoked before `b` completed, may have consumed the
//!   missing numbers (each accounts for one number per occurrence of the uid, counted greedily).
//!
//! Unexplained gaps are violations only in a fault-free run; in a run with faults they are a
//! statistic (the timing of a fault's effect on a server is not exactly known).
//!
//! The second half is checked the same way: a violation in a fault-free run, a statistic in a run
//! with faults. A new owner
//! starts every uid of a section at the ceiling it loads, so a gap across an owner change may be
//! as large as the section's reserve: above the highest number handed out in the section, an owner
//! reserves at most a step and a half (it bumps by a step when less than half a step is left) plus
//! the largest block a caller asked for, and each later owner that served nothing may have raised
//! the ceiling once more before it died. With `k` the epochs between the two owners (an epoch is
//! raised at every owner change, and at a few other steps, so `k` never undercounts) and `H` the
//! highest value the earlier owners handed out in the section (every value served under an
//! earlier epoch of the set; values whose owner is not known count when their call began before
//! the later one ended; plus one for each failed or unknown call there, which may have consumed
//! one), the later value is at most `H + k·reserve + 1`. Checked only where both owners are known and of one set (epochs of
//! different sets do not compare; a move carries the ceiling instead) and the run says its step.
//! Faults break the count: an owner whose lease lapsed (a cut, a pause) drops the section and
//! may gain the same grant back under the same epoch, loading and reserving anew, and the history
//! does not show it (`sim dst` seed 1181 with `--sets 2 --keys --blocks`: a uid's new owner
//! reloaded under epoch 2 and started it above the single reserve that epoch allows).

use super::{Promise, Violation};
use crate::history::{Call, FaultSpan, Outcome, OwnerTag};
use crate::keys::{label, section_of};
use serde::Serialize;
use std::collections::HashMap;

/// Gap statistics over a whole history.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GapStats {
    /// Pairs of consecutive ok seqs that differ by more than 1.
    pub gaps: usize,
    pub excused: usize,
    pub unexplained: usize,
    /// Largest difference between consecutive ok seqs.
    pub max_gap: u64,
    /// Gaps across an owner change held to the section's reserve (the second half of P6), and
    /// those beyond it (violations in a fault-free run).
    pub bounded: usize,
    pub beyond_reserve: usize,
}

#[derive(Clone, Copy)]
struct Seen {
    call: u64,
    invoke_ns: u64,
    complete_ns: u64,
    value: u64,
    owner: Option<(u64, u64)>,
    /// The set of the owner that answered, and the uid's section (known with a section size).
    set_id: Option<u64>,
    section: Option<u64>,
}

fn owner_for(owners: &[OwnerTag], section: Option<u64>) -> Option<&OwnerTag> {
    match section {
        Some(s) => owners.iter().find(|o| o.section == s),
        None if owners.len() == 1 => owners.first(),
        None => None,
    }
}

/// Without sections: a batch reply's owners are matched to a uid only when there is one, and the
/// reserve is not checked.
pub fn check(calls: &[Call], faults: &[FaultSpan], fault_free: bool) -> (Vec<Violation>, GapStats) {
    check_with_sections(calls, faults, fault_free, Layout::default())
}

/// What the run says of its sections: `section_size` (0 = unknown), `uid_limit` (where keys are
/// placed) and `step` (0 = unknown: the reserve is not checked).
#[derive(Clone, Copy, Debug, Default)]
pub struct Layout {
    pub section_size: u64,
    pub uid_limit: u64,
    pub step: u64,
    pub key_placement: seqsvr_proto::keys::KeyPlacement,
}

/// A value handed out: the value, the invoke time of its call, its owner's set and epoch if known.
type Handed = (u64, u64, Option<(u64, u64)>);

/// Per section, what bounds a new owner's start: every ok value handed out there (value, the
/// invoke time of its call, the set and epoch of its owner when known), the invoke times of failed
/// or unknown fetches there, and the largest block a caller asked for.
#[derive(Default)]
struct SectionLog {
    values: Vec<Handed>,
    doubts: Vec<u64>,
    max_block: u64,
}

impl SectionLog {
    /// The highest value the owners before epoch `epoch` of set `set` can have handed out: every
    /// value served under an earlier epoch of that set, and (as their owner does not compare) every
    /// other value whose call was invoked before `until`; plus one per doubtful call invoked
    /// before `until`.
    fn high_before(&self, set: u64, epoch: u64, until: u64) -> u64 {
        let earlier = |&&(_, t, o): &&Handed| match o {
            Some((s, e)) if s == set => e < epoch,
            _ => t < until,
        };
        let high = self.values.iter().filter(earlier).map(|v| v.0).max().unwrap_or(0);
        high + self.doubts.iter().filter(|&&t| t < until).count() as u64
    }
}

fn section_logs(calls: &[Call], layout: Layout) -> HashMap<u64, SectionLog> {
    let mut logs: HashMap<u64, SectionLog> = HashMap::new();
    if layout.section_size == 0 || layout.step == 0 {
        return logs;
    }
    for c in calls.iter().filter(|c| c.is_fetch()) {
        let block = match c.kind {
            crate::history::CallKind::Reserve => c.uids.len() as u64,
            _ => 0,
        };
        for (i, &uid) in c.uids.iter().enumerate() {
            let section = section_of(uid, layout.section_size, layout.uid_limit, layout.key_placement);
            let owner = owner_for(&c.owners, Some(section)).map(|o| (o.set_id, o.epoch));
            let log = logs.entry(section).or_default();
            log.max_block = log.max_block.max(block);
            match (c.outcome, c.values.get(i)) {
                (Outcome::Ok, Some(&v)) => log.values.push((v, c.invoke_ns, owner)),
                (Outcome::Ok, None) => {}
                _ => log.doubts.push(c.invoke_ns),
            }
        }
    }
    logs
}

/// Every ok value per uid (with who served it), and the invoke times of the calls per uid that
/// failed or whose outcome is unknown (each may have used up a number).
fn collect(calls: &[Call], layout: Layout) -> (HashMap<u64, Vec<Seen>>, HashMap<u64, Vec<u64>>) {
    let mut seen: HashMap<u64, Vec<Seen>> = HashMap::new();
    let mut doubtful: HashMap<u64, Vec<u64>> = HashMap::new();
    for c in calls.iter().filter(|c| c.is_fetch()) {
        match c.outcome {
            Outcome::Ok => {
                for (uid, value) in c.ok_values() {
                    let (size, limit) = (layout.section_size, layout.uid_limit);
                    let section = (size > 0).then(|| section_of(uid, size, limit, layout.key_placement));
                    let owner = owner_for(&c.owners, section);
                    seen.entry(uid).or_default().push(Seen {
                        call: c.id,
                        invoke_ns: c.invoke_ns,
                        complete_ns: c.complete_ns,
                        value,
                        owner: owner.map(|o| (o.incarnation, o.epoch)),
                        set_id: owner.map(|o| o.set_id),
                        section,
                    });
                }
            }
            Outcome::Failed | Outcome::Unknown => {
                for &uid in &c.uids {
                    doubtful.entry(uid).or_default().push(c.invoke_ns);
                }
            }
        }
    }
    (seen, doubtful)
}

/// The layout lets a batch reply's owners be matched to a uid or key, and a gap across an owner
/// change be held to the section's reserve.
pub fn check_with_sections(
    calls: &[Call],
    faults: &[FaultSpan],
    fault_free: bool,
    layout: Layout,
) -> (Vec<Violation>, GapStats) {
    let (mut seen, mut doubtful) = collect(calls, layout);
    let logs = section_logs(calls, layout);
    let mut stats = GapStats::default();
    let mut out = Vec::new();
    let mut uids: Vec<_> = seen.keys().copied().collect();
    uids.sort_unstable();
    for uid in uids {
        let list = seen.get_mut(&uid).expect("key from map");
        list.sort_by_key(|s| s.value);
        let mut doubts = doubtful.remove(&uid).unwrap_or_default();
        doubts.sort_unstable();
        let mut used = 0usize;
        for w in list.windows(2) {
            let (a, b) = (w[0], w[1]);
            let diff = b.value - a.value;
            stats.max_gap = stats.max_gap.max(diff);
            if diff <= 1 {
                continue;
            }
            stats.gaps += 1;
            let missing = (diff - 1) as usize;
            let owner_changed = a.owner.is_none() || a.owner != b.owner;
            if owner_changed && let Some(v) = beyond_reserve(uid, a, b, &logs, layout.step, &mut stats) {
                stats.beyond_reserve += 1;
                if fault_free {
                    out.push(v);
                }
            }
            let lo = a.invoke_ns.min(b.invoke_ns);
            let hi = a.complete_ns.max(b.complete_ns);
            let faulted = faults.iter().any(|f| f.start_ns <= hi && f.end_ns >= lo);
            let eligible = doubts.partition_point(|&t| t < b.complete_ns).saturating_sub(used);
            let by_doubt = eligible >= missing;
            if by_doubt {
                used += missing;
            }
            if owner_changed || faulted || by_doubt {
                stats.excused += 1;
                continue;
            }
            stats.unexplained += 1;
            if fault_free {
                out.push(Violation::new(
                    Promise::P6,
                    format!(
                        "{}: seq jumped from {} to {} under one owner with no fault",
                        label(uid),
                        a.value,
                        b.value
                    ),
                    vec![a.call, b.call],
                ));
            }
        }
    }
    (out, stats)
}

/// The second half of P6 for one gap `a → b` across an owner change (module docs): a violation
/// when `b` starts above what the section can have reserved.
fn beyond_reserve(
    uid: u64,
    a: Seen,
    b: Seen,
    logs: &HashMap<u64, SectionLog>,
    step: u64,
    stats: &mut GapStats,
) -> Option<Violation> {
    let ((_, epoch_a), (_, epoch_b)) = (a.owner?, b.owner?);
    let log = logs.get(&b.section?)?;
    let set = b.set_id?;
    if a.set_id? != set || epoch_b <= epoch_a {
        return None;
    }
    stats.bounded += 1;
    let reserve = step + step / 2 + log.max_block;
    let bound = log.high_before(set, epoch_b, b.complete_ns) + (epoch_b - epoch_a) * reserve + 1;
    (b.value > bound).then(|| {
        let what = format!(
            "{}: seq jumped from {} to {} across {} epochs, above the {bound} the section can have reserved",
            label(uid),
            a.value,
            b.value,
            epoch_b - epoch_a
        );
        Violation::new(Promise::P6, what, vec![a.call, b.call])
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checks::test_util::*;

    fn fault(start: u64, end: u64) -> FaultSpan {
        FaultSpan {
            id: 1,
            kind: "kill".into(),
            target: "x".into(),
            start_ns: start,
            end_ns: end,
        }
    }

    #[test]
    fn table() {
        let o = |c, e| owned(c, 0, 1, 11, e);
        // (name, calls, faults, fault_free, violations, stats (gaps, excused, unexplained, max_gap))
        #[allow(clippy::type_complexity)]
        let cases: Vec<(&str, Vec<Call>, Vec<FaultSpan>, bool, usize, (usize, usize, usize, u64))> = vec![
            (
                "dense",
                vec![o(fetch(1, 5, 0, 1, 1), 1), o(fetch(2, 5, 2, 3, 2), 1)],
                vec![],
                true,
                0,
                (0, 0, 0, 1),
            ),
            (
                "planted gap",
                vec![o(fetch(1, 5, 0, 1, 1), 1), o(fetch(2, 5, 2, 3, 3), 1)],
                vec![],
                true,
                1,
                (1, 0, 1, 2),
            ),
            (
                "gap is only a stat with faults elsewhere",
                vec![o(fetch(1, 5, 0, 1, 1), 1), o(fetch(2, 5, 2, 3, 3), 1)],
                vec![],
                false,
                0,
                (1, 0, 1, 2),
            ),
            (
                "owner change excuses",
                vec![o(fetch(1, 5, 0, 1, 1), 1), o(fetch(2, 5, 2, 3, 10_001), 2)],
                vec![],
                true,
                0,
                (1, 1, 0, 10_000),
            ),
            (
                "fault in between excuses",
                vec![o(fetch(1, 5, 0, 1, 1), 1), o(fetch(2, 5, 10, 11, 50), 1)],
                vec![fault(5, 6)],
                true,
                0,
                (1, 1, 0, 49),
            ),
            (
                "unknown fetch explains one missing number",
                vec![
                    o(fetch(1, 5, 0, 1, 1), 1),
                    unknown(2, 5, 2, 3),
                    o(fetch(3, 5, 4, 5, 3), 1),
                ],
                vec![],
                true,
                0,
                (1, 1, 0, 2),
            ),
            (
                "one unknown does not explain two missing numbers",
                vec![
                    o(fetch(1, 5, 0, 1, 1), 1),
                    unknown(2, 5, 2, 3),
                    o(fetch(3, 5, 4, 5, 4), 1),
                ],
                vec![],
                true,
                1,
                (1, 0, 1, 3),
            ),
            (
                "values are ordered by value, not time",
                vec![o(fetch(1, 5, 0, 10, 2), 1), o(fetch(2, 5, 1, 9, 1), 1)],
                vec![],
                true,
                0,
                (0, 0, 0, 1),
            ),
        ];
        for (name, calls, faults, fault_free, want_v, (g, e, u, m)) in cases {
            let (v, s) = check(&calls, &faults, fault_free);
            assert_eq!(v.len(), want_v, "{name}: {v:?}");
            assert_eq!(
                s,
                GapStats {
                    gaps: g,
                    excused: e,
                    unexplained: u,
                    max_gap: m,
                    bounded: 0,
                    beyond_reserve: 0,
                },
                "{name}"
            );
        }
    }

    /// Uids 5 and 6 share section 0 (sections of 100); the step is 10, so an owner reserves at
    /// most 15 above the highest number handed out in the section, plus the largest block.
    fn reserve_case(calls: &[Call]) -> (Vec<Violation>, GapStats) {
        let layout = Layout {
            section_size: 100,
            uid_limit: 1_000,
            step: 10,
            key_placement: Default::default(),
        };
        check_with_sections(calls, &[], true, layout)
    }

    #[test]
    fn a_new_owner_starts_within_the_reserve_of_the_section() {
        let o = |c, inc, e| owned(c, 0, 1, inc, e);
        // Uid 6 was served up to 40 by the old owner; uid 5 jumps from 3 to the ceiling above it.
        let within = vec![
            o(fetch(1, 5, 0, 1, 3), 7, 1),
            o(fetch(2, 6, 2, 3, 40), 7, 1),
            o(fetch(3, 5, 10, 11, 40 + 15 + 1), 8, 2),
        ];
        let (v, s) = reserve_case(&within);
        assert!(v.is_empty(), "{v:?}");
        assert_eq!(s.bounded, 1);

        // One more than the reserve: a new owner that skipped numbers nobody reserved.
        let mut beyond = within.clone();
        beyond[2] = o(fetch(3, 5, 10, 11, 40 + 15 + 2), 8, 2);
        let (v, s) = reserve_case(&beyond);
        assert_eq!((v.len(), s.beyond_reserve), (1, 1), "{v:?}");
        assert!(v[0].what.contains("above the 56"), "{}", v[0].what);
        // In a run with faults it is a statistic: a lapsed lease may have reloaded unseen.
        let layout = Layout {
            section_size: 100,
            uid_limit: 1_000,
            step: 10,
            key_placement: Default::default(),
        };
        let (v, s) = check_with_sections(&beyond, &[], false, layout);
        assert_eq!((v.len(), s.beyond_reserve), (0, 1), "{v:?}");

        // Each epoch between the two owners may have reserved once more (an owner that died
        // before serving), and an unknown fetch in the section may have consumed one number.
        let mut later = within.clone();
        later[2] = o(fetch(3, 5, 10, 11, 40 + 2 * 15 + 2), 8, 3);
        later.push(unknown(4, 6, 4, 5));
        assert!(reserve_case(&later).0.is_empty());

        // Owners of different sets do not compare epochs: not bounded, not a violation.
        let mut moved = beyond.clone();
        moved[2] = in_set(moved[2].clone(), 1);
        let (v, s) = reserve_case(&moved);
        assert!(v.is_empty() && s.bounded == 0, "{v:?}");
    }
}
