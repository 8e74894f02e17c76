//! Every error the HTTP front end answers, as the one documented JSON object
//! `{"error":{"code","message","may_have_been_taken"}}`: a failed call mapped to its status and
//! code ([`status_and_code`]), the front end's own refusals ([`Refusal`]), the router's 404 and
//! 405, the path extractor's rejection ([`Segment`]), and [`JsonErrors`], the layer that turns
//! any other error reply — one a library made — into the same JSON, its wording to the log.
//!
//! Left out: hyper's own replies to a request head it cannot parse or that is over
//! [`super::MAX_HEAD_BYTES`] (400, 431, with no body, then the connection closed): hyper writes
//! them before any of our code sees a request.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::task::{Context, Poll};

use axum::Json;
use axum::body::Body;
use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::future::{BoxFuture, Either, FutureExt, Then};
use serde_json::{Value, json};
use tracing::debug;

use super::{MAX_ITEM_MESSAGE_BYTES, MAX_MESSAGE_BYTES};
use crate::calls::{CallError, ErrorKind};

/// The one mapping of a failed call to its HTTP status and error code (a batch item uses the code).
pub(super) fn status_and_code(kind: ErrorKind) -> (StatusCode, &'static str) {
    match kind {
        ErrorKind::BadInput => (StatusCode::BAD_REQUEST, "bad_input"),
        ErrorKind::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        ErrorKind::Overloaded => (StatusCode::TOO_MANY_REQUESTS, "overloaded"),
        ErrorKind::Exhausted => (StatusCode::CONFLICT, "exhausted"),
        ErrorKind::Unknown => (StatusCode::GATEWAY_TIMEOUT, "unknown_outcome"),
        ErrorKind::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        ErrorKind::NotFound => (StatusCode::NOT_FOUND, "not_found"),
        ErrorKind::Conflict => (StatusCode::CONFLICT, "conflict"),
        ErrorKind::Refused => (StatusCode::PRECONDITION_FAILED, "precondition_failed"),
        ErrorKind::Forbidden => (StatusCode::FORBIDDEN, "forbidden"),
    }
}

/// A request the front end answers itself, without a call: nothing was taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Refusal {
    /// The body is over [`super::MAX_BODY_BYTES`]: 413, send less (a smaller batch).
    TooLarge(String),
    /// The body did not arrive within [`super::BODY_TIMEOUT`]: 408, send it faster or again.
    Timeout(String),
    /// No such path: 404, the message lists the routes.
    NotFound(String),
    /// The path takes another method: 405 with `Allow`.
    MethodNotAllowed(String),
    /// A TLS caller whose certificate may not take numbers: 403.
    Forbidden(String),
}

impl Refusal {
    fn status_and_code(&self) -> (StatusCode, &'static str, &str) {
        match self {
            Refusal::TooLarge(m) => (StatusCode::PAYLOAD_TOO_LARGE, "too_large", m),
            Refusal::Timeout(m) => (StatusCode::REQUEST_TIMEOUT, "timeout", m),
            Refusal::NotFound(m) => (StatusCode::NOT_FOUND, "not_found", m),
            Refusal::MethodNotAllowed(m) => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", m),
            Refusal::Forbidden(m) => (StatusCode::FORBIDDEN, "forbidden", m),
        }
    }
}

/// Why a route gave no value: a failed call, or the front end's own refusal.
#[derive(Debug)]
pub(super) enum Failure {
    Call(CallError),
    Refused(Refusal),
}

impl From<CallError> for Failure {
    fn from(e: CallError) -> Self {
        Failure::Call(e)
    }
}

impl From<Refusal> for Failure {
    fn from(r: Refusal) -> Self {
        Failure::Refused(r)
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        match self {
            Failure::Call(e) => error(&e),
            Failure::Refused(r) => {
                let (status, code, message) = r.status_and_code();
                reply(status, code, message, false)
            }
        }
    }
}

/// The one error body, its message cut to [`MAX_MESSAGE_BYTES`].
fn error_body(code: &str, message: &str, may_have_been_taken: bool) -> Value {
    let message = cut(message, MAX_MESSAGE_BYTES);
    json!({"error": {"code": code, "message": message, "may_have_been_taken": may_have_been_taken}})
}

/// The longest start of `message` (whole characters) that takes at most `max` bytes as a JSON
/// string's contents, with serde_json's escapes counted: a message quoting the caller's input
/// then cannot make a reply grow with the request.
pub(super) fn cut(message: &str, max: usize) -> &str {
    let mut written = 0;
    for (at, c) in message.char_indices() {
        written += match c {
            '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
            c if (c as u32) < 0x20 => 6,
            c => c.len_utf8(),
        };
        if written > max {
            return &message[..at];
        }
    }
    message
}

fn reply(status: StatusCode, code: &str, message: &str, may_have_been_taken: bool) -> Response {
    (status, Json(error_body(code, message, may_have_been_taken))).into_response()
}

/// The reply to a failed call.
pub(super) fn error(e: &CallError) -> Response {
    let (status, code) = status_and_code(e.kind);
    let mut r = reply(status, code, &e.message, e.may_have_taken());
    if matches!(e.kind, ErrorKind::Unavailable | ErrorKind::Overloaded) {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

/// The error object of one item of a batch, written as the error body's (keys in the order a
/// map writes them), its message cut to [`MAX_ITEM_MESSAGE_BYTES`].
#[derive(serde::Serialize)]
pub(super) struct ItemError<'a> {
    code: &'static str,
    may_have_been_taken: bool,
    message: &'a str,
}

impl<'a> From<&'a CallError> for ItemError<'a> {
    fn from(e: &'a CallError) -> Self {
        Self {
            code: status_and_code(e.kind).1,
            may_have_been_taken: e.may_have_taken(),
            message: cut(&e.message, MAX_ITEM_MESSAGE_BYTES),
        }
    }
}

const ROUTES: &str = "the routes are POST /v1/seq/{uid}/next, POST /v1/seq/{uid}/reserve, GET /v1/seq/{uid}, \
                      POST /v1/seq/batch, POST /v1/counter/{key}/next, POST /v1/counter/{key}/reserve, \
                      GET /v1/counter/{key}, POST /v1/ids, GET /v1/ids/{id}, PUT and GET /v1/ledger/{key}, \
                      POST /v1/ledger/{key}/reserve, POST /v1/ledger/{key}/{n}/confirm, \
                      POST /v1/ledger/{key}/{n}/release, GET /v1/ledger/{key}/{n} and GET /v1/ledger/{key}/gaps";

pub(super) async fn not_found(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    Failure::from(Refusal::NotFound(format!("no route {method} {}; {ROUTES}", uri.path()))).into_response()
}

/// 405; the router adds `Allow`.
pub(super) async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let m = format!(
        "{method} is not allowed on {}: a take is a POST and a read a GET (the Allow header says which)",
        uri.path()
    );
    Failure::from(Refusal::MethodNotAllowed(m)).into_response()
}

/// The routes for a TLS caller whose certificate may not take numbers: 403 to everything.
pub(super) fn refused(why: String) -> axum::Router {
    axum::Router::new()
        .fallback(move || {
            let r = Failure::from(Refusal::Forbidden(why.clone()));
            async move { r.into_response() }
        })
        .layer(JsonErrors)
}

/// One path parameter (a uid or a key), percent-decoded; a path that does not decode to UTF-8 is
/// refused with the documented 400 rather than axum's text.
pub(super) struct Segment(pub(super) String);

impl<S: Send + Sync> FromRequestParts<S> for Segment {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Path::<String>::from_request_parts(parts, state).await {
            Ok(Path(s)) => Ok(Segment(s)),
            Err(e) => {
                debug!(error = %e.body_text(), "HTTP path refused");
                Err(error(&CallError::bad_input(
                    "the uid or key in the path must be UTF-8 once percent-decoded",
                )))
            }
        }
    }
}

/// A layer that answers every error reply that is not already our JSON with the documented
/// JSON of its status (the original's text goes to the log): whatever axum, hyper's body reader
/// or a future route makes, a caller sees one shape. A reply that is not an error, or is JSON,
/// passes untouched without an allocation.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct JsonErrors;

impl<S> tower::Layer<S> for JsonErrors {
    type Service = JsonErrorsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        JsonErrorsService { inner }
    }
}

#[derive(Debug, Clone)]
pub(super) struct JsonErrorsService<S> {
    inner: S,
}

type Remapped = Either<Ready<Result<Response, Infallible>>, BoxFuture<'static, Result<Response, Infallible>>>;

impl<S, R> tower::Service<R> for JsonErrorsService<S>
where
    S: tower::Service<R, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Then<S::Future, Remapped, fn(Result<Response, Infallible>) -> Remapped>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        self.inner.call(req).then(remap)
    }
}

fn remap(r: Result<Response, Infallible>) -> Remapped {
    let Ok(r) = r;
    let is_json = r
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|t| t.as_bytes().starts_with(b"application/json"));
    if r.status().as_u16() < 400 || is_json {
        return Either::Left(ready(Ok(r)));
    }
    Either::Right(Box::pin(async move { Ok(as_json(r).await) }))
}

/// How much of a library's error text is kept for the log.
const LOGGED_BYTES: usize = 1024;

/// `r`, an error reply that is not ours, as the documented JSON of its status; its headers
/// (`Allow`, `Retry-After`) kept, its text logged.
async fn as_json(r: Response) -> Response {
    let (mut parts, body) = r.into_parts();
    let text = axum::body::to_bytes(body, LOGGED_BYTES).await.unwrap_or_default();
    debug!(status = %parts.status, text = %String::from_utf8_lossy(&text), "HTTP error reply made JSON");
    let (code, message) = match parts.status {
        StatusCode::NOT_FOUND => ("not_found", ROUTES),
        StatusCode::METHOD_NOT_ALLOWED => (
            "method_not_allowed",
            "the method is not allowed on this path (see Allow)",
        ),
        StatusCode::REQUEST_TIMEOUT => ("timeout", "the request did not arrive in time"),
        StatusCode::PAYLOAD_TOO_LARGE => ("too_large", "the body is too large"),
        StatusCode::FORBIDDEN => ("forbidden", "this caller may not take numbers"),
        s if s.is_server_error() => ("internal", "the front end failed to answer"),
        _ => ("bad_input", "the request cannot be read"),
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    parts
        .headers
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let body = serde_json::to_vec(&error_body(code, message, false)).unwrap_or_default();
    Response::from_parts(parts, Body::from(body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Layer, ServiceExt};

    /// A cut message, written as JSON, takes at most the bound, ends on a whole character, and
    /// is as long as the bound allows; a short one is whole.
    #[test]
    fn a_message_is_cut_to_its_bound_as_json() {
        for unit in ["a", "\"", "\\", "\n", "\u{1}", "é", "€", "😀", "a\u{1f}\"é"] {
            let long = unit.repeat(500);
            for max in [0, 1, 7, 256, 1024] {
                let cut = cut(&long, max);
                let written = serde_json::to_string(cut).unwrap().len() - 2;
                assert!(written <= max, "{unit:?} at {max}: {written}");
                assert!(long.starts_with(cut));
                let one_more = &long[..long[cut.len()..]
                    .chars()
                    .next()
                    .map_or(long.len(), |c| cut.len() + c.len_utf8())];
                let longer = serde_json::to_string(one_more).unwrap().len() - 2;
                assert!(
                    cut.len() == long.len() || longer > max,
                    "{unit:?} at {max}: could take more"
                );
            }
        }
        assert_eq!(cut("why", 256), "why");
    }

    /// An error reply any library makes becomes the documented JSON with its status and
    /// headers; a success and our own JSON errors pass unchanged.
    #[tokio::test]
    async fn a_library_error_reply_becomes_the_documented_json() {
        let text = |status: StatusCode| {
            tower::service_fn(move |_: ()| async move {
                Ok::<_, Infallible>(
                    (
                        status,
                        [(header::ALLOW, "POST")],
                        "Failed to deserialize: internal detail",
                    )
                        .into_response(),
                )
            })
        };
        for (status, code) in [
            (StatusCode::BAD_REQUEST, "bad_input"),
            (StatusCode::UNSUPPORTED_MEDIA_TYPE, "bad_input"),
            (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
            (StatusCode::REQUEST_TIMEOUT, "timeout"),
            (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
            (StatusCode::BAD_GATEWAY, "internal"),
        ] {
            let r = JsonErrors.layer(text(status)).oneshot(()).await.unwrap();
            assert_eq!(r.status(), status);
            assert_eq!(r.headers()[header::ALLOW], "POST");
            assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
            let body = axum::body::to_bytes(r.into_body(), 4096).await.unwrap();
            let v: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["error"]["code"], code, "{status}");
            assert_eq!(v["error"]["may_have_been_taken"], false);
            assert!(!v.to_string().contains("internal detail"), "{v}");
        }
        let ok = JsonErrors.layer(text(StatusCode::OK)).oneshot(()).await.unwrap();
        let body = axum::body::to_bytes(ok.into_body(), 4096).await.unwrap();
        assert_eq!(&body[..], b"Failed to deserialize: internal detail");
        let ours =
            tower::service_fn(|_: ()| async { Ok::<_, Infallible>(error(&CallError::new(ErrorKind::Unknown, "why"))) });
        let r = JsonErrors.layer(ours).oneshot(()).await.unwrap();
        assert_eq!(r.status(), StatusCode::GATEWAY_TIMEOUT);
        let body = axum::body::to_bytes(r.into_body(), 4096).await.unwrap();
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["message"], "why");
        assert_eq!(v["error"]["may_have_been_taken"], true);
    }
}
