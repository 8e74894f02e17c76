//! The fault injector of `sim run`: follows the seeded schedule, finds each fault's target when it
//! is due (a section's owner, a set's StoreSvr leader), does the fault through the supervisor and
//! the proxies, and records its span in the history.
//!
//! Deliberately left out: choosing the faults (`crate::schedule`) and the move kinds (`moves`).

use super::targets::{
    TARGET_TIMEOUT, leader_target, owner_of, set_of_pick, store_leader, store_links_through, terminate,
    wait_for_log_line,
};
use super::{Lab, moves};
use crate::history::{FaultSpan, Record};
use crate::proxy::{FlowMode, LinkMode};
use crate::schedule::{FaultKind, LAG_SEND_WINDOW, PlannedFault, RELEASE_WINDOW};
use crate::topology::{N, alloc_name, members, store_name};
use anyhow::Context;
use std::future::Future;
use std::pin::Pin;
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

/// A move's companion fault, through [`inject`] (boxed with its `Send` stated: the compiler cannot
/// infer it for a future that contains itself).
fn companion(lab: &Lab, c: PlannedFault) -> Pin<Box<dyn Future<Output = anyhow::Result<String>> + Send + '_>> {
    Box::pin(async move { inject(lab, &c).await })
}

/// Applies one fault, waits its hold, heals it. Returns the target's description.
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
        FaultKind::TermStoreLeader => {
            let (name, desc) = leader_target(lab, f.pick).await;
            terminate(lab, &name).await?;
            sleep(f.hold).await;
            lab.cluster.lock().await.start(&name)?;
            Ok(desc)
        }
        FaultKind::KillAllocRegistered => kill_registered(lab, f).await,
        FaultKind::MoveRange | FaultKind::MoveKillCli | FaultKind::MovePausedOwner | FaultKind::MoveUnderFault => {
            moves::move_fault(lab, f, &|c| companion(lab, c)).await
        }
        FaultKind::IdClockStep | FaultKind::IdClockDrift | FaultKind::IdClockRestartBehind => {
            super::ids::clock_fault(lab, f).await
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
