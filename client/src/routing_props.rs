//! The client's route cache against random route tables and cluster maps from servers (issue
//! "Security and hardening", bullet "Fuzzing"). A unit-test module because `RouteCache::offer`
//! and `target_addr` are crate-private.
//!
//! A random sequence of offers (tables of sets 0..3 and maps, each valid or not, with random
//! versions) goes to one `RouteCache`, and a model follows along. Properties after every offer:
//! - an offer is installed exactly when it is valid and newer than what its slot holds, and a
//!   refused one leaves the cached table or map as it was;
//! - the cached map answers `set_of` and `may_answer` as the model does for every section (its
//!   ranges were validated as non-empty and non-overlapping: an independent pairwise check here);
//! - `target_addr` never panics for any uid: below the limit it names an owner a table names,
//!   an AllocSvr the map lists, or the seed; at or above the limit it refuses.
//!
//! `PROPTEST_CASES` overrides the CI case count.

use proptest::prelude::*;
use seqsvr_proto::{Routes, SectionId, Uid, pb};

use crate::map::MapView;
use crate::routing::{RouteCache, Seeds, target_addr};

/// Cases per property in CI (docs/FUZZING.md).
const CI_CASES: u32 = 2000;
/// Sections the model checks (the generators stay below this).
const SECTIONS: u64 = 48;

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok());
    ProptestConfig::with_cases(cases.unwrap_or(CI_CASES))
}

#[derive(Debug, Clone)]
enum Offer {
    Table(pb::RouteTable),
    Map(pb::ClusterMap),
    Nothing,
}

fn sizes() -> impl Strategy<Value = (u64, u64)> {
    // Mostly the cluster's sizes (4 uids a section, 40 sections), sometimes another or a zero.
    prop_oneof![6 => Just((4u64, 160u64)), 1 => Just((0, 160)), 1 => Just((4, 0)), 1 => (1u64..6, 1u64..200)]
}

fn table() -> impl Strategy<Value = pb::RouteTable> {
    let entries = prop::collection::vec((1u64..12, 0u64..4, prop::bool::weighted(0.8)), 1..8);
    (0u64..4, 0u64..8, sizes(), entries, prop::bool::weighted(0.7)).prop_map(
        |(set_id, version, (ss, ul), es, cover)| {
            let total = if ss == 0 { 0 } else { ul.div_ceil(ss) };
            let mut at = 0;
            let mut entries: Vec<pb::RouteEntry> = es
                .into_iter()
                .map(|(len, set, owned)| {
                    let (begin, end) = (at, at + len);
                    at = end;
                    pb::RouteEntry {
                        set_id: set,
                        section_begin: begin,
                        section_end: end,
                        node_id: set + 1,
                        incarnation: 1,
                        addr: if owned { format!("alloc-{set}:1") } else { String::new() },
                    }
                })
                .collect();
            // Most tables are stretched to cover exactly the sections, so that many are valid.
            if cover && let Some(last) = entries.last_mut() {
                last.section_end = last.section_end.max(last.section_begin + 1).max(total);
            }
            pb::RouteTable {
                version,
                section_size: ss,
                uid_limit: ul,
                entries,
                set_id,
            }
        },
    )
}

fn map() -> impl Strategy<Value = pb::ClusterMap> {
    let ranges = prop::collection::vec((0u64..SECTIONS, 0u64..12, 0u64..4), 0..6);
    let moves = prop::collection::vec((0u64..SECTIONS, 1u64..8, 0u64..4, 0u64..4, 0i32..10), 0..3);
    (0u64..8, sizes(), ranges, moves).prop_map(|(version, (ss, ul), ranges, moves)| pb::ClusterMap {
        version,
        ids: None,
        section_size: ss,
        uid_limit: ul,
        sets: (0..4)
            .map(|s| pb::SetInfo {
                set_id: s,
                stores: vec![format!("store-{s}:1")],
                allocsvrs: if s == 3 {
                    Vec::new()
                } else {
                    vec![format!("alloc-{s}:1")]
                },
            })
            .collect(),
        ranges: ranges
            .into_iter()
            .map(|(b, len, set)| pb::MapRange {
                section_begin: b,
                section_end: b + len,
                set_id: set,
            })
            .collect(),
        moves: moves
            .into_iter()
            .map(|(b, len, from, to, phase)| pb::MoveInfo {
                from_set: from,
                to_set: to,
                sections: Some(pb::SectionRange { begin: b, end: b + len }),
                phase,
                ..Default::default()
            })
            .collect(),
    })
}

fn offer() -> impl Strategy<Value = Offer> {
    prop_oneof![3 => table().prop_map(Offer::Table), 2 => map().prop_map(Offer::Map), 1 => Just(Offer::Nothing)]
}

/// The map rules written out once more: non-zero version and sizes, ranges non-empty and
/// pairwise disjoint.
fn map_valid(m: &pb::ClusterMap) -> bool {
    let disjoint =
        |a: &pb::MapRange, b: &pb::MapRange| a.section_end <= b.section_begin || b.section_end <= a.section_begin;
    m.version > 0
        && m.section_size > 0
        && m.uid_limit > 0
        && m.ranges.iter().all(|r| r.section_begin < r.section_end)
        && m.ranges
            .iter()
            .enumerate()
            .all(|(i, a)| m.ranges[i + 1..].iter().all(|b| disjoint(a, b)))
}

/// What the model says `m` allows for `section`: its set, and the running moves' sides.
fn model_set_of(m: &pb::ClusterMap, section: u64) -> Option<u64> {
    m.ranges
        .iter()
        .find(|r| (r.section_begin..r.section_end).contains(&section))
        .map(|r| r.set_id)
}

fn model_may_answer(m: &pb::ClusterMap, section: u64, set: u64) -> bool {
    let ended = |p: i32| p == pb::MovePhase::Done as i32 || p == pb::MovePhase::Cancelled as i32;
    model_set_of(m, section) == Some(set)
        || m.moves.iter().any(|mv| {
            let holds = mv.sections.is_some_and(|s| (s.begin..s.end).contains(&section));
            !ended(mv.phase) && holds && (mv.from_set == set || mv.to_set == set)
        })
}

/// The model: the last installed table per set and the last installed map.
#[derive(Default)]
struct Model {
    tables: [Option<pb::RouteTable>; 4],
    map: Option<pb::ClusterMap>,
}

impl Model {
    /// Whether `offer` must be installed, updating the model when it is.
    fn offer(&mut self, offer: &Offer) -> bool {
        match offer {
            Offer::Table(t) => {
                let slot = &mut self.tables[t.set_id as usize];
                let newer = t.version > slot.as_ref().map_or(0, |c| c.version);
                let install = newer && Routes::new(t.clone()).is_ok();
                if install {
                    *slot = Some(t.clone());
                }
                install
            }
            Offer::Map(m) => {
                let install = m.version > self.map.as_ref().map_or(0, |c| c.version) && map_valid(m);
                if install {
                    self.map = Some(m.clone());
                }
                install
            }
            Offer::Nothing => false,
        }
    }
}

fn check_cache(cache: &RouteCache, model: &Model) -> Result<(), TestCaseError> {
    let now = cache.get();
    for (set, want) in model.tables.iter().enumerate() {
        let got = now.table(set as u64);
        prop_assert_eq!(
            got.as_ref().map(|r| r.as_proto()),
            want.as_ref(),
            "table of set {}",
            set
        );
    }
    prop_assert_eq!(now.map_version(), model.map.as_ref().map_or(0, |m| m.version));
    if let (Some(view), Some(m)) = (now.map(), &model.map) {
        prop_assert_eq!(view.as_ref(), &MapView::new(m).unwrap());
        for s in 0..SECTIONS + 12 {
            prop_assert_eq!(view.set_of(SectionId(s)), model_set_of(m, s), "set_of section {}", s);
            for set in 0..4 {
                prop_assert_eq!(view.may_answer(SectionId(s), set), model_may_answer(m, s, set));
            }
        }
    }
    Ok(())
}

fn check_targets(cache: &RouteCache, uids: &[u64]) -> Result<(), TestCaseError> {
    let routes = cache.get();
    let seeds = Seeds::new(vec!["seed:1".into()]);
    for &uid in uids {
        let target = target_addr(&routes, Uid(uid), &seeds, |n| n - 1);
        match (target, routes.uid_limit()) {
            (Err(_), Some(limit)) => prop_assert!(uid >= limit, "uid {uid} below the limit {limit} refused"),
            (Err(e), None) => {
                return Err(TestCaseError::fail(format!(
                    "uid {uid} refused with no limit known: {e}"
                )));
            }
            (Ok(t), limit) => {
                prop_assert!(limit.is_none_or(|l| uid < l), "uid {uid} at or above the limit routed");
                prop_assert!(
                    t.addr == "seed:1" || routes.routes_to(t.addr),
                    "uid {uid} sent to unknown {}",
                    t.addr
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn the_route_cache_installs_exactly_the_valid_newer_offers_and_routes_every_uid(
        offers in prop::collection::vec(offer(), 1..12),
        uids in prop::collection::vec(prop_oneof![0u64..220, any::<u64>()], 1..16),
    ) {
        let cache = RouteCache::default();
        let mut model = Model::default();
        for offer in &offers {
            let want = model.offer(offer);
            let got = match offer {
                Offer::Table(t) => cache.offer(Some(t.clone())),
                Offer::Map(m) => cache.offer_map(Some(m)),
                Offer::Nothing => cache.offer(None) || cache.offer_map(None),
            };
            prop_assert_eq!(got, want, "offer {:?}", offer);
            check_cache(&cache, &model)?;
            check_targets(&cache, &uids)?;
        }
    }
}
