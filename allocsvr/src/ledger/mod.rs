//! Ledger counters on every AllocSvr: the `seqsvr.v1.LedgerService` each node serves on its gRPC
//! port, which forwards every call to the StoreSvr leader of the set that keeps the key.
//!
//! A ledger's numbers are decided by its set's Raft group, never from an AllocSvr's memory
//! (docs/decisions/0004-ledger-counters.md): the AllocSvr adds nothing but the way there. So any
//! AllocSvr answers for any key, not only the owner of the key's section. The key is placed as a
//! counter key is ([`route`]), the cluster map the node holds names the set that serves the
//! section and that set's StoreSvrs, and one leader-following client per set
//! (`seqsvr_control::LedgerClient`) carries the call ([`service`]), in a loop that follows a section
//! moved to another set ([`forward`]).
//!
//! Promises kept here: a reply never carries `not_leader` (hints are followed before answering);
//! a store's refusal reaches the caller unchanged (code and message), except "not served by this
//! set now" (the section is moving or moved), which is retried after a fresh map until the call's
//! deadline; a call whose outcome is unknown (an attempt without a reply) is answered UNKNOWN,
//! never UNAVAILABLE, so that a caller retries with the same request id or reference. Operator
//! calls (Void, Reconcile) are checked here too: only an `admin` certificate (or no TLS) passes,
//! because the store admits this node's certificate for them.
//!
//! Deliberately left out: any state of a ledger (the store keeps all of it), caching of replies,
//! and the front ends' routes (`seqsvr_frontends`, which reach this service through the client
//! library).

pub mod forward;
pub mod route;
pub mod service;

pub use service::LedgerFront;
