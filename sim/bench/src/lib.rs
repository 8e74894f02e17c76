//! The benchmarks of seqsvr-rs (not published), as two binaries: `alloc-bench` (the AllocSvr data
//! plane against a bare tonic echo, the client library against Redis) and `store-bench` (committed
//! bumps against the disk's fsync rate). Both start every process they need through
//! `seqsvr-harness` and print ratios against baselines measured in the same run.
//!
//! - [`echo`]: the baseline server; [`load`]: closed-loop load and its samples; [`report`]:
//!   medians and verdicts; [`procfs`]: RSS, CPU and metrics of the processes under test.
//!
//! Deliberately left out: faults (the simulator's job) and timing assertions in tests.

pub mod echo;
pub mod load;
pub mod procfs;
pub mod report;
