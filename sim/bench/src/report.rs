//! Tables and medians of `alloc-bench` (the per-run table and the verdict lines also of the other
//! benchmarks).
//!
//! Each case is run once per run against the echo and once against the AllocSvr. The summary shows
//! the median of each figure over the runs, and the median of the per-run ratios AllocSvr/echo
//! (a ratio taken within one run compares two measurements made seconds apart, under the same
//! background load; the median then drops the odd run).
//!
//! Deliberately left out: any judgement of noise beyond the median of a few runs.

use crate::load::Sample;

/// One case measured against both servers, once per run.
pub struct Case {
    /// What the calls carry: `unary`, `batch100`, `hot-unary`, ...
    pub name: String,
    pub concurrency: usize,
    /// `(echo, allocsvr)` per run.
    pub runs: Vec<(Sample, Sample)>,
}

/// Median figures of one server in one case.
pub struct Stats {
    pub calls_per_sec: f64,
    pub seqs_per_sec: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    /// Server CPU per call, microseconds.
    pub server_cpu_us: f64,
}

/// Median figures of one case and the medians of the per-run ratios.
pub struct Summary {
    pub echo: Stats,
    pub alloc: Stats,
    /// AllocSvr seqs/s over echo seqs/s.
    pub throughput_ratio: f64,
    /// AllocSvr p99 over echo p99.
    pub p99_ratio: f64,
    /// AllocSvr p99.9 over echo p99.9.
    pub p999_ratio: f64,
}

/// Median of `v` (mean of the middle two for an even count); NaN when empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Median figures of `samples`.
pub fn stats<'a>(samples: impl Iterator<Item = &'a Sample> + Clone) -> Stats {
    let m = |f: fn(&Sample) -> f64| median(samples.clone().map(f).collect());
    Stats {
        calls_per_sec: m(Sample::calls_per_sec),
        seqs_per_sec: m(Sample::seqs_per_sec),
        p50_us: m(|s| s.quantile_us(0.5)),
        p99_us: m(|s| s.quantile_us(0.99)),
        p999_us: m(|s| s.quantile_us(0.999)),
        server_cpu_us: m(|s| s.server_cpu * 1e6 / s.calls.max(1) as f64),
    }
}

impl Case {
    pub fn summary(&self) -> Summary {
        let ratio = |f: fn(&Sample) -> f64| median(self.runs.iter().map(|(e, a)| f(a) / f(e)).collect());
        Summary {
            echo: stats(self.runs.iter().map(|(e, _)| e)),
            alloc: stats(self.runs.iter().map(|(_, a)| a)),
            throughput_ratio: ratio(Sample::seqs_per_sec),
            p99_ratio: ratio(|s| s.quantile_us(0.99)),
            p999_ratio: ratio(|s| s.quantile_us(0.999)),
        }
    }
}

/// Header of the per-run table ([`row`]).
pub fn header() -> String {
    header_for("seqs/s")
}

/// [`header`] with another name for what the calls hand out (`ids/s`).
pub fn header_for(unit: &str) -> String {
    format!(
        "{:<13} {:>4} {:<6} {:>9} {:>10} {:>8} {:>8} {:>9} {:>8} {:>8} {:>7} {:>9} {:>6}",
        "case",
        "conc",
        "server",
        "calls/s",
        unit,
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "srv µs/c",
        "store %",
        "bench %",
        "foreign %",
        "errors"
    )
}

/// One line of the per-run table: what one server did in one case.
pub fn row(name: &str, concurrency: usize, server: &str, s: &Sample) -> String {
    format!(
        "{:<13} {:>4} {:<6} {:>9.0} {:>10.0} {:>8.0} {:>8.0} {:>9.0} {:>8.1} {:>8.0} {:>7.0} {:>9.0} {:>6}",
        name,
        concurrency,
        server,
        s.calls_per_sec(),
        s.seqs_per_sec(),
        s.quantile_us(0.5),
        s.quantile_us(0.99),
        s.quantile_us(0.999),
        s.server_cpu * 1e6 / s.calls.max(1) as f64,
        s.other_cpu * 100.0 / s.secs,
        s.client_cpu * 100.0 / s.secs,
        s.foreign_cpu * 100.0 / s.secs,
        s.errors + s.not_ok
    )
}

/// Header of the summary table ([`summary_row`]).
pub fn summary_header() -> String {
    format!(
        "{:<13} {:>4} {:>9} {:>9} {:>10} {:>10} {:>5} {:>6} {:>6} {:>6} {:>6} {:>5} {:>7} {:>7} {:>5}",
        "case",
        "conc",
        "e calls/s",
        "a calls/s",
        "e seqs/s",
        "a seqs/s",
        "ratio",
        "e p50",
        "a p50",
        "e p99",
        "a p99",
        "ratio",
        "e p99.9",
        "a p99.9",
        "ratio"
    )
}

/// One line of the summary table: medians over the runs (`e` echo, `a` AllocSvr, latency in µs).
pub fn summary_row(c: &Case, s: &Summary) -> String {
    format!(
        "{:<13} {:>4} {:>9.0} {:>9.0} {:>10.0} {:>10.0} {:>5.2} {:>6.0} {:>6.0} {:>6.0} {:>6.0} {:>5.2} {:>7.0} {:>7.0} {:>5.2}",
        c.name,
        c.concurrency,
        s.echo.calls_per_sec,
        s.alloc.calls_per_sec,
        s.echo.seqs_per_sec,
        s.alloc.seqs_per_sec,
        s.throughput_ratio,
        s.echo.p50_us,
        s.alloc.p50_us,
        s.echo.p99_us,
        s.alloc.p99_us,
        s.p99_ratio,
        s.echo.p999_us,
        s.alloc.p999_us,
        s.p999_ratio
    )
}

/// `MET` or `NOT MET`.
pub fn verdict(met: bool) -> &'static str {
    if met { "MET" } else { "NOT MET" }
}

/// The targets under `heading`, one `MET`/`NOT MET` line each.
pub fn print_verdicts(heading: &str, verdicts: &[(bool, String)]) {
    println!("\n{heading}:");
    for (met, what) in verdicts {
        println!("  {:<8} {what}", verdict(*met));
    }
}

/// The targets of a benchmark that prints them rather than failing on them, and how many are met.
pub fn print_targets(verdicts: &[(bool, String)]) {
    print_verdicts("targets (printed, not asserted)", verdicts);
    let met = verdicts.iter().filter(|(m, _)| *m).count();
    println!("{met} of {} targets met", verdicts.len());
}
