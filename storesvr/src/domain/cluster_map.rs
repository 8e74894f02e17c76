//! The cluster map: which set serves which sections, where each set's StoreSvrs are, and the
//! record of every move. Its one authoritative home is set 0's Raft group (the set that starts
//! owning the whole uid space); every other server holds a copy and hands it out as a hint.
//!
//! Why set 0's group and not a group of its own: one Raft group fewer to run, and the map is
//! written only by operators (a few entries per move), so it adds nothing measurable to set 0's
//! log. What it costs: while set 0 has no quorum, no move can start, switch or finish anywhere,
//! and no set can be added (serving goes on: every set enforces its own range states).
//!
//! Every change is a compare-and-set on the map's `version` or is keyed by a move's op id, and a
//! move is driven by one driver at a time (a token that a `resume` takes over; the old driver's
//! next step is refused). A move's phases, in order:
//!
//! ```text
//! Recorded ─▶ Importing ─▶ Frozen ─▶ Sealed(ceilings) ─▶ Installed ─▶ Switched ─▶ Done
//!     └──────────┴────────────┴─▶ Cancelling ─▶ Cancelled   (never from Sealed on: the point
//!                                                              of no return)
//! ```
//!
//! A move ends (`Done`, `Cancelled`) only by [`MapCommand::Finish`], which the driver sends once
//! the sets have applied their last range step: the tombstone for `Done`, both sets' cancel for
//! `Cancelled`. Until then the move is still work to do — `Cancelling` holds its range like any
//! running move, `resume` and a repeated `cancel` finish it, and the stuck-move alert sees it. The
//! finish raises the map version, so every published copy stops treating the range as in flight.
//! (`Advance` to `Done` or `Cancelled`, which older drivers sent and older logs hold, still
//! applies as it always did, without that raise: a replayed log must give the same map.)
//!
//! Sealed stores the source's final ceilings; after it the target may install and serve, so a
//! cancel could leave numbers served by the target that the source does not know about. That is
//! why the point of no return sits at the seal, one step before the map switch.
//!
//! Left out: reaching the sets (the driver does), and time (the lease wait is the source's).

use super::ranges::{OpId, RangeTable};
use super::section::Span;
use seqsvr_proto::SectionId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Most StoreSvr addresses one set may list.
pub const MAX_STORES_PER_SET: usize = 16;

/// One set as the map knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetEntry {
    /// Its StoreSvr replicas' addresses (host:port), where clients and tools reach it.
    pub stores: Vec<String>,
}

/// How far a move has got (see the module docs for the order).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    Recorded,
    Importing,
    Frozen,
    /// The source's final ceilings, section by section.
    Sealed(Vec<u64>),
    Installed,
    Switched {
        map_version: u64,
    },
    Done,
    Cancelled,
    /// Cancelled in the map (no driver can seal it any more); the sets' range steps that give
    /// the range back may not all be applied yet. Appended last: the log stores a variant by
    /// position.
    Cancelling,
}

impl Phase {
    fn rank(&self) -> u8 {
        match self {
            Phase::Recorded => 0,
            Phase::Importing => 1,
            Phase::Frozen => 2,
            Phase::Sealed(_) => 3,
            Phase::Installed => 4,
            Phase::Switched { .. } => 5,
            Phase::Done => 6,
            Phase::Cancelled => 7,
            Phase::Cancelling => 8,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Phase::Recorded => "recorded",
            Phase::Importing => "importing",
            Phase::Frozen => "frozen",
            Phase::Sealed(_) => "sealed",
            Phase::Installed => "installed",
            Phase::Switched { .. } => "switched",
            Phase::Done => "done",
            Phase::Cancelled => "cancelled",
            Phase::Cancelling => "cancelling",
        }
    }

    /// Whether the move still holds its range (overlapping moves are refused).
    pub fn running(&self) -> bool {
        !matches!(self, Phase::Done | Phase::Cancelled)
    }
}

/// The record of one move.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveOp {
    pub op: OpId,
    pub from: u64,
    pub to: u64,
    pub span: Span,
    pub phase: Phase,
    /// The driver allowed to advance it (a random token per `seqctl` run).
    pub driver: u64,
    /// The map version the move was recorded at.
    pub recorded_at: u64,
    /// The map version its switch made (0 before the switch).
    pub switched_at: u64,
}

/// A change of the map. Variants are appended only (the log stores a variant by position).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MapCommand {
    /// Put a new set, owning nothing yet, into the map.
    AddSet {
        expect_version: u64,
        set_id: u64,
        stores: Vec<String>,
    },
    /// Record a move of `span` from `from` to `to` under op id `op`.
    Begin {
        expect_version: u64,
        op: OpId,
        from: u64,
        to: u64,
        span: Span,
        driver: u64,
    },
    /// A new driver takes the move over (`resume`); the previous one's next step is refused.
    Claim { op: OpId, driver: u64 },
    /// The driver reached `phase` (the next one in order, or `Cancelling` before the seal).
    Advance { op: OpId, driver: u64, phase: Phase },
    /// The sets applied the move's last range steps: `Switched` becomes `Done`, `Cancelling`
    /// becomes `Cancelled`, and the map's version rises.
    Finish { op: OpId, driver: u64 },
}

/// What a map command did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MapResult {
    /// Applied (or, `already`, applied before by the same driver): the map's version after it.
    Ok { version: u64, already: bool },
    /// The map changed since the caller read it: nothing done; here is the current version.
    VersionChanged { version: u64 },
    /// Not allowed (bad set, overlap, wrong order, another driver…): nothing done.
    Refused(String),
}

/// The map and the moves, as set 0's state machine holds them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMap {
    /// Raised on every change of `sets` or `ranges` (not on a move's progress).
    pub version: u64,
    pub sets: BTreeMap<u64, SetEntry>,
    /// Which set serves each run of sections; sections not listed are served by nobody.
    pub ranges: RangeTable<u64>,
    pub ops: BTreeMap<OpId, MoveOp>,
}

impl ClusterMap {
    /// The map of a new cluster: set 0 at `stores` serving sections `[0, total)`.
    pub fn first(total: u64, stores: Vec<String>) -> Self {
        let mut map = Self {
            version: 1,
            ..Self::default()
        };
        map.sets.insert(0, SetEntry { stores });
        map.ranges.set(SectionId(0), SectionId(total), Some(0));
        map
    }

    /// The set serving `section`.
    pub fn set_of(&self, section: SectionId) -> Option<u64> {
        self.ranges.state_at(section)
    }

    /// Whether every section of `span` is served by `set`.
    pub fn serves_all(&self, set: u64, span: Span) -> bool {
        self.ranges.all(span.begin, span.end, |s| s == Some(set))
    }

    pub fn apply(&mut self, cmd: &MapCommand) -> MapResult {
        match cmd {
            MapCommand::AddSet {
                expect_version,
                set_id,
                stores,
            } => self.add_set(*expect_version, *set_id, stores),
            MapCommand::Begin {
                expect_version,
                op,
                from,
                to,
                span,
                driver,
            } => self.begin(*expect_version, *op, *from, *to, *span, *driver),
            MapCommand::Claim { op, driver } => self.claim(*op, *driver),
            MapCommand::Advance { op, driver, phase } => self.advance(*op, *driver, phase),
            MapCommand::Finish { op, driver } => self.finish(*op, *driver),
        }
    }

    fn ok(&self, already: bool) -> MapResult {
        MapResult::Ok {
            version: self.version,
            already,
        }
    }

    fn add_set(&mut self, expect: u64, set_id: u64, stores: &[String]) -> MapResult {
        if let Some(existing) = self.sets.get(&set_id) {
            return if existing.stores == stores {
                self.ok(true)
            } else {
                MapResult::Refused(format!("set {set_id} is already in the map with {:?}", existing.stores))
            };
        }
        if expect != self.version {
            return MapResult::VersionChanged { version: self.version };
        }
        if stores.is_empty() || stores.len() > MAX_STORES_PER_SET {
            return MapResult::Refused(format!("a set needs 1..={MAX_STORES_PER_SET} StoreSvr addresses"));
        }
        self.sets.insert(
            set_id,
            SetEntry {
                stores: stores.to_vec(),
            },
        );
        self.version += 1;
        self.ok(false)
    }

    fn begin(&mut self, expect: u64, op: OpId, from: u64, to: u64, span: Span, driver: u64) -> MapResult {
        if let Some(m) = self.ops.get(&op) {
            let same = m.from == from && m.to == to && m.span == span && m.driver == driver;
            return if same {
                self.ok(true)
            } else {
                MapResult::Refused(format!("op id {op} is taken by another move"))
            };
        }
        if expect != self.version {
            return MapResult::VersionChanged { version: self.version };
        }
        if let Some(why) = self.why_not_move(from, to, span) {
            return MapResult::Refused(why);
        }
        let recorded_at = self.version;
        self.ops.insert(
            op,
            MoveOp {
                op,
                from,
                to,
                span,
                phase: Phase::Recorded,
                driver,
                recorded_at,
                switched_at: 0,
            },
        );
        self.version += 1;
        self.ok(false)
    }

    /// Why a move of `span` from `from` to `to` cannot start now, if it cannot.
    pub fn why_not_move(&self, from: u64, to: u64, span: Span) -> Option<String> {
        if span.begin >= span.end {
            return Some(format!("the range [{}, {}) is empty", span.begin, span.end));
        }
        for set in [from, to] {
            if !self.sets.contains_key(&set) {
                return Some(format!(
                    "set {set} is not in the cluster map (add it with `seqctl set add`)"
                ));
            }
        }
        if from == to {
            return Some(format!(
                "the source and target are the same set ({from}): a move goes between two sets"
            ));
        }
        if !self.serves_all(from, span) {
            return Some(format!(
                "set {from} does not serve all of sections [{}, {})",
                span.begin, span.end
            ));
        }
        self.ops
            .values()
            .find(|m| m.phase.running() && m.span.begin < span.end && span.begin < m.span.end)
            .map(|m| {
                format!(
                    "move {} ({} of sections [{}, {})) overlaps it; wait for it, resume or cancel it",
                    m.op,
                    m.phase.name(),
                    m.span.begin,
                    m.span.end
                )
            })
    }

    fn claim(&mut self, op: OpId, driver: u64) -> MapResult {
        let Some(m) = self.ops.get_mut(&op) else {
            return MapResult::Refused(format!("no move {op}"));
        };
        if !m.phase.running() {
            return MapResult::Refused(format!("move {op} is {} already", m.phase.name()));
        }
        let already = m.driver == driver;
        m.driver = driver;
        self.ok(already)
    }

    fn advance(&mut self, op: OpId, driver: u64, phase: &Phase) -> MapResult {
        let version = self.version;
        let Some(m) = self.ops.get_mut(&op) else {
            return MapResult::Refused(format!("no move {op}"));
        };
        if m.phase == *phase || (matches!(phase, Phase::Switched { .. }) && matches!(m.phase, Phase::Switched { .. })) {
            return self.ok(true);
        }
        if m.driver != driver {
            return MapResult::Refused(format!("move {op} is driven by another seqctl now (it was resumed)"));
        }
        let allowed = match phase {
            Phase::Cancelled | Phase::Cancelling => m.phase.rank() < Phase::Sealed(Vec::new()).rank(),
            next => next.rank() == m.phase.rank() + 1,
        };
        if !allowed {
            return MapResult::Refused(format!(
                "move {op} is {}; it cannot become {}",
                m.phase.name(),
                phase.name()
            ));
        }
        if let Phase::Sealed(ceilings) = phase
            && ceilings.len() as u64 != m.span.end.0 - m.span.begin.0
        {
            return MapResult::Refused(format!(
                "{} ceilings for a move of {} sections",
                ceilings.len(),
                m.span.end.0 - m.span.begin.0
            ));
        }
        let mut phase = phase.clone();
        if let Phase::Switched { .. } = phase {
            // The point where clients are sent to the target: the map changes, its version rises.
            phase = Phase::Switched {
                map_version: version + 1,
            };
        }
        m.phase = phase.clone();
        if let Phase::Switched { map_version } = phase {
            m.switched_at = map_version;
            let (span, to) = (m.span, m.to);
            self.ranges.set(span.begin, span.end, Some(to));
            self.version += 1;
        }
        self.ok(false)
    }

    fn finish(&mut self, op: OpId, driver: u64) -> MapResult {
        let Some(m) = self.ops.get_mut(&op) else {
            return MapResult::Refused(format!("no move {op}"));
        };
        let end = match m.phase {
            Phase::Done | Phase::Cancelled => return self.ok(true),
            Phase::Switched { .. } => Phase::Done,
            Phase::Cancelling => Phase::Cancelled,
            ref p => {
                return MapResult::Refused(format!(
                    "move {op} is {}: only a switched or cancelling move can finish",
                    p.name()
                ));
            }
        };
        if m.driver != driver {
            return MapResult::Refused(format!("move {op} is driven by another seqctl now (it was resumed)"));
        }
        m.phase = end;
        self.version += 1;
        self.ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(b: u64, e: u64) -> Span {
        Span {
            begin: SectionId(b),
            end: SectionId(e),
        }
    }

    fn two_sets() -> ClusterMap {
        let mut map = ClusterMap::first(10, vec!["a:1".into()]);
        let add = MapCommand::AddSet {
            expect_version: 1,
            set_id: 1,
            stores: vec!["b:1".into()],
        };
        assert_eq!(
            map.apply(&add),
            MapResult::Ok {
                version: 2,
                already: false
            }
        );
        assert_eq!(
            map.apply(&add),
            MapResult::Ok {
                version: 2,
                already: true
            },
            "a repeated add is a no-op"
        );
        map
    }

    fn begin(map: &mut ClusterMap, op: OpId, s: Span, driver: u64) -> MapResult {
        let expect_version = map.version;
        map.apply(&MapCommand::Begin {
            expect_version,
            op,
            from: 0,
            to: 1,
            span: s,
            driver,
        })
    }

    fn advance(map: &mut ClusterMap, op: OpId, driver: u64, phase: Phase) -> MapResult {
        map.apply(&MapCommand::Advance { op, driver, phase })
    }

    #[test]
    fn a_move_walks_its_phases_in_order_and_switches_the_map_once() {
        let mut map = two_sets();
        assert!(matches!(
            begin(&mut map, 5, span(2, 4), 77),
            MapResult::Ok { already: false, .. }
        ));
        assert!(
            matches!(advance(&mut map, 5, 77, Phase::Frozen), MapResult::Refused(_)),
            "importing comes first"
        );
        for phase in [
            Phase::Importing,
            Phase::Frozen,
            Phase::Sealed(vec![10, 20]),
            Phase::Installed,
        ] {
            assert!(matches!(
                advance(&mut map, 5, 77, phase.clone()),
                MapResult::Ok { already: false, .. }
            ));
            assert!(matches!(
                advance(&mut map, 5, 77, phase),
                MapResult::Ok { already: true, .. }
            ));
        }
        let before = map.version;
        assert_eq!(map.set_of(SectionId(3)), Some(0));
        assert!(matches!(
            advance(&mut map, 5, 77, Phase::Switched { map_version: 0 }),
            MapResult::Ok { already: false, .. }
        ));
        assert_eq!(map.version, before + 1);
        assert_eq!(
            map.ops[&5].phase,
            Phase::Switched {
                map_version: before + 1
            }
        );
        assert_eq!(
            (
                map.set_of(SectionId(1)),
                map.set_of(SectionId(3)),
                map.set_of(SectionId(4))
            ),
            (Some(0), Some(1), Some(0))
        );
        assert!(matches!(
            advance(&mut map, 5, 77, Phase::Switched { map_version: 0 }),
            MapResult::Ok { already: true, .. }
        ));
        assert_eq!(map.version, before + 1, "a repeated switch changes nothing");
        assert_eq!(map.ops[&5].switched_at, before + 1, "the tombstone names this version");
        assert!(matches!(advance(&mut map, 5, 77, Phase::Done), MapResult::Ok { .. }));
        assert!(matches!(
            advance(&mut map, 5, 77, Phase::Cancelled),
            MapResult::Refused(_)
        ));
    }

    #[test]
    fn refusals_name_the_problem_and_change_nothing() {
        let mut map = two_sets();
        let v = map.version;
        let stale = MapCommand::Begin {
            expect_version: v - 1,
            op: 1,
            from: 0,
            to: 1,
            span: span(0, 2),
            driver: 1,
        };
        assert_eq!(map.apply(&stale), MapResult::VersionChanged { version: v });
        assert!(matches!(begin(&mut map, 1, span(3, 3), 1), MapResult::Refused(m) if m.contains("empty")));
        assert!(matches!(begin(&mut map, 1, span(8, 12), 1), MapResult::Refused(m) if m.contains("does not serve")));
        let to_self = MapCommand::Begin {
            expect_version: v,
            op: 1,
            from: 1,
            to: 1,
            span: span(0, 2),
            driver: 1,
        };
        assert!(matches!(map.apply(&to_self), MapResult::Refused(m) if m.contains("same set")));
        let unknown = MapCommand::Begin {
            expect_version: v,
            op: 1,
            from: 0,
            to: 9,
            span: span(0, 2),
            driver: 1,
        };
        assert!(matches!(map.apply(&unknown), MapResult::Refused(m) if m.contains("set 9")));
        assert_eq!(map.version, v);
        assert!(map.ops.is_empty());

        assert!(matches!(begin(&mut map, 1, span(0, 4), 1), MapResult::Ok { .. }));
        assert!(matches!(begin(&mut map, 2, span(3, 6), 1), MapResult::Refused(m) if m.contains("overlaps")));
        assert!(
            matches!(begin(&mut map, 2, span(4, 6), 1), MapResult::Ok { .. }),
            "disjoint moves run at once"
        );
        assert!(matches!(begin(&mut map, 1, span(6, 8), 1), MapResult::Refused(m) if m.contains("taken")));
    }

    #[test]
    fn a_resumed_move_belongs_to_its_new_driver_and_cancel_stops_at_the_seal() {
        let mut map = two_sets();
        begin(&mut map, 3, span(0, 2), 10);
        advance(&mut map, 3, 10, Phase::Importing);
        assert!(matches!(
            map.apply(&MapCommand::Claim { op: 3, driver: 11 }),
            MapResult::Ok { .. }
        ));
        assert!(matches!(advance(&mut map, 3, 10, Phase::Frozen), MapResult::Refused(m) if m.contains("another")));
        assert!(matches!(advance(&mut map, 3, 11, Phase::Frozen), MapResult::Ok { .. }));
        assert!(matches!(
            advance(&mut map, 3, 11, Phase::Cancelled),
            MapResult::Ok { .. }
        ));
        assert!(!map.ops[&3].phase.running());
        assert_eq!(map.set_of(SectionId(1)), Some(0));

        begin(&mut map, 4, span(0, 2), 12);
        for phase in [Phase::Importing, Phase::Frozen, Phase::Sealed(vec![1, 2])] {
            advance(&mut map, 4, 12, phase);
        }
        assert!(matches!(advance(&mut map, 4, 12, Phase::Cancelled), MapResult::Refused(m) if m.contains("sealed")));
        assert!(
            matches!(advance(&mut map, 4, 12, Phase::Sealed(vec![1])), MapResult::Refused(_)),
            "sealed once"
        );
    }

    /// A cancel is `Cancelling` until the driver says the sets gave the range back; only then
    /// does the move end, and the map's version rises so that published copies drop it. A
    /// finished move ends the same way.
    #[test]
    fn a_move_ends_only_when_finished_and_its_end_raises_the_map_version() {
        let mut map = two_sets();
        begin(&mut map, 3, span(0, 2), 10);
        advance(&mut map, 3, 10, Phase::Importing);
        assert!(matches!(
            advance(&mut map, 3, 10, Phase::Cancelling),
            MapResult::Ok { already: false, .. }
        ));
        assert!(matches!(
            advance(&mut map, 3, 10, Phase::Cancelling),
            MapResult::Ok { already: true, .. }
        ));
        assert!(map.ops[&3].phase.running(), "cancelling still holds the range");
        assert!(matches!(begin(&mut map, 9, span(1, 3), 1), MapResult::Refused(m) if m.contains("cancelling")));
        assert!(
            matches!(advance(&mut map, 3, 10, Phase::Frozen), MapResult::Refused(_)),
            "no way back"
        );
        assert!(
            matches!(advance(&mut map, 3, 10, Phase::Cancelled), MapResult::Refused(_)),
            "only Finish ends it"
        );
        assert!(
            matches!(
                map.apply(&MapCommand::Claim { op: 3, driver: 11 }),
                MapResult::Ok { .. }
            ),
            "a repeated cancel takes it over"
        );
        let v = map.version;
        let finish = |driver| MapCommand::Finish { op: 3, driver };
        assert!(matches!(map.apply(&finish(10)), MapResult::Refused(m) if m.contains("another")));
        assert_eq!(
            map.apply(&finish(11)),
            MapResult::Ok {
                version: v + 1,
                already: false
            }
        );
        assert_eq!((map.ops[&3].phase.clone(), map.version), (Phase::Cancelled, v + 1));
        assert_eq!(
            map.apply(&finish(11)),
            MapResult::Ok {
                version: v + 1,
                already: true
            }
        );
        assert!(matches!(
            map.apply(&MapCommand::Claim { op: 3, driver: 12 }),
            MapResult::Refused(_)
        ));

        begin(&mut map, 4, span(0, 2), 12);
        assert!(
            matches!(map.apply(&MapCommand::Finish { op: 4, driver: 12 }), MapResult::Refused(m) if m.contains("recorded"))
        );
        for phase in [
            Phase::Importing,
            Phase::Frozen,
            Phase::Sealed(vec![1, 2]),
            Phase::Installed,
        ] {
            advance(&mut map, 4, 12, phase);
        }
        assert!(matches!(
            advance(&mut map, 4, 12, Phase::Cancelling),
            MapResult::Refused(_)
        ));
        advance(&mut map, 4, 12, Phase::Switched { map_version: 0 });
        let v = map.version;
        assert_eq!(
            map.apply(&MapCommand::Finish { op: 4, driver: 12 }),
            MapResult::Ok {
                version: v + 1,
                already: false
            }
        );
        assert_eq!(map.ops[&4].phase, Phase::Done);
    }

    /// The log stores variants by position: the ones added for issue 25 come after every older
    /// one, so an entry or snapshot written by the previous release decodes as it did.
    #[test]
    fn new_variants_are_appended_and_old_ones_keep_their_positions() {
        let tag = |v: &MapCommand| postcard::to_stdvec(v).unwrap()[0];
        assert_eq!(tag(&MapCommand::Claim { op: 1, driver: 2 }), 2);
        assert_eq!(tag(&MapCommand::Finish { op: 1, driver: 2 }), 4);
        let phase = |p: &Phase| postcard::to_stdvec(p).unwrap()[0];
        assert_eq!((phase(&Phase::Done), phase(&Phase::Cancelled)), (6, 7));
        assert_eq!(phase(&Phase::Cancelling), 8);
    }
}
