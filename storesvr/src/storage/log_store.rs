//! The Raft log and vote: entries in a [`SegmentLog`], vote and log metadata in a [`KvStore`]
//! (one durable file per key).
//!
//! Every method that openraft relies on for durability (`save_vote`, `append`,
//! `truncate`, `purge`) writes and then syncs before it returns or calls the
//! flush callback: an acknowledged append is on disk. Each call completes before
//! openraft issues the next, so vote and log IO are never reordered. The log's sync
//! runs in `append` itself, on the runtime worker that runs openraft's core, unless the
//! flusher thread is syncing already (see [`Durability`]); the other blocking IO runs on
//! tokio's blocking pool.
//!
//! The committed index lives in memory and is written to the key-value store only by
//! the flusher, right after a sync of the log that covers it: it can never be on
//! disk ahead of the entries it names (they are in another file).
//!
//! Left out: caching entries in memory (reads are `pread`s from the page cache).

use crate::raft::types::{Entry, LogId, StorageError, TypeConfig, Vote};
use crate::storage::kv::KvStore;
use crate::storage::segment_log::SegmentLog;
use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{ErrorSubject, ErrorVerb, RaftLogReader};
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const VOTE: &[u8] = b"vote";
const COMMITTED: &[u8] = b"committed";
const PURGED: &[u8] = b"last_purged";

/// Log store handle; cheap to clone (clones share the same storage and flusher).
#[derive(Clone)]
pub struct LogStore {
    kv: Arc<dyn KvStore>,
    log: Arc<SegmentLog>,
    durability: Durability,
}

enum FlushRequest {
    /// Entries were inserted; call back once they are synced.
    Append(LogFlushed<TypeConfig>),
    /// Sync the log, then write and sync the committed index, and answer.
    Barrier(tokio::sync::oneshot::Sender<io::Result<()>>),
}

/// What the flusher knows about the committed index.
#[derive(Default)]
struct Watermarks {
    /// The latest committed log id openraft reported (`save_committed`), in memory only.
    latest: Mutex<Option<LogId>>,
    /// Index + 1 (0 = none) of the committed index the flusher last wrote and synced.
    durable: AtomicU64,
}

/// The log's flusher thread and what it knows about the committed index on disk.
///
/// `append` inserts the entries and syncs them itself when no sync is running; otherwise it hands
/// the callback to the flusher, and requests that queue up while a sync runs share the next one.
/// openraft 0.9 does not replicate while the leader's own sync runs: its core awaits the callback
/// before it hands the entries to the replication tasks. A sync is a barrier over every write
/// before it, so a callback is only ever fired by a sync that began after its entries were
/// inserted.
///
/// The committed index is not synced on every commit (that would put a second sync on every
/// commit's path). Instead, before a replica exposes applied state through a local read it
/// calls [`Durability::make_durable`], so that after a crash it replays at least that far and
/// never shows an older state than it showed before (P3 on every replica).
#[derive(Clone)]
pub struct Durability {
    tx: std::sync::mpsc::Sender<FlushRequest>,
    marks: Arc<Watermarks>,
}

impl Durability {
    /// `on_disk`: the committed log id found on disk at start. It seeds `latest`, so the flusher
    /// never writes a lower one over it before openraft reports a commit.
    fn start(kv: Arc<dyn KvStore>, log: Arc<SegmentLog>, on_disk: Option<LogId>) -> Self {
        let (tx, rx) = std::sync::mpsc::channel::<FlushRequest>();
        let marks = Arc::new(Watermarks {
            latest: Mutex::new(on_disk),
            durable: AtomicU64::new(on_disk.map_or(0, |c| c.index + 1)),
        });
        let m = marks.clone();
        std::thread::Builder::new()
            .name("log-flusher".into())
            .spawn(move || {
                while let Ok(first) = rx.recv() {
                    let mut batch = vec![first];
                    batch.extend(rx.try_iter());
                    let barrier = batch.iter().any(|r| matches!(r, FlushRequest::Barrier(_)));
                    // Read before the log sync: every entry it names was appended before it was
                    // saved, so that sync covers them.
                    let committed = *m.latest.lock().expect("watermark lock poisoned");
                    let mut res = log.sync();
                    if res.is_ok() && barrier {
                        res = kv.put(COMMITTED, &encode(&committed));
                        if res.is_ok() {
                            m.durable
                                .fetch_max(committed.map_or(0, |c| c.index + 1), Ordering::AcqRel);
                        }
                    }
                    if let Err(e) = &res {
                        tracing::error!(error = %e, "syncing the raft log failed; the node stops");
                    }
                    for req in batch {
                        let r = res
                            .as_ref()
                            .map(|_| ())
                            .map_err(|e| io::Error::new(e.kind(), e.to_string()));
                        match req {
                            FlushRequest::Append(cb) => cb.log_io_completed(r),
                            FlushRequest::Barrier(tx) => {
                                let _ = tx.send(r);
                            }
                        }
                    }
                }
            })
            .expect("spawning the log flusher thread");
        Self { tx, marks }
    }

    /// Makes sure a committed index of at least `index` is on disk (syncing if needed).
    pub async fn make_durable(&self, index: u64) -> io::Result<()> {
        if self.marks.durable.load(Ordering::Acquire) > index {
            return Ok(());
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.tx
            .send(FlushRequest::Barrier(tx))
            .map_err(|_| io::Error::other("log flusher stopped"))?;
        rx.await.map_err(|_| io::Error::other("log flusher stopped"))??;
        if self.marks.durable.load(Ordering::Acquire) > index {
            Ok(())
        } else {
            Err(io::Error::other(format!("committed index {index} is not saved yet")))
        }
    }
}

fn io_err(subject: ErrorSubject<u64>, verb: ErrorVerb, e: impl std::error::Error + 'static) -> StorageError {
    StorageError::from_io_error(subject, verb, io::Error::other(e.to_string()))
}

fn read_err(e: impl std::error::Error + 'static) -> StorageError {
    io_err(ErrorSubject::Logs, ErrorVerb::Read, e)
}

fn write_err(e: impl std::error::Error + 'static) -> StorageError {
    io_err(ErrorSubject::Logs, ErrorVerb::Write, e)
}

impl LogStore {
    /// `kv` keeps the vote and log metadata, `log` the entries.
    /// Fails when the recorded purge point cannot be applied to the log.
    pub fn new(kv: Arc<dyn KvStore>, log: SegmentLog) -> io::Result<Self> {
        let on_disk = kv
            .get(COMMITTED)
            .ok()
            .flatten()
            .and_then(|b| postcard::from_bytes::<Option<LogId>>(&b).ok())
            .flatten();
        let purged = kv
            .get(PURGED)?
            .map(|b| postcard::from_bytes::<LogId>(&b).map_err(io::Error::other))
            .transpose()?;
        if let Some(p) = purged {
            log.purge_upto(p.index)?;
        }
        check_covers_committed(&log, purged, on_disk)?;
        let log = Arc::new(log);
        let durability = Durability::start(kv.clone(), log.clone(), on_disk);
        Ok(Self { kv, log, durability })
    }

    /// The flusher handle, for services that expose applied state.
    pub fn durability(&self) -> Durability {
        self.durability.clone()
    }

    /// Forgets, before Raft starts, that this node was a leader (or knew one) before it stopped.
    ///
    /// openraft 0.9 restores a node whose persisted vote is committed and its own as leader at
    /// once, without an election, and answers `ensure_linearizable` with
    /// `max(first log of its term, committed)`. After a restart `committed` may lag what this
    /// leader acknowledged before it died, so such a read can miss acknowledged bumps (seen in
    /// `acknowledged_bump_survives_leader_kill_and_full_restart`). An uncommitted vote keeps
    /// term and `voted_for` (all Raft needs persisted) and makes the node win a fresh election,
    /// whose new no-op entry covers everything committed before.
    pub async fn demote_vote_for_startup(&mut self) -> Result<(), StorageError> {
        if let Some(mut vote) = self.read_vote().await?
            && vote.committed
        {
            vote.committed = false;
            self.save_vote(&vote).await?;
            tracing::info!(%vote, "restarting: persisted vote marked uncommitted, a new election decides the leader");
        }
        Ok(())
    }

    fn get_meta<T: serde::de::DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>, StorageError> {
        match self.kv.get(key).map_err(read_err)? {
            Some(bytes) => Ok(Some(postcard::from_bytes(&bytes).map_err(read_err)?)),
            None => Ok(None),
        }
    }

    /// Runs blocking storage work off the async workers.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn KvStore) -> io::Result<T> + Send + 'static,
    ) -> io::Result<T> {
        let kv = self.kv.clone();
        tokio::task::spawn_blocking(move || f(kv.as_ref()))
            .await
            .map_err(io::Error::other)?
    }
}

/// Refuses a log that ends below the committed index on disk. That index is written only after a
/// sync of the log that covers it, so every entry up to it was durable; a log that lost some (bit
/// rot read as a torn tail, a lost segment) must not start as if it had never had them: it could
/// vote, or serve a read, from a past it no longer has.
fn check_covers_committed(log: &SegmentLog, purged: Option<LogId>, committed: Option<LogId>) -> io::Result<()> {
    let Some(committed) = committed else {
        return Ok(());
    };
    let last = log.last()?.map(|(i, _)| i).max(purged.map(|p| p.index));
    if last.is_some_and(|l| l >= committed.index) {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "the Raft log ends at index {} but entries up to {} were committed and synced here before: \
             synced entries are missing (a damaged or removed log segment). This replica cannot start \
             on this data: move its data dir away and start it again as a new replica (--new-replica); \
             it catches up from its peers",
            last.map_or_else(|| "none".to_string(), |l| l.to_string()),
            committed.index
        ),
    ))
}

fn encode<T: serde::Serialize>(v: &T) -> Vec<u8> {
    postcard::to_stdvec(v).expect("serializing to a Vec cannot fail")
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let start = match range.start_bound() {
            Bound::Included(i) => *i,
            Bound::Excluded(i) => i + 1,
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(i) => Some(i + 1),
            Bound::Excluded(i) => Some(*i),
            Bound::Unbounded => None,
        };
        self.log
            .read(start, end.unwrap_or(u64::MAX))
            .map_err(read_err)?
            .into_iter()
            .map(|(_, v)| postcard::from_bytes(&v).map_err(read_err))
            .collect()
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged: Option<LogId> = self.get_meta(PURGED)?;
        let last = match self.log.last().map_err(read_err)? {
            Some((_, v)) => Some(postcard::from_bytes::<Entry>(&v).map_err(read_err)?.log_id),
            None => last_purged,
        };
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let bytes = encode(vote);
        self.blocking(move |kv| kv.put(VOTE, &bytes))
            .await
            .map_err(|e| io_err(ErrorSubject::Vote, ErrorVerb::Write, e))
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        self.get_meta(VOTE)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        // Kept in memory; the flusher writes it after a log sync that covers it, when a local
        // read needs it durable (`Durability::make_durable`).
        let mut latest = self.durability.marks.latest.lock().expect("watermark lock poisoned");
        *latest = (*latest).max(committed);
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.get_meta::<Option<LogId>>(COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let items: Vec<_> = entries.into_iter().map(|e| (e.log_id.index, encode(&e))).collect();
        // A write into the page cache: cheap enough for the async worker.
        self.log.append(&items).map_err(write_err)?;
        // openraft 0.9's RaftCore awaits this callback before it does anything else (it neither
        // replicates nor answers the leader or a peer meanwhile), so the sync is on every commit's
        // path either way. Run here, it saves the two thread wake-ups of the flusher hand-off
        // (≈ 40 µs each way on the benchmark machine, docs/BENCHMARKS.md); the worker thread is
        // blocked for one `fdatasync` and its other tasks can be stolen by the other workers. When
        // the flusher is syncing already (a local read's barrier), the entries wait for it instead.
        match self.log.try_sync() {
            Some(synced) => {
                if let Err(e) = &synced {
                    tracing::error!(error = %e, "syncing the raft log failed; the node stops");
                }
                callback.log_io_completed(synced);
            }
            None => self
                .durability
                .tx
                .send(FlushRequest::Append(callback))
                .map_err(|_| write_err(io::Error::other("log flusher stopped")))?,
        }
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let log = self.log.clone();
        tokio::task::spawn_blocking(move || log.truncate_from(log_id.index))
            .await
            .map_err(write_err)?
            .map_err(write_err)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let purged = encode(&log_id);
        let log = self.log.clone();
        self.blocking(move |kv| {
            // Record the purge point first: a crash between the two steps leaves
            // entries that are merely ignored, never a hole before last_purged.
            kv.put(PURGED, &purged)?;
            log.purge_upto(log_id.index)
        })
        .await
        .map_err(write_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::kv::FileKv;
    use openraft::CommittedLeaderId;

    fn log_id(index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(1, 1), index)
    }

    #[test]
    fn a_log_that_lost_committed_entries_is_refused_and_a_whole_one_opens() {
        let dir = tempfile::tempdir().unwrap();
        let kv: Arc<dyn KvStore> = Arc::new(FileKv::open(&dir.path().join("kv")).unwrap());
        kv.put(COMMITTED, &encode(&Some(log_id(3)))).unwrap();
        let open_with = |entries: &[u64]| {
            let log = SegmentLog::open(&dir.path().join("log")).unwrap();
            let items: Vec<(u64, Vec<u8>)> = entries.iter().map(|&i| (i, vec![i as u8])).collect();
            log.append(&items).unwrap();
            log.sync().unwrap();
            LogStore::new(kv.clone(), log)
        };
        let err = open_with(&[1, 2])
            .err()
            .expect("a log ending below the committed index is refused");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let msg = err.to_string();
        assert!(msg.contains("ends at index 2") && msg.contains("up to 3"), "{msg}");
        assert!(open_with(&[3]).is_ok(), "entries 1..=3 cover the committed index");
    }

    #[test]
    fn a_log_purged_up_to_the_committed_index_opens() {
        let dir = tempfile::tempdir().unwrap();
        let kv: Arc<dyn KvStore> = Arc::new(FileKv::open(&dir.path().join("kv")).unwrap());
        kv.put(COMMITTED, &encode(&Some(log_id(5)))).unwrap();
        kv.put(PURGED, &encode(&log_id(5))).unwrap();
        let log = SegmentLog::open(&dir.path().join("log")).unwrap();
        assert!(
            LogStore::new(kv, log).is_ok(),
            "an empty log purged up to the committed index"
        );
    }
}
