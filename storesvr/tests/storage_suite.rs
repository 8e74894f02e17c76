//! openraft's own storage conformance suite against our log store (segment files + key files) and state machine:
//! log state, vote, append/truncate/purge, snapshots, applied state.

use openraft::testing::{StoreBuilder, Suite};
use std::sync::Arc;
use storesvr::raft::types::{StorageError, TypeConfig};
use storesvr::storage::kv::{FileKv, KvStore};
use storesvr::storage::log_store::LogStore;
use storesvr::storage::sm_store::StateMachineStore;

struct Builder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for Builder {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), StorageError> {
        let dir = tempfile::tempdir().expect("temp dir");
        let kv: Arc<dyn KvStore> = Arc::new(FileKv::open(&dir.path().join("meta")).expect("open the key files"));
        let sm = StateMachineStore::open(kv.clone(), Default::default())?;
        let log_store = LogStore::open(kv, &dir.path().join("log")).expect("open the log store");
        Ok((dir, log_store, sm))
    }
}

#[test]
fn openraft_storage_suite_passes() {
    Suite::test_all(Builder).expect("openraft storage suite");
}
