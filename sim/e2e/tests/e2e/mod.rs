//! A whole seqsvr-rs cluster of real processes on loopback, for the end-to-end tests: 3 `storesvr`
//! replicas (one Raft group, node 1 bootstraps it) and 2 `allocsvr` nodes, driven through the real
//! client library.
//!
//! Every process runs under the harness's supervisor: it logs to its own file in a temp dir and is
//! killed when the [`Cluster`] drops, also when a test panics (then the tail of every log is
//! printed first). Addresses are fixed at start so
//! that a process restarted after a kill comes back where the route table and its peers expect it.
//! Readiness is always polled with a deadline; nothing sleeps and hopes.
//!
//! The `storesvr`, `allocsvr` and `seqctl` binaries belong to other packages: they are taken from
//! the target directory this test runs from, so `cargo build --workspace --bins` must have run
//! first (a stale binary there is used as is). A process can run binaries from another directory
//! instead ([`Cluster::start_from`], [`Cluster::use_bin_dir`]): the rolling-upgrade test runs the
//! previous release's beside this tree's.
//!
//! Deliberately left out: network faults (the simulator injects those) and more than one set.

#![allow(dead_code)]

pub mod fronts_cluster;
pub mod seqctl;
pub mod values;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

use seqsvr_client::{Client, ClientConfig, Fetched, MAX_UIDS_PER_RPC};
use seqsvr_control::{Seed, StoreClient, StoreTimeouts};
use seqsvr_harness::{ProcSpec, Signal, Supervisor, find_binary};
use seqsvr_proto::pb::alloc_service_client::AllocServiceClient;
use seqsvr_proto::{NodeId, Uid, pb};
use tokio::time::Instant;
use tonic::transport::Channel;

/// Uids per section.
pub const SECTION_SIZE: u64 = 100_000;
/// The cluster serves `[0, UID_LIMIT)`.
pub const UID_LIMIT: u64 = 2_000_000;
/// Sections of the one set.
pub const SECTIONS: u64 = UID_LIMIT / SECTION_SIZE;
/// How much one bump raises a section's ceiling.
pub const STEP: u64 = 1_000;
/// AllocSvr lease.
pub const LEASE: Duration = Duration::from_millis(3_000);
/// How long the arbiter waits for a renewal before declaring an AllocSvr dead.
pub const DETECT: Duration = Duration::from_millis(2_000);
/// StoreSvr replicas.
pub const STORES: [u64; 3] = [1, 2, 3];
/// AllocSvr nodes.
pub const ALLOCS: [u64; 2] = [1, 2];
/// Extra flags for every `allocsvr` (for negative controls run by hand, e.g. an unsafe switch).
pub const EXTRA_ARGS_VAR: &str = "E2E_ALLOCSVR_EXTRA_ARGS";
/// Flags added to every StoreSvr of this tree (not to a previous release's, which may not know
/// them), e.g. `--handoff-ms=0` to measure a rolling restart without the leader's handoff.
pub const STORE_EXTRA_ARGS_VAR: &str = "E2E_STORESVR_EXTRA_ARGS";

/// The flags [`STORE_EXTRA_ARGS_VAR`] names.
pub fn store_extra_args() -> Vec<String> {
    std::env::var(STORE_EXTRA_ARGS_VAR)
        .map(|v| v.split_whitespace().map(String::from).collect())
        .unwrap_or_default()
}
/// Lines of each log printed when a test fails.
const LOG_TAIL_LINES: usize = 120;
/// Interval of every readiness poll.
const POLL_EVERY: Duration = Duration::from_millis(20);

/// Which kind of process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    Store,
    Alloc,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Store => "store",
            Role::Alloc => "alloc",
        }
    }
}

/// A workspace binary from this target directory; fails with what to do when it is missing.
pub fn sibling_bin(name: &str) -> PathBuf {
    find_binary(name, None).unwrap_or_else(|e| panic!("{e}: run `cargo build --workspace --bins` first"))
}

/// A loopback address of its own for one cluster: the processes' outgoing connections take their
/// ephemeral ports on 127.0.0.1, so they can never grab a port picked here between the pick and
/// the process binding it (a restarted process binds its old port again).
fn private_loopback_ip() -> String {
    let [a, b, c]: [u8; 3] = rand::random();
    format!("127.{}.{b}.{}", a.clamp(1, 254), c.clamp(1, 254))
}

/// `n` distinct free addresses on `ip` (all held open until every one is picked, so the kernel
/// cannot hand the same port out twice).
fn free_addrs(ip: &str, n: usize) -> Vec<String> {
    let held: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind((ip, 0)).expect("bind an ephemeral port on a private loopback address"))
        .collect();
    held.iter()
        .map(|l| l.local_addr().expect("local addr").to_string())
        .collect()
}

/// Polls `f` until it returns `Some`, or panics after `within`.
pub async fn poll<T, F, Fut>(what: &str, within: Duration, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    seqsvr_harness::poll_until(within, f)
        .await
        .unwrap_or_else(|| panic!("timed out after {within:?} waiting for {what}"))
}

/// Three StoreSvr replicas and two AllocSvrs as OS processes.
pub struct Cluster {
    dir: tempfile::TempDir,
    pub store_addrs: BTreeMap<u64, String>,
    pub alloc_addrs: BTreeMap<u64, String>,
    alloc_metrics: BTreeMap<u64, String>,
    /// Each AllocSvr's Redis-protocol front end.
    pub alloc_resp: BTreeMap<u64, String>,
    /// Each AllocSvr's HTTP/JSON front end.
    pub alloc_http: BTreeMap<u64, String>,
    /// How much one bump raises a section's ceiling.
    step: u64,
    /// Where a process's binary comes from when not this target directory.
    bin_dirs: BTreeMap<(Role, u64), PathBuf>,
    procs: Supervisor,
    /// The processes this cluster started and has not killed or seen exit.
    live: BTreeSet<(Role, u64)>,
    /// StoreSvr ids started at least once: only a first start passes `--new-replica`.
    stores_started: BTreeSet<u64>,
    /// With mutual TLS: the development CA's files, one certificate per role.
    pub certs: Option<seqsvr_auth::devca::LocalCerts>,
    /// With mutual TLS: the CA, to sign more certificates in tests.
    pub ca: Option<seqsvr_auth::devca::DevCa>,
    /// The loopback address every process of this cluster listens on.
    pub ip: String,
}

impl Cluster {
    /// Starts every process (node 1 bootstraps the group); does not wait for anything.
    pub fn start() -> Self {
        Self::start_with(false)
    }

    /// [`Cluster::start`] with mutual TLS on every link: a development CA and one certificate per
    /// role in the temp dir; every process and every client of this struct uses its role's.
    pub fn start_tls() -> Self {
        Self::start_with(true)
    }

    fn start_with(tls: bool) -> Self {
        Self::start_from(tls, None, STEP)
    }

    /// Starts every process from the binaries in `bin_dir` (this target directory when `None`),
    /// the set bootstrapped with `step` (how much one bump raises a ceiling) instead of [`STEP`].
    pub fn start_from(tls: bool, bin_dir: Option<PathBuf>, step: u64) -> Self {
        // Fail early, with what to do, when a binary is missing.
        if bin_dir.is_none() {
            sibling_bin("storesvr");
            sibling_bin("allocsvr");
        }
        let ip = private_loopback_ip();
        let mut addrs = free_addrs(&ip, STORES.len() + 4 * ALLOCS.len()).into_iter();
        let dir = tempfile::tempdir().expect("temp dir");
        let procs = Supervisor::new(&dir.path().join("logs")).expect("log dir");
        let certs = tls.then(|| {
            seqsvr_auth::devca::LocalCerts::create(&dir.path().join("certs"), std::slice::from_ref(&ip), 2)
                .expect("development certificates")
        });
        let (certs, ca) = certs.unzip();
        let mut c = Self {
            certs,
            ca,
            ip,
            dir,
            store_addrs: STORES.iter().map(|id| (*id, addrs.next().unwrap())).collect(),
            alloc_addrs: ALLOCS.iter().map(|id| (*id, addrs.next().unwrap())).collect(),
            alloc_metrics: ALLOCS.iter().map(|id| (*id, addrs.next().unwrap())).collect(),
            alloc_resp: ALLOCS.iter().map(|id| (*id, addrs.next().unwrap())).collect(),
            alloc_http: ALLOCS.iter().map(|id| (*id, addrs.next().unwrap())).collect(),
            step,
            bin_dirs: STORES
                .iter()
                .map(|id| (Role::Store, *id))
                .chain(ALLOCS.iter().map(|id| (Role::Alloc, *id)))
                .filter_map(|k| Some((k, bin_dir.clone()?)))
                .collect(),
            procs,
            live: BTreeSet::new(),
            stores_started: BTreeSet::new(),
        };
        c.start_all();
        c
    }

    /// Starts every process that is not running.
    pub fn start_all(&mut self) {
        for id in STORES {
            self.start_store(id);
        }
        for id in ALLOCS {
            self.start_alloc(id);
        }
    }

    /// Runs process `role` `id` from the binaries in `dir` (this target directory when `None`)
    /// from its next start on.
    pub fn use_bin_dir(&mut self, role: Role, id: u64, dir: Option<PathBuf>) {
        match dir {
            Some(d) => self.bin_dirs.insert((role, id), d),
            None => self.bin_dirs.remove(&(role, id)),
        };
    }

    fn bin_of(&self, role: Role, id: u64, bin: &str) -> PathBuf {
        match self.bin_dirs.get(&(role, id)) {
            Some(dir) => find_binary(bin, Some(dir)).unwrap_or_else(|e| panic!("{e}")),
            None => sibling_bin(bin),
        }
    }

    fn name(role: Role, id: u64) -> String {
        format!("{}{id}", role.name())
    }

    /// Everything process `role` `id` has logged so far.
    pub fn log(&self, role: Role, id: u64) -> String {
        std::fs::read_to_string(self.log_path(role, id)).unwrap_or_default()
    }

    fn log_path(&self, role: Role, id: u64) -> PathBuf {
        self.dir
            .path()
            .join("logs")
            .join(format!("{}.log", Self::name(role, id)))
    }

    /// The `--tls-*` flags of a process holding `role`'s certificate (none without TLS).
    pub fn tls_flags(&self, role: seqsvr_auth::Role) -> Vec<String> {
        self.certs.as_ref().map(|c| c.flags(role)).unwrap_or_default()
    }

    /// `role`'s certificate loaded, for in-test clients; `None` without TLS.
    pub fn tls(&self, role: seqsvr_auth::Role) -> Option<std::sync::Arc<seqsvr_auth::Tls>> {
        Some(self.certs.as_ref()?.load(role).expect("load test certificate"))
    }

    fn spawn(&mut self, role: Role, id: u64, bin: &str, mut args: Vec<String>, rust_log: &str) {
        args.extend(self.tls_flags(match role {
            Role::Store => seqsvr_auth::Role::StoreSvr,
            Role::Alloc => seqsvr_auth::Role::AllocSvr,
        }));
        assert!(self.live.insert((role, id)), "{}{id} is already running", role.name());
        let spec = ProcSpec {
            env: vec![("NO_COLOR".into(), "1".into()), ("RUST_LOG".into(), rust_log.into())],
            ..ProcSpec::new(Self::name(role, id), self.bin_of(role, id, bin), args)
        };
        self.procs
            .spawn(spec)
            .unwrap_or_else(|e| panic!("spawn {}{id}: {e}", role.name()));
    }

    /// Starts StoreSvr replica `id` on its address and data dir (bootstrap flag only on node 1; it
    /// does nothing once the data dir holds a group; `--new-replica` only on the first start, as an
    /// operator would: a restart keeps its data dir).
    pub fn start_store(&mut self, id: u64) {
        if self.live.contains(&(Role::Store, id)) {
            return;
        }
        let peers: Vec<String> = self.store_addrs.iter().map(|(i, a)| format!("{i}={a}")).collect();
        let mut args = vec![
            format!("--node-id={id}"),
            format!("--listen={}", self.store_addrs[&id]),
            format!("--data-dir={}", self.dir.path().join(format!("store{id}")).display()),
            "--set-id=0".to_string(),
            format!("--peers={}", peers.join(",")),
            format!("--section-size={SECTION_SIZE}"),
            format!("--uid-limit={UID_LIMIT}"),
            format!("--step={}", self.step),
            format!("--lease-ms={}", LEASE.as_millis()),
            format!("--detect-ms={}", DETECT.as_millis()),
        ];
        if id == 1 {
            args.push("--bootstrap".into());
        }
        if self.stores_started.insert(id) {
            args.push("--new-replica".into());
        }
        if !self.bin_dirs.contains_key(&(Role::Store, id)) {
            args.extend(store_extra_args());
        }
        self.spawn(Role::Store, id, "storesvr", args, "info,openraft=warn");
    }

    /// Starts AllocSvr `id` (a new incarnation) on its fixed data-plane and metrics addresses.
    pub fn start_alloc(&mut self, id: u64) {
        if self.live.contains(&(Role::Alloc, id)) {
            return;
        }
        let mut args = vec![
            format!("--node-id={id}"),
            format!("--listen={}", self.alloc_addrs[&id]),
            format!("--store={}", self.store_seeds_flag()),
            format!("--metrics-listen={}", self.alloc_metrics[&id]),
            format!("--resp-listen={}", self.alloc_resp[&id]),
        ];
        // An older release's binary (the upgrade tests) is started with its own flags only.
        if !self.bin_dirs.contains_key(&(Role::Alloc, id)) {
            args.push(format!("--http-listen={}", self.alloc_http[&id]));
        }
        // Negative controls by hand, e.g. `E2E_ALLOCSVR_EXTRA_ARGS=--unsafe-skip-lease-wait`
        // must make the takeover test fail.
        if let Ok(extra) = std::env::var(EXTRA_ARGS_VAR) {
            args.extend(extra.split_whitespace().map(String::from));
        }
        self.spawn(Role::Alloc, id, "allocsvr", args, "info");
    }

    /// `1=addr,2=addr,3=addr`, as `allocsvr --store` and `seqctl --store` take it.
    pub fn store_seeds_flag(&self) -> String {
        let seeds: Vec<String> = self.store_addrs.iter().map(|(i, a)| format!("{i}={a}")).collect();
        seeds.join(",")
    }

    /// Comma-separated AllocSvr addresses, as `seqctl --alloc` takes them.
    pub fn alloc_seeds_flag(&self) -> String {
        let seeds: Vec<&str> = self.alloc_addrs.values().map(String::as_str).collect();
        seeds.join(",")
    }

    /// SIGKILLs a process and reaps it (no-op when it is not running).
    pub fn kill(&mut self, role: Role, id: u64) {
        if self.live.remove(&(role, id)) {
            let _ = self.procs.kill(&Self::name(role, id));
        }
    }

    /// SIGKILLs all five processes.
    pub fn kill_all(&mut self) {
        self.procs.kill_all();
        self.live.clear();
    }

    /// Sends SIGTERM to a running process without waiting for it.
    pub fn sigterm(&mut self, role: Role, id: u64) {
        assert!(self.live.contains(&(role, id)), "{}{id} is not running", role.name());
        self.procs
            .signal(&Self::name(role, id), Signal::SIGTERM)
            .expect("send SIGTERM");
    }

    /// Waits until a process exited (after a SIGTERM) and reaps it; panics after `within`.
    pub async fn wait_exit(&mut self, role: Role, id: u64, within: Duration) -> ExitStatus {
        let status = self
            .procs
            .wait_exit(&Self::name(role, id), within)
            .await
            .expect("process was started");
        let status = status.unwrap_or_else(|| panic!("{}{id} did not exit within {within:?}", role.name()));
        self.live.remove(&(role, id));
        status
    }

    /// Every running process of `role`, by id.
    pub fn running(&self, role: Role) -> Vec<u64> {
        self.live
            .iter()
            .filter(|(r, _)| *r == role)
            .map(|(_, id)| *id)
            .collect()
    }

    /// A StoreService client over every replica, following leader hints.
    pub fn store_client(&self) -> StoreClient {
        let seeds = self
            .store_addrs
            .iter()
            .map(|(id, a)| Seed {
                node_id: Some(NodeId(*id)),
                addr: a.clone(),
            })
            .collect();
        let timeouts = StoreTimeouts {
            attempt: Duration::from_millis(800),
            overall: Duration::from_secs(5),
        };
        let dialer = seqsvr_control::Dialer::with_tls(self.tls(seqsvr_auth::Role::Admin));
        StoreClient::with_dialer(seeds, timeouts, &dialer).expect("store client")
    }

    /// The Status of one replica alone (no hint following), or `None` when it does not answer.
    pub async fn store_status_of(&self, id: u64) -> Option<pb::StatusReply> {
        let seed = Seed {
            node_id: Some(NodeId(id)),
            addr: self.store_addrs[&id].clone(),
        };
        let short = Duration::from_millis(500);
        let client = StoreClient::with_dialer(
            vec![seed],
            StoreTimeouts {
                attempt: short,
                overall: short,
            },
            &seqsvr_control::Dialer::with_tls(self.tls(seqsvr_auth::Role::Admin)),
        )
        .ok()?;
        client.status().await.ok()
    }

    /// The running replica that reports itself the leader of an initialized set.
    pub async fn wait_store_leader(&self, within: Duration) -> u64 {
        poll("a StoreSvr leader", within, || async {
            for id in self.running(Role::Store) {
                if let Some(s) = self.store_status_of(id).await
                    && s.leader_id == id
                    && s.params.is_some()
                {
                    return Some(id);
                }
            }
            None
        })
        .await
    }

    /// The store's current route table (from the leader, through hints).
    pub async fn store_routes(&self) -> Option<pb::RouteTable> {
        self.store_client().get_routes().await.ok()?.routes
    }

    /// A client-library client seeded with both AllocSvrs.
    pub fn client_config(&self) -> ClientConfig {
        ClientConfig {
            tls: self.tls(seqsvr_auth::Role::Client),
            ..ClientConfig::new(self.alloc_addrs.values().cloned())
        }
    }

    /// A client that has learned the route table.
    pub async fn client(&self) -> Client {
        Client::connect(self.client_config()).await.expect("client connects")
    }

    /// A raw data-plane client of one AllocSvr (connects lazily).
    pub fn alloc_rpc(&self, id: u64) -> AllocServiceClient<Channel> {
        let tls = self.tls(seqsvr_auth::Role::Client);
        let endpoint = seqsvr_auth::endpoint(&self.alloc_addrs[&id], tls.as_deref())
            .expect("endpoint")
            .connect_timeout(Duration::from_millis(200))
            .timeout(Duration::from_secs(2));
        AllocServiceClient::new(endpoint.connect_lazy())
    }

    /// Waits until the store's route table gives every section to a running AllocSvr and every
    /// running AllocSvr some sections (the arbiter's planned moves are done), then until every
    /// section is served.
    pub async fn wait_settled(&self, within: Duration) -> Duration {
        let started = Instant::now();
        let mut last = None;
        loop {
            let routes = self.store_routes().await;
            let running = self.running(Role::Alloc);
            if let Some(r) = &routes {
                // Entries of another set are sections moved away (a test with a second set).
                let owned = r
                    .entries
                    .iter()
                    .filter(|e| e.set_id == r.set_id)
                    .all(|e| e.incarnation != 0 && running.contains(&e.node_id));
                let balanced = running.iter().all(|id| r.entries.iter().any(|e| e.node_id == *id));
                if owned && balanced {
                    break;
                }
            }
            last = routes.or(last);
            assert!(
                started.elapsed() < within,
                "not every section owned by a running AllocSvr (running: {running:?}) within {within:?}; \
                 last route table from the store: {last:?}"
            );
            tokio::time::sleep(POLL_EVERY).await;
        }
        self.wait_serving(within.saturating_sub(started.elapsed())).await;
        started.elapsed()
    }

    /// Waits until every section is served: a `GetCurSeq` (which consumes nothing) of the first uid
    /// of every section is answered OK through the client library. Each round uses a fresh client,
    /// so a route table learned while sections were moving cannot pin it to a dead node.
    pub async fn wait_serving(&self, within: Duration) -> Duration {
        let started = Instant::now();
        let cfg = ClientConfig {
            deadline: Duration::from_millis(500),
            attempt_timeout: Duration::from_millis(300),
            connect_timeout: Duration::from_millis(200),
            ..self.client_config()
        };
        let mut pending: Vec<u64> = (0..SECTIONS).collect();
        loop {
            let client = Client::new(cfg.clone()).expect("client config");
            let mut still = Vec::new();
            for s in pending {
                if client.get_cur_seq(Uid(s * SECTION_SIZE)).await.is_err() {
                    still.push(s);
                }
            }
            pending = still;
            if pending.is_empty() {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < within,
                "sections {pending:?} not served within {within:?}"
            );
            tokio::time::sleep(POLL_EVERY).await;
        }
    }

    /// AllocSvr `id`'s whole metrics page.
    pub async fn alloc_metrics_page(&self, id: u64) -> String {
        poll("metrics page", Duration::from_secs(5), || {
            http_get(&self.alloc_metrics[&id], "/metrics")
        })
        .await
    }

    /// The value of one AllocSvr's `allocsvr_fetch_total{outcome=...}` counter (0 when not yet
    /// exported).
    pub async fn fetch_counter(&self, id: u64, outcome: &str) -> u64 {
        let body = poll("metrics page", Duration::from_secs(5), || {
            http_get(&self.alloc_metrics[&id], "/metrics")
        })
        .await;
        // Other labels (the node's) may stand beside the outcome, in any order.
        let label = format!("outcome=\"{outcome}\"");
        body.lines()
            .filter(|l| l.starts_with("allocsvr_fetch_total{") && l.contains(&label))
            .find_map(|l| l.rsplit(' ').next())
            .map(|v| v.trim().parse::<f64>().expect("counter value") as u64)
            .unwrap_or(0)
    }

    /// Prints the last lines of every log.
    pub fn dump_logs(&self) {
        let mut keys: Vec<(Role, u64)> = STORES.iter().map(|id| (Role::Store, *id)).collect();
        keys.extend(ALLOCS.iter().map(|id| (Role::Alloc, *id)));
        for (role, id) in keys {
            let Ok(s) = std::fs::read_to_string(self.log_path(role, id)) else {
                continue;
            };
            let lines: Vec<&str> = s.lines().collect();
            let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
            eprintln!(
                "===== {}{id} (last {} lines) =====\n{}",
                role.name(),
                tail.len(),
                tail.join("\n")
            );
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for (name, status) in self.procs.take_unexpected_exits() {
                eprintln!("===== {name} had exited: {status}");
            }
            self.dump_logs();
        }
        self.kill_all();
    }
}

async fn http_get(addr: &str, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let io = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).await.ok()?;
        Some(body)
    };
    tokio::time::timeout(Duration::from_secs(2), io).await.ok()?
}

/// `count` uids spread over every section, including the first and last uid of each.
pub fn spread_uids(per_section: u64) -> Vec<Uid> {
    assert!(per_section >= 2);
    let mut uids = Vec::new();
    for s in 0..SECTIONS {
        let base = s * SECTION_SIZE;
        uids.push(Uid(base));
        uids.push(Uid(base + SECTION_SIZE - 1));
        for k in 1..per_section - 1 {
            uids.push(Uid(base + (k * 7_919) % SECTION_SIZE));
        }
    }
    uids.sort_unstable_by_key(|u| u.0);
    uids.dedup();
    uids
}

/// The last seq seen per uid; every new one must be strictly above it (P1 for sequential callers).
#[derive(Debug, Default)]
pub struct Tracker {
    last: HashMap<u64, u64>,
    /// Seqs recorded.
    pub served: u64,
}

impl Tracker {
    /// Records a fetched seq; panics when it does not increase the uid's last one.
    pub fn record(&mut self, f: &Fetched) {
        assert_ne!(f.seq, 0, "uid {} was given seq 0", f.uid);
        if let Some(prev) = self.last.insert(f.uid.0, f.seq) {
            assert!(
                f.seq > prev,
                "P1 violated: uid {} was given {} after {prev} (owner {:?})",
                f.uid,
                f.seq,
                f.owner
            );
        }
        self.served += 1;
    }

    /// The last seq of `uid`, if any.
    pub fn last(&self, uid: Uid) -> Option<u64> {
        self.last.get(&uid.0).copied()
    }

    /// Fetches `copies` seqs of `uid` in batch calls of at most one RPC's worth each: raises the
    /// section's high-water mark by `copies`, so with `copies > step` the owner must commit at
    /// least one bump through the store. The seqs of one call must be distinct and above every
    /// earlier one, but not in request order: the library retries occurrences answered
    /// NOT_READY in a later round, after later occurrences were served.
    pub async fn fetch_hot(&mut self, client: &Client, uid: Uid, copies: usize) {
        let mut left = copies;
        while left > 0 {
            let n = left.min(MAX_UIDS_PER_RPC);
            let mut got = client
                .batch_fetch(&vec![uid; n])
                .await
                .unwrap_or_else(|e| panic!("hot fetch of {uid}: {e}"));
            assert_eq!(got.len(), n);
            got.sort_unstable_by_key(|f| f.seq);
            for f in &got {
                assert_eq!(f.uid, uid);
                self.record(f);
            }
            left -= n;
        }
    }

    /// Fetches every uid once (batch fetches, retrying the ones that failed) until all were served;
    /// panics after `within`. Returns how long it took.
    pub async fn fetch_each_once(&mut self, client: &Client, uids: &[Uid], within: Duration) -> Duration {
        let started = Instant::now();
        let mut pending = uids.to_vec();
        let mut last_error = String::new();
        while !pending.is_empty() {
            assert!(
                started.elapsed() < within,
                "{} of {} uids not served within {within:?}; last error: {last_error}",
                pending.len(),
                uids.len()
            );
            let results = client.batch_fetch_each(&pending).await.expect("batch is well formed");
            let mut still = Vec::new();
            for (uid, r) in pending.iter().zip(results) {
                match r {
                    Ok(f) => self.record(&f),
                    Err(e) => {
                        last_error = e.to_string();
                        still.push(*uid);
                    }
                }
            }
            pending = still;
            if !pending.is_empty() {
                tokio::time::sleep(POLL_EVERY).await;
            }
        }
        started.elapsed()
    }
}
