//! Raft peer transport: openraft's RPCs as postcard bytes over the gRPC
//! `RaftService`, and the server side of the same service.
//!
//! postcard rather than JSON: the same compact encoding the log uses, and less
//! CPU per replicated entry (measured with `store-bench`, docs/BENCHMARKS.md).
//! Every replica of a group must run the same encoding: there is no version
//! negotiation between peers.
//!
//! Transport failures map to `Unreachable` (openraft backs off) and every RPC
//! honours openraft's hard deadline. A peer is dialled at its advertised
//! address unless `--dial ID=ADDR` says otherwise, which is how the simulator
//! puts a proxy on each directed link.
//!
//! Left out: TLS and authentication of peers.

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
#[derive(Clone, Default)]
pub struct Network {
    /// Address overrides by node id (`--dial`).
    pub dial: Arc<BTreeMap<NodeId, String>>,
    /// Mutual TLS with this replica's `storesvr` certificate; plaintext when unset.
    pub tls: Option<Arc<seqsvr_auth::Tls>>,
}

pub struct PeerClient {
    target: NodeId,
    client: Option<RaftServiceClient<Channel>>,
    addr: String,
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
        PeerClient { target, client, addr }
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
        let mut request = Request::new(RaftPayload { data });
        request.set_timeout(option.hard_ttl());
        let reply = match kind {
            Kind::Append(_) => client.append_entries(request).await,
            Kind::Vote => client.vote(request).await,
            Kind::Snapshot => client.install_snapshot(request).await,
        };
        let reply = reply.map_err(|s| RPCError::Unreachable(Unreachable::new(&TransportError(s.to_string()))))?;
        let result: Result<Resp, RaftError<NodeId, E>> =
            postcard::from_bytes(&reply.into_inner().data).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
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

/// Server side of the peer service: hands each RPC to the local Raft node.
pub struct RaftPeerService {
    pub raft: Raft,
}

fn decode<T: DeserializeOwned>(req: Request<RaftPayload>) -> Result<T, Status> {
    postcard::from_bytes(&req.into_inner().data)
        .map_err(|e| Status::invalid_argument(format!("malformed raft payload: {e}")))
}

fn encode<T: Serialize>(v: &T) -> Result<tonic::Response<RaftPayload>, Status> {
    let data = postcard::to_stdvec(v).map_err(|e| Status::internal(format!("encoding raft reply: {e}")))?;
    Ok(tonic::Response::new(RaftPayload { data }))
}

#[tonic::async_trait]
impl RaftService for RaftPeerService {
    async fn append_entries(&self, req: Request<RaftPayload>) -> Result<tonic::Response<RaftPayload>, Status> {
        let rpc: AppendEntriesRequest<TypeConfig> = decode(req)?;
        encode(&self.raft.append_entries(rpc).await)
    }

    async fn vote(&self, req: Request<RaftPayload>) -> Result<tonic::Response<RaftPayload>, Status> {
        let rpc: VoteRequest<NodeId> = decode(req)?;
        encode(&self.raft.vote(rpc).await)
    }

    async fn install_snapshot(&self, req: Request<RaftPayload>) -> Result<tonic::Response<RaftPayload>, Status> {
        let rpc: InstallSnapshotRequest<TypeConfig> = decode(req)?;
        encode(&self.raft.install_snapshot(rpc).await)
    }
}
