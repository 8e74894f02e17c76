//! The words every part of a set's state machine shares: sections and spans of them, a section's
//! durable record, and runs of sections that share an owner or a state.
//!
//! A leaf: it imports nothing of the state machine but the range states (`ranges`), so that the
//! sub-machines (`state`, `moves`, `cluster_map`) and the narration of commands can all use it
//! without importing each other.
//!
//! Left out: what changes a section (the commands and the machines that apply them).

use seqsvr_proto::params::SetParams;
use seqsvr_proto::{Epoch, Incarnation, SectionId};
use serde::{Deserialize, Serialize};

use super::ranges::RangeState;

/// The owner of a section nobody owns.
pub const NOBODY: Incarnation = Incarnation(0);

/// Position of `section` in [`SetState::sections`] (which covers the whole section space).
pub(crate) fn slot(section: SectionId) -> usize {
    section.0 as usize
}

/// The part of `[begin, end)` that lies inside the section space, section by section.
pub(crate) fn clamp(p: &SetParams, begin: SectionId, end: SectionId) -> impl Iterator<Item = SectionId> + use<> {
    sections(begin, end.min(SectionId(p.total_sections())))
}

/// Sections `[begin, end)` one by one.
pub fn sections(begin: SectionId, end: SectionId) -> impl Iterator<Item = SectionId> {
    (begin.0..end.0).map(SectionId)
}

/// The states of sections `[begin, end)` that `sections` (indexed by section) holds, with their ids.
pub fn sections_of(
    sections: &[SectionState],
    begin: SectionId,
    end: SectionId,
) -> impl Iterator<Item = (SectionId, &SectionState)> {
    let last = end.min(SectionId(sections.len() as u64)).max(begin);
    let states = sections.get(slot(begin)..slot(last)).unwrap_or_default();
    states
        .iter()
        .enumerate()
        .map(move |(i, s)| (SectionId(begin.0 + i as u64), s))
}

/// Sections `[begin, end)`: what an owner is asked to hand over, or what a request names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span {
    pub begin: SectionId,
    pub end: SectionId,
}

/// Consecutive sections `[begin, end)` with one owner (epochs may differ).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OwnerRun {
    pub begin: SectionId,
    pub end: SectionId,
    pub owner: Incarnation,
}

/// Consecutive sections `[begin, end)` that share one state (owner, epoch, `no_wait`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run<'a> {
    pub begin: SectionId,
    pub end: SectionId,
    pub state: &'a SectionState,
    /// What the set may do with these sections.
    pub range: RangeState,
}

/// One section's durable state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SectionState {
    /// Durable ceiling: no uid of the section is ever given a seq above it.
    pub max_seq: u64,
    /// Raised on every ownership change; a bump must carry it.
    pub epoch: Epoch,
    /// Incarnation of the owner; [`NOBODY`] = unowned.
    pub owner: Incarnation,
    /// The current (or next) owner may serve without waiting out the previous
    /// owner's lease: there was no previous owner, or it released the section.
    pub no_wait: bool,
}

impl SectionState {
    /// Hands the section to `owner` under a new epoch.
    pub(crate) fn change_owner(&mut self, owner: Incarnation) {
        self.owner = owner;
        self.epoch = Epoch(self.epoch.0 + 1);
    }
}
