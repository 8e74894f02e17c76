//! The one error enum of the AllocSvr and its one mapping to `tonic::Status`.
//!
//! Expected outcomes of a fetch (not the owner, not ready yet) are not errors: they travel as
//! `Outcome` values in the reply together with the route table. What is left here is what the
//! caller must act on: fix the request, retry later, or give up starting.

/// Why an AllocSvr call or start failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is wrong (uid outside `[0, uid_limit)`, empty or oversized batch): fix it.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The node cannot answer now (shutting down, store unreachable): retry, maybe elsewhere.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The uid's section has used up the 64-bit sequence space: no retry will help.
    #[error("{0}")]
    Exhausted(String),
    /// The node could not start (bad parameters from the store, cannot bind): give up.
    #[error("cannot start: {0}")]
    Startup(String),
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        match e {
            Error::InvalidArgument(m) => tonic::Status::invalid_argument(m),
            Error::Unavailable(m) => tonic::Status::unavailable(m),
            Error::Exhausted(m) => tonic::Status::resource_exhausted(m),
            Error::Startup(m) => tonic::Status::internal(m),
        }
    }
}
