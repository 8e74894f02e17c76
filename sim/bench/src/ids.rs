//! The parts of `ids-bench` (time-ordered ids, `AllocService.NextIds`): the NextIds load through
//! the closed-loop driver ([`crate::load`]), waiting until an AllocSvr holds a slot and issues, one
//! slot's in-process ceiling, and the medians, ratios and verdicts of the servers side by side
//! (AllocSvr, the bare echo, ferroid-tonic-server as shipped and with `TCP_NODELAY`:
//! [`crate::ferroid`]).
//!
//! Throughput is counted in ids, not calls: a call of `count` ids that came back whole adds
//! `count` (the driver's `seqs`). Ratios are taken within a run (measurements made seconds
//! apart, under the same background load) and their median over the runs is reported, as
//! `report::Case` does for alloc-bench.
//!
//! Deliberately left out: checking the ids themselves (unique, increasing: the e2e test
//! `sim/e2e/tests/ids.rs` and the simulator do that; here it would only add client CPU on the two
//! shared cores), more than one AllocSvr (any one that holds a slot answers; a client spreading
//! calls over several is the client library's business), and the Sonyflake layout.

use std::sync::Arc;
use std::time::{Duration, Instant};

use allocsvr::ids::clock::IdClock;
use allocsvr::ids::issuer::{SlotIssuer, UnsafeIssuing};
use allocsvr::ids::slots::MAX_BORROW;
use seqsvr_proto::id_layout::IdLayout;
use seqsvr_proto::pb;
use seqsvr_proto::pb::alloc_service_client::AllocServiceClient;
use tonic::transport::Channel;

use crate::cluster;
use crate::load::{Answer, Pids, Sample, Window, drive};
use crate::report::{self, Stats, median};

/// `NextIds{count}` by `concurrency` callers over `clients` (task `t` uses `clients[t % len]`). A
/// reply whose runs do not add up to `count` counts as not OK.
pub async fn next_ids(
    clients: &[AllocServiceClient<Channel>],
    concurrency: usize,
    count: u32,
    window: Window,
    pids: Pids<'_>,
) -> Sample {
    let clients = Arc::new(clients.to_vec());
    drive(concurrency, window, pids, move |t, _| {
        let mut client = clients[t % clients.len()].clone();
        async move {
            match client.next_ids(pb::NextIdsRequest { count }).await {
                Ok(r) => {
                    let got: u64 = r.get_ref().runs.iter().map(|run| u64::from(run.count)).sum();
                    if got == u64::from(count) {
                        Answer::Served { ok: got, not_ok: 0 }
                    } else {
                        Answer::Served { ok: 0, not_ok: 1 }
                    }
                }
                Err(_) => Answer::Failed,
            }
        }
    })
    .await
}

/// Waits until the set's ids are set up, the leader counts a slot held, and `client` (the
/// AllocSvr) answers a `NextIds` of one id (its slot needs a raise acknowledged first). Returns the
/// slots held and the layout the AllocSvr answered with.
pub async fn wait_issuing(
    leader: &str,
    client: &AllocServiceClient<Channel>,
    limit: Duration,
) -> Result<(u64, IdLayout), String> {
    let deadline = Instant::now() + limit;
    let mut last = String::from("no Status from the leader yet");
    while Instant::now() < deadline {
        match cluster::status(leader).await {
            Some(s) if s.ids.is_some() && s.slots_held > 0 => {
                match client.clone().next_ids(pb::NextIdsRequest { count: 1 }).await {
                    Ok(r) => {
                        let layout = r.get_ref().layout.as_ref().ok_or("NextIds answered without a layout")?;
                        let layout = IdLayout::from_pb(layout).map_err(|e| e.to_string())?;
                        return Ok((s.slots_held, layout));
                    }
                    Err(e) => last = format!("NextIds: {}", e.message()),
                }
            }
            Some(s) => last = format!("ids set up: {}, slots held: {}", s.ids.is_some(), s.slots_held),
            None => last = "no Status from the leader".into(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("the AllocSvr issued no id within {limit:?} (last: {last})"))
}

/// What one slot's issuer does in a tight loop, in this process.
#[derive(Debug, Clone, Copy)]
pub struct Ceiling {
    /// Ids per call.
    pub count: u64,
    /// Ids per second of the loop: the issuer's CPU ceiling, the layout's limit lifted.
    pub ids_per_sec: f64,
    /// Nanoseconds per call (one clock read and one `issue`).
    pub ns_per_call: f64,
}

/// The layout's limit for one slot: its sequence numbers per tick, every tick, ids per second.
pub fn layout_limit(layout: &IdLayout) -> f64 {
    layout.ids_per_tick() as f64 * 1_000.0 / layout.tick_ms as f64
}

/// One slot's [`SlotIssuer`] issuing `count` ids per call for `dur` on this thread, as the
/// AllocSvr's hot path does minus its lock and RPC: one read of the ids' clock per call, then
/// `issue`. The tick handed over is the issuer's own last one, not the clock's: with the real
/// clock a loop faster than the layout borrows ticks ahead until it is refused, and its rate is
/// then the layout's limit ([`layout_limit`]), whatever the code costs. So this is the code's
/// ceiling and the layout's limit is printed beside it; one slot gives the lower of the two.
pub fn issuer_ceiling(layout: IdLayout, count: u64, dur: Duration) -> Result<Ceiling, String> {
    let clock = IdClock::host();
    let floor = layout
        .tick_of(clock.now_ms())
        .ok_or("the clock reads before the layout's epoch")?;
    let borrow = MAX_BORROW.as_millis() as u64 / layout.tick_ms;
    let mut issuer = SlotIssuer::new(layout, 0, floor, borrow);
    issuer.acknowledged(layout.max_tick());
    let (mut ids, mut calls) = (0u64, 0u64);
    let start = Instant::now();
    // The elapsed time is read once per 1,024 calls, so that timing the loop costs little of it.
    while start.elapsed() < dur {
        for _ in 0..1_024 {
            std::hint::black_box(clock.now_ms());
            let runs = issuer
                .issue(Some(issuer.last_tick()), count, UnsafeIssuing::default())
                .map_err(|r| format!("the issuer refused: {r:?}"))?;
            ids += runs.iter().map(|r| r.count).sum::<u64>();
            calls += 1;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    Ok(Ceiling {
        count,
        ids_per_sec: ids as f64 / secs,
        ns_per_call: secs * 1e9 / calls as f64,
    })
}

/// The servers of a point, in the order of the first point (each point rotates it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    Alloc,
    Echo,
    /// ferroid-tonic-server as shipped.
    Ferroid,
    /// ferroid-tonic-server with `TCP_NODELAY` on its accepted sockets (the preloaded shim).
    FerroidNodelay,
}

impl Server {
    pub const ALL: [Server; 4] = [Server::Alloc, Server::Echo, Server::Ferroid, Server::FerroidNodelay];

    /// Server column of the tables (six characters at most).
    pub fn name(self) -> &'static str {
        match self {
            Server::Alloc => "alloc",
            Server::Echo => "echo",
            Server::Ferroid => "ferr",
            Server::FerroidNodelay => "ferrnd",
        }
    }

    /// What the short name stands for.
    pub fn title(self) -> &'static str {
        match self {
            Server::Alloc => "the AllocSvr",
            Server::Echo => "the bare tonic echo",
            Server::Ferroid => "ferroid-tonic-server as shipped",
            Server::FerroidNodelay => "ferroid-tonic-server with TCP_NODELAY (ferroid-nodelay.so)",
        }
    }
}

/// What one run measured at one point: a sample per server measured (the AllocSvr and the echo
/// always; each ferroid when it runs).
pub struct Run(pub Vec<(Server, Sample)>);

impl Run {
    pub fn get(&self, server: Server) -> Option<&Sample> {
        self.0.iter().find(|(s, _)| *s == server).map(|(_, x)| x)
    }
}

/// One point (`count` ids per call, `concurrency` callers): every server once per run.
pub struct Point {
    pub count: u32,
    pub concurrency: usize,
    pub runs: Vec<Run>,
}

/// Medians of one point and of its per-run ratios.
pub struct Summary {
    /// Per server measured: its median figures.
    pub stats: Vec<(Server, Stats)>,
    /// Per other server measured: the median of AllocSvr ids/s over its ids/s.
    pub alloc_over: Vec<(Server, f64)>,
    /// Median of AllocSvr p99 over echo p99.
    pub p99_over_echo: f64,
}

/// AllocSvr/ferroid ids/s: at least this at every point.
pub const TARGET_OVER_FERROID: f64 = 1.0;
/// AllocSvr/echo ids/s: at least this.
pub const TARGET_OVER_ECHO: f64 = 0.9;
/// AllocSvr/echo p99: at most this.
pub const TARGET_P99: f64 = 1.2;

impl Point {
    /// Median of `f(alloc, other)` over the runs that measured `other`; `None` when none did.
    fn ratio(&self, other: Server, f: fn(&Sample) -> f64) -> Option<f64> {
        let v: Vec<f64> = self
            .runs
            .iter()
            .filter_map(|r| Some(f(r.get(Server::Alloc)?) / f(r.get(other)?)))
            .collect();
        (!v.is_empty()).then(|| median(v))
    }

    pub fn summary(&self) -> Summary {
        let mut stats = Vec::new();
        let mut alloc_over = Vec::new();
        for server in Server::ALL {
            let samples: Vec<&Sample> = self.runs.iter().filter_map(|r| r.get(server)).collect();
            if samples.is_empty() {
                continue;
            }
            stats.push((server, report::stats(samples.iter().copied())));
            if let Some(r) = self
                .ratio(server, Sample::seqs_per_sec)
                .filter(|_| server != Server::Alloc)
            {
                alloc_over.push((server, r));
            }
        }
        Summary {
            stats,
            alloc_over,
            p99_over_echo: self.ratio(Server::Echo, |s| s.quantile_us(0.99)).unwrap_or(f64::NAN),
        }
    }
}

impl Summary {
    fn of(&self, server: Server) -> Option<&Stats> {
        self.stats.iter().find(|(s, _)| *s == server).map(|(_, x)| x)
    }

    fn alloc_over(&self, server: Server) -> Option<f64> {
        self.alloc_over.iter().find(|(s, _)| *s == server).map(|(_, r)| *r)
    }
}

/// Header of the table of medians ([`summary_rows`]).
pub fn summary_header() -> String {
    format!(
        "{:>5} {:>4} {:<6} {:>10} {:>8} {:>7} {:>7} {:>8} {:>8}",
        "count", "conc", "server", "ids/s", "calls/s", "p50 µs", "p99 µs", "p99.9 µs", "srv µs/c"
    )
}

/// The lines of one point in the table of medians: one per server measured.
pub fn summary_rows(p: &Point, s: &Summary) -> Vec<String> {
    s.stats
        .iter()
        .map(|(server, x)| {
            format!(
                "{:>5} {:>4} {:<6} {:>10.0} {:>8.0} {:>7.0} {:>7.0} {:>8.0} {:>8.1}",
                p.count,
                p.concurrency,
                server.name(),
                x.seqs_per_sec,
                x.calls_per_sec,
                x.p50_us,
                x.p99_us,
                x.p999_us,
                x.server_cpu_us
            )
        })
        .collect()
}

/// Header of the table of ratios ([`ratio_row`]).
pub fn ratio_header() -> String {
    format!(
        "{:>5} {:>4} {:>9} {:>11} {:>11} {:>10}",
        "count", "conc", "a/echo", "a/ferr", "a/ferrnd", "p99 a/echo"
    )
}

/// One point in the table of ratios: AllocSvr ids/s over each other server's, and the p99 ratio.
pub fn ratio_row(p: &Point, s: &Summary) -> String {
    let r = |server| match s.alloc_over(server) {
        Some(v) => format!("{v:.2}"),
        None => "-".into(),
    };
    format!(
        "{:>5} {:>4} {:>9} {:>11} {:>11} {:>10.2}",
        p.count,
        p.concurrency,
        r(Server::Echo),
        r(Server::Ferroid),
        r(Server::FerroidNodelay),
        s.p99_over_echo
    )
}

/// Every target at every point: (met, what). Against ferroid, one line per variant measured; when
/// neither was, one line saying so (not met: there is no ratio to judge).
pub fn verdicts(points: &[Point]) -> Vec<(bool, String)> {
    let mut out = Vec::new();
    for p in points {
        let s = p.summary();
        let at = format!("count {}@{}", p.count, p.concurrency);
        let ferroids = [Server::Ferroid, Server::FerroidNodelay];
        let mut judged = false;
        for f in ferroids {
            if let Some(r) = s.alloc_over(f) {
                judged = true;
                out.push((
                    r >= TARGET_OVER_FERROID,
                    format!("{at}: ids/s AllocSvr/{} = {r:.2} (>= {TARGET_OVER_FERROID})", f.name()),
                ));
            }
        }
        if !judged {
            out.push((false, format!("{at}: ferroid not measured, no ratio")));
        }
        let over_echo = s.alloc_over(Server::Echo).unwrap_or(f64::NAN);
        out.push((
            over_echo >= TARGET_OVER_ECHO,
            format!("{at}: ids/s AllocSvr/echo = {over_echo:.2} (>= {TARGET_OVER_ECHO})"),
        ));
        let (a, e) = (s.of(Server::Alloc), s.of(Server::Echo));
        out.push((
            s.p99_over_echo <= TARGET_P99,
            format!(
                "{at}: p99 AllocSvr/echo = {:.2} (<= {TARGET_P99}; {:.0} vs {:.0} µs)",
                s.p99_over_echo,
                a.map_or(f64::NAN, |x| x.p99_us),
                e.map_or(f64::NAN, |x| x.p99_us)
            ),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_twitter_layout_allows_4096_ids_per_ms_per_slot() {
        assert_eq!(layout_limit(&IdLayout::twitter(0)), 4_096_000.0);
        assert_eq!(layout_limit(&IdLayout::sonyflake(0)), 25_600.0);
    }

    /// A sample of `ids` ids in one second whose every call took `latency_us`.
    fn sample(ids: u64, latency_us: u64) -> Sample {
        let mut hist = hdrhistogram::Histogram::new_with_bounds(1_000, 60_000_000_000, 2).unwrap();
        hist.record_n(latency_us * 1_000, 100).unwrap();
        Sample {
            calls: 100,
            seqs: ids,
            not_ok: 0,
            errors: 0,
            secs: 1.0,
            hist,
            server_cpu: 0.0,
            other_cpu: 0.0,
            client_cpu: 0.0,
            foreign_cpu: 0.0,
        }
    }

    #[test]
    fn ratios_are_medians_of_per_run_ratios_and_each_ferroid_is_judged() {
        let run = |a, e, f| {
            Run(vec![
                (Server::Alloc, sample(a, 100)),
                (Server::Echo, sample(e, 100)),
                (Server::Ferroid, sample(f, 50)),
            ])
        };
        // Per run AllocSvr/echo: 0.8, 1.0, 2.0 -> 1.0 (the median of the medians would be 1000/1000).
        let p = Point {
            count: 100,
            concurrency: 16,
            runs: vec![run(800, 1_000, 400), run(1_000, 1_000, 2_000), run(4_000, 2_000, 1_000)],
        };
        let s = p.summary();
        assert_eq!(s.alloc_over(Server::Echo), Some(1.0));
        assert_eq!(s.alloc_over(Server::Ferroid), Some(2.0));
        assert_eq!(s.alloc_over(Server::FerroidNodelay), None, "not measured");
        assert_eq!(s.p99_over_echo, 1.0);
        let v = verdicts(&[p]);
        let met: Vec<bool> = v.iter().map(|(m, _)| *m).collect();
        assert_eq!(met, [true, true, true], "{v:?}");
        assert!(v[0].1.contains("AllocSvr/ferr = 2.00"), "{v:?}");
    }

    #[test]
    fn without_ferroid_its_target_is_reported_unjudged() {
        let p = Point {
            count: 1,
            concurrency: 1,
            runs: vec![Run(vec![
                (Server::Alloc, sample(80, 130)),
                (Server::Echo, sample(100, 100)),
            ])],
        };
        let v = verdicts(&[p]);
        let met: Vec<bool> = v.iter().map(|(m, _)| *m).collect();
        assert_eq!(met, [false, false, false], "{v:?}");
        assert!(v[0].1.contains("ferroid not measured"), "{v:?}");
    }

    #[test]
    fn the_ceiling_loop_issues_whole_calls_across_ticks() {
        let layout = IdLayout::twitter(seqsvr_proto::id_layout::DEFAULT_EPOCH_MS);
        // 100 does not divide 4,096: calls straddle ticks, and each still gets all its ids.
        let c = issuer_ceiling(layout, 100, Duration::from_millis(20)).unwrap();
        assert!(c.ids_per_sec > 0.0 && c.ns_per_call > 0.0, "{c:?}");
    }
}
