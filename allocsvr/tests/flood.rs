//! A bounded flood against one AllocSvr: does it stay up, and do well-behaved callers keep being
//! served, and how fast, while others send it (a) oversized messages, (b) thousands of concurrent
//! calls over many connections, (c) calls whose replies they never read?
//!
//! Three parties, each on its own runtime so that none steals the others' scheduler: the server
//! (a node on a fake store, on the binary's runtime: one worker per CPU it may use), the flood
//! (the test's runtime), and the probe — one well-behaved caller on its own connection, one
//! FetchNextSeq at a time, paced. The probe's latencies are measured unloaded first, then under
//! each flood.
//!
//! Every flood is bounded in count and in time. The server runs with an in-flight limit per CPU
//! the version chooses (`FLOOD_MAX_IN_FLIGHT` sets a total instead) and 32 streams per
//! connection, so that the flood crosses both.
//!
//! Three versions:
//! - the test run in CI (default limit, debug build, everyone on both cores) asserts that the
//!   server stays up, every probe call is served, the limit acted (flood calls waited for a slot or
//!   were refused: with the limits off this is what fails), oversized requests are refused, no slow
//!   reader got a reply, and the probe's p99 stays within `2 × unloaded + CI_FLOOR`, a floor
//!   generous enough for a debug build on a shared 2-core box;
//! - `strict_flood_on_its_own_core` (`#[ignore]`d, release, alone, ten times longer): the issue's
//!   target, p99 within 2× of unloaded, with the flood kept off the server's core, the
//!   flood-hardened limit and a probe with CPU time of its own;
//! - `flood_on_shared_cores` (`#[ignore]`d): the same length with everyone on both cores; the
//!   ratio is reported, not checked (docs/benchmarks/overload.md has what each gives).

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use allocsvr::Node;
use common::{FakeStore, test_params};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use seqsvr_plumbing::serve_limits::{self, ServeLimits};
use seqsvr_proto::pb;
use seqsvr_proto::pb::alloc_service_client::AllocServiceClient;
use seqsvr_proto::refusal::{self, Refusal};
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

const SECTIONS: u64 = 64;
const SECTION_SIZE: u64 = 1_000;
/// Large, so that the flood's bumps are rare: this measures the server's RPC path, not the store.
const STEP: u64 = 1_000_000;
/// The probe's uid; the flood never touches its section.
const PROBE_UID: u64 = 7;
/// The server's limits in this test: `per_cpu` calls in flight for each CPU the server may run on
/// (call this on the server's thread), or `FLOOD_MAX_IN_FLIGHT` to measure another by hand
/// (docs/benchmarks/overload.md); 32 streams per connection, so that the flood's 64 callers per
/// connection cross it.
fn limits(per_cpu: usize) -> ServeLimits {
    let max_in_flight = std::env::var("FLOOD_MAX_IN_FLIGHT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| serve_limits::in_flight_for_cpus(per_cpu));
    ServeLimits {
        max_in_flight,
        max_streams_per_connection: 32,
        rpc_timeout: Duration::from_secs(2),
    }
}

/// The CI version's allowance over twice the unloaded p99: a debug build on a 2-core box shared
/// with other builds saw the probe's p99 at 44–138 ms under flood (b), against 5–11 ms unloaded.
const CI_FLOOR: Duration = Duration::from_millis(500);

/// How big and how long one run is.
#[derive(Clone, Copy)]
struct Plan {
    probe_calls: usize,
    probe_every: Duration,
    /// Flood (b): connections × concurrent callers on each.
    connections: usize,
    callers_per_connection: usize,
    /// Flood (a): connections sending oversized requests, and how many each sends at most.
    oversized_connections: usize,
    oversized_per_connection: usize,
    /// Flood (c): connections that never read a reply, and the streams each holds open.
    slow_connections: usize,
    slow_streams: usize,
    /// The server and the probe on CPU 0, the flood on CPU 1 (a flood from other machines, as
    /// far as one 2-core box can show it); `false`: everyone shares both cores.
    pinned: bool,
    /// The server's in-flight limit per CPU.
    in_flight_per_cpu: usize,
    /// The probe's thread runs SCHED_FIFO when the process may ask for it: the probe stands for a
    /// caller on a machine of its own, and sharing CPU 0's time with the busy server made its own
    /// wake-ups wait behind the server's worker (see [`probe`]).
    probe_realtime: bool,
}

const CI: Plan = Plan {
    probe_calls: 200,
    probe_every: Duration::from_millis(2),
    connections: 40,
    callers_per_connection: 64,
    oversized_connections: 4,
    oversized_per_connection: 6,
    slow_connections: 16,
    slow_streams: 64,
    pinned: false,
    in_flight_per_cpu: serve_limits::ALLOCSVR_IN_FLIGHT_PER_CPU,
    probe_realtime: false,
};

const STRICT: Plan = Plan {
    probe_calls: 2_000,
    ..CI
};

/// Runs the calling thread, and every thread it starts from now on, on `cpu` only.
fn pin_to(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).expect("cpu index");
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).expect("sched_setaffinity");
}

/// The CPU the server and the probe run on in a pinned plan.
fn server_cpu(plan: Plan) -> Option<usize> {
    plan.pinned.then_some(0)
}

/// The set's parameters: the production lease timings (3 s lease, renewed every 500 ms), not the
/// fake store's short test ones. A flood that saturates the CPU delays renewals too; with a 600 ms
/// lease the node lost its lease in the flood and answered NOT_OWNER (a first run of this test).
fn params() -> pb::SetParams {
    pb::SetParams {
        lease_ms: 3_000,
        renew_interval_ms: 500,
        margin_ms: 100,
        ..test_params(SECTIONS, SECTION_SIZE, STEP)
    }
}

/// A node on a fake store, on its own runtime and thread.
struct Server {
    addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    fn start(cpu: Option<usize>, in_flight_per_cpu: usize) -> Server {
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            // Before the runtime: its worker threads inherit this thread's CPUs.
            if let Some(cpu) = cpu {
                pin_to(cpu);
            }
            // The binary's runtime: one worker per CPU the thread may run on, as the binary has.
            // (Two workers on one CPU take turns at the kernel's time slices, and a call queued on
            // the descheduled one waits a slice: the pinned flood's p99 was ~5 ms with two.)
            let rt = allocsvr::node::runtime(None, allocsvr::config::EVENT_INTERVAL).expect("the server's runtime");
            let limits = limits(in_flight_per_cpu);
            eprintln!("server: {limits:?}");
            rt.block_on(async move {
                let store = FakeStore::start(params(), true).await;
                let mut cfg = common::config(1, &store);
                cfg.serve_limits = limits;
                let node = Node::start(cfg).await.expect("node starts");
                addr_tx.send(node.local_addr()).unwrap();
                let _ = stopped.await;
                node.shutdown().await;
            });
        });
        let addr = addr_rx.recv_timeout(Duration::from_secs(10)).expect("server started");
        Server {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn endpoint(addr: std::net::SocketAddr) -> Endpoint {
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .timeout(Duration::from_secs(5))
        .connect_timeout(Duration::from_secs(5))
}

async fn connect(ep: Endpoint) -> AllocServiceClient<Channel> {
    AllocServiceClient::new(ep.connect().await.expect("connect"))
        .max_decoding_message_size(seqsvr_proto::limits::DATA_PLANE_MESSAGE_BYTES)
        .max_encoding_message_size(seqsvr_proto::limits::DATA_PLANE_MESSAGE_BYTES)
}

async fn fetch(c: &mut AllocServiceClient<Channel>, uid: u64) -> Result<pb::FetchNextSeqReply, tonic::Status> {
    let req = pb::FetchNextSeqRequest { uid, route_version: 0 };
    c.fetch_next_seq(req).await.map(|r| r.into_inner())
}

/// Puts the calling thread in SCHED_FIFO (priority 10), or says why not (it needs root or
/// CAP_SYS_NICE; without it the probe's p99 under flood carries its own wait for the CPU).
fn realtime() {
    let param = nix::libc::sched_param { sched_priority: 10 };
    // SAFETY: a valid sched_param; pid 0 is the calling thread.
    let r = unsafe { nix::libc::sched_setscheduler(0, nix::libc::SCHED_FIFO, &param) };
    if r != 0 {
        eprintln!(
            "probe: SCHED_FIFO refused ({}); the probe shares the CPU's time with the server",
            std::io::Error::last_os_error()
        );
    }
}

/// What the probe saw.
#[derive(Debug, Default)]
struct Probe {
    latencies_us: Vec<u64>,
    served: usize,
    not_served: Vec<String>,
}

impl Probe {
    fn p(&self, q: f64) -> Duration {
        let mut v = self.latencies_us.clone();
        v.sort_unstable();
        let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
        Duration::from_micros(v[i])
    }
}

/// One well-behaved caller on its own thread and connection: `plan.probe_calls` fetches, one at a
/// time, `plan.probe_every` apart; on the server's CPU in a pinned plan, SCHED_FIFO if
/// `plan.probe_realtime` and the process may.
///
/// Why the priority: a caller on another machine has its own CPU. Here, sharing CPU 0 with a
/// server worker that the flood keeps busy, the probe's thread waited for the CPU at each wake-up
/// (its timer, its reply), and its p99 under flood (b) was 1.5–2.3× what it was with SCHED_FIFO in
/// the same hour. A shorter EEVDF slice for the probe (`sched_setattr` with a 100 µs
/// `sched_runtime`) did not help. The probe uses about 3 % of a core, so its priority costs the
/// server little.
fn probe(addr: std::net::SocketAddr, plan: Plan) -> std::thread::JoinHandle<Probe> {
    let cpu = server_cpu(plan);
    std::thread::spawn(move || {
        if let Some(cpu) = cpu {
            pin_to(cpu);
        }
        if plan.probe_realtime {
            realtime();
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let mut c = connect(endpoint(addr)).await;
            let mut out = Probe::default();
            for _ in 0..plan.probe_calls {
                let started = Instant::now();
                let r = fetch(&mut c, PROBE_UID).await;
                out.latencies_us.push(started.elapsed().as_micros() as u64);
                match r {
                    Ok(r) if r.outcome == pb::Outcome::Ok as i32 => out.served += 1,
                    Ok(r) => out.not_served.push(format!("outcome {}", r.outcome)),
                    Err(s) => out.not_served.push(format!("{}: {}", s.code(), s.message())),
                }
                tokio::time::sleep(plan.probe_every).await;
            }
            out
        })
    })
}

/// How the flood's calls ended.
#[derive(Debug, Default)]
struct Tally {
    ok: AtomicU64,
    overloaded: AtomicU64,
    out_of_range: AtomicU64,
    other: AtomicU64,
    /// The first few answers counted as `other`, for the report.
    other_seen: std::sync::Mutex<Vec<String>>,
}

impl Tally {
    fn note(&self, r: &Result<pb::FetchNextSeqReply, tonic::Status>) {
        let counter = match r {
            Ok(_) => &self.ok,
            Err(s) if refusal::of(s) == Some(Refusal::Overloaded) => &self.overloaded,
            Err(s) if s.code() == Code::OutOfRange => &self.out_of_range,
            Err(s) => {
                let mut seen = self.other_seen.lock().unwrap();
                if seen.len() < 5 {
                    seen.push(format!("{}: {}", s.code(), s.message()));
                }
                &self.other
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn get(&self) -> [u64; 4] {
        [&self.ok, &self.overloaded, &self.out_of_range, &self.other].map(|c| c.load(Ordering::Relaxed))
    }
}

/// Flood (b): `connections` × `callers` fetching in a closed loop until `until`.
async fn many_calls(addr: std::net::SocketAddr, plan: Plan, until: Instant, tally: Arc<Tally>) {
    let mut tasks = Vec::new();
    for conn in 0..plan.connections {
        let c = connect(endpoint(addr)).await;
        for caller in 0..plan.callers_per_connection {
            let (mut c, tally) = (c.clone(), tally.clone());
            // Any section but the probe's.
            let uid = SECTION_SIZE + ((conn * 977 + caller * 131) as u64 % ((SECTIONS - 1) * SECTION_SIZE));
            tasks.push(tokio::spawn(async move {
                // Bounded in count as well as in time.
                for _ in 0..1_000_000 {
                    if Instant::now() >= until {
                        break;
                    }
                    tally.note(&fetch(&mut c, uid).await);
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// Flood (a): requests above the data plane's message limit, `per_connection` on each.
async fn oversized(addr: std::net::SocketAddr, plan: Plan, until: Instant, tally: Arc<Tally>) {
    // 1.9 M uids of 10 varint bytes each: 19 MB, above DATA_PLANE_MESSAGE_BYTES (17 MiB).
    let req = pb::BatchFetchNextSeqRequest {
        uids: vec![u64::MAX; 1_900_000],
        route_version: 0,
    };
    let mut tasks = Vec::new();
    for _ in 0..plan.oversized_connections {
        let ch = endpoint(addr).connect().await.expect("connect");
        let mut c = AllocServiceClient::new(ch).max_encoding_message_size(usize::MAX);
        let (req, tally) = (req.clone(), tally.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..plan.oversized_per_connection {
                if Instant::now() >= until {
                    break;
                }
                let r = c.batch_fetch_next_seq(req.clone()).await;
                tally.note(&r.map(|_| pb::FetchNextSeqReply::default()));
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// Flood (c): connections that advertise a receive window of zero, so no reply can ever reach
/// them, each opening `slow_streams` calls and holding them until `until`. Returns how many of
/// their calls got a reply message (none can: a refusal needs no window, a reply does).
async fn slow_readers(addr: std::net::SocketAddr, plan: Plan, until: Instant) -> u64 {
    let completed = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..plan.slow_connections {
        let ep = endpoint(addr)
            .initial_stream_window_size(0)
            .timeout(Duration::from_secs(60));
        let c = AllocServiceClient::new(ep.connect().await.expect("connect"));
        for i in 0..plan.slow_streams {
            let (mut c, completed) = (c.clone(), completed.clone());
            tasks.push(tokio::spawn(async move {
                let call = fetch(&mut c, SECTION_SIZE + i as u64);
                if let Ok(Ok(_)) = tokio::time::timeout_at(until.into(), call).await {
                    completed.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    completed.load(Ordering::Relaxed)
}

/// The server's admission counters now: calls that waited for a slot, calls refused as
/// overloaded (`allocsvr_parked_total`, `allocsvr_shed_total`). They are process-wide: run the
/// strict tests one at a time (`--test-threads 1`) for counts of one run.
fn admission_counts() -> [u64; 2] {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    let handle = HANDLE.get_or_init(|| {
        PrometheusBuilder::new()
            .install_recorder()
            .expect("the test's metrics recorder")
    });
    let text = handle.render();
    ["allocsvr_parked_total", "allocsvr_shed_total"].map(|name| {
        text.lines()
            .filter_map(|l| l.strip_prefix(name))
            .filter_map(|rest| rest.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    })
}

/// What one run saw.
struct Seen {
    /// The probe alone, then under each flood.
    phases: Vec<(&'static str, Probe)>,
    /// Flood (b)'s calls: ok, overloaded, out of range, other; and the first few others.
    calls: [u64; 4],
    other: Vec<String>,
    /// The server's count of flood (b)'s calls that waited for a slot, and of those it refused.
    parked_shed: [u64; 2],
    /// Flood (a)'s oversized calls, counted the same way.
    big: [u64; 4],
    /// Flood (c)'s calls that got a reply message.
    slow_completed: u64,
}

/// Runs the probe alone and then under each flood.
async fn run(plan: Plan) -> Seen {
    // Installs the recorder before the node registers its counters.
    admission_counts();
    let server = Server::start(server_cpu(plan), plan.in_flight_per_cpu);
    let addr = server.addr;
    // Warm up: the probe's section and the flood's are gained and bumped once.
    let mut c = connect(endpoint(addr)).await;
    common::poll("the probe's uid served", Duration::from_secs(10), || {
        let mut c = c.clone();
        async move {
            fetch(&mut c, PROBE_UID)
                .await
                .ok()
                .filter(|r| r.outcome == pb::Outcome::Ok as i32)
        }
    })
    .await;
    for section in 1..SECTIONS {
        let _ = fetch(&mut c, section * SECTION_SIZE).await;
    }
    let window = plan.probe_every * plan.probe_calls as u32 + Duration::from_secs(1);
    let mut phases = Vec::new();
    phases.push(("unloaded", probe(addr, plan).join().unwrap()));

    let calls = Arc::new(Tally::default());
    let before = admission_counts();
    let until = Instant::now() + window;
    let flood = tokio::spawn(many_calls(addr, plan, until, calls.clone()));
    tokio::time::sleep(Duration::from_millis(300)).await; // the flood is at full strength
    let p = probe(addr, plan);
    phases.push((
        "many calls",
        tokio::task::spawn_blocking(|| p.join().unwrap()).await.unwrap(),
    ));
    flood.await.unwrap();
    let after = admission_counts();
    let parked_shed = [after[0] - before[0], after[1] - before[1]];

    let big = Arc::new(Tally::default());
    let until = Instant::now() + window;
    let flood = tokio::spawn(oversized(addr, plan, until, big.clone()));
    let p = probe(addr, plan);
    phases.push((
        "oversized",
        tokio::task::spawn_blocking(|| p.join().unwrap()).await.unwrap(),
    ));
    flood.await.unwrap();

    let until = Instant::now() + window;
    let flood = tokio::spawn(slow_readers(addr, plan, until));
    tokio::time::sleep(Duration::from_millis(300)).await; // every slow stream is open
    let p = probe(addr, plan);
    phases.push((
        "slow readers",
        tokio::task::spawn_blocking(|| p.join().unwrap()).await.unwrap(),
    ));
    let slow_completed = flood.await.unwrap();

    still_up(addr).await;
    drop(server);
    let other = calls.other_seen.lock().unwrap().clone();
    Seen {
        phases,
        calls: calls.get(),
        other,
        parked_shed,
        big: big.get(),
        slow_completed,
    }
}

/// The server answers health checks and fetches on a new connection.
async fn still_up(addr: std::net::SocketAddr) {
    use tonic_health::pb::health_client::HealthClient;
    let ch = endpoint(addr)
        .connect()
        .await
        .expect("the server still accepts connections");
    let health = HealthClient::new(ch.clone())
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .expect("health check answered");
    assert_eq!(health.into_inner().status, 1, "SERVING");
    let mut c = connect(endpoint(addr)).await;
    let r = fetch(&mut c, PROBE_UID).await.expect("a fetch after the flood");
    assert_eq!(r.outcome, pb::Outcome::Ok as i32);
}

fn report(seen: &Seen) {
    let Seen {
        phases,
        calls,
        other,
        parked_shed,
        big,
        slow_completed,
    } = seen;
    let unloaded = phases[0].1.p(0.99).as_secs_f64();
    for (name, p) in phases {
        eprintln!(
            "{name:>13}: {} calls, {} served, p50 {:?}, p99 {:?} ({:.2}× unloaded), max {:?}",
            p.latencies_us.len(),
            p.served,
            p.p(0.50),
            p.p(0.99),
            p.p(0.99).as_secs_f64() / unloaded,
            p.p(1.0)
        );
    }
    eprintln!("flood (b) calls [ok, overloaded, out_of_range, other]: {calls:?}");
    eprintln!("flood (b) first answers counted as other: {other:?}");
    eprintln!("flood (b) at the server [parked, shed]: {parked_shed:?}");
    eprintln!("flood (a) oversized [ok, overloaded, out_of_range, other]: {big:?}");
    eprintln!("flood (c) slow readers' calls that completed: {slow_completed}");
}

/// The checks every version makes; `floor` is what the probe's p99 may add to twice the
/// unloaded (`None`: the ratio is reported, not checked).
fn check(plan: Plan, seen: &Seen, floor: Option<Duration>) {
    let Seen {
        phases,
        calls,
        parked_shed,
        big,
        slow_completed,
        ..
    } = seen;
    for (name, p) in phases {
        assert_eq!(
            p.served, plan.probe_calls,
            "{name}: the probe was not always served: {:?}",
            p.not_served
        );
    }
    let [ok, _, _, _] = *calls;
    let [parked, shed] = *parked_shed;
    assert!(
        ok > 0 && parked + shed > 0,
        "the flood was served, and the limit acted (calls parked or shed): {calls:?}, {parked_shed:?}"
    );
    let [big_ok, _, big_refused, _] = *big;
    assert!(
        big_ok == 0 && big_refused > 0,
        "oversized requests are refused: {big:?}"
    );
    assert_eq!(
        *slow_completed, 0,
        "a slow reader never got a reply, so it held its streams"
    );
    let Some(floor) = floor else { return };
    let unloaded = phases[0].1.p(0.99);
    for (name, p) in &phases[1..] {
        let bound = unloaded * 2 + floor;
        assert!(
            p.p(0.99) <= bound,
            "{name}: p99 {:?} > 2 × {unloaded:?} + {floor:?}",
            p.p(0.99)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_bounded_flood_the_server_stays_up_and_keeps_serving_a_well_behaved_caller() {
    let seen = run(CI).await;
    report(&seen);
    check(CI, &seen, Some(CI_FLOOR));
}

/// Everyone on both cores: the flood's runtime takes CPU time from the server's workers, which
/// no flood from other machines can. The probe's p99 is reported against the unloaded one (it was
/// about 11×, docs/benchmarks/overload.md), not checked; the rest of [`check`] is. Release build, alone:
/// `cargo test --release -p allocsvr --test flood flood_on_shared_cores -- --exact --ignored
/// --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn flood_on_shared_cores() {
    let seen = run(STRICT).await;
    report(&seen);
    check(STRICT, &seen, None);
}

/// The target, strictly: under each flood the probe's p99 within twice its unloaded p99.
/// The flood is kept off the server's core (server and probe on CPU 0, the flood's runtime on
/// CPU 1: what a flood from other machines leaves the server, as far as a 2-core box can show it),
/// the server runs with the flood-hardened in-flight limit
/// ([`serve_limits::ALLOCSVR_FLOOD_HARDENED_IN_FLIGHT_PER_CPU`]; at the default 32 per CPU the ratio
/// was about 4×), and the probe's thread is SCHED_FIFO when the process may ask for it ([`probe`]).
/// Release build, alone, as root for the probe's priority:
/// `cargo test --release -p allocsvr --test flood strict_flood_on_its_own_core -- --exact --ignored
/// --nocapture`.
#[test]
#[ignore]
fn strict_flood_on_its_own_core() {
    assert!(
        std::thread::available_parallelism().map_or(0, |n| n.get()) >= 2,
        "needs two CPUs"
    );
    // The flood's runtime is built on this thread after the pin, so its workers run on CPU 1.
    pin_to(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let plan = Plan {
        pinned: true,
        in_flight_per_cpu: serve_limits::ALLOCSVR_FLOOD_HARDENED_IN_FLIGHT_PER_CPU,
        probe_realtime: true,
        ..STRICT
    };
    let seen = rt.block_on(run(plan));
    report(&seen);
    check(plan, &seen, Some(Duration::ZERO));
}
