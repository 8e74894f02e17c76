//! The pure heart of a replica: the replicated state and its deterministic `apply`, and the
//! arbiter's placement and liveness decisions. No IO, no clock reads (`now` is passed in).
//!
//! Deliberately left out: storing, replicating and serving any of it.

pub mod arbiter;
pub mod state;
