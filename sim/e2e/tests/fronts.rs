//! The HTTP/JSON and Redis-protocol front ends under clients others wrote: two sets of real
//! processes (one StoreSvr and two AllocSvrs each, every AllocSvr serving both front ends), and
//! at once Python's standard HTTP client and the `redis` package (single commands, pipelines and
//! its default MULTI/EXEC pipelines, RESP2 and RESP3), the Rust `redis` crate (the same), and `curl`
//! and `redis-cli` — each call to a random AllocSvr, while a uid range moves from set 0 to set 1 and one
//! of set 0's AllocSvrs is killed. Every value of every uid and counter is checked: unique, and
//! above every value of the same name whose call had completed before the call began (P1/U1
//! across clients, on CLOCK_MONOTONIC).
//!
//! The Python `redis` package (pinned) is installed into `target/pydeps` by the test itself when
//! missing (pip); `curl` and `redis-cli` must be installed (`scripts/test.sh` does it). A missing
//! one fails the test: without it the test would check less and still pass.
//!
//! Needs the `storesvr`, `allocsvr` and `seqctl` binaries: `cargo build --workspace --bins` first.

use std::time::{Duration, Instant};

use rand::Rng;
use seqsvr_harness::poll_until;

mod e2e;
use e2e::fronts_cluster::{FrontsCluster, Node};
use e2e::seqctl::text;
use e2e::values::{Obs, check, metrics_page, monotonic_ns, per_client, python_redis};

const SECTION_SIZE: u64 = 100_000;
const UID_LIMIT: u64 = 1_000_000;
const LOAD: Duration = Duration::from_secs(8);
const WAIT: Duration = Duration::from_secs(30);

fn parse_python(stdout: &str, obs: &mut Vec<Obs>, errors: &mut Vec<String>) -> Option<String> {
    let mut redis_py = None;
    for line in stdout.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        if let Some(version) = v.get("redis_py") {
            redis_py = version.as_str().map(str::to_owned);
        } else if let Some(e) = v.get("error") {
            errors.push(format!("{} {}: {e}", v["client"], v["name"]));
        } else {
            obs.push(Obs {
                client: v["client"].as_str().unwrap().into(),
                name: v["name"].as_str().unwrap().into(),
                start: v["start"].as_u64().unwrap(),
                end: v["end"].as_u64().unwrap(),
                value: v["value"].as_u64().unwrap(),
            });
        }
    }
    redis_py
}

/// The Rust `redis` crate: single INCRs and pipelines of distinct names to random AllocSvrs.
async fn rust_redis(resp: Vec<String>, names: Vec<String>, until: Instant, seed: u64) -> (Vec<Obs>, Vec<String>) {
    use rand::SeedableRng;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (mut obs, mut errors) = (Vec::new(), Vec::new());
    let mut conn: Option<redis::aio::MultiplexedConnection> = None;
    while Instant::now() < until {
        if conn.is_none() {
            let addr = &resp[rng.random_range(0..resp.len())];
            let protocol = if rng.random_bool(0.5) { "?protocol=resp3" } else { "" };
            let client = redis::Client::open(format!("redis://{addr}/{protocol}")).unwrap();
            match tokio::time::timeout(Duration::from_secs(2), client.get_multiplexed_async_connection()).await {
                Ok(Ok(c)) => conn = Some(c),
                other => {
                    errors.push(format!("connect {addr}: {other:?}"));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            }
        }
        let c = conn.as_mut().unwrap();
        let batch: Vec<String> = if rng.random_bool(0.5) {
            vec![names[rng.random_range(0..names.len())].clone()]
        } else {
            let mut picked: Vec<String> = names.clone();
            let n = picked.len();
            for i in 0..4 {
                picked.swap(i, rng.random_range(i..n));
            }
            picked.truncate(4);
            picked
        };
        let mut pipe = redis::pipe();
        for n in &batch {
            pipe.cmd("INCR").arg(n);
        }
        let start = monotonic_ns();
        let r = tokio::time::timeout(Duration::from_secs(5), pipe.query_async::<Vec<redis::Value>>(c)).await;
        let end = monotonic_ns();
        match r {
            Ok(Ok(values)) => {
                for (n, v) in batch.iter().zip(values) {
                    match v {
                        redis::Value::Int(i) => obs.push(Obs {
                            client: "rust-redis".into(),
                            name: n.clone(),
                            start,
                            end,
                            value: i as u64,
                        }),
                        other => errors.push(format!("rust-redis {n}: {other:?}")),
                    }
                }
            }
            other => {
                errors.push(format!("rust-redis {batch:?}: {other:?}"));
                conn = None;
            }
        }
    }
    (obs, errors)
}

/// `curl` and `redis-cli`, a call at a time (the test fails when either is missing).
fn command_line_tools(
    http: Vec<String>,
    resp: Vec<String>,
    names: Vec<String>,
    until: Instant,
) -> (Vec<Obs>, Vec<String>, Vec<&'static str>) {
    let have = |tool: &str| {
        std::process::Command::new(tool)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let tools: Vec<&'static str> = vec!["curl", "redis-cli"];
    for tool in &tools {
        assert!(
            have(tool),
            "`{tool}` is not installed (Debian packages curl, redis-tools; scripts/test.sh installs them)"
        );
    }
    let (mut obs, mut errors) = (Vec::new(), Vec::new());
    let mut i = 0usize;
    while Instant::now() < until && !tools.is_empty() {
        let tool = tools[i % tools.len()];
        let name = &names[(i * 7) % names.len()];
        let start = monotonic_ns();
        let out = if tool == "curl" {
            let path = match name.strip_prefix("u:") {
                Some(uid) => format!("/v1/seq/{uid}/next"),
                None => format!("/v1/counter/{name}/next"),
            };
            let url = format!("http://{}{path}", http[i % http.len()]);
            std::process::Command::new("curl")
                .args(["-s", "-m", "5", "-X", "POST", &url])
                .output()
        } else {
            let (host, port) = resp[i % resp.len()].rsplit_once(':').unwrap();
            std::process::Command::new("redis-cli")
                .args(["-h", host, "-p", port, "INCR", name])
                .output()
        };
        let end = monotonic_ns();
        let stdout = out
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default();
        let value = if tool == "curl" {
            serde_json::from_str::<serde_json::Value>(&stdout).ok().and_then(|v| {
                v.get("seq")
                    .or(v.get("value"))
                    .and_then(|s| s.as_str())
                    .and_then(|s| s.parse().ok())
            })
        } else {
            stdout.parse().ok()
        };
        match value {
            Some(value) => obs.push(Obs {
                client: tool.into(),
                name: name.clone(),
                start,
                end,
                value,
            }),
            None => errors.push(format!("{tool} {name}: {stdout}")),
        }
        i += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    (obs, errors, tools)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_others_wrote_get_rising_values_from_any_allocsvr_through_a_move_and_a_kill() {
    let pydeps = python_redis();
    let mut c = FrontsCluster::start(2, SECTION_SIZE, UID_LIMIT, &[]);
    // Set 0's AllocSvrs serve first; set 1's learn where uid 1 lives once set 1 is in the map.
    wait_http(&c.nodes[..2]).await;
    let add = c
        .operator()
        .output(&["set", "add", "1", "--stores", &format!("1={}", c.stores[1])])
        .await;
    assert!(add.status.success(), "{}", text(&add));
    wait_http(&c.nodes).await;

    // Uids in every section (sections 1 and 2 move), and counters wherever their keys fall.
    let mut names: Vec<String> = (0..10).map(|s| format!("u:{}", s * SECTION_SIZE + 4_242)).collect();
    names.extend((0..10).map(|i| format!("orders-{i}")));
    let until = Instant::now() + LOAD;
    let python = tokio::process::Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fronts.py"))
        .arg(LOAD.as_secs_f64().to_string())
        .arg("7")
        .arg(c.list(|n| &n.http))
        .arg(c.list(|n| &n.resp))
        .arg(names.join(","))
        .env("PYTHONPATH", &pydeps)
        .kill_on_drop(true)
        .output();
    let resp: Vec<String> = c.nodes.iter().map(|n| n.resp.clone()).collect();
    let http: Vec<String> = c.nodes.iter().map(|n| n.http.clone()).collect();
    let rust = (0..4u64)
        .map(|seed| tokio::spawn(rust_redis(resp.clone(), names.clone(), until, seed)))
        .collect::<Vec<_>>();
    let tools = {
        let (http, resp, names) = (http.clone(), resp.clone(), names.clone());
        tokio::task::spawn_blocking(move || command_line_tools(http, resp, names, until))
    };
    let faults = async {
        tokio::time::sleep(LOAD / 4).await;
        let mv = c
            .operator()
            .output(&["move", "--from", "0", "--to", "1", "--uids", "100000..300000"])
            .await;
        assert!(mv.status.success(), "{}", text(&mv));
        tokio::time::sleep(LOAD / 4).await;
        // Set 0's second AllocSvr dies; its sections go to the first.
        c.procs.kill("alloc1").unwrap();
    };
    let (python, ()) = tokio::join!(python, faults);

    let python = python.expect("python3 runs");
    assert!(python.status.success(), "{}", String::from_utf8_lossy(&python.stderr));
    let (mut obs, mut errors) = (Vec::new(), Vec::new());
    let redis_py = parse_python(&String::from_utf8_lossy(&python.stdout), &mut obs, &mut errors);
    for r in rust {
        let (o, e) = r.await.unwrap();
        obs.extend(o);
        errors.extend(e);
    }
    let (o, e, tools) = tools.await.unwrap();
    obs.extend(o);
    errors.extend(e);

    let per_client = per_client(&obs, &errors, &format!("; redis-py {redis_py:?}; tools {tools:?}"));
    check(&obs);
    for client in ["py-http", "rust-redis"]
        .into_iter()
        .chain(
            redis_py
                .as_ref()
                .map(|_| ["py-redis", "py-redis-pipe", "py-redis-multi"])
                .into_iter()
                .flatten(),
        )
        .chain(tools.iter().copied())
    {
        assert!(
            per_client.get(client).copied().unwrap_or(0) >= 10,
            "{client} got too few values: {per_client:?}"
        );
    }
    // Calls that failed are a small part (the killed node's connections, the move's moment).
    assert!(
        errors.len() * 10 < obs.len(),
        "{} failures for {} values",
        errors.len(),
        obs.len()
    );

    // Calls were forwarded between AllocSvrs (both within set 0 and into set 1).
    let mut forwarded = 0.0;
    for n in [&c.nodes[0], &c.nodes[2], &c.nodes[3]] {
        let body = metrics_page(&n.metrics).await;
        forwarded += body
            .lines()
            .filter(|l| l.starts_with("allocsvr_front_rpcs_total") && l.contains("to=\"forwarded\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
    }
    assert!(forwarded > 0.0, "no call was forwarded");
}

/// Waits until every one of `nodes` answers `POST /v1/seq/1/next` with 200.
async fn wait_http(nodes: &[Node]) {
    for n in nodes {
        let url = format!("http://{}/v1/seq/1/next", n.http);
        let served = poll_until(WAIT, || async {
            let out = tokio::process::Command::new("python3")
                .args([
                    "-c",
                    &format!("import urllib.request as u; print(u.urlopen(u.Request('{url}', method='POST'), timeout=2).status)"),
                ])
                .output()
                .await
                .ok()?;
            (String::from_utf8_lossy(&out.stdout).trim() == "200").then_some(())
        })
        .await;
        assert!(served.is_some(), "{} never served over HTTP", n.http);
    }
}

#[test]
fn the_checker_catches_a_repeat_and_a_step_back() {
    let o = |client: &str, start, end, value| Obs {
        client: client.into(),
        name: "k".into(),
        start,
        end,
        value,
    };
    // Overlapping calls may finish in any order; a call after another must be above it.
    check(&[o("a", 0, 10, 2), o("b", 5, 15, 1), o("c", 20, 30, 3)]);
    for bad in [
        vec![o("a", 0, 10, 2), o("b", 20, 30, 1)],
        vec![o("a", 0, 10, 2), o("b", 5, 15, 2)],
        vec![o("a", 0, 10, 0)],
    ] {
        let caught = std::panic::catch_unwind(|| check(&bad));
        assert!(caught.is_err(), "{bad:?}");
    }
}
