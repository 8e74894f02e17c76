//! The Grafana dashboard (`deploy/grafana/seqsvr.json`) and the alert rules
//! (`deploy/prometheus/alerts.yml`) name only metrics a running cluster exports.
//!
//! `every_metric_the_dashboard_and_alerts_name_is_exported` starts two sets of real processes
//! (set 0: one StoreSvr and two AllocSvrs; set 1: one StoreSvr and one AllocSvr), every one with
//! `--metrics-listen`, and makes each kind of series appear: fetches (a hot uid past several steps,
//! so that bumps run and fetches wait at the ceiling), a data-plane error, a move of a section from
//! set 0 to set 1 and a drain of one AllocSvr. It scrapes every endpoint, takes every metric name
//! out of the dashboard's `expr` fields (and its template queries) and the rules' `expr:` lines, and
//! fails naming each one that no endpoint exports. It also checks a few values the dashboard relies
//! on (the move counted as done, the drained node marked draining, the release-path gains).
//!
//! The names are taken out of PromQL by [`promql::metric_names`], a small scanner whose unit tests
//! below show it finds a misspelt metric. `promtool_accepts_the_rules_their_tests_and_the_dashboard`
//! runs `promtool` (Debian package `prometheus`, which `scripts/test.sh` installs): rule syntax,
//! the rules' unit tests (`alerts.test.yml`) and every dashboard query parsed as PromQL; without
//! promtool it fails.
//!
//! Needs the `storesvr`, `allocsvr` and `seqctl` binaries: `cargo build --workspace --bins` first.
//!
//! Left out: label names (only metric names are checked) and metrics Prometheus makes itself
//! (`up`), which no process exports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use seqsvr_client::{Client, ClientConfig};
use seqsvr_harness::{ProcSpec, Supervisor, free_addr, poll_until};
use seqsvr_proto::Uid;
use seqsvr_proto::pb::{self, alloc_service_client::AllocServiceClient};

mod e2e;
use e2e::seqctl::Seqctl;
use e2e::sibling_bin as bin;

const SECTION_SIZE: u64 = 100_000;
const UID_LIMIT: u64 = 1_000_000;
/// Half of one RPC's worth of uids, so that a batch of one hot uid always crosses its ceiling and
/// waits for a bump (`allocsvr_ceiling_waits_total`), however fast the prefetch comes back.
const STEP: u64 = 500;
const WAIT: Duration = Duration::from_secs(20);
/// Series Prometheus makes itself for every target.
const MADE_BY_PROMETHEUS: [&str; 1] = ["up"];

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel)
}

/// Two sets of real processes, each process with a metrics endpoint.
struct Cluster {
    dir: tempfile::TempDir,
    procs: Supervisor,
    stores: [String; 2],
    /// (data-plane address, set) of AllocSvr nodes 1, 2 (set 0) and 3 (set 1).
    allocs: [(String, usize); 3],
    /// Metrics endpoint of every process, by process name.
    metrics: BTreeMap<String, String>,
}

impl Cluster {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let procs = Supervisor::new(&dir.path().join("logs")).unwrap();
        let mut c = Self {
            dir,
            procs,
            stores: [free_addr(), free_addr()],
            allocs: [(free_addr(), 0), (free_addr(), 0), (free_addr(), 1)],
            metrics: BTreeMap::new(),
        };
        for set in 0..2 {
            let args = vec![
                "--node-id=1".to_string(),
                format!("--set-id={set}"),
                format!("--listen={}", c.stores[set]),
                format!("--data-dir={}", c.dir.path().join(format!("store{set}")).display()),
                format!("--peers=1={}", c.stores[set]),
                "--bootstrap".into(),
                "--new-replica".into(),
                format!("--section-size={SECTION_SIZE}"),
                format!("--uid-limit={UID_LIMIT}"),
                format!("--step={STEP}"),
            ];
            c.spawn(format!("store{set}"), "storesvr", args);
        }
        for (i, (addr, set)) in c.allocs.clone().iter().enumerate() {
            let args = vec![
                format!("--node-id={}", i + 1),
                format!("--listen={addr}"),
                format!("--store=1={}", c.stores[*set]),
            ];
            c.spawn(format!("alloc{}", i + 1), "allocsvr", args);
        }
        c
    }

    fn spawn(&mut self, name: String, binary: &str, mut args: Vec<String>) {
        let metrics = free_addr();
        args.push(format!("--metrics-listen={metrics}"));
        self.procs
            .spawn(ProcSpec::new(name.clone(), bin(binary), args))
            .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        self.metrics.insert(name, metrics);
    }

    async fn seqctl(&self, args: &[&str]) -> Output {
        Seqctl::new(["--store", self.stores[0].as_str()]).ok(args).await
    }

    fn client(&self) -> Client {
        Client::new(ClientConfig::new(self.allocs.iter().map(|(a, _)| a.clone()))).expect("client config")
    }

    /// Every endpoint's page, by process name; panics when one does not answer within [`WAIT`].
    async fn scrape_all(&self) -> BTreeMap<String, String> {
        let mut pages = BTreeMap::new();
        for (name, addr) in &self.metrics {
            let page = poll_until(WAIT, || http_get(addr))
                .await
                .unwrap_or_else(|| panic!("{name}'s metrics endpoint {addr} never answered"));
            pages.insert(name.clone(), page);
        }
        pages
    }

    /// Polls `process`'s page until the samples of `name` with every one of `labels` add up to a
    /// value `ok` accepts.
    async fn wait_value(&self, process: &str, name: &str, labels: &[&str], ok: impl Fn(f64) -> bool) -> f64 {
        self.wait_total(&[process], name, labels, ok).await
    }

    /// [`Self::wait_value`] summed over several processes (which of a set's AllocSvrs owns a
    /// section depends on the order they registered in).
    async fn wait_total(&self, processes: &[&str], name: &str, labels: &[&str], ok: impl Fn(f64) -> bool) -> f64 {
        let total = || async {
            let mut sum = None;
            for p in processes {
                if let Some(v) = sample(&http_get(&self.metrics[*p]).await?, name, labels) {
                    *sum.get_or_insert(0.0) += v;
                }
            }
            sum
        };
        if let Some(v) = poll_until(WAIT, || async { total().await.filter(|v| ok(*v)) }).await {
            return v;
        }
        let mut pages = String::new();
        for p in processes {
            pages += &format!("===== {p}\n{}\n", http_get(&self.metrics[*p]).await.unwrap_or_default());
        }
        panic!("{processes:?}: no {name}{labels:?} with the wanted value within {WAIT:?}; pages:\n{pages}")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for name in self.procs.names().map(String::from).collect::<Vec<_>>() {
                if let Some(log) = self.procs.log_path(&name).and_then(|p| std::fs::read_to_string(p).ok()) {
                    let tail: Vec<&str> = log.lines().rev().take(40).collect();
                    eprintln!("===== {name} =====");
                    tail.iter().rev().for_each(|l| eprintln!("{l}"));
                }
            }
        }
        self.procs.kill_all();
    }
}

/// The body of `GET /metrics` at `addr`, or `None` when it does not answer.
async fn http_get(addr: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let io = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        let req = "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
        s.write_all(req.as_bytes()).await.ok()?;
        let mut page = String::new();
        s.read_to_string(&mut page).await.ok()?;
        page.starts_with("HTTP/1.1 200").then_some(page)
    };
    tokio::time::timeout(Duration::from_secs(2), io).await.ok()?
}

/// The sum of the samples of `name` whose label set contains every one of `labels`
/// (`key="value"`), or `None` when there is none.
fn sample(page: &str, name: &str, labels: &[&str]) -> Option<f64> {
    let mut sum = None;
    for line in page.lines().filter(|l| !l.starts_with('#')) {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        if &line[..name_end] != name || !labels.iter().all(|l| line[name_end..].contains(l)) {
            continue;
        }
        if let Some(v) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
            *sum.get_or_insert(0.0) += v;
        }
    }
    sum
}

/// Every metric name exported on a page (histograms as their `_bucket`, `_sum`, `_count` series).
fn exported_names(page: &str) -> BTreeSet<String> {
    let body = page.split_once("\r\n\r\n").map_or(page, |(_, b)| b);
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l[..l.find(['{', ' ']).unwrap_or(l.len())].to_string())
        .collect()
}

/// The queries of the dashboard: every `expr` field, and every template variable's query.
fn dashboard_queries(dashboard: &serde_json::Value) -> Vec<String> {
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("expr", serde_json::Value::String(s)) => out.push(s.clone()),
                        ("definition", serde_json::Value::String(s)) => out.push(template_metric(s)),
                        _ => walk(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(dashboard, &mut out);
    out
}

/// A template variable's query as the selector it reads: `label_values(m, label)` is `m` (the
/// label is no metric).
fn template_metric(definition: &str) -> String {
    definition
        .strip_prefix("label_values(")
        .and_then(|rest| rest.split([',', ')']).next())
        .unwrap_or(definition)
        .trim()
        .to_string()
}

/// The `expr:` of every rule; each must sit on its line (a block scalar would be missed).
fn rule_queries(rules: &str) -> Vec<String> {
    rules
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("expr:"))
        .map(|e| {
            let e = e.trim();
            assert!(
                !e.is_empty() && !e.starts_with(['|', '>']),
                "keep every rule's expr on its `expr:` line: {e:?}"
            );
            e.trim_matches(['\'', '"']).to_string()
        })
        .collect()
}

/// Every metric the dashboard and the rules name, with the queries naming it.
fn named_metrics() -> BTreeMap<String, Vec<String>> {
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo_file("deploy/grafana/seqsvr.json")).unwrap())
            .expect("dashboard is JSON");
    let rules = std::fs::read_to_string(repo_file("deploy/prometheus/alerts.yml")).unwrap();
    let queries: Vec<String> = dashboard_queries(&dashboard)
        .into_iter()
        .chain(rule_queries(&rules))
        .collect();
    assert!(queries.len() > 40, "found only {} queries", queries.len());
    let mut named: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for q in queries {
        for m in promql::metric_names(&q) {
            named.entry(m).or_default().push(q.clone());
        }
    }
    named
}

/// Fetches enough seqs to make every kind of data-plane series appear: a hot uid past several
/// steps (bumps, waits at the ceiling), uids in every section, and one malformed request.
async fn drive_traffic(c: &Cluster) {
    let client = c.client();
    let served = poll_until(WAIT, || async { client.fetch_next_seq(Uid(150_000)).await.ok() }).await;
    assert!(served.is_some(), "set 0 never served");
    for _ in 0..3 {
        client
            .batch_fetch(&vec![Uid(150_001); 1_000])
            .await
            .expect("hot batch fetch");
    }
    let spread: Vec<Uid> = (0..UID_LIMIT / SECTION_SIZE)
        .map(|s| Uid(s * SECTION_SIZE + 7))
        .collect();
    client.batch_fetch(&spread).await.expect("a uid of every section");
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", c.allocs[0].0)).unwrap();
    let mut raw = AllocServiceClient::new(endpoint.connect().await.expect("connect alloc1"));
    let bad = raw
        .fetch_next_seq(pb::FetchNextSeqRequest {
            uid: UID_LIMIT,
            ..Default::default()
        })
        .await
        .expect_err("a uid past the limit is refused");
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_and_alerts_name_is_exported() {
    let named = named_metrics();
    let c = Cluster::start();
    drive_traffic(&c).await;

    let store1 = format!("1={}", c.stores[1]);
    c.seqctl(&["set", "add", "1", "--stores", &store1]).await;
    c.seqctl(&["move", "--from", "0", "--to", "1", "--uids", "100000..200000"])
        .await;
    let client = c.client();
    let moved = poll_until(WAIT, || async { client.fetch_next_seq(Uid(150_000)).await.ok() }).await;
    let owner = moved.expect("set 1 serves the moved uid").owner;
    assert_eq!(owner.map(|o| o.set_id), Some(1), "the moved uid is served by set 1");
    // Node 1 must hold something for the drain to hand over (the arbiter balances after both
    // registered).
    c.wait_value("alloc1", "allocsvr_sections_held", &[], |v| v > 0.0).await;
    c.seqctl(&["alloc", "drain", "1"]).await;

    // What the move, the drain and the traffic must show (sampled every 500 ms by the StoreSvrs).
    c.wait_value("store0", "storesvr_moves", &["phase=\"done\""], |v| v == 1.0)
        .await;
    c.wait_value("store0", "storesvr_sections", &["state=\"tombstoned\""], |v| v == 1.0)
        .await;
    c.wait_value("store1", "storesvr_sections", &["state=\"owned\""], |v| v == 1.0)
        .await;
    c.wait_value("store0", "storesvr_allocsvrs", &["state=\"draining\""], |v| v == 1.0)
        .await;
    c.wait_value("store0", "storesvr_raft_is_leader", &["set=\"0\""], |v| v == 1.0)
        .await;
    c.wait_value(
        "alloc2",
        "allocsvr_gain_ready_seconds_count",
        &["path=\"release\""],
        |v| v > 0.0,
    )
    .await;
    c.wait_value("alloc1", "allocsvr_sections_held", &[], |v| v == 0.0)
        .await;
    c.wait_value(
        "alloc1",
        "allocsvr_rpc_errors_total",
        &["code=\"InvalidArgument\""],
        |v| v == 1.0,
    )
    .await;
    c.wait_total(&["alloc1", "alloc2"], "allocsvr_ceiling_waits_total", &[], |v| v > 0.0)
        .await;

    let pages = c.scrape_all().await;
    let exported: BTreeSet<String> = pages.values().flat_map(|p| exported_names(p)).collect();
    let missing: Vec<String> = named
        .iter()
        .filter(|(m, _)| !exported.contains(*m) && !MADE_BY_PROMETHEUS.contains(&m.as_str()))
        .map(|(m, qs)| format!("{m} (in {qs:?})"))
        .collect();
    assert!(
        missing.is_empty(),
        "named by the dashboard or the alerts but exported by no process:\n{}\n\nexported: {exported:?}",
        missing.join("\n")
    );
    eprintln!(
        "{} metric names in the dashboard and the rules, all among the {} series names exported",
        named.len(),
        exported.len()
    );
}

/// `promtool` on PATH, if any.
fn promtool() -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join("promtool"))
        .find(|p| p.is_file())
}

fn run_promtool(tool: &Path, args: &[&str], dir: &Path) {
    let out = std::process::Command::new(tool)
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run promtool");
    assert!(
        out.status.success(),
        "promtool {args:?}:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn promtool_accepts_the_rules_their_tests_and_the_dashboard() {
    // Fails loudly: without promtool the rules and queries would go unchecked and the test pass.
    let tool =
        promtool().expect("promtool is not installed (Debian package `prometheus`; scripts/test.sh installs it)");
    let dir = repo_file("deploy/prometheus");
    run_promtool(&tool, &["check", "rules", "alerts.yml"], &dir);
    run_promtool(&tool, &["test", "rules", "alerts.test.yml"], &dir);
    run_promtool(&tool, &["check", "config", "prometheus.yml"], &dir);
    // Every dashboard query as a recording rule, Grafana's variables replaced by what they stand for.
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo_file("deploy/grafana/seqsvr.json")).unwrap()).unwrap();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, q) in dashboard_queries(&dashboard).iter().enumerate() {
        let q = q.replace("$__rate_interval", "1m").replace("$set", ".*");
        rules.push_str(&format!(
            "      - record: dashboard_query_{i}\n        expr: {}\n",
            serde_json::json!(q)
        ));
    }
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("dashboard.yml"), rules).unwrap();
    run_promtool(&tool, &["check", "rules", "dashboard.yml"], tmp.path());
}

/// Metric names out of PromQL, without a full parser: enough for the queries we write, and strict
/// where it matters (a name it cannot place is still reported as a metric).
mod promql {
    use std::collections::BTreeSet;

    /// Words that are PromQL syntax, not metric names, where they stand without a `(` after them
    /// (an aggregation may be followed by `by (...)` first).
    const KEYWORDS: [&str; 25] = [
        "sum",
        "min",
        "max",
        "avg",
        "count",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
        "group",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "and",
        "or",
        "unless",
        "offset",
        "inf",
        "nan",
    ];
    /// Keywords followed by a parenthesised list of label names.
    const LABEL_LISTS: [&str; 6] = ["by", "without", "on", "ignoring", "group_left", "group_right"];

    /// Every metric name `expr` selects. Skipped: strings, label matchers (`{...}`), ranges
    /// (`[...]`), label lists after `by`/`on`/…, numbers, durations, Grafana variables (`$x`,
    /// `${x}`) and functions or aggregations (a word followed by `(`).
    pub fn metric_names(expr: &str) -> BTreeSet<String> {
        let b = expr.as_bytes();
        let mut names = BTreeSet::new();
        let mut i = 0;
        let mut skip_list = false;
        while i < b.len() {
            let c = b[i];
            match c {
                b'"' | b'\'' | b'`' => i = skip_string(b, i),
                b'{' => i = skip_to(b, i, b'}'),
                b'[' => i = skip_to(b, i, b']'),
                b'(' if skip_list => {
                    i = skip_to(b, i, b')');
                    skip_list = false;
                }
                b'$' if b.get(i + 1) == Some(&b'{') => i = skip_to(b, i + 1, b'}'),
                b'$' => i = skip_word(b, i + 1),
                b'0'..=b'9' | b'.' => i = skip_word(b, i),
                c if c.is_ascii_alphabetic() || c == b'_' || c == b':' => {
                    let end = skip_word(b, i);
                    let word = &expr[i..end];
                    let next = b[end..].iter().find(|c| !c.is_ascii_whitespace());
                    if LABEL_LISTS.contains(&word) {
                        // `group_left` may stand without a list: then what follows is an operand.
                        skip_list = next == Some(&b'(');
                    } else if next != Some(&b'(') && !KEYWORDS.contains(&word) {
                        names.insert(word.to_string());
                    }
                    i = end;
                }
                _ => i += 1,
            }
        }
        names
    }

    fn skip_word(b: &[u8], mut i: usize) -> usize {
        while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b':' || b[i] == b'.') {
            i += 1;
        }
        i
    }

    /// Past the closing quote of the string opening at `i` (backslash escapes honoured).
    fn skip_string(b: &[u8], i: usize) -> usize {
        let quote = b[i];
        let mut j = i + 1;
        while j < b.len() && b[j] != quote {
            j += if b[j] == b'\\' { 2 } else { 1 };
        }
        j + 1
    }

    /// Past the `close` matching the bracket at `i`, skipping strings inside.
    fn skip_to(b: &[u8], i: usize, close: u8) -> usize {
        let mut j = i + 1;
        while j < b.len() && b[j] != close {
            j = if matches!(b[j], b'"' | b'\'' | b'`') {
                skip_string(b, j)
            } else {
                j + 1
            };
        }
        j + 1
    }

    #[test]
    fn names_are_found_and_syntax_is_not() {
        let cases: [(&str, &[&str]); 8] = [
            ("allocsvr_lease_valid == 0", &["allocsvr_lease_valid"]),
            (
                r#"sum by (outcome) (rate(allocsvr_fetch_total{outcome!="ok",x=~"a{b}|$set"}[$__rate_interval]))"#,
                &["allocsvr_fetch_total"],
            ),
            (
                "histogram_quantile(0.99, sum by (le, method) (rate(allocsvr_rpc_seconds_bucket[5m]))) > 0.05",
                &["allocsvr_rpc_seconds_bucket"],
            ),
            (
                "max(storesvr_map_version) - on () group_right min by (set) (storesvr_map_version) > 0",
                &["storesvr_map_version"],
            ),
            (
                "a_total / ignoring (outcome) group_left sum(b_total offset 5m) > bool 1e3",
                &["a_total", "b_total"],
            ),
            (r#"x{a="$set",b=~"${set}"} * on (k) y"#, &["x", "y"]),
            (
                r#"up{job=~"storesvr|allocsvr"} == 0 and on (instance) c:rule"#,
                &["c:rule", "up"],
            ),
            (
                "max by (set) (storesvr_max_seq_highest) > 9.223372036854776e18",
                &["storesvr_max_seq_highest"],
            ),
        ];
        for (expr, want) in cases {
            let got: Vec<String> = metric_names(expr).into_iter().collect();
            assert_eq!(got, *want, "{expr}");
        }
    }

    #[test]
    fn a_template_query_names_its_metric_not_its_label() {
        assert_eq!(
            super::template_metric("label_values(storesvr_raft_term, set)"),
            "storesvr_raft_term"
        );
        assert_eq!(super::template_metric("storesvr_raft_term"), "storesvr_raft_term");
    }

    #[test]
    fn a_misspelt_metric_is_reported_so_the_cluster_check_fails_on_it() {
        let names = metric_names("sum(rate(allocsvr_fetch_totl[1m])) / sum(rate(allocsvr_fetch_total[1m]))");
        assert!(names.contains("allocsvr_fetch_totl"), "{names:?}");
    }
}
