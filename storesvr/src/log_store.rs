//! The Raft log and vote, on [`KvStore`](crate::kv::KvStore).
//!
//! Every method that openraft relies on for durability (`save_vote`, `append`,
//! `truncate`, `purge`) writes and then `sync`s before it returns or calls the
//! flush callback: an acknowledged append is on disk. Each call completes before
//! openraft issues the next, so vote and log IO are never reordered. The
//! blocking sled work runs on tokio's blocking pool, not on a runtime worker.
//!
//! Left out: caching entries in memory (reads hit sled's own cache).

use crate::kv::{KvStore, Space};
use crate::raft_types::{Entry, LogId, StorageError, TypeConfig, Vote};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{ErrorSubject, ErrorVerb, RaftLogReader};
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

const VOTE: &[u8] = b"vote";
const COMMITTED: &[u8] = b"committed";
const PURGED: &[u8] = b"last_purged";

/// Log store handle; cheap to clone (clones share the same storage and flusher).
#[derive(Clone)]
pub struct LogStore {
    kv: Arc<dyn KvStore>,
    durability: Durability,
}

enum FlushRequest {
    /// Entries were inserted; call back once they are synced.
    Append(LogFlushed<TypeConfig>),
    /// Sync everything written so far (including the committed index) and answer.
    Barrier(tokio::sync::oneshot::Sender<io::Result<()>>),
}

/// Commit-index watermarks, each stored as index + 1 (0 = none).
#[derive(Default)]
struct Watermarks {
    /// Written by `save_committed` (not yet necessarily synced).
    saved: AtomicU64,
    /// Known to be on disk: the `saved` value read before the last successful sync.
    durable: AtomicU64,
}

/// The log's flusher thread and what it knows about the committed index on disk.
///
/// `append` inserts the entries (so they are readable for replication at once) and hands the
/// callback to the flusher; openraft goes on replicating while the leader's own sync runs.
/// Requests that queue up while a sync runs share the next one (group commit of the local log).
/// A sync is a barrier over every write before it, so a callback is only ever fired by a sync that
/// began after its entries were inserted.
///
/// The committed index is saved without a sync of its own (that would put a second sync on
/// every commit's path). Instead, before a replica exposes applied state through a local read it
/// calls [`Durability::make_durable`], so that after a crash it replays at least that far and
/// never shows an older state than it showed before (P3 on every replica).
#[derive(Clone)]
pub struct Durability {
    tx: std::sync::mpsc::Sender<FlushRequest>,
    marks: Arc<Watermarks>,
}

impl Durability {
    /// `on_disk`: the committed index (plus one) found on disk at start.
    fn start(kv: Arc<dyn KvStore>, on_disk: u64) -> Self {
        let (tx, rx) = std::sync::mpsc::channel::<FlushRequest>();
        let marks = Arc::new(Watermarks {
            saved: AtomicU64::new(on_disk),
            durable: AtomicU64::new(on_disk),
        });
        let m = marks.clone();
        std::thread::Builder::new()
            .name("log-flusher".into())
            .spawn(move || {
                while let Ok(first) = rx.recv() {
                    let mut batch = vec![first];
                    batch.extend(rx.try_iter());
                    let saved = m.saved.load(Ordering::Acquire);
                    let res = kv.sync();
                    match &res {
                        Ok(()) => {
                            m.durable.fetch_max(saved, Ordering::AcqRel);
                        }
                        Err(e) => tracing::error!(error = %e, "syncing the raft log failed; the node stops"),
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
    pub fn new(kv: Arc<dyn KvStore>) -> Self {
        let on_disk = kv
            .get(Space::Meta, COMMITTED)
            .ok()
            .flatten()
            .and_then(|b| postcard::from_bytes::<Option<LogId>>(&b).ok())
            .flatten()
            .map_or(0, |c| c.index + 1);
        let durability = Durability::start(kv.clone(), on_disk);
        Self { kv, durability }
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
        match self.kv.get(Space::Meta, key).map_err(read_err)? {
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
        let end_key = end.map(|e| e.to_be_bytes());
        let rows = self
            .kv
            .range(Space::Log, &start.to_be_bytes(), end_key.as_ref().map(|k| &k[..]))
            .map_err(read_err)?;
        rows.into_iter()
            .map(|(_, v)| postcard::from_bytes(&v).map_err(read_err))
            .collect()
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged: Option<LogId> = self.get_meta(PURGED)?;
        let last = match self.kv.last(Space::Log).map_err(read_err)? {
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
        self.blocking(move |kv| {
            kv.insert_batch(Space::Meta, vec![(VOTE.to_vec(), bytes)])?;
            kv.sync()
        })
        .await
        .map_err(|e| io_err(ErrorSubject::Vote, ErrorVerb::Write, e))
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        self.get_meta(VOTE)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        // No sync here (that would put a second sync on every commit's path): the flusher's next
        // sync covers it, and `Durability::make_durable` forces one before a local read exposes
        // state applied up to it.
        self.kv
            .insert_batch(Space::Meta, vec![(COMMITTED.to_vec(), encode(&committed))])
            .map_err(write_err)?;
        // Published only after the insert, so a sync that reads it covers it.
        if let Some(c) = committed {
            self.durability.marks.saved.fetch_max(c.index + 1, Ordering::AcqRel);
        }
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
        let items: Vec<_> = entries
            .into_iter()
            .map(|e| (e.log_id.index.to_be_bytes().to_vec(), encode(&e)))
            .collect();
        // An in-memory insert into sled: cheap enough for the async worker. Durability is the
        // flusher's job; the callback fires only after its sync.
        self.kv.insert_batch(Space::Log, items).map_err(write_err)?;
        self.durability
            .tx
            .send(FlushRequest::Append(callback))
            .map_err(|_| write_err(io::Error::other("log flusher stopped")))?;
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let from = log_id.index.to_be_bytes();
        self.blocking(move |kv| {
            kv.remove_range(Space::Log, &from, None)?;
            kv.sync()
        })
        .await
        .map_err(write_err)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let purged = encode(&log_id);
        let to = (log_id.index + 1).to_be_bytes();
        self.blocking(move |kv| {
            // Record the purge point first: a crash between the two steps leaves
            // entries that are merely ignored, never a hole before last_purged.
            kv.insert_batch(Space::Meta, vec![(PURGED.to_vec(), purged)])?;
            kv.sync()?;
            kv.remove_range(Space::Log, &0u64.to_be_bytes(), Some(&to))?;
            kv.sync()
        })
        .await
        .map_err(write_err)
    }
}
