//! StoreSvr configuration: options and their validation.
//!
//! Options come as flags, `STORESVR_*` environment variables or a TOML config file
//! (`--config`), in that order of precedence, through `seqsvr_plumbing::cli`; addresses are parsed
//! by `seqsvr_proto::addr`. Parsing and validating are separate: clap turns the options into
//! [`Config`], then [`Config::validate`] checks the relations between values — the set's
//! parameters with the one rule set of `seqsvr_proto::params`, the Raft timings against the lease,
//! the peers — and refuses a bad configuration with the option named.

use crate::domain::slots::SlotCommand;
use clap::Parser;
use seqsvr_plumbing::serve_limits::{self, ServeLimits};
use seqsvr_proto::addr::{IdAddr, unique_ids};
use seqsvr_proto::id_layout::{DEFAULT_EPOCH_MS, LayoutShape};
use seqsvr_proto::keys::KeyPlacement;
use seqsvr_proto::limits::MAX_ID_SLOTS_PER_SET;
use seqsvr_proto::params::SetParams;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Prefix of the environment variables of the `storesvr` binary's options.
pub const ENV_PREFIX: &str = "STORESVR";

/// StoreSvr: one replica of a set's Raft group (section ceilings, ownership, routes).
#[derive(Parser, Debug, Clone)]
#[command(name = "storesvr", version = seqsvr_plumbing::version::LONG, args_override_self = true)]
pub struct Config {
    /// Read options from this TOML file (`node_id = 1`, `listen = "127.0.0.1:7101"`, …); flags and
    /// environment variables override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// This replica's node id (> 0). Never reuse the id of a removed or wiped replica.
    #[arg(long)]
    pub node_id: u64,

    /// Id of the set this replica's Raft group stores; required, with no default, on every start
    /// (a forgotten flag must not make a second set 0). Set 0 starts owning the whole uid space
    /// and keeps the cluster map; any other set starts empty and gets its ranges by moves. A data
    /// dir that holds another set's replica is refused.
    #[arg(long)]
    pub set_id: u64,

    /// Address to listen on for gRPC (StoreService, Raft peers, Admin, health, reflection).
    #[arg(long)]
    pub listen: SocketAddr,

    /// Directory for the Raft log, vote and snapshots. Created if missing.
    #[arg(long)]
    pub data_dir: PathBuf,

    /// Initial voters as ID=ADDR, comma-separated. Only read with --bootstrap.
    #[arg(long, value_delimiter = ',')]
    pub peers: Vec<IdAddr>,

    /// Initialize a new group from --peers if this replica's data dir is fresh. Give it to ONE
    /// replica, once; on a restart with existing data it does nothing.
    #[arg(long)]
    pub bootstrap: bool,

    /// This replica is new: accept an empty data dir and claim it for --node-id. Only for the
    /// first start of an initial member of a brand-new group, or of a replica added under a
    /// never-used id with `seqctl replica add`. Without it an empty data dir is refused: a replica
    /// whose data was lost must come back under a NEW node id (ids are never reused).
    #[arg(long)]
    pub new_replica: bool,

    /// Reach peer ID at ADDR instead of its advertised address (proxies, NAT), comma-separated ID=ADDR.
    #[arg(long, value_delimiter = ',')]
    pub dial: Vec<IdAddr>,

    /// Uids per section (sections share one max_seq). Fixed when the set is bootstrapped.
    #[arg(long, default_value_t = 100_000)]
    pub section_size: u64,

    /// How much one bump raises a section's max_seq. Fixed at bootstrap.
    #[arg(long, default_value_t = 10_000)]
    pub step: u64,

    /// The cluster serves uids in [0, uid_limit). Fixed at bootstrap.
    #[arg(long, default_value_t = 1 << 32)]
    pub uid_limit: u64,

    /// AllocSvr lease length. Fixed at bootstrap.
    #[arg(long, default_value_t = 3_000)]
    pub lease_ms: u64,

    /// How often AllocSvrs renew their lease. Fixed at bootstrap.
    #[arg(long, default_value_t = 500)]
    pub renew_interval_ms: u64,

    /// Bound on clock rate difference between nodes, parts per million (10,000 = 1 %).
    #[arg(long, default_value_t = 10_000)]
    pub drift_ppm: u64,

    /// Safety margin subtracted from (and added to) lease arithmetic.
    #[arg(long, default_value_t = 100)]
    pub margin_ms: u64,

    /// Time-ordered ids: the bit layout, `twitter` (41 time bits of 1 ms, 10 slot bits, 12
    /// sequence bits), `sonyflake` (39 of 10 ms, 16, 8), `javascript` (10 ms ticks, 8 slot bits,
    /// 6 sequence bits: ids stay at most 2^53 - 1 for 174 years from the epoch) or
    /// SLOT_BITS/SEQ_BITS/TICK_MS. Set 0's is fixed when its ids are set up (its first leader after
    /// this version starts); every other set takes set 0's from the cluster map and ignores this.
    #[arg(long, default_value = "twitter")]
    pub id_layout: LayoutShape,

    /// Time-ordered ids: refuse a layout whose ids pass 2^53 - 1 (what a JavaScript number or
    /// `JSON.parse` holds exactly) within 100 years. Implied by `--id-layout javascript`.
    #[arg(long)]
    pub id_js_safe: bool,

    /// Time-ordered ids: tick 0 of the layout, Unix milliseconds (default 2020-01-01T00:00:00Z).
    /// Must not be in the future. Set 0 only, like --id-layout.
    #[arg(long, default_value_t = DEFAULT_EPOCH_MS)]
    pub id_epoch_ms: u64,

    /// Time-ordered ids: slots each set leases; set K has [K × N, (K + 1) × N), so the layout's
    /// slots bound the number of sets (Twitter's 1,024 slots: 16 sets of 64). At most 65,536
    /// (every replica holds each slot of its set's share in memory, 24 bytes a slot). An AllocSvr
    /// holds one or more. Set 0 only, like --id-layout.
    #[arg(long, default_value_t = 64)]
    pub id_slots_per_set: u64,

    /// Time-ordered ids: how far past the store leader's clock a slot's mark may be raised. An
    /// AllocSvr whose clock runs further ahead than this (less its raise window) cannot issue ids
    /// and says why. Set 0 only, like --id-layout.
    #[arg(long, default_value_t = 10_000)]
    pub id_max_ahead_ms: u64,

    /// How counter keys are placed in the uid space, cluster-wide: `sha256` (SHA-256 of the key)
    /// or `slots` (the key's Redis Cluster hash slot, so that Redis Cluster clients reach each
    /// key's owner directly: docs/FRONTENDS.md). Fixed with set 0's id setup; a replica whose
    /// flag disagrees with what its set has stored refuses to run. Every set gives the same.
    #[arg(long, default_value = "sha256")]
    pub key_placement: KeyPlacement,

    /// An AllocSvr that has not renewed for this long is declared dead and its sections move.
    #[arg(long, default_value_t = 2_000)]
    pub detect_ms: u64,

    /// Raft election timeout, lower bound. Keep well below the lease.
    #[arg(long, default_value_t = 300)]
    pub election_min_ms: u64,

    /// Raft election timeout, upper bound.
    #[arg(long, default_value_t = 600)]
    pub election_max_ms: u64,

    /// Raft heartbeat interval.
    #[arg(long, default_value_t = 100)]
    pub heartbeat_ms: u64,

    /// On SIGTERM a leader stops taking writes and hands leadership to a caught-up follower,
    /// waiting at most this long for it to take over before it stops anyway; 0 stops at once
    /// (the followers then elect a leader when their election timers fire).
    #[arg(long, default_value_t = 2_000)]
    pub handoff_ms: u64,

    /// Build a snapshot (and purge the log) after this many entries.
    #[arg(long, default_value_t = 5_000)]
    pub snapshot_logs: u64,

    /// Log entries kept after a snapshot, so a briefly lagging replica catches up from the log
    /// instead of by snapshot.
    #[arg(long, default_value_t = 1_000)]
    pub keep_logs: u64,

    /// Serve Prometheus metrics over HTTP on this address.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,

    /// Calls handled at once, over all connections (Raft peers and health checks not counted);
    /// above it a call waits for a slot, granted round-robin over connections, unless its
    /// connection has no other call in flight (admitted up to twice this). A call that waits over
    /// 200 ms, or finds 4,096 waiting, is refused with RESOURCE_EXHAUSTED (overloaded, retried
    /// after a backoff).
    #[arg(long, default_value_t = serve_limits::STORESVR.max_in_flight)]
    pub max_in_flight: usize,

    /// HTTP/2 streams one connection may have open at once; a client queues calls above it.
    #[arg(long, default_value_t = serve_limits::STORESVR.max_streams_per_connection)]
    pub max_streams_per_connection: u32,

    /// Longest a call may run, in milliseconds; a caller's shorter deadline (grpc-timeout) wins.
    #[arg(long, default_value_t = serve_limits::STORESVR.rpc_timeout.as_millis() as u64)]
    pub rpc_timeout_ms: u64,

    /// Mutual TLS with a `storesvr` certificate: for every port of this replica and every call it
    /// makes to its peers.
    #[command(flatten)]
    pub tls: seqsvr_auth::TlsArgs,

    /// TEST ONLY (negative control): apply bumps, and raises of id slot marks, without checking the
    /// epoch. Breaks P4 and U1.
    #[arg(long, hide = true)]
    pub unsafe_skip_epoch_fence: bool,

    /// TEST ONLY (negative control): a Release ignores the epoch it names. Breaks P1 and P4.
    #[arg(long, hide = true)]
    pub unsafe_unfenced_release: bool,

    /// TEST ONLY (negative control): apply raises of id slot marks without checking the epoch
    /// (bumps keep their fence). Breaks U1.
    #[arg(long, hide = true)]
    pub unsafe_skip_slot_fence: bool,

    /// TEST ONLY (negative control): Raft messages of another set or group, or meant for another
    /// node, are handed to openraft like this group's own. Breaks P3 under a crossed `--peers`.
    #[arg(long, hide = true)]
    pub unsafe_skip_group_check: bool,
    /// TEST ONLY (negative control): Renews, Releases and Bumps are not checked against the
    /// secret their incarnation registered with, so anyone may act in its name. Breaks P1 and P4
    /// under a forger.
    #[arg(long, hide = true)]
    pub unsafe_skip_binding: bool,

    /// TEST ONLY (negative control): a frozen range's final ceilings are handed out at once, before
    /// its owners are provably gone, so the target set may serve while they still do. Breaks P1.
    #[arg(long, hide = true)]
    pub unsafe_skip_move_wait: bool,

    /// TEST ONLY (negative control): a ledger reserve on the leader is answered at once with the
    /// number this replica predicts (its applied `high` plus the reserves it answered since), and
    /// its write goes on in the background: a leader change that loses the write lets the next
    /// leader hand the same number out again. Breaks G1.
    #[arg(long, hide = true)]
    pub unsafe_ledger_answer_before_commit: bool,

    /// TEST ONLY, a clock fault: this replica's wall clock (the one id raises are capped by and
    /// reported to the followers' leader) runs this many ms off the host's (negative: behind).
    /// Leases and Raft timing keep the monotonic clock.
    #[arg(long, hide = true, allow_hyphen_values = true, default_value_t = 0)]
    pub test_clock_offset_ms: i64,

    /// TEST ONLY, a disk fault: while this file exists, every write and sync of the Raft log and
    /// key files fails with ENOSPC (with `eio-sync` in the file: only syncs fail, with EIO).
    /// See `storage/fault.rs` and docs/OPERATIONS.md.
    #[arg(long, hide = true)]
    pub unsafe_disk_fault_file: Option<PathBuf>,
}

impl Config {
    /// The negative controls this replica's state machine runs with.
    pub fn unsafe_rules(&self) -> crate::domain::state::UnsafeRules {
        crate::domain::state::UnsafeRules {
            skip_epoch_fence: self.unsafe_skip_epoch_fence,
            unfenced_release: self.unsafe_unfenced_release,
            skip_binding: self.unsafe_skip_binding,
            skip_slot_fence: self.unsafe_skip_slot_fence,
            // `sim dst` only: no flag starts a real StoreSvr with it.
            predecessor_wait_from_first_renewal: false,
        }
    }
}

impl Config {
    /// Checks relations between values; the error names the option to fix.
    pub fn validate(&self) -> Result<(), String> {
        let err = |m: String| Err(m);
        if self.node_id == 0 {
            return err("--node-id must be > 0".into());
        }
        self.set_params()
            .validate()
            .map_err(|e| format!("--{}: {}", flag_of(e.field), e.why))?;
        if self.election_min_ms >= self.election_max_ms {
            return err("--election-min-ms must be below --election-max-ms".into());
        }
        if self.heartbeat_ms == 0 || self.heartbeat_ms * 2 > self.election_min_ms {
            return err("--heartbeat-ms must be > 0 and at most half of --election-min-ms".into());
        }
        if self.election_max_ms * 2 > self.lease_ms {
            return err(format!(
                "--election-max-ms ({}) must be at most half of --lease-ms ({}): a leader change must not cost AllocSvrs their lease",
                self.election_max_ms, self.lease_ms
            ));
        }
        if self.detect_ms < self.renew_interval_ms * 2 {
            return err("--detect-ms must be at least twice --renew-interval-ms".into());
        }
        self.validate_ids(unix_now_ms())?;
        if self.snapshot_logs == 0 {
            return err("--snapshot-logs must be > 0".into());
        }
        self.serve_limits().check()?;
        unique_ids("--peers", &self.peers)?;
        unique_ids("--dial", &self.dial)?;
        if self.bootstrap && !self.peers.iter().any(|p| p.id.0 == self.node_id) {
            return err(format!(
                "--bootstrap needs --peers to include this node ({})",
                self.node_id
            ));
        }
        Ok(())
    }

    /// The time-ordered id flags at `now_ms`: the layout's rules with their arithmetic, a share
    /// for set 0 at least, and an allowance between a second and an hour.
    fn validate_ids(&self, now_ms: u64) -> Result<(), String> {
        let layout = self.id_layout.with_epoch(self.id_epoch_ms);
        let checked = if self.id_layout.js_safe || self.id_js_safe {
            layout.validate_js_safe(now_ms)
        } else {
            layout.validate(now_ms)
        };
        checked.map_err(|e| format!("--id-layout/--id-epoch-ms: {e}"))?;
        // The layout's slots bound the share, and so does what a replica holds per slot.
        let most = layout.slots().min(MAX_ID_SLOTS_PER_SET);
        if self.id_slots_per_set == 0 || self.id_slots_per_set > most {
            return Err(format!(
                "--id-slots-per-set must be in 1..={most} (the layout's {} slot bits make {} slots; a set \
                 leases at most {MAX_ID_SLOTS_PER_SET}, each held in every replica's memory)",
                layout.slot_bits,
                layout.slots(),
            ));
        }
        // An AllocSvr keeps its marks a 2 s window ahead of its clock; the allowance must leave
        // room for that window and a second of skew.
        if !(3_000..=3_600_000).contains(&self.id_max_ahead_ms) {
            return Err(
                "--id-max-ahead-ms must be between 3000 (an AllocSvr's 2 s raise window and a second of skew) and \
                 3600000 (an hour)"
                    .into(),
            );
        }
        Ok(())
    }

    /// The limits the replica's server runs with (`seqsvr_plumbing::serve_limits`).
    pub fn serve_limits(&self) -> ServeLimits {
        ServeLimits {
            max_in_flight: self.max_in_flight,
            max_streams_per_connection: self.max_streams_per_connection,
            rpc_timeout: std::time::Duration::from_millis(self.rpc_timeout_ms),
        }
    }

    /// The set's parameters these options give (written at bootstrap; the stored ones apply after).
    /// Only set 0 owns sections from the start (all of them); the others begin empty.
    pub fn set_params(&self) -> SetParams {
        let total = self.uid_limit.div_ceil(self.section_size.max(1));
        SetParams {
            set_id: self.set_id,
            section_size: self.section_size,
            uid_limit: self.uid_limit,
            step: self.step,
            lease_ms: self.lease_ms,
            renew_interval_ms: self.renew_interval_ms,
            drift_ppm: self.drift_ppm,
            margin_ms: self.margin_ms,
            section_begin: 0,
            section_end: if self.set_id == 0 { total } else { 0 },
        }
    }

    /// The id setup set 0 writes once (`None` for the other sets, which take set 0's from the map).
    pub fn id_setup(&self) -> Option<SlotCommand> {
        (self.set_id == 0).then(|| {
            SlotCommand::setup(
                self.id_layout.with_epoch(self.id_epoch_ms),
                self.id_slots_per_set,
                self.id_max_ahead_ms,
                self.key_placement,
            )
        })
    }

    /// The initial voters, by node id.
    pub fn peer_map(&self) -> BTreeMap<u64, String> {
        id_addr_map(&self.peers)
    }

    /// Addresses that override peers' own (proxies, NAT), by node id.
    pub fn dial_map(&self) -> BTreeMap<u64, String> {
        id_addr_map(&self.dial)
    }
}

/// The test-only offset of [`unix_now_ms`] (`--test-clock-offset-ms`): process-wide, as the host's
/// clock is; set once at start.
static CLOCK_OFFSET_MS: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

/// Sets the process's test clock offset (`--test-clock-offset-ms`).
pub(crate) fn set_test_clock_offset_ms(ms: i64) {
    CLOCK_OFFSET_MS.store(ms, std::sync::atomic::Ordering::Relaxed);
}

/// This host's wall clock, Unix milliseconds (0 before 1970): the one reading of it the id
/// checks, the RaiseMarks cap, the clock replies to peers and restores share.
pub(crate) fn unix_now_ms() -> u64 {
    let host = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    host.saturating_add(CLOCK_OFFSET_MS.load(std::sync::atomic::Ordering::Relaxed))
        .max(0) as u64
}

fn id_addr_map(list: &[IdAddr]) -> BTreeMap<u64, String> {
    list.iter().map(|p| (p.id.0, p.addr.to_string())).collect()
}

/// The option that sets a field of the set's parameters.
fn flag_of(field: &str) -> String {
    match field {
        "sections" => "uid-limit".into(),
        f => f.replace('_', "-"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Vec<&'static str> {
        vec![
            "storesvr",
            "--node-id",
            "1",
            "--listen",
            "127.0.0.1:7001",
            "--data-dir",
            "/tmp/x",
            "--set-id",
            "0",
        ]
    }

    fn check(extra: &[&str]) -> Result<(), String> {
        let mut args = base();
        args.extend_from_slice(extra);
        seqsvr_plumbing::cli::try_parse_from::<Config, _, _>(ENV_PREFIX, args)
            .map_err(|e| e.to_string())?
            .validate()
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(check(&[]), Ok(()));
    }

    #[test]
    fn bad_relations_are_refused_with_the_option_named() {
        let cases: &[(&[&str], &str)] = &[
            (&["--node-id", "0"], "--node-id"),
            (&["--step", "0"], "--step"),
            (&["--renew-interval-ms", "2000"], "--renew-interval-ms"),
            (&["--election-max-ms", "2000"], "--election-max-ms"),
            (&["--election-min-ms", "700"], "--election-min-ms"),
            (&["--margin-ms", "1000"], "--margin-ms"),
            (&["--section-size", "1"], "--section-size"),
            (&["--bootstrap", "--peers", "2=127.0.0.1:1"], "--bootstrap"),
            (&["--peers", "x=127.0.0.1:1"], "--peers"),
            (&["--peers", "2=nowhere"], "--peers"),
            (&["--dial", "2=127.0.0.1:1,2=127.0.0.1:2"], "--dial"),
            (&["--max-in-flight", "0"], "--max-in-flight"),
            (&["--max-streams-per-connection", "0"], "--max-streams-per-connection"),
            (&["--rpc-timeout-ms", "0"], "--rpc-timeout-ms"),
        ];
        for (extra, flag) in cases {
            let e = check(extra).expect_err(flag);
            assert!(e.contains(flag), "{extra:?}: {e}");
        }
    }

    /// A layout of 33 slot bits passes the layout's own rules (29 time bits of 1 s last 17 years),
    /// so only the bound on a set's share stops 2^33 slots a set, which every replica would try to
    /// allocate when it applies the setup.
    #[test]
    fn slots_per_set_are_bounded_by_memory_not_only_by_the_layout() {
        let wide = ["--id-layout", "33/1/1000", "--id-slots-per-set"];
        for too_many in ["8589934592", "65537"] {
            let e = check(&[&wide[..], &[too_many]].concat()).expect_err(too_many);
            assert!(
                e.contains("--id-slots-per-set") && e.contains("65536"),
                "{too_many}: {e}"
            );
        }
        assert_eq!(check(&[&wide[..], &["65536"]].concat()), Ok(()));
        assert_eq!(
            check(&["--id-layout", "sonyflake", "--id-slots-per-set", "65536"]),
            Ok(())
        );
        let e = check(&["--id-slots-per-set", "2048"]).expect_err("past Twitter's 1,024 slots");
        assert!(e.contains("1..=1024"), "{e}");
    }

    /// `--id-layout javascript` and `--id-js-safe` refuse a layout whose ids pass 2^53 - 1 within
    /// a century; the preset itself passes.
    #[test]
    fn javascript_safe_layouts_are_checked_against_53_bits() {
        assert_eq!(check(&["--id-layout", "javascript"]), Ok(()));
        let e = check(&["--id-js-safe"]).expect_err("twitter's ids pass 2^53 in days");
        assert!(e.contains("--id-layout") && e.contains("JavaScript"), "{e}");
        assert_eq!(check(&["--id-js-safe", "--id-layout", "8/6/10"]), Ok(()));
        let e = check(&["--id-js-safe", "--id-layout", "8/7/10"]).expect_err("87 years from 2020");
        assert!(e.contains("at least 100 are needed"), "{e}");
    }
}
