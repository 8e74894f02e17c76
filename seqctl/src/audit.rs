//! `seqctl audit`: the audit trail of a set's admin actions (membership changes, map changes,
//! move steps, drains, map publications), read from its leader.
//!
//! Without `--after`, the newest `--limit` records; with it, the oldest `--limit` records above
//! that number, so a script can follow the trail by passing the last number it saw. One line per
//! record, time in RFC 3339 UTC; `--json` prints the records with the trail's `dropped` and `last`.
//!
//! Left out: following the trail as it grows (`tail -f`); run it again with `--after`.

use clap::Args;
use seqsvr_control::AdminClient;
use seqsvr_proto::pb;
use serde_json::{Value, json};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use crate::{Failure, dialer, store_seeds, timeouts};

/// Most records one call asks for (one reply's worth, see `seqsvr_proto::limits::MAX_AUDIT_PAGE`).
const MAX_LIMIT: u32 = seqsvr_proto::limits::MAX_AUDIT_PAGE as u32;

#[derive(Args, Debug)]
pub struct AuditArgs {
    /// How many records to show (1..=1000).
    #[arg(long, default_value_t = 50)]
    limit: u32,
    /// Show the oldest records numbered above N instead of the newest.
    #[arg(long, value_name = "N")]
    after: Option<u64>,
}

pub async fn audit(cli: &crate::Cli, args: &AuditArgs) -> Result<String, Failure> {
    if !(1..=MAX_LIMIT).contains(&args.limit) {
        return Err(Failure::usage(format!("--limit must be in 1..={MAX_LIMIT}")));
    }
    let admin = AdminClient::with_dialer(store_seeds(cli)?, timeouts(cli), &dialer(cli)?).map_err(Failure::usage)?;
    let reply = admin
        .audit(args.after.unwrap_or(0), args.limit, args.after.is_none())
        .await?;
    Ok(if cli.json {
        to_json(&reply).to_string()
    } else {
        lines(&reply)
    })
}

/// `at_ms` as RFC 3339 UTC with milliseconds; the raw number when it is out of range.
pub(crate) fn rfc3339(at_ms: u64) -> String {
    i128::from(at_ms)
        .checked_mul(1_000_000)
        .and_then(|ns| OffsetDateTime::from_unix_timestamp_nanos(ns).ok())
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| format!("{at_ms} ms after the epoch"))
}

fn to_json(reply: &pb::GetAuditReply) -> Value {
    let records: Vec<Value> = reply
        .records
        .iter()
        .map(|r| {
            json!({
                "number": r.number, "at": rfc3339(r.at_ms), "at_ms": r.at_ms,
                "who": r.who, "what": r.what, "outcome": r.outcome,
            })
        })
        .collect();
    json!({"records": records, "dropped": reply.dropped, "last": reply.last})
}

fn lines(reply: &pb::GetAuditReply) -> String {
    let mut out: Vec<String> = reply
        .records
        .iter()
        .map(|r| {
            format!(
                "#{} {} {}: {} -> {}",
                r.number,
                rfc3339(r.at_ms),
                r.who,
                r.what,
                r.outcome
            )
        })
        .collect();
    if out.is_empty() {
        out.push(format!("no records (the newest is #{})", reply.last));
    }
    if reply.dropped > 0 {
        out.push(format!(
            "({} older records were dropped to keep the trail bounded)",
            reply.dropped
        ));
    }
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_utc_with_milliseconds() {
        let cases = [
            (0, "1970-01-01T00:00:00Z"),
            (1_700_000_000_123, "2023-11-14T22:13:20.123Z"),
            (u64::MAX, "18446744073709551615 ms after the epoch"),
        ];
        for (at_ms, want) in cases {
            assert_eq!(rfc3339(at_ms), want, "{at_ms}");
        }
    }
}
