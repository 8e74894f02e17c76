//! The client's copy of the cluster map: which set serves which sections, the AllocSvr addresses
//! of every set, and the moves in flight.
//!
//! The map is learned from data-plane replies (a server adds it when the caller's version, sent in
//! the `seqsvr-map-version` header, is older than its own) and replaced only by a newer version.
//! It is used for two things:
//! - **routing**: which set to ask for a uid that no route table names an owner for, and how to
//!   reach a set the client has no seed in (the map lists each set's AllocSvrs);
//! - **the answer check**: a number is accepted only from a set the map allows to answer for the
//!   uid's section — the set it maps the section to, or either side of a move of that section that
//!   has not ended (from the install to the switch the target serves while the map still names the
//!   source; the sets' own range states decide which of the two may serve at any moment).
//!
//! Deliberately left out: anything of the map's move records beyond their range and sets (their
//! progress does not change the map's version, so a cached copy may show an older phase).

use std::collections::BTreeMap;

use seqsvr_proto::keys::KeyPlacement;
use seqsvr_proto::{SectionId, pb};

/// A validated copy of the cluster map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapView {
    version: u64,
    section_size: u64,
    uid_limit: u64,
    /// `(begin, end, set)`, sorted by `begin`, not overlapping.
    ranges: Vec<(u64, u64, u64)>,
    /// AllocSvr data-plane addresses by set.
    allocsvrs: BTreeMap<u64, Vec<String>>,
    /// Moves not done or cancelled: `(begin, end, from, to)`.
    moving: Vec<(u64, u64, u64, u64)>,
    /// How keys are placed, from the map's id setup (`None`: it carries none).
    key_placement: Option<KeyPlacement>,
}

impl MapView {
    /// The view of `map`, or why it cannot be used.
    pub fn new(map: &pb::ClusterMap) -> Result<Self, String> {
        if map.version == 0 || map.section_size == 0 || map.uid_limit == 0 {
            return Err(format!(
                "map version {} with section size {} and uid limit {}",
                map.version, map.section_size, map.uid_limit
            ));
        }
        let mut ranges: Vec<(u64, u64, u64)> = map
            .ranges
            .iter()
            .map(|r| (r.section_begin, r.section_end, r.set_id))
            .collect();
        ranges.sort_unstable();
        if ranges.iter().any(|r| r.0 >= r.1) || ranges.windows(2).any(|w| w[0].1 > w[1].0) {
            return Err(format!("map version {}: empty or overlapping ranges", map.version));
        }
        let running = |m: &&pb::MoveInfo| {
            !matches!(
                pb::MovePhase::try_from(m.phase),
                Ok(pb::MovePhase::Done | pb::MovePhase::Cancelled)
            )
        };
        let moving = map
            .moves
            .iter()
            .filter(running)
            .filter_map(|m| m.sections.map(|s| (s.begin, s.end, m.from_set, m.to_set)))
            .collect();
        Ok(Self {
            version: map.version,
            section_size: map.section_size,
            uid_limit: map.uid_limit,
            ranges,
            allocsvrs: map.sets.iter().map(|s| (s.set_id, s.allocsvrs.clone())).collect(),
            moving,
            key_placement: KeyPlacement::of_map(map),
        })
    }

    /// How the cluster places counter keys, when the map's id setup says.
    pub fn key_placement(&self) -> Option<KeyPlacement> {
        self.key_placement
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn section_size(&self) -> u64 {
        self.section_size
    }

    pub fn uid_limit(&self) -> u64 {
        self.uid_limit
    }

    /// The set the map gives `section` to.
    pub fn set_of(&self, section: SectionId) -> Option<u64> {
        let i = self.ranges.partition_point(|r| r.0 <= section.0).checked_sub(1)?;
        let (_, end, set) = self.ranges[i];
        (section.0 < end).then_some(set)
    }

    /// Whether an answer for `section` from a node of set `set` is one the map allows: the set
    /// serves it, or is either side of a move of it that has not ended.
    pub fn may_answer(&self, section: SectionId, set: u64) -> bool {
        self.set_of(section) == Some(set)
            || self
                .moving
                .iter()
                .any(|&(b, e, from, to)| (b..e).contains(&section.0) && (from == set || to == set))
    }

    /// The AllocSvr addresses the map lists for `set` (empty when it lists none).
    pub fn allocsvrs(&self, set: u64) -> &[String] {
        self.allocsvrs.get(&set).map_or(&[], Vec::as_slice)
    }

    /// Every AllocSvr address the map lists.
    pub fn all_allocsvrs(&self) -> impl Iterator<Item = &str> {
        self.allocsvrs.values().flatten().map(String::as_str)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Sections [0, 10): [0, 4) set 0, [4, 10) set 1; a move of [2, 4) from 0 to 2 in `phase`.
    pub(crate) fn map(version: u64, phase: pb::MovePhase) -> pb::ClusterMap {
        let set = |set_id, addr: &str| pb::SetInfo {
            set_id,
            stores: vec![],
            allocsvrs: vec![addr.into()],
        };
        let range = |section_begin, section_end, set_id| pb::MapRange {
            section_begin,
            section_end,
            set_id,
        };
        pb::ClusterMap {
            version,
            sets: vec![set(0, "a:1"), set(1, "b:1"), set(2, "c:1")],
            ranges: vec![range(4, 10, 1), range(0, 4, 0)],
            moves: vec![pb::MoveInfo {
                op: 1,
                from_set: 0,
                to_set: 2,
                sections: Some(pb::SectionRange { begin: 2, end: 4 }),
                phase: phase as i32,
                ..Default::default()
            }],
            section_size: 10,
            uid_limit: 100,
            ids: None,
        }
    }

    #[test]
    fn sections_map_to_sets_and_moves_in_flight_let_both_sides_answer() {
        let v = MapView::new(&map(3, pb::MovePhase::Installed)).unwrap();
        let set = |s| v.set_of(SectionId(s));
        assert_eq!(
            (set(0), set(3), set(4), set(9), set(10)),
            (Some(0), Some(0), Some(1), Some(1), None)
        );
        let may = |s, set| v.may_answer(SectionId(s), set);
        assert!(may(3, 0) && may(3, 2), "a move in flight: source and target");
        assert!(!may(1, 2), "outside the move: only the mapped set");
        assert!(!may(5, 0) && may(5, 1));
        assert_eq!(v.allocsvrs(2), ["c:1".to_string()]);
        assert!(v.allocsvrs(7).is_empty());
        let done = MapView::new(&map(4, pb::MovePhase::Done)).unwrap();
        assert!(
            !done.may_answer(SectionId(3), 2),
            "an ended move lets nobody else answer"
        );
    }

    #[test]
    fn unusable_maps_are_refused() {
        let mut zero = map(0, pb::MovePhase::Done);
        assert!(MapView::new(&zero).is_err(), "version 0");
        zero.version = 1;
        zero.ranges.push(pb::MapRange {
            section_begin: 3,
            section_end: 5,
            set_id: 2,
        });
        assert!(MapView::new(&zero).is_err(), "overlap");
    }
}
