//! `seqctl ledger …`: ledger counters through the client library (any AllocSvr, `--alloc`), as an
//! application and an operator use them: `create`, `reserve`, `confirm`, `issue` (a reserve
//! confirmed in the same write), `release`, `void`, `reconcile`, `show` and `gaps` — the
//! auditor's report of every voided number with its reason, who voided it, the note and the time
//! (RFC 3339), as text, CSV or JSON.
//!
//! A key is checked here first (exit 2 naming the rule) so that a typo costs no round trip. A
//! refusal keeps its meaning in the message and exits 1; an unknown outcome exits 3 (a reserve
//! whose reply was lost: its number, if one was taken, expires into the gap report).
//!
//! Left out: reading the gap report of many ledgers at once (a shell loop over keys is the
//! operator's batch).

use std::time::Duration;

use clap::{Subcommand, ValueEnum};
use seqsvr_proto::pb;
use serde_json::{Value, json};

use crate::audit::rfc3339;
use crate::data::alloc_client;
use crate::{Cli, Failure, table};

#[derive(Subcommand, Debug)]
pub(crate) enum LedgerCmd {
    /// Declare ledger KEY; a reserved number stays held for --hold (1s to 24h).
    Create {
        key: String,
        #[arg(long, default_value = "60s", value_parser = seqsvr_plumbing::cli::parse_duration)]
        hold: Duration,
    },
    /// Take the next number of KEY, held until confirmed, released or expired.
    Reserve {
        key: String,
        /// Who holds it (up to 64 bytes), shown by `show` and, if it expires, by `gaps`.
        #[arg(long, default_value = "")]
        holder: String,
    },
    /// Confirm held number N of KEY with REF (e.g. the invoice id); the same REF again answers
    /// the same.
    Confirm { key: String, n: u64, reference: String },
    /// Take the next number of KEY confirmed with REF in the same write (never held); the same
    /// REF again answers the same number.
    Issue { key: String, reference: String },
    /// Give held number N of KEY up: it is voided as released, with --note in the gap report.
    Release {
        key: String,
        n: u64,
        #[arg(long, default_value = "")]
        note: String,
    },
    /// Operator: void held number N of KEY, recorded with --why and --who (needs an admin
    /// certificate when TLS is on).
    Void {
        key: String,
        n: u64,
        #[arg(long)]
        why: String,
        /// Who voids it, as the gap report names them (default: $USER).
        #[arg(long)]
        who: Option<String>,
    },
    /// Operator, after a restore from a backup: reserves resume at --next; the numbers between
    /// the ledger's next and it are voided as lost with the restore.
    Reconcile {
        key: String,
        #[arg(long)]
        next: u64,
        #[arg(long)]
        who: Option<String>,
    },
    /// The ledger's summary; with N one number; with --from and --count (1 to 1,000) a range.
    Show {
        key: String,
        n: Option<u64>,
        #[arg(long, conflicts_with = "n", requires = "count")]
        from: Option<u64>,
        #[arg(long, requires = "from", value_parser = clap::value_parser!(u32).range(1..=1000))]
        count: Option<u32>,
    },
    /// Every voided number or run of KEY with its reason, who, note and time (the auditor's report).
    Gaps {
        key: String,
        #[arg(long, value_enum, default_value_t = GapsFormat::Text)]
        format: GapsFormat,
    },
}

/// How `gaps` prints the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum GapsFormat {
    Text,
    Csv,
    Json,
}

impl LedgerCmd {
    fn key(&self) -> &str {
        match self {
            LedgerCmd::Create { key, .. }
            | LedgerCmd::Reserve { key, .. }
            | LedgerCmd::Confirm { key, .. }
            | LedgerCmd::Issue { key, .. }
            | LedgerCmd::Release { key, .. }
            | LedgerCmd::Void { key, .. }
            | LedgerCmd::Reconcile { key, .. }
            | LedgerCmd::Show { key, .. }
            | LedgerCmd::Gaps { key, .. } => key,
        }
    }
}

/// Who an operator's call names: `--who`, else `$USER`, else `seqctl`.
fn operator(who: &Option<String>) -> String {
    who.clone()
        .or_else(|| std::env::var("USER").ok().filter(|u| !u.is_empty()))
        .unwrap_or_else(|| "seqctl".into())
}

pub(crate) async fn ledger(cli: &Cli, cmd: &LedgerCmd) -> Result<String, Failure> {
    let key = cmd.key();
    seqsvr_proto::keys::check_key_str(key).map_err(|e| Failure::usage(e.to_string()))?;
    let client = alloc_client(cli)?;
    match cmd {
        LedgerCmd::Create { hold, .. } => {
            let info = client.ledger_create(key, *hold).await?;
            Ok(summary(cli.json, &info))
        }
        LedgerCmd::Reserve { holder, .. } => {
            let r = client
                .ledger_reserve_with_id(key, holder, &seqsvr_client::new_request_id())
                .await?;
            Ok(one(cli.json, key, &r))
        }
        LedgerCmd::Confirm { n, reference, .. } => {
            Ok(one(cli.json, key, &client.ledger_confirm(key, *n, reference).await?))
        }
        LedgerCmd::Issue { reference, .. } => Ok(one(cli.json, key, &client.ledger_issue(key, reference).await?)),
        LedgerCmd::Release { n, note, .. } => Ok(one(cli.json, key, &client.ledger_release(key, *n, note).await?)),
        LedgerCmd::Void { n, why, who, .. } => {
            let r = client.ledger_void(key, *n, &operator(who), why).await?;
            Ok(one(cli.json, key, &r))
        }
        LedgerCmd::Reconcile { next, who, .. } => {
            let r = client.ledger_reconcile(key, *next, &operator(who)).await?;
            Ok(one(cli.json, key, &r))
        }
        LedgerCmd::Show { n, from, count, .. } => {
            let (from, count) = match (n, from, count) {
                (Some(n), _, _) => (*n, 1),
                (None, Some(f), Some(c)) => (*f, *c),
                _ => (0, 0),
            };
            let s = client.ledger_show(key, from, count).await?;
            let info = s.ledger.unwrap_or_default();
            if count == 0 {
                return Ok(summary(cli.json, &info));
            }
            let mut entries = s.entries;
            if let Some(n) = n
                && entries.is_empty()
            {
                entries.push(pb::LedgerEntry {
                    number: *n,
                    state: pb::LedgerState::NotIssued as i32,
                    ..Default::default()
                });
            }
            Ok(entries_out(cli.json, &info, &entries))
        }
        LedgerCmd::Gaps { format, .. } => {
            let g = client.ledger_gaps(key).await?;
            let format = if cli.json { GapsFormat::Json } else { *format };
            Ok(gaps_out(format, &g.ledger, &g.voided))
        }
    }
}

fn summary_json(l: &pb::LedgerInfo) -> Value {
    json!({
        "key": l.key, "hold_ms": l.hold_ms, "high": l.high, "settled": l.settled, "held": l.held,
        "confirmed": l.confirmed, "voided": l.voided, "restored": l.restored, "set": l.set_id,
    })
}

fn summary(as_json: bool, l: &pb::LedgerInfo) -> String {
    if as_json {
        return summary_json(l).to_string();
    }
    table(
        &[
            "KEY",
            "HOLD",
            "HIGH",
            "SETTLED",
            "HELD",
            "CONFIRMED",
            "VOIDED",
            "SET",
            "RESTORED",
        ],
        vec![vec![
            l.key.clone(),
            format!("{:?}", Duration::from_millis(l.hold_ms)),
            l.high.to_string(),
            l.settled.to_string(),
            l.held.to_string(),
            l.confirmed.to_string(),
            l.voided.to_string(),
            l.set_id.to_string(),
            if l.restored { "yes: reconcile first" } else { "no" }.into(),
        ]],
    )
}

fn state_name(s: pb::LedgerState) -> &'static str {
    match s {
        pb::LedgerState::Held => "held",
        pb::LedgerState::Confirmed => "confirmed",
        pb::LedgerState::Voided => "voided",
        pb::LedgerState::NotIssued => "not issued",
        pb::LedgerState::Unspecified => "unspecified",
    }
}

fn reason_name(r: pb::VoidReason) -> &'static str {
    match r {
        pb::VoidReason::Released => "released",
        pb::VoidReason::Expired => "expired",
        pb::VoidReason::Operator => "operator",
        pb::VoidReason::LostWithRestore => "lost with restore",
        pb::VoidReason::Unspecified => "unspecified",
    }
}

/// The last number of an entry's run (itself for a single number).
fn last_of(e: &pb::LedgerEntry) -> u64 {
    e.through.max(e.number)
}

fn entry_json(e: &pb::LedgerEntry) -> Value {
    let mut v = json!({"number": e.number, "state": state_name(e.state())});
    match e.state() {
        pb::LedgerState::Held => {
            v["holder"] = json!(e.holder);
            v["deadline"] = json!(rfc3339(e.deadline_ms));
            v["time"] = json!(rfc3339(e.at_ms));
        }
        pb::LedgerState::Confirmed => {
            v["reference"] = json!(e.reference);
            if e.at_ms > 0 {
                v["time"] = json!(rfc3339(e.at_ms));
            }
        }
        pb::LedgerState::Voided => {
            v["through"] = json!(last_of(e));
            v["reason"] = json!(reason_name(e.reason()));
            v["by"] = json!(e.holder);
            v["note"] = json!(e.note);
            v["time"] = json!(rfc3339(e.at_ms));
        }
        _ => {}
    }
    v
}

/// The row of one number: NUMBER STATE WHO DETAIL TIME.
fn entry_row(e: &pb::LedgerEntry) -> Vec<String> {
    let (who, detail, at) = match e.state() {
        pb::LedgerState::Held => (
            e.holder.clone(),
            format!("until {}", rfc3339(e.deadline_ms)),
            rfc3339(e.at_ms),
        ),
        pb::LedgerState::Confirmed => (
            String::new(),
            format!("reference {:?}", e.reference),
            if e.at_ms > 0 { rfc3339(e.at_ms) } else { String::new() },
        ),
        pb::LedgerState::Voided => {
            let run = if last_of(e) > e.number {
                format!(" (run {}..={})", e.number, last_of(e))
            } else {
                String::new()
            };
            (
                e.holder.clone(),
                format!("{}{run}: {}", reason_name(e.reason()), e.note),
                rfc3339(e.at_ms),
            )
        }
        _ => (String::new(), String::new(), String::new()),
    };
    vec![e.number.to_string(), state_name(e.state()).into(), who, detail, at]
}

/// The reply of a write: the number's record after it.
fn one(as_json: bool, key: &str, r: &pb::LedgerReply) -> String {
    let e = r.entry.clone().unwrap_or_default();
    if as_json {
        let mut v = json!({"key": key, "number": e.number, "entry": entry_json(&e), "repeated": r.repeated});
        if let Some(l) = &r.ledger {
            v["ledger"] = summary_json(l);
        }
        return v.to_string();
    }
    let mut row = entry_row(&e);
    row.insert(0, key.to_owned());
    row.push(if r.repeated { "yes" } else { "no" }.into());
    table(
        &["KEY", "NUMBER", "STATE", "WHO", "DETAIL", "TIME", "REPEATED"],
        vec![row],
    )
}

fn entries_out(as_json: bool, l: &pb::LedgerInfo, entries: &[pb::LedgerEntry]) -> String {
    if as_json {
        return json!({"ledger": summary_json(l), "entries": entries.iter().map(entry_json).collect::<Vec<_>>()})
            .to_string();
    }
    table(
        &["NUMBER", "STATE", "WHO", "DETAIL", "TIME"],
        entries.iter().map(entry_row).collect(),
    )
}

/// One CSV field (RFC 4180): quoted when it holds a comma, a quote or a line break.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// The gap report: one line (row, object) per voided run.
pub(crate) fn gaps_out(format: GapsFormat, l: &pb::LedgerInfo, voided: &[pb::LedgerEntry]) -> String {
    let cells = |e: &pb::LedgerEntry| {
        [
            e.number.to_string(),
            last_of(e).to_string(),
            (last_of(e) - e.number + 1).to_string(),
            reason_name(e.reason()).to_owned(),
            e.holder.clone(),
            e.note.clone(),
            rfc3339(e.at_ms),
        ]
    };
    match format {
        GapsFormat::Json => {
            let runs: Vec<Value> = voided
                .iter()
                .map(|e| {
                    json!({
                        "first": e.number, "last": last_of(e), "count": last_of(e) - e.number + 1,
                        "reason": reason_name(e.reason()), "by": e.holder, "note": e.note,
                        "time": rfc3339(e.at_ms), "at_ms": e.at_ms,
                    })
                })
                .collect();
            json!({"ledger": summary_json(l), "voided": runs}).to_string()
        }
        GapsFormat::Csv => {
            let mut out = vec!["first,last,count,reason,by,note,time".to_owned()];
            out.extend(
                voided
                    .iter()
                    .map(|e| cells(e).iter().map(|c| csv_field(c)).collect::<Vec<_>>().join(",")),
            );
            out.join("\n")
        }
        GapsFormat::Text => {
            let header = format!(
                "ledger {:?}: numbers 1..={}, {} voided in {} records",
                l.key,
                l.high,
                l.voided,
                voided.len()
            );
            if voided.is_empty() {
                return format!("{header}\nno gaps");
            }
            let rows = voided.iter().map(|e| cells(e).to_vec()).collect();
            format!(
                "{header}\n{}",
                table(&["FIRST", "LAST", "COUNT", "REASON", "BY", "NOTE", "TIME"], rows)
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(first: u64, through: u64, reason: pb::VoidReason, by: &str, note: &str) -> pb::LedgerEntry {
        let mut e = pb::LedgerEntry {
            number: first,
            through,
            holder: by.into(),
            note: note.into(),
            at_ms: 1_796_169_600_000,
            ..Default::default()
        };
        e.set_state(pb::LedgerState::Voided);
        e.set_reason(reason);
        e
    }

    fn report() -> (pb::LedgerInfo, Vec<pb::LedgerEntry>) {
        let l = pb::LedgerInfo {
            key: "inv".into(),
            high: 9,
            voided: 4,
            ..Default::default()
        };
        let v = vec![
            run(2, 2, pb::VoidReason::Released, "till-1", "customer left, \"twice\""),
            run(5, 7, pb::VoidReason::LostWithRestore, "alice", ""),
        ];
        (l, v)
    }

    #[test]
    fn gaps_csv_has_a_row_per_run_and_quotes_what_needs_quoting() {
        let (l, v) = report();
        let csv = gaps_out(GapsFormat::Csv, &l, &v);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], "first,last,count,reason,by,note,time");
        assert_eq!(
            lines[1],
            "2,2,1,released,till-1,\"customer left, \"\"twice\"\"\",2026-12-02T00:00:00Z"
        );
        assert_eq!(lines[2], "5,7,3,lost with restore,alice,,2026-12-02T00:00:00Z");
        assert_eq!(lines.len(), 3);
    }

    #[test]
    fn gaps_json_lists_every_run_with_numbers_as_numbers() {
        let (l, v) = report();
        let j: Value = serde_json::from_str(&gaps_out(GapsFormat::Json, &l, &v)).unwrap();
        let runs = j["voided"].as_array().unwrap();
        assert_eq!(runs.len(), 2);
        assert_eq!(
            (
                runs[1]["first"].as_u64(),
                runs[1]["last"].as_u64(),
                runs[1]["count"].as_u64()
            ),
            (Some(5), Some(7), Some(3))
        );
        assert_eq!(runs[0]["reason"], "released");
        assert_eq!(runs[0]["time"], "2026-12-02T00:00:00Z");
        assert_eq!(j["ledger"]["key"], "inv");
    }

    #[test]
    fn gaps_text_says_so_when_there_are_none() {
        let (l, _) = report();
        assert!(gaps_out(GapsFormat::Text, &l, &[]).ends_with("no gaps"));
        let (l, v) = report();
        let text = gaps_out(GapsFormat::Text, &l, &v);
        assert!(text.contains("lost with restore"), "{text}");
    }
}
