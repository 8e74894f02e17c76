//! The LedgerService's calls as plain functions: each checks a request and builds the ledger
//! command a Raft write carries ([`command`]), turns the applied result into the reply
//! ([`committed`]), or answers a linearizable read from the applied state ([`read`]).
//!
//! A write is answered only after its entry committed and applied, from the result the state
//! machine returned: the number a reserve hands out is the one its own entry made held, so a
//! leader change can lose an unanswered reserve but never answer one twice (G1). The negative
//! control `--unsafe-ledger-answer-before-commit` breaks exactly that (see `grpc::serve`).
//!
//! Every refusal maps to one gRPC status, named for what the caller does next (the table is in
//! `ledger.proto`).
//!
//! Left out: Raft (the drivers commit and pass the read index), and which set owns a key (an
//! AllocSvr finds the set; a set that does not own the key's section refuses with UNAVAILABLE).

use seqsvr_proto::keys::check_key;
use seqsvr_proto::pb;

use crate::domain::ledger::{self, Ledger, LedgerCommand, LedgerResult, NumberState, Refusal, Summary, VoidReason};
use crate::domain::state::{Command, CommandResult, SetState};
use crate::error::RpcError;
use crate::protocol::{params_of, unexpected};

/// Most numbers one Show returns, and most voided runs one Gaps page returns.
pub const MAX_SHOW: u32 = 1_000;
pub const MAX_GAPS_PAGE: u32 = 10_000;

/// A LedgerService request.
#[derive(Clone, Debug)]
pub enum LedgerCall {
    Create(pb::CreateLedgerRequest),
    Reserve(pb::LedgerReserveRequest),
    Confirm(pb::LedgerConfirmRequest),
    Release(pb::LedgerReleaseRequest),
    Void(pb::LedgerVoidRequest),
    Reconcile(pb::LedgerReconcileRequest),
    Show(pb::LedgerShowRequest),
    Gaps(pb::LedgerGapsRequest),
}

impl LedgerCall {
    /// A linearizable read (Show, Gaps); every other call is a write.
    pub fn reads(&self) -> bool {
        matches!(self, LedgerCall::Show(_) | LedgerCall::Gaps(_))
    }

    /// An operator's call, recorded in the audit trail as it applies.
    pub fn is_admin(&self) -> bool {
        matches!(self, LedgerCall::Void(_) | LedgerCall::Reconcile(_))
    }

    /// The key's bytes.
    pub fn key_bytes(&self) -> &[u8] {
        match self {
            LedgerCall::Create(q) => &q.key,
            LedgerCall::Reserve(q) => &q.key,
            LedgerCall::Confirm(q) => &q.key,
            LedgerCall::Release(q) => &q.key,
            LedgerCall::Void(q) => &q.key,
            LedgerCall::Reconcile(q) => &q.key,
            LedgerCall::Show(q) => &q.key,
            LedgerCall::Gaps(q) => &q.key,
        }
    }
}

fn key_of(bytes: &[u8]) -> Result<String, RpcError> {
    check_key(bytes)
        .map(str::to_string)
        .map_err(|e| RpcError::InvalidArgument(format!("ledger key: {e}")))
}

/// The write `call` asks for at `now_ms` (the leader's clock), checked; `None` for a read.
pub fn command(call: &LedgerCall, now_ms: u64) -> Result<Option<LedgerCommand>, RpcError> {
    let key = key_of(call.key_bytes())?;
    let cmd = match call {
        LedgerCall::Create(q) => LedgerCommand::Create {
            key,
            hold_ms: q.hold_ms,
        },
        LedgerCall::Reserve(q) if !q.reference.is_empty() => LedgerCommand::Issue {
            key,
            reference: q.reference.clone(),
            now_ms,
        },
        LedgerCall::Reserve(q) => LedgerCommand::Reserve {
            key,
            holder: q.holder.clone(),
            request_id: q.request_id.clone(),
            now_ms,
        },
        LedgerCall::Confirm(q) => LedgerCommand::Confirm {
            key,
            number: q.number,
            reference: q.reference.clone(),
            now_ms,
        },
        LedgerCall::Release(q) => LedgerCommand::Release {
            key,
            number: q.number,
            note: q.note.clone(),
            now_ms,
        },
        LedgerCall::Void(q) => LedgerCommand::Void {
            key,
            number: q.number,
            who: q.who.clone(),
            note: q.note.clone(),
            now_ms,
        },
        LedgerCall::Reconcile(q) => LedgerCommand::Reconcile {
            key,
            next: q.next,
            who: q.who.clone(),
            now_ms,
        },
        LedgerCall::Show(_) | LedgerCall::Gaps(_) => return Ok(None),
    };
    cmd.validate().map_err(RpcError::InvalidArgument)?;
    Ok(Some(cmd))
}

/// The step of a write: refused at once when the set is not initialized, else the command.
pub fn write_command(set: &SetState, call: &LedgerCall, now_ms: u64) -> Result<Command, RpcError> {
    params_of(set)?;
    let cmd = command(call, now_ms)?.ok_or_else(|| RpcError::Internal("a ledger read is not a write".into()))?;
    Ok(Command::Ledger(cmd))
}

/// The reply to a write once its command applied with `result`.
pub fn committed(set: &SetState, call: &LedgerCall, result: CommandResult) -> Result<pb::LedgerReply, RpcError> {
    let result = match result {
        CommandResult::Ledger(r) => r,
        // An audited write (Void, Reconcile) answers its inner result.
        CommandResult::Invalid(m) => return Err(RpcError::InvalidArgument(m)),
        other => return Err(unexpected(other)),
    };
    let key = key_of(call.key_bytes())?;
    match result {
        LedgerResult::Done {
            summary,
            number,
            repeated,
        } => {
            let p = params_of(set)?;
            let entry = set
                .ledgers
                .by_key
                .get(&key)
                .filter(|_| number > 0)
                .map(|l| entry(number, &l.state_of(number)));
            Ok(pb::LedgerReply {
                not_leader: None,
                ledger: Some(info(&key, &summary, p.set_id)),
                entry,
                repeated,
            })
        }
        LedgerResult::Refused(r) => Err(refusal(&key, call, r)),
        LedgerResult::Count(_) => Err(RpcError::Internal("a ledger call answered with a count".into())),
    }
}

/// The leader's expiry tick at `now_ms`: a command voiding every held number past its deadline,
/// when there is one (`None` keeps an idle set's log quiet).
pub fn expire_tick(set: &SetState, now_ms: u64) -> Option<Command> {
    let due = set
        .ledgers
        .by_key
        .values()
        .filter(|l| set.ranges.is_owned(l.section))
        // The first hold ends first (`Ledger::check`): one look per ledger, every 100 ms.
        .any(|l| {
            l.held
                .values()
                .next()
                .is_some_and(|h| h.deadline_ms <= now_ms.max(l.clock_ms))
        });
    due.then_some(Command::Ledger(LedgerCommand::Expire { now_ms }))
}

/// The answer to a read, from the applied state.
pub fn read(set: &SetState, call: &LedgerCall) -> Result<ReadReply, RpcError> {
    let p = params_of(set)?;
    let key = key_of(call.key_bytes())?;
    let l = set
        .ledgers
        .by_key
        .get(&key)
        .ok_or_else(|| RpcError::NotFound(format!("no ledger {key:?} in set {}", p.set_id)))?;
    let ledger = Some(info(&key, &l.summary(), p.set_id));
    match call {
        LedgerCall::Show(q) => {
            if q.count > MAX_SHOW {
                return Err(RpcError::InvalidArgument(format!(
                    "a show returns at most {MAX_SHOW} numbers, asked for {}",
                    q.count
                )));
            }
            let from = q.from.max(1);
            let entries = (from..from.saturating_add(u64::from(q.count)))
                .take_while(|&n| n >= 1 && n <= l.high)
                .map(|n| entry(n, &l.state_of(n)))
                .collect();
            Ok(ReadReply::Show(pb::LedgerShowReply {
                not_leader: None,
                ledger,
                entries,
            }))
        }
        LedgerCall::Gaps(q) => {
            let limit = match q.limit {
                0 => 1_000,
                n if n > MAX_GAPS_PAGE => {
                    return Err(RpcError::InvalidArgument(format!(
                        "a gaps page holds at most {MAX_GAPS_PAGE} runs, asked for {n}"
                    )));
                }
                n => n,
            } as usize;
            let mut runs = gaps_after(l, q.after);
            let voided: Vec<pb::LedgerEntry> = runs.by_ref().take(limit).collect();
            Ok(ReadReply::Gaps(pb::LedgerGapsReply {
                not_leader: None,
                ledger,
                voided,
                more: runs.next().is_some(),
            }))
        }
        _ => Err(RpcError::Internal("a ledger write is not a read".into())),
    }
}

/// The reply of a read.
#[derive(Debug)]
pub enum ReadReply {
    Show(pb::LedgerShowReply),
    Gaps(pb::LedgerGapsReply),
}

/// The voided runs that end above `after`, in order, each as one entry (`number` its first).
fn gaps_after(l: &Ledger, after: u64) -> impl Iterator<Item = pb::LedgerEntry> + '_ {
    let start = l
        .voided
        .range(..=after)
        .next_back()
        .filter(|(_, v)| v.through > after)
        .map(|(&f, _)| f);
    let from = start.unwrap_or(after.saturating_add(1));
    l.voided
        .range(from..)
        .map(|(&first, v)| entry(first, &NumberState::Voided { first, void: v.clone() }))
}

fn info(key: &str, s: &Summary, set_id: u64) -> pb::LedgerInfo {
    pb::LedgerInfo {
        key: key.to_string(),
        hold_ms: s.hold_ms,
        high: s.high,
        settled: s.settled,
        held: s.held,
        confirmed: s.confirmed,
        voided: s.voided,
        restored: s.restored,
        set_id,
    }
}

fn reason(r: VoidReason) -> pb::VoidReason {
    match r {
        VoidReason::Released => pb::VoidReason::Released,
        VoidReason::Expired => pb::VoidReason::Expired,
        VoidReason::Operator => pb::VoidReason::Operator,
        VoidReason::LostWithRestore => pb::VoidReason::LostWithRestore,
    }
}

/// Number `n`'s record on the wire.
pub fn entry(n: u64, state: &NumberState) -> pb::LedgerEntry {
    let mut e = pb::LedgerEntry {
        number: n,
        ..Default::default()
    };
    match state {
        NumberState::Held(h) => {
            e.set_state(pb::LedgerState::Held);
            e.holder = h.holder.clone();
            e.deadline_ms = h.deadline_ms;
            e.at_ms = h.at_ms;
        }
        NumberState::Confirmed(r) => {
            e.set_state(pb::LedgerState::Confirmed);
            if let Some(r) = r {
                e.reference = r.reference.clone();
                e.at_ms = r.at_ms;
            }
        }
        NumberState::Voided { first, void } => {
            e.set_state(pb::LedgerState::Voided);
            e.number = *first.max(&n);
            e.through = void.through;
            e.set_reason(reason(void.reason));
            e.holder = void.who.clone();
            e.note = void.note.clone();
            e.at_ms = void.at_ms;
        }
        NumberState::NotIssued => e.set_state(pb::LedgerState::NotIssued),
    }
    e
}

fn reason_words(r: VoidReason) -> &'static str {
    match r {
        VoidReason::Released => "released by its holder",
        VoidReason::Expired => "expired unconfirmed",
        VoidReason::Operator => "voided by an operator",
        VoidReason::LostWithRestore => "lost with a restore",
    }
}

/// The status of a refusal, named for what the caller does next.
fn refusal(key: &str, call: &LedgerCall, r: Refusal) -> RpcError {
    let number = match call {
        LedgerCall::Confirm(q) => q.number,
        LedgerCall::Release(q) => q.number,
        LedgerCall::Void(q) => q.number,
        _ => 0,
    };
    match r {
        Refusal::Invalid(m) => RpcError::InvalidArgument(m),
        Refusal::NoLedger => RpcError::NotFound(format!(
            "no ledger {key:?}: create it first (seqctl ledger create {key})"
        )),
        Refusal::OtherHold { hold_ms } => {
            RpcError::AlreadyExists(format!("ledger {key:?} exists with a hold of {hold_ms} ms"))
        }
        Refusal::TooManyLedgers => {
            RpcError::ResourceExhausted(format!("this set keeps at most {} ledgers", ledger::MAX_LEDGERS))
        }
        Refusal::TooManyHeld => RpcError::ResourceExhausted(format!(
            "ledger {key:?} holds {} numbers already: confirm or release some first",
            ledger::MAX_HELD
        )),
        Refusal::TooManyVoided => RpcError::ResourceExhausted(format!(
            "this set keeps {} void records already: archive the gap reports and ask an operator",
            ledger::MAX_VOIDED_RECORDS
        )),
        Refusal::NotOwned => RpcError::Unavailable(format!(
            "ledger {key:?} {} (its section is moving or moved): retry",
            seqsvr_proto::refusal::LEDGER_NOT_SERVED
        )),
        Refusal::Restored => RpcError::FailedPrecondition(format!(
            "ledger {key:?} was restored from a backup: reserves wait for `seqctl ledger reconcile {key} --next N`"
        )),
        Refusal::NotIssued { high } => RpcError::NotFound(format!(
            "number {number} of ledger {key:?} was never handed out (the highest is {high})"
        )),
        Refusal::ConfirmedOther { reference: Some(first) } => RpcError::AlreadyExists(format!(
            "number {number} of ledger {key:?} is confirmed with reference {first:?}"
        )),
        Refusal::ConfirmedOther { reference: None } => RpcError::AlreadyExists(format!(
            "number {number} of ledger {key:?} is confirmed; its reference is no longer kept (only the last {} are)",
            ledger::KEEP_REFERENCES
        )),
        Refusal::Confirmed => RpcError::FailedPrecondition(format!(
            "number {number} of ledger {key:?} is confirmed: it cannot be voided"
        )),
        Refusal::Voided { first, void } => {
            let run = if void.through > first {
                format!(" (with {first}..={})", void.through)
            } else {
                String::new()
            };
            RpcError::FailedPrecondition(format!(
                "number {number} of ledger {key:?} is voided{run}: {} at {} ms; take a new number",
                reason_words(void.reason),
                void.at_ms
            ))
        }
        Refusal::ReconcileBelow { next } => RpcError::InvalidArgument(format!(
            "ledger {key:?} has handed out numbers below {next}: reconcile at {next} or above"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::testing::set_with;

    const KEY: &[u8] = b"invoices";

    fn write(set: &mut SetState, call: LedgerCall, now_ms: u64) -> Result<pb::LedgerReply, RpcError> {
        let cmd = write_command(set, &call, now_ms)?;
        let result = set.apply(&cmd, false);
        committed(set, &call, result)
    }

    fn reserve() -> LedgerCall {
        LedgerCall::Reserve(pb::LedgerReserveRequest {
            key: KEY.to_vec(),
            holder: "h".into(),
            request_id: String::new(),
            reference: String::new(),
        })
    }

    fn confirm(number: u64, reference: &str) -> LedgerCall {
        LedgerCall::Confirm(pb::LedgerConfirmRequest {
            key: KEY.to_vec(),
            number,
            reference: reference.into(),
        })
    }

    fn created() -> SetState {
        let (mut set, _) = set_with(&[]);
        let create = LedgerCall::Create(pb::CreateLedgerRequest {
            key: KEY.to_vec(),
            hold_ms: 1_000,
        });
        write(&mut set, create, 0).expect("create");
        set
    }

    #[test]
    fn each_refusal_becomes_the_status_that_says_what_to_do() {
        let mut set = created();
        let code = |r: Result<pb::LedgerReply, RpcError>| match r {
            Err(e) => tonic::Status::from(e).code(),
            Ok(_) => tonic::Code::Ok,
        };
        assert_eq!(code(write(&mut set, confirm(1, "x"), 10)), tonic::Code::NotFound);
        assert_eq!(code(write(&mut set, reserve(), 10)), tonic::Code::Ok);
        assert_eq!(code(write(&mut set, confirm(1, "x"), 20)), tonic::Code::Ok);
        assert_eq!(code(write(&mut set, confirm(1, "y"), 30)), tonic::Code::AlreadyExists);
        assert_eq!(code(write(&mut set, reserve(), 40)), tonic::Code::Ok);
        // Past its 1 s hold: voided as expired, and the confirm says so.
        let late = write(&mut set, confirm(2, "z"), 5_000);
        assert!(
            matches!(&late, Err(RpcError::FailedPrecondition(m)) if m.contains("expired")),
            "{late:?}"
        );
        let bad_key = LedgerCall::Reserve(pb::LedgerReserveRequest {
            key: vec![0xff],
            ..Default::default()
        });
        assert_eq!(code(write(&mut set, bad_key, 50)), tonic::Code::InvalidArgument);
        let other = LedgerCall::Reserve(pb::LedgerReserveRequest {
            key: b"nobody".to_vec(),
            ..Default::default()
        });
        assert_eq!(code(write(&mut set, other, 60)), tonic::Code::NotFound);
    }

    #[test]
    fn a_show_from_0_starts_at_1_and_gaps_come_a_page_at_a_time() {
        let mut set = created();
        for n in 1..=5 {
            write(&mut set, reserve(), n).expect("reserve");
        }
        for n in [1, 3, 5] {
            let release = LedgerCall::Release(pb::LedgerReleaseRequest {
                key: KEY.to_vec(),
                number: n,
                note: String::new(),
            });
            write(&mut set, release, 100).expect("release");
        }
        let show = LedgerCall::Show(pb::LedgerShowRequest {
            key: KEY.to_vec(),
            from: 0,
            count: 10,
        });
        let ReadReply::Show(shown) = read(&set, &show).expect("show") else {
            panic!("not a show")
        };
        assert_eq!(
            shown.entries.iter().map(|e| e.number).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5]
        );
        let gaps = |after, limit| {
            LedgerCall::Gaps(pb::LedgerGapsRequest {
                key: KEY.to_vec(),
                after,
                limit,
            })
        };
        let ReadReply::Gaps(page) = read(&set, &gaps(0, 2)).expect("gaps") else {
            panic!("not gaps")
        };
        assert_eq!(
            (page.voided.iter().map(|e| e.number).collect::<Vec<_>>(), page.more),
            (vec![1, 3], true)
        );
        let ReadReply::Gaps(rest) = read(&set, &gaps(3, 2)).expect("gaps") else {
            panic!("not gaps")
        };
        assert_eq!(
            (rest.voided.iter().map(|e| e.number).collect::<Vec<_>>(), rest.more),
            (vec![5], false)
        );
    }

    #[test]
    fn the_expiry_tick_writes_only_when_a_hold_is_due() {
        let mut set = created();
        assert!(expire_tick(&set, 10_000).is_none(), "nothing held");
        write(&mut set, reserve(), 1_000).expect("reserve");
        assert!(expire_tick(&set, 1_999).is_none());
        let tick = expire_tick(&set, 2_000).expect("due at its deadline");
        set.apply(&tick, false);
        assert!(expire_tick(&set, 3_000).is_none(), "voided: nothing more to do");
    }
}
