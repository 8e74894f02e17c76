//! A small durable key-value trait and its sled 0.34 implementation.
//!
//! The vote, the log's metadata and the state machine snapshot are written
//! through this trait so that the storage engine can be swapped without
//! touching Raft code (the log's entries live in `segment_log`). What matters
//! is `sync`: openraft is told that a vote or an append is durable only after
//! `sync` returned, and sled's own `flush` is only `sync_file_range` (not a
//! barrier), so `sync` flushes and then `fdatasync`s the db file and any blob
//! files (sled keeps large values in separate files).
//!
//! Left out: transactions across spaces (each caller orders its writes and
//! syncs between steps that must not be reordered).

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// The storage operations the Raft stores need: vote, committed and purged log ids, snapshot.
pub trait KvStore: Send + Sync + 'static {
    fn get(&self, key: &[u8]) -> io::Result<Option<Vec<u8>>>;
    fn insert_batch(&self, items: Vec<(Vec<u8>, Vec<u8>)>) -> io::Result<()>;
    /// Makes every write before this call durable.
    fn sync(&self) -> io::Result<()>;
}

/// sled 0.34 with the background flusher off: durability is decided by `sync`.
pub struct SledKv {
    meta: sled::Tree,
    db: sled::Db,
    db_file: File,
    blob_dir: PathBuf,
    /// Blob files already synced: each sync only syncs the new ones (and then the directory).
    synced_blobs: std::sync::Mutex<std::collections::BTreeSet<std::ffi::OsString>>,
}

fn to_io(e: sled::Error) -> io::Error {
    match e {
        sled::Error::Io(e) => e,
        other => io::Error::other(other),
    }
}

impl SledKv {
    pub fn open(dir: &Path) -> io::Result<Self> {
        let db = sled::Config::new()
            .path(dir)
            .flush_every_ms(None)
            .open()
            .map_err(to_io)?;
        // Before the log moved to segment files its entries lived in this tree; such a data dir
        // cannot be read by this version (its committed index would name entries it cannot see).
        if db.tree_names().iter().any(|n| &n[..] == b"raft_log") && !db.open_tree("raft_log").map_err(to_io)?.is_empty()
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "this data dir holds a Raft log in the old sled format (before segment files); \
                 this version cannot read it: start the replica from an empty data dir",
            ));
        }
        let meta = db.open_tree("raft_meta").map_err(to_io)?;
        let db_file = File::open(dir.join("db"))?;
        Ok(Self {
            meta,
            db,
            db_file,
            blob_dir: dir.join("blobs"),
            synced_blobs: Default::default(),
        })
    }
}

impl KvStore for SledKv {
    fn get(&self, key: &[u8]) -> io::Result<Option<Vec<u8>>> {
        Ok(self.meta.get(key).map_err(to_io)?.map(|v| v.to_vec()))
    }

    fn insert_batch(&self, items: Vec<(Vec<u8>, Vec<u8>)>) -> io::Result<()> {
        let mut batch = sled::Batch::default();
        for (k, v) in items {
            batch.insert(k, v);
        }
        self.meta.apply_batch(batch).map_err(to_io)
    }

    fn sync(&self) -> io::Result<()> {
        self.db.flush().map_err(to_io)?;
        self.db_file.sync_data()?;
        // Large values live in blob files that sled writes without fsync. Sync the ones not
        // synced before, then the directory entry that names them; forget deleted ones.
        let Ok(entries) = std::fs::read_dir(&self.blob_dir) else {
            return Ok(());
        };
        let mut synced = self.synced_blobs.lock().expect("blob set lock poisoned");
        let mut present = std::collections::BTreeSet::new();
        let mut fresh = false;
        for e in entries.flatten() {
            let name = e.file_name();
            if !synced.contains(&name) {
                File::open(e.path())?.sync_data()?;
                fresh = true;
            }
            present.insert(name);
        }
        if fresh {
            File::open(&self.blob_dir)?.sync_all()?;
        }
        *synced = present;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_dir_with_a_sled_raft_log_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = sled::open(dir.path()).unwrap();
            db.open_tree("raft_log").unwrap().insert(b"1", b"entry").unwrap();
            db.flush().unwrap();
        }
        let err = SledKv::open(dir.path())
            .err()
            .expect("an old-format data dir must be refused");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    }

    #[test]
    fn writes_survive_reopen_after_sync() {
        let dir = tempfile::tempdir().unwrap();
        let big = vec![7u8; 2 << 20]; // large enough to become a sled blob
        {
            let kv = SledKv::open(dir.path()).unwrap();
            kv.insert_batch(vec![(b"snapshot".to_vec(), big.clone())]).unwrap();
            kv.insert_batch(vec![(b"vote".to_vec(), b"v".to_vec())]).unwrap();
            kv.sync().unwrap();
        }
        let kv = SledKv::open(dir.path()).unwrap();
        assert_eq!(kv.get(b"vote").unwrap(), Some(b"v".to_vec()));
        assert_eq!(kv.get(b"snapshot").unwrap(), Some(big));
    }
}
