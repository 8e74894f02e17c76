//! What every seqsvr-rs process shares besides the wire contract (`seqsvr-proto`): the plumbing of
//! a server and of a command line.
//!
//! - [`cli`]: how every binary takes options: flags, environment, config file.
//! - [`serve_limits`]: the limits every server runs with (calls in flight, streams per connection,
//!   deadlines), set by one function on a tonic `Server` builder.
//! - [`reflection`]: gRPC reflection (v1 and v1alpha) listing only what a port serves.
//! - [`observe`]: the latency histogram buckets both servers' metrics use.
//! - [`lease_clock`]: the clock lease deadlines are read on, counting the host's suspended time.
//! - [`version`]: the release and commit every binary reports.
//!
//! Deliberately left out: the messages, newtypes and limits (`seqsvr-proto`, which applications
//! link without any of this), TLS and roles (`seqsvr-auth`), and any service.

pub mod cli;
pub mod lease_clock;
pub mod observe;
pub mod reflection;
pub mod serve_limits;
pub mod version;
