//! A local cluster for the benchmarks: one 3-replica StoreSvr set and any number of AllocSvrs, each
//! a real process started through [`Supervisor`] (killed when it is dropped), on loopback.
//! [`crate::setup`] makes the usual one-AllocSvr cluster of these parts.
//!
//! Also what the measurements need around it: the leader's Status and route table, waiting until
//! the arbiter has balanced the sections over every AllocSvr and they serve, touching a range of
//! uids once, reading the store's write counters, and waiting for a quiet machine.
//!
//! Deliberately left out: restarts and faults (the simulator's and the e2e tests' job), and a second
//! set.

use std::path::{Path, PathBuf};
use std::time::Duration;

use seqsvr_harness::{ProcSpec, Supervisor};
use seqsvr_proto::limits::{self, MAX_UIDS_PER_BATCH};
use seqsvr_proto::pb;
use seqsvr_proto::pb::alloc_service_client::AllocServiceClient;
use seqsvr_proto::pb::store_service_client::StoreServiceClient;
use tokio::time::Instant;
use tonic::transport::Channel;

use crate::procfs;

/// The server binaries, next to the running benchmark.
pub struct Binaries {
    pub storesvr: PathBuf,
    pub allocsvr: PathBuf,
}

/// Finds `storesvr` and `allocsvr` beside this executable; the error says how to build them.
pub fn binaries() -> Result<Binaries, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find own binary: {e}"))?;
    let dir = exe.parent().ok_or("binary has no parent dir")?;
    let b = Binaries {
        storesvr: dir.join("storesvr"),
        allocsvr: dir.join("allocsvr"),
    };
    for p in [&b.storesvr, &b.allocsvr] {
        if !p.exists() {
            return Err(format!(
                "{} not found; build first: cargo build --release -p seqsvr-bench -p storesvr -p allocsvr --bins",
                p.display()
            ));
        }
    }
    Ok(b)
}

/// The running StoreSvr set.
pub struct Stores {
    pub addrs: Vec<String>,
    pub metrics: Vec<String>,
    /// `id=addr` items, as `--peers` and `--store` take them.
    pub peers: Vec<String>,
    pub pids: Vec<u32>,
    pub leader: String,
}

/// One running AllocSvr.
pub struct AllocNode {
    pub node_id: u64,
    pub addr: String,
    pub metrics: String,
    pub pid: u32,
}

/// Starts 3 StoreSvr replicas of a fresh set with this `step` and `section_size` (default uid
/// limit 2^32, default leases) and waits for a leader.
pub async fn start_stores(
    procs: &mut Supervisor,
    storesvr: &Path,
    dir: &Path,
    step: u64,
    section_size: u64,
) -> Result<Stores, String> {
    start_stores_with(procs, storesvr, dir, step, section_size, &[]).await
}

/// [`start_stores`] with `extra` flags for every replica (e.g. `--uid-limit`).
pub async fn start_stores_with(
    procs: &mut Supervisor,
    storesvr: &Path,
    dir: &Path,
    step: u64,
    section_size: u64,
    extra: &[String],
) -> Result<Stores, String> {
    let addrs: Vec<String> = (0..3).map(|_| seqsvr_harness::free_addr()).collect();
    let metrics: Vec<String> = (0..3).map(|_| seqsvr_harness::free_addr()).collect();
    let peers: Vec<String> = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}={a}", i + 1))
        .collect();
    let mut pids = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let id = i + 1;
        let name = format!("store{id}");
        let mut args = vec![
            format!("--node-id={id}"),
            format!("--listen={addr}"),
            format!("--data-dir={}", dir.join(&name).display()),
            "--set-id=0".to_string(),
            format!("--peers={}", peers.join(",")),
            "--new-replica".into(), // a fresh temp dir, started once
            format!("--step={step}"),
            format!("--section-size={section_size}"),
            format!("--metrics-listen={}", metrics[i]),
        ];
        args.extend(crate::tls::flags(seqsvr_auth::Role::StoreSvr));
        args.extend(extra.iter().cloned());
        if id == 1 {
            args.push("--bootstrap".into());
        }
        let spec = ProcSpec {
            env: vec![("RUST_LOG".into(), "warn".into())],
            ..ProcSpec::new(&name, storesvr, args)
        };
        pids.push(procs.spawn(spec).map_err(|e| format!("cannot start {name}: {e}"))?);
    }
    let leader = wait_leader(&addrs, Duration::from_secs(30)).await?;
    Ok(Stores {
        addrs,
        metrics,
        peers,
        pids,
        leader,
    })
}

/// Starts AllocSvr `node_id` registered with `stores` (it does not wait for ownership).
pub fn start_allocsvr(
    procs: &mut Supervisor,
    allocsvr: &Path,
    node_id: u64,
    stores: &Stores,
) -> Result<AllocNode, String> {
    start_allocsvr_with(procs, allocsvr, node_id, stores, &[])
}

/// [`start_allocsvr`] with `extra` flags (e.g. `--http-listen`).
pub fn start_allocsvr_with(
    procs: &mut Supervisor,
    allocsvr: &Path,
    node_id: u64,
    stores: &Stores,
    extra: &[String],
) -> Result<AllocNode, String> {
    let addr = seqsvr_harness::free_addr();
    let metrics = seqsvr_harness::free_addr();
    let name = format!("alloc{node_id}");
    let mut args = vec![
        format!("--node-id={node_id}"),
        format!("--listen={addr}"),
        format!("--store={}", stores.peers.join(",")),
        format!("--metrics-listen={metrics}"),
    ];
    args.extend(crate::tls::flags(seqsvr_auth::Role::AllocSvr));
    args.extend(extra.iter().cloned());
    let spec = ProcSpec {
        env: vec![("RUST_LOG".into(), "warn".into())],
        ..ProcSpec::new(&name, allocsvr, args)
    };
    let pid = procs.spawn(spec).map_err(|e| format!("cannot start {name}: {e}"))?;
    Ok(AllocNode {
        node_id,
        addr,
        metrics,
        pid,
    })
}

/// A channel to `addr` with `TCP_NODELAY` and bounded connect and call times.
pub async fn connect(addr: &str) -> Result<Channel, String> {
    seqsvr_auth::endpoint(addr, crate::tls::client().as_deref())?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("cannot connect to {addr}: {e}"))
}

/// `n` separate connections to `addr` (one HTTP/2 connection is driven by one task on each side).
pub async fn channels(addr: &str, n: usize) -> Result<Vec<AllocServiceClient<Channel>>, String> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let client = AllocServiceClient::new(connect(addr).await?)
            .max_decoding_message_size(limits::DATA_PLANE_MESSAGE_BYTES)
            .max_encoding_message_size(limits::DATA_PLANE_MESSAGE_BYTES);
        out.push(client);
    }
    Ok(out)
}

/// Channels used at `concurrency`: one per 32 callers, 1..=8 (as alloc-bench).
pub fn channel_count(concurrency: usize) -> usize {
    (concurrency / 32).clamp(1, 8)
}

pub async fn status(addr: &str) -> Option<pb::StatusReply> {
    let ch = connect(addr).await.ok()?;
    StoreServiceClient::new(ch)
        .max_decoding_message_size(limits::STORE_MESSAGE_BYTES)
        .max_encoding_message_size(limits::STORE_MESSAGE_BYTES)
        .status(pb::StatusRequest {})
        .await
        .ok()
        .map(|r| r.into_inner())
}

/// The leader's address, once one is elected and the set's parameters exist.
async fn wait_leader(addrs: &[String], limit: Duration) -> Result<String, String> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        for a in addrs {
            if let Some(s) = status(a).await
                && s.leader_id != 0
                && s.params.is_some()
                && let Some(l) = addrs.get(s.leader_id as usize - 1)
            {
                return Ok(l.clone());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("no StoreSvr leader within {limit:?}"))
}

/// True when every section is owned and each of `k` live AllocSvrs owns its balanced share
/// (the arbiter cuts the sections into `k` runs of ⌊n/k⌋ or ⌈n/k⌉).
pub fn balanced(s: &pb::StatusReply, k: usize) -> bool {
    let live: Vec<&pb::AllocSvrInfo> = s.allocsvrs.iter().filter(|a| a.alive).collect();
    let share = s.sections_total / k.max(1) as u64;
    s.sections_total > 0
        && s.sections_owned == s.sections_total
        && live.len() == k
        && live.iter().all(|a| a.sections_owned >= share)
}

/// Waits until the leader reports the sections balanced over `k` AllocSvrs.
pub async fn wait_balanced(leader: &str, k: usize, limit: Duration) -> Result<pb::StatusReply, String> {
    let deadline = Instant::now() + limit;
    let mut last = None;
    while Instant::now() < deadline {
        if let Some(s) = status(leader).await {
            if balanced(&s, k) {
                return Ok(s);
            }
            last = Some(s);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let owned: Vec<(u64, u64)> = last
        .map(|s| s.allocsvrs.iter().map(|a| (a.node_id, a.sections_owned)).collect())
        .unwrap_or_default();
    Err(format!(
        "sections not balanced over {k} AllocSvrs within {limit:?} (node, sections): {owned:?}"
    ))
}

/// The set's route table, from the leader.
pub async fn routes(leader: &str) -> Result<pb::RouteTable, String> {
    let ch = connect(leader).await?;
    StoreServiceClient::new(ch)
        .max_decoding_message_size(limits::STORE_MESSAGE_BYTES)
        .max_encoding_message_size(limits::STORE_MESSAGE_BYTES)
        .get_routes(pb::GetRoutesRequest {})
        .await
        .map_err(|e| format!("GetRoutes: {e}"))?
        .into_inner()
        .routes
        .ok_or_else(|| "GetRoutes: no table".to_string())
}

/// Waits until `GetCurSeq` (a read: consumes nothing) answers OK for every uid of `uids`; returns
/// the AllocSvr's route version, so that later calls carry it and get no table back.
pub async fn wait_serving(client: &AllocServiceClient<Channel>, uids: &[u64], limit: Duration) -> Result<u64, String> {
    let deadline = Instant::now() + limit;
    let mut pending: Vec<u64> = uids.to_vec();
    let mut version = 0;
    while Instant::now() < deadline {
        let mut still = Vec::new();
        for uid in &pending {
            let req = pb::GetCurSeqRequest {
                uid: *uid,
                route_version: version,
            };
            match client.clone().get_cur_seq(req).await {
                Ok(r) if r.get_ref().outcome == pb::Outcome::Ok as i32 => version = r.get_ref().route_version,
                _ => still.push(*uid),
            }
        }
        if still.is_empty() {
            return Ok(version);
        }
        pending = still;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!(
        "{} uids not served within {limit:?} (e.g. {:?})",
        pending.len(),
        pending.first()
    ))
}

/// The store's write counters at one instant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StoreReading {
    /// The leader's applied Raft index: one per entry.
    pub applied_index: u64,
    /// Section bumps committed (`storesvr_bump_items_total`; only the leader's count grows).
    pub bump_items: f64,
    /// Bump RPCs the AllocSvrs sent (`allocsvr_bump_rpcs_total`, summed).
    pub bump_rpcs: f64,
    /// CPU seconds of the leader process so far.
    pub leader_cpu: f64,
}

/// Reads the counters; fails when the leader changed (the figures would mix two logs).
pub async fn read_store(stores: &Stores, allocs: &[AllocNode]) -> Result<StoreReading, String> {
    let s = status(&stores.leader)
        .await
        .ok_or_else(|| format!("no Status from the leader {}", stores.leader))?;
    let idx = (s.leader_id as usize).checked_sub(1);
    if idx.and_then(|i| stores.addrs.get(i)) != Some(&stores.leader) {
        return Err("the StoreSvr leader changed during the benchmark".into());
    }
    let sum = |addrs: &mut dyn Iterator<Item = &String>, metric: &str| -> Result<f64, String> {
        addrs
            .map(|m| procfs::scrape(m, metric, None))
            .sum::<Option<f64>>()
            .ok_or_else(|| format!("cannot read {metric}"))
    };
    Ok(StoreReading {
        applied_index: s.applied_index,
        bump_items: sum(&mut stores.metrics.iter(), "storesvr_bump_items_total")?,
        bump_rpcs: sum(&mut allocs.iter().map(|a| &a.metrics), "allocsvr_bump_rpcs_total")?,
        leader_cpu: idx
            .and_then(|i| stores.pids.get(i))
            .and_then(|p| procfs::cpu_seconds(*p))
            .unwrap_or(0.0),
    })
}

/// Fetches every uid of `[first, first + count)` once, in batches of [`MAX_UIDS_PER_BATCH`], four
/// calls in flight; fails if any uid was not served. Requests are made as they are sent (10^8 uids
/// would be 800 MB of requests built up front).
pub async fn touch(
    clients: &[AllocServiceClient<Channel>],
    first: u64,
    count: u64,
    route_version: u64,
) -> Result<(), String> {
    in_batches(clients, count, "uids", move |mut client, lo, hi| async move {
        let req = pb::BatchFetchNextSeqRequest {
            uids: (first + lo..first + hi).collect(),
            route_version,
        };
        let r = tokio::time::timeout(Duration::from_secs(5), client.batch_fetch_next_seq(req)).await;
        unserved(r.ok().and_then(Result::ok).map(|r| r.into_inner().outcomes), hi - lo)
    })
    .await
}

/// How many of `asked` items a batch reply's `outcomes` did not serve (all of them without a reply).
pub fn unserved(outcomes: Option<Vec<i32>>, asked: u64) -> u64 {
    match outcomes {
        Some(o) => asked - o.iter().filter(|&&o| o == pb::Outcome::Ok as i32).count() as u64,
        None => asked,
    }
}

/// Runs `call(client, lo, hi)` for every batch `[lo, hi)` of [`MAX_UIDS_PER_BATCH`] items of
/// `0..count`, four in flight over `clients`; `call` answers how many of its items were not
/// served, and any fails the whole (naming `what` the items are).
pub async fn in_batches<F, Fut>(
    clients: &[AllocServiceClient<Channel>],
    count: u64,
    what: &str,
    call: F,
) -> Result<(), String>
where
    F: Fn(AllocServiceClient<Channel>, u64, u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = u64> + Send,
{
    const IN_FLIGHT: u64 = 4;
    let per_call = MAX_UIDS_PER_BATCH as u64;
    let calls = count.div_ceil(per_call);
    let mut tasks = Vec::new();
    for t in 0..IN_FLIGHT.min(calls) {
        let (client, call) = (clients[t as usize % clients.len()].clone(), call.clone());
        tasks.push(tokio::spawn(async move {
            let mut not_ok = 0u64;
            for n in (t..calls).step_by(IN_FLIGHT as usize) {
                let (lo, hi) = (n * per_call, ((n + 1) * per_call).min(count));
                not_ok += call(client.clone(), lo, hi).await;
            }
            not_ok
        }));
    }
    let mut not_ok = 0;
    for t in tasks {
        not_ok += t.await.map_err(|e| format!("touch task: {e}"))?;
    }
    match not_ok {
        0 => Ok(()),
        n => Err(format!("{n} of {count} {what} not served while touching them")),
    }
}

/// Fails when a started process exited.
pub fn check_alive(procs: &mut Supervisor) -> Result<(), String> {
    let dead: Vec<String> = procs.take_unexpected_exits().into_iter().map(|(n, _)| n).collect();
    if dead.is_empty() {
        Ok(())
    } else {
        Err(format!("process(es) exited during the benchmark: {dead:?}"))
    }
}

/// Waits (at most `limit`) until processes this benchmark did not start use less than `below_pct`
/// percent of one core over half a second: the two cores are shared with other work.
pub async fn wait_quiet(ours: &[u32], below_pct: f64, limit: Duration) {
    let deadline = Instant::now() + limit;
    let me = std::process::id();
    let foreign = || {
        let ours_cpu: f64 = ours.iter().chain([&me]).filter_map(|p| procfs::cpu_seconds(*p)).sum();
        procfs::machine_busy_seconds().unwrap_or(0.0) - ours_cpu
    };
    let mut waited = false;
    loop {
        let f0 = foreign();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let pct = (foreign() - f0) * 100.0 / 0.5;
        if pct < below_pct {
            if waited {
                println!("  (machine quiet again: foreign load {pct:.0} %)");
            }
            return;
        }
        if Instant::now() >= deadline {
            println!("  (gave up waiting for a quiet machine: foreign load {pct:.0} %)");
            return;
        }
        if !waited {
            println!("  (waiting for foreign load {pct:.0} % to drop below {below_pct} %)");
            waited = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(node_id: u64, owned: u64, alive: bool) -> pb::AllocSvrInfo {
        pb::AllocSvrInfo {
            node_id,
            alive,
            sections_owned: owned,
            ..Default::default()
        }
    }

    #[test]
    fn balanced_needs_every_share() {
        let mut s = pb::StatusReply {
            sections_total: 10,
            sections_owned: 10,
            allocsvrs: vec![info(1, 3, true), info(2, 3, true), info(3, 4, true)],
            ..Default::default()
        };
        assert!(balanced(&s, 3));
        assert!(!balanced(&s, 2), "three live nodes, two expected");
        s.allocsvrs[0] = info(1, 2, true);
        s.allocsvrs[2] = info(3, 5, true);
        assert!(!balanced(&s, 3), "node 1 below its share of 3");
        s.allocsvrs[0] = info(1, 3, false);
        assert!(!balanced(&s, 3), "a dead node does not count");
        s.sections_owned = 9;
        assert!(!balanced(&s, 2));
    }
}
