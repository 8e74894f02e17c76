//! The pure core of StoreSvr: what the Raft group replicates and how the leader decides who owns
//! what. No IO, no clock reads (`now` is handed in), no async: these are the parts the unit tests
//! and the simulator exercise most.
//!
//! - [`section`]: the shared words (sections, spans, a section's record); a leaf.
//! - [`command`]: the commands one Raft entry carries, their results, and both in words.
//! - [`state`]: the replicated state of a set and its deterministic `apply` (P3, the store half
//!   of P4, the bound on bumps), which wraps the sub-machines below.
//! - [`moves`] and [`cluster_map`]: sub-machines with their own commands and results — a set's
//!   side of a move (range steps), and the cluster map with its move records (set 0 only).
//! - [`slots`]: worker slots for time-ordered ids (holder, epoch and high-water mark per slot),
//!   a sub-machine with its own commands and results, and the arbiter's slot grants.
//! - [`ledger`]: ledger counters (numbers with no gaps, each held, confirmed or voided), a
//!   sub-machine with its own commands and results, keyed by counter key.
//! - [`binding`]: which incarnation registered with which secret (as its hash), and the check
//!   that binds its Renews, Releases and Bumps to that registration.
//! - [`audit`]: the bounded trail of admin actions (who, when, what, outcome) in that state.
//! - [`restore`]: a backed-up state made safe to serve again (every ceiling raised by a margin).
//! - [`liveness`]: when the leader last heard from each AllocSvr incarnation, and who counts as
//!   alive at a given instant.
//! - [`arbiter`]: the balanced layout of sections over live incarnations and the moves and
//!   handovers that approach it.
//!
//! Left out: applying decisions (the arbiter task writes them through Raft) and everything
//! about storage and the network.

pub(crate) mod arbiter;
pub mod audit;
pub mod binding;
pub mod cluster_map;
pub mod command;
#[cfg(test)]
mod format_pins;
pub mod ledger;
pub(crate) mod liveness;
pub mod moves;
pub mod ranges;
pub mod restore;
#[cfg(test)]
mod scripts;
pub mod section;
pub mod slots;
pub mod state;
#[cfg(test)]
pub(crate) mod state_props;
#[cfg(test)]
pub(crate) mod testing;
