//! The loads of `counter-bench`: named counters on the AllocSvr (raw `CounterNext` and
//! `CounterReserve`, and the client library's `Coalescer`), the uid path on the same sections, and
//! Redis `INCR`/`INCRBY` on the same key names — all through the one closed-loop driver
//! ([`crate::load`]), so that every figure means the same for every server — and the memory a
//! live key costs on each side.
//!
//! The uid cases ask the uid at each key's position (`seqsvr_proto::keys::position`): the same
//! sections, in the same proportions, as the keys, so that a key and a uid differ only in what the
//! AllocSvr does per call (hashing the key, a map lookup instead of an array slot).
//!
//! Deliberately left out: pipelined Redis clients (one request in flight per connection, as a
//! caller waiting for its number is) and Redis Cluster.

use std::sync::Arc;
use std::time::Duration;

use seqsvr_client::Coalescer;
use seqsvr_proto::pb;
use seqsvr_proto::pb::alloc_service_client::AllocServiceClient;
use tonic::transport::Channel;

use crate::load::{Answer, Pids, Sample, Window, drive};
use crate::peers::RedisConn;

/// The name of key `i` of a run (`prefix` keeps the memory keys apart from the load's).
pub fn key_name(prefix: &str, i: u64) -> String {
    format!("{prefix}:{i}")
}

/// What one call asks of the AllocSvr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// `CounterNext` of a key.
    KeyNext,
    /// `CounterReserve` of this many values of a key.
    KeyReserve(u32),
    /// `FetchNextSeq` of the uid at a key's position.
    UidNext,
    /// `Reserve` of this many seqs of the uid at a key's position.
    UidReserve(u32),
}

fn pick(rng: &mut u64, keys: u64) -> u64 {
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    *rng % keys.max(1)
}

/// `call` of uniformly random keys `ctr:0..keys` (or their uids) over `clients`.
pub async fn alloc_load(
    clients: &[AllocServiceClient<Channel>],
    concurrency: usize,
    call: Call,
    keys: u64,
    uid_limit: u64,
    window: Window,
    pids: Pids<'_>,
) -> Sample {
    let clients = Arc::new(clients.to_vec());
    drive(concurrency, window, pids, move |t, seed| {
        let mut client = clients[t % clients.len()].clone();
        let mut rng = seed | 1;
        let key = key_name("ctr", pick(&mut rng, keys));
        async move {
            let ok = |outcome: i32, value: u64| outcome == pb::Outcome::Ok as i32 && value != 0;
            let uid = || seqsvr_proto::keys::position(&key, uid_limit).0;
            let counter = |count| pb::CounterRequest {
                key: key.as_bytes().to_vec(),
                count,
                route_version: 0,
            };
            let (served, n) = match call {
                Call::KeyNext => match client.counter_next(counter(0)).await {
                    Ok(r) => (ok(r.get_ref().outcome, r.get_ref().value), 1),
                    Err(_) => return Answer::Failed,
                },
                Call::KeyReserve(n) => match client.counter_reserve(counter(n)).await {
                    Ok(r) => (ok(r.get_ref().outcome, r.get_ref().value), n),
                    Err(_) => return Answer::Failed,
                },
                Call::UidNext => {
                    let req = pb::FetchNextSeqRequest {
                        uid: uid(),
                        route_version: 0,
                    };
                    match client.fetch_next_seq(req).await {
                        Ok(r) => (ok(r.get_ref().outcome, r.get_ref().seq), 1),
                        Err(_) => return Answer::Failed,
                    }
                }
                Call::UidReserve(n) => {
                    let req = pb::ReserveRequest {
                        uid: uid(),
                        count: n,
                        route_version: 0,
                    };
                    match client.reserve(req).await {
                        Ok(r) => (ok(r.get_ref().outcome, r.get_ref().first), n),
                        Err(_) => return Answer::Failed,
                    }
                }
            };
            Answer::Served {
                ok: if served { u64::from(n) } else { 0 },
                not_ok: u64::from(!served),
            }
        }
    })
    .await
}

/// `CounterNext` (or, with `uids`, `FetchNextSeq` of the uid at the key's position under that uid
/// limit) through the client library's [`Coalescer`]: callers share `CounterBatch`es
/// (`BatchFetchNextSeq`s).
pub async fn coalesced(
    coalescer: Arc<Coalescer>,
    concurrency: usize,
    keys: u64,
    uids: Option<u64>,
    window: Window,
    pids: Pids<'_>,
) -> Sample {
    drive(concurrency, window, pids, move |_, seed| {
        let coalescer = coalescer.clone();
        let mut rng = seed | 1;
        let key = key_name("ctr", pick(&mut rng, keys));
        async move {
            let r = match uids {
                Some(limit) => {
                    let uid = seqsvr_proto::keys::position(&key, limit);
                    coalescer.fetch_next_seq(uid).await.map(|_| ())
                }
                None => coalescer.counter_next(&key).await.map(|_| ()),
            };
            match r {
                Ok(()) => Answer::Served { ok: 1, not_ok: 0 },
                Err(_) => Answer::Failed,
            }
        }
    })
    .await
}

/// `INCR` (`by` = 1) or `INCRBY by` of uniformly random keys `ctr:0..keys`, one connection per
/// caller (RESP has one request in flight per connection).
pub async fn redis_load(
    addr: &str,
    concurrency: usize,
    by: u32,
    keys: u64,
    window: Window,
    pids: Pids<'_>,
) -> Result<Sample, String> {
    let command = move |seed: u64| {
        let mut rng = seed | 1;
        let key = key_name("ctr", pick(&mut rng, keys)).into_bytes();
        let args = if by == 1 {
            vec![b"INCR".to_vec(), key]
        } else {
            vec![b"INCRBY".to_vec(), key, by.to_string().into_bytes()]
        };
        (args, u64::from(by))
    };
    crate::peers::redis_command_load(addr, concurrency, window, pids, command).await
}

/// Gives `count` fresh keys `prefix:0..count` a value each through `CounterBatch`es of 1,000, four
/// in flight; fails if any key was not served.
pub async fn touch_keys(clients: &[AllocServiceClient<Channel>], prefix: &str, count: u64) -> Result<(), String> {
    let prefix: Arc<str> = prefix.into();
    crate::cluster::in_batches(clients, count, "keys", move |mut client, lo, hi| {
        let keys = (lo..hi).map(|i| key_name(&prefix, i).into_bytes()).collect();
        async move {
            let req = pb::CounterBatchRequest { keys, route_version: 0 };
            let r = tokio::time::timeout(Duration::from_secs(10), client.counter_batch(req)).await;
            crate::cluster::unserved(r.ok().and_then(Result::ok).map(|r| r.into_inner().outcomes), hi - lo)
        }
    })
    .await
}

/// `INCR`s `count` fresh keys `prefix:0..count` once each over 16 connections.
pub async fn redis_touch(addr: &str, prefix: &str, count: u64) -> Result<(), String> {
    const CONNS: u64 = 16;
    let mut tasks = Vec::new();
    for t in 0..CONNS {
        let mut conn = RedisConn::connect(addr).await?;
        let prefix = prefix.to_owned();
        tasks.push(tokio::spawn(async move {
            for i in (t..count).step_by(CONNS as usize) {
                conn.incr(key_name(&prefix, i).as_bytes()).await?;
            }
            Ok::<(), String>(())
        }));
    }
    for t in tasks {
        t.await.map_err(|e| format!("redis touch task: {e}"))??;
    }
    Ok(())
}

/// The mean of Redis's `MEMORY USAGE` over `sample` of the keys `prefix:0..count`, evenly spread.
pub async fn redis_memory_usage(addr: &str, prefix: &str, count: u64, sample: u64) -> Result<f64, String> {
    let mut conn = RedisConn::connect(addr).await?;
    let step = (count / sample.max(1)).max(1);
    let (mut sum, mut n) = (0i64, 0i64);
    for i in (0..count).step_by(step as usize) {
        sum += conn
            .command(&[b"MEMORY", b"USAGE", key_name(prefix, i).as_bytes()])
            .await?;
        n += 1;
    }
    Ok(sum as f64 / n.max(1) as f64)
}
