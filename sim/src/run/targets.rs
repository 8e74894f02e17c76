//! Finding a fault's target when it is due, and the small actions faults and moves share: the
//! owner of a section (from the store's route table), a set's StoreSvr leader (confirmed by the
//! replica itself), SIGTERM with a grace period, waiting for a log line, and cutting an AllocSvr's
//! links to its store.
//!
//! Deliberately left out: the faults themselves (`faults`) and the moves (`moves`), which both
//! build on this.

use super::Lab;
use crate::proxy::LinkMode;
use crate::topology::{N, Topology, alloc_name, members, set_of, store_name};
use seqsvr_harness::supervisor::START_MARKER;
use seqsvr_proto::pb;
use std::time::Duration;
use tokio::time::{Instant, sleep};

/// How long the injector looks for a fault's intended target before it falls back to a seeded
/// guess (and says so in the target's name).
pub(super) const TARGET_TIMEOUT: Duration = Duration::from_secs(3);

/// The set a StoreSvr fault hits: always set 0 in a one-set run.
pub(super) fn set_of_pick(lab: &Lab, pick: u64) -> u64 {
    (pick >> 8) % lab.stores.len() as u64
}

/// The StoreSvr leader of `set`, confirmed by the replica itself (its own Status names itself
/// leader; the highest term wins if two still do). Retried for [`TARGET_TIMEOUT`].
pub(super) async fn store_leader(lab: &Lab, set: u64) -> Option<u64> {
    let deadline = Instant::now() + TARGET_TIMEOUT;
    loop {
        let mut best: Option<(u64, u64)> = None;
        for (i, c) in lab.replicas.iter().filter(|(i, _)| set_of(*i) == set) {
            let mut c = c.clone();
            if let Ok(Ok(r)) = tokio::time::timeout(Duration::from_millis(500), c.status(pb::StatusRequest {})).await {
                let r = r.into_inner();
                if r.leader_id == *i && best.is_none_or(|(term, _)| r.term > term) {
                    best = Some((r.term, *i));
                }
            }
        }
        if let Some((_, id)) = best {
            return Some(id);
        }
        if Instant::now() > deadline {
            return None;
        }
        sleep(Duration::from_millis(100)).await;
    }
}

/// The StoreSvr leader's name (of the set `pick` chooses), or a seeded guess marked as such.
pub(super) async fn leader_target(lab: &Lab, pick: u64) -> (String, String) {
    let set = set_of_pick(lab, pick);
    match store_leader(lab, set).await {
        Some(l) => (store_name(l), format!("{} (leader)", store_name(l))),
        None => {
            let n = store_name(members(set).start() + pick % N);
            (n.clone(), format!("{n} (no leader found; guessed)"))
        }
    }
}

/// SIGTERM with a grace period; a process that does not leave in time is killed (and said so).
pub(super) async fn terminate(lab: &Lab, name: &str) -> anyhow::Result<()> {
    let clean = lab.cluster.lock().await.terminate(name, Duration::from_secs(5)).await?;
    if !clean {
        println!("sim: {name} did not exit within 5 s of SIGTERM; killed");
    }
    Ok(())
}

/// Waits until the part of `log` after the simulator's last start marker has a line containing
/// `text` (polled every 2 ms: the point is to act before the process's next step).
pub(super) async fn wait_for_log_line(log: &std::path::Path, text: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Ok(all) = std::fs::read_to_string(log) {
            let tail = all.rsplit(START_MARKER).next().unwrap_or("");
            if tail.lines().any(|l| l.contains(text)) {
                return true;
            }
        }
        sleep(Duration::from_millis(2)).await;
    }
    false
}

/// The AllocSvr that owns section `pick % sections` in the store's route table (retried for
/// [`TARGET_TIMEOUT`]), with a description naming the sections it owns; a seeded guess, marked
/// as such, when no owner is known.
pub(super) async fn owner_of(lab: &Lab, pick: u64) -> (u64, String) {
    let section = pick % lab.sections.max(1);
    let deadline = Instant::now() + TARGET_TIMEOUT;
    loop {
        for set in 0..lab.stores.len() as u64 {
            if let Some((node, desc, _)) = owner_in(lab, set, section).await {
                return (node, desc);
            }
        }
        if Instant::now() > deadline {
            let a = pick % N + 1;
            return (a, format!("{} (no owner found; guessed)", alloc_name(a)));
        }
        sleep(Duration::from_millis(100)).await;
    }
}

/// The AllocSvr of set `set` that owns `section` in that set's route table, with a description
/// naming the sections it owns and the run `[begin, end)` of the entry holding `section`; `None`
/// when the set does not serve the section or nobody owns it.
pub(super) async fn owner_in(lab: &Lab, set: u64, section: u64) -> Option<(u64, String, (u64, u64))> {
    let t = lab.stores[set as usize].get_routes().await.ok()?.routes?;
    let e = t
        .entries
        .iter()
        .find(|e| e.section_begin <= section && section < e.section_end)?;
    if e.set_id != set || !members(set).contains(&e.node_id) || e.incarnation == 0 {
        return None;
    }
    let owned: Vec<String> = t
        .entries
        .iter()
        .filter(|o| o.node_id == e.node_id && o.incarnation == e.incarnation)
        .map(|o| format!("{}..{}", o.section_begin, o.section_end))
        .collect();
    let desc = format!("{} (owner of sections {})", alloc_name(e.node_id), owned.join(","));
    Some((e.node_id, desc, (e.section_begin, e.section_end)))
}

/// Puts every AllocSvr→StoreSvr link of AllocSvr `a` through `steps` (mode, how long), in order,
/// then lets them pass again.
pub(super) async fn store_links_through(topo: &Topology, a: u64, steps: &[(LinkMode, Duration)]) {
    for &(mode, how_long) in steps {
        set_store_links(topo, a, mode);
        sleep(how_long).await;
    }
    set_store_links(topo, a, LinkMode::PASS);
}

/// Puts every AllocSvr→StoreSvr link of AllocSvr `a` in `mode`.
pub(super) fn set_store_links(topo: &Topology, a: u64, mode: LinkMode) {
    for j in members(set_of(a)) {
        topo.alloc_store[&(a, j)].set(mode);
    }
}
