//! The client-facing services of a replica: `StoreService` (`store`) and `AdminService` (`admin`,
//! with the audit trail's stamping and read in `audit`, and the backup stream in `backup`). The
//! calls `protocol::step` decides take one path, `serve`: the read index or the write around the
//! step, and the one mapping of its outcome to a response.
//! The Raft peer service is in `raft::network`.
//!
//! Deliberately left out: deciding anything about ownership (`domain`, `protocol`); the services
//! put Raft around the decisions, and add logs and metrics.

pub(crate) mod admin;
pub(crate) mod audit;
pub(crate) mod backup;
pub(crate) mod ledger;
pub(crate) mod serve;
pub mod store;
