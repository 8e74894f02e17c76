//! Test and benchmark harness of seqsvr-rs (not published): the one process supervisor that the
//! simulator, the benchmarks and the end-to-end tests start real servers with, and loopback
//! helpers.
//!
//! - [`supervisor`]: named processes with a log file each; kill, pause, resume, terminate with a
//!   grace, wait for an exit, crash and panic detection; everything killed on drop.
//! - [`net`]: a free loopback port, waiting until a port listens, polling with a deadline.
//! - [`reflection`]: which services a port lists over gRPC reflection v1 and v1alpha.
//! - [`bounded`]: a command that must end by itself (a refusal), run with a time limit.
//!
//! Deliberately left out: anything a production deployment would run; this crate only starts
//! processes for tests, benchmarks and the simulator.

pub mod bounded;
pub mod net;
pub mod reflection;
pub mod supervisor;

pub use bounded::output_within;
pub use net::{free_addr, poll_until, wait_listening};
pub use supervisor::{PanicLine, ProcSpec, Signal, Supervisor, find_binary};
