//! The audit trail at the service edge: stamping admin writes with who asked and when, recording
//! membership changes, and `GetAudit`.
//!
//! Who is the caller the server's role check recorded on the request (`seqsvr_auth::Caller`: the
//! certificate subject, or `anonymous` without TLS); when is this leader's wall clock, read here
//! once and carried in the command, so that applying it reads no clock (see `domain::audit`).
//!
//! Left out: a wall clock that could not be read (before 1970) is recorded as 0 rather than
//! refusing the action; the trail orders records by their numbers, not their times.

use std::time::{SystemTime, UNIX_EPOCH};

use seqsvr_auth::Caller;
use seqsvr_proto::limits::MAX_AUDIT_PAGE;
use seqsvr_proto::pb;

use crate::domain::audit::{AuditNote, AuditRecord, AuditTrail};
use crate::domain::command;
use crate::domain::state::Command;
use crate::error::RpcError;
use crate::replica::{Led, ReplicaState};

/// This replica's wall clock, milliseconds since the Unix epoch.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `cmd` as an admin action of `who`, stamped now: applied and recorded in one Raft entry.
pub(crate) fn stamped(who: &Caller, cmd: Command) -> Command {
    command::wrap(&who.subject, now_ms(), cmd)
}

/// A record alone (a membership change, which is not a command), stamped now.
pub(crate) fn record(who: &Caller, what: &str, outcome: &str) -> Command {
    let note = AuditNote {
        who: who.subject.to_string(),
        at_ms: now_ms(),
        what: what.to_owned(),
    };
    Command::Audit(AuditRecord::new(&note, outcome))
}

/// The reply to a GetAudit, read from `trail`; a `limit` above [`MAX_AUDIT_PAGE`] is refused.
pub fn audit_reply(trail: &AuditTrail, req: &pb::GetAuditRequest) -> Result<pb::GetAuditReply, RpcError> {
    let limit = match req.limit as usize {
        0 => MAX_AUDIT_PAGE,
        n if n > MAX_AUDIT_PAGE => {
            return Err(RpcError::InvalidArgument(format!(
                "limit {n} is above the {MAX_AUDIT_PAGE} records one reply may hold; page with `after`"
            )));
        }
        n => n,
    };
    let records = trail
        .page(req.after, limit, req.newest)
        .into_iter()
        .map(|(number, r)| pb::AuditRecord {
            number,
            at_ms: r.at_ms,
            who: r.who.clone(),
            what: r.what.clone(),
            outcome: r.outcome.clone(),
        })
        .collect();
    Ok(pb::GetAuditReply {
        not_leader: None,
        records,
        dropped: trail.dropped(),
        last: trail.last(),
    })
}

/// GetAudit on the leader, after a read index (the trail as of every committed action).
pub async fn get_audit(ctx: &ReplicaState, req: pb::GetAuditRequest) -> Result<pb::GetAuditReply, RpcError> {
    if let Led::Elsewhere(hint) = ctx.linearizable().await? {
        return Ok(pb::GetAuditReply {
            not_leader: Some(hint),
            ..Default::default()
        });
    }
    ctx.data(|d| audit_reply(&d.set.audit, &req))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_of_zero_is_a_full_page_and_above_a_page_is_refused() {
        let mut trail = AuditTrail::default();
        for n in 0..(MAX_AUDIT_PAGE as u64 + 3) {
            let note = AuditNote {
                who: "anonymous".into(),
                at_ms: n,
                what: "x".into(),
            };
            trail.push(AuditRecord::new(&note, "done"));
        }
        let ask = |limit: u32, newest| pb::GetAuditRequest {
            after: 0,
            limit,
            newest,
        };
        let full = audit_reply(&trail, &ask(0, false)).unwrap();
        assert_eq!(full.records.len(), MAX_AUDIT_PAGE);
        assert_eq!(
            (full.records[0].number, full.last, full.dropped),
            (1, MAX_AUDIT_PAGE as u64 + 3, 0)
        );
        let tail = audit_reply(&trail, &ask(2, true)).unwrap();
        let numbers: Vec<u64> = tail.records.iter().map(|r| r.number).collect();
        assert_eq!(numbers, [MAX_AUDIT_PAGE as u64 + 2, MAX_AUDIT_PAGE as u64 + 3]);
        let err = audit_reply(&trail, &ask(MAX_AUDIT_PAGE as u32 + 1, false)).unwrap_err();
        assert!(matches!(err, RpcError::InvalidArgument(m) if m.contains("page with")));
    }
}
