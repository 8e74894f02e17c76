//! The AllocSvr's errors: [`Error`] for a call, with its one mapping to `tonic::Status`, and
//! [`StartError`] for a node that cannot start.
//!
//! Expected outcomes of a fetch (not the owner, not ready yet) are not errors: they travel as
//! `Outcome` values in the reply together with the route table. What is left here is what the
//! caller must act on: fix the request, retry later, or give up.

/// Why an AllocSvr call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is wrong (uid outside `[0, uid_limit)`, empty or oversized batch): fix it.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The uid's section has used up the 64-bit sequence space: no retry will help. Answered as
    /// RESOURCE_EXHAUSTED marked `exhausted` (`seqsvr_proto::refusal`).
    #[error("{0}")]
    Exhausted(String),
    /// This node cannot answer now, another may (no id slot held, a clock behind the slot's last
    /// tick, a mark not yet raised): retry, here after a moment or on another AllocSvr.
    #[error("{0}")]
    Unavailable(String),
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        match e {
            Error::InvalidArgument(m) => tonic::Status::invalid_argument(m),
            // Marked, so that callers tell it from an overloaded server's RESOURCE_EXHAUSTED.
            Error::Exhausted(m) => seqsvr_proto::refusal::exhausted(m),
            Error::Unavailable(m) => tonic::Status::unavailable(m),
        }
    }
}

/// Why a node could not start; the binary prints it and exits non-zero.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The data-plane address cannot be bound.
    #[error("cannot bind {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    /// TLS could not be set up (a bad certificate or key).
    #[error("TLS: {0}")]
    Tls(String),
    /// The store client cannot be built from the configured addresses.
    #[error("bad store addresses: {0}")]
    StoreAddrs(String),
    /// No StoreSvr accepted the registration before the start timeout.
    #[error("no store accepted the registration: {0}")]
    NoStore(String),
    /// The store refused the registration.
    #[error("store refused registration: {0}")]
    Refused(String),
    /// The store's reply cannot be used (missing or unsafe set parameters).
    #[error("{0}")]
    BadReply(String),
    /// An HTTP or Redis front end could not start.
    #[error("front end: {0}")]
    Front(String),
}
