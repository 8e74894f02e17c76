//! Where a ledger key lives: its section (the counter placement of `seqsvr_proto::keys`) and the
//! set the cluster map gives that section to, with that set's StoreSvr addresses. Pure: handed the
//! map, returns the place.
//!
//! Left out: the map's moves. During a move the map still names the source until the switch; the
//! source refuses a frozen section as "not served by this set now" and the caller asks again with
//! a newer map (`service`).

use seqsvr_proto::keys::KeyPlacement;
use seqsvr_proto::{SectionId, pb};

/// Where one key's ledger is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    pub section: SectionId,
    pub set_id: u64,
    /// The set's StoreSvrs, `host:port`; empty when the map lists none (the caller falls back to
    /// the StoreSvrs it was configured with, for its own set).
    pub stores: Vec<String>,
}

/// The place of `key` under `placement` in a uid space of `uid_limit` uids cut in sections of
/// `section_size`, by `map` — or, without a map (none heard yet) or without a range for the
/// section, in `own_set`, where this node's own StoreSvrs keep it if it is kept anywhere they know.
pub fn place(
    key: &str,
    placement: KeyPlacement,
    (uid_limit, section_size): (u64, u64),
    map: Option<&pb::ClusterMap>,
    own_set: u64,
) -> Place {
    let section = placement.position(key, uid_limit).section(section_size);
    let set_id = map
        .and_then(|m| {
            m.ranges
                .iter()
                .find(|r| (r.section_begin..r.section_end).contains(&section.0))
                .map(|r| r.set_id)
        })
        .unwrap_or(own_set);
    let stores = map
        .and_then(|m| m.sets.iter().find(|s| s.set_id == set_id))
        .map(|s| s.stores.clone())
        .unwrap_or_default();
    Place {
        section,
        set_id,
        stores,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> pb::ClusterMap {
        let set = |id: u64, stores: &[&str]| pb::SetInfo {
            set_id: id,
            stores: stores.iter().map(|s| s.to_string()).collect(),
            allocsvrs: vec![],
        };
        let range = |b, e, set_id| pb::MapRange {
            section_begin: b,
            section_end: e,
            set_id,
        };
        pb::ClusterMap {
            version: 3,
            sets: vec![set(0, &["a:1", "a:2"]), set(1, &["b:1"])],
            ranges: vec![range(0, 2, 0), range(2, 4, 1)],
            section_size: 25,
            uid_limit: 100,
            ..Default::default()
        }
    }

    /// A key whose position falls in the wanted section (searching a few names).
    fn key_in(section: u64) -> String {
        (0..10_000)
            .map(|i| format!("inv-{i}"))
            .find(|k| KeyPlacement::Sha256.position(k, 100).section(25).0 == section)
            .expect("some name lands there")
    }

    #[test]
    fn a_key_goes_to_the_set_the_map_gives_its_section() {
        let m = map();
        for (section, set, stores) in [
            (0, 0, vec!["a:1", "a:2"]),
            (1, 0, vec!["a:1", "a:2"]),
            (3, 1, vec!["b:1"]),
        ] {
            let key = key_in(section);
            let p = place(&key, KeyPlacement::Sha256, (100, 25), Some(&m), 7);
            assert_eq!(p.section, SectionId(section), "{key}");
            assert_eq!(p.set_id, set, "{key}");
            assert_eq!(p.stores, stores, "{key}");
        }
    }

    #[test]
    fn without_a_map_or_a_range_the_key_stays_in_the_own_set() {
        let key = key_in(3);
        let p = place(&key, KeyPlacement::Sha256, (100, 25), None, 7);
        assert_eq!((p.set_id, p.stores.len()), (7, 0));
        let mut m = map();
        m.ranges.pop();
        let p = place(&key, KeyPlacement::Sha256, (100, 25), Some(&m), 7);
        assert_eq!((p.set_id, p.stores.len()), (7, 0));
    }

    #[test]
    fn slot_placement_places_by_hash_slot() {
        // "{user}.a" and "{user}.b" share a hash slot, so a section and a set.
        let m = map();
        let a = place("{user}.a", KeyPlacement::Slots, (100, 25), Some(&m), 0);
        let b = place("{user}.b", KeyPlacement::Slots, (100, 25), Some(&m), 0);
        assert_eq!(a, b);
    }
}
