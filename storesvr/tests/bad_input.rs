//! Bad configuration and bad requests get clear errors and change nothing.

mod common;

use common::*;
use seqsvr_control::ControlError;
use seqsvr_proto::pb;
use std::process::Command;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);

fn run(args: &[&str]) -> (i32, String) {
    let out = seqsvr_harness::output_within(
        Command::new(env!("CARGO_BIN_EXE_storesvr")).args(args),
        Duration::from_secs(60),
    );
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout),
    )
}

#[test]
fn bad_configuration_is_refused_with_exit_2_and_the_option_named() {
    let dir = tempfile::tempdir().unwrap();
    let d = format!("--data-dir={}", dir.path().display());
    let cases: &[(&[&str], &str)] = &[
        (&["--node-id=1", "--set-id=0", "--listen=127.0.0.1:1"], "--data-dir"),
        (&["--node-id=1", "--set-id=0", "--listen=nowhere", &d], "--listen"),
        (&["--node-id=0", "--set-id=0", "--listen=127.0.0.1:1", &d], "--node-id"),
        (
            &[
                "--node-id=1",
                "--set-id=0",
                "--listen=127.0.0.1:1",
                &d,
                "--lease-ms=900",
            ],
            "--renew-interval-ms",
        ),
        (
            &[
                "--node-id=1",
                "--set-id=0",
                "--listen=127.0.0.1:1",
                &d,
                "--lease-ms=1000",
                "--renew-interval-ms=100",
            ],
            "--election-max-ms",
        ),
        (
            &[
                "--node-id=1",
                "--set-id=0",
                "--listen=127.0.0.1:1",
                &d,
                "--bootstrap",
                "--peers=2=127.0.0.1:2",
            ],
            "--bootstrap",
        ),
        (
            &[
                "--node-id=1",
                "--set-id=0",
                "--listen=127.0.0.1:1",
                &d,
                "--section-size=0",
            ],
            "--section-size",
        ),
        (
            &["--node-id=1", "--set-id=0", "--listen=127.0.0.1:1", &d, "--step=abc"],
            "--step",
        ),
        // Issue 25: no default set id, so a forgotten flag cannot make a second set 0.
        (
            &[
                "--node-id=1",
                "--listen=127.0.0.1:1",
                &d,
                "--bootstrap",
                "--peers=1=127.0.0.1:1",
            ],
            "--set-id",
        ),
    ];
    for (args, needle) in cases {
        let (code, err) = run(args);
        assert_eq!(code, 2, "{args:?} exited {code}: {err}");
        assert!(err.contains(needle), "{args:?}: message does not name {needle}: {err}");
    }
    assert!(
        !dir.path().join("raft").exists(),
        "a refused configuration touched the data dir"
    );
}

#[test]
fn config_file_is_read_and_flags_override_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("store.conf");
    std::fs::write(
        &file,
        "node_id = 1\nset_id = 0\nlisten = \"127.0.0.1:1\"\nlease_ms = 900 # too short for the renew interval\n",
    )
    .unwrap();
    let d = format!("--data-dir={}", dir.path().display());
    let c = format!("--config={}", file.display());
    let (code, err) = run(&[&c, &d]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--renew-interval-ms"), "{err}");
    let (code, err) = run(&[&c, &d, "--node-id=0"]);
    assert_eq!(code, 2);
    assert!(err.contains("--node-id"), "flag did not override the file: {err}");
}

#[test]
fn help_documents_every_option() {
    let (code, out) = run(&["--help"]);
    assert_eq!(code, 0);
    for opt in [
        "--node-id",
        "--set-id",
        "--listen",
        "--data-dir",
        "--peers",
        "--bootstrap",
        "--new-replica",
        "--dial",
        "--section-size",
        "--step",
        "--uid-limit",
        "--lease-ms",
        "--renew-interval-ms",
        "--drift-ppm",
        "--margin-ms",
        "--detect-ms",
        "--election-min-ms",
        "--metrics-listen",
        "--config",
    ] {
        assert!(out.contains(opt), "--help lacks {opt}");
    }
}

fn rejected(r: Result<impl std::fmt::Debug, ControlError>) -> tonic::Status {
    match r {
        Err(ControlError::Rejected(s)) => s,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_errors_and_change_nothing() {
    let c = Cluster::start(3);
    let leader = c.wait_leader(WAIT).await;
    let client = c.client();
    let owner = FakeOwner::register(&client, 1).await;
    let epoch = owner.epoch_of(&client, 1, WAIT).await;
    bump(&client, owner.incarnation, 1, epoch, 777).await;
    // A bump far above the ceiling (anyone who can reach the leader can send one) is refused:
    // it would use the section up for good.
    let forged = bump(&client, owner.incarnation, 1, epoch, u64::MAX - 1).await;
    assert_eq!(forged.outcome, pb::BumpOutcome::OutOfRange as i32, "{forged:?}");
    assert_eq!(forged.max_seq, 777);
    let before = c.status_of(leader).await.unwrap().max_seq_sum;

    let item = |section| pb::BumpItem {
        section,
        epoch,
        new_max: 1_000_000,
    };
    let cases: Vec<(pb::BumpRequest, tonic::Code, &str)> = vec![
        (
            pb::BumpRequest {
                secret: Vec::new(),
                incarnation: owner.incarnation,
                items: vec![item(SECTIONS)],
            },
            tonic::Code::InvalidArgument,
            "unknown section",
        ),
        (
            pb::BumpRequest {
                secret: Vec::new(),
                incarnation: owner.incarnation,
                items: vec![item(1), item(u64::MAX)],
            },
            tonic::Code::InvalidArgument,
            "unknown section",
        ),
        (
            pb::BumpRequest {
                secret: Vec::new(),
                incarnation: owner.incarnation,
                items: vec![],
            },
            tonic::Code::InvalidArgument,
            "items",
        ),
        (
            pb::BumpRequest {
                secret: Vec::new(),
                incarnation: owner.incarnation,
                items: vec![item(1); 65_537],
            },
            tonic::Code::InvalidArgument,
            "items",
        ),
        (
            pb::BumpRequest {
                secret: Vec::new(),
                incarnation: 999_999,
                items: vec![item(1)],
            },
            tonic::Code::FailedPrecondition,
            "unknown incarnation",
        ),
    ];
    for (req, code, needle) in cases {
        let n = req.items.len();
        let s = rejected(client.bump(req).await);
        assert_eq!(s.code(), code, "{n} items: {s:?}");
        assert!(s.message().contains(needle), "{s:?}");
    }

    let s = rejected(
        client
            .load(pb::LoadRequest {
                sections: vec![pb::SectionRange { begin: 3, end: 99 }],
            })
            .await,
    );
    assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
    let s = rejected(client.load(pb::LoadRequest { sections: vec![] }).await);
    assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
    let s = rejected(
        client
            .register(pb::RegisterRequest {
                secret: Vec::new(),
                node_id: 0,
                addr: "127.0.0.1:1".into(),
                nonce: 1,
            })
            .await,
    );
    assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
    let s = rejected(
        client
            .register(pb::RegisterRequest {
                secret: Vec::new(),
                node_id: 5,
                addr: "no port".into(),
                nonce: 1,
            })
            .await,
    );
    assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
    let s = rejected(
        client
            .release(pb::ReleaseRequest {
                secret: Vec::new(),
                incarnation: 424_242,
                sections: vec![pb::ReleasedRange {
                    begin: 0,
                    end: 1,
                    epoch: 1,
                    waited: false,
                }],
                leaving: false,
            })
            .await,
    );
    assert_eq!(s.code(), tonic::Code::FailedPrecondition, "{s:?}");

    // A malformed Raft peer message is refused, not applied.
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", c.addrs[&leader]))
        .unwrap()
        .connect_lazy();
    let mut peer = pb::raft_service_client::RaftServiceClient::new(ch);
    let group_id = c.status_of(leader).await.unwrap().group_id;
    assert_ne!(group_id, 0, "a group bootstrapped now has a group id");
    let s = peer
        .append_entries(pb::RaftPayload {
            data: b"not json".to_vec(),
            stamped: true,
            set_id: 0,
            group_id,
            node_id: leader,
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), tonic::Code::InvalidArgument);
    // One that does not say it is of this group is refused before it is even decoded.
    let s = peer
        .append_entries(pb::RaftPayload {
            data: b"not json".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), tonic::Code::FailedPrecondition, "{s:?}");

    assert_eq!(
        c.status_of(leader).await.unwrap().max_seq_sum,
        before,
        "a refused request changed max_seq"
    );
    assert_eq!(load(&client, 1).await.max_seq, 777);
}
