//! `seqctl verify` against real processes: two sets (one StoreSvr and two AllocSvrs each, every
//! AllocSvr serving gRPC, HTTP/JSON and the Redis protocol).
//!
//! - A healthy cluster passes while one AllocSvr is killed and the reserved uids' range moves to
//!   the other set (exit 0), and writes its history.
//! - `--self-test` trips on the duplicate it plants (exit 1, the plant reported).
//! - The negative control: AllocSvrs started with `--unsafe-block-overlap` (a block starts at a
//!   seq already handed out), with a kill, make verify exit 1 with an order violation. It is the
//!   same run as the first but for the switch, so the first test is its twin: together they show
//!   the verdict depends on the cluster, not on the checker alone.
//!
//! The clusters run one at a time (a lock): two side by side on a 2-core machine stretch the
//! timings. Needs the `storesvr`, `allocsvr` and `seqctl` binaries: `cargo build --workspace
//! --bins` first; `curl` must be installed (readiness is polled through HTTP).

use std::process::Output;
use std::time::Duration;

use seqsvr_harness::poll_until;
use tokio::sync::Mutex;

mod e2e;
use e2e::fronts_cluster::FrontsCluster;
use e2e::seqctl::{Seqctl, text};

const SECTION_SIZE: u64 = 100_000;
const UID_LIMIT: u64 = 1_000_000;
const WAIT: Duration = Duration::from_secs(30);

static ONE_CLUSTER_AT_A_TIME: Mutex<()> = Mutex::const_new(());

/// `seqctl verify` through every front end of every AllocSvr of `c`, for `duration`, with `more`.
fn verify(c: &FrontsCluster, duration: &str, more: &[&str]) -> tokio::process::Command {
    let (grpc, http, resp) = (c.list(|n| &n.grpc), c.list(|n| &n.http), c.list(|n| &n.resp));
    let mut args = vec![
        "verify",
        "--duration",
        duration,
        "--grpc",
        &grpc,
        "--http",
        &http,
        "--resp",
        &resp,
    ];
    args.extend(more);
    Seqctl::new(["--timeout-ms", "3000"]).command(&args)
}

/// Waits until the first `n` AllocSvrs of `c` serve `POST /v1/seq/1/next`.
async fn wait_serving(c: &FrontsCluster, n: usize) {
    for n in &c.nodes[..n] {
        let url = format!("http://{}/v1/seq/1/next", n.http);
        let served = poll_until(WAIT, || async {
            let out = tokio::process::Command::new("curl")
                .args([
                    "-s",
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{http_code}",
                    "-m",
                    "2",
                    "-X",
                    "POST",
                    &url,
                ])
                .output()
                .await
                .expect("`curl` runs (Debian package curl; scripts/test.sh installs it)");
            (String::from_utf8_lossy(&out.stdout).trim() == "200").then_some(())
        })
        .await;
        assert!(served.is_some(), "{} never served over HTTP", n.http);
    }
}

async fn finish(cmd: &mut tokio::process::Command) -> Output {
    cmd.output().await.expect("run seqctl verify")
}

/// The count printed for a front end's ok calls (`grpc  calls ok    1234 ...`).
fn ok_calls(stdout: &str, front: &str) -> u64 {
    stdout
        .lines()
        .find(|l| l.starts_with(front) && l.contains("calls ok"))
        .and_then(|l| l.split_whitespace().nth(3)?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_cluster_passes_through_a_kill_and_a_move_and_the_self_test_trips() {
    let _one = ONE_CLUSTER_AT_A_TIME.lock().await;
    let mut c = FrontsCluster::start(2, SECTION_SIZE, UID_LIMIT, &[]);
    // Set 1's AllocSvrs serve once set 1 is in the cluster map.
    wait_serving(&c, 2).await;
    c.operator()
        .ok(&["set", "add", "1", "--stores", &format!("1={}", c.stores[1])])
        .await;
    wait_serving(&c, 4).await;
    let dir = tempfile::tempdir().unwrap();
    let history = dir.path().join("history.json");
    let history_arg = history.to_str().unwrap().to_owned();
    let mut run = verify(&c, "10s", &["--history", &history_arg]);
    let faults = async {
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        c.procs.kill("alloc1").unwrap();
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        // The reserved uids are the 64 highest: section 9 moves to set 1.
        let mv = c
            .operator()
            .output(&["move", "--from", "0", "--to", "1", "--uids", "900000..1000000"])
            .await;
        assert!(mv.status.success(), "{}", text(&mv));
    };
    let (out, ()) = tokio::join!(finish(&mut run), faults);
    eprintln!("healthy: {}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(stdout.contains("verify: PASS"), "{}", text(&out));
    for front in ["grpc", "http", "resp"] {
        assert!(
            ok_calls(&stdout, front) > 100,
            "{front}: too few ok calls: {}",
            text(&out)
        );
    }
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&history).unwrap()).unwrap();
    assert_eq!(doc["format"], "seqctl-verify/1");
    let calls = doc["calls"].as_array().unwrap();
    let bytes = std::fs::metadata(&history).unwrap().len();
    eprintln!("history: {} calls, {bytes} bytes of JSON", calls.len());
    assert!(calls.iter().any(|c| c["op"] == "next_ids" && c["outcome"] == "ok"));
    assert!(
        calls
            .iter()
            .any(|c| c["subjects"][0]["uid"].as_u64().is_some_and(|u| u >= UID_LIMIT - 64))
    );

    let out = finish(&mut verify(&c, "3s", &["--self-test"])).await;
    eprintln!("self-test: {}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        stdout.contains("self-test: the planted duplicate was reported"),
        "{}",
        text(&out)
    );
    assert!(stdout.contains("handed out twice"), "{}", text(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_overlapping_handed_out_seqs_are_caught() {
    let _one = ONE_CLUSTER_AT_A_TIME.lock().await;
    let mut c = FrontsCluster::start(1, SECTION_SIZE, UID_LIMIT, &["--unsafe-block-overlap"]);
    wait_serving(&c, 2).await;
    let mut run = verify(&c, "5s", &[]);
    let kill = async {
        tokio::time::sleep(Duration::from_millis(2_000)).await;
        c.procs.kill("alloc1").unwrap();
    };
    let (out, ()) = tokio::join!(finish(&mut run), kill);
    eprintln!("negative control: {}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "the broken rule went unnoticed: {}",
        text(&out)
    );
    assert!(stdout.contains("VIOLATION order:"), "{}", text(&out));
    assert!(stdout.contains("verify: FAIL"), "{}", text(&out));
}
