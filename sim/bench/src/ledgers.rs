//! The ledger side of `ledger-bench`: reserve+confirm pairs over gRPC `LedgerService`, the
//! numbers every pair was given, and the check at the end that the service's own summary agrees
//! with them (the promise G1 seen from the callers: no number handed out twice, none skipped).
//!
//! A pair is what an application does per invoice: `Reserve{key, holder, request_id}`, then
//! `Confirm{key, number, reference}` of the number it got, each answered after its Raft entry
//! committed. Caller `t` numbers the ledger `inv:{t % ledgers}` (one ledger by default: every
//! caller contends on it, as every caller of the PostgreSQL peer contends on its one row).
//!
//! [`Numbers`] keeps every confirmed number, per caller (each caller locks only its own list, so
//! the record costs no contention), for both sides: PostgreSQL's pairs are recorded the same way
//! ([`crate::postgres`]) and checked by the same [`check`].
//!
//! An *issue* ([`issue_load`]) is the same invoice in one call: `Reserve` with the reference,
//! confirmed in its own entry, for an application whose invoice has its id before its number.
//!
//! Deliberately left out: Release, Void and expiry (a pair that confirms what it reserves voids
//! nothing; the gap report's cost is not what this measures), and retries of a pair cut off by the
//! driver's deadline (it counts as an error and shows in the final check).

use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use seqsvr_proto::limits;
use seqsvr_proto::pb;
use seqsvr_proto::pb::ledger_service_client::LedgerServiceClient;
use tonic::transport::Channel;

use crate::load::{Answer, Pids, Sample, Window, drive};

/// How long a reserved number may stay held: far above any pair's time (a pair cut off leaves its
/// number held, and the final check must see it as held, not as voided by expiry).
pub const HOLD_MS: u64 = 3_600_000;

/// The name of ledger (and PostgreSQL series) `i`.
pub fn key_name(i: usize) -> String {
    format!("inv:{i}")
}

/// A `LedgerService` client over `channel`, with the data plane's message limits.
pub fn client(channel: Channel) -> LedgerServiceClient<Channel> {
    LedgerServiceClient::new(channel)
        .max_decoding_message_size(limits::DATA_PLANE_MESSAGE_BYTES)
        .max_encoding_message_size(limits::DATA_PLANE_MESSAGE_BYTES)
}

/// Every number a pair was given, per caller, over the whole benchmark (warm-ups included).
pub struct Numbers {
    callers: Vec<Mutex<Vec<(usize, u64)>>>,
}

/// What the callers saw of one ledger (or series).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Seen {
    /// Pairs that ended confirmed (committed).
    pub pairs: u64,
    /// Distinct numbers among them.
    pub distinct: u64,
    /// The highest number among them.
    pub highest: u64,
}

/// What the server says of one ledger (or series) at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Said {
    /// The highest number handed out.
    pub high: u64,
    /// Numbers confirmed (invoices inserted).
    pub confirmed: u64,
    /// Numbers still held (always 0 for PostgreSQL: a rolled-back transaction holds nothing).
    pub held: u64,
}

impl Numbers {
    /// Room for up to `callers` callers.
    pub fn new(callers: usize) -> Numbers {
        Numbers {
            callers: (0..callers).map(|_| Mutex::new(Vec::new())).collect(),
        }
    }

    /// Caller `caller` was given `number` of ledger `key`.
    pub fn record(&self, caller: usize, key: usize, number: u64) {
        // A poisoned lock only means another caller's task panicked; the list is still whole.
        let mut list = self.callers[caller].lock().unwrap_or_else(|p| p.into_inner());
        list.push((key, number));
    }

    /// What the callers saw, per key `0..keys`.
    pub fn seen(&self, keys: usize) -> Vec<Seen> {
        let mut all: Vec<(usize, u64)> = Vec::new();
        for c in &self.callers {
            all.extend(c.lock().unwrap_or_else(|p| p.into_inner()).iter().copied());
        }
        all.sort_unstable();
        let mut out = vec![Seen::default(); keys];
        let mut last = None;
        for (key, n) in all {
            let Some(s) = out.get_mut(key) else { continue };
            s.pairs += 1;
            if last != Some((key, n)) {
                s.distinct += 1;
            }
            s.highest = s.highest.max(n);
            last = Some((key, n));
        }
        out
    }
}

/// The final check of one side: for every key, the callers got `pairs` distinct numbers, the
/// highest of them `pairs` (so none skipped), and the server says high == pairs, confirmed ==
/// pairs, none held. With `cut_may_commit` (PostgreSQL: a transaction whose COMMIT was in flight
/// when the driver's deadline cut it may still have committed), the server may be ahead of the
/// callers, but then every number up to its high must be confirmed (no gap in the tables) and
/// the callers' numbers distinct and within it. `Ok` is the line to print; `Err` names each key
/// that disagrees.
pub fn check(side: &str, seen: &[Seen], said: &[Said], cut_may_commit: bool) -> Result<String, String> {
    let mut bad = Vec::new();
    if seen.len() != said.len() {
        bad.push(format!("{} keys seen, {} on the server", seen.len(), said.len()));
    }
    let mut unseen = 0;
    for (i, (s, d)) in seen.iter().zip(said).enumerate() {
        if s.distinct != s.pairs {
            bad.push(format!("{}: {} numbers given twice", key_name(i), s.pairs - s.distinct));
        }
        let agrees = if cut_may_commit {
            s.highest <= d.high && s.pairs <= d.high && d.confirmed == d.high && d.held == 0
        } else {
            s.highest == s.pairs && d.high == s.pairs && d.confirmed == s.pairs && d.held == 0
        };
        if !agrees {
            bad.push(format!(
                "{}: {} pairs confirmed to callers (highest number {}), server says high {}, confirmed {}, held {}",
                key_name(i),
                s.pairs,
                s.highest,
                d.high,
                d.confirmed,
                d.held
            ));
        }
        unseen += d.high.saturating_sub(s.pairs);
    }
    let pairs: u64 = seen.iter().map(|s| s.pairs).sum();
    if !bad.is_empty() {
        return Err(format!("{side}: the final check failed: {}", bad.join("; ")));
    }
    let server = if unseen > 0 {
        format!("high == confirmed, {unseen} above the pairs (committed, their replies cut by the 2 s deadline)")
    } else {
        "high == confirmed == pairs".to_string()
    };
    Ok(format!(
        "{side}: {pairs} pairs over {} key(s), every number distinct; the server says {server}, none held",
        seen.len()
    ))
}

/// Declares ledgers `inv:0..keys` through `client`. `Err` carries the gRPC status of the first
/// refusal (UNIMPLEMENTED: this server does not serve `LedgerService`).
pub async fn create(client: &LedgerServiceClient<Channel>, keys: usize) -> Result<(), tonic::Status> {
    for i in 0..keys {
        let req = pb::CreateLedgerRequest {
            key: key_name(i).into_bytes(),
            hold_ms: HOLD_MS,
        };
        let r = client.clone().create_ledger(req).await?.into_inner();
        if let Some(hint) = r.not_leader {
            return Err(tonic::Status::unavailable(format!("not the leader (hint: {hint:?})")));
        }
    }
    Ok(())
}

/// What the server says of ledgers `inv:0..keys` (Show, a linearizable read).
pub async fn said(client: &LedgerServiceClient<Channel>, keys: usize) -> Result<Vec<Said>, String> {
    let mut out = Vec::with_capacity(keys);
    for i in 0..keys {
        let req = pb::LedgerShowRequest {
            key: key_name(i).into_bytes(),
            from: 0,
            count: 0,
        };
        let mut client = client.clone();
        let r = tokio::time::timeout(Duration::from_secs(5), client.show(req))
            .await
            .map_err(|_| format!("Show {} timed out", key_name(i)))?
            .map_err(|e| format!("Show {}: {e}", key_name(i)))?
            .into_inner();
        let info = r
            .ledger
            .ok_or_else(|| format!("Show {}: no summary (not_leader {:?})", key_name(i), r.not_leader))?;
        out.push(Said {
            high: info.high,
            confirmed: info.confirmed,
            held: info.held,
        });
    }
    Ok(out)
}

/// Reserve+confirm pairs over `clients` (caller `t` uses channel `t % clients.len()` and ledger
/// `t % keys`); every confirmed number is recorded in `numbers`. A reply with `not_leader` set, or
/// without the number, is "not OK".
pub async fn pair_load(
    clients: &[LedgerServiceClient<Channel>],
    concurrency: usize,
    keys: usize,
    numbers: Arc<Numbers>,
    window: Window,
    pids: Pids<'_>,
) -> Sample {
    let clients = Arc::new(clients.to_vec());
    drive(concurrency, window, pids, move |t, seed| {
        let mut client = clients[t % clients.len()].clone();
        let numbers = numbers.clone();
        async move {
            let not_ok = Answer::Served { ok: 0, not_ok: 1 };
            let k = t % keys;
            let key = key_name(k).into_bytes();
            let reserve = pb::LedgerReserveRequest {
                key: key.clone(),
                holder: format!("caller-{t}"),
                request_id: format!("{seed:016x}"),
                reference: String::new(),
            };
            let r = match client.reserve(reserve).await {
                Ok(r) => r.into_inner(),
                Err(_) => return Answer::Failed,
            };
            let Some(number) = r.entry.map(|e| e.number).filter(|&n| n != 0 && r.not_leader.is_none()) else {
                return not_ok;
            };
            let confirm = pb::LedgerConfirmRequest {
                key,
                number,
                reference: format!("inv-{seed:016x}"),
            };
            let r = match client.confirm(confirm).await {
                Ok(r) => r.into_inner(),
                Err(_) => return Answer::Failed,
            };
            let confirmed = r
                .entry
                .is_some_and(|e| e.number == number && e.state == pb::LedgerState::Confirmed as i32);
            if !confirmed || r.not_leader.is_some() {
                return not_ok;
            }
            numbers.record(t, k, number);
            Answer::Served { ok: 1, not_ok: 0 }
        }
    })
    .await
}

/// Issues over `clients`, laid out as [`pair_load`]'s: one `Reserve` with a reference per invoice,
/// answered confirmed after its one Raft entry committed (what the PostgreSQL transaction does in
/// one COMMIT: the number and the invoice row together). A reply not confirmed is "not OK".
pub async fn issue_load(
    clients: &[LedgerServiceClient<Channel>],
    concurrency: usize,
    keys: usize,
    numbers: Arc<Numbers>,
    window: Window,
    pids: Pids<'_>,
) -> Sample {
    let clients = Arc::new(clients.to_vec());
    drive(concurrency, window, pids, move |t, seed| {
        let mut client = clients[t % clients.len()].clone();
        let numbers = numbers.clone();
        async move {
            let k = t % keys;
            let issue = pb::LedgerReserveRequest {
                key: key_name(k).into_bytes(),
                reference: format!("inv-{seed:016x}"),
                ..Default::default()
            };
            let r = match client.reserve(issue).await {
                Ok(r) => r.into_inner(),
                Err(_) => return Answer::Failed,
            };
            let number = r
                .entry
                .filter(|e| e.number != 0 && e.state == pb::LedgerState::Confirmed as i32)
                .map(|e| e.number);
            match number {
                Some(n) if r.not_leader.is_none() => {
                    numbers.record(t, k, n);
                    Answer::Served { ok: 1, not_ok: 0 }
                }
                _ => Answer::Served { ok: 0, not_ok: 1 },
            }
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn said(high: u64, confirmed: u64, held: u64) -> Said {
        Said { high, confirmed, held }
    }

    #[test]
    fn seen_counts_pairs_distinct_numbers_and_the_highest_per_key() {
        let n = Numbers::new(2);
        n.record(0, 0, 1);
        n.record(1, 0, 2);
        n.record(1, 1, 1);
        n.record(0, 1, 1);
        let seen = n.seen(2);
        assert_eq!(
            seen[0],
            Seen {
                pairs: 2,
                distinct: 2,
                highest: 2
            }
        );
        assert_eq!(
            seen[1],
            Seen {
                pairs: 2,
                distinct: 1,
                highest: 1
            }
        );
    }

    #[test]
    fn check_passes_only_when_callers_and_server_agree() {
        let n = Numbers::new(3);
        for (c, num) in [(0, 1), (1, 2), (2, 3)] {
            n.record(c, 0, num);
        }
        let seen = n.seen(1);
        assert!(check("ledger", &seen, &[said(3, 3, 0)], false).is_ok());
        // A number handed out above what the callers saw (a pair cut off after its reserve).
        assert!(check("ledger", &seen, &[said(4, 3, 1)], false).is_err());
        // A confirm the server did not count.
        assert!(check("ledger", &seen, &[said(3, 2, 0)], false).is_err());
        // A key missing on the server.
        assert!(check("ledger", &seen, &[], false).is_err());
    }

    #[test]
    fn a_cut_transaction_may_have_committed_but_leaves_no_gap() {
        let n = Numbers::new(2);
        n.record(0, 0, 1);
        n.record(1, 0, 3);
        let seen = n.seen(1);
        // Number 2's COMMIT went through after its caller gave up: 3 invoices, next = 3.
        let line = check("postgres", &seen, &[said(3, 3, 0)], true).expect("passes");
        assert!(line.contains("1 above the pairs"), "{line}");
        // The same for a ledger is a failure: a ledger call is never cut silently.
        assert!(check("ledger", &seen, &[said(3, 3, 0)], false).is_err());
        // A gap in the tables fails either way.
        assert!(check("postgres", &seen, &[said(3, 2, 0)], true).is_err());
    }

    #[test]
    fn check_refuses_a_number_given_twice_and_a_skipped_one() {
        let twice = Numbers::new(2);
        twice.record(0, 0, 1);
        twice.record(1, 0, 1);
        let e = check("postgres", &twice.seen(1), &[said(2, 2, 0)], true).unwrap_err();
        assert!(e.contains("given twice"), "{e}");
        let skipped = Numbers::new(2);
        skipped.record(0, 0, 1);
        skipped.record(1, 0, 3);
        assert!(check("ledger", &skipped.seen(1), &[said(2, 2, 0)], false).is_err());
    }
}
