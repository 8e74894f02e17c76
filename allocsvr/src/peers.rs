//! What the other AllocSvrs say of their own ports: the Redis Cluster port the redirects name
//! (`crate::cluster`) and the direct forwarding port the front ends' hop uses (`crate::hop`); and,
//! asked directly, their set's route table ([`Peers::table_of`]).
//!
//! A peer's answer to the small `FrontInfo` gRPC call, asked on the data-plane address the
//! route table names, is kept for one incarnation of the peer and at most [`PEER_TTL`] (a
//! restarted peer may listen elsewhere). Why a call and not a field of the replicated state or
//! the renewal: the ports are facts of one process, not of the cluster; a call changes nothing
//! stored, reaches peers of every set the same way, and an AllocSvr that predates it answers
//! UNIMPLEMENTED — it then has neither port as far as this node knows. Until an answer is in, a
//! caller acts as if the peer had none (it forwards over gRPC): there is always a way that works.
//!
//! Deliberately left out: any guess of a peer's port.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use seqsvr_proto::{Incarnation, pb};
use tracing::debug;

/// Longest a peer's answer is kept.
pub const PEER_TTL: Duration = Duration::from_secs(5);
/// Longest a `FrontInfo` call may take.
const ASK_TIMEOUT: Duration = Duration::from_secs(1);

/// The ports a peer said it runs (`host:port` as it is reached), `None` where it runs none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ports {
    pub resp_cluster: Option<Arc<str>>,
    pub hop: Option<Arc<str>>,
}

/// What one peer said, for which incarnation, and when.
#[derive(Debug, Clone)]
struct Peer {
    incarnation: Incarnation,
    ports: Ports,
    at: Instant,
    asking: bool,
}

/// The peers' answers, shared by every part of the node that needs a peer's port.
pub struct Peers {
    dialer: seqsvr_client::transport::Dialer,
    known: Arc<Mutex<HashMap<String, Peer>>>,
}

impl Peers {
    pub fn new(tls: Option<Arc<seqsvr_auth::Tls>>) -> Self {
        Self {
            dialer: seqsvr_client::transport::Dialer::with_tls(tls),
            known: Arc::default(),
        }
    }

    /// The ports of the peer at data-plane address `addr` in incarnation `inc`, as far as known
    /// (nothing until it answered); asks it in the background when not known, or when the answer
    /// is old.
    pub fn ports(&self, addr: &str, inc: Incarnation) -> Ports {
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        let entry = known.get_mut(addr);
        let (ports, fresh, asking) = match &entry {
            Some(p) if p.incarnation == inc => (p.ports.clone(), p.at.elapsed() < PEER_TTL, p.asking),
            Some(p) => (Ports::default(), false, p.asking),
            None => (Ports::default(), false, false),
        };
        if !fresh && !asking {
            let marker = Peer {
                incarnation: inc,
                ports: ports.clone(),
                at: entry.as_ref().map_or_else(Instant::now, |p| p.at),
                asking: true,
            };
            match entry {
                Some(p) => *p = marker,
                None => {
                    known.insert(addr.to_owned(), marker);
                }
            }
            self.ask(addr.to_owned(), inc);
        }
        ports
    }

    /// The route table of the set of the AllocSvr at `addr`, when newer than `version`: a read of
    /// uid 0 (it takes no number, and any AllocSvr answers it, owner of uid 0 or not) sent to
    /// that AllocSvr alone, not through the client library (nothing is retried elsewhere, and
    /// nothing counts as a forwarded call).
    pub async fn table_of(&self, addr: &str, version: u64) -> Result<Option<pb::RouteTable>, String> {
        let conn = self.dialer.dial_data(addr, ASK_TIMEOUT)?;
        let mut c = pb::alloc_service_client::AllocServiceClient::new(conn);
        let read = c.get_cur_seq(pb::GetCurSeqRequest {
            uid: 0,
            route_version: version,
        });
        let reply = tokio::time::timeout(ASK_TIMEOUT, read)
            .await
            .map_err(|_| "no answer within a second".to_string())?
            .map_err(|e| e.to_string())?;
        Ok(reply.into_inner().routes)
    }

    /// Asks the peer at `addr` for its ports, and keeps the answer for incarnation `inc`.
    fn ask(&self, addr: String, inc: Incarnation) {
        let conn = self.dialer.dial_data(&addr, ASK_TIMEOUT);
        let known = self.known.clone();
        tokio::spawn(async move {
            let asked = async {
                let mut c = pb::front_info_client::FrontInfoClient::new(conn?);
                let reply = tokio::time::timeout(ASK_TIMEOUT, c.get_front_info(pb::FrontInfoRequest {}))
                    .await
                    .map_err(|_| "no answer within a second".to_string())?
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(reply.into_inner())
            };
            let (ports, seen) = match asked.await {
                // Another incarnation may have answered: what it said is for that one.
                Ok(r) => (ports_of(&r), Incarnation(r.incarnation)),
                Err(e) => {
                    debug!(peer = %addr, error = %e, "a peer did not say where its ports are; forwarding to it over gRPC");
                    (Ports::default(), inc)
                }
            };
            let mut known = known.lock().unwrap_or_else(|e| e.into_inner());
            known.insert(
                addr,
                Peer {
                    incarnation: seen,
                    ports,
                    at: Instant::now(),
                    asking: false,
                },
            );
        });
    }
}

fn ports_of(r: &pb::FrontInfoReply) -> Ports {
    let some = |s: &String| (!s.is_empty()).then(|| Arc::from(s.as_str()));
    Ports {
        resp_cluster: some(&r.resp_cluster_addr),
        hop: some(&r.hop_addr),
    }
}

/// The address a port bound at `bound` is reached at: the data plane's advertised host when it
/// is bound to every interface, else `bound` itself.
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

    #[test]
    fn an_answer_from_a_peer_without_the_hop_field_has_no_hop_port() {
        // What an AllocSvr that predates `hop_addr` sends: fields 1 and 2 only.
        use prost::Message;
        let mut old = Vec::new();
        prost::encoding::string::encode(1, &"10.0.0.5:7000".to_string(), &mut old);
        prost::encoding::uint64::encode(2, &7, &mut old);
        let r = pb::FrontInfoReply::decode(old.as_slice()).unwrap();
        assert_eq!(r.incarnation, 7);
        assert_eq!(
            ports_of(&r),
            Ports {
                resp_cluster: Some(Arc::from("10.0.0.5:7000")),
                hop: None
            }
        );
    }

    #[test]
    fn an_empty_port_in_an_answer_is_no_port() {
        let r = pb::FrontInfoReply {
            resp_cluster_addr: String::new(),
            incarnation: 3,
            hop_addr: "10.0.0.5:7300".into(),
        };
        assert_eq!(
            ports_of(&r),
            Ports {
                resp_cluster: None,
                hop: Some(Arc::from("10.0.0.5:7300"))
            }
        );
    }
}
