//! Raft peer transport: openraft's RPCs as postcard bytes over the gRPC
//! `RaftService`, and the server side of the same service.
//!
//! postcard rather than JSON: the same compact encoding the log uses, and less
//! CPU per replicated entry (measured with `store-bench`, docs/journal/benchmarks-2026-11.md).
//! Every replica of a group must run the same encoding: there is no version
//! negotiation between peers.
//!
//! Transport failures map to `Unreachable` (openraft backs off) and every RPC
//! honours openraft's hard deadline. A peer is dialled at its advertised
//! address unless `--dial ID=ADDR` says otherwise, which is how the simulator
//! puts a proxy on each directed link.
//!
//! Every request and reply is stamped with its sender's set, group and node, and checked on
//! arrival before openraft sees it (see `identity`): traffic of another group is refused as if
//! the peer were unreachable.
//!
//! Every reply also carries the answering replica's wall clock in a header (`clocks`), which the
//! leader compares with its own.
//!
//! The same service carries `Campaign`, a stopping leader's request that a follower start an
//! election at once (`handoff`).
//!
//! Left out: authentication of peers (mTLS's role check does that, see `seqsvr_auth`).

use crate::raft::clocks::{CLOCK_HEADER, PeerClocks};
use crate::raft::handoff::CampaignRequest;
use crate::raft::identity::{Carries, Identity};
use crate::raft::types::{Node, NodeId, Raft, TypeConfig};
use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use seqsvr_proto::pb::RaftPayload;
use seqsvr_proto::pb::raft_service_client::RaftServiceClient;
use seqsvr_proto::pb::raft_service_server::RaftService;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::sync::Arc;
use tonic::transport::Channel;
use tonic::{Request, Status};

/// Largest gRPC message between peers, both ends: the shared table's value (it holds one entry of
/// the writer's byte cap with its framing; larger AppendEntries are split, see `append_entries`).
pub const MAX_PEER_MESSAGE: usize = seqsvr_proto::limits::PEER_MESSAGE_BYTES;
/// gRPC frame and protobuf framing around a payload of postcard bytes.
const PAYLOAD_FRAMING: usize = 16;

/// Creates one client per peer.
#[derive(Clone)]
pub struct Network {
    /// Address overrides by node id (`--dial`).
    pub dial: Arc<BTreeMap<NodeId, String>>,
    /// Mutual TLS with this replica's `storesvr` certificate; plaintext when unset.
    pub tls: Option<Arc<seqsvr_auth::Tls>>,
    /// What every message is stamped with and checked against.
    pub identity: Arc<Identity>,
    /// Where the followers' wall clocks, read off their replies, are kept (`clocks`).
    pub clocks: Arc<PeerClocks>,
}

pub struct PeerClient {
    target: NodeId,
    client: Option<RaftServiceClient<Channel>>,
    addr: String,
    identity: Arc<Identity>,
    clocks: Arc<PeerClocks>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &Node) -> PeerClient {
        let addr = self.dial.get(&target).cloned().unwrap_or_else(|| node.addr.clone());
        let client = seqsvr_auth::endpoint(&addr, self.tls.as_deref()).ok().map(|e| {
            let channel = e
                .connect_timeout(std::time::Duration::from_millis(500))
                .tcp_nodelay(true)
                .connect_lazy();
            RaftServiceClient::new(channel)
                .max_decoding_message_size(MAX_PEER_MESSAGE)
                .max_encoding_message_size(MAX_PEER_MESSAGE)
        });
        PeerClient {
            target,
            client,
            addr,
            identity: self.identity.clone(),
            clocks: self.clocks.clone(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct TransportError(String);

type RpcErr<E> = RPCError<NodeId, Node, RaftError<NodeId, E>>;

impl PeerClient {
    async fn call<Req, Resp, E>(&mut self, kind: Kind, req: &Req, option: &RPCOption) -> Result<Resp, RpcErr<E>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let Some(client) = self.client.as_mut() else {
            return Err(RPCError::Unreachable(Unreachable::new(&TransportError(format!(
                "bad address {}",
                self.addr
            )))));
        };
        let data = postcard::to_stdvec(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        if data.len() + PAYLOAD_FRAMING > MAX_PEER_MESSAGE {
            return Err(match kind {
                // openraft sends up to `max_payload_entries` entries at once; when together they
                // pass the limit, ask for half as many (openraft retries at once with the hint).
                // One entry always fits: the writer caps its bytes (see `seqsvr_proto::limits`).
                Kind::Append(entries) if entries > 1 => {
                    RPCError::PayloadTooLarge(PayloadTooLarge::new_entries_hint(entries / 2))
                }
                _ => RPCError::Unreachable(Unreachable::new(&TransportError(format!(
                    "a {}-byte peer message passes the {MAX_PEER_MESSAGE}-byte limit",
                    data.len()
                )))),
            });
        }
        let payload = self.identity.stamp(
            RaftPayload {
                data,
                ..Default::default()
            },
            self.target,
        );
        let mut request = Request::new(payload);
        request.set_timeout(option.hard_ttl());
        let (sent, sent_ms) = (std::time::Instant::now(), crate::config::unix_now_ms());
        let reply = match kind {
            Kind::Append(_) => client.append_entries(request).await,
            Kind::Vote => client.vote(request).await,
            Kind::Snapshot => client.install_snapshot(request).await,
        };
        let reply = reply.map_err(|s| RPCError::Unreachable(Unreachable::new(&TransportError(s.to_string()))))?;
        if let Some(peer_ms) = reply
            .metadata()
            .get(CLOCK_HEADER)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        {
            self.clocks.record(self.target, sent, sent_ms, peer_ms);
        }
        let reply = reply.into_inner();
        // A reply of another group is no reply: openraft backs off as from an unreachable peer.
        self.identity
            .check_reply(&reply, self.target)
            .map_err(|why| RPCError::Unreachable(Unreachable::new(&TransportError(why))))?;
        let result: Result<Resp, RaftError<NodeId, E>> =
            postcard::from_bytes(&reply.data).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

#[derive(Clone, Copy)]
enum Kind {
    /// With the number of entries carried.
    Append(u64),
    Vote,
    Snapshot,
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcErr<openraft::error::Infallible>> {
        self.call(Kind::Append(rpc.entries.len() as u64), &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RpcErr<InstallSnapshotError>> {
        self.call(Kind::Snapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RpcErr<openraft::error::Infallible>> {
        self.call(Kind::Vote, &rpc, &option).await
    }
}

/// Server side of the peer service: checks each RPC's stamp, then hands it to the local Raft node.
pub struct RaftPeerService {
    pub raft: Raft,
    pub identity: Arc<Identity>,
}

impl RaftPeerService {
    /// The request's openraft payload, once its stamp is this group's.
    fn admit<T: DeserializeOwned>(&self, req: Request<RaftPayload>, carries: Carries) -> Result<T, Status> {
        let payload = req.into_inner();
        self.identity
            .admit(&payload, carries)
            .map_err(Status::failed_precondition)?;
        postcard::from_bytes(&payload.data)
            .map_err(|e| Status::invalid_argument(format!("malformed raft payload: {e}")))
    }

    fn encode<T: Serialize>(&self, v: &T) -> Result<tonic::Response<RaftPayload>, Status> {
        let data = postcard::to_stdvec(v).map_err(|e| Status::internal(format!("encoding raft reply: {e}")))?;
        let reply = self.identity.stamp(
            RaftPayload {
                data,
                ..Default::default()
            },
            0,
        );
        let mut reply = tonic::Response::new(reply);
        // The answering replica's wall clock, for the leader's comparison of clocks (`clocks`).
        reply.metadata_mut().insert(
            CLOCK_HEADER,
            tonic::metadata::AsciiMetadataValue::from(crate::config::unix_now_ms()),
        );
        Ok(reply)
    }
}

#[tonic::async_trait]
impl RaftService for RaftPeerService {
    async fn append_entries(&self, req: Request<RaftPayload>) -> Result<tonic::Response<RaftPayload>, Status> {
        let rpc: AppendEntriesRequest<TypeConfig> = self.admit(req, Carries::Entries)?;
        self.encode(&self.raft.append_entries(rpc).await)
    }

    async fn vote(&self, req: Request<RaftPayload>) -> Result<tonic::Response<RaftPayload>, Status> {
        let rpc: VoteRequest<NodeId> = self.admit(req, Carries::Vote)?;
        self.encode(&self.raft.vote(rpc).await)
    }

    async fn install_snapshot(&self, req: Request<RaftPayload>) -> Result<tonic::Response<RaftPayload>, Status> {
        let rpc: InstallSnapshotRequest<TypeConfig> = self.admit(req, Carries::Entries)?;
        self.encode(&self.raft.install_snapshot(rpc).await)
    }

    async fn campaign(&self, req: Request<RaftPayload>) -> Result<tonic::Response<RaftPayload>, Status> {
        let rpc: CampaignRequest = self.admit(req, Carries::Vote)?;
        crate::raft::handoff::campaign(&self.raft, &rpc)
            .await
            .map_err(Status::failed_precondition)?;
        self.encode(&())
    }
}
