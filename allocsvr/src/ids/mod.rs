//! Time-ordered ids on this AllocSvr (`NextIds`): unique in the whole cluster because a node
//! issues a tick of a slot only between the slot's floor when it gained it and the mark the store
//! acknowledged under its epoch (docs/DESIGN.md, U1–U3). The sequences (`section`, `service`)
//! share nothing with this folder but the node's state and its renewals.
//!
//! From pure rules to the RPC:
//! - [`issuer`]: one slot's issuing rules (floor, acknowledged mark, last tick, borrowing), pure
//!   and handed the clock's tick.
//! - [`clock`]: the wall clock ids are stamped with (a test may offset or step it).
//! - [`slots`]: the slots this node holds, learnt from renewals, raised and issued from, and how
//!   many it asks for.
//! - [`service`]: `NextIds`, with its short waits for a raise or the clock.
//!
//! Deliberately left out: the raiser's Raft write (`tasks::raise`, an IO loop beside the other
//! tasks) and the store's side of slots (the StoreSvr's `domain::slots`).

pub mod clock;
pub mod issuer;
pub mod service;
pub mod slots;
