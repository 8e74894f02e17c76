//! The history `seqctl verify` records and writes with `--history FILE`: one JSON document,
//! format `seqctl-verify/1`, described field by field in docs/operations/verify.md so that anyone
//! can check it with a checker of their own.
//!
//! Times are ns on this process's monotonic clock since the run started; `started_unix_ms` is
//! the wall clock at that instant (what id stamps are judged against). Every integer is a JSON
//! number of up to 64 bits: read it with a parser that keeps 64-bit integers exact.
//!
//! Deliberately left out: streaming the history to the file while the run goes (a run is bounded
//! in time and rate, so it fits in memory), and reading a file back (no command takes one yet).

use serde::{Deserialize, Serialize};

/// The `format` of the document this version writes.
pub(crate) const FORMAT: &str = "seqctl-verify/1";

/// Which front end a call went through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Front {
    Grpc,
    Http,
    Resp,
}

/// What a call asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Op {
    /// The next seq of one uid.
    Fetch,
    /// The next seq of each of several uids (gRPC only).
    Batch,
    /// A block of seqs of one uid.
    Reserve,
    /// The next value of a named counter.
    CounterNext,
    /// A block of a named counter's values.
    CounterReserve,
    /// Time-ordered ids.
    NextIds,
}

/// How a call ended, as far as the caller can know.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Outcome {
    /// `values` are valid.
    Ok,
    /// Refused before anything was taken.
    Failed,
    /// Timed out or lost mid-call: it may have taken values no one saw. Never assumed absent.
    Unknown,
}

/// A uid or a named counter: `{"uid": 999990}` or `{"key": "seqctl-verify:3"}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Subject {
    Uid(u64),
    Key(String),
}

impl std::fmt::Display for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Subject::Uid(u) => write!(f, "uid {u}"),
            Subject::Key(k) => write!(f, "key {k:?}"),
        }
    }
}

/// One call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Call {
    /// Unique in the history.
    pub id: u64,
    /// Which caller made it; one caller's calls never overlap.
    pub caller: u32,
    pub front: Front,
    /// The address it was sent to (gRPC: the seeds' client routes it to the owner).
    pub addr: String,
    pub op: Op,
    /// For the sequence and counter operations, one subject per value: `values[i]` is a value of
    /// `subjects[i]` (a block repeats its subject). Empty for `next_ids`.
    pub subjects: Vec<Subject>,
    /// Taken just before the request was sent.
    pub invoke_ns: u64,
    /// Taken just after the answer (or the error) arrived.
    pub complete_ns: u64,
    pub outcome: Outcome,
    /// The values of an ok call (for `next_ids`, the ids in reply order); empty otherwise.
    #[serde(default)]
    pub values: Vec<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The whole document.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct History {
    /// [`FORMAT`].
    pub format: String,
    /// The wall clock (Unix ms) at the run's time 0.
    pub started_unix_ms: u64,
    /// How far an id's stamp may be from this host's clock while its call ran.
    pub id_allowance_ms: u64,
    /// How ids decode: the layout the cluster reported, or the one given by flags.
    pub id_layout: seqsvr_proto::id_layout::IdLayout,
    pub calls: Vec<Call>,
}

impl History {
    /// Writes the document to `path` (replacing it).
    pub(crate) fn write(&self, path: &std::path::Path) -> Result<(), String> {
        let text = serde_json::to_vec(self).map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("cannot write the history to {}: {e}", path.display()))
    }
}
