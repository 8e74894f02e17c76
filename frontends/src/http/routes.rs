//! The handlers of the routes (the table in the module above) and the shapes of their replies.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::errors::{Failure, Refusal, Segment, item_error};
use super::{BODY_TIMEOUT, MAX_BATCH_UIDS, MAX_BODY_BYTES, MAX_TIMEOUT_MS, TIMEOUT_HEADER};
use crate::calls::{CallError, Calls, Owner, Taken, Who, parse_u64, within};
use crate::{Front, count_call};
use seqsvr_proto::limits::MAX_IDS_PER_CALL;

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
    // Our words, not the library's: a caller cannot act on serde's.
    let Query(q) = query.map_err(|_| CallError::bad_input("the query must be name=value pairs, percent-encoded"))?;
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

fn answer<T: serde::Serialize>(r: Result<T, Failure>) -> Response {
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
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

pub(super) async fn seq_next<C: Calls>(
    State(calls): State<Arc<C>>,
    Segment(uid): Segment,
    headers: HeaderMap,
) -> Response {
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

pub(super) async fn seq_reserve<C: Calls>(
    State(calls): State<Arc<C>>,
    Segment(uid): Segment,
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

pub(super) async fn seq_current<C: Calls>(
    State(calls): State<Arc<C>>,
    Segment(uid): Segment,
    headers: HeaderMap,
) -> Response {
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

pub(super) async fn counter_next<C: Calls>(
    State(calls): State<Arc<C>>,
    Segment(key): Segment,
    headers: HeaderMap,
) -> Response {
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

pub(super) async fn counter_reserve<C: Calls>(
    State(calls): State<Arc<C>>,
    Segment(key): Segment,
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

pub(super) async fn counter_current<C: Calls>(
    State(calls): State<Arc<C>>,
    Segment(key): Segment,
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

pub(super) async fn ids<C: Calls>(
    State(calls): State<Arc<C>>,
    headers: HeaderMap,
    query: Result<Query<HashMap<String, String>>, axum::extract::rejection::QueryRejection>,
) -> Response {
    answer(
        async {
            let n = count(query, Some(1))?;
            // Checked here too, not only by the server: the reply is built from what `ids`
            // returns, and its size must not depend on the backend's check.
            if n > MAX_IDS_PER_CALL {
                return Err(CallError::bad_input(format!("count must be 1 to {MAX_IDS_PER_CALL}, got {n}")).into());
            }
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

/// Why a body could not be read, in our words (the library's go to the log): over the bound, or
/// broken framing (a bad chunk, a connection closed mid-body).
fn body_error(e: &axum::Error) -> Failure {
    let over = std::error::Error::source(e).is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
    tracing::debug!(error = %e, "HTTP body refused");
    if over {
        Refusal::TooLarge(format!("the body is over {MAX_BODY_BYTES} bytes")).into()
    } else {
        CallError::bad_input("the body could not be read: its length or chunked framing is broken").into()
    }
}

/// A uid in a batch body: a number, or a string of digits (for callers whose numbers round).
/// Read by hand rather than as an untagged enum, whose error names this type instead of saying
/// what a uid may be.
enum UidIn {
    Number(u64),
    Text(String),
}

impl<'de> serde::Deserialize<'de> for UidIn {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = UidIn;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a uid: a number from 0 to 2^64-1, or a string of its digits")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<UidIn, E> {
                Ok(UidIn::Number(v))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<UidIn, E> {
                Ok(UidIn::Text(v.to_owned()))
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchIn {
    uids: Vec<UidIn>,
}

pub(super) async fn batch<C: Calls>(State(calls): State<Arc<C>>, headers: HeaderMap, body: Body) -> Response {
    answer(
        async {
            let d = deadline(&headers)?;
            let bytes = match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, MAX_BODY_BYTES)).await {
                Ok(Ok(b)) => b,
                Ok(Err(e)) => return Err(body_error(&e)),
                Err(_) => {
                    return Err(Refusal::Timeout(format!("the body did not arrive within {BODY_TIMEOUT:?}")).into());
                }
            };
            let input: BatchIn = serde_json::from_slice(&bytes)
                .map_err(|e| CallError::bad_input(format!("the body must be {{\"uids\": [...]}}: {e}")))?;
            if input.uids.is_empty() || input.uids.len() > MAX_BATCH_UIDS {
                return Err(CallError::bad_input(format!(
                    "a batch needs 1 to {MAX_BATCH_UIDS} uids, got {}",
                    input.uids.len()
                ))
                .into());
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
