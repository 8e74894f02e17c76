//! The history of a run: one record per call, plus the `max_seq` polls (P3) and the fault windows
//! (P6, unavailability), written as JSON lines and read back.
//!
//! Every call is recorded with its invoke and complete times on one monotonic clock (ns since the
//! run started), its outcome and, when it succeeded, its values and the owner that answered. A
//! call whose outcome is not known (deadline, connection lost mid-call) is recorded as
//! [`Outcome::Unknown`]: the checkers never treat it as "did not happen" (docs/DESIGN.md, Promises).
//!
//! The writer keeps a bounded buffer (a `BufWriter`) and is flushed periodically by the run and at
//! the end; the file is the source of truth, so `sim check FILE` judges exactly what a run judged.
//!
//! Deliberately left out: compression and rotation. A run of a few minutes writes a few hundred MB
//! at most; the workload is rate-limited for that reason.

use seqsvr_proto::keys::KeyPlacement;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// What a call asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallKind {
    /// `FetchNextSeq(uid)`.
    Fetch,
    /// `BatchFetchNextSeq(uids)`: one value per uid, in order.
    BatchFetch,
    /// `GetCurSeq(uid)`.
    Get,
    /// `Reserve(uid, n)`: a block, recorded as the uid n times with the block's n values in
    /// order, so every checker sees it as n fetches that completed together.
    Reserve,
}

/// How a call ended, as far as the caller can know.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The values are valid.
    Ok,
    /// The service said no before doing anything (e.g. no owner reachable); contributes no value.
    Failed,
    /// Timed out or lost mid-call: it may or may not have consumed numbers.
    Unknown,
}

/// The owner that answered, as carried in the reply (`seqsvr.v1.Owner`); lets P4 be checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OwnerTag {
    pub section: u64,
    pub node_id: u64,
    pub incarnation: u64,
    /// Epochs count per set: compare them only within one set.
    pub epoch: u64,
    /// The set of the AllocSvr that answered (histories of one-set runs before sets had none: 0).
    #[serde(default)]
    pub set_id: u64,
}

/// One call of one client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Call {
    /// Unique within a run.
    pub id: u64,
    /// Which workload client made it (calls of one client never overlap).
    pub client: u32,
    pub kind: CallKind,
    pub uids: Vec<u64>,
    /// ns since the run started, taken just before the request was sent.
    pub invoke_ns: u64,
    /// ns since the run started, taken just after the reply (or the error) arrived.
    pub complete_ns: u64,
    pub outcome: Outcome,
    /// One per uid, in order, when `outcome` is `Ok`; empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<u64>,
    /// Owners that answered (one per distinct section served); empty when not known.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owners: Vec<OwnerTag>,
    /// Error text of a failed or unknown call, for the report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Call {
    /// `(uid, value)` pairs of an ok call; nothing for a failed or unknown one.
    pub fn ok_values(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let ok = self.outcome == Outcome::Ok;
        self.uids
            .iter()
            .copied()
            .zip(self.values.iter().copied())
            .filter(move |_| ok)
    }

    /// True for the kinds that hand out numbers.
    pub fn is_fetch(&self) -> bool {
        matches!(self.kind, CallKind::Fetch | CallKind::BatchFetch | CallKind::Reserve)
    }
}

/// One reading of sections' `max_seq` from one source, for P3.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Poll {
    pub at_ns: u64,
    /// `"leader"` for a linearizable Load, `"replica-N"` for one replica's local Status.
    pub source: String,
    /// `(section, max_seq)` pairs (empty for a Status poll). A list, not a map: integer map keys
    /// do not survive serde's internally tagged enums.
    #[serde(default)]
    pub max_seqs: Vec<(u64, u64)>,
    /// Sum of max_seq over all sections, when the source reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sum: Option<u64>,
}

/// One injected fault, from injection to heal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultSpan {
    pub id: u64,
    /// Kind name, e.g. `kill-alloc-owner`; the unit of the per-fault statistics.
    pub kind: String,
    /// What it hit, for the report (e.g. `allocsvr-2`).
    pub target: String,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// One operator move of a section range between sets, as the simulator drove it (`seqctl`,
/// perhaps killed and resumed): the range's owning set changes from `from` to `to` at some moment
/// inside `[start_ns, end_ns]` when `done`, and never when it was cancelled.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveSpan {
    pub op: u64,
    /// Sections `[begin, end)`.
    pub sections: (u64, u64),
    pub from: u64,
    pub to: u64,
    /// Before the operator's first command.
    pub start_ns: u64,
    /// After the op was seen done (or cancelled) in the cluster map.
    pub end_ns: u64,
    /// True when the map says the op is done; false when it was cancelled.
    pub done: bool,
}

/// One `NextIds` call (time-ordered ids). A failed call issued nothing anyone saw, so there is no
/// unknown outcome here: a lost reply only wastes ids.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdCall {
    pub id: u64,
    pub client: u32,
    pub count: u64,
    pub invoke_ns: u64,
    pub complete_ns: u64,
    pub outcome: Outcome,
    /// The ids of an ok call as `(first, count)` runs of consecutive ids, in reply order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<(u64, u64)>,
    /// The set whose slot issued them.
    #[serde(default)]
    pub set_id: u64,
    /// The epoch of that slot's grant to the AllocSvr that issued them (0: not said).
    #[serde(default)]
    pub slot_epoch: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl IdCall {
    /// Every id of an ok call, in reply order.
    pub fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        let ok = self.outcome == Outcome::Ok;
        self.runs
            .iter()
            .filter(move |_| ok)
            .flat_map(|&(first, count)| first..first.saturating_add(count))
    }
}

/// What the id checkers need to know of a run with time-ordered ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdsInfo {
    /// How ids decode.
    pub layout: seqsvr_proto::id_layout::IdLayout,
    /// The true time (Unix ms) at the run's time 0: the simulator's clock in `sim dst`, the
    /// host's wall clock in `sim run` (the StoreSvrs read it; AllocSvr clocks are offset from it).
    pub origin_ms: u64,
    /// The allowance between an AllocSvr's clock and the store leader's (`--id-max-ahead-ms`):
    /// ids are stamped within it of the true time (docs/design/time-ordered-ids.md, U3).
    pub max_skew_ms: u64,
}

/// Facts about the run the checkers need.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunInfo {
    pub seed: u64,
    pub section_size: u64,
    pub uid_limit: u64,
    pub step: u64,
    pub lease_ms: u64,
    /// No faults were scheduled: P6 gaps count as violations, not as a statistic.
    pub fault_free: bool,
    /// How to replay this run.
    pub replay: String,
    /// Start of the verify phase after the final heal: every uid touched before must get an ok
    /// fetch invoked at or after this time. Written in a second info record at the end of a run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify_from_ns: Option<u64>,
    /// Set when the run issued time-ordered ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ids: Option<IdsInfo>,
    /// How the cluster placed counter keys (`--front resp-cluster`: by hash slot).
    #[serde(default, skip_serializing_if = "KeyPlacement::is_sha256")]
    pub key_placement: KeyPlacement,
}

/// One line of the history file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum Record {
    Info(RunInfo),
    Call(Call),
    Poll(Poll),
    Fault(FaultSpan),
    Move(MoveSpan),
    Ids(IdCall),
    /// A call of `sim run --ledger` (`crate::ledger_workload`).
    Ledger(crate::checks::ledger::LedgerOp),
}

/// A whole history in memory, as the checkers take it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    pub info: RunInfo,
    pub calls: Vec<Call>,
    pub polls: Vec<Poll>,
    pub faults: Vec<FaultSpan>,
    pub moves: Vec<MoveSpan>,
    pub ids: Vec<IdCall>,
    pub ledger: Vec<crate::checks::ledger::LedgerOp>,
}

/// Why a history file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("history io: {0}")]
    Io(#[from] std::io::Error),
    #[error("history line {line}: {source}")]
    Parse { line: usize, source: serde_json::Error },
    #[error("history has no info record")]
    NoInfo,
}

impl History {
    /// Builds a history from records in any order (the last info record wins).
    pub fn from_records(records: impl IntoIterator<Item = Record>) -> Self {
        let mut h = History::default();
        for r in records {
            match r {
                Record::Info(i) => h.info = i,
                Record::Call(c) => h.calls.push(c),
                Record::Poll(p) => h.polls.push(p),
                Record::Fault(f) => h.faults.push(f),
                Record::Move(m) => h.moves.push(m),
                Record::Ids(c) => h.ids.push(c),
                Record::Ledger(op) => h.ledger.push(op),
            }
        }
        h
    }

    /// Reads a JSON-lines history file. A torn last line (the run died mid-write) is an error:
    /// a checker must not silently judge a truncated history.
    pub fn read(path: &Path) -> Result<Self, HistoryError> {
        let reader = BufReader::new(File::open(path)?);
        let mut records = Vec::new();
        let mut seen_info = false;
        for (n, line) in reader.lines().enumerate() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let r: Record =
                serde_json::from_str(&line).map_err(|source| HistoryError::Parse { line: n + 1, source })?;
            seen_info |= matches!(r, Record::Info(_));
            records.push(r);
        }
        if !seen_info {
            return Err(HistoryError::NoInfo);
        }
        Ok(Self::from_records(records))
    }

    /// Looks calls up by id (for printing the offending calls of a violation).
    pub fn call_index(&self) -> std::collections::HashMap<u64, &Call> {
        self.calls.iter().map(|c| (c.id, c)).collect()
    }
}

/// Writes the final linearizable `max_seq` of every section (input of P2) as a JSON list of
/// `[section, max_seq]` pairs.
pub fn write_max_seqs(path: &Path, max_seqs: &std::collections::BTreeMap<u64, u64>) -> std::io::Result<()> {
    let pairs: Vec<(u64, u64)> = max_seqs.iter().map(|(&s, &m)| (s, m)).collect();
    std::fs::write(path, serde_json::to_vec(&pairs).map_err(std::io::Error::other)?)
}

/// Reads what [`write_max_seqs`] wrote.
pub fn read_max_seqs(path: &Path) -> Result<std::collections::BTreeMap<u64, u64>, HistoryError> {
    let text = std::fs::read(path)?;
    let pairs: Vec<(u64, u64)> =
        serde_json::from_slice(&text).map_err(|source| HistoryError::Parse { line: 1, source })?;
    Ok(pairs.into_iter().collect())
}

/// The run's monotonic clock: every time in a history is ns since this instant.
#[derive(Clone, Copy, Debug)]
///
/// It reads tokio's clock, which is the system's monotonic clock in a real run and the simulated
/// one under `sim dst` (paused time), so the same recorder serves both.
pub struct RunClock {
    start: tokio::time::Instant,
}

impl RunClock {
    pub fn start() -> Self {
        Self {
            start: tokio::time::Instant::now(),
        }
    }

    pub fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Converts an instant taken elsewhere (e.g. by a proxy) to run time.
    pub fn ns_of(&self, t: Instant) -> u64 {
        tokio::time::Instant::from_std(t)
            .saturating_duration_since(self.start)
            .as_nanos() as u64
    }
}

/// Size of the writer's in-memory buffer; a full buffer is written out by the caller that filled it.
const WRITE_BUFFER_BYTES: usize = 1 << 20;

/// Appends records to a history file. Shared by all clients; holds a std `Mutex` only around a
/// serialise-and-buffer step (never across an `.await`).
pub struct HistoryWriter {
    out: Mutex<Sink>,
    next_call_id: AtomicU64,
    clock: RunClock,
}

/// Where records go: a JSON-lines file (`sim run`) or memory (`sim dst`, which checks thousands
/// of histories a minute and writes one only for a failing seed).
enum Sink {
    File(BufWriter<File>),
    Memory(Vec<Record>),
}

impl HistoryWriter {
    /// Creates (truncates) the file and writes the info record first.
    pub fn create(path: &Path, clock: RunClock, info: &RunInfo) -> std::io::Result<Self> {
        let file = File::create(path)?;
        let w = Self {
            out: Mutex::new(Sink::File(BufWriter::with_capacity(WRITE_BUFFER_BYTES, file))),
            next_call_id: AtomicU64::new(1),
            clock,
        };
        w.write(&Record::Info(info.clone()))?;
        Ok(w)
    }

    /// A writer that keeps the records in memory ([`Self::take`] hands them out).
    pub fn in_memory(clock: RunClock, info: &RunInfo) -> Self {
        Self {
            out: Mutex::new(Sink::Memory(vec![Record::Info(info.clone())])),
            next_call_id: AtomicU64::new(1),
            clock,
        }
    }

    /// The records written so far to an in-memory writer (none for a file).
    pub fn take(&self) -> Vec<Record> {
        match &mut *self.out.lock().unwrap_or_else(|e| e.into_inner()) {
            Sink::Memory(v) => std::mem::take(v),
            Sink::File(_) => Vec::new(),
        }
    }

    pub fn clock(&self) -> RunClock {
        self.clock
    }

    /// A fresh call id and the invoke time: take both just before sending.
    pub fn begin(&self) -> (u64, u64) {
        (self.next_call_id.fetch_add(1, Ordering::Relaxed), self.clock.now_ns())
    }

    pub fn write(&self, record: &Record) -> std::io::Result<()> {
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        match &mut *out {
            Sink::File(f) => {
                let mut line = serde_json::to_vec(record).map_err(std::io::Error::other)?;
                line.push(b'\n');
                f.write_all(&line)
            }
            Sink::Memory(v) => {
                v.push(record.clone());
                Ok(())
            }
        }
    }

    /// Writes the buffer out; called periodically by the run and once at the end.
    pub fn flush(&self) -> std::io::Result<()> {
        match &mut *self.out.lock().unwrap_or_else(|e| e.into_inner()) {
            Sink::File(f) => {
                f.flush()?;
                f.get_ref().sync_data()
            }
            Sink::Memory(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(id: u64) -> Call {
        Call {
            id,
            client: 3,
            kind: CallKind::BatchFetch,
            uids: vec![7, 8],
            invoke_ns: 10,
            complete_ns: 20,
            outcome: Outcome::Ok,
            values: vec![100, 200],
            owners: vec![OwnerTag {
                section: 0,
                node_id: 1,
                incarnation: 9,
                epoch: 2,
                set_id: 1,
            }],
            error: None,
        }
    }

    #[test]
    fn written_history_reads_back_equal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.jsonl");
        let info = RunInfo {
            seed: 42,
            section_size: 100,
            uid_limit: 1000,
            step: 10,
            ..Default::default()
        };
        let w = HistoryWriter::create(&path, RunClock::start(), &info).unwrap();
        let unknown = Call {
            outcome: Outcome::Unknown,
            values: vec![],
            owners: vec![],
            error: Some("deadline".into()),
            ..call(2)
        };
        let poll = Poll {
            at_ns: 5,
            source: "leader".into(),
            max_seqs: vec![(0, 10)],
            sum: None,
        };
        let fault = FaultSpan {
            id: 1,
            kind: "kill".into(),
            target: "a1".into(),
            start_ns: 1,
            end_ns: 2,
        };
        for r in [
            Record::Call(call(1)),
            Record::Call(unknown.clone()),
            Record::Poll(poll.clone()),
            Record::Fault(fault.clone()),
        ] {
            w.write(&r).unwrap();
        }
        w.flush().unwrap();
        let h = History::read(&path).unwrap();
        assert_eq!(h.info, info);
        assert_eq!(h.calls, vec![call(1), unknown]);
        assert_eq!(h.polls, vec![poll]);
        assert_eq!(h.faults, vec![fault]);
    }

    #[test]
    fn torn_line_is_an_error_not_a_shorter_history() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.jsonl");
        let w = HistoryWriter::create(&path, RunClock::start(), &RunInfo::default()).unwrap();
        w.write(&Record::Call(call(1))).unwrap();
        w.flush().unwrap();
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("{\"t\":\"call\",\"id\":");
        std::fs::write(&path, text).unwrap();
        assert!(matches!(History::read(&path), Err(HistoryError::Parse { .. })));
    }

    #[test]
    fn history_without_info_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.jsonl");
        std::fs::write(&path, "").unwrap();
        assert!(matches!(History::read(&path), Err(HistoryError::NoInfo)));
    }

    #[test]
    fn ok_values_skip_unknown_calls() {
        let c = call(1);
        assert_eq!(c.ok_values().collect::<Vec<_>>(), vec![(7, 100), (8, 200)]);
        let u = Call {
            outcome: Outcome::Unknown,
            ..call(1)
        };
        assert_eq!(u.ok_values().count(), 0);
    }

    #[test]
    fn call_ids_are_unique_and_increasing() {
        let dir = tempfile::tempdir().unwrap();
        let w = HistoryWriter::create(&dir.path().join("h"), RunClock::start(), &RunInfo::default()).unwrap();
        let (a, ta) = w.begin();
        let (b, tb) = w.begin();
        assert!(b > a && tb >= ta);
    }
}
