//! The handlers of the routes (the table in the module above) and the shapes of their replies.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{Value, json};

use super::batches::{self, Batches};
use super::errors::{Failure, ItemError, Refusal, Segment};
use super::{BODY_TIMEOUT, MAX_BATCH_UIDS, MAX_BODY_BYTES, MAX_IDS_UNBATCHED, MAX_TIMEOUT_MS, TIMEOUT_HEADER};
use crate::calls::{CallError, Calls, Owner, Taken, Who, decode_id, parse_u64, within};
use crate::{Front, count_call};
use seqsvr_proto::limits::MAX_IDS_PER_CALL;

/// The caller's deadline, if it gave one.
pub(super) fn deadline(headers: &HeaderMap) -> Result<Option<Duration>, CallError> {
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

pub(super) fn key_of(s: &str) -> Result<&str, CallError> {
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
    Extension(batches): Extension<Batches>,
    headers: HeaderMap,
    query: Result<Query<HashMap<String, String>>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let r = async {
        let n = count(query, Some(1))?;
        // Checked here too, not only by the server: the reply is built from what `ids`
        // returns, and its size must not depend on the backend's check.
        if n > MAX_IDS_PER_CALL {
            return Err(CallError::bad_input(format!("count must be 1 to {MAX_IDS_PER_CALL}, got {n}")).into());
        }
        let d = deadline(&headers)?;
        // Many ids make a reply of up to 94 KB: a batch, with a place of its own.
        let place = if n > MAX_IDS_UNBATCHED {
            Some(batches.admit(d).await?)
        } else {
            None
        };
        // A lost id is never seen by anyone: an unanswered call took nothing that matters.
        let r = within(d, false, calls.ids(n)).await;
        count_call(Front::Http, &r);
        let reply = IdsReply {
            ids: r?.into_iter().map(Decimal).collect(),
        };
        Ok((place, reply))
    }
    .await;
    match r {
        Ok((Some(place), reply)) => batches::reply(place, exact_json(&reply)),
        Ok((None, reply)) => Json(reply).into_response(),
        Err(e) => Failure::into_response(e),
    }
}

/// `GET /v1/ids/{id}`: the id taken apart under the cluster's layout, decoded by this node
/// without a call to anyone (`decode_id`).
pub(super) async fn id_decode<C: Calls>(State(calls): State<Arc<C>>, Segment(id): Segment) -> Response {
    answer((|| {
        let id = parse_u64(&id, "id")?;
        let d = decode_id(id, calls.id_decoding())?;
        Ok(json!({
            "id": d.id.to_string(),
            "time": d.time,
            "unix_ms": d.unix_ms.to_string(),
            "tick": d.tick.to_string(),
            "slot": d.slot.to_string(),
            "sequence": d.sequence.to_string(),
            "set": d.set_id.map(|s| s.to_string()),
        }))
    })())
}

/// `{"ids": [...]}`.
#[derive(serde::Serialize)]
struct IdsReply {
    ids: Vec<Decimal>,
}

/// `v` as JSON in a buffer of exactly its size: a batch's reply is held until it is written, and
/// a buffer grown by doubling could hold up to twice the bytes (three times while it moves).
pub(super) fn exact_json<T: serde::Serialize>(v: &T) -> Vec<u8> {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut n = Count(0);
    // Serializing these types cannot fail (string keys, no maps of other keys).
    let _ = serde_json::to_writer(&mut n, v);
    let mut out = Vec::with_capacity(n.0);
    let _ = serde_json::to_writer(&mut out, v);
    out
}

/// Why a body could not be read, in our words (the library's go to the log): over the bound, or
/// broken framing (a bad chunk, a connection closed mid-body).
pub(super) fn body_error(e: &axum::Error) -> Failure {
    let over = std::error::Error::source(e).is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
    tracing::debug!(error = %e, "HTTP body refused");
    if over {
        Refusal::TooLarge(format!("the body is over {MAX_BODY_BYTES} bytes")).into()
    } else {
        CallError::bad_input("the body could not be read: its length or chunked framing is broken").into()
    }
}

/// A uid in a batch body: a number, or a string of digits (for callers whose numbers round),
/// parsed where it lies. Read by hand rather than as an untagged enum, whose error names a type
/// instead of saying what a uid may be, and which would copy every string.
struct UidIn(u64);

impl<'de> serde::Deserialize<'de> for UidIn {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = UidIn;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a uid: a number from 0 to 2^64-1, or a string of its digits")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<UidIn, E> {
                Ok(UidIn(v))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<UidIn, E> {
                uid_of(v).map(UidIn).map_err(|e| E::custom(e.message))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// The uids of a batch body: at most [`MAX_BATCH_UIDS`] kept, the rest only counted, so that a
/// body of small numbers (`[0,0,...]`, 2 bytes a uid) cannot make a list of tens of thousands.
struct Uids {
    kept: Vec<u64>,
    total: usize,
}

impl<'de> serde::Deserialize<'de> for Uids {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Uids;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of uids")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Uids, A::Error> {
                let mut kept = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(MAX_BATCH_UIDS));
                while kept.len() < MAX_BATCH_UIDS {
                    match seq.next_element::<UidIn>()? {
                        Some(UidIn(u)) => kept.push(u),
                        None => break,
                    }
                }
                let mut total = kept.len();
                if total == MAX_BATCH_UIDS {
                    while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
                        total += 1;
                    }
                }
                Ok(Uids { kept, total })
            }
        }
        d.deserialize_seq(Visitor)
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchIn {
    uids: Uids,
}

/// One item of a batch's reply, keys in the order a map writes them (as every reply here).
#[derive(serde::Serialize)]
#[serde(untagged)]
enum BatchItem<'a> {
    Taken {
        #[serde(skip_serializing_if = "Option::is_none")]
        owner: Option<OwnerJson>,
        seq: Decimal,
        uid: Decimal,
    },
    Failed {
        error: ItemError<'a>,
        uid: Decimal,
    },
}

/// `{"results": [...]}`, written from the uids and their results without a copy.
struct BatchReply<'a> {
    uids: &'a [u64],
    results: &'a [Result<Taken, CallError>],
}

impl serde::Serialize for BatchReply<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        struct Items<'a>(&'a BatchReply<'a>);
        impl serde::Serialize for Items<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_seq(self.0.uids.iter().zip(self.0.results).map(|(&uid, r)| match r {
                    Ok(t) => BatchItem::Taken {
                        owner: t.owner.map(OwnerJson::from),
                        seq: Decimal(t.value),
                        uid: Decimal(uid),
                    },
                    Err(e) => BatchItem::Failed {
                        error: ItemError::from(e),
                        uid: Decimal(uid),
                    },
                }))
            }
        }
        let mut st = s.serialize_struct("BatchReply", 1)?;
        st.serialize_field("results", &Items(self))?;
        st.end()
    }
}

pub(super) async fn batch<C: Calls>(
    State(calls): State<Arc<C>>,
    Extension(batches): Extension<Batches>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let d = match deadline(&headers) {
        Ok(d) => d,
        Err(e) => return Failure::from(e).into_response(),
    };
    // The place is taken before the body is read: the body is what a flood of batches is made of.
    let place = match batches.admit(d).await {
        Ok(p) => p,
        Err(e) => {
            batches::drain(body).await;
            return e.into_response();
        }
    };
    let r = async {
        let uids = {
            let bytes = match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, MAX_BODY_BYTES)).await {
                Ok(Ok(b)) => b,
                Ok(Err(e)) => return Err(body_error(&e)),
                Err(_) => {
                    return Err(Refusal::Timeout(format!("the body did not arrive within {BODY_TIMEOUT:?}")).into());
                }
            };
            let input: BatchIn = serde_json::from_slice(&bytes)
                .map_err(|e| CallError::bad_input(format!("the body must be {{\"uids\": [...]}}: {e}")))?;
            // The body's bytes are dropped here, before the call.
            input.uids
        };
        if uids.total == 0 || uids.total > MAX_BATCH_UIDS {
            return Err(
                CallError::bad_input(format!("a batch needs 1 to {MAX_BATCH_UIDS} uids, got {}", uids.total)).into(),
            );
        }
        let results = within(d, true, calls.batch(&uids.kept)).await;
        count_call(Front::Http, &results);
        let results = results?;
        Ok(exact_json(&BatchReply {
            uids: &uids.kept,
            results: &results,
        }))
    }
    .await;
    match r {
        Ok(json) => batches::reply(place, json),
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calls::ErrorKind;
    use crate::http::{MAX_BATCH_REPLY_BYTES, MAX_REPLY_BYTES};
    use seqsvr_proto::{Epoch, Incarnation, NodeId, SectionId};

    fn widest_owner() -> Owner {
        Owner {
            section: SectionId(u64::MAX),
            node_id: NodeId(u64::MAX),
            incarnation: Incarnation(u64::MAX),
            epoch: Epoch(u64::MAX),
            set_id: u64::MAX,
        }
    }

    /// The largest batch's reply, of the widest items (every number 20 digits and an owner, or
    /// an error of the longest code whose message escapes every byte), fits
    /// [`MAX_BATCH_REPLY_BYTES`], which is no more than a tenth above it.
    #[test]
    fn a_batch_reply_fits_its_bound() {
        let uids = vec![u64::MAX; MAX_BATCH_UIDS];
        let taken: Vec<_> = (0..MAX_BATCH_UIDS)
            .map(|_| {
                Ok(Taken {
                    value: u64::MAX,
                    owner: Some(widest_owner()),
                })
            })
            .collect();
        let failed: Vec<_> = (0..MAX_BATCH_UIDS)
            .map(|_| Err(CallError::new(ErrorKind::Unknown, "\"".repeat(10_000))))
            .collect();
        let mut largest = 0;
        for results in [taken, failed] {
            let json = exact_json(&BatchReply {
                uids: &uids,
                results: &results,
            });
            assert_eq!(json.capacity(), json.len());
            let v: Value = serde_json::from_slice(&json).unwrap();
            assert_eq!(v["results"].as_array().map(Vec::len), Some(MAX_BATCH_UIDS));
            largest = largest.max(json.len());
        }
        assert!(largest <= MAX_BATCH_REPLY_BYTES, "{largest}");
        assert!(
            largest * 11 / 10 >= MAX_BATCH_REPLY_BYTES,
            "{largest}: the bound is loose"
        );
    }

    /// The widest reply of every request that is not a batch fits [`MAX_REPLY_BYTES`]: a key of
    /// 256 bytes that all escape, an owner of 20-digit numbers, the most ids of a single call, an
    /// error whose message quotes a head's worth of input.
    #[tokio::test]
    async fn every_other_reply_fits_its_bound() {
        let key = "\u{1}".repeat(256);
        let replies = [
            serde_json::to_vec(&CounterNext {
                key: &key,
                owner: Some(widest_owner().into()),
                value: Decimal(u64::MAX),
            })
            .unwrap(),
            serde_json::to_vec(&with_owner(
                json!({"key": key, "first": u64::MAX.to_string(), "last": u64::MAX.to_string(), "count": u32::MAX}),
                Some(widest_owner()),
            ))
            .unwrap(),
            serde_json::to_vec(&IdsReply {
                ids: (0..MAX_IDS_UNBATCHED).map(|_| Decimal(u64::MAX)).collect(),
            })
            .unwrap(),
        ];
        for r in replies {
            assert!(
                r.len() <= MAX_REPLY_BYTES,
                "{} bytes: {}",
                r.len(),
                String::from_utf8_lossy(&r)
            );
        }
        let quoted = CallError::bad_input(format!(
            "uid must be a decimal number, got {:?}",
            "\u{1}\"".repeat(8000)
        ));
        let r = Failure::from(quoted).into_response();
        let len = axum::body::to_bytes(r.into_body(), usize::MAX).await.unwrap().len();
        assert!(len <= MAX_REPLY_BYTES, "an error reply of {len} bytes");
    }

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
