//! `--unsafe-disk-fault-file`: a TEST ONLY switch that makes this replica's storage fail as a full
//! or failing disk does, so that a test of real processes can show what a replica does then
//! (`storesvr/tests/full_disk.rs`).
//!
//! While the named file exists, every write and sync of the Raft log (`segment_log.rs`) and of the
//! key files (`kv.rs`) fails, as if the disk were full (ENOSPC); if the file holds the word
//! `eio-sync`, writes go through and only the syncs fail (EIO), the case where written pages sit
//! in the page cache with nothing known about whether they reach the disk. Removing the file is
//! space coming back. Without the flag nothing is checked and nothing costs anything but one
//! branch per write.
//!
//! Why a file and not a signal or an RPC: a test flips it from outside the process without a
//! new port, and a restarted process (what comes after a storage error) sees the same fault until
//! the test clears it, as it would see the same full disk.
//!
//! Left out: failing reads (a read error is reported to openraft like a write error, and the
//! replica stops the same way), and partial writes (a failed write is cut back in
//! `SegmentLog::append`, and the next open cuts a torn tail anyway).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where a storage call is, for [`DiskFault::check`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Data goes to the page cache (or a file or directory is created, renamed, cut or removed).
    Write,
    /// `fsync` / `fdatasync`.
    Sync,
}

/// The fault switch: none in production.
#[derive(Clone, Debug, Default)]
pub struct DiskFault {
    file: Option<Arc<PathBuf>>,
}

impl DiskFault {
    /// Faults while `file` exists.
    pub fn from_file(file: &Path) -> Self {
        Self {
            file: Some(Arc::new(file.to_path_buf())),
        }
    }

    /// The injected error for `op`, if the fault is on: ENOSPC for everything, or EIO for syncs
    /// only when the file says `eio-sync`.
    pub fn check(&self, op: Op) -> io::Result<()> {
        let Some(file) = &self.file else {
            return Ok(());
        };
        let Ok(mode) = std::fs::read_to_string(file.as_path()) else {
            return Ok(());
        };
        let (errno, what) = match (mode.trim(), op) {
            ("eio-sync", Op::Write) => return Ok(()),
            ("eio-sync", Op::Sync) => (EIO, "input/output error on fsync"),
            _ => (ENOSPC, "no space left on device"),
        };
        let os = io::Error::from_raw_os_error(errno);
        Err(io::Error::new(
            os.kind(),
            format!("{what} (injected by --unsafe-disk-fault-file {})", file.display()),
        ))
    }
}

/// Linux's errno values (the only platform this runs on: the log relies on `fdatasync`).
const ENOSPC: i32 = 28;
const EIO: i32 = 5;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fault_follows_the_file_and_its_mode() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("fault");
        let fault = DiskFault::from_file(&file);
        assert!(fault.check(Op::Write).is_ok() && fault.check(Op::Sync).is_ok());
        std::fs::write(&file, "").unwrap();
        let err = fault.check(Op::Write).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::StorageFull, "{err}");
        assert!(err.to_string().contains("--unsafe-disk-fault-file"), "{err}");
        assert!(fault.check(Op::Sync).is_err());
        std::fs::write(&file, "eio-sync\n").unwrap();
        assert!(fault.check(Op::Write).is_ok());
        assert!(fault.check(Op::Sync).unwrap_err().to_string().contains("fsync"));
        std::fs::remove_file(&file).unwrap();
        assert!(fault.check(Op::Sync).is_ok());
        assert!(DiskFault::default().check(Op::Sync).is_ok());
    }
}
