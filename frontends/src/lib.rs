//! The front ends every AllocSvr can serve beside gRPC, so that a service in any language takes
//! numbers with the HTTP or Redis client it already has:
//!
//! - [`http`]: HTTP/JSON (`--http-listen`) on axum, every 64-bit number a JSON string.
//! - [`resp`]: the Redis protocol (`--resp-listen`), RESP2 and RESP3, `INCR`/`INCRBY`/`GET`/`MGET`
//!   on counters and uids (`u:42`), `NEXTID` for time-ordered ids.
//! - [`calls`]: what both ask of the cluster ([`calls::Calls`]) and the one error type they map
//!   to their protocols; [`calls::ClientCalls`] answers through the client library, which sends each
//!   call to its owner: a call that lands on an AllocSvr that does not own it is forwarded.
//!
//! Every call a front end makes is counted in `allocsvr_front_calls_total{front, result}`.
//!
//! With mutual TLS on ([`tls`]), both take only callers whose certificate the cluster's CA signed
//! and whose role may take numbers (`client`, `admin`; `allocsvr`), as the gRPC data plane does.
//!
//! Deliberately left out: any answer not taken from an owner's reply.

pub mod calls;
pub mod http;
pub mod resp;
pub mod tls;

use calls::{CallError, ErrorKind};

/// Counts one call of a front end by how it ended.
pub(crate) fn count_call<T>(front: &'static str, r: &Result<T, CallError>) {
    let result = match r {
        Ok(_) => "ok",
        Err(e) => match e.kind {
            ErrorKind::BadInput => "bad_input",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::Exhausted => "exhausted",
            ErrorKind::Unknown => "unknown",
            ErrorKind::Internal => "internal",
        },
    };
    metrics::counter!("allocsvr_front_calls_total", "front" => front, "result" => result).increment(1);
}

/// Resolves when `stop` turns true (or its sender is gone); holds no borrow of the value when it
/// does, so that an accept loop waiting on it stays `Send`.
pub(crate) async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
