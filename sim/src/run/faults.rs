//! The fault injector of `sim run`: follows the seeded schedule, finds each fault's target when it
//! is due (a section's owner, a set's StoreSvr leader), does the fault through the supervisor and
//! the proxies, and records its span in the history.
//!
//! Deliberately left out: choosing the faults (`crate::schedule`) and the move kinds (`moves`).

use super::{Lab, moves};
use crate::history::{FaultSpan, Record};
use crate::proxy::{FlowMode, LinkMode};
use crate::schedule::{FaultKind, LAG_SEND_WINDOW, PlannedFault, RELEASE_WINDOW};
use crate::topology::{N, Topology, alloc_name, members, set_of, store_name};
use anyhow::Context;
use seqsvr_harness::supervisor::START_MARKER;
use seqsvr_proto::pb;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::time::{Instant, sleep};

/// Injects each planned fault at its time after `start` and records its span; returns after the
/// last one (faults that hold something restore it themselves before they return).
pub(super) async fn inject_all(lab: Arc<Lab>, schedule: Vec<PlannedFault>, start: Instant) -> anyhow::Result<()> {
    for (n, f) in schedule.into_iter().enumerate() {
        tokio::time::sleep_until(start + f.at).await;
        let clock = lab.history.clock();
        let start_ns = clock.now_ns();
        let target = inject(&lab, &f).await?;
        println!("sim: fault {} {} on {target} for {:?}", n + 1, f.kind.name(), f.hold);
        let end_ns = clock.now_ns();
        lab.history.write(&Record::Fault(FaultSpan {
            id: n as u64 + 1,
            kind: f.kind.name().into(),
            target,
            start_ns,
            end_ns,
        }))?;
        lab.faults_done.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

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

/// The AllocSvr that owns section `pick % sections` in the store's route table (retried for
/// [`TARGET_TIMEOUT`]), with a description naming the sections it owns; a seeded guess, marked
/// as such, when no owner is known.
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

/// Applies one fault, waits its hold, heals it. Returns the target's description.
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

/// Injects one fault and holds it for its duration; a description of its target.
pub(super) async fn inject(lab: &Lab, f: &PlannedFault) -> anyhow::Result<String> {
    match f.kind {
        FaultKind::KillAllocOwner | FaultKind::KillStoreLeader | FaultKind::KillStoreFollower => {
            kill_fault(lab, f).await
        }
        FaultKind::PauseAllocShort
        | FaultKind::PauseAllocLong
        | FaultKind::PauseAllocVeryLong
        | FaultKind::PauseStoreLeader => pause_fault(lab, f).await,
        FaultKind::CutAllocFromStore | FaultKind::HoldAllocToStore | FaultKind::LagAllocToStore => {
            owner_link_fault(lab, f).await
        }
        FaultKind::PartitionStoreLeader => partition_leader(lab, f).await,
        FaultKind::DelayLinks => {
            for p in lab.topo.all_proxies() {
                p.set(LinkMode::delay(f.delay));
            }
            sleep(f.hold).await;
            lab.topo.heal_all();
            Ok(format!("all links +{:?}", f.delay))
        }
        FaultKind::TermAlloc | FaultKind::TermAllocTwice => term_fault(lab, f).await,
        FaultKind::KillAllocRegistered => kill_registered(lab, f).await,
        FaultKind::MoveRange | FaultKind::MoveKillCli | FaultKind::MovePausedOwner | FaultKind::MoveUnderFault => {
            moves::move_fault(lab, f).await
        }
    }
}

/// SIGKILL an owner AllocSvr, the StoreSvr leader or a follower; restart it after the hold.
pub(super) async fn kill_fault(lab: &Lab, f: &PlannedFault) -> anyhow::Result<String> {
    let (name, desc) = match f.kind {
        FaultKind::KillAllocOwner => {
            let (a, desc) = owner_of(lab, f.pick).await;
            (alloc_name(a), desc)
        }
        FaultKind::KillStoreLeader => leader_target(lab, f.pick).await,
        _ => {
            let set = set_of_pick(lab, f.pick);
            let leader = store_leader(lab, set).await.unwrap_or(0);
            let followers: Vec<u64> = members(set).filter(|&i| i != leader).collect();
            let n = store_name(followers[(f.pick % followers.len() as u64) as usize]);
            (n.clone(), n)
        }
    };
    lab.cluster.lock().await.kill(&name)?;
    sleep(f.hold).await;
    lab.cluster.lock().await.start(&name)?;
    Ok(desc)
}

/// SIGSTOP an owner AllocSvr or the StoreSvr leader; SIGCONT after the hold.
pub(super) async fn pause_fault(lab: &Lab, f: &PlannedFault) -> anyhow::Result<String> {
    let (name, desc) = match f.kind {
        FaultKind::PauseStoreLeader => leader_target(lab, f.pick).await,
        _ => {
            let (a, desc) = owner_of(lab, f.pick).await;
            (alloc_name(a), desc)
        }
    };
    lab.cluster.lock().await.pause(&name)?;
    sleep(f.hold).await;
    lab.cluster.lock().await.resume(&name)?;
    Ok(desc)
}

/// Drives an owner's links to the store through phases: cut, hold-then-release, or lag.
pub(super) async fn owner_link_fault(lab: &Lab, f: &PlannedFault) -> anyhow::Result<String> {
    let (a, desc) = owner_of(lab, f.pick).await;
    let steps: Vec<(LinkMode, Duration)> = match f.kind {
        FaultKind::HoldAllocToStore => {
            let phases = f.phases.context("a hold fault without its phases")?;
            vec![
                (LinkMode::DROP, phases.drop_first),
                (LinkMode::HOLD, phases.hold),
                (LinkMode::PASS, RELEASE_WINDOW),
                (LinkMode::DROP, phases.drop_after),
            ]
        }
        FaultKind::LagAllocToStore => {
            let lag = f.delay + LAG_SEND_WINDOW;
            let late_requests = LinkMode {
                forward: FlowMode::Delay(f.delay),
                backward: FlowMode::Pass,
            };
            vec![(late_requests, lag), (LinkMode::DROP, f.hold.saturating_sub(lag))]
        }
        _ => vec![(LinkMode::DROP, f.hold)],
    };
    store_links_through(&lab.topo, a, &steps).await;
    Ok(desc)
}

/// Cuts the StoreSvr leader off from both followers for the hold.
pub(super) async fn partition_leader(lab: &Lab, f: &PlannedFault) -> anyhow::Result<String> {
    let set = set_of_pick(lab, f.pick);
    let guess = members(set).start() + f.pick % N;
    let l = store_leader(lab, set).await;
    let desc = match l {
        Some(l) => format!("{} (leader)", store_name(l)),
        None => format!("{} (no leader found; guessed)", store_name(guess)),
    };
    let l = l.unwrap_or(guess);
    let links: Vec<(u64, u64)> = members(set)
        .filter(|&j| j != l)
        .flat_map(|j| [(l, j), (j, l)])
        .collect();
    for k in &links {
        lab.topo.raft[k].set(LinkMode::DROP);
    }
    sleep(f.hold).await;
    for k in &links {
        lab.topo.raft[k].set(LinkMode::PASS);
    }
    Ok(desc)
}

/// SIGTERM an owner AllocSvr and restart it; for `TermAllocTwice`, once more after the hold.
pub(super) async fn term_fault(lab: &Lab, f: &PlannedFault) -> anyhow::Result<String> {
    let (a, desc) = owner_of(lab, f.pick).await;
    let name = alloc_name(a);
    terminate(lab, &name).await?;
    if f.kind == FaultKind::TermAllocTwice {
        lab.cluster.lock().await.start(&name)?;
        sleep(f.hold).await;
        terminate(lab, &name).await?;
    } else {
        sleep(f.hold).await;
    }
    lab.cluster.lock().await.start(&name)?;
    Ok(desc)
}

/// SIGKILL an owner, restart it, SIGKILL it again as soon as it registered; restart after the hold.
pub(super) async fn kill_registered(lab: &Lab, f: &PlannedFault) -> anyhow::Result<String> {
    let (a, desc) = owner_of(lab, f.pick).await;
    let name = alloc_name(a);
    let log = {
        let mut c = lab.cluster.lock().await;
        c.kill(&name)?;
        c.start(&name)?;
        c.log_path(&name).map(|p| p.to_path_buf())
    };
    let seen = match log {
        Some(log) => wait_for_log_line(&log, "registered", TARGET_TIMEOUT).await,
        None => false,
    };
    lab.cluster.lock().await.kill(&name)?;
    sleep(f.hold).await;
    lab.cluster.lock().await.start(&name)?;
    Ok(if seen {
        format!("{desc}; killed again right after it registered")
    } else {
        format!("{desc}; no registration seen, killed again anyway")
    })
}
