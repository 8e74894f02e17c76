//! The ledger routes of the HTTP front end: numbers with no gaps, each held, confirmed or voided,
//! decided by the set that keeps the ledger ([`Calls::ledger`]).
//!
//! | method and path | body | body of a 200 |
//! |---|---|---|
//! | `PUT /v1/ledger/{key}` | `{"hold_ms": N}` (optional) | `{"ledger":{...},"repeated":false}` |
//! | `POST /v1/ledger/{key}/reserve` | `{"holder":"…","request_id":"…"}` (optional) | `{"key","number":"7","request_id","entry","ledger","repeated"}` |
//! | `POST /v1/ledger/{key}/reserve` | `{"reference":"…"}` (an issue) | `{"key","number":"7","entry","ledger","repeated"}` |
//! | `POST /v1/ledger/{key}/{n}/confirm` | `{"reference":"…"}` | `{"key","number","entry","ledger","repeated"}` |
//! | `POST /v1/ledger/{key}/{n}/release` | `{"note":"…"}` (optional) | the same |
//! | `GET /v1/ledger/{key}` | | `{"key","ledger":{...}}` |
//! | `GET /v1/ledger/{key}?from=N&count=M` | | `{"key","ledger":{...},"entries":[...]}` (M ≤ [`MOST_SHOWN`]) |
//! | `GET /v1/ledger/{key}/{n}` | | `{"key","ledger":{...},"entry":{...}}` |
//! | `GET /v1/ledger/{key}/gaps?after=N&limit=M` | | `{"key","ledger","voided":[...],"more":bool,"next_after"}` |
//!
//! A reserve without a `request_id` gets one drawn here and named in the reply: a caller whose
//! reply is lost sends the same id again and gets the same number. A reserve with a `reference`
//! is an issue: the number is confirmed with it in the same write (one commit instead of two),
//! never held, and the reference is what a retry repeats. A confirm repeated with the
//! same reference answers the same. A number's `state` is `held`, `confirmed`, `voided` or
//! `not_issued`; a voided run has `reason` (`released`, `expired`, `operator`,
//! `lost_with_restore`), `by`, `note`, `through` (its last number) and `time` (RFC 3339).
//!
//! Refusals: 404 `not_found` (no such ledger, a number never handed out), 409 `conflict` (confirmed
//! with another reference, created with another hold), 412 `precondition_failed` (the number is
//! voided or confirmed, or the ledger waits for a reconcile), 429 (too many held numbers), 503
//! (retry), 504 `unknown_outcome` (a reserve may have taken a number: send the same request id).
//!
//! Left out: the operator's void and reconcile (`seqctl ledger`), and the whole gap report in one
//! reply (it is read a page of at most [`MOST_SHOWN`] runs at a time, so that a reply stays the
//! size of a batch's).

use std::collections::HashMap;
use std::sync::Arc;

use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use seqsvr_proto::pb;
use serde_json::{Value, json};

use super::batches::{self, Batches};
use super::errors::{Failure, Refusal, Segment};
use super::routes::{deadline, exact_json, key_of};
use super::{BODY_TIMEOUT, MAX_BODY_BYTES};
use crate::calls::{CallError, Calls, LedgerAnswer, LedgerCall, parse_u64, within};
use crate::{Front, count_call};

/// Most numbers one `GET ?from&count` shows and most voided runs one gaps page holds: a reply of
/// at most ~60 KB, served as a batch (one of `MAX_BATCHES_IN_SERVICE` places).
pub const MOST_SHOWN: u32 = 100;

type QueryResult = Result<Query<HashMap<String, String>>, axum::extract::rejection::QueryRejection>;

/// The body of a create.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct CreateIn {
    #[serde(default)]
    hold_ms: u64,
}

/// The body of a reserve.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ReserveIn {
    #[serde(default)]
    holder: String,
    request_id: Option<String>,
    /// Set: confirmed in the same write (an issue).
    #[serde(default)]
    reference: String,
}

/// The body of a confirm.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ConfirmIn {
    #[serde(default)]
    reference: String,
}

/// The body of a release.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ReleaseIn {
    #[serde(default)]
    note: String,
}

/// An optional JSON body: empty is `T::default()`.
async fn body_of<T: serde::de::DeserializeOwned + Default>(body: Body, shape: &str) -> Result<T, Failure> {
    let bytes = match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, MAX_BODY_BYTES)).await {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => return Err(super::routes::body_error(&e)),
        Err(_) => return Err(Refusal::Timeout(format!("the body did not arrive within {BODY_TIMEOUT:?}")).into()),
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(&bytes).map_err(|e| CallError::bad_input(format!("the body must be {shape}: {e}")).into())
}

/// Runs one ledger call within the caller's deadline, counted as a front-end call.
async fn call<C: Calls>(calls: &C, headers: &HeaderMap, c: LedgerCall<'_>) -> Result<LedgerAnswer, CallError> {
    let d = deadline(headers)?;
    let r = within(d, c.writes(), calls.ledger(c)).await;
    count_call(Front::Http, &r);
    r
}

fn unexpected() -> Failure {
    CallError::new(
        crate::calls::ErrorKind::Internal,
        "the backend answered another ledger call",
    )
    .into()
}

/// A ledger's summary as JSON; 64-bit numbers as decimal strings. Without its key, which every
/// reply names once at its top: a key of 256 escaped bytes written twice would take a single
/// reply past [`super::MAX_REPLY_BYTES`].
pub fn ledger_json(l: &pb::LedgerInfo) -> Value {
    json!({
        "hold_ms": l.hold_ms.to_string(),
        "high": l.high.to_string(),
        "settled": l.settled.to_string(),
        "held": l.held.to_string(),
        "confirmed": l.confirmed.to_string(),
        "voided": l.voided.to_string(),
        "restored": l.restored,
        "set": l.set_id.to_string(),
    })
}

/// The wire name of a number's state.
pub fn state_name(s: pb::LedgerState) -> &'static str {
    match s {
        pb::LedgerState::Held => "held",
        pb::LedgerState::Confirmed => "confirmed",
        pb::LedgerState::Voided => "voided",
        pb::LedgerState::NotIssued => "not_issued",
        pb::LedgerState::Unspecified => "unspecified",
    }
}

/// The wire name of why a number was voided.
pub fn reason_name(r: pb::VoidReason) -> &'static str {
    match r {
        pb::VoidReason::Released => "released",
        pb::VoidReason::Expired => "expired",
        pb::VoidReason::Operator => "operator",
        pb::VoidReason::LostWithRestore => "lost_with_restore",
        pb::VoidReason::Unspecified => "unspecified",
    }
}

/// One number's record as JSON: only the fields its state has.
pub fn entry_json(e: &pb::LedgerEntry) -> Value {
    let mut v = json!({"number": e.number.to_string(), "state": state_name(e.state())});
    let time = |ms: u64| crate::calls::rfc3339(ms);
    match e.state() {
        pb::LedgerState::Held => {
            v["holder"] = json!(e.holder);
            v["deadline"] = json!(time(e.deadline_ms));
            v["time"] = json!(time(e.at_ms));
        }
        pb::LedgerState::Confirmed => {
            v["reference"] = json!(e.reference);
            if e.at_ms > 0 {
                v["time"] = json!(time(e.at_ms));
            }
        }
        pb::LedgerState::Voided => {
            v["through"] = json!(e.through.max(e.number).to_string());
            v["reason"] = json!(reason_name(e.reason()));
            v["by"] = json!(e.holder);
            v["note"] = json!(e.note);
            v["time"] = json!(time(e.at_ms));
        }
        pb::LedgerState::NotIssued | pb::LedgerState::Unspecified => {}
    }
    v
}

/// The reply of a write: the number it was about, its record and the ledger after it.
fn one_reply(key: &str, r: &pb::LedgerReply) -> Value {
    let mut v = json!({"key": key, "repeated": r.repeated});
    if let Some(l) = &r.ledger {
        v["ledger"] = ledger_json(l);
    }
    if let Some(e) = &r.entry {
        v["number"] = json!(e.number.to_string());
        v["entry"] = entry_json(e);
    }
    v
}

fn answer(r: Result<Value, Failure>) -> Response {
    match r {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `PUT /v1/ledger/{key}`.
pub(super) async fn create<C: Calls>(
    State(calls): State<Arc<C>>,
    Segment(key): Segment,
    headers: HeaderMap,
    body: Body,
) -> Response {
    answer(
        async {
            let k = key_of(&key)?;
            let input: CreateIn = body_of(body, "{\"hold_ms\": N} or empty").await?;
            match call(
                &*calls,
                &headers,
                LedgerCall::Create {
                    key: k,
                    hold_ms: input.hold_ms,
                },
            )
            .await?
            {
                LedgerAnswer::One(r) => Ok(one_reply(k, &r)),
                _ => Err(unexpected()),
            }
        }
        .await,
    )
}

/// `POST /v1/ledger/{key}/reserve`.
pub(super) async fn reserve<C: Calls>(
    State(calls): State<Arc<C>>,
    Segment(key): Segment,
    headers: HeaderMap,
    body: Body,
) -> Response {
    answer(
        async {
            let k = key_of(&key)?;
            let input: ReserveIn = body_of(
                body,
                "{\"holder\": \"…\", \"request_id\": \"…\"}, {\"reference\": \"…\"} or empty",
            )
            .await?;
            if !input.reference.is_empty() {
                return issue(&*calls, &headers, k, &input).await;
            }
            let id = input.request_id.unwrap_or_else(seqsvr_client::new_request_id);
            let c = LedgerCall::Reserve {
                key: k,
                holder: &input.holder,
                request_id: Some(&id),
            };
            match call(&*calls, &headers, c).await {
                Ok(LedgerAnswer::One(r)) => {
                    let mut v = one_reply(k, &r);
                    v["request_id"] = json!(id);
                    Ok(v)
                }
                Ok(_) => Err(unexpected()),
                // The caller needs the id to retry: it is in the message of an unknown outcome.
                Err(mut e) if e.may_have_taken() => {
                    e.message = format!(
                        "{}; retry with \"request_id\": \"{id}\" to get the number it took",
                        e.message
                    );
                    Err(e.into())
                }
                Err(e) => Err(e.into()),
            }
        }
        .await,
    )
}

/// A reserve with a reference: the number comes back confirmed.
async fn issue<C: Calls>(calls: &C, headers: &HeaderMap, key: &str, input: &ReserveIn) -> Result<Value, Failure> {
    if !input.holder.is_empty() || input.request_id.is_some() {
        // Nothing is held, and the reference is the retry's key: either field would mislead.
        return Err(CallError::bad_input(
            "a reserve with a \"reference\" is confirmed at once: leave out holder and request_id",
        )
        .into());
    }
    let c = LedgerCall::Issue {
        key,
        reference: &input.reference,
    };
    match call(calls, headers, c).await {
        Ok(LedgerAnswer::One(r)) => Ok(one_reply(key, &r)),
        Ok(_) => Err(unexpected()),
        Err(mut e) if e.may_have_taken() => {
            e.message = format!("{}; send the same reference again to get the number it took", e.message);
            Err(e.into())
        }
        Err(e) => Err(e.into()),
    }
}

/// The key and number of `/v1/ledger/{key}/{n}/…`.
fn key_and_number(
    path: Result<Path<(String, String)>, axum::extract::rejection::PathRejection>,
) -> Result<(String, u64), Failure> {
    let Path((key, n)) =
        path.map_err(|_| CallError::bad_input("the key and number in the path must be UTF-8 once percent-decoded"))?;
    key_of(&key)?;
    let n = parse_u64(&n, "number")?;
    Ok((key, n))
}

/// `POST /v1/ledger/{key}/{n}/confirm`.
pub(super) async fn confirm<C: Calls>(
    State(calls): State<Arc<C>>,
    path: Result<Path<(String, String)>, axum::extract::rejection::PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    answer(
        async {
            let (key, number) = key_and_number(path)?;
            let input: ConfirmIn = body_of(body, "{\"reference\": \"…\"}").await?;
            let c = LedgerCall::Confirm {
                key: &key,
                number,
                reference: &input.reference,
            };
            match call(&*calls, &headers, c).await? {
                LedgerAnswer::One(r) => Ok(one_reply(&key, &r)),
                _ => Err(unexpected()),
            }
        }
        .await,
    )
}

/// `POST /v1/ledger/{key}/{n}/release`.
pub(super) async fn release<C: Calls>(
    State(calls): State<Arc<C>>,
    path: Result<Path<(String, String)>, axum::extract::rejection::PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    answer(
        async {
            let (key, number) = key_and_number(path)?;
            let input: ReleaseIn = body_of(body, "{\"note\": \"…\"} or empty").await?;
            let c = LedgerCall::Release {
                key: &key,
                number,
                note: &input.note,
            };
            match call(&*calls, &headers, c).await? {
                LedgerAnswer::One(r) => Ok(one_reply(&key, &r)),
                _ => Err(unexpected()),
            }
        }
        .await,
    )
}

/// The query's parameters, only those named, each a decimal number.
fn numbers(query: QueryResult, names: &[&str]) -> Result<HashMap<String, u64>, CallError> {
    let Query(q) = query.map_err(|_| CallError::bad_input("the query must be name=value pairs, percent-encoded"))?;
    if let Some(other) = q.keys().find(|k| !names.contains(&k.as_str())) {
        return Err(CallError::bad_input(format!(
            "unknown query parameter {other:?}; only {}",
            names.join(" and ")
        )));
    }
    q.iter().map(|(k, v)| Ok((k.clone(), parse_u64(v, k)?))).collect()
}

/// A count of at most [`MOST_SHOWN`].
fn shown(n: u64, what: &str) -> Result<u32, CallError> {
    if n > u64::from(MOST_SHOWN) {
        return Err(CallError::bad_input(format!(
            "{what} must be 0 to {MOST_SHOWN}, got {n}"
        )));
    }
    Ok(n as u32)
}

/// `GET /v1/ledger/{key}` (the summary) or `GET /v1/ledger/{key}?from=N&count=M` (a range).
pub(super) async fn show<C: Calls>(
    State(calls): State<Arc<C>>,
    Extension(batches): Extension<Batches>,
    Segment(key): Segment,
    headers: HeaderMap,
    query: QueryResult,
) -> Response {
    let r = async {
        let k = key_of(&key)?;
        let q = numbers(query, &["from", "count"])?;
        let (from, count) = match (q.get("from"), q.get("count")) {
            (None, None) => (0, 0),
            (Some(&f), c) => (f, shown(c.copied().unwrap_or(u64::from(MOST_SHOWN)), "count")?),
            (None, Some(_)) => return Err(CallError::bad_input("count needs from (?from=N&count=M)").into()),
        };
        let d = deadline(&headers)?;
        let place = if count > 0 { Some(batches.admit(d).await?) } else { None };
        match call(&*calls, &headers, LedgerCall::Show { key: k, from, count }).await? {
            LedgerAnswer::Show(s) => {
                let mut v = json!({"key": k});
                if let Some(l) = &s.ledger {
                    v["ledger"] = ledger_json(l);
                }
                if count > 0 {
                    v["entries"] = Value::Array(s.entries.iter().map(entry_json).collect());
                }
                Ok((place, v))
            }
            _ => Err(unexpected()),
        }
    }
    .await;
    match r {
        Ok((Some(place), v)) => batches::reply(place, exact_json(&v)),
        Ok((None, v)) => axum::Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `GET /v1/ledger/{key}/{n}`: one number's record (`not_issued` above the highest).
pub(super) async fn number<C: Calls>(
    State(calls): State<Arc<C>>,
    path: Result<Path<(String, String)>, axum::extract::rejection::PathRejection>,
    headers: HeaderMap,
) -> Response {
    answer(
        async {
            let (key, n) = key_and_number(path)?;
            match call(
                &*calls,
                &headers,
                LedgerCall::Show {
                    key: &key,
                    from: n,
                    count: 1,
                },
            )
            .await?
            {
                LedgerAnswer::Show(s) => {
                    let not_issued = pb::LedgerEntry {
                        number: n,
                        state: pb::LedgerState::NotIssued as i32,
                        ..Default::default()
                    };
                    let e = s.entries.first().unwrap_or(&not_issued);
                    let mut v = json!({"key": key, "entry": entry_json(e)});
                    if let Some(l) = &s.ledger {
                        v["ledger"] = ledger_json(l);
                    }
                    Ok(v)
                }
                _ => Err(unexpected()),
            }
        }
        .await,
    )
}

/// `GET /v1/ledger/{key}/gaps?after=N&limit=M`: one page of voided runs.
pub(super) async fn gaps<C: Calls>(
    State(calls): State<Arc<C>>,
    Extension(batches): Extension<Batches>,
    Segment(key): Segment,
    headers: HeaderMap,
    query: QueryResult,
) -> Response {
    let r = async {
        let k = key_of(&key)?;
        let q = numbers(query, &["after", "limit"])?;
        let after = q.get("after").copied().unwrap_or(0);
        let limit = match q.get("limit") {
            None => MOST_SHOWN,
            Some(&0) => return Err(CallError::bad_input(format!("limit must be 1 to {MOST_SHOWN}, got 0")).into()),
            Some(&n) => shown(n, "limit")?,
        };
        let d = deadline(&headers)?;
        let place = batches.admit(d).await?;
        match call(&*calls, &headers, LedgerCall::Gaps { key: k, after, limit }).await? {
            LedgerAnswer::Gaps(g) => {
                let mut v = json!({
                    "key": k,
                    "voided": g.voided.iter().map(entry_json).collect::<Vec<_>>(),
                    "more": g.more,
                });
                if let Some(l) = &g.ledger {
                    v["ledger"] = ledger_json(l);
                }
                if g.more
                    && let Some(last) = g.voided.last()
                {
                    v["next_after"] = json!(last.through.max(last.number).to_string());
                }
                Ok((place, v))
            }
            _ => Err(unexpected()),
        }
    }
    .await;
    match r {
        Ok((place, v)) => batches::reply(place, exact_json(&v)),
        Err(e) => e.into_response(),
    }
}
