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
//! The committed index lives in memory and is written to the key-value store by the flusher
//! (`durability.rs`) after a sync of the log that covers it, every so many entries or
//! milliseconds and when a local read needs it. At start it tells the segment log how far the
//! log was synced, so that damage there refuses to start instead of reading as a torn tail.
//!
//! A write or sync that fails is returned to openraft as a `StorageError` (or, for an append, as
//! the flush callback's error), never retried here: openraft takes it as fatal and stops the
//! node, the segment log refuses every later write (`segment_log.rs`), and the process exits so
//! that a restart reopens the log from what is on disk (`main.rs`).
//!
//! Left out: caching entries in memory (reads are `pread`s from the page cache).

use crate::raft::types::{Entry, LogId, StorageError, TypeConfig, Vote};
use crate::storage::durability::{COMMITTED, Durability, WritePolicy};
use crate::storage::fault::DiskFault;
use crate::storage::kv::KvStore;
use crate::storage::segment_log::{SEGMENT_BYTES, SegmentLog};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{ErrorSubject, ErrorVerb, RaftLogReader};
use seqsvr_proto::limits::APPEND_ENTRIES_BYTES;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::Arc;

const VOTE: &[u8] = b"vote";
const PURGED: &[u8] = b"last_purged";

/// Log store handle; cheap to clone (clones share the same storage and flusher).
#[derive(Clone)]
pub struct LogStore {
    kv: Arc<dyn KvStore>,
    log: Arc<SegmentLog>,
    durability: Durability,
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
    /// Opens the log in `dir` with its vote and metadata in `kv`. Fails when the log lost entries
    /// that were committed and synced here before (damage at or below the committed index on
    /// disk, a missing last segment), or when the recorded purge point cannot be applied.
    pub fn open(kv: Arc<dyn KvStore>, dir: &Path) -> io::Result<Self> {
        Self::open_with(kv, dir, WritePolicy::default(), DiskFault::default())
    }

    /// [`open`](Self::open) with the log's writes failing while `fault` is on
    /// (`--unsafe-disk-fault-file`, tests only).
    pub fn open_with_fault(kv: Arc<dyn KvStore>, dir: &Path, fault: DiskFault) -> io::Result<Self> {
        Self::open_with(kv, dir, WritePolicy::default(), fault)
    }

    /// [`open`](Self::open) with the flusher's write policy given (tests isolate one rule).
    pub(crate) fn open_with(
        kv: Arc<dyn KvStore>,
        dir: &Path,
        policy: WritePolicy,
        fault: DiskFault,
    ) -> io::Result<Self> {
        // A damaged key file is an error (kv.rs); a missing one is a data dir that never wrote it.
        let on_disk = kv
            .get(COMMITTED)?
            .map(|b| postcard::from_bytes::<Option<LogId>>(&b).map_err(io::Error::other))
            .transpose()?
            .flatten();
        let purged = kv
            .get(PURGED)?
            .map(|b| postcard::from_bytes::<LogId>(&b).map_err(io::Error::other))
            .transpose()?;
        // Entries up to the committed index on disk were synced; those at or below the purge
        // point may be gone on purpose.
        let synced_to = on_disk.map(|c| c.index).filter(|c| purged.is_none_or(|p| p.index < *c));
        let log = SegmentLog::open_keeping(dir, SEGMENT_BYTES, synced_to)?.with_fault(fault);
        if let Some(p) = purged {
            log.purge_upto(p.index)?;
        }
        check_covers_committed(&log, purged, on_disk)?;
        let log = Arc::new(log);
        let durability = Durability::start(kv.clone(), log.clone(), on_disk, policy)?;
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
        decode(self.log.read(start, end.unwrap_or(u64::MAX)).map_err(read_err)?)
    }

    /// What replication sends in one AppendEntries: at most [`APPEND_ENTRIES_BYTES`] of entries
    /// (at least one), cut before decoding. openraft asks for up to 300 entries at once and
    /// gives their AppendEntries one heartbeat interval, or reads and sends the same range again.
    async fn limited_get_log_entries(&mut self, start: u64, end: u64) -> Result<Vec<Entry>, StorageError> {
        decode(
            self.log
                .read_limited(start, end, APPEND_ENTRIES_BYTES)
                .map_err(read_err)?,
        )
    }
}

fn decode(records: Vec<(u64, Vec<u8>)>) -> Result<Vec<Entry>, StorageError> {
    records
        .into_iter()
        .map(|(_, v)| postcard::from_bytes(&v).map_err(read_err))
        .collect()
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
        // Kept in memory; the flusher writes it after a log sync that covers it, every so many
        // entries or milliseconds, or when a local read needs it (`durability.rs`).
        self.durability.save_committed(committed);
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
        // (≈ 40 µs each way on the benchmark machine, docs/journal/benchmarks-2026-11.md); the worker thread is
        // blocked for one `fdatasync` and its other tasks can be stolen by the other workers. When
        // the flusher is syncing already (a local read's barrier), the entries wait for it instead.
        match self.log.try_sync() {
            Some(synced) => {
                if let Err(e) = &synced {
                    tracing::error!(error = %e, "syncing the raft log failed; the node stops");
                }
                callback.log_io_completed(synced);
            }
            None => self.durability.hand_over(callback).map_err(write_err)?,
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
    use crate::storage::durability::COMMITTED_WRITE_EVERY_ENTRIES;
    use crate::storage::durability::testing::{CountingKv, committed_on_disk, wait_for};
    use crate::storage::kv::FileKv;
    use openraft::{CommittedLeaderId, EntryPayload};
    use std::time::Duration;

    fn log_id(index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(1, 1), index)
    }

    /// Writes entries straight into the segment log in `dir` and syncs them.
    fn write_log(dir: &Path, entries: &[u64]) {
        let log = SegmentLog::open(dir).unwrap();
        let items: Vec<(u64, Vec<u8>)> = entries.iter().map(|&i| (i, vec![i as u8])).collect();
        log.append(&items).unwrap();
        log.sync().unwrap();
    }

    #[test]
    fn a_log_that_lost_committed_entries_is_refused_and_a_whole_one_opens() {
        let dir = tempfile::tempdir().unwrap();
        let kv: Arc<dyn KvStore> = Arc::new(FileKv::open(&dir.path().join("kv")).unwrap());
        kv.put(COMMITTED, &encode(&Some(log_id(3)))).unwrap();
        let log_dir = dir.path().join("log");
        write_log(&log_dir, &[1, 2]);
        let err = LogStore::open(kv.clone(), &log_dir)
            .err()
            .expect("a log ending below the committed index is refused");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let msg = err.to_string();
        assert!(msg.contains("ends at index 2") && msg.contains("up to 3"), "{msg}");
        write_log(&log_dir, &[3]);
        assert!(
            LogStore::open(kv, &log_dir).is_ok(),
            "entries 1..=3 cover the committed index"
        );
    }

    #[test]
    fn a_log_purged_up_to_the_committed_index_opens() {
        let dir = tempfile::tempdir().unwrap();
        let kv: Arc<dyn KvStore> = Arc::new(FileKv::open(&dir.path().join("kv")).unwrap());
        kv.put(COMMITTED, &encode(&Some(log_id(5)))).unwrap();
        kv.put(PURGED, &encode(&log_id(5))).unwrap();
        assert!(
            LogStore::open(kv, &dir.path().join("log")).is_ok(),
            "an empty log purged up to the committed index"
        );
    }

    /// Entries committed in the load below: five times the write interval and a bit, so that the
    /// index on disk has to move several times.
    const LOAD: u64 = 5 * COMMITTED_WRITE_EVERY_ENTRIES + 100;

    /// Appends and commits `LOAD` blank entries as openraft does (insert, sync, report the commit),
    /// eight per sync, with no local read asking for the committed index. Only the entry rule
    /// writes it: the time rule is an hour away.
    async fn store_after_a_load(dir: &Path) -> (Arc<CountingKv>, LogStore) {
        let (kv, gate) = CountingKv::open(&dir.join("meta"));
        gate.release();
        let policy = WritePolicy {
            every_entries: COMMITTED_WRITE_EVERY_ENTRIES,
            every: Duration::from_secs(3600),
        };
        let mut store = LogStore::open_with(kv.clone(), &dir.join("log"), policy, DiskFault::default()).unwrap();
        for first in (1..=LOAD).step_by(8) {
            let items: Vec<(u64, Vec<u8>)> = (first..(first + 8).min(LOAD + 1))
                .map(|i| {
                    (
                        i,
                        encode(&Entry {
                            log_id: log_id(i),
                            payload: EntryPayload::Blank,
                        }),
                    )
                })
                .collect();
            store.log.append(&items).unwrap();
            store.log.sync().unwrap();
            let last = items.last().unwrap().0;
            store.save_committed(Some(log_id(last))).await.unwrap();
        }
        (kv, store)
    }

    #[tokio::test]
    async fn commits_without_any_local_read_keep_the_committed_index_on_disk_near_the_log_end() {
        let dir = tempfile::tempdir().unwrap();
        let (kv, store) = store_after_a_load(dir.path()).await;
        let near = wait_for(|| committed_on_disk(kv.as_ref()).filter(|c| LOAD - c < COMMITTED_WRITE_EVERY_ENTRIES));
        assert!(
            near.is_some(),
            "after {LOAD} commits and no local read the committed index on disk is {:?}, not within \
             {COMMITTED_WRITE_EVERY_ENTRIES} of the log's end",
            committed_on_disk(kv.as_ref())
        );
        let writes = kv.writes();
        assert!(
            writes <= LOAD / COMMITTED_WRITE_EVERY_ENTRIES + 1,
            "{writes} writes of the committed index for {LOAD} commits"
        );
        drop(store);
    }

    /// Byte offset of the payload of the record of `index` in a segment file (layout in
    /// `segment_log.rs`: 16-byte header with the length first and the index last).
    fn payload_at(bytes: &[u8], index: u64) -> usize {
        let mut at = 0;
        loop {
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            if u64::from_le_bytes(bytes[at + 8..at + 16].try_into().unwrap()) == index {
                return at + 16;
            }
            at += 16 + len;
        }
    }

    #[tokio::test]
    async fn damage_below_the_committed_index_on_disk_refuses_to_start_and_cuts_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (kv, store) = store_after_a_load(dir.path()).await;
        let on_disk = wait_for(|| committed_on_disk(kv.as_ref()).filter(|c| LOAD - c < COMMITTED_WRITE_EVERY_ENTRIES))
            .expect("the committed index reaches the disk without a local read");
        drop(store);
        let seg = std::fs::read_dir(dir.path().join("log"))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        let whole = std::fs::read(&seg).unwrap();
        let mut damaged = whole.clone();
        damaged[payload_at(&whole, on_disk / 2)] ^= 1;
        std::fs::write(&seg, &damaged).unwrap();
        let err = LogStore::open(kv.clone(), &dir.path().join("log"))
            .err()
            .expect("a damaged committed entry is refused, not cut as a torn tail");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let msg = err.to_string();
        let name = seg.file_name().unwrap().to_str().unwrap();
        assert!(msg.contains(name) && msg.contains(&format!("up to {on_disk}")), "{msg}");
        assert!(
            msg.contains("not a torn tail") && msg.contains("--new-replica"),
            "{msg}"
        );
        assert!(
            std::fs::read(&seg).unwrap() == damaged,
            "a refused start cut the segment"
        );

        // Above the index on disk is the window the flusher's interval leaves: a torn tail.
        let mut above = whole.clone();
        above[payload_at(&whole, LOAD)] ^= 1;
        std::fs::write(&seg, &above).unwrap();
        let store = LogStore::open(kv, &dir.path().join("log")).expect("damage above the index on disk");
        assert_eq!(store.log.last().unwrap().map(|e| e.0), Some(LOAD - 1));
    }
}
