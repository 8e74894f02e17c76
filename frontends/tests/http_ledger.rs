//! The HTTP/JSON front end's ledger routes over an in-memory ledger: the replies (64-bit numbers
//! as strings, a reserve's request id named), what each route asks of the backend, every refusal's
//! status and code, and bad input refused before any call.

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use seqsvr_frontends::calls::{CallError, Calls, ErrorKind, LedgerAnswer, LedgerCall, Taken, Who};
use seqsvr_frontends::http::router;
use seqsvr_proto::pb;
use serde_json::Value;
use tower::ServiceExt;

/// A one-ledger backend: numbers handed out from 1, each held until confirmed; `fail` answers
/// every call while set. Records the calls it was asked, in words.
#[derive(Default)]
struct Ledger {
    high: Mutex<u64>,
    asked: Mutex<Vec<String>>,
    fail: Mutex<Option<CallError>>,
}

impl Ledger {
    fn info(&self) -> pb::LedgerInfo {
        pb::LedgerInfo {
            key: "inv".into(),
            hold_ms: 60_000,
            high: *self.high.lock().unwrap(),
            ..Default::default()
        }
    }

    fn entry(n: u64, state: pb::LedgerState) -> pb::LedgerEntry {
        let mut e = pb::LedgerEntry {
            number: n,
            at_ms: 1_796_169_600_000,
            ..Default::default()
        };
        e.set_state(state);
        e
    }

    fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap().clone()
    }
}

impl Calls for Ledger {
    async fn take(&self, _: Who<'_>, _: u32) -> Result<Taken, CallError> {
        Err(CallError::bad_input("not here"))
    }
    async fn current(&self, _: Who<'_>) -> Result<Taken, CallError> {
        Err(CallError::bad_input("not here"))
    }
    async fn batch(&self, _: &[u64]) -> Result<Vec<Result<Taken, CallError>>, CallError> {
        Err(CallError::bad_input("not here"))
    }
    async fn ids(&self, _: u32) -> Result<Vec<u64>, CallError> {
        Err(CallError::bad_input("not here"))
    }

    async fn ledger(&self, call: LedgerCall<'_>) -> Result<LedgerAnswer, CallError> {
        self.asked.lock().unwrap().push(format!("{call:?}"));
        if let Some(e) = self.fail.lock().unwrap().clone() {
            return Err(e);
        }
        let one = |entry: Option<pb::LedgerEntry>| {
            LedgerAnswer::One(pb::LedgerReply {
                ledger: Some(self.info()),
                entry,
                ..Default::default()
            })
        };
        Ok(match call {
            LedgerCall::Create { .. } => one(None),
            LedgerCall::Reserve { holder, .. } => {
                let n = {
                    let mut high = self.high.lock().unwrap();
                    *high += 1;
                    *high
                };
                let mut e = Self::entry(n, pb::LedgerState::Held);
                e.holder = holder.to_owned();
                one(Some(e))
            }
            LedgerCall::Confirm { number, reference, .. } => {
                let mut e = Self::entry(number, pb::LedgerState::Confirmed);
                e.reference = reference.to_owned();
                one(Some(e))
            }
            LedgerCall::Issue { reference, .. } => {
                let n = {
                    let mut high = self.high.lock().unwrap();
                    *high += 1;
                    *high
                };
                let mut e = Self::entry(n, pb::LedgerState::Confirmed);
                e.reference = reference.to_owned();
                one(Some(e))
            }
            LedgerCall::Release { number, note, .. } => {
                let mut e = Self::entry(number, pb::LedgerState::Voided);
                e.set_reason(pb::VoidReason::Released);
                e.note = note.to_owned();
                e.holder = note.to_owned();
                one(Some(e))
            }
            LedgerCall::Show { from, count, .. } => {
                let high = *self.high.lock().unwrap();
                LedgerAnswer::Show(pb::LedgerShowReply {
                    ledger: Some(self.info()),
                    entries: (from..from + u64::from(count))
                        .filter(|&n| n >= 1 && n <= high)
                        .map(|n| Self::entry(n, pb::LedgerState::Held))
                        .collect(),
                    ..Default::default()
                })
            }
            LedgerCall::Gaps { after, .. } => {
                let mut run = Self::entry(after + 1, pb::LedgerState::Voided);
                run.through = after + 3;
                run.set_reason(pb::VoidReason::Expired);
                LedgerAnswer::Gaps(pb::LedgerGapsReply {
                    ledger: Some(self.info()),
                    voided: vec![run],
                    more: true,
                    ..Default::default()
                })
            }
        })
    }
}

async fn call(l: &Arc<Ledger>, method: &str, uri: &str, body: Option<&str>) -> (StatusCode, Value) {
    let (status, bytes) = call_raw(l, method, uri, body).await;
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

async fn call_raw(l: &Arc<Ledger>, method: &str, uri: &str, body: Option<&str>) -> (StatusCode, Vec<u8>) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_owned())))
        .unwrap();
    let resp = router(l.clone()).oneshot(req).await.unwrap();
    let status = resp.status();
    (status, resp.into_body().collect().await.unwrap().to_bytes().to_vec())
}

#[tokio::test]
async fn each_route_asks_its_call_and_answers_numbers_as_strings() {
    let l = Arc::new(Ledger::default());
    let (s, v) = call(&l, "PUT", "/v1/ledger/inv", Some(r#"{"hold_ms": 5000}"#)).await;
    assert_eq!(
        (s, &v["ledger"]["hold_ms"]),
        (StatusCode::OK, &Value::from("60000")),
        "{v}"
    );
    let (s, v) = call(&l, "PUT", "/v1/ledger/inv", None).await;
    assert_eq!(s, StatusCode::OK, "an empty body is the default hold: {v}");

    let (s, v) = call(
        &l,
        "POST",
        "/v1/ledger/inv/reserve",
        Some(r#"{"holder":"till-1","request_id":"r-1"}"#),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        (&v["number"], &v["request_id"]),
        (&Value::from("1"), &Value::from("r-1")),
        "{v}"
    );
    assert_eq!(
        (&v["entry"]["state"], &v["entry"]["holder"]),
        (&Value::from("held"), &Value::from("till-1"))
    );
    // Without a request id, one is drawn here and named: the caller retries with it.
    let (_, v) = call(&l, "POST", "/v1/ledger/inv/reserve", None).await;
    let drawn = v["request_id"].as_str().expect("a drawn request id").to_owned();
    assert!(!drawn.is_empty());

    let (s, v) = call(&l, "POST", "/v1/ledger/inv/2/confirm", Some(r#"{"reference":"INV-2"}"#)).await;
    assert_eq!(
        (s, &v["entry"]["reference"]),
        (StatusCode::OK, &Value::from("INV-2")),
        "{v}"
    );
    let (s, v) = call(&l, "POST", "/v1/ledger/inv/1/release", Some(r#"{"note":"left"}"#)).await;
    assert_eq!(
        (s, &v["entry"]["reason"]),
        (StatusCode::OK, &Value::from("released")),
        "{v}"
    );

    let (s, v) = call(&l, "GET", "/v1/ledger/inv", None).await;
    assert_eq!((s, &v["ledger"]["high"]), (StatusCode::OK, &Value::from("2")), "{v}");
    assert!(v.get("entries").is_none(), "a summary only: {v}");
    let (_, v) = call(&l, "GET", "/v1/ledger/inv?from=1&count=5", None).await;
    assert_eq!(v["entries"].as_array().map(Vec::len), Some(2), "{v}");
    let (_, v) = call(&l, "GET", "/v1/ledger/inv/9", None).await;
    assert_eq!(v["entry"]["state"], "not_issued", "{v}");
    let (_, v) = call(&l, "GET", "/v1/ledger/inv/gaps?after=10", None).await;
    assert_eq!(
        (&v["voided"][0]["number"], &v["voided"][0]["through"]),
        (&Value::from("11"), &Value::from("13"))
    );
    assert_eq!(v["next_after"], "13", "the next page starts above the run's end: {v}");

    let asked = l.asked();
    assert!(asked[0].contains("hold_ms: 5000"), "{asked:?}");
    assert!(asked[2].contains("request_id: Some(\"r-1\")"), "{asked:?}");
    assert!(asked[3].contains(&drawn), "{asked:?}");
    assert!(asked.last().unwrap().contains("after: 10, limit: 100"), "{asked:?}");
}

#[tokio::test]
async fn a_reserve_with_a_reference_is_an_issue_answered_confirmed() {
    let l = Arc::new(Ledger::default());
    let (s, v) = call(&l, "POST", "/v1/ledger/inv/reserve", Some(r#"{"reference":"INV-7"}"#)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        (&v["number"], &v["entry"]["state"], &v["entry"]["reference"]),
        (&Value::from("1"), &Value::from("confirmed"), &Value::from("INV-7")),
        "{v}"
    );
    assert!(v.get("request_id").is_none(), "nothing is held, no request id: {v}");
    assert_eq!(l.asked(), [r#"Issue { key: "inv", reference: "INV-7" }"#]);
    // An unknown outcome tells the caller what to send again.
    *l.fail.lock().unwrap() = Some(CallError::new(ErrorKind::Unknown, "outcome unknown"));
    let (s, v) = call(&l, "POST", "/v1/ledger/inv/reserve", Some(r#"{"reference":"INV-8"}"#)).await;
    assert_eq!(s, StatusCode::GATEWAY_TIMEOUT, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("same reference"),
        "{v}"
    );
}

#[tokio::test]
async fn refusals_map_to_their_status_and_code() {
    let cases = [
        (ErrorKind::NotFound, StatusCode::NOT_FOUND, "not_found"),
        (ErrorKind::Conflict, StatusCode::CONFLICT, "conflict"),
        (
            ErrorKind::Refused,
            StatusCode::PRECONDITION_FAILED,
            "precondition_failed",
        ),
        (ErrorKind::Forbidden, StatusCode::FORBIDDEN, "forbidden"),
        (ErrorKind::Overloaded, StatusCode::TOO_MANY_REQUESTS, "overloaded"),
        (ErrorKind::Unavailable, StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
    ];
    for (kind, status, code) in cases {
        let l = Arc::new(Ledger::default());
        *l.fail.lock().unwrap() = Some(CallError::new(kind, "number 3 of ledger \"inv\" is confirmed"));
        let (s, v) = call(&l, "POST", "/v1/ledger/inv/3/confirm", Some(r#"{"reference":"x"}"#)).await;
        assert_eq!((s, &v["error"]["code"]), (status, &Value::from(code)), "{kind:?}: {v}");
    }
    // A reserve whose outcome is unknown names the request id to retry with.
    let l = Arc::new(Ledger::default());
    *l.fail.lock().unwrap() = Some(CallError::new(ErrorKind::Unknown, "outcome unknown"));
    let (s, v) = call(&l, "POST", "/v1/ledger/inv/reserve", Some(r#"{"request_id":"r-9"}"#)).await;
    assert_eq!(s, StatusCode::GATEWAY_TIMEOUT, "{v}");
    assert_eq!(v["error"]["may_have_been_taken"], true, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("r-9"), "{v}");
}

#[tokio::test]
async fn bad_input_is_refused_before_any_call() {
    let l = Arc::new(Ledger::default());
    let long = "k".repeat(257);
    let bad = [
        ("PUT", "/v1/ledger/inv".to_owned(), Some(r#"{"hold":1}"#)),
        ("PUT", "/v1/ledger/inv".to_owned(), Some("not json")),
        ("POST", format!("/v1/ledger/{long}/reserve"), None),
        (
            "POST",
            "/v1/ledger/inv/reserve".to_owned(),
            Some(r#"{"reference":"a","request_id":"r"}"#),
        ),
        (
            "POST",
            "/v1/ledger/inv/x/confirm".to_owned(),
            Some(r#"{"reference":"a"}"#),
        ),
        ("POST", "/v1/ledger/inv/-1/release".to_owned(), None),
        ("GET", "/v1/ledger/inv?from=1&count=101".to_owned(), None),
        ("GET", "/v1/ledger/inv?count=5".to_owned(), None),
        ("GET", "/v1/ledger/inv?frm=1".to_owned(), None),
        ("GET", "/v1/ledger/inv/gaps?limit=0".to_owned(), None),
        ("GET", "/v1/ledger/inv/gaps?limit=101".to_owned(), None),
    ];
    for (method, uri, body) in bad {
        let (s, v) = call(&l, method, &uri, body).await;
        assert_eq!(
            (s, &v["error"]["code"]),
            (StatusCode::BAD_REQUEST, &Value::from("bad_input")),
            "{method} {uri}: {v}"
        );
    }
    assert!(l.asked().is_empty(), "{:?}", l.asked());
}

#[tokio::test]
async fn the_widest_single_reply_fits_the_reply_bound() {
    // A key of 256 bytes and a note and holder of 64, each byte one JSON escapes to six.
    let l = Arc::new(Ledger::default());
    let key = "%01".repeat(256);
    let note = "\\u0001".repeat(64);
    let body = format!(r#"{{"note":"{note}"}}"#);
    let uri = format!("/v1/ledger/{key}/18446744073709551615/release");
    let (s, bytes) = call_raw(&l, "POST", &uri, Some(&body)).await;
    assert_eq!(s, StatusCode::OK, "{}", String::from_utf8_lossy(&bytes));
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["entry"]["note"].as_str().map(str::len), Some(64), "{v}");
    eprintln!("the widest single ledger reply: {} bytes", bytes.len());
    assert!(
        bytes.len() <= seqsvr_frontends::http::MAX_REPLY_BYTES,
        "{} bytes",
        bytes.len()
    );
}
