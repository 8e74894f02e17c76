//! The openraft state machine: [`SetState`] in memory, snapshots on disk.
//!
//! Applying an entry touches only memory and is deterministic (see
//! `state.rs`). Durability comes from the log: after a restart the latest
//! snapshot is loaded and openraft re-applies the committed log after it. A
//! snapshot is written and synced before openraft may purge the log it covers;
//! a failed snapshot write returns a `StorageError`, which stops the Raft node
//! rather than letting replicas diverge.
//!
//! Readers (the gRPC services, the arbiter) share the state through
//! [`SharedState`] and hold its lock only for the copy they need.
//!
//! Left out: incremental snapshots (the whole state of a set is a few MB).

use crate::kv::KvStore;
use crate::raft_types::{Entry, LogId, Node, NodeId, Response, StorageError, TypeConfig};
use crate::state::{SetState, UnsafeRules};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    EntryPayload, ErrorSubject, ErrorVerb, RaftSnapshotBuilder, SnapshotMeta, StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};
use std::io::Cursor;
use std::sync::{Arc, RwLock};

const SNAPSHOT: &[u8] = b"snapshot";

/// Everything the state machine holds; also the snapshot format.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SmData {
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership<NodeId, Node>,
    pub set: SetState,
}

#[derive(Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta<NodeId, Node>,
    data: Vec<u8>,
}

/// Read access to the applied state for services and the arbiter.
pub type SharedState = Arc<RwLock<SmData>>;

pub struct StateMachineStore {
    state: SharedState,
    kv: Arc<dyn KvStore>,
    rules: UnsafeRules,
    snapshot_seq: u64,
}

fn sm_err(verb: ErrorVerb, e: impl ToString) -> StorageError {
    StorageError::IO {
        source: StorageIOError::new(
            ErrorSubject::StateMachine,
            verb,
            openraft::AnyError::error(e.to_string()),
        ),
    }
}

fn snap_err(verb: ErrorVerb, e: impl ToString) -> StorageError {
    StorageError::IO {
        source: StorageIOError::new(
            ErrorSubject::Snapshot(None),
            verb,
            openraft::AnyError::error(e.to_string()),
        ),
    }
}

impl StateMachineStore {
    /// Opens the state machine at its latest snapshot (empty if none).
    pub fn open(kv: Arc<dyn KvStore>, rules: UnsafeRules) -> Result<Self, StorageError> {
        let mut data = SmData::default();
        if let Some(bytes) = kv.get(SNAPSHOT).map_err(|e| snap_err(ErrorVerb::Read, e))? {
            let stored: StoredSnapshot = postcard::from_bytes(&bytes).map_err(|e| snap_err(ErrorVerb::Read, e))?;
            data = postcard::from_bytes(&stored.data).map_err(|e| snap_err(ErrorVerb::Read, e))?;
        }
        Ok(Self {
            state: Arc::new(RwLock::new(data)),
            kv,
            rules,
            snapshot_seq: 0,
        })
    }

    pub fn shared(&self) -> SharedState {
        self.state.clone()
    }

    fn read_stored(&self) -> Result<Option<StoredSnapshot>, StorageError> {
        match self.kv.get(SNAPSHOT).map_err(|e| snap_err(ErrorVerb::Read, e))? {
            Some(bytes) => Ok(Some(
                postcard::from_bytes(&bytes).map_err(|e| snap_err(ErrorVerb::Read, e))?,
            )),
            None => Ok(None),
        }
    }

    async fn persist(&self, stored: StoredSnapshot) -> Result<(), StorageError> {
        let bytes = postcard::to_stdvec(&stored).map_err(|e| snap_err(ErrorVerb::Write, e))?;
        let kv = self.kv.clone();
        tokio::task::spawn_blocking(move || {
            kv.insert_batch(vec![(SNAPSHOT.to_vec(), bytes)])?;
            kv.sync()
        })
        .await
        .map_err(|e| snap_err(ErrorVerb::Write, e))?
        .map_err(|e| snap_err(ErrorVerb::Write, e))
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let (data, meta) = {
            let st = self.state.read().expect("state lock poisoned");
            let data = postcard::to_stdvec(&*st).map_err(|e| sm_err(ErrorVerb::Read, e))?;
            self.snapshot_seq += 1;
            let id = match st.last_applied {
                Some(l) => format!("{}-{}-{}", l.leader_id, l.index, self.snapshot_seq),
                None => format!("none-{}", self.snapshot_seq),
            };
            let meta = SnapshotMeta {
                last_log_id: st.last_applied,
                last_membership: st.membership.clone(),
                snapshot_id: id,
            };
            (data, meta)
        };
        self.persist(StoredSnapshot {
            meta: meta.clone(),
            data: data.clone(),
        })
        .await?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership<NodeId, Node>), StorageError> {
        let st = self.state.read().expect("state lock poisoned");
        Ok((st.last_applied, st.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut st = self.state.write().expect("state lock poisoned");
        let mut out = Vec::new();
        for entry in entries {
            st.last_applied = Some(entry.log_id);
            let resp = match entry.payload {
                EntryPayload::Blank => Response::default(),
                EntryPayload::Membership(m) => {
                    let ids: Vec<u64> = m.nodes().map(|(id, _)| *id).collect();
                    st.set.replica_ids_ever.extend(ids);
                    st.membership = StoredMembership::new(Some(entry.log_id), m);
                    Response::default()
                }
                EntryPayload::Normal(req) => {
                    let results = req.cmds.iter().map(|c| st.set.apply_with(c, self.rules)).collect();
                    Response { results }
                }
            };
            out.push(resp);
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        Self {
            state: self.state.clone(),
            kv: self.kv.clone(),
            rules: self.rules,
            snapshot_seq: self.snapshot_seq + 1000,
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, Node>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        let new: SmData = postcard::from_bytes(&data).map_err(|e| snap_err(ErrorVerb::Read, e))?;
        // Persist first: if the write fails the node stops with its old state intact.
        self.persist(StoredSnapshot {
            meta: meta.clone(),
            data,
        })
        .await?;
        *self.state.write().expect("state lock poisoned") = new;
        tracing::info!(snapshot = %meta.snapshot_id, "installed snapshot");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        Ok(self.read_stored()?.map(|s| Snapshot {
            meta: s.meta,
            snapshot: Box::new(Cursor::new(s.data)),
        }))
    }
}
