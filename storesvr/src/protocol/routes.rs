//! The route table a set hands out (in renewals and `GetRoutes`): runs of sections with the same
//! owner, built from the committed state, covering the whole uid space.
//!
//! Deliberately left out: caching the table between calls (a replica keeps the last one it built,
//! keyed by the route version: `ReplicaState::route_table`), and the other sets' tables (each set
//! hands out its own; the cluster map says which set serves what).

use seqsvr_proto::{SectionId, pb};

use crate::domain::ranges::RangeState;
use crate::domain::state::{SetParams, SetState};
use crate::error::RpcError;

/// The route table of the set (runs of sections with the same owner), or why there is none yet.
pub fn table(set: &SetState) -> Result<pb::RouteTable, RpcError> {
    let Some(p) = set.params.as_ref() else {
        return Err(RpcError::Unavailable("the set is not initialized yet".into()));
    };
    let total = SectionId(p.total_sections());
    let mut entries = Vec::new();
    let mut at = SectionId(0);
    for run in set.owner_runs() {
        not_owned(set, p, at, run.begin, &mut entries);
        let rec = set.allocsvrs.get(&run.owner);
        entries.push(pb::RouteEntry {
            set_id: p.set_id,
            section_begin: run.begin.0,
            section_end: run.end.0,
            node_id: rec.map_or(0, |r| r.node_id.0),
            incarnation: rec.map_or(0, |r| r.incarnation.0),
            addr: rec.map(|r| r.addr.clone()).unwrap_or_default(),
        });
        at = run.end;
    }
    not_owned(set, p, at, total, &mut entries);
    Ok(pb::RouteTable {
        version: set.route_version,
        section_size: p.section_size,
        uid_limit: p.uid_limit,
        entries,
        set_id: p.set_id,
    })
}

/// Route entries for sections `[begin, end)`, none of which the set owns. Clients accept only a
/// table that covers the whole uid space, so these are listed without an owner, under the set the
/// sections went to (or are known to be served by), `u64::MAX` when this set does not know.
fn not_owned(set: &SetState, p: &SetParams, begin: SectionId, end: SectionId, out: &mut Vec<pb::RouteEntry>) {
    let entry = |b: SectionId, e: SectionId, state: Option<RangeState>| {
        let set_id = match state {
            Some(RangeState::Migrating { to_set, .. } | RangeState::Tombstoned { to_set, .. }) => to_set,
            Some(RangeState::Importing { .. } | RangeState::Owned) => p.set_id,
            None => set.map.as_ref().and_then(|m| m.set_of(b)).unwrap_or(u64::MAX),
        };
        pb::RouteEntry {
            set_id,
            section_begin: b.0,
            section_end: e.0,
            ..Default::default()
        }
    };
    let mut at = begin;
    for run in set.ranges.runs_in(begin, end) {
        if at < run.begin {
            out.push(entry(at, run.begin, None));
        }
        out.push(entry(run.begin, run.end, Some(run.state)));
        at = run.end;
    }
    if at < end {
        out.push(entry(at, end, None));
    }
}
