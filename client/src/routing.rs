//! The client's view of who owns what: the cached route table and one gRPC channel per owner address.
//!
//! The route table is replaced only by a strictly newer, valid one (servers embed theirs in replies when
//! the caller's version is older), so a late reply carrying an old table cannot move the client back.
//! Readers take a cheap `Arc` clone under a read lock and never hold the lock across an `.await`.
//!
//! A uid goes to the owner a route table names for it (the table of the set the cluster map gives
//! it to first). When no table names one, the client asks an AllocSvr of the set that should
//! serve it — the set a newer table says the section went to, or the map's set — at an address
//! the map lists for that set, and the reply carries that set's table. So seeds in one set are
//! enough: the other sets are found through the map (see `map`).
//!
//! A counter key is routed by its position in the uid space, which needs the space's size: a
//! client that knows neither a table nor the map asks a seed, and checks the answer against the
//! key's position once the reply taught it the size (never against a stand-in uid).
//!
//! Deliberately left out: learning routes or the map from StoreSvrs. The data plane hands both
//! out on demand, which keeps the client independent of the control plane.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use seqsvr_proto::{Routes, Uid, pb};

use crate::error::{ClientError, FailureKind};
use crate::map::MapView;
use crate::transport::{Conn, Connect, H2Conn};

/// The latest valid route table of every set heard from, and the latest cluster map.
///
/// Each set's table covers the whole uid space but names an owner only for the sections that set
/// serves; a uid is sent to the owner some table names under that table's own set. Two tables
/// can both claim a uid for a moment (one of them stale, from before a move): the stale set's
/// AllocSvr then answers NOT_OWNER with its newer table, and the next attempt goes to the other.
#[derive(Debug, Default, Clone)]
pub struct RouteSet {
    by_set: BTreeMap<u64, Arc<Routes>>,
    map: Option<Arc<MapView>>,
}

/// Where a uid's request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target<'a> {
    pub addr: &'a str,
    /// The route version of the table that chose `addr` (0 for a seed: its reply carries its table).
    pub version: u64,
}

impl RouteSet {
    /// The table of set `set_id`, if one was learned.
    pub fn table(&self, set_id: u64) -> Option<Arc<Routes>> {
        self.by_set.get(&set_id).cloned()
    }

    /// Every learned table, by set.
    pub fn tables(&self) -> impl Iterator<Item = &Arc<Routes>> {
        self.by_set.values()
    }

    pub fn is_empty(&self) -> bool {
        self.by_set.is_empty()
    }

    /// The latest cluster map heard from, if any.
    pub fn map(&self) -> Option<&Arc<MapView>> {
        self.map.as_ref()
    }

    /// The version of the latest map (0 = none): what requests send.
    pub fn map_version(&self) -> u64 {
        self.map.as_ref().map_or(0, |m| m.version())
    }

    /// The uid space's size, from any table or the map (every set has the same).
    pub fn uid_limit(&self) -> Option<u64> {
        let from_map = || self.map.as_ref().map(|m| m.uid_limit());
        self.tables().next().map(|t| t.uid_limit()).or_else(from_map)
    }

    pub fn section_size(&self) -> Option<u64> {
        let from_map = || self.map.as_ref().map(|m| m.section_size());
        self.tables().next().map(|t| t.section_size()).or_else(from_map)
    }

    /// The map version requests send: one below the map's while it carries no id setup, so that
    /// a server sends it again until it does (set 0 keeps a map's version when it sets its ids
    /// up, and the setup says how keys are placed).
    pub fn map_version_to_send(&self) -> u64 {
        match &self.map {
            Some(m) if m.key_placement().is_none() => m.version() - 1,
            _ => self.map_version(),
        }
    }

    /// Where counter key `key` lives: its position under the uid space's size and the map's key
    /// placement (SHA-256 while the map does not say: only the route depends on it, since the
    /// server places a key itself), `None` while the size is unknown (a fresh client, before its
    /// first reply). Never a stand-in such as uid 0: an answer checked against another uid's
    /// section would be refused, and its value lost.
    pub(crate) fn key_place(&self, key: &str) -> Option<Uid> {
        let placement = self.map.as_ref().and_then(|m| m.key_placement()).unwrap_or_default();
        self.uid_limit().map(|limit| placement.position(key, limit))
    }

    /// The set the map gives `uid`'s section to.
    fn map_set(&self, uid: Uid) -> Option<u64> {
        let map = self.map.as_ref()?;
        map.set_of(uid.section(map.section_size()))
    }

    /// The owner a table names for `uid` under its own set, with that table's version: the
    /// table of the map's set first, then any.
    pub(crate) fn owner_of(&self, uid: Uid) -> Option<(&str, u64)> {
        fn owner(t: &Routes, uid: Uid) -> Option<(&str, u64)> {
            let target = t.lookup(uid)?;
            (!target.addr.is_empty() && target.set_id == t.set_id()).then_some((target.addr, t.version()))
        }
        let preferred = self.map_set(uid).and_then(|set| self.by_set.get(&set));
        preferred
            .and_then(|t| owner(t, uid))
            .or_else(|| self.tables().find_map(|t| owner(t, uid)))
    }

    /// The set to ask about `uid` when no table names its owner: where the table of the map's set
    /// says the section went (the data plane learns of a move before the map switches); without
    /// that table, a set whose own table says the section is its own (a move's target serves from
    /// its install on, while a map copy may still name the source, whose owner may be the paused
    /// or dead node the move waited out); else the map's set; without a map, a set some table
    /// says the section went to.
    pub(crate) fn set_to_ask(&self, uid: Uid) -> Option<u64> {
        let went = |t: &Arc<Routes>| t.lookup(uid).map(|x| x.set_id).filter(|&s| s != t.set_id());
        let claims = |t: &Arc<Routes>| t.lookup(uid).is_some_and(|x| x.set_id == t.set_id());
        match self.map_set(uid) {
            Some(set) => Some(match self.by_set.get(&set) {
                Some(t) => went(t).unwrap_or(set),
                None => self.tables().find(|t| claims(t)).map_or(set, |t| t.set_id()),
            }),
            None => self.tables().find_map(went),
        }
    }

    /// Whether `addr` is an owner some table names, or an AllocSvr the map lists.
    pub(crate) fn routes_to(&self, addr: &str) -> bool {
        self.tables().any(|t| t.entries().iter().any(|e| e.addr == addr))
            || self.map.as_ref().is_some_and(|m| m.all_allocsvrs().any(|a| a == addr))
    }

    /// Every AllocSvr address known: owners the tables name and those the map lists.
    pub(crate) fn owner_addrs(&self) -> Vec<&str> {
        let mut addrs: Vec<&str> = self
            .tables()
            .flat_map(|t| t.entries().iter().map(|e| e.addr.as_str()))
            .collect();
        if let Some(m) = &self.map {
            addrs.extend(m.all_allocsvrs());
        }
        addrs
    }
}

/// The route tables, shared by every call of a client.
///
/// Every call reads it, often several times, from every runtime thread; it changes when a table
/// or map version does. Behind an `RwLock<Arc<_>>` each read was two atomic writes to the lock
/// and two to the `Arc`'s count, on lines every core shares: [`Self::with`] reads without
/// writing anything shared (`arc_swap`), and installs, rare, take turns on a mutex.
#[derive(Debug, Default)]
pub(crate) struct RouteCache {
    current: ArcSwap<RouteSet>,
    installing: Mutex<()>,
}

impl RouteCache {
    /// The current tables, to keep (across an `.await`, say).
    pub(crate) fn get(&self) -> Arc<RouteSet> {
        self.current.load_full()
    }

    /// `f` of the current tables, without taking a reference to keep: for reads that end before
    /// the caller awaits anything.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&RouteSet) -> R) -> R {
        f(&self.current.load())
    }

    fn install(&self) -> std::sync::MutexGuard<'_, ()> {
        self.installing.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Installs `table` when it is valid and newer than the cached one of its set; true when it did.
    pub(crate) fn offer(&self, table: Option<pb::RouteTable>) -> bool {
        let Some(table) = table else { return false };
        let set = table.set_id;
        if table.version <= self.with(|r| r.table(set).map_or(0, |t| t.version())) {
            return false;
        }
        let routes = match Routes::new(table) {
            Ok(r) => Arc::new(r),
            Err(e) => {
                tracing::warn!(error = %e, "ignoring a malformed route table from a server");
                return false;
            }
        };
        let _installing = self.install();
        let current = self.current.load_full();
        // Checked again in turn: another reply may have installed a newer table meanwhile.
        if current.table(set).is_some_and(|c| c.version() >= routes.version()) {
            return false;
        }
        tracing::info!(set, version = routes.version(), "route table updated");
        let mut next = (*current).clone();
        next.by_set.insert(set, routes);
        self.current.store(Arc::new(next));
        true
    }

    /// Installs `map` when it is valid and newer than the cached one; true when it did.
    pub(crate) fn offer_map(&self, map: Option<&pb::ClusterMap>) -> bool {
        let Some(map) = map else { return false };
        if map.version <= self.with(RouteSet::map_version_to_send) {
            return false;
        }
        let view = match MapView::new(map) {
            Ok(v) => Arc::new(v),
            Err(e) => {
                tracing::warn!(error = %e, "ignoring a malformed cluster map from a server");
                return false;
            }
        };
        let _installing = self.install();
        let current = self.current.load_full();
        if current.map_version_to_send() >= view.version()
            || (current.map_version() == view.version() && view.key_placement().is_none())
        {
            return false;
        }
        tracing::info!(version = view.version(), "cluster map updated");
        let mut next = (*current).clone();
        next.map = Some(view);
        self.current.store(Arc::new(next));
        true
    }
}

/// Where to send a request for one uid: its owner, or a seed when no table names one.
///
/// `pick(n)` chooses one of `n` listed addresses (the client's seeded random numbers).
pub(crate) fn target_addr<'a>(
    routes: &'a RouteSet,
    uid: Uid,
    seeds: &'a Seeds,
    pick: impl FnOnce(usize) -> usize,
) -> Result<Target<'a>, ClientError> {
    if let Some(limit) = routes.uid_limit()
        && uid.0 >= limit
    {
        return Err(ClientError::failed(
            FailureKind::InvalidArgument,
            format!("uid {uid} is outside [0, {limit})"),
        ));
    }
    if let Some((addr, version)) = routes.owner_of(uid) {
        return Ok(Target { addr, version });
    }
    // Unowned, being moved or in a set not heard from yet: ask an AllocSvr of the set that should
    // serve it (its reply carries its table), or a seed when the map lists none.
    let listed = routes
        .set_to_ask(uid)
        .and_then(|set| Some(routes.map()?.allocsvrs(set)))
        .filter(|a| !a.is_empty());
    let addr = match listed {
        Some(addrs) => addrs[pick(addrs.len())].as_str(),
        None => seeds.next(),
    };
    Ok(Target { addr, version: 0 })
}

/// [`target_addr`] of a place that may not be known yet: a counter key cannot be placed before
/// the uid space's size is ([`RouteSet::key_place`]), and then a seed is asked — the server places
/// the key itself, and its reply brings the table and the map.
pub(crate) fn target_of<'a>(
    routes: &'a RouteSet,
    place: Option<Uid>,
    seeds: &'a Seeds,
    pick: impl FnOnce(usize) -> usize,
) -> Result<Target<'a>, ClientError> {
    match place {
        Some(uid) => target_addr(routes, uid, seeds, pick),
        None => Ok(Target {
            addr: seeds.next(),
            version: 0,
        }),
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

/// One connection per address, reused by every call: a lazily connected channel (one HTTP/2
/// connection), or the in-process transport when the client was built with one.
#[derive(Debug)]
pub(crate) struct Channels {
    map: Mutex<HashMap<String, Conn>>,
    connect_timeout: Duration,
    in_process: Option<InProcess>,
    tls: Option<Arc<seqsvr_auth::Tls>>,
}

/// The in-process transport, behind a type that can be printed.
#[derive(Clone)]
pub(crate) struct InProcess(pub(crate) Arc<dyn Connect>);

impl std::fmt::Debug for InProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InProcess")
    }
}

impl Channels {
    pub(crate) fn new(
        connect_timeout: Duration,
        in_process: Option<InProcess>,
        tls: Option<Arc<seqsvr_auth::Tls>>,
    ) -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            connect_timeout,
            in_process,
            tls,
        }
    }

    /// The channel to `addr`, created on first use. Fails only for an address that is not `host:port`.
    pub(crate) fn get(&self, addr: &str, keep: impl Fn(&str) -> bool) -> Result<Conn, ClientError> {
        if let Some(InProcess(via)) = &self.in_process {
            return Ok(Conn::InProcess {
                addr: addr.into(),
                via: via.clone(),
            });
        }
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(ch) = map.get(addr) {
            return Ok(ch.clone());
        }
        // Our own HTTP/2 connection, whose unary request leaves in one write (`seqsvr_rpc`'s
        // h2conn.rs says why).
        let channel = Conn::H2(
            H2Conn::dial(addr, self.connect_timeout, self.tls.as_deref())
                .map_err(|e| ClientError::failed(FailureKind::Unavailable, e))?,
        );
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
            set_id: 0,
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
        assert_eq!(cache.get().owner_of(Uid(5)), Some(("a:1", 2)));
        assert!(cache.offer(Some(table(3, "b:1"))));
        assert_eq!(cache.get().table(0).unwrap().version(), 3);
    }

    #[test]
    fn targets_follow_the_table_and_fall_back_to_seeds() {
        let seeds = Seeds::new(vec!["s1:1".into(), "s2:1".into()]);
        let cache = RouteCache::default();
        let target = |cache: &RouteCache, uid| {
            target_addr(&cache.get(), Uid(uid), &seeds, |_| 0).map(|t| (t.addr.to_owned(), t.version))
        };
        assert_eq!(target(&cache, 1).unwrap().0, "s1:1", "no table yet");
        assert_eq!(target(&cache, 1).unwrap().0, "s2:1", "round robin");
        cache.offer(Some(table(1, "a:1")));
        assert_eq!(target(&cache, 99).unwrap(), ("a:1".to_owned(), 1));
        let err = target(&cache, 100).unwrap_err();
        assert_eq!(err.failure_kind(), Some(FailureKind::InvalidArgument));
        let unowned = RouteCache::default();
        unowned.offer(Some(table(1, "")));
        assert_eq!(target(&unowned, 1).unwrap().1, 0, "unowned: a seed");
    }

    /// After a move of sections 0..5 from set 0 to set 1: set 0's table lists them without an owner
    /// under set 1, set 1's table owns them. Until set 0's newer table arrives, its stale one may
    /// still claim them; after, only set 1 does.
    #[test]
    fn uids_go_to_the_set_whose_table_owns_them() {
        let seeds = Seeds::new(vec!["s:1".into()]);
        let cache = RouteCache::default();
        cache.offer(Some(table(1, "a:1")));
        let moved = |version, set_id, owner_set, addr: &str| pb::RouteTable {
            version,
            section_size: 10,
            uid_limit: 100,
            set_id,
            entries: vec![
                pb::RouteEntry {
                    set_id: owner_set,
                    section_begin: 0,
                    section_end: 5,
                    addr: addr.into(),
                    ..Default::default()
                },
                pb::RouteEntry {
                    set_id: 0,
                    section_begin: 5,
                    section_end: 10,
                    addr: if set_id == 0 { "a:1".into() } else { String::new() },
                    ..Default::default()
                },
            ],
        };
        assert!(cache.offer(Some(moved(4, 1, 1, "b:1"))));
        let to = |uid| {
            let routes = cache.get();
            let t = target_addr(&routes, Uid(uid), &seeds, |_| 0).unwrap();
            (t.addr.to_owned(), t.version)
        };
        assert_eq!(
            to(10).0,
            "a:1",
            "set 0's stale table still claims it: its owner will say no"
        );
        assert!(cache.offer(Some(moved(2, 0, 1, ""))));
        assert_eq!(to(10), ("b:1".to_owned(), 4));
        assert_eq!(to(60), ("a:1".to_owned(), 2));
    }

    /// A map copy still names the source of a move in flight (sections [2, 4) from set 0 to 2),
    /// whose owner may be the paused node the move waited out; the client knows only the target's
    /// table, which says the sections are its own (installed, no owner yet): ask the target.
    #[test]
    fn without_the_sources_table_the_set_that_claims_the_section_is_asked() {
        let cache = RouteCache::default();
        assert!(cache.offer_map(Some(&crate::map::tests::map(3, pb::MovePhase::Installed))));
        let target_set = |set_id| pb::RouteTable {
            version: 7,
            section_size: 10,
            uid_limit: 100,
            set_id,
            entries: vec![
                pb::RouteEntry {
                    set_id: 0,
                    section_begin: 0,
                    section_end: 2,
                    ..Default::default()
                },
                pb::RouteEntry {
                    set_id,
                    section_begin: 2,
                    section_end: 4,
                    ..Default::default()
                },
                pb::RouteEntry {
                    set_id: 1,
                    section_begin: 4,
                    section_end: 10,
                    ..Default::default()
                },
            ],
        };
        assert_eq!(cache.get().set_to_ask(Uid(25)), Some(0), "only the map: its set");
        assert!(cache.offer(Some(target_set(2))));
        assert_eq!(cache.get().set_to_ask(Uid(25)), Some(2));
        assert_eq!(
            cache.get().set_to_ask(Uid(5)),
            Some(0),
            "sections nobody claims: the map's set"
        );
    }
}
