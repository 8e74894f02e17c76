//! A replica whose disk fills up (ENOSPC) or whose `fsync` fails stops: it acknowledges nothing
//! that is not durable, the process exits with status 1, the other two replicas go on serving, and
//! once the fault clears a restart (what systemd or Kubernetes does) brings it back, caught up.
//! No acknowledged bump is lost on the way (P2, P3), so no sequence number is handed out twice
//! (P1). What a replica does and why: docs/OPERATIONS.md, "A full or failing disk".
//!
//! The fault is injected with the TEST ONLY flag `--unsafe-disk-fault-file` (`storage/fault.rs`):
//! while the file exists the replica's log and key-file writes and syncs fail. A loop-mounted or
//! size-limited filesystem would need root and `mount`, which CI may not have.
//!
//! `cargo test -p storesvr --test full_disk`.

mod common;

use common::*;
use seqsvr_proto::pb;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(30);
/// Sections the writer bumps in turn.
const BUMPED: u64 = 2;
const STEP: u64 = 100;
/// Bounds on the writer: it stops at whichever comes first, or when told to.
const MAX_BUMPS: u64 = 5_000;
const MAX_WRITING: Duration = Duration::from_secs(150);

fn fault_file(c: &Cluster, id: u64) -> PathBuf {
    c.dir.path().join(format!("disk-fault-{id}"))
}

/// Three replicas, each with its own fault file (absent: no fault yet).
fn cluster() -> Cluster {
    let mut c = Cluster::unstarted(3, &[]);
    for id in 1..=3 {
        let flag = format!("--unsafe-disk-fault-file={}", fault_file(&c, id).display());
        c.node_args.insert(id, vec![flag]);
    }
    for id in 1..=3 {
        c.spawn(id, id == 1);
    }
    c
}

/// What the writer saw: the highest acknowledged `max_seq` per section, and how many bumps were
/// acknowledged; and the test's pause switch, with the writer's answer that it has no bump in
/// flight.
struct Acked {
    max: Vec<AtomicU64>,
    count: AtomicU64,
    pause: AtomicBool,
    idle: AtomicBool,
}

/// Bumps the first [`BUMPED`] sections in turn through the set's client (which follows the leader)
/// until `stop`, like an owner: one step above the last acknowledged ceiling, and an unknown outcome
/// (an error) retried with the same target.
async fn write_until(client: seqsvr_control::StoreClient, owner: FakeOwner, acked: Arc<Acked>, stop: Arc<AtomicBool>) {
    let mut epochs = Vec::new();
    for s in 0..BUMPED {
        epochs.push(owner.epoch_of(&client, s, WAIT).await);
    }
    let mut next = vec![STEP; BUMPED as usize];
    let started = Instant::now();
    let mut s = 0usize;
    for _ in 0..MAX_BUMPS {
        while acked.pause.load(Ordering::Acquire) && !stop.load(Ordering::Relaxed) && started.elapsed() <= MAX_WRITING {
            acked.idle.store(true, Ordering::Release);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        acked.idle.store(false, Ordering::Release);
        if stop.load(Ordering::Relaxed) || started.elapsed() > MAX_WRITING {
            break;
        }
        let req = common::bump_request(owner.incarnation, s as u64, epochs[s], next[s]);
        match client.bump(req).await {
            Ok(r) if r.results[0].outcome == pb::BumpOutcome::StaleEpoch as i32 => {
                epochs[s] = owner.epoch_of(&client, s as u64, WAIT).await;
            }
            Ok(r) => {
                let r = r.results[0];
                assert!(r.max_seq >= next[s], "bump to {} acknowledged with {r:?}", next[s]);
                acked.max[s].fetch_max(r.max_seq, Ordering::AcqRel);
                acked.count.fetch_add(1, Ordering::AcqRel);
                next[s] = r.max_seq + STEP;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
        s = (s + 1) % BUMPED as usize;
    }
}

/// The writer: what it acknowledged, its stop switch and its task, and its owner's incarnation
/// and epoch of section [`BUMPED`], which it leaves alone (for a bump of the test's own).
struct Writer {
    acked: Arc<Acked>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
    incarnation: u64,
    spare_epoch: u64,
}

async fn start_writer(c: &Cluster) -> Writer {
    let client = c.client();
    let owner = FakeOwner::register(&client, 1).await;
    let incarnation = owner.incarnation;
    let spare_epoch = owner.epoch_of(&client, BUMPED, WAIT).await;
    let acked = Arc::new(Acked {
        max: (0..BUMPED).map(|_| AtomicU64::new(0)).collect(),
        count: AtomicU64::new(0),
        pause: AtomicBool::new(false),
        idle: AtomicBool::new(false),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let task = tokio::spawn(write_until(client, owner, acked.clone(), stop.clone()));
    Writer {
        acked,
        stop,
        task,
        incarnation,
        spare_epoch,
    }
}

impl Writer {
    /// Pauses the writer and waits until no bump of its is in flight.
    async fn pause(&self) {
        self.acked.pause.store(true, Ordering::Release);
        let t = Instant::now();
        while !self.acked.idle.load(Ordering::Acquire) {
            assert!(t.elapsed() < WAIT, "the writer did not pause within {WAIT:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn resume(&self) {
        self.acked.pause.store(false, Ordering::Release);
    }

    async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap();
    }
}

/// Waits until `more` bumps beyond those acknowledged so far are acknowledged.
async fn wait_for_bumps(acked: &Acked, more: u64, what: &str) {
    let want = acked.count.load(Ordering::Acquire) + more;
    let t = Instant::now();
    while acked.count.load(Ordering::Acquire) < want {
        assert!(
            t.elapsed() < WAIT,
            "{what}: {more} more bumps not acknowledged within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits for replica `id` to exit by itself; it must exit with a failure status and say why, and
/// that the fault was injected.
fn expect_exit_on_storage_error(c: &mut Cluster, id: u64, cause: &str) {
    let log = expect_exit(c, id, cause);
    assert!(
        log.contains("--unsafe-disk-fault-file"),
        "the injected fault is named in the log"
    );
}

/// Waits for replica `id` to exit by itself with a failure status, its last start's log naming
/// `cause` and saying it exits; returns that log.
fn expect_exit(c: &mut Cluster, id: u64, cause: &str) -> String {
    let status = c
        .wait_exit(id, WAIT)
        .unwrap_or_else(|| panic!("replica {id} kept running on a failing disk ({cause})"));
    assert!(!status.success(), "replica {id} exited with {status}");
    let log = std::fs::read_to_string(c.log_path(id)).unwrap();
    // The supervisor appends every start's output to one file, after a line naming the start.
    let log = log.rsplit(&format!(" of store{id}: ")).next().unwrap_or_default();
    assert!(
        log.contains(cause),
        "replica {id}'s log does not name the cause {cause:?}:\n{log}"
    );
    assert!(
        log.contains("storesvr: "),
        "replica {id} exited without saying why:\n{log}"
    );
    log.to_string()
}

/// Every acknowledged ceiling is still there, asked of the set (P2, P3: a lost one would let an
/// owner hand out its numbers again, breaking P1).
async fn check_nothing_lost(c: &Cluster, acked: &Acked, when: &str) {
    let client = c.client();
    for s in 0..BUMPED {
        let want = acked.max[s as usize].load(Ordering::Acquire);
        let got = load(&client, s).await.max_seq;
        assert!(
            got >= want,
            "{when}: section {s} has max_seq {got} < acknowledged {want}"
        );
    }
}

/// Starts replica `id` after its fault cleared and waits until it has applied what the leader has.
async fn comes_back_caught_up(c: &mut Cluster, id: u64) -> u64 {
    c.spawn(id, false);
    let leader = c.wait_leader(WAIT).await;
    let target = c.status_of(leader).await.expect("the leader answers").applied_index;
    c.wait_applied(id, target, WAIT).await;
    target
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_whose_disk_fills_stops_the_set_goes_on_and_it_catches_up_when_space_returns() {
    let mut c = cluster();
    let leader = c.wait_leader(WAIT).await;
    let writer = start_writer(&c).await;
    let acked = writer.acked.clone();
    wait_for_bumps(&acked, 5, "before the fault").await;

    let follower = (1..=3).find(|id| *id != leader).unwrap();
    std::fs::write(fault_file(&c, follower), "").unwrap();
    // Its next append fails: it stops and exits, and acknowledges nothing more.
    expect_exit_on_storage_error(&mut c, follower, "no space left on device");
    wait_for_bumps(&acked, 20, "on two replicas").await;

    // Restarted while the disk is still full, it exits again instead of serving.
    c.spawn(follower, false);
    expect_exit_on_storage_error(&mut c, follower, "no space left on device");

    std::fs::remove_file(fault_file(&c, follower)).unwrap();
    let caught_up = comes_back_caught_up(&mut c, follower).await;
    wait_for_bumps(&acked, 5, "after the follower came back").await;
    writer.stop().await;
    check_nothing_lost(&c, &acked, "at the end").await;
    println!(
        "follower {follower} stopped on ENOSPC, came back and applied {caught_up}; {} bumps acknowledged, none lost",
        acked.count.load(Ordering::Acquire)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_fsync_fails_acknowledges_nothing_leadership_moves_and_it_comes_back() {
    let mut c = cluster();
    let leader = c.wait_leader(WAIT).await;
    let writer = start_writer(&c).await;
    let acked = writer.acked.clone();
    wait_for_bumps(&acked, 5, "before the fault").await;

    // Writes reach the page cache; every fsync fails. With the writer paused, the test's own bump
    // is the first write the fault meets: asked directly, the leader does not acknowledge it.
    writer.pause().await;
    std::fs::write(fault_file(&c, leader), "eio-sync").unwrap();
    let mut req = tonic::Request::new(common::bump_request(
        writer.incarnation,
        BUMPED,
        writer.spare_epoch,
        1_000,
    ));
    req.set_timeout(Duration::from_secs(5));
    let refused = match c.client_of(leader).bump(req).await {
        Ok(r) => panic!("the leader answered a bump it could not sync: {:?}", r.into_inner()),
        Err(status) => status,
    };
    expect_exit_on_storage_error(&mut c, leader, "input/output error on fsync");
    writer.resume();

    let new_leader = c.wait_leader(WAIT).await;
    assert_ne!(new_leader, leader, "leadership moved");
    wait_for_bumps(&acked, 20, "under the new leader").await;
    check_nothing_lost(&c, &acked, "after the leader stopped").await;

    std::fs::remove_file(fault_file(&c, leader)).unwrap();
    let caught_up = comes_back_caught_up(&mut c, leader).await;
    wait_for_bumps(&acked, 5, "after the old leader came back").await;
    writer.stop().await;
    check_nothing_lost(&c, &acked, "at the end").await;
    // Information, not a promise: an unknown outcome may or may not have committed.
    let spare = load(&c.client(), BUMPED).await.max_seq;
    println!("the failing leader's answer to a bump to 1000: {refused}; section {BUMPED} max_seq now {spare}");
    println!(
        "leader {leader} stopped on a failed fsync, {new_leader} took over, {leader} came back and applied \
         {caught_up}; {} bumps acknowledged, none lost",
        acked.count.load(Ordering::Acquire)
    );
}

/// A tmpfs mounted for the test, lazily unmounted when dropped (also when the test fails).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &std::path::Path, bytes: u64) -> Self {
        std::fs::create_dir_all(at).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(at)
            .output()
            .expect("run mount(8)");
        assert!(
            out.status.success(),
            "this test needs root and mount(8): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Writes zeros into `path` until the filesystem is full; the bytes written.
fn fill(path: &std::path::Path) -> u64 {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 64 << 10];
    let mut written = 0u64;
    loop {
        match f.write(&chunk) {
            Ok(0) => return written,
            Ok(n) => written += n as u64,
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(28), "filling the tmpfs: {e}");
                return written;
            }
        }
    }
}

/// The same as the fault-injected tests on a real full filesystem: replica 3's data dir is a 32 MiB
/// tmpfs, filled up while the set writes. (tmpfs never fails an `fsync`; the failing write is an
/// append's, or the zeros a new segment is given.) Needs root and mount(8), which CI may not have:
/// `cargo test -p storesvr --test full_disk -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and mount(8)"]
async fn a_replica_on_a_real_full_tmpfs_stops_and_comes_back_when_space_returns() {
    let mut c = Cluster::unstarted(3, &[]);
    let tmpfs = Tmpfs::mount(&c.data_dir(3), 32 << 20);
    for id in 1..=3 {
        c.spawn(id, id == 1);
    }
    let leader = c.wait_leader(WAIT).await;
    let writer = start_writer(&c).await;
    let acked = writer.acked.clone();
    wait_for_bumps(&acked, 5, "before the disk fills").await;

    let filler = c.data_dir(3).join("filler");
    let filled = fill(&filler);
    let log = expect_exit(&mut c, 3, "No space left on device");
    wait_for_bumps(&acked, 20, "on two replicas").await;
    check_nothing_lost(&c, &acked, "with replica 3 down").await;

    std::fs::remove_file(&filler).unwrap();
    let caught_up = comes_back_caught_up(&mut c, 3).await;
    wait_for_bumps(&acked, 5, "after replica 3 came back").await;
    writer.stop().await;
    check_nothing_lost(&c, &acked, "at the end").await;
    let why = log.lines().find(|l| l.starts_with("storesvr: ")).unwrap_or_default();
    println!(
        "replica 3 (leader at the start: {leader}) on a tmpfs filled with {filled} bytes exited: {why}; \
         space freed, it came back and applied {caught_up}; {} bumps acknowledged, none lost",
        acked.count.load(Ordering::Acquire)
    );
    // `tmpfs` is dropped (lazily unmounted) before `c` kills the processes and removes its directory.
    let _ = &tmpfs;
}
