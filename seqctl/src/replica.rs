//! `seqctl replica add|remove`: a set's Raft membership.
//!
//! Left out: moving a replica's data (a new replica catches up from the leader).

use seqsvr_control::{AdminClient, Seed};
use seqsvr_proto::{NodeId, pb};
use serde_json::json;

use crate::{Cli, Failure, ReplicaCmd, dialer, store_seeds, timeouts};

pub(crate) async fn replica(cli: &Cli, action: &ReplicaCmd) -> Result<String, Failure> {
    let admin = AdminClient::with_dialer(store_seeds(cli)?, timeouts(cli), &dialer(cli)?).map_err(Failure::usage)?;
    let reply = match action {
        ReplicaCmd::Add { id, addr } => {
            Seed::parse(addr).map_err(Failure::usage)?;
            if *id == 0 {
                return Err(Failure::usage("node id must be > 0"));
            }
            admin.add_replica(NodeId(*id), addr).await.map_err(Failure::of_write)?
        }
        ReplicaCmd::Remove { id } => admin.remove_replica(NodeId(*id)).await.map_err(Failure::of_write)?,
    };
    Ok(render_membership(cli.json, &reply))
}

fn render_membership(as_json: bool, r: &pb::MembershipReply) -> String {
    if as_json {
        return json!({"voters": r.voters, "learners": r.learners, "log_index": r.log_index}).to_string();
    }
    let list = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    format!(
        "voters {} learners {} (log index {})",
        list(&r.voters),
        if r.learners.is_empty() {
            "-".into()
        } else {
            list(&r.learners)
        },
        r.log_index
    )
}
