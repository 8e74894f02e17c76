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
use std::sync::Mutex;
use std::time::Duration;

use seqsvr_harness::{ProcSpec, Supervisor, free_addr, poll_until};

mod e2e;
use e2e::seqctl::{Seqctl, text};
use e2e::sibling_bin as bin;

const SECTION_SIZE: u64 = 100_000;
const UID_LIMIT: u64 = 1_000_000;
const WAIT: Duration = Duration::from_secs(30);

static ONE_CLUSTER_AT_A_TIME: Mutex<()> = Mutex::new(());

struct Node {
    grpc: String,
    http: String,
    resp: String,
}

struct Cluster {
    _dir: tempfile::TempDir,
    procs: Supervisor,
    stores: Vec<String>,
    /// Set 0's AllocSvrs, then set 1's.
    nodes: Vec<Node>,
}

impl Cluster {
    /// `sets` sets; every AllocSvr gets `alloc_args` too.
    fn start(sets: usize, alloc_args: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut procs = Supervisor::new(&dir.path().join("logs")).unwrap();
        let stores: Vec<String> = (0..sets).map(|_| free_addr()).collect();
        let mut nodes = Vec::new();
        for (set, store) in stores.iter().enumerate() {
            let args = vec![
                "--node-id=1".to_string(),
                format!("--set-id={set}"),
                format!("--listen={store}"),
                format!("--data-dir={}", dir.path().join(format!("store{set}")).display()),
                format!("--peers=1={store}"),
                "--bootstrap".into(),
                "--new-replica".into(),
                format!("--section-size={SECTION_SIZE}"),
                format!("--uid-limit={UID_LIMIT}"),
                "--step=1000".into(),
            ];
            procs
                .spawn(ProcSpec::new(format!("store{set}"), bin("storesvr"), args))
                .unwrap();
            for i in 0..2 {
                let node = Node {
                    grpc: free_addr(),
                    http: free_addr(),
                    resp: free_addr(),
                };
                let mut args = vec![
                    format!("--node-id={}", 2 * set + i + 1),
                    format!("--listen={}", node.grpc),
                    format!("--store=1={store}"),
                    format!("--http-listen={}", node.http),
                    format!("--resp-listen={}", node.resp),
                ];
                args.extend(alloc_args.iter().map(|a| a.to_string()));
                procs
                    .spawn(ProcSpec::new(format!("alloc{}", 2 * set + i), bin("allocsvr"), args))
                    .unwrap();
                nodes.push(node);
            }
        }
        Self {
            _dir: dir,
            procs,
            stores,
            nodes,
        }
    }

    fn operator(&self) -> Seqctl {
        Seqctl::new(["--store", self.stores[0].as_str()])
    }

    fn list(&self, f: impl Fn(&Node) -> &str) -> String {
        self.nodes.iter().map(f).collect::<Vec<_>>().join(",")
    }

    /// `seqctl verify` through every front end of every AllocSvr, for `duration`, with `more`.
    fn verify(&self, duration: &str, more: &[&str]) -> tokio::process::Command {
        let (grpc, http, resp) = (self.list(|n| &n.grpc), self.list(|n| &n.http), self.list(|n| &n.resp));
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

    /// Waits until the first `n` AllocSvrs serve `POST /v1/seq/1/next`.
    async fn wait_serving(&self, n: usize) {
        for n in &self.nodes[..n] {
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
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.procs.kill_all();
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
    let _one = ONE_CLUSTER_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut c = Cluster::start(2, &[]);
    // Set 1's AllocSvrs serve once set 1 is in the cluster map.
    c.wait_serving(2).await;
    c.operator()
        .ok(&["set", "add", "1", "--stores", &format!("1={}", c.stores[1])])
        .await;
    c.wait_serving(4).await;
    let dir = tempfile::tempdir().unwrap();
    let history = dir.path().join("history.json");
    let history_arg = history.to_str().unwrap().to_owned();
    let mut run = c.verify("10s", &["--history", &history_arg]);
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
    assert!(calls.iter().any(|c| c["op"] == "next_ids" && c["outcome"] == "ok"));
    assert!(
        calls
            .iter()
            .any(|c| c["subjects"][0]["uid"].as_u64().is_some_and(|u| u >= UID_LIMIT - 64))
    );

    let out = finish(&mut c.verify("3s", &["--self-test"])).await;
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
    let _one = ONE_CLUSTER_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut c = Cluster::start(1, &["--unsafe-block-overlap"]);
    c.wait_serving(2).await;
    let mut run = c.verify("5s", &[]);
    let kill = async {
        tokio::time::sleep(Duration::from_millis(2_000)).await;
        c.procs.kill("alloc1").unwrap();
    };
    let (out, ()) = tokio::join!(finish(&mut run), kill);
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
