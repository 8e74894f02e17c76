//! openraft wiring: the type configuration, the peer network over gRPC, the writer that packs
//! concurrent commands into one entry (openraft 0.9 does not group-commit), and a follower's
//! campaign when a stopping leader asks for it (`handoff`).
//!
//! Deliberately left out: storage (`storage`) and the client-facing services (`grpc`).

pub mod clocks;
pub mod handoff;
pub mod identity;
pub mod network;
pub mod types;
pub mod writer;
