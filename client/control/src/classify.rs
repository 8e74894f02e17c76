//! What a gRPC error from one attempt says: whether the request may have taken effect, whether
//! another attempt is worth it, and whether the input itself is wrong. One classifier for the data
//! plane client and the control-plane clients.
//!
//! A call that timed out has an unknown outcome (docs/DESIGN.md, Promises): an attempt counts as
//! *certainly not taken* only when the request never left this process (the connection could not
//! be made) or a server explicitly refused it; a timeout, a reset stream or an undecodable reply may
//! have taken effect.
//!
//! Deliberately left out: any IO, and what to do next (the callers' loops decide).

use std::error::Error as _;

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
        };
    }
    match status.code() {
        Code::InvalidArgument => Verdict {
            delivery: Delivery::NotTaken,
            retry: false,
            invalid_argument: true,
        },
        // The server may have done the work before the call was cut or failed.
        Code::Unknown | Code::Internal | Code::DataLoss | Code::DeadlineExceeded | Code::Cancelled => Verdict {
            delivery: Delivery::Maybe,
            retry: true,
            invalid_argument: false,
        },
        // An explicit refusal that may pass: shutting down, overloaded, conflict.
        Code::Unavailable | Code::ResourceExhausted | Code::Aborted => Verdict {
            delivery: Delivery::NotTaken,
            retry: true,
            invalid_argument: false,
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
        },
    }
}

/// True when the error chain says the connection was never made, so no request bytes were sent.
fn is_connect_error(status: &Status) -> bool {
    let mut next = status.source();
    while let Some(err) = next {
        if err.is::<tonic::ConnectError>() {
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
            };
            assert_eq!(got, want, "{code:?}");
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
