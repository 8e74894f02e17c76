//! What a gRPC error from one attempt says: whether the request may have taken effect, whether
//! another attempt is worth it, and whether the input itself is wrong. One classifier for the data
//! plane client and the control-plane clients.
//!
//! A call that timed out has an unknown outcome (docs/DESIGN.md, Promises): an attempt counts as
//! *certainly not taken* only when the request never left this process (the connection could not
//! be made) or a server explicitly refused it; a timeout, a reset stream or an undecodable reply may
//! have taken effect.
//!
//! RESOURCE_EXHAUSTED has two meanings (`seqsvr_proto::refusal`): a server overloaded (retry
//! after a backoff) and a section whose sequence space is used up (never retry); [`Verdict::refusal`]
//! says which.
//!
//! Deliberately left out: any IO, and what to do next (the callers' loops decide).

use std::error::Error as _;

use seqsvr_proto::refusal::{self, Refusal};
use tonic::{Code, Status};

/// What a failed attempt tells about the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// The request certainly did not take effect: never sent, or refused by the server.
    NotTaken,
    /// The request may have been executed by a server.
    Maybe,
}

/// The decision about one gRPC error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub delivery: Delivery,
    /// Worth another attempt (possibly elsewhere, after a backoff).
    pub retry: bool,
    /// The server said the input is wrong: surface it, never retry.
    pub invalid_argument: bool,
    /// What a RESOURCE_EXHAUSTED refused: an overload (retried, after a backoff rather than a
    /// search for another server) or a used-up section (`retry` is false).
    pub refusal: Option<Refusal>,
}

/// Classifies a gRPC error from one attempt.
///
/// A `Status` that carries a `source` was made in this process from a transport error; one without was
/// decoded from the server's reply (or synthesized by tonic after the response started).
pub fn classify(status: &Status) -> Verdict {
    if status.source().is_some() {
        return Verdict {
            delivery: if is_connect_error(status) {
                Delivery::NotTaken
            } else {
                Delivery::Maybe
            },
            retry: true,
            invalid_argument: false,
            refusal: None,
        };
    }
    let refusal = refusal::of(status);
    match status.code() {
        Code::InvalidArgument => Verdict {
            delivery: Delivery::NotTaken,
            retry: false,
            invalid_argument: true,
            refusal,
        },
        // The server may have done the work before the call was cut or failed.
        Code::Unknown | Code::Internal | Code::DataLoss | Code::DeadlineExceeded | Code::Cancelled => Verdict {
            delivery: Delivery::Maybe,
            retry: true,
            invalid_argument: false,
            refusal,
        },
        // An explicit refusal that may pass: shutting down, overloaded, conflict.
        Code::Unavailable | Code::ResourceExhausted | Code::Aborted => Verdict {
            delivery: Delivery::NotTaken,
            retry: refusal != Some(Refusal::Exhausted),
            invalid_argument: false,
            refusal,
        },
        // An explicit refusal that will not pass by retrying (wrong server, wrong service, no access).
        Code::Ok
        | Code::NotFound
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::FailedPrecondition
        | Code::OutOfRange
        | Code::Unimplemented
        | Code::Unauthenticated => Verdict {
            delivery: Delivery::NotTaken,
            retry: false,
            invalid_argument: false,
            refusal,
        },
    }
}

/// True when the error chain says the connection was never made, so no request bytes were sent.
fn is_connect_error(status: &Status) -> bool {
    let mut next = status.source();
    while let Some(err) = next {
        if err.is::<tonic::ConnectError>() || err.is::<crate::h2conn::ConnectError>() {
            return true;
        }
        next = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_statuses_are_classified_by_what_they_say_about_delivery() {
        use Delivery::*;
        let cases = [
            (Code::InvalidArgument, NotTaken, false, true),
            (Code::Unavailable, NotTaken, true, false),
            (Code::ResourceExhausted, NotTaken, true, false),
            (Code::Internal, Maybe, true, false),
            (Code::Unknown, Maybe, true, false),
            (Code::DeadlineExceeded, Maybe, true, false),
            (Code::Cancelled, Maybe, true, false),
            (Code::Unimplemented, NotTaken, false, false),
            (Code::FailedPrecondition, NotTaken, false, false),
        ];
        for (code, delivery, retry, invalid_argument) in cases {
            let got = classify(&Status::new(code, "x"));
            let want = Verdict {
                delivery,
                retry,
                invalid_argument,
                refusal: (code == Code::ResourceExhausted).then_some(Refusal::Overloaded),
            };
            assert_eq!(got, want, "{code:?}");
        }
    }

    #[test]
    fn a_used_up_section_is_final_and_an_overload_is_retried() {
        let exhausted = classify(&refusal::exhausted("section 7 is used up"));
        assert_eq!(exhausted.refusal, Some(Refusal::Exhausted));
        assert!(!exhausted.retry && exhausted.delivery == Delivery::NotTaken);
        for overload in [
            refusal::overloaded("busy"),
            Status::resource_exhausted("Too many active requests for the connection"),
        ] {
            let v = classify(&overload);
            assert_eq!(v.refusal, Some(Refusal::Overloaded), "{overload:?}");
            assert!(v.retry && v.delivery == Delivery::NotTaken);
        }
    }

    #[test]
    fn transport_errors_are_maybe_delivered_unless_the_connection_never_opened() {
        let connect = Status::from_error(Box::new(tonic::ConnectError("refused".into())));
        assert_eq!(connect.code(), Code::Unavailable);
        assert_eq!(classify(&connect).delivery, Delivery::NotTaken);
        assert!(classify(&connect).retry);

        let reset = Status::from_error(Box::new(std::io::Error::other("connection reset")));
        assert_eq!(classify(&reset).delivery, Delivery::Maybe);
        assert!(classify(&reset).retry);
    }
}
