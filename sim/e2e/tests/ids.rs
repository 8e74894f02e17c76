//! Time-ordered ids with real processes: two sets (one StoreSvr each; two AllocSvrs in set 0, one
//! in set 1), the client library asking random AllocSvrs, while an AllocSvr is SIGKILLed and
//! restarted on a clock 2 s behind (the classic Snowflake duplicate: a restart on a host whose
//! clock is behind) and another is terminated. Every id any call returned is checked:
//! - U1: no id twice;
//! - U2: the ids of one slot under one holder strictly increase in the order the calls completed
//!   (calls to one AllocSvr are made one after another here);
//! - each set issues only from its own share of slots (set 1 adopted set 0's layout from the map).
//!
//! Two more restart a1 on a clock 6 s ahead and 6 s behind the store leader's (3 s allowed): it issues
//! nothing. The negative controls run the same restart with `--unsafe-ids-ignore-floor` (the new holder
//! starts at its own clock instead of above the slot's mark) and must see a repeated id.
//!
//! Needs the `storesvr`, `allocsvr` and `seqctl` binaries: `cargo build --workspace --bins` first.
//!
//! One more steps a running AllocSvr's clock back 10 s, forward an hour and back (`--test-clock-file`).
//!
//! Left out: load, and clock drift (the simulators' part).

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use seqsvr_client::{Client, ClientConfig};
use seqsvr_harness::{ProcSpec, Supervisor, free_addr, poll_until};
use seqsvr_proto::id_layout::IdLayout;

mod e2e;
use e2e::seqctl::{Seqctl, text};
use e2e::sibling_bin as bin;

const WAIT: Duration = Duration::from_secs(30);

struct Cluster {
    _dir: tempfile::TempDir,
    procs: Supervisor,
    stores: [String; 2],
    /// AllocSvr name → (address, set).
    allocs: BTreeMap<String, (String, u64)>,
}

impl Cluster {
    /// Both sets, every StoreSvr with `store_extra` too.
    fn start_with(store_extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut procs = Supervisor::new(&dir.path().join("logs")).unwrap();
        let stores = [free_addr(), free_addr()];
        for set in 0..2u64 {
            let s = &stores[set as usize];
            let args = vec![
                "--node-id=1".to_string(),
                format!("--set-id={set}"),
                format!("--listen={s}"),
                format!("--data-dir={}", dir.path().join(format!("store{set}")).display()),
                format!("--peers=1={s}"),
                "--bootstrap".into(),
                "--new-replica".into(),
                "--uid-limit=1000000".into(),
                "--id-slots-per-set=8".into(),
            ];
            let args = [args, store_extra.iter().map(|s| s.to_string()).collect()].concat();
            procs
                .spawn(ProcSpec::new(format!("store{set}"), bin("storesvr"), args))
                .unwrap();
        }
        let mut c = Self {
            _dir: dir,
            procs,
            stores,
            allocs: BTreeMap::new(),
        };
        for (name, set) in [("a1", 0), ("a2", 0), ("b1", 1)] {
            c.start_alloc(name, set, &[]);
        }
        c
    }

    /// Starts AllocSvr `name` of `set` (node id from its name) with `extra` flags.
    fn start_alloc(&mut self, name: &str, set: u64, extra: &[&str]) {
        let addr = self.allocs.get(name).map_or_else(free_addr, |(a, _)| a.clone());
        let node = match name {
            "a1" => 1,
            "a2" => 2,
            _ => 3,
        };
        let mut args = vec![
            format!("--node-id={node}"),
            format!("--listen={addr}"),
            format!("--store=1={}", self.stores[set as usize]),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let _ = self.procs.kill(name);
        self.procs.spawn(ProcSpec::new(name, bin("allocsvr"), args)).unwrap();
        self.allocs.insert(name.into(), (addr, set));
    }

    /// Waits until AllocSvr `name` has logged `steps` steps of its ids' clock in all (it steps
    /// before it logs). Counting the lines rather than reading their values: a value's digits
    /// would also match an earlier line (the step to 0 is in every line that says "to=-10000").
    async fn until_clock_steps(&self, name: &str, steps: usize) {
        let log = self.procs.log_path(name).expect("started here").to_path_buf();
        let stepped = poll_until(WAIT, || async {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            (text.matches("the ids' clock steps").count() >= steps).then_some(())
        })
        .await;
        assert!(stepped.is_some(), "{name} never logged {steps} steps of its clock");
    }

    /// The set of the AllocSvr at `addr` (`u64::MAX` for an address not started here).
    fn set_of(&self, addr: &str) -> u64 {
        self.allocs
            .values()
            .find(|(a, _)| a == addr)
            .map_or(u64::MAX, |(_, s)| *s)
    }

    fn client(&self) -> Client {
        let seeds: Vec<String> = self.allocs.values().map(|(a, _)| a.clone()).collect();
        Client::new(ClientConfig {
            deadline: Duration::from_secs(10),
            ..ClientConfig::new(seeds)
        })
        .unwrap()
    }

    /// Both sets started (StoreSvrs with `store_extra`), set 1 added, and a client that has had an
    /// id: the cluster issuing.
    async fn issuing(store_extra: &[&str]) -> (Self, Client) {
        let c = Self::start_with(store_extra);
        c.add_set_1().await;
        let client = c.client();
        poll_until(WAIT, || async { client.next_ids(1).await.ok() })
            .await
            .expect("no AllocSvr issued an id");
        (c, client)
    }

    /// Adds set 1 to the map, once set 0 has set its ids up (the map `set add` publishes then
    /// carries the setup), and waits until both sets have.
    async fn add_set_1(&self) {
        let set0 = Seqctl::new(["--store", self.stores[0].as_str()]);
        poll_until(WAIT, || async {
            set0.json(&["status"]).await?["ids"].as_object().map(|_| ())
        })
        .await
        .expect("set 0 never set its ids up");
        let stores = format!("1={}", self.stores[1]);
        let op = Seqctl::new(["--store", self.stores[0].as_str()]);
        let add = op.output(&["set", "add", "1", "--stores", &stores]).await;
        assert!(add.status.success(), "{}", text(&add));
        for s in &self.stores {
            let at = Seqctl::new(["--store", s.as_str()]);
            poll_until(WAIT, || async {
                at.json(&["status"]).await?["ids"].as_object().map(|_| ())
            })
            .await
            .unwrap_or_else(|| panic!("the set at {s} never set its ids up"));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.procs.kill_all();
    }
}

/// Every id returned, with where it came from, and the checks over them.
#[derive(Default)]
struct Ledger {
    seen: HashSet<u64>,
    repeats: Vec<u64>,
    /// (AllocSvr, slot) → the last id it returned.
    last: BTreeMap<(String, u64), u64>,
    decreases: Vec<String>,
    /// Slots each set issued from.
    slots: BTreeMap<u64, std::collections::BTreeSet<u64>>,
    calls: u64,
    /// Ids issued per AllocSvr address.
    by_addr: BTreeMap<String, u64>,
    /// U3: ids whose time lies outside [call start − allowance, call end + borrowing].
    off_time: Vec<String>,
}

/// U3's bounds as the scenarios set them: the store's allowance (`--id-max-ahead-ms`, 10 s by
/// default) behind, the AllocSvr's 1 s of borrowing ahead.
const ALLOWANCE_MS: u64 = 10_000;
const BORROW_MS: u64 = 1_000;

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

impl Ledger {
    /// No id twice (U1), each (AllocSvr, slot)'s ids increasing (U2), every id's time within its
    /// call's bounds (U3).
    fn assert_u1_to_u3(&self) {
        assert_eq!(self.repeats, Vec::<u64>::new(), "U1: repeated ids");
        assert_eq!(self.decreases, Vec::<String>::new(), "U2: a holder's ids went down");
        assert_eq!(self.off_time, Vec::<String>::new(), "U3: ids outside their time bounds");
    }

    /// `ids` of a call that began at `started` and ended at `ended` (Unix ms, this host's clock).
    fn record(&mut self, layout: &IdLayout, addr: &str, set: u64, ids: &[u64], (started, ended): (u64, u64)) {
        self.calls += 1;
        *self.by_addr.entry(addr.to_string()).or_default() += ids.len() as u64;
        for &id in ids {
            let at = layout.ms_of(layout.decompose(id).expect("an id decodes").tick);
            if at + ALLOWANCE_MS < started || at > ended + BORROW_MS {
                self.off_time
                    .push(format!("{addr}: id {id} at {at} ms for a call in [{started}, {ended}]"));
            }
            if !self.seen.insert(id) {
                self.repeats.push(id);
            }
            let slot = layout.decompose(id).expect("an id decodes").slot;
            self.slots.entry(set).or_default().insert(slot);
            let key = (addr.to_string(), slot);
            if let Some(&prev) = self.last.get(&key)
                && id <= prev
            {
                self.decreases.push(format!("{addr} slot {slot}: {id} after {prev}"));
            }
            self.last.insert(key, id);
        }
    }
}

/// One id through the client library's own choice of AllocSvr, recorded unless refused.
async fn ask_through_the_client(c: &Cluster, client: &Client, ledger: &mut Ledger) {
    let started = unix_ms();
    if let Ok(got) = client.next_ids(1).await {
        ledger.record(
            &got.layout,
            &got.addr,
            c.set_of(&got.addr),
            &got.ids,
            (started, unix_ms()),
        );
    }
}

/// For `run`, calls of 1 or 100 ids, each to one AllocSvr of `c` in turn (direct, not through the
/// client's choice, so a holder's order is the call order), and one through the client library's
/// own choice each time; refusals are skipped.
async fn ask_each(c: &Cluster, client: &Client, ledger: &mut Ledger, run: Duration) {
    let direct: Vec<(String, u64, Client)> = c
        .allocs
        .values()
        .map(|(addr, set)| {
            let cfg = ClientConfig {
                deadline: Duration::from_millis(500),
                ..ClientConfig::new([addr.clone()])
            };
            (addr.clone(), *set, Client::new(cfg).unwrap())
        })
        .collect();
    let until = std::time::Instant::now() + run;
    let mut i = 0;
    while std::time::Instant::now() < until {
        let (addr, set, one) = &direct[i % direct.len()];
        let count = if i % 3 == 0 { 100 } else { 1 };
        let started = unix_ms();
        if let Ok(got) = one.next_ids(count).await {
            ledger.record(&got.layout, addr, *set, &got.ids, (started, unix_ms()));
        }
        ask_through_the_client(c, client, ledger).await;
        i += 1;
    }
}

/// Runs the scenario; `restart_extra` goes to the AllocSvr restarted on a clock behind.
async fn scenario(restart_extra: &[&str]) -> Ledger {
    let (mut c, client) = Cluster::issuing(&[]).await;
    let mut ledger = Ledger::default();
    ask_each(&c, &client, &mut ledger, Duration::from_secs(4)).await;
    // SIGKILL a1 and restart it at once on a clock 2 s behind, so that its clock reads the ticks
    // it issued from before the kill: it registers again, which frees its slot, and the arbiter
    // gives it the lowest free slot — its old one.
    c.procs.kill("a1").unwrap();
    let mut extra = vec!["--test-clock-offset-ms=-2000"];
    extra.extend_from_slice(restart_extra);
    c.start_alloc("a1", 0, &extra);
    ask_each(&c, &client, &mut ledger, Duration::from_secs(6)).await;
    // SIGTERM a2: its slot goes free at once (the leaving Release).
    c.procs.signal("a2", seqsvr_harness::Signal::SIGTERM).unwrap();
    ask_each(&c, &client, &mut ledger, Duration::from_secs(2)).await;
    eprintln!(
        "ids: {} distinct from {} calls, {} repeated, {} decreases; slots by set {:?}",
        ledger.seen.len(),
        ledger.calls,
        ledger.repeats.len(),
        ledger.decreases.len(),
        ledger.slots
    );
    if restart_extra.is_empty() {
        let panics = c.procs.scan_panics().unwrap();
        assert!(panics.is_empty(), "panics: {panics:?}");
    }
    ledger
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_never_repeat_across_sets_kills_and_a_restart_on_a_clock_behind() {
    let ledger = scenario(&[]).await;
    assert!(
        ledger.seen.len() > 10_000,
        "too few ids to mean anything: {}",
        ledger.seen.len()
    );
    ledger.assert_u1_to_u3();
    assert!(
        ledger.slots[&0].iter().all(|s| *s < 8) && ledger.slots[&1].iter().all(|s| (8..16).contains(s)),
        "each set issues from its own share: {:?}",
        ledger.slots
    );
}

/// A cluster set up with `--id-layout javascript` issues ids a JavaScript number holds exactly
/// (at most 2^53 - 1), and an AllocSvr decodes one on its HTTP port (`GET /v1/ids/{id}`, with
/// `curl`) and its Redis port (`IDDECODE`) as `seqctl id decode` does from the StoreSvrs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_javascript_safe_cluster_issues_ids_below_2_53_and_every_front_decodes_them() {
    let (mut c, client) = Cluster::issuing(&["--id-layout=javascript"]).await;
    let ids = client.next_ids(500).await.expect("ids").ids;
    assert!(
        ids.iter().all(|id| *id < 1 << 53),
        "an id past 2^53 - 1: {:?}",
        ids.iter().max()
    );
    let (http, resp) = (free_addr(), free_addr());
    let fronts = [format!("--http-listen={http}"), format!("--resp-listen={resp}")];
    c.start_alloc("a1", 0, &[fronts[0].as_str(), fronts[1].as_str()]);
    let id = ids[ids.len() / 2];
    let decoded = Seqctl::new(["--store", c.stores[0].as_str()])
        .json(&["id", "decode", &id.to_string()])
        .await
        .expect("seqctl id decode");
    // Once a1 renewed with set 0, it has the layout and decodes without asking anyone.
    let url = format!("http://{http}/v1/ids/{id}");
    let by_http = poll_until(WAIT, || async {
        let out = std::process::Command::new("curl")
            .args(["-s", "--max-time", "2", &url])
            .output();
        let out = out.expect("curl is not installed (scripts/test.sh installs it)");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        v.get("time").is_some().then_some(v)
    })
    .await
    .expect("GET /v1/ids/{id} never answered with a decoded id");
    assert_eq!(by_http["time"], decoded["time"], "http {by_http} seqctl {decoded}");
    for (field, want) in [("slot", "slot"), ("sequence", "sequence"), ("set", "set_id")] {
        assert_eq!(
            by_http[field].as_str().map(|s| s.parse::<u64>().unwrap()),
            decoded[want].as_u64(),
            "{field}"
        );
    }
    let redis = redis::Client::open(format!("redis://{resp}/")).unwrap();
    let mut conn = redis
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection");
    let fields: Vec<redis::Value> = redis::cmd("IDDECODE")
        .arg(id)
        .query_async(&mut conn)
        .await
        .expect("IDDECODE");
    let text = format!("{fields:?}");
    assert!(
        text.contains(decoded["time"].as_str().unwrap()),
        "IDDECODE {text}, seqctl {decoded}"
    );
    let slot_at = fields
        .iter()
        .position(|v| matches!(v, redis::Value::BulkString(b) if b == b"slot"));
    let slot = slot_at.and_then(|i| match &fields[i + 1] {
        redis::Value::Int(n) => Some(*n as u64),
        _ => None,
    });
    assert_eq!(slot, decoded["slot"].as_u64(), "IDDECODE {text}");
}

/// Sonyflake's layout gives a slot 256 ids per 10 ms tick (25,600 a second); one caller asking
/// for 1,000 at a time uses a slot up in a few calls. The AllocSvr asks for more slots at its
/// renewals and gets free ones of its set's share while a2 keeps its one; every id is still unique
/// and each (AllocSvr, slot)'s ids increase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allocsvr_whose_load_outgrows_its_slot_gets_more_and_nothing_repeats() {
    let (c, client) = Cluster::issuing(&["--id-layout=sonyflake"]).await;
    let mut ledger = Ledger::default();
    let (addr, _) = c.allocs["a1"].clone();
    let one = Client::new(ClientConfig {
        deadline: Duration::from_millis(500),
        ..ClientConfig::new([addr.clone()])
    })
    .unwrap();
    let mut refused = 0;
    let until = std::time::Instant::now() + Duration::from_secs(8);
    while std::time::Instant::now() < until {
        let started = unix_ms();
        match one.next_ids(1_000).await {
            Ok(got) => ledger.record(&got.layout, &addr, 0, &got.ids, (started, unix_ms())),
            Err(_) => refused += 1,
        }
        // a2 and b1 issue too, from their own slots.
        ask_through_the_client(&c, &client, &mut ledger).await;
    }
    let a1_slots: std::collections::BTreeSet<u64> = ledger
        .last
        .keys()
        .filter(|(a, _)| *a == addr)
        .map(|(_, s)| *s)
        .collect();
    let status = Seqctl::new(["--store", c.stores[0].as_str()])
        .json(&["status"])
        .await
        .expect("status");
    eprintln!(
        "a1 issued {} ids from slots {a1_slots:?} ({refused} calls refused); set 0 status: {}",
        ledger.by_addr.get(&addr).copied().unwrap_or(0),
        status["ids"]
    );
    assert!(a1_slots.len() >= 3, "a1 issued from slots {a1_slots:?} only");
    assert!(
        status["ids"]["slots_held"].as_u64().unwrap_or(0) >= 4,
        "{}",
        status["ids"]
    );
    ledger.assert_u1_to_u3();
    assert!(
        ledger.slots[&0].iter().all(|s| *s < 8),
        "set 0's share: {:?}",
        ledger.slots
    );
    let panics = c.procs.scan_panics().unwrap();
    assert!(panics.is_empty(), "panics: {panics:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_negative_control_that_ignores_the_floor_repeats_an_id() {
    let ledger = scenario(&["--unsafe-ids-ignore-floor"]).await;
    assert!(
        !ledger.repeats.is_empty(),
        "a holder that starts at its own clock 2 s behind must repeat its slot's ids ({} ids seen)",
        ledger.seen.len()
    );
}

/// Restarts a1 on a clock `offset_ms` off (the store allows 3 s either way) with `extra`, lets it
/// be asked for `off_for`, SIGKILLs it and restarts it on the right clock, and asks everyone for
/// 8 s more: long enough for the right clock to reach the ticks a fast one read.
async fn clock_off_scenario(offset_ms: i64, off_for: Duration, extra: &[&str]) -> (Ledger, u64) {
    let (mut c, client) = Cluster::issuing(&["--id-max-ahead-ms=3000"]).await;
    let mut ledger = Ledger::default();
    c.procs.kill("a1").unwrap();
    let offset = format!("--test-clock-offset-ms={offset_ms}");
    let mut off = vec![offset.as_str()];
    off.extend_from_slice(extra);
    c.start_alloc("a1", 0, &off);
    ask_each(&c, &client, &mut ledger, off_for).await;
    let from_fast = ledger.last.iter().filter(|((a, _), _)| *a == c.allocs["a1"].0).count() as u64;
    c.procs.kill("a1").unwrap();
    c.start_alloc("a1", 0, &[]);
    ask_each(&c, &client, &mut ledger, Duration::from_secs(8)).await;
    eprintln!(
        "clock {offset_ms:+} ms: {} distinct ids from {} calls, {} repeated; the AllocSvr off answered from {from_fast} slots",
        ledger.seen.len(),
        ledger.calls,
        ledger.repeats.len()
    );
    (ledger, from_fast)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_far_ahead_of_the_store_leader_issues_nothing_and_nothing_repeats() {
    let (ledger, from_fast) = clock_off_scenario(6_000, Duration::from_secs(3), &[]).await;
    assert_eq!(from_fast, 0, "an AllocSvr whose clock is 6 s ahead must issue no id");
    assert!(ledger.seen.len() > 5_000, "too few ids: {}", ledger.seen.len());
    assert_eq!(ledger.repeats, Vec::<u64>::new(), "U1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_negative_control_that_issues_above_the_acknowledged_mark_repeats_an_id() {
    let (ledger, from_fast) = clock_off_scenario(6_000, Duration::from_secs(3), &["--unsafe-ids-ignore-mark"]).await;
    assert!(from_fast > 0, "the control must let the fast AllocSvr issue");
    assert!(
        !ledger.repeats.is_empty(),
        "issuing above the mark must repeat an id once the right clock gets there"
    );
}

/// U3's other side: a clock 6 s behind the store leader's (3 s allowed) would stamp its ids 6 s in
/// the past; it issues nothing once its first raise tells it the leader's time. Asked for 10 s, so
/// that its clock passes its slot's floor (the old holder's mark, about 2 s past the kill) and only
/// the lag keeps it from issuing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_far_behind_the_store_leader_issues_nothing() {
    let (ledger, from_slow) = clock_off_scenario(-6_000, Duration::from_secs(10), &[]).await;
    assert_eq!(from_slow, 0, "an AllocSvr whose clock is 6 s behind must issue no id");
    assert_eq!(ledger.repeats, Vec::<u64>::new(), "U1");
}

/// A running AllocSvr's clock steps back 10 s, forward an hour, and back to the right time (the
/// store allows 10 s): while it is 10 s behind it may still issue (within the allowance) but only
/// above the last tick it used, an hour ahead it issues nothing, and right again it issues. Across
/// all of it no id repeats, no holder's ids go down, and every id's time is within U3's bounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_clock_that_steps_back_and_forward_repeats_nothing() {
    let (mut c, client) = Cluster::issuing(&[]).await;
    let file = c._dir.path().join("a1.clock");
    std::fs::write(&file, "0").unwrap();
    let follow = format!("--test-clock-file={}", file.display());
    c.start_alloc("a1", 0, &[&follow]);
    let a1 = c.allocs["a1"].0.clone();
    let mut ledger = Ledger::default();
    ask_each(&c, &client, &mut ledger, Duration::from_secs(3)).await;
    let mut from_a1 = vec![ledger.by_addr.get(&a1).copied().unwrap_or(0)];
    for (step, offset) in ["-10000", "3600000", "0"].into_iter().enumerate() {
        std::fs::write(&file, offset).unwrap();
        // a1 reads the file every 50 ms (later on a busy machine) and issues on its old clock
        // until it has: each phase starts at the step a1 logs, not at the write.
        c.until_clock_steps("a1", step + 1).await;
        ask_each(&c, &client, &mut ledger, Duration::from_secs(4)).await;
        from_a1.push(ledger.by_addr.get(&a1).copied().unwrap_or(0));
    }
    eprintln!(
        "clock steps: {} distinct ids from {} calls, {} repeated, {} decreases, {} off time; a1's running total \
         after start, -10 s, +1 h, 0: {from_a1:?}",
        ledger.seen.len(),
        ledger.calls,
        ledger.repeats.len(),
        ledger.decreases.len(),
        ledger.off_time.len()
    );
    assert_eq!(ledger.repeats, Vec::<u64>::new(), "U1/U4");
    assert_eq!(ledger.decreases, Vec::<String>::new(), "U2");
    assert_eq!(ledger.off_time, Vec::<String>::new(), "U3");
    assert!(from_a1[0] > 0, "a1 issued before the steps");
    assert_eq!(from_a1[2], from_a1[1], "an hour ahead, a1 issues nothing");
    assert!(from_a1[3] > from_a1[2], "a1 issues again once its clock is right");
}
