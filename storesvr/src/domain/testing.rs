//! Fixtures shared by the domain's unit tests: a small initialized set with registered AllocSvrs.
//!
//! Left out: anything a production path could call (this module is compiled for tests only).

use super::state::{Command, CommandResult, SetParams, SetState};
use seqsvr_proto::{Incarnation, NodeId};

/// Ten sections of ten uids, step 5.
pub(crate) fn small_params() -> SetParams {
    SetParams {
        set_id: 0,
        section_size: 10,
        uid_limit: 100,
        step: 5,
        lease_ms: 3000,
        renew_interval_ms: 500,
        drift_ppm: 10_000,
        margin_ms: 100,
        section_begin: 0,
        section_end: 10,
    }
}

/// Registers `node_id` (nonce 0: every registration is a new process); its incarnation.
pub(crate) fn register(st: &mut SetState, node_id: u64) -> Incarnation {
    register_with(st, node_id, 0)
}

/// Registers `node_id` with `nonce` (a retry carries the nonce of its first attempt).
pub(crate) fn register_with(st: &mut SetState, node_id: u64, nonce: u64) -> Incarnation {
    match st.apply(
        &Command::Register {
            node_id: NodeId(node_id),
            addr: format!("n{node_id}"),
            nonce,
        },
        false,
    ) {
        CommandResult::Registered { incarnation } => incarnation,
        other => panic!("register: {other:?}"),
    }
}

/// An initialized [`small_params`] set with `nodes` registered, in order; their incarnations.
pub(crate) fn set_with(nodes: &[u64]) -> (SetState, Vec<Incarnation>) {
    let mut st = SetState::default();
    st.apply(&Command::Init(small_params()), false);
    let incs = nodes.iter().map(|n| register(&mut st, *n)).collect();
    (st, incs)
}
