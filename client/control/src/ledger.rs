//! The `LedgerService` client of one set's StoreSvrs: every ledger call must reach the set's
//! leader, which decides it through Raft (a follower answers with `not_leader`, which the
//! leader-following loop follows like any StoreService hint).
//!
//! Retries inside the loop are safe because every ledger write is: a Reserve repeated with the
//! same request id answers the number it already holds, a Confirm with the same reference answers
//! the same, a Release or Void of a number already voided is refused without a change.
//!
//! One refusal is not retried here although it is UNAVAILABLE: "not served by this set now" (the
//! key's section is frozen for a move or has left the set). Every replica of the group would say
//! the same, so the call ends at once ([`LeaderCall::ends_call`]) and the caller — an AllocSvr
//! that knows the cluster map — finds the set that serves the key now ([`is_not_served`]).
//!
//! Deliberately left out: which set owns a key (the caller places it), and any meaning of the
//! replies.

use std::future::Future;

use seqsvr_proto::pb::ledger_service_client::LedgerServiceClient;
use seqsvr_proto::{limits, pb};
use tonic::{Code, Request, Response, Status};

use crate::leader::{ControlError, Leader, LeaderCall, Seed, StoreTimeouts};
use seqsvr_rpc::transport::{Conn, Dialer};

/// What a StoreSvr says when the key's section is not this set's now (storesvr's
/// `protocol::ledger`, `Refusal::NotOwned`). The one phrase both sides agree on.
pub const NOT_SERVED: &str = "is not served by this set now";

/// Whether `status` is a set's "not served by this set now": the key's section is moving or moved,
/// so the caller refreshes its map and asks the set that serves it (or the same one, after the
/// move's switch).
pub fn is_not_served(status: &Status) -> bool {
    status.code() == Code::Unavailable && status.message().contains(NOT_SERVED)
}

/// Client of one set's `LedgerService`; cheap to clone (clones share channels and the believed
/// leader).
#[derive(Clone, Debug)]
pub struct LedgerClient {
    leader: Leader,
}

impl LedgerClient {
    /// A client over the set's StoreSvr addresses; no connection is made until the first call.
    pub fn with_dialer(seeds: Vec<Seed>, timeouts: StoreTimeouts, dialer: &Dialer) -> Result<Self, String> {
        Ok(Self {
            leader: Leader::with_dialer(seeds, timeouts, dialer)?,
        })
    }

    /// The same client (shared channels and leader) with other deadlines: a forwarded call keeps
    /// within its caller's.
    pub fn with_timeouts(&self, timeouts: StoreTimeouts) -> Self {
        Self {
            leader: self.leader.with_timeouts(timeouts),
        }
    }

    /// Address of the replica currently believed to lead (for logs and tests).
    pub fn believed_leader(&self) -> String {
        self.leader.believed_leader()
    }

    /// Sends any ledger request (each request type knows its method) to the set's leader.
    pub async fn call<R: LedgerRequest>(&self, req: R) -> Result<R::Reply, ControlError> {
        self.leader.call(req).await
    }
}

/// A `LedgerService` request: the eight calls, each sent the same way.
pub trait LedgerRequest: LeaderCall {}

/// The StoreSvr's own limits, both ways.
fn ledger_service(channel: Conn) -> LedgerServiceClient<Conn> {
    LedgerServiceClient::new(channel)
        .max_decoding_message_size(limits::STORE_MESSAGE_BYTES)
        .max_encoding_message_size(limits::STORE_MESSAGE_BYTES)
}

macro_rules! ledger_call {
    ($req:ty, $reply:ty, $method:ident) => {
        impl LeaderCall for $req {
            type Reply = $reply;
            fn send(
                channel: Conn,
                req: Request<Self>,
            ) -> impl Future<Output = Result<Response<Self::Reply>, Status>> + Send {
                async move { ledger_service(channel).$method(req).await }
            }
            fn hint(reply: &Self::Reply) -> Option<&pb::LeaderHint> {
                reply.not_leader.as_ref()
            }
            fn ends_call(status: &Status) -> bool {
                is_not_served(status)
            }
        }
        impl LedgerRequest for $req {}
    };
}

ledger_call!(pb::CreateLedgerRequest, pb::LedgerReply, create_ledger);
ledger_call!(pb::LedgerReserveRequest, pb::LedgerReply, reserve);
ledger_call!(pb::LedgerConfirmRequest, pb::LedgerReply, confirm);
ledger_call!(pb::LedgerReleaseRequest, pb::LedgerReply, release);
ledger_call!(pb::LedgerVoidRequest, pb::LedgerReply, void);
ledger_call!(pb::LedgerReconcileRequest, pb::LedgerReply, reconcile);
ledger_call!(pb::LedgerShowRequest, pb::LedgerShowReply, show);
ledger_call!(pb::LedgerGapsRequest, pb::LedgerGapsReply, gaps);

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use pb::ledger_service_server::{LedgerService, LedgerServiceServer};

    /// A replica that answers every Reserve with `status`, counting the calls.
    struct Refusing {
        status: fn() -> Status,
        calls: Arc<AtomicU64>,
    }

    #[tonic::async_trait]
    impl LedgerService for Refusing {
        async fn create_ledger(
            &self,
            _: Request<pb::CreateLedgerRequest>,
        ) -> Result<Response<pb::LedgerReply>, Status> {
            Err(Status::unimplemented("create"))
        }
        async fn reserve(&self, _: Request<pb::LedgerReserveRequest>) -> Result<Response<pb::LedgerReply>, Status> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            Err((self.status)())
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

    async fn serve(status: fn() -> Status) -> (SocketAddr, Arc<AtomicU64>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let calls = Arc::new(AtomicU64::new(0));
        let svc = LedgerServiceServer::new(Refusing {
            status,
            calls: calls.clone(),
        });
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        (addr, calls)
    }

    fn client(addr: SocketAddr) -> LedgerClient {
        let timeouts = StoreTimeouts {
            attempt: Duration::from_millis(300),
            overall: Duration::from_millis(800),
        };
        LedgerClient::with_dialer(
            Seed::parse_list(&addr.to_string()).unwrap(),
            timeouts,
            &Dialer::default(),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn a_section_that_left_the_set_ends_the_call_at_once() {
        let (addr, calls) = serve(|| {
            Status::unavailable("ledger \"inv\" is not served by this set now (its section is moving or moved): retry")
        })
        .await;
        let err = client(addr)
            .call(pb::LedgerReserveRequest::default())
            .await
            .unwrap_err();
        let ControlError::Rejected(status) = err else {
            panic!("{err:?}")
        };
        assert!(is_not_served(&status), "{status:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 1, "not retried inside the set");
    }

    #[tokio::test]
    async fn a_set_without_a_leader_is_retried_until_the_deadline() {
        let (addr, calls) = serve(|| Status::unavailable("no leader")).await;
        let err = client(addr)
            .call(pb::LedgerReserveRequest::default())
            .await
            .unwrap_err();
        assert!(matches!(err, ControlError::Unavailable { .. }), "{err:?}");
        assert!(calls.load(Ordering::SeqCst) >= 2, "retried within the set");
    }
}
