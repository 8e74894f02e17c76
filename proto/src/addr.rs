//! Addresses as every binary and client takes them: `host:port`, and `id=host:port` where a
//! replica's node id goes with its address.
//!
//! One parser for all of them, so that `--store`, `--peers`, `--dial`, `--listen`-style flags and
//! the client's seed lists refuse the same bad input with the same message. Both types implement
//! `FromStr`, which makes them clap value parsers as they are (`#[arg(long)] addr: HostPort`).
//!
//! Deliberately left out: name resolution. A host stays a string until tonic or the OS connects to
//! it, so a name that resolves differently later is followed, and parsing never blocks.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use crate::NodeId;

/// Why an address was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddrError {
    #[error("{0:?} is not host:port")]
    NotHostPort(String),
    #[error("{0:?} is not ID=HOST:PORT with a node id > 0")]
    NotIdAddr(String),
}

/// A `host:port` pair: an IP literal (`[::1]:7000` for IPv6) or a DNS name, and a port > 0.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostPort {
    host: String,
    port: u16,
}

impl HostPort {
    /// The host part as given (brackets kept for IPv6).
    pub fn host(&self) -> &str {
        &self.host
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URI tonic dials: `http://host:port`.
    pub fn uri(&self) -> String {
        format!("http://{self}")
    }

    /// The socket address, when the host is an IP literal (servers bind these).
    pub fn socket_addr(&self) -> Option<SocketAddr> {
        self.to_string().parse().ok()
    }
}

impl FromStr for HostPort {
    type Err = AddrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || AddrError::NotHostPort(s.to_string());
        let (host, port) = s.trim().rsplit_once(':').ok_or_else(bad)?;
        let port: u16 = port.parse().map_err(|_| bad())?;
        let bracketed = host.starts_with('[') && host.ends_with(']') && host.len() > 2;
        // An unbracketed colon means a bare IPv6 address, whose port cannot be told apart.
        let plain = !host.is_empty() && !host.contains(['[', ']', ':', '/', ' ', '@']);
        if port == 0 || !(bracketed || plain) {
            return Err(bad());
        }
        Ok(Self {
            host: host.to_string(),
            port,
        })
    }
}

impl From<SocketAddr> for HostPort {
    fn from(a: SocketAddr) -> Self {
        let host = match a {
            SocketAddr::V4(v4) => v4.ip().to_string(),
            SocketAddr::V6(v6) => format!("[{}]", v6.ip()),
        };
        Self { host, port: a.port() }
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// A node id with its address, written `ID=HOST:PORT` (Raft peers, StoreSvr seeds with ids).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IdAddr {
    pub id: NodeId,
    pub addr: HostPort,
}

impl FromStr for IdAddr {
    type Err = AddrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || AddrError::NotIdAddr(s.to_string());
        let (id, addr) = s.trim().split_once('=').ok_or_else(bad)?;
        let id: u64 = id.trim().parse().map_err(|_| bad())?;
        if id == 0 {
            return Err(bad());
        }
        let addr = addr.parse().map_err(|_| bad())?;
        Ok(Self { id: NodeId(id), addr })
    }
}

impl fmt::Display for IdAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.id, self.addr)
    }
}

/// Checks that no node id appears twice in a list of `ID=HOST:PORT` (the flag is named in the error).
pub fn unique_ids(flag: &str, list: &[IdAddr]) -> Result<(), String> {
    let mut seen = std::collections::BTreeSet::new();
    match list.iter().find(|p| !seen.insert(p.id)) {
        Some(p) => Err(format!("{flag}: node id {} given twice", p.id)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_accepts_names_and_ip_literals() {
        for (s, host, port) in [
            ("127.0.0.1:7000", "127.0.0.1", 7000),
            ("store-1.example:443", "store-1.example", 443),
            ("[::1]:9", "[::1]", 9),
            (" localhost:1 ", "localhost", 1),
        ] {
            let hp: HostPort = s.parse().unwrap();
            assert_eq!((hp.host(), hp.port()), (host, port), "{s}");
            assert_eq!(hp.to_string().parse::<HostPort>().unwrap(), hp);
        }
        let v6: HostPort = "[::1]:9".parse().unwrap();
        assert_eq!(v6.socket_addr(), Some("[::1]:9".parse().unwrap()));
        assert_eq!(v6.uri(), "http://[::1]:9");
        assert_eq!("a:1".parse::<HostPort>().unwrap().socket_addr(), None);
    }

    #[test]
    fn host_port_refuses_what_cannot_be_dialled() {
        for s in [
            "",
            "a",
            ":80",
            "a:",
            "a:0",
            "a:65536",
            "a:x",
            "::1:80",
            "[]:1",
            "http://a:1",
            "a b:1",
        ] {
            let e = s.parse::<HostPort>().unwrap_err();
            assert!(e.to_string().contains("host:port"), "{s}: {e}");
        }
    }

    #[test]
    fn id_addr_needs_a_positive_id_and_an_address() {
        let p: IdAddr = "2=127.0.0.1:7001".parse().unwrap();
        assert_eq!(p.id, NodeId(2));
        assert_eq!(p.to_string(), "2=127.0.0.1:7001");
        for s in ["127.0.0.1:7001", "0=a:1", "x=a:1", "2=nowhere", "=a:1"] {
            assert!(s.parse::<IdAddr>().is_err(), "{s}");
        }
        let twice: Vec<IdAddr> = ["1=a:1", "1=a:2"].iter().map(|s| s.parse().unwrap()).collect();
        assert!(unique_ids("--peers", &twice).unwrap_err().contains("--peers"));
    }

    #[test]
    fn socket_addrs_convert_both_ways() {
        for s in ["10.0.0.1:5", "[fe80::1]:5"] {
            let a: SocketAddr = s.parse().unwrap();
            assert_eq!(HostPort::from(a).socket_addr(), Some(a));
        }
    }
}
