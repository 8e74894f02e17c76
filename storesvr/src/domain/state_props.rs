//! Property tests of the replicated state machine: random sequences of every [`Command`] variant,
//! with the invariants of docs/DESIGN.md (P3, the store half of P4) and of
//! docs/design/sets-and-moves.md (the range states) checked after every single step, not only at
//! the end.
//!
//! Field values come mostly from small domains that collide on purpose (a handful of node ids,
//! incarnations and epochs around the ones that exist, sections inside and just outside the
//! section space, op ids shared by several range steps, map versions old and new), so that
//! retries, stale epochs, superseded incarnations and out-of-order range steps actually happen;
//! one arm in each field draws any `u64` to reach the edges.
//!
//! Case counts: [`CI_CASES`] per property; `PROPTEST_CASES=N` overrides it for a long run (the
//! `proptest!` macro passes its config through `contextualize_config`, which reads the variable).
//! See docs/FUZZING.md.
//!
//! Left out: the arbiter's choices (its `Assign`s are generated at random here, which covers
//! more than the arbiter ever sends) and time (the state machine reads no clock).

use super::audit::{AuditNote, AuditRecord, MAX_AUDIT_FIELD_BYTES, MAX_AUDIT_RECORDS};
use super::binding::{SecretHash, Verdict};
use super::cluster_map::{MapCommand, MapResult, Phase as MapPhase};
use super::command;
use super::moves::{RangeCommand, Role, SidePhase};
use super::ranges::RangeState;
use super::slots::{RaiseItem, SlotCommand, SlotMove};
use super::state::*;
use proptest::prelude::*;
use seqsvr_proto::{Epoch, Incarnation, NodeId, SectionId};
use std::borrow::Cow;

/// Cases per property in CI (debug build); a sequence has up to [`MAX_STEPS`] commands.
const CI_CASES: u32 = 256;
const MAX_STEPS: usize = 300;

/// Sections in the uid space of the generated sets (uid_limit / section_size).
const TOTAL: u64 = 12;

/// Set 0 owns `[0, 8)` and keeps the cluster map; set 1 owns `[8, 12)` and has none. Both leave
/// sections of the space to another set, so imports and absent sections occur from the start.
pub(crate) fn params(set_id: u64) -> SetParams {
    let (section_begin, section_end) = if set_id == 0 { (0, 8) } else { (8, TOTAL) };
    SetParams {
        set_id,
        section_size: 100,
        uid_limit: TOTAL * 100,
        step: 10,
        lease_ms: 3_000,
        renew_interval_ms: 500,
        drift_ppm: 10_000,
        margin_ms: 100,
        section_begin,
        section_end,
    }
}

/// Mostly `0..small`, sometimes any `u64` (0 and `u64::MAX` included by proptest's edge bias).
fn small_or_any(small: u64) -> impl Strategy<Value = u64> {
    prop_oneof![8 => 0..small, 1 => any::<u64>(), 1 => Just(u64::MAX)]
}

fn section() -> impl Strategy<Value = SectionId> {
    prop_oneof![9 => 0..TOTAL + 2, 1 => any::<u64>()].prop_map(SectionId)
}

fn inc() -> impl Strategy<Value = Incarnation> {
    small_or_any(8).prop_map(Incarnation)
}

fn epoch() -> impl Strategy<Value = Epoch> {
    small_or_any(8).prop_map(Epoch)
}

/// Mostly a non-empty span inside (or just past) the section space, sometimes empty or reversed.
fn span() -> impl Strategy<Value = Span> {
    prop_oneof![
        8 => (0..TOTAL, 1..6u64).prop_map(|(b, len)| (b, b + len)),
        1 => (0..TOTAL + 2, 0..TOTAL + 2),
        1 => (any::<u64>(), any::<u64>()),
    ]
    .prop_map(|(b, e)| Span {
        begin: SectionId(b),
        end: SectionId(e),
    })
}

fn op() -> impl Strategy<Value = u64> {
    small_or_any(4)
}

fn set_id() -> impl Strategy<Value = u64> {
    small_or_any(3)
}

/// One ceiling per section of `span` (sometimes one too many or too few), around the step.
fn ceilings(span: Span) -> impl Strategy<Value = Vec<u64>> {
    let len = span.end.0.saturating_sub(span.begin.0).min(8) as usize;
    let len = prop_oneof![4 => Just(len), 1 => len.saturating_sub(1)..=len + 1];
    len.prop_flat_map(|n| prop::collection::vec(small_or_any(80), n))
}

/// The span each small op id mostly names, so that the steps of one move agree on it: ranges of
/// set 0 (`[0, 8)`) to export, ranges of set 1 (`[8, 12)`) to import there, and the reverse.
const OP_SPANS: [(u64, u64); 4] = [(2, 4), (8, 10), (10, 12), (0, 3)];

/// Mostly the op's own span (a coherent move), sometimes any span (a step out of place).
fn op_and_span() -> impl Strategy<Value = (u64, Span)> {
    (op(), prop_oneof![7 => Just(None), 3 => span().prop_map(Some)]).prop_map(|(op, span)| {
        let (b, e) = OP_SPANS[(op % 4) as usize];
        let own = Span {
            begin: SectionId(b),
            end: SectionId(e),
        };
        (op, span.unwrap_or(own))
    })
}

fn range_command() -> impl Strategy<Value = RangeCommand> {
    // Kinds 4 (Cancel) and 5 (Seal) are rarer: a cancelled op id is spent for good, and a sealed
    // one can no longer be cancelled.
    let kind = prop_oneof![4 => 0u8..4, 1 => Just(4u8), 1 => Just(5u8)];
    (kind, op_and_span(), set_id(), small_or_any(5)).prop_flat_map(|(kind, (op, span), other, v)| match kind {
        0 => Just(RangeCommand::Import {
            op,
            span,
            from_set: other,
        })
        .boxed(),
        1 => Just(RangeCommand::Freeze {
            op,
            span,
            to_set: other,
        })
        .boxed(),
        2 => ceilings(span)
            .prop_map(move |ceilings| RangeCommand::Install { op, span, ceilings })
            .boxed(),
        3 => Just(RangeCommand::Tombstone {
            op,
            span,
            to_set: other,
            map_version: v,
        })
        .boxed(),
        4 => Just(RangeCommand::Cancel { op, span }).boxed(),
        _ => Just(RangeCommand::Seal { op, span }).boxed(),
    })
}

fn map_phase() -> impl Strategy<Value = MapPhase> {
    prop_oneof![
        Just(MapPhase::Recorded),
        Just(MapPhase::Importing),
        Just(MapPhase::Frozen),
        prop::collection::vec(small_or_any(80), 0..6).prop_map(MapPhase::Sealed),
        Just(MapPhase::Installed),
        small_or_any(6).prop_map(|map_version| MapPhase::Switched { map_version }),
        Just(MapPhase::Done),
        Just(MapPhase::Cancelled),
        Just(MapPhase::Cancelling),
    ]
}

fn stores() -> impl Strategy<Value = Vec<String>> {
    let addr = prop_oneof![Just("a:1".to_string()), Just("b:2".to_string()), ".{0,12}"];
    prop::collection::vec(addr, 0..4)
}

fn map_command() -> impl Strategy<Value = MapCommand> {
    let v = || small_or_any(5);
    let driver = || small_or_any(3);
    prop_oneof![
        (v(), set_id(), stores()).prop_map(|(expect_version, set_id, stores)| MapCommand::AddSet {
            expect_version,
            set_id,
            stores
        }),
        (v(), op(), set_id(), set_id(), span(), driver()).prop_map(|(expect_version, op, from, to, span, driver)| {
            MapCommand::Begin {
                expect_version,
                op,
                from,
                to,
                span,
                driver,
            }
        }),
        (op(), driver()).prop_map(|(op, driver)| MapCommand::Claim { op, driver }),
        (op(), driver(), map_phase()).prop_map(|(op, driver, phase)| MapCommand::Advance { op, driver, phase }),
        (op(), driver()).prop_map(|(op, driver)| MapCommand::Finish { op, driver }),
    ]
}

fn released() -> impl Strategy<Value = Released> {
    (span(), epoch(), any::<bool>()).prop_map(|(s, epoch, waited)| Released {
        begin: s.begin,
        end: s.end,
        epoch,
        waited,
    })
}

fn moves() -> impl Strategy<Value = Vec<Move>> {
    let one = (span(), inc(), inc()).prop_map(|(s, from, to)| Move {
        begin: s.begin,
        end: s.end,
        from,
        to,
    });
    prop::collection::vec(one, 0..4)
}

fn bump() -> impl Strategy<Value = Command> {
    let item = (section(), epoch(), small_or_any(80)).prop_map(|(section, epoch, new_max)| BumpItem {
        section,
        epoch,
        new_max,
    });
    (inc(), prop::collection::vec(item, 0..5)).prop_map(|(incarnation, items)| Command::Bump { incarnation, items })
}

/// Who, when and what of an admin action; texts past the field cap too (apply must cut them).
fn audit_note() -> impl Strategy<Value = AuditNote> {
    let text = || prop_oneof![3 => Just("anonymous".to_string()), 1 => ".{0,300}"];
    (text(), any::<u64>(), text()).prop_map(|(who, at_ms, what)| AuditNote { who, at_ms, what })
}

/// A record alone (a membership change's), fields uncut.
fn audit_record() -> impl Strategy<Value = AuditRecord> {
    (audit_note(), ".{0,300}").prop_map(|(n, outcome)| AuditRecord {
        who: n.who,
        at_ms: n.at_ms,
        what: n.what,
        outcome,
    })
}

/// Every command variant: mostly bare, some as audited admin actions (also nested ones, which
/// must be refused), some audit records alone, some bound to one of two secrets (so that a
/// registration's later calls sometimes carry its secret, sometimes the other one, sometimes none).
pub(crate) fn command() -> impl Strategy<Value = Command> {
    let audited = |inner: BoxedStrategy<Command>| {
        (audit_note(), inner).prop_map(|(note, cmd)| Command::Audited {
            note,
            cmd: Box::new(cmd),
        })
    };
    // Boxed: the nested strategy types otherwise overflow a test thread's stack in debug builds.
    let bound = (
        prop_oneof![Just(&b"one"[..]), Just(&b"two"[..])],
        plain_command().boxed(),
    )
        .prop_map(|(secret, cmd)| Command::Bound {
            secret_hash: SecretHash::of(secret),
            cmd: Box::new(cmd),
        })
        .boxed();
    prop_oneof![
        20 => plain_command(),
        6 => bound,
        4 => audited(plain_command().boxed()),
        1 => audited(audit_record().prop_map(Command::Audit).boxed()),
        1 => audit_record().prop_map(Command::Audit),
    ]
}

/// Every command variant but the audit ones, weighted towards the ones that change ownership and
/// ceilings.
fn plain_command() -> impl Strategy<Value = Command> {
    let node = || small_or_any(5).prop_map(NodeId);
    prop_oneof![
        1 => (0..2u64).prop_map(|s| Command::Init(params(s))),
        2 => (node(), ".{0,8}", small_or_any(4)).prop_map(|(node_id, addr, nonce)| Command::Register {
            node_id,
            addr,
            nonce
        }),
        6 => bump(),
        3 => (inc(), prop::collection::vec(released(), 0..4), prop::bool::weighted(0.2))
            .prop_map(|(incarnation, ranges, leaving)| Command::Release { incarnation, ranges, leaving }),
        5 => (prop_oneof![4 => Just(vec![]), 1 => prop::collection::vec(inc(), 1..3)], moves()).prop_map(|(expire, moves)| Command::Assign { expire, moves }),
        5 => range_command().prop_map(Command::Range),
        3 => map_command().prop_map(Command::Map),
        1 => node().prop_map(|node_id| Command::Drain { node_id }),
        1 => (small_or_any(6), prop::collection::vec(any::<u8>(), 0..4))
            .prop_map(|(version, encoded)| Command::CacheMap(CachedMap { version, encoded })),
        4 => slot_command().prop_map(Command::Slots),
    ]
}

/// Worker-slot commands: mostly the one setup both sets accept (4 slots a set), raises around the
/// marks that exist, grants between the incarnations that exist.
fn slot_command() -> impl Strategy<Value = SlotCommand> {
    let slot = || prop_oneof![9 => 0u64..10, 1 => any::<u64>()];
    let setup = (
        prop_oneof![5 => Just(4u64), 1 => 0u64..600],
        prop_oneof![5 => Just(5_000u64), 1 => any::<u64>()],
    )
        .prop_map(|(per_set, max_ahead_ms)| SlotCommand::Setup {
            layout: seqsvr_proto::id_layout::IdLayout::twitter(0),
            per_set,
            max_ahead_ms,
        });
    let grant = prop::collection::vec((slot(), inc(), inc()), 0..3).prop_map(|m| {
        SlotCommand::Grant(
            m.into_iter()
                .map(|(slot, from, to)| SlotMove { slot, from, to })
                .collect(),
        )
    });
    let item = (slot(), epoch(), small_or_any(20_000)).prop_map(|(slot, epoch, mark)| RaiseItem { slot, epoch, mark });
    let raise = (
        inc(),
        prop::collection::vec(item, 0..3),
        small_or_any(20_000),
        any::<bool>(),
    )
        .prop_map(|(holder, items, leader_ms, capped)| match capped {
            true => SlotCommand::RaiseCapped {
                holder,
                items,
                leader_ms,
            },
            false => SlotCommand::Raise {
                holder,
                items,
                leader_ms,
            },
        });
    let release = (inc(), prop::collection::vec((slot(), epoch()), 0..3))
        .prop_map(|(holder, items)| SlotCommand::Release { holder, items });
    prop_oneof![2 => setup, 3 => grant, 5 => raise, 1 => release]
}

/// A sequence to apply: which set to initialize first (none: the set stays uninitialized unless a
/// generated `Init` comes), then the commands.
pub(crate) fn script() -> impl Strategy<Value = (Option<u64>, Vec<Command>)> {
    (
        prop_oneof![1 => Just(None), 6 => Just(Some(0)), 3 => Just(Some(1))],
        prop::collection::vec(command(), 1..=MAX_STEPS),
    )
}

// ---- The invariants ----

/// Everything that must hold across one applied command (`before` → `after`, with its `result`).
pub(crate) fn check_step(
    before: &SetState,
    after: &SetState,
    cmd: &Command,
    result: &CommandResult,
) -> Result<(), String> {
    check_audit(before, after, cmd, result)?;
    check_binding(before, after, cmd, result)?;
    let (cmd, after) = action_of(before, after, cmd);
    let after = after.as_ref();
    check_sections(before, after)?;
    check_registry(before, after)?;
    check_ranges(after)?;
    check_versions(before, after)?;
    check_refusals(before, after, cmd, result)?;
    check_slots(before, after, cmd)?;
    check_bumps(before, after, cmd, result)
}

/// Time-ordered ids: a setup never changes once made; per slot the epoch and the mark never go
/// down; a mark rises only by a raise of the slot's holder under its current epoch, and never past
/// the leader's clock plus the allowance; every holder is a registered incarnation.
fn check_slots(before: &SetState, after: &SetState, cmd: &Command) -> Result<(), String> {
    let Some(a) = &after.ids else {
        return match &before.ids {
            Some(_) => Err("the id setup was lost".into()),
            None => Ok(()),
        };
    };
    if let Some(b) = &before.ids
        && (b.layout, b.per_set, b.max_ahead_ms, b.first, b.slots.len())
            != (a.layout, a.per_set, a.max_ahead_ms, a.first, a.slots.len())
    {
        return Err(format!("the id setup changed: {b:?} -> {a:?}"));
    }
    for (slot, s) in a.iter() {
        if s.holder != NOBODY && !after.allocsvrs.contains_key(&s.holder) {
            return Err(format!("slot {slot} held by {}, which is not registered", s.holder));
        }
        let Some(old) = before.ids.as_ref().and_then(|b| b.get(slot)) else {
            continue;
        };
        if s.epoch < old.epoch || s.mark < old.mark {
            return Err(format!("slot {slot} went back: {old:?} -> {s:?}"));
        }
        if s.mark > old.mark {
            let raised_by = |holder: &Incarnation, items: &[RaiseItem], leader_ms: u64, capped: bool| {
                let limit = a.raise_limit(leader_ms);
                items.iter().any(|i| {
                    let target = if capped { i.mark.min(limit) } else { i.mark };
                    i.slot == slot
                        && *holder == old.holder
                        && i.epoch == old.epoch
                        && target == s.mark
                        && i.mark.min(limit) == target
                })
            };
            let fenced = match cmd {
                Command::Slots(SlotCommand::Raise {
                    holder,
                    items,
                    leader_ms,
                }) => raised_by(holder, items, *leader_ms, false),
                Command::Slots(SlotCommand::RaiseCapped {
                    holder,
                    items,
                    leader_ms,
                }) => raised_by(holder, items, *leader_ms, true),
                _ => false,
            };
            if !fenced {
                return Err(format!("slot {slot}'s mark rose {} -> {} by {cmd:?}", old.mark, s.mark));
            }
        }
    }
    Ok(())
}

/// Whether applying `cmd` to `before` must append one audit record: an audited action that holds
/// no audit command, or a record alone, on an initialized set.
fn records(before: &SetState, cmd: &Command) -> bool {
    let recording = match cmd {
        Command::Audited { cmd, .. } => !matches!(**cmd, Command::Audited { .. } | Command::Audit(_)),
        Command::Audit(_) => true,
        _ => false,
    };
    recording && before.params.is_some()
}

/// The audit trail: exactly one record more after an admin action (its note, the outcome of its
/// result, fields within the cap), none after anything else; never above the bound; numbers only
/// grow.
fn check_audit(before: &SetState, after: &SetState, cmd: &Command, result: &CommandResult) -> Result<(), String> {
    let (b, a) = (&before.audit, &after.audit);
    if a.len() > MAX_AUDIT_RECORDS || a.dropped() < b.dropped() || a.last() < b.last() {
        return Err(format!(
            "the audit trail went back or past its bound: {} kept, last {}",
            a.len(),
            a.last()
        ));
    }
    if !records(before, cmd) {
        return if a == b {
            Ok(())
        } else {
            Err("a command that is no admin action touched the audit trail".into())
        };
    }
    if a.last() != b.last() + 1 {
        return Err(format!("an admin action made {} audit records", a.last() - b.last()));
    }
    let Some(&(_, newest)) = a.page(0, 1, true).first() else {
        return Err("an admin action left the audit trail empty".into());
    };
    if [&newest.who, &newest.what, &newest.outcome]
        .iter()
        .any(|f| f.len() > MAX_AUDIT_FIELD_BYTES)
    {
        return Err(format!("an audit field is above the cap: {newest:?}"));
    }
    let want = match cmd {
        Command::Audited { note, .. } => AuditRecord::new(note, &command::outcome(result)),
        Command::Audit(r) => AuditRecord::new(
            &AuditNote {
                who: r.who.clone(),
                at_ms: r.at_ms,
                what: r.what.clone(),
            },
            &r.outcome,
        ),
        _ => unreachable!("records() holds"),
    };
    if *newest != want {
        return Err(format!("audit record {newest:?}, expected {want:?}"));
    }
    Ok(())
}

/// What the other checks judge: the action an audited command applied, with the trail (checked
/// by `check_audit`) as it was before, so that a refused or repeated action still reads as
/// "nothing changed".
fn action_of<'a>(before: &SetState, after: &'a SetState, cmd: &'a Command) -> (&'a Command, Cow<'a, SetState>) {
    if let Command::Bound { cmd: inner, .. } = cmd {
        return (inner.as_ref(), Cow::Borrowed(after));
    }
    if !records(before, cmd) {
        return (cmd, Cow::Borrowed(after));
    }
    let mut rest = after.clone();
    rest.audit = before.audit.clone();
    match cmd {
        Command::Audited { cmd: inner, .. } => (inner.as_ref(), Cow::Owned(rest)),
        _ => (cmd, Cow::Owned(rest)),
    }
}

/// P3 and the epoch fence: per section, `max_seq` and the epoch never go down, and an owner change
/// always raises the epoch (a stale owner's bumps and releases then miss); the route version rises
/// with every owner change (AllocSvrs and clients learn of it by that version).
fn check_sections(before: &SetState, after: &SetState) -> Result<(), String> {
    if before.params.is_some() && before.sections.len() != after.sections.len() {
        return Err(format!(
            "{} sections became {}",
            before.sections.len(),
            after.sections.len()
        ));
    }
    let mut owner_changed = false;
    for (i, (b, a)) in before.sections.iter().zip(&after.sections).enumerate() {
        if a.max_seq < b.max_seq {
            return Err(format!("P3: section {i} max_seq {} -> {}", b.max_seq, a.max_seq));
        }
        if a.epoch < b.epoch {
            return Err(format!("section {i} epoch {} -> {}", b.epoch.0, a.epoch.0));
        }
        if a.owner != b.owner {
            owner_changed = true;
            if a.epoch <= b.epoch {
                return Err(format!(
                    "section {i} owner {} -> {} without a new epoch ({})",
                    b.owner.0, a.owner.0, a.epoch.0
                ));
            }
        }
    }
    if owner_changed && after.route_version <= before.route_version {
        return Err(format!(
            "owners changed but route_version stayed {}",
            after.route_version
        ));
    }
    Ok(())
}

/// Incarnations are minted in order and never reused; one live incarnation per node; a section's
/// owner is one that was minted. (It need not be live: an expired or superseded owner keeps its
/// sections until the arbiter moves them, and its bumps are refused as UnknownIncarnation.)
/// The binding: a Bump or Release of a bound incarnation without the hash it registered with is
/// refused and changes nothing; a call that carries it, or of an unbound incarnation, is never
/// refused for it; only live incarnations keep a hash, and a hash never changes.
fn check_binding(before: &SetState, after: &SetState, cmd: &Command, result: &CommandResult) -> Result<(), String> {
    let (inner, presented) = match cmd {
        Command::Bound { secret_hash, cmd } => (cmd.as_ref(), Some(secret_hash)),
        cmd => (cmd, None),
    };
    if let Command::Bump { incarnation, .. } | Command::Release { incarnation, .. } = inner
        && before.params.is_some()
    {
        let refused = before.bindings.check(*incarnation, presented) == Verdict::Refused;
        if refused != (*result == CommandResult::NotBound) {
            return Err(format!("binding verdict refused={refused}, result {result:?}"));
        }
    }
    let live = after.allocsvrs.keys().all(|i| {
        let kept = after.bindings.check(*i, None) != Verdict::Unbound;
        let was = before.bindings.check(*i, None) != Verdict::Unbound;
        !was || kept
    });
    if after.bindings.len() > after.allocsvrs.len() || !live {
        return Err(format!(
            "{} hashes for {} live incarnations, or a live one lost its hash",
            after.bindings.len(),
            after.allocsvrs.len()
        ));
    }
    Ok(())
}

fn check_registry(before: &SetState, after: &SetState) -> Result<(), String> {
    if after.last_incarnation < before.last_incarnation {
        return Err("last_incarnation went down".into());
    }
    let mut nodes = std::collections::BTreeSet::new();
    for (k, r) in &after.allocsvrs {
        if *k != r.incarnation || *k > after.last_incarnation || *k == NOBODY {
            return Err(format!(
                "registry entry {k:?} -> {r:?} (last {:?})",
                after.last_incarnation
            ));
        }
        if !nodes.insert(r.node_id) {
            return Err(format!("node {:?} has two live incarnations", r.node_id));
        }
    }
    match after.sections.iter().position(|s| s.owner > after.last_incarnation) {
        Some(i) => Err(format!(
            "section {i} owned by never-minted {:?}",
            after.sections[i].owner
        )),
        None => Ok(()),
    }
}

/// The range table is a partition: runs ordered, non-empty, disjoint, inside the section space
/// and merged (so each section has exactly one state or none); an owner only on owned or frozen
/// sections; every importing or frozen run belongs to a started move of this set in that role.
fn check_ranges(st: &SetState) -> Result<(), String> {
    let total = st.sections.len() as u64;
    let mut prev: Option<super::ranges::RangeRun> = None;
    for run in st.ranges.runs() {
        if run.begin >= run.end || run.end.0 > total {
            return Err(format!("bad run {run:?} (total {total})"));
        }
        if let Some(p) = prev
            && (run.begin < p.end || (run.begin == p.end && run.state == p.state))
        {
            return Err(format!("runs {p:?} and {run:?} overlap or are not merged"));
        }
        prev = Some(run);
        let m = |op| st.moves.get(&op).map(|m| (m.role, m.phase, m.span));
        let ok = match run.state {
            RangeState::Owned => true,
            RangeState::Importing { op } => {
                matches!(m(op), Some((Role::Import { .. }, SidePhase::Started, _)))
            }
            RangeState::Migrating { op, to_set } => {
                matches!(m(op), Some((Role::Export { to_set: t }, SidePhase::Started | SidePhase::Sealed, _)) if t == to_set)
            }
            RangeState::Tombstoned { op, to_set, .. } => {
                matches!(m(op), Some((Role::Export { to_set: t }, SidePhase::Done, _)) if t == to_set)
            }
        };
        if !ok {
            return Err(format!("run {run:?} but its move is {:?}", m(run_op(run.state))));
        }
    }
    for (i, s) in st.sections.iter().enumerate() {
        let state = st.ranges.state_at(SectionId(i as u64));
        let may_own = matches!(state, Some(RangeState::Owned | RangeState::Migrating { .. }));
        if s.owner != NOBODY && !may_own {
            return Err(format!("section {i} is {state:?} but owned by {:?}", s.owner));
        }
    }
    Ok(())
}

fn run_op(state: RangeState) -> u64 {
    match state {
        RangeState::Owned => 0,
        RangeState::Importing { op } | RangeState::Migrating { op, .. } | RangeState::Tombstoned { op, .. } => op,
    }
}

/// Versions only rise: routes, the authoritative map, the cached copy. Parameters never change
/// once set.
fn check_versions(before: &SetState, after: &SetState) -> Result<(), String> {
    let map_v = |s: &SetState| s.map.as_ref().map(|m| m.version);
    let cached_v = |s: &SetState| s.cached_map.as_ref().map_or(0, |c| c.version);
    if after.route_version < before.route_version || map_v(after) < map_v(before) || cached_v(after) < cached_v(before)
    {
        return Err("a version went down".into());
    }
    if before.params.is_some() && after.params != before.params {
        return Err("the parameters changed after Init".into());
    }
    Ok(())
}

/// A command that was refused, found nothing to do or was a repeat changes nothing; commands on an
/// uninitialized set and commands naming sections outside the section space are refused.
fn check_refusals(before: &SetState, after: &SetState, cmd: &Command, result: &CommandResult) -> Result<(), String> {
    use CommandResult as R;
    let uninitialized = before.params.is_none() && !matches!(cmd, Command::Init(_));
    let outside = match cmd {
        Command::Bump { incarnation, items } => {
            before.allocsvrs.contains_key(incarnation) && items.iter().any(|i| i.section.0 >= TOTAL)
        }
        Command::Range(step) => {
            let s = step.span();
            before.params.is_some() && (s.begin >= s.end || s.end.0 > TOTAL)
        }
        _ => false,
    };
    // A bound incarnation's call without its secret is refused before its sections are looked at.
    if (uninitialized || outside) && !matches!(result, R::Invalid(_) | R::NotBound) {
        return Err(format!("expected Invalid, got {result:?}"));
    }
    let nothing = match result {
        R::Invalid(m) | R::Refused(m) => {
            if m.is_empty() {
                return Err("a refusal without a reason".into());
            }
            true
        }
        R::UnknownIncarnation
        | R::NotBound
        | R::Initialized { fresh: false }
        | R::Stepped { already: true }
        | R::MapCached { already: true, .. }
        | R::Draining { incarnation: None }
        | R::Map(MapResult::Refused(_) | MapResult::VersionChanged { .. } | MapResult::Ok { already: true, .. }) => {
            true
        }
        R::Released { count: 0 } => !matches!(cmd, Command::Release { leaving: true, .. }),
        R::Assigned { moved: 0, .. } => matches!(cmd, Command::Assign { expire, .. } if expire.is_empty()),
        _ => false,
    };
    if nothing && after != before {
        return Err(format!("{result:?} but the state changed"));
    }
    Ok(())
}

/// P3/P4 at the store: a ceiling rises only through an applied bump item, by its current owner
/// under its current epoch on an owned section, at most MAX_BUMP_STEPS steps up, or through an
/// install (max of both sides); a section is granted only to a live incarnation.
fn check_bumps(before: &SetState, after: &SetState, cmd: &Command, result: &CommandResult) -> Result<(), String> {
    let mut raised = vec![false; after.sections.len()];
    if let (Command::Bump { incarnation, items }, CommandResult::Bumped(results)) = (cmd, result) {
        if results.len() != items.len() {
            return Err(format!("{} results for {} items", results.len(), items.len()));
        }
        let step = before.params.as_ref().map_or(0, |p| p.step);
        let mut ceiling: Vec<u64> = before.sections.iter().map(|s| s.max_seq).collect();
        for (item, r) in items.iter().zip(results) {
            let i = item.section.0 as usize;
            let b = &before.sections[i];
            if r.outcome == BumpOutcome::Applied {
                let fenced = b.owner == *incarnation && b.epoch == item.epoch && before.ranges.is_owned(item.section);
                let bounded = item.new_max > ceiling[i] && item.new_max <= ceiling[i] + MAX_BUMP_STEPS * step;
                if !fenced || !bounded {
                    return Err(format!("bump {item:?} applied over {b:?} (ceiling {})", ceiling[i]));
                }
                ceiling[i] = item.new_max;
                raised[i] = true;
            }
            if r.max_seq != ceiling[i] || r.epoch != b.epoch {
                return Err(format!(
                    "result {r:?} but the section is at {} epoch {:?}",
                    ceiling[i], b.epoch
                ));
            }
        }
    }
    let install = matches!(cmd, Command::Range(RangeCommand::Install { .. }));
    for (i, (b, a)) in before.sections.iter().zip(&after.sections).enumerate() {
        if a.max_seq != b.max_seq && !raised[i] && !install {
            return Err(format!("section {i} max_seq {} -> {} by {cmd:?}", b.max_seq, a.max_seq));
        }
        if a.owner != b.owner && a.owner != NOBODY && !after.allocsvrs.contains_key(&a.owner) {
            return Err(format!("section {i} granted to {:?}, which is not live", a.owner));
        }
    }
    Ok(())
}

/// Applying the same command again right away changes nothing (a retry after a lost reply): every
/// command but a Register without a nonce (nonce 0 = a new process each time), which mints a new
/// incarnation on purpose, and an Assign whose moves overlap (one move's target is another's
/// source, so a second pass moves on: a chain the arbiter never plans, as it names each section
/// once, from its current owner), and a Bump naming one section twice (an item refused as out of
/// range may pass once a later item raised the ceiling; an AllocSvr names each section once). A
/// repeated range step answers `Stepped { already: true }` and a
/// retried Register gets the same incarnation.
pub(crate) fn check_repeat(after: &SetState, cmd: &Command, first: &CommandResult) -> Result<(), String> {
    let action = match cmd {
        Command::Audited { cmd, .. } | Command::Bound { cmd, .. } => cmd.as_ref(),
        cmd => cmd,
    };
    match action {
        Command::Register { nonce: 0, .. } => return Ok(()),
        Command::Assign { moves, .. } if overlapping(moves) => return Ok(()),
        Command::Bump { items, .. } if repeats_a_section(items) => return Ok(()),
        _ => {}
    }
    let mut again = after.clone();
    let second = again.apply(cmd, false);
    // A repeated admin action is recorded again, on purpose (check_audit checked the record).
    if records(after, cmd) {
        again.audit = after.audit.clone();
    }
    if again != *after {
        return Err(format!(
            "repeating {cmd:?} (first {first:?}, then {second:?}) changed the state"
        ));
    }
    let ok = match (first, &second) {
        (CommandResult::Stepped { .. }, CommandResult::Stepped { already }) => *already,
        (CommandResult::Stepped { .. }, _) => false,
        (CommandResult::Registered { incarnation: a }, CommandResult::Registered { incarnation: b }) => a == b,
        (CommandResult::Registered { .. }, _) => false,
        _ => true,
    };
    if !ok {
        return Err(format!("repeating {cmd:?}: first {first:?}, then {second:?}"));
    }
    Ok(())
}

/// Whether two items of a bump name the same section.
fn repeats_a_section(items: &[BumpItem]) -> bool {
    let mut seen = std::collections::BTreeSet::new();
    !items.iter().all(|i| seen.insert(i.section))
}

/// Whether two moves name a common section.
fn overlapping(moves: &[Move]) -> bool {
    moves.iter().enumerate().any(|(i, a)| {
        moves[i + 1..]
            .iter()
            .any(|b| a.begin < b.end && b.begin < a.end && a.begin < a.end && b.begin < b.end)
    })
}

// ---- Symbolic values ----
//
// Commands are generated without looking at the state (so that proptest can shrink them), but
// literal incarnations and epochs would almost never match the ones a random history minted: bumps
// would all be UnknownIncarnation and the arbiter's moves would find no section to move. So small
// generated values are symbolic and resolved against the state each command is applied to; large
// ones stay literal. Resolution is deterministic, so a script still names one exact history.

/// Incarnation `1..=5`: a live one (cycling); `6..=8`: a recent one, live or not; else literal.
fn incarnation_in(st: &SetState, i: Incarnation) -> Incarnation {
    let live: Vec<Incarnation> = st.allocsvrs.keys().copied().collect();
    match i.0 {
        k @ 1..=5 if !live.is_empty() => live[(k as usize - 1) % live.len()],
        k @ 1..=8 => Incarnation(st.last_incarnation.0.saturating_sub(k.saturating_sub(5))),
        _ => i,
    }
}

/// Epoch `0..=4`: the section's own; 5: one below; 6: one above; 7: zero; else literal.
fn epoch_near(st: &SetState, section: SectionId, e: Epoch) -> Epoch {
    let Some(s) = st.sections.get(section.0 as usize) else {
        return e;
    };
    match e.0 {
        0..=4 => s.epoch,
        5 => Epoch(s.epoch.0.saturating_sub(1)),
        6 => Epoch(s.epoch.0 + 1),
        7 => Epoch(0),
        _ => e,
    }
}

/// A bump target below 80 is relative: from one step under the ceiling to seven steps over it
/// (the bound is four).
fn max_near(st: &SetState, section: SectionId, v: u64) -> u64 {
    match (st.sections.get(section.0 as usize), &st.params) {
        (Some(s), Some(p)) if v < 80 => s.max_seq.saturating_add(v).saturating_sub(p.step),
        _ => v,
    }
}

/// Incarnation `1..=3`: whoever owns `section` now (the owner bumping or releasing it, or what the
/// arbiter would name as a move's source); otherwise as [`incarnation_in`].
fn owner_or_incarnation(st: &SetState, section: Option<SectionId>, i: Incarnation) -> Incarnation {
    match (i.0, section.and_then(|s| st.sections.get(s.0 as usize))) {
        (1..=3, Some(s)) if s.owner != NOBODY => s.owner,
        _ => incarnation_in(st, i),
    }
}

/// The command with its symbolic values resolved against `st`.
pub(crate) fn resolve(cmd: &Command, st: &SetState) -> Command {
    let mut cmd = cmd.clone();
    match &mut cmd {
        Command::Bump { incarnation, items } => {
            *incarnation = owner_or_incarnation(st, items.first().map(|i| i.section), *incarnation);
            for i in items {
                i.epoch = epoch_near(st, i.section, i.epoch);
                i.new_max = max_near(st, i.section, i.new_max);
            }
        }
        Command::Release {
            incarnation, ranges, ..
        } => {
            *incarnation = owner_or_incarnation(st, ranges.first().map(|r| r.begin), *incarnation);
            for r in ranges {
                r.epoch = epoch_near(st, r.begin, r.epoch);
            }
        }
        Command::Audited { cmd: inner, .. } => **inner = resolve(inner, st),
        Command::Assign { expire, moves } => {
            for e in expire {
                *e = incarnation_in(st, *e);
            }
            for m in moves {
                m.to = incarnation_in(st, m.to);
                // 1..=3: whoever owns the first section now (what the arbiter would name).
                // 1..=3: whoever owns the first section now, nobody included (what the arbiter
                // names as a move's source).
                m.from = match (m.from.0, st.sections.get(m.begin.0 as usize)) {
                    (1..=3, Some(s)) => s.owner,
                    _ => incarnation_in(st, m.from),
                };
            }
        }
        _ => {}
    }
    cmd
}

/// Applies `script` to a fresh state, checking every step; the final state.
pub(crate) fn run_checked(init: Option<u64>, cmds: &[Command]) -> Result<SetState, String> {
    run_checked_with(init, cmds, UnsafeRules::default())
}

/// [`run_checked`] under `rules` (the negative controls: the checker must catch them).
fn run_checked_with(init: Option<u64>, cmds: &[Command], rules: UnsafeRules) -> Result<SetState, String> {
    let mut st = SetState::default();
    if let Some(set) = init {
        st.apply(&Command::Init(params(set)), false);
    }
    for (n, cmd) in cmds.iter().enumerate() {
        let before = st.clone();
        let cmd = &resolve(cmd, &st);
        let result = st.apply_with(cmd, rules);
        check_step(&before, &st, cmd, &result)
            .and_then(|()| check_repeat(&st, cmd, &result))
            .map_err(|e| format!("step {n}: {cmd:?} -> {result:?}: {e}"))?;
    }
    Ok(st)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CI_CASES, ..ProptestConfig::default() })]

    /// Every invariant after every step, never a panic (apply runs on every replica: a panic
    /// there stops the whole set).
    #[test]
    fn random_command_sequences_keep_every_invariant_after_every_step((init, cmds) in script()) {
        if let Err(e) = run_checked(init, &cmds) {
            prop_assert!(false, "{}", e);
        }
    }

    /// An uninitialized set refuses everything but Init, and changes nothing.
    #[test]
    fn an_uninitialized_set_refuses_every_command_but_init(cmds in prop::collection::vec(command(), 1..50)) {
        let mut st = SetState::default();
        for cmd in cmds.iter().filter(|c| !matches!(c, Command::Init(_))) {
            let r = st.apply(cmd, false);
            prop_assert!(matches!(r, CommandResult::Invalid(_)), "{:?} -> {:?}", cmd, r);
            prop_assert_eq!(&st, &SetState::default());
        }
    }
}

proptest! {
    // Half the cases: the property is cheap to hold and each case runs the script twice.
    #![proptest_config(ProptestConfig { cases: CI_CASES / 2, ..ProptestConfig::default() })]

    /// Replicas that apply the same log reach the same state, and a snapshot of it (postcard, as
    /// the state machine store writes it) reads back as the same state.
    #[test]
    fn the_same_sequence_gives_the_same_state_and_snapshot((init, cmds) in script()) {
        let run = || {
            let mut st = SetState::default();
            if let Some(set) = init {
                st.apply(&Command::Init(params(set)), false);
            }
            let results: Vec<CommandResult> = cmds.iter().map(|c| st.apply(&resolve(c, &st), false)).collect();
            (st, results)
        };
        let (a, ra) = run();
        let (b, rb) = run();
        prop_assert_eq!(&ra, &rb);
        prop_assert_eq!(&a, &b);
        let bytes = postcard::to_stdvec(&a).unwrap();
        prop_assert_eq!(&bytes, &postcard::to_stdvec(&b).unwrap());
        // As a snapshot is read: a SHA-256 key placement is not written.
        prop_assert_eq!(crate::storage::sm_store::decode_padded::<SetState>(&bytes).unwrap(), a);
    }
}

/// The checker must be able to fail: each broken transition below is one a bug could make.
mod the_checker {
    use super::*;

    /// Set 0 with one live incarnation owning sections 0..8 under epoch 1.
    fn owned() -> (SetState, Incarnation) {
        let mut st = SetState::default();
        st.apply(&Command::Init(params(0)), false);
        let CommandResult::Registered { incarnation } = st.apply(
            &Command::Register {
                node_id: NodeId(1),
                addr: "a:1".into(),
                nonce: 7,
            },
            false,
        ) else {
            panic!("register")
        };
        let moves = vec![Move {
            begin: SectionId(0),
            end: SectionId(8),
            from: NOBODY,
            to: incarnation,
        }];
        st.apply(&Command::Assign { expire: vec![], moves }, false);
        (st, incarnation)
    }

    fn drain() -> Command {
        Command::Drain { node_id: NodeId(9) }
    }

    /// `break_it` turns a correct after-state into a broken one; the checker must say so.
    fn caught(break_it: impl Fn(&mut SetState)) -> String {
        let (before, _) = owned();
        let mut after = before.clone();
        break_it(&mut after);
        let result = CommandResult::Draining { incarnation: None };
        check_step(&before, &after, &drain(), &result).expect_err("the checker missed a broken state")
    }

    #[test]
    fn catches_a_ceiling_that_goes_down() {
        let (mut st, inc) = owned();
        let bump = Command::Bump {
            incarnation: inc,
            items: vec![BumpItem {
                section: SectionId(2),
                epoch: Epoch(1),
                new_max: 10,
            }],
        };
        st.apply(&bump, false);
        let mut lower = st.clone();
        lower.sections[2].max_seq = 9;
        let e = check_step(&st, &lower, &drain(), &CommandResult::Draining { incarnation: None }).unwrap_err();
        assert!(e.contains("P3"), "{e}");
    }

    #[test]
    fn catches_an_owner_change_without_a_new_epoch() {
        let e = caught(|s| {
            s.sections[1].owner = NOBODY;
            s.route_version += 1;
        });
        assert!(e.contains("without a new epoch"), "{e}");
    }

    #[test]
    fn catches_an_owner_on_a_section_the_set_does_not_have() {
        let e = caught(|s| {
            s.sections[10].owner = Incarnation(1);
            s.sections[10].epoch = Epoch(1);
            s.route_version += 1;
        });
        assert!(e.contains("owned by"), "{e}");
    }

    #[test]
    fn catches_a_grant_to_an_incarnation_that_is_not_live() {
        let (mut before, inc) = owned();
        before.sections[3].owner = NOBODY;
        let mut after = before.clone();
        after.allocsvrs.clear();
        after.sections[3].owner = inc;
        after.sections[3].epoch = Epoch(2);
        after.route_version += 1;
        let assign = Command::Assign {
            expire: vec![inc],
            moves: vec![],
        };
        let result = CommandResult::Assigned {
            moved: 1,
            route_version: after.route_version,
        };
        let e = check_step(&before, &after, &assign, &result).unwrap_err();
        assert!(e.contains("not live"), "{e}");
    }

    /// The whole property, not just the checker: with the epoch fence switched off (the
    /// `--unsafe-skip-epoch-fence` negative control) random sequences must fail it.
    #[test]
    fn the_property_catches_the_store_without_its_epoch_fence() {
        let rules = UnsafeRules {
            skip_epoch_fence: true,
            ..UnsafeRules::default()
        };
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(CI_CASES));
        let outcome = runner.run(&script(), |(init, cmds)| {
            run_checked_with(init, &cmds, rules)
                .map(|_| ())
                .map_err(TestCaseError::fail)
        });
        assert!(outcome.is_err(), "no sequence caught a bump applied outside the fence");
    }

    #[test]
    fn catches_an_admin_action_without_its_record_or_with_another() {
        let (before, _) = owned();
        let cmd = command::wrap("CN=ops", 5, drain());
        let mut after = before.clone();
        let result = after.apply(&cmd, false);
        assert_eq!(check_step(&before, &after, &cmd, &result), Ok(()));
        let e = check_step(&before, &before, &cmd, &result).unwrap_err();
        assert!(e.contains("made 0 audit records"), "{e}");
        let mut forged = before.clone();
        forged.apply(&command::wrap("CN=mallory", 5, drain()), false);
        let e = check_step(&before, &forged, &cmd, &result).unwrap_err();
        assert!(e.contains("expected"), "{e}");
        let e = check_step(&before, &after, &drain(), &result).unwrap_err();
        assert!(e.contains("touched the audit trail"), "{e}");
    }

    #[test]
    fn catches_a_refusal_that_changed_something() {
        let (before, inc) = owned();
        let mut after = before.clone();
        after.sections[0].max_seq = 5;
        let bump = Command::Bump {
            incarnation: inc,
            items: vec![],
        };
        let e = check_step(&before, &after, &bump, &CommandResult::Refused("no".into())).unwrap_err();
        assert!(e.contains("state changed") || e.contains("max_seq"), "{e}");
    }

    #[test]
    fn catches_a_bump_applied_under_a_stale_epoch() {
        let (before, inc) = owned();
        let item = BumpItem {
            section: SectionId(3),
            epoch: Epoch(0),
            new_max: 10,
        };
        let mut after = before.clone();
        after.sections[3].max_seq = 10;
        let result = CommandResult::Bumped(vec![BumpResult {
            section: SectionId(3),
            outcome: BumpOutcome::Applied,
            max_seq: 10,
            epoch: Epoch(1),
        }]);
        let bump = Command::Bump {
            incarnation: inc,
            items: vec![item],
        };
        let e = check_step(&before, &after, &bump, &result).unwrap_err();
        assert!(e.contains("applied over"), "{e}");
    }

    #[test]
    fn catches_unmerged_range_runs_and_a_non_idempotent_retry() {
        let (st, _) = owned();
        assert!(check_ranges(&st).is_ok());
        // A Register with nonce 0 mints a new incarnation each time: as a "retry" it must fail.
        let reg = Command::Register {
            node_id: NodeId(2),
            addr: "b:2".into(),
            nonce: 0,
        };
        let mut after = st.clone();
        let r = after.apply(&reg, false);
        let as_retry = Command::Register {
            node_id: NodeId(2),
            addr: "b:2".into(),
            nonce: 0,
        };
        assert!(check_repeat(&after, &as_retry, &r).is_ok(), "nonce 0 is exempt");
        let mut rogue = after.clone();
        rogue.last_incarnation = Incarnation(0);
        assert!(check_registry(&after, &rogue).is_err(), "last_incarnation went down");
    }
}
