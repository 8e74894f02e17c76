//! The cluster of `sim run`: starting every set's StoreSvrs and AllocSvrs and waiting until they
//! serve, the background readers of the StoreSvrs (the `max_seq` poller for P3, the progress
//! line), healing after the faults, the final linearizable Load (P2), and stopping everything.
//!
//! Deliberately left out: what happens to the processes in between (see `faults`).

use super::{Lab, ReplicaClient, RunOpts, moves};
use crate::history::{HistoryWriter, Poll, Record, RunClock, write_max_seqs};
use crate::topology::{N, Topology};
use crate::workload::Counters;
use anyhow::{Context, bail};
use seqsvr_control::{StoreClient, StoreTimeouts};
use seqsvr_harness::{PanicLine, Supervisor, find_binary};
use seqsvr_proto::pb;
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::time::{Instant, sleep};

use crate::verify::READY_TIMEOUT;

pub(super) const POLL_EVERY: Duration = Duration::from_millis(500);
pub(super) const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Starts every set's StoreSvr group, waits for their leaders, then the AllocSvrs; waits until
/// every section is owned (all in set 0) and puts the other sets into the cluster map.
pub(super) async fn start_cluster(
    opts: &RunOpts,
    dir: &Path,
    topo: &Topology,
) -> anyhow::Result<(Supervisor, Vec<StoreClient>)> {
    let store_bin = find_binary("storesvr", opts.bin_dir.as_deref())?;
    let alloc_bin = find_binary("allocsvr", opts.bin_dir.as_deref())?;
    let mut cluster = Supervisor::new(&dir.join("logs"))?;
    let all = 1..=opts.sets * N;
    for i in all.clone() {
        cluster.spawn(topo.store_spec(i, &store_bin, dir, &opts.set))?;
    }
    let timeouts = StoreTimeouts {
        attempt: Duration::from_millis(500),
        overall: Duration::from_secs(5),
    };
    let mut stores = Vec::new();
    for set in 0..opts.sets {
        // Status, routes and the final Load of every ceiling: Load is an AllocSvr's call.
        let dialer = seqsvr_control::Dialer::with_tls(crate::tls::allocsvr());
        let store = StoreClient::with_dialer(topo.store_seeds(set), timeouts, &dialer).map_err(anyhow::Error::msg)?;
        wait_for_leader(&store).await?;
        stores.push(store);
    }
    for i in all {
        cluster.spawn(topo.alloc_spec(i, &alloc_bin, &opts.set))?;
    }
    wait_for_owners(&stores[0]).await?;
    for set in 1..opts.sets {
        moves::add_set(topo, set).await?;
    }
    Ok((cluster, stores))
}

/// Stops every process; the panics found in their logs and the crashes seen during the run.
pub(super) async fn stop_cluster(lab: &Lab) -> anyhow::Result<(Vec<PanicLine>, Vec<String>)> {
    let mut cluster = lab.cluster.lock().await;
    let exits = cluster.take_unexpected_exits();
    cluster.kill_all();
    let mut crashes = lab.crashes.lock().unwrap_or_else(|e| e.into_inner()).clone();
    crashes.extend(exits.into_iter().map(|(n, s)| crash_line(&cluster, &n, &s)));
    Ok((cluster.scan_panics()?, crashes))
}

/// Writes the final `max_seq` of every section into the history and `max_seqs.json`.
pub(super) async fn record_final_state(
    lab: &Lab,
    history: &HistoryWriter,
    clock: RunClock,
    max_path: &Path,
) -> anyhow::Result<std::collections::BTreeMap<u64, u64>> {
    let final_max = final_load(lab).await?;
    history.write(&Record::Poll(Poll {
        at_ns: clock.now_ns(),
        source: "leader".into(),
        max_seqs: final_max.iter().map(|(&s, &m)| (s, m)).collect(),
        sum: None,
    }))?;
    write_max_seqs(max_path, &final_max)?;
    Ok(final_max)
}

pub(super) async fn wait_for_leader(store: &StoreClient) -> anyhow::Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Ok(s) = store.status().await
            && s.leader_id != 0
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("no StoreSvr leader within {READY_TIMEOUT:?}");
        }
        sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until every AllocSvr owns some sections and no section is unowned.
pub(super) async fn wait_for_owners(store: &StoreClient) -> anyhow::Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Ok(r) = store.get_routes().await
            && let Some(t) = r.routes
        {
            let owners: HashSet<u64> = t.entries.iter().map(|e| e.node_id).collect();
            if owners.len() == N as usize && t.entries.iter().all(|e| e.incarnation != 0) {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!("AllocSvrs did not all own sections within {READY_TIMEOUT:?}");
        }
        sleep(Duration::from_millis(100)).await;
    }
}

/// Every section's `max_seq`, read linearizably from the set that owns it (all of them, or an error
/// once the deadline passes).
pub(super) async fn final_load(lab: &Lab) -> anyhow::Result<BTreeMap<u64, u64>> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let mut all = BTreeMap::new();
        for set in 0..lab.stores.len() as u64 {
            if let Ok(found) = load_owned(lab, set).await {
                all.extend(found);
            }
        }
        if all.len() as u64 == lab.sections {
            return Ok(all);
        }
        if Instant::now() > deadline {
            bail!("the final Loads returned {} of {} sections", all.len(), lab.sections);
        }
        sleep(Duration::from_millis(200)).await;
    }
}

/// `(section, max_seq)` of every section set `set` serves, in one linearizable Load from its
/// leader. Fails when the set's route table cannot be read or the Load is refused (a move changed
/// what the set owns in between).
pub(super) async fn load_owned(lab: &Lab, set: u64) -> anyhow::Result<Vec<(u64, u64)>> {
    let store = &lab.stores[set as usize];
    let routes = store.get_routes().await?.routes.context("no route table")?;
    let sections: Vec<pb::SectionRange> = routes
        .entries
        .iter()
        .filter(|e| e.set_id == set)
        .map(|e| pb::SectionRange {
            begin: e.section_begin,
            end: e.section_end,
        })
        .collect();
    if sections.is_empty() {
        return Ok(vec![]);
    }
    let r = store.load(pb::LoadRequest { sections }).await?;
    if r.not_leader.is_some() {
        bail!("set {set}: not the leader");
    }
    Ok(r.sections.iter().map(|s| (s.section, s.max_seq)).collect())
}

pub(super) fn replica_clients(topo: &Topology) -> Vec<(u64, ReplicaClient)> {
    topo.store_addr
        .iter()
        .filter_map(|(&i, a)| {
            // Status and Load; Load is an AllocSvr's call.
            let ep = seqsvr_auth::endpoint(&a.to_string(), crate::tls::allocsvr().as_deref()).ok()?;
            let ch = ep
                .connect_timeout(Duration::from_millis(300))
                .timeout(Duration::from_millis(500))
                .connect_lazy();
            Some((i, ReplicaClient::new(ch)))
        })
        .collect()
}

pub(super) async fn poll_loop(lab: Arc<Lab>, stop: Arc<AtomicBool>) {
    let clock = lab.history.clock();
    while !stop.load(Ordering::Relaxed) {
        // One source for every set: a range that moves keeps its ceiling (the target installs at
        // least the source's), so `max_seq` must not go down across a move either.
        for set in 0..lab.stores.len() as u64 {
            if let Ok(max_seqs) = load_owned(&lab, set).await {
                let _ = lab.history.write(&Record::Poll(Poll {
                    at_ns: clock.now_ns(),
                    source: "leader".into(),
                    max_seqs,
                    sum: None,
                }));
            }
        }
        for (i, c) in &lab.replicas {
            let mut c = c.clone();
            if let Ok(Ok(r)) = tokio::time::timeout(Duration::from_millis(500), c.status(pb::StatusRequest {})).await {
                let _ = lab.history.write(&Record::Poll(Poll {
                    at_ns: clock.now_ns(),
                    source: format!("replica-{i}"),
                    max_seqs: vec![],
                    sum: Some(r.into_inner().max_seq_sum),
                }));
            }
        }
        let _ = lab.history.flush();
        sleep(POLL_EVERY).await;
    }
}

pub(super) async fn progress_loop(lab: Arc<Lab>, counters: Arc<Counters>, stop: Arc<AtomicBool>) {
    let started = Instant::now();
    let mut last = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        sleep(Duration::from_millis(200)).await;
        if last.elapsed() < PROGRESS_EVERY {
            continue;
        }
        last = Instant::now();
        let restarted = restart_crashed(&lab).await;
        println!(
            "sim: {:>5.0?} calls {} failed {} unknown {} faults {} crashes {}",
            started.elapsed(),
            counters.calls.load(Ordering::Relaxed),
            counters.failed.load(Ordering::Relaxed),
            counters.unknown.load(Ordering::Relaxed),
            lab.faults_done.load(Ordering::Relaxed),
            restarted,
        );
    }
}

/// Restarts processes that exited without the simulator asking; each such exit is a finding.
pub(super) async fn restart_crashed(lab: &Lab) -> usize {
    let mut cluster = lab.cluster.lock().await;
    let exits = cluster.take_unexpected_exits();
    let mut crashes = lab.crashes.lock().unwrap_or_else(|e| e.into_inner());
    for (name, status) in exits {
        println!("sim: CRASH {name} exited by itself ({status}); restarting it");
        crashes.push(crash_line(&cluster, &name, &status));
        let _ = cluster.start(&name);
    }
    crashes.len()
}

/// Lines of a crashed process's log shown with its crash: enough for a panic's message and
/// location, or a runtime's last words (`has overflowed its stack`).
const CRASH_TAIL_LINES: usize = 8;
/// Bytes of the log read for them (the log can be long; its end is what matters).
const CRASH_TAIL_BYTES: u64 = 16 * 1024;

/// `name: status`, then the last lines its log (its stdout and stderr) had when it died.
fn crash_line(cluster: &Supervisor, name: &str, status: &str) -> String {
    let tail = cluster
        .log_path(name)
        .and_then(|p| log_tail(p, CRASH_TAIL_BYTES, CRASH_TAIL_LINES).ok())
        .unwrap_or_default();
    let mut line = format!("{name}: {status}");
    for l in tail {
        line.push_str("\n    | ");
        line.push_str(&l);
    }
    line
}

/// `s` without the colour codes (`ESC [ … m`) the servers' log lines carry.
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // Up to and including the sequence's final letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The last `lines` lines within the last `bytes` bytes of a file.
fn log_tail(path: &Path, bytes: u64, lines: usize) -> std::io::Result<Vec<String>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(bytes)))?;
    let mut buf = Vec::new();
    f.read_to_end(&mut buf)?;
    let text = strip_ansi(&String::from_utf8_lossy(&buf));
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    Ok(all[all.len().saturating_sub(lines)..]
        .iter()
        .map(|l| l.to_string())
        .collect())
}

pub(super) async fn heal_everything(lab: &Lab) -> anyhow::Result<()> {
    lab.topo.heal_all();
    if let Some(dir) = &lab.clock_dir {
        super::ids::reset_clocks(dir, lab.topo.sets)?;
    }
    let mut cluster = lab.cluster.lock().await;
    let names: Vec<String> = cluster.names().map(String::from).collect();
    for n in names {
        cluster.resume(&n)?;
        if !cluster.is_running(&n) {
            cluster.start(&n)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crash_shows_the_end_of_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("allocsvr-1.log");
        let text: String = (1..=20).map(|i| format!("line {i}\n")).collect::<String>()
            + "\nthread 'tokio-runtime-worker' has overflowed its stack\nfatal runtime error: stack overflow\n";
        std::fs::write(&log, text).unwrap();
        let tail = log_tail(&log, 16 * 1024, 3).unwrap();
        assert_eq!(
            tail,
            [
                "line 20",
                "thread 'tokio-runtime-worker' has overflowed its stack",
                "fatal runtime error: stack overflow"
            ]
        );
        // Only the last bytes are read: a line cut by the window comes out partial, never more.
        assert_eq!(log_tail(&log, 8, 5).unwrap(), ["verflow"]);
        assert!(log_tail(&dir.path().join("none.log"), 8, 5).is_err());
        assert_eq!(
            strip_ansi("\x1b[2m2026\x1b[0m \x1b[32m INFO\x1b[0m serving"),
            "2026  INFO serving"
        );
    }
}
