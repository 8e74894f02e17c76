//! What a benchmark run sets up before it measures, the same way in every binary: the server
//! binaries, a temp dir for the run's data (removed when the run ends), the supervisor of its
//! processes (logs in the dir's `logs/`, every process killed when the run ends), a fresh StoreSvr
//! set with ONE AllocSvr that listens, the header lines that say which machine and which options
//! the figures come from, and the check after each case that no process died and the load was
//! served.
//!
//! Deliberately left out: what "serving" means to a benchmark (every section owned, a counter
//! answered, an id slot held: each binary waits for its own), the echo and the peers
//! ([`crate::echo`], [`crate::peers`]), and more than one AllocSvr (`cost-curves`,
//! `front-bench` and `takeover-bench` start theirs through [`crate::cluster`]).

use std::path::Path;
use std::time::{Duration, Instant};

use seqsvr_harness::Supervisor;
use seqsvr_proto::pb::alloc_service_client::AllocServiceClient;
use tempfile::TempDir;
use tonic::transport::Channel;

use crate::cluster::{self, AllocNode, Binaries, Stores};
use crate::exit::{Failure, harness};
use crate::load::Sample;
use crate::procfs;

/// Longest wait for a started AllocSvr to listen.
const LISTEN_LIMIT: Duration = Duration::from_secs(20);

/// One benchmark run: its binaries, its processes and its data dir.
pub struct Run {
    /// Declared first, so dropped first: the processes are killed before their dir is removed.
    pub procs: Supervisor,
    pub bins: Binaries,
    tmp: TempDir,
}

/// One AllocSvr over a fresh 3-replica StoreSvr set, listening, with channels to it.
pub struct OneAlloc {
    pub stores: Stores,
    pub node: AllocNode,
    /// Separate connections to the AllocSvr (task `t` of a load uses `t % n`).
    pub clients: Vec<AllocServiceClient<Channel>>,
    /// When the AllocSvr process was started: what "… s after the allocsvr started" counts from.
    pub started: Instant,
}

impl Run {
    /// Finds the server binaries and makes the data dir (in `dir`, else [`temp_dir`]'s default)
    /// and the supervisor.
    pub fn new(dir: Option<&Path>) -> Result<Run, Failure> {
        let bins = cluster::binaries().map_err(Failure::Usage)?;
        let tmp = temp_dir(dir, &bins)?;
        let procs = supervisor(tmp.path())?;
        Ok(Run { procs, bins, tmp })
    }

    /// The run's data dir.
    pub fn dir(&self) -> &Path {
        self.tmp.path()
    }

    /// The supervisor and the data dir at once: starting a server takes both.
    pub fn procs_and_dir(&mut self) -> (&mut Supervisor, &Path) {
        (&mut self.procs, self.tmp.path())
    }

    /// Starts 3 StoreSvr replicas (`step`, `section_size`, and `extra` flags for each) and AllocSvr
    /// 1; returns once it listens, with `channels` connections to it. Whether it serves yet is
    /// the caller's to wait for.
    pub async fn one_allocsvr(
        &mut self,
        step: u64,
        section_size: u64,
        extra: &[String],
        channels: usize,
    ) -> Result<OneAlloc, Failure> {
        let dir = self.tmp.path();
        let stores = cluster::start_stores_with(&mut self.procs, &self.bins.storesvr, dir, step, section_size, extra)
            .await
            .map_err(harness)?;
        let node = cluster::start_allocsvr(&mut self.procs, &self.bins.allocsvr, 1, &stores).map_err(harness)?;
        let started = Instant::now();
        if !seqsvr_harness::wait_listening(&node.addr, LISTEN_LIMIT).await {
            return Err(harness(format!("the allocsvr did not listen within {LISTEN_LIMIT:?}")));
        }
        let clients = cluster::channels(&node.addr, channels).await.map_err(harness)?;
        Ok(OneAlloc {
            stores,
            node,
            clients,
            started,
        })
    }
}

/// A fresh temp dir in `dir`, else in the target dir (beside the server binaries): on the disk the
/// build is on, as the `--dir` flags say. Removed when dropped.
pub fn temp_dir(dir: Option<&Path>, bins: &Binaries) -> Result<TempDir, Failure> {
    let target = bins.storesvr.parent().and_then(Path::parent);
    match (dir, target) {
        (Some(d), _) => tempfile::tempdir_in(d),
        (None, Some(t)) => tempfile::tempdir_in(t),
        (None, None) => tempfile::tempdir(),
    }
    .map_err(|e| harness(format!("cannot create a temp dir: {e}")))
}

/// The supervisor of a run's processes, their logs in `dir/logs`.
pub fn supervisor(dir: &Path) -> Result<Supervisor, Failure> {
    Supervisor::new(&dir.join("logs")).map_err(|e| harness(format!("cannot create the log dir: {e}")))
}

/// The first line of a run's output: the machine the figures come from.
pub fn machine_line() -> String {
    format!(
        "machine: {}, shared by the benchmark and every server",
        procfs::machine()
    )
}

/// The second: the options that shape the figures (`--seconds 5 …`) and where the data is.
pub fn options_line(options: &str, dir: &Path) -> String {
    format!("options: {options}; data dir {}", dir.display())
}

/// Prints [`machine_line`] and [`options_line`].
pub fn print_header(options: &str, dir: &Path) {
    println!("{}", machine_line());
    println!("{}", options_line(options, dir));
}

/// Fails when a started process exited, or when `what` (a case, a point, a server) completed no
/// call: a figure of nothing must not pass for a measurement.
pub fn check(procs: &mut Supervisor, what: &str, s: &Sample) -> Result<(), Failure> {
    cluster::check_alive(procs).map_err(harness)?;
    if s.calls == 0 {
        return Err(harness(format!(
            "{what} completed no call ({} errors, {} not OK)",
            s.errors, s.not_ok
        )));
    }
    Ok(())
}
