//! `seqctl verify`: the promises checked against a live deployment. It drives a bounded load
//! through the front ends it is given (gRPC, HTTP/JSON, the Redis protocol) on uids and keys it
//! reserves, records every call (`history`), judges the history with the simulator's checkers
//! (`judge`), prints a verdict, and exits 0 (pass), 1 (a violation) or 2 (usage, or a front end
//! that answered nothing). docs/operations/verify.md is the operator's page.
//!
//! Files: `load` (the callers), `fronts` (the HTTP and RESP clients), `history` (the recorded
//! calls and the `--history` document), `judge` (the checks and `--self-test`'s plant).
//!
//! Deliberately left out: faults (verify watches what the operator's own kills, moves and
//! upgrades do; `sim run` injects faults), and reads (see `load`).

mod fronts;
mod history;
mod judge;
mod load;

use std::fmt::Write as _;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use seqsvr_proto::id_layout::{DEFAULT_EPOCH_MS, IdLayout, LayoutShape};

use crate::data::alloc_client_of;
use crate::{Cli, EXIT_FAILED, EXIT_USAGE, Failure};
use history::{Call, Front, History, Outcome};
use judge::Violation;

/// The longest run: its history, at most `3 × callers × rate` calls a second, is held in memory.
const MAX_DURATION: Duration = Duration::from_secs(3600);

/// How many of the highest uids are reserved by default.
const DEFAULT_RESERVED_UIDS: u64 = 64;

#[derive(Args, Debug)]
pub(crate) struct VerifyArgs {
    /// How long to drive the load (e.g. 60s, 5m).
    #[arg(long, default_value = "60s", value_parser = seqsvr_plumbing::cli::parse_duration)]
    duration: Duration,
    /// Callers per front end, each making one call at a time.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    callers: u32,
    /// Calls per second of one caller, at most.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=1000))]
    rate: u32,
    /// AllocSvr gRPC addresses, host:port, comma-separated (default: --alloc).
    #[arg(long, value_delimiter = ',')]
    grpc: Vec<String>,
    /// AllocSvr HTTP/JSON front-end addresses, host:port, comma-separated.
    #[arg(long, value_delimiter = ',')]
    http: Vec<String>,
    /// AllocSvr Redis-protocol front-end addresses, host:port, comma-separated.
    #[arg(long, value_delimiter = ',')]
    resp: Vec<String>,
    /// The uids verify takes seqs of, FIRST..END (END excluded). Their seqs rise for good: give
    /// a range production never uses. Default: the 64 highest uids of the cluster (learned over
    /// gRPC; without gRPC this flag is required).
    #[arg(long, value_name = "FIRST..END")]
    uids: Option<String>,
    /// The named counters verify takes values of are PREFIX0, PREFIX1, ... (`--keys` of them).
    #[arg(long, default_value = "seqctl-verify:")]
    key_prefix: String,
    /// How many named counters.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1000))]
    keys: u32,
    /// How far (ms) an id's stamp may be from this host's clock while its call ran: the
    /// StoreSvrs' --id-max-ahead-ms plus this host's own clock error.
    #[arg(long, default_value_t = 10_000)]
    id_allowance_ms: u64,
    /// Without gRPC: the cluster's id layout (twitter, sonyflake or SLOT_BITS/SEQ_BITS/TICK_MS).
    #[arg(long, default_value = "twitter")]
    id_layout: LayoutShape,
    /// Without gRPC: the id layout's epoch, Unix ms.
    #[arg(long, default_value_t = DEFAULT_EPOCH_MS)]
    id_epoch_ms: u64,
    /// Write every call (JSON, format seqctl-verify/1) to this file.
    #[arg(long, value_name = "FILE")]
    history: Option<PathBuf>,
    /// Check the checker: judge a copy of the history with one duplicate planted, and exit 1 when
    /// it is reported (as it must be; any other exit means the checker is broken).
    #[arg(long)]
    self_test: bool,
    /// Seed of the load's choices of calls.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Violations printed (all are counted).
    #[arg(long, default_value_t = 10)]
    show: usize,
}

/// `FIRST..END` as a range.
fn parse_uids(s: &str) -> Result<Range<u64>, String> {
    let (a, b) = s
        .split_once("..")
        .ok_or_else(|| format!("--uids {s:?}: expected FIRST..END"))?;
    let n = |v: &str| v.trim().parse::<u64>().map_err(|e| format!("--uids {s:?}: {v:?}: {e}"));
    let r = n(a)?..n(b)?;
    if r.is_empty() {
        return Err(format!("--uids {s:?}: the range is empty"));
    }
    Ok(r)
}

fn usage(message: String) -> Failure {
    Failure::usage(message)
}

/// Connects the gRPC client, learns the uid space and the id layout. `None` without gRPC.
async fn grpc_setup(
    cli: &Cli,
    args: &VerifyArgs,
) -> Result<Option<(seqsvr_client::Client, u64, Option<IdLayout>)>, Failure> {
    let seeds = if args.grpc.is_empty() { &cli.alloc } else { &args.grpc };
    if seeds.iter().all(|s| s.trim().is_empty()) {
        return Ok(None);
    }
    let client = alloc_client_of(cli, seeds)?;
    let routes = client.refresh_routes().await.map_err(|e| Failure {
        code: EXIT_USAGE,
        message: format!("cannot reach the AllocSvrs over gRPC ({}): {e}", seeds.join(",")),
    })?;
    let uid_limit = routes
        .uid_limit()
        .ok_or_else(|| usage("the cluster has no cluster map yet (is it set up?)".into()))?;
    // A cluster without ids set up yet leaves the flags' layout; its id calls then fail, counted.
    let layout = client.next_ids(1).await.ok().map(|ids| ids.layout);
    Ok(Some((client, uid_limit, layout)))
}

/// The plan the flags describe, and the id layout to judge by.
async fn plan(cli: &Cli, args: &VerifyArgs) -> Result<(load::Plan, IdLayout), Failure> {
    if args.duration > MAX_DURATION {
        return Err(usage(format!(
            "--duration {:?} is over {MAX_DURATION:?}: the history is kept in memory (about 235 bytes of JSON a call)",
            args.duration
        )));
    }
    let grpc = grpc_setup(cli, args).await?;
    let clean = |v: &[String]| -> Vec<String> {
        v.iter()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect()
    };
    let (http, resp) = (clean(&args.http), clean(&args.resp));
    if grpc.is_none() && http.is_empty() && resp.is_empty() {
        return Err(usage(
            "nothing to verify: pass --grpc (or --alloc), --http and/or --resp addresses".into(),
        ));
    }
    let uids = match (&args.uids, &grpc) {
        (Some(s), _) => parse_uids(s).map_err(usage)?,
        (None, Some((_, limit, _))) => limit.saturating_sub(DEFAULT_RESERVED_UIDS)..*limit,
        (None, None) => {
            return Err(usage(
                "without gRPC, --uids FIRST..END is required (the reserved uids)".into(),
            ));
        }
    };
    if let Some((_, limit, _)) = &grpc
        && uids.end > *limit
    {
        return Err(usage(format!(
            "--uids {uids:?} reaches past the cluster's uid limit {limit}"
        )));
    }
    let keys: Vec<String> = (0..args.keys).map(|i| format!("{}{i}", args.key_prefix)).collect();
    for k in &keys {
        seqsvr_proto::keys::check_key_str(k).map_err(|e| usage(format!("--key-prefix: {k:?}: {e}")))?;
    }
    let layout = grpc
        .as_ref()
        .and_then(|g| g.2)
        .unwrap_or_else(|| args.id_layout.with_epoch(args.id_epoch_ms));
    let grpc = grpc.map(|(c, ..)| {
        let seeds = if args.grpc.is_empty() { &cli.alloc } else { &args.grpc };
        (c, seeds.join(","))
    });
    let plan = load::Plan {
        duration: args.duration,
        callers: args.callers,
        rate: args.rate,
        uids,
        keys,
        grpc,
        http,
        resp,
        deadline: Duration::from_millis(cli.timeout_ms),
    };
    Ok((plan, layout))
}

pub(crate) async fn verify(cli: &Cli, args: &VerifyArgs) -> Result<String, Failure> {
    let (plan, layout) = plan(cli, args).await?;
    let fronts = fronts_of(&plan);
    let started_unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let clock = tokio::time::Instant::now();
    let calls = load::drive(Arc::new(plan), clock, args.seed).await;
    let h = History {
        format: history::FORMAT.into(),
        started_unix_ms,
        id_allowance_ms: args.id_allowance_ms,
        id_layout: layout,
        calls,
    };
    if let Some(path) = &args.history {
        h.write(path).map_err(|message| Failure {
            code: EXIT_USAGE,
            message,
        })?;
    }
    let found = judge::judge(&h);
    let mut out = summary(&h, &fronts);
    render_violations(&mut out, &found, args.show);
    let silent: Vec<&str> = fronts
        .iter()
        .filter(|(f, _)| !h.calls.iter().any(|c| c.front == *f && c.outcome == Outcome::Ok))
        .map(|(_, name)| *name)
        .collect();
    if args.self_test {
        return self_test(&h, out, &found);
    }
    verdict(out, &found, &silent)
}

fn fronts_of(plan: &load::Plan) -> Vec<(Front, &'static str)> {
    let mut v = Vec::new();
    if plan.grpc.is_some() {
        v.push((Front::Grpc, "grpc"));
    }
    if !plan.http.is_empty() {
        v.push((Front::Http, "http"));
    }
    if !plan.resp.is_empty() {
        v.push((Front::Resp, "resp"));
    }
    v
}

/// Calls per front end and outcome, values and ids judged.
fn summary(h: &History, fronts: &[(Front, &'static str)]) -> String {
    let mut out = String::new();
    for (front, name) in fronts {
        let of = |o: Outcome| h.calls.iter().filter(|c| c.front == *front && c.outcome == o).count();
        let _ = writeln!(
            out,
            "{name:<5} calls ok {:>7}  failed {:>5}  unknown {:>5}",
            of(Outcome::Ok),
            of(Outcome::Failed),
            of(Outcome::Unknown)
        );
    }
    let is_ids = |c: &Call| c.op == history::Op::NextIds;
    let ok: Vec<&Call> = h.calls.iter().filter(|c| c.outcome == Outcome::Ok).collect();
    let values: usize = ok.iter().filter(|c| !is_ids(c)).map(|c| c.values.len()).sum();
    let ids: usize = ok.iter().filter(|c| is_ids(c)).map(|c| c.values.len()).sum();
    let _ = writeln!(out, "values checked {values}, ids checked {ids}");
    let first = h.calls.iter().find(|c| c.error.is_some());
    if let Some(c) = first {
        let _ = writeln!(
            out,
            "first error: call {}: {}",
            c.id,
            c.error.as_deref().unwrap_or_default()
        );
    }
    out
}

fn render_violations(out: &mut String, found: &[Violation], show: usize) {
    for v in found.iter().take(show) {
        let _ = writeln!(out, "VIOLATION {}: {}", v.promise, v.what);
    }
    if found.len() > show {
        let _ = writeln!(out, "... and {} more", found.len() - show);
    }
}

/// PASS (exit 0), FAIL (exit 1, the report on stdout), or no verdict (exit 2) when a front end
/// never answered.
fn verdict(mut out: String, found: &[Violation], silent: &[&str]) -> Result<String, Failure> {
    if !found.is_empty() {
        let _ = write!(out, "verify: FAIL: {} violations", found.len());
        println!("{out}");
        return Err(Failure {
            code: EXIT_FAILED,
            message: format!("{} violations of the promises", found.len()),
        });
    }
    if !silent.is_empty() {
        print!("{out}");
        return Err(usage(format!(
            "no call through {} succeeded: nothing to judge there (wrong address, or the cluster is down)",
            silent.join(", ")
        )));
    }
    let _ = write!(out, "verify: PASS");
    Ok(out)
}

/// `--self-test`: the real history's violations first (a real one is still a real one), then the
/// planted duplicate, which must be reported: exit 1 when it is.
fn self_test(h: &History, mut out: String, found: &[Violation]) -> Result<String, Failure> {
    if !found.is_empty() {
        return verdict(out, found, &[]);
    }
    let (copy, planted) = judge::plant_duplicate(h)
        .ok_or_else(|| usage("self-test: no call succeeded, so there is nothing to copy a duplicate from".into()))?;
    let caught: Vec<Violation> = judge::judge(&copy)
        .into_iter()
        .filter(|v| v.calls.contains(&planted.call))
        .collect();
    let _ = writeln!(out, "self-test: planted {}", planted.what);
    if caught.is_empty() {
        println!("{out}self-test: NOT REPORTED: the checker missed a planted duplicate");
        return Err(Failure {
            code: EXIT_USAGE,
            message: "the checker is broken: it did not report the planted duplicate".into(),
        });
    }
    render_violations(&mut out, &caught, caught.len());
    let _ = write!(
        out,
        "self-test: the planted duplicate was reported ({} violations)",
        caught.len()
    );
    println!("{out}");
    Err(Failure {
        code: EXIT_FAILED,
        message: "self-test tripped, as it must".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uid_ranges_parse_or_are_refused() {
        assert_eq!(parse_uids("10..20"), Ok(10..20));
        for bad in ["10", "20..10", "5..5", "a..3", "1..99999999999999999999"] {
            assert!(parse_uids(bad).is_err(), "{bad}");
        }
    }
}
