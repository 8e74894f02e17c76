//! A StoreSvr group of real processes on loopback, for black-box tests, over the harness's
//! supervisor: every process is killed when the `Cluster` drops (also when a test fails).
//! Readiness is polled with a deadline; nothing sleeps and hopes.

#![allow(dead_code)]

use seqsvr_control::{Seed, StoreClient, StoreTimeouts};
use seqsvr_proto::pb;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use seqsvr_harness::free_addr;
use seqsvr_harness::{ProcSpec, Supervisor};

pub const SECTIONS: u64 = 10;

/// The supervisor's name of replica `id`.
fn name(id: u64) -> String {
    format!("store{id}")
}

/// Flags every replica of the test group gets.
pub fn set_args() -> Vec<String> {
    [
        // Tests of set 1 add `--set-id=1` after these (a later flag wins).
        "--set-id=0",
        "--section-size=100000",
        "--uid-limit=1000000",
        "--step=1000",
        "--snapshot-logs=20",
        "--keep-logs=0",
        "--lease-ms=3000",
        "--detect-ms=2000",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub addrs: BTreeMap<u64, String>,
    procs: Supervisor,
    /// Flags added after [`set_args`] for every replica (later flags override earlier ones).
    pub extra_args: Vec<String>,
    /// Flags added after those for one replica only.
    pub node_args: BTreeMap<u64, Vec<String>>,
    /// Ids started at least once: only their first start passes `--new-replica`.
    started: std::collections::BTreeSet<u64>,
}

impl Cluster {
    /// Starts `n` replicas; node 1 bootstraps the group.
    pub fn start(n: u64) -> Self {
        Self::start_with(n, &[])
    }

    /// Starts `n` replicas with `extra` flags after the common ones; node 1 bootstraps the group.
    pub fn start_with(n: u64, extra: &[&str]) -> Self {
        let mut c = Self::unstarted(n, extra);
        for id in 1..=n {
            c.spawn(id, id == 1);
        }
        c
    }

    /// The same group with no process started yet (a test may change `addrs` first).
    pub fn unstarted(n: u64, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let addrs: BTreeMap<u64, String> = (1..=n).map(|id| (id, free_addr())).collect();
        let procs = Supervisor::new(&dir.path().join("logs")).unwrap();
        Self {
            dir,
            addrs,
            procs,
            extra_args: extra.iter().map(|s| s.to_string()).collect(),
            node_args: BTreeMap::new(),
            started: Default::default(),
        }
    }

    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("store{id}"))
    }

    pub fn log_path(&self, id: u64) -> PathBuf {
        self.dir.path().join("logs").join(format!("{}.log", name(id)))
    }

    /// Starts replica `id` as an operator would: `--new-replica` on its first start only.
    pub fn spawn(&mut self, id: u64, bootstrap: bool) {
        let first = self.started.insert(id);
        self.spawn_with(id, bootstrap, first);
    }

    /// Starts replica `id` with `--new-replica` exactly when `new_replica` is set.
    pub fn spawn_with(&mut self, id: u64, bootstrap: bool, new_replica: bool) {
        let peers: Vec<String> = self
            .addrs
            .iter()
            .filter(|(i, _)| **i <= 3)
            .map(|(i, a)| format!("{i}={a}"))
            .collect();
        let mut args = vec![
            format!("--node-id={id}"),
            format!("--listen={}", self.addrs[&id]),
            format!("--data-dir={}", self.data_dir(id).display()),
            format!("--peers={}", peers.join(",")),
        ];
        args.extend(set_args());
        args.extend(self.extra_args.iter().cloned());
        args.extend(self.node_args.get(&id).into_iter().flatten().cloned());
        if bootstrap {
            args.push("--bootstrap".into());
        }
        if new_replica {
            args.push("--new-replica".into());
        }
        let spec = ProcSpec {
            env: vec![("RUST_LOG".into(), "info,openraft=warn".into())],
            ..ProcSpec::new(name(id), env!("CARGO_BIN_EXE_storesvr"), args)
        };
        self.procs.spawn(spec).expect("spawn storesvr");
    }

    /// Adds a replica process under a new id (not yet a member).
    pub fn spawn_new(&mut self, id: u64) -> String {
        let addr = free_addr();
        self.addrs.insert(id, addr.clone());
        self.spawn(id, false);
        addr
    }

    pub fn kill(&mut self, id: u64) {
        let _ = self.procs.kill(&name(id));
    }

    /// Waits up to `within` for replica `id` to exit by itself; `None` if it is still running (or
    /// its exit was already collected, by [`running`](Self::running) say).
    pub fn wait_exit(&mut self, id: u64, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            // Only `try_exit` here: asking `is_running` as well could lose an exit that falls
            // between the two calls (`is_running` collects the status and keeps it to itself).
            if let Some(status) = self.procs.try_exit(&name(id)).ok()? {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn restart(&mut self, id: u64) {
        self.kill(id);
        self.spawn(id, false);
    }

    pub fn running(&mut self) -> Vec<u64> {
        self.procs
            .running()
            .iter()
            .filter_map(|n| n.strip_prefix("store")?.parse().ok())
            .collect()
    }

    pub fn client(&self) -> StoreClient {
        let seeds = self
            .addrs
            .iter()
            .map(|(id, a)| Seed {
                node_id: Some(seqsvr_proto::NodeId(*id)),
                addr: a.clone(),
            })
            .collect();
        StoreClient::new(
            seeds,
            StoreTimeouts {
                attempt: Duration::from_millis(800),
                overall: Duration::from_secs(10),
            },
        )
        .unwrap()
    }

    /// A client of one replica only (no leader following beyond it).
    pub fn client_of(&self, id: u64) -> pb::store_service_client::StoreServiceClient<tonic::transport::Channel> {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", self.addrs[&id]))
            .unwrap()
            .connect_lazy();
        pb::store_service_client::StoreServiceClient::new(ch)
    }

    pub async fn status_of(&self, id: u64) -> Option<pb::StatusReply> {
        let mut c = self.client_of(id);
        let mut req = tonic::Request::new(pb::StatusRequest {});
        req.set_timeout(Duration::from_millis(500));
        c.status(req).await.ok().map(|r| r.into_inner())
    }

    /// Waits until a running replica reports itself leader of an initialized set.
    pub async fn wait_leader(&self, within: Duration) -> u64 {
        let deadline = Instant::now() + within;
        loop {
            // A replica that is down refuses the connection at once.
            for &id in self.addrs.keys() {
                if let Some(s) = self.status_of(id).await
                    && s.leader_id == id
                    && s.params.is_some()
                {
                    return id;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no leader within {within:?}; logs in {}",
                self.dir.path().display()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until replica `id` has applied at least `index`.
    pub async fn wait_applied(&self, id: u64, index: u64, within: Duration) -> pb::StatusReply {
        let deadline = Instant::now() + within;
        loop {
            if let Some(s) = self.status_of(id).await
                && s.applied_index >= index
            {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "node {id} did not apply {index} within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn dump_logs(&self) {
        for id in self.addrs.keys() {
            if let Ok(s) = std::fs::read_to_string(self.log_path(*id)) {
                eprintln!("===== store{id} =====\n{s}");
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dump_logs();
        }
        self.procs.kill_all();
    }
}

/// A pretend AllocSvr: registers, then renews in the background so the arbiter keeps it alive.
pub struct FakeOwner {
    pub incarnation: u64,
    renew: tokio::task::JoinHandle<()>,
}

impl FakeOwner {
    pub async fn register(client: &StoreClient, node_id: u64) -> Self {
        let reply = client
            .register(pb::RegisterRequest {
                secret: Vec::new(),
                node_id,
                addr: format!("127.0.0.1:{}", 40_000 + node_id),
                nonce: 0,
            })
            .await
            .expect("register");
        let incarnation = reply.incarnation;
        let c = client.clone();
        let renew = tokio::spawn(async move {
            loop {
                let _ = c
                    .renew(pb::RenewRequest {
                        secret: Vec::new(),
                        incarnation,
                        route_version: 0,
                        map_version: u64::MAX,
                        id_slots_wanted: 0,
                        version: String::new(),
                    })
                    .await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        });
        Self { incarnation, renew }
    }

    /// Waits until the arbiter granted this owner `section`; returns its epoch.
    pub async fn epoch_of(&self, client: &StoreClient, section: u64, within: Duration) -> u64 {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(r) = client
                .renew(pb::RenewRequest {
                    secret: Vec::new(),
                    incarnation: self.incarnation,
                    route_version: 0,
                    map_version: u64::MAX,
                    id_slots_wanted: 0,
                    version: String::new(),
                })
                .await
                && let Some(g) = r
                    .grants
                    .iter()
                    .find(|g| (g.section_begin..g.section_end).contains(&section))
            {
                return g.epoch;
            }
            assert!(
                Instant::now() < deadline,
                "section {section} not granted within {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for FakeOwner {
    fn drop(&mut self) {
        self.renew.abort();
    }
}

/// A Bump of one section by an unbound incarnation.
pub fn bump_request(incarnation: u64, section: u64, epoch: u64, new_max: u64) -> pb::BumpRequest {
    pb::BumpRequest {
        secret: Vec::new(),
        incarnation,
        items: vec![pb::BumpItem {
            section,
            epoch,
            new_max,
        }],
    }
}

pub async fn bump(client: &StoreClient, incarnation: u64, section: u64, epoch: u64, new_max: u64) -> pb::BumpResult {
    let r = client
        .bump(bump_request(incarnation, section, epoch, new_max))
        .await
        .expect("bump");
    r.results[0]
}

pub async fn load(client: &StoreClient, section: u64) -> pb::SectionState {
    let r = client
        .load(pb::LoadRequest {
            sections: vec![pb::SectionRange {
                begin: section,
                end: section + 1,
            }],
        })
        .await
        .expect("load");
    r.sections[0]
}
