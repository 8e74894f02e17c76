//! A small durable key-value store for the Raft metadata: one file per key.
//!
//! The vote, the committed log id, the purge point and the state machine snapshot are written
//! through [`KvStore`] (the log's entries live in `segment_log`). Each is one key, replaced whole,
//! and openraft is told that a vote is saved only once `put` returned, so `put` is durable by
//! itself: write a temporary file, `fdatasync` it, rename it over the key's file, `fsync` the
//! directory. A crash leaves either the old or the new file under the key's name, plus perhaps a
//! temporary file, which `open` removes.
//!
//! Every key file starts with a header (magic, format version, length, CRC32 of the value). A file
//! that fails the check is an error, never "absent": treating a corrupt vote as no vote would let
//! this replica vote twice in a term.
//!
//! Why not sled (which this replaced): sled 0.34.7 could refuse its own directory after repeated
//! SIGKILLs (`empty/corrupt snapshot file found`, `Read corrupted data at file offset None`;
//! spacejam/sled issues 1527, 1533), its `flush` is `sync_file_range` rather than a barrier, and
//! for four small keys a file each is simpler to reason about. Measurements: docs/journal/benchmarks-2026-11.md.
//!
//! Left out: transactions across keys (each caller orders its writes; every `put` is durable
//! before the next begins) and caching (reads are rare: start-up and sending a snapshot).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::storage::dirs::create_dir_synced;
use crate::storage::fault::{DiskFault, Op};

/// The storage operations the Raft stores need: vote, committed and purged log ids, snapshot.
pub trait KvStore: Send + Sync + 'static {
    /// The value of `key`; `None` only when it was never written. A damaged value is an error.
    fn get(&self, key: &[u8]) -> io::Result<Option<Vec<u8>>>;
    /// Replaces the value of `key`; durable when it returns.
    fn put(&self, key: &[u8], value: &[u8]) -> io::Result<()>;
}

const MAGIC: &[u8; 4] = b"SQKV";
const VERSION: u8 = 1;
/// magic, version, value length (u64 LE), CRC32 of the value (u32 LE).
const HEADER: usize = 4 + 1 + 8 + 4;
/// Temporary files are named `<key>.tmp.<n>`; keys never contain a dot.
const TMP: &str = ".tmp.";

/// One file per key in one directory.
pub struct FileKv {
    dir: PathBuf,
    /// Kept open to `fsync` the directory after each rename.
    dir_file: File,
    tmp_seq: AtomicU64,
    /// `--unsafe-disk-fault-file` (tests only); none otherwise.
    fault: DiskFault,
}

impl FileKv {
    /// Opens (creating if needed) the store in `dir` and removes temporary files a crash left.
    pub fn open(dir: &Path) -> io::Result<Self> {
        create_dir_synced(dir)?;
        let mut removed = false;
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            if e.file_name().to_string_lossy().contains(TMP) {
                std::fs::remove_file(e.path())?;
                removed = true;
            }
        }
        let dir_file = File::open(dir)?;
        if removed {
            dir_file.sync_all()?;
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            dir_file,
            tmp_seq: AtomicU64::new(0),
            fault: DiskFault::default(),
        })
    }

    /// This store with every `put` failing while `fault` is on (`--unsafe-disk-fault-file`).
    pub fn with_fault(mut self, fault: DiskFault) -> Self {
        self.fault = fault;
        self
    }

    fn name(key: &[u8]) -> io::Result<&str> {
        match std::str::from_utf8(key) {
            Ok(k) if !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') => Ok(k),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("key {key:?}: only [A-Za-z0-9_] may name a key file"),
            )),
        }
    }
}

fn encode(value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + value.len());
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.extend_from_slice(&(value.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(value).to_le_bytes());
    out.extend_from_slice(value);
    out
}

/// The value inside a key file, or why the file cannot be trusted.
fn decode(mut bytes: Vec<u8>) -> Result<Vec<u8>, String> {
    if bytes.len() < HEADER {
        return Err(format!("{} bytes, shorter than the {HEADER}-byte header", bytes.len()));
    }
    if &bytes[..4] != MAGIC || bytes[4] != VERSION {
        return Err("bad magic or format version".into());
    }
    let len = u64::from_le_bytes(bytes[5..13].try_into().expect("8 bytes"));
    let crc = u32::from_le_bytes(bytes[13..17].try_into().expect("4 bytes"));
    if len != (bytes.len() - HEADER) as u64 {
        return Err(format!(
            "header says {len} bytes of value, file holds {}",
            bytes.len() - HEADER
        ));
    }
    let value = bytes.split_off(HEADER);
    if crc32fast::hash(&value) != crc {
        return Err("CRC32 mismatch".into());
    }
    Ok(value)
}

impl KvStore for FileKv {
    fn get(&self, key: &[u8]) -> io::Result<Option<Vec<u8>>> {
        let path = self.dir.join(Self::name(key)?);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        decode(bytes).map(Some).map_err(|why| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} is damaged ({why}); refusing to read it as absent. This replica's Raft \
                     metadata cannot be trusted: bring it back under a new node id with \
                     `seqctl replica add`",
                    path.display()
                ),
            )
        })
    }

    fn put(&self, key: &[u8], value: &[u8]) -> io::Result<()> {
        let name = Self::name(key)?;
        let n = self.tmp_seq.fetch_add(1, Ordering::Relaxed);
        let tmp = self.dir.join(format!("{name}{TMP}{n}"));
        let written = (|| {
            self.fault.check(Op::Write)?;
            let mut f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
            f.write_all(&encode(value))?;
            self.fault.check(Op::Sync)?;
            f.sync_data()?;
            std::fs::rename(&tmp, self.dir.join(name))
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written?;
        self.fault.check(Op::Sync)?;
        self.dir_file.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_survive_reopen_and_leftover_temp_files_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let big = vec![7u8; 2 << 20];
        {
            let kv = FileKv::open(dir.path()).unwrap();
            assert_eq!(kv.get(b"vote").unwrap(), None);
            kv.put(b"snapshot", &big).unwrap();
            kv.put(b"vote", b"v1").unwrap();
            kv.put(b"vote", b"v2").unwrap();
        }
        std::fs::write(dir.path().join("vote.tmp.9"), b"half a write").unwrap();
        let kv = FileKv::open(dir.path()).unwrap();
        assert_eq!(kv.get(b"vote").unwrap(), Some(b"v2".to_vec()));
        assert_eq!(kv.get(b"snapshot").unwrap(), Some(big));
        assert!(!dir.path().join("vote.tmp.9").exists());
        assert!(kv.put(b"../x", b"").is_err(), "a key must not name another path");
    }

    #[test]
    fn a_damaged_key_file_is_an_error_not_absent() {
        let dir = tempfile::tempdir().unwrap();
        let kv = FileKv::open(dir.path()).unwrap();
        kv.put(b"vote", b"a vote of some length").unwrap();
        let path = dir.path().join("vote");
        let good = std::fs::read(&path).unwrap();
        let mut flipped = good.clone();
        *flipped.last_mut().unwrap() ^= 1;
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("empty", vec![]),
            ("torn header", good[..10].to_vec()),
            ("torn value", good[..good.len() - 3].to_vec()),
            ("flipped bit", flipped),
            ("not a key file", b"hello, this is not a key file".to_vec()),
        ];
        for (what, bytes) in cases {
            std::fs::write(&path, bytes).unwrap();
            let err = kv.get(b"vote").expect_err(what);
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{what}: {err}");
            assert!(err.to_string().contains("damaged"), "{what}: {err}");
        }
    }
}
