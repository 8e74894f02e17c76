//! Every error the HTTP front end answers, as the one documented JSON object: the mapping of a
//! failed call to its status and code, and the answers of the router itself.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::calls::{CallError, ErrorKind};

/// An error reply.
pub(super) fn error(e: &CallError) -> Response {
    let (status, code) = status_and_code(e.kind);
    let mut r = (status, Json(error_body(e, code))).into_response();
    if matches!(e.kind, ErrorKind::Unavailable | ErrorKind::Overloaded) {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

/// The one mapping of a failure to its HTTP status and error code (a batch item uses the code).
pub(super) fn status_and_code(kind: ErrorKind) -> (StatusCode, &'static str) {
    match kind {
        ErrorKind::BadInput => (StatusCode::BAD_REQUEST, "bad_input"),
        ErrorKind::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        ErrorKind::Overloaded => (StatusCode::TOO_MANY_REQUESTS, "overloaded"),
        ErrorKind::Exhausted => (StatusCode::CONFLICT, "exhausted"),
        ErrorKind::Unknown => (StatusCode::GATEWAY_TIMEOUT, "unknown_outcome"),
        ErrorKind::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
    }
}

pub(super) fn error_body(e: &CallError, code: &str) -> Value {
    json!({"error": {"code": code, "message": e.message, "may_have_been_taken": e.may_have_taken()}})
}

/// The error object of one item of a batch.
pub(super) fn item_error(e: &CallError) -> Value {
    error_body(e, status_and_code(e.kind).1)["error"].clone()
}

pub(super) async fn not_found(method: axum::http::Method, uri: axum::http::Uri) -> Response {
    let e = CallError::bad_input(format!(
        "no route {method} {}; the routes are /v1/seq/{{uid}}[/next|/reserve], /v1/seq/batch, \
         /v1/counter/{{key}}[/next|/reserve] and /v1/ids",
        uri.path()
    ));
    (StatusCode::NOT_FOUND, Json(error_body(&e, "not_found"))).into_response()
}

/// The routes for a TLS caller whose certificate may not take numbers: 403 to everything.
pub(super) fn refused(why: String) -> axum::Router {
    let e = CallError::bad_input(why);
    axum::Router::new().fallback(move || {
        let body = error_body(&e, "forbidden");
        async move { (StatusCode::FORBIDDEN, Json(body)).into_response() }
    })
}
