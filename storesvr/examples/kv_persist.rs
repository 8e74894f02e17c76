//! Time of the two metadata writes on the Raft path: `save_vote` (a few bytes) and persisting a
//! state machine snapshot (`build_snapshot`, 1,000 sections), through the real `LogStore` and
//! `StateMachineStore` on the data dir's disk. Prints the median of each of several runs.
//!
//! `cargo run --release -p storesvr --example kv_persist [DIR]` (DIR defaults to a temp dir under
//! `target/`; give a dir on the disk you care about).

use openraft::storage::{RaftLogStorage, RaftSnapshotBuilder};
use openraft::{CommittedLeaderId, LogId, Vote};
use std::sync::Arc;
use std::time::{Duration, Instant};
use storesvr::domain::state::{Command, SetParams};
use storesvr::storage::kv::{FileKv, KvStore};
use storesvr::storage::log_store::LogStore;
use storesvr::storage::sm_store::StateMachineStore;

const RUNS: usize = 5;
const OPS: usize = 200;

fn open_kv(dir: &std::path::Path) -> Arc<dyn KvStore> {
    Arc::new(FileKv::open(&dir.join("meta")).unwrap())
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let base = std::env::args().nth(1).map(std::path::PathBuf::from);
    let tmp = match &base {
        Some(b) => tempfile::tempdir_in(b).unwrap(),
        None => tempfile::tempdir_in(concat!(env!("CARGO_MANIFEST_DIR"), "/../target")).unwrap(),
    };
    let kv = open_kv(tmp.path());
    let mut log = LogStore::open(kv.clone(), &tmp.path().join("log")).unwrap();
    let mut sm = StateMachineStore::open(kv, Default::default()).unwrap();
    {
        let shared = sm.shared();
        let mut st = shared.write().unwrap();
        st.set.apply(
            &Command::Init(SetParams {
                set_id: 0,
                section_size: 100_000,
                uid_limit: 100_000_000,
                step: 10_000,
                lease_ms: 3_000,
                renew_interval_ms: 500,
                drift_ppm: 10_000,
                margin_ms: 100,
                section_begin: 0,
                section_end: 1_000,
            }),
            false,
        );
    }
    let mut term = 0;
    let mut index = 0;
    for run in 1..=RUNS {
        let mut votes = Vec::with_capacity(OPS);
        for _ in 0..OPS {
            term += 1;
            let t = Instant::now();
            log.save_vote(&Vote::new(term, 1)).await.unwrap();
            votes.push(t.elapsed());
        }
        let mut snaps = Vec::with_capacity(OPS);
        let shared = sm.shared();
        let mut size = 0;
        for _ in 0..OPS {
            index += 1;
            shared.write().unwrap().last_applied = Some(LogId::new(CommittedLeaderId::new(1, 1), index));
            let t = Instant::now();
            let s = sm.build_snapshot().await.unwrap();
            snaps.push(t.elapsed());
            size = s.snapshot.get_ref().len();
        }
        println!(
            "run {run}: save_vote median {:?}; snapshot persist ({size} bytes) median {:?} (n={OPS} each)",
            median(votes),
            median(snaps)
        );
    }
}
