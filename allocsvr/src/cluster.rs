//! The Redis Cluster view of this node (`--resp-cluster-listen`): which AllocSvr serves each hash
//! slot, and where that AllocSvr's cluster-mode Redis port is.
//!
//! A slot's owner is the owner of the section its keys are placed in
//! (`seqsvr_proto::keys::slot_position`), found in the route tables and cluster map the front
//! ends route with (the client library's, so a move or a failover reaches the redirects as soon
//! as it reaches the forwarding). Only a cluster set up with `storesvr --key-placement slots`
//! has slots to redirect by; in any other the cluster commands are refused and every call is
//! forwarded.
//!
//! Where a peer's cluster port is: its answer to the small `FrontInfo` gRPC call, asked on the
//! data-plane address the route table names, kept for one incarnation of the peer and at most
//! [`PEER_TTL`] (a restarted peer may listen elsewhere). Why a call and not a field of the
//! replicated state or the renewal: the port is a fact of one process, not of the cluster; a call
//! changes nothing stored, reaches peers of every set the same way, and an AllocSvr that predates
//! it answers UNIMPLEMENTED — it is then forwarded to, never redirected to. Until an answer is
//! in, a slot of that peer is served here by forwarding, and `CLUSTER SLOTS` names this node for
//! it: a client always has a node that answers.
//!
//! Deliberately left out: replicas (a slot has exactly one owner), and any guess of a peer's port.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use seqsvr_client::{Client, RouteSet};
use seqsvr_frontends::calls::{CallError, ClusterNode, ClusterView, ErrorKind, SlotHome};
use seqsvr_proto::keys::{HASH_SLOTS, KeyPlacement, slot_position};
use seqsvr_proto::pb;
use seqsvr_proto::{Incarnation, Routes, Uid};
use tracing::debug;

use crate::state::AllocState;

/// Longest a peer's answer is kept.
pub const PEER_TTL: Duration = Duration::from_secs(5);
/// How often the view is brought up to date in the background (peers' ports asked before a
/// client asks for them).
const REFRESH: Duration = Duration::from_secs(1);
/// Longest a `FrontInfo` call may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(1);

/// A run of slots `(first, last)` and their owner (data-plane address and incarnation), if any.
type SlotRun = (u16, u16, Option<(String, Incarnation)>);

/// What a peer said of its cluster port.
#[derive(Debug, Clone)]
struct Peer {
    incarnation: Incarnation,
    /// `None`: it runs no cluster port, or predates `FrontInfo`.
    addr: Option<String>,
    at: Instant,
    asking: bool,
}

/// This node's Redis Cluster view, for the front ends ([`crate::front::NodeCalls`]).
pub struct ClusterFront {
    shared: Arc<AllocState>,
    client: Client,
    me: ClusterNode,
    dialer: seqsvr_client::transport::Dialer,
    peers: Arc<Mutex<HashMap<String, Peer>>>,
}

/// Redis's node id of the AllocSvr at data-plane address `addr`: 40 hex digits of its SHA-256,
/// the same on every node.
pub fn node_id(addr: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, addr.as_bytes());
    digest.as_ref()[..20].iter().map(|b| format!("{b:02x}")).collect()
}

/// The owner a route table names for `uid` under its own set, with its incarnation: the table
/// of the set the map gives the section to first, then any (the client library's rule).
fn owner_of(routes: &RouteSet, uid: Uid, section_size: u64) -> Option<(&str, Incarnation)> {
    fn of(t: &Routes, uid: Uid) -> Option<(&str, Incarnation)> {
        let x = t.lookup(uid)?;
        (!x.addr.is_empty() && x.set_id == t.set_id()).then_some((x.addr, x.incarnation))
    }
    let set = routes.map().and_then(|m| m.set_of(uid.section(section_size)));
    let preferred = set.and_then(|s| routes.tables().find(|t| t.set_id() == s));
    preferred
        .and_then(|t| of(t, uid))
        .or_else(|| routes.tables().find_map(|t| of(t, uid)))
}

impl ClusterFront {
    /// The view of the node whose cluster port is `my_cluster_addr` (`host:port`).
    pub fn new(
        shared: Arc<AllocState>,
        client: Client,
        my_cluster_addr: String,
        tls: Option<Arc<seqsvr_auth::Tls>>,
    ) -> Self {
        let me = ClusterNode {
            id: node_id(shared.advertise()),
            addr: my_cluster_addr,
        };
        Self {
            shared,
            client,
            me,
            dialer: seqsvr_client::transport::Dialer::with_tls(tls),
            peers: Arc::default(),
        }
    }

    fn slots_placed(&self) -> Result<(), CallError> {
        match self.shared.key_placement() {
            Some(KeyPlacement::Slots) => Ok(()),
            Some(KeyPlacement::Sha256) => Err(CallError::bad_input(
                "this cluster places counter keys by SHA-256 (chosen at setup: storesvr --key-placement), not by \
                 hash slot, so no node can be named for a slot; use a plain connection (allocsvr --resp-listen), \
                 which forwards every call to its owner",
            )),
            None => Err(CallError::new(
                ErrorKind::Unavailable,
                "the cluster's key placement is not known yet; retry after a pause",
            )),
        }
    }

    /// Hands this node's own route table and map, from its renewals, to the front ends' client
    /// when they are newer than what it has: its own set's owners are then known before any call
    /// was forwarded (two atomic loads when nothing changed).
    fn sync(&self) {
        let set = self.shared.params().set_id;
        let (table, map) = self
            .client
            .with_routes(|r| (r.table(set).map_or(0, |t| t.version()), r.map_version()));
        if self.shared.route_version() > table || self.shared.map_version() > map {
            let (_, routes) = self.shared.routes_for(table, false);
            let (_, map) = self.shared.map_for(Some(map));
            self.client.learn_from(map.as_ref(), routes);
        }
    }

    /// Where `slot` is served, as a cluster-mode connection acts on it.
    pub fn slot_home(&self, slot: u16) -> SlotHome {
        if self.slots_placed().is_err() {
            return SlotHome::Forward;
        }
        self.sync();
        let p = self.shared.params();
        let uid = slot_position(slot, p.uid_limit);
        let owner = self.client.with_routes(|routes| {
            owner_of(routes, uid, p.section_size)
                .map(|(addr, inc)| (addr == self.shared.advertise(), addr.to_owned(), inc))
        });
        match owner {
            Some((true, _, _)) => SlotHome::Here,
            Some((false, addr, inc)) => self
                .peer_port(&addr, inc)
                .map_or(SlotHome::Forward, SlotHome::Elsewhere),
            None => SlotHome::Forward,
        }
    }

    /// Keeps the view fresh until `stop` turns true: every [`REFRESH`], the tables and map synced
    /// and every owner's cluster port asked when not known or old, so that `CLUSTER SLOTS` names
    /// the owners from a node's first seconds on.
    pub fn refresh(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                self.learn_sets().await;
                let _ = self.view();
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => return,
                    () = tokio::time::sleep(REFRESH) => {}
                }
            }
        })
    }

    /// Reads, through the client library, one uid of each set the map gives slots to and whose
    /// route table the front ends have not seen: the reply brings the table, so that its slots
    /// are named and redirected to their owners before a call for them had to be forwarded (a
    /// read takes no number; once per set, the client keeps what it learned).
    async fn learn_sets(&self) {
        let p = self.shared.params();
        let unknown: Vec<Uid> = self.client.with_routes(|routes| {
            let Some(map) = routes.map() else { return Vec::new() };
            let mut seen = std::collections::BTreeMap::new();
            for slot in 0..HASH_SLOTS {
                let uid = slot_position(slot, p.uid_limit);
                if let Some(set) = map.set_of(uid.section(p.section_size)) {
                    seen.entry(set).or_insert(uid);
                }
            }
            seen.into_iter()
                .filter(|(set, _)| routes.table(*set).is_none())
                .map(|(_, uid)| uid)
                .collect()
        });
        for uid in unknown {
            if let Err(e) = self.client.get_cur_seq(uid).await {
                debug!(%uid, error = %e, "could not learn the route table of another set yet");
            }
        }
    }

    /// Every slot's node: its owner when that owner's cluster port is known, else this node.
    pub fn view(&self) -> Result<ClusterView, CallError> {
        self.slots_placed()?;
        self.sync();
        let p = self.shared.params();
        // Runs of slots with one owner, read under the routes (a string per run, not per slot).
        let runs: Vec<SlotRun> = self.client.with_routes(|routes| {
            let mut runs: Vec<SlotRun> = Vec::new();
            for slot in 0..HASH_SLOTS {
                let owner = owner_of(routes, slot_position(slot, p.uid_limit), p.section_size);
                match runs.last_mut() {
                    Some(last) if last.2.as_ref().map(|(a, i)| (a.as_str(), *i)) == owner => last.1 = slot,
                    _ => runs.push((slot, slot, owner.map(|(a, i)| (a.to_owned(), i)))),
                }
            }
            runs
        });
        let mut ranges: Vec<(u16, u16, ClusterNode)> = Vec::new();
        for (first, last, owner) in runs {
            let node = match owner {
                Some((addr, inc)) if addr != self.shared.advertise() => match self.peer_port(&addr, inc) {
                    Some(port) => ClusterNode {
                        id: node_id(&addr),
                        addr: port,
                    },
                    None => self.me.clone(),
                },
                _ => self.me.clone(),
            };
            match ranges.last_mut() {
                Some(prev) if prev.2 == node => prev.1 = last,
                _ => ranges.push((first, last, node)),
            }
        }
        Ok(ClusterView {
            me: self.me.clone(),
            ranges,
            epoch: self.shared.map_version(),
        })
    }

    /// The cluster port of the peer at data-plane address `addr` in incarnation `inc`, when known;
    /// asks it in the background when not, or when the answer is old.
    fn peer_port(&self, addr: &str, inc: Incarnation) -> Option<String> {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        let entry = peers.get_mut(addr);
        let (known, fresh, asking) = match &entry {
            Some(p) if p.incarnation == inc => (p.addr.clone(), p.at.elapsed() < PEER_TTL, p.asking),
            Some(p) => (None, false, p.asking),
            None => (None, false, false),
        };
        if !fresh && !asking {
            let marker = Peer {
                incarnation: inc,
                addr: known.clone(),
                at: entry.as_ref().map_or_else(Instant::now, |p| p.at),
                asking: true,
            };
            match entry {
                Some(p) => *p = marker,
                None => {
                    peers.insert(addr.to_owned(), marker);
                }
            }
            self.ask(addr.to_owned(), inc);
        }
        known
    }

    /// Asks the peer at `addr` for its cluster port, and keeps the answer for incarnation `inc`.
    fn ask(&self, addr: String, inc: Incarnation) {
        let conn = self.dialer.dial_data(&addr, ASK_TIMEOUT);
        let peers = self.peers.clone();
        tokio::spawn(async move {
            let asked = async {
                let mut c = pb::front_info_client::FrontInfoClient::new(conn?);
                let reply = tokio::time::timeout(ASK_TIMEOUT, c.get_front_info(pb::FrontInfoRequest {}))
                    .await
                    .map_err(|_| "no answer within a second".to_string())?
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(reply.into_inner())
            };
            let (port, seen) = match asked.await {
                Ok(r) if r.incarnation == inc.0 => {
                    ((!r.resp_cluster_addr.is_empty()).then_some(r.resp_cluster_addr), inc)
                }
                // Another incarnation answered: what it said is for that one.
                Ok(r) => (
                    (!r.resp_cluster_addr.is_empty()).then_some(r.resp_cluster_addr),
                    Incarnation(r.incarnation),
                ),
                Err(e) => {
                    debug!(peer = %addr, error = %e, "a peer did not say where its cluster port is; forwarding to it");
                    (None, inc)
                }
            };
            let mut peers = peers.lock().unwrap_or_else(|e| e.into_inner());
            peers.insert(
                addr,
                Peer {
                    incarnation: seen,
                    addr: port,
                    at: Instant::now(),
                    asking: false,
                },
            );
        });
    }
}

/// The `FrontInfo` service: this node's cluster port, for its peers.
pub struct FrontInfoSvc {
    shared: Arc<AllocState>,
    resp_cluster_addr: String,
}

impl FrontInfoSvc {
    pub fn new(shared: Arc<AllocState>, resp_cluster_addr: Option<String>) -> Self {
        Self {
            shared,
            resp_cluster_addr: resp_cluster_addr.unwrap_or_default(),
        }
    }
}

#[tonic::async_trait]
impl pb::front_info_server::FrontInfo for FrontInfoSvc {
    async fn get_front_info(
        &self,
        _req: tonic::Request<pb::FrontInfoRequest>,
    ) -> Result<tonic::Response<pb::FrontInfoReply>, tonic::Status> {
        Ok(tonic::Response::new(pb::FrontInfoReply {
            resp_cluster_addr: self.resp_cluster_addr.clone(),
            incarnation: self.shared.incarnation().0,
        }))
    }
}

/// A bound cluster port and the address it is reached at.
pub struct Port {
    pub listener: tokio::net::TcpListener,
    pub bound: std::net::SocketAddr,
    pub advertised: String,
}

/// Binds `--resp-cluster-listen`, if given, for a node whose data plane is reached at
/// `data_plane`.
pub async fn bind(at: Option<std::net::SocketAddr>, data_plane: &str) -> std::io::Result<Option<Port>> {
    let Some(at) = at else { return Ok(None) };
    let listener = tokio::net::TcpListener::bind(at).await?;
    let bound = listener.local_addr()?;
    Ok(Some(Port {
        listener,
        bound,
        advertised: advertised(bound, data_plane),
    }))
}

/// Serves the Redis Cluster protocol on `port` until `stop` turns true: the Redis front end's
/// settings (`--resp-password`, idle timeout, TLS) in cluster mode.
pub fn serve<C: seqsvr_frontends::calls::Calls>(
    port: Port,
    cfg: &crate::config::FrontConfig,
    calls: Arc<C>,
    tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tracing::info!(addr = %port.bound, advertised = %port.advertised, "Redis Cluster front end listening");
    let rc = seqsvr_frontends::resp::RespConfig {
        password: cfg.resp_password.clone(),
        idle_timeout: cfg.resp_idle_timeout,
        max_unauthenticated: cfg.resp_max_unauthenticated,
        tls,
        cluster: true,
        ..seqsvr_frontends::resp::RespConfig::default()
    };
    tokio::spawn(seqsvr_frontends::resp::serve(port.listener, calls, Arc::new(rc), stop))
}

/// The address a cluster port bound at `bound` is reached at: the data plane's advertised host
/// when it is bound to every interface, else `bound` itself.
pub fn advertised(bound: std::net::SocketAddr, data_plane: &str) -> String {
    if !bound.ip().is_unspecified() {
        return bound.to_string();
    }
    let host = data_plane.rsplit_once(':').map_or(data_plane, |(h, _)| h);
    format!("{host}:{}", bound.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_are_forty_hex_digits_of_the_address() {
        let id = node_id("127.0.0.1:7100");
        assert_eq!(id.len(), 40);
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(id, node_id("127.0.0.1:7100"));
        assert_ne!(id, node_id("127.0.0.1:7101"));
    }

    #[test]
    fn a_port_on_every_interface_is_advertised_at_the_data_planes_host() {
        assert_eq!(
            advertised("0.0.0.0:7000".parse().unwrap(), "10.0.0.5:7100"),
            "10.0.0.5:7000"
        );
        assert_eq!(
            advertised("127.0.0.1:7000".parse().unwrap(), "10.0.0.5:7100"),
            "127.0.0.1:7000"
        );
    }
}
