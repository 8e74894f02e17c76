//! AllocSvr of seqsvr-rs: owns sections of one set under leases, keeps `cur_seq` of every uid of
//! its sections in memory and answers `FetchNextSeq` from memory, raising a section's durable
//! ceiling `max_seq` by `step` through the StoreSvr before it is reached.
//!
//! Modules, from pure decision logic to IO:
//! - [`lease`]: lease arithmetic from send time, gain wait (pure, takes `now`).
//! - [`section`]: one section's memory, `try_next` and prefetch decisions (pure).
//! - [`grants`]: what a renewal reply changes: drop, gain, release (pure).
//! - [`ids`]: time-ordered ids, in a folder of their own: one slot's pure issuing rules, the
//!   clock ids are stamped with, the slots this node holds, and `NextIds`.
//! - [`owned`]: the map of held sections and the published lease end, read on every fetch.
//! - [`store`]: the store calls the node makes, as a trait (the gRPC client implements it).
//! - [`state`]: the state the service and the tasks share ([`state::AllocState`]), behind methods.
//! - [`tasks`]: registration and renewal, gaining, bumping, releasing — the IO loops.
//! - [`service`]: the `AllocService` gRPC data plane, one file per group of calls (`NextIds` is
//!   answered by [`ids::service`]).
//! - [`ledger`]: the `LedgerService` every node serves, forwarding each call to the StoreSvr
//!   leader of the set that keeps the key.
//! - [`front`]: the HTTP/JSON and Redis-protocol front ends, whose calls are forwarded to the
//!   owner wherever they land.
//! - [`node`]: the composition root: start, wire, shut down.
//! - [`config`], [`error`], [`metrics`], [`rpc_metrics`] (per-method latency and error codes),
//!   [`metrics_http`] (the Prometheus page).
//!
//! Promises kept here (docs/DESIGN.md): P1 (per-uid increase; reload on every gain), P2 (never
//! above the acknowledged ceiling), P4 with the store's epochs (lease from send time, gain wait,
//! fenced bumps), P5 (GetCurSeq), P6 (dense per-uid counters, one step reserved at a time).
//!
//! Start in-process with [`Node::start`]; the `allocsvr` binary wraps it with options, logging,
//! metrics and signal handling.
//!
//! Deliberately left out: durable state (an AllocSvr is stateless between restarts) and routing
//! of gRPC requests to the owner (a gRPC caller routes itself with the route table; only the
//! HTTP and Redis front ends forward).

pub mod cluster;
pub mod config;
pub mod error;
pub mod front;
pub mod grants;
pub mod hop;
pub mod ids;
pub mod lease;
pub mod ledger;
pub mod metrics;
pub mod metrics_http;
pub mod node;
pub mod owned;
pub mod peers;
pub mod rpc_metrics;
pub mod section;
pub mod service;
pub mod state;
pub mod store;
pub mod tasks;

pub use config::{Cli, NodeConfig, UnsafeRules};
pub use error::{Error, StartError};
pub use node::{Core, Node};
