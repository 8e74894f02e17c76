//! The two meanings of RESOURCE_EXHAUSTED on the wire, and how a caller tells them apart.
//!
//! - **Exhausted**: a section's sequence space is used up (docs/DESIGN.md, rule 6). Permanent: no
//!   retry, anywhere, will ever serve that uid again.
//! - **Overloaded**: a server refused a call because too many were in flight. Transient: the same
//!   call may pass after a backoff.
//!
//! gRPC has one code for both, so the server says which in the trailer metadata key
//! [`REFUSAL_KEY`]. Only the exhausted answer must carry its mark: a RESOURCE_EXHAUSTED without it
//! is read as overload. That default is the safe one — a refusal made by a layer that does not know
//! this contract (tonic's per-connection shedding, a proxy, an older server) is retried with
//! backoff until the caller's deadline, where the opposite default would turn a passing overload
//! into a permanent failure. The overload answers seqsvr makes carry their mark too, for operators
//! reading traces.
//!
//! A ledger that holds as many numbers as it may (held or voided) is refused as exhausted too: no
//! retry passes until its callers confirm or release, or an operator archives its gap report.
//!
//! Deliberately left out: a retry-after hint. The client's own jittered backoff spreads callers
//! out, and a server that is overloaded cannot know when it will not be.

use tonic::metadata::MetadataValue;
use tonic::{Code, Status};

/// The phrase of a StoreSvr's UNAVAILABLE for a ledger key whose section the set does not serve
/// now (moving or moved): its callers look the key's set up again rather than retry the same one.
/// One constant for the server that says it and the clients that read it.
pub const LEDGER_NOT_SERVED: &str = "is not served by this set now";

/// Metadata key of a RESOURCE_EXHAUSTED answer saying what ran out.
pub const REFUSAL_KEY: &str = "seqsvr-refusal";

/// [`REFUSAL_KEY`]'s value on a section whose sequence space is used up.
pub const EXHAUSTED: &str = "exhausted";

/// [`REFUSAL_KEY`]'s value on a call refused because the server had too many in flight.
pub const OVERLOADED: &str = "overloaded";

/// What a RESOURCE_EXHAUSTED answer means for the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The uid's section can never be served again: give up.
    Exhausted,
    /// The server is overloaded: back off and retry.
    Overloaded,
}

/// The answer for a uid whose section's sequence space is used up (permanent).
pub fn exhausted(message: impl Into<String>) -> Status {
    marked(message.into(), EXHAUSTED)
}

/// The answer for a call refused under overload (retry after a backoff).
pub fn overloaded(message: impl Into<String>) -> Status {
    marked(message.into(), OVERLOADED)
}

fn marked(message: String, value: &'static str) -> Status {
    let mut status = Status::resource_exhausted(message);
    status
        .metadata_mut()
        .insert(REFUSAL_KEY, MetadataValue::from_static(value));
    status
}

/// What `status` refuses, when it is RESOURCE_EXHAUSTED; `None` for any other code.
pub fn of(status: &Status) -> Option<Refusal> {
    if status.code() != Code::ResourceExhausted {
        return None;
    }
    let mark = status.metadata().get(REFUSAL_KEY).and_then(|v| v.to_str().ok());
    Some(match mark {
        Some(EXHAUSTED) => Refusal::Exhausted,
        _ => Refusal::Overloaded,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exhausted_mark_is_permanent() {
        let tonic_shed = Status::resource_exhausted("Too many active requests for the connection");
        let mut wrong_mark = Status::resource_exhausted("x");
        wrong_mark
            .metadata_mut()
            .insert(REFUSAL_KEY, MetadataValue::from_static("something-else"));
        let cases = [
            (exhausted("section 3 is used up"), Some(Refusal::Exhausted)),
            (overloaded("busy"), Some(Refusal::Overloaded)),
            (tonic_shed, Some(Refusal::Overloaded)),
            (wrong_mark, Some(Refusal::Overloaded)),
            (Status::unavailable("x"), None),
            (Status::invalid_argument("x"), None),
        ];
        for (status, want) in cases {
            assert_eq!(of(&status), want, "{status:?}");
        }
    }

    #[test]
    fn the_mark_survives_the_trip_through_http_headers() {
        for (status, want) in [
            (exhausted("gone"), Refusal::Exhausted),
            (overloaded("busy"), Refusal::Overloaded),
        ] {
            let response: http::Response<()> = status.into_http();
            let back = Status::from_header_map(response.headers()).expect("a grpc-status header");
            assert_eq!(of(&back), Some(want));
        }
    }
}
