//! The client's view of who owns what: the cached route table and one gRPC channel per owner address.
//!
//! The route table is replaced only by a strictly newer, valid one (servers embed theirs in replies when
//! the caller's version is older), so a late reply carrying an old table cannot move the client back.
//! Readers take a cheap `Arc` clone under a read lock and never hold the lock across an `.await`.
//!
//! Deliberately left out: learning routes from StoreSvr. The data plane hands tables out on demand,
//! which keeps the client independent of the control plane.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use seqsvr_proto::{Routes, Uid, pb};
use tonic::transport::{Channel, Endpoint};

use crate::error::{ClientError, FailureKind};

/// The latest valid route table seen, if any.
#[derive(Debug, Default)]
pub(crate) struct RouteCache {
    current: RwLock<Option<Arc<Routes>>>,
}

impl RouteCache {
    pub(crate) fn get(&self) -> Option<Arc<Routes>> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Installs `table` when it is valid and newer than the cached one; true when it did.
    pub(crate) fn offer(&self, table: Option<pb::RouteTable>) -> bool {
        let Some(table) = table else { return false };
        if table.version <= self.get().map_or(0, |r| r.version()) {
            return false;
        }
        let routes = match Routes::new(table) {
            Ok(r) => Arc::new(r),
            Err(e) => {
                tracing::warn!(error = %e, "ignoring a malformed route table from a server");
                return false;
            }
        };
        let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
        // Checked again under the write lock: another reply may have installed a newer table meanwhile.
        if current.as_ref().is_some_and(|c| c.version() >= routes.version()) {
            return false;
        }
        tracing::info!(version = routes.version(), "route table updated");
        *current = Some(routes);
        true
    }
}

/// Where to send a request for one uid.
pub(crate) fn target_addr(routes: Option<&Routes>, uid: Uid, seeds: &Seeds) -> Result<String, ClientError> {
    let Some(routes) = routes else {
        return Ok(seeds.next().to_owned());
    };
    match routes.lookup(uid) {
        None => Err(ClientError::failed(
            FailureKind::InvalidArgument,
            format!("uid {uid} is outside [0, {})", routes.uid_limit()),
        )),
        // The section is being reassigned: ask a seed, whose reply carries any newer table.
        Some(t) if t.addr.is_empty() => Ok(seeds.next().to_owned()),
        Some(t) => Ok(t.addr.to_owned()),
    }
}

/// Seed addresses, handed out round-robin so that one dead seed does not stall every retry.
#[derive(Debug)]
pub(crate) struct Seeds {
    addrs: Vec<String>,
    next: AtomicUsize,
}

impl Seeds {
    pub(crate) fn new(addrs: Vec<String>) -> Self {
        assert!(!addrs.is_empty(), "validated config has seeds");
        Self {
            addrs,
            next: AtomicUsize::new(0),
        }
    }

    pub(crate) fn next(&self) -> &str {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        &self.addrs[i % self.addrs.len()]
    }

    pub(crate) fn all(&self) -> &[String] {
        &self.addrs
    }
}

/// Largest number of cached channels; past it, channels to addresses no longer routed are dropped.
const MAX_CHANNELS: usize = 256;

/// One lazily connected channel (one HTTP/2 connection) per address, reused by every call.
#[derive(Debug)]
pub(crate) struct Channels {
    map: Mutex<HashMap<String, Channel>>,
    connect_timeout: Duration,
}

impl Channels {
    pub(crate) fn new(connect_timeout: Duration) -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            connect_timeout,
        }
    }

    /// The channel to `addr`, created on first use. Fails only for an address that is not `host:port`.
    pub(crate) fn get(&self, addr: &str, keep: impl Fn(&str) -> bool) -> Result<Channel, ClientError> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(ch) = map.get(addr) {
            return Ok(ch.clone());
        }
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| ClientError::failed(FailureKind::Unavailable, format!("bad address {addr:?}: {e}")))?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true);
        let channel = endpoint.connect_lazy();
        if map.len() >= MAX_CHANNELS {
            map.retain(|a, _| keep(a));
        }
        map.insert(addr.to_owned(), channel.clone());
        Ok(channel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(version: u64, addr: &str) -> pb::RouteTable {
        pb::RouteTable {
            version,
            section_size: 10,
            uid_limit: 100,
            entries: vec![pb::RouteEntry {
                set_id: 0,
                section_begin: 0,
                section_end: 10,
                node_id: 1,
                incarnation: 1,
                addr: addr.into(),
            }],
        }
    }

    #[test]
    fn only_newer_valid_tables_replace_the_cached_one() {
        let cache = RouteCache::default();
        assert!(!cache.offer(None));
        assert!(cache.offer(Some(table(2, "a:1"))));
        assert!(!cache.offer(Some(table(1, "old:1"))), "older");
        assert!(!cache.offer(Some(table(2, "same:1"))), "same version");
        let mut broken = table(3, "broken:1");
        broken.entries.clear();
        assert!(!cache.offer(Some(broken)), "malformed");
        assert_eq!(cache.get().unwrap().lookup(Uid(5)).unwrap().addr, "a:1");
        assert!(cache.offer(Some(table(3, "b:1"))));
        assert_eq!(cache.get().unwrap().version(), 3);
    }

    #[test]
    fn targets_follow_the_table_and_fall_back_to_seeds() {
        let seeds = Seeds::new(vec!["s1:1".into(), "s2:1".into()]);
        let owned = Routes::new(table(1, "a:1")).unwrap();
        let unowned = Routes::new(table(1, "")).unwrap();
        assert_eq!(target_addr(Some(&owned), Uid(99), &seeds).unwrap(), "a:1");
        let err = target_addr(Some(&owned), Uid(100), &seeds).unwrap_err();
        assert_eq!(err.failure_kind(), Some(FailureKind::InvalidArgument));
        assert_eq!(target_addr(Some(&unowned), Uid(1), &seeds).unwrap(), "s1:1");
        assert_eq!(target_addr(None, Uid(1), &seeds).unwrap(), "s2:1");
        assert_eq!(target_addr(None, Uid(1), &seeds).unwrap(), "s1:1", "round robin");
    }
}
