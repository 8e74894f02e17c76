//! openraft's own storage conformance suite against our sled log store and state machine:
//! log state, vote, append/truncate/purge, snapshots, applied state.

use openraft::testing::{StoreBuilder, Suite};
use std::sync::Arc;
use storesvr::kv::{KvStore, SledKv};
use storesvr::log_store::LogStore;
use storesvr::raft_types::{StorageError, TypeConfig};
use storesvr::sm_store::StateMachineStore;

struct Builder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for Builder {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), StorageError> {
        let dir = tempfile::tempdir().expect("temp dir");
        let kv: Arc<dyn KvStore> = Arc::new(SledKv::open(dir.path()).expect("open sled"));
        let sm = StateMachineStore::open(kv.clone(), false)?;
        Ok((dir, LogStore::new(kv), sm))
    }
}

#[test]
fn openraft_storage_suite_passes() {
    Suite::test_all(Builder).expect("openraft storage suite");
}
