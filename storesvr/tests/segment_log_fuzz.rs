//! Segment-log recovery from random damage (issue "Security and hardening", bullet "Fuzzing").
//!
//! Each case appends random entries (payloads of 0 bytes to a few kilobytes) over many small
//! segments, syncs (the acknowledged point), appends more without a sync, damages the files in
//! one of four ways and reopens, telling the log (as `LogStore` does with its committed index on
//! disk) that the entries up to a random one of the synced ones were synced. What
//! `SegmentLog::open_keeping` promises, read from its recovery code (every record is
//! `[len][crc32 of index and payload][index][payload]`; a bad record ends the scan of its segment;
//! only the last segment may be cut, any other bad segment refuses):
//!
//! - it never panics, every entry it returns is exactly what was written at that index, and a
//!   refusal changes no byte of any file;
//! - damage in the last segment (a cut, a flipped byte, garbage after the end) that drops only
//!   entries above the index it was told were synced is taken for a torn tail: the log opens
//!   with every entry before the first damaged record, and no other. Damage past the synced point
//!   therefore keeps every acknowledged entry;
//! - damage there that would drop an entry at or below that index refuses with an error naming
//!   the segment file, unless only zeros are left after the last whole record (a log that merely
//!   ends early, which `LogStore` refuses one level up, knowing its purge point). Entries synced
//!   but above the index it was told can still be dropped silently: the window between two
//!   writes of the committed index (docs/FUZZING.md, "Findings");
//! - a flipped byte, garbage or a cut inside a record of any other segment refuses to open with
//!   an error naming that segment file;
//! - a missing middle segment, or one cut exactly at a record boundary, refuses to open with an
//!   error naming the segment after the hole (a segment starts where the one before it ends).
//!
//! The expectation is exact (the set of indexes read back), so every deviation fails.
//! `PROPTEST_CASES` overrides the CI case count for long runs.

use proptest::prelude::*;
use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use storesvr::storage::segment_log::{SEGMENT_BYTES, SegmentLog};

/// Cases per property in CI: about 5 s of a debug build (docs/FUZZING.md).
const CI_CASES: u32 = 200;

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok());
    ProptestConfig::with_cases(cases.unwrap_or(CI_CASES))
}

/// How the files are damaged after the writer is gone. Positions are fractions (0..1 of the
/// file or of the segment list) so that one strategy fits every layout.
#[derive(Debug, Clone)]
enum Damage {
    /// Cut the last segment at this fraction of its length.
    TruncateLast(f64),
    /// XOR a non-zero byte into one position of one segment.
    Flip { seg: f64, at: f64, xor: u8 },
    /// Append these bytes to one segment.
    Garbage { seg: f64, bytes: Vec<u8> },
    /// Delete a segment that is neither first nor last.
    DeleteMiddle(f64),
    /// Cut a segment that is neither first nor last.
    TruncateMiddle { seg: f64, at: f64 },
}

fn damage() -> impl Strategy<Value = Damage> {
    let frac = || 0.0..1.0f64;
    prop_oneof![
        frac().prop_map(Damage::TruncateLast),
        (frac(), frac(), 1u8..=255).prop_map(|(seg, at, xor)| Damage::Flip { seg, at, xor }),
        (frac(), prop::collection::vec(any::<u8>(), 1..64)).prop_map(|(seg, bytes)| Damage::Garbage { seg, bytes }),
        frac().prop_map(Damage::DeleteMiddle),
        (frac(), frac()).prop_map(|(seg, at)| Damage::TruncateMiddle { seg, at }),
    ]
}

/// Payload sizes: empty, small, and large against the segment size.
fn payload() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        1 => Just(Vec::new()),
        4 => prop::collection::vec(any::<u8>(), 1..64),
        2 => prop::collection::vec(any::<u8>(), 64..1024),
        1 => prop::collection::vec(any::<u8>(), 1024..5000),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    first: u64,
    payloads: Vec<Vec<u8>>,
    /// How many of the entries are appended and synced before the rest.
    synced: usize,
    /// The index the reopening log is told was synced (at most the last synced entry), as
    /// `LogStore` tells it its committed index on disk.
    synced_to: Option<u64>,
    batch: usize,
    segment_bytes: u64,
    damage: Damage,
}

/// A fraction, 1 (all) in a third of the cases: every entry synced and the log told so is the
/// case in which damage in the last segment must refuse.
fn all_or_part() -> impl Strategy<Value = f64> {
    prop_oneof![1 => Just(1.0), 2 => 0.0..=1.0f64]
}

fn case() -> impl Strategy<Value = Case> {
    (
        1u64..1000,
        prop::collection::vec(payload(), 1..40),
        all_or_part(),
        all_or_part(),
        1usize..4,
        64u64..2048,
        damage(),
    )
        .prop_map(|(first, payloads, synced, told, batch, segment_bytes, damage)| {
            let synced = (payloads.len() as f64 * synced) as usize;
            let told = (synced as f64 * told) as u64;
            Case {
                synced,
                synced_to: (told > 0).then(|| first + told - 1),
                first,
                payloads,
                batch,
                segment_bytes,
                damage,
            }
        })
}

/// Where one written entry sits on disk.
#[derive(Debug, Clone, Copy)]
struct Place {
    seg: usize,
    end: u64,
}

/// Writes the case's entries, syncing after the first `synced`; the log is closed on return.
fn write(dir: &Path, case: &Case) -> BTreeMap<u64, Vec<u8>> {
    let log = SegmentLog::open_with_segment_bytes(dir, case.segment_bytes).expect("open a new log");
    let entries: Vec<(u64, Vec<u8>)> = (case.first..).zip(case.payloads.iter().cloned()).collect();
    let (acked, rest) = entries.split_at(case.synced);
    for chunk in acked.chunks(case.batch) {
        log.append(chunk).expect("append");
    }
    log.sync().expect("sync");
    for chunk in rest.chunks(case.batch) {
        log.append(chunk).expect("append");
    }
    entries.into_iter().collect()
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    files
}

/// Parses the undamaged files by the documented record layout (16-byte header, then payload),
/// up to the zeros the log writes ahead of its last record.
fn layout(files: &[PathBuf]) -> BTreeMap<u64, Place> {
    let mut places = BTreeMap::new();
    for (seg, path) in files.iter().enumerate() {
        let bytes = std::fs::read(path).unwrap();
        let mut at = 0usize;
        while at < bytes.len() && bytes[at..].iter().any(|b| *b != 0) {
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
            let index = u64::from_le_bytes(bytes[at + 8..at + 16].try_into().unwrap());
            let end = at + 16 + len;
            places.insert(index, Place { seg, end: end as u64 });
            at = end;
        }
    }
    places
}

/// What reopening must give: exactly these indexes, or a refusal naming this file.
#[derive(Debug)]
enum Expect {
    Exactly(Vec<u64>),
    Refuse(PathBuf),
}

fn pick(frac: f64, n: usize) -> usize {
    ((frac * n as f64) as usize).min(n - 1)
}

/// What reopening must give after damage in the last segment that starts at byte `at`: the
/// entries before the first damaged record, or a refusal naming the file when that drops an entry
/// at or below `synced_to` and something other than zeros is left after the last whole record.
fn in_last(files: &[PathBuf], places: &BTreeMap<u64, Place>, at: u64, synced_to: Option<u64>) -> Expect {
    let last = files.len() - 1;
    let lost = |p: &Place| p.seg == last && p.end > at;
    let kept_end = places
        .values()
        .filter(|p| p.seg == last && p.end <= at)
        .map(|p| p.end)
        .max()
        .unwrap_or(0);
    let bytes = std::fs::read(&files[last]).unwrap();
    let only_zeros = bytes.get(kept_end as usize..).is_none_or(|b| b.iter().all(|x| *x == 0));
    let drops_synced = places
        .iter()
        .any(|(i, p)| lost(p) && synced_to.is_some_and(|s| *i <= s));
    if drops_synced && !only_zeros {
        Expect::Refuse(files[last].clone())
    } else {
        Expect::Exactly(places.iter().filter(|(_, p)| !lost(p)).map(|(i, _)| *i).collect())
    }
}

/// Damages the files and says what reopening must give, and where the damage starts when it is
/// in the last segment; `None` when the layout has no segment this damage applies to (fewer
/// than three segments for a middle one).
fn apply(
    damage: &Damage,
    files: &[PathBuf],
    places: &BTreeMap<u64, Place>,
    synced_to: Option<u64>,
) -> Option<(Expect, Option<u64>)> {
    let n = files.len();
    let keep = |lost: &dyn Fn(&Place) -> bool| {
        Expect::Exactly(places.iter().filter(|(_, p)| !lost(p)).map(|(i, _)| *i).collect())
    };
    let len = |seg: usize| std::fs::metadata(&files[seg]).unwrap().len();
    let cut = |seg: usize, at: u64| {
        OpenOptions::new()
            .write(true)
            .open(&files[seg])
            .unwrap()
            .set_len(at)
            .unwrap()
    };
    let boundary = |seg: usize, at: u64| at == 0 || places.values().any(|p| p.seg == seg && p.end == at);
    Some(match *damage {
        Damage::TruncateLast(at) => {
            let at = (len(n - 1) as f64 * at) as u64;
            cut(n - 1, at);
            (in_last(files, places, at, synced_to), Some(at))
        }
        Damage::Flip { seg, at, xor } => {
            let seg = pick(seg, n);
            let mut bytes = std::fs::read(&files[seg]).unwrap();
            let at = pick(at, bytes.len());
            bytes[at] ^= xor;
            std::fs::write(&files[seg], bytes).unwrap();
            if seg + 1 == n {
                (in_last(files, places, at as u64, synced_to), Some(at as u64))
            } else {
                (Expect::Refuse(files[seg].clone()), None)
            }
        }
        Damage::Garbage { seg, ref bytes } => {
            let seg = pick(seg, n);
            let end = len(seg);
            let mut file = OpenOptions::new().append(true).open(&files[seg]).unwrap();
            std::io::Write::write_all(&mut file, bytes).unwrap();
            if seg + 1 == n {
                (keep(&|_| false), Some(end))
            } else {
                (Expect::Refuse(files[seg].clone()), None)
            }
        }
        // The segment after the hole starts past where the one before it ends: refused, naming it.
        Damage::DeleteMiddle(seg) if n >= 3 => {
            let seg = 1 + pick(seg, n - 2);
            std::fs::remove_file(&files[seg]).unwrap();
            (Expect::Refuse(files[seg + 1].clone()), None)
        }
        Damage::TruncateMiddle { seg, at } if n >= 3 => {
            let seg = 1 + pick(seg, n - 2);
            let at = (len(seg) as f64 * at) as u64;
            cut(seg, at);
            if boundary(seg, at) {
                // Whole records lost from its end: the next segment starts past where it ends.
                (Expect::Refuse(files[seg + 1].clone()), None)
            } else {
                (Expect::Refuse(files[seg].clone()), None)
            }
        }
        Damage::DeleteMiddle(_) | Damage::TruncateMiddle { .. } => return None,
    })
}

/// Every file's bytes, to show that a refused open changed none.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    segments(dir)
        .into_iter()
        .map(|f| (f.clone(), std::fs::read(f).unwrap()))
        .collect()
}

/// Reopens and checks the outcome against `expect` and the written entries.
/// `must_keep`: synced entries that no damage touched, which must read back.
fn check(
    dir: &Path,
    case: &Case,
    written: &BTreeMap<u64, Vec<u8>>,
    expect: Expect,
    must_keep: &[u64],
) -> Result<(), TestCaseError> {
    let before = snapshot(dir);
    let opened = SegmentLog::open_keeping(dir, case.segment_bytes, case.synced_to);
    let log = match (opened, expect) {
        (Err(e), Expect::Refuse(path)) => {
            let name = path.file_name().unwrap().to_str().unwrap();
            prop_assert!(e.to_string().contains(name), "refusal does not name {name}: {e}");
            prop_assert!(snapshot(dir) == before, "a refused open changed the files");
            return Ok(());
        }
        (Err(e), Expect::Exactly(want)) => {
            return Err(TestCaseError::fail(format!(
                "refused to open ({e}), want entries {want:?}"
            )));
        }
        (Ok(log), Expect::Refuse(path)) => {
            let got: Vec<u64> = log.read(0, u64::MAX).unwrap().into_iter().map(|e| e.0).collect();
            return Err(TestCaseError::fail(format!(
                "opened {got:?} despite damage in {}",
                path.display()
            )));
        }
        (Ok(log), Expect::Exactly(want)) => (log, want),
    };
    let (log, want) = log;
    let got = log
        .read(0, u64::MAX)
        .map_err(|e| TestCaseError::fail(format!("read: {e}")))?;
    for (index, payload) in &got {
        prop_assert!(
            written.get(index) == Some(payload),
            "entry {index} reads back other bytes than written"
        );
    }
    let got: Vec<u64> = got.into_iter().map(|e| e.0).collect();
    let lost: Vec<&u64> = must_keep.iter().filter(|i| !got.contains(i)).collect();
    prop_assert!(
        lost.is_empty(),
        "acknowledged entries {lost:?} lost to damage past the synced end"
    );
    prop_assert_eq!(&got, &want);
    // The log goes on after recovery: a further entry is durable and the rest is unchanged.
    let next = got.last().map_or(case.first, |l| l + 1);
    log.append(&[(next, b"after recovery".to_vec())])
        .expect("append after recovery");
    log.sync().expect("sync after recovery");
    drop(log);
    let again = SegmentLog::open(dir).expect("reopen after recovery");
    let indexes: Vec<u64> = again.read(0, u64::MAX).unwrap().into_iter().map(|e| e.0).collect();
    prop_assert_eq!(indexes, got.iter().copied().chain([next]).collect::<Vec<_>>());
    Ok(())
}

/// The synced entries whose records end at or before `from` in the last segment, plus every
/// synced entry in earlier segments: those an undamaged-up-to-`from` last segment must keep.
fn acked_before(case: &Case, places: &BTreeMap<u64, Place>, last: usize, from: u64) -> Vec<u64> {
    let acked = case.first..case.first + case.synced as u64;
    acked
        .filter(|i| places[i].seg < last || places[i].end <= from)
        .collect()
}

proptest! {
    #![proptest_config(config())]

    /// The property of the module doc, with the acknowledgement rule also checked on its own:
    /// damage that starts past the synced end of the last segment loses no synced entry.
    #[test]
    fn reopening_a_damaged_log_keeps_exactly_the_undamaged_prefix_or_refuses(case in case()) {
        let dir = tempfile::tempdir().unwrap();
        let written = write(dir.path(), &case);
        let files = segments(dir.path());
        let places = layout(&files);
        prop_assert_eq!(places.len(), written.len(), "the writer lost entries before any damage");
        let last = files.len() - 1;
        let acked = acked_before(&case, &places, last, u64::MAX);
        let synced_end = acked.iter().map(|i| places[i]).filter(|p| p.seg == last).map(|p| p.end).max().unwrap_or(0);
        let Some((expect, tail_from)) = apply(&case.damage, &files, &places, case.synced_to) else { return Ok(()) };
        let must_keep = match tail_from {
            Some(from) if from >= synced_end => acked,
            _ => Vec::new(),
        };
        check(dir.path(), &case, &written, expect, &must_keep)?;
    }
}

/// Minimal case of finding 2 in docs/FUZZING.md, now closed: with the middle one of three
/// segments gone, the log opened and read 1, 3 (a silent hole); it refuses now.
#[test]
fn a_deleted_middle_segment_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let log = SegmentLog::open_with_segment_bytes(dir.path(), 1).unwrap();
    for i in 1..=3u64 {
        log.append(&[(i, vec![i as u8])]).unwrap();
    }
    log.sync().unwrap();
    drop(log);
    std::fs::remove_file(&segments(dir.path())[1]).unwrap();
    let err = SegmentLog::open(dir.path())
        .err()
        .expect("a synced entry vanished and the log opened");
    assert!(err.to_string().contains("entries 2 to 2 are missing"), "{err}");
}

/// A middle segment cut short is refused the same way, and the refusal says which entries are
/// missing: cut at a record's end (the segment reads whole, the next one starts too late) and cut
/// inside a record (a bad record where only the last segment may have one).
#[test]
fn a_truncated_middle_segment_is_refused_naming_the_missing_entries() {
    for (cut_inside_record, names_file) in [(false, 2usize), (true, 1)] {
        let dir = tempfile::tempdir().unwrap();
        // Segments of 40 bytes: 1..=2, 3..=4, 5..=6 (a 16-byte header and a 7-byte payload each).
        let log = SegmentLog::open_with_segment_bytes(dir.path(), 40).unwrap();
        for i in 1..=6u64 {
            log.append(&[(i, format!("entry {i}").into_bytes())]).unwrap();
        }
        log.sync().unwrap();
        drop(log);
        let segs = segments(dir.path());
        assert_eq!(segs.len(), 3, "{segs:?}");
        let middle = &segs[1];
        let keep = if cut_inside_record { 23 + 5 } else { 23 };
        let before = std::fs::read(middle).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(middle)
            .unwrap()
            .set_len(keep)
            .unwrap();
        let err = SegmentLog::open(dir.path())
            .err()
            .expect("synced entry 4 was cut away and the log opened");
        let msg = err.to_string();
        assert!(msg.contains("entries 4 to 4 are missing"), "{msg}");
        let named = segs[names_file].file_name().unwrap().to_str().unwrap();
        assert!(msg.contains(named), "the refusal names {named}: {msg}");
        assert_eq!(
            std::fs::read(middle).unwrap(),
            before[..keep as usize],
            "a refused open changed the cut segment"
        );
    }
}

/// Minimal case of finding 1 in docs/FUZZING.md, now closed: one flipped byte in a synced record
/// of the last segment. `SegmentLog::open` alone still takes it for a torn tail (it does not know
/// how far the segment was synced); told the synced index, as `LogStore` tells it the committed
/// index on disk, it refuses and cuts nothing. That the committed index reaches the disk without
/// a local read asking for it is tested in `storage::log_store`
/// (`commits_without_any_local_read_keep_the_committed_index_on_disk_near_the_log_end`).
#[test]
fn a_flipped_byte_in_a_synced_record_of_the_last_segment_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let log = SegmentLog::open(dir.path()).unwrap();
    log.append(&[(1, vec![1]), (2, vec![2])]).unwrap();
    log.sync().unwrap();
    drop(log);
    let seg = segments(dir.path())[0].clone();
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[16] ^= 1; // the payload of entry 1
    std::fs::write(&seg, &bytes).unwrap();
    let err = SegmentLog::open_keeping(dir.path(), SEGMENT_BYTES, Some(2))
        .err()
        .expect("entries 1 and 2 were acknowledged, and the log opened without them");
    let name = seg.file_name().unwrap().to_str().unwrap();
    assert!(err.to_string().contains(name), "the refusal names the segment: {err}");
    assert!(
        std::fs::read(&seg).unwrap() == bytes,
        "the refused open cut the segment"
    );
}
