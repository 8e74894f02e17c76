//! The client-facing services of a replica: `StoreService` (`store`) and `AdminService` (`admin`,
//! with its move RPCs in `moves`, the audit trail's stamping and read in `audit`, and the
//! backup stream in `backup`).
//! The Raft peer service is in `raft::network`.
//!
//! Deliberately left out: deciding anything about ownership (`domain`); the services validate,
//! turn requests into commands, and map results and errors to replies.

pub(crate) mod admin;
pub(crate) mod audit;
pub(crate) mod backup;
pub(crate) mod moves;
pub mod store;
