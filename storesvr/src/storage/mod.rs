//! openraft storage: log entries in `fdatasync`ed segment files, the vote, commit index, purge
//! point and snapshot one durable file per key, and the in-memory state machine with persisted
//! snapshots.
//!
//! Deliberately left out: what the entries mean (`domain::state`).

pub mod dirs;
pub mod durability;
pub mod fault;
pub mod kv;
pub mod log_store;
pub mod segment_log;
pub mod sm_store;
