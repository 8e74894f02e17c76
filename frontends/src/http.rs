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
//!
//! A reply whose server said who it was carries `"owner": {"set", "node", "incarnation",
//! "section", "epoch"}` (which AllocSvr served, under which ownership epoch of the section).
//!
//! Every 64-bit number in a reply is a JSON *string* of decimal digits: a JavaScript `number`
//! holds integers exactly only up to 2^53, and a seq, a uid or an id can be larger; a string
//! reaches every language unrounded (`BigInt(s)` in JavaScript). Uids in a batch body may be
//! strings or numbers. A key in a path is percent-decoded (`/v1/counter/a%2Fb` is `a/b`).
//!
//! Errors are `{"error":{"code":...,"message":...,"may_have_been_taken":bool}}` with the status:
//! 400 bad input (a body over [`MAX_BODY_BYTES`] too), 404 an unknown path, 405 a wrong method,
//! 429 overloaded and 503 not ready or unreachable (both with `Retry-After`), 409 a section whose
//! 64-bit space is used up, 504 no answer in time — `may_have_been_taken: true` when the call
//! could have taken a number, whose value is then lost (never "did not happen").
//!
//! A caller's deadline is the `x-seqsvr-timeout-ms` header (1 to 60,000); without it the
//! front end's own. Headers must arrive within [`HEADER_TIMEOUT`] and a body within
//! [`BODY_TIMEOUT`], or the connection is closed.
//!
//! With `tls` set the port speaks HTTPS with mutual TLS: a caller needs a certificate the
//! cluster's CA signed whose role may take numbers, or every request is answered 403.
//!
//! Deliberately left out: HTTP/2 (gRPC is the fast path for callers that have it).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::{Semaphore, watch};
use tracing::{debug, warn};

use crate::calls::{CallError, Calls, ErrorKind, Owner, Taken, Who, parse_u64, within};
use crate::{Front, count_call, stopped};

/// Largest request body (a batch of [`MAX_BATCH_UIDS`] uids as 20-digit strings fits).
pub const MAX_BODY_BYTES: usize = 256 * 1024;
/// Most uids in one batch.
pub const MAX_BATCH_UIDS: usize = 10_000;
/// Longest wait for a request's headers.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for a request's body.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);
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

/// The routes for a TLS caller whose certificate may not take numbers: 403 to everything.
fn refused(why: String) -> axum::Router {
    let e = CallError::bad_input(why);
    axum::Router::new().fallback(move || {
        let body = error_body(&e, "forbidden");
        async move { (StatusCode::FORBIDDEN, Json(body)).into_response() }
    })
}

/// Serves HTTP/1.1 on one connection.
async fn serve_connection<S>(stream: S, app: axum::Router, peer: std::net::SocketAddr)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper_util::service::TowerToHyperService::new(app);
    let served = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
        .await;
    if let Err(e) = served {
        debug!(%peer, error = %e, "HTTP connection ended");
    }
}

/// The routes over `calls`.
pub fn router<C: Calls>(calls: Arc<C>) -> axum::Router {
    axum::Router::new()
        .route("/v1/seq/batch", post(batch::<C>))
        .route("/v1/seq/{uid}", get(seq_current::<C>))
        .route("/v1/seq/{uid}/next", post(seq_next::<C>))
        .route("/v1/seq/{uid}/reserve", post(seq_reserve::<C>))
        .route("/v1/counter/{key}", get(counter_current::<C>))
        .route("/v1/counter/{key}/next", post(counter_next::<C>))
        .route("/v1/counter/{key}/reserve", post(counter_reserve::<C>))
        .route("/v1/ids", post(ids::<C>))
        .fallback(not_found)
        .with_state(calls)
}

/// An error reply.
fn error(e: &CallError) -> Response {
    let (status, code) = status_and_code(e.kind);
    let mut r = (status, Json(error_body(e, code))).into_response();
    if matches!(e.kind, ErrorKind::Unavailable | ErrorKind::Overloaded) {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

/// The one mapping of a failure to its HTTP status and error code (a batch item uses the code).
fn status_and_code(kind: ErrorKind) -> (StatusCode, &'static str) {
    match kind {
        ErrorKind::BadInput => (StatusCode::BAD_REQUEST, "bad_input"),
        ErrorKind::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        ErrorKind::Overloaded => (StatusCode::TOO_MANY_REQUESTS, "overloaded"),
        ErrorKind::Exhausted => (StatusCode::CONFLICT, "exhausted"),
        ErrorKind::Unknown => (StatusCode::GATEWAY_TIMEOUT, "unknown_outcome"),
        ErrorKind::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
    }
}

fn error_body(e: &CallError, code: &str) -> Value {
    json!({"error": {"code": code, "message": e.message, "may_have_been_taken": e.may_have_taken()}})
}

/// The error object of one item of a batch.
fn item_error(e: &CallError) -> Value {
    error_body(e, status_and_code(e.kind).1)["error"].clone()
}

async fn not_found(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let e = CallError::bad_input(format!(
        "no route {method} {}; the routes are /v1/seq/{{uid}}[/next|/reserve], /v1/seq/batch, \
         /v1/counter/{{key}}[/next|/reserve] and /v1/ids",
        uri.path()
    ));
    (StatusCode::NOT_FOUND, Json(error_body(&e, "not_found"))).into_response()
}

/// The caller's deadline, if it gave one.
fn deadline(headers: &HeaderMap) -> Result<Option<Duration>, CallError> {
    let Some(v) = headers.get(TIMEOUT_HEADER) else {
        return Ok(None);
    };
    let ms = v
        .to_str()
        .map_err(|_| CallError::bad_input(format!("{TIMEOUT_HEADER} must be a decimal number")))
        .and_then(|s| parse_u64(s, TIMEOUT_HEADER))?;
    if ms == 0 || ms > MAX_TIMEOUT_MS {
        return Err(CallError::bad_input(format!(
            "{TIMEOUT_HEADER} must be 1 to {MAX_TIMEOUT_MS}, got {ms}"
        )));
    }
    Ok(Some(Duration::from_millis(ms)))
}

/// `?count=N`: a block's size (1 to `u32::MAX`; the server refuses more than a step).
fn count(
    query: Result<Query<HashMap<String, String>>, axum::extract::rejection::QueryRejection>,
    default: Option<u32>,
) -> Result<u32, CallError> {
    let Query(q) = query.map_err(|e| CallError::bad_input(e.body_text()))?;
    if let Some(other) = q.keys().find(|k| k.as_str() != "count") {
        return Err(CallError::bad_input(format!(
            "unknown query parameter {other:?}; only count"
        )));
    }
    let n = match (q.get("count"), default) {
        (Some(s), _) => parse_u64(s, "count")?,
        (None, Some(d)) => return Ok(d),
        (None, None) => return Err(CallError::bad_input("count is required (?count=N)")),
    };
    if n == 0 || n > u64::from(u32::MAX) {
        return Err(CallError::bad_input(format!(
            "count must be 1 to {}, got {n}",
            u32::MAX
        )));
    }
    Ok(n as u32)
}

fn uid_of(s: &str) -> Result<u64, CallError> {
    parse_u64(s, "uid")
}

fn key_of(s: &str) -> Result<&str, CallError> {
    seqsvr_proto::keys::check_key_str(s).map_err(|e| CallError::bad_input(e.to_string()))
}

/// Takes `count` numbers of `who` within the caller's deadline; the first.
async fn take<C: Calls>(calls: &C, headers: &HeaderMap, who: Who<'_>, count: u32) -> Result<Taken, CallError> {
    let d = deadline(headers)?;
    let r = within(d, true, calls.take(who, count)).await;
    count_call(Front::Http, &r);
    r
}

async fn current<C: Calls>(calls: &C, headers: &HeaderMap, who: Who<'_>) -> Result<Taken, CallError> {
    let d = deadline(headers)?;
    let r = within(d, false, calls.current(who)).await;
    count_call(Front::Http, &r);
    r
}

fn answer<T: serde::Serialize>(r: Result<T, CallError>) -> Response {
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => error(&e),
    }
}

fn block(first: u64, count: u32) -> (String, String) {
    (first.to_string(), (first + u64::from(count) - 1).to_string())
}

/// `v` with who served it, when the server said: every field a decimal string, as every 64-bit
/// number here ([`OwnerJson`], the one place its fields are named).
fn with_owner(mut v: Value, owner: Option<Owner>) -> Value {
    if let Some(o) = owner {
        v["owner"] = json!(OwnerJson::from(o));
    }
    v
}

/// A 64-bit number written as a JSON string (see the module doc), without a `String` per field.
#[derive(serde::Serialize)]
#[serde(transparent)]
struct Decimal(#[serde(serialize_with = "serialize_decimal")] u64);

fn serialize_decimal<S: serde::Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

/// Who served a call, as every reply names it: the replies of the two `next` calls, the busiest,
/// are written straight from structs rather than built as `Value` maps (an allocation per field
/// and map node, visible in a profile of `wrk` against `/v1/seq/{uid}/next`), and the other
/// replies put this into their map ([`with_owner`]). Fields in alphabetical order, as a map writes
/// them.
#[derive(serde::Serialize)]
struct OwnerJson {
    epoch: Decimal,
    incarnation: Decimal,
    node: Decimal,
    section: Decimal,
    set: Decimal,
}

impl From<Owner> for OwnerJson {
    fn from(o: Owner) -> Self {
        Self {
            epoch: Decimal(o.epoch.0),
            incarnation: Decimal(o.incarnation.0),
            node: Decimal(o.node_id.0),
            section: Decimal(o.section.0),
            set: Decimal(o.set_id),
        }
    }
}

/// `{"owner": ..., "seq": ..., "uid": ...}`, keys in the order a `Value` map writes them.
#[derive(serde::Serialize)]
struct SeqNext {
    #[serde(skip_serializing_if = "Option::is_none")]
    owner: Option<OwnerJson>,
    seq: Decimal,
    uid: Decimal,
}

/// `{"key": ..., "owner": ..., "value": ...}`.
#[derive(serde::Serialize)]
struct CounterNext<'a> {
    key: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    owner: Option<OwnerJson>,
    value: Decimal,
}

async fn seq_next<C: Calls>(State(calls): State<Arc<C>>, Path(uid): Path<String>, headers: HeaderMap) -> Response {
    answer(
        async {
            let uid = uid_of(&uid)?;
            let t = take(&*calls, &headers, Who::Uid(uid), 1).await?;
            Ok(SeqNext {
                owner: t.owner.map(OwnerJson::from),
                seq: Decimal(t.value),
                uid: Decimal(uid),
            })
        }
        .await,
    )
}

async fn seq_reserve<C: Calls>(
    State(calls): State<Arc<C>>,
    Path(uid): Path<String>,
    headers: HeaderMap,
    query: Result<Query<HashMap<String, String>>, axum::extract::rejection::QueryRejection>,
) -> Response {
    answer(
        async {
            let uid = uid_of(&uid)?;
            let n = count(query, None)?;
            let t = take(&*calls, &headers, Who::Uid(uid), n).await?;
            let (first, last) = block(t.value, n);
            Ok(with_owner(
                json!({"uid": uid.to_string(), "first": first, "last": last, "count": n}),
                t.owner,
            ))
        }
        .await,
    )
}

async fn seq_current<C: Calls>(State(calls): State<Arc<C>>, Path(uid): Path<String>, headers: HeaderMap) -> Response {
    answer(
        async {
            let uid = uid_of(&uid)?;
            let t = current(&*calls, &headers, Who::Uid(uid)).await?;
            Ok(with_owner(
                json!({"uid": uid.to_string(), "cur_seq": t.value.to_string()}),
                t.owner,
            ))
        }
        .await,
    )
}

async fn counter_next<C: Calls>(State(calls): State<Arc<C>>, Path(key): Path<String>, headers: HeaderMap) -> Response {
    answer(
        async {
            let k = key_of(&key)?;
            let t = take(&*calls, &headers, Who::Key(k), 1).await?;
            Ok(CounterNext {
                key: k,
                owner: t.owner.map(OwnerJson::from),
                value: Decimal(t.value),
            })
        }
        .await,
    )
}

async fn counter_reserve<C: Calls>(
    State(calls): State<Arc<C>>,
    Path(key): Path<String>,
    headers: HeaderMap,
    query: Result<Query<HashMap<String, String>>, axum::extract::rejection::QueryRejection>,
) -> Response {
    answer(
        async {
            let k = key_of(&key)?;
            let n = count(query, None)?;
            let t = take(&*calls, &headers, Who::Key(k), n).await?;
            let (first, last) = block(t.value, n);
            Ok(with_owner(
                json!({"key": k, "first": first, "last": last, "count": n}),
                t.owner,
            ))
        }
        .await,
    )
}

async fn counter_current<C: Calls>(
    State(calls): State<Arc<C>>,
    Path(key): Path<String>,
    headers: HeaderMap,
) -> Response {
    answer(
        async {
            let k = key_of(&key)?;
            let t = current(&*calls, &headers, Who::Key(k)).await?;
            Ok(with_owner(json!({"key": k, "value": t.value.to_string()}), t.owner))
        }
        .await,
    )
}

async fn ids<C: Calls>(
    State(calls): State<Arc<C>>,
    headers: HeaderMap,
    query: Result<Query<HashMap<String, String>>, axum::extract::rejection::QueryRejection>,
) -> Response {
    answer(
        async {
            let n = count(query, Some(1))?;
            let d = deadline(&headers)?;
            // A lost id is never seen by anyone: an unanswered call took nothing that matters.
            let r = within(d, false, calls.ids(n)).await;
            count_call(Front::Http, &r);
            let ids: Vec<String> = r?.into_iter().map(|i| i.to_string()).collect();
            Ok(json!({ "ids": ids }))
        }
        .await,
    )
}

/// A uid in a batch body: a number, or a string of digits (for callers whose numbers round).
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum UidIn {
    Number(u64),
    Text(String),
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchIn {
    uids: Vec<UidIn>,
}

async fn batch<C: Calls>(State(calls): State<Arc<C>>, headers: HeaderMap, body: Body) -> Response {
    answer(
        async {
            let d = deadline(&headers)?;
            let bytes = match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, MAX_BODY_BYTES)).await {
                Ok(Ok(b)) => b,
                Ok(Err(e)) => {
                    return Err(CallError::bad_input(format!(
                        "cannot read the body (at most {MAX_BODY_BYTES} bytes): {e}"
                    )));
                }
                Err(_) => {
                    return Err(CallError::bad_input(format!(
                        "the body did not arrive within {BODY_TIMEOUT:?}"
                    )));
                }
            };
            let input: BatchIn = serde_json::from_slice(&bytes)
                .map_err(|e| CallError::bad_input(format!("the body must be {{\"uids\": [...]}}: {e}")))?;
            if input.uids.is_empty() || input.uids.len() > MAX_BATCH_UIDS {
                return Err(CallError::bad_input(format!(
                    "a batch needs 1 to {MAX_BATCH_UIDS} uids, got {}",
                    input.uids.len()
                )));
            }
            let uids = input
                .uids
                .iter()
                .map(|u| match u {
                    UidIn::Number(n) => Ok(*n),
                    UidIn::Text(s) => uid_of(s),
                })
                .collect::<Result<Vec<u64>, _>>()?;
            let results = within(d, true, calls.batch(&uids)).await;
            count_call(Front::Http, &results);
            let items: Vec<Value> = uids
                .iter()
                .zip(results?)
                .map(|(uid, r)| match r {
                    Ok(t) => with_owner(json!({"uid": uid.to_string(), "seq": t.value.to_string()}), t.owner),
                    Err(e) => json!({"uid": uid.to_string(), "error": item_error(&e)}),
                })
                .collect();
            Ok(json!({ "results": items }))
        }
        .await,
    )
}

/// Serves HTTP/1.1 on the connections `listener` accepts until `stop` turns true.
pub async fn serve<C: Calls>(
    listener: tokio::net::TcpListener,
    calls: Arc<C>,
    cfg: HttpConfig,
    stop: watch::Receiver<bool>,
) {
    serve_router(listener, router(calls), cfg, stop).await;
}

/// Serves `app` over HTTP/1.1 on the connections `listener` accepts, at most
/// `cfg.max_connections` at once, each with this front end's header timeout and TLS, until `stop`
/// turns true. The AllocSvr's metrics page is served by it too.
pub async fn serve_router(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    cfg: HttpConfig,
    mut stop: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(cfg.max_connections));
    loop {
        // At the bound, stop accepting: callers wait in the listen queue, not in memory.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = tokio::select! {
            () = stopped(&mut stop) => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    warn!(error = %e, "HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let (app, tls) = (app.clone(), cfg.tls.clone());
        tokio::spawn(async move {
            match tls {
                None => serve_connection(stream, app, peer).await,
                Some(tls) => match crate::tls::accept(&tls, stream).await {
                    crate::tls::Accepted::Caller(stream, _) => serve_connection(stream, app, peer).await,
                    crate::tls::Accepted::Refused(stream, why) => serve_connection(stream, refused(why), peer).await,
                    crate::tls::Accepted::Failed(why) => debug!(%peer, %why, "HTTP connection ended"),
                },
            }
            drop(slot);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use seqsvr_proto::{Epoch, Incarnation, NodeId, SectionId};

    /// The typed `next` replies write the same JSON, byte for byte, as the `Value` maps every
    /// other reply is built from (and these were before): every number a string, keys in order,
    /// the owner's five fields as the replies have always named them.
    #[test]
    fn typed_next_replies_write_what_the_value_maps_wrote() {
        let owner = Owner {
            section: SectionId(9),
            node_id: NodeId(3),
            incarnation: Incarnation(u64::MAX),
            epoch: Epoch(2),
            set_id: 1,
        };
        let typed = serde_json::to_string(&SeqNext {
            owner: Some(owner.into()),
            seq: Decimal(u64::MAX - 1),
            uid: Decimal(42),
        })
        .unwrap();
        let mapped = with_owner(json!({"uid": "42", "seq": (u64::MAX - 1).to_string()}), Some(owner));
        assert_eq!(typed, mapped.to_string());
        assert_eq!(
            typed,
            r#"{"owner":{"epoch":"2","incarnation":"18446744073709551615","node":"3","section":"9","set":"1"},"seq":"18446744073709551614","uid":"42"}"#
        );
        let typed = serde_json::to_string(&CounterNext {
            key: "conv:8f3a\"é",
            owner: None,
            value: Decimal(7),
        })
        .unwrap();
        let mapped = with_owner(json!({"key": "conv:8f3a\"é", "value": "7"}), None);
        assert_eq!(typed, mapped.to_string());
    }
}
