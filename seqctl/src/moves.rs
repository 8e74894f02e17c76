//! `seqctl sets`, `seqctl set add` and `seqctl move …`: the cluster map and moves of uid ranges
//! between sets, over `seqsvr_control::Mover`.
//!
//! `--store` names StoreSvrs of set 0, where the map lives; every other set is reached at the
//! addresses the map lists. Refusals exit 2 and change nothing; a map that changed under the
//! caller exits 1 with its new version; a move interrupted mid-way exits 1 and says how to resume.
//!
//! Progress goes to stderr: when both stdout and stderr are terminals, as a progress bar through
//! the steps with the lease wait counting down; otherwise as plain lines, one per step and one per
//! second of the lease wait (scripts and tests parse them). Either way the op id comes first.
//!
//! Left out here: `alloc drain`, which is `drain.rs`.

use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use seqsvr_control::mover::{Plan, Progress};
use seqsvr_control::{MoveError, Mover};
use seqsvr_proto::pb;
use serde_json::{Value, json};

use crate::{EXIT_FAILED, EXIT_USAGE, Failure, table, timeouts};

#[derive(Subcommand, Debug)]
pub enum SetCmd {
    /// Put a new, empty set into the cluster map (its StoreSvr group must already be running,
    /// started with --set-id ID).
    Add {
        id: u64,
        /// The new set's StoreSvr addresses, host:port, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        stores: Vec<String>,
    },
}

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct MoveArgs {
    #[command(subcommand)]
    pub action: Option<MoveCmd>,
    /// The set that serves the range now.
    #[arg(long)]
    pub from: Option<u64>,
    /// The set that will serve it.
    #[arg(long)]
    pub to: Option<u64>,
    /// The uids to move, LO..HI (HI excluded), on section boundaries.
    #[arg(long)]
    pub uids: Option<String>,
    /// Print the plan and change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Subcommand, Debug)]
pub enum MoveCmd {
    /// One move's record.
    Status { op: u64 },
    /// Every move the map records.
    List,
    /// Take a move over (from a driver that died) and finish it (a move being cancelled: finish
    /// the cancel).
    Resume { op: u64 },
    /// Cancel a move before its seal (after it, move the range back instead). Repeat it to finish
    /// a cancel that was cut off.
    Cancel { op: u64 },
}

impl From<MoveError> for Failure {
    fn from(e: MoveError) -> Self {
        match e {
            MoveError::Refused(m) => Failure {
                code: EXIT_USAGE,
                message: m,
            },
            MoveError::VersionChanged(v) => Failure {
                code: EXIT_FAILED,
                message: format!("the cluster map changed under you: it is at version {v} now; look again and retry"),
            },
            // The servers' own refusals (an overlap found there, a step out of order) change
            // nothing either: bad input, like the ones caught here.
            MoveError::Control(seqsvr_control::ControlError::Rejected(s))
                if matches!(s.code(), tonic::Code::FailedPrecondition | tonic::Code::InvalidArgument) =>
            {
                Failure {
                    code: EXIT_USAGE,
                    message: s.message().to_string(),
                }
            }
            MoveError::Control(c) => Failure::of_write(c),
        }
    }
}

fn mover(cli: &crate::Cli) -> Result<Mover, Failure> {
    let seeds = crate::store_seeds(cli)?;
    Mover::with_dialer(seeds, timeouts(cli), rand::random::<u64>() | 1, crate::dialer(cli)?).map_err(Failure::usage)
}

pub async fn sets(cli: &crate::Cli) -> Result<String, Failure> {
    let map = mover(cli)?.map().await?;
    let mut health = Vec::new();
    for s in &map.sets {
        health.push(set_health(cli, s).await);
    }
    if cli.json {
        let mut v = map_json(&map);
        for (set, h) in v["sets"].as_array_mut().into_iter().flatten().zip(&health) {
            set["health"] = h.json();
        }
        return Ok(v.to_string());
    }
    let rows = map
        .sets
        .iter()
        .zip(&health)
        .map(|(s, h)| {
            vec![
                s.set_id.to_string(),
                uid_ranges(&map, s.set_id),
                h.leader(),
                h.members(),
                h.allocsvrs(),
                h.state(),
            ]
        })
        .collect();
    Ok(format!(
        "cluster map version {}\n{}\n{}",
        map.version,
        id_slots_line(&map),
        table(&["set", "ranges", "leader", "stores", "allocsvrs", "health"], rows)
    ))
}

/// The cluster's time-ordered id layout and how slots are shared between sets.
fn id_slots_line(map: &pb::ClusterMap) -> String {
    let layout = map
        .ids
        .as_ref()
        .and_then(|i| seqsvr_proto::id_layout::IdLayout::from_pb(i.layout.as_ref()?).ok());
    match (layout, map.ids.as_ref()) {
        (Some(l), Some(i)) => format!(
            "time-ordered ids: layout {l}; set K leases slots [K*{n}, (K+1)*{n}) (at most {} sets)",
            l.slots() / i.slots_per_set.max(1),
            n = i.slots_per_set
        ),
        _ => "time-ordered ids: not set up".into(),
    }
}

/// `uids LO..HI` of every map range of `set`.
fn uid_ranges(map: &pb::ClusterMap, set: u64) -> String {
    let ranges: Vec<String> = map
        .ranges
        .iter()
        .filter(|r| r.set_id == set)
        .map(|r| {
            format!(
                "uids {}..{}",
                r.section_begin * map.section_size,
                (r.section_end * map.section_size).min(map.uid_limit)
            )
        })
        .collect();
    if ranges.is_empty() {
        "(none)".into()
    } else {
        ranges.join(" ")
    }
}

/// What one set's StoreSvrs say about themselves: its leader's Status, or why there is none.
struct SetHealth {
    stores: Vec<String>,
    status: Result<pb::StatusReply, String>,
    /// Each member's own release (`status::store_version`), or why it did not answer.
    versions: std::collections::BTreeMap<u64, String>,
}

impl SetHealth {
    fn leader(&self) -> String {
        match &self.status {
            Ok(s) if s.leader_id != 0 => format!("{}={}", s.leader_id, s.leader_addr),
            _ => "-".into(),
        }
    }

    fn members(&self) -> String {
        match &self.status {
            Ok(s) if !s.members.is_empty() => {
                let m: Vec<String> = s
                    .members
                    .iter()
                    .map(|r| {
                        let v = self.versions.get(&r.node_id).map_or("?", String::as_str);
                        format!("{}={} [{v}]", r.node_id, r.addr)
                    })
                    .collect();
                m.join(",")
            }
            _ => self.stores.join(","),
        }
    }

    fn allocsvrs(&self) -> String {
        let Ok(s) = &self.status else {
            return "-".into();
        };
        let a: Vec<String> = s
            .allocsvrs
            .iter()
            .map(|a| {
                let dead = if a.alive { "" } else { " (dead)" };
                let version = crate::status::alloc_version(a);
                format!(
                    "{}@{} {} sections{dead} [{version}]",
                    a.node_id, a.addr, a.sections_owned
                )
            })
            .collect();
        if a.is_empty() { "(none)".into() } else { a.join(", ") }
    }

    /// `ok` when a leader answered; otherwise what went wrong (no quorum, unreachable).
    fn state(&self) -> String {
        match &self.status {
            Ok(s) if s.leader_id != 0 => "ok".into(),
            Ok(_) => "no leader".into(),
            Err(e) => format!("unreachable: {e}"),
        }
    }

    fn json(&self) -> Value {
        match &self.status {
            Ok(s) => json!({
                "state": self.state(),
                "leader_id": s.leader_id,
                "leader_addr": s.leader_addr,
                "members": s.members.iter().map(|r| json!({"node_id": r.node_id, "addr": r.addr, "voter": r.voter,
                    "version": self.versions.get(&r.node_id)})).collect::<Vec<_>>(),
                "allocsvrs": s.allocsvrs.iter().map(|a| json!({"node_id": a.node_id, "incarnation": a.incarnation,
                    "addr": a.addr, "alive": a.alive, "sections_owned": a.sections_owned,
                    "version": crate::status::alloc_version(a)})).collect::<Vec<_>>(),
                "route_version": s.route_version,
            }),
            Err(_) => json!({"state": self.state()}),
        }
    }
}

/// Asks set `s`'s StoreSvrs (at the addresses the map lists) for their leader's Status.
async fn set_health(cli: &crate::Cli, s: &pb::SetInfo) -> SetHealth {
    let seeds: Result<Vec<seqsvr_control::Seed>, String> =
        s.stores.iter().map(|a| seqsvr_control::Seed::parse(a)).collect();
    let dialer = crate::dialer(cli).map_err(|f| f.message);
    let store = seeds.and_then(|seeds| seqsvr_control::StoreClient::with_dialer(seeds, timeouts(cli), &dialer?));
    let mut status = match store {
        Ok(store) => store.status().await.map_err(|e| e.to_string()),
        Err(e) => Err(e),
    };
    // Liveness of AllocSvrs is known only on the leader (a follower calls every one dead): take
    // the leader's view, as `seqctl status` does.
    if let Ok(view) = &status
        && view.leader_id != 0
        && view.leader_id != view.node_id
        && !view.leader_addr.is_empty()
        && let Ok(seeds) = s
            .stores
            .iter()
            .map(|a| seqsvr_control::Seed::parse(a))
            .collect::<Result<Vec<_>, _>>()
        && let Ok(leader_view) = crate::status::single_status(
            cli,
            &crate::status::configured_addr(&seeds, view.leader_id, &view.leader_addr),
        )
        .await
    {
        status = Ok(leader_view);
    }
    let versions = match &status {
        Ok(view) => member_versions(cli, s, view).await,
        Err(_) => Default::default(),
    };
    SetHealth {
        stores: s.stores.clone(),
        status,
        versions,
    }
}

/// What each member of the set says it runs (a half-done upgrade shows as a mix), asked at the
/// address the map lists for it.
async fn member_versions(
    cli: &crate::Cli,
    s: &pb::SetInfo,
    view: &pb::StatusReply,
) -> std::collections::BTreeMap<u64, String> {
    let seeds: Vec<seqsvr_control::Seed> = s
        .stores
        .iter()
        .filter_map(|a| seqsvr_control::Seed::parse(a).ok())
        .collect();
    let mut out = std::collections::BTreeMap::new();
    for m in &view.members {
        let addr = crate::status::configured_addr(&seeds, m.node_id, &m.addr);
        let v = match crate::status::single_status(cli, &addr).await {
            Ok(own) => crate::status::store_version(&own).to_owned(),
            Err(_) => "unreachable".to_owned(),
        };
        out.insert(m.node_id, v);
    }
    out
}

pub async fn set(cli: &crate::Cli, cmd: &SetCmd) -> Result<String, Failure> {
    let SetCmd::Add { id, stores } = cmd;
    for s in stores {
        seqsvr_control::Seed::parse(s).map_err(Failure::usage)?;
    }
    let r = mover(cli)?.add_set(*id, stores.clone()).await?;
    Ok(if cli.json {
        json!({"set_id": id, "map_version": r.version, "already": r.already}).to_string()
    } else if r.already {
        format!("set {id} was already in the map (version {})", r.version)
    } else {
        format!("set {id} added; cluster map version {}", r.version)
    })
}

pub async fn moves(cli: &crate::Cli, args: &MoveArgs) -> Result<String, Failure> {
    let m = mover(cli)?;
    match &args.action {
        Some(MoveCmd::List) => {
            let map = m.map().await?;
            Ok(render_moves(cli.json, &map, &map.moves))
        }
        Some(MoveCmd::Status { op }) => {
            let map = m.map().await?;
            let found: Vec<pb::MoveInfo> = map.moves.iter().filter(|x| x.op == *op).cloned().collect();
            if found.is_empty() {
                return Err(Failure::usage(format!("no move {op} in the cluster map")));
            }
            Ok(render_moves(cli.json, &map, &found))
        }
        Some(MoveCmd::Resume { op }) => {
            m.claim(*op).await?;
            drive(&m, *op, cli.json).await
        }
        Some(MoveCmd::Cancel { op }) => {
            m.cancel(*op).await?;
            Ok(if cli.json {
                json!({"op": op, "cancelled": true}).to_string()
            } else {
                format!("move {op} cancelled; the source serves the range again")
            })
        }
        None => start(cli, &m, args).await,
    }
}

/// `LO..HI` in uids.
fn parse_uids(s: &str) -> Result<(u64, u64), Failure> {
    let (lo, hi) = s
        .split_once("..")
        .ok_or_else(|| Failure::usage(format!("--uids {s:?} is not LO..HI")))?;
    let num = |x: &str| {
        x.trim()
            .parse::<u64>()
            .map_err(|_| Failure::usage(format!("--uids {s:?}: {x:?} is not a number")))
    };
    Ok((num(lo)?, num(hi)?))
}

async fn start(cli: &crate::Cli, m: &Mover, args: &MoveArgs) -> Result<String, Failure> {
    let (Some(from), Some(to), Some(uids)) = (args.from, args.to, args.uids.as_deref()) else {
        return Err(Failure::usage("a move needs --from SET --to SET --uids LO..HI"));
    };
    let (lo, hi) = parse_uids(uids)?;
    let map = m.map().await?;
    let (begin, end) = Mover::sections_of(&map, lo, hi)?;
    let plan = m.plan(from, to, begin, end).await?;
    if args.dry_run {
        return Ok(render_plan(cli.json, &plan, &map, lo, hi));
    }
    let op = rand::random::<u64>() >> 1;
    // The op id first: whatever happens next, the operator can resume or cancel it.
    eprintln!("move {op}: sections [{begin}, {end}) (uids {lo}..{hi}) from set {from} to set {to}");
    m.begin(op, &plan).await?;
    let mut reporter = Reporter::new(op);
    reporter.recorded(op, plan.map_version + 1);
    drive_with(m, op, cli.json, reporter).await
}

/// The steps of a move, RECORDED (1) to DONE (7): a phase's number is its position on the bar.
const STEPS: u64 = pb::MovePhase::Done as u64;

const BAR_TEMPLATE: &str = "move {prefix}: {spinner} [{bar:28}] {pos}/{len} {msg} ({elapsed})";

fn bar_style() -> ProgressStyle {
    ProgressStyle::with_template(BAR_TEMPLATE)
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar())
}

/// How a running move is reported: a bar on a terminal, plain lines otherwise.
enum Reporter {
    Lines {
        started: Instant,
        last_wait_line: Option<Instant>,
    },
    Bar {
        started: Instant,
        bar: ProgressBar,
    },
}

impl Reporter {
    fn new(op: u64) -> Self {
        use std::io::IsTerminal;
        let started = Instant::now();
        if !(std::io::stdout().is_terminal() && std::io::stderr().is_terminal()) {
            return Reporter::Lines {
                started,
                last_wait_line: None,
            };
        }
        let bar = ProgressBar::new(STEPS)
            .with_style(bar_style())
            .with_prefix(op.to_string());
        bar.enable_steady_tick(Duration::from_millis(100));
        Reporter::Bar { started, bar }
    }

    fn recorded(&mut self, op: u64, version: u64) {
        match self {
            Reporter::Lines { .. } => eprintln!("move {op}: recorded (map version {version})"),
            Reporter::Bar { bar, .. } => {
                bar.set_position(pb::MovePhase::Recorded as u64);
                bar.set_message(format!("recorded (map version {version})"));
            }
        }
    }

    fn report(&mut self, p: Progress) {
        match (self, p) {
            (Reporter::Lines { started, .. }, Progress::Step { op, phase }) => {
                eprintln!(
                    "move {op}: {} ({} ms)",
                    phase_label(phase),
                    started.elapsed().as_millis()
                )
            }
            (Reporter::Lines { last_wait_line, .. }, Progress::Waiting { op, held, wait_ms }) => {
                if last_wait_line.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                    *last_wait_line = Some(Instant::now());
                    eprintln!(
                        "move {op}: waiting for the source's owners: {held} sections held, at most {wait_ms} ms left"
                    );
                }
            }
            (Reporter::Bar { bar, .. }, Progress::Step { phase, .. }) => {
                bar.set_position(phase as u64);
                bar.set_message(phase_label(phase));
            }
            // Polled every 20-50 ms: the countdown moves smoothly.
            (Reporter::Bar { bar, .. }, Progress::Waiting { held, wait_ms, .. }) => bar.set_message(format!(
                "lease wait: {held} sections held, {:.1} s left at most",
                wait_ms as f64 / 1000.0
            )),
        }
    }

    fn started(&self) -> Instant {
        match self {
            Reporter::Lines { started, .. } | Reporter::Bar { started, .. } => *started,
        }
    }

    /// Takes the bar off the terminal (the final line or the error is printed after it).
    fn finish(&self, ok: bool) {
        if let Reporter::Bar { bar, .. } = self {
            if ok {
                bar.finish_and_clear();
            } else {
                bar.abandon();
            }
        }
    }
}

async fn drive(m: &Mover, op: u64, as_json: bool) -> Result<String, Failure> {
    drive_with(m, op, as_json, Reporter::new(op)).await
}

async fn drive_with(m: &Mover, op: u64, as_json: bool, mut reporter: Reporter) -> Result<String, Failure> {
    let started = reporter.started();
    let result = m.drive(op, |p| reporter.report(p)).await;
    reporter.finish(result.is_ok());
    let done = result.map_err(|e| {
        let mut f = Failure::from(e);
        f.message = format!(
            "{}; the move stays recorded: `seqctl move resume {op}` finishes it",
            f.message
        );
        f
    })?;
    let took = started.elapsed().as_millis();
    if done.phase == pb::MovePhase::Cancelled as i32 {
        // `resume` of a cancel that was cut off: it finished the cancel.
        return Ok(if as_json {
            json!({"op": op, "phase": "cancelled", "millis": took}).to_string()
        } else {
            format!("move {op} was being cancelled; the cancel is finished and the source serves the range again")
        });
    }
    Ok(if as_json {
        json!({"op": op, "phase": "done", "millis": took, "switched_at": done.switched_at}).to_string()
    } else {
        format!("move {op} done in {took} ms; cluster map version {}", done.switched_at)
    })
}

fn phase_label(p: pb::MovePhase) -> String {
    p.as_str_name().trim_start_matches("MOVE_PHASE_").to_lowercase()
}

fn phase_name(m: &pb::MoveInfo) -> String {
    pb::MovePhase::try_from(m.phase)
        .map(phase_label)
        .unwrap_or_else(|_| format!("unknown({})", m.phase))
}

fn render_moves(as_json: bool, map: &pb::ClusterMap, moves: &[pb::MoveInfo]) -> String {
    let uids = |s: Option<pb::SectionRange>| {
        s.map(|s| {
            format!(
                "{}..{}",
                s.begin * map.section_size,
                (s.end * map.section_size).min(map.uid_limit)
            )
        })
        .unwrap_or_default()
    };
    if as_json {
        let list: Vec<Value> = moves
            .iter()
            .map(|m| {
                json!({"op": m.op, "from": m.from_set, "to": m.to_set, "uids": uids(m.sections),
                       "phase": phase_name(m), "recorded_at": m.recorded_at, "switched_at": m.switched_at})
            })
            .collect();
        return json!({"map_version": map.version, "moves": list}).to_string();
    }
    let rows = moves
        .iter()
        .map(|m| {
            vec![
                m.op.to_string(),
                m.from_set.to_string(),
                m.to_set.to_string(),
                uids(m.sections),
                phase_name(m),
            ]
        })
        .collect();
    table(&["op", "from", "to", "uids", "phase"], rows)
}

fn render_plan(as_json: bool, plan: &Plan, map: &pb::ClusterMap, lo: u64, hi: u64) -> String {
    let back = format!("seqctl move --from {} --to {} --uids {lo}..{hi}", plan.to, plan.from);
    if as_json {
        let sections: Vec<Value> = plan
            .sections
            .iter()
            .map(
                |s| json!({"section": s.section, "max_seq": s.max_seq, "epoch": s.epoch, "owner": s.owner_incarnation}),
            )
            .collect();
        return json!({"from": plan.from, "to": plan.to, "sections": sections, "map_version": plan.map_version,
                      "unavailable_ms": {"released": "under 1000", "forced": plan.forced_wait.as_millis() as u64},
                      "reverse": back})
        .to_string();
    }
    let rows = plan
        .sections
        .iter()
        .map(|s| {
            vec![
                s.section.to_string(),
                s.max_seq.to_string(),
                s.epoch.to_string(),
                s.owner_incarnation.to_string(),
            ]
        })
        .collect();
    format!(
        "dry run: move uids {lo}..{hi} (sections [{}, {})) from set {} to set {}; nothing changed\n{}\n\
         expects cluster map version {} (currently {})\n\
         unavailable: under a second if every owner hands over; at most {} ms if one does not\n\
         to move it back later: {back}",
        plan.begin,
        plan.end,
        plan.from,
        plan.to,
        table(&["section", "max_seq", "epoch", "owner"], rows),
        plan.map_version,
        map.version,
        plan.forced_wait.as_millis()
    )
}

fn map_json(map: &pb::ClusterMap) -> Value {
    let sets: Vec<Value> = map
        .sets
        .iter()
        .map(|s| json!({"set_id": s.set_id, "stores": s.stores}))
        .collect();
    let ranges: Vec<Value> = map
        .ranges
        .iter()
        .map(|r| json!({"section_begin": r.section_begin, "section_end": r.section_end, "set_id": r.set_id}))
        .collect();
    let ids = map.ids.as_ref().map(|i| {
        let l = i.layout.unwrap_or_default();
        json!({"tick_ms": l.tick_ms, "epoch_ms": l.epoch_ms, "slot_bits": l.slot_bits, "seq_bits": l.seq_bits,
               "slots_per_set": i.slots_per_set, "max_ahead_ms": i.max_ahead_ms})
    });
    json!({"version": map.version, "section_size": map.section_size, "uid_limit": map.uid_limit,
           "sets": sets, "ranges": ranges, "ids": ids})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_on_a_terminal_progress_is_plain_lines() {
        // Under the test runner stdout is captured, as when a script or a test runs seqctl.
        assert!(matches!(Reporter::new(1), Reporter::Lines { .. }));
    }

    #[test]
    fn the_bar_moves_through_the_steps_and_counts_the_lease_wait_down() {
        assert!(ProgressStyle::with_template(BAR_TEMPLATE).is_ok());
        let bar = ProgressBar::hidden().with_style(bar_style());
        bar.set_length(STEPS);
        let mut r = Reporter::Bar {
            started: Instant::now(),
            bar: bar.clone(),
        };
        r.recorded(7, 3);
        assert_eq!((bar.position(), bar.message()), (1, "recorded (map version 3)".into()));
        r.report(Progress::Step {
            op: 7,
            phase: pb::MovePhase::Frozen,
        });
        assert_eq!((bar.position(), bar.message()), (3, "frozen".into()));
        for (wait_ms, shown) in [(3_100, "3.1"), (1_050, "1.1"), (40, "0.0")] {
            r.report(Progress::Waiting {
                op: 7,
                held: 2,
                wait_ms,
            });
            assert_eq!(
                bar.message(),
                format!("lease wait: 2 sections held, {shown} s left at most")
            );
        }
        r.report(Progress::Step {
            op: 7,
            phase: pb::MovePhase::Done,
        });
        assert_eq!(bar.position(), STEPS);
    }
}
