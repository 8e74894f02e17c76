//! A stopping leader hands its leadership to a caught-up follower (Raft's leadership transfer).
//!
//! Without it, when a leader stops, bumps wait until a follower's election timer fires and then
//! until the other follower's leader lease runs out: openraft refuses a vote while the voter
//! heard from a leader less than `election_timeout_max` ago. With the defaults that was up to
//! ~1 s of bumps waiting at every rolling restart. With it, on SIGTERM the leader:
//! 1. refuses new writes (callers are told to go to the successor, and retry);
//! 2. waits until a voter's log holds every entry the leader has;
//! 3. asks that voter to campaign at once (the peer RPC `Campaign`, which calls openraft's
//!    `trigger().elect()` — openraft 0.9 has no transfer call);
//! 4. grants the candidate its vote itself (a leader's own lease dates from its election, long
//!    past), which makes it a follower; in a group of three the candidate wins with those two
//!    votes within a round trip;
//! 5. stops once it has heard from the new leader, or when `--handoff-ms` ran out.
//!
//! A follower campaigns only when the asker is the leader it follows, in the term it follows it,
//! and its own log reaches the asker's last index: a late or stray request cannot start an
//! election the follower would lose (a lost election only costs time; safety is Raft's).
//! Rolling upgrades mix releases: a follower of a release without `Campaign` answers
//! UNIMPLEMENTED, and the leader tries another or stops as before.
//!
//! This module is the follower's side and the request; the leader's is `tasks::handoff`.
//!
//! Deliberately left out: groups of five or more, where the candidate needs a vote from a
//! follower whose lease still runs (the handoff then gains little and costs at most its budget);
//! a transfer an operator asks for without stopping the leader.

use std::time::Duration;

use openraft::ServerState;
use seqsvr_proto::pb::RaftPayload;
use seqsvr_proto::pb::raft_service_client::RaftServiceClient;
use serde::{Deserialize, Serialize};

use crate::raft::identity::Identity;
use crate::raft::types::{NodeId, Raft};

/// Longest one `Campaign` call may take.
pub const ASK_TIMEOUT: Duration = Duration::from_millis(500);

/// What a stopping leader sends the follower it picked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CampaignRequest {
    /// The asking leader.
    pub leader: NodeId,
    /// The term it leads.
    pub term: u64,
    /// Its last log index: the candidate must hold that much for the leader to vote for it.
    pub last_log_index: u64,
}

/// Whether a follower should campaign on `req`, from its own metrics; the error says why not.
pub fn should_campaign(
    me: NodeId,
    m: &openraft::RaftMetrics<NodeId, crate::raft::types::Node>,
    req: &CampaignRequest,
) -> Result<(), String> {
    if m.state == ServerState::Leader {
        return Err(format!("node {me} leads term {} itself", m.current_term));
    }
    if m.current_leader != Some(req.leader) || m.current_term != req.term {
        return Err(format!(
            "node {me} follows {:?} in term {}, not node {} in term {}",
            m.current_leader, m.current_term, req.leader, req.term
        ));
    }
    let mine = m.last_log_index.unwrap_or(0);
    if mine < req.last_log_index {
        return Err(format!(
            "node {me} holds the log to index {mine}, behind the leader's {}",
            req.last_log_index
        ));
    }
    if !m.membership_config.membership().voter_ids().any(|v| v == me) {
        return Err(format!("node {me} is not a voter"));
    }
    Ok(())
}

/// The follower's side: campaigns when [`should_campaign`] agrees.
pub async fn campaign(raft: &Raft, req: &CampaignRequest) -> Result<(), String> {
    let m = raft.metrics().borrow().clone();
    should_campaign(m.id, &m, req)?;
    tracing::info!(
        leader = req.leader,
        term = req.term,
        "the stopping leader asked this replica to campaign"
    );
    raft.trigger().elect().await.map_err(|e| e.to_string())
}

/// Sends one `Campaign` request.
pub async fn ask(
    addr: &str,
    tls: Option<&seqsvr_auth::Tls>,
    identity: &Identity,
    to: NodeId,
    req: &CampaignRequest,
) -> Result<(), String> {
    let endpoint = seqsvr_auth::endpoint(addr, tls).map_err(|e| format!("bad address {addr}: {e}"))?;
    let channel = endpoint.connect_timeout(ASK_TIMEOUT).tcp_nodelay(true).connect_lazy();
    let data = postcard::to_stdvec(req).map_err(|e| e.to_string())?;
    let payload = identity.stamp(
        RaftPayload {
            data,
            ..Default::default()
        },
        to,
    );
    let mut request = tonic::Request::new(payload);
    request.set_timeout(ASK_TIMEOUT);
    let reply = RaftServiceClient::new(channel)
        .campaign(request)
        .await
        .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?
        .into_inner();
    identity.check_reply(&reply, to)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use openraft::{BasicNode, Membership, RaftMetrics, StoredMembership};
    use std::collections::{BTreeMap, BTreeSet};

    pub(crate) fn metrics(me: NodeId, leader: NodeId, term: u64, last: u64) -> RaftMetrics<NodeId, BasicNode> {
        let mut m = RaftMetrics::new_initial(me);
        m.state = ServerState::Follower;
        m.current_leader = Some(leader);
        m.current_term = term;
        m.last_log_index = Some(last);
        let voters = BTreeSet::from([1, 2, 3]);
        let nodes: BTreeMap<NodeId, BasicNode> = voters.iter().map(|id| (*id, BasicNode::new("x"))).collect();
        let membership = Membership::new(vec![voters], nodes);
        m.membership_config = std::sync::Arc::new(StoredMembership::new(None, membership));
        m
    }

    fn req(leader: NodeId, term: u64, last: u64) -> CampaignRequest {
        CampaignRequest {
            leader,
            term,
            last_log_index: last,
        }
    }

    #[test]
    fn a_caught_up_follower_of_the_asker_campaigns() {
        assert_eq!(should_campaign(2, &metrics(2, 1, 5, 40), &req(1, 5, 40)), Ok(()));
    }

    #[test]
    fn a_follower_behind_the_asker_or_of_another_leader_or_term_refuses() {
        let behind = should_campaign(2, &metrics(2, 1, 5, 39), &req(1, 5, 40)).unwrap_err();
        assert!(behind.contains("behind the leader's 40"), "{behind}");
        let other = should_campaign(2, &metrics(2, 3, 5, 40), &req(1, 5, 40)).unwrap_err();
        assert!(other.contains("not node 1 in term 5"), "{other}");
        let late = should_campaign(2, &metrics(2, 1, 6, 40), &req(1, 5, 40)).unwrap_err();
        assert!(late.contains("in term 6"), "{late}");
        let mut leading = metrics(2, 2, 5, 40);
        leading.state = ServerState::Leader;
        assert!(should_campaign(2, &leading, &req(1, 5, 40)).is_err());
    }

    #[test]
    fn a_learner_refuses() {
        let learner = should_campaign(4, &metrics(4, 1, 5, 40), &req(1, 5, 40)).unwrap_err();
        assert!(learner.contains("not a voter"), "{learner}");
    }
}
