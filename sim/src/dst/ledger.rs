//! Ledger counters in `sim dst --ledger`: the callers that reserve, confirm and release numbers
//! of a few ledgers through the StoreSvr's production LedgerService logic
//! (`storesvr::protocol::step` and `committed` with `Request::Ledger`, behind the modelled Raft
//! group, as the gRPC service runs them), the operator who reconciles a restored ledger, the calls
//! after the heal, and what the checker (`checks::ledger`) is handed at the end.
//!
//! A caller reserves with a request id of its own, then confirms with a reference of its own
//! (most), releases, or crashes (never says anything more: its number must end expired by the
//! leader's expiry tick, which runs with the arbiter on the group's wall clock). Some retry a
//! reserve with the same request id, as after a lost reply (the same number while it is held);
//! some repeat a confirm (the same reference: answered again; another: ALREADY_EXISTS); some
//! confirm only after the hold ran out (answered "voided"). A fifth of the series are issues
//! instead (a reserve with a reference, confirmed in its one write), some sent twice, as after a
//! lost reply (the same number again). A call follows the leader as the AllocSvr's store client
//! does, retries the same write on a silence or "may have been committed" until its deadline, and
//! tries the other set when one says the ledger is not its own.
//!
//! Negative control `--unsafe-ledger-answer-before-commit`: a reserve is answered when the leader
//! steps it, with the number it predicts from its applied state and its own reserves not yet
//! committed, while the entry goes on to Raft; a leader change then hands the number out again.
//! It lives here, in the driver, not in `protocol::step::Switches`: when to answer is the driver's
//! part (step only says what to commit), and production's driver is the gRPC service's writer.
//!
//! Deliberately left out: the AllocSvr's forwarding of ledger calls (not built yet: the callers
//! reach the store as `seqctl ledger` does), Show and Gaps (reads of the same state the checker
//! reads whole), and operator voids.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use seqsvr_proto::pb;
use storesvr::domain::ledger::Ledger;
use storesvr::error::RpcError;
use storesvr::protocol::ledger::LedgerCall;
use storesvr::protocol::{Reply, Request};
use tokio::time::Instant;

use super::addrs::REPLICAS;
use super::group::{Rep, Step, Wall};
use super::world::{Ep, ID_ORIGIN_MS, World};
use crate::checks::ledger::{LedgerAnswer, LedgerAsk, LedgerOp};

/// The ledgers of every seed: three, so that callers share each and some land in other sections.
pub const KEYS: [&str; 3] = ["invoices-eu", "invoices-us", "receipts"];
/// Callers, each one series of reserves at a time.
const CALLERS: u32 = 4;
/// The caller id of the calls after the heal.
pub const VERIFY_CALLER: u32 = 100;
/// How long one call keeps trying (the AllocSvr's store calls give up after 5 s; a caller of a
/// ledger has its own deadline) and how long one attempt waits for an answer.
const CALL_DEADLINE: Duration = Duration::from_secs(2);
const ATTEMPT: Duration = Duration::from_millis(300);

/// One seed's ledger workload: its calls so far, and the leaders' predictions under the control.
pub struct LedgerRun {
    world: Arc<World>,
    answer_before_commit: bool,
    /// The seed's hold: 1 to 2 s, so that holds end within the load and the settle.
    pub hold_ms: u64,
    ops: Mutex<Vec<LedgerOp>>,
    next_id: AtomicU64,
    /// Reserves a leader stepped and has not seen commit, by (set, replica, term, key): what it
    /// adds to its applied `high` to predict the next number under the control.
    pending: Arc<Mutex<Pending>>,
    /// The ledgers created (answered OK), for the operator to find one a restore lost.
    created: Mutex<BTreeSet<String>>,
    /// Ledgers the operator is creating again after a restore lost them: nobody calls them.
    repairing: Mutex<BTreeSet<String>>,
}

/// Reserves a leader answered early and has not seen decided, by (set, replica, term, key).
type Pending = BTreeMap<(u64, usize, u64, String), u64>;

/// Gives every group the wall clock its leaders stamp holds with (the true time, unless `--ids`
/// set one up already) and draws the seed's hold.
pub fn set_up(world: &Arc<World>, seed: u64, answer_before_commit: bool) -> Arc<LedgerRun> {
    for g in &mut world.lock().groups {
        g.wall.get_or_insert(Wall(world.start.into_std(), ID_ORIGIN_MS));
    }
    let mut rng = StdRng::seed_from_u64(seed ^ 0x1ed9_e700_0000_0000);
    Arc::new(LedgerRun {
        world: world.clone(),
        answer_before_commit,
        hold_ms: [1_000, 1_500, 2_000][rng.random_range(0..3)],
        ops: Mutex::new(Vec::new()),
        next_id: AtomicU64::new(0),
        pending: Default::default(),
        created: Default::default(),
        repairing: Default::default(),
    })
}

/// Why a call ended without a ledger reply.
enum Fail {
    Refused(RpcError),
    Unknown,
}

impl LedgerRun {
    /// The calls so far, in the order they completed.
    pub fn ops(&self) -> Vec<LedgerOp> {
        self.ops.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Every set's copy of each ledger now.
    pub fn finals(&self) -> BTreeMap<String, Vec<Ledger>> {
        let st = self.world.lock();
        KEYS.iter()
            .map(|k| {
                let copies = st.groups.iter().filter_map(|g| g.set.ledgers.by_key.get(*k).cloned());
                (k.to_string(), copies.collect())
            })
            .collect()
    }

    /// Creates the ledgers (once the set is initialized), then starts the callers and the
    /// operator, until `stop`.
    pub fn spawn(self: &Arc<Self>, seed: u64, stop: &Arc<AtomicBool>) {
        let run = self.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            for key in KEYS {
                let until = Instant::now() + Duration::from_secs(5);
                while Instant::now() < until && !run.create(key).await {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            for c in 0..CALLERS {
                tokio::spawn(run.clone().caller(c, seed, stop.clone()));
            }
            run.operator().await;
        });
    }

    /// One caller's series: reserve, then confirm, release or crash (see the module's essay).
    async fn caller(self: Arc<Self>, c: u32, seed: u64, stop: Arc<AtomicBool>) {
        let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(97) ^ 0x1ed9_0000_0000_0000 ^ u64::from(c));
        let mut op = 0u64;
        while !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(rng.random_range(5..40))).await;
            op += 1;
            let key = KEYS[rng.random_range(0..KEYS.len())];
            if self.repairing.lock().unwrap_or_else(|e| e.into_inner()).contains(key) {
                continue;
            }
            if rng.random_bool(0.2) {
                // An issue: confirmed in its own write. Sent again after a lost reply, and now and
                // then for no reason: the same reference must answer the same number.
                let reference = format!("iss-{c}-{op}");
                let ask = || LedgerAsk::Issue {
                    reference: reference.clone(),
                };
                let first = self.record(c, key, ask(), CALL_DEADLINE).await;
                if first == LedgerAnswer::Unknown || rng.random_bool(0.15) {
                    self.record(c, key, ask(), CALL_DEADLINE).await;
                }
                continue;
            }
            let rid = format!("c{c}-{op}");
            let LedgerAnswer::Ok { number, .. } = self.reserve(c, key, &rid, CALL_DEADLINE).await else {
                continue;
            };
            if rng.random_bool(0.1) {
                self.reserve(c, key, &rid, CALL_DEADLINE).await;
            }
            let reference = format!("ref-{c}-{op}");
            match rng.random_range(0..100) {
                // Crashed between reserve and confirm: the hold must expire.
                0..15 => {}
                15..30 => {
                    let release = LedgerAsk::Release { number };
                    self.record(c, key, release, CALL_DEADLINE).await;
                }
                late => {
                    let wait = if late >= 90 {
                        self.hold_ms + rng.random_range(100..300)
                    } else {
                        rng.random_range(0..50)
                    };
                    tokio::time::sleep(Duration::from_millis(wait)).await;
                    self.confirm(c, key, number, &reference).await;
                    if rng.random_bool(0.15) {
                        self.confirm(c, key, number, &reference).await;
                    }
                    if rng.random_bool(0.1) {
                        self.confirm(c, key, number, &format!("{reference}-other")).await;
                    }
                }
            }
        }
    }

    async fn reserve(&self, c: u32, key: &str, rid: &str, deadline: Duration) -> LedgerAnswer {
        let ask = LedgerAsk::Reserve {
            request_id: rid.to_string(),
        };
        self.record(c, key, ask, deadline).await
    }

    async fn confirm(&self, c: u32, key: &str, number: u64, reference: &str) -> LedgerAnswer {
        let ask = LedgerAsk::Confirm {
            number,
            reference: reference.to_string(),
        };
        self.record(c, key, ask, CALL_DEADLINE).await
    }

    /// Calls `ask` on `key` for caller `c` and records it with its answer.
    async fn record(&self, c: u32, key: &str, ask: LedgerAsk, deadline: Duration) -> LedgerAnswer {
        let k = key.as_bytes().to_vec();
        let call = match &ask {
            LedgerAsk::Reserve { request_id } => LedgerCall::Reserve(pb::LedgerReserveRequest {
                key: k,
                holder: format!("caller-{c}"),
                request_id: request_id.clone(),
                reference: String::new(),
            }),
            LedgerAsk::Issue { reference } => LedgerCall::Reserve(pb::LedgerReserveRequest {
                key: k,
                reference: reference.clone(),
                ..Default::default()
            }),
            LedgerAsk::Confirm { number, reference } => LedgerCall::Confirm(pb::LedgerConfirmRequest {
                key: k,
                number: *number,
                reference: reference.clone(),
            }),
            LedgerAsk::Release { number } => LedgerCall::Release(pb::LedgerReleaseRequest {
                key: k,
                number: *number,
                note: String::new(),
            }),
        };
        let invoke_ns = self.world.now_ns();
        let (set, answer) = self.ask(call, deadline).await;
        let answer = match answer {
            Ok(r) => LedgerAnswer::Ok {
                number: r.entry.map_or(0, |e| e.number),
                repeated: r.repeated,
            },
            Err(Fail::Unknown) => LedgerAnswer::Unknown,
            Err(Fail::Refused(RpcError::AlreadyExists(_))) => LedgerAnswer::AlreadyExists,
            Err(Fail::Refused(RpcError::FailedPrecondition(m))) if m.contains("is voided") => LedgerAnswer::Voided,
            Err(Fail::Refused(e)) => LedgerAnswer::Refused(e.to_string()),
        };
        let op = LedgerOp {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            caller: c,
            set,
            key: key.to_string(),
            ask,
            invoke_ns,
            complete_ns: self.world.now_ns(),
            answer: answer.clone(),
        };
        self.ops.lock().unwrap_or_else(|e| e.into_inner()).push(op);
        answer
    }

    /// `call` until a ledger reply, a refusal or the deadline: follows the leader, retries the
    /// same write on a silence, and tries the next set when one says the key is not its own.
    /// Returns the set asked last with the outcome.
    async fn ask(&self, call: LedgerCall, deadline: Duration) -> (u64, Result<pb::LedgerReply, Fail>) {
        let until = Instant::now() + deadline;
        let sets = self.world.lock().groups.len() as u64;
        let (mut set, mut r) = (0u64, 0usize);
        let req = Request::Ledger(call);
        loop {
            let now = Instant::now();
            if now >= until {
                return (set, Err(Fail::Unknown));
            }
            let rep = tokio::time::timeout(ATTEMPT.min(until - now), self.rpc(set, r, &req)).await;
            let pause = match rep {
                Ok(Rep::Reply(Reply::Ledger(reply))) => return (set, Ok(*reply)),
                Ok(Rep::Reply(other)) => {
                    let e = RpcError::Internal(format!("a ledger call answered {other:?}"));
                    return (set, Err(Fail::Refused(e)));
                }
                Ok(Rep::NotLeader(hint)) => {
                    r = hint.unwrap_or(r + 1) % REPLICAS;
                    10
                }
                Ok(Rep::Error(RpcError::Unavailable(m))) if m.contains("not served by this set") && sets > 1 => {
                    set = (set + 1) % sets;
                    20
                }
                Ok(Rep::Error(RpcError::NotFound(m))) if m.starts_with("no ledger") && sets > 1 => {
                    set = (set + 1) % sets;
                    20
                }
                Ok(Rep::Error(RpcError::Unavailable(_) | RpcError::MaybeCommitted(_))) => 20,
                Ok(Rep::Error(e)) => return (set, Err(Fail::Refused(e))),
                Err(_) => {
                    r = (r + 1) % REPLICAS;
                    0
                }
            };
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }

    /// One attempt at replica `r` of `set`, across the network both ways.
    async fn rpc(&self, set: u64, r: usize, req: &Request) -> Rep {
        self.world.cross(Ep::Clients, Ep::Store(set, r)).await;
        let rep = if self.answer_before_commit {
            self.deliver_early(set, r, req).await
        } else {
            self.world.deliver(set, r, req).await
        };
        let Some(rep) = rep else {
            return std::future::pending().await;
        };
        self.world.cross(Ep::Store(set, r), Ep::Clients).await;
        rep
    }

    /// The negative control's delivery: a reserve is answered with the leader's prediction at
    /// once, and its entry committed behind the answer; every other call as usual.
    async fn deliver_early(&self, set: u64, r: usize, req: &Request) -> Option<Rep> {
        let Request::Ledger(LedgerCall::Reserve(q)) = req else {
            return self.world.deliver(set, r, req).await;
        };
        let key = String::from_utf8_lossy(&q.key).into_owned();
        let early = {
            let mut st = self.world.lock();
            let g = &mut st.groups[set as usize];
            match g.receive(r, req, Instant::now().into_std()) {
                Step::Silent => return None,
                Step::Answer(rep) => return Some(rep),
                Step::Commit(cmd) => g.set.ledgers.by_key.get(&key).map(|l| {
                    let term = g.term_of(r);
                    let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
                    let mine = pending.entry((set, r, term, key.clone())).or_default();
                    let (number, fresh) = match l.requests.get(&q.request_id) {
                        Some(&n) if !q.request_id.is_empty() => (n, false),
                        _ => {
                            *mine += 1;
                            (l.high + *mine, true)
                        }
                    };
                    (cmd, term, number, fresh)
                }),
            }
        };
        // No such ledger here: the step's own refusal, after the commit as usual.
        let Some((cmd, term, number, fresh)) = early else {
            return self.world.deliver(set, r, req).await;
        };
        // The entry goes on to Raft behind the answer; the leader forgets its prediction once the
        // entry is decided (applied, so in `high`, or lost with the leadership).
        let (world, pending) = (self.world.clone(), self.pending.clone());
        tokio::spawn(async move {
            let _ = world.commit(set, r, term, &cmd).await;
            if fresh
                && let Some(n) = pending
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_mut(&(set, r, term, key))
            {
                *n = n.saturating_sub(1);
            }
        });
        let state = if q.reference.is_empty() {
            pb::LedgerState::Held
        } else {
            pb::LedgerState::Confirmed
        };
        let entry = pb::LedgerEntry {
            number,
            state: state.into(),
            ..Default::default()
        };
        Some(Rep::Reply(Reply::Ledger(Box::new(pb::LedgerReply {
            entry: Some(entry),
            ..Default::default()
        }))))
    }

    /// Reconciles every ledger a restore marked, at one above the highest number any caller was
    /// answered (the operator's own records) or the backup holds, as `seqctl ledger reconcile`
    /// would be run; a ledger created after the backup, which the restore lost whole, is created
    /// again first (else its numbers would start at 1 again).
    async fn operator(&self) {
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let (restored, lost) = {
                let st = self.world.lock();
                let marked = st.groups.iter().flat_map(|g| g.set.ledgers.by_key.iter());
                let restored: Vec<(String, u64)> = marked
                    .filter(|(_, l)| l.restored)
                    .map(|(k, l)| (k.clone(), l.high))
                    .collect();
                let created = self.created.lock().unwrap_or_else(|e| e.into_inner());
                let anywhere = |k: &String| st.groups.iter().any(|g| g.set.ledgers.by_key.contains_key(k));
                let lost: Vec<(String, u64)> = if st.restores.rewinds.is_empty() {
                    Vec::new()
                } else {
                    created
                        .iter()
                        .filter(|k| !anywhere(k))
                        .map(|k| (k.clone(), 0))
                        .collect()
                };
                (restored, lost)
            };
            if !lost.is_empty() {
                // Re-created, it would hand out 1 again until the reconcile: the callers of a lost
                // ledger stop until it is repaired, and the calls already out run to their end.
                self.repairing
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend(lost.iter().map(|(k, _)| k.clone()));
                tokio::time::sleep(CALL_DEADLINE + ATTEMPT).await;
            }
            for (key, _) in &lost {
                let _ = self.create(key).await;
            }
            for (key, high) in restored.into_iter().chain(lost) {
                // Above what the callers were told and what the backup held (`seqctl ledger show`).
                let next = self.answered_high(&key).max(high) + 1;
                let call = LedgerCall::Reconcile(pb::LedgerReconcileRequest {
                    key: key.clone().into_bytes(),
                    next,
                    who: "operator".into(),
                });
                if self.ask(call, CALL_DEADLINE).await.1.is_ok() {
                    self.repairing.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
                }
            }
        }
    }

    /// The highest number any caller of `key` was answered.
    fn answered_high(&self, key: &str) -> u64 {
        let ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
        let numbers = ops.iter().filter(|o| o.key == key).filter_map(|o| match o.answer {
            LedgerAnswer::Ok { number, .. } => Some(number),
            _ => None,
        });
        numbers.max().unwrap_or(0)
    }

    /// Creates `key` with the seed's hold; whether it was answered OK.
    async fn create(&self, key: &str) -> bool {
        let create = pb::CreateLedgerRequest {
            key: key.into(),
            hold_ms: self.hold_ms,
        };
        let ok = self.ask(LedgerCall::Create(create), CALL_DEADLINE).await.1.is_ok();
        if ok {
            self.created
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key.to_string());
        }
        ok
    }

    /// After the heal: each ledger must serve a reserve and a confirm again (the checker's
    /// Liveness), a few tries with long deadlines.
    pub async fn verify(&self) {
        for key in KEYS {
            for attempt in 0..3 {
                let rid = format!("verify-{key}-{attempt}");
                let deadline = Duration::from_secs(10);
                if let LedgerAnswer::Ok { number, .. } = self.reserve(VERIFY_CALLER, key, &rid, deadline).await {
                    let ask = LedgerAsk::Confirm {
                        number,
                        reference: rid.clone(),
                    };
                    if matches!(
                        self.record(VERIFY_CALLER, key, ask, deadline).await,
                        LedgerAnswer::Ok { .. }
                    ) {
                        break;
                    }
                }
            }
        }
    }
}
