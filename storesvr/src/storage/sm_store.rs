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

use crate::domain::state::{SetState, UnsafeRules};
use crate::raft::types::{Entry, LogId, Node, NodeId, Response, StorageError, TypeConfig};
use crate::storage::kv::KvStore;
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    EntryPayload, ErrorSubject, ErrorVerb, RaftSnapshotBuilder, SnapshotMeta, StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};
use std::io::Cursor;
use std::sync::{Arc, Mutex, RwLock};

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
    /// Last log id of the snapshot on disk, shared by the state machine and every builder it
    /// hands out. Held across the compare and the blocking write (see [`Self::persist`]).
    persisted: Arc<Mutex<Option<LogId>>>,
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

/// Decodes a snapshot's state; older formats as [`decode_padded`] reads them.
fn decode_sm_data(bytes: &[u8]) -> Result<SmData, StorageError> {
    decode_padded(bytes).map_err(|e| snap_err(ErrorVerb::Read, e))
}

/// Decodes a value that ends with a `SetState` (a snapshot's `SmData`, a backup's state). Fields
/// added to `SetState` since the first snapshots went last, and postcard has no field tags, so an
/// older encoding ends early: as many 0 bytes as the missing fields' empty encodings are supplied
/// (`ledgers`: none, one byte, and never written when empty, so every state without ledgers ends
/// there; `ids`: `None`, one byte; `bindings`: an empty map, one byte; `audit`: an empty trail,
/// two bytes; `cached_map`: `None`, one byte) and it is read with them empty. A state whose `ids`
/// end before `IdState::key_placement` (SHA-256 placement is not written unless ledgers follow,
/// so that an older replica reads the state) takes one byte more, read as SHA-256. A current
/// encoding with ledgers decodes on the first try. A shorter padding of an older format runs out
/// of bytes, so the first padding that decodes is the encoding's own. Trailing bytes are an error.
pub(crate) fn decode_padded<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, postcard::Error> {
    /// No ledgers (1 byte); no key placement or no ids either (2); then no bindings (3), no trail
    /// (5), no cached map (6).
    const OLDER_FORMATS: [usize; 5] = [1, 2, 3, 5, 6];
    let whole = |b: &[u8]| match postcard::take_from_bytes::<T>(b) {
        Ok((v, [])) => Ok(v),
        Ok(_) => Err(postcard::Error::DeserializeBadEncoding),
        Err(e) => Err(e),
    };
    let first = match whole(bytes) {
        Ok(data) => return Ok(data),
        Err(e) => e,
    };
    for missing in OLDER_FORMATS {
        let mut padded = Vec::with_capacity(bytes.len() + missing);
        padded.extend_from_slice(bytes);
        padded.resize(bytes.len() + missing, 0);
        if let Ok(data) = whole(&padded) {
            return Ok(data);
        }
    }
    Err(first)
}

impl StateMachineStore {
    /// Opens the state machine at its latest snapshot (empty if none).
    pub fn open(kv: Arc<dyn KvStore>, rules: UnsafeRules) -> Result<Self, StorageError> {
        let mut data = SmData::default();
        let mut persisted = None;
        if let Some(bytes) = kv.get(SNAPSHOT).map_err(|e| snap_err(ErrorVerb::Read, e))? {
            let stored: StoredSnapshot = postcard::from_bytes(&bytes).map_err(|e| snap_err(ErrorVerb::Read, e))?;
            data = decode_sm_data(&stored.data)?;
            persisted = stored.meta.last_log_id;
        }
        Ok(Self {
            state: Arc::new(RwLock::new(data)),
            kv,
            persisted: Arc::new(Mutex::new(persisted)),
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

    /// Writes `stored` unless the snapshot on disk is as new or newer; returns whether it wrote.
    ///
    /// openraft 0.9 runs a snapshot build (a builder from `get_snapshot_builder`) in its own task
    /// while `install_snapshot` may run: without the check an older build could land after a newer
    /// installed snapshot whose log openraft has already purged, and the replica could not start
    /// again. The compare and the write happen under one std `Mutex`, taken inside the blocking
    /// task and held across the write and its sync: no `.await` happens while it is held, and a
    /// blocking task cannot be cancelled halfway, so a dropped future never leaves the lock or the
    /// file in between (a `tokio::sync::Mutex` held across `spawn_blocking(..).await` would do the
    /// same, with one more lock type to reason about).
    async fn persist(&self, stored: StoredSnapshot) -> Result<bool, StorageError> {
        let last = stored.meta.last_log_id;
        let bytes = postcard::to_stdvec(&stored).map_err(|e| snap_err(ErrorVerb::Write, e))?;
        let kv = self.kv.clone();
        let persisted = self.persisted.clone();
        let wrote = tokio::task::spawn_blocking(move || {
            let mut on_disk = persisted.lock().expect("snapshot persist lock poisoned");
            if last <= *on_disk {
                return Ok(false);
            }
            kv.put(SNAPSHOT, &bytes)?;
            *on_disk = last;
            Ok(true)
        })
        .await
        .map_err(|e| snap_err(ErrorVerb::Write, e))?
        .map_err(|e: std::io::Error| snap_err(ErrorVerb::Write, e))?;
        if !wrote {
            tracing::info!(
                snapshot = %stored.meta.snapshot_id,
                "snapshot not stored: the one on disk is as new or newer"
            );
        }
        Ok(wrote)
    }
}

impl StateMachineStore {
    /// First half of a snapshot build: serializes the applied state as it is now.
    fn capture(&mut self) -> Result<StoredSnapshot, StorageError> {
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
        Ok(StoredSnapshot { meta, data })
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let stored = self.capture()?;
        let (meta, data) = (stored.meta.clone(), stored.data.clone());
        self.persist(stored).await?;
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
                    let ids: Vec<seqsvr_proto::NodeId> = m.nodes().map(|(id, _)| seqsvr_proto::NodeId(*id)).collect();
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
            persisted: self.persisted.clone(),
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
        let new = decode_sm_data(&data)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::kv::FileKv;
    use openraft::{CommittedLeaderId, RaftSnapshotBuilder};

    fn log_id(term: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    fn sm_data(applied: LogId) -> SmData {
        SmData {
            last_applied: Some(applied),
            ..Default::default()
        }
    }

    /// openraft 0.9 builds snapshots in a separate task while `install_snapshot` may run: an older
    /// build that persists last must not replace a newer installed snapshot (the log before the
    /// newer one may already be purged, and the replica could not start again).
    #[tokio::test]
    async fn an_older_build_never_overwrites_a_newer_installed_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let kv: Arc<dyn KvStore> = Arc::new(FileKv::open(dir.path()).unwrap());
        let mut sm = StateMachineStore::open(kv.clone(), Default::default()).unwrap();
        *sm.shared().write().unwrap() = sm_data(log_id(1, 5));

        // The builder captures the state at index 5 ...
        let mut builder = sm.get_snapshot_builder().await;
        let old = builder.capture().unwrap();
        // ... meanwhile a snapshot at index 10 from the leader is installed ...
        let newer = SnapshotMeta {
            last_log_id: Some(log_id(2, 10)),
            last_membership: StoredMembership::default(),
            snapshot_id: "leader-10".into(),
        };
        let bytes = postcard::to_stdvec(&sm_data(log_id(2, 10))).unwrap();
        sm.install_snapshot(&newer, Box::new(Cursor::new(bytes))).await.unwrap();
        // ... and only then the older build reaches the disk.
        builder.persist(old).await.unwrap();
        drop((sm, builder));

        let mut reopened = StateMachineStore::open(kv, Default::default()).unwrap();
        let current = reopened.get_current_snapshot().await.unwrap().expect("a snapshot");
        assert_eq!(current.meta.last_log_id, Some(log_id(2, 10)), "{:?}", current.meta);
        assert_eq!(reopened.applied_state().await.unwrap().0, Some(log_id(2, 10)));
        // A build that is newer than what is stored still lands.
        *reopened.shared().write().unwrap() = sm_data(log_id(2, 12));
        reopened.build_snapshot().await.unwrap();
        let current = reopened.get_current_snapshot().await.unwrap().expect("a snapshot");
        assert_eq!(current.meta.last_log_id, Some(log_id(2, 12)));
    }

    /// Snapshots written before the bindings, before the audit trail and before the cached map
    /// existed (the state ends one, two or three fields earlier) are read with those empty; a
    /// current one round-trips with all of them.
    #[test]
    fn snapshots_from_before_the_bindings_the_audit_trail_and_the_cached_map_are_still_read() {
        use crate::domain::audit::{AuditNote, AuditRecord};
        use crate::domain::binding::SecretHash;
        use crate::domain::state::CachedMap;
        use seqsvr_proto::Incarnation;
        let mut data = sm_data(log_id(1, 7));
        data.set.cached_map = Some(CachedMap {
            version: 4,
            encoded: vec![1, 2, 3],
        });
        let note = AuditNote {
            who: "anonymous".into(),
            at_ms: 5,
            what: "drain AllocSvr node 2".into(),
        };
        data.set.audit.push(AuditRecord::new(&note, "done"));
        data.set
            .bindings
            .bind(Incarnation(3), SecretHash::of(b"sixteen bytes ok"));
        let setup = crate::domain::slots::SlotCommand::Setup {
            layout: seqsvr_proto::id_layout::IdLayout::twitter(0),
            per_set: 4,
            max_ahead_ms: 1_000,
        };
        crate::domain::slots::apply(&mut data.set.ids, 0, &setup, &Default::default());
        assert!(data.set.ids.is_some());
        let bytes = postcard::to_stdvec(&data).unwrap();
        assert_eq!(decode_sm_data(&bytes).unwrap().set, data.set);
        // SHA-256 placement is not written (the bytes of the release before placements), and
        // reads back as SHA-256; placement by slot is one byte more.
        let mut slots_placed = data.clone();
        slots_placed.set.ids.as_mut().unwrap().key_placement = seqsvr_proto::keys::KeyPlacement::Slots;
        let slots_bytes = postcard::to_stdvec(&slots_placed).unwrap();
        assert_eq!(decode_sm_data(&slots_bytes).unwrap().set, slots_placed.set);
        assert_eq!(
            (slots_bytes.len(), &slots_bytes[..bytes.len()]),
            (bytes.len() + 1, &bytes[..])
        );

        // Each older format: the fields it lacks emptied, their bytes cut off the end.
        let older: [(usize, &str); 4] = [(1, "no ids"), (2, "no bindings"), (4, "no trail"), (5, "no cached map")];
        for (missing, what) in older {
            match missing {
                1 => data.set.ids = None,
                2 => data.set.bindings = Default::default(),
                4 => data.set.audit = Default::default(),
                _ => data.set.cached_map = None,
            }
            let mut old = postcard::to_stdvec(&data).unwrap();
            let tail = old.split_off(old.len() - missing);
            assert!(
                tail.iter().all(|b| *b == 0),
                "{what}: the cut fields are not empty: {tail:?}"
            );
            let read = decode_sm_data(&old).unwrap();
            assert_eq!((read.last_applied, &read.set), (data.last_applied, &data.set), "{what}");
        }
        assert!(decode_sm_data(&[0xff; 3]).is_err(), "garbage is still refused");
    }
}
