//! The peers of `alloc-bench`: what else would hand out sequence numbers, measured on the same
//! machine, in the same run, through the same closed-loop driver ([`crate::load`]) as the
//! AllocSvr, so that every figure (calls/s, latency percentiles, server CPU per call, foreign load)
//! means the same thing for every server.
//!
//! - **Redis INCR** over a minimal RESP client written here (one connection per caller, since RESP
//!   has no multiplexing; `TCP_NODELAY`; one request in flight per connection), started twice:
//!   without persistence, and with `appendonly yes` + `appendfsync always` (Redis writes and
//!   fsyncs its AOF once per event-loop pass before sending that pass's replies, so concurrent
//!   callers share an fsync). Each call increments `seq:{uid}` for a uid drawn uniformly from the
//!   same uid set as the AllocSvr's spread cases: per-user counters, like ours.
//! - **An etcd counter**: one global key, incremented by compare-and-swap (Range, then
//!   Txn(mod_revision unchanged → put value+1, else → range) until it commits), over a tonic
//!   client generated from the small `proto/etcd_kv.proto` (etcd's own package and field
//!   numbers). A single-node etcd fsyncs its WAL before it answers a write (writes proposed
//!   together share an fsync): that is its durability. Every attempt is such a write, a failed
//!   compare included, since the Txn could have put. At 64 or 256 callers the CAS loop contends
//!   on the one key; the conflicts are counted and reported, and a call gives up after
//!   [`CAS_ATTEMPTS`] conflicts (the driver's per-call deadline bounds its time as well).
//!
//! Deliberately left out: pipelining (redis-benchmark's `-P`: it measures a batching client, not a
//! caller waiting for its number), Redis replication or cluster mode, a 3-node etcd (one node
//! already pays the fsync; three on the same two cores would only add hops and CPU), and
//! etcd's other way to a sequence (a plain Put and the store's global revision as the number:
//! also one global sequence, without conflicts).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use seqsvr_harness::{ProcSpec, Supervisor};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Mutex;
use tonic::transport::{Channel, Endpoint};

use crate::load::{Answer, Pids, Sample, Uids, Window, drive};

/// Client half of etcd's v3 KV API, as much as the counter needs.
pub mod etcdserverpb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("etcdserverpb");
}

use etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use etcdserverpb::kv_client::KvClient;
use etcdserverpb::request_op::Request;
use etcdserverpb::response_op::Response;
use etcdserverpb::{Compare, KeyValue, PutRequest, RangeRequest, RequestOp, TxnRequest, TxnResponse};

/// The etcd counter's one key.
pub const ETCD_KEY: &[u8] = b"seq:counter";
/// Conflicts after which one etcd increment gives up (counted as an error).
pub const CAS_ATTEMPTS: u32 = 100;
/// Longest wait for a peer to start and answer.
const START_LIMIT: Duration = Duration::from_secs(20);
/// Longest RESP reply line accepted; INCR replies are a few dozen bytes.
const MAX_LINE: usize = 64 * 1024;

/// Which peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerKind {
    /// Redis INCR, no persistence.
    Redis,
    /// Redis INCR, `appendonly yes`, `appendfsync always`.
    RedisFsync,
    /// An etcd counter: one key, CAS increments.
    Etcd,
}

impl PeerKind {
    pub const ALL: [PeerKind; 3] = [PeerKind::Redis, PeerKind::RedisFsync, PeerKind::Etcd];

    /// Case name in the per-run table (and process name).
    pub fn name(self) -> &'static str {
        match self {
            PeerKind::Redis => "redis-incr",
            PeerKind::RedisFsync => "redis-fsync",
            PeerKind::Etcd => "etcd-cas",
        }
    }

    /// Column title in the side-by-side table.
    pub fn title(self) -> &'static str {
        match self {
            PeerKind::Redis => "Redis INCR",
            PeerKind::RedisFsync => "Redis fsync always",
            PeerKind::Etcd => "etcd CAS counter",
        }
    }

    /// Server column of the per-run table (six characters at most).
    pub fn server(self) -> &'static str {
        match self {
            PeerKind::Redis | PeerKind::RedisFsync => "redis",
            PeerKind::Etcd => "etcd",
        }
    }

    /// What the peer gives up next to a seqsvr set (replicated, durable per step, per-user seqs).
    pub fn gives_up(self) -> &'static str {
        match self {
            PeerKind::Redis => {
                "no replication and nothing durable per call: a restart (or a failover) loses every counter"
            }
            PeerKind::RedisFsync => {
                "durable per call on one host (AOF fsynced before the reply), but still no replication and no failover"
            }
            PeerKind::Etcd => {
                "replicated and durable, but one global counter and no per-user sequences: a per-user counter would be one key per user, each increment a Raft write"
            }
        }
    }

    /// The server binary, looked up on `PATH`.
    pub fn binary(self) -> &'static str {
        match self {
            PeerKind::Redis | PeerKind::RedisFsync => "redis-server",
            PeerKind::Etcd => "etcd",
        }
    }
}

/// A running peer.
pub struct Server {
    pub kind: PeerKind,
    /// `127.0.0.1:PORT` of its clients.
    pub addr: String,
    pub pid: u32,
    /// First line of `--version`.
    pub version: String,
}

/// Conflicts and outcomes of the etcd CAS loop, over a whole load (warm-up included).
#[derive(Debug, Default)]
pub struct CasTally {
    /// Increments committed.
    pub increments: AtomicU64,
    /// Txns that found the counter moved and had to try again.
    pub conflicts: AtomicU64,
    /// Calls that gave up after [`CAS_ATTEMPTS`] conflicts.
    pub gave_up: AtomicU64,
}

impl CasTally {
    /// `(increments, conflicts, gave_up)`.
    pub fn read(&self) -> (u64, u64, u64) {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        (get(&self.increments), get(&self.conflicts), get(&self.gave_up))
    }
}

// ---------------------------------------------------------------------------------------------
// Redis: RESP, just enough for INCR.

/// A reply to INCR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `:<n>\r\n`
    Integer(i64),
    /// `-<message>\r\n`
    Error(String),
}

/// Appends `INCR key` in RESP to `out`.
pub fn encode_incr(key: &[u8], out: &mut Vec<u8>) {
    encode_command(&[b"INCR", key], out);
}

/// Appends a command of bulk-string arguments in RESP to `out`.
pub fn encode_command(args: &[&[u8]], out: &mut Vec<u8>) {
    out.push(b'*');
    out.extend_from_slice(args.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
    for a in args {
        out.push(b'$');
        out.extend_from_slice(a.len().to_string().as_bytes());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// Parses the reply at the start of `buf`: `Ok(None)` while it is incomplete, else the reply and
/// the bytes it took. Other reply types are protocol errors: INCR answers an integer or an error.
pub fn parse_reply(buf: &[u8]) -> Result<Option<(Reply, usize)>, String> {
    let Some(end) = buf.windows(2).position(|w| w == b"\r\n") else {
        if buf.len() > MAX_LINE {
            return Err(format!("no end of line in {} bytes", buf.len()));
        }
        return Ok(None);
    };
    let line = &buf[1..end];
    let reply = match buf[0] {
        b':' => {
            let text = std::str::from_utf8(line).map_err(|_| "integer reply is not UTF-8".to_string())?;
            Reply::Integer(text.parse().map_err(|_| format!("bad integer reply {text:?}"))?)
        }
        b'-' => Reply::Error(String::from_utf8_lossy(line).into_owned()),
        other => {
            return Err(format!(
                "unexpected reply type {:?} to INCR: {:?}",
                other as char,
                String::from_utf8_lossy(&buf[..end])
            ));
        }
    };
    Ok(Some((reply, end + 2)))
}

/// One RESP connection with one request in flight at a time.
pub struct RedisConn {
    stream: TcpStream,
    /// Bytes read but not yet parsed (a reply may arrive in pieces).
    inbuf: Vec<u8>,
    out: Vec<u8>,
}

impl RedisConn {
    pub async fn connect(addr: &str) -> Result<Self, String> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("cannot connect to redis at {addr}: {e}"))?;
        // Each call is one small write awaiting one small reply: Nagle would only delay it.
        stream.set_nodelay(true).map_err(|e| format!("TCP_NODELAY: {e}"))?;
        Ok(Self {
            stream,
            inbuf: Vec::with_capacity(64),
            out: Vec::with_capacity(64),
        })
    }

    /// `INCR key`: the new value, or Redis's error message.
    pub async fn incr(&mut self, key: &[u8]) -> Result<i64, String> {
        self.command(&[b"INCR", key]).await
    }

    /// A command whose reply is an integer (`INCR`, `INCRBY`, `MEMORY USAGE`, `DBSIZE`).
    pub async fn command(&mut self, args: &[&[u8]]) -> Result<i64, String> {
        self.out.clear();
        encode_command(args, &mut self.out);
        self.stream
            .write_all(&self.out)
            .await
            .map_err(|e| format!("redis write: {e}"))?;
        loop {
            if let Some((reply, used)) = parse_reply(&self.inbuf)? {
                self.inbuf.drain(..used);
                return match reply {
                    Reply::Integer(v) => Ok(v),
                    Reply::Error(e) => Err(format!("redis: {e}")),
                };
            }
            let n = self
                .stream
                .read_buf(&mut self.inbuf)
                .await
                .map_err(|e| format!("redis read: {e}"))?;
            if n == 0 {
                return Err("redis closed the connection".into());
            }
        }
    }
}

/// INCR of `seq:{uid}` for uniformly random uids of `uids`, one connection per caller.
pub async fn redis_load(
    addr: &str,
    concurrency: usize,
    uids: Uids,
    window: Window,
    pids: Pids<'_>,
) -> Result<Sample, String> {
    let command = move |seed: u64| {
        let mut rng = seed | 1;
        (
            vec![b"INCR".to_vec(), format!("seq:{}", uids.pick(&mut rng)).into_bytes()],
            1,
        )
    };
    redis_command_load(addr, concurrency, window, pids, command).await
}

/// Calls `command(seed)` — the command's arguments and how many numbers a positive reply stands
/// for — over one connection per caller, through the shared driver.
pub async fn redis_command_load<F>(
    addr: &str,
    concurrency: usize,
    window: Window,
    pids: Pids<'_>,
    command: F,
) -> Result<Sample, String>
where
    F: Fn(u64) -> (Vec<Vec<u8>>, u64) + Send + Sync + 'static,
{
    // A connection is taken out of its slot for the call and put back only when the reply was
    // read: a call cut off by the deadline leaves an empty slot, and the next call reconnects
    // instead of reading the late reply as its own.
    let mut slots = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        slots.push(Mutex::new(Some(RedisConn::connect(addr).await?)));
    }
    let slots = Arc::new(slots);
    let addr: Arc<str> = addr.into();
    let command = Arc::new(command);
    let sample = drive(concurrency, window, pids, move |t, seed| {
        let (slots, addr, command) = (slots.clone(), addr.clone(), command.clone());
        async move {
            let mut slot = slots[t].lock().await;
            let mut conn = match slot.take() {
                Some(c) => c,
                None => match RedisConn::connect(&addr).await {
                    Ok(c) => c,
                    Err(_) => return Answer::Failed,
                },
            };
            let (args, numbers) = command(seed);
            let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            match conn.command(&args).await {
                Ok(v) => {
                    *slot = Some(conn);
                    let served = v > 0;
                    Answer::Served {
                        ok: if served { numbers } else { 0 },
                        not_ok: u64::from(!served),
                    }
                }
                Err(_) => Answer::Failed,
            }
        }
    })
    .await;
    Ok(sample)
}

// ---------------------------------------------------------------------------------------------
// etcd: a CAS counter.

/// The counter's value and the revision that last wrote it (0, 0 while the key does not exist:
/// etcd compares a missing key's mod_revision as 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counter {
    pub value: u64,
    pub mod_revision: i64,
}

/// The counter in a Range answer.
pub fn counter_of(kvs: &[KeyValue]) -> Result<Counter, String> {
    let Some(kv) = kvs.first() else {
        return Ok(Counter {
            value: 0,
            mod_revision: 0,
        });
    };
    let text = std::str::from_utf8(&kv.value).map_err(|_| "counter value is not UTF-8".to_string())?;
    let value = text
        .parse()
        .map_err(|_| format!("counter value {text:?} is not a number"))?;
    Ok(Counter {
        value,
        mod_revision: kv.mod_revision,
    })
}

/// Txn: if the counter was not written since `seen`, write `seen.value + 1`; else read it.
pub fn cas_request(key: &[u8], seen: Counter) -> TxnRequest {
    TxnRequest {
        compare: vec![Compare {
            result: CompareResult::Equal as i32,
            target: CompareTarget::Mod as i32,
            key: key.to_vec(),
            target_union: Some(TargetUnion::ModRevision(seen.mod_revision)),
        }],
        success: vec![RequestOp {
            request: Some(Request::RequestPut(PutRequest {
                key: key.to_vec(),
                value: (seen.value + 1).to_string().into_bytes(),
            })),
        }],
        failure: vec![RequestOp {
            request: Some(Request::RequestRange(RangeRequest { key: key.to_vec() })),
        }],
    }
}

/// What a CAS Txn did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnOutcome {
    Committed,
    /// Someone wrote first; the counter as it is now.
    Conflict(Counter),
}

/// Reads a [`cas_request`]'s answer.
pub fn txn_outcome(resp: &TxnResponse) -> Result<TxnOutcome, String> {
    if resp.succeeded {
        return Ok(TxnOutcome::Committed);
    }
    match resp.responses.first().and_then(|r| r.response.as_ref()) {
        Some(Response::ResponseRange(range)) => Ok(TxnOutcome::Conflict(counter_of(&range.kvs)?)),
        _ => Err("failed Txn without the range of its failure branch".into()),
    }
}

/// Why an increment did not commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CasError {
    /// The Txn call failed or its answer made no sense.
    Rpc(String),
    /// [`CAS_ATTEMPTS`] (or the given bound) conflicts in a row.
    GaveUp,
}

/// Increments the counter starting from `seen`, retrying with the value each conflict returned,
/// at most `attempts` Txns; the committed value. Conflicts are added to `conflicts` as they
/// happen, so that a call cut off by a deadline still counts the ones it met.
pub async fn cas_increment<F, Fut>(
    key: &[u8],
    mut seen: Counter,
    attempts: u32,
    conflicts: &AtomicU64,
    mut txn: F,
) -> Result<u64, CasError>
where
    F: FnMut(TxnRequest) -> Fut,
    Fut: Future<Output = Result<TxnResponse, String>>,
{
    for _ in 0..attempts {
        let resp = txn(cas_request(key, seen)).await.map_err(CasError::Rpc)?;
        match txn_outcome(&resp).map_err(CasError::Rpc)? {
            TxnOutcome::Committed => return Ok(seen.value + 1),
            TxnOutcome::Conflict(now) => {
                conflicts.fetch_add(1, Ordering::Relaxed);
                seen = now;
            }
        }
    }
    Err(CasError::GaveUp)
}

/// A plaintext gRPC connection to a peer at `addr` (`TCP_NODELAY`, bounded connect and call times).
pub(crate) async fn plain_channel(addr: &str) -> Result<Channel, String> {
    Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| format!("bad address {addr}: {e}"))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("cannot connect to {addr}: {e}"))
}

/// `n` KV clients of the etcd at `addr`, each over its own connection.
pub async fn etcd_clients(addr: &str, n: usize) -> Result<Vec<KvClient<Channel>>, String> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(KvClient::new(
            plain_channel(addr).await.map_err(|e| format!("etcd: {e}"))?,
        ));
    }
    Ok(out)
}

async fn read_counter(client: &mut KvClient<Channel>) -> Result<Counter, String> {
    let req = RangeRequest { key: ETCD_KEY.to_vec() };
    let resp = client
        .range(req)
        .await
        .map_err(|e| format!("etcd Range: {}", e.message()))?;
    counter_of(&resp.into_inner().kvs)
}

/// CAS increments of [`ETCD_KEY`] by `concurrency` callers over `clients` (task `t` uses
/// `clients[t % len]`); the sample and the loop's tally.
pub async fn etcd_load(
    clients: &[KvClient<Channel>],
    concurrency: usize,
    window: Window,
    pids: Pids<'_>,
) -> (Sample, Arc<CasTally>) {
    let clients = Arc::new(clients.to_vec());
    let tally = Arc::new(CasTally::default());
    let t2 = tally.clone();
    let sample = drive(concurrency, window, pids, move |t, _| {
        let mut client = clients[t % clients.len()].clone();
        let tally = t2.clone();
        async move {
            let Ok(seen) = read_counter(&mut client).await else {
                return Answer::Failed;
            };
            let txn = |req| {
                let mut c = client.clone();
                async move {
                    c.txn(req)
                        .await
                        .map(|r| r.into_inner())
                        .map_err(|e| e.message().to_string())
                }
            };
            match cas_increment(ETCD_KEY, seen, CAS_ATTEMPTS, &tally.conflicts, txn).await {
                Ok(_) => {
                    tally.increments.fetch_add(1, Ordering::Relaxed);
                    Answer::Served { ok: 1, not_ok: 0 }
                }
                Err(CasError::GaveUp) => {
                    tally.gave_up.fetch_add(1, Ordering::Relaxed);
                    Answer::Failed
                }
                Err(CasError::Rpc(_)) => Answer::Failed,
            }
        }
    })
    .await;
    (sample, tally)
}

// ---------------------------------------------------------------------------------------------
// Starting the peers.

/// Where `name` is on `PATH`, if anywhere.
pub fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The first line `bin --version` prints.
pub(crate) fn version(bin: &Path) -> String {
    std::process::Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).lines().next().map(str::to_string))
        .unwrap_or_else(|| "unknown version".into())
}

fn port_of(addr: &str) -> Result<u16, String> {
    addr.rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .ok_or_else(|| format!("no port in {addr}"))
}

/// Starts the peer `kind` under `procs`, its data in `dir/NAME`. `Ok(None)` when its binary is not
/// installed (the caller skips it); an error when it is installed but did not come up.
pub async fn start(procs: &mut Supervisor, dir: &Path, kind: PeerKind) -> Result<Option<Server>, String> {
    let Some(bin) = on_path(kind.binary()) else {
        return Ok(None);
    };
    let data = dir.join(kind.name());
    std::fs::create_dir_all(&data).map_err(|e| format!("cannot create {}: {e}", data.display()))?;
    let addr = seqsvr_harness::free_addr();
    let args = match kind {
        PeerKind::Redis | PeerKind::RedisFsync => redis_args(kind, &addr, &data)?,
        PeerKind::Etcd => etcd_args(&addr, &data),
    };
    let spec = ProcSpec {
        cwd: Some(data.clone()),
        ..ProcSpec::new(kind.name(), &bin, args)
    };
    let pid = procs
        .spawn(spec)
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    let up = match kind {
        PeerKind::Redis | PeerKind::RedisFsync => redis_ready(&addr).await,
        PeerKind::Etcd => etcd_ready(&addr).await,
    };
    if let Err(e) = up {
        let _ = procs.kill(kind.name());
        return Err(format!("{} did not come up: {e}", kind.name()));
    }
    Ok(Some(Server {
        kind,
        addr,
        pid,
        version: version(&bin),
    }))
}

fn redis_args(kind: PeerKind, addr: &str, data: &Path) -> Result<Vec<String>, String> {
    let port = port_of(addr)?.to_string();
    let mut args = vec![
        "--bind",
        "127.0.0.1",
        "--port",
        &port,
        "--save",
        "",
        "--daemonize",
        "no",
    ];
    if kind == PeerKind::RedisFsync {
        args.extend(["--appendonly", "yes", "--appendfsync", "always"]);
    } else {
        args.extend(["--appendonly", "no"]);
    }
    let mut args: Vec<String> = args.into_iter().map(String::from).collect();
    args.extend(["--dir".to_string(), data.display().to_string()]);
    Ok(args)
}

fn etcd_args(addr: &str, data: &Path) -> Vec<String> {
    let client = format!("http://{addr}");
    let peer = format!("http://{}", seqsvr_harness::free_addr());
    vec![
        "--name=default".into(),
        format!("--data-dir={}", data.join("etcd").display()),
        format!("--listen-client-urls={client}"),
        format!("--advertise-client-urls={client}"),
        format!("--listen-peer-urls={peer}"),
        format!("--initial-advertise-peer-urls={peer}"),
        format!("--initial-cluster=default={peer}"),
        "--logger=zap".into(),
        "--log-level=warn".into(),
    ]
}

/// Until an INCR answers.
async fn redis_ready(addr: &str) -> Result<(), String> {
    let r = seqsvr_harness::poll_until(START_LIMIT, || async {
        let mut c = RedisConn::connect(addr).await.ok()?;
        c.incr(b"seq:ready").await.ok()
    })
    .await;
    r.map(|_| ())
        .ok_or_else(|| format!("no INCR answer at {addr} within {START_LIMIT:?}"))
}

/// Until a Range answers (a leader is elected), then the counter is set to 0.
async fn etcd_ready(addr: &str) -> Result<(), String> {
    let client = seqsvr_harness::poll_until(START_LIMIT, || async {
        let mut c = etcd_clients(addr, 1).await.ok()?.pop()?;
        read_counter(&mut c).await.ok().map(|_| c)
    })
    .await;
    let mut client = client.ok_or_else(|| format!("no Range answer at {addr} within {START_LIMIT:?}"))?;
    let init = TxnRequest {
        compare: Vec::new(),
        success: vec![RequestOp {
            request: Some(Request::RequestPut(PutRequest {
                key: ETCD_KEY.to_vec(),
                value: b"0".to_vec(),
            })),
        }],
        failure: Vec::new(),
    };
    client
        .txn(init)
        .await
        .map_err(|e| format!("cannot set the counter: {}", e.message()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::etcdserverpb::{PutResponse, RangeResponse, ResponseOp};
    use super::*;

    #[test]
    fn incr_is_a_two_item_resp_array() {
        let mut out = Vec::new();
        encode_incr(b"seq:42", &mut out);
        assert_eq!(out, b"*2\r\n$4\r\nINCR\r\n$6\r\nseq:42\r\n");
    }

    #[test]
    fn replies_parse_only_when_complete() {
        assert_eq!(parse_reply(b""), Ok(None));
        assert_eq!(parse_reply(b":12"), Ok(None));
        assert_eq!(parse_reply(b":12\r"), Ok(None));
        assert_eq!(parse_reply(b":12\r\n"), Ok(Some((Reply::Integer(12), 5))));
        // Two replies in one read: the first is taken, its length says where the next begins.
        assert_eq!(parse_reply(b":7\r\n:8\r\n"), Ok(Some((Reply::Integer(7), 4))));
        assert_eq!(parse_reply(b":-3\r\n"), Ok(Some((Reply::Integer(-3), 5))));
    }

    #[test]
    fn error_replies_carry_the_message() {
        let e = b"-ERR value is not an integer or out of range\r\n";
        assert_eq!(
            parse_reply(e),
            Ok(Some((
                Reply::Error("ERR value is not an integer or out of range".into()),
                e.len()
            )))
        );
    }

    #[test]
    fn other_replies_are_protocol_errors() {
        assert!(parse_reply(b"+OK\r\n").is_err());
        assert!(parse_reply(b"$1\r\nx\r\n").is_err());
        assert!(parse_reply(b":12x\r\n").is_err());
        assert!(parse_reply(&vec![b':'; MAX_LINE + 1]).is_err());
    }

    /// A one-connection fake Redis: answers the first INCR in two writes, the second with an error.
    #[tokio::test]
    async fn incr_reads_a_reply_split_across_reads_and_an_error_reply() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let want = b"*2\r\n$4\r\nINCR\r\n$5\r\nseq:1\r\n";
            let mut got = vec![0u8; want.len()];
            s.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, want);
            s.write_all(b":4").await.unwrap();
            s.flush().await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
            s.write_all(b"2\r\n").await.unwrap();
            s.read_exact(&mut got).await.unwrap();
            s.write_all(b"-ERR value is not an integer or out of range\r\n")
                .await
                .unwrap();
        });
        let mut c = RedisConn::connect(&addr).await.unwrap();
        assert_eq!(c.incr(b"seq:1").await, Ok(42));
        let e = c.incr(b"seq:1").await.unwrap_err();
        assert!(e.contains("ERR value is not an integer"), "{e}");
        server.await.unwrap();
    }

    /// An in-memory etcd key: applies a CAS Txn as etcd would, after `interfere` other writers
    /// commit first (one per Txn).
    struct FakeKey {
        value: u64,
        rev: i64,
        interfere: u32,
    }

    impl FakeKey {
        fn txn(&mut self, req: &TxnRequest) -> TxnResponse {
            if self.interfere > 0 {
                self.interfere -= 1;
                self.value += 1;
                self.rev += 1;
            }
            let Some(TargetUnion::ModRevision(seen)) = req.compare[0].target_union else {
                panic!("not a mod_revision compare: {req:?}");
            };
            if seen == self.rev {
                let Some(Request::RequestPut(put)) = &req.success[0].request else {
                    panic!("success branch is not a put: {req:?}");
                };
                self.value = std::str::from_utf8(&put.value).unwrap().parse().unwrap();
                self.rev += 1;
                let put = Response::ResponsePut(PutResponse { header: None });
                return TxnResponse {
                    header: None,
                    succeeded: true,
                    responses: vec![ResponseOp { response: Some(put) }],
                };
            }
            let kv = KeyValue {
                key: ETCD_KEY.to_vec(),
                mod_revision: self.rev,
                value: self.value.to_string().into_bytes(),
                ..Default::default()
            };
            let range = RangeResponse {
                header: None,
                kvs: vec![kv],
                count: 1,
            };
            TxnResponse {
                header: None,
                succeeded: false,
                responses: vec![ResponseOp {
                    response: Some(Response::ResponseRange(range)),
                }],
            }
        }
    }

    async fn increment(
        key: &RefCell<FakeKey>,
        seen: Counter,
        attempts: u32,
        conflicts: &AtomicU64,
    ) -> Result<u64, CasError> {
        cas_increment(ETCD_KEY, seen, attempts, conflicts, |req| {
            let resp = key.borrow_mut().txn(&req);
            async move { Ok(resp) }
        })
        .await
    }

    #[test]
    fn a_missing_key_is_zero_and_a_bad_value_an_error() {
        let zero = Counter {
            value: 0,
            mod_revision: 0,
        };
        assert_eq!(counter_of(&[]), Ok(zero));
        let bad = KeyValue {
            value: b"x".to_vec(),
            ..Default::default()
        };
        assert!(counter_of(&[bad]).is_err());
    }

    #[test]
    fn the_cas_compares_the_mod_revision_and_puts_the_next_value() {
        let seen = Counter {
            value: 41,
            mod_revision: 9,
        };
        let req = cas_request(ETCD_KEY, seen);
        assert_eq!(req.compare[0].result, CompareResult::Equal as i32);
        assert_eq!(req.compare[0].target, CompareTarget::Mod as i32);
        assert_eq!(req.compare[0].target_union, Some(TargetUnion::ModRevision(9)));
        let Some(Request::RequestPut(put)) = &req.success[0].request else {
            panic!("no put");
        };
        assert_eq!(put.value, b"42");
        assert!(matches!(req.failure[0].request, Some(Request::RequestRange(_))));
    }

    #[tokio::test]
    async fn conflicts_are_retried_with_the_value_they_return_and_counted() {
        let key = RefCell::new(FakeKey {
            value: 10,
            rev: 5,
            interfere: 3,
        });
        let seen = Counter {
            value: 10,
            mod_revision: 5,
        };
        let conflicts = AtomicU64::new(0);
        // Three other writers commit first: 11, 12, 13; this one commits 14.
        assert_eq!(increment(&key, seen, 10, &conflicts).await, Ok(14));
        assert_eq!(conflicts.load(Ordering::Relaxed), 3);
        assert_eq!(key.borrow().value, 14);
    }

    #[tokio::test]
    async fn an_increment_gives_up_after_its_bound() {
        let key = RefCell::new(FakeKey {
            value: 0,
            rev: 1,
            interfere: u32::MAX,
        });
        let seen = Counter {
            value: 0,
            mod_revision: 1,
        };
        let conflicts = AtomicU64::new(0);
        assert_eq!(increment(&key, seen, 5, &conflicts).await, Err(CasError::GaveUp));
        assert_eq!(conflicts.load(Ordering::Relaxed), 5);
    }

    #[tokio::test]
    async fn a_failed_txn_without_its_range_is_an_error() {
        let conflicts = AtomicU64::new(0);
        let seen = Counter {
            value: 0,
            mod_revision: 0,
        };
        let r = cas_increment(ETCD_KEY, seen, 5, &conflicts, |_| async { Ok(TxnResponse::default()) }).await;
        assert!(matches!(r, Err(CasError::Rpc(_))), "{r:?}");
    }
}
