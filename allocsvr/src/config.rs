//! Configuration: the binary's options (flags, `ALLOCSVR_*` environment variables or a TOML
//! config file, through `seqsvr_plumbing::cli`), validated once, before anything is served.
//!
//! Parsing (clap, with typed addresses) is kept apart from validation ([`Cli::validate`]) so that
//! the library can be started in-process with a [`NodeConfig`] built by hand.
//!
//! Deliberately left out: section size, step and lease timings as options. Every AllocSvr of a set
//! must agree on them, so they come from the store (`RegisterReply.params`, checked by
//! `seqsvr_proto::params`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use seqsvr_control::Seed;
use seqsvr_plumbing::lease_clock::LeaseClock;
use seqsvr_plumbing::serve_limits::{self, ServeLimits};
use seqsvr_proto::NodeId;
use seqsvr_proto::addr::HostPort;

/// Prefix of the environment variables of the `allocsvr` binary's options.
pub const ENV_PREFIX: &str = "ALLOCSVR";

/// How often a busy worker of [`runtime`](crate::node::runtime) looks for new IO, in tasks
/// polled (tokio's default is 61). Under a flood the run queue never empties, and a well-behaved
/// caller's request is noticed only at the next look, then queued behind what that look found. In
/// docs/benchmarks/overload.md's flood (b) on one core (in-flight limit 4) the caller's p99 was
/// 1.1–1.8 ms at 61 and 0.4–0.9 ms at 7, against 0.3–0.6 ms unloaded. The cost is one
/// `epoll_wait` per 7 polls while busy; an idle worker waits on the IO driver either way.
pub const EVENT_INTERVAL: u32 = 7;

/// Options of the `allocsvr` binary.
#[derive(Debug, Parser)]
#[command(
    name = "allocsvr",
    version = seqsvr_plumbing::version::LONG,
    about = "seqsvr AllocSvr: hands out per-uid sequence numbers from memory"
)]
pub struct Cli {
    /// Read options from this TOML file (`node_id = 1`, `store = "1=10.0.0.1:7000,…"`); flags and
    /// environment variables override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Stable id of this AllocSvr slot (> 0); a restarted process keeps it but gets a new incarnation.
    #[arg(long)]
    pub node_id: u64,
    /// Address the data-plane gRPC server binds, ip:port.
    #[arg(long)]
    pub listen: SocketAddr,
    /// Address put in the route table for clients, host:port (defaults to --listen; required when
    /// --listen is a wildcard such as 0.0.0.0, which no client can dial).
    #[arg(long)]
    pub advertise: Option<HostPort>,
    /// StoreSvr replicas of the set, comma-separated `host:port` or `id=host:port`.
    #[arg(long)]
    pub store: String,
    /// Serve Prometheus metrics over HTTP on this ip:port.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// Give up starting when no StoreSvr accepted the registration within this many milliseconds.
    #[arg(long, default_value_t = 30_000)]
    pub start_timeout_ms: u64,
    /// Calls handled at once, over all connections (default: 32 per CPU); above it a call waits
    /// for a slot, granted round-robin over connections, unless its connection has no other call
    /// in flight (admitted up to twice this). A call that waits over 200 ms, or finds 4,096
    /// waiting, is refused with RESOURCE_EXHAUSTED (overloaded, retried after a backoff).
    #[arg(long, default_value_t = serve_limits::allocsvr().max_in_flight)]
    pub max_in_flight: usize,
    /// HTTP/2 streams one connection may have open at once; a client queues calls above it.
    #[arg(long, default_value_t = serve_limits::allocsvr().max_streams_per_connection)]
    pub max_streams_per_connection: u32,
    /// Longest a call may run, in milliseconds; a caller's shorter deadline (grpc-timeout) wins.
    #[arg(long, default_value_t = serve_limits::allocsvr().rpc_timeout.as_millis() as u64)]
    pub rpc_timeout_ms: u64,
    /// Named counters' keys held in memory at most, over all owned sections. A section that would
    /// add a key past it (or past --max-live-key-bytes) forgets its own keys; each of those then
    /// restarts above everything the section issued (a gap, never a repeat).
    #[arg(long, default_value_t = DEFAULT_MAX_LIVE_KEYS)]
    pub max_live_keys: usize,
    /// Bytes of named counters' keys held in memory at most, over all owned sections: each
    /// section's key map and the names longer than 24 bytes (held on the heap). A key of up to
    /// 24 bytes costs about 40–75 bytes, a 256-byte key about 300 (allocator headers not counted).
    /// Past it, as past --max-live-keys.
    #[arg(long, default_value_t = DEFAULT_MAX_LIVE_KEY_BYTES)]
    pub max_live_key_bytes: usize,
    /// Serve HTTP/JSON on this ip:port (`POST /v1/seq/{uid}/next`, `/v1/counter/{key}/next`,
    /// `/v1/ids`, …); a call for a uid or key another AllocSvr owns is forwarded to it. HTTPS with
    /// mutual TLS under --tls-* (a `client` or `admin` certificate).
    #[arg(long)]
    pub http_listen: Option<SocketAddr>,
    /// Serve the Redis protocol on this ip:port (`INCR name`, `INCRBY`, `GET`, `MGET`, `NEXTID`;
    /// `u:42` names uid 42, any other name a counter); forwarded like --http-listen. Mutual TLS
    /// under --tls-*.
    #[arg(long)]
    pub resp_listen: Option<SocketAddr>,
    /// Serve the Redis Cluster protocol on this ip:port: as --resp-listen, but a counter key whose
    /// hash slot another AllocSvr serves is answered `-MOVED <slot> <its cluster port>`, and
    /// `CLUSTER SLOTS` names every slot's owner, so that a Redis Cluster client (`redis-cli -c`,
    /// redis-py `RedisCluster`) sends each key to its owner. Needs a cluster set up with
    /// `storesvr --key-placement slots` (elsewhere its cluster commands are refused and it
    /// forwards). Same password and TLS as --resp-listen.
    #[arg(long)]
    pub resp_cluster_listen: Option<SocketAddr>,
    /// Password every Redis-protocol connection must give with AUTH (user `default`); not with
    /// --tls-*, where the certificate decides.
    #[arg(long)]
    pub resp_password: Option<String>,
    /// Close a Redis-protocol connection that has authenticated (or sent a command) and then
    /// sends nothing for this many seconds, as Redis's `timeout`; 0, the default, never does.
    #[arg(long, default_value_t = 0)]
    pub resp_idle_timeout_secs: u64,
    /// Most Redis-protocol connections at once that have not yet authenticated (or, without a
    /// password, sent a first command); each has 10 s to do so. Silent sockets fill only this.
    #[arg(long, default_value_t = 1_000)]
    pub resp_max_unauthenticated: usize,
    /// Longest one HTTP or Redis call may take, retries and forwarding included, in milliseconds
    /// (an HTTP caller's shorter `x-seqsvr-timeout-ms` wins).
    #[arg(long, default_value_t = 2_000)]
    pub front_deadline_ms: u64,
    /// Where the direct forwarding hop listens: ip:port, or `off`. Other AllocSvrs' front ends
    /// send it the single takes (`next`, `INCR`) they forward here, in a small binary frame
    /// instead of a gRPC call (they find the port by asking this node). By default a free port
    /// on --listen's address; `off`, or any --tls-* setting, forwards those over gRPC only.
    #[arg(long)]
    pub hop_listen: Option<String>,
    /// How often a busy worker thread looks for new network events, in tasks run (1 to 1,000;
    /// tokio's own default is 61). Lower notices a new call sooner while the server is flooded,
    /// at one more `epoll_wait` per that many tasks; docs/journal/benchmarks-2026-11.md has both
    /// measured.
    #[arg(long, default_value_t = EVENT_INTERVAL)]
    pub event_interval: u32,
    /// Mutual TLS with an `allocsvr` certificate: for the data plane and every store call.
    #[command(flatten)]
    pub tls: seqsvr_auth::TlsArgs,
    /// TEST ONLY, breaks P1: serve a gained section without the lease wait.
    #[arg(long, hide = true)]
    pub unsafe_skip_lease_wait: bool,
    /// TEST ONLY, breaks P2: serve above the acknowledged ceiling without waiting for the bump.
    #[arg(long, hide = true)]
    pub unsafe_serve_before_bump_ack: bool,
    /// TEST ONLY, breaks P1: keep cur_seq memory of a section across losing and regaining it.
    #[arg(long, hide = true)]
    pub unsafe_keep_memory: bool,
    /// TEST ONLY, breaks P1: a block of seqs starts at the uid's last seq instead of above it.
    #[arg(long, hide = true)]
    pub unsafe_block_overlap: bool,
    /// TEST ONLY, breaks P6 for keys: every counter key of a section shares one `cur_seq`.
    #[arg(long, hide = true)]
    pub unsafe_keys_share_seq: bool,
    /// TEST ONLY, breaks P1 for keys: keys forgotten for the memory bound restart at the
    /// section's loaded base, below values they were given.
    #[arg(long, hide = true)]
    pub unsafe_keys_forget_to_base: bool,
    /// TEST ONLY, breaks U1: a slot's new holder issues from its own clock, not above the mark the
    /// store reported (its floor).
    #[arg(long, hide = true)]
    pub unsafe_ids_ignore_floor: bool,
    /// TEST ONLY, breaks U1: issue time-ordered ids above the acknowledged mark.
    #[arg(long, hide = true)]
    pub unsafe_ids_ignore_mark: bool,
    /// TEST ONLY, a clock fault: the clock time-ordered ids are issued by runs this many
    /// milliseconds off the host's (negative: behind). Leases keep the host's clock.
    #[arg(long, hide = true, allow_hyphen_values = true, default_value_t = 0)]
    pub test_clock_offset_ms: i64,
    /// TEST ONLY, a clock fault: re-read this file every 50 ms; a number of milliseconds in it is
    /// the ids' clock offset from then on (the simulator steps a running process's clock so).
    #[arg(long, hide = true)]
    pub test_clock_file: Option<std::path::PathBuf>,
    /// TEST ONLY, a network fault: send every Release once more, at a random time between N
    /// and 2N ms after the first (a late duplicate, as a retry after a lost reply would be).
    #[arg(long, hide = true)]
    pub test_repeat_releases_after_ms: Option<u64>,
}

/// Negative controls: each breaks exactly one ownership rule of docs/DESIGN.md so that the simulator can
/// prove its checkers fail. All off by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnsafeRules {
    /// Rule 4 off: a gained section is served at once.
    pub skip_lease_wait: bool,
    /// Rule 6 off: an in-flight bump counts as acknowledged.
    pub serve_before_bump_ack: bool,
    /// Rule 5 off: memory of an earlier epoch is reused on regain.
    pub keep_memory: bool,
    /// Time-ordered ids: issue from the clock, not above the floor; issue above the acknowledged
    /// mark.
    pub ids: crate::ids::issuer::UnsafeIssuing,
    /// A block (`Reserve`) starts at the uid's last seq, overlapping what it was given before.
    pub block_overlap: bool,
    /// Counter keys of a section share one `cur_seq`; forgotten keys restart at the base.
    pub keys_share_seq: bool,
    pub keys_forget_to_base: bool,
}

impl UnsafeRules {
    /// Whether any negative control is on (logged loudly at start).
    pub fn any(&self) -> bool {
        self.skip_lease_wait
            || self.serve_before_bump_ack
            || self.keep_memory
            || self.block_overlap
            || self.keys_share_seq
            || self.keys_forget_to_base
            || self.ids != crate::ids::issuer::UnsafeIssuing::default()
    }
}

/// Default of `--max-live-keys`: 150–300 MB of keys of up to 24 bytes, as the maps fill and double.
pub const DEFAULT_MAX_LIVE_KEYS: usize = 4_000_000;

/// Default of `--max-live-key-bytes`, 256 MiB: about what the default count of short keys takes,
/// so that long keys cannot take five times that (4,000,000 keys of 256 bytes: 1.2 GB).
pub const DEFAULT_MAX_LIVE_KEY_BYTES: usize = 256 << 20;

/// Validated configuration of one AllocSvr process.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Stable id of this slot.
    pub node_id: NodeId,
    /// Where the data-plane server binds (port 0 picks a free port; see `Node::local_addr`).
    pub listen: SocketAddr,
    /// Address registered in the route table; `None` = the bound address.
    pub advertise: Option<HostPort>,
    /// StoreSvr replicas of the set.
    pub store: Vec<Seed>,
    /// Longest time to wait for the first registration.
    pub start_timeout: Duration,
    /// Negative controls (test only).
    pub unsafe_rules: UnsafeRules,
    /// Test only: send every Release again this long (up to twice this) after the first.
    pub repeat_releases_after: Option<Duration>,
    /// Calls in flight, streams per connection and the longest call (`seqsvr_plumbing::serve_limits`).
    pub serve_limits: ServeLimits,
    /// Mutual TLS (an `allocsvr` certificate) on the data plane and to the store; plaintext when unset.
    pub tls: Option<std::sync::Arc<seqsvr_auth::Tls>>,
    /// The clock every lease deadline is read on: the host's, counting suspended time; tests and
    /// the simulator script one to suspend or skew a node.
    pub lease_clock: LeaseClock,
    /// The clock time-ordered ids are stamped with: the host's, off by a test-only offset.
    pub id_clock: crate::ids::clock::IdClock,
    /// Test only: a file whose number of ms the ids' clock offset follows while the node runs.
    pub id_clock_file: Option<std::path::PathBuf>,
    /// Counter keys held in memory at most (see `section`).
    pub max_live_keys: usize,
    /// Bytes of counter keys held in memory at most (see `section::KeyBudget`).
    pub max_live_key_bytes: usize,
    /// The HTTP/JSON and Redis-protocol front ends (none by default).
    pub front: FrontConfig,
    /// Where the direct forwarding hop listens (`crate::hop`); `None`: it does not run.
    pub hop_listen: Option<SocketAddr>,
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
            unsafe_rules: UnsafeRules::default(),
            repeat_releases_after: None,
            serve_limits: serve_limits::allocsvr(),
            tls: None,
            lease_clock: LeaseClock::host(),
            id_clock: crate::ids::clock::IdClock::host(),
            id_clock_file: None,
            max_live_keys: DEFAULT_MAX_LIVE_KEYS,
            max_live_key_bytes: DEFAULT_MAX_LIVE_KEY_BYTES,
            front: FrontConfig::default(),
            hop_listen: Some(SocketAddr::new(listen.ip(), 0)),
        }
    }
}

/// What the binary runs: the node config plus process-level options.
#[derive(Debug, Clone)]
pub struct BinaryConfig {
    pub node: NodeConfig,
    /// Prometheus HTTP listener, if any.
    pub metrics_listen: Option<SocketAddr>,
    /// The runtime's event interval (`--event-interval`).
    pub event_interval: u32,
}

/// What the front ends of one node are: where they listen, how long a call may take.
#[derive(Debug, Clone)]
pub struct FrontConfig {
    /// HTTP/JSON on this address.
    pub http: Option<SocketAddr>,
    /// The Redis protocol on this address.
    pub resp: Option<SocketAddr>,
    /// The Redis Cluster protocol on this address (`crate::cluster`).
    pub resp_cluster: Option<SocketAddr>,
    /// The Redis front end's `default` user's password.
    pub resp_password: Option<String>,
    /// The Redis front end's idle timeout (`None`: never).
    pub resp_idle_timeout: Option<Duration>,
    /// The Redis front end's cap on connections not yet admitted.
    pub resp_max_unauthenticated: usize,
    /// Longest one front-end call may take, retries and forwarding included (`None`: the client
    /// library's default of 5 s).
    pub deadline: Option<Duration>,
}

impl Default for FrontConfig {
    fn default() -> Self {
        let resp = seqsvr_frontends::resp::RespConfig::default();
        Self {
            http: None,
            resp: None,
            resp_cluster: None,
            resp_password: None,
            resp_idle_timeout: resp.idle_timeout,
            resp_max_unauthenticated: resp.max_unauthenticated,
            deadline: None,
        }
    }
}

impl FrontConfig {
    pub fn any(&self) -> bool {
        self.http.is_some() || self.resp.is_some() || self.resp_cluster.is_some()
    }
}

impl Cli {
    /// The flags that are numbers with a range of their own.
    fn check_numbers(&self) -> Result<(), String> {
        if self.node_id == 0 {
            return Err("--node-id must be > 0".into());
        }
        if self.start_timeout_ms == 0 {
            return Err("--start-timeout-ms must be > 0".into());
        }
        if self.max_live_keys == 0 {
            return Err("--max-live-keys must be > 0".into());
        }
        // Room for a few keys of the longest name in one section's smallest table.
        if self.max_live_key_bytes < 4_096 {
            return Err(format!(
                "--max-live-key-bytes must be at least 4096 (a few 256-byte keys), got {}",
                self.max_live_key_bytes
            ));
        }
        if !(1..=1_000).contains(&self.event_interval) {
            return Err(format!(
                "--event-interval must be in 1..=1000, got {}",
                self.event_interval
            ));
        }
        if self.resp_max_unauthenticated == 0 {
            return Err("--resp-max-unauthenticated must be > 0: no connection could ever authenticate".into());
        }
        Ok(())
    }

    /// Checks every flag and builds the config; the error says which flag is wrong and why.
    pub fn validate(self) -> Result<BinaryConfig, String> {
        self.check_numbers()?;
        let store = Seed::parse_list(&self.store).map_err(|e| format!("--store: {e}"))?;
        check_advertised(self.listen, self.advertise.as_ref())?;
        let serve_limits = ServeLimits {
            max_in_flight: self.max_in_flight,
            max_streams_per_connection: self.max_streams_per_connection,
            rpc_timeout: Duration::from_millis(self.rpc_timeout_ms),
        };
        serve_limits.check()?;
        let tls = self
            .tls
            .load(Some(seqsvr_auth::Role::AllocSvr))
            .map_err(|e| e.to_string())?;
        let front = FrontConfig {
            http: self.http_listen,
            resp: self.resp_listen,
            resp_cluster: self.resp_cluster_listen,
            resp_password: self.resp_password,
            resp_idle_timeout: (self.resp_idle_timeout_secs > 0)
                .then(|| Duration::from_secs(self.resp_idle_timeout_secs)),
            resp_max_unauthenticated: self.resp_max_unauthenticated,
            deadline: Some(Duration::from_millis(self.front_deadline_ms)),
        };
        check_front(&front, tls.is_some(), self.front_deadline_ms)?;
        let hop_listen = hop_listen(self.hop_listen.as_deref(), self.listen, tls.is_some())?;
        Ok(BinaryConfig {
            node: NodeConfig {
                node_id: NodeId(self.node_id),
                listen: self.listen,
                advertise: self.advertise,
                store,
                start_timeout: Duration::from_millis(self.start_timeout_ms),
                unsafe_rules: UnsafeRules {
                    skip_lease_wait: self.unsafe_skip_lease_wait,
                    serve_before_bump_ack: self.unsafe_serve_before_bump_ack,
                    keep_memory: self.unsafe_keep_memory,
                    ids: crate::ids::issuer::UnsafeIssuing {
                        ignore_floor: self.unsafe_ids_ignore_floor,
                        ignore_mark: self.unsafe_ids_ignore_mark,
                    },
                    block_overlap: self.unsafe_block_overlap,
                    keys_share_seq: self.unsafe_keys_share_seq,
                    keys_forget_to_base: self.unsafe_keys_forget_to_base,
                },
                repeat_releases_after: self.test_repeat_releases_after_ms.map(Duration::from_millis),
                serve_limits,
                tls: tls.map(std::sync::Arc::new),
                lease_clock: LeaseClock::host(),
                id_clock: crate::ids::clock::IdClock::with_offset(self.test_clock_offset_ms),
                id_clock_file: self.test_clock_file,
                max_live_keys: self.max_live_keys,
                max_live_key_bytes: self.max_live_key_bytes,
                front,
                hop_listen,
            },
            metrics_listen: self.metrics_listen,
            event_interval: self.event_interval,
        })
    }
}

/// Where the hop listens: `--hop-listen`, else a free port on the data plane's address; nowhere
/// with `off`, and nowhere under TLS (the hop does not carry certificates: `crate::hop`).
fn hop_listen(arg: Option<&str>, listen: SocketAddr, tls: bool) -> Result<Option<SocketAddr>, String> {
    match arg {
        Some("off") => Ok(None),
        Some(_) if tls => Err(
            "--hop-listen does not run under --tls-*: the direct hop carries no certificate, so with TLS \
             calls are forwarded over gRPC (leave --hop-listen out, or give `off`)"
                .into(),
        ),
        Some(a) => a
            .parse()
            .map(Some)
            .map_err(|e| format!("--hop-listen: {a:?} is not ip:port or `off` ({e})")),
        None if tls => Ok(None),
        None => Ok(Some(SocketAddr::new(listen.ip(), 0))),
    }
}

/// The front ends' options agree with each other and with TLS (with TLS the certificate's role
/// decides who may call, not a password).
fn check_front(front: &FrontConfig, tls: bool, deadline_ms: u64) -> Result<(), String> {
    if tls && front.resp_password.is_some() {
        return Err(
            "--resp-password is for a plaintext Redis port: with --tls-* the caller's certificate \
                    and its role decide"
                .into(),
        );
    }
    if front.resp_password.as_deref().is_some_and(str::is_empty) {
        return Err("--resp-password must not be empty".into());
    }
    if front.resp_password.is_some() && front.resp.is_none() && front.resp_cluster.is_none() {
        return Err("--resp-password needs --resp-listen or --resp-cluster-listen".into());
    }
    if !(1..=60_000).contains(&deadline_ms) {
        return Err(format!("--front-deadline-ms must be 1 to 60000, got {deadline_ms}"));
    }
    Ok(())
}

/// The route table must carry an address clients can dial: a wildcard `--listen` needs
/// `--advertise`, and the advertised address cannot be a wildcard itself.
fn check_advertised(listen: SocketAddr, advertise: Option<&HostPort>) -> Result<(), String> {
    match advertise {
        None if listen.ip().is_unspecified() => Err(format!(
            "--listen {listen} binds every interface: give --advertise HOST:PORT, the address clients dial"
        )),
        Some(a) if a.socket_addr().is_some_and(|a| a.ip().is_unspecified()) => Err(format!(
            "--advertise {a} is a wildcard, not an address clients can dial"
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(args: &[&str]) -> Result<BinaryConfig, String> {
        let mut argv = vec!["allocsvr"];
        argv.extend_from_slice(args);
        seqsvr_plumbing::cli::try_parse_from::<Cli, _, _>(ENV_PREFIX, argv)
            .map_err(|e| e.to_string())?
            .validate()
    }

    #[test]
    fn the_hop_listens_beside_the_data_plane_unless_off_or_under_tls() {
        let listen: SocketAddr = "10.0.0.5:7100".parse().unwrap();
        assert_eq!(hop_listen(None, listen, false), Ok(Some("10.0.0.5:0".parse().unwrap())));
        assert_eq!(hop_listen(None, listen, true), Ok(None));
        assert_eq!(hop_listen(Some("off"), listen, false), Ok(None));
        assert_eq!(
            hop_listen(Some("127.0.0.1:7300"), listen, false),
            Ok(Some("127.0.0.1:7300".parse().unwrap()))
        );
        assert!(
            hop_listen(Some("127.0.0.1:7300"), listen, true)
                .unwrap_err()
                .contains("TLS")
        );
        assert!(
            hop_listen(Some("on"), listen, false)
                .unwrap_err()
                .contains("--hop-listen")
        );
    }

    #[test]
    fn flags_are_validated_with_clear_messages() {
        let good = ["--node-id", "1", "--listen", "127.0.0.1:0", "--store", "1=127.0.0.1:5"];
        let c = cli(&good).unwrap();
        assert_eq!(c.node.node_id, NodeId(1));
        assert!(!c.node.unsafe_rules.any());
        let cases: [(&[&str], &str); 8] = [
            (
                &["--node-id", "1", "--listen", "0.0.0.0:7000", "--store", "a:1"],
                "--advertise",
            ),
            (
                &[
                    "--node-id",
                    "1",
                    "--listen",
                    "0.0.0.0:7000",
                    "--store",
                    "a:1",
                    "--advertise",
                    "[::]:7000",
                ],
                "--advertise",
            ),
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
        for (flag, zero) in [
            ("--max-in-flight", "0"),
            ("--max-streams-per-connection", "0"),
            ("--rpc-timeout-ms", "0"),
            ("--max-live-keys", "0"),
            ("--max-live-key-bytes", "4095"),
        ] {
            let mut args = good.to_vec();
            args.extend([flag, zero]);
            assert!(cli(&args).unwrap_err().contains(flag), "{flag}");
        }
        assert_eq!(c.node.serve_limits, serve_limits::allocsvr(), "defaults from one table");
        assert_eq!(
            (c.node.max_live_keys, c.node.max_live_key_bytes),
            (DEFAULT_MAX_LIVE_KEYS, DEFAULT_MAX_LIVE_KEY_BYTES)
        );
        let wildcard = ["--node-id", "1", "--listen", "0.0.0.0:7000", "--store", "a:1"];
        let c = cli(&[&wildcard[..], &["--advertise", "10.77.0.21:7000"]].concat()).unwrap();
        assert_eq!(
            c.node.advertise.map(|a| a.to_string()).as_deref(),
            Some("10.77.0.21:7000")
        );
        let mut unsafe_args = good.to_vec();
        unsafe_args.push("--unsafe-keep-memory");
        let c = cli(&unsafe_args).unwrap();
        assert!(c.node.unsafe_rules.keep_memory && c.node.unsafe_rules.any());
    }
}
