//! The arbiter loop, on the leader only: every tick — and at once after a Release committed, so
//! that released sections get their next owner without waiting for the tick — it keeps the
//! leadership bookkeeping of the liveness view, writes the set's parameters once, and turns one
//! arbiter decision (pure, in `domain::arbiter`) into a Raft write, then the slot decision for
//! time-ordered ids (`protocol::ids::slots_tick`: the setup once, then grants), and the expiry of
//! ledger holds past their deadline (`protocol::ledger::expire_tick`).
//!
//! Deliberately left out: the decision itself (`protocol::arbiter_tick`, pure); a failed write is simply retried at the next tick.

use std::sync::Arc;

use openraft::ServerState;

use crate::domain::state::Command;
use crate::protocol::{self, Tick};
use crate::replica::{ARBITER_TICK, ReplicaState, WRITE_TIMEOUT};

/// Leadership bookkeeping plus one arbiter decision per tick, on the leader only.
pub async fn arbiter_loop(ctx: Arc<ReplicaState>) {
    let mut tick = tokio::time::interval(ARBITER_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = ctx.arbiter_wake.notified() => {}
        }
        let (is_leader, term) = {
            let metrics = ctx.raft.metrics();
            let m = metrics.borrow();
            (
                m.state == ServerState::Leader && m.current_leader == Some(ctx.node_id),
                m.current_term,
            )
        };
        let (became_leader, tick, slots) = {
            let st = ctx.state.read().expect("state lock poisoned");
            let mut view = ctx.view();
            let now = ReplicaState::lease_now();
            let (became_leader, tick) = protocol::arbiter_tick(
                &st.set,
                &mut view,
                (is_leader, term),
                now,
                ctx.detect(),
                &ctx.config.set_params(),
            );
            let slots = match tick {
                Tick::Plan(_) => protocol::ids::slots_tick(&st.set, &view, now, ctx.detect(), ctx.config.id_setup()),
                _ => None,
            };
            let expire = match tick {
                Tick::Plan(_) => ledger_expiry(&ctx, &st.set),
                _ => None,
            };
            let slots = slots.into_iter().chain(expire);
            (became_leader, tick, slots)
        };
        if became_leader {
            tracing::info!(
                term,
                "became leader: liveness restarts now, nobody is declared dead for one detection interval"
            );
        }
        let cmd = match tick {
            Tick::Follower => continue,
            Tick::Init(params) => {
                match ctx.writer.write(Command::Init(params.clone()), WRITE_TIMEOUT).await {
                    Ok(r) => tracing::info!(?params, ?r, "set initialized"),
                    Err(e) => tracing::warn!(?e, "writing the set parameters failed; retrying"),
                }
                continue;
            }
            Tick::Plan(cmd) => cmd,
        };
        for cmd in cmd.into_iter().chain(slots) {
            if let Err(e) = ctx.writer.write(cmd, WRITE_TIMEOUT).await {
                tracing::warn!(?e, "arbiter write failed; retrying next tick");
                break;
            }
        }
    }
}

/// The expiry of ledger holds past their deadline, by the leader's clock moved to the quorum's
/// (as slot marks are capped by it), when one is due.
fn ledger_expiry(ctx: &ReplicaState, set: &crate::domain::state::SetState) -> Option<Command> {
    let max_ahead_ms = set.ids.as_ref().map_or(ctx.config.id_max_ahead_ms, |i| i.max_ahead_ms);
    protocol::ledger::expire_tick(set, ctx.id_clock_ms(max_ahead_ms))
}
