//! A cluster of sets for the front-end tests (`fronts.rs`, `verify.rs`, `redis_cluster.rs`): per
//! set one StoreSvr and two AllocSvrs, every AllocSvr serving gRPC, HTTP/JSON, the Redis protocol
//! (plain and cluster mode) and metrics, each
//! set bootstrapped on its own (a second set joins the map with `seqctl set add`).
//!
//! Deliberately left out: StoreSvr replication (one replica per set: these tests are about the
//! front ends, and kills hit AllocSvrs).

use seqsvr_harness::{ProcSpec, Supervisor, free_addr};

use super::seqctl::Seqctl;
use super::sibling_bin as bin;

/// One AllocSvr's listening addresses.
pub struct Node {
    pub grpc: String,
    pub http: String,
    pub resp: String,
    /// The Redis Cluster port (`--resp-cluster-listen`).
    pub resp_cluster: String,
    pub metrics: String,
}

pub struct FrontsCluster {
    _dir: tempfile::TempDir,
    pub procs: Supervisor,
    pub stores: Vec<String>,
    /// Set 0's AllocSvrs (`alloc0`, `alloc1`), then set 1's (`alloc2`, `alloc3`), ...
    pub nodes: Vec<Node>,
}

impl FrontsCluster {
    /// `sets` sets of `section_size`-uid sections up to `uid_limit`; every AllocSvr gets
    /// `alloc_args` too.
    pub fn start(sets: usize, section_size: u64, uid_limit: u64, alloc_args: &[&str]) -> Self {
        Self::start_with(sets, section_size, uid_limit, alloc_args, &[])
    }

    /// [`Self::start`] with `store_args` for every StoreSvr too (`--key-placement=slots`).
    pub fn start_with(
        sets: usize,
        section_size: u64,
        uid_limit: u64,
        alloc_args: &[&str],
        store_args: &[&str],
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut procs = Supervisor::new(&dir.path().join("logs")).unwrap();
        let stores: Vec<String> = (0..sets).map(|_| free_addr()).collect();
        let mut nodes = Vec::new();
        for (set, store) in stores.iter().enumerate() {
            let args = vec![
                "--node-id=1".to_string(),
                format!("--set-id={set}"),
                format!("--listen={store}"),
                format!("--data-dir={}", dir.path().join(format!("store{set}")).display()),
                format!("--peers=1={store}"),
                "--bootstrap".into(),
                "--new-replica".into(),
                format!("--section-size={section_size}"),
                format!("--uid-limit={uid_limit}"),
                "--step=1000".into(),
            ];
            let args: Vec<String> = args
                .into_iter()
                .chain(store_args.iter().map(|a| a.to_string()))
                .collect();
            procs
                .spawn(ProcSpec::new(format!("store{set}"), bin("storesvr"), args))
                .unwrap();
            for i in 0..2 {
                let node = Node {
                    grpc: free_addr(),
                    http: free_addr(),
                    resp: free_addr(),
                    resp_cluster: free_addr(),
                    metrics: free_addr(),
                };
                let mut args = vec![
                    format!("--node-id={}", 2 * set + i + 1),
                    format!("--listen={}", node.grpc),
                    format!("--store=1={store}"),
                    format!("--http-listen={}", node.http),
                    format!("--resp-listen={}", node.resp),
                    format!("--resp-cluster-listen={}", node.resp_cluster),
                    format!("--metrics-listen={}", node.metrics),
                ];
                args.extend(alloc_args.iter().map(|a| a.to_string()));
                procs
                    .spawn(ProcSpec::new(format!("alloc{}", 2 * set + i), bin("allocsvr"), args))
                    .unwrap();
                nodes.push(node);
            }
        }
        Self {
            _dir: dir,
            procs,
            stores,
            nodes,
        }
    }

    /// `seqctl --store <set 0>`.
    pub fn operator(&self) -> Seqctl {
        Seqctl::new(["--store", self.stores[0].as_str()])
    }

    /// One address of every AllocSvr, comma-separated.
    pub fn list(&self, f: impl Fn(&Node) -> &str) -> String {
        self.nodes.iter().map(f).collect::<Vec<_>>().join(",")
    }
}

impl Drop for FrontsCluster {
    fn drop(&mut self) {
        self.procs.kill_all();
    }
}
