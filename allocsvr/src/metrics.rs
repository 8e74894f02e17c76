//! Metric handles, registered once at start so that the hot path only bumps an atomic.
//!
//! The Prometheus exporter itself is installed by the binary (`--metrics-listen`): a recorder is
//! process-global, and tests start many nodes in one process. Without a recorder every handle is
//! a no-op.

use metrics::{Counter, Gauge, Histogram, counter, gauge, histogram};

/// Handles of every metric the AllocSvr exports.
#[derive(Clone)]
pub struct Metrics {
    /// Seqs handed out.
    pub fetch_ok: Counter,
    /// Seqs handed out in blocks (`Reserve`); each block is also one `fetch_ok`.
    pub block_seqs: Counter,
    /// Values of named counters handed out (singly, in blocks and in batches); each call is also
    /// counted in `fetch_ok`.
    pub key_seqs: Counter,
    /// Counter keys held in memory (all owned sections), and how many the node may hold.
    pub keys_live: Gauge,
    /// Bytes those keys take (their maps and long names), bounded by `--max-live-key-bytes`.
    pub key_bytes_live: Gauge,
    /// Fetches answered NOT_OWNER.
    pub fetch_not_owner: Counter,
    /// Fetches answered NOT_READY.
    pub fetch_not_ready: Counter,
    /// Bump RPCs sent (one may carry many sections).
    pub bump_rpcs: Counter,
    /// Sections raised by an acknowledged bump.
    pub bump_sections: Counter,
    /// Bump RPCs that failed or timed out (retried with the same new_max).
    pub bump_failures: Counter,
    /// Prefetches given up because the bump queue was full (the next fetch asks again).
    pub bump_queue_full: Counter,
    /// Time from sending a Bump to its reply, seconds.
    pub bump_latency: Histogram,
    /// Fetches that found their section's acknowledged ceiling reached (no headroom left) and
    /// had to wait for a bump: the prefetch at half a step did not finish in time, so the step
    /// is small for the section's rate or the store is slow.
    pub ceiling_waits: Counter,
    /// 1 while the lease is valid, else 0.
    pub lease_valid: Gauge,
    /// Sections currently held (any state).
    pub sections_held: Gauge,
    /// Times the lease ran out and everything was dropped.
    pub lease_lost: Counter,
    /// From the renewal that granted a section to the moment it could serve (loaded, first bump
    /// acknowledged, gain wait over), seconds: sections released to this node for it, which skip
    /// the wait (`path="release"`), and sections taken over after a lease wait (`"lease_wait"`).
    pub gain_ready_release: Histogram,
    pub gain_ready_lease_wait: Histogram,
    /// Time-ordered ids issued.
    pub ids_issued: Counter,
    /// Ids issued with a tick ahead of this host's clock (borrowed).
    pub ids_borrowed: Counter,
    /// NextIds calls refused, by cause.
    pub ids_refused_no_slot: Counter,
    pub ids_refused_clock_behind: Counter,
    pub ids_refused_clock_lagging: Counter,
    pub ids_refused_mark_behind: Counter,
    pub ids_refused_exhausted: Counter,
    /// Ticks between the clock and the least-raised slot's acknowledged mark.
    pub id_mark_headroom_ticks: Gauge,
    /// RaiseMarks that failed (asked again next tick).
    pub id_raise_failures: Counter,
    /// Raises refused as too far ahead of the store leader's clock (this host's clock is ahead).
    pub id_raises_too_far_ahead: Counter,
    /// Years until the layout's time field runs out.
    pub id_years_left: Gauge,
    /// Id slots held, and how many the last renewal asked for (from the rate of ids issued).
    pub id_slots_held: Gauge,
    pub id_slots_wanted: Gauge,
}

impl Metrics {
    /// Registers every handle with the global recorder (no-op handles when none is installed).
    pub fn new() -> Self {
        Self {
            fetch_ok: counter!("allocsvr_fetch_total", "outcome" => "ok"),
            block_seqs: counter!("allocsvr_block_seqs_total"),
            key_seqs: counter!("allocsvr_key_seqs_total"),
            keys_live: gauge!("allocsvr_keys_live"),
            key_bytes_live: gauge!("allocsvr_key_bytes_live"),
            fetch_not_owner: counter!("allocsvr_fetch_total", "outcome" => "not_owner"),
            fetch_not_ready: counter!("allocsvr_fetch_total", "outcome" => "not_ready"),
            bump_rpcs: counter!("allocsvr_bump_rpcs_total"),
            bump_sections: counter!("allocsvr_bump_sections_total"),
            bump_failures: counter!("allocsvr_bump_failures_total"),
            bump_queue_full: counter!("allocsvr_bump_queue_full_total"),
            bump_latency: histogram!("allocsvr_bump_latency_seconds"),
            ceiling_waits: counter!("allocsvr_ceiling_waits_total"),
            lease_valid: gauge!("allocsvr_lease_valid"),
            sections_held: gauge!("allocsvr_sections_held"),
            lease_lost: counter!("allocsvr_lease_lost_total"),
            gain_ready_release: histogram!("allocsvr_gain_ready_seconds", "path" => "release"),
            gain_ready_lease_wait: histogram!("allocsvr_gain_ready_seconds", "path" => "lease_wait"),
            ids_issued: counter!("allocsvr_ids_issued_total"),
            ids_borrowed: counter!("allocsvr_ids_borrowed_total"),
            ids_refused_no_slot: counter!("allocsvr_ids_refused_total", "cause" => "no_slot"),
            ids_refused_clock_behind: counter!("allocsvr_ids_refused_total", "cause" => "clock_behind"),
            ids_refused_clock_lagging: counter!("allocsvr_ids_refused_total", "cause" => "clock_lagging"),
            ids_refused_mark_behind: counter!("allocsvr_ids_refused_total", "cause" => "mark_behind"),
            ids_refused_exhausted: counter!("allocsvr_ids_refused_total", "cause" => "exhausted"),
            id_mark_headroom_ticks: gauge!("allocsvr_id_mark_headroom_ticks"),
            id_raise_failures: counter!("allocsvr_id_raise_failures_total"),
            id_raises_too_far_ahead: counter!("allocsvr_id_raises_too_far_ahead_total"),
            id_years_left: gauge!("allocsvr_id_years_left"),
            id_slots_held: gauge!("allocsvr_id_slots_held"),
            id_slots_wanted: gauge!("allocsvr_id_slots_wanted"),
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
