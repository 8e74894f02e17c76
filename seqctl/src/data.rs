//! `seqctl fetch`, `get`, `batch`, `reserve` (through the client library, as an application would) and
//! `routes` (a set's route table).
//!
//! Left out: anything that changes the cluster.

use std::time::Duration;

use seqsvr_client::{Block, Client, ClientConfig, CurSeq, Fetched, Owner};
use seqsvr_proto::{Uid, pb};
use serde_json::{Value, json};

use crate::{Cli, EXIT_FAILED, Failure, store_client, store_seeds, table, tls};

/// `fetch` (one uid) or `batch` (several): the next seq of each, in order.
pub(crate) async fn fetch(cli: &Cli, uids: &[Uid], batch: bool) -> Result<String, Failure> {
    let client = alloc_client(cli)?;
    let got = if batch {
        client.batch_fetch(uids).await?
    } else {
        vec![client.fetch_next_seq(uids[0]).await?]
    };
    Ok(render_fetched(cli.json, &got))
}

/// `reserve UID COUNT`: a block of seqs, `[first, first + count)`.
pub(crate) async fn reserve(cli: &Cli, uid: Uid, count: u32) -> Result<String, Failure> {
    let b = alloc_client(cli)?.reserve(uid, count).await?;
    Ok(render_block(cli.json, &b))
}

pub(crate) async fn get(cli: &Cli, uid: Uid) -> Result<String, Failure> {
    let c = alloc_client(cli)?.get_cur_seq(uid).await?;
    Ok(render_cur(cli.json, &c))
}

pub(crate) async fn routes(cli: &Cli) -> Result<String, Failure> {
    let reply = store_client(cli, &store_seeds(cli)?)?.get_routes().await?;
    let table = reply.routes.ok_or_else(|| Failure {
        code: EXIT_FAILED,
        message: "the store has no route table yet".into(),
    })?;
    Ok(render_routes(cli.json, &table))
}

pub(crate) fn alloc_client(cli: &Cli) -> Result<Client, Failure> {
    alloc_client_of(cli, &cli.alloc)
}

/// A client of the AllocSvrs at `seeds` (host:port), with this invocation's deadlines and
/// certificate.
pub(crate) fn alloc_client_of(cli: &Cli, seeds: &[String]) -> Result<Client, Failure> {
    let seeds: Vec<String> = seeds
        .iter()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect();
    if seeds.is_empty() {
        return Err(Failure::usage(
            "no AllocSvr address: pass --alloc ADDR[,ADDR..] or set SEQCTL_ALLOC",
        ));
    }
    let cfg = ClientConfig {
        deadline: Duration::from_millis(cli.timeout_ms),
        attempt_timeout: Duration::from_millis(cli.attempt_timeout_ms),
        connect_timeout: Duration::from_millis(cli.attempt_timeout_ms.div_ceil(2)),
        tls: tls(cli)?,
        ..ClientConfig::new(seeds)
    };
    Ok(Client::new(cfg)?)
}

pub(crate) fn owner_json(o: &Option<Owner>) -> Value {
    match o {
        Some(o) => json!({
            "section": o.section.0, "node_id": o.node_id.0, "incarnation": o.incarnation.0, "epoch": o.epoch.0,
        }),
        None => Value::Null,
    }
}

pub(crate) fn owner_cells(o: &Option<Owner>) -> [String; 4] {
    match o {
        Some(o) => [o.section.0, o.node_id.0, o.incarnation.0, o.epoch.0].map(|v| v.to_string()),
        None => ["-", "-", "-", "-"].map(String::from),
    }
}

fn render_fetched(as_json: bool, got: &[Fetched]) -> String {
    if as_json {
        let rows: Vec<Value> = got
            .iter()
            .map(|f| json!({"uid": f.uid.0, "seq": f.seq, "owner": owner_json(&f.owner)}))
            .collect();
        return if rows.len() == 1 {
            rows[0].to_string()
        } else {
            Value::Array(rows).to_string()
        };
    }
    let rows = got
        .iter()
        .map(|f| {
            let [s, n, i, e] = owner_cells(&f.owner);
            vec![f.uid.0.to_string(), f.seq.to_string(), s, n, i, e]
        })
        .collect();
    table(&["UID", "SEQ", "SECTION", "NODE", "INCARNATION", "EPOCH"], rows)
}

fn render_block(as_json: bool, b: &Block) -> String {
    let last = b.seqs().end - 1;
    if as_json {
        return json!({
            "uid": b.uid.0, "first": b.first, "last": last, "count": b.count, "owner": owner_json(&b.owner),
        })
        .to_string();
    }
    let [s, n, i, e] = owner_cells(&b.owner);
    table(
        &[
            "UID",
            "FIRST",
            "LAST",
            "COUNT",
            "SECTION",
            "NODE",
            "INCARNATION",
            "EPOCH",
        ],
        vec![vec![
            b.uid.0.to_string(),
            b.first.to_string(),
            last.to_string(),
            b.count.to_string(),
            s,
            n,
            i,
            e,
        ]],
    )
}

fn render_cur(as_json: bool, c: &CurSeq) -> String {
    if as_json {
        return json!({"uid": c.uid.0, "cur_seq": c.cur_seq, "owner": owner_json(&c.owner)}).to_string();
    }
    let [s, n, i, e] = owner_cells(&c.owner);
    table(
        &["UID", "CUR_SEQ", "SECTION", "NODE", "INCARNATION", "EPOCH"],
        vec![vec![c.uid.0.to_string(), c.cur_seq.to_string(), s, n, i, e]],
    )
}

fn render_routes(as_json: bool, t: &pb::RouteTable) -> String {
    if as_json {
        let entries: Vec<Value> = t
            .entries
            .iter()
            .map(|e| {
                json!({
                    "set_id": e.set_id, "section_begin": e.section_begin, "section_end": e.section_end,
                    "node_id": e.node_id, "incarnation": e.incarnation, "addr": e.addr,
                })
            })
            .collect();
        return json!({
            "version": t.version, "section_size": t.section_size, "uid_limit": t.uid_limit, "entries": entries,
        })
        .to_string();
    }
    let rows = t
        .entries
        .iter()
        .map(|e| {
            let uid_end = e.section_end.saturating_mul(t.section_size).min(t.uid_limit);
            vec![
                e.set_id.to_string(),
                format!("[{}, {})", e.section_begin, e.section_end),
                format!("[{}, {})", e.section_begin.saturating_mul(t.section_size), uid_end),
                e.node_id.to_string(),
                e.incarnation.to_string(),
                if e.addr.is_empty() {
                    "(unowned)".into()
                } else {
                    e.addr.clone()
                },
            ]
        })
        .collect();
    format!(
        "route version {}, section_size {}, uid_limit {}\n{}",
        t.version,
        t.section_size,
        t.uid_limit,
        table(&["SET", "SECTIONS", "UIDS", "NODE", "INCARNATION", "ADDR"], rows)
    )
}
