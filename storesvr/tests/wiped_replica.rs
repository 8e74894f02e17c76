//! A replica whose data dir was lost must not come back under its old node id (P3, then P1):
//! with no vote and no log it could vote a lagging replica leader and committed bumps would be
//! lost, and with `--bootstrap` it would found a second group.

mod common;

use common::*;
use seqsvr_proto::pb;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);
/// How long a refused start may take to exit (a debug build opens nothing before it refuses).
const REFUSE_WITHIN: Duration = Duration::from_secs(10);

fn log_of(c: &Cluster, id: u64) -> String {
    std::fs::read_to_string(c.log_path(id)).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_replica_restarted_under_its_old_id_is_refused() {
    let mut c = Cluster::start(3);
    c.wait_leader(WAIT).await;
    let client = c.client();
    let owner = FakeOwner::register(&client, 1).await;
    let epoch = owner.epoch_of(&client, 3, WAIT).await;

    // Only replicas 1 and 2 hold this bump.
    c.kill(3);
    c.wait_leader(WAIT).await;
    let acked = bump(&client, owner.incarnation, 3, epoch, 4_000).await;
    assert_eq!((acked.outcome, acked.max_seq), (pb::BumpOutcome::Applied as i32, 4_000));

    // Replica 2 loses its disk and is restarted with its old command line.
    c.kill(2);
    std::fs::remove_dir_all(c.data_dir(2)).unwrap();
    c.spawn(2, false);
    if let Some(status) = c.wait_exit(2, REFUSE_WITHIN) {
        let log = log_of(&c, 2);
        assert!(!status.success(), "refused start exited {status}");
        for needle in [
            "empty",
            "--new-replica",
            "seqctl replica add",
            "NEW node id",
            "never reused",
        ] {
            assert!(log.contains(needle), "the refusal does not say {needle:?}:\n{log}");
        }
        assert!(
            !c.data_dir(2).join("NODE_ID").exists(),
            "a refused start claimed the dir"
        );
        return;
    }

    // It started: show what that costs. With replica 1 down, replicas 2 (empty) and 3 (lagging)
    // form a majority and elect 3, whose log lacks the bump.
    c.kill(1);
    c.spawn(3, false);
    c.wait_leader(WAIT).await;
    let after = load(&client, 3).await;
    panic!(
        "a wiped replica 2 was accepted under its old id; with replica 1 down the group now \
         reports max_seq {} for section 3 after acknowledging 4000",
        after.max_seq
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_is_refused_when_a_peer_already_has_a_group() {
    let mut c = Cluster::start(3);
    c.wait_leader(WAIT).await;

    // Replica 1 loses its disk; the operator wrongly starts it as a new replica with --bootstrap.
    c.kill(1);
    std::fs::remove_dir_all(c.data_dir(1)).unwrap();
    c.wait_leader(WAIT).await;
    c.spawn_with(1, true, true);
    match c.wait_exit(1, REFUSE_WITHIN) {
        Some(status) => {
            let log = log_of(&c, 1);
            assert!(!status.success(), "refused bootstrap exited {status}");
            assert!(log.contains("already has an initialized group"), "{log}");
        }
        None => {
            let s = c.status_of(1).await;
            panic!(
                "--bootstrap on a wiped replica 1 started although replicas 2 and 3 hold a group; \
                 its status: {s:?}"
            );
        }
    }
}
