//! Redis Cluster clients others wrote against a cluster set up with `storesvr --key-placement
//! slots`: two sets of real processes (one StoreSvr and two AllocSvrs each, every AllocSvr
//! serving the Redis Cluster protocol on `--resp-cluster-listen`), driven by redis-py's
//! `RedisCluster` (single INCRs and cluster pipelines) and `redis-cli -c`, while a uid range — and
//! with it a run of hash slots — moves from set 0 to set 1 and one of set 0's AllocSvrs is
//! killed. It fails on:
//! - any value of a counter repeated or not above one whose call had ended before (P1/U1);
//! - a client that got too few values, or failures above a tenth of the calls;
//! - a slot map that does not follow the move: after the load, redis-py's client sends the moved
//!   keys to set 1's AllocSvrs, and once the cluster settled a fresh client's map names each key's
//!   owner (set 1 for the moved slots, set 0's surviving AllocSvr for the rest);
//! - any call forwarded between AllocSvrs (`allocsvr_front_rpcs_total{to="forwarded"}`) while
//!   the settled cluster serves 20 INCRs of each key from redis-py and 20 from `redis-cli -c`:
//!   once the slot map is known (every live node names the same owner for each slot), every
//!   call goes to its owner.
//!
//! redis-py (pinned) is installed into `target/pydeps` when missing, `redis-cli` must be
//! installed (`scripts/test.sh` does both); a missing one fails the test.
//!
//! Needs the `storesvr`, `allocsvr` and `seqctl` binaries: `cargo build --workspace --bins` first.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use seqsvr_harness::poll_until;
use seqsvr_proto::keys::{hash_slot, slot_position};

mod e2e;
use e2e::fronts_cluster::FrontsCluster;
use e2e::seqctl::text;
use e2e::values::{Obs, check, metrics_page, monotonic_ns, per_client, python_redis};

const SECTION_SIZE: u64 = 100_000;
const UID_LIMIT: u64 = 1_000_000;
/// The uids that move: sections 1 and 2, so hash slots 1639..=4915.
const MOVED: std::ops::Range<u64> = 100_000..300_000;
const LOAD: Duration = Duration::from_secs(8);
const WAIT: Duration = Duration::from_secs(30);
/// INCRs of each key in the settled phase, per client.
const STEADY: usize = 20;

fn moves(key: &str) -> bool {
    MOVED.contains(&slot_position(hash_slot(key.as_bytes()), UID_LIMIT).0)
}

/// `redis-cli ARGS...` against `addr`; its trimmed output.
fn redis_cli(addr: &str, args: &[&str]) -> Option<String> {
    let (host, port) = addr.rsplit_once(':')?;
    let out = std::process::Command::new("redis-cli")
        .args(["-h", host, "-p", port])
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// `redis-cli -c INCR`, a call at a time to rotating cluster ports, until `until` (or `count`
/// calls when given).
fn redis_cli_c(
    addrs: Vec<String>,
    names: Vec<String>,
    until: Instant,
    count: Option<usize>,
) -> (Vec<Obs>, Vec<String>) {
    let (mut obs, mut errors) = (Vec::new(), Vec::new());
    let mut i = 0usize;
    while count.map_or(Instant::now() < until, |n| i < n) {
        let name = &names[(i * 7) % names.len()];
        let start = monotonic_ns();
        let out = redis_cli(&addrs[i % addrs.len()], &["-c", "INCR", name]).unwrap_or_default();
        let end = monotonic_ns();
        match out.parse() {
            Ok(value) => obs.push(Obs {
                client: "redis-cli-c".into(),
                name: name.clone(),
                start,
                end,
                value,
            }),
            Err(_) => errors.push(format!("redis-cli -c {name}: {out}")),
        }
        i += 1;
        if count.is_none() {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    (obs, errors)
}

/// redis-py in `mode` (`redis_cluster.py`): its values, failures and the port its slot map sends
/// each key to at the end.
async fn redis_py(
    mode: &str,
    amount: f64,
    addrs: &str,
    names: &[String],
) -> (Vec<Obs>, Vec<String>, HashMap<String, u16>) {
    let out = tokio::process::Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/redis_cluster.py"))
        .args([mode, &amount.to_string(), "7", addrs, &names.join(",")])
        .env("PYTHONPATH", python_redis())
        .kill_on_drop(true)
        .output()
        .await
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "redis_cluster.py {mode}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (mut obs, mut errors, mut homes) = (Vec::new(), Vec::new(), HashMap::new());
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        if let Some(h) = v.get("homes").and_then(|h| h.as_object()) {
            homes = h.iter().map(|(k, p)| (k.clone(), p.as_u64().unwrap() as u16)).collect();
        } else if let Some(e) = v.get("error") {
            errors.push(format!("{} {}: {e}", v["client"], v["name"]));
        } else if v.get("value").is_some() {
            obs.push(Obs {
                client: v["client"].as_str().unwrap().into(),
                name: v["name"].as_str().unwrap().into(),
                start: v["start"].as_u64().unwrap(),
                end: v["end"].as_u64().unwrap(),
                value: v["value"].as_u64().unwrap(),
            });
        }
    }
    (obs, errors, homes)
}

/// Calls forwarded between AllocSvrs so far, summed over the metrics pages `pages`.
async fn forwarded(pages: &[&str]) -> f64 {
    let mut sum = 0.0;
    for page in pages {
        sum += metrics_page(page)
            .await
            .lines()
            .filter(|l| l.starts_with("allocsvr_front_rpcs_total") && l.contains("to=\"forwarded\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
    }
    sum
}

fn port(addr: &str) -> u16 {
    addr.rsplit_once(':').unwrap().1.parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_clients_reach_each_keys_owner_through_a_move_and_a_kill() {
    python_redis();
    assert!(
        redis_cli("127.0.0.1:1", &["--version"]).is_some(),
        "`redis-cli` is not installed (Debian package redis-tools; scripts/test.sh installs it)"
    );
    let mut c = FrontsCluster::start_with(2, SECTION_SIZE, UID_LIMIT, &[], &["--key-placement=slots"]);
    let cluster: Vec<String> = c.nodes.iter().map(|n| n.resp_cluster.clone()).collect();
    // Set 0's AllocSvrs serve every slot first; set 1 joins the map empty. `-c`: once a node
    // knows its peer's port it answers `-MOVED` for the peer's slots.
    for addr in &cluster[..2] {
        let up = poll_until(WAIT, || async {
            redis_cli(addr, &["-c", "INCR", "warm-up"])?.parse::<u64>().ok()
        })
        .await;
        assert!(up.is_some(), "{addr} never served INCR");
    }
    let add = c
        .operator()
        .output(&["set", "add", "1", "--stores", &format!("1={}", c.stores[1])])
        .await;
    assert!(add.status.success(), "{}", text(&add));

    let names: Vec<String> = (0..40).map(|i| format!("orders-{i}")).collect();
    let moving = names.iter().filter(|n| moves(n)).count();
    assert!((4..36).contains(&moving), "{moving} of the keys move: pick other names");
    let until = Instant::now() + LOAD;
    let startup = cluster[..2].join(",");
    let py = redis_py("load", LOAD.as_secs_f64(), &startup, &names);
    let cli = {
        let (addrs, names) = (cluster.clone(), names.clone());
        tokio::task::spawn_blocking(move || redis_cli_c(addrs, names, until, None))
    };
    let faults = async {
        tokio::time::sleep(LOAD / 4).await;
        let mv = c
            .operator()
            .output(&[
                "move",
                "--from",
                "0",
                "--to",
                "1",
                "--uids",
                &format!("{}..{}", MOVED.start, MOVED.end),
            ])
            .await;
        assert!(mv.status.success(), "{}", text(&mv));
        tokio::time::sleep(LOAD / 4).await;
        // Set 0's second AllocSvr dies; its slots go to the first.
        c.procs.kill("alloc1").unwrap();
    };
    let ((mut obs, mut errors, homes), ()) = tokio::join!(py, faults);
    let (o, e) = cli.await.unwrap();
    obs.extend(o);
    errors.extend(e);

    let per_client = per_client(&obs, &errors, "");
    for client in ["py-cluster", "py-cluster-pipe", "redis-cli-c"] {
        assert!(
            per_client.get(client).copied().unwrap_or(0) >= 10,
            "{client} got too few values: {per_client:?}"
        );
    }
    assert!(
        errors.len() * 10 < obs.len(),
        "{} failures for {} values",
        errors.len(),
        obs.len()
    );
    let set1: BTreeSet<u16> = cluster[2..].iter().map(|a| port(a)).collect();
    for name in names.iter().filter(|n| moves(n)) {
        assert!(
            set1.contains(&homes[name]),
            "redis-py sends moved key {name} to port {} after the move",
            homes[name]
        );
    }

    // Settled: the live nodes name the same owner for every slot, and none names the dead one.
    // Each node names itself for the slots of an owner it cannot reach (it forwards them, so a
    // client always has a node that answers): while the dead AllocSvr's lease runs, the nodes'
    // maps differ and its slots' calls are forwarded; they agree once set 0's survivor holds them.
    let live = [&cluster[0], &cluster[2], &cluster[3]];
    let dead = format!(" {}@", cluster[1]);
    let last = std::sync::Mutex::new(Vec::new());
    let settled = poll_until(WAIT, || async {
        let maps: Vec<Vec<String>> = live
            .iter()
            .filter_map(|a| redis_cli(a, &["CLUSTER", "NODES"]))
            .map(|m| {
                let mut lines: Vec<String> = m.lines().map(|l| l.replace("myself,", "")).collect();
                lines.sort();
                lines
            })
            .collect();
        let ok = maps.len() == live.len()
            && maps
                .iter()
                .all(|m| m == &maps[0] && m.len() == 3 && !m.iter().any(|l| l.contains(&dead)));
        *last.lock().unwrap() = maps.clone();
        ok.then_some(maps)
    })
    .await;
    assert!(
        settled.is_some(),
        "the live nodes' slot maps did not come to agree without the dead AllocSvr ({} at {:?}): {:#?}",
        dead.trim(),
        live,
        last.lock().unwrap()
    );
    let pages: Vec<&str> = [0, 2, 3].iter().map(|&i| c.nodes[i].metrics.as_str()).collect();
    let before = forwarded(&pages).await;
    let (o, e, homes) = redis_py("steady", STEADY as f64, &live.map(|a| a.as_str()).join(","), &names).await;
    let (o2, e2) = {
        let (addrs, names) = (live.iter().map(|a| a.to_string()).collect(), names.clone());
        tokio::task::spawn_blocking(move || redis_cli_c(addrs, names, Instant::now(), Some(STEADY)))
            .await
            .unwrap()
    };
    let after = forwarded(&pages).await;
    assert!(e.is_empty() && e2.is_empty(), "settled calls failed: {e:?} {e2:?}");
    assert_eq!(o.len(), STEADY * names.len());
    assert_eq!(after - before, 0.0, "calls were forwarded once the slot map was known");
    for name in &names {
        let want: BTreeSet<u16> = if moves(name) {
            set1.clone()
        } else {
            [port(&cluster[0])].into()
        };
        assert!(
            want.contains(&homes[name]),
            "{name} is sent to port {}, not {want:?}",
            homes[name]
        );
    }
    obs.extend(o);
    obs.extend(o2);
    check(&obs);
}
