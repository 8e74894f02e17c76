//! The shortened trace of a failing seed: around its first violation, the calls on the violating
//! uid, the ownership changes of its section (from the applied log) and the faults, in time order.

use std::fmt::Write as _;

use super::Outcome;
use crate::history::{Call, Outcome as CallOutcome};

/// Most lines printed (the ones nearest the violation).
const MAX_LINES: usize = 60;

/// Before the first evidence and after the last, in ns.
const BEFORE_NS: u64 = 3_000_000_000;
const AFTER_NS: u64 = 500_000_000;

/// The trace of `o`'s first violation, or nothing when it passed or kept no history.
pub fn render(o: &Outcome) -> String {
    let (Some(h), Some(v)) = (&o.history, o.report.violations.first()) else {
        return String::new();
    };
    let index = h.call_index();
    let evidence: Vec<&Call> = v.calls.iter().filter_map(|id| index.get(id).copied()).collect();
    let Some(uid) = evidence.iter().flat_map(|c| c.uids.first()).next().copied() else {
        return format!("(violation {:?} names no call)\n", v.promise);
    };
    let section = uid / h.info.section_size.max(1);
    let from = evidence
        .iter()
        .map(|c| c.invoke_ns)
        .min()
        .unwrap_or(0)
        .saturating_sub(BEFORE_NS);
    let to = evidence.iter().map(|c| c.complete_ns).max().unwrap_or(0) + AFTER_NS;
    let mut lines: Vec<(u64, String)> = Vec::new();
    for c in h
        .calls
        .iter()
        .filter(|c| c.uids.contains(&uid) && c.complete_ns >= from && c.invoke_ns <= to)
    {
        lines.push((c.invoke_ns, call_line(c, uid, section, v.calls.contains(&c.id))));
    }
    for ch in o
        .changes
        .iter()
        .filter(|c| c.section == section && (from..=to).contains(&c.at_ns))
    {
        let line = format!(
            "section {section}: owner incarnation {} epoch {} max_seq {} ({})",
            ch.owner, ch.epoch, ch.max_seq, ch.cause
        );
        lines.push((ch.at_ns, line));
    }
    for f in h.faults.iter().filter(|f| f.end_ns >= from && f.start_ns <= to) {
        lines.push((
            f.start_ns,
            format!("fault {} on {} until {}", f.kind, f.target, ms(f.end_ns)),
        ));
    }
    lines.sort();
    let skip = lines.len().saturating_sub(MAX_LINES);
    let mut out = format!(
        "trace of uid {uid} (section {section}) around the first violation ({} earlier lines left out):\n",
        skip
    );
    for (at, line) in lines.into_iter().skip(skip) {
        let _ = writeln!(out, "  {:>10}  {line}", ms(at));
    }
    out
}

fn ms(ns: u64) -> String {
    format!("{:.3}ms", ns as f64 / 1e6)
}

fn call_line(c: &Call, uid: u64, section: u64, evidence: bool) -> String {
    let value = c
        .uids
        .iter()
        .position(|&u| u == uid)
        .and_then(|i| c.values.get(i))
        .map_or(String::new(), |v| format!(" = {v}"));
    let owner = c
        .owners
        .iter()
        .find(|o| o.section == section)
        .or(c.owners.first())
        .map_or(String::new(), |o| {
            format!(" from incarnation {} epoch {}", o.incarnation, o.epoch)
        });
    let outcome = match c.outcome {
        CallOutcome::Ok => "ok",
        CallOutcome::Failed => "failed",
        CallOutcome::Unknown => "unknown",
    };
    format!(
        "{}call {} client {} {:?} {outcome}{value}{owner} (until {})",
        if evidence { "* " } else { "" },
        c.id,
        c.client,
        c.kind,
        ms(c.complete_ns)
    )
}
