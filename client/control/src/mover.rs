//! The driver of a move of sections between sets: what `seqctl move` runs.
//!
//! The move's record lives in the cluster map (set 0); every step is idempotent and keyed by the
//! op id, so the driver keeps no state of its own: [`Mover::drive`] reads the record, sends the
//! step its phase calls for to the set concerned, records the next phase, and repeats until the
//! move is done. A driver killed anywhere is replaced by `resume`, which takes the move over
//! (a new driver token: the old driver's next record is refused) and carries on from the record.
//!
//! The order, and why:
//! 1. record (CAS on the map version): overlapping moves and stale plans are refused;
//! 2. target imports: the target's state is written before anything removes the source's;
//! 3. source freezes: bumps refused, epochs raised, owners asked to hand over;
//! 4. the source's leader hands out the final ceilings only once the owners are provably gone
//!    (all released, or a lease has passed since it saw the freeze) — the wait is the server's;
//! 5. seal: the ceilings go into the record; from here on the move cannot be cancelled, because
//!    the target may serve after the next step;
//! 6. the source is told of the seal (it refuses a set-level cancel from then on), and only then
//!    the target installs `max(own, source's)` and owns the range;
//! 7. the map switches (clients go to the target); 8. the source tombstones; 9. the record
//!    ends (done), which raises the map version so that published copies drop the move.
//!
//! A cancel (before the seal) takes the same shape: the record says `cancelling` first, then the
//! source gives the range back and the target forgets its import, then the record ends
//! (cancelled). A cancel cut off anywhere is still a running move: a repeated `cancel` or a
//! `resume` finishes it.
//!
//! After every change of the map it makes (add a set, record, switch, done, cancel) the driver
//! publishes the map to every set it lists ([`Mover::publish`]), with each set's AllocSvr
//! addresses, so that every server can hand the map to clients. Best effort: a set that cannot be
//! reached keeps its older copy until a later publish; the move itself never waits for it.
//!
//! Left out: choosing ranges (the operator does) and rebalancing AllocSvrs inside a set.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use seqsvr_proto::pb;
use seqsvr_proto::pb::change_map_request::Change;

use crate::admin::AdminClient;
use crate::leader::{ControlError, Seed, StoreTimeouts};
use crate::store::StoreClient;
use seqsvr_rpc::transport::Dialer;

/// Longest a publish waits for one set: a set that is down must not hold a move up.
const PUBLISH_WAIT: Duration = Duration::from_secs(2);

/// Why a move command failed.
#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    /// The input or the cluster's state does not allow it; nothing changed.
    #[error("{0}")]
    Refused(String),
    /// The map changed since the plan was made; nothing changed.
    #[error("the cluster map changed (now version {0}); look again and retry")]
    VersionChanged(u64),
    /// A set could not be reached or answered with an error; the move stays where its record says.
    #[error(transparent)]
    Control(#[from] ControlError),
}

/// What a move of `span` would do, as the dry run prints it.
#[derive(Debug, Clone)]
pub struct Plan {
    pub from: u64,
    pub to: u64,
    pub begin: u64,
    pub end: u64,
    pub map_version: u64,
    /// Per section: `max_seq`, epoch and owner incarnation in the source now.
    pub sections: Vec<pb::SectionState>,
    /// The longest the range is unavailable if an owner does not hand over (the lease wait).
    pub forced_wait: Duration,
}

/// Where a running move stands, for progress output.
#[derive(Debug, Clone)]
pub enum Progress {
    Step { op: u64, phase: pb::MovePhase },
    Waiting { op: u64, held: u64, wait_ms: u64 },
}

/// Drives moves through set 0's map and the sets' admin services.
pub struct Mover {
    meta: AdminClient,
    timeouts: StoreTimeouts,
    /// This driver's token (random per run).
    pub driver: u64,
    dialer: Dialer,
}

/// The steps of a move after `phase`: the set that applies it and the phase recorded after it.
fn next_phase(phase: pb::MovePhase) -> Option<pb::MovePhase> {
    use pb::MovePhase::*;
    Some(match phase {
        Recorded => Importing,
        Importing => Frozen,
        Frozen => Sealed,
        Sealed => Installed,
        Installed => Switched,
        Switched => Done,
        _ => return None,
    })
}

impl Mover {
    pub fn new(meta_seeds: Vec<Seed>, timeouts: StoreTimeouts, driver: u64) -> Result<Self, String> {
        Self::with_dialer(meta_seeds, timeouts, driver, Dialer::default())
    }

    /// The same, every set reached over the transport `dialer` opens.
    pub fn with_dialer(
        meta_seeds: Vec<Seed>,
        timeouts: StoreTimeouts,
        driver: u64,
        dialer: Dialer,
    ) -> Result<Self, String> {
        Ok(Self {
            meta: AdminClient::with_dialer(meta_seeds, timeouts, &dialer)?,
            timeouts,
            driver,
            dialer,
        })
    }

    pub async fn map(&self) -> Result<pb::ClusterMap, MoveError> {
        Ok(self.meta.cluster_map().await?)
    }

    /// The admin client of set `set_id`, at the addresses the map lists.
    fn set_admin(&self, map: &pb::ClusterMap, set_id: u64) -> Result<AdminClient, MoveError> {
        AdminClient::with_dialer(seeds_of(map, set_id)?, self.timeouts, &self.dialer).map_err(MoveError::Refused)
    }

    /// Adds set `set_id` (its StoreSvr group already running) to the map, once the group at
    /// `stores` has shown that it is that set, with the cluster's section size and uid limit.
    ///
    /// The new set adopts set 0's time-ordered id setup from the map this call publishes; a set
    /// added before set 0 set its ids up (its first leader's first ticks) adopts it at the next
    /// map change.
    pub async fn add_set(&self, set_id: u64, stores: Vec<String>) -> Result<pb::ChangeMapReply, MoveError> {
        let map = self.map().await?;
        if !map.sets.iter().any(|s| s.set_id == set_id && s.stores == stores) {
            let seeds = stores.iter().map(|a| Seed::parse(a)).collect::<Result<Vec<_>, _>>();
            let store = StoreClient::with_dialer(seeds.map_err(MoveError::Refused)?, self.timeouts, &self.dialer)
                .map_err(MoveError::Refused)?;
            // A group started a moment ago may still be electing its first leader, whose first
            // entry writes the set's parameters.
            let started = Instant::now();
            let mut status = store.status().await?;
            let ready = |s: &pb::StatusReply| s.leader_id != 0 && s.params.is_some_and(|p| p.section_size != 0);
            while !ready(&status) && started.elapsed() < self.timeouts.overall {
                tokio::time::sleep(Duration::from_millis(100)).await;
                status = store.status().await?;
            }
            refuse_set(&map, set_id, &stores, &status)?;
        }
        let add = Change::AddSet(pb::AddSet {
            expect_version: map.version,
            set_id,
            stores,
        });
        let reply = check_change(self.meta.change_map(add).await?)?;
        self.publish().await;
        Ok(reply)
    }

    /// Publishes set 0's current map to every set it lists, each set's entry filled with the
    /// data-plane addresses of the AllocSvrs registered there now. Best effort: a set that cannot
    /// be reached is skipped and logged. Returns the sets that hold the published version now.
    pub async fn publish(&self) -> Vec<u64> {
        let mut map = match self.map().await {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the cluster map to publish it");
                return Vec::new();
            }
        };
        let timeouts = StoreTimeouts {
            attempt: self.timeouts.attempt.min(PUBLISH_WAIT),
            overall: self.timeouts.overall.min(PUBLISH_WAIT),
        };
        let mut admins = Vec::new();
        for set in &mut map.sets {
            let seeds: Result<Vec<Seed>, String> = set.stores.iter().map(|a| Seed::parse(a)).collect();
            let Ok(seeds) = seeds else { continue };
            let status = match StoreClient::with_dialer(seeds.clone(), timeouts, &self.dialer) {
                Ok(c) => c.status().await.map_err(|e| e.to_string()),
                Err(e) => Err(e),
            };
            match status {
                Ok(s) => set.allocsvrs = alloc_addrs(&s),
                Err(e) => {
                    tracing::warn!(set = set.set_id, error = %e, "no status: the map lists none of its AllocSvrs")
                }
            }
            if let Ok(a) = AdminClient::with_dialer(seeds, timeouts, &self.dialer) {
                admins.push((set.set_id, a));
            }
        }
        let mut took = Vec::new();
        for (set_id, admin) in admins {
            match admin.publish_map(map.clone(), set_id).await {
                Ok(_) => took.push(set_id),
                Err(e) => tracing::warn!(set = set_id, version = map.version, error = %e, "map not published"),
            }
        }
        took
    }

    /// Refuses a range not on section boundaries (naming the nearest ones), and turns uids into
    /// sections.
    pub fn sections_of(map: &pb::ClusterMap, lo: u64, hi: u64) -> Result<(u64, u64), MoveError> {
        let size = map.section_size.max(1);
        if lo >= hi || hi > map.uid_limit {
            return Err(MoveError::Refused(format!(
                "uids {lo}..{hi} must be a non-empty range within 0..{}",
                map.uid_limit
            )));
        }
        for (what, uid) in [("start", lo), ("end", hi)] {
            if uid % size != 0 && !(what == "end" && uid == map.uid_limit) {
                let below = uid / size * size;
                return Err(MoveError::Refused(format!(
                    "the {what} {uid} is not on a section boundary (sections are {size} uids); nearest: {below} or {}",
                    below + size
                )));
            }
        }
        Ok((lo / size, hi.div_ceil(size)))
    }

    /// The dry run: what moving sections `[begin, end)` from `from` to `to` would do; changes nothing.
    pub async fn plan(&self, from: u64, to: u64, begin: u64, end: u64) -> Result<Plan, MoveError> {
        let map = self.map().await?;
        refuse_move(&map, from, to, begin, end)?;
        let store =
            StoreClient::with_dialer(seeds_of(&map, from)?, self.timeouts, &self.dialer).map_err(MoveError::Refused)?;
        let loaded = store
            .load(pb::LoadRequest {
                sections: vec![pb::SectionRange { begin, end }],
            })
            .await?;
        let status = store.status().await?;
        let target =
            StoreClient::with_dialer(seeds_of(&map, to)?, self.timeouts, &self.dialer).map_err(MoveError::Refused)?;
        if target.status().await?.leader_id == 0 {
            return Err(MoveError::Refused(format!(
                "set {to} has no leader (no quorum?): a move needs both sets up"
            )));
        }
        let p = status.params.unwrap_or_default();
        let lease = Duration::from_millis(p.lease_ms).mul_f64(1.0 + p.drift_ppm as f64 / 1e6);
        Ok(Plan {
            from,
            to,
            begin,
            end,
            map_version: map.version,
            sections: loaded.sections,
            forced_wait: lease + Duration::from_millis(p.margin_ms),
        })
    }

    /// Records a new move (CAS on `expect_version`); drive it with [`Self::drive`].
    pub async fn begin(&self, op: u64, plan: &Plan) -> Result<u64, MoveError> {
        let begin = Change::BeginMove(pb::BeginMove {
            expect_version: plan.map_version,
            op,
            from_set: plan.from,
            to_set: plan.to,
            sections: Some(pb::SectionRange {
                begin: plan.begin,
                end: plan.end,
            }),
            driver: self.driver,
        });
        let version = check_change(self.meta.change_map(begin).await?)?.version;
        self.publish().await;
        Ok(version)
    }

    /// Takes move `op` over from whichever driver had it.
    pub async fn claim(&self, op: u64) -> Result<(), MoveError> {
        let claim = Change::ClaimMove(pb::ClaimMove {
            op,
            driver: self.driver,
        });
        check_change(self.meta.change_map(claim).await?)?;
        Ok(())
    }

    async fn advance(&self, op: u64, phase: pb::MovePhase, ceilings: Vec<u64>) -> Result<(), MoveError> {
        let advance = Change::AdvanceMove(pb::AdvanceMove {
            op,
            driver: self.driver,
            phase: phase as i32,
            ceilings,
        });
        check_change(self.meta.change_map(advance).await?)?;
        if matches!(phase, pb::MovePhase::Switched | pb::MovePhase::Cancelling) {
            self.publish().await;
        }
        Ok(())
    }

    /// Ends move `op` (done or cancelled) once the sets applied its last range steps.
    async fn finish(&self, op: u64) -> Result<(), MoveError> {
        let finish = Change::FinishMove(pb::FinishMove {
            op,
            driver: self.driver,
        });
        check_change(self.meta.change_map(finish).await?)?;
        self.publish().await;
        Ok(())
    }

    /// Drives move `op` from its recorded phase to done, reporting each step; a move being
    /// cancelled is driven to cancelled instead. Returns its final record.
    pub async fn drive(&self, op: u64, mut progress: impl FnMut(Progress)) -> Result<pb::MoveInfo, MoveError> {
        loop {
            let map = self.map().await?;
            let m = find_move(&map, op)?;
            let phase = pb::MovePhase::try_from(m.phase).unwrap_or(pb::MovePhase::Unspecified);
            if phase == pb::MovePhase::Cancelling {
                self.give_back(&map, &m).await?;
                self.finish(op).await?;
                progress(Progress::Step {
                    op,
                    phase: pb::MovePhase::Cancelled,
                });
                continue;
            }
            let Some(next) = next_phase(phase) else {
                return match phase {
                    pb::MovePhase::Done | pb::MovePhase::Cancelled => Ok(m),
                    _ => Err(MoveError::Refused(format!("move {op} is {}", phase.as_str_name()))),
                };
            };
            let ceilings = self.apply_step(&map, &m, next, &mut progress).await?;
            if next == pb::MovePhase::Done {
                self.finish(op).await?;
            } else {
                self.advance(op, next, ceilings).await?;
            }
            progress(Progress::Step { op, phase: next });
        }
    }

    /// Sends the set-level step that leads to `next`; the ceilings when `next` is SEALED.
    async fn apply_step(
        &self,
        map: &pb::ClusterMap,
        m: &pb::MoveInfo,
        next: pb::MovePhase,
        progress: &mut impl FnMut(Progress),
    ) -> Result<Vec<u64>, MoveError> {
        use pb::MovePhase::*;
        let step = |kind: pb::RangeStep, other_set: u64| pb::RangeStepRequest {
            op: m.op,
            step: kind as i32,
            sections: m.sections,
            other_set,
            ceilings: Vec::new(),
            map_version: 0,
            section_size: map.section_size,
            uid_limit: map.uid_limit,
            ledgers: Vec::new(),
        };
        match next {
            Importing => self
                .set_admin(map, m.to_set)?
                .range_step(step(pb::RangeStep::Import, m.from_set))
                .await
                .map(drop)?,
            Frozen => self
                .set_admin(map, m.from_set)?
                .range_step(step(pb::RangeStep::Freeze, m.to_set))
                .await
                .map(drop)?,
            Sealed => return self.wait_final(map, m, progress).await,
            Installed => self.seal_and_install(map, m, step).await?,
            Switched => {}
            Done => {
                let req = pb::RangeStepRequest {
                    map_version: m.switched_at,
                    ..step(pb::RangeStep::Tombstone, m.to_set)
                };
                self.set_admin(map, m.from_set)?.range_step(req).await.map(drop)?
            }
            _ => {}
        }
        Ok(Vec::new())
    }

    /// The step to INSTALLED: the source takes the seal, the target the range's ledgers and then
    /// the range.
    async fn seal_and_install(
        &self,
        map: &pb::ClusterMap,
        m: &pb::MoveInfo,
        step: impl Fn(pb::RangeStep, u64) -> pb::RangeStepRequest,
    ) -> Result<(), MoveError> {
        // The source learns of the seal before the target may serve: from here on it
        // refuses a set-level cancel. It refuses the seal when such a cancel came first
        // (between the record's seal and this step), and the target must then not install.
        self.set_admin(map, m.from_set)?
            .range_step(step(pb::RangeStep::Seal, m.to_set))
            .await
            .map_err(|e| match e {
                ControlError::Rejected(s) if s.code() == tonic::Code::FailedPrecondition => {
                    MoveError::Refused(format!(
                        "move {}: the source set {} did not take the seal, so the target must not install: {}",
                        m.op,
                        m.from_set,
                        s.message()
                    ))
                }
                other => MoveError::Control(other),
            })?;
        // The range's ledger counters go before the range: once the target serves it, a
        // ledger it lacked would be created anew and count from 1 again. Frozen at the
        // source since the freeze, they are read there now (the seal changed nothing of
        // them) and installed again whole if a driver repeats this step.
        let ledgers = self.set_admin(map, m.from_set)?.export_status(m.op).await?.ledgers;
        if !ledgers.is_empty() {
            let req = pb::RangeStepRequest {
                ledgers,
                ..step(pb::RangeStep::InstallLedgers, m.from_set)
            };
            self.set_admin(map, m.to_set)?.range_step(req).await.map(drop)?;
        }
        let req = pb::RangeStepRequest {
            ceilings: m.ceilings.clone(),
            ..step(pb::RangeStep::Install, m.from_set)
        };
        self.set_admin(map, m.to_set)?.range_step(req).await.map(drop)?;
        Ok(())
    }

    /// Polls the source until its leader vouches that the owners are gone; the final ceilings.
    async fn wait_final(
        &self,
        map: &pb::ClusterMap,
        m: &pb::MoveInfo,
        progress: &mut impl FnMut(Progress),
    ) -> Result<Vec<u64>, MoveError> {
        let source = self.set_admin(map, m.from_set)?;
        let started = Instant::now();
        loop {
            let s = source.export_status(m.op).await?;
            if s.ready {
                return Ok(s.ceilings);
            }
            progress(Progress::Waiting {
                op: m.op,
                held: s.held,
                wait_ms: s.wait_ms,
            });
            // The wait is bounded by the lease; a source that never gets ready is a bug or a
            // leader that keeps changing: give up after a generous bound and let `resume` retry.
            if started.elapsed() > Duration::from_secs(600) {
                return Err(MoveError::Refused(format!(
                    "move {}: the source has not vouched for the range in 10 minutes; resume later",
                    m.op
                )));
            }
            // Short polls: on the released path the owners let go at their next renewal.
            tokio::time::sleep(Duration::from_millis(s.wait_ms.clamp(20, 50))).await;
        }
    }

    /// Cancels move `op` before its seal: the record first (`cancelling`: no driver can seal it
    /// any more), then the source gives the range back and the target forgets its import, then
    /// the record ends (`cancelled`). Every part repeats harmlessly, so a cancel cut off anywhere
    /// is finished by running it again. A move that is cancelled already gets its range steps
    /// sent again: an older `seqctl` recorded the end first, and its steps may never have arrived.
    pub async fn cancel(&self, op: u64) -> Result<(), MoveError> {
        let map = self.map().await?;
        let m = find_move(&map, op)?;
        if m.phase == pb::MovePhase::Cancelled as i32 {
            return self.give_back(&map, &m).await;
        }
        self.claim(op).await?;
        self.advance(op, pb::MovePhase::Cancelling, Vec::new()).await?;
        let map = self.map().await?;
        self.give_back(&map, &find_move(&map, op)?).await?;
        self.finish(op).await
    }

    /// The set-level cancel, to the source (which owns the range again under a new epoch) and
    /// then the target (which forgets its import). Both repeat harmlessly.
    async fn give_back(&self, map: &pb::ClusterMap, m: &pb::MoveInfo) -> Result<(), MoveError> {
        let cancel = pb::RangeStepRequest {
            op: m.op,
            step: pb::RangeStep::Cancel as i32,
            sections: m.sections,
            other_set: 0,
            ceilings: Vec::new(),
            map_version: 0,
            section_size: map.section_size,
            uid_limit: map.uid_limit,
            ledgers: Vec::new(),
        };
        self.set_admin(map, m.from_set)?.range_step(cancel.clone()).await?;
        self.set_admin(map, m.to_set)?.range_step(cancel).await?;
        Ok(())
    }
}

/// The distinct data-plane addresses of a set's registered AllocSvrs.
fn alloc_addrs(s: &pb::StatusReply) -> Vec<String> {
    let mut addrs: Vec<String> = s
        .allocsvrs
        .iter()
        .map(|a| a.addr.clone())
        .filter(|a| !a.is_empty())
        .collect();
    addrs.sort();
    addrs.dedup();
    addrs
}

fn seeds_of(map: &pb::ClusterMap, set_id: u64) -> Result<Vec<Seed>, MoveError> {
    let set = map
        .sets
        .iter()
        .find(|s| s.set_id == set_id)
        .ok_or_else(|| MoveError::Refused(format!("set {set_id} is not in the cluster map")))?;
    set.stores
        .iter()
        .map(|a| Seed::parse(a))
        .collect::<Result<Vec<_>, _>>()
        .map_err(MoveError::Refused)
}

fn find_move(map: &pb::ClusterMap, op: u64) -> Result<pb::MoveInfo, MoveError> {
    map.moves
        .iter()
        .find(|m| m.op == op)
        .cloned()
        .ok_or_else(|| MoveError::Refused(format!("no move {op} in the cluster map")))
}

fn check_change(r: pb::ChangeMapReply) -> Result<pb::ChangeMapReply, MoveError> {
    if r.version_changed {
        return Err(MoveError::VersionChanged(r.version));
    }
    Ok(r)
}

/// Why the group at `stores` (answering `status`) cannot join the map as set `set_id`: it is
/// another set (a group started as set 0 would own every uid a second time), or its sections are
/// cut differently (a move between sets of different section sizes or uid limits would leave
/// uids unserved or served twice).
fn refuse_set(map: &pb::ClusterMap, set_id: u64, stores: &[String], status: &pb::StatusReply) -> Result<(), MoveError> {
    let p = status.params.unwrap_or_default();
    let at = stores.join(",");
    if status.leader_id == 0 || p.section_size == 0 {
        return Err(MoveError::Refused(format!(
            "the StoreSvrs at {at} have no leader with set parameters yet (no quorum, or not bootstrapped); retry"
        )));
    }
    if p.set_id != set_id {
        return Err(MoveError::Refused(format!(
            "the StoreSvrs at {at} serve set {}, not set {set_id} (a group must be started with --set-id {set_id})",
            p.set_id
        )));
    }
    if p.section_size != map.section_size || p.uid_limit != map.uid_limit {
        return Err(MoveError::Refused(format!(
            "set {set_id} has section size {} and uid limit {}, the cluster section size {} and uid limit {}: \
             every set must cut the uid space the same way",
            p.section_size, p.uid_limit, map.section_size, map.uid_limit
        )));
    }
    Ok(())
}

/// The same refusals as the map's own check, made before anything is sent, with clear words.
fn refuse_move(map: &pb::ClusterMap, from: u64, to: u64, begin: u64, end: u64) -> Result<(), MoveError> {
    let sets: BTreeMap<u64, &pb::SetInfo> = map.sets.iter().map(|s| (s.set_id, s)).collect();
    for set in [from, to] {
        if !sets.contains_key(&set) {
            return Err(MoveError::Refused(format!(
                "set {set} is not in the cluster map (add it with `seqctl set add`)"
            )));
        }
    }
    if from == to {
        return Err(MoveError::Refused(format!(
            "the source and target are the same set ({from}): a move goes between two sets"
        )));
    }
    let mut at = begin;
    for r in map
        .ranges
        .iter()
        .filter(|r| r.section_end > begin && r.section_begin < end)
    {
        if r.section_begin > at || r.set_id != from {
            return Err(MoveError::Refused(format!(
                "set {from} does not serve all of sections [{begin}, {end}) (sections [{}, {}) are set {}'s)",
                r.section_begin.max(begin),
                r.section_end.min(end),
                r.set_id
            )));
        }
        at = r.section_end;
    }
    if at < end {
        return Err(MoveError::Refused(format!(
            "sections [{at}, {end}) are served by no set"
        )));
    }
    let running = |m: &&pb::MoveInfo| {
        !matches!(
            pb::MovePhase::try_from(m.phase),
            Ok(pb::MovePhase::Done | pb::MovePhase::Cancelled)
        )
    };
    if let Some(m) = map
        .moves
        .iter()
        .filter(running)
        .find(|m| m.sections.is_some_and(|s| s.begin < end && begin < s.end))
    {
        return Err(MoveError::Refused(format!(
            "move {} overlaps the range; wait for it, or `seqctl move resume {}` / `seqctl move cancel {}`",
            m.op, m.op, m.op
        )));
    }
    Ok(())
}
