//! The bounded load `seqctl verify` drives: `callers` callers per front end, each making one call
//! at a time at most `rate` times a second until the duration is over, on the reserved uids and
//! keys and on time-ordered ids, each call recorded with its start, end and answer.
//!
//! The mix per front end: single takes of a uid, blocks of 2 to 5, named counters' next values
//! and blocks, batches of 2 to 4 uids (gRPC only), and 1 to 8 ids. Uids and keys are drawn from
//! the small reserved set, so each one gets many calls from every caller and front end at once:
//! that is what makes the order checks bite.
//!
//! Deliberately left out: reads (`get`): what a read may answer after an owner change is a
//! ceiling, not a value anyone was given, so it is not checked here (`sim run` checks P5).

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use seqsvr_client::Client;
use seqsvr_proto::Uid;
use tokio::time::Instant;

use super::fronts::{Http, NoValue, Resp, RespReply};
use super::history::{Call, Front, Op, Outcome, Subject};

/// What to drive, and where.
pub(crate) struct Plan {
    pub duration: Duration,
    pub callers: u32,
    /// Calls per second of one caller, at most.
    pub rate: u32,
    pub uids: Range<u64>,
    pub keys: Vec<String>,
    /// The gRPC client (routes every call to its owner), when gRPC is verified.
    pub grpc: Option<(Client, String)>,
    pub http: Vec<String>,
    pub resp: Vec<String>,
    pub deadline: Duration,
}

/// One call to make.
#[derive(Clone, Debug)]
enum Pick {
    Fetch(u64),
    Batch(Vec<u64>),
    Reserve(u64, u32),
    CounterNext(String),
    CounterReserve(String, u32),
    Ids(u32),
}

impl Pick {
    fn op(&self) -> Op {
        match self {
            Pick::Fetch(_) => Op::Fetch,
            Pick::Batch(_) => Op::Batch,
            Pick::Reserve(..) => Op::Reserve,
            Pick::CounterNext(_) => Op::CounterNext,
            Pick::CounterReserve(..) => Op::CounterReserve,
            Pick::Ids(_) => Op::NextIds,
        }
    }

    /// One subject per value the call will give.
    fn subjects(&self) -> Vec<Subject> {
        match self {
            Pick::Fetch(u) => vec![Subject::Uid(*u)],
            Pick::Batch(us) => us.iter().map(|u| Subject::Uid(*u)).collect(),
            Pick::Reserve(u, n) => vec![Subject::Uid(*u); *n as usize],
            Pick::CounterNext(k) => vec![Subject::Key(k.clone())],
            Pick::CounterReserve(k, n) => vec![Subject::Key(k.clone()); *n as usize],
            Pick::Ids(_) => vec![],
        }
    }
}

fn pick(rng: &mut StdRng, plan: &Plan, front: Front) -> Pick {
    let uid = |rng: &mut StdRng| rng.random_range(plan.uids.clone());
    let key = |rng: &mut StdRng| plan.keys[rng.random_range(0..plan.keys.len())].clone();
    match rng.random_range(0..100) {
        0..35 => Pick::Fetch(uid(rng)),
        35..45 if front == Front::Grpc => {
            let mut us: Vec<u64> = (0..rng.random_range(2..=4)).map(|_| uid(rng)).collect();
            us.sort_unstable();
            us.dedup();
            Pick::Batch(us)
        }
        35..55 => Pick::Reserve(uid(rng), rng.random_range(2..=5)),
        55..75 => Pick::CounterNext(key(rng)),
        75..82 => Pick::CounterReserve(key(rng), rng.random_range(2..=5)),
        _ => Pick::Ids(rng.random_range(1..=8)),
    }
}

/// Runs every caller to the end; the calls of all, numbered in invoke order.
pub(crate) async fn drive(plan: Arc<Plan>, clock: Instant, seed: u64) -> Vec<Call> {
    let mut tasks = Vec::new();
    let fronts = [
        (Front::Grpc, plan.grpc.is_some()),
        (Front::Http, !plan.http.is_empty()),
        (Front::Resp, !plan.resp.is_empty()),
    ];
    let mut caller = 0u32;
    for (front, _) in fronts.into_iter().filter(|f| f.1) {
        for _ in 0..plan.callers {
            let rng = StdRng::seed_from_u64(seed ^ u64::from(caller).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            tasks.push(tokio::spawn(run_caller(plan.clone(), front, caller, clock, rng)));
            caller += 1;
        }
    }
    let mut calls = Vec::new();
    for t in tasks {
        // A caller that panicked lost its calls; the run then judges fewer, which the counts show.
        calls.extend(t.await.unwrap_or_default());
    }
    calls.sort_by_key(|c| (c.invoke_ns, c.caller));
    for (i, c) in calls.iter_mut().enumerate() {
        c.id = i as u64 + 1;
    }
    calls
}

async fn run_caller(plan: Arc<Plan>, front: Front, caller: u32, clock: Instant, mut rng: StdRng) -> Vec<Call> {
    let mut http = Http::new(plan.deadline);
    let mut resp = Resp::new(plan.deadline);
    let mut tick = tokio::time::interval(Duration::from_secs(1) / plan.rate.max(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let end = clock + plan.duration;
    // Bounded in count as well as in time.
    let most = u64::from(plan.rate).saturating_mul(plan.duration.as_secs().saturating_add(1));
    let mut calls = Vec::new();
    while Instant::now() < end && (calls.len() as u64) < most {
        tick.tick().await;
        let p = pick(&mut rng, &plan, front);
        let invoke_ns = clock.elapsed().as_nanos() as u64;
        let (addr, answer) = match front {
            Front::Grpc => match &plan.grpc {
                Some((client, seeds)) => (seeds.clone(), grpc(client, &p).await),
                None => break,
            },
            Front::Http => {
                let addr = plan.http[rng.random_range(0..plan.http.len())].clone();
                let a = http_call(&mut http, &addr, &p).await;
                (addr, a)
            }
            Front::Resp => {
                let addr = plan.resp[rng.random_range(0..plan.resp.len())].clone();
                let a = resp_call(&mut resp, &addr, &p).await;
                (addr, a)
            }
        };
        let complete_ns = clock.elapsed().as_nanos() as u64;
        calls.push(record(caller, front, addr, &p, invoke_ns, complete_ns, answer));
    }
    calls
}

fn record(
    caller: u32,
    front: Front,
    addr: String,
    p: &Pick,
    invoke_ns: u64,
    complete_ns: u64,
    answer: Result<Vec<u64>, NoValue>,
) -> Call {
    let subjects = p.subjects();
    // A reply of the wrong size cannot be attributed value by value: it is no value at all.
    let answer = answer.and_then(|v| {
        if p.op() == Op::NextIds || v.len() == subjects.len() {
            Ok(v)
        } else {
            Err((
                Outcome::Unknown,
                format!("{} values for {} subjects", v.len(), subjects.len()),
            ))
        }
    });
    let (outcome, values, error) = match answer {
        Ok(v) => (Outcome::Ok, v, None),
        Err((o, why)) => (o, vec![], Some(why)),
    };
    Call {
        id: 0,
        caller,
        front,
        addr,
        op: p.op(),
        subjects,
        invoke_ns,
        complete_ns,
        outcome,
        values,
        error,
    }
}

fn no_value(e: seqsvr_client::ClientError) -> NoValue {
    let outcome = if e.is_unknown() {
        Outcome::Unknown
    } else {
        Outcome::Failed
    };
    (outcome, e.to_string())
}

async fn grpc(c: &Client, p: &Pick) -> Result<Vec<u64>, NoValue> {
    Ok(match p {
        Pick::Fetch(u) => vec![c.fetch_next_seq(Uid(*u)).await.map_err(no_value)?.seq],
        Pick::Batch(us) => {
            let uids: Vec<Uid> = us.iter().map(|u| Uid(*u)).collect();
            c.batch_fetch(&uids)
                .await
                .map_err(no_value)?
                .iter()
                .map(|f| f.seq)
                .collect()
        }
        Pick::Reserve(u, n) => c.reserve(Uid(*u), *n).await.map_err(no_value)?.seqs().collect(),
        Pick::CounterNext(k) => vec![c.counter_next(k).await.map_err(no_value)?.value],
        Pick::CounterReserve(k, n) => c.counter_reserve(k, *n).await.map_err(no_value)?.values().collect(),
        Pick::Ids(n) => c.next_ids(*n).await.map_err(no_value)?.ids,
    })
}

/// A decimal string field of an HTTP answer.
fn field(v: &serde_json::Value, name: &str) -> Result<u64, NoValue> {
    v[name]
        .as_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| (Outcome::Unknown, format!("a 2xx answer without {name:?}: {v}")))
}

fn block(v: &serde_json::Value, n: u32) -> Result<Vec<u64>, NoValue> {
    let first = field(v, "first")?;
    Ok((first..first + u64::from(n)).collect())
}

async fn http_call(h: &mut Http, addr: &str, p: &Pick) -> Result<Vec<u64>, NoValue> {
    let counter = |k: &str| format!("/v1/counter/{}", utf8_percent_encode(k, NON_ALPHANUMERIC));
    match p {
        Pick::Fetch(u) => Ok(vec![field(&h.post(addr, &format!("/v1/seq/{u}/next")).await?, "seq")?]),
        Pick::Reserve(u, n) => block(&h.post(addr, &format!("/v1/seq/{u}/reserve?count={n}")).await?, *n),
        Pick::CounterNext(k) => Ok(vec![field(
            &h.post(addr, &format!("{}/next", counter(k))).await?,
            "value",
        )?]),
        Pick::CounterReserve(k, n) => block(&h.post(addr, &format!("{}/reserve?count={n}", counter(k))).await?, *n),
        Pick::Ids(n) => {
            let v = h.post(addr, &format!("/v1/ids?count={n}")).await?;
            let ids: Option<Vec<u64>> = v["ids"]
                .as_array()
                .map(|a| a.iter().filter_map(|s| s.as_str()?.parse().ok()).collect());
            ids.filter(|ids| !ids.is_empty())
                .ok_or_else(|| (Outcome::Unknown, format!("a 2xx answer without ids: {v}")))
        }
        Pick::Batch(_) => Err((Outcome::Failed, "batches go through gRPC only".into())),
    }
}

fn positive(i: i64) -> Result<u64, NoValue> {
    u64::try_from(i)
        .ok()
        .filter(|v| *v > 0)
        .ok_or_else(|| (Outcome::Unknown, format!("not a value: {i}")))
}

async fn resp_call(r: &mut Resp, addr: &str, p: &Pick) -> Result<Vec<u64>, NoValue> {
    let (args, n): (Vec<String>, u32) = match p {
        Pick::Fetch(u) => (vec!["INCR".into(), format!("u:{u}")], 1),
        Pick::Reserve(u, n) => (vec!["INCRBY".into(), format!("u:{u}"), n.to_string()], *n),
        Pick::CounterNext(k) => (vec!["INCR".into(), k.clone()], 1),
        Pick::CounterReserve(k, n) => (vec!["INCRBY".into(), k.clone(), n.to_string()], *n),
        Pick::Ids(n) => (vec!["NEXTID".into(), n.to_string()], *n),
        Pick::Batch(_) => return Err((Outcome::Failed, "batches go through gRPC only".into())),
    };
    match (r.command(addr, &args).await?, p) {
        (RespReply::Ints(ids), Pick::Ids(_)) => ids.into_iter().map(positive).collect(),
        (RespReply::Int(id), Pick::Ids(_)) => Ok(vec![positive(id)?]),
        // `INCRBY` answers the block's last value.
        (RespReply::Int(last), _) => {
            let last = positive(last)?;
            let first = last
                .checked_sub(u64::from(n) - 1)
                .filter(|f| *f > 0)
                .ok_or_else(|| (Outcome::Unknown, format!("a block of {n} cannot end at {last}")))?;
            Ok((first..=last).collect())
        }
        (other, _) => Err((Outcome::Unknown, format!("{} answered {other:?}", args[0]))),
    }
}
