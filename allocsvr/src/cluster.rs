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
//! Where a peer's cluster port is: what it said ([`crate::peers`]). Until an answer is in, a slot
//! of that peer is served here by forwarding, and `CLUSTER SLOTS` names this node for it: a client
//! always has a node that answers.
//!
//! Deliberately left out: replicas (a slot has exactly one owner), and any guess of a peer's port.

use std::sync::Arc;
use std::time::Duration;

use seqsvr_client::{Client, RouteSet};
use seqsvr_frontends::calls::{CallError, ClusterNode, ClusterView, ErrorKind, SlotHome};
use seqsvr_proto::keys::{HASH_SLOTS, KeyPlacement, slot_position};
use seqsvr_proto::pb;
use seqsvr_proto::{Incarnation, Routes, Uid};
use tracing::debug;

use crate::peers::Peers;
use crate::state::AllocState;

/// How often the view is brought up to date in the background (peers' ports asked before a
/// client asks for them).
const REFRESH: Duration = Duration::from_secs(1);

/// A run of slots `(first, last)` and their owner (data-plane address and incarnation), if any.
type SlotRun = (u16, u16, Option<(String, Incarnation)>);

/// This node's Redis Cluster view, for the front ends ([`crate::front::NodeCalls`]).
pub struct ClusterFront {
    shared: Arc<AllocState>,
    client: Client,
    me: ClusterNode,
    peers: Arc<Peers>,
}

/// Redis's node id of the AllocSvr at data-plane address `addr`: 40 hex digits of its SHA-256,
/// the same on every node.
pub fn node_id(addr: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, addr.as_bytes());
    digest.as_ref()[..20].iter().map(|b| format!("{b:02x}")).collect()
}

/// The owner a route table names for `uid` under its own set, with its incarnation: the table
/// of the set the map gives the section to first, then any (the client library's rule).
pub(crate) fn owner_of(routes: &RouteSet, uid: Uid, section_size: u64) -> Option<(&str, Incarnation)> {
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
    pub fn new(shared: Arc<AllocState>, client: Client, my_cluster_addr: String, peers: Arc<Peers>) -> Self {
        let me = ClusterNode {
            id: node_id(shared.advertise()),
            addr: my_cluster_addr,
        };
        Self {
            shared,
            client,
            me,
            peers,
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
            for tick in 0usize.. {
                self.learn_sets().await;
                self.refresh_tables(tick).await;
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

    /// Brings the other sets' route tables up to date: each tick, one AllocSvr of each other set
    /// the client library has a table of (the next one each tick, so a dead one is passed over)
    /// is asked for its set's table when newer than ours. Without it, a table here is renewed
    /// only by a call that went through this node to that set: after a failover there, this
    /// node would go on naming the dead owner's slots as its own, and forwarding their calls,
    /// for as long as no such call came.
    async fn refresh_tables(&self, tick: usize) {
        let own = self.shared.params().set_id;
        let asks: Vec<(String, u64)> = self.client.with_routes(|routes| {
            routes
                .tables()
                .filter(|t| t.set_id() != own)
                .filter_map(|t| {
                    let mut addrs: Vec<&str> = t.entries().iter().map(|e| e.addr.as_str()).collect();
                    addrs.retain(|a| !a.is_empty());
                    addrs.sort_unstable();
                    addrs.dedup();
                    let addr = addrs.get(tick % addrs.len().max(1))?;
                    Some((addr.to_string(), t.version()))
                })
                .collect()
        });
        let asked = asks.into_iter().map(|(addr, version)| async move {
            match self.peers.table_of(&addr, version).await {
                Ok(table) => {
                    self.client.learn_from(None, table);
                }
                Err(e) => debug!(peer = %addr, error = %e, "could not ask a peer for its set's route table"),
            }
        });
        futures::future::join_all(asked).await;
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
}

impl ClusterFront {
    /// The cluster port of the peer at data-plane address `addr` in incarnation `inc`, when known.
    fn peer_port(&self, addr: &str, inc: Incarnation) -> Option<String> {
        self.peers.ports(addr, inc).resp_cluster.map(|p| p.to_string())
    }
}

/// The `FrontInfo` service: this node's cluster port and direct forwarding port, for its peers.
pub struct FrontInfoSvc {
    shared: Arc<AllocState>,
    resp_cluster_addr: String,
    hop_addr: String,
}

impl FrontInfoSvc {
    pub fn new(shared: Arc<AllocState>, resp_cluster_addr: Option<String>, hop_addr: Option<String>) -> Self {
        Self {
            shared,
            resp_cluster_addr: resp_cluster_addr.unwrap_or_default(),
            hop_addr: hop_addr.unwrap_or_default(),
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
            hop_addr: self.hop_addr.clone(),
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
        advertised: crate::peers::advertised(bound, data_plane),
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
}
