//! The forwarding loop of one ledger call: to the set that keeps the key ([`Sets::client_for`]),
//! again after a fresh map ([`Sets::refresh`]) when that set says the key's section is not its
//! own now, until the call's deadline. Every other answer passes through as the store gave it.
//!
//! Apart from the AllocSvr's state, behind [`Sets`], so that the loop is tested against fake
//! stores (below).
//!
//! Left out: where the sets are (`service`), and any retry after an unknown outcome (the caller
//! retries with the same request id or reference).

use std::future::Future;
use std::time::Duration;

use seqsvr_control::ledger::{LedgerRequest, is_not_served};
use seqsvr_control::{ControlError, LedgerClient, StoreTimeouts};
use seqsvr_proto::pb;
use tokio::time::Instant;
use tonic::Status;
use tracing::debug;

/// One store attempt at most: a leader answers a ledger write after one Raft commit.
const ATTEMPT: Duration = Duration::from_secs(1);
/// The pause before asking again after "not served by this set now": a move's switch takes a few
/// Raft commits.
const NOT_SERVED_PAUSE: Duration = Duration::from_millis(50);

/// Where the sets are, as the loop needs it.
pub trait Sets: Send + Sync {
    /// The set that keeps `key` by the map held now, and its client.
    fn client_for(&self, key: &str) -> Result<(u64, LedgerClient), Status>;
    /// Reads a newer map if there is one, within `budget`.
    fn refresh(&self, budget: Duration) -> impl Future<Output = ()> + Send;
}

/// The key of a ledger request, to place it.
pub trait Keyed {
    fn key(&self) -> &[u8];
}

macro_rules! keyed {
    ($($t:ty),*) => {$(
        impl Keyed for $t {
            fn key(&self) -> &[u8] {
                &self.key
            }
        }
    )*};
}

keyed!(
    pb::CreateLedgerRequest,
    pb::LedgerReserveRequest,
    pb::LedgerConfirmRequest,
    pb::LedgerReleaseRequest,
    pb::LedgerVoidRequest,
    pb::LedgerReconcileRequest,
    pb::LedgerShowRequest,
    pb::LedgerGapsRequest
);

/// Forwards `req` to the leader of the set that keeps its key, within `wait`.
pub async fn forward<R, S>(sets: &S, req: R, wait: Duration) -> Result<R::Reply, Status>
where
    R: LedgerRequest + Keyed,
    S: Sets,
{
    let key = seqsvr_proto::keys::check_key(req.key())
        .map_err(|e| Status::invalid_argument(format!("ledger key: {e}")))?
        .to_string();
    let deadline = Instant::now() + wait;
    loop {
        let (set, client) = sets.client_for(&key)?;
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Status::unavailable(format!(
                "ledger {key:?}: no set served it within {wait:?} (its section is moving): retry"
            )));
        }
        let client = client.with_timeouts(StoreTimeouts {
            attempt: ATTEMPT.min(left),
            overall: left,
        });
        match client.call(req.clone()).await {
            Ok(reply) => return Ok(reply),
            Err(ControlError::Rejected(s)) if is_not_served(&s) => {
                debug!(%key, set, "ledger call: not served by the set now; refreshing the map");
                sets.refresh(deadline.saturating_duration_since(Instant::now())).await;
                let pause = NOT_SERVED_PAUSE.min(deadline.saturating_duration_since(Instant::now()));
                tokio::time::sleep(pause).await;
            }
            Err(ControlError::Rejected(s)) => return Err(s),
            Err(ControlError::Unavailable {
                last,
                maybe_taken: true,
            }) => {
                return Err(Status::unknown(format!(
                    "ledger {key:?}: outcome unknown (set {set}: {last}); retry with the same request id or reference"
                )));
            }
            Err(ControlError::Unavailable {
                last,
                maybe_taken: false,
            }) => {
                return Err(Status::unavailable(format!("ledger {key:?}: set {set}: {last}")));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use pb::ledger_service_server::{LedgerService, LedgerServiceServer};
    use seqsvr_control::{Dialer, Seed};
    use tonic::{Code, Request, Response};

    use super::*;

    /// How a fake replica answers a Reserve.
    #[derive(Clone, Copy)]
    enum Answer {
        /// As the leader: number 7.
        Number,
        /// As a follower pointing at the leader's address.
        Hint,
        /// A status.
        Status(Code, &'static str),
        /// Never (the attempt times out).
        Silent,
    }

    struct Replica {
        answer: Answer,
        hint_to: std::sync::Mutex<String>,
        calls: AtomicU64,
    }

    #[tonic::async_trait]
    impl LedgerService for Replica {
        async fn create_ledger(
            &self,
            _: Request<pb::CreateLedgerRequest>,
        ) -> Result<Response<pb::LedgerReply>, Status> {
            Err(Status::unimplemented("create"))
        }
        async fn reserve(&self, _: Request<pb::LedgerReserveRequest>) -> Result<Response<pb::LedgerReply>, Status> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            match self.answer {
                Answer::Number => Ok(Response::new(pb::LedgerReply {
                    entry: Some(pb::LedgerEntry {
                        number: 7,
                        ..Default::default()
                    }),
                    ..Default::default()
                })),
                Answer::Hint => Ok(Response::new(pb::LedgerReply {
                    not_leader: Some(pb::LeaderHint {
                        leader_id: 0,
                        leader_addr: self.hint_to.lock().unwrap().clone(),
                    }),
                    ..Default::default()
                })),
                Answer::Status(code, m) => Err(Status::new(code, m)),
                Answer::Silent => std::future::pending().await,
            }
        }
        async fn confirm(&self, _: Request<pb::LedgerConfirmRequest>) -> Result<Response<pb::LedgerReply>, Status> {
            Err(Status::unimplemented("confirm"))
        }
        async fn release(&self, _: Request<pb::LedgerReleaseRequest>) -> Result<Response<pb::LedgerReply>, Status> {
            Err(Status::unimplemented("release"))
        }
        async fn void(&self, _: Request<pb::LedgerVoidRequest>) -> Result<Response<pb::LedgerReply>, Status> {
            Err(Status::unimplemented("void"))
        }
        async fn reconcile(&self, _: Request<pb::LedgerReconcileRequest>) -> Result<Response<pb::LedgerReply>, Status> {
            Err(Status::unimplemented("reconcile"))
        }
        async fn show(&self, _: Request<pb::LedgerShowRequest>) -> Result<Response<pb::LedgerShowReply>, Status> {
            Err(Status::unimplemented("show"))
        }
        async fn gaps(&self, _: Request<pb::LedgerGapsRequest>) -> Result<Response<pb::LedgerGapsReply>, Status> {
            Err(Status::unimplemented("gaps"))
        }
    }

    async fn replica(answer: Answer) -> (SocketAddr, Arc<Replica>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let r = Arc::new(Replica {
            answer,
            hint_to: std::sync::Mutex::new(String::new()),
            calls: AtomicU64::new(0),
        });
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(LedgerServiceServer::from_arc(r.clone()))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        (addr, r)
    }

    fn client(addrs: &[SocketAddr]) -> LedgerClient {
        let list = addrs.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
        LedgerClient::with_dialer(
            Seed::parse_list(&list).unwrap(),
            StoreTimeouts::default(),
            &Dialer::default(),
        )
        .unwrap()
    }

    /// Two sets: the key is in `first` until a refresh, then in `second` when `moves`.
    struct TwoSets {
        first: LedgerClient,
        second: LedgerClient,
        moves: bool,
        moved: AtomicBool,
        refreshes: AtomicU64,
    }

    impl TwoSets {
        fn new(first: LedgerClient, second: LedgerClient, moves: bool) -> Self {
            Self {
                first,
                second,
                moves,
                moved: AtomicBool::new(false),
                refreshes: AtomicU64::new(0),
            }
        }
    }

    impl Sets for TwoSets {
        fn client_for(&self, _: &str) -> Result<(u64, LedgerClient), Status> {
            Ok(if self.moved.load(Ordering::SeqCst) {
                (1, self.second.clone())
            } else {
                (0, self.first.clone())
            })
        }
        async fn refresh(&self, _: Duration) {
            self.refreshes.fetch_add(1, Ordering::SeqCst);
            if self.moves {
                self.moved.store(true, Ordering::SeqCst);
            }
        }
    }

    fn reserve() -> pb::LedgerReserveRequest {
        pb::LedgerReserveRequest {
            key: b"inv".to_vec(),
            holder: "till".into(),
            request_id: "r-1".into(),
            reference: String::new(),
        }
    }

    const NOT_SERVED: Answer = Answer::Status(
        Code::Unavailable,
        "ledger \"inv\" is not served by this set now (its section is moving or moved): retry",
    );

    #[tokio::test]
    async fn a_section_that_moved_is_followed_to_its_new_set() {
        let (old, old_calls) = replica(NOT_SERVED).await;
        let (new, _) = replica(Answer::Number).await;
        let sets = TwoSets::new(client(&[old]), client(&[new]), true);
        let reply = forward(&sets, reserve(), Duration::from_secs(3)).await.unwrap();
        assert_eq!(reply.entry.unwrap().number, 7);
        assert_eq!(old_calls.calls.load(Ordering::SeqCst), 1);
        assert_eq!(sets.refreshes.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_section_frozen_past_the_deadline_is_unavailable_after_bounded_retries() {
        let (old, old_calls) = replica(NOT_SERVED).await;
        let sets = TwoSets::new(client(&[old]), client(&[old]), false);
        let started = std::time::Instant::now();
        let e = forward(&sets, reserve(), Duration::from_millis(400)).await.unwrap_err();
        assert_eq!(e.code(), Code::Unavailable, "{e:?}");
        assert!(started.elapsed() < Duration::from_secs(2));
        let n = old_calls.calls.load(Ordering::SeqCst);
        assert!((2..=20).contains(&n), "{n} attempts: paused between, not a spin");
    }

    #[tokio::test]
    async fn a_refusal_passes_through_with_its_code_and_message() {
        for (code, message) in [
            (
                Code::AlreadyExists,
                "number 3 of ledger \"inv\" is confirmed with reference \"A\"",
            ),
            (Code::NotFound, "no ledger \"inv\": create it first"),
            (Code::FailedPrecondition, "number 3 is voided (expired unconfirmed)"),
            (Code::InvalidArgument, "holder is over 64 bytes"),
        ] {
            let (addr, _) = replica(Answer::Status(code, message)).await;
            let sets = TwoSets::new(client(&[addr]), client(&[addr]), false);
            let e = forward(&sets, reserve(), Duration::from_secs(2)).await.unwrap_err();
            assert_eq!((e.code(), e.message()), (code, message));
            assert_eq!(sets.refreshes.load(Ordering::SeqCst), 0);
        }
    }

    #[tokio::test]
    async fn a_follower_s_hint_is_followed_and_never_reaches_the_caller() {
        let (leader, _) = replica(Answer::Number).await;
        let (follower, follower_calls) = replica(Answer::Hint).await;
        *follower_calls.hint_to.lock().unwrap() = leader.to_string();
        let sets = TwoSets::new(client(&[follower]), client(&[follower]), false);
        let reply = forward(&sets, reserve(), Duration::from_secs(3)).await.unwrap();
        assert!(reply.not_leader.is_none());
        assert_eq!(reply.entry.unwrap().number, 7);
    }

    #[tokio::test]
    async fn a_write_without_a_reply_is_an_unknown_outcome() {
        let (addr, _) = replica(Answer::Silent).await;
        let sets = TwoSets::new(client(&[addr]), client(&[addr]), false);
        let e = forward(&sets, reserve(), Duration::from_millis(300)).await.unwrap_err();
        assert_eq!(e.code(), Code::Unknown, "{e:?}");
        assert!(e.message().contains("same request id"), "{e:?}");
    }

    #[tokio::test]
    async fn a_bad_key_is_refused_before_any_call() {
        let (addr, r) = replica(Answer::Number).await;
        let sets = TwoSets::new(client(&[addr]), client(&[addr]), false);
        let mut req = reserve();
        req.key = vec![0xff];
        let e = forward(&sets, req, Duration::from_secs(1)).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert_eq!(r.calls.load(Ordering::SeqCst), 0);
    }
}
