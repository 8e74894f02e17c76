//! Golden-script tests of the StoreSvr's server side as `sim dst` steps it: each file in
//! `testscripts/` is a story of requests, from an AllocSvr and from the move driver, to one or two
//! modelled groups (`s0:` and `s1:`; set 0 keeps the cluster map), each answered by the production
//! step (`storesvr::protocol::step`) over the group's leader, with the clock moved by hand. Where
//! `storesvr`'s scripts tell what the state machine does with commands, these tell what the
//! leader decides before anything is committed: who is planned sections, when a frozen range's
//! ceilings may be read, which steps are refused.
//!
//! `UPDATE_GOLDENFILES=1 cargo test -p sim --lib scripts` rewrites the expected output; read
//! the diff before committing it.
//!
//! Commands (sections as `b..e`):
//! - `init` (a group whose leader is elected and whose arbiter initialized the set);
//!   `wait MS` (moves every group's clock on);
//! - an AllocSvr's: `register node=N`, `renew inc=N`, `arbiter` (one tick of the leader's
//!   arbiter, its commands committed);
//! - the driver's: `add_set id=N`, `begin op=N b..e from=SET to=SET`, `advance op=N PHASE`,
//!   `step KIND op=N b..e other=SET` (KIND one of import, freeze, install, tombstone: install
//!   sends the ceilings the last `export` read, tombstone the map version the move switched at),
//!   `export op=N`, `owner section=N` (its set in the leader's cluster map).
//!
//! Left out: failures (a leader that loses its majority, lost replies), which `sim dst` draws by
//! the seed; and the AllocSvr's side (its lease wait, its serving), which is `allocsvr`'s.

use std::collections::BTreeMap;
use std::error::Error;
use std::time::{Duration, Instant};

use goldenscript::{ArgumentConsumer, Context};
use pb::change_map_request::Change;
use seqsvr_proto::pb;
use storesvr::domain::state::{CommandResult, UnsafeRules};
use storesvr::error::RpcError;
use storesvr::protocol::Reply;

use super::group::tests::params;
use super::group::{Group, Rep, Req, Step};

type Res<T> = Result<T, Box<dyn Error>>;

/// The groups of one script and the clock they share.
struct Sets {
    t0: Instant,
    now: Instant,
    groups: BTreeMap<u64, (Group, usize)>,
    /// The ceilings the last `export` read.
    ceilings: Vec<u64>,
}

fn num<T: std::str::FromStr>(s: Option<&str>, what: &str) -> Res<T>
where
    T::Err: std::fmt::Display,
{
    let s = s.ok_or_else(|| format!("{what} missing"))?;
    s.parse().map_err(|e| format!("{what} {s:?}: {e}").into())
}

fn sections(s: Option<&str>) -> Res<pb::SectionRange> {
    let s = s.ok_or("sections b..e missing")?;
    let (b, e) = s.split_once("..").ok_or_else(|| format!("{s:?} is not b..e"))?;
    Ok(pb::SectionRange {
        begin: num(Some(b), "begin")?,
        end: num(Some(e), "end")?,
    })
}

fn change_map(change: Change) -> Req {
    Req::ChangeMap(pb::ChangeMapRequest { change: Some(change) })
}

impl Sets {
    fn new() -> Self {
        let t0 = Instant::now();
        Sets {
            t0,
            now: t0,
            groups: BTreeMap::new(),
            ceilings: Vec::new(),
        }
    }

    fn group(&mut self, set: u64) -> Res<&mut (Group, usize)> {
        self.groups
            .get_mut(&set)
            .ok_or_else(|| format!("s{set} has no group: init it").into())
    }

    /// `req` to set `set`'s leader, committed at once when it is a write: the answer.
    fn call(&mut self, set: u64, req: Req) -> Res<Rep> {
        let now = self.now;
        let (g, leader) = self.group(set)?;
        Ok(match g.receive(*leader, &req, now) {
            Step::Silent => return Err(format!("the leader stayed silent to {req:?}").into()),
            Step::Answer(rep) => rep,
            Step::Commit(cmd) => {
                let result = g.apply(&cmd, 0);
                g.reply(*leader, &req, result, now)
            }
        })
    }

    fn map_version(&mut self) -> Res<u64> {
        let (g, _) = self.group(0)?;
        Ok(g.set.map.as_ref().map_or(0, |m| m.version))
    }

    fn init(&mut self, set: u64) -> String {
        let mut g = Group::new(params(set), Duration::from_secs(1), UnsafeRules::default());
        g.raft_tick(self.now, |_| 0);
        g.raft_tick(self.now + Duration::from_secs(1), |_| 0);
        let Some(leader) = g.leader() else {
            return "no leader after the election timeout".into();
        };
        let results: Vec<String> = (g.arbiter(leader, self.now).into_iter())
            .map(|cmd| committed(&g.apply(&cmd, 0)))
            .collect();
        self.groups.insert(set, (g, leader));
        results.join("; ")
    }

    fn arbiter(&mut self, set: u64) -> Res<String> {
        let now = self.now;
        let (g, leader) = self.group(set)?;
        let results: Vec<String> = (g.arbiter(*leader, now).into_iter())
            .map(|cmd| committed(&g.apply(&cmd, 0)))
            .collect();
        Ok(match results.is_empty() {
            true => "nothing to do".into(),
            false => results.join("; "),
        })
    }

    /// The request a script line asks for.
    fn request(&mut self, name: &str, args: &mut ArgumentConsumer) -> Res<Req> {
        let op = |args: &mut ArgumentConsumer| num::<u64>(args.take_key("op"), "op");
        Ok(match name {
            "register" => Req::Register(pb::RegisterRequest {
                node_id: num(args.take_key("node"), "node")?,
                addr: "allocsvr:7000".into(),
                nonce: 1,
                ..Default::default()
            }),
            "renew" => Req::Renew(pb::RenewRequest {
                incarnation: num(args.take_key("inc"), "inc")?,
                ..Default::default()
            }),
            "add_set" => {
                let set_id: u64 = num(args.take_key("id"), "id")?;
                change_map(Change::AddSet(pb::AddSet {
                    expect_version: self.map_version()?,
                    set_id,
                    stores: vec![format!("storesvr-{set_id}:7100")],
                }))
            }
            "begin" => change_map(Change::BeginMove(pb::BeginMove {
                expect_version: self.map_version()?,
                op: op(args)?,
                from_set: num(args.take_key("from"), "from")?,
                to_set: num(args.take_key("to"), "to")?,
                sections: Some(sections(args.next_pos())?),
                driver: 1,
            })),
            "advance" => {
                let op = op(args)?;
                let (phase, ceilings) = match args.next_pos().ok_or("phase missing")? {
                    "importing" => (pb::MovePhase::Importing, vec![]),
                    "frozen" => (pb::MovePhase::Frozen, vec![]),
                    "sealed" => (pb::MovePhase::Sealed, self.ceilings.clone()),
                    "installed" => (pb::MovePhase::Installed, vec![]),
                    "switched" => (pb::MovePhase::Switched, vec![]),
                    "done" => (pb::MovePhase::Done, vec![]),
                    other => return Err(format!("no phase {other}").into()),
                };
                change_map(Change::AdvanceMove(pb::AdvanceMove {
                    op,
                    driver: 1,
                    phase: phase as i32,
                    ceilings,
                }))
            }
            "step" => self.range_step(args)?,
            "export" => Req::ExportStatus(pb::ExportStatusRequest { op: op(args)? }),
            other => return Err(format!("unknown command {other}").into()),
        })
    }

    fn range_step(&mut self, args: &mut ArgumentConsumer) -> Res<Req> {
        let kind = args.next_pos().ok_or("step kind missing")?;
        let op = num(args.take_key("op"), "op")?;
        let (step, ceilings, map_version) = match kind {
            "import" => (pb::RangeStep::Import, vec![], 0),
            "freeze" => (pb::RangeStep::Freeze, vec![], 0),
            "install" => (pb::RangeStep::Install, self.ceilings.clone(), 0),
            "tombstone" => (pb::RangeStep::Tombstone, vec![], self.switched_at(op)?),
            other => return Err(format!("no range step {other}").into()),
        };
        let p = params(0);
        Ok(Req::RangeStep(pb::RangeStepRequest {
            op,
            step: step as i32,
            sections: Some(sections(args.next_pos())?),
            other_set: num(args.take_key("other"), "other")?,
            ceilings,
            map_version,
            section_size: p.section_size,
            uid_limit: p.uid_limit,
            ledgers: Vec::new(),
        }))
    }

    /// A reply in one line; what later lines need of it (ceilings, the switch) is kept.
    fn told(&mut self, rep: Rep) -> String {
        let reply = match rep {
            Rep::Reply(reply) => reply,
            Rep::NotLeader(_) => return "not the leader".into(),
            Rep::Error(e) => return format!("refused ({}): {e}", kind(&e)),
        };
        match reply {
            Reply::Register(r) => format!("registered: inc {}", r.incarnation),
            Reply::Renew(r) => {
                let grants: Vec<String> = (r.grants.iter())
                    .map(|g| {
                        let wait = if g.no_wait { "no wait" } else { "wait" };
                        format!("[{}, {}) epoch {} {wait}", g.section_begin, g.section_end, g.epoch)
                    })
                    .collect();
                match grants.is_empty() {
                    true => "renewed: nothing granted".into(),
                    false => format!("renewed: {}", grants.join(", ")),
                }
            }
            Reply::ChangeMap(r) if r.version_changed => format!("not done: the map is at version {}", r.version),
            Reply::ChangeMap(r) => {
                let already = if r.already { "already " } else { "" };
                format!("{already}done: map version {}", r.version)
            }
            Reply::RangeStep(r) => (if r.already { "already done" } else { "done" }).into(),
            Reply::ExportStatus(r) if r.ready => {
                self.ceilings = r.ceilings.clone();
                let how = if r.released { "released" } else { "the lease waited out" };
                format!("ready ({how}): ceilings {:?}", r.ceilings)
            }
            Reply::ExportStatus(r) => format!("not ready: {} held, {} ms more at most", r.held, r.wait_ms),
            other => format!("{other:?}"),
        }
    }

    /// The cluster map as set 0's leader hands it out.
    fn cluster_map(&mut self) -> Res<pb::ClusterMap> {
        match self.call(0, Req::GetClusterMap)? {
            Rep::Reply(Reply::ClusterMap(r)) => r.map.ok_or_else(|| "no cluster map".into()),
            other => Err(format!("no cluster map: {other:?}").into()),
        }
    }

    /// The map version from which move `op` was switched (what its tombstone names).
    fn switched_at(&mut self, op: u64) -> Res<u64> {
        let map = self.cluster_map()?;
        let m = map.moves.iter().find(|m| m.op == op).ok_or("no such move in the map")?;
        Ok(m.switched_at)
    }

    fn owner(&mut self, args: &mut ArgumentConsumer) -> Res<String> {
        let section: u64 = num(args.take_key("section"), "section")?;
        let map = self.cluster_map()?;
        let set = (map.ranges.iter())
            .find(|r| r.section_begin <= section && section < r.section_end)
            .map(|r| r.set_id);
        Ok(match set {
            Some(set) => format!("section {section}: set {set} (map version {})", map.version),
            None => format!("section {section}: in no set"),
        })
    }
}

/// The status an error goes out as, in words.
fn kind(e: &RpcError) -> &'static str {
    match e {
        RpcError::InvalidArgument(_) => "invalid argument",
        RpcError::FailedPrecondition(_) => "failed precondition",
        RpcError::Unauthenticated(_) => "unauthenticated",
        RpcError::NotFound(_) => "not found",
        RpcError::AlreadyExists(_) => "already exists",
        RpcError::ResourceExhausted(_) => "resource exhausted",
        RpcError::Unavailable(_) => "unavailable",
        RpcError::MaybeCommitted(_) => "unknown outcome",
        RpcError::Internal(_) | RpcError::Fatal(_) => "internal",
    }
}

/// A command the arbiter proposed, as committed.
fn committed(result: &CommandResult) -> String {
    match result {
        CommandResult::Initialized { .. } => "initialized".into(),
        CommandResult::Assigned { moved, route_version } => {
            format!("assigned {moved} sections: routes version {route_version}")
        }
        other => storesvr::domain::command::outcome(other),
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
        let out = match command.name.as_str() {
            "init" => self.init(set),
            "wait" => {
                let ms: u64 = num(args.next_pos(), "ms")?;
                self.now += Duration::from_millis(ms);
                format!("at {} ms", (self.now - self.t0).as_millis())
            }
            "arbiter" => self.arbiter(set)?,
            "owner" => self.owner(&mut args)?,
            name => {
                let req = self.request(name, &mut args)?;
                let rep = self.call(set, req)?;
                self.told(rep)
            }
        };
        args.reject_next()?;
        Ok(format!("{out}\n"))
    }
}

#[test]
fn golden_scripts() -> std::io::Result<()> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/dst/testscripts");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    paths.sort();
    assert!(!paths.is_empty(), "no scripts in {dir:?}");
    for path in paths {
        goldenscript::run(&mut Sets::new(), &path)?;
    }
    Ok(())
}
