//! A `StoreService` client that finds the StoreSvr Raft leader by itself.
//!
//! Writes and linearizable reads (Register, Renew, Release, Bump, Load) must reach the leader of
//! the set's Raft group. [`StoreClient`] keeps one lazily connected tonic `Channel` per StoreSvr
//! address, remembers which one answered as leader last, and on a reply carrying `not_leader`
//! follows the hint: to the *configured* address of the hinted node id when it knows that id
//! (the simulator puts proxies in front of every StoreSvr, so the hint's own `leader_addr` would
//! bypass them), else to `leader_addr`, else to the next seed after a jittered backoff. Transport
//! errors and timeouts rotate to the next seed the same way.
//!
//! Every attempt has its own deadline and the whole call has an overall deadline; when the overall
//! deadline passes the call fails with [`StoreError::Unavailable`]. A reply that says the request
//! itself is wrong (`INVALID_ARGUMENT`, `FAILED_PRECONDITION`, ...) is returned at once as
//! [`StoreError::Rejected`]: sending it elsewhere would not change the answer.
//!
//! Retries are safe for the callers in this project because every StoreService write is
//! idempotent or harmless when repeated: a Bump is retried with the same `new_max` (DESIGN.md §4
//! rule 6), a Release names the epoch of each section and releases nothing once that grant is
//! over, and a repeated Register carries the same nonce and gets the same incarnation back. Note that [`StoreError::Unavailable`] does
//! *not* mean "did not happen": the last attempt may have been applied.
//!
//! Deliberately left out: connection pooling beyond one channel per address, request hedging, and
//! any knowledge of what the replies mean.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use seqsvr_proto::pb;
use seqsvr_proto::pb::store_service_client::StoreServiceClient;
use seqsvr_proto::{NodeId, limits};
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Response, Status};

/// Most addresses learnt from hints that are kept beside the seeds; bounds memory when hints
/// point at ever new addresses.
const MAX_LEARNT_ADDRS: usize = 8;
/// First backoff after a seed failed or the leader was unknown.
const BACKOFF_MIN: Duration = Duration::from_millis(20);
/// Upper bound of the backoff between rounds.
const BACKOFF_MAX: Duration = Duration::from_millis(500);
/// Hints followed in a row without backoff before the client starts to back off (stops a tight
/// ping-pong between two replicas that both believe the other one leads).
const FREE_HOPS: u32 = 3;

/// Why a StoreService call failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No leader answered before the overall deadline. The outcome of a write is unknown.
    #[error("store unavailable: {last}")]
    Unavailable {
        /// What the last attempt saw, for logs.
        last: String,
    },
    /// The store refused the request itself; resending it anywhere would not help.
    #[error("store rejected the request: {0}")]
    Rejected(Status),
}

/// One StoreSvr address as configured: `addr` or `id=addr`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seed {
    /// StoreSvr node id, when the operator named it; lets hints map to this address.
    pub node_id: Option<NodeId>,
    /// `host:port` (no scheme).
    pub addr: String,
}

impl Seed {
    /// Parses `host:port` or `id=host:port`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let (node_id, addr) = match s.split_once('=') {
            Some((id, addr)) => {
                let id: u64 = id
                    .trim()
                    .parse()
                    .map_err(|_| format!("store seed {s:?}: node id {id:?} is not a number"))?;
                if id == 0 {
                    return Err(format!("store seed {s:?}: node id must be > 0"));
                }
                (Some(NodeId(id)), addr.trim())
            }
            None => (None, s),
        };
        if addr.is_empty() {
            return Err(format!("store seed {s:?}: empty address"));
        }
        let (host, port) = addr
            .rsplit_once(':')
            .ok_or_else(|| format!("store seed {s:?}: expected host:port"))?;
        if host.is_empty() || port.parse::<u16>().is_err() {
            return Err(format!("store seed {s:?}: expected host:port"));
        }
        Ok(Self {
            node_id,
            addr: addr.to_string(),
        })
    }

    /// Parses a comma-separated list of seeds; at least one is required.
    pub fn parse_list(s: &str) -> Result<Vec<Self>, String> {
        let seeds: Vec<Seed> = s
            .split(',')
            .filter(|p| !p.trim().is_empty())
            .map(Seed::parse)
            .collect::<Result<_, _>>()?;
        if seeds.is_empty() {
            return Err("no store address given".into());
        }
        Ok(seeds)
    }
}

/// Deadlines of a [`StoreClient`].
#[derive(Debug, Clone, Copy)]
pub struct StoreTimeouts {
    /// Longest wait for one reply from one replica.
    pub attempt: Duration,
    /// Longest time one call may take across all attempts.
    pub overall: Duration,
}

impl Default for StoreTimeouts {
    fn default() -> Self {
        Self {
            attempt: Duration::from_secs(1),
            overall: Duration::from_secs(5),
        }
    }
}

struct Target {
    node_id: Option<NodeId>,
    addr: String,
    channel: Channel,
}

struct Shared {
    /// Seeds first (in configured order), then addresses learnt from hints.
    targets: Mutex<Vec<Target>>,
    seed_count: usize,
    /// Index into `targets` of the replica believed to lead.
    leader: AtomicUsize,
}

/// Client of the StoreService of one set; cheap to clone (clones share channels and the
/// believed leader).
#[derive(Clone)]
pub struct StoreClient {
    shared: Arc<Shared>,
    timeouts: StoreTimeouts,
}

impl std::fmt::Debug for StoreClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let targets = self.shared.targets.lock().unwrap();
        let addrs: Vec<&str> = targets.iter().map(|t| t.addr.as_str()).collect();
        f.debug_struct("StoreClient")
            .field("targets", &addrs)
            .field("leader", &self.shared.leader.load(Ordering::Relaxed))
            .field("timeouts", &self.timeouts)
            .finish()
    }
}

fn lazy_channel(addr: &str, timeouts: StoreTimeouts) -> Result<Channel, String> {
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| format!("bad store address {addr:?}: {e}"))?
        .connect_timeout(timeouts.attempt)
        .tcp_nodelay(true);
    Ok(endpoint.connect_lazy())
}

impl StoreClient {
    /// Creates a client over the given seeds; no connection is made until the first call.
    pub fn new(seeds: Vec<Seed>, timeouts: StoreTimeouts) -> Result<Self, String> {
        if seeds.is_empty() {
            return Err("no store address given".into());
        }
        let mut targets = Vec::with_capacity(seeds.len());
        for seed in seeds {
            let channel = lazy_channel(&seed.addr, timeouts)?;
            targets.push(Target {
                node_id: seed.node_id,
                addr: seed.addr,
                channel,
            });
        }
        let seed_count = targets.len();
        Ok(Self {
            shared: Arc::new(Shared {
                targets: Mutex::new(targets),
                seed_count,
                leader: AtomicUsize::new(0),
            }),
            timeouts,
        })
    }

    /// The same client (shared channels and leader) with other deadlines, e.g. a short one for
    /// lease renewals.
    pub fn with_timeouts(&self, timeouts: StoreTimeouts) -> Self {
        Self {
            shared: self.shared.clone(),
            timeouts,
        }
    }

    /// The deadlines this handle uses.
    pub fn timeouts(&self) -> StoreTimeouts {
        self.timeouts
    }

    /// Address of the replica currently believed to lead (for logs and tests).
    pub fn believed_leader(&self) -> String {
        let targets = self.shared.targets.lock().unwrap();
        let i = self.shared.leader.load(Ordering::Relaxed).min(targets.len() - 1);
        targets[i].addr.clone()
    }

    /// Registers an AllocSvr process: a fresh incarnation and the set's parameters.
    pub async fn register(&self, req: pb::RegisterRequest) -> Result<pb::RegisterReply, StoreError> {
        self.call(req).await
    }

    /// Renews the lease of an incarnation and reads its grants.
    pub async fn renew(&self, req: pb::RenewRequest) -> Result<pb::RenewReply, StoreError> {
        self.call(req).await
    }

    /// Gives sections up so that their next owner need not wait a lease.
    pub async fn release(&self, req: pb::ReleaseRequest) -> Result<pb::ReleaseReply, StoreError> {
        self.call(req).await
    }

    /// Fenced raise of sections' `max_seq`.
    pub async fn bump(&self, req: pb::BumpRequest) -> Result<pb::BumpReply, StoreError> {
        self.call(req).await
    }

    /// Linearizable read of sections' `max_seq`, epoch and owner.
    pub async fn load(&self, req: pb::LoadRequest) -> Result<pb::LoadReply, StoreError> {
        self.call(req).await
    }

    /// The current route table (any replica answers from local state).
    pub async fn get_routes(&self) -> Result<pb::GetRoutesReply, StoreError> {
        self.call(pb::GetRoutesRequest {}).await
    }

    /// Cluster status as seen by the replica that answers (the believed leader first).
    pub async fn status(&self) -> Result<pb::StatusReply, StoreError> {
        self.call(pb::StatusRequest {}).await
    }

    fn channel_at(&self, i: usize) -> (usize, Channel) {
        let targets = self.shared.targets.lock().unwrap();
        let i = i % targets.len();
        (i, targets[i].channel.clone())
    }

    /// Where to go after a `not_leader` hint: `None` when the hint names no usable replica.
    fn follow_hint(&self, hint: &pb::LeaderHint) -> Option<usize> {
        let mut targets = self.shared.targets.lock().unwrap();
        if hint.leader_id != 0
            && let Some(i) = targets.iter().position(|t| t.node_id == Some(NodeId(hint.leader_id)))
        {
            return Some(i);
        }
        if hint.leader_addr.is_empty() {
            return None;
        }
        if let Some(i) = targets.iter().position(|t| t.addr == hint.leader_addr) {
            return Some(i);
        }
        let channel = lazy_channel(&hint.leader_addr, self.timeouts).ok()?;
        let target = Target {
            node_id: (hint.leader_id != 0).then_some(NodeId(hint.leader_id)),
            addr: hint.leader_addr.clone(),
            channel,
        };
        if targets.len() < self.shared.seed_count + MAX_LEARNT_ADDRS {
            targets.push(target);
            Some(targets.len() - 1)
        } else {
            // Replace the oldest learnt address (round robin over the learnt slots).
            let slot = self.shared.seed_count + (targets.len() % MAX_LEARNT_ADDRS.max(1));
            let slot = slot.min(targets.len() - 1);
            targets[slot] = target;
            Some(slot)
        }
    }

    /// The next seed after `i` (learnt addresses are skipped: they were tried through a hint).
    fn next_seed(&self, i: usize) -> usize {
        (i + 1) % self.shared.seed_count
    }

    async fn call<R: StoreCall>(&self, req: R) -> Result<R::Reply, StoreError> {
        let deadline = Instant::now() + self.timeouts.overall;
        let mut backoff = BACKOFF_MIN;
        let mut hops = 0u32;
        let mut i = self.shared.leader.load(Ordering::Relaxed);
        let mut last = String::from("no attempt made");
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Err(StoreError::Unavailable { last });
            }
            let attempt = self.timeouts.attempt.min(deadline - now);
            let (idx, channel) = self.channel_at(i);
            i = idx;
            let mut request = Request::new(req.clone());
            request.set_timeout(attempt);
            // The StoreSvr's own limits, both ways: a reply it may send is one this client decodes.
            let client = StoreServiceClient::new(channel)
                .max_decoding_message_size(limits::STORE_MESSAGE_BYTES)
                .max_encoding_message_size(limits::STORE_MESSAGE_BYTES);
            let result = tokio::time::timeout(attempt, R::send(client, request)).await;
            let retry_at = match result {
                Ok(Ok(reply)) => {
                    let reply = reply.into_inner();
                    match R::hint(&reply) {
                        None => {
                            self.shared.leader.store(i, Ordering::Relaxed);
                            return Ok(reply);
                        }
                        Some(hint) => {
                            last = format!(
                                "{} is not the leader (hint: id {} addr {:?})",
                                self.describe(i),
                                hint.leader_id,
                                hint.leader_addr
                            );
                            match self.follow_hint(hint) {
                                Some(next) if next != i && hops < FREE_HOPS => {
                                    hops += 1;
                                    i = next;
                                    continue;
                                }
                                Some(next) if next != i => next,
                                _ => self.next_seed(i),
                            }
                        }
                    }
                }
                Ok(Err(status)) if is_rejection(status.code()) => return Err(StoreError::Rejected(status)),
                Ok(Err(status)) => {
                    last = format!("{}: {}", self.describe(i), status);
                    self.next_seed(i)
                }
                Err(_) => {
                    last = format!("{}: no reply within {attempt:?}", self.describe(i));
                    self.next_seed(i)
                }
            };
            tracing::debug!(%last, "store call retrying");
            i = retry_at;
            let jittered = rand::rng().random_range(backoff / 2..=backoff);
            let sleep_until = (Instant::now() + jittered).min(deadline);
            tokio::time::sleep_until(sleep_until).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    fn describe(&self, i: usize) -> String {
        let targets = self.shared.targets.lock().unwrap();
        targets.get(i).map(|t| t.addr.clone()).unwrap_or_default()
    }
}

/// Codes that say the request is wrong or refused for good; everything else (unavailable,
/// deadline, cancelled, internal, unknown) may be a passing fault of one replica.
fn is_rejection(code: Code) -> bool {
    matches!(
        code,
        Code::InvalidArgument
            | Code::FailedPrecondition
            | Code::OutOfRange
            | Code::NotFound
            | Code::AlreadyExists
            | Code::PermissionDenied
            | Code::Unauthenticated
            | Code::Unimplemented
    )
}

/// One StoreService RPC: how to send it and where its reply says "not the leader".
trait StoreCall: Clone + Send + Sync + 'static {
    type Reply: Send;
    fn send(
        client: StoreServiceClient<Channel>,
        req: Request<Self>,
    ) -> impl Future<Output = Result<Response<Self::Reply>, Status>> + Send;
    fn hint(reply: &Self::Reply) -> Option<&pb::LeaderHint>;
}

macro_rules! store_call {
    ($req:ty, $reply:ty, $method:ident, with_hint) => {
        store_call!($req, $reply, $method, |r: &$reply| r.not_leader.as_ref());
    };
    ($req:ty, $reply:ty, $method:ident, $hint:expr) => {
        impl StoreCall for $req {
            type Reply = $reply;
            fn send(
                mut client: StoreServiceClient<Channel>,
                req: Request<Self>,
            ) -> impl Future<Output = Result<Response<Self::Reply>, Status>> + Send {
                async move { client.$method(req).await }
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
store_call!(pb::GetRoutesRequest, pb::GetRoutesReply, get_routes, |_| None);
store_call!(pb::StatusRequest, pb::StatusReply, status, |_| None);

#[cfg(test)]
mod tests {
    use super::*;
    use pb::store_service_server::{StoreService, StoreServiceServer};
    use std::net::SocketAddr;
    use std::sync::atomic::AtomicU64;

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
        assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
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
            matches!(&err, StoreError::Rejected(s) if s.code() == Code::InvalidArgument),
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
