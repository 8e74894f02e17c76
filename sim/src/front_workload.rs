//! The workload through the AllocSvrs' HTTP/JSON or Redis-protocol front end (`sim run --front
//! http|resp`): the same seeded mix of calls as [`crate::workload::run_client`] — fetches, blocks,
//! batches, reads, named counters — each sent to a random AllocSvr's front end, which answers
//! wherever the call lands (forwarding to the owner), and recorded in the same history, so that
//! every checker judges what the front ends answered.
//!
//! `--front resp-cluster` is a Redis Cluster client of its own: the cluster places keys by hash
//! slot, each call goes to the AllocSvr its slot was last redirected to (a random one before), and
//! a `-MOVED <slot> <addr>` is followed (at most [`MAX_REDIRECTS`] times) and remembered; a
//! connection that fails forgets the slots it served. A pipeline of several names is sent one
//! command at a time, each to its slot's node.
//!
//! An HTTP 504 or a RESP `-UNKNOWN` is an unknown outcome, as is a lost connection after a take
//! was sent; every other refusal is a failure (nothing taken). HTTP replies say who served (an
//! `owner` object), so those calls carry owners for P4 and P6 as the library's do; the Redis
//! protocol has nowhere to say it, so RESP calls carry none (P4 and P6's per-owner accounting
//! rest on the other calls there).
//!
//! Deliberately left out: the network faults between clients and front ends (the front-end ports
//! are not behind the simulator's proxies; kills and pauses reach them, and the forwarded calls
//! cross the client proxies like every client's).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use seqsvr_client::{ClientError, FailureKind, Owner};
use seqsvr_proto::{Epoch, Incarnation, NodeId, SectionId};

use crate::workload::{Recorder, WorkloadParams};

/// Longest a front-end call may take here: above the AllocSvrs' own front deadline (2 s).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// `-MOVED` redirects followed by every client of this process.
static REDIRECTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// `-MOVED` redirects the `--front resp-cluster` clients followed so far.
pub fn redirects() -> u64 {
    REDIRECTS.load(Ordering::Relaxed)
}

/// Most `-MOVED` redirects one call follows (a slot's owner changes at most once or twice while
/// a call is redirected; more is a loop).
pub const MAX_REDIRECTS: usize = 5;

/// Which front end the calls go through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Front {
    /// The client library over gRPC (the default workload).
    Grpc,
    /// HTTP/JSON (`--http-listen`).
    Http,
    /// The Redis protocol (`--resp-listen`).
    Resp,
    /// The Redis Cluster protocol (`--resp-cluster-listen`, keys placed by hash slot), `-MOVED`
    /// followed.
    RespCluster,
}

/// A uid or a key index, as the workload draws them.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Subject {
    Uid(u64),
    Key(u64),
}

impl Subject {
    fn recorded(self) -> u64 {
        match self {
            Subject::Uid(u) => u,
            Subject::Key(i) => crate::keys::subject(i),
        }
    }

    /// The name the Redis front end maps to this subject.
    fn resp_name(self) -> String {
        match self {
            Subject::Uid(u) => format!("u:{u}"),
            Subject::Key(i) => crate::keys::name(i),
        }
    }

    /// The HTTP path prefix of this subject.
    fn http_path(self) -> String {
        match self {
            Subject::Uid(u) => format!("/v1/seq/{u}"),
            Subject::Key(i) => format!("/v1/counter/{}", percent_encode(&crate::keys::name(i))),
        }
    }
}

/// Every byte but RFC 3986's unreserved ones as `%XX`.
fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The `owner` object of an HTTP reply (every field a decimal string), when there is one.
fn owner_of(v: &serde_json::Value) -> Option<Owner> {
    let o = v.get("owner")?;
    let n = |k: &str| o[k].as_str()?.parse::<u64>().ok();
    Some(Owner {
        section: SectionId(n("section")?),
        node_id: NodeId(n("node")?),
        incarnation: Incarnation(n("incarnation")?),
        epoch: Epoch(n("epoch")?),
        set_id: n("set")?,
    })
}

fn failed(why: impl Into<String>) -> ClientError {
    ClientError::failed(FailureKind::Unavailable, why)
}

/// A lost answer: unknown for a call that takes, a failure for a read.
fn lost(takes: bool, why: String) -> ClientError {
    if takes { ClientError::unknown(why) } else { failed(why) }
}

/// One client's connections to the front ends (one per front end: the RESP connection is kept,
/// HTTP's pool keeps one alive for a caller that waits for each answer).
pub(crate) struct Conns {
    front: Front,
    addrs: Vec<SocketAddr>,
    http: hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    resp: HashMap<SocketAddr, redis::aio::MultiplexedConnection>,
    /// `--front resp-cluster`: where each hash slot was last redirected to.
    slots: HashMap<u16, SocketAddr>,
}

impl Conns {
    pub(crate) fn new(front: Front, addrs: Vec<SocketAddr>) -> Self {
        let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
        Self {
            front,
            addrs,
            http,
            resp: HashMap::new(),
            slots: HashMap::new(),
        }
    }

    /// One HTTP call: the JSON body of a 200, or the error it maps to.
    async fn http(
        &self,
        addr: SocketAddr,
        method: &str,
        path: &str,
        body: Bytes,
        takes: bool,
    ) -> Result<serde_json::Value, ClientError> {
        let req = hyper::Request::builder()
            .method(method)
            .uri(format!("http://{addr}{path}"))
            .header("content-type", "application/json")
            .body(Full::new(body))
            .map_err(|e| failed(e.to_string()))?;
        let resp = match tokio::time::timeout(CALL_TIMEOUT, self.http.request(req)).await {
            Err(_) => return Err(lost(takes, format!("{addr}: no answer in {CALL_TIMEOUT:?}"))),
            Ok(Err(e)) if e.is_connect() => return Err(failed(format!("{addr}: {e}"))),
            Ok(Err(e)) => return Err(lost(takes, format!("{addr}: {e}"))),
            Ok(Ok(r)) => r,
        };
        let status = resp.status();
        let bytes = match tokio::time::timeout(CALL_TIMEOUT, resp.into_body().collect()).await {
            Ok(Ok(b)) => b.to_bytes(),
            _ => return Err(lost(takes, format!("{addr}: the body did not arrive"))),
        };
        let v: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| lost(takes, format!("{addr}: not JSON ({e})")))?;
        if status.is_success() {
            return Ok(v);
        }
        let why = format!("{addr}: {status} {}", v["error"]["message"]);
        if v["error"]["may_have_been_taken"] == true {
            Err(ClientError::unknown(why))
        } else {
            Err(failed(why))
        }
    }

    async fn resp_conn(&mut self, addr: SocketAddr) -> Result<redis::aio::MultiplexedConnection, ClientError> {
        if let Some(c) = self.resp.get(&addr) {
            return Ok(c.clone());
        }
        let client = redis::Client::open(format!("redis://{addr}/")).map_err(|e| failed(e.to_string()))?;
        let c = tokio::time::timeout(CALL_TIMEOUT, client.get_multiplexed_async_connection())
            .await
            .map_err(|_| failed(format!("{addr}: connect timed out")))?
            .map_err(|e| failed(format!("{addr}: {e}")))?;
        self.resp.insert(addr, c.clone());
        Ok(c)
    }

    /// Runs `pipe` (of `commands` commands) at `addr`: one reply per command, or the error of the
    /// whole pipeline. The `redis` crate answers a pipeline with an error when any command got
    /// one: of a single command, the server's code says whether it took a number (`UNKNOWN`);
    /// of several, the others may have taken theirs, so a take is then unknown.
    async fn resp(
        &mut self,
        addr: SocketAddr,
        pipe: redis::Pipeline,
        commands: usize,
        takes: bool,
    ) -> Result<Vec<redis::Value>, ClientError> {
        let mut c = self.resp_conn(addr).await?;
        let r = tokio::time::timeout(CALL_TIMEOUT, pipe.query_async::<Vec<redis::Value>>(&mut c)).await;
        self.resp_outcome(addr, r, commands, takes)
    }

    /// [`Self::resp`] of one command for `name`; on the cluster port, sent to the node of the
    /// name's slot, `-MOVED` followed.
    async fn resp_one(
        &mut self,
        addr: SocketAddr,
        name: &str,
        pipe: redis::Pipeline,
        takes: bool,
    ) -> Result<Vec<redis::Value>, ClientError> {
        if self.front != Front::RespCluster {
            return self.resp(addr, pipe, 1, takes).await;
        }
        let slot = seqsvr_proto::keys::hash_slot(name.as_bytes());
        let mut at = self.slots.get(&slot).copied().unwrap_or(addr);
        for _ in 0..=MAX_REDIRECTS {
            let mut c = match self.resp_conn(at).await {
                Ok(c) => c,
                Err(e) => {
                    self.slots.retain(|_, a| *a != at);
                    return Err(e);
                }
            };
            let r = tokio::time::timeout(CALL_TIMEOUT, pipe.query_async::<Vec<redis::Value>>(&mut c)).await;
            if let Ok(Err(e)) = &r
                && e.kind() == redis::ErrorKind::Moved
            {
                // Nothing was taken: the node answered without serving the call.
                let to = e.redirect_node().and_then(|(a, _)| a.parse::<SocketAddr>().ok());
                let Some(to) = to else {
                    return Err(failed(format!("{at}: a MOVED without an address: {e}")));
                };
                self.slots.insert(slot, to);
                REDIRECTS.fetch_add(1, Ordering::Relaxed);
                at = to;
                continue;
            }
            if !matches!(&r, Ok(Ok(_))) {
                self.slots.retain(|_, a| *a != at);
            }
            return self.resp_outcome(at, r, 1, takes);
        }
        Err(failed(format!(
            "{addr}: more than {MAX_REDIRECTS} MOVED redirects for slot {slot}"
        )))
    }

    /// What a pipeline's answer at `addr` means.
    fn resp_outcome(
        &mut self,
        addr: SocketAddr,
        r: Result<redis::RedisResult<Vec<redis::Value>>, tokio::time::error::Elapsed>,
        commands: usize,
        takes: bool,
    ) -> Result<Vec<redis::Value>, ClientError> {
        match r {
            Ok(Ok(values)) => Ok(values),
            Ok(Err(e)) if e.code().is_some() && (commands == 1 || !takes) => {
                let why = format!("{addr}: {e}");
                if e.code() == Some("UNKNOWN") {
                    Err(ClientError::unknown(why))
                } else {
                    Err(failed(why))
                }
            }
            Ok(Err(e)) => {
                if e.code().is_none() {
                    self.resp.remove(&addr);
                }
                Err(lost(takes, format!("{addr}: {e}")))
            }
            Err(_) => {
                self.resp.remove(&addr);
                Err(lost(takes, format!("{addr}: no answer in {CALL_TIMEOUT:?}")))
            }
        }
    }

    /// `count` values of `who` (a block when above 1), first to last, and who served them when the
    /// front end says (HTTP does, RESP cannot).
    pub(crate) async fn take(
        &mut self,
        addr: SocketAddr,
        who: Subject,
        count: u32,
    ) -> Result<(Vec<u64>, Option<Owner>), ClientError> {
        match self.front {
            Front::Http => {
                let path = if count == 1 {
                    format!("{}/next", who.http_path())
                } else {
                    format!("{}/reserve?count={count}", who.http_path())
                };
                let v = self.http(addr, "POST", &path, Bytes::new(), true).await?;
                let first = ["seq", "value", "first"]
                    .iter()
                    .find_map(|k| v[*k].as_str())
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or_else(|| ClientError::unknown(format!("{addr}: a 200 without a value: {v}")))?;
                Ok(((first..first + u64::from(count)).collect(), owner_of(&v)))
            }
            _ => {
                let mut pipe = redis::pipe();
                if count == 1 {
                    pipe.cmd("INCR").arg(who.resp_name());
                } else {
                    pipe.cmd("INCRBY").arg(who.resp_name()).arg(count);
                }
                let v = self.resp_one(addr, &who.resp_name(), pipe, true).await?;
                let last = resp_int(addr, v.into_iter().next())?;
                Ok(((last + 1 - u64::from(count)..=last).collect(), None))
            }
        }
    }

    /// The current value of `who` (0: none handed out), and who answered when it says.
    async fn current(&mut self, addr: SocketAddr, who: Subject) -> Result<(u64, Option<Owner>), ClientError> {
        match self.front {
            Front::Http => {
                let v = self.http(addr, "GET", &who.http_path(), Bytes::new(), false).await?;
                let value = ["cur_seq", "value"]
                    .iter()
                    .find_map(|k| v[*k].as_str())
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| failed(format!("{addr}: a 200 without a value: {v}")))?;
                Ok((value, owner_of(&v)))
            }
            _ => {
                let mut pipe = redis::pipe();
                pipe.cmd("GET").arg(who.resp_name());
                match self
                    .resp_one(addr, &who.resp_name(), pipe, false)
                    .await?
                    .into_iter()
                    .next()
                {
                    Some(redis::Value::Nil) => Ok((0, None)),
                    Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(&b)
                        .parse()
                        .map(|v| (v, None))
                        .map_err(|_| failed(format!("{addr}: GET answered {b:?}"))),
                    Some(redis::Value::ServerError(e)) => Err(failed(format!("{addr}: {e:?}"))),
                    other => Err(failed(format!("{addr}: GET answered {other:?}"))),
                }
            }
        }
    }

    /// The next value of each subject: HTTP's batch of uids, or a RESP pipeline of `INCR`s.
    async fn batch(
        &mut self,
        addr: SocketAddr,
        whos: &[Subject],
    ) -> Result<crate::workload::BatchResults, ClientError> {
        match self.front {
            Front::Http => {
                let uids: Vec<String> = whos
                    .iter()
                    .map(|w| match w {
                        Subject::Uid(u) => u.to_string(),
                        Subject::Key(_) => unreachable!("HTTP batches are of uids"),
                    })
                    .collect();
                let body = serde_json::json!({ "uids": uids }).to_string();
                let v = self
                    .http(addr, "POST", "/v1/seq/batch", Bytes::from(body), true)
                    .await?;
                let results = v["results"]
                    .as_array()
                    .filter(|r| r.len() == whos.len())
                    .ok_or_else(|| ClientError::unknown(format!("{addr}: a batch answer of the wrong shape: {v}")))?;
                Ok(results
                    .iter()
                    .map(|r| match r["seq"].as_str().and_then(|s| s.parse().ok()) {
                        Some(seq) => Ok((seq, owner_of(r))),
                        None if r["error"]["may_have_been_taken"] == true => {
                            Err(ClientError::unknown(r["error"]["message"].to_string()))
                        }
                        None => Err(failed(r["error"]["message"].to_string())),
                    })
                    .collect())
            }
            Front::RespCluster => {
                let mut results = Vec::with_capacity(whos.len());
                for w in whos {
                    let mut pipe = redis::pipe();
                    pipe.cmd("INCR").arg(w.resp_name());
                    let v = self.resp_one(addr, &w.resp_name(), pipe, true).await;
                    results.push(v.and_then(|v| resp_int(addr, v.into_iter().next())).map(|v| (v, None)));
                }
                Ok(results)
            }
            _ => {
                let mut pipe = redis::pipe();
                for w in whos {
                    pipe.cmd("INCR").arg(w.resp_name());
                }
                let values = self.resp(addr, pipe, whos.len(), true).await?;
                if values.len() != whos.len() {
                    return Err(ClientError::unknown(format!(
                        "{addr}: {} replies to {}",
                        values.len(),
                        whos.len()
                    )));
                }
                Ok(values
                    .into_iter()
                    .map(|v| resp_int(addr, Some(v)).map(|v| (v, None)))
                    .collect())
            }
        }
    }
}

/// An `INCR`/`INCRBY` reply as a value, or what its error means.
fn resp_int(addr: SocketAddr, v: Option<redis::Value>) -> Result<u64, ClientError> {
    match v {
        Some(redis::Value::Int(i)) if i > 0 => Ok(i as u64),
        Some(redis::Value::ServerError(e)) => {
            let why = format!("{addr}: {} {}", e.code(), e.details().unwrap_or_default());
            if e.code() == "UNKNOWN" {
                Err(ClientError::unknown(why))
            } else {
                Err(failed(why))
            }
        }
        other => Err(ClientError::unknown(format!("{addr}: not a value: {other:?}"))),
    }
}

/// Runs one front-end client until `stop` is set.
pub async fn run_front_client(
    front: Front,
    addrs: Vec<SocketAddr>,
    client_id: u32,
    p: WorkloadParams,
    hot: Arc<Vec<u64>>,
    rec: Arc<Recorder>,
    stop: Arc<AtomicBool>,
) {
    let mut rng = StdRng::seed_from_u64(
        p.seed
            .wrapping_mul(0x2545_f491_4f6c_dd1d)
            .wrapping_add(client_id as u64),
    );
    let mut tick = crate::workload::pacer(&p);
    let mut conns = Conns::new(front, addrs);
    let pick_uid = |rng: &mut StdRng| crate::workload::pick_uid(rng, &hot, p.uid_limit);
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let addr = conns.addrs[rng.random_range(0..conns.addrs.len())];
        let who = if p.keys > 0 && rng.random_bool(0.4) {
            Subject::Key(rng.random_range(0..u64::from(p.keys)))
        } else {
            Subject::Uid(pick_uid(&mut rng))
        };
        let roll = rng.random_range(0..100);
        if roll < 60 {
            let n = if p.max_block > 0 && rng.random_bool(0.3) {
                rng.random_range(1..=p.max_block)
            } else {
                1
            };
            let kind = if n > 1 {
                crate::history::CallKind::Reserve
            } else {
                crate::history::CallKind::Fetch
            };
            let call = conns.take(addr, who, n);
            rec.record_values(client_id, vec![who.recorded(); n as usize], kind, call)
                .await;
        } else if roll < 80 {
            let call = conns.current(addr, who);
            rec.record_values(client_id, vec![who.recorded()], crate::history::CallKind::Get, async {
                call.await.map(|(v, owner)| (vec![v], owner))
            })
            .await;
        } else {
            // A batch of distinct subjects (HTTP: uids only; RESP: a pipeline, keys too).
            let n = rng.random_range(2..=p.max_batch.max(2));
            let mut whos: Vec<Subject> = Vec::with_capacity(n);
            for _ in 0..n {
                let w = match (front, p.keys > 0 && rng.random_bool(0.4)) {
                    (Front::Resp | Front::RespCluster, true) => Subject::Key(rng.random_range(0..u64::from(p.keys))),
                    _ => Subject::Uid(pick_uid(&mut rng)),
                };
                if !whos.iter().any(|x| x.recorded() == w.recorded()) {
                    whos.push(w);
                }
            }
            let subjects: Vec<u64> = whos.iter().map(|w| w.recorded()).collect();
            let call = conns.batch(addr, &whos);
            rec.record_batch(client_id, &subjects, call).await;
        }
    }
}
