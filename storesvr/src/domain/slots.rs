//! Worker slots for time-ordered ids: the sub-machine a set keeps beside its sections.
//!
//! Once a set's ids are set up ([`SlotCommand::Setup`]), it leases the slots
//! `[set_id × per_set, (set_id + 1) × per_set)` of the cluster-wide layout: slot ranges of
//! different sets are disjoint by construction, so no set has to ask another, and a set added
//! later takes the next share. Per slot the state keeps its holder (an AllocSvr incarnation), an
//! epoch raised on every grant, and the high-water `mark`: the highest tick any holder of the slot
//! was allowed to issue. The rules that make ids unique without trusting a clock or a lease:
//! - a raise of the mark is applied only under the slot's current epoch and holder, and only
//!   upward ([`SlotCommand::Raise`]);
//! - a grant raises the epoch, so the previous holder's raises are refused from then on, and the
//!   mark a new holder reads with its grant is at or above every mark an earlier holder was
//!   acknowledged — the floor it issues above;
//! - a raise more than `max_ahead_ms` past the proposing leader's wall clock (carried in the
//!   command, so every replica decides alike) is capped at that limit ([`SlotCommand::RaiseCapped`],
//!   what leaders propose now; the first [`SlotCommand::Raise`] refused it, and old entries of it
//!   still apply so): one bad clock cannot push a slot's ids years ahead, and a leader whose clock
//!   is a little behind the holders' still lets them issue up to its limit instead of stopping them.
//!
//! A setup is refused, before anything is allocated, when its layout's bits do not fit or its
//! share is above `MAX_ID_SLOTS_PER_SET` (`seqsvr_proto::limits`): it is a log entry, and one that
//! allocated without a bound would crash every replica that applies it, again at every restart.
//!
//! Left out: who should hold which slot (`plan_grants`, run by the arbiter on the leader), issuing
//! (the AllocSvr's `issuer`), and slot ranges that move between sets (a set's share is fixed by
//! its id).

use seqsvr_proto::id_layout::IdLayout;
use seqsvr_proto::keys::KeyPlacement;
use seqsvr_proto::limits::MAX_ID_SLOTS_PER_SET;
use seqsvr_proto::{Epoch, Incarnation};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

use super::section::NOBODY;

/// One slot's durable state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotState {
    /// The incarnation that may issue from the slot; [`NOBODY`] when free.
    pub holder: Incarnation,
    /// Raised on every grant; a raise must carry it.
    pub epoch: Epoch,
    /// The highest tick any holder of the slot was allowed to issue.
    pub mark: u64,
}

/// A set's time-ordered id state: the layout, its share of slots and each slot's record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdState {
    pub layout: IdLayout,
    /// Slots each set leases; set `k` has `[k × per_set, (k + 1) × per_set)`.
    pub per_set: u64,
    /// How far past the proposing leader's clock a mark may be raised.
    pub max_ahead_ms: u64,
    /// The first slot of this set's share.
    pub first: u64,
    /// The share's slots, in order.
    pub slots: Vec<SlotState>,
    /// How the cluster places counter keys. Last, and not written when `Sha256`: such a state
    /// encodes byte for byte as before placements existed (a replica of an older release reads
    /// it), and one that ends a byte early reads as `Sha256` (`storage::sm_store::decode_padded`).
    #[serde(default, skip_serializing_if = "KeyPlacement::is_sha256")]
    pub key_placement: KeyPlacement,
}

/// Every field of an [`IdState`], written whatever the key placement (see `SetState`'s `Serialize`).
#[derive(Serialize)]
pub(crate) struct WholeIdState<'a> {
    layout: &'a IdLayout,
    per_set: u64,
    max_ahead_ms: u64,
    first: u64,
    slots: &'a Vec<SlotState>,
    key_placement: KeyPlacement,
}

impl IdState {
    /// The state with its key placement written even when it is SHA-256.
    pub(crate) fn whole(&self) -> WholeIdState<'_> {
        WholeIdState {
            layout: &self.layout,
            per_set: self.per_set,
            max_ahead_ms: self.max_ahead_ms,
            first: self.first,
            slots: &self.slots,
            key_placement: self.key_placement,
        }
    }
}

/// Slot `slot` goes from `from` (its holder when the arbiter decided) to `to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotMove {
    pub slot: u64,
    pub from: Incarnation,
    pub to: Incarnation,
}

/// A holder's fenced raise of one slot's mark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RaiseItem {
    pub slot: u64,
    pub epoch: Epoch,
    pub mark: u64,
}

/// A command of the slot sub-machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SlotCommand {
    /// Sets up the set's ids once; the same setup again changes nothing, another is refused.
    Setup {
        layout: IdLayout,
        per_set: u64,
        max_ahead_ms: u64,
    },
    /// The arbiter's decision; a slot whose holder is no longer `from` is left alone.
    Grant(Vec<SlotMove>),
    /// A holder raises marks; `leader_ms` is the proposing leader's wall clock.
    Raise {
        holder: Incarnation,
        items: Vec<RaiseItem>,
        leader_ms: u64,
    },
    /// A holder gives slots up, each under the epoch it held it in.
    Release {
        holder: Incarnation,
        items: Vec<(u64, Epoch)>,
    },
    /// [`SlotCommand::Raise`] with a mark past the limit applied at the limit rather than refused
    /// (issue 47): a leader a little behind the holders' clocks no longer stops every raise.
    /// A variant of its own, not a changed `Raise`: an entry of the old kind, replayed from a log,
    /// must apply as it did when it was first applied, or replicas of two builds would disagree
    /// on a mark.
    RaiseCapped {
        holder: Incarnation,
        items: Vec<RaiseItem>,
        leader_ms: u64,
    },
    /// [`SlotCommand::Setup`] of a cluster that places counter keys by Redis hash slot
    /// (`--key-placement slots`, `seqsvr_proto::keys::KeyPlacement`). A variant of its own,
    /// written only by such a cluster: one set up with SHA-256 placement, the default, writes
    /// `Setup` entries as before, which a replica of an older release reads.
    SetupSlots {
        layout: IdLayout,
        per_set: u64,
        max_ahead_ms: u64,
    },
}

impl SlotCommand {
    /// A setup's parts, with the key placement it records (`None`: not a setup).
    pub fn setup_parts(&self) -> Option<(IdLayout, u64, u64, KeyPlacement)> {
        match *self {
            SlotCommand::Setup {
                layout,
                per_set,
                max_ahead_ms,
            } => Some((layout, per_set, max_ahead_ms, KeyPlacement::Sha256)),
            SlotCommand::SetupSlots {
                layout,
                per_set,
                max_ahead_ms,
            } => Some((layout, per_set, max_ahead_ms, KeyPlacement::Slots)),
            _ => None,
        }
    }

    /// The setup command of these parts.
    pub fn setup(layout: IdLayout, per_set: u64, max_ahead_ms: u64, placement: KeyPlacement) -> Self {
        match placement {
            KeyPlacement::Sha256 => SlotCommand::Setup {
                layout,
                per_set,
                max_ahead_ms,
            },
            KeyPlacement::Slots => SlotCommand::SetupSlots {
                layout,
                per_set,
                max_ahead_ms,
            },
        }
    }
}

/// What happened to one raise item.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RaiseOutcome {
    Applied,
    /// The mark was already as high.
    NoOp,
    /// The slot was granted again, or never to this holder.
    StaleEpoch,
    /// Past the leader's clock plus `max_ahead_ms`, or past the layout's last tick.
    TooFarAhead {
        limit: u64,
    },
    /// Not a slot of this set's share.
    NotOurs,
    /// Past the limit (as `TooFarAhead`), so the mark was raised to the limit instead, if that is
    /// above it ([`SlotCommand::RaiseCapped`]): the result's mark is what the holder may use.
    Capped {
        limit: u64,
    },
}

/// One raise item's outcome with the slot's mark and epoch after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RaiseResult {
    pub slot: u64,
    pub outcome: RaiseOutcome,
    pub mark: u64,
    pub epoch: Epoch,
}

/// The result of a [`SlotCommand`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SlotResult {
    SetUp { fresh: bool },
    Granted { moved: u64 },
    Raised(Vec<RaiseResult>),
    Released { count: u64 },
    Refused(String),
}

/// Applies `cmd` to `ids` (`None` until set up) of set `set_id`. Pure and deterministic.
/// `registered` are the set's registered incarnations: a grant to one that is gone is skipped.
pub fn apply(
    ids: &mut Option<IdState>,
    set_id: u64,
    cmd: &SlotCommand,
    registered: &BTreeSet<Incarnation>,
) -> SlotResult {
    apply_with(ids, set_id, cmd, registered, false)
}

/// [`apply`] with the negative control `skip_fence` (`--unsafe-skip-epoch-fence`): a raise is
/// applied whatever its epoch and holder, as a bump is under that control.
pub fn apply_with(
    ids: &mut Option<IdState>,
    set_id: u64,
    cmd: &SlotCommand,
    registered: &BTreeSet<Incarnation>,
    skip_fence: bool,
) -> SlotResult {
    if let Some(parts) = cmd.setup_parts() {
        return setup(ids.as_ref(), set_id, parts).map_or_else(SlotResult::Refused, |new| match new {
            Some(state) => {
                *ids = Some(state);
                SlotResult::SetUp { fresh: true }
            }
            None => SlotResult::SetUp { fresh: false },
        });
    }
    match (ids.as_mut(), cmd) {
        (_, SlotCommand::Setup { .. } | SlotCommand::SetupSlots { .. }) => {
            SlotResult::Refused("a setup is applied above".into())
        }
        (None, _) => SlotResult::Refused(format!("set {set_id} has no time-ordered ids set up")),
        (Some(s), SlotCommand::Grant(moves)) => s.grant(moves, registered),
        (
            Some(s),
            SlotCommand::Raise {
                holder,
                items,
                leader_ms,
            },
        ) => s.raise(*holder, items, *leader_ms, skip_fence, false),
        (
            Some(s),
            SlotCommand::RaiseCapped {
                holder,
                items,
                leader_ms,
            },
        ) => s.raise(*holder, items, *leader_ms, skip_fence, true),
        (Some(s), SlotCommand::Release { holder, items }) => s.release(*holder, items),
    }
}

/// Why `cmd`, a setup, would be refused as set `set_id`'s first one (`None`: it would apply).
pub fn setup_refusal(set_id: u64, cmd: &SlotCommand) -> Option<String> {
    match cmd.setup_parts() {
        Some(parts) => setup(None, set_id, parts).err(),
        None => Some("not a setup".into()),
    }
}

/// A fresh state for a first setup, `None` for a repeat of the same one, or why it is refused.
fn setup(
    current: Option<&IdState>,
    set_id: u64,
    (layout, per_set, max_ahead_ms, key_placement): (IdLayout, u64, u64, KeyPlacement),
) -> Result<Option<IdState>, String> {
    if let Some(s) = current {
        let now = (s.layout, s.per_set, s.max_ahead_ms, s.key_placement);
        return match now == (layout, per_set, max_ahead_ms, key_placement) {
            true => Ok(None),
            false => Err(format!(
                "set {set_id}'s ids are set up already with layout {}, {} slots a set, marks at most {} ms \
                 ahead, key placement {}; a layout cannot change once ids were issued, nor a placement once \
                 keys were",
                s.layout, s.per_set, s.max_ahead_ms, s.key_placement
            )),
        };
    }
    // A setup is a log entry every replica applies: whatever it says, it must be refused here,
    // before the share is allocated, and alike on every replica (no clock, no host limit).
    if let Err(e) = IdLayout::from_pb(&layout.to_pb()) {
        return Err(e.to_string());
    }
    if per_set > MAX_ID_SLOTS_PER_SET {
        return Err(format!(
            "{per_set} slots a set: at most {MAX_ID_SLOTS_PER_SET} slots a set (every replica holds each \
             slot of its share in memory)"
        ));
    }
    let slots = layout.slots();
    let first = set_id
        .checked_mul(per_set)
        .filter(|f| per_set > 0 && f + per_set <= slots);
    let Some(first) = first else {
        return Err(format!(
            "set {set_id} with {per_set} slots a set needs slots up to {}, but the layout has {slots} \
             (at most {} sets of {per_set})",
            set_id.saturating_add(1).saturating_mul(per_set),
            slots.checked_div(per_set).unwrap_or(0)
        ));
    };
    Ok(Some(IdState {
        layout,
        per_set,
        max_ahead_ms,
        first,
        slots: vec![SlotState::default(); per_set as usize],
        key_placement,
    }))
}

impl IdState {
    /// The share's slots with their states.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &SlotState)> {
        self.slots.iter().enumerate().map(|(i, s)| (self.first + i as u64, s))
    }

    pub fn get(&self, slot: u64) -> Option<&SlotState> {
        let i = slot.checked_sub(self.first)?;
        self.slots.get(usize::try_from(i).ok()?)
    }

    fn get_mut(&mut self, slot: u64) -> Option<&mut SlotState> {
        let i = slot.checked_sub(self.first)?;
        self.slots.get_mut(usize::try_from(i).ok()?)
    }

    /// Slots held by `holder`.
    pub fn held_by(&self, holder: Incarnation) -> impl Iterator<Item = (u64, &SlotState)> {
        self.iter().filter(move |(_, s)| s.holder == holder)
    }

    fn grant(&mut self, moves: &[SlotMove], registered: &BTreeSet<Incarnation>) -> SlotResult {
        let mut moved = 0;
        for m in moves {
            // A grant to an incarnation that is gone by now would park the slot on nobody alive.
            let to_ok = m.to == NOBODY || registered.contains(&m.to);
            match self.get_mut(m.slot) {
                Some(s) if s.holder == m.from && to_ok && m.from != m.to => {
                    s.holder = m.to;
                    s.epoch = Epoch(s.epoch.0 + 1);
                    moved += 1;
                }
                _ => {}
            }
        }
        SlotResult::Granted { moved }
    }

    /// The highest tick a raise proposed at the leader's `leader_ms` may reach: the tick
    /// containing the leader's clock plus the allowance (before the epoch, tick 0), at most the
    /// layout's last.
    pub fn raise_limit(&self, leader_ms: u64) -> u64 {
        self.layout
            .tick_of(leader_ms.saturating_add(self.max_ahead_ms))
            .unwrap_or(0)
            .min(self.layout.max_tick())
    }

    /// What a raise of `item` by `holder` would do to the slot as it is now: the outcome, and the
    /// slot's mark after it (`None`: not a slot of this share).
    fn raise_outcome(
        &self,
        holder: Incarnation,
        item: &RaiseItem,
        limit: u64,
        skip_fence: bool,
        capped: bool,
    ) -> (RaiseOutcome, Option<u64>) {
        let Some(s) = self.get(item.slot) else {
            return (RaiseOutcome::NotOurs, None);
        };
        let fenced_out = s.holder != holder || s.epoch != item.epoch || holder == NOBODY;
        if fenced_out && !skip_fence {
            (RaiseOutcome::StaleEpoch, Some(s.mark))
        } else if item.mark > limit && capped {
            (RaiseOutcome::Capped { limit }, Some(s.mark.max(limit)))
        } else if item.mark > limit {
            (RaiseOutcome::TooFarAhead { limit }, Some(s.mark))
        } else if item.mark <= s.mark {
            (RaiseOutcome::NoOp, Some(s.mark))
        } else {
            (RaiseOutcome::Applied, Some(item.mark))
        }
    }

    /// The result of a raise that would change no mark, computed without applying it (`None`
    /// when it would change one): the leader answers such a raise without a Raft entry. Every
    /// item sees the state as it is, which is also what applying them in turn would see, since
    /// none changes it.
    pub fn unchanged_raise(
        &self,
        holder: Incarnation,
        items: &[RaiseItem],
        leader_ms: u64,
        skip_fence: bool,
    ) -> Option<Vec<RaiseResult>> {
        let limit = self.raise_limit(leader_ms);
        items
            .iter()
            .map(|item| {
                let (outcome, after) = self.raise_outcome(holder, item, limit, skip_fence, true);
                let before = self.get(item.slot).map(|s| s.mark);
                (after == before).then(|| self.result_of(item, outcome, skip_fence))
            })
            .collect()
    }

    fn result_of(&self, item: &RaiseItem, outcome: RaiseOutcome, skip_fence: bool) -> RaiseResult {
        let Some(s) = self.get(item.slot) else {
            return RaiseResult {
                slot: item.slot,
                outcome: RaiseOutcome::NotOurs,
                mark: 0,
                epoch: Epoch(0),
            };
        };
        RaiseResult {
            slot: item.slot,
            outcome,
            mark: s.mark,
            // Knowing no epochs, the unfenced store echoes the raise's own (as a bump's).
            epoch: if skip_fence { item.epoch } else { s.epoch },
        }
    }

    fn raise(
        &mut self,
        holder: Incarnation,
        items: &[RaiseItem],
        leader_ms: u64,
        skip_fence: bool,
        capped: bool,
    ) -> SlotResult {
        let limit = self.raise_limit(leader_ms);
        let results = items
            .iter()
            .map(|item| {
                // In turn: a later item of the same slot sees what an earlier one did.
                let (outcome, after) = self.raise_outcome(holder, item, limit, skip_fence, capped);
                if let (Some(mark), Some(s)) = (after, self.get_mut(item.slot)) {
                    s.mark = mark;
                }
                self.result_of(item, outcome, skip_fence)
            })
            .collect();
        SlotResult::Raised(results)
    }

    fn release(&mut self, holder: Incarnation, items: &[(u64, Epoch)]) -> SlotResult {
        let mut count = 0;
        for &(slot, epoch) in items {
            if let Some(s) = self.get_mut(slot)
                && s.holder == holder
                && s.epoch == epoch
                && holder != NOBODY
            {
                s.holder = NOBODY;
                count += 1;
            }
        }
        SlotResult::Released { count }
    }

    /// Frees the slots of incarnations that are no longer registered (expired or superseded).
    pub fn forget_gone(&mut self, registered: &BTreeMap<Incarnation, impl Sized>) {
        for s in &mut self.slots {
            if s.holder != NOBODY && !registered.contains_key(&s.holder) {
                s.holder = NOBODY;
            }
        }
    }

    /// Raises every mark to at least `floor` (a restore: the backup may predate raises).
    pub fn raise_all(&mut self, floor: u64) {
        for s in &mut self.slots {
            s.mark = s.mark.max(floor);
            s.holder = NOBODY;
        }
    }
}

/// The arbiter's slot decisions. `want` names the incarnations that may gain slots, each with the
/// number it asks for (at least one, from its renewals); a slot whose holder is not in `keep`
/// (declared dead, superseded, gone) is free. In this order:
/// 1. each incarnation of `want` that holds none gets a free slot (lowest first); when none is
///    free, the holder of the most slots, if it holds more than one, gives up its highest;
/// 2. those holding fewer than they ask for get one free slot more each, in turns, until all have
///    what they asked for or no slot is free (a holder never takes another's slot to grow);
/// 3. a holder in `want` that holds more than it asks for frees the surplus, its highest slots
///    first, so that slots follow load.
///
/// A slot issues `ids_per_tick` ids a tick (4,096 a millisecond in Twitter's layout, 25,600 a
/// second in Sonyflake's): more than one AllocSvr answers in the first, far less in the second.
/// Every move raises the slot's epoch, so a holder that loses a slot is fenced out of raising it,
/// and the next holder's floor is at or above every mark the earlier one was acknowledged.
pub fn plan_grants(ids: &IdState, keep: &BTreeSet<Incarnation>, want: &BTreeMap<Incarnation, usize>) -> Vec<SlotMove> {
    let mut held: BTreeMap<Incarnation, Vec<u64>> = BTreeMap::new();
    let mut free = std::collections::VecDeque::new();
    for (slot, s) in ids.iter() {
        if s.holder != NOBODY && keep.contains(&s.holder) {
            held.entry(s.holder).or_default().push(slot);
        } else {
            free.push_back((slot, s.holder));
        }
    }
    let count = |held: &BTreeMap<Incarnation, Vec<u64>>, i: &Incarnation| held.get(i).map_or(0, Vec::len);
    let mut moves = Vec::new();
    for &to in want.keys() {
        if count(&held, &to) > 0 {
            continue;
        }
        let taken = free.pop_front().or_else(|| {
            // Ties go to the lowest incarnation, so that every leader plans alike.
            let (&donor, _) = held
                .iter()
                .filter(|(_, v)| v.len() > 1)
                .max_by_key(|(i, v)| (v.len(), std::cmp::Reverse(**i)))?;
            let slots = held.get_mut(&donor)?;
            slots.sort_unstable();
            Some((slots.pop()?, donor))
        });
        if let Some((slot, from)) = taken {
            moves.push(SlotMove { slot, from, to });
            held.entry(to).or_default().push(slot);
        }
    }
    'grow: loop {
        let mut grew = false;
        for (&to, &asked) in want {
            if count(&held, &to) >= asked {
                continue;
            }
            let Some((slot, from)) = free.pop_front() else {
                break 'grow;
            };
            moves.push(SlotMove { slot, from, to });
            held.entry(to).or_default().push(slot);
            grew = true;
        }
        if !grew {
            break;
        }
    }
    for (&from, &asked) in want {
        let Some(slots) = held.get_mut(&from) else { continue };
        slots.sort_unstable();
        for &slot in slots.iter().skip(asked.max(1)) {
            moves.push(SlotMove { slot, from, to: NOBODY });
        }
    }
    moves
}

impl IdState {
    /// The wire form of the setup (published with the cluster map, shown by Status).
    pub fn setup_pb(&self) -> seqsvr_proto::pb::IdSetup {
        seqsvr_proto::pb::IdSetup {
            layout: Some(self.layout.to_pb()),
            slots_per_set: self.per_set,
            max_ahead_ms: self.max_ahead_ms,
            key_placement: self.key_placement.to_pb(),
        }
    }
}

/// The setup a published map carries, as the command that adopts it (`None` when it carries none
/// or one that does not decode, a key placement of a later release included).
pub fn setup_from_pb(p: &seqsvr_proto::pb::IdSetup) -> Option<SlotCommand> {
    let layout = IdLayout::from_pb(p.layout.as_ref()?).ok()?;
    let placement = KeyPlacement::from_pb(p.key_placement)?;
    Some(SlotCommand::setup(layout, p.slots_per_set, p.max_ahead_ms, placement))
}

#[cfg(test)]
mod tests {
    use super::*;

    const I1: Incarnation = Incarnation(1);
    const I2: Incarnation = Incarnation(2);
    /// 2026-11-27T00:00:00Z.
    const NOW_MS: u64 = 1_795_737_600_000;

    fn set_up(set_id: u64) -> Option<IdState> {
        let mut ids = None;
        let setup = SlotCommand::Setup {
            layout: IdLayout::twitter(seqsvr_proto::id_layout::DEFAULT_EPOCH_MS),
            per_set: 64,
            max_ahead_ms: 60_000,
        };
        assert_eq!(
            apply(&mut ids, set_id, &setup, &live(&[])),
            SlotResult::SetUp { fresh: true }
        );
        assert_eq!(
            apply(&mut ids, set_id, &setup, &live(&[])),
            SlotResult::SetUp { fresh: false }
        );
        ids
    }

    /// A placement by hash slot is its own setup entry, recorded with the ids and published with
    /// them; a setup that differs only in its placement is refused once one applied.
    #[test]
    fn the_key_placement_is_set_up_with_the_ids_and_never_changes() {
        let layout = IdLayout::twitter(seqsvr_proto::id_layout::DEFAULT_EPOCH_MS);
        let slots = SlotCommand::setup(layout, 8, 60_000, KeyPlacement::Slots);
        assert!(matches!(slots, SlotCommand::SetupSlots { .. }));
        let sha = SlotCommand::setup(layout, 8, 60_000, KeyPlacement::Sha256);
        assert!(matches!(sha, SlotCommand::Setup { .. }));
        let mut ids = None;
        assert_eq!(
            apply(&mut ids, 1, &slots, &live(&[])),
            SlotResult::SetUp { fresh: true }
        );
        let state = ids.clone().unwrap();
        assert_eq!(state.key_placement, KeyPlacement::Slots);
        assert_eq!(setup_from_pb(&state.setup_pb()), Some(slots.clone()));
        assert_eq!(
            apply(&mut ids, 1, &slots, &live(&[])),
            SlotResult::SetUp { fresh: false }
        );
        match apply(&mut ids, 1, &sha, &live(&[])) {
            SlotResult::Refused(why) => assert!(why.contains("key placement slots"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(ids.as_ref(), Some(&state));
        // A placement of a later release is never taken for another.
        let mut later = state.setup_pb();
        later.key_placement = 9;
        assert_eq!(setup_from_pb(&later), None);
    }

    /// Each of `i` asking for one slot.
    fn one_each(i: &[Incarnation]) -> BTreeMap<Incarnation, usize> {
        i.iter().map(|&i| (i, 1)).collect()
    }

    fn live(i: &[Incarnation]) -> BTreeSet<Incarnation> {
        i.iter().copied().collect()
    }

    fn raise(ids: &mut Option<IdState>, holder: Incarnation, slot: u64, epoch: u64, mark: u64) -> RaiseOutcome {
        let cmd = SlotCommand::Raise {
            holder,
            items: vec![RaiseItem {
                slot,
                epoch: Epoch(epoch),
                mark,
            }],
            leader_ms: NOW_MS,
        };
        match apply(ids, 1, &cmd, &live(&[])) {
            SlotResult::Raised(r) => r[0].outcome,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn each_set_has_its_own_share_and_a_layout_never_changes() {
        let ids = set_up(1).unwrap();
        assert_eq!((ids.first, ids.slots.len()), (64, 64));
        let mut other = None;
        let too_many = SlotCommand::Setup {
            layout: IdLayout::twitter(0),
            per_set: 64,
            max_ahead_ms: 1,
        };
        let SlotResult::Refused(why) = apply(&mut other, 16, &too_many, &live(&[])) else {
            panic!()
        };
        assert!(
            why.contains("needs slots up to 1088, but the layout has 1024 (at most 16 sets of 64)"),
            "{why}"
        );
        let mut ids = Some(ids);
        let SlotResult::Refused(why) = apply(&mut ids, 1, &too_many, &live(&[])) else {
            panic!()
        };
        assert!(why.contains("cannot change"), "{why}");
    }

    /// A setup is an entry every replica applies, and one that allocated without a bound would
    /// crash-loop them all on it: a share above the bound, or a layout whose bits do not fit, is
    /// refused before anything is allocated. The first case is ordered first on purpose: today's
    /// code would allocate 2^17 slots (3 MiB) and fail the assertion, not try 192 GiB.
    #[test]
    fn a_setup_above_the_slot_bound_is_refused_before_allocating() {
        let wide = |slot_bits| IdLayout {
            tick_ms: 1_000,
            epoch_ms: 0,
            slot_bits,
            seq_bits: 1,
        };
        let cases = [
            (wide(33), 1 << 17, "at most 65536 slots a set"),
            (wide(33), 1 << 33, "at most 65536 slots a set"),
            (wide(70), 4, "slot and sequence bits"),
            (wide(62), 4, "slot and sequence bits"),
        ];
        for (layout, per_set, why) in cases {
            let setup = SlotCommand::Setup {
                layout,
                per_set,
                max_ahead_ms: 5_000,
            };
            let mut ids = None;
            let got = apply(&mut ids, 0, &setup, &live(&[]));
            let SlotResult::Refused(msg) = got else {
                panic!("{per_set} slots of {layout:?} were set up")
            };
            assert!(msg.contains(why), "{msg}");
            assert_eq!(ids, None);
            assert_eq!(setup_refusal(0, &setup), Some(msg));
        }
        // The bound itself is a valid share.
        let mut ids = None;
        let at_bound = SlotCommand::Setup {
            layout: wide(33),
            per_set: seqsvr_proto::limits::MAX_ID_SLOTS_PER_SET,
            max_ahead_ms: 5_000,
        };
        assert_eq!(
            apply(&mut ids, 1, &at_bound, &live(&[])),
            SlotResult::SetUp { fresh: true }
        );
    }

    #[test]
    fn a_grant_fences_the_previous_holder_and_marks_only_grow() {
        let mut ids = set_up(1);
        let tick = IdLayout::twitter(seqsvr_proto::id_layout::DEFAULT_EPOCH_MS)
            .tick_of(NOW_MS)
            .unwrap();
        let grant = |from, to| SlotCommand::Grant(vec![SlotMove { slot: 64, from, to }]);
        assert_eq!(
            apply(&mut ids, 1, &grant(NOBODY, I1), &live(&[I1])),
            SlotResult::Granted { moved: 1 }
        );
        assert_eq!(raise(&mut ids, I1, 64, 1, tick + 5_000), RaiseOutcome::Applied);
        assert_eq!(raise(&mut ids, I1, 64, 1, tick + 4_000), RaiseOutcome::NoOp);
        // Past the leader's clock plus a minute: refused, the mark stays.
        assert_eq!(
            raise(&mut ids, I1, 64, 1, tick + 3_600_000),
            RaiseOutcome::TooFarAhead { limit: tick + 60_000 }
        );
        assert_eq!(raise(&mut ids, I1, 0, 1, tick), RaiseOutcome::NotOurs);
        // A grant decided against an older holder changes nothing; the right one fences I1.
        assert_eq!(
            apply(&mut ids, 1, &grant(NOBODY, I2), &live(&[I2])),
            SlotResult::Granted { moved: 0 }
        );
        assert_eq!(
            apply(&mut ids, 1, &grant(I1, I2), &live(&[I2])),
            SlotResult::Granted { moved: 1 }
        );
        assert_eq!(raise(&mut ids, I1, 64, 1, tick + 6_000), RaiseOutcome::StaleEpoch);
        let s = *ids.as_ref().unwrap().get(64).unwrap();
        assert_eq!(
            (s.holder, s.epoch, s.mark),
            (I2, Epoch(2), tick + 5_000),
            "the new holder's floor"
        );
        // A release under an old epoch is ignored; under the current one frees the slot.
        let release = |epoch| SlotCommand::Release {
            holder: I2,
            items: vec![(64, Epoch(epoch))],
        };
        assert_eq!(
            apply(&mut ids, 1, &release(1), &live(&[])),
            SlotResult::Released { count: 0 }
        );
        assert_eq!(
            apply(&mut ids, 1, &release(2), &live(&[])),
            SlotResult::Released { count: 1 }
        );
        assert_eq!(ids.unwrap().get(64).unwrap().holder, NOBODY);
    }

    #[test]
    fn the_arbiter_gives_each_live_incarnation_one_slot_and_takes_back_dead_ones() {
        let mut ids = set_up(0);
        let both = live(&[I1, I2]);
        let plan = plan_grants(ids.as_ref().unwrap(), &both, &one_each(&[I1, I2]));
        assert_eq!(
            plan.iter().map(|m| (m.slot, m.to)).collect::<Vec<_>>(),
            [(0, I1), (1, I2)]
        );
        apply(&mut ids, 0, &SlotCommand::Grant(plan), &both);
        assert_eq!(plan_grants(ids.as_ref().unwrap(), &both, &one_each(&[I1, I2])), []);
        // I1 stopped renewing but is not declared dead: it keeps its slot, nobody new wants one.
        assert_eq!(plan_grants(ids.as_ref().unwrap(), &both, &one_each(&[I2])), []);
        // I1 died: I3 takes its slot, I2 keeps its own.
        let i3 = Incarnation(3);
        let now = live(&[I2, i3]);
        let plan = plan_grants(ids.as_ref().unwrap(), &now, &one_each(&[I2, i3]));
        assert_eq!(
            plan,
            [SlotMove {
                slot: 0,
                from: I1,
                to: i3
            }]
        );
    }

    #[test]
    fn slots_follow_what_each_holder_asks_for() {
        let mut ids = None;
        let four = SlotCommand::Setup {
            layout: IdLayout::twitter(seqsvr_proto::id_layout::DEFAULT_EPOCH_MS),
            per_set: 4,
            max_ahead_ms: 60_000,
        };
        apply(&mut ids, 0, &four, &live(&[]));
        let i3 = Incarnation(3);
        let all = live(&[I1, I2, i3]);
        let held = |ids: &Option<IdState>, i| ids.as_ref().unwrap().held_by(i).map(|(s, _)| s).collect::<Vec<_>>();
        let mv = |slot, from, to| SlotMove { slot, from, to };
        // Each first gets one, then they grow in turns until no slot is free.
        let plan = plan_grants(ids.as_ref().unwrap(), &all, &BTreeMap::from([(I1, 3), (I2, 2)]));
        assert_eq!(
            plan,
            [
                mv(0, NOBODY, I1),
                mv(1, NOBODY, I2),
                mv(2, NOBODY, I1),
                mv(3, NOBODY, I2)
            ]
        );
        apply(&mut ids, 0, &SlotCommand::Grant(plan), &all);
        assert_eq!((held(&ids, I1), held(&ids, I2)), (vec![0, 2], vec![1, 3]));
        // A newcomer finds none free: the holder of the most (the lowest incarnation of a tie)
        // gives up its highest; nobody else grows at another's cost.
        let want = BTreeMap::from([(I1, 3), (I2, 2), (i3, 1)]);
        let plan = plan_grants(ids.as_ref().unwrap(), &all, &want);
        assert_eq!(plan, [mv(2, I1, i3)]);
        apply(&mut ids, 0, &SlotCommand::Grant(plan), &all);
        assert_eq!(
            ids.as_ref().unwrap().get(2).unwrap().epoch,
            Epoch(2),
            "the move fences I1 out"
        );
        assert_eq!(plan_grants(ids.as_ref().unwrap(), &all, &want), []);
        // I2's load fell: it frees its surplus, and the next plan gives it to I1, which asks for more.
        let want = BTreeMap::from([(I1, 3), (I2, 1), (i3, 1)]);
        let plan = plan_grants(ids.as_ref().unwrap(), &all, &want);
        assert_eq!(plan, [mv(3, I2, NOBODY)]);
        apply(&mut ids, 0, &SlotCommand::Grant(plan), &all);
        assert_eq!(plan_grants(ids.as_ref().unwrap(), &all, &want), [mv(3, NOBODY, I1)]);
        // A holder that stopped renewing (not in `want`) keeps what it has, surplus or not.
        let want = BTreeMap::from([(I2, 1), (i3, 1)]);
        assert_eq!(plan_grants(ids.as_ref().unwrap(), &all, &want), []);
    }

    /// Through the whole state machine: a slot's Raise is bound to its holder's registration like a
    /// Bump, and a holder that registers again (a new process) loses its slots at once.
    #[test]
    fn raises_are_bound_to_the_registration_and_a_new_process_loses_its_slots() {
        use crate::domain::binding::SecretHash;
        use crate::domain::state::{Command, CommandResult, SetState};
        use seqsvr_proto::NodeId;
        use seqsvr_proto::params::SetParams;

        let mut st = SetState::default();
        st.apply(&Command::Init(SetParams::single_set(0)), false);
        let hash = SecretHash::of(b"sixteen bytes ok");
        let register = |nonce| Command::Bound {
            secret_hash: hash,
            cmd: Box::new(Command::Register {
                node_id: NodeId(1),
                addr: "127.0.0.1:1".into(),
                nonce,
            }),
        };
        let CommandResult::Registered { incarnation } = st.apply(&register(1), false) else {
            panic!()
        };
        let setup = SlotCommand::Setup {
            layout: IdLayout::twitter(0),
            per_set: 4,
            max_ahead_ms: 1_000,
        };
        st.apply(&Command::Slots(setup), false);
        let grant = SlotCommand::Grant(vec![SlotMove {
            slot: 0,
            from: NOBODY,
            to: incarnation,
        }]);
        assert_eq!(
            st.apply(&Command::Slots(grant), false),
            CommandResult::Slots(SlotResult::Granted { moved: 1 })
        );
        let raise = Command::Slots(SlotCommand::Raise {
            holder: incarnation,
            items: vec![RaiseItem {
                slot: 0,
                epoch: Epoch(1),
                mark: 5,
            }],
            leader_ms: 0,
        });
        assert_eq!(st.apply(&raise, false), CommandResult::NotBound, "a forged raise");
        let bound = Command::Bound {
            secret_hash: hash,
            cmd: Box::new(raise),
        };
        let CommandResult::Slots(SlotResult::Raised(r)) = st.apply(&bound, false) else {
            panic!()
        };
        assert_eq!((r[0].outcome, r[0].mark), (RaiseOutcome::Applied, 5));
        st.apply(&register(2), false);
        let slot = st.ids.as_ref().unwrap().get(0).unwrap();
        assert_eq!((slot.holder, slot.mark), (NOBODY, 5), "freed, its mark kept");
    }
}
