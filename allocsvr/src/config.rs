//! Configuration: command-line flags (also read from the environment) and the set's parameters
//! handed out at registration, both validated once, before anything is served.
//!
//! Parsing (clap) is kept apart from validation ([`Cli::validate`], [`Params::from_proto`]) so
//! that the library can be started in-process with a [`NodeConfig`] built by hand.
//!
//! Deliberately left out: section size, step and lease timings as flags. Every AllocSvr of a set
//! must agree on them, so they come from the store (`RegisterReply.params`).

use std::net::SocketAddr;
use std::ops::Range;
use std::time::Duration;

use clap::Parser;
use seqsvr_client::store::Seed;
use seqsvr_proto::NodeId;
use seqsvr_proto::pb;
use seqsvr_proto::types::section_count;

use crate::lease::LeaseTimings;

/// Largest accepted `section_size`: one touched section costs 8 bytes per uid.
const MAX_SECTION_SIZE: u64 = 1 << 24;

/// Command-line flags of the `allocsvr` binary.
#[derive(Debug, Parser)]
#[command(
    name = "allocsvr",
    version,
    about = "seqsvr AllocSvr: hands out per-uid sequence numbers from memory"
)]
pub struct Cli {
    /// Stable id of this AllocSvr slot (> 0); a restarted process keeps it but gets a new incarnation.
    #[arg(long, env = "ALLOCSVR_NODE_ID")]
    pub node_id: u64,
    /// Address the data-plane gRPC server binds, ip:port.
    #[arg(long, env = "ALLOCSVR_LISTEN")]
    pub listen: String,
    /// Address put in the route table for clients, host:port (defaults to --listen).
    #[arg(long, env = "ALLOCSVR_ADVERTISE")]
    pub advertise: Option<String>,
    /// StoreSvr replicas of the set, comma-separated `addr` or `id=addr`.
    #[arg(long, env = "ALLOCSVR_STORE")]
    pub store: String,
    /// Serve Prometheus metrics over HTTP on this ip:port.
    #[arg(long, env = "ALLOCSVR_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// Give up starting when no StoreSvr accepted the registration within this many milliseconds.
    #[arg(long, env = "ALLOCSVR_START_TIMEOUT_MS", default_value_t = 30_000)]
    pub start_timeout_ms: u64,
    /// TEST ONLY, breaks P1: serve a gained section without the lease wait.
    #[arg(long, hide = true)]
    pub unsafe_skip_lease_wait: bool,
    /// TEST ONLY, breaks P2: serve above the acknowledged ceiling without waiting for the bump.
    #[arg(long, hide = true)]
    pub unsafe_serve_before_bump_ack: bool,
    /// TEST ONLY, breaks P1: keep cur_seq memory of a section across losing and regaining it.
    #[arg(long, hide = true)]
    pub unsafe_keep_memory: bool,
    /// TEST ONLY, a network fault: send every Release once more, at a random time between N
    /// and 2N ms after the first (a late duplicate, as a retry after a lost reply would be).
    #[arg(long, hide = true)]
    pub test_repeat_releases_after_ms: Option<u64>,
}

/// Negative controls: each breaks exactly one rule of DESIGN.md §4 so that the simulator can
/// prove its checkers fail. All off by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnsafeSwitches {
    /// Rule 4 off: a gained section is served at once.
    pub skip_lease_wait: bool,
    /// Rule 6 off: an in-flight bump counts as acknowledged.
    pub serve_before_bump_ack: bool,
    /// Rule 5 off: memory of an earlier epoch is reused on regain.
    pub keep_memory: bool,
}

impl UnsafeSwitches {
    /// Whether any negative control is on (logged loudly at start).
    pub fn any(&self) -> bool {
        self.skip_lease_wait || self.serve_before_bump_ack || self.keep_memory
    }
}

/// Validated configuration of one AllocSvr process.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Stable id of this slot.
    pub node_id: NodeId,
    /// Where the data-plane server binds (port 0 picks a free port; see `Node::local_addr`).
    pub listen: SocketAddr,
    /// Address registered in the route table; `None` = the bound address.
    pub advertise: Option<String>,
    /// StoreSvr replicas of the set.
    pub store: Vec<Seed>,
    /// Longest time to wait for the first registration.
    pub start_timeout: Duration,
    /// Negative controls (test only).
    pub unsafe_switches: UnsafeSwitches,
    /// Test only: send every Release again this long (up to twice this) after the first.
    pub repeat_releases_after: Option<Duration>,
}

impl NodeConfig {
    /// A config with default timings, for in-process use.
    pub fn new(node_id: NodeId, listen: SocketAddr, store: Vec<Seed>) -> Self {
        Self {
            node_id,
            listen,
            advertise: None,
            store,
            start_timeout: Duration::from_secs(30),
            unsafe_switches: UnsafeSwitches::default(),
            repeat_releases_after: None,
        }
    }
}

/// What the binary runs: the node config plus process-level options.
#[derive(Debug, Clone)]
pub struct BinaryConfig {
    pub node: NodeConfig,
    /// Prometheus HTTP listener, if any.
    pub metrics_listen: Option<SocketAddr>,
}

fn check_host_port(what: &str, s: &str) -> Result<(), String> {
    match s.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(()),
        _ => Err(format!("{what} {s:?} is not host:port")),
    }
}

impl Cli {
    /// Checks every flag and builds the config; the error says which flag is wrong and why.
    pub fn validate(self) -> Result<BinaryConfig, String> {
        if self.node_id == 0 {
            return Err("--node-id must be > 0".into());
        }
        let listen: SocketAddr = self
            .listen
            .parse()
            .map_err(|e| format!("--listen {:?} is not ip:port: {e}", self.listen))?;
        if let Some(a) = &self.advertise {
            check_host_port("--advertise", a)?;
        }
        let store = Seed::parse_list(&self.store).map_err(|e| format!("--store: {e}"))?;
        let metrics_listen = self
            .metrics_listen
            .map(|m| {
                m.parse::<SocketAddr>()
                    .map_err(|e| format!("--metrics-listen {m:?} is not ip:port: {e}"))
            })
            .transpose()?;
        if self.start_timeout_ms == 0 {
            return Err("--start-timeout-ms must be > 0".into());
        }
        Ok(BinaryConfig {
            node: NodeConfig {
                node_id: NodeId(self.node_id),
                listen,
                advertise: self.advertise,
                store,
                start_timeout: Duration::from_millis(self.start_timeout_ms),
                unsafe_switches: UnsafeSwitches {
                    skip_lease_wait: self.unsafe_skip_lease_wait,
                    serve_before_bump_ack: self.unsafe_serve_before_bump_ack,
                    keep_memory: self.unsafe_keep_memory,
                },
                repeat_releases_after: self.test_repeat_releases_after_ms.map(Duration::from_millis),
            },
            metrics_listen,
        })
    }
}

/// The set's parameters (`SetParams`), validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Params {
    pub set_id: u64,
    pub section_size: u64,
    pub uid_limit: u64,
    pub step: u64,
    pub timings: LeaseTimings,
    /// How often the lease is renewed.
    pub renew_interval: Duration,
    /// Sections this set serves.
    pub sections: Range<u64>,
}

impl Params {
    /// Refuses parameters that would make the lease protocol unsafe or the memory unbounded.
    pub fn from_proto(p: &pb::SetParams) -> Result<Self, String> {
        let bad = |why: String| Err(format!("store sent bad set params ({why}): {p:?}"));
        if p.section_size == 0 || p.section_size > MAX_SECTION_SIZE {
            return bad(format!("section_size must be in 1..={MAX_SECTION_SIZE}"));
        }
        if p.uid_limit == 0 {
            return bad("uid_limit must be > 0".into());
        }
        if p.step == 0 {
            return bad("step must be > 0".into());
        }
        if p.drift_ppm >= 1_000_000 {
            return bad("drift_ppm must be < 1,000,000".into());
        }
        if p.lease_ms == 0 || p.margin_ms >= p.lease_ms {
            return bad("need 0 <= margin_ms < lease_ms".into());
        }
        let timings = LeaseTimings {
            lease: Duration::from_millis(p.lease_ms),
            drift_ppm: p.drift_ppm,
            margin: Duration::from_millis(p.margin_ms),
        };
        let renew_interval = Duration::from_millis(p.renew_interval_ms);
        if renew_interval.is_zero() || renew_interval >= timings.owner_validity() {
            return bad("need 0 < renew_interval_ms < lease·(1−drift) − margin".into());
        }
        let Some(range) = &p.sections else {
            return bad("no section range".into());
        };
        let total = section_count(p.uid_limit, p.section_size);
        if range.begin >= range.end || range.end > total {
            return bad(format!("section range must be non-empty and within 0..{total}"));
        }
        Ok(Self {
            set_id: p.set_id,
            section_size: p.section_size,
            uid_limit: p.uid_limit,
            step: p.step,
            timings,
            renew_interval,
            sections: range.begin..range.end,
        })
    }

    /// Number of sections of the set.
    pub fn section_count(&self) -> usize {
        (self.sections.end - self.sections.start) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(args: &[&str]) -> Result<BinaryConfig, String> {
        let mut argv = vec!["allocsvr"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).map_err(|e| e.to_string())?.validate()
    }

    #[test]
    fn flags_are_validated_with_clear_messages() {
        let good = ["--node-id", "1", "--listen", "127.0.0.1:0", "--store", "1=127.0.0.1:5"];
        let c = cli(&good).unwrap();
        assert_eq!(c.node.node_id, NodeId(1));
        assert!(!c.node.unsafe_switches.any());
        let cases: [(&[&str], &str); 6] = [
            (
                &["--node-id", "0", "--listen", "127.0.0.1:0", "--store", "a:1"],
                "--node-id",
            ),
            (&["--node-id", "1", "--listen", "nowhere", "--store", "a:1"], "--listen"),
            (&["--node-id", "1", "--listen", "127.0.0.1:0", "--store", ""], "--store"),
            (
                &["--node-id", "1", "--listen", "127.0.0.1:0", "--store", "x=a:1"],
                "--store",
            ),
            (
                &[
                    "--node-id",
                    "1",
                    "--listen",
                    "127.0.0.1:0",
                    "--store",
                    "a:1",
                    "--advertise",
                    "a",
                ],
                "--advertise",
            ),
            (
                &[
                    "--node-id",
                    "1",
                    "--listen",
                    "127.0.0.1:0",
                    "--store",
                    "a:1",
                    "--metrics-listen",
                    "x",
                ],
                "--metrics-listen",
            ),
        ];
        for (args, flag) in cases {
            let err = cli(args).unwrap_err();
            assert!(err.contains(flag), "{args:?}: {err}");
        }
        let mut unsafe_args = good.to_vec();
        unsafe_args.push("--unsafe-keep-memory");
        let c = cli(&unsafe_args).unwrap();
        assert!(c.node.unsafe_switches.keep_memory && c.node.unsafe_switches.any());
    }

    fn params() -> pb::SetParams {
        pb::SetParams {
            set_id: 0,
            section_size: 100_000,
            uid_limit: 1 << 32,
            step: 10_000,
            lease_ms: 3_000,
            renew_interval_ms: 500,
            drift_ppm: 10_000,
            margin_ms: 100,
            sections: Some(pb::SectionRange { begin: 0, end: 42_950 }),
        }
    }

    #[test]
    fn set_params_are_validated() {
        let p = Params::from_proto(&params()).unwrap();
        assert_eq!(p.section_count(), 42_950);
        type Mutate = fn(&mut pb::SetParams);
        let cases: [(Mutate, &str); 8] = [
            (|p| p.section_size = 0, "section_size"),
            (|p| p.uid_limit = 0, "uid_limit"),
            (|p| p.step = 0, "step"),
            (|p| p.margin_ms = 3_000, "margin"),
            (|p| p.renew_interval_ms = 3_000, "renew_interval"),
            (|p| p.drift_ppm = 1_000_000, "drift"),
            (|p| p.sections = None, "section range"),
            (
                |p| p.sections = Some(pb::SectionRange { begin: 0, end: 42_951 }),
                "section range",
            ),
        ];
        for (mutate, what) in cases {
            let mut p = params();
            mutate(&mut p);
            let err = Params::from_proto(&p).unwrap_err();
            assert!(err.contains(what), "{what}: {err}");
        }
    }
}
