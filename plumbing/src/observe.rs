//! What the servers' Prometheus exporters share: the buckets of every `*_seconds` histogram.
//!
//! One bucket list for every latency, so that the dashboard and the alert rules can compute any
//! quantile across instances with `histogram_quantile` (the exporter's default, a summary per
//! process, cannot be aggregated). The range covers a data-plane call served from memory (tens of
//! microseconds) up to a takeover's lease wait (seconds).
//!
//! Left out: the exporter itself (each binary installs it; a recorder is process-global).

/// Histograms whose name ends so get [`LATENCY_BUCKETS_SECONDS`].
pub const LATENCY_SUFFIX: &str = "_seconds";

/// Upper bounds of the latency buckets, seconds (Prometheus adds `+Inf`).
pub const LATENCY_BUCKETS_SECONDS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
