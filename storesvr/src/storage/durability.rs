//! The log's flusher thread, and the committed index it keeps on disk.
//!
//! Two jobs share one thread. It syncs the log for appends that found a sync already running (see
//! `LogStore::append`), and it writes the committed index (key `committed`) to the key-value store.
//! It writes that index only right after a sync of the log that covers it (the index is read
//! before the sync, and every entry it names was appended before openraft reported it), so the
//! index on disk is never ahead of the entries it names, which live in another file.
//!
//! When it writes: unasked, once the committed index is [`COMMITTED_WRITE_EVERY_ENTRIES`] ahead of
//! the one on disk (openraft's `save_committed` nudges the thread), or has moved at all and
//! [`COMMITTED_WRITE_EVERY`] has passed since the last write (the thread's own timer); and when a
//! local read needs it ([`Durability::make_durable`]). So a replica that nobody asks for a local
//! read still keeps its committed index on disk within a bounded distance of the log's end, and at
//! start the log refuses damage at or below it instead of cutting it as a torn tail
//! (`SegmentLog::open_keeping`): a replica that lost committed entries must not vote or serve as if
//! it never had them (P3). Damage above it, in the last writes' worth of entries, still reads as a
//! torn tail; that window is the price of not writing on every commit.
//!
//! Why the committed index and not the synced length of each segment: it is what both users need
//! (the start-up check, and local reads that must replay at least as far after a crash), so one
//! write serves both, and a read whose index the timer's write already covers costs nothing. It is
//! the key this store already had: no new file, no change to the segment format, and a data dir
//! without the key (never asked for a local read) starts as before. A synced length would also
//! cover synced entries not yet known to be committed, but kept exactly it needs a write on every
//! sync (a second fsync on every commit's path) or a new record in the segments; kept periodically
//! it has the same window as this.
//!
//! Cost: one key-file write (write, `fdatasync`, rename, directory `fsync`) per
//! [`COMMITTED_WRITE_EVERY_ENTRIES`] entries or per [`COMMITTED_WRITE_EVERY`], whichever comes
//! first, plus one per batch of local reads that need a newer index; all on this thread, never on
//! an append's path. Concurrent reads share one write, and a read the index on disk covers returns
//! at once.
//!
//! Left out: writing on every commit (a second sync on every commit's path), and a time bound on
//! a flusher that is stuck in a slow disk: the window is bounded in entries and time only while
//! the disk keeps up.

use crate::raft::types::{LogId, TypeConfig};
use crate::storage::kv::KvStore;
use crate::storage::segment_log::SegmentLog;
use openraft::storage::LogFlushed;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Key of the committed log id in the key-value store (postcard `Option<LogId>`).
pub(crate) const COMMITTED: &[u8] = b"committed";

/// The flusher writes the committed index once it is this many entries ahead of the one on disk:
/// the bound, in entries, on what bit rot in the last segment can drop silently. The benchmarks'
/// busiest set commits about 1 400 entries/s (docs/benchmarks/store-bench.md): a write every
/// 0.7 s. A write is two syncs, about 0.4 ms on the benchmark machine ("Raft metadata writes"
/// there), so even at 20 000 entries/s (20 writes a second) it takes under 1 % of the disk's time.
pub const COMMITTED_WRITE_EVERY_ENTRIES: u64 = 1024;

/// The flusher writes a committed index that moved at all once this long has passed since its
/// last write: the bound in time, for a set that commits slowly. One write a second costs
/// 0.04 % of the benchmark machine's disk, and about 1 % of a slow one (4 ms per `fdatasync`, as
/// on a loaded 2-core VM). 100 ms was tried first: on that slow disk, with three replicas
/// sharing it, `tests/kill_loop.rs` acknowledged a median of 27 bumps per run against 113 without
/// the writes (5 interleaved runs each) and failed its "too few bumps" check; at 1 s it was back
/// in the same range (median about 150; the load from other builds made every run vary by 10x).
pub const COMMITTED_WRITE_EVERY: Duration = Duration::from_secs(1);

/// When the flusher writes the committed index unasked; tests change it to isolate one rule.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WritePolicy {
    pub every_entries: u64,
    pub every: Duration,
}

impl Default for WritePolicy {
    fn default() -> Self {
        Self {
            every_entries: COMMITTED_WRITE_EVERY_ENTRIES,
            every: COMMITTED_WRITE_EVERY,
        }
    }
}

impl WritePolicy {
    /// Whether a write is due: `latest` and `durable` are index + 1 (0 = none) of the committed
    /// index in memory and on disk, `since_write` the time since the last write.
    fn due(&self, latest: u64, durable: u64, since_write: Duration) -> bool {
        latest > durable && (latest - durable >= self.every_entries || since_write >= self.every)
    }
}

enum FlushRequest {
    /// Entries were inserted; call back once they are synced.
    Append(LogFlushed<TypeConfig>),
    /// Make a committed index of at least `index` durable, and answer.
    Barrier {
        index: u64,
        tx: tokio::sync::oneshot::Sender<io::Result<()>>,
    },
    /// The committed index moved [`WritePolicy::every_entries`] since the last nudge.
    Nudge,
}

/// What the flusher knows about the committed index.
struct Watermarks {
    /// The latest committed log id openraft reported (`save_committed`), in memory only.
    latest: Mutex<Option<LogId>>,
    /// Index + 1 (0 = none) of the committed index the flusher last wrote and synced.
    durable: AtomicU64,
    /// Index + 1 of the committed index at the last nudge: one nudge per
    /// [`WritePolicy::every_entries`], not a message on every commit.
    nudged: AtomicU64,
}

fn next_of(id: Option<LogId>) -> u64 {
    id.map_or(0, |c| c.index + 1)
}

/// Handle on the log's flusher thread; cheap to clone.
///
/// openraft 0.9 does not replicate while the leader's own sync runs: its core awaits the append's
/// callback before it hands the entries to the replication tasks. A sync is a barrier over every
/// write before it, so a callback is only ever fired by a sync that began after its entries were
/// inserted.
///
/// Before a replica exposes applied state through a local read it calls
/// [`Durability::make_durable`], so that after a crash it replays at least that far and never
/// shows an older state than it showed before (P3 on every replica).
#[derive(Clone)]
pub struct Durability {
    tx: Sender<FlushRequest>,
    marks: Arc<Watermarks>,
    policy: WritePolicy,
}

impl Durability {
    /// Starts the flusher. `on_disk`: the committed log id found on disk at start. It seeds
    /// `latest`, so the flusher never writes a lower one over it before openraft reports a commit.
    pub(crate) fn start(
        kv: Arc<dyn KvStore>,
        log: Arc<SegmentLog>,
        on_disk: Option<LogId>,
        policy: WritePolicy,
    ) -> io::Result<Self> {
        let (tx, rx) = std::sync::mpsc::channel::<FlushRequest>();
        let marks = Arc::new(Watermarks {
            latest: Mutex::new(on_disk),
            durable: AtomicU64::new(next_of(on_disk)),
            nudged: AtomicU64::new(next_of(on_disk)),
        });
        let flusher = Flusher {
            rx,
            kv,
            log,
            marks: marks.clone(),
            policy,
            last_write: Instant::now(),
        };
        std::thread::Builder::new()
            .name("log-flusher".into())
            .spawn(move || flusher.run())?;
        Ok(Self { tx, marks, policy })
    }

    /// Makes sure a committed index of at least `index` is on disk. Free when the one on disk
    /// covers it; otherwise shares the flusher's next write with every request waiting for it.
    pub async fn make_durable(&self, index: u64) -> io::Result<()> {
        if self.marks.durable.load(Ordering::Acquire) > index {
            return Ok(());
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.tx
            .send(FlushRequest::Barrier { index, tx })
            .map_err(|_| io::Error::other("log flusher stopped"))?;
        rx.await.map_err(|_| io::Error::other("log flusher stopped"))??;
        if self.marks.durable.load(Ordering::Acquire) > index {
            Ok(())
        } else {
            Err(io::Error::other(format!("committed index {index} is not saved yet")))
        }
    }

    /// Index + 1 (0 = none) of the committed index on disk.
    pub fn durable_next(&self) -> u64 {
        self.marks.durable.load(Ordering::Acquire)
    }

    /// Records openraft's committed index (in memory), and nudges the flusher when it has moved
    /// [`WritePolicy::every_entries`] since the last nudge or write.
    pub(crate) fn save_committed(&self, committed: Option<LogId>) {
        let latest = {
            let mut latest = self.marks.latest.lock().expect("watermark lock poisoned");
            *latest = (*latest).max(committed);
            next_of(*latest)
        };
        let since = self
            .marks
            .nudged
            .load(Ordering::Relaxed)
            .max(self.marks.durable.load(Ordering::Acquire));
        if latest.saturating_sub(since) >= self.policy.every_entries {
            self.marks.nudged.store(latest, Ordering::Relaxed);
            // A stopped flusher is reported by the next append or barrier.
            let _ = self.tx.send(FlushRequest::Nudge);
        }
    }

    /// Hands an append's callback to the flusher: it is called after the flusher's next sync.
    pub(crate) fn hand_over(&self, callback: LogFlushed<TypeConfig>) -> io::Result<()> {
        self.tx
            .send(FlushRequest::Append(callback))
            .map_err(|_| io::Error::other("log flusher stopped"))
    }
}

/// Rounds of "appends handed over while the flusher synced" served before a committed-index write.
/// Each is one more sync (usually of a clean log, so free); the bound keeps a stream of them from
/// holding a write off for ever.
const APPEND_ROUNDS: usize = 4;

/// The requests of one round, sorted by what they wait for.
#[derive(Default)]
struct Work {
    appends: Vec<LogFlushed<TypeConfig>>,
    barriers: Vec<tokio::sync::oneshot::Sender<io::Result<()>>>,
    /// The highest index a barrier needs on disk.
    need: Option<u64>,
}

impl Work {
    fn take(&mut self, requests: impl IntoIterator<Item = FlushRequest>) {
        for req in requests {
            match req {
                FlushRequest::Append(cb) => self.appends.push(cb),
                FlushRequest::Barrier { index, tx } => {
                    self.need = self.need.max(Some(index));
                    self.barriers.push(tx);
                }
                FlushRequest::Nudge => {}
            }
        }
    }
}

fn copy(r: &io::Result<()>) -> io::Result<()> {
    r.as_ref()
        .map(|_| ())
        .map_err(|e| io::Error::new(e.kind(), e.to_string()))
}

/// The flusher thread's state.
struct Flusher {
    rx: Receiver<FlushRequest>,
    kv: Arc<dyn KvStore>,
    log: Arc<SegmentLog>,
    marks: Arc<Watermarks>,
    policy: WritePolicy,
    /// When the committed index was last written (or a write was tried).
    last_write: Instant,
}

impl Flusher {
    fn run(mut self) {
        loop {
            let first = match self.rx.recv_timeout(self.policy.every) {
                Ok(req) => Some(req),
                // Nothing asked for a while: the committed index may be due by time.
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            let mut work = Work::default();
            work.take(first.into_iter().chain(self.rx.try_iter()));
            self.serve(work);
        }
    }

    /// Answers the appends, then writes the committed index if a barrier needs it or it is due,
    /// and answers the barriers.
    fn serve(&mut self, mut work: Work) {
        // Appends handed over while a sync ran wait for the next one: serve them before the
        // slower key-file write, so that it does not sit on their path. (One handed over just
        // after the last look still waits for the write; that takes the flusher's sync racing
        // with the append's own, at most once per write.)
        for _ in 0..APPEND_ROUNDS {
            if work.appends.is_empty() {
                break;
            }
            let synced = self.sync_log();
            for cb in work.appends.drain(..) {
                cb.log_io_completed(copy(&synced));
            }
            work.take(self.rx.try_iter());
        }
        // Read before the sync below: every entry it names was appended before openraft reported
        // it, so that sync covers them.
        let committed = *self.marks.latest.lock().expect("watermark lock poisoned");
        let durable = self.marks.durable.load(Ordering::Acquire);
        let wanted = work.need.is_some_and(|i| durable <= i)
            || self.policy.due(next_of(committed), durable, self.last_write.elapsed());
        if work.appends.is_empty() && !wanted {
            // Every barrier here is covered by the index on disk (a write since it was sent).
            for tx in work.barriers {
                let _ = tx.send(Ok(()));
            }
            return;
        }
        let synced = self.sync_log();
        for cb in work.appends.drain(..) {
            cb.log_io_completed(copy(&synced));
        }
        let res = match synced {
            Ok(()) if wanted => self.write(committed),
            other => other,
        };
        for tx in work.barriers {
            let _ = tx.send(copy(&res));
        }
    }

    fn sync_log(&self) -> io::Result<()> {
        let synced = self.log.sync();
        if let Err(e) = &synced {
            tracing::error!(error = %e, "syncing the raft log failed; the node stops");
        }
        synced
    }

    /// Writes and syncs `committed`; the caller synced the log after reading it.
    fn write(&mut self, committed: Option<LogId>) -> io::Result<()> {
        self.last_write = Instant::now();
        let res = self.kv.put(COMMITTED, &postcard_encode(&committed));
        match &res {
            Ok(()) => {
                self.marks.durable.fetch_max(next_of(committed), Ordering::AcqRel);
            }
            // The index on disk stays a lower bound (safe, only less useful); the next write
            // that is due or asked for tries again, and a barrier gets the error.
            Err(e) => tracing::warn!(error = %e, "writing the committed index failed"),
        }
        res
    }
}

fn postcard_encode<T: serde::Serialize>(v: &T) -> Vec<u8> {
    postcard::to_stdvec(v).expect("serializing to a Vec cannot fail")
}

/// Test doubles for the flusher's writes, shared with `log_store.rs`'s tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::COMMITTED;
    use crate::raft::types::LogId;
    use crate::storage::kv::{FileKv, KvStore};
    use std::io;
    use std::path::Path;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::mpsc::{Receiver, Sender};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    /// Key files in a directory that count the writes of the committed index, and hold each one
    /// until the [`Gate`] is released.
    pub(crate) struct CountingKv {
        inner: FileKv,
        writes: AtomicU64,
        entered: Mutex<Sender<()>>,
        release: Mutex<Receiver<()>>,
    }

    /// The test's side of a [`CountingKv`]: `entered` ticks when a write starts to wait.
    pub(crate) struct Gate {
        pub entered: Receiver<()>,
        release: Sender<()>,
    }

    impl Gate {
        /// Lets every write through, now and later.
        pub fn release(self) {
            drop(self.release);
        }
    }

    impl CountingKv {
        pub fn open(dir: &Path) -> (Arc<Self>, Gate) {
            let (entered_tx, entered) = std::sync::mpsc::channel();
            let (release, release_rx) = std::sync::mpsc::channel();
            let kv = Self {
                inner: FileKv::open(dir).unwrap(),
                writes: AtomicU64::new(0),
                entered: Mutex::new(entered_tx),
                release: Mutex::new(release_rx),
            };
            (Arc::new(kv), Gate { entered, release })
        }

        /// Writes of the committed index so far.
        pub fn writes(&self) -> u64 {
            self.writes.load(Ordering::SeqCst)
        }
    }

    impl KvStore for CountingKv {
        fn get(&self, key: &[u8]) -> io::Result<Option<Vec<u8>>> {
            self.inner.get(key)
        }

        fn put(&self, key: &[u8], value: &[u8]) -> io::Result<()> {
            if key == COMMITTED {
                self.writes.fetch_add(1, Ordering::SeqCst);
                let _ = self.entered.lock().unwrap().send(());
                // Returns at once when the gate was released (its sender dropped).
                let _ = self.release.lock().unwrap().recv();
            }
            self.inner.put(key, value)
        }
    }

    /// The committed index in the key files, as the next start reads it.
    pub(crate) fn committed_on_disk(kv: &dyn KvStore) -> Option<u64> {
        let bytes = kv.get(COMMITTED).unwrap()?;
        postcard::from_bytes::<Option<LogId>>(&bytes).unwrap().map(|c| c.index)
    }

    /// Polls `f` until it gives a value, for at most 10 s (the flusher is a thread of its own).
    pub(crate) fn wait_for<T>(mut f: impl FnMut() -> Option<T>) -> Option<T> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(v) = f() {
                return Some(v);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{CountingKv, committed_on_disk, wait_for};
    use super::*;
    use openraft::CommittedLeaderId;
    use std::path::Path;

    fn log_id(index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(1, 1), index)
    }

    /// Neither rule writes unasked: only barriers do.
    const NEVER: WritePolicy = WritePolicy {
        every_entries: u64::MAX,
        every: Duration::from_secs(3600),
    };

    #[test]
    fn a_write_is_due_after_enough_entries_or_enough_time_and_never_for_nothing() {
        let p = WritePolicy {
            every_entries: 10,
            every: Duration::from_millis(100),
        };
        let ms = Duration::from_millis;
        // (latest, durable, since the last write, due)
        let cases = [
            (0, 0, ms(1_000), false), // nothing committed
            (5, 5, ms(1_000), false), // nothing new, however long
            (14, 5, ms(99), false),   // 9 new entries, 99 ms
            (15, 5, ms(0), true),     // 10 new entries
            (6, 5, ms(100), true),    // 1 new entry, 100 ms
            (4, 5, ms(1_000), false), // behind the disk (a barrier wrote a newer one)
        ];
        for (latest, durable, since, due) in cases {
            assert_eq!(p.due(latest, durable, since), due, "{latest} {durable} {since:?}");
        }
    }

    /// Starts a flusher over a log in `dir` with entries 1..=`last` synced and committed.
    fn flusher_with(dir: &Path, kv: Arc<CountingKv>, policy: WritePolicy, last: u64) -> (Arc<SegmentLog>, Durability) {
        let log = Arc::new(SegmentLog::open(&dir.join("log")).unwrap());
        let d = Durability::start(kv, log.clone(), None, policy).unwrap();
        let items: Vec<(u64, Vec<u8>)> = (1..=last).map(|i| (i, vec![i as u8])).collect();
        log.append(&items).unwrap();
        log.sync().unwrap();
        d.save_committed(Some(log_id(last)));
        (log, d)
    }

    #[tokio::test]
    async fn concurrent_barriers_share_one_write_and_covered_ones_cost_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (kv, gate) = CountingKv::open(&dir.path().join("meta"));
        let (log, d) = flusher_with(dir.path(), kv.clone(), NEVER, 10);
        let mut first = Box::pin(d.make_durable(10));
        assert!(futures::poll!(first.as_mut()).is_pending());
        gate.entered
            .recv_timeout(Duration::from_secs(10))
            .expect("the first read makes the flusher write the committed index");
        // A flood of local reads arrives while that write runs: each sends its barrier.
        let mut flood: Vec<_> = (0..32).map(|_| Box::pin(d.make_durable(10))).collect();
        for f in &mut flood {
            assert!(futures::poll!(f.as_mut()).is_pending());
        }
        gate.release();
        first.await.unwrap();
        for f in flood {
            f.await.unwrap();
        }
        assert_eq!(kv.writes(), 1, "the waiting reads share the write that was running");
        // Nothing new committed: the index on disk covers every read, which costs no sync at all.
        let syncs = log.syncs();
        for r in futures::future::join_all((0..32).map(|_| d.make_durable(10))).await {
            r.unwrap();
        }
        assert_eq!((kv.writes(), log.syncs()), (1, syncs));
        assert_eq!(committed_on_disk(kv.as_ref()), Some(10));
    }

    #[tokio::test]
    async fn a_slow_commit_rate_reaches_the_disk_by_the_time_rule() {
        let dir = tempfile::tempdir().unwrap();
        let (kv, gate) = CountingKv::open(&dir.path().join("meta"));
        gate.release();
        let policy = WritePolicy {
            every_entries: u64::MAX,
            every: Duration::from_millis(20),
        };
        let (_log, d) = flusher_with(dir.path(), kv.clone(), policy, 3);
        let on_disk = wait_for(|| committed_on_disk(kv.as_ref()).filter(|c| *c == 3));
        assert_eq!(on_disk, Some(3), "3 entries committed and no local read");
        // The flusher publishes the mark just after its write returns: a read between the two saw
        // the file and not yet the mark (a CI run did).
        let published = wait_for(|| (d.durable_next() == 4).then_some(()));
        assert_eq!(
            published,
            Some(()),
            "durable_next {} after the write of 3",
            d.durable_next()
        );
        let writes = kv.writes();
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(kv.writes(), writes, "nothing new committed: nothing written");
    }
}
