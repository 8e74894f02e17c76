//! StoreSvr: one Raft group per set, keeping what AllocSvrs need durably.
//!
//! Modules, from the pure core out:
//! - [`domain`]: the replicated state and its deterministic `apply`; the arbiter (pure, `now`
//!   passed in).
//! - [`storage`]: openraft storage (log entries in segment files; vote, commit index, purge point
//!   and snapshot one durable file per key; the in-memory state machine).
//! - [`raft`]: openraft wiring: types, the peer network over gRPC, the group-committing writer.
//! - [`protocol`]: the StoreService's protocol calls as plain functions over the applied state
//!   (check, command, reply), driven by the gRPC handlers and by the deterministic simulator.
//! - [`replica`]: the state the services and tasks share ([`replica::ReplicaState`]); [`grpc`]:
//!   StoreService and AdminService; [`tasks`]: the arbiter loop and the metrics loop.
//! - [`backup`] (the backup file of the applied state) and [`restore`] (`storesvr restore`: a new
//!   set's first data dir from a backup, every ceiling raised by a margin).
//! - [`config`], `startup` (data-dir and bootstrap checks), [`error`], and [`node`], which only
//!   wires everything together.
//!
//! Exported is what others use — the `storesvr` binary, the simulator (the domain, the protocol
//! calls, backup and restore, the route builder) and this crate's integration tests (storage and
//! Raft types); `startup`, the arbiter loop and the admin handlers are the crate's own.
//!
//! Promises kept here: P2 (a bump is acknowledged only once committed by a
//! quorum that synced it), P3 (`max_seq` only grows) and the store half of P4
//! (bumps are fenced by epoch inside the state machine).

// openraft's storage traits fix the error type to its (large) `StorageError`.
#![allow(clippy::result_large_err)]

pub mod backup;
pub mod config;
pub mod domain;
pub mod error;
pub mod grpc;
pub mod node;
pub mod protocol;
pub mod raft;
pub mod replica;
pub mod restore;
pub(crate) mod startup;
pub mod storage;
pub mod tasks;
