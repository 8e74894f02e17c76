//! The arbiter loop, on the leader only: every tick it keeps the leadership bookkeeping of the
//! liveness view, writes the set's parameters once, and turns one arbiter decision (pure, in
//! `domain::arbiter`) into a Raft write.
//!
//! Deliberately left out: the decision itself; a failed write is simply retried at the next tick.

use std::sync::Arc;
use std::time::Instant;

use openraft::ServerState;

use crate::domain::state::Command;
use crate::domain::{arbiter, liveness};
use crate::shared::{ARBITER_TICK, Shared, WRITE_TIMEOUT};

/// Leadership bookkeeping plus one arbiter decision per tick, on the leader only.
pub async fn arbiter_loop(ctx: Arc<Shared>) {
    let mut tick = tokio::time::interval(ARBITER_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (is_leader, term) = {
            let metrics = ctx.raft.metrics();
            let m = metrics.borrow();
            (
                m.state == ServerState::Leader && m.current_leader == Some(ctx.node_id),
                m.current_term,
            )
        };
        let became_leader =
            ctx.liveness
                .lock()
                .expect("liveness lock poisoned")
                .observe_leadership(is_leader, term, Instant::now());
        if became_leader {
            tracing::info!(
                term,
                "became leader: liveness restarts now, nobody is declared dead for one detection interval"
            );
        }
        if !is_leader {
            continue;
        }
        let needs_init = ctx.state.read().expect("state lock poisoned").set.params.is_none();
        if needs_init {
            let params = ctx.config.set_params();
            match ctx.writer.write(Command::Init(params.clone()), WRITE_TIMEOUT).await {
                Ok(r) => tracing::info!(?params, ?r, "set initialized"),
                Err(e) => tracing::warn!(?e, "writing the set parameters failed; retrying"),
            }
            continue;
        }
        let (plan, warn) = {
            let st = ctx.state.read().expect("state lock poisoned");
            let live = ctx.liveness.lock().expect("liveness lock poisoned");
            let alive = liveness::alive(&st.set, &live, Instant::now(), ctx.detect());
            let p = arbiter::plan(&st.set, &alive);
            let warn = st.set.params.as_ref() != Some(&ctx.config.set_params());
            (p, warn)
        };
        if warn {
            tracing::debug!(
                "this replica's set flags differ from the parameters stored at bootstrap; the stored ones apply"
            );
        }
        let cmd = plan.command();
        if !plan.expire.is_empty() {
            tracing::info!(expire = ?plan.expire, "declaring AllocSvr incarnations dead");
        }
        if !plan.moves.is_empty() {
            tracing::info!(moves = ?plan.moves, "moving sections");
        }
        *ctx.plan.lock().expect("plan lock poisoned") = plan;
        if let Some(cmd) = cmd
            && let Err(e) = ctx.writer.write(cmd, WRITE_TIMEOUT).await
        {
            tracing::warn!(?e, "arbiter write failed; retrying next tick");
        }
    }
}
