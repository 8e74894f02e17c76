//! StoreSvr's error for an RPC it cannot answer, and its one mapping to a gRPC status.
//!
//! "Not the leader" is not here: it is an expected outcome, carried in the
//! reply's `not_leader` field so the caller can follow it.

use tonic::Status;

/// What went wrong, named for what the caller should do.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    /// Fix the request: unknown section, uid out of range, malformed or oversized input.
    #[error("{0}")]
    InvalidArgument(String),
    /// The request is well-formed but not allowed in this state (unknown incarnation,
    /// reused node id, set not initialized yet).
    #[error("{0}")]
    FailedPrecondition(String),
    /// The call names an incarnation it cannot prove to be (no secret, or not the one that
    /// incarnation registered with): only the process that registered may act in its name.
    /// Resending will not help; a process that lost its secret registers again.
    #[error("{0}")]
    Unauthenticated(String),
    /// The request names something that does not exist (a ledger, a number above the highest).
    #[error("{0}")]
    NotFound(String),
    /// The request conflicts with what exists and was not a repeat of it (a confirm with another
    /// reference than the first).
    #[error("{0}")]
    AlreadyExists(String),
    /// A bound was reached (held or voided numbers, ledgers): an operator's step frees room.
    #[error("{0}")]
    ResourceExhausted(String),
    /// Retry later or elsewhere: no quorum, Raft shutting down, deadline passed; nothing was
    /// written.
    #[error("{0}")]
    Unavailable(String),
    /// A write was proposed and its outcome is unknown (timed out, quorum lost, Raft stopped
    /// after proposing): it may have been committed. UNKNOWN on the wire, which callers treat as
    /// "may have happened" (retry the same write; never "did not happen").
    #[error("the write may have been committed: {0}")]
    MaybeCommitted(String),
    /// A bug in this server (a result the command cannot produce): retrying will not help.
    #[error("{0}")]
    Internal(String),
    /// The Raft node stopped (storage failure): this replica is out of service.
    #[error("raft node stopped: {0}")]
    Fatal(String),
}

impl From<RpcError> for Status {
    fn from(e: RpcError) -> Status {
        match e {
            RpcError::InvalidArgument(m) => Status::invalid_argument(m),
            RpcError::FailedPrecondition(m) => Status::failed_precondition(m),
            RpcError::Unauthenticated(m) => Status::unauthenticated(m),
            RpcError::Unavailable(m) => Status::unavailable(m),
            RpcError::NotFound(m) => Status::not_found(m),
            RpcError::AlreadyExists(m) => Status::already_exists(m),
            // Marked exhausted, not overloaded: no retry passes until room is made.
            RpcError::ResourceExhausted(m) => seqsvr_proto::refusal::exhausted(m),
            RpcError::MaybeCommitted(m) => Status::unknown(format!("the write may have been committed: {m}")),
            RpcError::Internal(m) => Status::internal(m),
            RpcError::Fatal(m) => Status::internal(format!("raft node stopped: {m}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use seqsvr_rpc::classify::{Delivery, classify};

    /// Issue 25, item 8: a write whose outcome is unknown must reach the caller as "may have
    /// happened". It went out as UNAVAILABLE, which callers read as "not taken".
    #[test]
    fn a_write_that_may_have_committed_is_never_classified_as_not_taken() {
        let maybe: Status = RpcError::MaybeCommitted("timed out".into()).into();
        assert_eq!(classify(&maybe).delivery, Delivery::Maybe, "{maybe:?}");
        let refused: Status = RpcError::Unavailable("no quorum".into()).into();
        assert_eq!(classify(&refused).delivery, Delivery::NotTaken);
    }
}
