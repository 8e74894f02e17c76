//! The leader's side of a handoff on SIGTERM (`raft::handoff` says why and how): stop taking
//! writes, wait for a voter that holds the whole log, ask it to campaign, and wait to hear from it.
//!
//! Deliberately left out: choosing among caught-up voters by anything but their order (any
//! caught-up voter of a group of three wins the same way).

use std::time::{Duration, Instant};

use openraft::ServerState;

use crate::raft::handoff::{CampaignRequest, ask};
use crate::raft::types::NodeId;
use crate::replica::ReplicaState;

/// How often the stopping leader looks at replication while it waits.
const POLL: Duration = Duration::from_millis(5);

type Metrics = openraft::RaftMetrics<NodeId, crate::raft::types::Node>;

/// How a stop went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handoff {
    /// This replica was not the leader: nothing to hand over.
    NotLeader,
    /// `to` leads now; `took` from the start of the handoff until this replica heard from it.
    Handed { to: NodeId, took: Duration },
    /// No follower took over within the budget, or every one was asked and none did; `why` says
    /// what was tried.
    TimedOut { why: String },
}

impl std::fmt::Display for Handoff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Handoff::NotLeader => write!(f, "not the leader, nothing to hand over"),
            Handoff::Handed { to, took } => write!(f, "handed leadership to node {to} in {} ms", took.as_millis()),
            Handoff::TimedOut { why } => write!(f, "no follower took over: {why}"),
        }
    }
}

/// The leader's side, run on SIGTERM before Raft stops: hands leadership over within `budget`.
pub async fn step_aside(ctx: &ReplicaState, tls: Option<&seqsvr_auth::Tls>, budget: Duration) -> Handoff {
    let start = Instant::now();
    let m = ctx.raft.metrics().borrow().clone();
    if m.state != ServerState::Leader || m.current_leader != Some(ctx.node_id) {
        return Handoff::NotLeader;
    }
    ctx.refuse_writes(None);
    // After a follower agreed, its election runs: asking another meanwhile would start a second
    // candidate that splits the votes. Another is asked only if this one has not won in the
    // longest election timeout.
    let patience = Duration::from_millis(ctx.config.election_max_ms);
    let term = m.current_term;
    let (mut tried, mut asked, mut why) = (
        Vec::<NodeId>::new(),
        None::<Instant>,
        String::from("no voter caught up"),
    );
    while start.elapsed() < budget {
        let m = ctx.raft.metrics().borrow().clone();
        if let Some(to) = m.current_leader.filter(|l| *l != ctx.node_id) {
            return Handoff::Handed {
                to,
                took: start.elapsed(),
            };
        }
        let waiting = asked.is_some_and(|t| t.elapsed() < patience);
        // Only once every write taken is committed and applied: the log has stopped growing,
        // so a follower that holds it now still holds all of it when it asks for votes.
        if !waiting
            && m.state == ServerState::Leader
            && ctx.writer.idle()
            && let Some(to) = caught_up(&m, ctx.node_id, &tried)
        {
            tried.push(to);
            match ask_to_campaign(ctx, tls, &m, to, term).await {
                Ok(()) => {
                    tracing::info!(
                        to,
                        after_ms = start.elapsed().as_millis() as u64,
                        "a caught-up follower campaigns"
                    );
                    asked = Some(Instant::now());
                    why = format!("node {to} campaigned but did not win");
                }
                Err(e) => {
                    tracing::info!(to, error = %e, "a follower did not campaign; trying another");
                    why = format!("node {to}: {e}");
                }
            }
        }
        // Every other voter was asked and none is still running an election: stop now rather
        // than refuse writes for the rest of the budget (followers of a release without
        // `Campaign`, say).
        let others = m
            .membership_config
            .membership()
            .voter_ids()
            .filter(|v| *v != ctx.node_id)
            .count();
        if tried.len() >= others && asked.is_none_or(|t| t.elapsed() >= patience) {
            return Handoff::TimedOut { why };
        }
        tokio::time::sleep(POLL).await;
    }
    Handoff::TimedOut { why }
}

/// Sends callers to `to` from now on and asks it to campaign.
async fn ask_to_campaign(
    ctx: &ReplicaState,
    tls: Option<&seqsvr_auth::Tls>,
    m: &Metrics,
    to: NodeId,
    term: u64,
) -> Result<(), String> {
    ctx.refuse_writes(Some(to));
    let req = CampaignRequest {
        leader: ctx.node_id,
        term,
        last_log_index: m.last_log_index.unwrap_or(0),
    };
    ask(&peer_addr(ctx, m, to), tls, &ctx.identity, to, &req).await
}

/// A voter other than `me` and those `tried` whose log holds everything the leader has.
fn caught_up(m: &Metrics, me: NodeId, tried: &[NodeId]) -> Option<NodeId> {
    let last = m.last_log_index?;
    if m.last_applied.is_none_or(|a| a.index < last) {
        return None;
    }
    let replication = m.replication.as_ref()?;
    m.membership_config
        .membership()
        .voter_ids()
        .filter(|v| *v != me && !tried.contains(v))
        .find(|v| replication.get(v).is_some_and(|l| l.is_some_and(|l| l.index >= last)))
}

/// Where to reach `to`: its `--dial` override, else its address in the membership.
fn peer_addr(ctx: &ReplicaState, m: &Metrics, to: NodeId) -> String {
    ctx.config.dial_map().get(&to).cloned().unwrap_or_else(|| {
        m.membership_config
            .membership()
            .get_node(&to)
            .map(|n| n.addr.clone())
            .unwrap_or_default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::handoff::tests::metrics;
    use std::collections::BTreeMap;

    #[test]
    fn the_successor_is_a_voter_holding_the_whole_log() {
        let mut m = metrics(1, 1, 5, 40);
        m.state = ServerState::Leader;
        let at = |i| Some(openraft::LogId::new(openraft::CommittedLeaderId::new(5, 1), i));
        m.replication = Some(BTreeMap::from([(2, at(40)), (3, at(40))]));
        m.last_applied = at(39);
        assert_eq!(
            caught_up(&m, 1, &[]),
            None,
            "an entry not yet applied: the log may still grow"
        );
        m.last_applied = at(40);
        m.replication = Some(BTreeMap::from([(2, at(39)), (3, at(40))]));
        assert_eq!(caught_up(&m, 1, &[]), Some(3));
        assert_eq!(caught_up(&m, 1, &[3]), None, "node 2 is behind");
        m.replication = Some(BTreeMap::from([(2, at(40)), (3, at(40))]));
        assert_eq!(caught_up(&m, 1, &[2]), Some(3));
    }
}
