//! Time-ordered ids in `sim run --ids`: set 0's id setup (every StoreSvr is given it; the other
//! sets adopt set 0's from the cluster map), each AllocSvr's id clock, the id clients, the id
//! clock faults, and the calls after the heal that show ids are issued again.
//!
//! The StoreSvrs read the host's clock: the true time. Each AllocSvr stamps ids with the host's
//! clock plus an offset it re-reads every 50 ms from its clock file, `<data dir>/allocsvr-N.clock`
//! (`allocsvr --test-clock-file`). The file is that host's clock: it stays across restarts, and
//! the clock faults write it (steps, a drift rewritten every 50 ms, a restart on a clock behind)
//! and put it back to 0 when they end. Slot faults need nothing of their own: a slot's holder is
//! killed, paused past its lease or cut off by the other fault kinds.
//!
//! This mirrors `sim dst --ids` (`crate::dst::ids`, `crate::dst::faults::id_clock_faults`) on real
//! processes; the clients are `crate::id_workload`'s and the checks U1–U4 `crate::checks::ids`.
//!
//! Deliberately left out: moving slot ranges between sets (each set's share of slots is fixed),
//! the Coalescer (it merges calls; what it hands out are the replies recorded here), and clock
//! faults on the StoreSvrs (the allowance is measured against the store leader's clock, which is
//! the true time here).

use super::Lab;
use super::targets::TARGET_TIMEOUT;
use crate::history::{IdsInfo, RunClock};
use crate::id_workload::{self, ID_CLIENT_BASE, IdWorkload, PINNED_ID_CLIENT_BASE};
use crate::schedule::{FaultKind, PlannedFault};
use crate::topology::{N, alloc_name, clock_file};
use crate::workload::Recorder;
use anyhow::Context;
use seqsvr_client::{Client, ClientConfig};
use seqsvr_proto::id_layout::IdLayout;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;
use tokio::time::{Instant, sleep};

/// The allowance between an AllocSvr's clock and the store leader's (`--id-max-ahead-ms`, at its
/// smallest): a 2 s step is within it, a 10 s one beyond.
pub const MAX_AHEAD_MS: u64 = 3_000;
/// Slots each set leases (`--id-slots-per-set`): more than its AllocSvrs, so that a dead holder's
/// slot is not the only one a restarted node can get, and few, so that slots change hands.
pub const SLOTS_PER_SET: u64 = 8;
/// Routing id clients, and their rate (calls/s each).
const CLIENTS: u32 = 2;
const RATE: f64 = 20.0;
/// The rate of the id client pinned to each AllocSvr, and how long it waits for an answer (a
/// paused node answers when it wakes: what shows whether a woken old holder still issues).
const PINNED_RATE: f64 = 4.0;
const PINNED_WAIT: Duration = Duration::from_secs(10);

/// The flags every StoreSvr gets: set 0 sets ids up with them, the others ignore them.
pub fn store_flags(layout: &IdLayout) -> Vec<String> {
    vec![
        format!(
            "--id-layout={}/{}/{}",
            layout.slot_bits, layout.seq_bits, layout.tick_ms
        ),
        format!("--id-epoch-ms={}", layout.epoch_ms),
        format!("--id-slots-per-set={SLOTS_PER_SET}"),
        format!("--id-max-ahead-ms={MAX_AHEAD_MS}"),
    ]
}

/// Sets AllocSvr `a`'s id clock `offset_ms` off the true time. Written to a temporary file and
/// renamed over the clock file, so that the AllocSvr never reads half a number.
pub fn set_clock(dir: &Path, a: u64, offset_ms: i64) -> std::io::Result<()> {
    let path = clock_file(dir, a);
    let tmp = path.with_extension("clock.tmp");
    std::fs::write(&tmp, format!("{offset_ms}\n"))?;
    std::fs::rename(&tmp, &path)
}

/// Every AllocSvr's clock file at 0 (the true time): before the start and at the final heal.
pub fn reset_clocks(dir: &Path, sets: u64) -> std::io::Result<()> {
    for a in 1..=sets * N {
        set_clock(dir, a, 0)?;
    }
    Ok(())
}

/// What the checkers need: the layout, the true time at the run clock's 0 (`clock` has just
/// started), the allowance.
pub fn info(layout: IdLayout, clock: RunClock) -> IdsInfo {
    let unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    IdsInfo {
        layout,
        origin_ms: unix_ms.saturating_sub(clock.now_ns() / 1_000_000),
        max_skew_ms: MAX_AHEAD_MS,
    }
}

fn workload(seed: u64, rate_per_client: f64) -> IdWorkload {
    IdWorkload { seed, rate_per_client }
}

/// Starts the routing id clients and one pinned to each AllocSvr (through its client proxy),
/// until `stop`.
pub(super) async fn start_clients(
    lab: &Lab,
    seed: u64,
    cfg: &ClientConfig,
    rec: &Arc<Recorder>,
    stop: &Arc<AtomicBool>,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let mut workers = Vec::new();
    for c in 0..CLIENTS {
        let client = Client::connect(cfg.clone()).await.context("id client connect")?;
        let worker = id_workload::run_client(
            client,
            ID_CLIENT_BASE + c,
            workload(seed, RATE),
            rec.clone(),
            stop.clone(),
        );
        workers.push(tokio::spawn(worker));
    }
    for (&a, proxy) in &lab.topo.client_alloc {
        let Some(conn) = crate::workload::pinned_conn(&proxy.addr().to_string(), PINNED_WAIT) else {
            continue;
        };
        let worker = id_workload::run_pinned(
            conn,
            PINNED_ID_CLIENT_BASE + a as u32,
            workload(seed, PINNED_RATE),
            PINNED_WAIT,
            rec.clone(),
            stop.clone(),
        );
        workers.push(tokio::spawn(worker));
    }
    Ok(workers)
}

/// After the final heal: ids must be issued again (`checks::liveness::check_ids`). A few calls,
/// each with a long deadline, until one gets ids.
pub async fn verify(cfg: &ClientConfig, rec: &Recorder) -> anyhow::Result<()> {
    let client = Client::connect(ClientConfig {
        deadline: Duration::from_secs(10),
        ..cfg.clone()
    })
    .await
    .context("id client connect")?;
    for _ in 0..5 {
        if id_workload::next_ids(rec, &client, ID_CLIENT_BASE + CLIENTS, 3).await {
            println!("sim: ids are issued again");
            return Ok(());
        }
        sleep(Duration::from_secs(1)).await;
    }
    println!("sim: no ids issued after the heal");
    Ok(())
}

/// Injects an id clock fault: the AllocSvr `pick` chooses (any set's), its clock stepped, drifted
/// or restarted behind for the hold, then put back to the true time.
pub(super) async fn clock_fault(lab: &Lab, f: &PlannedFault) -> anyhow::Result<String> {
    let dir = lab
        .clock_dir
        .as_deref()
        .context("an id clock fault in a run without --ids")?;
    let a = f.pick % (lab.topo.sets * N) + 1;
    let name = alloc_name(a);
    let desc = match f.kind {
        FaultKind::IdClockStep => {
            set_clock(dir, a, f.clock_ms)?;
            sleep(f.hold).await;
            format!("{name} (id clock {:+} ms)", f.clock_ms)
        }
        FaultKind::IdClockDrift => {
            drift(dir, a, f.clock_ms, f.hold).await?;
            format!("{name} (id clock {:+}‰)", f.clock_ms)
        }
        _ => {
            let log = {
                let mut c = lab.cluster.lock().await;
                c.kill(&name)?;
                set_clock(dir, a, f.clock_ms)?;
                c.start(&name)?;
                c.log_path(&name).map(Path::to_path_buf)
            };
            // The hold counts from its registration: it is then about to take a slot.
            let registered = match log {
                Some(log) => super::targets::wait_for_log_line(&log, "registered", TARGET_TIMEOUT).await,
                None => false,
            };
            sleep(f.hold).await;
            let seen = if registered { "" } else { "; no registration seen" };
            format!("{name} (restarted, id clock {:+} ms{seen})", f.clock_ms)
        }
    };
    set_clock(dir, a, 0)?;
    Ok(desc)
}

/// AllocSvr `a`'s id clock gains (or loses) `per_mille` ms a second for `hold`: its file rewritten
/// every 50 ms (as often as the AllocSvr reads it).
async fn drift(dir: &Path, a: u64, per_mille: i64, hold: Duration) -> std::io::Result<()> {
    let every = allocsvr::ids::clock::FOLLOW_EVERY;
    let start = Instant::now();
    loop {
        let elapsed = start.elapsed();
        if elapsed >= hold {
            return Ok(());
        }
        set_clock(dir, a, per_mille * elapsed.as_millis() as i64 / 1_000)?;
        sleep(every.min(hold - elapsed)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_files_hold_the_offset_the_allocsvr_parses() {
        let dir = tempfile::tempdir().unwrap();
        set_clock(dir.path(), 2, -3_600_000).unwrap();
        let text = std::fs::read_to_string(clock_file(dir.path(), 2)).unwrap();
        assert_eq!(text.trim().parse::<i64>(), Ok(-3_600_000));
        reset_clocks(dir.path(), 2).unwrap();
        for a in 1..=6 {
            let text = std::fs::read_to_string(clock_file(dir.path(), a)).unwrap();
            assert_eq!(text.trim(), "0", "allocsvr-{a}");
        }
    }

    #[test]
    fn store_flags_name_the_layout_as_the_storesvr_parses_it() {
        let layout = IdLayout::sonyflake(seqsvr_proto::id_layout::DEFAULT_EPOCH_MS);
        let flags = store_flags(&layout);
        let shape: seqsvr_proto::id_layout::LayoutShape =
            flags[0].strip_prefix("--id-layout=").unwrap().parse().unwrap();
        assert_eq!(shape.with_epoch(layout.epoch_ms), layout);
    }
}
