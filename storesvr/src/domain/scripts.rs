//! Golden-script tests of the state machine and the move protocol: each file in `testscripts/` is
//! a story of commands applied to one or two sets (`s0:` and `s1:` prefixes; set 0 keeps the
//! cluster map) with what each answered and, where asked, what the state became. A change to the
//! protocol shows as a diff of those files.
//!
//! `UPDATE_GOLDENFILES=1 cargo test -p storesvr scripts` rewrites the expected output; read the
//! diff before committing it. The format is `goldenscript`'s (a command per line, `---`, the
//! output; `!` before a command expects it to fail, `(…)` silences it).
//!
//! Commands (sections as `b..e`, incarnations and ops as numbers):
//! - `init`; `register node=N [nonce=N] [secret=S]`; `assign b..e to=INC [from=INC]`;
//!   `bump inc=INC section=N max=M [epoch=E] [secret=S]`;
//!   `release inc=INC b..e [epoch=E] [waited=BOOL] [leaving] [secret=S]`; `drain node=N`;
//! - range steps: `import op=N b..e from=SET`, `freeze op=N b..e to=SET`, `seal op=N b..e`,
//!   `install op=N b..e ceilings=SET` (the final ceilings that set vouches for, or a list
//!   `ceilings="a,b,…"` as a driver could send any),
//!   `tombstone op=N b..e to=SET` (at set 0's map version), `cancel op=N b..e`;
//! - the map (set 0): `add_set id=N`, `begin op=N b..e from=SET to=SET driver=D`,
//!   `claim op=N driver=D`, `advance op=N driver=D PHASE` (a sealed record takes the source's
//!   final ceilings), `finish op=N driver=D`;
//! - `show b..e` (sections), `show routes` (the owner runs), `show export OP` (what a move's
//!   source still holds), `show ceilings OP` (the final ceilings a source vouches for), `show moves`, `show map`.
//!
//! Left out: time (leases, the lease wait: the leader's business, not the state machine's) and
//! the RPC layer (`protocol`), which the integration tests cover.

use std::collections::BTreeMap;
use std::error::Error;
use std::fmt::Write as _;

use goldenscript::{ArgumentConsumer, Context};
use seqsvr_proto::{Epoch, Incarnation, NodeId, SectionId};

use super::binding::SecretHash;
use super::cluster_map::{MapCommand, Phase};
use super::command::{BumpItem, BumpOutcome, Command, CommandResult, Move, Released, outcome};
use super::moves::{RangeCommand, Role, SidePhase};
use super::ranges::RangeState;
use super::section::{NOBODY, Span};
use super::state::SetState;
use super::state_props::params;

type Res<T> = Result<T, Box<dyn Error>>;

/// The sets of one script, by id.
#[derive(Default)]
struct Sets(BTreeMap<u64, SetState>);

fn num<T: std::str::FromStr>(s: Option<&str>, what: &str) -> Res<T>
where
    T::Err: std::fmt::Display,
{
    let s = s.ok_or_else(|| format!("{what} missing"))?;
    s.parse().map_err(|e| format!("{what} {s:?}: {e}").into())
}

fn span_of(s: Option<&str>) -> Res<Span> {
    let s = s.ok_or("sections b..e missing")?;
    let (b, e) = s.split_once("..").ok_or_else(|| format!("{s:?} is not b..e"))?;
    Ok(Span {
        begin: SectionId(num(Some(b), "begin")?),
        end: SectionId(num(Some(e), "end")?),
    })
}

/// `cmd`, bound to `secret` when the script gives one.
fn bound(args: &mut ArgumentConsumer, cmd: Command) -> Command {
    match args.take_key("secret") {
        Some(secret) => Command::Bound {
            secret_hash: SecretHash::of(secret.as_bytes()),
            cmd: Box::new(cmd),
        },
        None => cmd,
    }
}

impl Sets {
    fn set(&mut self, id: u64) -> &mut SetState {
        self.0.entry(id).or_default()
    }

    /// The command a script line asks for, made against the current states where it needs them.
    fn command(&mut self, set: u64, name: &str, args: &mut ArgumentConsumer) -> Res<Command> {
        let inc = |args: &mut ArgumentConsumer, key| num(args.take_key(key), key).map(Incarnation);
        Ok(match name {
            "init" => Command::Init(params(set)),
            "register" => {
                let node: u64 = num(args.take_key("node"), "node")?;
                let cmd = Command::Register {
                    node_id: NodeId(node),
                    addr: format!("n{node}:1"),
                    nonce: args.take_key("nonce").map_or(Ok(0), |n| num(Some(n), "nonce"))?,
                };
                bound(args, cmd)
            }
            "assign" => {
                let span = span_of(args.next_pos())?;
                let from = args.take_key("from").map_or(Ok(NOBODY), |_| inc(args, "from"))?;
                let mv = Move {
                    begin: span.begin,
                    end: span.end,
                    from,
                    to: inc(args, "to")?,
                };
                Command::Assign {
                    expire: vec![],
                    moves: vec![mv],
                }
            }
            "bump" => self.bump(set, args)?,
            "release" => self.release(set, args)?,
            "drain" => Command::Drain {
                node_id: NodeId(num(args.take_key("node"), "node")?),
            },
            "import" | "freeze" | "seal" | "install" | "tombstone" | "cancel" => {
                Command::Range(self.range_step(name, args)?)
            }
            _ => Command::Map(self.map_command(name, args)?),
        })
    }

    fn epoch_or_current(&mut self, set: u64, args: &mut ArgumentConsumer, section: SectionId) -> Res<Epoch> {
        match args.take_key("epoch") {
            Some(e) => Ok(Epoch(num(Some(e), "epoch")?)),
            None => Ok(self.set(set).section(section).map_or(Epoch(0), |s| s.epoch)),
        }
    }

    fn bump(&mut self, set: u64, args: &mut ArgumentConsumer) -> Res<Command> {
        let incarnation = Incarnation(num(args.take_key("inc"), "inc")?);
        let section = SectionId(num(args.take_key("section"), "section")?);
        let item = BumpItem {
            section,
            epoch: self.epoch_or_current(set, args, section)?,
            new_max: num(args.take_key("max"), "max")?,
        };
        let cmd = Command::Bump {
            incarnation,
            items: vec![item],
        };
        Ok(bound(args, cmd))
    }

    fn release(&mut self, set: u64, args: &mut ArgumentConsumer) -> Res<Command> {
        let incarnation = Incarnation(num(args.take_key("inc"), "inc")?);
        let span = span_of(args.next_pos())?;
        let range = Released {
            begin: span.begin,
            end: span.end,
            epoch: self.epoch_or_current(set, args, span.begin)?,
            waited: args.take_key("waited").map_or(Ok(true), |w| num(Some(w), "waited"))?,
        };
        let leaving = args.next_pos() == Some("leaving");
        let cmd = Command::Release {
            incarnation,
            ranges: vec![range],
            leaving,
        };
        Ok(bound(args, cmd))
    }

    fn range_step(&mut self, name: &str, args: &mut ArgumentConsumer) -> Res<RangeCommand> {
        let op = num(args.take_key("op"), "op")?;
        let span = span_of(args.next_pos())?;
        Ok(match name {
            "import" => RangeCommand::Import {
                op,
                span,
                from_set: num(args.take_key("from"), "from")?,
            },
            "freeze" => RangeCommand::Freeze {
                op,
                span,
                to_set: num(args.take_key("to"), "to")?,
            },
            "seal" => RangeCommand::Seal { op, span },
            "install" => {
                let given = args.take_key("ceilings").ok_or("ceilings missing")?;
                let ceilings = match given.contains(',') {
                    true => (given.split(',').map(|c| num(Some(c.trim()), "ceiling"))).collect::<Res<Vec<u64>>>()?,
                    false => (self.set(num(Some(given), "ceilings")?).final_ceilings(op))
                        .ok_or("the source vouches for no ceilings")?,
                };
                RangeCommand::Install { op, span, ceilings }
            }
            "tombstone" => RangeCommand::Tombstone {
                op,
                span,
                to_set: num(args.take_key("to"), "to")?,
                map_version: self.set(0).map.as_ref().map_or(0, |m| m.version),
            },
            _ => RangeCommand::Cancel { op, span },
        })
    }

    fn map_command(&mut self, name: &str, args: &mut ArgumentConsumer) -> Res<MapCommand> {
        let version = self.set(0).map.as_ref().map_or(0, |m| m.version);
        let op_driver = |args: &mut ArgumentConsumer| -> Res<(u64, u64)> {
            Ok((num(args.take_key("op"), "op")?, num(args.take_key("driver"), "driver")?))
        };
        Ok(match name {
            "add_set" => {
                let set_id = num(args.take_key("id"), "id")?;
                MapCommand::AddSet {
                    expect_version: version,
                    set_id,
                    stores: vec![format!("set{set_id}:1")],
                }
            }
            "begin" => {
                let (op, driver) = op_driver(args)?;
                MapCommand::Begin {
                    expect_version: version,
                    op,
                    from: num(args.take_key("from"), "from")?,
                    to: num(args.take_key("to"), "to")?,
                    span: span_of(args.next_pos())?,
                    driver,
                }
            }
            "claim" | "finish" => {
                let (op, driver) = op_driver(args)?;
                match name {
                    "claim" => MapCommand::Claim { op, driver },
                    _ => MapCommand::Finish { op, driver },
                }
            }
            "advance" => {
                let (op, driver) = op_driver(args)?;
                let phase = self.phase(op, args.next_pos().ok_or("phase missing")?)?;
                MapCommand::Advance { op, driver, phase }
            }
            other => return Err(format!("unknown command {other}").into()),
        })
    }

    fn phase(&mut self, op: u64, name: &str) -> Res<Phase> {
        Ok(match name {
            "importing" => Phase::Importing,
            "frozen" => Phase::Frozen,
            "sealed" => {
                let from = self.set(0).map.as_ref().and_then(|m| m.ops.get(&op)).map(|m| m.from);
                let source = from.ok_or("no such move")?;
                Phase::Sealed(self.set(source).final_ceilings(op).unwrap_or_default())
            }
            "installed" => Phase::Installed,
            "switched" => Phase::Switched { map_version: 0 },
            "cancelling" => Phase::Cancelling,
            other => return Err(format!("no phase {other}").into()),
        })
    }

    fn show(&mut self, set: u64, what: &str, args: &mut ArgumentConsumer) -> Res<String> {
        let st = self.set(set);
        let mut out = String::new();
        match what {
            "moves" => {
                for (op, m) in &st.moves {
                    let role = match m.role {
                        Role::Unseen => "never seen here".to_string(),
                        Role::Import { from_set } => format!("import from set {from_set}"),
                        Role::Export { to_set } => format!("export to set {to_set}"),
                    };
                    let phase = match m.phase {
                        SidePhase::Started => "started",
                        SidePhase::Done => "done",
                        SidePhase::Cancelled => "cancelled",
                        SidePhase::Sealed => "sealed",
                    };
                    writeln!(out, "op {op}: {role} [{}, {}) {phase}", m.span.begin, m.span.end)?;
                }
            }
            "routes" => {
                let runs: Vec<String> = (st.owner_runs().iter())
                    .map(|r| format!("[{}, {}) inc {}", r.begin, r.end, r.owner))
                    .collect();
                writeln!(out, "routes: {}", runs.join(", "))?;
            }
            "export" => {
                let op = num(args.next_pos(), "op")?;
                let e = st.export_status(op).ok_or("no export of that op")?;
                let released = if e.released() { "released" } else { "not released" };
                writeln!(out, "export op {op}: {} held, {} forced, {released}", e.held, e.forced)?;
            }
            "ceilings" => {
                let op = num(args.next_pos(), "op")?;
                let ceilings = st.final_ceilings(op).ok_or("no final ceilings for that op")?;
                writeln!(out, "final ceilings of op {op}: {ceilings:?}")?;
            }
            "map" => {
                let map = st.map.as_ref().ok_or("set holds no map")?;
                let runs: Vec<String> = map
                    .ranges
                    .runs()
                    .map(|r| format!("[{}, {}) set {}", r.begin, r.end, r.state))
                    .collect();
                writeln!(out, "version {}: {}", map.version, runs.join(", "))?;
                for (op, m) in &map.ops {
                    writeln!(
                        out,
                        "op {op}: {} → {} [{}, {}) {}",
                        m.from,
                        m.to,
                        m.span.begin,
                        m.span.end,
                        m.phase.name()
                    )?;
                }
            }
            span => {
                let span = span_of(Some(span))?;
                for (id, s) in st.sections_in(span.begin, span.end) {
                    let range = range_state(st.ranges.state_at(id));
                    let wait = if s.no_wait { "no wait" } else { "wait" };
                    writeln!(
                        out,
                        "section {id}: max {} epoch {} owner {} {wait}, {range}",
                        s.max_seq, s.epoch, s.owner
                    )?;
                }
            }
        }
        Ok(out)
    }
}

impl goldenscript::Runner for Sets {
    type Command = goldenscript::Command;

    fn run(&mut self, command: &goldenscript::Command, context: &Context) -> Res<String> {
        let set = match context.prefix.as_deref() {
            None => 0,
            Some(p) => num(p.strip_prefix('s'), "set prefix")?,
        };
        let mut args = command.consume_args();
        if command.name == "show" {
            let what = args.next_pos().ok_or("show what?")?;
            let out = self.show(set, what, &mut args)?;
            args.reject_next()?;
            return Ok(out);
        }
        let cmd = self.command(set, &command.name, &mut args)?;
        args.reject_next()?;
        // A refusal is the state machine's answer, not a failure of the script: it is output.
        let result: CommandResult = self.set(set).apply(&cmd, false);
        Ok(format!("{}\n", told(&result)))
    }
}

/// A command's answer in one line. The answers the audit log words (`outcome`) are kept as
/// they are; the rest, which only scripts print, get words instead of `Debug` structs.
fn told(result: &CommandResult) -> String {
    match result {
        CommandResult::Initialized { fresh: true } => "initialized".into(),
        CommandResult::Initialized { fresh: false } => "already initialized".into(),
        CommandResult::Registered { incarnation } => format!("registered: inc {incarnation}"),
        CommandResult::Assigned { moved, route_version } => {
            format!("assigned {moved} sections: routes version {route_version}")
        }
        CommandResult::Released { count: 1 } => "released 1 section".into(),
        CommandResult::Released { count } => format!("released {count} sections"),
        CommandResult::UnknownIncarnation => "refused: unknown incarnation".into(),
        CommandResult::NotBound => "refused: not bound to the incarnation's secret".into(),
        CommandResult::Bumped(items) => {
            let items: Vec<String> = (items.iter())
                .map(|b| {
                    let what = match b.outcome {
                        BumpOutcome::Applied => "raised",
                        BumpOutcome::NoOp => "not raised (no higher)",
                        BumpOutcome::StaleEpoch => "refused (stale epoch)",
                        BumpOutcome::OutOfRange => "refused (too far)",
                        BumpOutcome::NotOwned => "refused (not owned here)",
                    };
                    format!("section {} {what}: max {} epoch {}", b.section, b.max_seq, b.epoch)
                })
                .collect();
            items.join("; ")
        }
        other => outcome(other),
    }
}

fn range_state(state: Option<RangeState>) -> String {
    match state {
        None => "not in the set".into(),
        Some(RangeState::Owned) => "owned".into(),
        Some(RangeState::Importing { op }) => format!("importing (op {op})"),
        Some(RangeState::Migrating { op, to_set }) => format!("migrating to set {to_set} (op {op})"),
        Some(RangeState::Tombstoned {
            op,
            to_set,
            map_version,
        }) => {
            format!("tombstoned: set {to_set} from map version {map_version} (op {op})")
        }
    }
}

#[test]
fn golden_scripts() -> std::io::Result<()> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/domain/testscripts");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    paths.sort();
    assert!(!paths.is_empty(), "no scripts in {dir:?}");
    for path in paths {
        goldenscript::run(&mut Sets::default(), &path)?;
    }
    Ok(())
}
