//! The Raft log's entries in append-only segment files, synced with `fdatasync`.
//!
//! Why not sled (which kept the vote and snapshots until key files replaced it,
//! see `kv.rs`): a log is written at its end and
//! read back almost only from its end, and on this disk sled's insert + flush +
//! `fdatasync` of its db file took 110–140 µs against 50–65 µs for an append and
//! `fdatasync` of a plain file, while sled's IO threads took about a fifth of the
//! leader's CPU under load (docs/journal/benchmarks-2026-11.md). Both sit on the commit path of
//! every entry on every replica.
//!
//! Layout: `dir/<first index, 20 digits>.seg`, each a run of records
//! `[len: u32][crc32 of index and payload: u32][index: u64][payload]` (little
//! endian) with increasing indexes, across segments too. Raft never leaves a
//! hole, but gaps inside a segment are accepted (openraft's storage suite writes
//! them); a segment starts where the one before it ends, so a segment deleted from
//! the middle is seen at open and refused. Writing at or below the last index
//! needs a truncation first. Writes go to
//! the page cache at once (readable by replication) and become durable on
//! [`SegmentLog::sync`]. Only the last segment can hold a torn or unsynced tail:
//! a segment is synced before the next one is created, and a new file's
//! directory entry is synced with it. Opening cuts the last segment back to its
//! last whole record; a bad record anywhere else is corruption and refuses to
//! open. The log cannot tell bit rot in the synced part of the last segment from a
//! torn tail by itself (it does not record how far it was synced); its owner can:
//! [`SegmentLog::open_keeping`] is told the index up to which entries were synced
//! (the durable committed index, `log_store.rs`) and refuses, cutting nothing, when
//! a bad record lies at or below it. Truncation and purge are synced before they
//! return, so removed entries never come back after a crash.
//!
//! A failed write or sync stops the log for good (until it is opened again): every later append,
//! sync, truncation or purge returns an error naming the first failure. After a failed `fsync` the
//! state of the page cache is unknown (Linux may have marked the unwritten pages clean, so a
//! second `fsync` succeeds without writing them: the "fsyncgate" lesson), so a retried sync must
//! not be trusted to cover entries written before it; reopening reads back what is really on
//! disk. `LogStore` reports the error to openraft, which stops the Raft node, and the process
//! exits (`main.rs`, docs/OPERATIONS.md "A full or failing disk").
//!
//! Zeros ahead: the last segment keeps up to [`ZERO_AHEAD_BYTES`] of zeros written
//! after its last record, and records are written over them. A sync then only
//! overwrites blocks that are already allocated and does not change the file's
//! size, so `fdatasync` has no metadata to commit: 108–127 µs against 136–186 µs
//! for an append of 120 bytes on the benchmark machine's disk (docs/journal/benchmarks-2026-11.md),
//! and a sync sits on every commit's path on the leader and on a follower. Zeros
//! read as a torn tail (a zero header fails its checksum), so opening cuts them
//! like one, and a segment is cut back to its last record before a later one is
//! created: only the last segment ever holds zeros.
//!
//! Left out: compression, and a read cache (reads are `pread`s served from the
//! page cache).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::storage::dirs::{create_dir_synced, sync_dir};
use crate::storage::fault::{DiskFault, Op};

/// A segment is closed and a new one started beyond this size.
pub const SEGMENT_BYTES: u64 = 64 << 20;
const HEADER: usize = 16;
/// Zeros kept written ahead of the last record (at most the segment size): refilled when less
/// than half is left, so the size change and block allocation of a refill reach the disk with
/// one sync in about half a megabyte of log.
pub const ZERO_AHEAD_BYTES: u64 = 1 << 20;
/// Largest payload accepted (a corrupt length must not allocate gigabytes on open); the shared
/// table asserts that the writer's largest entry fits.
const MAX_RECORD: u32 = seqsvr_proto::limits::MAX_LOG_RECORD_BYTES as u32;

struct Segment {
    path: PathBuf,
    file: Arc<File>,
    /// (index, byte offset) of each record, indexes increasing.
    records: Vec<(u64, u64)>,
    /// End of the last record: where the next one goes.
    len: u64,
    /// Size of the file: `len`, then zeros written ahead (the last segment only).
    size: u64,
}

impl Segment {
    fn last_index(&self) -> Option<u64> {
        self.records.last().map(|r| r.0)
    }

    /// Position of the first record with an index at or above `index`.
    fn position(&self, index: u64) -> usize {
        self.records.partition_point(|r| r.0 < index)
    }

    /// End of record `i`: where the next one starts.
    fn end_of(&self, i: usize) -> u64 {
        self.records.get(i + 1).map_or(self.len, |r| r.1)
    }
}

struct Inner {
    segments: Vec<Segment>,
    /// The last segment has writes not yet covered by a sync.
    dirty: bool,
    /// First index that may be read: everything below was purged (a segment that also holds
    /// later entries stays on disk, its purged entries are hidden).
    floor: u64,
    /// The first write or sync that failed: the log refuses every write and sync after it.
    failed: Option<String>,
}

impl Inner {
    /// The error for a write or sync after a failed one.
    fn refuse_if_failed(&self) -> io::Result<()> {
        match &self.failed {
            None => Ok(()),
            Some(first) => Err(io::Error::other(format!(
                "the raft log stopped after a failed write or sync ({first}): what reached the disk \
                 since is unknown, so nothing more is written or acknowledged; restart the process to \
                 reopen the log from what is on disk"
            ))),
        }
    }

    /// Records `e` as the failure that stops the log (the first one wins) and returns it.
    fn fail(&mut self, e: io::Error) -> io::Error {
        tracing::error!(error = %e, "raft log write or sync failed; the log takes no more writes");
        self.failed.get_or_insert_with(|| e.to_string());
        e
    }
}

/// The log's entries as opaque payloads keyed by consecutive indexes.
pub struct SegmentLog {
    dir: PathBuf,
    /// Roll-over size: [`SEGMENT_BYTES`] except in tests that need many segments.
    segment_bytes: u64,
    inner: Mutex<Inner>,
    /// Held across the whole of a [`sync`](Self::sync), so that a sync which finds the log clean
    /// knows that the sync which cleaned it has finished, not merely begun: with two threads
    /// syncing (the flusher, and a caller that found it idle) a clean flag alone could be read
    /// while the other thread's `fdatasync` is still running.
    syncing: Mutex<()>,
    /// `fdatasync`s of the last segment run by [`sync`](Self::sync) so far: lets tests see
    /// what a caller costs (a sync of a clean log runs none).
    syncs: AtomicU64,
    /// `--unsafe-disk-fault-file` (tests only); none otherwise.
    fault: DiskFault,
}

fn corrupt(path: &Path, offset: u64, what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("raft log segment {} at byte {offset}: {what}", path.display()),
    )
}

/// The refusal of a bad record at or below the index the owner knows was synced.
fn damaged_synced(path: &Path, offset: u64, kept: Option<u64>, synced: u64) -> io::Error {
    let kept = kept.map_or_else(|| "no entry".to_string(), |k| format!("entry {k}"));
    corrupt(
        path,
        offset,
        &format!(
            "bad record after {kept}, but entries up to {synced} were committed and synced here: this is \
             damage to synced data, not a torn tail, and nothing was cut. This replica cannot start on this \
             data: move its data dir away and bring it back as a new replica (--new-replica under a new \
             node id, then `seqctl replica add`); it catches up from its peers"
        ),
    )
}

/// Refuses a segment whose first index `first` does not follow the last index `after` of the
/// segments before it: the entries between are gone.
fn follows(path: &Path, first: u64, after: Option<u64>) -> io::Result<()> {
    match after {
        Some(prev) if first != prev + 1 => Err(corrupt(
            path,
            0,
            &format!(
                "starts at index {first}, but the segment before it ends at {prev}: entries {} to {} \
                 are missing (a segment between them was removed, or the one before was cut short at \
                 a record's end)",
                prev + 1,
                first.saturating_sub(1)
            ),
        )),
        _ => Ok(()),
    }
}

/// What a bad record in a segment that is not the last one costs: every entry from the one after
/// the last whole record (`kept`, or the segment's `first` if none) to the one before the next
/// segment's first (`next`) is gone, synced ones included.
fn closed_segment_damage(kept: Option<u64>, first: u64, next: u64) -> String {
    let from = kept.map_or(first, |k| k + 1);
    format!(
        "bad record in a closed segment (cut short or damaged): entries {from} to {} are missing, and \
         they were synced before the next segment was started. This replica cannot start on this \
         data: move its data dir away and bring it back as a new replica (--new-replica under a new \
         node id, then `seqctl replica add`); it catches up from its peers",
        next.saturating_sub(1)
    )
}

fn segment_name(first: u64) -> String {
    format!("{first:020}.seg")
}

fn checksum(index: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&index.to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// Writes zeros over `[from, to)` of `file`.
fn write_zeros(file: &File, from: u64, to: u64) -> io::Result<()> {
    const CHUNK: u64 = 64 << 10;
    let zeros = [0u8; CHUNK as usize];
    let mut at = from;
    while at < to {
        let n = (to - at).min(CHUNK);
        file.write_all_at(&zeros[..n as usize], at)?;
        at += n;
    }
    Ok(())
}

/// Whether every byte of `file` from `from` on is zero: the zeros written ahead of the last
/// record, not a torn record.
fn zeros_from(file: &File, from: u64) -> io::Result<bool> {
    let size = file.metadata()?.len();
    let mut buf = vec![0u8; 64 << 10];
    let mut at = from;
    while at < size {
        let n = (size - at).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], at)?;
        if buf[..n].iter().any(|b| *b != 0) {
            return Ok(false);
        }
        at += n as u64;
    }
    Ok(true)
}

/// What [`scan`] found in one segment file.
struct Scanned {
    /// (index, offset) of every whole record.
    records: Vec<(u64, u64)>,
    /// End of the last whole record.
    end: u64,
    /// Nothing follows `end`.
    whole: bool,
}

/// Reads the whole records of one segment whose indexes are above `after`.
fn scan(file: &File, after: Option<u64>) -> io::Result<Scanned> {
    let size = file.metadata()?.len();
    let mut records: Vec<(u64, u64)> = Vec::new();
    let mut at = 0u64;
    let mut header = [0u8; HEADER];
    while at + HEADER as u64 <= size {
        file.read_exact_at(&mut header, at)?;
        let len = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes"));
        let crc = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
        let index = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
        let end = at + HEADER as u64 + len as u64;
        if len > MAX_RECORD || end > size {
            return Ok(Scanned {
                records,
                end: at,
                whole: false,
            });
        }
        let mut payload = vec![0u8; len as usize];
        file.read_exact_at(&mut payload, at + HEADER as u64)?;
        let prev = records.last().map(|r| r.0).or(after);
        if checksum(index, &payload) != crc || prev.is_some_and(|p| index <= p) {
            return Ok(Scanned {
                records,
                end: at,
                whole: false,
            });
        }
        records.push((index, at));
        at = end;
    }
    Ok(Scanned {
        records,
        end: at,
        whole: at == size,
    })
}

impl SegmentLog {
    /// Opens (or creates) the log in `dir`, cutting a torn tail off the last segment.
    pub fn open(dir: &Path) -> io::Result<Self> {
        Self::open_with_segment_bytes(dir, SEGMENT_BYTES)
    }

    /// [`open`](Self::open) rolling over to a new segment beyond `segment_bytes` instead of
    /// [`SEGMENT_BYTES`]: lets tests (storesvr/tests/segment_log_fuzz.rs) spread a few
    /// kilobytes over many segments. The size is not stored; any value reads any log.
    pub fn open_with_segment_bytes(dir: &Path, segment_bytes: u64) -> io::Result<Self> {
        Self::open_keeping(dir, segment_bytes, None)
    }

    /// [`open_with_segment_bytes`](Self::open_with_segment_bytes), told that every entry up to
    /// `synced_to` was synced here before (the owner's durable committed index). A bad record at
    /// or below it in the last segment is damage, not a torn tail: open refuses, naming the file,
    /// and cuts nothing, so the bytes stay for whoever looks into it.
    pub fn open_keeping(dir: &Path, segment_bytes: u64, synced_to: Option<u64>) -> io::Result<Self> {
        create_dir_synced(dir)?;
        let mut firsts: Vec<u64> = std::fs::read_dir(dir)?
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().to_str()?.strip_suffix(".seg")?.parse().ok())
            .collect();
        firsts.sort_unstable();
        let mut segments: Vec<Segment> = Vec::with_capacity(firsts.len());
        for (i, &first) in firsts.iter().enumerate() {
            let path = dir.join(segment_name(first));
            let file = OpenOptions::new().read(true).write(true).open(&path)?;
            let after = segments.iter().rev().find_map(Segment::last_index);
            // Checked before anything is cut, so a refused open leaves every byte as it was.
            follows(&path, first, after)?;
            let Scanned { records, end, whole } = scan(&file, after)?;
            let last = i + 1 == firsts.len();
            if !whole {
                if !last {
                    let kept = records.last().map(|r| r.0).or(after);
                    return Err(corrupt(&path, end, &closed_segment_damage(kept, first, firsts[i + 1])));
                }
                // Only zeros after the records are the zeros written ahead (or a tail that never
                // reached the disk): nothing to cut but zeros. A log that ends too early that way
                // is the owner's to refuse (it knows the committed index and the purge point).
                if !zeros_from(&file, end)? {
                    let kept = records.last().map(|r| r.0).or(after);
                    if let Some(synced) = synced_to.filter(|s| kept.is_none_or(|k| k < *s)) {
                        return Err(damaged_synced(&path, end, kept, synced));
                    }
                    tracing::warn!(segment = %path.display(), at = end, "cutting a torn tail off the raft log");
                }
                file.set_len(end)?;
                file.sync_all()?;
            }
            if records.first().is_some_and(|r| r.0 != first) {
                return Err(corrupt(&path, 0, "first record does not match the file name"));
            }
            segments.push(Segment {
                path,
                file: Arc::new(file),
                records,
                len: end,
                size: end,
            });
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            segment_bytes,
            inner: Mutex::new(Inner {
                segments,
                dirty: false,
                floor: 0,
                failed: None,
            }),
            syncing: Mutex::new(()),
            syncs: AtomicU64::new(0),
            fault: DiskFault::default(),
        })
    }

    /// This log with writes and syncs failing while `fault` is on (`--unsafe-disk-fault-file`).
    pub fn with_fault(mut self, fault: DiskFault) -> Self {
        self.fault = fault;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("segment log lock poisoned")
    }

    /// Appends entries (index, payload) with indexes above every index in the log. Written to
    /// the page cache; durable after the next [`sync`](Self::sync).
    pub fn append(&self, entries: &[(u64, Vec<u8>)]) -> io::Result<()> {
        let Some((first_index, _)) = entries.first() else {
            return Ok(());
        };
        let mut inner = self.lock();
        inner.refuse_if_failed()?;
        let last_before = inner.segments.iter().rev().find_map(Segment::last_index);
        let mut prev = last_before;
        for (index, _) in entries {
            if prev.is_some_and(|p| *index <= p) {
                return Err(io::Error::other(format!(
                    "append of index {index} at or below the last index {}: truncate first",
                    prev.unwrap_or_default()
                )));
            }
            prev = Some(*index);
        }
        let start_new = match inner.segments.last() {
            None => true,
            Some(s) if s.records.is_empty() => true,
            // A segment starts only where the one before it ends: open reads a gap between
            // segments as a segment gone missing. After a gap (which Raft never leaves; the
            // storage suite writes them) the full segment takes the entries and grows past
            // its size until the next consecutive append.
            Some(s) => s.len >= self.segment_bytes && last_before.is_none_or(|l| *first_index == l + 1),
        };
        if start_new && let Err(e) = self.start_segment(&mut inner, *first_index) {
            return Err(inner.fail(e));
        }
        let zero_ahead = ZERO_AHEAD_BYTES.min(self.segment_bytes);
        let seg = inner.segments.last_mut().expect("a segment exists");
        let mut buf = Vec::with_capacity(entries.iter().map(|(_, p)| HEADER + p.len()).sum());
        let mut records = Vec::with_capacity(entries.len());
        for (index, payload) in entries {
            let len = u32::try_from(payload.len())
                .ok()
                .filter(|l| *l <= MAX_RECORD)
                .ok_or_else(|| io::Error::other(format!("log entry {index} is too large")))?;
            records.push((*index, seg.len + buf.len() as u64));
            buf.extend_from_slice(&len.to_le_bytes());
            buf.extend_from_slice(&checksum(*index, payload).to_le_bytes());
            buf.extend_from_slice(&index.to_le_bytes());
            buf.extend_from_slice(payload);
        }
        let end = seg.len + buf.len() as u64;
        let size = seg.size.max(end);
        let refill = size - end < zero_ahead / 2;
        let mut written = self
            .fault
            .check(Op::Write)
            .and_then(|()| seg.file.write_all_at(&buf, seg.len));
        if written.is_ok() && refill {
            written = write_zeros(&seg.file, size, end + zero_ahead);
        }
        if let Err(e) = written {
            // A partial write leaves bytes that the next open cuts off; cut them now so that
            // later appends do not land behind garbage.
            if seg.file.set_len(seg.len).is_ok() {
                seg.size = seg.len;
            }
            return Err(inner.fail(e));
        }
        seg.size = if refill { end + zero_ahead } else { size };
        seg.len = end;
        seg.records.extend(records);
        inner.dirty = true;
        Ok(())
    }

    /// Creates the segment whose first entry is `first_index` and makes it the last one.
    fn start_segment(&self, inner: &mut Inner, first_index: u64) -> io::Result<()> {
        self.fault.check(Op::Write)?;
        // The segment before must be whole on disk, without the zeros ahead of its end, before a
        // later one exists (only the last segment may end in anything but a record), and the new
        // file's name must survive a crash along with what is written into it.
        if let Some(prev) = inner.segments.last_mut() {
            if prev.size > prev.len {
                prev.file.set_len(prev.len)?;
                prev.size = prev.len;
            }
            prev.file.sync_all()?;
        }
        let path = self.dir.join(segment_name(first_index));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        sync_dir(&self.dir)?;
        if inner.segments.last().is_some_and(|s| s.records.is_empty()) {
            // An empty segment (its entries were truncated) gives its place to this one.
            let empty = inner.segments.pop().expect("checked above");
            if empty.path != path {
                std::fs::remove_file(&empty.path)?;
            }
        }
        inner.segments.push(Segment {
            path,
            file: Arc::new(file),
            records: Vec::new(),
            len: 0,
            size: 0,
        });
        Ok(())
    }

    /// Makes every append before this call durable, waiting for a sync already running.
    pub fn sync(&self) -> io::Result<()> {
        let _syncing = self.syncing.lock().expect("segment log sync lock poisoned");
        self.sync_locked()
    }

    /// [`sync`](Self::sync), unless another sync is running right now: `None` then, and nothing
    /// was done. Lets a caller sync on its own thread when that costs no waiting, and hand the
    /// work to the thread that is syncing otherwise.
    pub fn try_sync(&self) -> Option<io::Result<()>> {
        let _syncing = match self.syncing.try_lock() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::WouldBlock) => return None,
            Err(std::sync::TryLockError::Poisoned(_)) => {
                return Some(Err(io::Error::other("segment log sync lock poisoned")));
            }
        };
        Some(self.sync_locked())
    }

    /// The sync itself; the caller holds `syncing`.
    fn sync_locked(&self) -> io::Result<()> {
        let file = {
            let mut inner = self.lock();
            inner.refuse_if_failed()?;
            if !inner.dirty {
                return Ok(());
            }
            inner.dirty = false;
            inner.segments.last().map(|s| s.file.clone())
        };
        // Outside the `inner` lock, so appends and reads go on while the disk works. Writes that land meanwhile
        // mark the log dirty again and are covered by the next sync.
        match file {
            Some(f) => {
                self.syncs.fetch_add(1, Ordering::Relaxed);
                // Not marked dirty again for a retry: a second sync could succeed without writing
                // what the first one lost (see the module docs).
                self.fault
                    .check(Op::Sync)
                    .and_then(|()| f.sync_data())
                    .map_err(|e| self.lock().fail(e))
            }
            None => Ok(()),
        }
    }

    /// How many `fdatasync`s [`sync`](Self::sync) and [`try_sync`](Self::try_sync) have run.
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// Payloads of the entries in `[from, to)` that exist, in order.
    pub fn read(&self, from: u64, to: u64) -> io::Result<Vec<(u64, Vec<u8>)>> {
        self.read_limited(from, to, usize::MAX)
    }

    /// Like [`read`](Self::read), but stops before the payloads would pass `max_bytes`; the first
    /// entry is returned whatever its size, so a non-empty range never reads as empty.
    pub fn read_limited(&self, from: u64, to: u64, max_bytes: usize) -> io::Result<Vec<(u64, Vec<u8>)>> {
        let inner = self.lock();
        let mut out = Vec::new();
        let mut bytes = 0usize;
        let lo = from.max(inner.floor);
        for seg in &inner.segments {
            for i in seg.position(lo)..seg.position(to) {
                let (index, offset) = seg.records[i];
                let start = offset + HEADER as u64;
                let len = (seg.end_of(i) - start) as usize;
                bytes = bytes.saturating_add(len);
                if bytes > max_bytes && !out.is_empty() {
                    return Ok(out);
                }
                let mut payload = vec![0u8; len];
                seg.file.read_exact_at(&mut payload, start)?;
                out.push((index, payload));
            }
        }
        Ok(out)
    }

    /// The last entry that was not purged, if any.
    pub fn last(&self) -> io::Result<Option<(u64, Vec<u8>)>> {
        let last = self.lock().segments.iter().rev().find_map(Segment::last_index);
        match last {
            Some(n) => Ok(self.read(n, n + 1)?.pop()),
            None => Ok(None),
        }
    }

    /// Removes every entry at or after `index`, durably.
    pub fn truncate_from(&self, index: u64) -> io::Result<()> {
        let mut inner = self.lock();
        inner.refuse_if_failed()?;
        let fault = &self.fault;
        let truncated = Self::truncate_locked(&self.dir, fault, &mut inner, index);
        truncated.map_err(|e| inner.fail(e))
    }

    fn truncate_locked(dir: &Path, fault: &DiskFault, inner: &mut Inner, index: u64) -> io::Result<()> {
        fault.check(Op::Write)?;
        while let Some(seg) = inner.segments.last() {
            if seg.records.first().is_some_and(|r| r.0 < index) {
                break;
            }
            // One at a time, last first, each removal durable before the next: a crash must not
            // leave a later segment without an earlier one (open would see a segment missing,
            // and before that check, entries truncated away came back).
            std::fs::remove_file(&seg.path)?;
            fault.check(Op::Sync)?;
            sync_dir(dir)?;
            inner.segments.pop();
        }
        if let Some(seg) = inner.segments.last_mut() {
            let keep = seg.position(index);
            if keep < seg.records.len() {
                let cut = seg.records[keep].1;
                seg.file.set_len(cut)?;
                fault.check(Op::Sync)?;
                seg.file.sync_data()?;
                seg.records.truncate(keep);
                seg.len = cut;
                seg.size = cut;
            }
        }
        Ok(())
    }

    /// Hides every entry at or below `index` and deletes the segments that hold nothing else,
    /// durably. Idempotent: the owner calls it again after [`open`](Self::open) with the purge
    /// point it recorded, which is how a reopened log learns what to hide.
    pub fn purge_upto(&self, index: u64) -> io::Result<()> {
        let mut inner = self.lock();
        inner.refuse_if_failed()?;
        let purged = Self::purge_locked(&self.dir, &self.fault, &mut inner, index);
        purged.map_err(|e| inner.fail(e))
    }

    fn purge_locked(dir: &Path, fault: &DiskFault, inner: &mut Inner, index: u64) -> io::Result<()> {
        inner.floor = inner.floor.max(index + 1);
        let mut removed = 0;
        while inner
            .segments
            .first()
            .is_some_and(|s| s.last_index().is_none_or(|l| l <= index))
        {
            fault.check(Op::Write)?;
            let seg = inner.segments.remove(0);
            std::fs::remove_file(&seg.path)?;
            removed += 1;
        }
        if removed > 0 {
            fault.check(Op::Sync)?;
            sync_dir(dir)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(from: u64, n: u64) -> Vec<(u64, Vec<u8>)> {
        (from..from + n)
            .map(|i| (i, format!("entry {i}").into_bytes()))
            .collect()
    }

    #[test]
    fn appended_entries_read_back_after_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let log = SegmentLog::open(dir.path()).unwrap();
            log.append(&entries(5, 3)).unwrap();
            log.append(&entries(8, 2)).unwrap();
            log.sync().unwrap();
        }
        let log = SegmentLog::open(dir.path()).unwrap();
        assert_eq!(log.read(0, 100).unwrap(), entries(5, 5));
        assert_eq!(log.read(6, 8).unwrap(), entries(6, 2));
        assert_eq!(log.last().unwrap(), Some((9, b"entry 9".to_vec())));
    }

    #[test]
    fn a_limited_read_stops_before_the_byte_limit_and_returns_at_least_one_entry() {
        let dir = tempfile::tempdir().unwrap();
        // Two segments of small files, so the limit is checked across a segment's end.
        let log = SegmentLog::open_with_segment_bytes(dir.path(), 64).unwrap();
        log.append(&entries(1, 9)).unwrap();
        // "entry N" is 7 bytes.
        assert_eq!(
            log.read_limited(1, 10, 21).unwrap(),
            entries(1, 3),
            "exactly the limit fits"
        );
        assert_eq!(log.read_limited(1, 10, 20).unwrap(), entries(1, 2));
        assert_eq!(
            log.read_limited(4, 10, 1).unwrap(),
            entries(4, 1),
            "one entry above the limit"
        );
        assert_eq!(log.read_limited(3, 10, 10_000).unwrap(), entries(3, 7));
        assert_eq!(
            log.read_limited(10, 20, 1).unwrap(),
            Vec::new(),
            "an empty range stays empty"
        );
    }

    #[test]
    fn a_try_sync_never_reports_a_sync_that_another_thread_is_still_running() {
        let dir = tempfile::tempdir().unwrap();
        let log = SegmentLog::open(dir.path()).unwrap();
        log.append(&entries(1, 2)).unwrap();
        {
            // Another thread's sync in progress: it cleared `dirty` and has not finished.
            let _running = log.syncing.lock().unwrap();
            log.lock().dirty = false;
            assert!(
                log.try_sync().is_none(),
                "a clean flag while a sync runs proves nothing"
            );
        }
        log.append(&entries(3, 1)).unwrap();
        assert!(matches!(log.try_sync(), Some(Ok(()))));
        assert!(!log.lock().dirty);
        assert!(matches!(log.try_sync(), Some(Ok(()))), "a clean log syncs at once");
        drop(log);
        let log = SegmentLog::open(dir.path()).unwrap();
        assert_eq!(log.read(0, 10).unwrap(), entries(1, 3));
    }

    #[test]
    fn zeros_ahead_are_overwritten_cut_at_open_and_never_left_in_a_closed_segment() {
        let dir = tempfile::tempdir().unwrap();
        let seg_bytes = 4096;
        let file_len = |first: u64| std::fs::metadata(dir.path().join(segment_name(first))).unwrap().len();
        {
            let log = SegmentLog::open_with_segment_bytes(dir.path(), seg_bytes).unwrap();
            log.append(&entries(1, 2)).unwrap();
            let end = records_end(&log);
            assert!(
                file_len(1) >= end + seg_bytes / 2,
                "zeros are written ahead of the records"
            );
            assert!(zeros_from(&File::open(dir.path().join(segment_name(1))).unwrap(), end).unwrap());
            log.append(&entries(3, 1)).unwrap();
            log.sync().unwrap();
        }
        // Reopening reads every record, cuts the zeros, and appends go on where the records end.
        let log = SegmentLog::open_with_segment_bytes(dir.path(), seg_bytes).unwrap();
        assert_eq!(log.read(0, 10).unwrap(), entries(1, 3));
        assert_eq!(file_len(1), records_end(&log));
        let big = vec![7u8; seg_bytes as usize];
        log.append(&[(4, big.clone())]).unwrap();
        log.append(&[(5, big.clone())]).unwrap(); // rolls over: segment 1 is closed
        assert_eq!(
            file_len(1),
            log.lock().segments[0].len,
            "a closed segment ends at its last record"
        );
        log.sync().unwrap();
        drop(log);
        let log = SegmentLog::open_with_segment_bytes(dir.path(), seg_bytes).unwrap();
        let got: Vec<u64> = log.read(0, 10).unwrap().into_iter().map(|e| e.0).collect();
        assert_eq!(got, [1, 2, 3, 4, 5]);
    }

    #[test]
    fn a_rewrite_is_refused_and_gaps_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let log = SegmentLog::open(dir.path()).unwrap();
        log.append(&entries(1, 2)).unwrap();
        assert!(log.append(&entries(2, 1)).is_err());
        assert!(log.append(&[(4, vec![1]), (4, vec![2])]).is_err());
        assert_eq!(log.read(0, 10).unwrap(), entries(1, 2));
        log.append(&entries(5, 1)).unwrap();
        drop(log);
        let log = SegmentLog::open(dir.path()).unwrap();
        let got: Vec<u64> = log.read(0, 10).unwrap().into_iter().map(|e| e.0).collect();
        assert_eq!(got, [1, 2, 5]);
        assert_eq!(log.read(3, 5).unwrap(), vec![]);
    }

    #[test]
    fn a_gap_never_starts_a_segment_and_a_missing_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        {
            let log = SegmentLog::open_with_segment_bytes(dir.path(), 1).unwrap();
            log.append(&entries(1, 1)).unwrap();
            log.append(&entries(2, 1)).unwrap();
            // After a gap the full segment takes the entry; the next consecutive one rolls over.
            log.append(&entries(10, 1)).unwrap();
            log.append(&entries(11, 1)).unwrap();
            log.sync().unwrap();
        }
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        assert_eq!(names, [segment_name(1), segment_name(2), segment_name(11)]);
        let log = SegmentLog::open(dir.path()).unwrap();
        let got: Vec<u64> = log.read(0, 100).unwrap().into_iter().map(|e| e.0).collect();
        assert_eq!(got, [1, 2, 10, 11]);
        drop(log);
        std::fs::remove_file(dir.path().join(segment_name(2))).unwrap();
        let err = SegmentLog::open(dir.path()).err().expect("a segment is missing");
        assert!(err.to_string().contains(&segment_name(11)), "{err}");
        assert!(err.to_string().contains("ends at 1"), "{err}");
    }

    #[test]
    fn a_failed_sync_or_write_stops_the_log_until_it_is_reopened() {
        let dir = tempfile::tempdir().unwrap();
        let fault_file = dir.path().join("fault");
        let log_dir = dir.path().join("log");
        let fault = DiskFault::from_file(&fault_file);
        let log = SegmentLog::open(&log_dir).unwrap().with_fault(fault.clone());
        log.append(&entries(1, 2)).unwrap();
        log.sync().unwrap();
        // fsync fails: the entry is in the page cache, and nothing says it will reach the disk.
        std::fs::write(&fault_file, "eio-sync").unwrap();
        log.append(&entries(3, 1)).unwrap();
        assert!(log.sync().is_err());
        // The fault is gone, but a second sync could succeed without writing what the first lost:
        // the log takes nothing more and acknowledges nothing more.
        std::fs::remove_file(&fault_file).unwrap();
        let err = log.sync().expect_err("a sync after a failed one is not trusted");
        assert!(err.to_string().contains("restart the process"), "{err}");
        assert!(err.to_string().contains("input/output error on fsync"), "{err}");
        assert!(log.try_sync().is_some_and(|r| r.is_err()));
        assert!(log.append(&entries(4, 1)).is_err());
        assert!(log.truncate_from(3).is_err());
        assert!(log.purge_upto(1).is_err());
        drop(log);
        // Reopened, it reads what is there and goes on.
        let log = SegmentLog::open(&log_dir).unwrap().with_fault(fault.clone());
        assert_eq!(log.read(1, 3).unwrap(), entries(1, 2));
        log.truncate_from(3).unwrap();
        log.append(&entries(3, 1)).unwrap();
        log.sync().unwrap();

        // A full disk: the append fails and leaves nothing behind its last record.
        std::fs::write(&fault_file, "").unwrap();
        let end = records_end(&log);
        let err = log.append(&entries(4, 1)).expect_err("no space");
        assert_eq!(err.kind(), io::ErrorKind::StorageFull, "{err}");
        assert_eq!(records_end(&log), end);
        std::fs::remove_file(&fault_file).unwrap();
        assert!(
            log.append(&entries(4, 1)).is_err(),
            "space is back, the log stays stopped"
        );
        drop(log);
        let log = SegmentLog::open(&log_dir).unwrap();
        assert_eq!(log.read(0, 10).unwrap(), entries(1, 3));
        log.append(&entries(4, 1)).unwrap();
    }

    /// End of the last record of the last segment (the zeros written ahead follow it).
    fn records_end(log: &SegmentLog) -> u64 {
        log.lock().segments.last().map_or(0, |s| s.len)
    }

    #[test]
    fn a_torn_tail_is_cut_and_the_log_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let len = {
            let log = SegmentLog::open(dir.path()).unwrap();
            log.append(&entries(1, 3)).unwrap();
            log.sync().unwrap();
            records_end(&log)
        };
        let seg = dir.path().join(segment_name(1));
        // A crash in the middle of the third record: its last bytes never reached the disk.
        OpenOptions::new()
            .write(true)
            .open(&seg)
            .unwrap()
            .set_len(len - 2)
            .unwrap();
        let log = SegmentLog::open(dir.path()).unwrap();
        assert_eq!(log.read(0, 10).unwrap(), entries(1, 2));
        log.append(&entries(3, 2)).unwrap();
        drop(log);
        let log = SegmentLog::open(dir.path()).unwrap();
        assert_eq!(log.read(0, 10).unwrap(), entries(1, 4));
    }

    #[test]
    fn a_flipped_byte_ends_the_log_at_the_record_before() {
        let dir = tempfile::tempdir().unwrap();
        let end = {
            let log = SegmentLog::open(dir.path()).unwrap();
            log.append(&entries(1, 3)).unwrap();
            records_end(&log)
        };
        let seg = dir.path().join(segment_name(1));
        let mut bytes = std::fs::read(&seg).unwrap();
        let last = end as usize - 1;
        bytes[last] ^= 0xff;
        std::fs::write(&seg, bytes).unwrap();
        let log = SegmentLog::open(dir.path()).unwrap();
        assert_eq!(log.read(0, 10).unwrap(), entries(1, 2));
    }

    #[test]
    fn truncate_and_purge_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let log = SegmentLog::open(dir.path()).unwrap();
            log.append(&entries(1, 10)).unwrap();
            log.truncate_from(7).unwrap();
            assert_eq!(log.last().unwrap().map(|e| e.0), Some(6));
            log.append(&entries(7, 1)).unwrap();
            log.purge_upto(3).unwrap(); // the only segment still holds 4..=7: kept, 1..=3 hidden
            assert_eq!(log.read(0, 100).unwrap(), entries(4, 4));
            log.sync().unwrap();
        }
        let log = SegmentLog::open(dir.path()).unwrap();
        log.purge_upto(3).unwrap();
        assert_eq!(log.read(0, 100).unwrap(), entries(4, 4));
        log.purge_upto(7).unwrap();
        assert_eq!(log.last().unwrap(), None);
        // After a purge past the end (a snapshot was installed) the log restarts anywhere.
        log.append(&entries(20, 2)).unwrap();
        log.truncate_from(0).unwrap();
        assert_eq!(log.last().unwrap(), None);
    }

    #[test]
    fn segments_roll_over_and_stay_consecutive() {
        let dir = tempfile::tempdir().unwrap();
        let big = vec![9u8; (SEGMENT_BYTES / 3) as usize];
        {
            let log = SegmentLog::open(dir.path()).unwrap();
            for i in 1..=7u64 {
                log.append(&[(i, big.clone())]).unwrap();
            }
            log.sync().unwrap();
            assert!(std::fs::read_dir(dir.path()).unwrap().count() >= 2);
            log.purge_upto(3).unwrap();
            log.truncate_from(6).unwrap();
        }
        let log = SegmentLog::open(dir.path()).unwrap();
        let got: Vec<u64> = log.read(0, 100).unwrap().into_iter().map(|e| e.0).collect();
        assert_eq!(*got.last().unwrap(), 5);
        assert!(got.windows(2).all(|w| w[1] == w[0] + 1));
    }
}
