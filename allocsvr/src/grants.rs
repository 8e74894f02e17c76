//! What a confirming renewal changes, decided without IO: the diff of the sections this node holds
//! against the grants and handover requests of a Renew reply.
//!
//! - A held section no longer granted, or granted under another epoch, is dropped (and in the
//!   second case taken again, fresh, under the new epoch: memory never crosses epochs).
//! - A section granted and not held (under that epoch) is gained.
//! - A section the store asks to hand over is neither kept nor gained; if it is still granted, it
//!   is released under the granted epoch. Only a granted section can be released: the arbiter's
//!   handover list may be older than the grants. Releasing it is safe even when this node never
//!   took it: once the diff is applied no slot of this node serves it under that epoch.
//! - A section once handed over is never gained again under the epoch it was released under, even
//!   when a later renewal still grants it and no longer asks for the handover (the arbiter's plan
//!   changed): it is released again instead, until the grant is gone. A Release that was sent
//!   may still land (a retry, a slow network); if this node served the same (section, epoch)
//!   again, that Release would free the section for a next owner while this node still serves it.
//!   The simulator found exactly that (seed 69646 of `sim dst`).
//!
//! Deliberately left out: building slots, the lease wait and sending anything (see `shared` and
//! `tasks::renew`); grants outside the uid space are ignored and reported, never trusted.

use std::collections::BTreeMap;
use std::ops::Range;
use std::time::Duration;

use seqsvr_proto::pb;
use seqsvr_proto::{Epoch, SectionId};

/// A section to take under an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gain {
    pub id: SectionId,
    pub epoch: Epoch,
    /// The previous owner released it (or there was none): no lease wait.
    pub no_wait: bool,
    /// What the store leader says is left of earlier owners' leases (`Grant.wait_ms`); `None`:
    /// the whole wait.
    pub wait: Option<Duration>,
}

/// The changes one renewal asks for.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct GrantDiff {
    /// Held sections to stop serving.
    pub drop: Vec<SectionId>,
    /// Sections to take (a held one under an older epoch is replaced).
    pub gain: Vec<Gain>,
    /// Handed-over sections to release, with the epoch they are granted under.
    pub release: Vec<(SectionId, Epoch)>,
    /// Grants that reach outside the uid space (ignored beyond its bounds).
    pub outside: Vec<pb::Grant>,
}

impl GrantDiff {
    pub fn changes_anything(&self) -> bool {
        !(self.drop.is_empty() && self.gain.is_empty())
    }
}

/// The (section, epoch) pairs one incarnation has released on a handover and must never serve
/// again, with whether its wait had passed when it let go (a repeated Release says the same).
#[derive(Debug, Default)]
pub struct HandedOver(BTreeMap<SectionId, (Epoch, bool)>);

impl HandedOver {
    pub fn contains(&self, id: SectionId, epoch: Epoch) -> bool {
        self.0.get(&id).is_some_and(|(e, _)| *e == epoch)
    }

    /// Whether the wait had passed when (`id`, `epoch`) was first handed over.
    pub fn waited(&self, id: SectionId, epoch: Epoch) -> Option<bool> {
        self.0.get(&id).filter(|(e, _)| *e == epoch).map(|(_, w)| *w)
    }

    /// Keeps exactly the releases of the latest diff: every handed-over pair still granted is in
    /// it again, and a pair no longer granted can never be granted again under the same epoch (a
    /// new grant of a section always carries a new epoch), so it need not be remembered.
    pub fn replace(&mut self, released: &[(SectionId, Epoch, bool)]) {
        self.0 = released
            .iter()
            .map(|&(id, epoch, waited)| (id, (epoch, waited)))
            .collect();
    }

    pub fn clear(&mut self) {
        self.0.clear();
    }
}

/// Diffs `held` (the epoch of the slot held for each section of `sections`, by position) against a
/// renewal's `grants` and `handover` ranges; `handed` are the pairs already handed over, released
/// again while still granted.
pub fn diff(
    sections: Range<u64>,
    held: &[Option<Epoch>],
    grants: &[pb::Grant],
    handover: &[pb::SectionRange],
    handed: &HandedOver,
) -> GrantDiff {
    debug_assert_eq!(held.len() as u64, sections.end - sections.start);
    let first = sections.start;
    let mut out = GrantDiff::default();
    let mut wanted: Vec<Option<(Epoch, bool, Option<Duration>)>> = vec![None; held.len()];
    for g in grants {
        let (begin, end) = (g.section_begin.max(first), g.section_end.min(sections.end));
        if begin != g.section_begin || end != g.section_end {
            out.outside.push(*g);
        }
        for s in begin..end {
            let wait = g.wait_ms.map(|ms| Duration::from_millis(u64::from(ms)));
            wanted[(s - first) as usize] = Some((Epoch(g.epoch), g.no_wait, wait));
        }
    }
    for h in handover {
        for s in h.begin.max(first)..h.end.min(sections.end) {
            if let Some((epoch, _, _)) = wanted[(s - first) as usize].take() {
                out.release.push((SectionId(s), epoch));
            }
        }
    }
    for (i, want) in wanted.iter_mut().enumerate() {
        let id = SectionId(first + i as u64);
        if let Some((epoch, _, _)) = *want
            && handed.contains(id, epoch)
        {
            *want = None;
            out.release.push((id, epoch));
        }
    }
    out.release.sort_unstable();
    out.release.dedup();
    for (i, (held, want)) in held.iter().zip(wanted).enumerate() {
        let id = SectionId(first + i as u64);
        match (held, want) {
            (Some(epoch), Some((want, _, _))) if *epoch == want => {}
            (None, None) => {}
            (Some(_), None) => out.drop.push(id),
            (_, Some((epoch, no_wait, wait))) => out.gain.push(Gain {
                id,
                epoch,
                no_wait,
                wait,
            }),
        }
    }
    out
}

/// Compresses section ids (any order) into sorted half-open ranges.
pub fn ranges(ids: impl Iterator<Item = SectionId>) -> Vec<pb::SectionRange> {
    let mut ids: Vec<u64> = ids.map(|s| s.0).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut out: Vec<pb::SectionRange> = Vec::new();
    for id in ids {
        match out.last_mut() {
            Some(r) if r.end == id => r.end += 1,
            _ => out.push(pb::SectionRange { begin: id, end: id + 1 }),
        }
    }
    out
}

/// What a Release names: `(section, epoch, waited)` triples in runs of consecutive sections under
/// the same epoch and wait state (the store releases a section only while it is still granted
/// under that epoch, and lets the next owner skip its wait only when this one had waited).
pub fn released(mut held: Vec<(SectionId, Epoch, bool)>) -> Vec<pb::ReleasedRange> {
    held.sort_unstable();
    held.dedup();
    let mut out: Vec<pb::ReleasedRange> = Vec::new();
    for (SectionId(id), Epoch(epoch), waited) in held {
        match out.last_mut() {
            Some(r) if r.end == id && r.epoch == epoch && r.waited == waited => r.end += 1,
            _ => out.push(pb::ReleasedRange {
                begin: id,
                end: id + 1,
                epoch,
                waited,
            }),
        }
    }
    out
}

/// Most ranges in one Release: each encodes in at most 37 bytes, so a request stays near 2 MiB,
/// under both the store's message limit and the Raft entry byte cap (sections held under many
/// different epochs make many ranges).
pub const RELEASE_CHUNK_RANGES: usize = 65_536;

/// The Releases that give `ranges` up, in chunks; `leaving` is set on the last one only, so the
/// incarnation is forgotten after everything it names was released.
pub fn release_requests(incarnation: u64, ranges: Vec<pb::ReleasedRange>, leaving: bool) -> Vec<pb::ReleaseRequest> {
    let mut out: Vec<pb::ReleaseRequest> = ranges
        .chunks(RELEASE_CHUNK_RANGES)
        .map(|c| pb::ReleaseRequest {
            secret: Vec::new(),
            incarnation,
            sections: c.to_vec(),
            leaving: false,
        })
        .collect();
    if leaving {
        match out.last_mut() {
            Some(last) => last.leaving = true,
            None => out.push(pb::ReleaseRequest {
                secret: Vec::new(),
                incarnation,
                sections: vec![],
                leaving: true,
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(begin: u64, end: u64, epoch: u64, no_wait: bool) -> pb::Grant {
        pb::Grant {
            section_begin: begin,
            section_end: end,
            epoch,
            no_wait,
            wait_ms: None,
        }
    }

    fn range(begin: u64, end: u64) -> pb::SectionRange {
        pb::SectionRange { begin, end }
    }

    fn gain(id: u64, epoch: u64, no_wait: bool) -> Gain {
        Gain {
            id: SectionId(id),
            epoch: Epoch(epoch),
            no_wait,
            wait: None,
        }
    }

    #[test]
    fn a_renewal_keeps_drops_gains_and_releases() {
        let e = |n| Some(Epoch(n));
        // Set of sections 10..16; held: 10@1, 11@1, 12@2, 13 none, 14@1, 15 none.
        let held = [e(1), e(1), e(2), None, e(1), None];
        type Case = (&'static str, Vec<pb::Grant>, Vec<pb::SectionRange>, GrantDiff);
        let cases: Vec<Case> = vec![
            (
                "same grants: nothing",
                vec![grant(10, 12, 1, false), grant(12, 13, 2, false), grant(14, 15, 1, true)],
                vec![],
                GrantDiff::default(),
            ),
            (
                "new epoch replaces, missing drops, new gains",
                vec![grant(10, 11, 1, false), grant(11, 12, 3, true), grant(15, 16, 4, false)],
                vec![],
                GrantDiff {
                    drop: vec![SectionId(12), SectionId(14)],
                    gain: vec![gain(11, 3, true), gain(15, 4, false)],
                    ..GrantDiff::default()
                },
            ),
            (
                "handover of held and not-yet-taken sections; an ungranted one is not released",
                vec![grant(10, 13, 1, false), grant(13, 14, 5, false)],
                vec![range(11, 14), range(15, 16)],
                GrantDiff {
                    drop: vec![SectionId(11), SectionId(12), SectionId(14)],
                    release: vec![
                        (SectionId(11), Epoch(1)),
                        (SectionId(12), Epoch(1)),
                        (SectionId(13), Epoch(5)),
                    ],
                    ..GrantDiff::default()
                },
            ),
            (
                "grants beyond the set are cut and reported",
                vec![grant(8, 11, 1, false), grant(15, 20, 2, false)],
                vec![],
                GrantDiff {
                    drop: vec![SectionId(11), SectionId(12), SectionId(14)],
                    gain: vec![gain(15, 2, false)],
                    outside: vec![grant(8, 11, 1, false), grant(15, 20, 2, false)],
                    ..GrantDiff::default()
                },
            ),
        ];
        for (what, grants, handover, expected) in cases {
            assert_eq!(
                diff(10..16, &held, &grants, &handover, &HandedOver::default()),
                expected,
                "{what}"
            );
        }
    }

    #[test]
    fn overlapping_handover_ranges_release_a_section_once() {
        let d = diff(
            0..4,
            &[None; 4],
            &[grant(0, 4, 7, false)],
            &[range(0, 3), range(1, 4)],
            &HandedOver::default(),
        );
        assert_eq!(d.release.len(), 4);
        assert!(d.gain.is_empty());
    }

    #[test]
    fn a_handed_over_section_is_released_again_never_regained_under_its_epoch() {
        // Section 1 was handed over under epoch 4. The next renewal still grants it under epoch 4
        // but no longer asks for the handover: it is released again, not gained.
        let mut handed = HandedOver::default();
        handed.replace(&[(SectionId(1), Epoch(4), true)]);
        let grants = [grant(0, 2, 4, false)];
        let d = diff(0..3, &[Some(Epoch(4)), None, None], &grants, &[], &handed);
        assert_eq!(
            d,
            GrantDiff {
                release: vec![(SectionId(1), Epoch(4))],
                ..GrantDiff::default()
            }
        );
        assert_eq!(handed.waited(SectionId(1), Epoch(4)), Some(true));
        // Asked again as well: released once.
        let d = diff(0..3, &[None; 3], &grants, &[range(1, 2)], &handed);
        assert_eq!(d.release, vec![(SectionId(1), Epoch(4))]);
        assert_eq!(d.gain, vec![gain(0, 4, false)]);
        // Granted under a new epoch (it was released and came back): gained.
        let d = diff(0..3, &[None; 3], &[grant(1, 2, 6, true)], &[], &handed);
        assert_eq!((d.gain, d.release), (vec![gain(1, 6, true)], vec![]));
        assert_eq!(handed.waited(SectionId(1), Epoch(6)), None);
    }

    #[test]
    fn releases_are_chunked_and_only_the_last_one_leaves() {
        let range = |i: u64| pb::ReleasedRange {
            begin: i,
            end: i + 1,
            epoch: i % 2,
            waited: true,
        };
        let many: Vec<pb::ReleasedRange> = (0..(RELEASE_CHUNK_RANGES as u64 * 2 + 1)).map(range).collect();
        let reqs = release_requests(7, many.clone(), true);
        assert_eq!(reqs.len(), 3);
        assert!(reqs.iter().all(|r| r.incarnation == 7));
        assert_eq!(reqs.iter().map(|r| r.leaving).collect::<Vec<_>>(), [false, false, true]);
        let all: Vec<pb::ReleasedRange> = reqs.iter().flat_map(|r| r.sections.clone()).collect();
        assert_eq!(all, many);
        let worst = pb::ReleaseRequest {
            secret: Vec::new(),
            incarnation: u64::MAX,
            sections: vec![
                pb::ReleasedRange {
                    begin: u64::MAX,
                    end: u64::MAX,
                    epoch: u64::MAX,
                    waited: true,
                };
                RELEASE_CHUNK_RANGES
            ],
            leaving: true,
        };
        assert!(prost::Message::encoded_len(&worst) < seqsvr_proto::limits::MAX_ENTRY_BYTES);
        // Nothing held: a leaving Release still goes out; not leaving, nothing does.
        let empty = release_requests(7, vec![], true);
        assert_eq!((empty.len(), empty[0].leaving, empty[0].sections.len()), (1, true, 0));
        assert!(release_requests(7, vec![], false).is_empty());
    }

    #[test]
    fn released_runs_split_at_epoch_and_wait_changes() {
        let held = [
            (3, 1, true),
            (1, 1, true),
            (2, 1, true),
            (4, 2, true),
            (2, 1, true),
            (5, 2, false),
        ];
        let got = released(held.iter().map(|&(s, e, w)| (SectionId(s), Epoch(e), w)).collect());
        let got: Vec<(u64, u64, u64, bool)> = got.iter().map(|r| (r.begin, r.end, r.epoch, r.waited)).collect();
        assert_eq!(got, vec![(1, 4, 1, true), (4, 5, 2, true), (5, 6, 2, false)]);
    }

    #[test]
    fn ranges_compress_sorted_runs() {
        type Case = (&'static [u64], &'static [(u64, u64)]);
        let cases: [Case; 4] = [
            (&[], &[]),
            (&[3], &[(3, 4)]),
            (&[5, 3, 4, 9, 10, 4], &[(3, 6), (9, 11)]),
            (&[0, 2, 4], &[(0, 1), (2, 3), (4, 5)]),
        ];
        for (ids, expected) in cases {
            let got: Vec<(u64, u64)> = ranges(ids.iter().map(|i| SectionId(*i)))
                .into_iter()
                .map(|r| (r.begin, r.end))
                .collect();
            assert_eq!(got, expected, "{ids:?}");
        }
    }
}
