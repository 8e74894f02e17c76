//! The `allocsvr` binary: flag validation, serving against a fake store, and a clean exit on
//! SIGTERM that releases every section.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{FakeStore, fetch, poll, test_params};
use seqsvr_proto::pb;
use seqsvr_proto::pb::alloc_service_client::AllocServiceClient;

const BIN: &str = env!("CARGO_BIN_EXE_allocsvr");
/// Longest a run that must refuse its options (or print its help) may take: a regression that
/// accepts them would otherwise serve forever and hang the suite.
const REFUSAL_LIMIT: Duration = Duration::from_secs(60);

/// Kills the child if the test fails before it exits.
struct Guard(std::process::Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

async fn http_get(port: u16, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).await.ok()?;
    Some(body)
}

#[test]
fn bad_flags_exit_non_zero_with_a_clear_message() {
    let cases: [(&[&str], &str); 3] = [
        (
            &["--node-id", "0", "--listen", "127.0.0.1:0", "--store", "127.0.0.1:1"],
            "--node-id",
        ),
        (
            &["--node-id", "1", "--listen", "x", "--store", "127.0.0.1:1"],
            "--listen",
        ),
        (
            &["--node-id", "1", "--listen", "127.0.0.1:0", "--store", "1=nope"],
            "--store",
        ),
    ];
    for (args, flag) in cases {
        let out = seqsvr_harness::output_within(Command::new(BIN).args(args), REFUSAL_LIMIT);
        assert!(!out.status.success(), "{args:?} accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
    }
    let help = seqsvr_harness::output_within(Command::new(BIN).arg("--help"), REFUSAL_LIMIT);
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in ["--node-id", "--listen", "--advertise", "--store", "--metrics-listen"] {
        assert!(help.contains(flag), "--help lacks {flag}");
    }
    assert!(!help.contains("unsafe"), "test-only switches are hidden");
}

#[tokio::test]
async fn binary_serves_and_releases_everything_on_sigterm() {
    let store = FakeStore::start(test_params(4, 10, 5), true).await;
    let (port, metrics_port) = (free_port(), free_port());
    let mut child = Guard(
        Command::new(BIN)
            .args(["--node-id", "7", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--store", &format!("1={}", store.addr)])
            .args(["--metrics-listen", &format!("127.0.0.1:{metrics_port}")])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut c = poll("binary listening", Duration::from_secs(10), || async {
        AllocServiceClient::connect(format!("http://127.0.0.1:{port}"))
            .await
            .ok()
    })
    .await;
    poll("uid served", Duration::from_secs(5), || {
        let mut c = c.clone();
        async move { (fetch(&mut c, 3).await.outcome == pb::Outcome::Ok as i32).then_some(()) }
    })
    .await;
    let _ = fetch(&mut c, 3).await;
    let metrics = poll("metrics served", Duration::from_secs(5), || {
        http_get(metrics_port, "/metrics")
    })
    .await;
    assert!(metrics.contains("allocsvr_fetch_total"), "{metrics}");
    let kill = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = poll("binary exited", Duration::from_secs(10), || {
        let status = child.0.try_wait().unwrap();
        async move { status }
    })
    .await;
    assert!(status.success(), "exit {status:?}");
    assert!(
        store.with(|s| s.sections.iter().all(|x| x.owner == 0)),
        "every section released"
    );
}
