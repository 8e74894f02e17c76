//! A small durable key-value trait and its sled 0.34 implementation.
//!
//! The Raft log store and the snapshot store write through this trait so that
//! the storage engine can be swapped without touching Raft code. What matters
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

/// Independent key spaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Space {
    /// Raft log entries keyed by big-endian index.
    Log,
    /// Vote, committed log id, purged log id, snapshot.
    Meta,
}

/// The storage operations the Raft stores need.
pub trait KvStore: Send + Sync + 'static {
    fn get(&self, space: Space, key: &[u8]) -> io::Result<Option<Vec<u8>>>;
    fn insert_batch(&self, space: Space, items: Vec<(Vec<u8>, Vec<u8>)>) -> io::Result<()>;
    /// Removes keys in `[from, to)`; `to = None` means to the end.
    fn remove_range(&self, space: Space, from: &[u8], to: Option<&[u8]>) -> io::Result<()>;
    /// Key-value pairs in `[from, to)`, in key order.
    fn range(&self, space: Space, from: &[u8], to: Option<&[u8]>) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>>;
    fn last(&self, space: Space) -> io::Result<Option<(Vec<u8>, Vec<u8>)>>;
    /// Makes every write before this call durable.
    fn sync(&self) -> io::Result<()>;
}

/// sled 0.34 with the background flusher off: durability is decided by `sync`.
pub struct SledKv {
    log: sled::Tree,
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
        let log = db.open_tree("raft_log").map_err(to_io)?;
        let meta = db.open_tree("raft_meta").map_err(to_io)?;
        let db_file = File::open(dir.join("db"))?;
        Ok(Self {
            log,
            meta,
            db,
            db_file,
            blob_dir: dir.join("blobs"),
            synced_blobs: Default::default(),
        })
    }

    fn tree(&self, space: Space) -> &sled::Tree {
        match space {
            Space::Log => &self.log,
            Space::Meta => &self.meta,
        }
    }
}

impl KvStore for SledKv {
    fn get(&self, space: Space, key: &[u8]) -> io::Result<Option<Vec<u8>>> {
        Ok(self.tree(space).get(key).map_err(to_io)?.map(|v| v.to_vec()))
    }

    fn insert_batch(&self, space: Space, items: Vec<(Vec<u8>, Vec<u8>)>) -> io::Result<()> {
        let mut batch = sled::Batch::default();
        for (k, v) in items {
            batch.insert(k, v);
        }
        self.tree(space).apply_batch(batch).map_err(to_io)
    }

    fn remove_range(&self, space: Space, from: &[u8], to: Option<&[u8]>) -> io::Result<()> {
        let tree = self.tree(space);
        let mut batch = sled::Batch::default();
        let iter = match to {
            Some(to) => tree.range(from..to),
            None => tree.range(from..),
        };
        for kv in iter {
            batch.remove(kv.map_err(to_io)?.0);
        }
        tree.apply_batch(batch).map_err(to_io)
    }

    fn range(&self, space: Space, from: &[u8], to: Option<&[u8]>) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let tree = self.tree(space);
        let iter = match to {
            Some(to) => tree.range(from..to),
            None => tree.range(from..),
        };
        iter.map(|kv| kv.map(|(k, v)| (k.to_vec(), v.to_vec())).map_err(to_io))
            .collect()
    }

    fn last(&self, space: Space) -> io::Result<Option<(Vec<u8>, Vec<u8>)>> {
        Ok(self
            .tree(space)
            .last()
            .map_err(to_io)?
            .map(|(k, v)| (k.to_vec(), v.to_vec())))
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
    fn writes_survive_reopen_after_sync() {
        let dir = tempfile::tempdir().unwrap();
        {
            let kv = SledKv::open(dir.path()).unwrap();
            let big = vec![7u8; 2 << 20]; // large enough to become a sled blob
            kv.insert_batch(Space::Log, vec![(1u64.to_be_bytes().to_vec(), b"a".to_vec())])
                .unwrap();
            kv.insert_batch(Space::Log, vec![(2u64.to_be_bytes().to_vec(), big)])
                .unwrap();
            kv.insert_batch(Space::Meta, vec![(b"vote".to_vec(), b"v".to_vec())])
                .unwrap();
            kv.sync().unwrap();
        }
        let kv = SledKv::open(dir.path()).unwrap();
        assert_eq!(kv.get(Space::Meta, b"vote").unwrap(), Some(b"v".to_vec()));
        assert_eq!(kv.range(Space::Log, &[], None).unwrap().len(), 2);
        assert_eq!(kv.last(Space::Log).unwrap().unwrap().1.len(), 2 << 20);
        kv.remove_range(Space::Log, &2u64.to_be_bytes(), None).unwrap();
        assert_eq!(kv.range(Space::Log, &[], None).unwrap().len(), 1);
    }
}
