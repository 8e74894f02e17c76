//! Restores in `sim dst`: in a share of the seeds, an operator backs a set up, the set is lost
//! later (every replica gone), and the operator restores it from that backup while the load goes
//! on, through the production code of `storesvr restore`:
//! - the backup file is made and read back by `storesvr::backup` (`capture`, `read`), from the
//!   set's committed state at the backup's time (what the Backup RPC reads after a ReadIndex);
//! - with two sets, the backup is checked against the live cluster map
//!   (`domain::restore::check_against_map`), read by the production `AdminClient` from the other
//!   set (set 0's map, or set 1's published copy when set 0 is the one lost) and converted by
//!   `storesvr::restore::live_map_of`, as `--map-from` does. With one set there is nobody to
//!   ask, and the restore goes ahead as `--skip-map-check` does;
//! - the margin is `choose_margin` of a number of steps, and `domain::restore::restore` raises
//!   every ceiling, clears every owner, raises every epoch, forgets every AllocSvr and jumps the
//!   route version, the incarnation counter and (on set 0) the map version.
//!
//! The restored state becomes a new group in place of the lost one (`Group::replace`: fresh
//! replicas, a new generation, nothing of the old group lands); the set's AllocSvrs, whose
//! incarnations the new group does not know, register again by themselves. A refused restore is
//! recorded with the production message, and the set's replicas come back with their logs, as
//! if the loss was an outage after all: a set lost for good would leave its uids unserved, which
//! is the refusal's point, not something the checkers can judge.
//!
//! The operator's margin covers the set's real growth since the backup (the simulator knows it:
//! the lost state's ceilings) plus 0–2 steps: the margin is the operator's bound, and a smaller
//! one repeats numbers by construction (`docs/BACKUP.md`). Moves before and after the backup come
//! from `--sets 2`'s own schedule; a move after it makes the check refuse.
//!
//! Drawn from a generator of its own and listed last among the faults, so every other fault of
//! every seed stays where it was. Deliberately left out: a second restore in one seed, restoring
//! into a running group, and the data dir side of a restore (`storesvr`'s tests cover writing
//! and starting it).

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use seqsvr_control::leader::Seed;
use seqsvr_control::{AdminClient, Dialer, StoreTimeouts};
use seqsvr_proto::NodeId;
use serde::Serialize;
use storesvr::domain::restore::{MarginArgs, RestoreAt, check_against_map, choose_margin, restore};
use storesvr::domain::state::SetState;
use storesvr::storage::sm_store::SmData;

use super::addrs::REPLICAS;
use super::addrs::store_addr;
use super::transport::SimConnect;
use super::world::World;

/// Share of seeds with a restore.
const SHARE: f64 = 0.3;

/// The operator's patience when reading the live map (the production default is 10 s; a refusal
/// for want of a map is recorded like any other).
const MAP_READ: Duration = Duration::from_secs(1);

/// One restore of a seed.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Plan {
    pub set: u64,
    /// The set is lost this long after the backup ...
    pub lose_after_ms: u64,
    /// ... and the restore is tried this long after the loss.
    pub outage_ms: u64,
    /// Steps of margin above the set's growth since the backup.
    pub extra_steps: u64,
    /// How far the restoring host's clock is behind the true time (with `--ids` only; without,
    /// the clock is not read): 0, less than the backup's age (accepted: the marks rise past the
    /// backup's highest mark moved on by its age), or an hour (before the backup: refused).
    pub clock_behind_ms: u64,
}

/// The seed's restore, if it has one: the backup from 0.7 s (the set is initialized by then) to
/// 3.3 s before the end of the load, the loss 0.1–2.5 s later (long enough for a move to start and
/// end in between), the attempt 0.1–0.8 s after that. With two sets, set 0 or 1. The plan, when
/// the backup is taken and how long the whole of it may take, all in ms of the load.
pub fn plan(seed: u64, load_ms: u64, two_sets: bool) -> Option<(Plan, u64, u64)> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x4e57_04e0_0000_0000);
    if !rng.random_bool(SHARE) {
        return None;
    }
    let set = u64::from(rng.random_bool(0.5) && two_sets);
    let at_ms = rng.random_range(700..load_ms.saturating_sub(3_300).max(701));
    let plan = Plan {
        set,
        lose_after_ms: rng.random_range(100..2_500),
        outage_ms: rng.random_range(100..800),
        extra_steps: rng.random_range(0..=2),
        clock_behind_ms: 0,
    };
    // A generator of its own, drawn after the others: the plans of the seeds before restores had
    // a wrong clock stay as they were.
    let mut clock = StdRng::seed_from_u64(seed ^ 0x0c10_c4be_0000_0000);
    let plan = Plan {
        clock_behind_ms: match clock.random_range(0..4) {
            // Before the backup was taken: refused.
            0 => 3_600_000,
            1 => clock.random_range(0..plan.lose_after_ms + plan.outage_ms),
            _ => 0,
        },
        ..plan
    };
    let for_ms = (plan.lose_after_ms + plan.outage_ms + MAP_READ.as_millis() as u64).min(load_ms - at_ms);
    Some((plan, at_ms, for_ms))
}

/// Backs the set up now and runs the rest of the plan in the background; what it hit.
pub fn start(world: &Arc<World>, plan: Plan) -> String {
    let file = {
        let st = world.lock();
        let data = SmData {
            set: st.groups[plan.set as usize].set.clone(),
            ..Default::default()
        };
        // Stamped with the true time as a Unix clock (the leaders' clocks in the simulation).
        storesvr::backup::capture(&data, super::world::ID_ORIGIN_MS + world.now_ns() / 1_000_000)
    };
    match file {
        Ok(file) => {
            let backed_up = tokio::time::Instant::now();
            tokio::spawn(run(world.clone(), plan, file, backed_up));
            format!("set {} (backed up, lost after {} ms)", plan.set, plan.lose_after_ms)
        }
        Err(e) => {
            world
                .lock()
                .restores
                .notes
                .push(format!("no backup of set {}: {e}", plan.set));
            format!("set {} (no backup)", plan.set)
        }
    }
}

async fn run(world: Arc<World>, plan: Plan, file: Vec<u8>, backed_up: tokio::time::Instant) {
    let set = plan.set as usize;
    tokio::time::sleep(Duration::from_millis(plan.lose_after_ms)).await;
    let lost = {
        let mut st = world.lock();
        st.groups[set].lose();
        st.groups[set].set.clone()
    };
    tokio::time::sleep(Duration::from_millis(plan.outage_ms)).await;
    let age = backed_up.elapsed();
    let outcome = attempt(&world, plan, &file, &lost, age).await;
    let at_ms = world.now_ns() / 1_000_000;
    let mut st = world.lock();
    match outcome {
        Ok((restored, note)) => {
            st.groups[set].replace(restored);
            st.restores.restored += 1;
            let restored_ns = world.now_ns();
            st.restores.rewinds.push(super::tally::Rewind {
                set: plan.set,
                backup_ns: restored_ns.saturating_sub(age.as_nanos() as u64),
                restored_ns,
            });
            st.restores.unchecked += u64::from(note.is_some());
            let why = note.map_or(String::new(), |n| format!(" WITHOUT the map check, which says: {n}"));
            let line = format!("set {set} restored at {at_ms} ms from its backup of {age:?} before{why}");
            st.restores.notes.push(line);
        }
        Err((by_map, why)) => {
            st.groups[set].recover();
            st.restores.refused += 1;
            st.restores.refused_by_map += u64::from(by_map);
            let line = format!("set {set} restore refused at {at_ms} ms (the set comes back as it was): {why}");
            st.restores.notes.push(line);
        }
    }
}

/// `storesvr restore` over the backup file: the restored state (and, under the negative control,
/// what the skipped map check would have said), or why it was refused (and whether the check
/// against the map refused it).
async fn attempt(
    world: &Arc<World>,
    plan: Plan,
    file: &[u8],
    lost: &SetState,
    age: Duration,
) -> Result<(SetState, Option<String>), (bool, String)> {
    let other = |e: String| (false, e);
    let (header, backup) = storesvr::backup::read(file).map_err(|e| other(e.to_string()))?;
    let (two_sets, skip) = {
        let st = world.lock();
        (st.groups.len() > 1, st.skip_restore_check)
    };
    let mut skipped = None;
    let mut live_ids = None;
    if two_sets {
        let live = live_map(world, 1 - plan.set).await.map_err(other)?;
        live_ids = live.ids.clone();
        if let Err(e) = check_against_map(&backup, &live) {
            if !skip {
                return Err((true, e.to_string()));
            }
            skipped = Some(e.to_string());
        }
    }
    let step = backup.params.as_ref().map_or(1, |p| p.step).max(1);
    let margin_args = MarginArgs {
        steps: Some(growth(&backup, lost).div_ceil(step) + plan.extra_steps),
        max_bumps_per_sec: None,
    };
    let margin = choose_margin(step, margin_args, Ok(age)).map_err(|e| other(e.to_string()))?;
    let node = (1..)
        .map(NodeId)
        .find(|n| !backup.replica_ids_ever.contains(n))
        .unwrap_or(NodeId(u64::MAX));
    // The restoring host's wall clock: the true time, or with `--ids` the plan's wrong one. Time-
    // ordered id marks are raised past the latest of it and the backup's highest mark, each moved
    // on by the age; without `--ids` no set has slots, and the clock is only checked against the
    // backup's time.
    let with_ids = world.lock().groups.iter().any(|g| g.ids.is_some());
    let behind = if with_ids { plan.clock_behind_ms } else { 0 };
    let true_ms = super::world::ID_ORIGIN_MS + world.start.elapsed().as_millis() as u64;
    let at = RestoreAt {
        now_ms: true_ms.saturating_sub(behind),
        taken_at_ms: header.taken_at_unix_ms,
        live_ids: live_ids.clone(),
    };
    let (restored, _) = restore(&backup, margin.seqs, node, &at).map_err(|e| other(e.to_string()))?;
    Ok((restored, skipped))
}

/// The most any section's ceiling grew between the backup and the loss.
fn growth(backup: &SetState, lost: &SetState) -> u64 {
    backup
        .sections
        .iter()
        .zip(&lost.sections)
        .map(|(b, l)| l.max_seq.saturating_sub(b.max_seq))
        .max()
        .unwrap_or(0)
}

/// The cluster map as `--map-from` reads it from `set`'s replicas.
async fn live_map(world: &Arc<World>, set: u64) -> Result<storesvr::domain::restore::LiveMap, String> {
    let seeds = (0..REPLICAS)
        .map(|r| Seed::parse(&store_addr(set, r)))
        .collect::<Result<Vec<_>, _>>()?;
    let timeouts = StoreTimeouts {
        attempt: Duration::from_millis(300),
        overall: MAP_READ,
    };
    let token = world.draw(u64::MAX - 1) + 1;
    let dialer = Dialer::in_process(Arc::new(SimConnect { world: world.clone() }), token);
    let admin = AdminClient::with_dialer(seeds, timeouts, &dialer)?;
    let reply = admin
        .cluster_map_reply()
        .await
        .map_err(|e| format!("cannot read the cluster map from set {set}: {e}"))?;
    Ok(storesvr::restore::live_map_of(&reply))
}
