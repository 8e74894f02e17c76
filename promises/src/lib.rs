//! The checks of docs/DESIGN.md's promises that more than one tool runs over a recorded history:
//! the simulator (`sim`, package `sim`) and the operator's `seqctl verify` (package `seqctl`).
//!
//! - [`order`]: one subject's values (a uid's sequence or a named counter): never 0, never twice,
//!   and each above every value of a call that completed before its call began (P1).
//! - [`ids`]: time-ordered ids: none twice, and each stamped within the allowance of the time its
//!   call ran (U1, U3 of docs/design/time-ordered-ids.md).
//!
//! Every function is pure and O(n log n): the callers read and write histories, name the
//! promises in their own reports and choose which calls count. "A completed before B began"
//! means `A.complete_ns < B.invoke_ns` on the caller's one monotonic clock.
//!
//! Deliberately left out: IO, report formatting, and the checks only the simulator can make
//! (durability against the store's ceilings, ownership, waste): they need the cluster's inside.

pub mod ids;
pub mod order;
