//! Rolling upgrade from the previous release to this tree, and back, with real processes under
//! continuous load (docs/operations/upgrades.md says what is promised; this checks it).
//!
//! One set (3 StoreSvrs, 2 AllocSvrs) starts on the previous release's binaries, built by
//! `scripts/prev-release.sh` (which `scripts/test.sh` runs) into `target/prev-release/<release>/`
//! or the directory `SEQSVR_PREV_RELEASE_DIR` names; the test fails, naming the script, when they
//! are missing. Then one process at a time is SIGTERMed (an AllocSvr drained first with
//! `seqctl alloc drain`, as docs/OPERATIONS.md says) and started again on the other release:
//! - in order: both StoreSvr followers, the leader, then each AllocSvr; then both AllocSvrs back
//!   to the previous release; a second set stays on the previous release, and a section moves
//!   between the two sets (`seqctl move`) in each of set 0's states;
//! - in the wrong orders, on a fresh cluster: an AllocSvr before any StoreSvr, then the StoreSvr
//!   leader first, then the other two StoreSvrs (followers first), the other AllocSvr; then the
//!   StoreSvrs back to the previous release (a follower, the leader, the last one);
//! - a rolling restart on this release (a cluster started on it): both followers, the leader,
//!   both AllocSvrs. A leader of this release hands its leadership to a caught-up follower on
//!   SIGTERM (storesvr `tasks::handoff`); its log must say it did, and the phase's latencies show
//!   how long bumps waited meanwhile (`E2E_STORESVR_EXTRA_ARGS=--handoff-ms=0` shows them without).
//!
//! All the while gRPC callers (the client library: seqs and time-ordered ids) and Redis-protocol
//! callers (`INCR u:<uid>` and counters, the `redis` crate) run against both AllocSvrs. Checked:
//! every value of a uid or counter is unique and above every value of it whose call completed
//! before the call began (P1 across callers and front ends), no id is issued twice (U1), the
//! errors callers saw stay within [`GRPC_ERRORS`] and [`REDIS_ERRORS`], and after each step every
//! process reports the release it runs, in `seqctl status` (the StoreSvrs' own, the AllocSvrs' as
//! the leader heard it). The calls, errors and latencies of each step are printed.
//!
//! Left out: a snapshot sent between releases (the sets here write fewer entries than a snapshot
//! needs).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use seqsvr_client::ClientConfig;
use seqsvr_proto::Uid;
use tokio::time::Instant;

mod e2e;
use e2e::seqctl::{Seqctl, text};
use e2e::{ALLOCS, Cluster, Role, STORES, sibling_bin};

/// The release the upgrade starts from (`scripts/prev-release.sh` pins its commit).
const PREV_RELEASE: &str = "0.1.0";
/// A directory holding the previous release's `storesvr`, `allocsvr` and `seqctl` instead.
const PREV_DIR_VAR: &str = "SEQSVR_PREV_RELEASE_DIR";
/// Calls through the client library that may fail in a whole scenario: none, it retries.
const GRPC_ERRORS: u64 = 0;
/// Redis calls that may fail in a whole scenario, besides [`CLOSED`] ones: none (no error reply,
/// no timeout, no command whose outcome is unknown).
const REDIS_ERRORS: u64 = 0;
/// Redis commands that may find their connection closed, per caller and AllocSvr restart: a
/// SIGTERMed AllocSvr answers the commands it has read and closes every connection (the Redis
/// protocol has no way to say "go elsewhere"), and a caller without retries (this one) sees the
/// close on its next command: mostly a broken pipe (the command was not sent; sending it again
/// on a new connection is safe, and redis-py does by default), sometimes a reset (a command that
/// raced the close; its outcome is unknown, as with any Redis server that shuts down).
const CLOSED_PER_RESTART: u64 = 1;
/// How [`redis_caller`] marks a command whose connection a stopping AllocSvr closed.
const CLOSED: &str = "connection closed";
/// Load kept running in each state between two restarts.
const DWELL: Duration = Duration::from_millis(1_500);
/// How long a SIGTERMed process may take to exit.
const EXIT_WITHIN: Duration = Duration::from_secs(20);
const WAIT: Duration = Duration::from_secs(30);
/// Pause between one caller's calls: about 300 calls a second per caller on a quiet machine.
const PACE: Duration = Duration::from_millis(3);
/// Callers through the client library (one of them also asks for ids) and through Redis.
const GRPC_CALLERS: u64 = 3;
const REDIS_CALLERS: u64 = 3;
/// How much one bump raises a section's ceiling: small, so that AllocSvrs bump several times a
/// second while the StoreSvr leader restarts and the wait shows in the callers' latency.
const STEP: u64 = 10;
/// Most calls one caller makes (the load is also bounded by the scenario's end).
const MAX_CALLS: u64 = 200_000;

/// Both scenarios start clusters of their own; running them at once would double the load on a
/// small CI machine and blur each one's latencies.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Release {
    Prev,
    New,
}

/// The directory of the previous release's binaries; panics with what to run when missing.
fn prev_dir() -> PathBuf {
    let dir = std::env::var_os(PREV_DIR_VAR).map(PathBuf::from).unwrap_or_else(|| {
        // deps/ → debug/ → the target directory.
        let exe = std::env::current_exe().expect("current exe");
        let target = exe.ancestors().nth(3).expect("test runs from target/<profile>/deps");
        target.join("prev-release").join(PREV_RELEASE)
    });
    for bin in ["storesvr", "allocsvr", "seqctl"] {
        let path = dir.join(bin);
        let out = std::process::Command::new(&path).arg("--version").output();
        let version = out.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
        assert!(
            version.as_ref().is_ok_and(|v| v == &format!("{bin} {PREV_RELEASE}")),
            "the previous release's {bin} ({PREV_RELEASE}) is not at {} (got {version:?}): run \
             scripts/prev-release.sh (scripts/test.sh does), or point {PREV_DIR_VAR} at its binaries",
            path.display()
        );
    }
    dir
}

#[derive(Clone, Copy, Debug)]
enum Step {
    /// A StoreSvr follower still to go: on the other release, or not yet restarted.
    Follower(Release),
    /// The StoreSvr leader (which must be still to go).
    Leader(Release),
    /// A StoreSvr still to go: a follower if there is one, else the leader.
    AnyStore(Release),
    Alloc(u64, Release),
    /// `seqctl move` of [`MOVED`] from one set to the other, under the same load.
    Move {
        from: u64,
        to: u64,
    },
}

/// The uid range the moves carry: section 5, where some of the callers' uids are.
const MOVED: &str = "500000..600000";

/// A second set, on the previous release throughout (one StoreSvr, one AllocSvr), for moves
/// between a set being upgraded and one that is not.
struct OtherSet {
    procs: seqsvr_harness::Supervisor,
    store: String,
    _dir: tempfile::TempDir,
}

impl OtherSet {
    fn start(prev: &std::path::Path) -> Self {
        use seqsvr_harness::{ProcSpec, Supervisor, find_binary, free_addr};
        let dir = tempfile::tempdir().expect("temp dir");
        let mut procs = Supervisor::new(&dir.path().join("logs")).expect("log dir");
        let store = free_addr();
        let bin = |b: &str| find_binary(b, Some(prev)).unwrap_or_else(|e| panic!("{e}"));
        let store_args = vec![
            "--node-id=1".to_string(),
            "--set-id=1".into(),
            format!("--listen={store}"),
            format!("--data-dir={}", dir.path().join("store").display()),
            format!("--peers=1={store}"),
            "--bootstrap".into(),
            "--new-replica".into(),
            format!("--section-size={}", e2e::SECTION_SIZE),
            format!("--uid-limit={}", e2e::UID_LIMIT),
            format!("--step={STEP}"),
            format!("--lease-ms={}", e2e::LEASE.as_millis()),
            format!("--detect-ms={}", e2e::DETECT.as_millis()),
        ];
        procs
            .spawn(ProcSpec::new("set1-store", bin("storesvr"), store_args))
            .expect("spawn set 1's StoreSvr");
        let alloc_args = vec![
            "--node-id=3".to_string(),
            format!("--listen={}", free_addr()),
            format!("--store=1={store}"),
            format!("--resp-listen={}", free_addr()),
        ];
        procs
            .spawn(ProcSpec::new("set1-alloc", bin("allocsvr"), alloc_args))
            .expect("spawn set 1's AllocSvr");
        Self {
            procs,
            store,
            _dir: dir,
        }
    }
}

impl Drop for OtherSet {
    fn drop(&mut self) {
        self.procs.kill_all();
    }
}

/// What one call got.
struct Call {
    phase: usize,
    front: &'static str,
    /// `u:<uid>`, `c:<n>` (a counter) or `ids`.
    name: String,
    start: Duration,
    end: Duration,
    values: Result<Vec<u64>, String>,
}

struct Load {
    stop: AtomicBool,
    phase: AtomicUsize,
    t0: Instant,
    calls: Mutex<Vec<Call>>,
}

impl Load {
    fn record(&self, front: &'static str, name: String, start: Instant, values: Result<Vec<u64>, String>) {
        let call = Call {
            phase: self.phase.load(Ordering::SeqCst),
            front,
            name,
            start: start - self.t0,
            end: Instant::now() - self.t0,
            values,
        };
        self.calls.lock().unwrap().push(call);
    }

    fn running(&self, made: u64) -> bool {
        !self.stop.load(Ordering::SeqCst) && made < MAX_CALLS
    }
}

/// Uids in every section (first, last, and one inside).
fn hot_uids() -> Vec<u64> {
    e2e::spread_uids(3).into_iter().map(|u| u.0).collect()
}

async fn grpc_caller(load: Arc<Load>, cfg: ClientConfig, ids: bool, seed: u64) {
    use rand::SeedableRng;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let client = seqsvr_client::Client::new(cfg).expect("client config");
    let uids = hot_uids();
    let mut made = 0;
    while load.running(made) {
        made += 1;
        let start = Instant::now();
        if ids && made % 2 == 0 {
            let r = client.next_ids(4).await.map(|i| i.ids).map_err(|e| e.to_string());
            load.record("grpc", "ids".into(), start, r);
        } else if made % 5 == 0 {
            let name = format!("c:{}", rng.random_range(0..8));
            let r = client.counter_next(&name).await;
            load.record("grpc", name, start, r.map(|c| vec![c.value]).map_err(|e| e.to_string()));
        } else {
            let uid = uids[rng.random_range(0..uids.len())];
            let r = client.fetch_next_seq(Uid(uid)).await;
            load.record(
                "grpc",
                format!("u:{uid}"),
                start,
                r.map(|f| vec![f.seq]).map_err(|e| e.to_string()),
            );
        }
        tokio::time::sleep(PACE).await;
    }
}

/// One Redis connection at a time, to the AllocSvrs in turn: a connection that fails is counted
/// as the caller's error and replaced by one to the next AllocSvr.
async fn redis_caller(load: Arc<Load>, addrs: Vec<String>, seed: u64) {
    use rand::SeedableRng;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let uids = hot_uids();
    let mut conn: Option<redis::aio::MultiplexedConnection> = None;
    let (mut made, mut next) = (0, seed as usize);
    while load.running(made) {
        made += 1;
        let start = Instant::now();
        if conn.is_none() {
            next += 1;
            let addr = &addrs[next % addrs.len()];
            let client = redis::Client::open(format!("redis://{addr}/")).expect("redis url");
            match tokio::time::timeout(Duration::from_secs(2), client.get_multiplexed_async_connection()).await {
                Ok(Ok(c)) => conn = Some(c),
                other => {
                    load.record(
                        "redis",
                        "connect".into(),
                        start,
                        Err(format!("connect {addr}: {other:?}")),
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            }
        }
        let c = conn.as_mut().expect("connected above");
        let name = if made % 5 == 0 {
            format!("c:{}", rng.random_range(0..8))
        } else {
            format!("u:{}", uids[rng.random_range(0..uids.len())])
        };
        let r = tokio::time::timeout(
            Duration::from_secs(5),
            redis::cmd("INCR").arg(&name).query_async::<u64>(c),
        )
        .await;
        let r = match r {
            Ok(Ok(v)) => Ok(vec![v]),
            Ok(Err(e)) if e.is_connection_dropped() => Err(format!("{CLOSED}: {e}")),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("no reply within 5 s".into()),
        };
        if r.is_err() {
            conn = None;
        }
        load.record("redis", name, start, r);
        tokio::time::sleep(PACE).await;
    }
}

/// Violations of P1 (a name's value not unique, or not above one whose call had completed
/// before the call began) and of U1 (an id twice), at most a few described.
fn violations(calls: &[Call]) -> (u64, Vec<String>) {
    let mut by_name: HashMap<&str, Vec<(Duration, Duration, u64)>> = HashMap::new();
    let (mut ids, mut found, mut said) = (HashSet::new(), 0u64, Vec::new());
    for c in calls {
        let Ok(values) = &c.values else { continue };
        for v in values {
            if c.name == "ids" {
                if !ids.insert(*v) {
                    found += 1;
                    said.push(format!("U1: id {v} issued twice"));
                }
            } else {
                by_name.entry(&c.name).or_default().push((c.start, c.end, *v));
            }
        }
    }
    for (name, mut obs) in by_name {
        let mut seen = HashSet::new();
        for (_, _, v) in &obs {
            if !seen.insert(*v) {
                found += 1;
                said.push(format!("P1: {name} got {v} twice"));
            }
        }
        // Sweep by start time over the calls sorted by end: the highest value of every call
        // that had ended before this one began must be below this one's.
        let mut ended: Vec<(Duration, u64)> = obs.iter().map(|(_, e, v)| (*e, *v)).collect();
        ended.sort_unstable();
        obs.sort_unstable();
        let (mut i, mut high) = (0, 0);
        for (start, _, v) in &obs {
            while i < ended.len() && ended[i].0 < *start {
                high = high.max(ended[i].1);
                i += 1;
            }
            if *v <= high {
                found += 1;
                said.push(format!(
                    "P1: {name} got {v} after a call that had completed with {high}"
                ));
            }
        }
    }
    said.truncate(10);
    (found, said)
}

/// Calls, errors and latency of each phase and front end, as a table; and the error counts by
/// front end (`closed` apart: [`CLOSED`] Redis commands).
fn report(phases: &[String], calls: &[Call]) -> (String, BTreeMap<&'static str, u64>) {
    let mut rows: BTreeMap<(usize, &'static str), (u64, u64, Vec<Duration>)> = BTreeMap::new();
    let mut errors: BTreeMap<&'static str, u64> = BTreeMap::new();
    for c in calls {
        let row = rows.entry((c.phase, c.front)).or_default();
        match &c.values {
            Ok(_) => row.2.push(c.end - c.start),
            Err(e) if e.starts_with(CLOSED) => {
                row.1 += 1;
                *errors.entry("closed").or_default() += 1;
            }
            Err(_) => {
                row.0 += 1;
                *errors.entry(c.front).or_default() += 1;
            }
        }
    }
    let mut out = format!(
        "{:<56} {:<6} {:>7} {:>6} {:>6} {:>8} {:>8} {:>8}\n",
        "phase", "front", "ok", "errors", "closed", "p50 ms", "p99 ms", "max ms"
    );
    for ((phase, front), (errs, closed, mut lat)) in rows {
        lat.sort_unstable();
        let q = |f: f64| {
            lat.get(((lat.len() as f64 * f) as usize).min(lat.len().saturating_sub(1)))
                .map_or(0.0, |d| d.as_secs_f64() * 1e3)
        };
        out += &format!(
            "{:<56} {front:<6} {:>7} {errs:>6} {closed:>6} {:>8.1} {:>8.1} {:>8.1}\n",
            phases[phase],
            lat.len(),
            q(0.5),
            q(0.99),
            q(1.0)
        );
    }
    let failed: Vec<&Call> = calls.iter().filter(|c| c.values.is_err()).take(10).collect();
    for c in failed {
        out += &format!("error in {}: {} {}: {:?}\n", phases[c.phase], c.front, c.name, c.values);
    }
    (out, errors)
}

/// The running cluster, which release each process runs, and the bin directory of each release.
struct Rolling {
    c: Cluster,
    prev: PathBuf,
    runs: BTreeMap<(Role, u64), Release>,
    /// StoreSvrs restarted so far.
    restarted: HashSet<u64>,
    /// Set 1, when the scenario moves ranges.
    other: Option<OtherSet>,
}

impl Rolling {
    async fn start(on: Release) -> Self {
        let prev = prev_dir();
        let dir = (on == Release::Prev).then(|| prev.clone());
        let c = Cluster::start_from(false, dir, STEP);
        c.wait_store_leader(WAIT).await;
        c.wait_settled(WAIT).await;
        let runs = all_on(on, on);
        Self {
            c,
            prev,
            runs,
            restarted: HashSet::new(),
            other: None,
        }
    }

    /// Starts set 1 on the previous release and adds it to the cluster map (with this tree's
    /// `seqctl`, as an operator upgrading would have it).
    async fn add_other_set(&mut self) {
        let other = OtherSet::start(&self.prev);
        let op = Seqctl::new(["--store", self.c.store_seeds_flag().as_str()]);
        let stores = format!("1={}", other.store);
        let added = tokio::time::timeout(WAIT, async {
            loop {
                let out = op.output(&["set", "add", "1", "--stores", &stores]).await;
                if out.status.success() {
                    return;
                }
                // Set 1's StoreSvr may still be electing itself.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
        .await;
        assert!(added.is_ok(), "seqctl set add 1 did not succeed within {WAIT:?}");
        self.other = Some(other);
    }

    /// Moves [`MOVED`] and says how long it took.
    async fn move_range(&self, from: u64, to: u64) -> String {
        assert!(self.other.is_some(), "a move needs the second set (add_other_set)");
        let op = Seqctl::new(["--store", self.c.store_seeds_flag().as_str()]);
        let (from_s, to_s) = (from.to_string(), to.to_string());
        let started = Instant::now();
        let moved = tokio::time::timeout(
            WAIT,
            op.output(&["move", "--from", &from_s, "--to", &to_s, "--uids", MOVED]),
        )
        .await
        .unwrap_or_else(|_| panic!("seqctl move {MOVED} from set {from} to {to} did not end within {WAIT:?}"));
        assert!(moved.status.success(), "seqctl move: {}", text(&moved));
        format!("move {MOVED} from set {from} to set {to} ({:.1?})", started.elapsed())
    }

    fn dir(&self, r: Release) -> Option<PathBuf> {
        (r == Release::Prev).then(|| self.prev.clone())
    }

    /// Whether StoreSvr `id` is still to go to `r`: it runs the other release, or (a restart on
    /// one release) it has not been restarted yet.
    fn to_go(&self, id: u64, r: Release) -> bool {
        self.runs[&(Role::Store, id)] != r || !self.restarted.contains(&id)
    }

    /// The process a step restarts.
    async fn target(&self, step: Step) -> (Role, u64, Release) {
        let leader = self.c.wait_store_leader(WAIT).await;
        match step {
            Step::Leader(r) => {
                assert!(self.to_go(leader, r), "the leader {leader} already runs {r:?}");
                (Role::Store, leader, r)
            }
            Step::Follower(r) | Step::AnyStore(r) => {
                let left = |id: &&u64| self.to_go(**id, r);
                let f = STORES.iter().filter(left).find(|id| **id != leader);
                let f = match (step, f) {
                    (_, Some(f)) => *f,
                    (Step::AnyStore(_), None) if left(&&leader) => leader,
                    _ => panic!("no StoreSvr left to move to {r:?} (leader {leader}): {:?}", self.runs),
                };
                (Role::Store, f, r)
            }
            Step::Alloc(id, r) => (Role::Alloc, id, r),
            Step::Move { .. } => panic!("a move restarts nothing"),
        }
    }

    /// SIGTERMs the step's process, starts it on the other release and waits until it serves
    /// (a StoreSvr: caught up with the leader; an AllocSvr: every section owned and served).
    async fn restart(&mut self, step: Step) -> String {
        let (role, id, r) = self.target(step).await;
        let leader = self.c.wait_store_leader(WAIT).await;
        let applied = self.c.store_status_of(leader).await.map_or(0, |s| s.applied_index);
        if role == Role::Alloc {
            // As docs/OPERATIONS.md says: its sections handed over first, without a lease wait.
            let op = Seqctl::new(["--store", self.c.store_seeds_flag().as_str()]);
            let node = id.to_string();
            let drained = tokio::time::timeout(WAIT, op.ok(&["alloc", "drain", &node])).await;
            assert!(drained.is_ok(), "seqctl alloc drain {id} did not end within {WAIT:?}");
        }
        let stopping = Instant::now();
        let was = self.runs[&(role, id)];
        // A follower of this release can campaign when asked; one of the previous cannot.
        let successor_new = STORES
            .iter()
            .any(|s| *s != id && self.runs[&(Role::Store, *s)] == Release::New);
        self.c.sigterm(role, id);
        let status = self.c.wait_exit(role, id, EXIT_WITHIN).await;
        let exited = stopping.elapsed();
        assert!(status.success(), "{role:?} {id} exited with {status} after SIGTERM");
        let handoff =
            (role == Role::Store && id == leader).then(|| self.handoff(id, was == Release::New && successor_new));
        if role == Role::Store {
            self.restarted.insert(id);
        }
        self.c.use_bin_dir(role, id, self.dir(r));
        self.runs.insert((role, id), r);
        match role {
            Role::Store => {
                self.c.start_store(id);
                e2e::poll("the restarted StoreSvr to catch up", WAIT, || async {
                    let s = self.c.store_status_of(id).await?;
                    (s.leader_id != 0 && s.applied_index >= applied).then_some(())
                })
                .await;
                self.c.wait_store_leader(WAIT).await;
            }
            Role::Alloc => {
                self.c.start_alloc(id);
                self.c.wait_settled(WAIT).await;
            }
        }
        let was_leader = match handoff {
            Some(Some(ms)) => format!(" (the leader, handed over in {ms} ms)"),
            Some(None) => " (the leader)".to_string(),
            None => String::new(),
        };
        let back = stopping.elapsed();
        format!("{role:?} {id}{was_leader} -> {r:?} (exit {exited:.1?}, back {back:.1?})")
    }

    /// How long the SIGTERMed leader `id` took to hand its leadership over, from its log. A
    /// leader of this release with a follower of this release (`expected`) and the handoff on
    /// must have handed over (this is the check that the handoff happens at all); a previous
    /// release's never does.
    fn handoff(&self, id: u64, expected: bool) -> Option<u64> {
        let log = self.c.log(Role::Store, id);
        let line = log
            .lines()
            .rev()
            .find(|l| l.contains("handed leadership to node") || l.contains("no follower took over"));
        let ms = line.and_then(|l| {
            let after = l.split("handed leadership to node ").nth(1)?;
            after.split(" in ").nth(1)?.split(" ms").next()?.parse::<u64>().ok()
        });
        let off = e2e::store_extra_args().iter().any(|a| a == "--handoff-ms=0");
        if expected && !off {
            assert!(
                ms.is_some(),
                "StoreSvr {id}, the leader, stopped without handing its leadership over: {line:?}"
            );
        }
        ms
    }

    /// Waits until `seqctl status` shows every process's release as it runs now.
    async fn versions_shown(&self) {
        let op = Seqctl::new(["--store", self.c.store_seeds_flag().as_str()]);
        let shown = |v: &serde_json::Value| v.as_str().unwrap_or("").to_owned();
        let want = |r: Release, old: &str| match r {
            Release::New => format!("{} (commit ", env!("CARGO_PKG_VERSION")),
            Release::Prev => old.to_owned(),
        };
        let last = Mutex::new(String::new());
        let ok = seqsvr_harness::poll_until(WAIT, || {
            let (op, last) = (&op, &last);
            async move {
                let s = op.json(&["status"]).await?;
                *last.lock().unwrap() = s.to_string();
                let stores = s["members"].as_array()?.iter().all(|m| {
                    let id = m["node_id"].as_u64().unwrap_or(0);
                    shown(&m["view"]["version"]).starts_with(&want(self.runs[&(Role::Store, id)], "< 0.2.0"))
                });
                // Only a leader of this release records what AllocSvrs report.
                let leader_new = self.runs.get(&(Role::Store, s["leader_id"].as_u64()?)) == Some(&Release::New);
                let allocs = s["allocsvrs"].as_array()?;
                let alive: Vec<&serde_json::Value> = allocs.iter().filter(|a| a["alive"] == true).collect();
                let allocs_ok = alive.len() == ALLOCS.len()
                    && alive.iter().all(|a| {
                        let id = a["node_id"].as_u64().unwrap_or(0);
                        let r = if leader_new {
                            self.runs[&(Role::Alloc, id)]
                        } else {
                            Release::Prev
                        };
                        shown(&a["version"]).starts_with(&want(r, "?"))
                    });
                (stores && allocs_ok).then_some(())
            }
        })
        .await;
        let last = last.into_inner().unwrap();
        assert!(
            ok.is_some(),
            "seqctl status never showed the releases {:?}; last: {last}",
            self.runs
        );
    }
}

/// Runs `steps` under load on a fresh cluster started on the previous release; checks P1/U1, the
/// error budget and the versions shown after each step; prints the counts. Returns which release
/// each process ended on.
async fn scenario(title: &str, on: Release, steps: &[Step]) -> BTreeMap<(Role, u64), Release> {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut r = Rolling::start(on).await;
    if steps.iter().any(|s| matches!(s, Step::Move { .. })) {
        r.add_other_set().await;
    }
    let load = Arc::new(Load {
        stop: AtomicBool::new(false),
        phase: AtomicUsize::new(0),
        t0: Instant::now(),
        calls: Mutex::new(Vec::new()),
    });
    let mut phases = vec![format!("all on {on:?}")];
    let mut callers = Vec::new();
    for i in 0..GRPC_CALLERS {
        let cfg = r.c.client_config();
        callers.push(tokio::spawn(grpc_caller(load.clone(), cfg, i == 0, i)));
    }
    let resp: Vec<String> = r.c.alloc_resp.values().cloned().collect();
    for i in 0..REDIS_CALLERS {
        callers.push(tokio::spawn(redis_caller(load.clone(), resp.clone(), 100 + i)));
    }
    tokio::time::sleep(DWELL).await;
    for step in steps {
        load.phase.store(phases.len(), Ordering::SeqCst);
        phases.push(format!("restarting {step:?}"));
        let what = match *step {
            Step::Move { from, to } => r.move_range(from, to).await,
            restart => r.restart(restart).await,
        };
        *phases.last_mut().unwrap() = what;
        r.versions_shown().await;
        tokio::time::sleep(DWELL).await;
    }
    load.stop.store(true, Ordering::SeqCst);
    for c in callers {
        c.await.expect("caller task");
    }
    build_info_shown(&r).await;
    let calls = std::mem::take(&mut *load.calls.lock().unwrap());
    let (table, errors) = report(&phases, &calls);
    let (found, said) = violations(&calls);
    println!("== {title}: {} calls, {found} violations\n{table}", calls.len());
    assert_eq!(found, 0, "{title}: P1/U1 violated: {said:#?}\n{table}");
    let count = |k: &str| errors.get(k).copied().unwrap_or(0);
    let (grpc, redis, closed) = (count("grpc"), count("redis"), count("closed"));
    let alloc_restarts = steps.iter().filter(|s| matches!(s, Step::Alloc(..))).count() as u64;
    let closed_budget = CLOSED_PER_RESTART * REDIS_CALLERS * alloc_restarts;
    println!("== {title}: caller errors: gRPC {grpc}, Redis {redis}, Redis connections closed {closed}");
    // The budgets are 0 today; `<=` keeps the checks right if one is ever raised.
    #[allow(clippy::absurd_extreme_comparisons)]
    let within = (grpc <= GRPC_ERRORS, redis <= REDIS_ERRORS);
    assert!(
        within.0,
        "{title}: {grpc} gRPC calls failed (budget {GRPC_ERRORS})\n{table}"
    );
    assert!(
        within.1,
        "{title}: {redis} Redis calls failed (budget {REDIS_ERRORS})\n{table}"
    );
    assert!(
        closed <= closed_budget,
        "{title}: {closed} Redis commands found their connection closed (budget {closed_budget})\n{table}"
    );
    assert!(
        calls.len() > 1_000,
        "{title}: only {} calls were made\n{table}",
        calls.len()
    );
    r.runs.clone()
}

/// Every StoreSvr on `stores`, every AllocSvr on `allocs`.
fn all_on(stores: Release, allocs: Release) -> BTreeMap<(Role, u64), Release> {
    let mut m: BTreeMap<(Role, u64), Release> = STORES.iter().map(|id| ((Role::Store, *id), stores)).collect();
    m.extend(ALLOCS.iter().map(|id| ((Role::Alloc, *id), allocs)));
    m
}

/// Every AllocSvr's metrics page names the release it runs (`seqsvr_build_info`, new in 0.2.0).
async fn build_info_shown(r: &Rolling) {
    for id in ALLOCS {
        let page = r.c.alloc_metrics_page(id).await;
        let line = page.lines().find(|l| l.starts_with("seqsvr_build_info{"));
        match r.runs[&(Role::Alloc, id)] {
            Release::New => assert!(
                line.is_some_and(|l| l.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION")))),
                "AllocSvr {id}: no seqsvr_build_info of this release: {line:?}"
            ),
            Release::Prev => assert!(line.is_none(), "the previous release has no build info: {line:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_in_order_then_roll_allocsvrs_back() {
    use Release::{New, Prev};
    // Set 1 stays on the previous release: the moves go between it and set 0 in each of set 0's
    // states (mixed StoreSvrs, new StoreSvrs with old AllocSvrs, all new, AllocSvrs back).
    let steps = [
        Step::Follower(New),
        Step::Follower(New),
        Step::Move { from: 0, to: 1 },
        Step::Leader(New),
        Step::Move { from: 1, to: 0 },
        Step::Alloc(1, New),
        Step::Alloc(2, New),
        Step::Move { from: 0, to: 1 },
        Step::Alloc(1, Prev),
        Step::Alloc(2, Prev),
        Step::Move { from: 1, to: 0 },
    ];
    let end = scenario("in order with moves, then the AllocSvrs back", Prev, &steps).await;
    assert_eq!(end, all_on(New, Prev));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_in_the_wrong_orders() {
    use Release::{New, Prev};
    // Then the StoreSvrs back to the previous release (the AllocSvrs stay on this one).
    let steps = [
        Step::Alloc(1, New),
        Step::Leader(New),
        Step::AnyStore(New),
        Step::AnyStore(New),
        Step::Alloc(2, New),
        Step::Follower(Prev),
        Step::Leader(Prev),
        Step::AnyStore(Prev),
    ];
    let title = "wrong orders: an AllocSvr first, the leader first; then the StoreSvrs back";
    let end = scenario(title, Prev, &steps).await;
    assert_eq!(end, all_on(Prev, New));
}

/// The restart docs/OPERATIONS.md describes, on one release: the leader hands over on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_on_this_release() {
    use Release::New;
    let steps = [
        Step::Follower(New),
        Step::Follower(New),
        Step::Leader(New),
        Step::Alloc(1, New),
        Step::Alloc(2, New),
    ];
    let end = scenario("a rolling restart on this release", New, &steps).await;
    assert_eq!(end, all_on(New, New));
}

/// This tree's binaries, the servers, `seqctl`, the simulator and the benchmarks, say which
/// release and commit they are (`--version`).
#[test]
fn every_binary_names_its_release_and_commit() {
    let tools = [
        "sim",
        "alloc-bench",
        "store-bench",
        "takeover-bench",
        "ids-bench",
        "counter-bench",
        "cost-curves",
        "front-bench",
        "cluster-bench",
    ];
    for bin in ["storesvr", "allocsvr", "seqctl"].into_iter().chain(tools) {
        let out = std::process::Command::new(sibling_bin(bin))
            .arg("--version")
            .output()
            .expect("run --version");
        let v = String::from_utf8_lossy(&out.stdout);
        let want = format!("{bin} {} (commit ", env!("CARGO_PKG_VERSION"));
        assert!(
            out.status.success() && v.starts_with(&want),
            "{bin} --version: {}",
            text(&out)
        );
    }
}
