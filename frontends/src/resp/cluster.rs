//! The Redis Cluster protocol on the Redis port: `CLUSTER SLOTS/SHARDS/NODES/INFO/KEYSLOT/MYID`,
//! `READONLY`/`READWRITE`/`ASKING`, the `COMMAND` table cluster clients read key positions from,
//! and `-MOVED` on a cluster-mode connection ([`RespConfig::cluster`](super::RespConfig)).
//!
//! The view comes from the backend ([`Calls::cluster_view`], [`Calls::slot_home`]): in an
//! AllocSvr, the route tables and cluster map its front ends route with. A cluster-mode
//! connection answers a counter key whose slot another node serves with
//! `-MOVED <slot> <host:port>`, so that a cluster client sends the key's calls to its owner from
//! then on; every other call (the owner or its cluster port not known yet, a `u:<uid>` name, a
//! cluster that does not place keys by slot) is served as on a plain connection, forwarded to the
//! owner. A plain connection never answers `-MOVED`: the `CLUSTER` commands answer the same on
//! both, and a client that is not cluster-aware only ever sees values.
//!
//! An `MGET` on a cluster-mode connection must name keys of one slot (`-CROSSSLOT` otherwise, as
//! Redis answers): cluster clients split a multi-key read by slot themselves.
//!
//! Deliberately left out: `-ASK` (a slot never migrates key by key: a move switches a whole
//! section at once, and during its frozen window a call waits and retries as on any connection),
//! replicas (`READONLY` is refused: every value comes from the slot's one owner), and the slot
//! administration commands (`ADDSLOTS`, `SETSLOT`, `MEET`, ...: `seqctl move` moves sections).

use seqsvr_proto::keys::hash_slot;

use super::{Reply, Session, arity};
use crate::calls::{Calls, ClusterNode, ClusterView, SlotHome, Who};

impl<C: Calls> Session<'_, C> {
    /// `CLUSTER ...`, `READONLY`, `READWRITE` and `ASKING` (`name` in upper case).
    pub(super) fn cluster_command(&self, name: &str, rest: &[&[u8]]) -> Reply {
        match (name, rest) {
            ("READONLY", []) => {
                Reply::err("READONLY: seqsvr has no replicas to read from; every value comes from its slot's one owner")
            }
            // The default mode of every connection, and the only one: nothing to change.
            ("READWRITE" | "ASKING", []) => Reply::ok(),
            ("READONLY" | "READWRITE" | "ASKING", _) => arity(name),
            _ => self.cluster(rest),
        }
    }

    fn cluster(&self, rest: &[&[u8]]) -> Reply {
        let sub = rest.first().map(|s| s.to_ascii_uppercase()).unwrap_or_default();
        let args = &rest[rest.len().min(1)..];
        let view = || self.calls.cluster_view().map_err(|e| Reply::of(&e));
        let answer = match (sub.as_slice(), args) {
            (b"KEYSLOT", [key]) => Ok(Reply::Int(i64::from(hash_slot(key)))),
            (b"SLOTS", []) => view().map(|v| slots(&v)),
            (b"SHARDS", []) => view().map(|v| shards(&v)),
            (b"NODES", []) => view().map(|v| Reply::Bulk(nodes(&v).into_bytes())),
            (b"INFO", []) => view().map(|v| Reply::Bulk(info(&v).into_bytes())),
            (b"MYID" | b"MYSHARDID", []) => view().map(|v| Reply::bulk(v.me.id)),
            _ => Ok(Reply::err(format!(
                "unknown subcommand or wrong number of arguments for '{}'. seqsvr serves CLUSTER SLOTS, \
                 SHARDS, NODES, INFO, KEYSLOT, MYID and MYSHARDID",
                String::from_utf8_lossy(&sub[..sub.len().min(32)])
            ))),
        };
        answer.unwrap_or_else(|refused| refused)
    }

    /// `-MOVED` for counter key `who` when this is a cluster-mode connection and another node
    /// serves its slot.
    pub(super) fn redirect(&self, who: Who<'_>) -> Option<Reply> {
        if !self.cfg.cluster {
            return None;
        }
        let Who::Key(key) = who else { return None };
        moved(self.calls, hash_slot(key.as_bytes()))
    }

    /// [`Self::redirect`] of a multi-key command's names: `-CROSSSLOT` when they are of two slots.
    pub(super) fn redirect_many(&self, names: &[&[u8]]) -> Option<Reply> {
        if !self.cfg.cluster {
            return None;
        }
        let slot = hash_slot(names.first()?);
        if names.iter().any(|n| hash_slot(n) != slot) {
            return Some(Reply::Error(
                "CROSSSLOT Keys in request don't hash to the same slot".into(),
            ));
        }
        let first = std::str::from_utf8(names[0]).ok()?;
        match crate::calls::who_of_name(first) {
            Ok(Who::Key(_)) => moved(self.calls, slot),
            _ => None,
        }
    }
}

fn moved<C: Calls>(calls: &C, slot: u16) -> Option<Reply> {
    match calls.slot_home(slot) {
        SlotHome::Elsewhere(addr) => Some(Reply::Error(format!("MOVED {slot} {addr}"))),
        SlotHome::Here | SlotHome::Forward => None,
    }
}

/// `host` and `port` of `host:port` (an IPv6 host without its brackets).
fn host_port(addr: &str) -> (&str, i64) {
    let (host, port) = addr.rsplit_once(':').unwrap_or((addr, "0"));
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (host, port.parse().unwrap_or(0))
}

fn slots(view: &ClusterView) -> Reply {
    let runs = view.ranges.iter().map(|(first, last, node)| {
        let (host, port) = host_port(&node.addr);
        Reply::Array(vec![
            Reply::Int(i64::from(*first)),
            Reply::Int(i64::from(*last)),
            Reply::Array(vec![Reply::bulk(host), Reply::Int(port), Reply::bulk(node.id.as_str())]),
        ])
    });
    Reply::Array(runs.collect())
}

/// The view's nodes, each with its runs of slots, in the order they first appear (the answering
/// node first).
fn by_node(view: &ClusterView) -> Vec<(&ClusterNode, Vec<(u16, u16)>)> {
    let mut out: Vec<(&ClusterNode, Vec<(u16, u16)>)> = vec![(&view.me, Vec::new())];
    for (first, last, node) in &view.ranges {
        match out.iter_mut().find(|(n, _)| n.id == node.id) {
            Some((_, runs)) => runs.push((*first, *last)),
            None => out.push((node, vec![(*first, *last)])),
        }
    }
    out
}

fn shards(view: &ClusterView) -> Reply {
    let s = |k: &'static str| Reply::bulk(k);
    let shards = by_node(view).into_iter().map(|(node, runs)| {
        let (host, port) = host_port(&node.addr);
        let slots = runs
            .iter()
            .flat_map(|(a, b)| [Reply::Int(i64::from(*a)), Reply::Int(i64::from(*b))])
            .collect();
        let node = Reply::Map(vec![
            (s("id"), Reply::bulk(node.id.as_str())),
            (s("port"), Reply::Int(port)),
            (s("ip"), Reply::bulk(host)),
            (s("endpoint"), Reply::bulk(host)),
            (s("role"), s("master")),
            (s("replication-offset"), Reply::Int(0)),
            (s("health"), s("online")),
        ]);
        Reply::Map(vec![
            (s("slots"), Reply::Array(slots)),
            (s("nodes"), Reply::Array(vec![node])),
        ])
    });
    Reply::Array(shards.collect())
}

/// `CLUSTER NODES`: one line per node, `id host:port@cport flags master ping pong epoch link
/// slots...`. There is no cluster bus: the bus port shown is 0.
fn nodes(view: &ClusterView) -> String {
    let mut out = String::new();
    for (node, runs) in by_node(view) {
        let flags = if node.id == view.me.id {
            "myself,master"
        } else {
            "master"
        };
        out.push_str(&format!(
            "{} {}@0 {flags} - 0 0 {} connected",
            node.id, node.addr, view.epoch
        ));
        for (a, b) in runs {
            match a == b {
                true => out.push_str(&format!(" {a}")),
                false => out.push_str(&format!(" {a}-{b}")),
            }
        }
        out.push('\n');
    }
    out
}

fn info(view: &ClusterView) -> String {
    let known = by_node(view).len();
    let served = by_node(view).iter().filter(|(_, runs)| !runs.is_empty()).count();
    format!(
        "cluster_enabled:1\r\ncluster_state:ok\r\ncluster_slots_assigned:16384\r\ncluster_slots_ok:16384\r\n\
         cluster_slots_pfail:0\r\ncluster_slots_fail:0\r\ncluster_known_nodes:{known}\r\ncluster_size:{served}\r\n\
         cluster_current_epoch:{e}\r\ncluster_my_epoch:{e}\r\n",
        e = view.epoch
    )
}

/// The commands served, as `COMMAND` lists them: name, arity, flags, first key, last key, step.
/// Cluster clients find a command's keys here (redis-py refuses a command it does not find).
type CommandInfo = (&'static str, i64, &'static [&'static str], i64, i64, i64);

const COMMANDS: &[CommandInfo] = &[
    ("incr", 2, &["write", "denyoom", "fast"], 1, 1, 1),
    ("incrby", 3, &["write", "denyoom", "fast"], 1, 1, 1),
    ("get", 2, &["readonly", "fast"], 1, 1, 1),
    ("mget", -2, &["readonly", "fast"], 1, -1, 1),
    ("nextid", -1, &["write", "fast"], 0, 0, 0),
    ("iddecode", 2, &["readonly", "fast"], 0, 0, 0),
    ("ping", -1, &["fast"], 0, 0, 0),
    ("echo", 2, &["fast"], 0, 0, 0),
    ("quit", -1, &["fast"], 0, 0, 0),
    ("auth", -2, &["noscript", "loading", "stale", "fast"], 0, 0, 0),
    ("hello", -1, &["noscript", "loading", "stale", "fast"], 0, 0, 0),
    ("select", 2, &["loading", "stale", "fast"], 0, 0, 0),
    ("client", -2, &["loading", "stale"], 0, 0, 0),
    ("info", -1, &["loading", "stale"], 0, 0, 0),
    ("command", -1, &["loading", "stale"], 0, 0, 0),
    ("config", -2, &["loading", "stale"], 0, 0, 0),
    ("cluster", -2, &["loading", "stale"], 0, 0, 0),
    ("readonly", 1, &["loading", "stale", "fast"], 0, 0, 0),
    ("readwrite", 1, &["loading", "stale", "fast"], 0, 0, 0),
    ("asking", 1, &["fast"], 0, 0, 0),
    ("multi", 1, &["loading", "stale", "fast"], 0, 0, 0),
    ("exec", 1, &["loading", "stale"], 0, 0, 0),
    ("discard", 1, &["loading", "stale", "fast"], 0, 0, 0),
    ("unwatch", 1, &["loading", "stale", "fast"], 0, 0, 0),
];

/// `COMMAND [COUNT | DOCS | ...]`.
pub(super) fn command(rest: &[&[u8]]) -> Reply {
    match rest.first().map(|s| s.to_ascii_uppercase()) {
        None => Reply::Array(
            COMMANDS
                .iter()
                .map(|(name, arity, flags, first, last, step)| {
                    Reply::Array(vec![
                        Reply::bulk(*name),
                        Reply::Int(*arity),
                        Reply::Array(flags.iter().map(|f| Reply::Simple(f)).collect()),
                        Reply::Int(*first),
                        Reply::Int(*last),
                        Reply::Int(*step),
                    ])
                })
                .collect(),
        ),
        Some(sub) if sub == b"COUNT" => Reply::Int(COMMANDS.len() as i64),
        // `redis-cli` asks for command docs: an empty answer says nothing wrong.
        Some(sub) if sub == b"DOCS" => Reply::Map(Vec::new()),
        Some(_) => Reply::Array(Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(n: u8) -> ClusterNode {
        ClusterNode {
            id: format!("{n:040x}"),
            addr: format!("127.0.0.1:{}", 7000 + u16::from(n)),
        }
    }

    fn view() -> ClusterView {
        ClusterView {
            me: node(1),
            ranges: vec![(0, 99, node(2)), (100, 16000, node(1)), (16001, 16383, node(2))],
            epoch: 3,
        }
    }

    #[test]
    fn nodes_lists_every_node_once_with_its_runs_of_slots() {
        let got = nodes(&view());
        let want = format!(
            "{} 127.0.0.1:7001@0 myself,master - 0 0 3 connected 100-16000\n\
             {} 127.0.0.1:7002@0 master - 0 0 3 connected 0-99 16001-16383\n",
            node(1).id,
            node(2).id
        );
        assert_eq!(got, want);
        assert!(info(&view()).contains("cluster_known_nodes:2\r\ncluster_size:2\r\n"));
    }

    #[test]
    fn slots_and_shards_name_each_run_host_and_port() {
        let Reply::Array(runs) = slots(&view()) else { panic!() };
        assert_eq!(runs.len(), 3);
        assert_eq!(
            runs[0],
            Reply::Array(vec![
                Reply::Int(0),
                Reply::Int(99),
                Reply::Array(vec![
                    Reply::bulk("127.0.0.1"),
                    Reply::Int(7002),
                    Reply::bulk(node(2).id)
                ]),
            ])
        );
        let Reply::Array(shards) = shards(&view()) else {
            panic!()
        };
        assert_eq!(shards.len(), 2);
        assert_eq!(host_port("[::1]:6379"), ("::1", 6379));
    }

    #[test]
    fn the_command_table_gives_every_key_position() {
        let Reply::Array(all) = command(&[]) else { panic!() };
        assert_eq!(command(&[b"count"]), Reply::Int(all.len() as i64));
        let incr = &all[0];
        assert_eq!(
            *incr,
            Reply::Array(vec![
                Reply::bulk("incr"),
                Reply::Int(2),
                Reply::Array(vec![
                    Reply::Simple("write"),
                    Reply::Simple("denyoom"),
                    Reply::Simple("fast")
                ]),
                Reply::Int(1),
                Reply::Int(1),
                Reply::Int(1),
            ])
        );
    }
}
