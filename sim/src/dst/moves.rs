//! Operator moves in `sim dst --sets 2`: the production move driver (`seqsvr_control::Mover`) over
//! the in-process transport, moving a seeded range from the set that serves it to the other set
//! under the workload and the faults, sometimes killed mid-way and resumed later by a new driver,
//! as an operator's `seqctl move` and `seqctl move resume` would. Every move is written to the
//! history ([`MoveSpan`]) for the one-set-at-a-time checker.
//!
//! Some moves are cancelled while they run, as `seqctl move cancel` would: the cancel itself is
//! sometimes cut off mid-way (its driver dropped) and then repeated until the map says the move
//! ended, so a cancel interrupted between its map record and the sets' range steps is exercised
//! (a cancel that comes after the seal is refused, and the move is resumed to its end instead).
//!
//! The moves are drawn from the seed with their own generator (the cancels with one more), so a
//! one-set seed's faults are the same with or without this mode. Deliberately left out: moves that
//! overlap in time (one at a time keeps a failing seed explainable).

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use seqsvr_control::leader::Seed;
use seqsvr_control::mover::MoveError;
use seqsvr_control::{Dialer, Mover, StoreTimeouts};
use seqsvr_proto::pb;
use serde::Serialize;

use super::Recorder;
use super::addrs::REPLICAS;
use super::addrs::store_addr;
use super::transport::SimConnect;
use super::world::World;
use crate::history::{MoveSpan, Record};

/// AllocSvrs of set 1 (set 0 has `ALLOCS`).
pub const SET1_ALLOCS: usize = 2;

/// How often an unfinished move is resumed before the seed gives up on it (a harness failure:
/// the move then shows in the trace as never finished).
const RESUMES: u32 = 20;

/// One move of a seed.
#[derive(Clone, Debug, Serialize)]
pub struct PlannedMove {
    pub at_ms: u64,
    /// Chooses the range: its first section and its length (1–3 sections, within one map range).
    pub pick: u64,
    /// The driver is killed this long after it started (and resumed by a new one later).
    pub kill_after_ms: Option<u64>,
    /// A cancel starts this long after the move began; when the second value is set, that cancel
    /// is cut off after so many ms (and repeated later).
    pub cancel: Option<(u64, Option<u64>)>,
}

/// One or two moves over the first `load_ms`, from `seed` alone.
pub fn schedule(seed: u64, load_ms: u64) -> Vec<PlannedMove> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x3007_e000_0000_0000);
    let n = rng.random_range(1..=2);
    let mut cancels = StdRng::seed_from_u64(seed ^ 0xca9c_e100_0000_0000);
    let mut at = 0;
    (0..n)
        .map(|_| {
            let lo = at + 300;
            at = rng.random_range(lo..(load_ms * 3 / 4).max(lo + 1));
            PlannedMove {
                at_ms: at,
                pick: rng.random(),
                kill_after_ms: rng.random_bool(0.4).then(|| rng.random_range(5..2_000)),
                cancel: cancels.random_bool(0.35).then(|| {
                    let after = cancels.random_range(0..1_500);
                    (after, cancels.random_bool(0.5).then(|| cancels.random_range(1..400)))
                }),
            }
        })
        .collect()
}

fn timeouts() -> StoreTimeouts {
    StoreTimeouts {
        attempt: Duration::from_millis(500),
        overall: Duration::from_secs(5),
    }
}

/// A driver (its token from the world's generator) over the in-process transport.
pub fn mover(world: &Arc<World>) -> Mover {
    let token = world.draw(u64::MAX - 1) + 1;
    let dialer = Dialer::in_process(Arc::new(SimConnect { world: world.clone() }), token);
    let seeds = (0..REPLICAS)
        .map(|r| Seed::parse(&store_addr(0, r)).expect("a valid simulated address"))
        .collect();
    Mover::with_dialer(seeds, timeouts(), token, dialer).expect("seeds given")
}

/// Puts set 1 into the cluster map (retried while set 0 elects its first leader).
pub async fn add_set(world: &Arc<World>) {
    let stores: Vec<String> = (0..REPLICAS).map(|r| store_addr(1, r)).collect();
    for _ in 0..RESUMES {
        if mover(world).add_set(1, stores.clone()).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs the planned moves at their times; each one to its end before the next starts.
pub async fn run(world: Arc<World>, plans: Vec<PlannedMove>, rec: Arc<Recorder>, sections: u64) {
    let start = tokio::time::Instant::now();
    for (i, plan) in plans.iter().enumerate() {
        tokio::time::sleep_until(start + Duration::from_millis(plan.at_ms)).await;
        one(&world, i as u64 + 1, plan, &rec, sections).await;
    }
}

/// One move: plan, record, drive (killed and resumed when planned so), then recorded.
async fn one(world: &Arc<World>, op: u64, plan: &PlannedMove, rec: &Recorder, sections: u64) {
    let m = mover(world);
    let Ok(map) = m.map().await else { return };
    let section = plan.pick % sections;
    let Some(run) = map
        .ranges
        .iter()
        .find(|r| r.section_begin <= section && section < r.section_end)
    else {
        return;
    };
    let (from, to) = (run.set_id, 1 - run.set_id.min(1));
    let end = (section + 1 + (plan.pick >> 32) % 3).min(run.section_end);
    let start_ns = rec.history.clock().now_ns();
    let Ok(p) = m.plan(from, to, section, end).await else {
        return;
    };
    // Its reply may be lost, or it may not have committed: the map says which, below.
    let _ = m.begin(op, &p).await;
    // The first driver; a planned kill drops it mid-way, wherever it is. A planned cancel runs
    // beside it (it takes the move over), and may itself be cut off.
    let drive = async {
        match plan.kill_after_ms {
            Some(ms) => drop(tokio::time::timeout(Duration::from_millis(ms), m.drive(op, |_| {})).await),
            None => drop(m.drive(op, |_| {}).await),
        }
    };
    let cancel = async {
        let Some((after, cut)) = plan.cancel else { return };
        tokio::time::sleep(Duration::from_millis(after)).await;
        let c = mover(world);
        match cut {
            Some(ms) => drop(tokio::time::timeout(Duration::from_millis(ms), c.cancel(op)).await),
            None => drop(c.cancel(op).await),
        }
    };
    tokio::join!(drive, cancel);
    let Some(done) = settle(world, op, plan, section, to).await else {
        return;
    };
    let _ = rec.history.write(&Record::Move(MoveSpan {
        op,
        sections: (section, end),
        from,
        to,
        start_ns,
        end_ns: rec.history.clock().now_ns(),
        done,
    }));
}

/// Repeats until the map says the move `op` of `section` to set `to` is done or cancelled, as an
/// operator would: the cancel again when one was asked for (a refusal after the seal leaves the
/// move to a resume), else `seqctl move resume`. Whether it is done (`false` also when the map
/// never said); `None` when it never began.
async fn settle(world: &Arc<World>, op: u64, plan: &PlannedMove, section: u64, to: u64) -> Option<bool> {
    let mut done = None;
    for _ in 0..RESUMES {
        match phase(world, op).await {
            // No record: the begin never committed and nothing moved — or set 0, the map's home,
            // was restored since from a backup older than the move, which forgets its record but
            // not its effect (the restore goes ahead only when the backup's owners agree with the
            // live map, so a move whose record vanished is one that had switched). The map's
            // owner of the range tells the two apart.
            Ok(None) if owner_of(world, section).await == Some(to) => done = Some(true),
            Ok(None) => return None,
            Ok(Some(pb::MovePhase::Done)) => done = Some(true),
            Ok(Some(pb::MovePhase::Cancelled)) => done = Some(false),
            Ok(Some(_)) => {
                let again = mover(world);
                let cancelled = plan.cancel.is_some() && again.cancel(op).await.is_ok();
                if !cancelled && again.claim(op).await.is_ok() {
                    let _ = again.drive(op, |_| {}).await;
                }
                continue;
            }
            Err(_) => {}
        }
        if done.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Some(done.unwrap_or(false))
}

/// The set the map gives `section` to (`None`: no map read).
async fn owner_of(world: &Arc<World>, section: u64) -> Option<u64> {
    let map = mover(world).map().await.ok()?;
    map.ranges
        .iter()
        .find(|r| r.section_begin <= section && section < r.section_end)
        .map(|r| r.set_id)
}

/// The phase the map records for `op` (`None`: no record).
async fn phase(world: &Arc<World>, op: u64) -> Result<Option<pb::MovePhase>, MoveError> {
    let map = mover(world).map().await?;
    Ok(map
        .moves
        .iter()
        .find(|x| x.op == op)
        .map(|x| pb::MovePhase::try_from(x.phase).unwrap_or(pb::MovePhase::Unspecified)))
}
