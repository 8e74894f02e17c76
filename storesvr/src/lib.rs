//! StoreSvr: one Raft group per set, keeping what AllocSvrs need durably.
//!
//! Modules, bottom up:
//! - `state`: the pure replicated state (sections' `max_seq`, epochs, owners,
//!   AllocSvr registry, route version) and its deterministic `apply`.
//! - `kv`, `segment_log`, `log_store`, `sm_store`: openraft storage (log entries in
//!   segment files, vote, commit index, purge point and snapshot one file per key;
//!   in-memory state machine with persisted snapshots).
//! - `raft_types`, `network`: openraft wiring; peer RPCs over gRPC.
//!
//! Promises kept here: P2 (a bump is acknowledged only once committed by a
//! quorum that synced it), P3 (`max_seq` only grows) and the store half of P4
//! (bumps are fenced by epoch inside the state machine).

// openraft's storage traits fix the error type to its (large) `StorageError`.
#![allow(clippy::result_large_err)]

pub mod admin;
pub mod arbiter;
pub mod config;
pub mod error;
pub mod kv;
pub mod log_store;
pub mod network;
pub mod node;
pub mod raft_types;
pub mod segment_log;
pub mod service;
pub mod sm_store;
pub mod state;
pub mod writer;
