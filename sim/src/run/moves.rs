//! Operator moves as faults: the simulator runs the real `seqctl` as a process (so a move can be
//! killed mid-way, as an operator's terminal can be) to move a seeded section range from the set
//! that serves it to another set, under the workload, and records every move in the history
//! ([`MoveSpan`]) for the one-set-at-a-time checker.
//!
//! A move that was interrupted is finished before the next move starts and again after the final
//! heal ([`finish_all`]): `seqctl move resume` until the cluster map says done or cancelled. A move
//! the map never recorded (its `seqctl` died before the record committed) moved nothing.
//!
//! Deliberately left out: moves that run at the same time (the map allows disjoint ones; one at a
//! time keeps a failing run explainable) and `seqctl alloc drain` (the end-to-end tests cover it).

use super::Lab;
use super::targets::{owner_in, set_store_links};
use crate::history::{MoveSpan, Record};
use crate::proxy::LinkMode;
use crate::schedule::{FaultKind, PlannedFault};
use crate::topology::{Topology, alloc_name};
use crate::workload::{STALE_CLIENT_BASE, pinned_call, pinned_conn};
use anyhow::{Context, anyhow, bail};
use seqsvr_control::{Mover, StoreTimeouts};
use seqsvr_proto::pb;
use std::future::Future;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::time::{Instant, sleep};

/// How long one `seqctl` command may run before the simulator gives up on it (it is killed).
const SEQCTL_LIMIT: Duration = Duration::from_secs(30);
/// How often an unfinished move is resumed before the run fails as a harness error.
const RESUME_ATTEMPTS: u32 = 10;

fn mover(topo: &Topology) -> anyhow::Result<Mover> {
    let timeouts = StoreTimeouts {
        attempt: Duration::from_millis(500),
        overall: Duration::from_secs(5),
    };
    let dialer = seqsvr_control::Dialer::with_tls(crate::tls::admin());
    Mover::with_dialer(topo.store_seeds(0), timeouts, rand::random::<u64>() | 1, dialer).map_err(anyhow::Error::msg)
}

/// Puts set `set` (running, empty) into the cluster map.
pub(super) async fn add_set(topo: &Topology, set: u64) -> anyhow::Result<()> {
    let stores = topo.store_list(set).split(',').map(String::from).collect();
    mover(topo)?
        .add_set(set, stores)
        .await
        .map_err(|e| anyhow!("adding set {set} to the cluster map: {e}"))?;
    Ok(())
}

/// A range to move: sections `[begin, end)` from set `from` to set `to`.
#[derive(Clone, Copy, Debug)]
struct Pick {
    from: u64,
    to: u64,
    begin: u64,
    end: u64,
}

impl Pick {
    fn uids(&self, lab: &Lab) -> String {
        let hi = (self.end * lab.section_size).min(lab.uid_limit);
        format!("{}..{}", self.begin * lab.section_size, hi)
    }
}

/// The range a move fault moves: from section `pick % sections`, up to 4 sections of the map range
/// that holds it (for `MovePausedOwner`: the whole run its owner holds, so the paused owner's
/// stale clients ask for the moved range), to another set.
async fn pick_range(lab: &Lab, f: &PlannedFault) -> anyhow::Result<(Pick, Option<u64>)> {
    let map = mover(&lab.topo)?
        .map()
        .await
        .map_err(|e| anyhow!("reading the map: {e}"))?;
    let section = f.pick % lab.sections;
    let r = map
        .ranges
        .iter()
        .find(|r| r.section_begin <= section && section < r.section_end)
        .with_context(|| format!("the cluster map does not cover section {section}"))?;
    let sets = lab.stores.len() as u64;
    let to = (r.set_id + 1 + (f.pick >> 40) % (sets - 1)) % sets;
    let mut pick = Pick {
        from: r.set_id,
        to,
        begin: section,
        end: (section + 1 + (f.pick >> 20) % 4).min(r.section_end),
    };
    let mut owner = None;
    if f.kind == FaultKind::MovePausedOwner
        && let Some((node, begin, end)) = owner_run(lab, pick.from, section).await
    {
        pick.begin = begin.max(r.section_begin);
        pick.end = end.min(r.section_end);
        owner = Some(node);
    }
    Ok((pick, owner))
}

/// The AllocSvr of `set` owning `section` and the run of sections its route entry covers.
async fn owner_run(lab: &Lab, set: u64, section: u64) -> Option<(u64, u64, u64)> {
    let (node, _, (begin, end)) = owner_in(lab, set, section).await?;
    Some((node, begin, end))
}

/// How a move fault has its companion fault injected (the fault injector's own `inject`, handed
/// in so that the injector and the moves do not import each other).
pub(super) type Inject<'a> =
    &'a (dyn Fn(PlannedFault) -> Pin<Box<dyn Future<Output = anyhow::Result<String>> + Send + 'a>> + Sync);

/// Injects one move fault; a description of what it moved and what else it did.
pub(super) async fn move_fault(lab: &Lab, f: &PlannedFault, inject: Inject<'_>) -> anyhow::Result<String> {
    finish_all(lab).await?;
    let (pick, owner) = pick_range(lab, f).await?;
    let what = format!(
        "sections {}..{} from set {} to set {}",
        pick.begin, pick.end, pick.from, pick.to
    );
    let start_ns = lab.history.clock().now_ns();
    let (op, extra) = match f.kind {
        FaultKind::MoveKillCli => kill_cli_move(lab, f, &pick).await?,
        FaultKind::MovePausedOwner => paused_owner_move(lab, f, &pick, owner).await?,
        FaultKind::MoveUnderFault => {
            let c = f.companion.context("a move-under-fault without its companion")?;
            // The companion's target is the source's owner of the range (or a seeded set's leader).
            let companion = PlannedFault {
                kind: c.kind,
                hold: c.hold,
                pick: pick.begin,
                companion: None,
                ..*f
            };
            let (moved, hit) = tokio::join!(seqctl_move(lab, &pick, None), inject(companion));
            (moved?, format!("; with {} on {}", c.kind.name(), hit?))
        }
        _ => (seqctl_move(lab, &pick, None).await?, String::new()),
    };
    let Some(op) = op else {
        return Ok(format!("{what}: the move was never recorded{extra}"));
    };
    let done = finish(lab, op, pick, start_ns).await?;
    let outcome = if done { "done" } else { "cancelled" };
    Ok(format!("{what} (op {op}, {outcome}){extra}"))
}

/// Runs `seqctl move` for `pick`, SIGKILLed after `kill_after` if given. The op id it printed
/// first (`None` when it died before printing one).
async fn seqctl_move(lab: &Lab, pick: &Pick, kill_after: Option<Duration>) -> anyhow::Result<Option<u64>> {
    let (from, to, uids) = (pick.from.to_string(), pick.to.to_string(), pick.uids(lab));
    let args = ["move", "--from", &from, "--to", &to, "--uids", &uids];
    let out = seqctl(lab, &args, kill_after).await?;
    Ok(out.lines().find_map(|l| {
        l.strip_prefix("move ")
            .and_then(|rest| rest.split(':').next())
            .and_then(|op| op.parse().ok())
    }))
}

/// A move whose `seqctl` is SIGKILLed mid-way; after the hold, for odd picks, a cancel (refused
/// past the seal), then the caller resumes whatever is left. For one pick in four the cancel's
/// own `seqctl` is SIGKILLed too, a few ms in: often between the map's `cancelling` and the sets'
/// range steps, which the resume must then finish (a cancel is still work to do until both sets
/// gave the range back).
async fn kill_cli_move(lab: &Lab, f: &PlannedFault, pick: &Pick) -> anyhow::Result<(Option<u64>, String)> {
    let op = seqctl_move(lab, pick, Some(f.delay)).await?;
    sleep(f.hold.saturating_sub(f.delay + shared_lease(lab))).await;
    let mut extra = format!("; seqctl killed after {:?}", f.delay);
    if let Some(op) = op
        && f.pick % 2 == 1
    {
        let cut = (f.pick % 4 == 3).then(|| Duration::from_millis(5 + (f.pick >> 8) % 60));
        let out = seqctl(lab, &["move", "cancel", &op.to_string()], cut).await?;
        let said = match cut {
            _ if out.contains("cancelled") => "; cancelled".to_string(),
            Some(after) if !out.contains("error") => format!("; cancel cut off after {after:?}"),
            _ => "; cancel refused".to_string(),
        };
        extra.push_str(&said);
    }
    Ok((op, extra))
}

/// The schedule adds a lease to every move's hold for the move itself; what is left is the wait.
fn shared_lease(lab: &Lab) -> Duration {
    Duration::from_millis(lab.lease_ms)
}

/// A move while the source's owner of the range is paused: it cannot release, and it wakes
/// during the move's lease wait still holding its lease, then learns from its next renewal that
/// the range is frozen or gone.
///
/// Stale callers queue requests for the moved range's hot uids at the paused owner, as clients
/// with an old route would: once the move has returned, or a quarter of the pause before the wake
/// if it is still waiting. The woken owner answers them under its lease: harmless while the target
/// waits that lease out (the protocol), two sets serving one section when it does not
/// (`--unsafe-skip-move-wait`). Without them the control would hang on the pinned client's one
/// in-flight call happening to ask for a moved section that the target had served already.
///
/// The owner's links to its store are held (bytes buffered, not lost) from just before the wake
/// until the stale calls are answered, or [`STALE_HOLD_LIMIT`]: a paused process whose network is
/// slow too. Without the hold, the woken owner's overdue renewal raced the queued calls, and when
/// its reply came first the owner had let go of the range before reading them; the negative
/// control then passed (seen in a CI run). With it the calls are read first on every run.
async fn paused_owner_move(
    lab: &Lab,
    f: &PlannedFault,
    pick: &Pick,
    owner: Option<u64>,
) -> anyhow::Result<(Option<u64>, String)> {
    let Some(node) = owner else {
        return Ok((seqctl_move(lab, pick, None).await?, "; no owner found to pause".into()));
    };
    let name = alloc_name(node);
    let pause = f.hold.saturating_sub(shared_lease(lab));
    let wake = Instant::now() + pause;
    lab.cluster.lock().await.pause(&name)?;
    let mut moving = std::pin::pin!(seqctl_move(lab, pick, None));
    let moved = tokio::select! {
        r = &mut moving => Some(r),
        () = tokio::time::sleep_until(wake - pause / 4) => None,
    };
    let stale = stale_callers(lab, node, pick, pause + STALE_CALL_GRACE);
    tokio::time::sleep_until(wake).await;
    set_store_links(&lab.topo, node, LinkMode::HOLD);
    lab.cluster.lock().await.resume(&name)?;
    let queued = stale.len();
    let answered = async {
        for call in stale {
            call.await.context("a stale caller")?;
        }
        anyhow::Ok(())
    };
    let mut answered = std::pin::pin!(answered);
    let early = tokio::time::timeout(STALE_HOLD_LIMIT, &mut answered).await;
    set_store_links(&lab.topo, node, LinkMode::PASS);
    match early {
        Ok(r) => r?,
        Err(_) => answered.await?,
    }
    let op = match moved {
        Some(r) => r,
        None => moving.await,
    };
    Ok((
        op?,
        format!("; {name} paused for {pause:?}, {queued} stale calls queued"),
    ))
}

/// The longest the woken owner's links to its store stay held while its stale calls are answered.
/// Answers from memory take milliseconds; a call that needs the store waits until the links pass
/// again.
const STALE_HOLD_LIMIT: Duration = Duration::from_secs(1);
/// How long a stale caller waits past the pause for its answer.
const STALE_CALL_GRACE: Duration = Duration::from_secs(2);
/// Hot uids per moved section that stale callers ask for.
const STALE_UIDS_PER_SECTION: usize = 2;

/// One task per stale call: a hot uid of each section of `pick`, asked of AllocSvr `node` directly
/// (no routing), each with its own client id.
fn stale_callers(lab: &Lab, node: u64, pick: &Pick, wait: Duration) -> Vec<tokio::task::JoinHandle<()>> {
    let Some(proxy) = lab.topo.client_alloc.get(&node) else {
        return Vec::new();
    };
    let Some(conn) = pinned_conn(&proxy.addr().to_string(), wait) else {
        return Vec::new();
    };
    let size = lab.section_size;
    let uids = (pick.begin..pick.end).flat_map(|s| {
        let in_section = move |u: &&u64| **u / size == s;
        lab.hot.iter().filter(in_section).take(STALE_UIDS_PER_SECTION).copied()
    });
    uids.map(|uid| {
        let (mut conn, rec) = (conn.clone(), lab.rec.clone());
        let client = STALE_CLIENT_BASE + lab.stale_calls.fetch_add(1, Ordering::Relaxed) as u32;
        tokio::spawn(async move { pinned_call(&mut conn, client, uid, wait, &rec).await })
    })
    .collect()
}

/// Resumes move `op` until the map says it is done (true) or cancelled (false), then records it.
async fn finish(lab: &Lab, op: u64, pick: Pick, start_ns: u64) -> anyhow::Result<bool> {
    for attempt in 0..RESUME_ATTEMPTS {
        let map = mover(&lab.topo)?
            .map()
            .await
            .map_err(|e| anyhow!("reading the map: {e}"));
        let phase = map
            .ok()
            .and_then(|m| m.moves.iter().find(|m| m.op == op).map(|m| m.phase()));
        match phase {
            Some(pb::MovePhase::Done) | Some(pb::MovePhase::Cancelled) => {
                let done = phase == Some(pb::MovePhase::Done);
                lab.history.write(&Record::Move(MoveSpan {
                    op,
                    sections: (pick.begin, pick.end),
                    from: pick.from,
                    to: pick.to,
                    start_ns,
                    end_ns: lab.history.clock().now_ns(),
                    done,
                }))?;
                return Ok(done);
            }
            Some(_) => {
                seqctl(lab, &["move", "resume", &op.to_string()], None).await?;
            }
            // Not readable, or not recorded yet: a Begin may still be on its way.
            None => {}
        }
        sleep(Duration::from_millis(200 * (attempt as u64 + 1))).await;
    }
    bail!("move {op} neither done nor cancelled after {RESUME_ATTEMPTS} resumes")
}

/// Finishes every move the map has in progress (one a killed `seqctl` left behind).
pub(super) async fn finish_all(lab: &Lab) -> anyhow::Result<()> {
    if lab.stores.len() < 2 {
        return Ok(());
    }
    let map = mover(&lab.topo)?
        .map()
        .await
        .map_err(|e| anyhow!("reading the map: {e}"))?;
    for m in &map.moves {
        if matches!(m.phase(), pb::MovePhase::Done | pb::MovePhase::Cancelled) {
            continue;
        }
        let s = m.sections.unwrap_or_default();
        let pick = Pick {
            from: m.from_set,
            to: m.to_set,
            begin: s.begin,
            end: s.end,
        };
        let start_ns = lab.history.clock().now_ns();
        finish(lab, m.op, pick, start_ns).await?;
    }
    Ok(())
}

/// Runs `seqctl ARGS` against set 0's StoreSvrs; everything it prints goes to `logs/seqctl.log`
/// and is returned. SIGKILLed after `kill_after` if given, and after [`SEQCTL_LIMIT`] in any case.
async fn seqctl(lab: &Lab, args: &[&str], kill_after: Option<Duration>) -> anyhow::Result<String> {
    let store = lab.topo.store_list(0);
    let mut child = tokio::process::Command::new(&lab.seqctl)
        .args(["--store", &store])
        .args(crate::tls::flags(seqsvr_auth::Role::Admin))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting seqctl")?;
    let stderr = child.stderr.take().context("seqctl stderr")?;
    let stdout = child.stdout.take().context("seqctl stdout")?;
    let lines = tokio::spawn(async move {
        let mut out = String::new();
        let mut err = BufReader::new(stderr).lines();
        while let Ok(Some(l)) = err.next_line().await {
            out.push_str(&l);
            out.push('\n');
        }
        let mut rest = BufReader::new(stdout).lines();
        while let Ok(Some(l)) = rest.next_line().await {
            out.push_str(&l);
            out.push('\n');
        }
        out
    });
    let limit = kill_after.unwrap_or(SEQCTL_LIMIT).min(SEQCTL_LIMIT);
    let status = match tokio::time::timeout(limit, child.wait()).await {
        Ok(status) => status?.to_string(),
        Err(_) => {
            child.kill().await?;
            "killed by the simulator".into()
        }
    };
    let out = lines.await?;
    let mut log = tokio::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(lab.logs.join("seqctl.log"))
        .await?;
    let text = format!("$ seqctl {}\n{out}({status})\n", args.join(" "));
    log.write_all(text.as_bytes()).await?;
    Ok(out)
}
