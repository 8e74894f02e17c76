//! `sim load`: the workload and the recorder of `sim run`, pointed at a cluster the simulator did
//! not start (another host, network namespaces, a Kubernetes namespace), with the faults injected
//! by whoever runs that cluster.
//!
//! Phases: wait until every section has been served once; run the seeded routing clients and one
//! pinned (stale-route) client per AllocSvr for the duration; read the faults and moves the
//! operator injected from an events file (wall-clock times, turned into the run's clock); verify
//! that every touched uid is served again; write the history. The caller judges it with the same
//! checkers as `sim run` ([`crate::checks::check_all`]).
//!
//! The events file has one event a line, times in ns since the Unix epoch (`date +%s%N`):
//! `fault KIND TARGET START END` and `move OP FROM TO SECTION_BEGIN SECTION_END START END` (a
//! completed move; a cancelled one is left out). Both sides read the same machine's clock.
//!
//! Deliberately left out: P2 and P3, which need the StoreSvrs' `max_seq` (final Load and polls), and
//! process crashes and panics, which only the cluster's owner can see in its logs.

use crate::history::{FaultSpan, HistoryWriter, MoveSpan, Record, RunClock, RunInfo};
use crate::workload::{PINNED_CLIENT_BASE, Recorder, WorkloadParams, hot_uids, pinned_conn, run_client, run_pinned};
use anyhow::{Context, bail};
use seqsvr_client::{Client, ClientConfig};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::sleep;

/// What `sim load` needs, validated by the caller.
#[derive(Clone, Debug)]
pub struct LoadOpts {
    pub seed: u64,
    /// AllocSvr addresses (`host:port`) as the cluster advertises them.
    pub alloc: Vec<String>,
    pub duration: Duration,
    pub clients: u32,
    pub rate_per_client: f64,
    /// The set parameters the cluster was started with (the checkers need them).
    pub section_size: u64,
    pub uid_limit: u64,
    pub step: u64,
    pub lease_ms: u64,
    /// Where the history goes (created).
    pub history: PathBuf,
    /// The operator's faults and moves, read after the workload (absent: a fault-free run).
    pub events: Option<PathBuf>,
    pub replay: String,
}

/// Records a history against the external cluster; returns its path. Errors are harness
/// failures (the cluster never served, the events file is unreadable), not verdicts.
pub async fn record(opts: &LoadOpts) -> anyhow::Result<PathBuf> {
    let clock = RunClock::start();
    let start_unix_ns = unix_ns_now();
    let mut info = RunInfo {
        seed: opts.seed,
        section_size: opts.section_size,
        uid_limit: opts.uid_limit,
        step: opts.step,
        lease_ms: opts.lease_ms,
        fault_free: opts.events.is_none(),
        replay: opts.replay.clone(),
        verify_from_ns: None,
        ids: None,
        key_placement: Default::default(),
    };
    let history = Arc::new(
        HistoryWriter::create(&opts.history, clock, &info)
            .with_context(|| format!("cannot create {}", opts.history.display()))?,
    );
    let rec = Arc::new(Recorder::new(history.clone()));
    let cfg = ClientConfig::new(opts.alloc.clone());
    let probe = Client::connect(cfg.clone()).await.context("client connect")?;
    crate::verify::serve_every_section(&probe, &rec, opts.section_size, opts.uid_limit).await?;
    println!("sim load: every section served; workload for {:?}", opts.duration);

    let stop = Arc::new(AtomicBool::new(false));
    let workers = start_workload(opts, &cfg, &rec, &stop).await?;
    sleep(opts.duration).await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.context("workload client")?;
    }
    if let Some(path) = &opts.events {
        for r in read_events(path, start_unix_ns)? {
            history.write(&r)?;
        }
    }
    let verify_from = clock.now_ns();
    let touched = crate::verify::touched_uids(&rec);
    println!("sim load: verifying {} touched uids are served again", touched.len());
    crate::verify::verify_served(&probe, &rec, &touched).await;
    info.verify_from_ns = Some(verify_from);
    history.write(&Record::Info(info))?;
    history.flush()?;
    let c = &rec.counters;
    println!(
        "sim load: {} calls ({} failed, {} unknown) recorded in {}",
        c.calls.load(Ordering::Relaxed),
        c.failed.load(Ordering::Relaxed),
        c.unknown.load(Ordering::Relaxed),
        opts.history.display()
    );
    Ok(opts.history.clone())
}

fn unix_ns_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn workload_params(opts: &LoadOpts) -> WorkloadParams {
    WorkloadParams {
        seed: opts.seed,
        clients: opts.clients,
        rate_per_client: opts.rate_per_client,
        section_size: opts.section_size,
        uid_limit: opts.uid_limit,
        hot_per_section: 4,
        max_batch: 16,
        max_block: 0,
        keys: 0,
    }
}

/// The routing clients, and one pinned client per AllocSvr (a stale route cache: it keeps asking
/// that node, so a node that serves after losing its lease shows in the history).
async fn start_workload(
    opts: &LoadOpts,
    cfg: &ClientConfig,
    rec: &Arc<Recorder>,
    stop: &Arc<AtomicBool>,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let wp = workload_params(opts);
    let hot = Arc::new(hot_uids(&wp));
    let mut workers = Vec::new();
    for c in 1..=opts.clients {
        let client = Client::connect(cfg.clone()).await.context("client connect")?;
        let worker = run_client(client, c, wp.clone(), hot.clone(), rec.clone(), stop.clone());
        workers.push(tokio::spawn(worker));
    }
    for (i, addr) in opts.alloc.iter().enumerate() {
        let Some(conn) = pinned_conn(addr, Duration::from_secs(1)) else {
            bail!("--alloc {addr:?} is not host:port");
        };
        let pinned = WorkloadParams {
            rate_per_client: opts.rate_per_client / 2.0,
            ..wp.clone()
        };
        let id = PINNED_CLIENT_BASE + 1 + i as u32;
        workers.push(tokio::spawn(run_pinned(
            conn,
            id,
            pinned,
            hot.clone(),
            rec.clone(),
            stop.clone(),
        )));
    }
    Ok(workers)
}

/// Reads the events file into history records on the run's clock (`start_unix_ns` = its zero).
pub fn read_events(path: &Path, start_unix_ns: u64) -> anyhow::Result<Vec<Record>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read events {}", path.display()))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let faults = out.iter().filter(|r| matches!(r, Record::Fault(_))).count();
        let r = parse_event(line, faults as u64 + 1, start_unix_ns)
            .with_context(|| format!("{} line {}: {line:?}", path.display(), n + 1))?;
        out.push(r);
    }
    Ok(out)
}

/// One line of the events file (see the module doc); `id` numbers the faults.
fn parse_event(line: &str, id: u64, start_unix_ns: u64) -> anyhow::Result<Record> {
    let f: Vec<&str> = line.split_whitespace().collect();
    let num = |s: &str| s.parse::<u64>().with_context(|| format!("{s:?} is not a number"));
    let at = |s: &str| num(s).map(|t| t.saturating_sub(start_unix_ns));
    match f.as_slice() {
        ["fault", kind, target, start, end] => {
            let (start_ns, end_ns) = (at(start)?, at(end)?);
            if end_ns < start_ns {
                bail!("a fault that ends before it starts");
            }
            Ok(Record::Fault(FaultSpan {
                id,
                kind: kind.to_string(),
                target: target.to_string(),
                start_ns,
                end_ns,
            }))
        }
        ["move", op, from, to, begin, end, start, done] => {
            let (start_ns, end_ns) = (at(start)?, at(done)?);
            let sections = (num(begin)?, num(end)?);
            if end_ns < start_ns || sections.1 <= sections.0 {
                bail!("a move that ends before it starts, or an empty section range");
            }
            Ok(Record::Move(MoveSpan {
                op: num(op)?,
                sections,
                from: num(from)?,
                to: num(to)?,
                start_ns,
                end_ns,
                done: true,
            }))
        }
        _ => bail!("expected `fault KIND TARGET START END` or `move OP FROM TO BEGIN END START END`"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_turn_into_records_on_the_run_clock() {
        let f = parse_event("fault partition s0-store1 1500 2500", 1, 1000).unwrap();
        let Record::Fault(f) = f else { panic!("{f:?}") };
        assert_eq!(
            (f.kind.as_str(), f.target.as_str(), f.start_ns, f.end_ns),
            ("partition", "s0-store1", 500, 1500)
        );
        let m = parse_event("move 7 0 1 0 4 1200 1900", 2, 1000).unwrap();
        let Record::Move(m) = m else { panic!("{m:?}") };
        assert_eq!(
            (m.op, m.from, m.to, m.sections, m.start_ns, m.end_ns, m.done),
            (7, 0, 1, (0, 4), 200, 900, true)
        );
        // An event from before the run started is clamped to its start.
        let Record::Fault(f) = parse_event("fault x y 10 20", 3, 1000).unwrap() else {
            panic!()
        };
        assert_eq!((f.start_ns, f.end_ns), (0, 0));
    }

    #[test]
    fn malformed_events_are_refused() {
        for bad in [
            "fault partition s0 1",
            "fault partition s0 20 10",
            "move 1 0 1 4 4 10 20",
            "move 1 0 1 0 4 x 20",
            "cut a b 1 2",
        ] {
            assert!(parse_event(bad, 1, 0).is_err(), "{bad}");
        }
    }
}
