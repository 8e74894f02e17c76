//! The benchmarks of seqsvr-rs (not published), as seven binaries in `src/bin/`, first of them
//! `alloc-bench` (the AllocSvr data plane against a bare tonic echo, the client library and the
//! AllocSvr next to Redis and etcd) and `store-bench` (committed bumps against the disk's fsync
//! rate). Each starts every process it needs through `seqsvr-harness` and prints ratios against
//! baselines measured in the same run; what more than one of them does is in this library.
//!
//! - [`args`]: the flags the benchmarks share; [`setup`]: what every run sets up (binaries, temp
//!   dir, supervisor, one AllocSvr, the header lines) and the check after each case; [`echo`]: the
//!   baseline server; [`load`]: closed-loop load and its samples; [`report`]:
//!   medians and verdicts; [`procfs`]: RSS, CPU and metrics of the processes under test;
//!   [`peers`]: Redis INCR and an etcd counter, driven by the same load loop.
//! - `cost-curves` (third binary) and its parts: [`cluster`]: start a StoreSvr set and AllocSvrs,
//!   wait for ownership, touch uids; [`costs`]: the uid sets, tables and extrapolation of the cost
//!   curves; [`plot`]: PNG line charts (also alloc-bench's latency plots); [`tls`]: `--tls`, every
//!   link of the run over mutual TLS; [`exit`]: the benchmarks' shared `main` body and exit codes;
//!   [`callgrind`]: what the instruction-counting drivers (examples) share.
//! - `takeover-bench` (fourth binary): one section changing AllocSvr under load.
//! - `front-bench` (seventh binary): the HTTP/JSON and RESP front ends against Redis and a bare
//!   HTTP handler, driven by `redis-benchmark` and `wrk`; `cluster-bench`: Redis Cluster clients
//!   against AllocSvrs and a Redis Cluster; [`redis_benchmark`]: what both read from
//!   `redis-benchmark`.
//! - `counter-bench` (sixth binary): named counters against the uid path and Redis
//!   `INCR`/`INCRBY`, and the memory of a live key on each side; [`counters`]: its loads.
//! - `ids-bench` (fifth binary): time-ordered ids (`NextIds`) against the echo and a Snowflake
//!   server others wrote; [`ids`]: its load, waiting for a slot, one slot's in-process ceiling,
//!   its table and verdicts; [`ferroid`]: ferroid-tonic-server, started and driven.
//!
//! - `ledger-bench`: ledger counters' reserve+confirm pairs against the same pairs as PostgreSQL
//!   transactions; [`ledgers`]: the ledger load, the numbers each pair got and the final check;
//!   [`postgres`]: the system's PostgreSQL started in the run's dir, its load and its tally.
//!
//! Deliberately left out: faults (the simulator's job) and timing assertions in tests.

pub mod args;
pub mod callgrind;
pub mod cluster;
pub mod costs;
pub mod counters;
pub mod echo;
pub mod exit;
pub mod ferroid;
pub mod ids;
pub mod ledgers;
pub mod load;
pub mod peers;
pub mod plot;
pub mod postgres;
pub mod procfs;
pub mod redis_benchmark;
pub mod report;
pub mod setup;
pub mod tls;
