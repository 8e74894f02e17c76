//! The slot protocol of time-ordered ids with the production parts and nothing else: a set's
//! state machine (`storesvr::domain`) and two AllocSvr issuers (`allocsvr::ids::issuer`), driven by
//! hand through a handover in which the old holder, paused while the slot was granted again,
//! wakes up and asks for a raise. With the epoch fence the raise is refused and no id repeats;
//! with `--unsafe-skip-epoch-fence` (the negative control) it is applied, the old holder issues
//! beside the new one, and ids repeat — which the check here catches.
//!
//! Left out: timing, the network and the arbiter's choice (the grants are written by hand); the
//! real processes are `sim/e2e/tests/ids.rs`.

use std::collections::HashSet;

use allocsvr::ids::issuer::{SlotIssuer, UnsafeIssuing};
use seqsvr_proto::id_layout::IdLayout;
use seqsvr_proto::params::SetParams;
use seqsvr_proto::{Epoch, Incarnation, NodeId};
use storesvr::domain::slots::{RaiseItem, RaiseOutcome, SlotCommand, SlotMove, SlotResult};
use storesvr::domain::state::{Command, CommandResult, SetState, UnsafeRules};

const SLOT: u64 = 0;
/// The leader's clock, ms since the layout's epoch (the layout's epoch is 0 here).
const LEADER_MS: u64 = 1_000_000;

fn register(st: &mut SetState, rules: UnsafeRules, node: u64) -> Incarnation {
    let cmd = Command::Register {
        node_id: NodeId(node),
        addr: format!("127.0.0.1:{node}"),
        nonce: node,
    };
    match st.apply_with(&cmd, rules) {
        CommandResult::Registered { incarnation } => incarnation,
        other => panic!("{other:?}"),
    }
}

/// Raises `SLOT` to `mark` for `holder` under `epoch`; the mark acknowledged, if any.
fn raise(st: &mut SetState, rules: UnsafeRules, holder: Incarnation, epoch: Epoch, mark: u64) -> Option<(u64, Epoch)> {
    let cmd = Command::Slots(SlotCommand::Raise {
        holder,
        items: vec![RaiseItem {
            slot: SLOT,
            epoch,
            mark,
        }],
        leader_ms: LEADER_MS,
    });
    match st.apply_with(&cmd, rules) {
        CommandResult::Slots(SlotResult::Raised(r)) => match r[0].outcome {
            RaiseOutcome::Applied | RaiseOutcome::NoOp => Some((r[0].mark, r[0].epoch)),
            _ => None,
        },
        other => panic!("{other:?}"),
    }
}

fn grant(st: &mut SetState, rules: UnsafeRules, from: Incarnation, to: Incarnation) -> (Epoch, u64) {
    let cmd = Command::Slots(SlotCommand::Grant(vec![SlotMove { slot: SLOT, from, to }]));
    st.apply_with(&cmd, rules);
    let s = st.ids.as_ref().unwrap().get(SLOT).copied().unwrap();
    assert_eq!(s.holder, to);
    (s.epoch, s.mark)
}

/// The ids both holders issued, and how many repeated.
fn handover(rules: UnsafeRules) -> (usize, usize) {
    let layout = IdLayout::twitter(0);
    let mut st = SetState::default();
    st.apply_with(&Command::Init(SetParams::single_set(0)), rules);
    let setup = SlotCommand::Setup {
        layout,
        per_set: 4,
        max_ahead_ms: 10_000,
    };
    st.apply_with(&Command::Slots(setup), rules);
    let (old, new) = (register(&mut st, rules, 1), register(&mut st, rules, 2));
    let nobody = Incarnation(0);
    let (old_epoch, floor) = grant(&mut st, rules, nobody, old);
    let mut old_issuer = SlotIssuer::new(layout, SLOT, floor, 1_000);
    let (mark, _) = raise(&mut st, rules, old, old_epoch, 1_000).expect("the holder's raise");
    old_issuer.acknowledged(mark);
    let mut ids = Vec::new();
    for now in 990..1_000 {
        ids.extend(issued(&mut old_issuer, now));
    }
    // The old holder pauses; the slot is granted to the new one (its predecessor presumed dead).
    let (new_epoch, new_floor) = grant(&mut st, rules, old, new);
    let mut new_issuer = SlotIssuer::new(layout, SLOT, new_floor, 1_000);
    let (mark, _) = raise(&mut st, rules, new, new_epoch, 2_000).expect("the new holder's raise");
    new_issuer.acknowledged(mark);
    // The old holder wakes at tick 1,500 and asks for a raise under its old epoch.
    if let Some((mark, epoch)) = raise(&mut st, rules, old, old_epoch, 2_000)
        && epoch == old_epoch
    {
        old_issuer.acknowledged(mark);
    }
    for now in 1_500..1_510 {
        ids.extend(issued(&mut new_issuer, now));
        ids.extend(issued(&mut old_issuer, now));
    }
    let distinct: HashSet<u64> = ids.iter().copied().collect();
    (ids.len(), ids.len() - distinct.len())
}

fn issued(issuer: &mut SlotIssuer, now: u64) -> Vec<u64> {
    match issuer.issue(Some(now), 3, UnsafeIssuing::default()) {
        Ok(runs) => runs.iter().flat_map(|r| r.first..r.first + r.count).collect(),
        Err(_) => Vec::new(),
    }
}

#[test]
fn the_epoch_fence_keeps_a_woken_old_holder_from_issuing_beside_the_new_one() {
    let (ids, repeats) = handover(UnsafeRules::default());
    assert_eq!(repeats, 0, "{ids} ids");
    assert_eq!(ids, 60, "the old holder issued before its pause, the new one after");
}

#[test]
fn without_the_epoch_fence_the_woken_old_holder_repeats_ids() {
    let rules = UnsafeRules {
        skip_slot_fence: true,
        ..UnsafeRules::default()
    };
    let (ids, repeats) = handover(rules);
    assert_eq!(repeats, 30, "the negative control must repeat ids ({ids} ids)");
}
