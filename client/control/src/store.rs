//! The StoreService client of an AllocSvr and of operator tools: Register, Renew, Release, Bump and
//! Load must reach the leader of the set's Raft group; routes and status are answered by any
//! replica. All of them go through the one leader-following loop (`leader`).
//!
//! Retries are safe for the callers in this project because every StoreService write is
//! idempotent or harmless when repeated: a Bump is retried with the same `new_max` (ownership rule
//! 6 of docs/DESIGN.md), a Release names the epoch of each section and releases nothing once that
//! grant is over, and a repeated Register carries the same nonce and gets the same incarnation back.
//!
//! Deliberately left out: any knowledge of what the replies mean.

use std::future::Future;

use seqsvr_proto::pb::store_service_client::StoreServiceClient;
use seqsvr_proto::{limits, pb};
use tonic::{Request, Response, Status};

use crate::leader::{ControlError, Leader, LeaderCall, Seed, StoreTimeouts};
use seqsvr_rpc::transport::{Conn, Dialer};

/// Client of the StoreService of one set; cheap to clone (clones share channels and the
/// believed leader).
#[derive(Clone, Debug)]
pub struct StoreClient {
    leader: Leader,
}

impl StoreClient {
    /// Creates a client over the given seeds; no connection is made until the first call.
    pub fn new(seeds: Vec<Seed>, timeouts: StoreTimeouts) -> Result<Self, String> {
        Self::with_dialer(seeds, timeouts, &Dialer::default())
    }

    /// The same, over the transport `dialer` opens.
    pub fn with_dialer(seeds: Vec<Seed>, timeouts: StoreTimeouts, dialer: &Dialer) -> Result<Self, String> {
        Ok(Self {
            leader: Leader::with_dialer(seeds, timeouts, dialer)?,
        })
    }

    /// The same client (shared channels and leader) with other deadlines, e.g. a short one for
    /// lease renewals.
    pub fn with_timeouts(&self, timeouts: StoreTimeouts) -> Self {
        Self {
            leader: self.leader.with_timeouts(timeouts),
        }
    }

    /// Address of the replica currently believed to lead (for logs and tests).
    pub fn believed_leader(&self) -> String {
        self.leader.believed_leader()
    }

    /// Registers an AllocSvr process: a fresh incarnation and the set's parameters.
    pub async fn register(&self, req: pb::RegisterRequest) -> Result<pb::RegisterReply, ControlError> {
        self.leader.call(req).await
    }

    /// Renews the lease of an incarnation and reads its grants.
    pub async fn renew(&self, req: pb::RenewRequest) -> Result<pb::RenewReply, ControlError> {
        self.leader.call(req).await
    }

    /// Gives sections up so that their next owner need not wait a lease.
    pub async fn release(&self, req: pb::ReleaseRequest) -> Result<pb::ReleaseReply, ControlError> {
        self.leader.call(req).await
    }

    /// Fenced raise of sections' `max_seq`.
    pub async fn bump(&self, req: pb::BumpRequest) -> Result<pb::BumpReply, ControlError> {
        self.leader.call(req).await
    }

    /// Fenced raise of id slots' high-water marks (a slot holder's write).
    pub async fn raise_marks(&self, req: pb::RaiseMarksRequest) -> Result<pb::RaiseMarksReply, ControlError> {
        self.leader.call(req).await
    }

    /// Linearizable read of sections' `max_seq`, epoch and owner.
    pub async fn load(&self, req: pb::LoadRequest) -> Result<pb::LoadReply, ControlError> {
        self.leader.call(req).await
    }

    /// The current route table (any replica answers from local state).
    pub async fn get_routes(&self) -> Result<pb::GetRoutesReply, ControlError> {
        self.leader.call(pb::GetRoutesRequest {}).await
    }

    /// Cluster status as seen by the replica that answers (the believed leader first).
    pub async fn status(&self) -> Result<pb::StatusReply, ControlError> {
        self.leader.call(pb::StatusRequest {}).await
    }
}

/// The StoreSvr's own limits, both ways: a reply it may send is one this client decodes.
fn store_service(channel: Conn) -> StoreServiceClient<Conn> {
    StoreServiceClient::new(channel)
        .max_decoding_message_size(limits::STORE_MESSAGE_BYTES)
        .max_encoding_message_size(limits::STORE_MESSAGE_BYTES)
}

macro_rules! store_call {
    ($req:ty, $reply:ty, $method:ident, with_hint) => {
        store_call!($req, $reply, $method, |r: &$reply| r.not_leader.as_ref());
    };
    ($req:ty, $reply:ty, $method:ident, $hint:expr) => {
        impl LeaderCall for $req {
            type Reply = $reply;
            fn send(
                channel: Conn,
                req: Request<Self>,
            ) -> impl Future<Output = Result<Response<Self::Reply>, Status>> + Send {
                async move { store_service(channel).$method(req).await }
            }
            fn hint(reply: &Self::Reply) -> Option<&pb::LeaderHint> {
                let f: fn(&$reply) -> Option<&pb::LeaderHint> = $hint;
                f(reply)
            }
        }
    };
}

store_call!(pb::RegisterRequest, pb::RegisterReply, register, with_hint);
store_call!(pb::RenewRequest, pb::RenewReply, renew, with_hint);
store_call!(pb::ReleaseRequest, pb::ReleaseReply, release, with_hint);
store_call!(pb::BumpRequest, pb::BumpReply, bump, with_hint);
store_call!(pb::LoadRequest, pb::LoadReply, load, with_hint);
store_call!(pb::RaiseMarksRequest, pb::RaiseMarksReply, raise_marks, with_hint);
store_call!(pb::GetRoutesRequest, pb::GetRoutesReply, get_routes, |_| None);
store_call!(pb::StatusRequest, pb::StatusReply, status, |_| None);

#[cfg(test)]
mod tests {
    use super::*;
    use pb::store_service_server::{StoreService, StoreServiceServer};
    use seqsvr_proto::NodeId;
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::sync::atomic::AtomicU64;
    use std::sync::atomic::Ordering;
    use std::time::Duration;
    use tonic::Code;

    /// A fake replica: either the leader (answers Register with incarnation 42) or a follower
    /// that points at `hint`.
    struct Fake {
        hint: Option<pb::LeaderHint>,
        calls: Arc<AtomicU64>,
        reject: bool,
    }

    #[tonic::async_trait]
    impl StoreService for Fake {
        async fn register(&self, _: Request<pb::RegisterRequest>) -> Result<Response<pb::RegisterReply>, Status> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.reject {
                return Err(Status::invalid_argument("bad node id"));
            }
            Ok(Response::new(match &self.hint {
                Some(h) => pb::RegisterReply {
                    not_leader: Some(h.clone()),
                    ..Default::default()
                },
                None => pb::RegisterReply {
                    incarnation: 42,
                    ..Default::default()
                },
            }))
        }
        async fn renew(&self, _: Request<pb::RenewRequest>) -> Result<Response<pb::RenewReply>, Status> {
            Err(Status::unimplemented("renew"))
        }
        async fn release(&self, _: Request<pb::ReleaseRequest>) -> Result<Response<pb::ReleaseReply>, Status> {
            Err(Status::unimplemented("release"))
        }
        async fn bump(&self, _: Request<pb::BumpRequest>) -> Result<Response<pb::BumpReply>, Status> {
            Err(Status::unimplemented("bump"))
        }
        /// Answers every named section with every field at its largest encoding.
        async fn load(&self, req: Request<pb::LoadRequest>) -> Result<Response<pb::LoadReply>, Status> {
            let sections = req
                .into_inner()
                .sections
                .iter()
                .flat_map(|r| r.begin..r.end)
                .map(|_| pb::SectionState {
                    section: u64::MAX,
                    max_seq: u64::MAX,
                    epoch: u64::MAX,
                    owner_incarnation: u64::MAX,
                })
                .collect();
            Ok(Response::new(pb::LoadReply {
                not_leader: None,
                sections,
            }))
        }
        async fn get_routes(&self, _: Request<pb::GetRoutesRequest>) -> Result<Response<pb::GetRoutesReply>, Status> {
            Err(Status::unimplemented("get_routes"))
        }
        async fn status(&self, _: Request<pb::StatusRequest>) -> Result<Response<pb::StatusReply>, Status> {
            Err(Status::unimplemented("status"))
        }
        async fn raise_marks(
            &self,
            _: Request<pb::RaiseMarksRequest>,
        ) -> Result<Response<pb::RaiseMarksReply>, Status> {
            Err(Status::unimplemented("raise_marks"))
        }
    }

    /// Serves `fake` with the same message limits as a StoreSvr.
    async fn serve(fake: Fake) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let service = StoreServiceServer::new(fake)
            .max_decoding_message_size(limits::STORE_MESSAGE_BYTES)
            .max_encoding_message_size(limits::STORE_MESSAGE_BYTES);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming),
        );
        addr
    }

    #[tokio::test]
    async fn a_load_of_the_most_sections_decodes_under_the_client_limit() {
        use prost::Message;
        let (fake, _) = fake(None);
        let addr = serve(fake).await;
        let timeouts = StoreTimeouts {
            attempt: Duration::from_secs(10),
            overall: Duration::from_secs(10),
        };
        let client = StoreClient::new(Seed::parse_list(&addr.to_string()).unwrap(), timeouts).unwrap();
        // The largest Load the store accepts, and the chunk an AllocSvr asks for, each answered
        // with every field at its largest encoding.
        for sections in [limits::MAX_LOAD_SECTIONS, limits::LOAD_CHUNK_SECTIONS] {
            let req = pb::LoadRequest {
                sections: vec![pb::SectionRange {
                    begin: 0,
                    end: sections,
                }],
            };
            let reply = client
                .load(req)
                .await
                .unwrap_or_else(|e| panic!("{sections} sections: {e}"));
            assert_eq!(reply.sections.len() as u64, sections);
            let bytes = reply.encoded_len();
            assert!(
                bytes <= limits::STORE_MESSAGE_BYTES,
                "{sections} sections: {bytes} bytes"
            );
            eprintln!("a Load of {sections} sections: {bytes} bytes at most");
        }
    }

    fn fake(hint: Option<pb::LeaderHint>) -> (Fake, Arc<AtomicU64>) {
        let calls = Arc::new(AtomicU64::new(0));
        (
            Fake {
                hint,
                calls: calls.clone(),
                reject: false,
            },
            calls,
        )
    }

    fn quick() -> StoreTimeouts {
        StoreTimeouts {
            attempt: Duration::from_millis(500),
            overall: Duration::from_secs(3),
        }
    }

    #[tokio::test]
    async fn follows_hint_to_configured_address_of_leader_id() {
        let (leader, leader_calls) = fake(None);
        let leader_addr = serve(leader).await;
        // The follower's hint carries an address nobody listens on: the client must use the
        // configured address of node 2 instead (a proxy in the simulator).
        let (follower, follower_calls) = fake(Some(pb::LeaderHint {
            leader_id: 2,
            leader_addr: "127.0.0.1:1".into(),
        }));
        let follower_addr = serve(follower).await;
        let seeds = Seed::parse_list(&format!("1={follower_addr},2={leader_addr}")).unwrap();
        let client = StoreClient::new(seeds, quick()).unwrap();

        let reply = client.register(pb::RegisterRequest::default()).await.unwrap();
        assert_eq!(reply.incarnation, 42);
        assert_eq!(follower_calls.load(Ordering::SeqCst), 1);
        assert_eq!(leader_calls.load(Ordering::SeqCst), 1);
        assert_eq!(client.believed_leader(), leader_addr.to_string());

        // The next call goes straight to the remembered leader.
        client.register(pb::RegisterRequest::default()).await.unwrap();
        assert_eq!(follower_calls.load(Ordering::SeqCst), 1);
        assert_eq!(leader_calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn follows_hint_address_when_leader_id_is_unknown() {
        let (leader, leader_calls) = fake(None);
        let leader_addr = serve(leader).await;
        let (follower, _) = fake(Some(pb::LeaderHint {
            leader_id: 9,
            leader_addr: leader_addr.to_string(),
        }));
        let follower_addr = serve(follower).await;
        let client = StoreClient::new(Seed::parse_list(&follower_addr.to_string()).unwrap(), quick()).unwrap();
        let reply = client.register(pb::RegisterRequest::default()).await.unwrap();
        assert_eq!(reply.incarnation, 42);
        assert_eq!(leader_calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn rotates_seeds_when_hint_is_empty_or_replica_is_down() {
        let (leader, _) = fake(None);
        let leader_addr = serve(leader).await;
        let (follower, follower_calls) = fake(Some(pb::LeaderHint::default()));
        let follower_addr = serve(follower).await;
        // A dead seed first (nothing listens on port 1), then a follower that does not know the
        // leader, then the leader.
        let seeds = Seed::parse_list(&format!("127.0.0.1:1,{follower_addr},{leader_addr}")).unwrap();
        let client = StoreClient::new(seeds, quick()).unwrap();
        let reply = client.register(pb::RegisterRequest::default()).await.unwrap();
        assert_eq!(reply.incarnation, 42);
        assert!(follower_calls.load(Ordering::SeqCst) >= 1);
    }

    #[tokio::test]
    async fn gives_up_as_unavailable_after_overall_deadline() {
        let (follower, calls) = fake(Some(pb::LeaderHint::default()));
        let addr = serve(follower).await;
        let timeouts = StoreTimeouts {
            attempt: Duration::from_millis(100),
            overall: Duration::from_millis(400),
        };
        let client = StoreClient::new(Seed::parse_list(&addr.to_string()).unwrap(), timeouts).unwrap();
        let started = std::time::Instant::now();
        let err = client.register(pb::RegisterRequest::default()).await.unwrap_err();
        assert!(matches!(err, ControlError::Unavailable { .. }), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(2));
        // Bounded retries with backoff: a handful of attempts, not a spin.
        let n = calls.load(Ordering::SeqCst);
        assert!((2..=20).contains(&n), "{n} attempts");
    }

    #[tokio::test]
    async fn invalid_argument_is_not_retried() {
        let calls = Arc::new(AtomicU64::new(0));
        let addr = serve(Fake {
            hint: None,
            calls: calls.clone(),
            reject: true,
        })
        .await;
        let client = StoreClient::new(Seed::parse_list(&addr.to_string()).unwrap(), quick()).unwrap();
        let err = client.register(pb::RegisterRequest::default()).await.unwrap_err();
        assert!(
            matches!(&err, ControlError::Rejected(s) if s.code() == Code::InvalidArgument),
            "{err:?}"
        );
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn seeds_parse_with_and_without_node_ids() {
        let ok = [
            ("127.0.0.1:5", None, "127.0.0.1:5"),
            ("3=127.0.0.1:5", Some(3), "127.0.0.1:5"),
            (" 2 = localhost:80 ", Some(2), "localhost:80"),
        ];
        for (s, id, addr) in ok {
            let seed = Seed::parse(s).unwrap();
            assert_eq!((seed.node_id, seed.addr.as_str()), (id.map(NodeId), addr), "{s}");
        }
        for bad in [
            "",
            "x=1.2.3.4:5",
            "0=1.2.3.4:5",
            "1.2.3.4",
            "1=",
            "host:notaport",
            ":80",
        ] {
            assert!(Seed::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(Seed::parse_list(" , ").is_err());
        assert_eq!(Seed::parse_list("1=a:1,2=b:2").unwrap().len(), 2);
    }
}
