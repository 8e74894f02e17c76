//! Ledger counters: numbers handed out one after another with none skipped, each held, confirmed
//! or voided (docs/decisions/0004-ledger-counters.md). Any AllocSvr answers for any key: it
//! forwards the call to the StoreSvr leader of the set that keeps the ledger. So a call goes to
//! one of the client's seeds and, when that one cannot answer (unreachable, overloaded, the set
//! without a leader), to another known AllocSvr, under the call's deadline.
//!
//! Retrying is safe by construction: a reserve carries a request id drawn once per logical call
//! and sent again with every attempt, so a lost reply is answered, on the retry, with the number
//! the first attempt took; a confirm is repeated with the same reference and answers the same; a
//! release or void repeated answers the same (`repeated`).
//!
//! A store's refusal keeps its meaning ([`FailureKind::NotFound`], [`FailureKind::Conflict`],
//! [`FailureKind::Refused`], [`FailureKind::Forbidden`], [`FailureKind::InvalidArgument`]) and its
//! message. A call that ran out of time after an attempt that may have been applied is
//! [`ClientError::Unknown`].
//!
//! Left out: a cache of ledger state (every read is the set's linearizable read), and routing by
//! the key (the AllocSvr places it).

use std::time::Duration;

use rand::Rng;
use seqsvr_proto::pb;
use seqsvr_proto::pb::ledger_service_client::LedgerServiceClient;
use seqsvr_rpc::classify::{Delivery, classify};
use tokio::time::Instant;
use tonic::{Code, Status};

use crate::client::Client;
use crate::error::{ClientError, FailureKind};
use crate::retry::Budget;
use crate::transport::Conn;

/// Voided runs asked for per Gaps page (the store's default page).
const GAPS_PAGE: u32 = 1_000;
/// Most pages [`Client::ledger_gaps`] reads: with the store's bound on void records (1,000,000 a
/// set) a ledger has at most this many pages of [`GAPS_PAGE`].
const MOST_GAPS_PAGES: usize = 1_000;

/// A ledger's whole gap report: its summary and every voided run, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct LedgerGaps {
    pub ledger: pb::LedgerInfo,
    pub voided: Vec<pb::LedgerEntry>,
}

/// One ledger call, sent to an AllocSvr's `LedgerService`.
trait LedgerOp: Clone + Send + 'static {
    type Reply: Send;
    /// Whether an attempt without a reply may have changed the ledger.
    const WRITES: bool;
    fn send(
        client: LedgerServiceClient<Conn>,
        req: tonic::Request<Self>,
    ) -> impl std::future::Future<Output = Result<tonic::Response<Self::Reply>, Status>> + Send;
}

macro_rules! ledger_op {
    ($req:ty, $reply:ty, $method:ident, $writes:expr) => {
        impl LedgerOp for $req {
            type Reply = $reply;
            const WRITES: bool = $writes;
            fn send(
                mut client: LedgerServiceClient<Conn>,
                req: tonic::Request<Self>,
            ) -> impl std::future::Future<Output = Result<tonic::Response<Self::Reply>, Status>> + Send {
                async move { client.$method(req).await }
            }
        }
    };
}

ledger_op!(pb::CreateLedgerRequest, pb::LedgerReply, create_ledger, true);
ledger_op!(pb::LedgerReserveRequest, pb::LedgerReply, reserve, true);
ledger_op!(pb::LedgerConfirmRequest, pb::LedgerReply, confirm, true);
ledger_op!(pb::LedgerReleaseRequest, pb::LedgerReply, release, true);
ledger_op!(pb::LedgerVoidRequest, pb::LedgerReply, void, true);
ledger_op!(pb::LedgerReconcileRequest, pb::LedgerReply, reconcile, true);
ledger_op!(pb::LedgerShowRequest, pb::LedgerShowReply, show, false);
ledger_op!(pb::LedgerGapsRequest, pb::LedgerGapsReply, gaps, false);

/// A fresh request id: 128 random bits in hex (the store takes up to 64 bytes).
pub fn new_request_id() -> String {
    format!("{:032x}", rand::rng().random::<u128>())
}

/// The failure a store refusal means for the caller, `None` when another attempt may pass.
fn refusal_kind(status: &Status) -> Option<FailureKind> {
    Some(match status.code() {
        Code::InvalidArgument | Code::OutOfRange => FailureKind::InvalidArgument,
        Code::NotFound => FailureKind::NotFound,
        Code::AlreadyExists => FailureKind::Conflict,
        Code::FailedPrecondition => FailureKind::Refused,
        Code::PermissionDenied | Code::Unauthenticated => FailureKind::Forbidden,
        // An AllocSvr of a release without ledgers.
        Code::Unimplemented => FailureKind::Unavailable,
        // A ledger at its bound of held or voided numbers (marked exhausted by the store): no
        // retry passes until numbers are confirmed or released. Unmarked, it is overload: retried.
        Code::ResourceExhausted
            if seqsvr_proto::refusal::of(status) == Some(seqsvr_proto::refusal::Refusal::Exhausted) =>
        {
            FailureKind::Exhausted
        }
        _ => return None,
    })
}

impl Client {
    /// Declares ledger `key` whose reserved numbers stay held for `hold` (1 s to 1 day; zero means
    /// the store's 60 s). Repeating it with the same hold answers the same; another hold is
    /// [`FailureKind::Conflict`].
    pub async fn ledger_create(&self, key: &str, hold: Duration) -> Result<pb::LedgerInfo, ClientError> {
        let req = pb::CreateLedgerRequest {
            key: key.as_bytes().to_vec(),
            hold_ms: u64::try_from(hold.as_millis()).unwrap_or(u64::MAX),
        };
        let reply = self.ledger_call(req).await?;
        reply.ledger.ok_or_else(|| no_part("ledger"))
    }

    /// The next number of ledger `key`, held by `holder` until the ledger's hold ends: confirm it
    /// ([`Client::ledger_confirm`]) or release it before then.
    ///
    /// One random request id is drawn for the call and sent with every attempt, so a retry after a
    /// lost reply (UNKNOWN, UNAVAILABLE or a deadline) gets the number the lost attempt took: a
    /// lost reply costs no number. [`ClientError::Unknown`] only when the deadline passed with no
    /// reply at all; that number, if one was taken, expires into the gap report.
    pub async fn ledger_reserve(&self, key: &str, holder: &str) -> Result<u64, ClientError> {
        let reply = self.ledger_reserve_with_id(key, holder, &new_request_id()).await?;
        Ok(reply.entry.map(|e| e.number).unwrap_or_default())
    }

    /// [`Client::ledger_reserve`] with the caller's own request id (up to 64 bytes): a caller that
    /// keeps the id across its own restarts gets the same number back while it is held.
    pub async fn ledger_reserve_with_id(
        &self,
        key: &str,
        holder: &str,
        request_id: &str,
    ) -> Result<pb::LedgerReply, ClientError> {
        let req = pb::LedgerReserveRequest {
            key: key.as_bytes().to_vec(),
            holder: holder.to_owned(),
            request_id: request_id.to_owned(),
            reference: String::new(),
        };
        let reply = self.ledger_call(req).await?;
        match reply.entry.as_ref().map(|e| e.number) {
            Some(n) if n > 0 => Ok(reply),
            _ => Err(no_part("number")),
        }
    }

    /// The next number of ledger `key`, confirmed with `reference` (e.g. the invoice id) in the
    /// same write: one commit where [`Client::ledger_reserve`] and [`Client::ledger_confirm`] take
    /// two, for a caller whose document has its id before it needs the number. Retry-safe by the
    /// reference: sending it again (after a lost reply, or from a restarted caller) answers the
    /// number it already confirms (`repeated`), while it is among the ledger's last 1,000
    /// confirmed references.
    pub async fn ledger_issue(&self, key: &str, reference: &str) -> Result<pb::LedgerReply, ClientError> {
        let req = pb::LedgerReserveRequest {
            key: key.as_bytes().to_vec(),
            reference: reference.to_owned(),
            ..Default::default()
        };
        let reply = self.ledger_call(req).await?;
        match reply.entry.as_ref() {
            Some(e) if e.number > 0 && e.state() == pb::LedgerState::Confirmed => Ok(reply),
            // A store that does not know issues would have held the number: say so rather than
            // let the caller think it confirmed (the number expires into the gap report).
            Some(e) if e.number > 0 => Err(no_part("confirmed number (is every StoreSvr 0.2.0?)")),
            _ => Err(no_part("number")),
        }
    }

    /// Confirms held number `n` with `reference` (e.g. the invoice id). Retry-safe: the same
    /// reference again answers the same (`repeated`); another is [`FailureKind::Conflict`]; a
    /// number voided meanwhile (expired) is [`FailureKind::Refused`] — take a new one.
    pub async fn ledger_confirm(&self, key: &str, n: u64, reference: &str) -> Result<pb::LedgerReply, ClientError> {
        let req = pb::LedgerConfirmRequest {
            key: key.as_bytes().to_vec(),
            number: n,
            reference: reference.to_owned(),
        };
        self.ledger_call(req).await
    }

    /// Gives held number `n` up: it is voided "released", with `note` in the gap report.
    pub async fn ledger_release(&self, key: &str, n: u64, note: &str) -> Result<pb::LedgerReply, ClientError> {
        let req = pb::LedgerReleaseRequest {
            key: key.as_bytes().to_vec(),
            number: n,
            note: note.to_owned(),
        };
        self.ledger_call(req).await
    }

    /// Operator: voids held number `n`, recorded as voided by `who` because of `note`. Needs an
    /// admin certificate when TLS is on.
    pub async fn ledger_void(&self, key: &str, n: u64, who: &str, note: &str) -> Result<pb::LedgerReply, ClientError> {
        let req = pb::LedgerVoidRequest {
            key: key.as_bytes().to_vec(),
            number: n,
            who: who.to_owned(),
            note: note.to_owned(),
        };
        self.ledger_call(req).await
    }

    /// Operator, after a restore from a backup: reserves resume at `next`; the numbers between the
    /// ledger's next and it are voided as lost with the restore, by `who`.
    pub async fn ledger_reconcile(&self, key: &str, next: u64, who: &str) -> Result<pb::LedgerReply, ClientError> {
        let req = pb::LedgerReconcileRequest {
            key: key.as_bytes().to_vec(),
            next,
            who: who.to_owned(),
        };
        self.ledger_call(req).await
    }

    /// The ledger's summary and numbers `from..from + count` (at most 1,000; those above the
    /// highest handed out are left out).
    pub async fn ledger_show(&self, key: &str, from: u64, count: u32) -> Result<pb::LedgerShowReply, ClientError> {
        let req = pb::LedgerShowRequest {
            key: key.as_bytes().to_vec(),
            from,
            count,
        };
        self.ledger_call(req).await
    }

    /// Every voided run of the ledger, in order (the auditor's report), read a page at a time.
    /// Each page is a linearizable read; a void made while the pages are read shows when it is
    /// above the page already read.
    pub async fn ledger_gaps(&self, key: &str) -> Result<LedgerGaps, ClientError> {
        let mut after = 0;
        let mut voided = Vec::new();
        for _ in 0..MOST_GAPS_PAGES {
            let page = self.ledger_gaps_page(key, after, GAPS_PAGE).await?;
            let ledger = page.ledger.ok_or_else(|| no_part("ledger"))?;
            // A run's last number: the next page starts above it (a page may hold a run's start
            // only, and asking again with its first number would return it again).
            let last = page.voided.last().map(|e| e.through.max(e.number));
            voided.extend(page.voided);
            match last {
                Some(last) if page.more && last > after => after = last,
                _ => return Ok(LedgerGaps { ledger, voided }),
            }
        }
        Err(ClientError::failed(
            FailureKind::Unavailable,
            format!("the gap report of {key:?} is over {MOST_GAPS_PAGES} pages of {GAPS_PAGE} runs"),
        ))
    }

    /// One page of the gap report: at most `limit` voided runs (0: 1,000; at most 10,000) that end
    /// above `after`, and whether more follow (ask again with `after` at the last run's `through`).
    pub async fn ledger_gaps_page(
        &self,
        key: &str,
        after: u64,
        limit: u32,
    ) -> Result<pb::LedgerGapsReply, ClientError> {
        let req = pb::LedgerGapsRequest {
            key: key.as_bytes().to_vec(),
            after,
            limit,
        };
        self.ledger_call(req).await
    }

    /// Sends `req` to any AllocSvr, another one after a failure that another attempt may pass,
    /// until the client's deadline.
    async fn ledger_call<R: LedgerOp>(&self, req: R) -> Result<R::Reply, ClientError> {
        let cfg = self.config();
        let mut budget = Budget::until(cfg, Instant::now() + cfg.deadline);
        let mut last = String::new();
        let mut maybe_taken = false;
        let mut avoid: Option<String> = None;
        while let Some(timeout) = budget.start_attempt(Instant::now()) {
            let addr = match &avoid {
                None => self.any_seed(),
                Some(_) => self.any_allocsvr(avoid.as_deref()),
            };
            match self.ledger_attempt(&addr, req.clone(), timeout).await {
                Ok(reply) => return Ok(reply),
                Err(None) => {
                    maybe_taken |= R::WRITES;
                    last = format!("{addr}: attempt timed out after {timeout:?}");
                }
                Err(Some(status)) => {
                    if let Some(kind) = refusal_kind(&status) {
                        return Err(ClientError::failed(kind, status.message()));
                    }
                    maybe_taken |= R::WRITES && classify(&status).delivery == Delivery::Maybe;
                    last = format!("{addr}: {}: {}", status.code(), status.message());
                }
            }
            avoid = Some(addr);
            self.back_off(&mut budget, true).await;
        }
        if last.is_empty() {
            last = "no attempt before the deadline".into();
        }
        Err(if maybe_taken {
            ClientError::unknown(last)
        } else {
            ClientError::failed(FailureKind::Unavailable, last)
        })
    }

    /// The next seed: a call's first attempt goes where its caller pointed the client (an
    /// AllocSvr's front ends seed it with the AllocSvr itself, which it reaches in process).
    fn any_seed(&self) -> String {
        // The configuration has at least one (`ClientConfig::validate`).
        self.inner.seeds.next().to_owned()
    }

    /// One attempt: the reply, or the status (`None`: no reply within `timeout`).
    async fn ledger_attempt<R: LedgerOp>(
        &self,
        addr: &str,
        req: R,
        timeout: Duration,
    ) -> Result<R::Reply, Option<Status>> {
        // A channel that cannot be opened sent nothing: UNAVAILABLE, tried elsewhere.
        let channel = self
            .channel_for(addr)
            .map_err(|s| Some(Status::unavailable(s.message().to_owned())))?;
        let client = LedgerServiceClient::new(channel)
            .max_decoding_message_size(seqsvr_proto::limits::DATA_PLANE_MESSAGE_BYTES)
            .max_encoding_message_size(seqsvr_proto::limits::DATA_PLANE_MESSAGE_BYTES);
        let mut request = tonic::Request::new(req);
        request.set_timeout(timeout);
        match tokio::time::timeout(timeout, R::send(client, request)).await {
            Ok(Ok(reply)) => Ok(reply.into_inner()),
            Ok(Err(status)) => Err(Some(status)),
            Err(_) => Err(None),
        }
    }
}

/// A reply without a part every reply of its call carries: a server bug, not the caller's.
fn no_part(what: &str) -> ClientError {
    ClientError::failed(FailureKind::Unavailable, format!("the ledger reply carried no {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_keep_their_meaning_and_passing_failures_are_retried() {
        let cases = [
            (Code::InvalidArgument, Some(FailureKind::InvalidArgument)),
            (Code::NotFound, Some(FailureKind::NotFound)),
            (Code::AlreadyExists, Some(FailureKind::Conflict)),
            (Code::FailedPrecondition, Some(FailureKind::Refused)),
            (Code::PermissionDenied, Some(FailureKind::Forbidden)),
            (Code::Unavailable, None),
            (Code::Unknown, None),
            (Code::DeadlineExceeded, None),
            (Code::ResourceExhausted, None),
        ];
        for (code, kind) in cases {
            assert_eq!(refusal_kind(&Status::new(code, "x")), kind, "{code:?}");
        }
    }

    #[test]
    fn request_ids_are_fresh_and_fit_the_store_limit() {
        let (a, b) = (new_request_id(), new_request_id());
        assert_ne!(a, b);
        assert!(a.len() <= 64, "{a}");
    }
}
