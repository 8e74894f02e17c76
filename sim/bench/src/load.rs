//! Load loops of `alloc-bench`: `concurrency` tasks call as fast as they can for a warm-up and a
//! measured window, then stop by themselves.
//!
//! The same loop drives the echo baseline and the AllocSvr (raw tonic clients over the same number
//! of channels, the same uids), so that the only difference between the two is the server; it also
//! drives the client library and the peers (Redis, etcd: [`crate::peers`]). Calls are counted
//! only when they started after the warm-up and ended before the window closed. While the window
//! is open the CPU time of the given server processes and of the benchmark itself is sampled from
//! `/proc`, which tells where the two shared cores went.
//!
//! Deliberately left out: open-loop (fixed-rate) load. Closed loops measure the throughput limit,
//! which is what the targets compare; latency under it is queueing included, for both servers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use seqsvr_client::Coalescer;
use seqsvr_proto::pb::alloc_service_client::AllocServiceClient;
use seqsvr_proto::{Uid, pb};
use tokio::time::Instant;
use tonic::transport::Channel;

use crate::procfs::{cpu_seconds, machine_busy_seconds};

/// Longest a single call may take before it counts as an error (every RPC has a deadline).
const CALL_DEADLINE: Duration = Duration::from_secs(2);

/// Significant figures of each load task's latency histogram: 1 % resolution, far below the
/// run-to-run noise. With 3, every task's histogram spread its counts over tens of kilobytes, and
/// 256 of them missed the caches on every record: 8 % of the benchmark process's CPU in a profile
/// of the Coalescer at 256 callers, charged to every case alike.
const LATENCY_SIGFIG: u8 = 2;

/// What one call carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `FetchNextSeq` of one uid.
    Unary,
    /// `BatchFetchNextSeq` of this many uids.
    Batch(usize),
}

/// Which uids the calls ask for.
#[derive(Debug, Clone)]
pub enum Uids {
    /// Uniformly random uids of these sections.
    Spread { sections: Arc<Vec<u64>>, section_size: u64 },
    /// A handful of uids asked again and again: they cross step boundaries quickly.
    Hot { uids: Arc<Vec<u64>> },
    /// Uniformly random uids of `[first, first + count)` (`count` > 0).
    Range { first: u64, count: u64 },
    /// A batch spans exactly `span` sections (`span` <= `sections.len()`): `span` consecutive
    /// sections of the pool from a random start, uid `i` of the batch in the `i % span`-th of them,
    /// at a random offset. So the pool (and the memory touched) stays the same while `span` varies.
    Striped {
        sections: Arc<Vec<u64>>,
        section_size: u64,
        span: usize,
    },
}

impl Uids {
    pub(crate) fn pick(&self, rng: &mut u64) -> u64 {
        let r = xorshift(rng);
        match self {
            Uids::Spread { sections, section_size } => {
                let section = sections[(r % sections.len() as u64) as usize];
                section * section_size + (r >> 32) % section_size
            }
            Uids::Hot { uids } => uids[(r % uids.len() as u64) as usize],
            Uids::Range { first, count } => first + r % count,
            Uids::Striped {
                sections, section_size, ..
            } => {
                let section = sections[(r % sections.len() as u64) as usize];
                section * section_size + (r >> 32) % section_size
            }
        }
    }

    /// The uids of one batch of `n`.
    pub fn batch(&self, n: usize, rng: &mut u64) -> Vec<u64> {
        match self {
            Uids::Striped {
                sections,
                section_size,
                span,
            } => {
                let start = (xorshift(rng) % sections.len() as u64) as usize;
                (0..n)
                    .map(|i| {
                        let section = sections[(start + i % span) % sections.len()];
                        section * section_size + (xorshift(rng) >> 32) % section_size
                    })
                    .collect()
            }
            _ => (0..n).map(|_| self.pick(rng)).collect(),
        }
    }
}

/// How many loads this process has driven: each draws seeds no other load of the run draws.
static DRIVES: AtomicU64 = AtomicU64::new(0);

/// Task `t`'s first random state in the `drive_no`-th load. Seeds must differ between the loads
/// of one run, not only between tasks: a seed names a request (a ledger's request id or invoice
/// reference), and a name used again is answered with its first number, as it must be.
fn first_state(drive_no: u64, t: usize) -> u64 {
    // splitmix64 of (load, task): well spread, never zero (xorshift's fixed point) in practice.
    let mut z = (drive_no << 32 | t as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) | 1
}

fn xorshift(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    x.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// Processes whose CPU time is sampled during the window.
#[derive(Debug, Clone, Copy)]
pub struct Pids<'a> {
    /// The measured server.
    pub server: u32,
    /// The rest of the service (StoreSvr replicas); empty for the echo.
    pub others: &'a [u32],
    /// Every process the benchmark started: the rest of the machine's busy time is foreign load.
    pub ours: &'a [u32],
}

/// Warm-up, then the measured window.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub warmup: Duration,
    pub measure: Duration,
}

/// What one case measured.
pub struct Sample {
    /// Calls completed with every seq OK inside the window.
    pub calls: u64,
    /// Seqs handed out (OK) inside the window.
    pub seqs: u64,
    /// Answers that were not OK (NOT_READY, NOT_OWNER): must be 0 in a healthy run.
    pub not_ok: u64,
    /// Calls that failed or ran past [`CALL_DEADLINE`].
    pub errors: u64,
    /// Length of the window, seconds.
    pub secs: f64,
    /// Latency of counted calls, nanoseconds.
    pub hist: Histogram<u64>,
    /// CPU seconds used by the measured server process during the window.
    pub server_cpu: f64,
    /// CPU seconds used by other processes of the service (the StoreSvr replicas) during the window.
    pub other_cpu: f64,
    /// CPU seconds used by the benchmark process during the window.
    pub client_cpu: f64,
    /// CPU seconds used by processes the benchmark did not start (other work on the machine).
    pub foreign_cpu: f64,
}

impl Sample {
    pub fn calls_per_sec(&self) -> f64 {
        self.calls as f64 / self.secs
    }

    pub fn seqs_per_sec(&self) -> f64 {
        self.seqs as f64 / self.secs
    }

    /// CPU used by processes the benchmark did not start, percent of one core.
    pub fn foreign_pct(&self) -> f64 {
        self.foreign_cpu * 100.0 / self.secs
    }

    /// Latency at quantile `q`, microseconds.
    pub fn quantile_us(&self, q: f64) -> f64 {
        self.hist.value_at_quantile(q) as f64 / 1e3
    }
}

/// Per-task tally, merged into a [`Sample`].
struct Tally {
    calls: u64,
    seqs: u64,
    not_ok: u64,
    errors: u64,
    hist: Histogram<u64>,
}

impl Tally {
    fn new() -> Self {
        Self {
            calls: 0,
            seqs: 0,
            not_ok: 0,
            errors: 0,
            hist: Histogram::new_with_bounds(1_000, 60_000_000_000, LATENCY_SIGFIG).expect("histogram bounds"),
        }
    }
}

/// A call's result as the loop sees it: seqs OK, answers not OK, or an error.
pub(crate) enum Answer {
    Served { ok: u64, not_ok: u64 },
    Failed,
}

/// Drives `concurrency` tasks, each running `call` in a closed loop, through `window`. `call` gets
/// the task's index and a fresh random seed. Also drives the peers ([`crate::peers`]), so that they
/// are timed and counted exactly like the AllocSvr.
pub(crate) async fn drive<F, Fut>(concurrency: usize, window: Window, pids: Pids<'_>, call: F) -> Sample
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Answer> + Send,
{
    let call = Arc::new(call);
    let stop = Arc::new(AtomicBool::new(false));
    let drive_no = DRIVES.fetch_add(1, Ordering::Relaxed);
    let start = Instant::now();
    let measure_from = start + window.warmup;
    let stop_at = measure_from + window.measure;
    let mut tasks = Vec::with_capacity(concurrency);
    for t in 0..concurrency {
        let (call, stop) = (call.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut tally = Tally::new();
            let mut rng = first_state(drive_no, t);
            while !stop.load(Ordering::Relaxed) {
                let seed = xorshift(&mut rng);
                let t0 = Instant::now();
                let answer = tokio::time::timeout(CALL_DEADLINE, call(t, seed)).await;
                let t1 = Instant::now();
                if t0 < measure_from || t1 > stop_at {
                    continue;
                }
                match answer {
                    Ok(Answer::Served { ok, not_ok }) => {
                        tally.seqs += ok;
                        tally.not_ok += not_ok;
                        if not_ok == 0 {
                            tally.calls += 1;
                            tally.hist.saturating_record((t1 - t0).as_nanos() as u64);
                        }
                    }
                    Ok(Answer::Failed) | Err(_) => tally.errors += 1,
                }
            }
            tally
        }));
    }
    let cpu = |pids: &[u32]| -> f64 { pids.iter().filter_map(|p| cpu_seconds(*p)).sum() };
    let me = std::process::id();
    tokio::time::sleep_until(measure_from).await;
    let foreign = || machine_busy_seconds().unwrap_or(0.0) - cpu(pids.ours) - cpu(&[me]);
    let (server0, other0, client0, foreign0) = (cpu(&[pids.server]), cpu(pids.others), cpu(&[me]), foreign());
    tokio::time::sleep_until(stop_at).await;
    let (server1, other1, client1, foreign1) = (cpu(&[pids.server]), cpu(pids.others), cpu(&[me]), foreign());
    stop.store(true, Ordering::Relaxed);
    let mut total = Tally::new();
    for task in tasks {
        let t = task.await.expect("load task panicked");
        total.calls += t.calls;
        total.seqs += t.seqs;
        total.not_ok += t.not_ok;
        total.errors += t.errors;
        total.hist.add(t.hist).expect("histograms with equal bounds");
    }
    Sample {
        calls: total.calls,
        seqs: total.seqs,
        not_ok: total.not_ok,
        errors: total.errors,
        secs: window.measure.as_secs_f64(),
        hist: total.hist,
        server_cpu: server1 - server0,
        other_cpu: other1 - other0,
        client_cpu: client1 - client0,
        foreign_cpu: (foreign1 - foreign0).max(0.0),
    }
}

/// Raw tonic calls of `shape` over `clients` (task `t` uses channel `t % clients.len()`).
pub async fn raw(
    clients: &[AllocServiceClient<Channel>],
    concurrency: usize,
    shape: Shape,
    uids: Uids,
    route_version: u64,
    window: Window,
    pids: Pids<'_>,
) -> Sample {
    let clients = Arc::new(clients.to_vec());
    drive(concurrency, window, pids, move |t, seed| {
        let mut client = clients[t % clients.len()].clone();
        let mut rng = seed | 1;
        let uids = uids.clone();
        async move {
            match shape {
                Shape::Unary => {
                    let req = pb::FetchNextSeqRequest {
                        uid: uids.pick(&mut rng),
                        route_version,
                    };
                    match client.fetch_next_seq(req).await {
                        Ok(r) => {
                            let r = r.into_inner();
                            let ok = r.outcome == pb::Outcome::Ok as i32 && r.seq != 0;
                            Answer::Served {
                                ok: ok as u64,
                                not_ok: !ok as u64,
                            }
                        }
                        Err(_) => Answer::Failed,
                    }
                }
                Shape::Batch(n) => {
                    let req = pb::BatchFetchNextSeqRequest {
                        uids: uids.batch(n, &mut rng),
                        route_version,
                    };
                    match client.batch_fetch_next_seq(req).await {
                        Ok(r) => {
                            let r = r.into_inner();
                            let ok = r
                                .outcomes
                                .iter()
                                .zip(&r.seqs)
                                .filter(|(o, s)| **o == pb::Outcome::Ok as i32 && **s != 0)
                                .count() as u64;
                            Answer::Served {
                                ok,
                                not_ok: n as u64 - ok,
                            }
                        }
                        Err(_) => Answer::Failed,
                    }
                }
            }
        }
    })
    .await
}

/// Single-uid fetches through the client library's [`Coalescer`].
pub async fn coalesced(
    coalescer: Arc<Coalescer>,
    concurrency: usize,
    uids: Uids,
    window: Window,
    pids: Pids<'_>,
) -> Sample {
    drive(concurrency, window, pids, move |_, seed| {
        let coalescer = coalescer.clone();
        let mut rng = seed | 1;
        let uid = uids.pick(&mut rng);
        async move {
            match coalescer.fetch_next_seq(Uid(uid)).await {
                Ok(_) => Answer::Served { ok: 1, not_ok: 0 },
                Err(_) => Answer::Failed,
            }
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_and_tasks_draw_different_seeds() {
        let mut seen = std::collections::HashSet::new();
        for drive_no in 0..8 {
            for t in 0..256 {
                let mut state = first_state(drive_no, t);
                for _ in 0..64 {
                    assert!(
                        seen.insert(xorshift(&mut state)),
                        "load {drive_no} task {t} repeats a seed"
                    );
                }
            }
        }
    }
}
