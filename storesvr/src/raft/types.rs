//! openraft type configuration: what one Raft entry carries.
//!
//! An entry carries a batch of commands, not one: openraft 0.9 pays one log
//! flush per entry and does not group concurrent writes, so the writer
//! (`writer.rs`) packs everything queued into one entry.

use crate::domain::state::{Command, CommandResult};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::io::Cursor;

/// The application data of one Raft entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub cmds: Vec<Command>,
}

/// One result per command of the entry, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    pub results: Vec<CommandResult>,
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "batch of {} commands", self.cmds.len())
    }
}

openraft::declare_raft_types!(
    /// Types of the StoreSvr Raft group.
    pub TypeConfig:
        D = Request,
        R = Response,
);

/// openraft's node id: the raw `u64` of `seqsvr_proto::NodeId` (openraft needs a plain integer type).
pub type NodeId = u64;
pub type Node = openraft::BasicNode;
pub type Raft = openraft::Raft<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type StorageError = openraft::StorageError<NodeId>;
pub type Vote = openraft::Vote<NodeId>;
