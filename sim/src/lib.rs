//! The simulator of seqsvr-rs: it starts a real cluster as OS processes on loopback, puts a proxy
//! it controls on every network link, drives seeded concurrent clients, injects faults, records
//! every call and checks the promises P1–P6 of docs/DESIGN.md over the whole history.
//!
//! Layers, bottom up:
//! - [`history`]: one record per call (invoke/complete times, outcome, values, owner), written as
//!   JSON lines and read back. The checkers only ever see a history, so a run and an offline
//!   `sim check` judge the same thing.
//! - [`checks`]: one pure function per promise over a history; no IO, no clock.
//! - [`proxy`]: a TCP proxy per directed link whose mode (pass, drop, delay, one-way cut, hold)
//!   changes at runtime and affects connections already open (gRPC keeps them open).
//! - process control (start, SIGKILL, SIGSTOP/SIGCONT, SIGTERM, one log per process, nothing left
//!   running when the simulator ends) is `seqsvr-harness`'s supervisor, shared with the benchmarks
//!   and the end-to-end tests.
//! - [`schedule`]: the seeded fault schedule (pure: same seed, same schedule).
//! - [`stats`]: unavailability per fault, computed from the history after the run.
//! - [`topology`], [`workload`], [`run`]: the wiring of 3 StoreSvrs + 3 AllocSvrs per set behind
//!   proxies, the seeded clients (routing ones and pinned ones that play stale clients), and
//!   `sim run`, whose operator moves between sets run the real `seqctl` (`run/` keeps the
//!   orchestration in `mod.rs`, the cluster's life in `cluster.rs`, the fault injector in
//!   `faults.rs` and the operator moves in `moves.rs`).
//! - [`verify`]: what `sim run` and `sim load` do around the workload (every section served once
//!   before, every touched uid served again after).
//! - [`load`]: `sim load`, the same workload and recorder against a cluster started elsewhere
//!   (scripts/netns-cluster.sh: every process in its own network namespace), faults injected by
//!   its operator.
//!
//! - [`tls`]: `sim run --tls`: mutual TLS with roles on every link, certificates made per run.
//!
//! - [`dst`]: `sim dst`, the deterministic mode: the production protocol code of a whole set in
//!   one thread on simulated time, thousands of seeds a minute, each replayable bit for bit.
//!
//! In `sim run` the processes are real, so a seed fixes the workload and the fault schedule, not
//! the interleaving; `sim dst` fixes both.

pub mod checks;
pub mod dst;
pub mod front_workload;
pub mod history;
pub mod id_workload;
pub mod keys;
pub mod ledger_workload;
pub mod load;
pub mod proxy;
pub mod run;
pub mod schedule;
pub mod stats;
pub mod tls;
pub mod topology;
pub mod verify;
pub mod workload;
