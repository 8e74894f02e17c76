//! The simulated cluster's wiring: per set, 3 StoreSvr replicas (one Raft group) and 3 AllocSvrs
//! on loopback, with a [`Proxy`] on every link: StoreSvr↔StoreSvr inside a set (each direction,
//! through `--dial`), AllocSvr→StoreSvr of its own set (through `--store`), client→AllocSvr
//! (through `--advertise`, so the route table itself points clients at the proxies).
//!
//! Process ids are global: set `s` has StoreSvrs and AllocSvrs `3s+1 ..= 3s+3`, so a name such as
//! `allocsvr-5` says which set it is in and the history's owner tags never mix two sets' nodes.
//! Set 0 bootstraps owning the whole uid space; the others start empty and get ranges by moves.
//!
//! Deliberately left out: more or fewer than 3+3 processes per set, and proxies on the admin
//! links (`seqctl` and the simulator's own observers talk to StoreSvrs directly).

use crate::proxy::{LinkMode, Proxy};
use seqsvr_harness::ProcSpec;
use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// StoreSvrs and AllocSvrs per set.
pub const N: u64 = 3;

/// The set a process id (StoreSvr or AllocSvr) belongs to.
pub fn set_of(id: u64) -> u64 {
    (id - 1) / N
}

/// The process ids of set `set`, StoreSvrs and AllocSvrs alike.
pub fn members(set: u64) -> std::ops::RangeInclusive<u64> {
    set * N + 1..=set * N + N
}

/// Set parameters passed to every StoreSvr.
#[derive(Clone, Debug)]
pub struct SetArgs {
    pub section_size: u64,
    pub uid_limit: u64,
    pub step: u64,
    pub lease_ms: u64,
    pub detect_ms: u64,
    pub election_min_ms: u64,
    pub election_max_ms: u64,
    /// Extra flags for every StoreSvr (negative controls).
    pub store_extra: Vec<String>,
    /// Extra flags for every AllocSvr (negative controls).
    pub alloc_extra: Vec<String>,
    /// With time-ordered ids: the directory of the AllocSvrs' clock files (`crate::run::ids`),
    /// each followed by its AllocSvr (`--test-clock-file`) across restarts.
    pub id_clock_dir: Option<PathBuf>,
    /// The front end every AllocSvr serves on its [`Topology::front_addr`] (`--front`).
    pub front: crate::front_workload::Front,
}

/// Every address and proxy of one run.
pub struct Topology {
    pub sets: u64,
    pub store_addr: BTreeMap<u64, SocketAddr>,
    pub alloc_addr: BTreeMap<u64, SocketAddr>,
    /// Each AllocSvr's HTTP or Redis front end (`--front`), bound directly: no proxy.
    pub front_addr: BTreeMap<u64, SocketAddr>,
    /// (from replica, to replica) → proxy.
    pub raft: BTreeMap<(u64, u64), Proxy>,
    /// (allocsvr, replica) → proxy.
    pub alloc_store: BTreeMap<(u64, u64), Proxy>,
    /// allocsvr → proxy that clients use.
    pub client_alloc: BTreeMap<u64, Proxy>,
}

pub fn store_name(id: u64) -> String {
    format!("storesvr-{id}")
}

/// Lower end of the delay with which every AllocSvr Release is sent a second time (up to twice it).
pub const REPEAT_RELEASES_AFTER_MS: u64 = 1_000;

pub fn alloc_name(id: u64) -> String {
    format!("allocsvr-{id}")
}

/// AllocSvr `a`'s id clock file in `dir` (written by `crate::run::ids`, read by the AllocSvr
/// through `--test-clock-file`).
pub fn clock_file(dir: &Path, a: u64) -> PathBuf {
    dir.join(format!("{}.clock", alloc_name(a)))
}

impl Topology {
    pub async fn new(sets: u64) -> io::Result<Self> {
        let mut t = Topology {
            sets,
            store_addr: BTreeMap::new(),
            alloc_addr: BTreeMap::new(),
            front_addr: BTreeMap::new(),
            raft: BTreeMap::new(),
            alloc_store: BTreeMap::new(),
            client_alloc: BTreeMap::new(),
        };
        let all = 1..=sets * N;
        // Below the ephemeral range and never twice in this process (`free_port`'s docs): a
        // server restarted after a SIGKILL gets its port back.
        for i in all.clone() {
            for addrs in [&mut t.store_addr, &mut t.alloc_addr, &mut t.front_addr] {
                addrs.insert(i, SocketAddr::from(([127, 0, 0, 1], seqsvr_harness::net::free_port())));
            }
        }
        for i in all {
            for j in members(set_of(i)).filter(|&j| j != i) {
                t.raft.insert(
                    (i, j),
                    Proxy::start(format!("store{i}->store{j}"), t.store_addr[&j]).await?,
                );
            }
            for j in members(set_of(i)) {
                t.alloc_store.insert(
                    (i, j),
                    Proxy::start(format!("alloc{i}->store{j}"), t.store_addr[&j]).await?,
                );
            }
            t.client_alloc
                .insert(i, Proxy::start(format!("client->alloc{i}"), t.alloc_addr[&i]).await?);
        }
        Ok(t)
    }

    /// `ID=ADDR` of every StoreSvr of `set`.
    fn peers(&self, set: u64) -> String {
        members(set)
            .map(|i| format!("{i}={}", self.store_addr[&i]))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn store_spec(&self, id: u64, bin: &Path, data_dir: &Path, set: &SetArgs) -> ProcSpec {
        let set_id = set_of(id);
        let dial: Vec<String> = members(set_id)
            .filter(|&j| j != id)
            .map(|j| format!("{j}={}", self.raft[&(id, j)].addr()))
            .collect();
        let mut args = vec![
            format!("--node-id={id}"),
            format!("--listen={}", self.store_addr[&id]),
            format!("--data-dir={}", data_dir.join(store_name(id)).display()),
            format!("--set-id={set_id}"),
            format!("--peers={}", self.peers(set_id)),
            format!("--dial={}", dial.join(",")),
            format!("--section-size={}", set.section_size),
            format!("--uid-limit={}", set.uid_limit),
            format!("--step={}", set.step),
            format!("--lease-ms={}", set.lease_ms),
            format!("--detect-ms={}", set.detect_ms),
            format!("--election-min-ms={}", set.election_min_ms),
            format!("--election-max-ms={}", set.election_max_ms),
        ];
        if id == *members(set_id).start() {
            args.push("--bootstrap".into());
        }
        args.extend(set.store_extra.iter().cloned());
        ProcSpec {
            // Its data dir is fresh on the first start; a restart after a kill keeps it.
            first_args: vec!["--new-replica".into()],
            ..ProcSpec::new(store_name(id), bin, args)
        }
    }

    pub fn alloc_spec(&self, id: u64, bin: &Path, set: &SetArgs) -> ProcSpec {
        let store: Vec<String> = members(set_of(id))
            .map(|j| format!("{j}={}", self.alloc_store[&(id, j)].addr()))
            .collect();
        let mut args = vec![
            format!("--node-id={id}"),
            format!("--listen={}", self.alloc_addr[&id]),
            format!("--advertise={}", self.client_alloc[&id].addr()),
            format!("--store={}", store.join(",")),
            // Every Release arrives once more 1–2 s late, as a retry after a lost reply can: the
            // store must apply it only under the epoch it names (the term-alloc-twice fault hands
            // ranges back and forth inside that window).
            format!("--test-repeat-releases-after-ms={REPEAT_RELEASES_AFTER_MS}"),
        ];
        if let Some(dir) = &set.id_clock_dir {
            args.push(format!("--test-clock-file={}", clock_file(dir, id).display()));
        }
        match set.front {
            crate::front_workload::Front::Grpc => {}
            crate::front_workload::Front::Http => args.push(format!("--http-listen={}", self.front_addr[&id])),
            crate::front_workload::Front::Resp => args.push(format!("--resp-listen={}", self.front_addr[&id])),
            crate::front_workload::Front::RespCluster => {
                args.push(format!("--resp-cluster-listen={}", self.front_addr[&id]))
            }
        }
        args.extend(set.alloc_extra.iter().cloned());
        ProcSpec::new(alloc_name(id), bin, args)
    }

    /// Direct StoreSvr addresses (no proxy) of `set`, for the simulator's own observers.
    pub fn store_seeds(&self, set: u64) -> Vec<seqsvr_control::Seed> {
        members(set)
            .map(|i| seqsvr_control::Seed {
                node_id: Some(seqsvr_proto::NodeId(i)),
                addr: self.store_addr[&i].to_string(),
            })
            .collect()
    }

    /// `ID=ADDR,…` of `set`'s StoreSvrs, direct, as `seqctl --store` and the cluster map take them.
    pub fn store_list(&self, set: u64) -> String {
        self.peers(set)
    }

    /// The client→AllocSvr proxy addresses, as client seeds.
    pub fn client_seeds(&self) -> Vec<String> {
        self.client_alloc.values().map(|p| p.addr().to_string()).collect()
    }

    pub fn all_proxies(&self) -> impl Iterator<Item = &Proxy> {
        self.raft
            .values()
            .chain(self.alloc_store.values())
            .chain(self.client_alloc.values())
    }

    /// Every link back to pass (the final heal).
    pub fn heal_all(&self) {
        for p in self.all_proxies() {
            p.set(LinkMode::PASS);
        }
    }
}

/// Per-run data directory: `--data-dir` or a fresh one under the system temp dir. A directory
/// that already holds a run's server data is refused: the StoreSvrs would restore an old set
/// with other ports and the history would mix two runs.
pub fn data_dir(given: Option<&Path>, seed: u64) -> io::Result<PathBuf> {
    let dir = match given {
        Some(d) => d.to_path_buf(),
        None => std::env::temp_dir().join(format!("seqsvr-sim-{seed}-{}", std::process::id())),
    };
    for i in 1..=N {
        if dir.join(store_name(i)).exists() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} already holds a run; give an empty --data-dir", dir.display()),
            ));
        }
    }
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
