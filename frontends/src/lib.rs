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

use std::sync::OnceLock;

use calls::{CallError, ErrorKind};

/// Which front end a call came through: the `front` label of `allocsvr_front_calls_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Front {
    Http,
    Resp,
}

/// The `result` labels, in [`result_index`]'s order.
const RESULTS: [&str; 11] = [
    "ok",
    "bad_input",
    "unavailable",
    "overloaded",
    "exhausted",
    "unknown",
    "internal",
    "not_found",
    "conflict",
    "refused",
    "forbidden",
];

fn result_index<T>(r: &Result<T, CallError>) -> usize {
    match r {
        Ok(_) => 0,
        Err(e) => match e.kind {
            ErrorKind::BadInput => 1,
            ErrorKind::Unavailable => 2,
            ErrorKind::Overloaded => 3,
            ErrorKind::Exhausted => 4,
            ErrorKind::Unknown => 5,
            ErrorKind::Internal => 6,
            ErrorKind::NotFound => 7,
            ErrorKind::Conflict => 8,
            ErrorKind::Refused => 9,
            ErrorKind::Forbidden => 10,
        },
    }
}

/// Counts one call of a front end by how it ended.
///
/// The counters are looked up once per process, at a front end's first call (the binary installs
/// its recorder before it serves): a labelled `counter!` per call builds its key and finds it in
/// the recorder's registry, which was a few per cent of a pipelined `INCR`'s CPU in a profile.
pub(crate) fn count_call<T>(front: Front, r: &Result<T, CallError>) {
    static HTTP: OnceLock<[metrics::Counter; RESULTS.len()]> = OnceLock::new();
    static RESP: OnceLock<[metrics::Counter; RESULTS.len()]> = OnceLock::new();
    let (cell, name) = match front {
        Front::Http => (&HTTP, "http"),
        Front::Resp => (&RESP, "resp"),
    };
    let counters = cell.get_or_init(|| {
        RESULTS.map(|result| metrics::counter!("allocsvr_front_calls_total", "front" => name, "result" => result))
    });
    counters[result_index(r)].increment(1);
}

/// Resolves when `stop` turns true (or its sender is gone); holds no borrow of the value when it
/// does, so that an accept loop waiting on it stays `Send`.
pub(crate) async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
