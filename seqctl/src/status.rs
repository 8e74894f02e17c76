//! `seqctl status`: a set's state from its leader, and each replica's own view beside it.
//!
//! Left out: other sets (`seqctl sets` asks each set's leader).

use std::time::Duration;

use seqsvr_control::{Seed, StoreClient, StoreTimeouts};
use seqsvr_proto::{NodeId, pb};
use serde_json::{Value, json};

use crate::{Cli, Failure, dialer, store_client, store_seeds, table};

/// The set's status from the leader (when it can be reached), plus each member's own view.
pub(crate) async fn status(cli: &Cli) -> Result<String, Failure> {
    let seeds = store_seeds(cli)?;
    let mut view = store_client(cli, &seeds)?.status().await?;
    if view.leader_id != 0 && view.leader_id != view.node_id && !view.leader_addr.is_empty() {
        // Liveness of AllocSvrs is known only on the leader: prefer its view.
        let addr = configured_addr(&seeds, view.leader_id, &view.leader_addr);
        if let Ok(leader_view) = single_status(cli, &addr).await {
            view = leader_view;
        }
    }
    let mut members = Vec::new();
    for m in &view.members {
        let addr = configured_addr(&seeds, m.node_id, &m.addr);
        let own = if m.node_id == view.node_id {
            Ok(view.clone())
        } else {
            single_status(cli, &addr).await
        };
        members.push((m.clone(), addr, own));
    }
    Ok(render_status(cli.json, &view, &members))
}

/// The address the operator gave for `node_id`, else the one the cluster reports.
pub(crate) fn configured_addr(seeds: &[Seed], node_id: u64, reported: &str) -> String {
    seeds
        .iter()
        .find(|s| s.node_id == Some(NodeId(node_id)))
        .map_or_else(|| reported.to_owned(), |s| s.addr.clone())
}

/// One replica's own status (no hint following: Status is answered by any replica).
pub(crate) async fn single_status(cli: &Cli, addr: &str) -> Result<pb::StatusReply, String> {
    let seed = Seed::parse(addr)?;
    let short = StoreTimeouts {
        attempt: Duration::from_millis(cli.attempt_timeout_ms),
        overall: Duration::from_millis(cli.attempt_timeout_ms),
    };
    let dialer = dialer(cli).map_err(|f| f.message)?;
    let client = StoreClient::with_dialer(vec![seed], short, &dialer)?;
    client.status().await.map_err(|e| e.to_string())
}

type MemberView = (pb::ReplicaInfo, String, Result<pb::StatusReply, String>);

fn render_status(as_json: bool, v: &pb::StatusReply, members: &[MemberView]) -> String {
    if as_json {
        status_json(v, members).to_string()
    } else {
        status_tables(v, members)
    }
}

fn member_json((m, addr, own): &MemberView) -> Value {
    let mut o = json!({"node_id": m.node_id, "addr": addr, "voter": m.voter});
    match own {
        Ok(s) => {
            o["view"] = json!({
                "leader_id": s.leader_id, "term": s.term, "committed_index": s.committed_index,
                "applied_index": s.applied_index, "last_log_index": s.last_log_index,
                "route_version": s.route_version, "version": store_version(s),
            })
        }
        Err(e) => o["error"] = json!(e),
    }
    o
}

fn status_json(v: &pb::StatusReply, members: &[MemberView]) -> Value {
    let params = v.params.unwrap_or_default();
    let members: Vec<Value> = members.iter().map(member_json).collect();
    let allocsvrs: Vec<Value> = v
        .allocsvrs
        .iter()
        .map(|a| {
            json!({
                "node_id": a.node_id, "incarnation": a.incarnation, "addr": a.addr, "alive": a.alive,
                "last_renew_ms_ago": a.last_renew_ms_ago, "sections_owned": a.sections_owned,
                "version": alloc_version(a),
            })
        })
        .collect();
    json!({
        "answered_by": v.node_id, "set_id": v.set_id, "leader_id": v.leader_id, "leader_addr": v.leader_addr,
        "term": v.term, "committed_index": v.committed_index, "applied_index": v.applied_index,
        "last_log_index": v.last_log_index, "route_version": v.route_version, "version": store_version(v),
        "sections_total": v.sections_total, "sections_owned": v.sections_owned,
        "max_seq_high": v.max_seq_high, "max_seq_sum": v.max_seq_sum,
        "params": {
            "section_size": params.section_size, "uid_limit": params.uid_limit, "step": params.step,
            "lease_ms": params.lease_ms, "renew_interval_ms": params.renew_interval_ms,
        },
        "members": members, "allocsvrs": allocsvrs,
        "ids": v.ids.as_ref().map(|i| {
            let layout = i.layout.unwrap_or_default();
            json!({
                "tick_ms": layout.tick_ms, "epoch_ms": layout.epoch_ms, "slot_bits": layout.slot_bits,
                "seq_bits": layout.seq_bits, "slots_per_set": i.slots_per_set, "max_ahead_ms": i.max_ahead_ms,
                "first_slot": v.first_slot, "slots_held": v.slots_held,
            })
        }),
    })
}

/// The time-ordered id line of the status: the layout and this set's share of slots.
fn ids_line(v: &pb::StatusReply) -> String {
    let Some(setup) = &v.ids else {
        return "time-ordered ids: not set up (set 0 sets them up; other sets adopt its setup from the map)".into();
    };
    let layout = setup
        .layout
        .as_ref()
        .and_then(|l| seqsvr_proto::id_layout::IdLayout::from_pb(l).ok());
    let layout = layout.map_or("a layout that does not decode".into(), |l| l.to_string());
    format!(
        "time-ordered ids: layout {layout}; slots {}..{} of this set, {} held; marks at most {} ms ahead",
        v.first_slot,
        v.first_slot + setup.slots_per_set,
        v.slots_held,
        setup.max_ahead_ms
    )
}

fn member_row((m, addr, own): &MemberView) -> Vec<String> {
    let mut row = vec![m.node_id.to_string(), addr.clone(), yes_no(m.voter).into()];
    match own {
        Ok(s) => row.extend([
            if s.leader_id == m.node_id { "leader" } else { "follower" }.into(),
            s.term.to_string(),
            s.committed_index.to_string(),
            s.applied_index.to_string(),
            s.last_log_index.to_string(),
            store_version(s).into(),
        ]),
        Err(e) => {
            row.push(format!("unreachable: {e}"));
            row.extend(std::iter::repeat_n("-".to_string(), 5));
        }
    }
    row
}

fn status_tables(v: &pb::StatusReply, members: &[MemberView]) -> String {
    let params = v.params.unwrap_or_default();
    let member_rows = members.iter().map(member_row).collect();
    let alloc_rows = v
        .allocsvrs
        .iter()
        .map(|a| {
            vec![
                a.node_id.to_string(),
                a.incarnation.to_string(),
                a.addr.clone(),
                yes_no(a.alive).into(),
                a.last_renew_ms_ago.to_string(),
                a.sections_owned.to_string(),
                alloc_version(a).into(),
            ]
        })
        .collect();
    let leader_addr = if v.leader_addr.is_empty() {
        "unknown"
    } else {
        &v.leader_addr
    };
    let members_header = [
        "STORESVR",
        "ADDR",
        "VOTER",
        "ROLE",
        "TERM",
        "COMMITTED",
        "APPLIED",
        "LAST_LOG",
        "VERSION",
    ];
    let allocs_header = [
        "ALLOCSVR",
        "INCARNATION",
        "ADDR",
        "ALIVE",
        "LAST_RENEW_MS",
        "SECTIONS",
        "VERSION",
    ];
    format!(
        "set {}: leader {} ({leader_addr}), term {}, committed {}, applied {}, route version {} (answered by node {})\n\
         sections {} owned of {}; max_seq high {}, sum {}; step {}, lease {} ms\n{}\n\n{}\n\n{}",
        v.set_id,
        v.leader_id,
        v.term,
        v.committed_index,
        v.applied_index,
        v.route_version,
        v.node_id,
        v.sections_owned,
        v.sections_total,
        v.max_seq_high,
        v.max_seq_sum,
        params.step,
        params.lease_ms,
        ids_line(v),
        table(&members_header, member_rows),
        table(&allocs_header, alloc_rows),
    )
}

/// A StoreSvr's release and commit as it reports them; a StoreSvr older than 0.2.0 does not, so
/// a half-done upgrade shows as a mix of versions and `< 0.2.0`.
pub(crate) fn store_version(s: &pb::StatusReply) -> &str {
    if s.version.is_empty() { OLDER } else { &s.version }
}

/// An AllocSvr's release as its last renewal with the leader said: unknown on a follower, before
/// the first renewal, and from AllocSvrs older than 0.2.0 (which do not say).
pub(crate) fn alloc_version(a: &pb::AllocSvrInfo) -> &str {
    if a.version.is_empty() {
        UNKNOWN_ALLOC
    } else {
        &a.version
    }
}

/// What a StoreSvr that sends no version runs.
const OLDER: &str = "< 0.2.0";
/// What an AllocSvr whose version the leader does not know runs.
const UNKNOWN_ALLOC: &str = "? (< 0.2.0 or not renewed)";

pub(crate) fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}
