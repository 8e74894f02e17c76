//! The ledger workload of `sim run --ledger`: callers of the client library (any AllocSvr, which
//! forwards to the owning set's StoreSvr leader) that reserve numbers of a few ledgers and then
//! confirm, release or abandon them, recorded for the ledger checkers (`checks::ledger`, G1–G3
//! and holds) — the same checkers `sim dst --ledger` runs, here over real processes and real
//! faults.
//!
//! What each caller does, drawn from its seed: reserve with a request id of its own; then, most
//! often, confirm with a reference; sometimes release; sometimes nothing at all (a caller that
//! crashed between reserve and confirm: its number must end voided as expired); now and then it
//! repeats its confirm (same reference: answered the same) or confirms with another reference
//! (refused). A reserve whose outcome is unknown is sent again with the same request id, as a
//! caller that lost the reply would: while the number is held it gets the same number back. A
//! fifth of the calls are issues (the next number confirmed in the same write), sent again with
//! the same reference when the reply is lost, and now and then for no reason.
//!
//! The final state is read from each set's backup (a linearizable copy of its whole replicated
//! state), so the checker sees every ledger as the StoreSvrs keep it, not as a reply says.
//!
//! Deliberately left out: operator voids and reconciles (the unit and e2e tests cover them) and
//! restores (`sim dst --ledger` simulates them; `sim run` has no restore fault).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use seqsvr_client::{Client, ClientError, FailureKind};

use crate::checks::ledger::{LedgerAnswer, LedgerAsk, LedgerOp, Ledgers};
use crate::history::Record;
use crate::workload::Recorder;

/// Client ids of the ledger callers start here.
pub const LEDGER_CLIENT_BASE: u32 = 4000;
/// How many ledgers the run uses: few, so that callers contend on each one.
pub const LEDGERS: usize = 4;
/// How long a reserved number stays held. Short, so that abandoned numbers expire within the run
/// and the checker sees them voided.
pub const HOLD: Duration = Duration::from_secs(5);

/// The ledger keys of a run.
pub fn keys() -> Vec<String> {
    (0..LEDGERS).map(|i| format!("sim-ledger:{i}")).collect()
}

/// What a caller does with a number it reserved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Then {
    Confirm,
    ConfirmTwice,
    ConfirmOther,
    Release,
    Abandon,
}

fn then(rng: &mut StdRng) -> Then {
    match rng.random_range(0..100) {
        0..70 => Then::Confirm,
        70..78 => Then::ConfirmTwice,
        78..82 => Then::ConfirmOther,
        82..92 => Then::Release,
        _ => Then::Abandon,
    }
}

/// How a client call ended, in the checker's words.
fn answer(r: Result<u64, ClientError>, repeated: bool) -> LedgerAnswer {
    match r {
        Ok(number) => LedgerAnswer::Ok { number, repeated },
        Err(ClientError::Unknown { .. }) => LedgerAnswer::Unknown,
        Err(ClientError::Failed {
            kind: FailureKind::Conflict,
            ..
        }) => LedgerAnswer::AlreadyExists,
        Err(ClientError::Failed { detail, .. }) if detail.contains("is voided") => LedgerAnswer::Voided,
        Err(e) => LedgerAnswer::Refused(e.to_string()),
    }
}

/// One caller's calls, recorded as they end.
struct Caller<'a> {
    client: &'a Client,
    id: u32,
    rec: &'a Recorder,
}

impl Caller<'_> {
    async fn call(&self, key: &str, ask: LedgerAsk) -> LedgerAnswer {
        let (id, invoke_ns) = self.rec.history.begin();
        let answer = match &ask {
            LedgerAsk::Reserve { request_id } => {
                let r = self
                    .client
                    .ledger_reserve_with_id(key, &format!("c{}", self.id), request_id)
                    .await;
                let repeated = r.as_ref().is_ok_and(|r| r.repeated);
                answer(r.map(|r| r.entry.map_or(0, |e| e.number)), repeated)
            }
            LedgerAsk::Confirm { number, reference } => {
                let r = self.client.ledger_confirm(key, *number, reference).await;
                let repeated = r.as_ref().is_ok_and(|r| r.repeated);
                answer(r.map(|_| *number), repeated)
            }
            LedgerAsk::Release { number } => {
                let r = self.client.ledger_release(key, *number, "sim").await;
                let repeated = r.as_ref().is_ok_and(|r| r.repeated);
                answer(r.map(|_| *number), repeated)
            }
            LedgerAsk::Issue { reference } => {
                let r = self.client.ledger_issue(key, reference).await;
                let repeated = r.as_ref().is_ok_and(|r| r.repeated);
                answer(r.map(|r| r.entry.map_or(0, |e| e.number)), repeated)
            }
        };
        let op = LedgerOp {
            id,
            caller: self.id,
            // The AllocSvr forwards to whichever set owns the key: the checker finds it in the
            // final state, not here.
            set: 0,
            key: key.to_string(),
            ask,
            invoke_ns,
            complete_ns: self.rec.history.clock().now_ns(),
            answer: answer.clone(),
        };
        self.rec.counters.calls.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.rec.history.write(&Record::Ledger(op)) {
            tracing::error!(error = %e, "history write failed");
        }
        answer
    }
}

/// Declares the run's ledgers (retried until the cluster answers, at most `wait`).
pub async fn create(client: &Client, wait: Duration) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + wait;
    for key in keys() {
        loop {
            match client.ledger_create(&key, HOLD).await {
                Ok(_) => break,
                Err(e) if tokio::time::Instant::now() > deadline => {
                    anyhow::bail!("ledger {key} could not be created: {e}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }
    Ok(())
}

/// A ledger caller until `stop`, at most `rate` reserves a second.
pub async fn run_caller(client: Client, id: u32, seed: u64, rate: f64, rec: Arc<Recorder>, stop: Arc<AtomicBool>) {
    let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(0x51ed).wrapping_add(u64::from(id)));
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(0.1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let keys = keys();
    let caller = Caller {
        client: &client,
        id,
        rec: &rec,
    };
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        n += 1;
        let key = &keys[rng.random_range(0..keys.len())];
        if rng.random_bool(0.2) {
            let issue = || LedgerAsk::Issue {
                reference: format!("ISS-{id}-{n}"),
            };
            if caller.call(key, issue()).await == LedgerAnswer::Unknown || rng.random_bool(0.1) {
                // The reply was lost (or the caller restarted): the same reference again.
                caller.call(key, issue()).await;
            }
            continue;
        }
        let request_id = format!("c{id}-{n}");
        let reserve = || LedgerAsk::Reserve {
            request_id: request_id.clone(),
        };
        let mut got = caller.call(key, reserve()).await;
        if got == LedgerAnswer::Unknown {
            // The reply was lost: ask again with the same request id.
            got = caller.call(key, reserve()).await;
        }
        let LedgerAnswer::Ok { number, .. } = got else {
            continue;
        };
        let confirm = |reference: String| LedgerAsk::Confirm { number, reference };
        let reference = format!("INV-{id}-{n}");
        match then(&mut rng) {
            Then::Abandon => {}
            Then::Release => {
                caller.call(key, LedgerAsk::Release { number }).await;
            }
            Then::Confirm => {
                caller.call(key, confirm(reference)).await;
            }
            Then::ConfirmTwice => {
                caller.call(key, confirm(reference.clone())).await;
                caller.call(key, confirm(reference)).await;
            }
            Then::ConfirmOther => {
                caller.call(key, confirm(reference)).await;
                caller.call(key, confirm(format!("OTHER-{id}-{n}"))).await;
            }
        }
    }
}

/// Every ledger as each set keeps it at the end, read from the set's backup (taken by its leader
/// after a ReadIndex): key → one copy per set that has it.
pub async fn final_ledgers(backups: &[seqsvr_control::BackupClient]) -> anyhow::Result<Ledgers> {
    // Every hold the workload left (an abandoned number, a confirm lost to a fault) ends by its
    // deadline: wait that out, and a few expiry ticks more, so that the state read is the one
    // the holds promise (none held).
    tokio::time::sleep(HOLD + Duration::from_secs(2)).await;
    let mut all: Ledgers = BTreeMap::new();
    for (set, b) in backups.iter().enumerate() {
        let file = b
            .backup()
            .await
            .map_err(|e| anyhow::anyhow!("backup of set {set}: {e}"))?;
        let (_, state) = storesvr::backup::read(&file).map_err(|e| anyhow::anyhow!("backup of set {set}: {e}"))?;
        for (key, l) in state.ledgers.by_key {
            all.entry(key).or_default().push(l);
        }
    }
    Ok(all)
}

/// Declares the ledgers and starts `callers` ledger callers until `stop`.
pub async fn start(
    cfg: &seqsvr_client::ClientConfig,
    seed: u64,
    callers: u32,
    rate: f64,
    rec: &Arc<Recorder>,
    stop: &Arc<AtomicBool>,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    let probe = Client::connect(cfg.clone()).await?;
    create(&probe, Duration::from_secs(30)).await?;
    let mut workers = Vec::new();
    for c in 0..callers {
        let client = Client::connect(cfg.clone()).await?;
        let caller = run_caller(client, LEDGER_CLIENT_BASE + c, seed, rate, rec.clone(), stop.clone());
        workers.push(tokio::spawn(caller));
    }
    Ok(workers)
}

/// After the final heal: every ledger must serve a reserve and its confirm again (each retried
/// for up to `wait`), recorded like the workload's calls.
pub async fn verify(cfg: &seqsvr_client::ClientConfig, rec: &Recorder, wait: Duration) -> anyhow::Result<()> {
    let client = Client::connect(cfg.clone()).await?;
    let caller = Caller {
        client: &client,
        id: LEDGER_CLIENT_BASE - 1,
        rec,
    };
    let deadline = tokio::time::Instant::now() + wait;
    for (i, key) in keys().iter().enumerate() {
        let mut attempt = 0;
        while tokio::time::Instant::now() < deadline {
            attempt += 1;
            let request_id = format!("verify-{i}-{attempt}");
            if let LedgerAnswer::Ok { number, .. } = caller.call(key, LedgerAsk::Reserve { request_id }).await {
                let reference = format!("VERIFY-{i}");
                if let LedgerAnswer::Ok { .. } = caller.call(key, LedgerAsk::Confirm { number, reference }).await {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}

/// A backup client of each set, over admin TLS when the run has it.
pub fn backup_clients(topo: &crate::topology::Topology) -> anyhow::Result<Vec<seqsvr_control::BackupClient>> {
    let timeouts = seqsvr_control::StoreTimeouts {
        attempt: Duration::from_secs(10),
        overall: Duration::from_secs(30),
    };
    let dialer = seqsvr_control::Dialer::with_tls(crate::tls::admin());
    (0..topo.sets)
        .map(|set| {
            seqsvr_control::BackupClient::with_dialer(topo.store_seeds(set), timeouts, &dialer)
                .map_err(anyhow::Error::msg)
        })
        .collect()
}

/// After the final heal: [`verify`] every ledger, then read them all ([`final_ledgers`]).
pub async fn after_heal(
    cfg: &seqsvr_client::ClientConfig,
    rec: &Recorder,
    topo: &crate::topology::Topology,
) -> anyhow::Result<Ledgers> {
    verify(cfg, rec, Duration::from_secs(30)).await?;
    final_ledgers(&backup_clients(topo)?).await
}
