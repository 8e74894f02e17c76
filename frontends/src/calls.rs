//! What a front end asks of the cluster ([`Calls`]), the one error every front end maps to its
//! protocol ([`CallError`]), and [`ClientCalls`], which answers them with the client library —
//! routing, map following, retries and the unknown-outcome rule included — so that a call that
//! lands on an AllocSvr that does not own its uid or key is forwarded to the owner, in the same
//! set or another, exactly as a Rust caller's call would be sent there.
//!
//! Deliberately left out: any number not taken from an owner's reply. A front end never answers
//! from a cache, and never turns an unknown outcome into "did not happen".

use seqsvr_proto::id_layout::IdLayout;
use std::future::Future;
use std::time::Duration;

use seqsvr_client::{Client, ClientError, FailureKind, Subject};
use seqsvr_proto::Uid;

/// Whose number a call asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Who<'a> {
    /// A uid's sequence.
    Uid(u64),
    /// A named counter.
    Key(&'a str),
}

/// Why a call gave no value; each front end maps the kind to its protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The input is wrong: fix it, do not retry.
    BadInput,
    /// No owner could answer in time (not ready, unreachable, moving): retry after a pause.
    Unavailable,
    /// The owner is overloaded: retry after a pause, with fewer calls at once.
    Overloaded,
    /// The uid's or key's section has used up the 64-bit space: nothing will ever serve it again.
    Exhausted,
    /// The call may have taken a number and no value came back: the value is lost, not "not taken".
    Unknown,
    /// The front end's own configuration is wrong.
    Internal,
    /// Ledgers: no such ledger, or a number never handed out.
    NotFound,
    /// Ledgers: the record says otherwise (confirmed with another reference, created with
    /// another hold): do not retry.
    Conflict,
    /// Ledgers: the number's state does not allow the call (voided, confirmed), or the ledger
    /// waits for an operator's reconcile: take a new number, or ask an operator.
    Refused,
    /// The caller may not make this call.
    Forbidden,
}

/// A failed call: what kind, and the reason in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallError {
    pub kind: ErrorKind,
    pub message: String,
}

impl CallError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    pub fn bad_input(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::BadInput, message)
    }

    /// True when a number may have been taken by the call.
    pub fn may_have_taken(&self) -> bool {
        self.kind == ErrorKind::Unknown
    }

    /// The answer for a call still running at the caller's deadline: a call that can take a
    /// number may have taken one.
    pub fn deadline(after: Duration, takes: bool) -> Self {
        let kind = if takes {
            ErrorKind::Unknown
        } else {
            ErrorKind::Unavailable
        };
        Self::new(kind, format!("no answer within the caller's deadline of {after:?}"))
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<ClientError> for CallError {
    /// The caller sees what it can act on — the kind, and for bad input the server's reason —
    /// never the addresses of the cluster's nodes or the RPC library's wording: those go to the
    /// log (at debug: these failures are expected during moves and failovers, and counted in
    /// `allocsvr_front_calls_total`).
    fn from(e: ClientError) -> Self {
        let kind = match e.failure_kind() {
            None => ErrorKind::Unknown,
            Some(FailureKind::InvalidArgument) => ErrorKind::BadInput,
            Some(FailureKind::Unavailable) => ErrorKind::Unavailable,
            Some(FailureKind::Overloaded) => ErrorKind::Overloaded,
            Some(FailureKind::Exhausted) => ErrorKind::Exhausted,
            Some(FailureKind::BadConfig) => ErrorKind::Internal,
            Some(FailureKind::NotFound) => ErrorKind::NotFound,
            Some(FailureKind::Conflict) => ErrorKind::Conflict,
            Some(FailureKind::Refused) => ErrorKind::Refused,
            Some(FailureKind::Forbidden) => ErrorKind::Forbidden,
        };
        let detail = match &e {
            ClientError::Failed { detail, .. } | ClientError::Unknown { detail } => detail.as_str(),
        };
        tracing::debug!(?kind, %detail, "a front end's call failed");
        let message = match kind {
            ErrorKind::BadInput => format!("invalid request: {}", server_reason(detail)),
            ErrorKind::Unavailable => {
                "no owner could answer in time (starting, moving, failing over or unreachable); retry after a pause"
                    .into()
            }
            ErrorKind::Overloaded => "the owner is overloaded; retry after a pause, with fewer calls at once".into(),
            ErrorKind::Exhausted => "the 64-bit space of this uid's or key's section is used up".into(),
            ErrorKind::Unknown => {
                "outcome unknown: a number may have been taken, and its value is lost (never reused)".into()
            }
            ErrorKind::Internal => "internal error; the AllocSvr's log says more".into(),
            // A ledger's refusal names the number and its state: what the caller acts on.
            ErrorKind::NotFound | ErrorKind::Conflict | ErrorKind::Refused | ErrorKind::Forbidden => {
                server_reason(detail).to_owned()
            }
        };
        Self { kind, message }
    }
}

/// The server's own reason in a client error's detail, without the address of the node that
/// said it or the RPC status's name before it (`127.0.0.1:7201: Client specified an invalid
/// argument: count 0 ...` is `count 0 ...`).
fn server_reason(detail: &str) -> &str {
    let mut rest = detail;
    if let Some((head, tail)) = rest.split_once(": ")
        && (head.parse::<std::net::SocketAddr>().is_ok() || head.starts_with("http"))
    {
        rest = tail;
    }
    for status in ["Client specified an invalid argument: ", "Out of range: "] {
        rest = rest.strip_prefix(status).unwrap_or(rest);
    }
    rest
}

/// Who served a value: the section, AllocSvr, incarnation, epoch and set (the client library's).
pub use seqsvr_client::Owner;

/// A value and, when the server said, who served it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Taken {
    pub value: u64,
    pub owner: Option<Owner>,
}

impl Taken {
    /// A value whose server is not known.
    pub fn anonymous(value: u64) -> Self {
        Self { value, owner: None }
    }
}

/// Where a Redis Cluster hash slot is served, as a cluster-mode connection acts on it
/// (`resp::cluster`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotHome {
    /// This node owns the slot's section: serve the call.
    Here,
    /// Another node owns it and listens for cluster-mode clients at this `host:port`: answer
    /// `-MOVED`.
    Elsewhere(String),
    /// Not placed by slot, or the owner or its cluster port is not known (yet): serve the call
    /// the way a plain connection is served, forwarded to the owner.
    Forward,
}

/// One node of the Redis Cluster view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    /// 40 hex digits, stable for the node's address (Redis's node id).
    pub id: String,
    /// The node's cluster-mode Redis port, `host:port`.
    pub addr: String,
}

/// The cluster as Redis Cluster clients see it: every hash slot's node, in runs of slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterView {
    /// The node answering.
    pub me: ClusterNode,
    /// `(first slot, last slot, node)`, covering 0..=16383 in order.
    pub ranges: Vec<(u16, u16, ClusterNode)>,
    /// The cluster map's version (the config epoch clients are shown).
    pub epoch: u64,
}

/// The calls behind every front end. `take` of `count` > 1 is a block: its first value is
/// returned and the block is `first..first + count`.
pub trait Calls: Send + Sync + 'static {
    /// Takes `count` numbers of `who`; the first of them.
    fn take(&self, who: Who<'_>, count: u32) -> impl Future<Output = Result<Taken, CallError>> + Send;
    /// The last number handed out for `who` (or a ceiling above it after an ownership change).
    fn current(&self, who: Who<'_>) -> impl Future<Output = Result<Taken, CallError>> + Send;
    /// [`Calls::current`] of each of `whos`, one result per name in request order; the outer
    /// error is for the whole call (nothing was read). A backend that can read many names at once
    /// overrides the default, which reads them one by one, concurrently.
    #[allow(clippy::type_complexity)]
    fn current_many(
        &self,
        whos: &[Who<'_>],
    ) -> impl Future<Output = Result<Vec<Result<Taken, CallError>>, CallError>> + Send {
        async move { Ok(futures::future::join_all(whos.iter().map(|&w| self.current(w))).await) }
    }
    /// The next seq of each uid, one result per uid in request order; the outer error is for
    /// the whole call (nothing was sent).
    #[allow(clippy::type_complexity)]
    fn batch(&self, uids: &[u64]) -> impl Future<Output = Result<Vec<Result<Taken, CallError>>, CallError>> + Send;
    /// `count` time-ordered ids, increasing.
    fn ids(&self, count: u32) -> impl Future<Output = Result<Vec<u64>, CallError>> + Send;
    /// Where hash slot `slot` is served. By default nowhere in particular: every call is served
    /// as on a plain connection.
    fn slot_home(&self, _slot: u16) -> SlotHome {
        SlotHome::Forward
    }
    /// The Redis Cluster view, or why this backend serves none.
    fn cluster_view(&self) -> Result<ClusterView, CallError> {
        Err(CallError::bad_input(
            "this server does not serve the Redis Cluster protocol",
        ))
    }
    /// A ledger call ([`LedgerCall`]): numbers with no gaps, decided by the set that keeps the
    /// ledger. By default none are served.
    fn ledger(&self, _call: LedgerCall<'_>) -> impl Future<Output = Result<LedgerAnswer, CallError>> + Send {
        async { Err(CallError::bad_input("this server does not serve ledger counters")) }
    }
    /// The layout this server's ids are issued under and the slots each set leases (0 when not
    /// known), to decode ids with [`decode_id`]; `None` while it has none (the default).
    fn id_decoding(&self) -> Option<(IdLayout, u64)> {
        None
    }
}

/// A ledger call a front end makes (the operator's Void and Reconcile are `seqctl`'s, not a
/// front end's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LedgerCall<'a> {
    /// Declares the ledger; `hold_ms` 0 is the store's default.
    Create {
        key: &'a str,
        hold_ms: u64,
    },
    /// The next number, held by `holder`; a retry with the same `request_id` gets the same
    /// number (`None`: the backend draws one for the call and keeps it across its retries).
    Reserve {
        key: &'a str,
        holder: &'a str,
        request_id: Option<&'a str>,
    },
    Confirm {
        key: &'a str,
        number: u64,
        reference: &'a str,
    },
    /// The next number, confirmed with `reference` in the same write; a retry with the same
    /// reference gets the same number.
    Issue {
        key: &'a str,
        reference: &'a str,
    },
    Release {
        key: &'a str,
        number: u64,
        note: &'a str,
    },
    /// The summary and numbers `from..from + count` (count 0: the summary only).
    Show {
        key: &'a str,
        from: u64,
        count: u32,
    },
    /// One page of voided runs above `after`.
    Gaps {
        key: &'a str,
        after: u64,
        limit: u32,
    },
}

impl LedgerCall<'_> {
    /// Whether an unanswered call may have changed the ledger (a reserve may have taken a
    /// number): decides what a deadline means.
    pub fn writes(&self) -> bool {
        !matches!(self, LedgerCall::Show { .. } | LedgerCall::Gaps { .. })
    }
}

/// The answer to a [`LedgerCall`]: the store's reply as it came.
#[derive(Debug, Clone, PartialEq)]
pub enum LedgerAnswer {
    /// Create, Reserve, Confirm, Release.
    One(seqsvr_proto::pb::LedgerReply),
    Show(seqsvr_proto::pb::LedgerShowReply),
    Gaps(seqsvr_proto::pb::LedgerGapsReply),
}

/// An id taken apart: what `GET /v1/ids/{id}`, RESP `IDDECODE` and `seqctl id decode` show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedId {
    pub id: u64,
    /// When its tick began, Unix milliseconds, and the same as RFC 3339 UTC.
    pub unix_ms: u64,
    pub time: String,
    pub tick: u64,
    pub slot: u64,
    pub sequence: u64,
    /// The set that leases the slot; `None` when the slots per set are not known here.
    pub set_id: Option<u64>,
}

/// `id` under `decoding` ([`Calls::id_decoding`]): refused when the server has no layout, or
/// when the top bit is set (no layout issues such an id). Pure arithmetic: an id that was never
/// issued decodes too, as it would with `seqctl id decode`.
pub fn decode_id(id: u64, decoding: Option<(IdLayout, u64)>) -> Result<DecodedId, CallError> {
    let (layout, per_set) = decoding.ok_or_else(|| {
        CallError::new(
            ErrorKind::Unavailable,
            "this server has no time-ordered ids set up yet (no layout to decode with)",
        )
    })?;
    let parts = layout
        .decompose(id)
        .ok_or_else(|| CallError::bad_input(format!("{id} has its top bit set: no layout issues such an id")))?;
    let unix_ms = layout.ms_of(parts.tick);
    Ok(DecodedId {
        id,
        unix_ms,
        time: rfc3339(unix_ms),
        tick: parts.tick,
        slot: parts.slot,
        sequence: parts.seq,
        set_id: (per_set > 0).then(|| parts.slot / per_set),
    })
}

/// `at_ms` as RFC 3339 UTC with milliseconds; the raw number when it is out of range.
pub fn rfc3339(at_ms: u64) -> String {
    use time::OffsetDateTime;
    use time::format_description::well_known::Rfc3339;
    i128::from(at_ms)
        .checked_mul(1_000_000)
        .and_then(|ns| OffsetDateTime::from_unix_timestamp_nanos(ns).ok())
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| format!("{at_ms} ms after 1970"))
}

/// [`Calls`] through the client library.
#[derive(Debug, Clone)]
pub struct ClientCalls {
    client: Client,
}

impl ClientCalls {
    pub fn new(client: Client) -> Self {
        Self { client }
    }

    /// The client the calls go through.
    pub fn client(&self) -> &Client {
        &self.client
    }
}

impl Calls for ClientCalls {
    async fn take(&self, who: Who<'_>, count: u32) -> Result<Taken, CallError> {
        let c = &self.client;
        let (value, owner) = match (who, count) {
            (Who::Uid(uid), 1) => c.fetch_next_seq(Uid(uid)).await.map(|f| (f.seq, f.owner))?,
            (Who::Uid(uid), n) => c.reserve(Uid(uid), n).await.map(|b| (b.first, b.owner))?,
            (Who::Key(key), 1) => c.counter_next(key).await.map(|v| (v.value, v.owner))?,
            (Who::Key(key), n) => c.counter_reserve(key, n).await.map(|b| (b.first, b.owner))?,
        };
        Ok(Taken { value, owner })
    }

    async fn current(&self, who: Who<'_>) -> Result<Taken, CallError> {
        let (value, owner) = match who {
            Who::Uid(uid) => self.client.get_cur_seq(Uid(uid)).await.map(|c| (c.cur_seq, c.owner))?,
            Who::Key(key) => self.client.counter_get(key).await.map(|c| (c.value, c.owner))?,
        };
        Ok(Taken { value, owner })
    }

    /// One `BatchGet` per owner (the client library's [`Client::batch_get`]), not a read per name.
    async fn current_many(&self, whos: &[Who<'_>]) -> Result<Vec<Result<Taken, CallError>>, CallError> {
        let subjects: Vec<Subject<'_>> = whos
            .iter()
            .map(|w| match *w {
                Who::Uid(uid) => Subject::Uid(Uid(uid)),
                Who::Key(key) => Subject::Key(key),
            })
            .collect();
        let results = self.client.batch_get(&subjects).await?;
        Ok(results
            .into_iter()
            .map(|r| {
                r.map(|c| Taken {
                    value: c.value,
                    owner: c.owner,
                })
                .map_err(CallError::from)
            })
            .collect())
    }

    async fn batch(&self, uids: &[u64]) -> Result<Vec<Result<Taken, CallError>>, CallError> {
        let uids: Vec<Uid> = uids.iter().map(|&u| Uid(u)).collect();
        let results = self.client.batch_fetch_each(&uids).await?;
        Ok(results
            .into_iter()
            .map(|r| {
                r.map(|f| Taken {
                    value: f.seq,
                    owner: f.owner,
                })
                .map_err(CallError::from)
            })
            .collect())
    }

    async fn ids(&self, count: u32) -> Result<Vec<u64>, CallError> {
        Ok(self.client.next_ids(count).await?.ids)
    }

    async fn ledger(&self, call: LedgerCall<'_>) -> Result<LedgerAnswer, CallError> {
        let c = &self.client;
        Ok(match call {
            LedgerCall::Create { key, hold_ms } => {
                let info = c.ledger_create(key, Duration::from_millis(hold_ms)).await?;
                LedgerAnswer::One(seqsvr_proto::pb::LedgerReply {
                    ledger: Some(info),
                    ..Default::default()
                })
            }
            LedgerCall::Reserve {
                key,
                holder,
                request_id,
            } => {
                let id = request_id.map_or_else(seqsvr_client::new_request_id, str::to_owned);
                LedgerAnswer::One(c.ledger_reserve_with_id(key, holder, &id).await?)
            }
            LedgerCall::Confirm { key, number, reference } => {
                LedgerAnswer::One(c.ledger_confirm(key, number, reference).await?)
            }
            LedgerCall::Issue { key, reference } => LedgerAnswer::One(c.ledger_issue(key, reference).await?),
            LedgerCall::Release { key, number, note } => LedgerAnswer::One(c.ledger_release(key, number, note).await?),
            LedgerCall::Show { key, from, count } => LedgerAnswer::Show(c.ledger_show(key, from, count).await?),
            LedgerCall::Gaps { key, after, limit } => LedgerAnswer::Gaps(c.ledger_gaps_page(key, after, limit).await?),
        })
    }
}

/// Runs `call` until `deadline` at most: past it, the call is dropped and answered as
/// [`CallError::deadline`] (`takes`: whether it could have taken a number).
pub async fn within<T>(
    deadline: Option<Duration>,
    takes: bool,
    call: impl Future<Output = Result<T, CallError>>,
) -> Result<T, CallError> {
    match deadline {
        None => call.await,
        Some(d) => match tokio::time::timeout(d, call).await {
            Ok(r) => r,
            Err(_) => Err(CallError::deadline(d, takes)),
        },
    }
}

/// The parts of a counter's name that a front end reads as a uid: `u:<decimal>` is uid, any other
/// name a named counter (one mapping for every front end that takes names).
pub fn who_of_name(name: &str) -> Result<Who<'_>, CallError> {
    match name.strip_prefix(UID_PREFIX) {
        Some(digits) => parse_u64(digits, "uid").map(Who::Uid),
        None => Ok(Who::Key(name)),
    }
}

/// The prefix that makes a name a uid (`u:42`).
pub const UID_PREFIX: &str = "u:";

/// A decimal `u64`, or a bad-input error naming `what`.
pub fn parse_u64(s: &str, what: &str) -> Result<u64, CallError> {
    // `u64::from_str` takes a leading '+', which no one means.
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(CallError::bad_input(format!(
            "{what} must be a decimal number, got {s:?}"
        )));
    }
    s.parse()
        .map_err(|_| CallError::bad_input(format!("{what} {s} does not fit in 64 bits")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_decodes_to_its_time_slot_sequence_and_set() {
        use seqsvr_proto::id_layout::{DEFAULT_EPOCH_MS, IdParts};
        let layout = IdLayout::javascript(DEFAULT_EPOCH_MS);
        // 2026-12-02T00:00:00Z, slot 70 of a cluster with 64 slots a set: set 1.
        let at = 1_796_169_600_000;
        let tick = (at - DEFAULT_EPOCH_MS) / 10;
        let id = layout.compose(IdParts { tick, slot: 70, seq: 5 }).unwrap();
        let d = decode_id(id, Some((layout, 64))).unwrap();
        assert_eq!(
            (d.time.as_str(), d.slot, d.sequence, d.set_id),
            ("2026-12-02T00:00:00Z", 70, 5, Some(1))
        );
        assert_eq!(d.unix_ms, at);
        assert_eq!(
            decode_id(id, Some((layout, 0))).unwrap().set_id,
            None,
            "slots per set unknown"
        );
        let top = decode_id(1 << 63, Some((layout, 64))).unwrap_err();
        assert_eq!(top.kind, ErrorKind::BadInput);
        assert!(top.message.contains("top bit"), "{}", top.message);
        assert_eq!(decode_id(id, None).unwrap_err().kind, ErrorKind::Unavailable);
    }

    #[test]
    fn names_starting_u_colon_are_uids_and_everything_else_is_a_counter() {
        assert_eq!(who_of_name("u:42"), Ok(Who::Uid(42)));
        assert_eq!(who_of_name("orders"), Ok(Who::Key("orders")));
        assert_eq!(who_of_name("U:42"), Ok(Who::Key("U:42")));
        assert_eq!(who_of_name("user:42"), Ok(Who::Key("user:42")));
        for bad in ["u:", "u:-1", "u:+1", "u:4x", "u:18446744073709551616", "u: 1"] {
            let e = who_of_name(bad).unwrap_err();
            assert_eq!(e.kind, ErrorKind::BadInput, "{bad}");
        }
        assert_eq!(who_of_name("u:18446744073709551615"), Ok(Who::Uid(u64::MAX)));
    }

    #[test]
    fn no_address_or_rpc_wording_reaches_a_caller() {
        let cases = [
            (FailureKind::Unavailable, "127.0.0.1:7201: not the owner of uid 702263"),
            (FailureKind::Overloaded, "127.0.0.1:7201: Too many requests: busy"),
            (
                FailureKind::Exhausted,
                "10.0.0.7:7201: Resource has been exhausted: section 3",
            ),
            (FailureKind::BadConfig, "no seed address http://10.0.0.1:7201 answered"),
            (
                FailureKind::InvalidArgument,
                "127.0.0.1:7201: Client specified an invalid argument: count 0 is below 1",
            ),
        ];
        for (kind, detail) in cases {
            let e = CallError::from(ClientError::failed(kind, detail));
            assert!(
                !e.message.contains("10.0.0") && !e.message.contains("127.0.0.1"),
                "{}",
                e.message
            );
            assert!(
                !e.message.contains("Client specified") && !e.message.contains("Resource has"),
                "{}",
                e.message
            );
        }
        let bad = CallError::from(ClientError::failed(FailureKind::InvalidArgument, cases[4].1));
        assert_eq!(bad.message, "invalid request: count 0 is below 1");
        let unknown = CallError::from(ClientError::unknown("[::1]:7201: attempt timed out after 1s"));
        assert!(!unknown.message.contains("::1"), "{}", unknown.message);
    }

    #[test]
    fn an_unknown_outcome_says_a_number_may_have_been_taken() {
        let e = CallError::from(ClientError::unknown("attempt timed out"));
        assert!(e.may_have_taken());
        assert!(e.message.contains("may have been taken"), "{}", e.message);
        let e = CallError::from(ClientError::failed(FailureKind::Overloaded, "busy"));
        assert_eq!((e.kind, e.may_have_taken()), (ErrorKind::Overloaded, false));
        assert!(CallError::deadline(Duration::from_millis(5), true).may_have_taken());
        assert!(!CallError::deadline(Duration::from_millis(5), false).may_have_taken());
    }
}
