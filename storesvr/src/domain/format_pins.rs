//! The Raft log's and the snapshot's bytes, pinned by a fixture written by the code of
//! 2026-11-26 (`storesvr/fixtures/formats-2026-11.bin`), before the state machine was taken apart
//! into sub-machines.
//!
//! The fixture holds two scenarios written out by hand — a move from set 0 (the map's home) to set
//! 1 that ends done, one that is cancelled, bound and unbound AllocSvrs, a drain, audit records and
//! a cached map, each command checked to take effect — and then scripts of commands drawn by the
//! property tests' generator (a fixed seed), until every variant of `Command`, `RangeCommand`,
//! `MapCommand` and the map's `Phase` has been drawn at least once. Per script it keeps each command as it is encoded in a log entry
//! (`raft::types::Request`), each result (`Response`) and the state the script ends in, encoded as
//! a snapshot encodes it. The test decodes every entry, checks that it encodes back to the same
//! bytes, applies it and checks its result's bytes, and checks the final state's bytes — so a
//! change to any type in the log or the snapshot, or to what applying an old entry does, fails
//! here.
//!
//! `SEQSVR_WRITE_FORMAT_FIXTURE=1 cargo test -p storesvr format_pins` writes the fixture anew.
//! Do that only when a format change is the point (and older files must still be read: see
//! `storage::sm_store`'s padding of older snapshots).
//!
//! Left out: openraft's own envelope around an entry (its log id and membership entries, the
//! `Entry` type is openraft's) and the segment file framing (`storage::segment_log` tests it).

use std::collections::BTreeSet;
use std::path::PathBuf;

use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;
use serde::{Deserialize, Serialize};

use seqsvr_proto::{Epoch, Incarnation, NodeId, SectionId};

use super::audit::{AuditNote, AuditRecord};
use super::binding::SecretHash;
use super::cluster_map::{MapCommand, Phase};
use super::moves::RangeCommand;
use super::state::{BumpItem, CachedMap, Command, CommandResult, Move, NOBODY, Released, SetState, Span};
use super::state_props::{params, resolve, script};
use crate::raft::types::{Request, Response};
use crate::storage::sm_store::decode_padded;

/// The encoding of the `SetState` fields added after the fixture was written, empty: `ids: None`.
const ADDED_SINCE_FIXTURE: &[u8] = &[0];

/// One script: the set it initializes (if any), its entries and results, and its final state.
#[derive(Serialize, Deserialize)]
struct Pinned {
    init: Option<u64>,
    entries: Vec<Vec<u8>>,
    results: Vec<Vec<u8>>,
    state: Vec<u8>,
}

fn fixture_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/formats-2026-11.bin")
}

/// Encoding tags seen, per enum: `(enum, variant index)`.
fn tags_of(cmd: &Command, seen: &mut BTreeSet<(&'static str, u8)>) {
    let first = |bytes: Vec<u8>| bytes[0];
    seen.insert(("Command", first(postcard::to_stdvec(cmd).unwrap())));
    match cmd {
        Command::Range(r) => {
            seen.insert(("RangeCommand", first(postcard::to_stdvec(r).unwrap())));
        }
        Command::Map(m) => {
            seen.insert(("MapCommand", first(postcard::to_stdvec(m).unwrap())));
            if let MapCommand::Advance { phase, .. } = m {
                seen.insert(("Phase", first(postcard::to_stdvec(phase).unwrap())));
            }
        }
        Command::Audited { cmd, .. } | Command::Bound { cmd, .. } => tags_of(cmd, seen),
        _ => {}
    }
}

/// Variants per enum when the fixture was written: Command 12, RangeCommand 6, MapCommand 5, the
/// map's Phase 9 (`Command::Slots`, the 13th, came later).
const VARIANTS: [(&str, u8); 4] = [("Command", 12), ("RangeCommand", 6), ("MapCommand", 5), ("Phase", 9)];

fn covered(seen: &BTreeSet<(&'static str, u8)>) -> bool {
    VARIANTS
        .iter()
        .all(|(name, n)| (0..*n).all(|i| seen.contains(&(*name, i))))
}

/// Applies `entries` (each one command) to a fresh set; the results' and the state's bytes.
fn replay(init: Option<u64>, cmds: &[Command]) -> (Vec<Vec<u8>>, Vec<u8>) {
    let mut st = SetState::default();
    if let Some(set) = init {
        st.apply(&Command::Init(params(set)), false);
    }
    let results = cmds
        .iter()
        .map(|c| {
            let results = vec![st.apply(c, false)];
            postcard::to_stdvec(&Response { results }).unwrap()
        })
        .collect();
    (results, postcard::to_stdvec(&st).unwrap())
}

/// A scenario: commands made against the state they are applied to, each required to take effect.
struct Scenario {
    init: u64,
    st: SetState,
    cmds: Vec<Command>,
}

impl Scenario {
    fn new(init: u64) -> Self {
        let mut st = SetState::default();
        st.apply(&Command::Init(params(init)), false);
        Self {
            init,
            st,
            cmds: Vec::new(),
        }
    }

    fn run(&mut self, cmd: Command) -> CommandResult {
        let r = self.st.apply(&cmd, false);
        let failed = matches!(
            r,
            CommandResult::Refused(_) | CommandResult::Invalid(_) | CommandResult::NotBound
        ) || matches!(&r, CommandResult::Map(m) if !matches!(m, super::cluster_map::MapResult::Ok { already: false, .. }));
        assert!(!failed, "scenario step {cmd:?} did not take effect: {r:?}");
        self.cmds.push(cmd);
        r
    }

    fn epoch(&self, section: u64) -> Epoch {
        self.st.section(SectionId(section)).expect("a section of the set").epoch
    }

    fn pinned(self) -> Pinned {
        pin(Some(self.init), self.cmds)
    }
}

fn span(begin: u64, end: u64) -> Span {
    Span {
        begin: SectionId(begin),
        end: SectionId(end),
    }
}

fn bound(secret: &[u8], cmd: Command) -> Command {
    Command::Bound {
        secret_hash: SecretHash::of(secret),
        cmd: Box::new(cmd),
    }
}

fn registered(r: CommandResult) -> Incarnation {
    match r {
        CommandResult::Registered { incarnation } => incarnation,
        other => panic!("register: {other:?}"),
    }
}

/// Set 0: two AllocSvrs (one bound), bumps, the map, a move of sections 2..4 to set 1 that ends
/// done and one of section 5 that is cancelled, a drain, audit records, a cached map.
fn set_0_scenario() -> Pinned {
    let mut s = Scenario::new(0);
    let a = registered(s.run(bound(
        b"the first secret",
        Command::Register {
            node_id: NodeId(1),
            addr: "a:1".into(),
            nonce: 7,
        },
    )));
    let b = registered(s.run(Command::Register {
        node_id: NodeId(2),
        addr: "b:1".into(),
        nonce: 0,
    }));
    let moves = vec![
        Move {
            begin: SectionId(0),
            end: SectionId(4),
            from: NOBODY,
            to: a,
        },
        Move {
            begin: SectionId(4),
            end: SectionId(8),
            from: NOBODY,
            to: b,
        },
    ];
    s.run(Command::Assign { expire: vec![], moves });
    let item = |s: &Scenario, section: u64, new_max| BumpItem {
        section: SectionId(section),
        epoch: s.epoch(section),
        new_max,
    };
    let items = vec![item(&s, 2, 10), item(&s, 3, 20)];
    s.run(bound(b"the first secret", Command::Bump { incarnation: a, items }));
    let items = vec![item(&s, 5, 10)];
    s.run(Command::Bump { incarnation: b, items });
    let map = |s: &mut Scenario, c| s.run(Command::Map(c));
    map(
        &mut s,
        MapCommand::AddSet {
            expect_version: 1,
            set_id: 1,
            stores: vec!["c:1".into()],
        },
    );
    let v = s.st.map.as_ref().unwrap().version;
    map(
        &mut s,
        MapCommand::Begin {
            expect_version: v,
            op: 1,
            from: 0,
            to: 1,
            span: span(2, 4),
            driver: 5,
        },
    );
    let advance = |s: &mut Scenario, op, driver, phase| s.run(Command::Map(MapCommand::Advance { op, driver, phase }));
    advance(&mut s, 1, 5, Phase::Importing);
    s.run(Command::Range(RangeCommand::Freeze {
        op: 1,
        span: span(2, 4),
        to_set: 1,
    }));
    advance(&mut s, 1, 5, Phase::Frozen);
    let released = Released {
        begin: SectionId(2),
        end: SectionId(4),
        epoch: s.epoch(2),
        waited: true,
    };
    s.run(bound(
        b"the first secret",
        Command::Release {
            incarnation: a,
            ranges: vec![released],
            leaving: false,
        },
    ));
    let ceilings = s.st.final_ceilings(1).expect("frozen");
    advance(&mut s, 1, 5, Phase::Sealed(ceilings));
    s.run(Command::Range(RangeCommand::Seal {
        op: 1,
        span: span(2, 4),
    }));
    advance(&mut s, 1, 5, Phase::Installed);
    advance(&mut s, 1, 5, Phase::Switched { map_version: 0 });
    let switched = s.st.map.as_ref().unwrap().version;
    s.run(Command::Range(RangeCommand::Tombstone {
        op: 1,
        span: span(2, 4),
        to_set: 1,
        map_version: switched,
    }));
    map(&mut s, MapCommand::Finish { op: 1, driver: 5 });

    let v = s.st.map.as_ref().unwrap().version;
    map(
        &mut s,
        MapCommand::Begin {
            expect_version: v,
            op: 2,
            from: 0,
            to: 1,
            span: span(5, 6),
            driver: 5,
        },
    );
    advance(&mut s, 2, 5, Phase::Importing);
    s.run(Command::Range(RangeCommand::Freeze {
        op: 2,
        span: span(5, 6),
        to_set: 1,
    }));
    map(&mut s, MapCommand::Claim { op: 2, driver: 6 });
    advance(&mut s, 2, 6, Phase::Cancelling);
    s.run(Command::Range(RangeCommand::Cancel {
        op: 2,
        span: span(5, 6),
    }));
    map(&mut s, MapCommand::Finish { op: 2, driver: 6 });

    let note = AuditNote {
        who: "CN=operator".into(),
        at_ms: 1_764_115_200_000,
        what: "drain AllocSvr node 2".into(),
    };
    s.run(Command::Audited {
        note: note.clone(),
        cmd: Box::new(Command::Drain { node_id: NodeId(2) }),
    });
    s.run(Command::CacheMap(CachedMap {
        version: 9,
        encoded: vec![8, 1, 16, 2],
    }));
    s.run(Command::Audit(AuditRecord::new(&note, "done")));
    let gone = Released {
        begin: SectionId(4),
        end: SectionId(8),
        epoch: s.epoch(4),
        waited: true,
    };
    s.run(Command::Release {
        incarnation: b,
        ranges: vec![gone],
        leaving: true,
    });
    s.pinned()
}

/// Set 1: the target of set 0's moves: imports, installs the done one, forgets the cancelled one,
/// then serves what it installed.
fn set_1_scenario() -> Pinned {
    let mut s = Scenario::new(1);
    let a = registered(s.run(bound(
        b"another secret",
        Command::Register {
            node_id: NodeId(3),
            addr: "c:1".into(),
            nonce: 1,
        },
    )));
    s.run(Command::Range(RangeCommand::Import {
        op: 1,
        span: span(2, 4),
        from_set: 0,
    }));
    s.run(Command::Range(RangeCommand::Import {
        op: 2,
        span: span(5, 6),
        from_set: 0,
    }));
    s.run(Command::Range(RangeCommand::Install {
        op: 1,
        span: span(2, 4),
        ceilings: vec![10, 20],
    }));
    s.run(Command::Range(RangeCommand::Cancel {
        op: 2,
        span: span(5, 6),
    }));
    let moves = vec![
        Move {
            begin: SectionId(2),
            end: SectionId(4),
            from: NOBODY,
            to: a,
        },
        Move {
            begin: SectionId(8),
            end: SectionId(12),
            from: NOBODY,
            to: a,
        },
    ];
    s.run(Command::Assign { expire: vec![], moves });
    let items = vec![BumpItem {
        section: SectionId(3),
        epoch: s.epoch(3),
        new_max: 40,
    }];
    s.run(bound(b"another secret", Command::Bump { incarnation: a, items }));
    s.pinned()
}

/// Pins a script: its entries' bytes, and the results and final state of replaying them.
fn pin(init: Option<u64>, cmds: Vec<Command>) -> Pinned {
    let entries = cmds
        .iter()
        .map(|c| postcard::to_stdvec(&Request { cmds: vec![c.clone()] }).unwrap())
        .collect();
    let (results, state) = replay(init, &cmds);
    Pinned {
        init,
        entries,
        results,
        state,
    }
}

fn write_fixture() {
    let mut runner = TestRunner::deterministic();
    let mut seen = BTreeSet::new();
    let mut pinned = vec![set_0_scenario(), set_1_scenario()];
    while !covered(&seen) {
        assert!(pinned.len() < 400, "the generator never drew every variant: {seen:?}");
        let (init, drawn) = script().new_tree(&mut runner).unwrap().current();
        // Resolved against the state as the property tests do, so that commands land.
        let mut st = SetState::default();
        if let Some(set) = init {
            st.apply(&Command::Init(params(set)), false);
        }
        let cmds: Vec<Command> = drawn
            .iter()
            .map(|c| {
                let c = resolve(c, &st);
                st.apply(&c, false);
                c
            })
            .collect();
        cmds.iter().for_each(|c| tags_of(c, &mut seen));
        pinned.push(pin(init, cmds));
    }
    std::fs::write(fixture_path(), postcard::to_stdvec(&pinned).unwrap()).unwrap();
}

/// Entries and snapshots written by the code of 2026-11-26 decode, replay and encode exactly as
/// they did then.
#[test]
fn log_entries_and_snapshots_of_2026_11_replay_byte_for_byte() {
    if std::env::var_os("SEQSVR_WRITE_FORMAT_FIXTURE").is_some() {
        write_fixture();
    }
    let bytes = std::fs::read(fixture_path()).expect("the format fixture");
    let pinned: Vec<Pinned> = postcard::from_bytes(&bytes).expect("the fixture's own envelope");
    let mut seen = BTreeSet::new();
    for (n, p) in pinned.iter().enumerate() {
        let cmds: Vec<Command> = p
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let req: Request = postcard::from_bytes(e).unwrap_or_else(|err| panic!("script {n} entry {i}: {err}"));
                assert_eq!(
                    &postcard::to_stdvec(&req).unwrap(),
                    e,
                    "script {n} entry {i} encodes differently"
                );
                assert_eq!(req.cmds.len(), 1);
                req.cmds.into_iter().next().unwrap()
            })
            .collect();
        cmds.iter().for_each(|c| tags_of(c, &mut seen));
        let (results, state) = replay(p.init, &cmds);
        for (i, (now, then)) in results.iter().zip(&p.results).enumerate() {
            assert_eq!(now, then, "script {n}: entry {i} ({:?}) applies differently", cmds[i]);
        }
        // Fields added to `SetState` since the fixture was written encode their empty value at the
        // end; everything before them must be the pinned bytes.
        let now_pinned = [p.state.as_slice(), ADDED_SINCE_FIXTURE].concat();
        assert_eq!(state, now_pinned, "script {n}: the final state encodes differently");
        let decoded: SetState = decode_padded(&p.state).expect("the pinned state decodes");
        assert_eq!(
            postcard::to_stdvec(&decoded).unwrap(),
            now_pinned,
            "script {n}: state round trip"
        );
    }
    assert!(covered(&seen), "the fixture lacks a variant: {seen:?}");
}
