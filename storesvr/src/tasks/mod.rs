//! The replica's background loops, each over the [`ReplicaState`](crate::replica::ReplicaState) state.
//!
//! - [`arbiter`]: liveness bookkeeping and one ownership decision per tick, on the leader.
//! - [`handoff`]: on SIGTERM, the leader hands its leadership to a caught-up follower.
//! - [`metrics`]: Raft and set-state gauges for Prometheus, sampled on every replica.
//!
//! Deliberately left out: Raft's own tasks (openraft runs them) and the writer's (`raft::writer`).

pub(crate) mod arbiter;
pub mod handoff;
pub mod metrics;
