//! The HTTP/JSON front end's routes over [`common::Fake`]: the replies, 64-bit numbers as strings,
//! and every error's status, body and headers, with nothing taken for bad input.

mod common;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::Fake;
use http_body_util::BodyExt;
use seqsvr_frontends::calls::{CallError, ErrorKind};
use seqsvr_frontends::http::{
    BATCH_WAIT, MAX_BATCHES_IN_SERVICE, MAX_BODY_BYTES, MAX_IDS_UNBATCHED, TIMEOUT_HEADER, router,
};
use seqsvr_proto::limits::MAX_UIDS_PER_BATCH;
use serde_json::{Value, json};
use tower::ServiceExt;

struct Answer {
    status: StatusCode,
    retry_after: Option<String>,
    body: Value,
}

async fn call(fake: &Arc<Fake>, method: &str, uri: &str, body: Option<Body>, timeout_ms: Option<&str>) -> Answer {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(t) = timeout_ms {
        req = req.header(TIMEOUT_HEADER, t);
    }
    let req = req.body(body.unwrap_or_else(Body::empty)).unwrap();
    answer(router(fake.clone()).oneshot(req).await.unwrap()).await
}

/// A reply read to its end.
async fn answer(resp: axum::response::Response) -> Answer {
    let status = resp.status();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into()));
    Answer {
        status,
        retry_after,
        body,
    }
}

async fn post(fake: &Arc<Fake>, uri: &str) -> Answer {
    call(fake, "POST", uri, None, None).await
}

#[tokio::test]
async fn every_route_answers_with_numbers_as_strings() {
    let fake = Arc::new(Fake::default());
    assert_eq!(
        post(&fake, "/v1/seq/42/next").await.body,
        json!({"uid": "42", "seq": "1"})
    );
    assert_eq!(
        post(&fake, "/v1/seq/42/next").await.body,
        json!({"uid": "42", "seq": "2"})
    );
    assert_eq!(
        post(&fake, "/v1/seq/42/reserve?count=10").await.body,
        json!({"uid": "42", "first": "3", "last": "12", "count": 10})
    );
    let cur = call(&fake, "GET", "/v1/seq/42", None, None).await;
    assert_eq!(
        (cur.status, cur.body),
        (StatusCode::OK, json!({"uid": "42", "cur_seq": "12"}))
    );
    assert_eq!(
        post(&fake, "/v1/counter/a%2Fb%20c/next").await.body,
        json!({"key": "a/b c", "value": "1"})
    );
    assert_eq!(
        post(&fake, "/v1/counter/orders/reserve?count=5").await.body,
        json!({"key": "orders", "first": "1", "last": "5", "count": 5})
    );
    assert_eq!(
        call(&fake, "GET", "/v1/counter/orders", None, None).await.body,
        json!({"key": "orders", "value": "5"})
    );
    assert_eq!(
        post(&fake, "/v1/ids?count=3").await.body,
        json!({"ids": ["1", "2", "3"]})
    );
    assert_eq!(post(&fake, "/v1/ids").await.body, json!({"ids": ["4"]}));
    let batch = call(
        &fake,
        "POST",
        "/v1/seq/batch",
        Some(Body::from(r#"{"uids": [42, "18446744073709551615", 7]}"#)),
        None,
    )
    .await;
    assert_eq!(
        batch.body,
        json!({"results": [
            {"uid": "42", "seq": "13"},
            {"uid": "18446744073709551615", "seq": "1"},
            {"uid": "7", "seq": "1"},
        ]})
    );
}

/// `GET /v1/ids/{id}` decodes on the node, from the layout it has; an id it cannot decode is a
/// 400, and no layout yet a 503.
#[tokio::test]
async fn an_id_decodes_to_its_time_slot_sequence_and_set() {
    use seqsvr_proto::id_layout::{DEFAULT_EPOCH_MS, IdLayout, IdParts};
    let fake = Arc::new(Fake::default());
    let layout = IdLayout::javascript(DEFAULT_EPOCH_MS);
    let tick = (1_796_169_600_000 - DEFAULT_EPOCH_MS) / 10; // 2026-12-02T00:00:00Z
    let id = layout.compose(IdParts { tick, slot: 70, seq: 5 }).unwrap();
    let none = call(&fake, "GET", &format!("/v1/ids/{id}"), None, None).await;
    assert_eq!(none.status, StatusCode::SERVICE_UNAVAILABLE, "{}", none.body);
    *fake.decoding.lock().unwrap() = Some((layout, 64));
    let got = call(&fake, "GET", &format!("/v1/ids/{id}"), None, None).await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(
        got.body,
        json!({"id": id.to_string(), "time": "2026-12-02T00:00:00Z", "unix_ms": "1796169600000",
               "tick": tick.to_string(), "slot": "70", "sequence": "5", "set": "1"})
    );
    for bad in ["abc", "9223372036854775808", "18446744073709551616"] {
        let r = call(&fake, "GET", &format!("/v1/ids/{bad}"), None, None).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}: {}", r.body);
        assert_eq!(r.body["error"]["code"], "bad_input", "{bad}: {}", r.body);
    }
    assert_eq!(fake.taken(), 0);
}

#[tokio::test]
async fn bad_input_is_a_400_with_the_reason_and_takes_nothing() {
    let fake = Arc::new(Fake::default());
    let long = "k".repeat(257);
    let cases: Vec<(&str, String, Option<String>, &str)> = vec![
        ("POST", "/v1/seq/abc/next".into(), None, "uid must be a decimal number"),
        ("POST", "/v1/seq/-1/next".into(), None, "uid must be a decimal number"),
        (
            "POST",
            "/v1/seq/18446744073709551616/next".into(),
            None,
            "does not fit in 64 bits",
        ),
        ("POST", "/v1/seq/1/reserve".into(), None, "count is required"),
        ("POST", "/v1/seq/1/reserve?count=0".into(), None, "count must be 1 to"),
        (
            "POST",
            "/v1/seq/1/reserve?count=x".into(),
            None,
            "count must be a decimal number",
        ),
        (
            "POST",
            "/v1/seq/1/reserve?count=2&x=1".into(),
            None,
            "unknown query parameter",
        ),
        ("POST", format!("/v1/counter/{long}/next"), None, "256"),
        ("POST", "/v1/ids?count=4097".into(), None, "count must be 1 to 4096"),
        (
            "POST",
            "/v1/ids?count=-1".into(),
            None,
            "count must be a decimal number",
        ),
        ("POST", "/v1/seq/batch".into(), Some("{".into()), "the body must be"),
        (
            "POST",
            "/v1/seq/batch".into(),
            Some(r#"{"uids": []}"#.into()),
            "1 to 1000 uids",
        ),
        (
            "POST",
            "/v1/seq/batch".into(),
            Some(r#"{"uids": [1.5]}"#.into()),
            "the body must be",
        ),
        (
            "POST",
            "/v1/seq/batch".into(),
            Some(r#"{"uids": ["x"]}"#.into()),
            "uid must be",
        ),
        (
            "POST",
            "/v1/seq/batch".into(),
            Some(r#"{"uids": [1], "more": 1}"#.into()),
            "unknown field",
        ),
    ];
    for (method, uri, body, why) in cases {
        let a = call(&fake, method, &uri, body.map(Body::from), None).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{uri}: {}", a.body);
        assert_eq!(a.body["error"]["code"], "bad_input", "{uri}");
        assert_eq!(a.body["error"]["may_have_been_taken"], false, "{uri}");
        let msg = a.body["error"]["message"].as_str().unwrap();
        assert!(msg.contains(why), "{uri}: {msg}");
    }
    for t in ["0", "x", "60001"] {
        let a = call(&fake, "POST", "/v1/seq/1/next", None, Some(t)).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{t}");
    }
    assert_eq!(fake.taken(), 0);

    let a = post(&fake, "/v1/nothing/here").await;
    assert_eq!(
        (a.status, a.body["error"]["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    let a = call(&fake, "GET", "/v1/seq/1/next", None, None).await;
    assert_eq!(a.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(fake.taken(), 0);
}

#[tokio::test]
async fn failures_map_to_statuses_a_caller_can_act_on() {
    let fake = Arc::new(Fake::default());
    for (kind, status, retry_after, taken) in [
        (
            ErrorKind::Unavailable,
            StatusCode::SERVICE_UNAVAILABLE,
            Some("1"),
            false,
        ),
        (ErrorKind::Overloaded, StatusCode::TOO_MANY_REQUESTS, Some("1"), false),
        (ErrorKind::Unknown, StatusCode::GATEWAY_TIMEOUT, None, true),
        (ErrorKind::Exhausted, StatusCode::CONFLICT, None, false),
    ] {
        fake.fail_with(Some(CallError::new(kind, "why")));
        let a = post(&fake, "/v1/counter/c/next").await;
        assert_eq!(a.status, status, "{kind:?}");
        assert_eq!(a.retry_after.as_deref(), retry_after, "{kind:?}");
        assert_eq!(a.body["error"]["may_have_been_taken"], taken, "{kind:?}");
        assert_eq!(a.body["error"]["message"], "why");
    }
}

#[tokio::test(start_paused = true)]
async fn a_call_past_the_callers_deadline_is_a_504_that_may_have_taken_a_number() {
    let fake = Arc::new(Fake::default());
    *fake.delay.lock().unwrap() = Some(Duration::from_secs(5));
    let a = call(&fake, "POST", "/v1/seq/1/next", None, Some("50")).await;
    assert_eq!(a.status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(a.body["error"]["may_have_been_taken"], true);
    // A read past its deadline took nothing.
    let a = call(&fake, "GET", "/v1/seq/1", None, Some("50")).await;
    assert_eq!(a.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(a.body["error"]["may_have_been_taken"], false);
}

#[tokio::test(start_paused = true)]
async fn half_sent_headers_are_cut_off_and_take_nothing() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fake = Arc::new(Fake::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_stop_tx, stop) = tokio::sync::watch::channel(false);
    tokio::spawn(seqsvr_frontends::http::serve(
        listener,
        fake.clone(),
        seqsvr_frontends::http::HttpConfig::default(),
        stop,
    ));
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"POST /v1/seq/1/next HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut out)).await;
    // Closed by the server (after HEADER_TIMEOUT on the paused clock), not by our 60 s.
    assert!(read.is_ok(), "the connection stayed open");
    assert_eq!(fake.taken(), 0);
}

/// Every error the router answers is the documented JSON with the status that says what to do,
/// including the ones axum and the body reader make: a path that does not percent-decode to
/// UTF-8, a wrong method, a body over the bound.
#[tokio::test]
async fn every_error_is_the_documented_json_and_takes_nothing() {
    let fake = Arc::new(Fake::default());
    let big = Body::from(vec![b' '; MAX_BODY_BYTES + 1]);
    // method, path, body, and the status, code and words of the answer
    type Case = (
        &'static str,
        &'static str,
        Option<Body>,
        StatusCode,
        &'static str,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (
            "POST",
            "/v1/counter/%FF/next",
            None,
            StatusCode::BAD_REQUEST,
            "bad_input",
            "UTF-8",
        ),
        (
            "GET",
            "/v1/counter/a%FFb",
            None,
            StatusCode::BAD_REQUEST,
            "bad_input",
            "UTF-8",
        ),
        (
            "POST",
            "/v1/seq/%C3%28/next",
            None,
            StatusCode::BAD_REQUEST,
            "bad_input",
            "UTF-8",
        ),
        (
            "GET",
            "/v1/seq/1/next",
            None,
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "POST",
        ),
        (
            "DELETE",
            "/v1/ids",
            None,
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "POST",
        ),
        (
            "POST",
            "/v1/seq/batch",
            Some(big),
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            "the body is over",
        ),
    ];
    for (method, uri, body, status, code, why) in cases {
        let a = call(&fake, method, uri, body, None).await;
        assert_eq!(a.status, status, "{method} {uri}: {}", a.body);
        assert_eq!(a.body["error"]["code"], code, "{method} {uri}: {}", a.body);
        assert_eq!(a.body["error"]["may_have_been_taken"], false, "{method} {uri}");
        let msg = a.body["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(why), "{method} {uri}: {msg}");
    }
    assert_eq!(fake.taken(), 0);
}

/// A body that stops arriving is a 408 in JSON, not a bad input: the caller sent nothing wrong.
#[tokio::test(start_paused = true)]
async fn a_body_that_stops_arriving_is_a_json_408() {
    let fake = Arc::new(Fake::default());
    use futures::StreamExt;
    let first = axum::body::Bytes::from_static(b"{\"uids\":");
    let stalled = futures::stream::once(async { Ok::<_, std::io::Error>(first) }).chain(futures::stream::pending());
    let a = call(&fake, "POST", "/v1/seq/batch", Some(Body::from_stream(stalled)), None).await;
    assert_eq!(a.status, StatusCode::REQUEST_TIMEOUT, "{}", a.body);
    assert_eq!(a.body["error"]["code"], "timeout");
    assert_eq!(a.body["error"]["may_have_been_taken"], false);
    assert_eq!(fake.taken(), 0);
}

/// A batch takes at most what a gRPC batch takes (the client library splits larger calls into
/// batches of that size): the most uids, even as 20-digit strings one a line, fit the body bound
/// and are answered; one more is refused with the count, and takes nothing.
#[tokio::test]
async fn a_batch_takes_at_most_what_a_grpc_batch_takes() {
    let fake = Arc::new(Fake::default());
    let widest: Vec<String> = (0..MAX_UIDS_PER_BATCH as u64)
        .map(|i| (u64::MAX - i).to_string())
        .collect();
    let pretty = serde_json::to_string_pretty(&json!({ "uids": widest })).unwrap();
    assert!(pretty.len() <= MAX_BODY_BYTES, "{} bytes", pretty.len());
    let a = call(&fake, "POST", "/v1/seq/batch", Some(Body::from(pretty)), None).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body["error"]);
    assert_eq!(a.body["results"].as_array().map(Vec::len), Some(MAX_UIDS_PER_BATCH));
    assert_eq!(a.body["results"][0], json!({"uid": "18446744073709551615", "seq": "1"}));
    let taken = fake.taken();

    let one_more = json!({ "uids": (0..=MAX_UIDS_PER_BATCH as u64).collect::<Vec<_>>() }).to_string();
    let a = call(&fake, "POST", "/v1/seq/batch", Some(Body::from(one_more)), None).await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.body["error"]);
    assert_eq!(a.body["error"]["code"], "bad_input");
    let msg = a.body["error"]["message"].as_str().unwrap_or_default();
    let want = format!(
        "a batch needs 1 to {MAX_UIDS_PER_BATCH} uids, got {}",
        MAX_UIDS_PER_BATCH + 1
    );
    assert!(msg.contains(&want), "{msg}");
    assert_eq!(fake.taken(), taken);
}

fn batch_of_one() -> Request<Body> {
    Request::post("/v1/seq/batch")
        .body(Body::from(r#"{"uids":[1]}"#))
        .unwrap()
}

fn post_to(uri: &str) -> Request<Body> {
    Request::post(uri).body(Body::empty()).unwrap()
}

/// The answer to a batch that found no place: a 429 `overloaded` with `Retry-After`, after
/// waiting [`BATCH_WAIT`], that took nothing.
async fn assert_refused_for_room(app: &axum::Router, req: Request<Body>, fake: &Fake) {
    let taken = fake.taken();
    let started = tokio::time::Instant::now();
    let a = answer(app.clone().oneshot(req).await.unwrap()).await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS, "{}", a.body);
    assert_eq!(a.body["error"]["code"], "overloaded");
    assert_eq!(a.body["error"]["may_have_been_taken"], false);
    assert_eq!(a.retry_after.as_deref(), Some("1"));
    assert!(started.elapsed() >= BATCH_WAIT, "refused after {:?}", started.elapsed());
    assert_eq!(fake.taken(), taken);
}

/// At most [`MAX_BATCHES_IN_SERVICE`] batches are served at once — a batch of uids, or ids of
/// more than [`MAX_IDS_UNBATCHED`] — each from before its body is read until its reply has been
/// taken whole (or dropped with its connection): the next waits [`BATCH_WAIT`] for a place, then
/// is a 429 that took nothing. Single calls never wait for a place.
#[tokio::test(start_paused = true)]
async fn batches_in_service_are_bounded_until_their_replies_are_taken() {
    let fake = Arc::new(Fake::default());
    let app = router(fake.clone());
    // Replies produced but not read: each keeps its place.
    let mut held = Vec::new();
    for i in 0..MAX_BATCHES_IN_SERVICE {
        let req = if i % 2 == 0 {
            batch_of_one()
        } else {
            post_to(&format!("/v1/ids?count={}", MAX_IDS_UNBATCHED + 1))
        };
        let r = app.clone().oneshot(req).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        held.push(r);
    }
    assert_refused_for_room(&app, batch_of_one(), &fake).await;
    assert_refused_for_room(
        &app,
        post_to(&format!("/v1/ids?count={}", MAX_IDS_UNBATCHED + 1)),
        &fake,
    )
    .await;
    // Single calls, and ids of at most MAX_IDS_UNBATCHED, are not batches.
    let a = answer(app.clone().oneshot(post_to("/v1/seq/1/next")).await.unwrap()).await;
    assert_eq!(a.status, StatusCode::OK);
    let uri = format!("/v1/ids?count={MAX_IDS_UNBATCHED}");
    let a = answer(app.clone().oneshot(post_to(&uri)).await.unwrap()).await;
    assert_eq!(a.status, StatusCode::OK);

    // A reply read to its end gives its place back.
    let read = answer(held.pop().unwrap()).await;
    assert_eq!(read.status, StatusCode::OK, "{}", read.body);
    let a = answer(app.clone().oneshot(batch_of_one()).await.unwrap()).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    // So does one dropped unread (its connection closed).
    drop(held);
    let a = answer(app.clone().oneshot(batch_of_one()).await.unwrap()).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);

    // Batches waiting on the backend hold their places too.
    *fake.delay.lock().unwrap() = Some(Duration::from_secs(5));
    let in_service: Vec<_> = (0..MAX_BATCHES_IN_SERVICE)
        .map(|_| tokio::spawn(app.clone().oneshot(batch_of_one())))
        .collect();
    // Every one of them is parked in the backend before the next comes.
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_refused_for_room(&app, batch_of_one(), &fake).await;
    for t in in_service {
        let a = answer(t.await.unwrap().unwrap()).await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    }
}
