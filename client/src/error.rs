//! The one error type of the client library.
//!
//! Every failed call ends in exactly one of two states, because the caller must act differently:
//!
//! - [`ClientError::Failed`]: the request certainly did not take effect (it was refused before it was
//!   sent, or every attempt was answered with a refusal). Retrying later is safe and no number was used.
//! - [`ClientError::Unknown`]: at least one attempt may have reached a server that may have handed out a
//!   number, and no attempt came back with a value. docs/DESIGN.md: a timed-out call is never "did not
//!   happen". It is also never a number: there is no default seq.
//!
//! Deliberately left out: a mapping to `tonic::Status`. This crate is only a client; servers keep their
//! own error enums.

use std::fmt;

/// Why a call certainly did not take effect; tells the caller what to do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// The input is wrong (uid outside `[0, uid_limit)`, empty or oversized batch): fix it, do not retry.
    InvalidArgument,
    /// No server could serve the request before the deadline (unreachable, not the owner, not
    /// ready): retry later.
    Unavailable,
    /// As [`FailureKind::Unavailable`], and the last refusal was the owner's overload: it is alive
    /// but had no room for the call before the deadline. Retry later, with fewer calls at once.
    Overloaded,
    /// The client was built with an unusable configuration: fix the configuration.
    BadConfig,
    /// The uid's section has used up its 64-bit sequence space: no retry, anywhere, will ever
    /// serve this uid again. (An *overloaded* server answers the same gRPC code; that one is
    /// retried and ends as [`FailureKind::Overloaded`] if it never passes.)
    Exhausted,
    /// Ledgers: no such ledger, or a number never handed out: create it or check the number.
    NotFound,
    /// Ledgers: the record says otherwise (the number is confirmed with another reference, the
    /// ledger exists with another hold): do not retry; the message names what is recorded.
    Conflict,
    /// Ledgers: the number's state does not allow the call (voided, confirmed), or the ledger
    /// waits for an operator's reconcile after a restore: take a new number or ask an operator.
    Refused,
    /// The caller's certificate does not allow the call (an operator's ledger call without the
    /// admin role): use another certificate.
    Forbidden,
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FailureKind::InvalidArgument => "invalid argument",
            FailureKind::Unavailable => "unavailable",
            FailureKind::Overloaded => "overloaded",
            FailureKind::BadConfig => "bad client config",
            FailureKind::Exhausted => "sequence space exhausted",
            FailureKind::NotFound => "not found",
            FailureKind::Conflict => "conflict",
            FailureKind::Refused => "refused",
            FailureKind::Forbidden => "forbidden",
        })
    }
}

/// Error of every client call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// The request certainly did not take effect: no number was consumed.
    #[error("{kind}: {detail}")]
    Failed {
        /// What the caller should do about it.
        kind: FailureKind,
        /// Human-readable reason (the last server message or transport error).
        detail: String,
    },
    /// The request may or may not have taken effect (a timeout or a lost reply): a number may have been
    /// consumed. Never treat this as "did not happen".
    #[error("outcome unknown (the request may have taken effect): {detail}")]
    Unknown {
        /// Human-readable reason (what made the last attempt's outcome unknown).
        detail: String,
    },
}

impl ClientError {
    /// A failure of the given kind.
    pub fn failed(kind: FailureKind, detail: impl Into<String>) -> Self {
        ClientError::Failed {
            kind,
            detail: detail.into(),
        }
    }

    /// An unknown outcome.
    pub fn unknown(detail: impl Into<String>) -> Self {
        ClientError::Unknown { detail: detail.into() }
    }

    /// True when the request may have taken effect.
    pub fn is_unknown(&self) -> bool {
        matches!(self, ClientError::Unknown { .. })
    }

    /// The failure kind, or `None` for an unknown outcome.
    pub fn failure_kind(&self) -> Option<FailureKind> {
        match self {
            ClientError::Failed { kind, .. } => Some(*kind),
            ClientError::Unknown { .. } => None,
        }
    }
}
