//! `sim run --front http|resp --hostile`: the front ends under floods, beside the normal workload
//! and its promise checks. The run fails when a process dies (a crash, not a fault's kill; its log's
//! tail is printed), when an AllocSvr's memory passes `--hostile-max-rss-mib`, or when a
//! well-behaved caller's p99 with the floods passes 3x its p99 without them.
//!
//! Phases: first (`--hostile-baseline`) the workload and the well-behaved caller ([`caller`])
//! alone, no faults, no floods; then the run's `--duration` with the fault schedule and rounds of
//! floods ([`floods`]) to every AllocSvr's front end, which end by themselves with it. The memory
//! sampler ([`rss`]) runs through both.
//!
//! Deliberately left out: floods of the gRPC port and of the StoreSvrs, TLS, and any judgement
//! of how a server refuses a flood (closing, an error line, a 4xx): only what the floods do to the
//! processes and to the other callers counts.

mod caller;
mod floods;
mod rss;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::Lab;
use crate::front_workload::Front;
use crate::history::History;
use crate::workload::Recorder;
use caller::Sample;
pub use floods::FloodGroup;
use floods::Tallies;
use rss::{MIB, RssBook};

/// Descriptors this process needs beside the floods' (the cluster's clients, proxies and logs).
const OTHER_FDS: u64 = 2_000;

/// A hostile run's options (`--hostile-*`).
#[derive(Clone, Debug)]
pub struct HostileOpts {
    /// No AllocSvr's resident memory may pass this.
    pub max_rss_bytes: u64,
    /// The first phase, without floods or faults.
    pub baseline: Duration,
    /// Floods left out.
    pub skip: Vec<FloodGroup>,
    /// The nice value of the floods' thread (`--hostile-flood-nice`).
    pub flood_nice: i32,
}

/// The hostile mode while it runs.
pub(super) struct Hostile {
    front: Front,
    opts: HostileOpts,
    lab: Arc<Lab>,
    caller_at: (String, SocketAddr, u64),
    stop: Arc<AtomicBool>,
    caller: JoinHandle<Vec<Sample>>,
    sampler: JoinHandle<RssBook>,
    floods: Option<std::thread::JoinHandle<std::io::Result<()>>>,
    tallies: Arc<Tallies>,
    /// When the floods began, on the run's clock (`u64::MAX` before); the sampler reads it.
    floods_from_ns: Arc<AtomicU64>,
    fronts: usize,
}

/// What a hostile run saw, judged once the history is read back.
pub(super) struct HostileRun {
    front: Front,
    opts: HostileOpts,
    caller_at: (String, SocketAddr, u64),
    samples: Vec<Sample>,
    rss: RssBook,
    tallies: Arc<Tallies>,
    floods_from_ns: u64,
    fronts: usize,
}

/// Starts the well-behaved caller and the memory sampler. The caller takes the last uid at the
/// front end of the AllocSvr that owns it when the run starts (as a caller that knows the routes
/// would): no forwarded hop, so what it measures is the front end and the owner; when the owner
/// changes, its calls are forwarded like anyone's.
pub(super) async fn start(
    lab: &Arc<Lab>,
    opts: HostileOpts,
    front: Front,
    rec: &Arc<Recorder>,
) -> anyhow::Result<Hostile> {
    let fronts = lab.topo.front_addr.len();
    check_open_files(floods::connections_per_round(front, fronts) as u64 + OTHER_FDS)?;
    let uid = lab.uid_limit - 1;
    let (node, addr) = match owner_front(lab, uid).await {
        Some(found) => found,
        None => lab
            .topo
            .front_addr
            .iter()
            .next()
            .map(|(&n, &a)| (n, a))
            .context("no front end")?,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let caller = tokio::spawn(caller::run(
        front,
        addr,
        uid,
        rec.clone(),
        lab.history.clock(),
        stop.clone(),
    ));
    let floods_from_ns = Arc::new(AtomicU64::new(u64::MAX));
    let sampler = tokio::spawn(rss::sample(
        lab.clone(),
        opts.max_rss_bytes,
        floods_from_ns.clone(),
        stop.clone(),
    ));
    let tallies = Arc::new(Tallies::new(front, &opts.skip));
    println!(
        "sim: hostile: {:?} without floods or faults, then floods beside the faults; memory bound {} MiB",
        opts.baseline,
        opts.max_rss_bytes / MIB
    );
    Ok(Hostile {
        front,
        opts,
        lab: lab.clone(),
        caller_at: (crate::topology::alloc_name(node), addr, uid),
        stop,
        caller,
        sampler,
        floods: None,
        tallies,
        floods_from_ns,
        fronts,
    })
}

impl Hostile {
    /// The first phase: waits it out.
    pub(super) async fn first_phase(&self) {
        tokio::time::sleep(self.opts.baseline).await;
    }

    /// Starts the rounds of floods, which end by themselves after `duration`.
    pub(super) fn start_floods(&mut self, duration: Duration) {
        self.floods_from_ns
            .store(self.lab.history.clock().now_ns(), Ordering::Relaxed);
        let addrs: Vec<SocketAddr> = self.lab.topo.front_addr.values().copied().collect();
        println!(
            "sim: hostile: floods to {} front ends for {duration:?}, rounds of up to {:?}, from a thread at nice {}",
            addrs.len(),
            floods::ROUND,
            self.opts.flood_nice
        );
        let drive = floods::drive(
            self.front,
            addrs,
            Instant::now() + duration,
            self.stop.clone(),
            self.tallies.clone(),
            self.lab.history.clock(),
        );
        // The floods' thousands of tasks get a runtime and a thread of their own: on the run's
        // runtime they would queue the workload's and the well-behaved caller's tasks behind
        // theirs, and the caller's p99 would measure the simulator, not the servers. The thread
        // is the floods' alone (not tokio's blocking pool), so its nice value goes with it.
        let nice = self.opts.flood_nice;
        let thread = std::thread::Builder::new().name("floods".into()).spawn(move || {
            lower_priority(nice)?;
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(drive);
            Ok(())
        });
        match thread {
            Ok(t) => self.floods = Some(t),
            Err(e) => println!("HOSTILE: the floods' thread could not start: {e}"),
        }
    }

    /// Stops the floods, the caller and the sampler and collects what they saw.
    pub(super) async fn finish(self) -> anyhow::Result<HostileRun> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(f) = self.floods {
            let joined = tokio::task::spawn_blocking(move || f.join()).await.context("floods")?;
            joined
                .map_err(|_| anyhow::anyhow!("the floods' thread panicked"))?
                .context("the floods' runtime")?;
        }
        let samples = self.caller.await.context("well-behaved caller")?;
        let rss = self.sampler.await.context("memory sampler")?;
        Ok(HostileRun {
            front: self.front,
            opts: self.opts,
            caller_at: self.caller_at,
            samples,
            rss,
            tallies: self.tallies,
            floods_from_ns: self.floods_from_ns.load(Ordering::Relaxed),
            fronts: self.fronts,
        })
    }
}

impl HostileRun {
    /// Prints what the floods did and returns why the run fails (empty: every bound held). The
    /// floods' p99 leaves out the calls that began in a fault or a move or within `settle` after.
    pub(super) fn judge(&self, h: &History, settle: Duration) -> Vec<String> {
        let mut failures = self.judge_floods();
        failures.extend(self.judge_caller(h, settle));
        failures.extend(self.judge_memory());
        for f in &failures {
            println!("HOSTILE: {f}");
        }
        failures
    }

    /// Prints what each kind of flood did; fails a run in which no round ran.
    fn judge_floods(&self) -> Vec<String> {
        let mut failures = Vec::new();
        let rounds = self.tallies.rounds.load(Ordering::Relaxed);
        if self.tallies.kinds.is_empty() {
            println!("hostile: no floods (--hostile-skip left out every kind)");
        } else {
            println!(
                "hostile: {rounds} rounds of floods to {} {:?} front ends",
                self.fronts, self.front
            );
        }
        for (kind, t) in &self.tallies.kinds {
            println!(
                "  {:<20} opened {:>6}  refused {:>5}  cut by the server {:>6}",
                kind.name(),
                t.opened.load(Ordering::Relaxed),
                t.refused.load(Ordering::Relaxed),
                t.cut.load(Ordering::Relaxed)
            );
        }
        if rounds == 0 {
            failures.push("no round of floods ran (a --duration of 12 s at least runs one)".to_string());
        }
        failures
    }

    /// Prints the well-behaved caller's p99 without and with the floods, and judges them.
    fn judge_caller(&self, h: &History, settle: Duration) -> Vec<String> {
        let settle_ns = settle.as_nanos() as u64;
        let quiet_out: Vec<(u64, u64)> = h
            .faults
            .iter()
            .map(|f| (f.start_ns, f.end_ns + settle_ns))
            .chain(h.moves.iter().map(|m| (m.start_ns, m.end_ns + settle_ns)))
            .collect();
        let rounds = self.tallies.windows.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let p = caller::phases(&self.samples, self.floods_from_ns, &rounds, &quiet_out);
        let (name, addr, uid) = &self.caller_at;
        println!(
            "hostile: well-behaved caller: one take of uid {uid} every 10ms on one connection to {name}'s front end ({addr}; its owner when the run began)"
        );
        let line = |label: &str, s: &[Sample]| match (caller::p99(s.iter()), caller::percentile(s.iter(), 50)) {
            (Some((p99, n)), Some((p50, _))) => println!(
                "  p99 {label:<14} {p99:>10.2?}  (p50 {p50:.2?}; {n} calls, {} failed)",
                s.iter().filter(|s| !s.ok).count()
            ),
            _ => println!("  p99 {label:<14} no calls"),
        };
        line("first phase", &p.first);
        line("between rounds", &p.between);
        let without: Vec<Sample> = p.first.iter().chain(&p.between).copied().collect();
        line("without floods", &without);
        line("with floods", &p.with);
        println!(
            "  ({} calls left out: they began in a fault or a move, or within {settle:?} after; without floods \
             is the first phase and the pauses between rounds together)",
            p.left_out
        );
        caller::judge(&without, &p.with).into_iter().collect()
    }

    /// Prints each AllocSvr's memory; fails a run in which one passed the bound.
    fn judge_memory(&self) -> Vec<String> {
        let mut failures = Vec::new();
        println!(
            "hostile: AllocSvr memory (bound {} MiB), {} samples",
            self.opts.max_rss_bytes / MIB,
            self.rss.samples
        );
        for (name, r) in &self.rss.per {
            let mib = |b: u64| b as f64 / MIB as f64;
            println!(
                "  {name:<12} peak {:>7.1} MiB (before the floods {:>6.1} MiB)  end {:>7.1} MiB",
                mib(r.peak),
                mib(r.before_floods),
                mib(r.end)
            );
        }
        if let Some((name, bytes, at_ns)) = &self.rss.over {
            failures.push(format!(
                "{name}'s memory reached {:.1} MiB at {:.1?} (bound {} MiB)",
                *bytes as f64 / MIB as f64,
                Duration::from_nanos(*at_ns),
                self.opts.max_rss_bytes / MIB
            ));
        }
        if self.rss.per.is_empty() {
            failures.push("no AllocSvr's memory could be read".to_string());
        }
        failures
    }
}

/// The AllocSvr that owns `uid` now (set 0 holds every uid when a run starts), and its front end.
async fn owner_front(lab: &Lab, uid: u64) -> Option<(u64, SocketAddr)> {
    let section = uid / lab.section_size;
    let routes = lab.stores.first()?.get_routes().await.ok()?.routes?;
    let owner = routes
        .entries
        .iter()
        .find(|e| (e.section_begin..e.section_end).contains(&section) && e.incarnation != 0)?;
    Some((owner.node_id, *lab.topo.front_addr.get(&owner.node_id)?))
}

/// Gives the calling thread the nice value `nice` (Linux keeps one per thread).
fn lower_priority(nice: i32) -> std::io::Result<()> {
    if nice == 0 {
        return Ok(());
    }
    // SAFETY: setpriority reads only its arguments; gettid names the calling thread.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Makes sure this process may open `need` descriptors: raises its soft limit (`ulimit -n`) up to
/// the hard one when it is lower, and fails when the hard one is. The servers, started before,
/// keep the limit they were given.
fn check_open_files(need: u64) -> anyhow::Result<()> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).context("the open-files limit")?;
    if soft >= need {
        return Ok(());
    }
    if hard < need {
        bail!(
            "--hostile holds up to {need} connections at once, but this process may open {hard} files at most: raise `ulimit -Hn`"
        );
    }
    setrlimit(Resource::RLIMIT_NOFILE, need, hard).context("raising the open-files limit")?;
    println!("sim: hostile: open-files limit raised from {soft} to {need}");
    Ok(())
}
