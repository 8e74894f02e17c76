//! The replica's background loops, each over the [`Shared`](crate::shared::Shared) state.
//!
//! - [`arbiter`]: liveness bookkeeping and one ownership decision per tick, on the leader.
//!
//! Deliberately left out: Raft's own tasks (openraft runs them) and the writer's (`raft::writer`).

pub mod arbiter;
