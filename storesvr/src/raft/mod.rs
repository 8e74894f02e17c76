//! openraft wiring: the type configuration, the peer network over gRPC, and the writer that
//! packs concurrent commands into one entry (openraft 0.9 does not group-commit).
//!
//! Deliberately left out: storage (`storage`) and the client-facing services (`grpc`).

pub mod clocks;
pub mod identity;
pub mod network;
pub mod types;
pub mod writer;
