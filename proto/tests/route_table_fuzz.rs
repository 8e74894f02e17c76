//! Route-table validation (`Routes::new`) against random tables. Issue "Security and
//! hardening", bullet "Fuzzing".
//!
//! Tables are structurally valid protobuf values with semantically random contents: zero,
//! small and huge section sizes and uid limits, and entries that are either a valid cover of
//! the sections perturbed at random (a boundary moved, an entry dropped, repeated or swapped,
//! a reversed entry) or entirely random.
//!
//! Properties: `Routes::new` never panics; it accepts a table exactly when an independent model
//! of the rules does (non-zero sizes; non-empty entries contiguous from section 0 to
//! `ceil(uid_limit / section_size)`), so neither a bad table slips through nor a good one is
//! refused; and on an accepted table `lookup` answers every uid below the limit with the entry
//! whose range holds its section, and no uid at or above it. `PROPTEST_CASES` overrides the CI
//! case count.

use proptest::prelude::*;
use seqsvr_proto::{Routes, Uid, pb};

/// Cases per property in CI (docs/FUZZING.md).
const CI_CASES: u32 = 2000;

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok());
    ProptestConfig::with_cases(cases.unwrap_or(CI_CASES))
}

fn entry(begin: u64, end: u64, node: u64) -> pb::RouteEntry {
    pb::RouteEntry {
        set_id: node % 3,
        section_begin: begin,
        section_end: end,
        node_id: node,
        incarnation: node + 1,
        addr: format!("10.0.0.{node}:7000"),
    }
}

/// A valid cover of `[0, total)` cut at `cuts` (fractions), or none when `total` is too large to
/// cut into few entries usefully (the huge limits exercise the size checks instead).
fn cover(total: u64, cuts: &[f64]) -> Vec<pb::RouteEntry> {
    let mut points: Vec<u64> = cuts
        .iter()
        .map(|f| (f * total as f64) as u64)
        .filter(|&p| p > 0 && p < total)
        .collect();
    points.push(0);
    points.push(total);
    points.sort_unstable();
    points.dedup();
    points
        .windows(2)
        .enumerate()
        .map(|(i, w)| entry(w[0], w[1], i as u64))
        .collect()
}

#[derive(Debug, Clone)]
enum Perturb {
    None,
    MoveBoundary(usize, i64),
    Drop(usize),
    Repeat(usize),
    Swap(usize, usize),
    Reverse(usize),
}

fn perturb(mut entries: Vec<pb::RouteEntry>, p: &Perturb) -> Vec<pb::RouteEntry> {
    let n = entries.len();
    if n == 0 {
        return entries;
    }
    match *p {
        Perturb::None => {}
        Perturb::MoveBoundary(i, d) => {
            let e = &mut entries[i % n];
            e.section_end = e.section_end.saturating_add_signed(d);
        }
        Perturb::Drop(i) => {
            entries.remove(i % n);
        }
        Perturb::Repeat(i) => entries.insert(i % n, entries[i % n].clone()),
        Perturb::Swap(i, j) => entries.swap(i % n, j % n),
        Perturb::Reverse(i) => {
            let e = &mut entries[i % n];
            std::mem::swap(&mut e.section_begin, &mut e.section_end);
        }
    }
    entries
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), 1u64..5, 1u64..200, Just(u64::MAX), any::<u64>()]
}

fn table() -> impl Strategy<Value = pb::RouteTable> {
    let perturbation = prop_oneof![
        3 => Just(Perturb::None),
        2 => (any::<usize>(), -2i64..=2).prop_map(|(i, d)| Perturb::MoveBoundary(i, d)),
        1 => any::<usize>().prop_map(Perturb::Drop),
        1 => any::<usize>().prop_map(Perturb::Repeat),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(i, j)| Perturb::Swap(i, j)),
        1 => any::<usize>().prop_map(Perturb::Reverse),
    ];
    let random_entries = prop::collection::vec((0u64..50, 0u64..50, 0u64..9), 0..8)
        .prop_map(|es| es.into_iter().map(|(b, e, n)| entry(b, e, n)).collect::<Vec<_>>());
    let cuts = prop::collection::vec(0.0..1.0f64, 0..8);
    (
        size(),
        size(),
        cuts,
        perturbation,
        prop::option::weighted(0.8, Just(())),
        random_entries,
        any::<u64>(),
    )
        .prop_map(|(section_size, uid_limit, cuts, p, covered, random, version)| {
            let total = if section_size == 0 {
                0
            } else {
                uid_limit.div_ceil(section_size)
            };
            let entries = match covered {
                Some(()) => perturb(cover(total, &cuts), &p),
                None => random,
            };
            pb::RouteTable {
                version,
                section_size,
                uid_limit,
                entries,
                set_id: version % 3,
            }
        })
}

/// The rules written out once more, independently of `Routes::new`.
fn valid(t: &pb::RouteTable) -> bool {
    if t.section_size == 0 || t.uid_limit == 0 {
        return false;
    }
    let total = t.uid_limit.div_ceil(t.section_size);
    let mut at = 0;
    for e in &t.entries {
        if e.section_begin != at || e.section_end <= e.section_begin {
            return false;
        }
        at = e.section_end;
    }
    at == total
}

/// Uids to look up: around the limit, section edges and at random.
fn uids(t: &pb::RouteTable, random: &[u64]) -> Vec<u64> {
    let mut out: Vec<u64> = random.to_vec();
    out.extend([
        0,
        t.uid_limit.saturating_sub(1),
        t.uid_limit,
        t.uid_limit.saturating_add(1),
        u64::MAX,
    ]);
    for e in &t.entries {
        let start = e.section_begin.saturating_mul(t.section_size);
        out.extend([start, start.saturating_sub(1)]);
    }
    out
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn a_route_table_is_accepted_exactly_when_valid_and_then_routes_every_uid(
        t in table(),
        random in prop::collection::vec(any::<u64>(), 0..8),
    ) {
        let want = valid(&t);
        let routes = match Routes::new(t.clone()) {
            Ok(r) => r,
            Err(e) => {
                prop_assert!(!want, "a valid table was refused: {e}");
                return Ok(());
            }
        };
        prop_assert!(want, "an invalid table was accepted: {t:?}");
        prop_assert_eq!(routes.as_proto(), &t);
        for uid in uids(&t, &random) {
            let got = routes.lookup(Uid(uid));
            if uid >= t.uid_limit {
                prop_assert!(got.is_none(), "uid {uid} at or above the limit {} routed", t.uid_limit);
                continue;
            }
            let section = uid / t.section_size;
            let e = t.entries.iter().find(|e| (e.section_begin..e.section_end).contains(&section));
            let (got, e) = (got.expect("a uid below the limit routes"), e.expect("valid covers every section"));
            prop_assert_eq!((got.section.0, got.node_id.0, got.set_id, got.addr), (section, e.node_id, e.set_id, e.addr.as_str()));
        }
    }
}

/// The generator is not vacuous: a fixed run holds both accepted and refused tables, accepted
/// ones with several entries.
#[test]
fn the_table_generator_makes_valid_and_invalid_tables() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let (mut ok, mut multi, mut bad) = (0, 0, 0);
    for _ in 0..1000 {
        let t = table().new_tree(&mut runner).unwrap().current();
        let v = valid(&t);
        ok += usize::from(v);
        multi += usize::from(v && t.entries.len() > 2);
        bad += usize::from(!v);
    }
    assert!(
        ok > 100 && multi > 20 && bad > 100,
        "{ok} valid ({multi} with 3+ entries), {bad} invalid"
    );
}
