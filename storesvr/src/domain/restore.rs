//! Restoring a set from a backup: the margin and what it does to the backed-up state. Pure: the
//! caller hands in the state, the margin and the new replica's id (`crate::restore` reads the file
//! and writes the data dir).
//!
//! **Why every ceiling is raised.** A backup is a copy of the set at one log index. The set went on
//! serving after it: every Bump committed after the backup let an AllocSvr hand out numbers above
//! the backed-up `max_seq`, up to the ceiling the set had when it died. Those numbers are gone from
//! the backup, not from the world. A set restored with the backed-up ceilings would load them,
//! start every uid there and hand out numbers that were already served: P1 broken. Only a margin
//! at least as large as the growth of a section's ceiling since the backup keeps P1, because then
//! `backed-up max_seq + margin >= every number ever served`, and a new owner serves strictly above
//! the ceiling it loads. Nobody can measure that growth after the fact (the set is gone), so the
//! operator bounds it: a number of steps they know is enough, or a bound on bumps per second
//! times the backup's age ([`choose_margin`]). Too large a margin only skips numbers (P6's waste);
//! too small a one repeats them. docs/BACKUP.md says how to choose.
//!
//! **What else changes, and why.**
//! - Every section loses its owner and its epoch jumps by [`VERSION_GAP`], with `no_wait` off: no
//!   AllocSvr continues a lease from the old set, and the first owner of the new set waits out a
//!   lease (rule 4) in case an AllocSvr of the old set still serves from memory. The jump, not one
//!   more: the old set may have granted epochs after the backup, and a restored set that repeated
//!   one would tag its replies with an epoch an older owner of the lost set already showed, so
//!   whoever orders owners by epoch (an operator reading replies, the simulator's one-owner check)
//!   could not tell the new owner from the stale one.
//! - The AllocSvr registry is emptied and the incarnation counter jumps by [`VERSION_GAP`]: the
//!   old set may have minted incarnations after the backup, and one of them presented to the new
//!   set must never match a fresh registration (P4).
//! - The route version jumps by [`VERSION_GAP`]: clients keep only route tables newer than the one
//!   they hold, and they may hold one the old set issued after the backup.
//! - A backup taken while a move had a range importing or frozen is refused: the move went on (or
//!   was cancelled) after it, and the restored set cannot know which side the range ended on.
//! - A backup is checked against the live cluster map ([`check_against_map`]): a range the backup
//!   owns that a later move gave away would be served by two sets (duplicates); a range a later
//!   move brought in would be served by none, for good. Either is refused, naming the move. On set
//!   0, the map inside the backup must also still place every section where the live map does.
//! - On set 0 the map's version jumps by [`VERSION_GAP`] too: every holder of a copy takes only
//!   newer maps, and it may hold one issued after the backup.
//!
//! - Every ledger is marked restored: its reserves are refused until an operator reconciles it
//!   (`seqctl ledger reconcile KEY --next N`, N above every number their records show), which
//!   voids the numbers the backup lacks as lost with the restore. Confirms and releases of the
//!   numbers the backup holds go on at once.
//!
//! Left out: the move records are restored as they were (the ranges are checked, the history of
//! moves between other sets is not needed to serve), and the map's check needs a live copy of the
//! map; without one the operator must say so (`--unsafe-skip-map-check`).

use std::time::Duration;

use seqsvr_proto::{Epoch, Incarnation, NodeId, SectionId};
use thiserror::Error;

use super::ranges::{RangeRun, RangeState};
use super::section::NOBODY;
use super::slots::{self, IdState, SlotCommand};
use super::state::{MAX_BUMP_STEPS, SetState};

/// How far the route version and the incarnation counter jump on a restore: more than any set
/// can issue between a backup and its restore (one a millisecond for 136 years), and still 2^32
/// restores before the `u64` runs out.
pub const VERSION_GAP: u64 = 1 << 32;

/// How the operator bounds the ceiling growth since the backup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MarginArgs {
    /// Steps every section may have grown by since the backup.
    pub steps: Option<u64>,
    /// Most bumps one section can have committed per second since the backup.
    pub max_bumps_per_sec: Option<u64>,
}

/// The margin chosen and how it was derived, for the operator's report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Margin {
    pub seqs: u64,
    pub why: String,
}

/// Why a backup cannot be restored as asked.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RestoreError {
    #[error(
        "no margin given: pass --margin-steps N and/or --max-bumps-per-sec R (see docs/BACKUP.md, \
         \"Choosing the margin\")"
    )]
    NoMargin,
    #[error("the margin does not fit in 64 bits ({0})")]
    MarginOverflow(String),
    #[error(
        "the backup was taken {ahead_ms} ms after this machine's clock says it is now: its age is unknown, so \
         --max-bumps-per-sec cannot bound the growth since; give --margin-steps"
    )]
    BackupFromTheFuture { ahead_ms: u64 },
    #[error("the backup holds a set that was never initialized: nothing to restore")]
    NotInitialized,
    #[error(
        "section {section}: max_seq {max_seq} + margin {margin} passes 2^64-1; choose a smaller margin \
         (the section cannot be raised that far)"
    )]
    Overflow { section: u64, max_seq: u64, margin: u64 },
    #[error(
        "the backup was taken while move {op} had sections {begin}..{end} {what}: the move went on after the \
         backup, so the restored set cannot know where the range ended up; restore a backup taken before the \
         move began or after it ended"
    )]
    MoveInFlight {
        op: u64,
        begin: u64,
        end: u64,
        what: &'static str,
    },
    #[error("node id {0} was a member of the backed-up set: give the restored replica a node id never used")]
    NodeIdUsed(u64),
    #[error(
        "this host's clock reads {now_ms} ms since the Unix epoch, {behind_ms} ms before the backup was taken \
         ({taken_at_ms}): the clock is wrong, and a restore raises the slot marks of time-ordered ids from it \
         (and set 0 sets them up from it); set the clock right (NTP) and restore again"
    )]
    ClockBeforeBackup {
        now_ms: u64,
        taken_at_ms: u64,
        behind_ms: u64,
    },
    #[error(
        "the live cluster map sets time-ordered ids up as {live}, but the backup holds {backup}: a set restored \
         so would issue under another layout or slot share than the other sets (duplicate ids); restore a \
         backup of this cluster"
    )]
    IdSetupDiffers { live: String, backup: String },
    #[error("the {0} cannot jump by 2^32 without passing 2^64-1")]
    VersionOverflow(&'static str),
    #[error(
        "sections {begin}..{end} {what} after the backup ({by}): restoring this backup would {harm}; \
         take a new backup of a set that holds the range now, or move the range back first"
    )]
    OwnerChanged {
        begin: u64,
        end: u64,
        what: String,
        by: String,
        harm: &'static str,
    },
}

/// The live cluster map, as much of it as the check needs (from set 0 or a set's published copy),
/// and the range states of the set that answered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LiveMap {
    /// `(begin, end, set)` section runs.
    pub ranges: Vec<(u64, u64, u64)>,
    pub moves: Vec<LiveMove>,
    /// `(set, run)`: the answering set's own range states. A published copy of the map can lag
    /// behind set 0's (the publish after a move's last change may not have arrived); what a set
    /// holds in its own state machine cannot lag behind what it serves. Empty from a server that
    /// does not report them.
    pub held: Vec<(u64, RangeRun)>,
    /// The time-ordered ids' setup the map carries (set 0's), as the command that adopts it.
    pub ids: Option<SlotCommand>,
}

/// One move of the live map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveMove {
    pub op: u64,
    pub from: u64,
    pub to: u64,
    pub begin: u64,
    pub end: u64,
    /// Its phase's name (`done`, `cancelled`, `frozen`, ...).
    pub phase: String,
}

impl LiveMap {
    fn set_of(&self, section: u64) -> Option<u64> {
        self.ranges
            .iter()
            .find(|(b, e, _)| (*b..*e).contains(&section))
            .map(|r| r.2)
    }

    /// The latest move of `section` from `from` to `to` (op ids grow with time), for the message.
    fn move_of(&self, section: u64, from: Option<u64>, to: Option<u64>) -> String {
        self.moves
            .iter()
            .filter(|m| (m.begin..m.end).contains(&section))
            .filter(|m| from.is_none_or(|f| m.from == f) && to.is_none_or(|t| m.to == t))
            .max_by_key(|m| m.op)
            .map_or("no move in the map says how".to_string(), |m| {
                format!("move {} from set {} to set {}, {}", m.op, m.from, m.to, m.phase)
            })
    }
}

/// Why one section of the backup cannot be restored now: what happened, the move that did it, and
/// what restoring would do.
type Verdict = (String, String, &'static str);

/// Refuses a backup of set `set` whose ownership differs from the live map: for each section, the
/// backup's owned ranges must be exactly the ones the live map gives `set`, no move may be running
/// over them, and on set 0 the map inside the backup must place every section as the live one does.
/// The first run of sections with the same verdict is named, in uids.
pub fn check_against_map(backup: &SetState, live: &LiveMap) -> Result<(), RestoreError> {
    let p = backup.params.as_ref().ok_or(RestoreError::NotInitialized)?;
    check_ids_against_map(backup.ids.as_ref(), live.ids.as_ref())?;
    let mut bad: Option<(u64, u64, Verdict)> = None;
    for section in 0..p.total_sections() {
        match (&mut bad, verdict(backup, p.set_id, live, section)) {
            (Some((_, end, (what, ..))), Some((w, ..))) if *end == section && *what == w => *end = section + 1,
            (Some(_), _) => break,
            (None, Some(v)) => bad = Some((section, section + 1, v)),
            (None, None) => {}
        }
    }
    let Some((begin, end, (what, by, harm))) = bad else {
        return Ok(());
    };
    let uids = |s: u64| s.saturating_mul(p.section_size).min(p.uid_limit);
    Err(RestoreError::OwnerChanged {
        begin: uids(begin),
        end: uids(end),
        what,
        by,
        harm,
    })
}

fn verdict(backup: &SetState, set: u64, live: &LiveMap, section: u64) -> Option<Verdict> {
    let name = |s: Option<u64>| s.map_or("none".to_string(), |s| s.to_string());
    let owned = backup.ranges.is_owned(SectionId(section));
    let now = live.set_of(section);
    let running = live.moves.iter().find(|m| {
        (m.begin..m.end).contains(&section)
            && !matches!(m.phase.as_str(), "done" | "cancelled")
            && (m.from == set || m.to == set)
    });
    if let Some(m) = running {
        let by = format!("move {} from set {} to set {}", m.op, m.from, m.to);
        return Some((format!("are in move {} ({})", m.op, m.phase), by, "race a running move"));
    }
    if owned && now != Some(set) {
        let what = format!("were moved from set {set} to set {}", name(now));
        return Some((
            what,
            live.move_of(section, Some(set), None),
            "let two sets serve them (duplicates)",
        ));
    }
    // The map (perhaps a lagging copy) still places it here: does another set hold it already?
    if owned && let Some(v) = held_elsewhere(set, live, section) {
        return Some(v);
    }
    if !owned && now == Some(set) {
        let what = format!("were moved into set {set}");
        return Some((
            what,
            live.move_of(section, None, Some(set)),
            "leave them served by no set, for good",
        ));
    }
    let was = backup.map.as_ref()?.set_of(SectionId(section));
    (was != now).then(|| {
        let what = format!(
            "were placed in set {} by the backed-up map and in set {} now",
            name(was),
            name(now)
        );
        (what, live.move_of(section, was, now), "send clients to the wrong set")
    })
}

/// A section the backup owns that another set holds now, by that set's own range states (the map
/// copy that came with them may not show the move yet).
fn held_elsewhere(set: u64, live: &LiveMap, section: u64) -> Option<Verdict> {
    let (other, state) = live
        .held
        .iter()
        .filter(|(other, run)| *other != set && (run.begin.0..run.end.0).contains(&section))
        .find_map(|(other, run)| match run.state {
            RangeState::Tombstoned { .. } => None,
            s => Some((*other, s)),
        })?;
    let (how, op) = match state {
        RangeState::Importing { op } => ("importing", op),
        RangeState::Migrating { op, .. } => ("frozen for export", op),
        _ => ("owned", 0),
    };
    let by = if op == 0 {
        format!(
            "set {other}'s own range states; {}",
            live.move_of(section, Some(set), Some(other))
        )
    } else {
        format!("move {op}, by set {other}'s own range states")
    };
    Some((
        format!("became {how} in set {other}"),
        by,
        "let two sets serve them (duplicates)",
    ))
}

/// The margin `args` ask for: the larger of `steps × step` and what `max_bumps_per_sec` can
/// raise a ceiling by in `age` (each bump at most [`MAX_BUMP_STEPS`] steps, plus one bump that
/// may have been in flight). `age` is `None` when the backup's time is ahead of the clock by
/// the given milliseconds.
pub fn choose_margin(step: u64, args: MarginArgs, age: Result<Duration, u64>) -> Result<Margin, RestoreError> {
    let overflow = |what: String| RestoreError::MarginOverflow(what);
    let mut best: Option<Margin> = None;
    if let Some(n) = args.steps {
        let seqs = n
            .checked_mul(step)
            .ok_or_else(|| overflow(format!("{n} steps of {step}")))?;
        best = Some(Margin {
            seqs,
            why: format!("--margin-steps {n} × step {step}"),
        });
    }
    if let Some(rate) = args.max_bumps_per_sec {
        let age = age.map_err(|ahead_ms| RestoreError::BackupFromTheFuture { ahead_ms })?;
        let bumps = (age.as_millis() * rate as u128).div_ceil(1000) + 1;
        let seqs = bumps * (MAX_BUMP_STEPS as u128) * step as u128;
        let seqs = u64::try_from(seqs).map_err(|_| overflow(format!("{bumps} bumps of {MAX_BUMP_STEPS} steps")))?;
        let why = format!(
            "backup age {:.1} s × {rate} bumps/s + 1 = {bumps} bumps × {MAX_BUMP_STEPS} steps × step {step}",
            age.as_secs_f64()
        );
        if best.as_ref().is_none_or(|b| seqs > b.seqs) {
            best = Some(Margin { seqs, why });
        }
    }
    best.ok_or(RestoreError::NoMargin)
}

/// What a restore changed, for the operator's report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Raised {
    pub sections: u64,
    pub margin: u64,
    /// Lowest and highest `max_seq` before and after.
    pub max_seq_before: (u64, u64),
    pub max_seq_after: (u64, u64),
    /// Sections that had an owner in the backup.
    pub owners_cleared: u64,
    /// AllocSvr registrations forgotten.
    pub allocsvrs_forgotten: usize,
    pub route_version: (u64, u64),
    pub last_incarnation: (u64, u64),
    /// The tick every slot mark was raised to, when the set has time-ordered ids.
    pub slot_marks_at_least: Option<u64>,
    /// The backup had no id setup and took the live map's.
    pub ids_adopted: bool,
    /// Ledgers that wait for a reconcile.
    pub ledgers_restored: u64,
}

/// Takes the live map's id setup when the backup has none; whether it did.
fn adopt_live_ids(st: &mut SetState, set_id: u64, at: &RestoreAt) -> Result<bool, RestoreError> {
    let (None, Some(setup)) = (&st.ids, &at.live_ids) else {
        return Ok(false);
    };
    // Nobody holds a slot of a fresh setup: no incarnation needs to be registered.
    let adopted = slots::apply(&mut st.ids, set_id, setup, &Default::default());
    if let slots::SlotResult::Refused(why) = adopted {
        return Err(RestoreError::IdSetupDiffers {
            live: format!("{setup:?}"),
            backup: format!("none, and this set cannot take the live one: {why}"),
        });
    }
    Ok(true)
}

/// Refuses a backup taken while a move had a range importing or frozen here.
fn refuse_moves_in_flight(st: &SetState) -> Result<(), RestoreError> {
    for run in st.ranges.runs() {
        let (op, what) = match run.state {
            RangeState::Importing { op } => (op, "importing"),
            RangeState::Migrating { op, .. } => (op, "frozen for export"),
            RangeState::Owned | RangeState::Tombstoned { .. } => continue,
        };
        return Err(RestoreError::MoveInFlight {
            op,
            begin: run.begin.0,
            end: run.end.0,
            what,
        });
    }
    Ok(())
}

/// The clocks a restore reads, and the id setup of the live cluster, if known.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestoreAt {
    /// The restoring host's wall clock, Unix ms.
    pub now_ms: u64,
    /// When the backup was taken, by the lost set's leader's clock (the file's header).
    pub taken_at_ms: u64,
    /// The live map's id setup ([`LiveMap::ids`]): adopted when the backup predates the ids.
    pub live_ids: Option<SlotCommand>,
}

/// Refuses a backup whose id setup differs from the live map's. A backup without one is not
/// refused: [`restore`] adopts the live setup (see there).
pub fn check_ids_against_map(backup: Option<&IdState>, live: Option<&SlotCommand>) -> Result<(), RestoreError> {
    let (Some(b), Some((layout, per_set, max_ahead_ms, placement))) = (backup, live.and_then(SlotCommand::setup_parts))
    else {
        return Ok(());
    };
    if (b.layout, b.per_set, b.max_ahead_ms, b.key_placement) == (layout, per_set, max_ahead_ms, placement) {
        return Ok(());
    }
    let show = |l: &seqsvr_proto::id_layout::IdLayout, n: u64, a: u64, k: seqsvr_proto::keys::KeyPlacement| {
        format!("layout {l}, {n} slots a set, marks at most {a} ms ahead, key placement {k}")
    };
    Err(RestoreError::IdSetupDiffers {
        live: show(&layout, per_set, max_ahead_ms, placement),
        backup: show(&b.layout, b.per_set, b.max_ahead_ms, b.key_placement),
    })
}

/// The tick every slot mark of the restored set starts at, and why, for a set set up as `ids`.
///
/// Every mark the lost set acknowledged was at most its leader's clock plus the allowance `A`
/// when acknowledged. That leader's clock is not known here; three things bound it from below,
/// and the latest of them, plus `2A`, is the floor:
/// - this host's clock (refused when it reads before the backup: wrong for sure);
/// - the backup's time plus its age, by this clock: the lost leader's clock at its last raise, if
///   the two clocks agreed;
/// - the backup's highest mark plus the age: a mark `M` was at most that leader's clock plus `A`
///   when raised, so its clock then was at least `M − A`, and it ran on for the age. This one
///   holds whatever this host's clock says about the lost leader's, as long as some holder kept
///   its mark ahead of its clock when the backup was taken (they raise 2 s ahead).
///
/// The second allowance covers a lost leader whose clock ran ahead of this one by up to `A`.
fn marks_floor(ids: &IdState, at: &RestoreAt) -> u64 {
    let age_ms = at.now_ms.saturating_sub(at.taken_at_ms);
    let highest = ids.slots.iter().map(|s| s.mark).max().unwrap_or(0);
    // The end of the highest tick, Unix ms (0 when no mark was ever raised).
    let highest_ms = match highest {
        0 => 0,
        m => ids.layout.ms_of(m.saturating_add(1)),
    };
    let lost_clock_ms = at
        .now_ms
        .max(at.taken_at_ms.saturating_add(age_ms))
        .max(highest_ms.saturating_add(age_ms));
    let floor = lost_clock_ms.saturating_add(ids.max_ahead_ms.saturating_mul(2));
    ids.layout.tick_of(floor).unwrap_or(0).min(ids.layout.max_tick())
}

/// The state a new set starts from: `backup` with every ceiling raised by `margin`, no owners,
/// epochs moved past any the old set can have granted, no AllocSvrs, and the route version and incarnation counter moved past
/// anything the old set can have issued; `node` is recorded as a member (it must be a new id).
///
/// Slot marks (time-ordered ids) are raised to [`marks_floor`]. A backup taken before its set
/// set ids up, restored into a cluster whose map has a setup, takes that setup now, marks
/// raised the same way: the lost set may have set its ids up and issued after the backup, and a
/// restored set 0 without a setup would write one from its own flags at its first start (perhaps
/// another, overlapping the other sets' slot shares) and issue from mark 0. Refused: a clock that
/// reads before the backup was taken.
pub fn restore(
    backup: &SetState,
    margin: u64,
    node: NodeId,
    at: &RestoreAt,
) -> Result<(SetState, Raised), RestoreError> {
    let Some(params) = backup.params.as_ref() else {
        return Err(RestoreError::NotInitialized);
    };
    if at.now_ms < at.taken_at_ms {
        return Err(RestoreError::ClockBeforeBackup {
            now_ms: at.now_ms,
            taken_at_ms: at.taken_at_ms,
            behind_ms: at.taken_at_ms - at.now_ms,
        });
    }
    check_ids_against_map(backup.ids.as_ref(), at.live_ids.as_ref())?;
    refuse_moves_in_flight(backup)?;
    if backup.replica_ids_ever.contains(&node) {
        return Err(RestoreError::NodeIdUsed(node.0));
    }
    let jump = |v: u64, what| v.checked_add(VERSION_GAP).ok_or(RestoreError::VersionOverflow(what));
    let mut st = backup.clone();
    let mut r = Raised {
        margin,
        max_seq_before: (u64::MAX, 0),
        max_seq_after: (u64::MAX, 0),
        allocsvrs_forgotten: st.allocsvrs.len(),
        route_version: (st.route_version, jump(st.route_version, "route version")?),
        last_incarnation: (
            st.last_incarnation.0,
            jump(st.last_incarnation.0, "incarnation counter")?,
        ),
        ..Raised::default()
    };
    for (i, s) in st.sections.iter_mut().enumerate() {
        let raised = s.max_seq.checked_add(margin).ok_or(RestoreError::Overflow {
            section: i as u64,
            max_seq: s.max_seq,
            margin,
        })?;
        r.max_seq_before = (r.max_seq_before.0.min(s.max_seq), r.max_seq_before.1.max(s.max_seq));
        r.max_seq_after = (r.max_seq_after.0.min(raised), r.max_seq_after.1.max(raised));
        r.owners_cleared += u64::from(s.owner != NOBODY);
        s.max_seq = raised;
        s.owner = NOBODY;
        s.epoch = Epoch(jump(s.epoch.0, "epoch")?);
        s.no_wait = false;
    }
    r.sections = st.sections.len() as u64;
    st.allocsvrs.clear();
    if let Some(map) = st.map.as_mut() {
        map.version = jump(map.version, "cluster map version")?;
    }
    st.bindings = Default::default();
    r.ledgers_restored = st.ledgers.mark_restored();
    r.ids_adopted = adopt_live_ids(&mut st, params.set_id, at)?;
    if let Some(ids) = st.ids.as_mut() {
        let floor = marks_floor(ids, at);
        r.slot_marks_at_least = Some(floor);
        ids.raise_all(floor);
        for s in &mut ids.slots {
            s.epoch = Epoch(jump(s.epoch.0, "slot epoch")?);
        }
    }
    st.route_version = r.route_version.1;
    st.last_incarnation = Incarnation(r.last_incarnation.1);
    st.replica_ids_ever.insert(node);
    debug_assert!(
        st.sections
            .iter()
            .zip(&backup.sections)
            .all(|(a, b)| a.max_seq == b.max_seq + margin && a.owner == NOBODY && a.epoch > b.epoch)
    );
    Ok((st, r))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A restore at `now_ms` of a backup taken at 0, with no live id setup.
    fn at(now_ms: u64) -> RestoreAt {
        RestoreAt {
            now_ms,
            ..RestoreAt::default()
        }
    }
    use crate::domain::ranges::RangeState;
    use crate::domain::state::{BumpItem, Command, CommandResult};
    use crate::domain::testing::{set_with, small_params};

    /// A set whose sections 0..10 are owned by one AllocSvr, section 3 bumped to 10.
    fn served() -> SetState {
        let (mut st, incs) = set_with(&[1]);
        let moves = vec![crate::domain::state::Move {
            begin: SectionId(0),
            end: SectionId(10),
            from: NOBODY,
            to: incs[0],
        }];
        st.apply(&Command::Assign { expire: vec![], moves }, false);
        let epoch = st.sections[3].epoch;
        let bump = Command::Bump {
            incarnation: incs[0],
            items: vec![BumpItem {
                section: SectionId(3),
                epoch,
                new_max: 10,
            }],
        };
        assert!(matches!(st.apply(&bump, false), CommandResult::Bumped(_)));
        st
    }

    fn live(ranges: &[(u64, u64, u64)], moves: &[(u64, u64, u64, u64, u64, &str)]) -> LiveMap {
        LiveMap {
            ranges: ranges.to_vec(),
            moves: moves
                .iter()
                .map(|&(op, from, to, begin, end, phase)| LiveMove {
                    op,
                    from,
                    to,
                    begin,
                    end,
                    phase: phase.into(),
                })
                .collect(),
            held: vec![],
            ids: None,
        }
    }

    fn refusal(backup: &SetState, map: &LiveMap) -> String {
        check_against_map(backup, map).unwrap_err().to_string()
    }

    /// Issue 25, item 2: a backup older than a move is refused, naming the move, whichever way the
    /// range went; one that matches the live map passes.
    #[test]
    fn a_backup_whose_ranges_moved_since_is_refused_naming_the_move() {
        let set0 = served();
        let size = set0.params.as_ref().unwrap().section_size;
        assert_eq!(
            check_against_map(&set0, &live(&[(0, 10, 0)], &[(3, 0, 1, 2, 4, "cancelled")])),
            Ok(())
        );

        let away = live(&[(0, 2, 0), (2, 4, 1), (4, 10, 0)], &[(7, 0, 1, 2, 4, "done")]);
        let why = refusal(&set0, &away);
        assert!(why.contains(&format!("sections {}..{}", 2 * size, 4 * size)), "{why}");
        assert!(
            why.contains("move 7 from set 0 to set 1, done") && why.contains("two sets"),
            "{why}"
        );

        let running = live(&[(0, 10, 0)], &[(8, 0, 1, 5, 6, "frozen")]);
        assert!(refusal(&set0, &running).contains("are in move 8 (frozen)"));

        // Set 1's backup owns nothing; a move brought sections 2..4 in after it.
        let mut p = small_params();
        (p.set_id, p.section_begin, p.section_end) = (1, 0, 0);
        let mut set1 = SetState::default();
        set1.apply(&Command::Init(p), false);
        let into = live(&[(0, 2, 0), (2, 4, 1), (4, 10, 0)], &[(9, 0, 1, 2, 4, "done")]);
        let why = refusal(&set1, &into);
        assert!(
            why.contains("moved into set 1") && why.contains("move 9") && why.contains("no set"),
            "{why}"
        );
        assert_eq!(check_against_map(&set1, &live(&[(0, 10, 0)], &[])), Ok(()));

        // Set 0's backed-up map places 8..10 in set 1; a later move took them on to set 2.
        let mut old_map = served();
        old_map.ranges.set(SectionId(8), SectionId(10), None);
        old_map
            .map
            .as_mut()
            .unwrap()
            .ranges
            .set(SectionId(8), SectionId(10), Some(1));
        let onward = live(
            &[(0, 8, 0), (8, 10, 2)],
            &[(4, 0, 1, 8, 10, "done"), (11, 1, 2, 8, 10, "done")],
        );
        let why = refusal(&old_map, &onward);
        assert!(
            why.contains("set 1 by the backed-up map and in set 2 now") && why.contains("move 11"),
            "{why}"
        );
    }

    /// A published copy of the map can lag: set 1's copy still shows sections 2..4 in set 0 and no
    /// move, while set 1's own range states already own them. The check believes the range states.
    #[test]
    fn a_range_another_set_holds_is_refused_whatever_its_map_copy_says() {
        let set0 = served();
        let mut stale = live(&[(0, 10, 0)], &[]);
        assert_eq!(check_against_map(&set0, &stale), Ok(()), "the copy alone lets it pass");
        let run = |b: u64, e: u64, state| RangeRun {
            begin: SectionId(b),
            end: SectionId(e),
            state,
        };
        stale.held = vec![(1, run(2, 4, RangeState::Owned))];
        let why = refusal(&set0, &stale);
        assert!(
            why.contains("became owned in set 1 after the backup")
                && why.contains("two sets")
                && why.contains("set 1's own range states"),
            "{why}"
        );
        stale.held = vec![(1, run(5, 6, RangeState::Importing { op: 12 }))];
        assert!(refusal(&set0, &stale).contains("became importing in set 1 after the backup (move 12"));
        // What set 1 gave away, and what set 0 reports of itself, are no conflict.
        stale.held = vec![
            (
                1,
                run(
                    2,
                    4,
                    RangeState::Tombstoned {
                        op: 3,
                        to_set: 0,
                        map_version: 7,
                    },
                ),
            ),
            (0, run(0, 10, RangeState::Owned)),
        ];
        assert_eq!(check_against_map(&set0, &stale), Ok(()));
    }

    #[test]
    fn slot_marks_rise_past_the_restoring_clock_and_holders_are_cleared() {
        use super::super::slots::{SlotCommand, SlotMove, apply};
        let mut before = served();
        let setup = SlotCommand::Setup {
            layout: seqsvr_proto::id_layout::IdLayout::twitter(0),
            per_set: 2,
            max_ahead_ms: 1_000,
        };
        let registered = before.allocsvrs.keys().copied().collect();
        apply(&mut before.ids, 0, &setup, &registered);
        let holder = *before.allocsvrs.keys().next().unwrap();
        let grant = SlotCommand::Grant(vec![SlotMove {
            slot: 0,
            from: NOBODY,
            to: holder,
        }]);
        apply(&mut before.ids, 0, &grant, &registered);
        let (after, r) = restore(&before, 10, NodeId(9), &at(50_000)).unwrap();
        assert_eq!(r.slot_marks_at_least, Some(52_000));
        for (_, s) in after.ids.as_ref().unwrap().iter() {
            assert_eq!((s.holder, s.mark), (NOBODY, 52_000));
            assert!(s.epoch.0 >= VERSION_GAP, "epochs jump past any the lost set granted");
        }
    }

    /// Issue 47, item 9: a backup taken before set 0 set its ids up, restored into a cluster that
    /// issues ids, takes the live setup with every mark raised past the clock (it raised none, and
    /// set 0 would have set up again from its own flags); a backup whose setup differs from the
    /// live one is refused; a clock before the backup is refused.
    #[test]
    fn a_restore_takes_the_live_id_setup_the_backup_lacks_and_refuses_one_it_contradicts() {
        let setup = |per_set| SlotCommand::Setup {
            layout: seqsvr_proto::id_layout::IdLayout::twitter(0),
            per_set,
            max_ahead_ms: 1_000,
        };
        let before = served();
        assert!(before.ids.is_none());
        let live = RestoreAt {
            now_ms: 50_000,
            taken_at_ms: 40_000,
            live_ids: Some(setup(4)),
        };
        let (after, r) = restore(&before, 10, NodeId(9), &live).unwrap();
        assert!(r.ids_adopted);
        let ids = after.ids.as_ref().expect("the live setup, adopted");
        assert_eq!((ids.per_set, ids.slots.len()), (4, 4));
        assert!(ids.slots.iter().all(|s| s.mark == 52_000 && s.epoch.0 >= VERSION_GAP));

        let mut other = before.clone();
        slots::apply(&mut other.ids, 0, &setup(8), &Default::default());
        let err = restore(&other, 10, NodeId(9), &live).unwrap_err();
        assert!(matches!(err, RestoreError::IdSetupDiffers { .. }), "{err}");
        let mut map = live_map_of_set0();
        map.ids = Some(setup(4));
        assert!(matches!(
            check_against_map(&other, &map),
            Err(RestoreError::IdSetupDiffers { .. })
        ));

        let early = RestoreAt { now_ms: 39_000, ..live };
        assert_eq!(
            restore(&before, 10, NodeId(9), &early).unwrap_err(),
            RestoreError::ClockBeforeBackup {
                now_ms: 39_000,
                taken_at_ms: 40_000,
                behind_ms: 1_000
            }
        );
    }

    /// The live map of a one-set cluster: set 0 holds every section.
    fn live_map_of_set0() -> LiveMap {
        live(&[(0, 10, 0)], &[])
    }

    /// The backup's highest mark, moved on by the backup's age, bounds the lost leader's clock
    /// when this host's is behind it.
    #[test]
    fn marks_rise_past_the_backups_highest_mark_moved_on_by_its_age() {
        let mut before = served();
        let setup = SlotCommand::Setup {
            layout: seqsvr_proto::id_layout::IdLayout::twitter(0),
            per_set: 2,
            max_ahead_ms: 1_000,
        };
        slots::apply(&mut before.ids, 0, &setup, &Default::default());
        before.ids.as_mut().unwrap().slots[1].mark = 100_000;
        let at = RestoreAt {
            now_ms: 50_000,
            taken_at_ms: 45_000,
            live_ids: None,
        };
        let (_, r) = restore(&before, 10, NodeId(9), &at).unwrap();
        // Tick 100,000 ends at 100,001 ms; 5 s of age; twice the allowance.
        assert_eq!(r.slot_marks_at_least, Some(100_001 + 5_000 + 2_000));
    }

    #[test]
    fn a_restored_set_0_jumps_its_map_version() {
        let before = served();
        let (after, _) = restore(&before, 10, NodeId(9), &at(0)).unwrap();
        let v = |st: &SetState| st.map.as_ref().unwrap().version;
        assert_eq!(v(&after), v(&before) + VERSION_GAP);
    }

    #[test]
    fn every_ceiling_goes_up_by_the_margin_and_every_owner_goes() {
        let before = served();
        let (after, r) = restore(&before, 1_000, NodeId(9), &at(0)).unwrap();
        for (a, b) in after.sections.iter().zip(&before.sections) {
            assert_eq!(a.max_seq, b.max_seq + 1_000);
            assert_eq!(
                (a.owner, a.epoch, a.no_wait),
                (NOBODY, Epoch(b.epoch.0 + VERSION_GAP), false)
            );
        }
        assert_eq!(after.sections[3].max_seq, 1_010);
        assert!(after.allocsvrs.is_empty());
        assert_eq!(after.route_version, before.route_version + VERSION_GAP);
        assert_eq!(after.last_incarnation.0, before.last_incarnation.0 + VERSION_GAP);
        assert!(after.replica_ids_ever.contains(&NodeId(9)));
        assert_eq!(after.params, before.params);
        assert_eq!(r.sections, 10);
        assert_eq!((r.max_seq_before, r.max_seq_after), ((0, 10), (1_000, 1_010)));
        assert_eq!((r.owners_cleared, r.allocsvrs_forgotten), (10, 1));
    }

    #[test]
    fn an_overflowing_section_is_named_and_nothing_is_returned() {
        let mut st = served();
        st.sections[7].max_seq = u64::MAX - 5;
        let err = restore(&st, 6, NodeId(9), &at(0)).unwrap_err();
        assert_eq!(
            err,
            RestoreError::Overflow {
                section: 7,
                max_seq: u64::MAX - 5,
                margin: 6
            }
        );
        assert!(err.to_string().contains("section 7"), "{err}");
        assert!(restore(&st, 5, NodeId(9), &at(0)).is_ok(), "exactly 2^64-1 fits");
    }

    #[test]
    fn a_move_in_flight_an_uninitialized_set_or_a_used_node_id_is_refused() {
        let mut st = served();
        st.ranges.set(
            SectionId(2),
            SectionId(4),
            Some(RangeState::Migrating { op: 5, to_set: 1 }),
        );
        assert!(matches!(
            restore(&st, 1, NodeId(9), &at(0)),
            Err(RestoreError::MoveInFlight {
                op: 5,
                begin: 2,
                end: 4,
                ..
            })
        ));
        st.ranges
            .set(SectionId(2), SectionId(4), Some(RangeState::Importing { op: 6 }));
        assert!(matches!(
            restore(&st, 1, NodeId(9), &at(0)),
            Err(RestoreError::MoveInFlight { op: 6, .. })
        ));
        assert_eq!(
            restore(&SetState::default(), 1, NodeId(9), &at(0)),
            Err(RestoreError::NotInitialized)
        );
        let mut st = served();
        st.replica_ids_ever.insert(NodeId(4));
        assert_eq!(restore(&st, 1, NodeId(4), &at(0)), Err(RestoreError::NodeIdUsed(4)));
    }

    #[test]
    fn the_margin_is_the_larger_bound_the_operator_gives() {
        let step = small_params().step; // 5
        let secs = |s| Ok(Duration::from_secs(s));
        let steps = |n| MarginArgs {
            steps: Some(n),
            ..Default::default()
        };
        let rate = |r| MarginArgs {
            max_bumps_per_sec: Some(r),
            ..Default::default()
        };
        type Age = Result<Duration, u64>;
        let cases: &[(MarginArgs, Age, Result<u64, RestoreError>)] = &[
            (steps(10), secs(0), Ok(50)),
            (steps(0), secs(0), Ok(0)),
            // 2.5 s at 3 bumps/s: ceil(7.5) + 1 = 9 bumps of 4 steps of 5.
            (rate(3), Ok(Duration::from_millis(2_500)), Ok(9 * 4 * 5)),
            (rate(0), secs(100), Ok(4 * 5)),
            (
                MarginArgs {
                    steps: Some(1_000),
                    max_bumps_per_sec: Some(1),
                },
                secs(10),
                Ok(5_000),
            ),
            (
                MarginArgs {
                    steps: Some(1),
                    max_bumps_per_sec: Some(1),
                },
                secs(10),
                Ok(11 * 4 * 5),
            ),
            (MarginArgs::default(), secs(1), Err(RestoreError::NoMargin)),
            (
                rate(1),
                Err(1_500),
                Err(RestoreError::BackupFromTheFuture { ahead_ms: 1_500 }),
            ),
        ];
        for (args, age, want) in cases {
            let got = choose_margin(step, *args, *age).map(|m| m.seqs);
            assert_eq!(&got, want, "{args:?} {age:?}");
        }
        assert!(matches!(
            choose_margin(u64::MAX / 2, steps(3), secs(0)),
            Err(RestoreError::MarginOverflow(_))
        ));
        assert!(matches!(
            choose_margin(1 << 40, rate(1 << 30), secs(1 << 20)),
            Err(RestoreError::MarginOverflow(_))
        ));
    }
}
