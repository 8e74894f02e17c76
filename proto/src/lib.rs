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
//! - [`keys`]: which strings name a counter and where a key lives in the uid space.
//! - [`id_layout`]: how a time-ordered id's 63 bits split into time, slot and sequence.
//! - [`params`]: a set's parameters and the one set of rules they must keep.
//! - [`refusal`]: how RESOURCE_EXHAUSTED says "overloaded, retry" apart from "sequence space
//!   used up, give up".
//!
//! Deliberately left out: any IO. The plumbing every process shares (options, server limits,
//! reflection, the lease clock) is `seqsvr-plumbing`; clients, servers and retries live in the
//! crates that need them. An application that links the client library gets this contract
//! without any of it.

pub mod addr;
pub mod backup;
pub mod id_layout;
pub mod keys;
pub mod limits;
pub mod map_header;
pub mod params;
pub mod refusal;
pub mod routes;
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
