//! The HTTP/JSON front end (`--http-listen`), on axum and hyper.
//!
//! | method and path | body of a 200 |
//! |---|---|
//! | `POST /v1/seq/{uid}/next` | `{"uid":"42","seq":"7"}` |
//! | `POST /v1/seq/{uid}/reserve?count=N` | `{"uid":"42","first":"8","last":"17","count":10}` |
//! | `GET /v1/seq/{uid}` | `{"uid":"42","cur_seq":"17"}` |
//! | `POST /v1/seq/batch`, body `{"uids":[1,"2"]}` | `{"results":[{"uid":"1","seq":"5"},{"uid":"2","error":{...}}]}` |
//! | `POST /v1/counter/{key}/next` | `{"key":"orders","value":"3"}` |
//! | `POST /v1/counter/{key}/reserve?count=N` | `{"key":"orders","first":"4","last":"13","count":10}` |
//! | `GET /v1/counter/{key}` | `{"key":"orders","value":"13"}` |
//! | `POST /v1/ids?count=N` | `{"ids":["7384120986624001",...]}` |
//! | ledger counters: `PUT /v1/ledger/{key}`, `POST /v1/ledger/{key}/reserve`, `POST /v1/ledger/{key}/{n}/confirm` and `/release`, `GET /v1/ledger/{key}` (`?from&count`), `GET /v1/ledger/{key}/{n}`, `GET /v1/ledger/{key}/gaps` | the table in `ledger` |
//! | `GET /v1/ids/{id}` | `{"id":"…","time":"2026-12-02T00:00:00Z","unix_ms":"…","tick":"…","slot":"70","sequence":"5","set":"1"}` (`set` null when unknown) |
//!
//! A reply whose server said who it was carries `"owner": {"set", "node", "incarnation",
//! "section", "epoch"}` (which AllocSvr served, under which ownership epoch of the section).
//!
//! Every 64-bit number in a reply is a JSON *string* of decimal digits: a JavaScript `number`
//! holds integers exactly only up to 2^53, and a seq, a uid or an id can be larger; a string
//! reaches every language unrounded (`BigInt(s)` in JavaScript). Uids in a batch body may be
//! strings or numbers. A key in a path is percent-decoded (`/v1/counter/a%2Fb` is `a/b`).
//!
//! Every error is `{"error":{"code":...,"message":...,"may_have_been_taken":bool}}` with the
//! status: 400 `bad_input` (a path that does not percent-decode to UTF-8 too), 404 `not_found`,
//! 405 `method_not_allowed`, 408 `timeout` (a body slower than [`BODY_TIMEOUT`]), 413
//! `too_large` (a body over [`MAX_BODY_BYTES`]), 429 `overloaded` and 503 `unavailable` (both
//! with `Retry-After`), 409 `exhausted` (a section whose 64-bit space is used up), 504
//! `unknown_outcome` (no answer in time) — `may_have_been_taken: true` when the call could have
//! taken a number, whose value is then lost (never "did not happen"). An error reply any library
//! makes is turned into the same JSON (`errors::JsonErrors`); its words go to the log.
//!
//! A caller's deadline is the `x-seqsvr-timeout-ms` header (1 to 60,000); without it the
//! front end's own.
//!
//! Every connection is bounded in time and bytes ([`connection`]): a request's head within
//! [`HEADER_TIMEOUT`] (from the moment the server waits for it, so an idle keep-alive
//! connection too) and [`MAX_HEAD_BYTES`], a body within [`BODY_TIMEOUT`] and
//! [`MAX_BODY_BYTES`], replies read with no pause longer than [`WRITE_TIMEOUT`], and at most
//! [`MAX_BUFFERED_BYTES`] of pipelined requests read ahead; past any of them the connection is
//! closed and its slot under `max_connections` freed. A head over the bound, or one HTTP cannot
//! parse, is answered by hyper itself — 431 or 400 with no body — before the connection closes.
//!
//! Batches — `POST /v1/seq/batch` (1 to [`MAX_BATCH_UIDS`] uids, as a gRPC batch) and
//! `POST /v1/ids` of more than [`MAX_IDS_UNBATCHED`] — are the requests whose memory grows with
//! their size: at most [`MAX_BATCHES_IN_SERVICE`] are served at once, each from before its body
//! is read until its reply has been handed to the connection (`batches`); one more waits
//! [`BATCH_WAIT`], then is answered 429 `overloaded`. So the front end's heap is at most
//! `max_connections` × [`CONNECTION_BYTES`] + [`MAX_BATCHES_IN_SERVICE`] × [`BATCH_BYTES`]
//! (`tests/http_memory.rs` holds it; `docs/FRONTENDS.md` has the numbers).
//!
//! With `tls` set the port speaks HTTPS with mutual TLS: a caller needs a certificate the
//! cluster's CA signed whose role may take numbers, or every request is answered 403.
//!
//! Deliberately left out: HTTP/2 (gRPC is the fast path for callers that have it), and a JSON
//! body on hyper's own 400/431 to a head it cannot read (hyper writes it before our code runs).

mod batches;
mod errors;
mod io;
mod ledger;
mod routes;
mod server;

use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::routing::{get, post, put};

use crate::calls::Calls;
pub use server::{connection, serve, serve_router};

/// Largest request body: a batch of [`MAX_BATCH_UIDS`] uids as quoted 20-digit strings, one a
/// line and indented (28 bytes each), fits twice over. Read whole before it is parsed, by at most
/// [`MAX_BATCHES_IN_SERVICE`] requests at once.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Most uids in one batch: a gRPC batch's, as many names as RESP's `MGET` takes. The client
/// library splits larger calls into batches of this size; an HTTP caller does the same.
pub const MAX_BATCH_UIDS: usize = seqsvr_proto::limits::MAX_UIDS_PER_BATCH;
/// Most batches in service at once (`batches`): a batch of uids, or ids of more than
/// [`MAX_IDS_UNBATCHED`]. Each holds at most [`BATCH_BYTES`], so all of them at most 64 MiB; 64
/// keep both cores busy with batches of a thousand while any single call still finds the
/// runtime free.
pub const MAX_BATCHES_IN_SERVICE: usize = 64;
/// Longest a batch waits for a place (or the caller's deadline, if shorter) before its 429: a
/// burst queues briefly, a flood is turned away.
pub const BATCH_WAIT: Duration = Duration::from_secs(1);
/// Most ids a `POST /v1/ids` takes without being a batch: its reply (≤ 1.5 KB) is no larger than
/// a single call's.
pub const MAX_IDS_UNBATCHED: u32 = 64;
/// Most bytes of an error's message in a reply, as JSON (escapes counted): a message that quotes
/// the caller's input is cut there, so that no error reply grows with the request.
pub const MAX_MESSAGE_BYTES: usize = 1024;
/// Most bytes of one batch item's error message, as JSON: the messages a call fails with are
/// about 100 bytes, and a thousand of them stay a small reply.
pub const MAX_ITEM_MESSAGE_BYTES: usize = 256;
/// Largest reply to any request but a batch (asserted in `routes`): a 256-byte key written with
/// every byte escaped, an owner of five 20-digit numbers, or an error message cut to
/// [`MAX_MESSAGE_BYTES`].
pub const MAX_REPLY_BYTES: usize = 4 * 1024;
/// Largest reply to a batch (asserted in `routes`): [`MAX_BATCH_UIDS`] items of at most 364 bytes
/// (an error with a message of [`MAX_ITEM_MESSAGE_BYTES`], or a seq with its owner).
pub const MAX_BATCH_REPLY_BYTES: usize = MAX_BATCH_UIDS * 364 + 16;
/// What one connection holds at most outside a batch, in bytes: hyper's read buffer (at most
/// [`MAX_BUFFERED_BYTES`], its allocation up to twice that as it grows), the reply being written
/// (at most [`MAX_REPLY_BYTES`]), and hyper's, axum's and the runtime's state of the connection.
/// `docs/FRONTENDS.md` multiplies it by the connections; `tests/http_memory.rs` holds it.
pub const CONNECTION_BYTES: usize = 48 * 1024;
/// What one batch in service holds at most on top of its connection, in bytes: its body as read
/// (up to twice [`MAX_BODY_BYTES`]: the chunks, then one contiguous copy), the uids (8 KB), the
/// call's results (about 170 bytes an item with a failure's message) and the reply (at most
/// [`MAX_BATCH_REPLY_BYTES`], sized exactly before it is written) — about 680 KB, rounded up for
/// the allocator's size classes.
pub const BATCH_BYTES: usize = 1024 * 1024;
/// Longest wait for a request's head, from when the server starts waiting for it (the first
/// request, or the next on a keep-alive connection).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for a request's body.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest time a reply may wait unread (no byte of it taken by the caller) before the
/// connection is closed: the same order as the other deadlines here, and long enough for any
/// caller that reads at all.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest request head (request line and headers): this API's requests need a few hundred
/// bytes; 16 KiB leaves room for proxies' and tracing headers.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Most bytes of requests a connection reads ahead of the one it answers (hyper's read buffer):
/// a head fits, and a pipelining caller is not held back. With the reply being written, what one
/// connection holds is bounded by this; `docs/FRONTENDS.md` has the arithmetic.
pub const MAX_BUFFERED_BYTES: usize = MAX_HEAD_BYTES;
/// Largest deadline a caller may ask for.
pub const MAX_TIMEOUT_MS: u64 = 60_000;
/// The header that carries the caller's deadline.
pub const TIMEOUT_HEADER: &str = "x-seqsvr-timeout-ms";

/// How the front end runs.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// Most connections at once; more wait in the listen queue.
    pub max_connections: usize,
    /// Mutual TLS (HTTPS): only callers whose certificate may take numbers (`crate::tls`); any
    /// other is answered 403 on every request.
    pub tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            max_connections: 10_000,
            tls: None,
        }
    }
}

/// The routes over `calls`, with their own [`MAX_BATCHES_IN_SERVICE`] places for batches.
pub fn router<C: Calls>(calls: Arc<C>) -> axum::Router {
    let batches = Extension(batches::Batches::new(MAX_BATCHES_IN_SERVICE, BATCH_WAIT));
    axum::Router::new()
        .route("/v1/seq/batch", post(routes::batch::<C>).layer(batches.clone()))
        .route("/v1/seq/{uid}", get(routes::seq_current::<C>))
        .route("/v1/seq/{uid}/next", post(routes::seq_next::<C>))
        .route("/v1/seq/{uid}/reserve", post(routes::seq_reserve::<C>))
        .route("/v1/counter/{key}", get(routes::counter_current::<C>))
        .route("/v1/counter/{key}/next", post(routes::counter_next::<C>))
        .route("/v1/counter/{key}/reserve", post(routes::counter_reserve::<C>))
        .route("/v1/ids", post(routes::ids::<C>).layer(batches.clone()))
        .route("/v1/ids/{id}", get(routes::id_decode::<C>))
        .route(
            "/v1/ledger/{key}",
            put(ledger::create::<C>).get(ledger::show::<C>).layer(batches.clone()),
        )
        .route("/v1/ledger/{key}/reserve", post(ledger::reserve::<C>))
        .route("/v1/ledger/{key}/gaps", get(ledger::gaps::<C>).layer(batches.clone()))
        .route("/v1/ledger/{key}/{n}", get(ledger::number::<C>))
        .route("/v1/ledger/{key}/{n}/confirm", post(ledger::confirm::<C>))
        .route("/v1/ledger/{key}/{n}/release", post(ledger::release::<C>))
        .fallback(errors::not_found)
        .method_not_allowed_fallback(errors::method_not_allowed)
        .layer(errors::JsonErrors)
        .with_state(calls)
}
