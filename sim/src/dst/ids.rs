//! Time-ordered ids in `sim dst --ids`: set 0's setup (a layout drawn from the seed), the id
//! clients, and the calls after the heal that show ids are issued again.
//!
//! The production code runs as for sequences: the store's slot grants and fenced `RaiseMarks`
//! (`storesvr::protocol::ids`, applied by the state machine), the AllocSvr's raiser and issuer,
//! the client library's `next_ids`. Every AllocSvr stamps ids with its own wall clock
//! (`World::id_clock`: the simulated true time plus an offset the clock faults step and drift);
//! every StoreSvr replica reads the true time plus an offset of its own (`Replica::clock_offset_ms`,
//! stepped and drifted by the `store-clock-*` faults), and a leader stamps raises with the
//! quorum's clock (`Group::leader_ms`).
//!
//! The layouts: Twitter's (4,096 ids a millisecond), Sonyflake's (10 ms ticks, 256 a tick) and a
//! small one of 4 ids a millisecond, where a call of a few hundred ids borrows ticks ahead of the
//! clock and a large one is refused.
//!
//! Deliberately left out: moving slot ranges between sets (slot shares are fixed per set) and
//! the Coalescer (it merges calls; what it hands out are the replies recorded here).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use seqsvr_proto::id_layout::{DEFAULT_EPOCH_MS, IdLayout};
use storesvr::domain::slots::SlotCommand;

use super::group::{GroupIds, Wall};
use super::transport::SimConnect;
use super::world::{ID_ORIGIN_MS, World};
use crate::history::IdsInfo;
use crate::id_workload::{self, ID_CLIENT_BASE, IdWorkload, PINNED_ID_CLIENT_BASE};
use crate::workload::Recorder;

/// The allowance between an AllocSvr's clock and the store leader's (`--id-max-ahead-ms`, at its
/// smallest): a 10 s step is beyond it, a 2 s one within.
pub const MAX_AHEAD_MS: u64 = 3_000;
/// Slots each set leases: more than its AllocSvrs, so that a dead holder's slot is not the only
/// one a restarted node can get.
pub const SLOTS_PER_SET: u64 = 8;
/// Routing id clients.
const CLIENTS: u32 = 2;

/// The seed's layout.
pub fn layout(seed: u64) -> IdLayout {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x1d1a_7000_0000_0000);
    match rng.random_range(0..3) {
        0 => IdLayout::twitter(DEFAULT_EPOCH_MS),
        1 => IdLayout::sonyflake(DEFAULT_EPOCH_MS),
        _ => IdLayout {
            tick_ms: 1,
            epoch_ms: DEFAULT_EPOCH_MS,
            slot_bits: 8,
            seq_bits: 2,
        },
    }
}

/// Gives every group its wall clock and set 0 its setup; returns what the checkers need.
pub fn set_up(world: &Arc<World>, seed: u64) -> IdsInfo {
    let layout = layout(seed);
    let wall = Wall(world.start.into_std(), ID_ORIGIN_MS);
    for (set, g) in world.lock().groups.iter_mut().enumerate() {
        g.ids = Some(GroupIds {
            setup: (set == 0).then_some(SlotCommand::Setup {
                layout,
                per_set: SLOTS_PER_SET,
                max_ahead_ms: MAX_AHEAD_MS,
            }),
        });
        g.wall = Some(wall);
    }
    IdsInfo {
        layout,
        origin_ms: ID_ORIGIN_MS,
        max_skew_ms: MAX_AHEAD_MS,
    }
}

fn workload(seed: u64, rate_per_client: f64) -> IdWorkload {
    IdWorkload { seed, rate_per_client }
}

/// The routing id clients, and one pinned to each AllocSvr that waits for its answer however long
/// the node takes, until `stop`.
pub fn spawn_clients(world: &Arc<World>, seed: u64, rec: &Arc<Recorder>, stop: &Arc<AtomicBool>) {
    for c in 0..CLIENTS {
        let id = ID_CLIENT_BASE + c;
        let client = super::client(world, seed, id, Duration::from_secs(2));
        tokio::spawn(id_workload::run_client(
            client,
            id,
            workload(seed, 40.0),
            rec.clone(),
            stop.clone(),
        ));
    }
    let addrs: Vec<String> = world.lock().allocs.iter().map(|s| s.addr.clone()).collect();
    let via: Arc<dyn seqsvr_client::Connect> = Arc::new(SimConnect { world: world.clone() });
    for (i, addr) in addrs.into_iter().enumerate() {
        let conn = seqsvr_client::Conn::InProcess {
            addr: addr.into(),
            via: via.clone(),
        };
        let alloc = seqsvr_proto::pb::alloc_service_client::AllocServiceClient::new(conn);
        let id = PINNED_ID_CLIENT_BASE + i as u32;
        tokio::spawn(id_workload::run_pinned(
            alloc,
            id,
            workload(seed, 5.0),
            Duration::from_secs(10),
            rec.clone(),
            stop.clone(),
        ));
    }
}

/// After the heal: ids must be issued again (`checks::liveness::check_ids`). A few calls, each
/// with a long deadline, until one gets ids.
pub async fn verify(world: &Arc<World>, seed: u64, rec: &Arc<Recorder>) {
    let id = ID_CLIENT_BASE + CLIENTS;
    let client = super::client(world, seed, id, Duration::from_secs(10));
    for _ in 0..3 {
        if id_workload::next_ids(rec, &client, id, 3).await {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
