//! StoreSvr configuration: flags, an optional config file, and validation.
//!
//! Parsing and validating are separate: clap turns flags into [`Config`], then
//! [`Config::validate`] checks the relations between values (lease against
//! renewal interval and election timeout, sizes, peers) and refuses a bad
//! configuration with one clear message.
//!
//! A config file holds the same options as `key = value` lines (`#` starts a
//! comment; a bare `true` turns a switch on); flags given on the command line
//! override the file.

use clap::Parser;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

/// StoreSvr: one replica of a set's Raft group (section ceilings, ownership, routes).
#[derive(Parser, Debug, Clone)]
#[command(name = "storesvr", version, args_override_self = true)]
pub struct Config {
    /// Read options from this file (`key = value` per line); flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// This replica's node id (> 0). Never reuse the id of a removed or wiped replica.
    #[arg(long)]
    pub node_id: u64,

    /// Id of the set this replica's Raft group stores.
    #[arg(long, default_value_t = 0)]
    pub set_id: u64,

    /// Address to listen on for gRPC (StoreService, Raft peers, Admin, health, reflection).
    #[arg(long)]
    pub listen: SocketAddr,

    /// Address peers and clients should use to reach this replica (default: --listen).
    #[arg(long)]
    pub advertise: Option<String>,

    /// Directory for the Raft log, vote and snapshots. Created if missing.
    #[arg(long)]
    pub data_dir: PathBuf,

    /// Initial voters as ID=ADDR, comma-separated. Only read with --bootstrap.
    #[arg(long, value_delimiter = ',')]
    pub peers: Vec<String>,

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
    pub dial: Vec<String>,

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

    /// TEST ONLY (negative control): apply bumps without checking the epoch. Breaks P4.
    #[arg(long, hide = true)]
    pub unsafe_skip_epoch_fence: bool,

    /// TEST ONLY (negative control): a Release ignores the epoch it names. Breaks P1 and P4.
    #[arg(long, hide = true)]
    pub unsafe_unfenced_release: bool,
}

impl Config {
    /// The negative controls this replica's state machine runs with.
    pub fn unsafe_rules(&self) -> crate::state::UnsafeRules {
        crate::state::UnsafeRules {
            skip_epoch_fence: self.unsafe_skip_epoch_fence,
            unfenced_release: self.unsafe_unfenced_release,
        }
    }
}

/// Most sections one set may hold: bounds memory, snapshot size and entry size.
pub const MAX_SECTIONS: u64 = 1 << 20;

impl Config {
    /// Parses flags, merging a `--config` file under them.
    /// clap errors (including `--help`) come back as `Err(Ok(e))` so the caller
    /// can let clap print them with the right exit code; file errors as `Err(Err(msg))`.
    pub fn parse_with_file() -> Result<Self, Result<clap::Error, String>> {
        let args: Vec<String> = std::env::args().collect();
        let Some(file) = find_config_arg(&args) else {
            return Config::try_parse_from(&args).map_err(Ok);
        };
        let text = std::fs::read_to_string(&file).map_err(|e| Err(format!("cannot read config file {file}: {e}")))?;
        let mut merged = vec![args[0].clone()];
        merged.extend(file_args(&text).map_err(Err)?);
        merged.extend(args[1..].iter().cloned());
        Config::try_parse_from(merged).map_err(Ok)
    }

    /// Checks relations between values; the error names the option to fix.
    pub fn validate(&self) -> Result<(), String> {
        let err = |m: String| Err(m);
        if self.node_id == 0 {
            return err("--node-id must be > 0".into());
        }
        if self.section_size == 0 || self.step == 0 || self.uid_limit == 0 {
            return err("--section-size, --step and --uid-limit must be > 0".into());
        }
        let sections = self.uid_limit.div_ceil(self.section_size);
        if sections > MAX_SECTIONS {
            return err(format!(
                "--uid-limit / --section-size gives {sections} sections, more than {MAX_SECTIONS}; raise --section-size"
            ));
        }
        if self.step > u64::MAX / 4 {
            return err("--step is too large".into());
        }
        if self.drift_ppm >= 100_000 {
            return err("--drift-ppm must be below 100000 (10 %)".into());
        }
        if self.renew_interval_ms == 0 || self.renew_interval_ms * 3 > self.lease_ms {
            return err(format!(
                "--renew-interval-ms ({}) must be > 0 and at most a third of --lease-ms ({})",
                self.renew_interval_ms, self.lease_ms
            ));
        }
        if self.margin_ms * 4 > self.lease_ms {
            return err(format!(
                "--margin-ms ({}) must be at most a quarter of --lease-ms ({})",
                self.margin_ms, self.lease_ms
            ));
        }
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
        if self.snapshot_logs == 0 {
            return err("--snapshot-logs must be > 0".into());
        }
        let peers = self.peer_map()?;
        if self.bootstrap && !peers.contains_key(&self.node_id) {
            return err(format!(
                "--bootstrap needs --peers to include this node ({})",
                self.node_id
            ));
        }
        self.dial_map()?;
        Ok(())
    }

    /// Address put into the Raft membership for this replica.
    pub fn advertise_addr(&self) -> String {
        self.advertise.clone().unwrap_or_else(|| self.listen.to_string())
    }

    pub fn peer_map(&self) -> Result<BTreeMap<u64, String>, String> {
        parse_id_addrs("--peers", &self.peers)
    }

    pub fn dial_map(&self) -> Result<BTreeMap<u64, String>, String> {
        parse_id_addrs("--dial", &self.dial)
    }
}

fn parse_id_addrs(flag: &str, items: &[String]) -> Result<BTreeMap<u64, String>, String> {
    let mut out = BTreeMap::new();
    for item in items.iter().filter(|s| !s.is_empty()) {
        let (id, addr) = item
            .split_once('=')
            .ok_or_else(|| format!("{flag}: expected ID=ADDR, got {item:?}"))?;
        let id: u64 = id
            .trim()
            .parse()
            .map_err(|_| format!("{flag}: bad node id in {item:?}"))?;
        if id == 0 {
            return Err(format!("{flag}: node id must be > 0 in {item:?}"));
        }
        let addr = addr.trim();
        if addr.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok()).is_none() {
            return Err(format!("{flag}: expected host:port in {item:?}"));
        }
        if out.insert(id, addr.to_string()).is_some() {
            return Err(format!("{flag}: node id {id} given twice"));
        }
    }
    Ok(out)
}

fn find_config_arg(args: &[String]) -> Option<String> {
    args.iter().enumerate().find_map(|(i, a)| {
        a.strip_prefix("--config=")
            .map(str::to_string)
            .or_else(|| (a == "--config").then(|| args.get(i + 1).cloned()).flatten())
    })
}

/// Turns `key = value` lines into flags.
fn file_args(text: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .ok_or_else(|| format!("config line {}: expected key = value", n + 1))?;
        let k = k.trim().replace('_', "-");
        let v = v.trim().trim_matches('"');
        match v {
            "true" => out.push(format!("--{k}")),
            "false" => {}
            _ => out.push(format!("--{k}={v}")),
        }
    }
    Ok(out)
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
        ]
    }

    fn check(extra: &[&str]) -> Result<(), String> {
        let mut args = base();
        args.extend_from_slice(extra);
        Config::try_parse_from(args).map_err(|e| e.to_string())?.validate()
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
        ];
        for (extra, flag) in cases {
            let e = check(extra).expect_err(flag);
            assert!(e.contains(flag), "{extra:?}: {e}");
        }
    }

    #[test]
    fn config_file_lines_become_flags() {
        let args =
            file_args("# comment\nnode_id = 3\nbootstrap = true\nunsafe_skip_epoch_fence = false\nstep = \"5\"\n")
                .unwrap();
        assert_eq!(args, vec!["--node-id=3", "--bootstrap", "--step=5"]);
        assert!(file_args("nonsense").is_err());
    }
}
