//! The wire contract of seqsvr-rs (gRPC package `seqsvr.v1`) and the domain
//! newtypes every crate shares.
//!
//! - [`pb`]: generated messages and services: data plane (`AllocService`),
//!   control plane (`StoreService`), Raft peers (`RaftService`), operators
//!   (`AdminService`).
//! - [`types`]: `Uid`, `SectionId`, `Epoch`, `NodeId`, `Incarnation` so that
//!   values that look alike cannot be swapped by mistake.
//! - [`routes`]: a validated route table with uid → owner lookup.
//! - [`map_header`]: the request header that carries a data-plane caller's cluster map version.
//! - [`backup`]: the backup file's layout (header, opaque state, checksum), pure bytes.
//! - [`limits`]: every message size and per-request count, shared by servers and clients.
//! - [`addr`]: `host:port` and `id=host:port`, parsed once for every flag and client.
//! - [`params`]: a set's parameters and the one set of rules they must keep.
//! - [`cli`]: how every binary takes options: flags, environment, config file.
//! - [`reflection`]: gRPC reflection (v1 and v1alpha) listing only what a port serves.
//! - [`observe`]: the latency histogram buckets both servers' metrics use.
//! - [`serving`]: the limits every server runs with (calls in flight, streams per connection,
//!   deadlines), set by one function on a tonic `Server` builder.
//! - [`lease_clock`]: the clock lease deadlines are read on, counting the host's suspended time.
//! - [`refusal`]: how RESOURCE_EXHAUSTED says "overloaded, retry" apart from "sequence space
//!   used up, give up".
//!
//! Deliberately left out: any network IO (the only IO here is [`cli`] reading a config file;
//! [`lease_clock`] reads the host's clocks). Clients, servers and retries live in the
//! crates that need them.

pub mod addr;
pub mod backup;
pub mod cli;
pub mod lease_clock;
pub mod limits;
pub mod map_header;
pub mod observe;
pub mod params;
pub mod reflection;
pub mod refusal;
pub mod routes;
pub mod serving;
pub mod types;

/// Generated protobuf messages and gRPC stubs of `seqsvr.v1`.
pub mod pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("seqsvr.v1");
}

/// Encoded file descriptor set, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("seqsvr_v1_descriptor");

pub use routes::{RouteError, Routes};
pub use types::{Epoch, Incarnation, NodeId, SectionId, Uid};
