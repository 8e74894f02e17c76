//! Control-plane clients of seqsvr-rs: the StoreService client an AllocSvr uses ([`StoreClient`])
//! and the AdminService client operators use through `seqctl` ([`AdminClient`]), both over one
//! leader-following loop ([`leader`]) with one hop limit and one error type ([`ControlError`]);
//! [`ledger`] sends ledger calls to the leader of the set that keeps them;
//! [`backup`] reads a set's backup stream; [`mover`] drives moves of ranges between sets.
//!
//! Deliberately left out: the data plane (`seqsvr-client`), how a call reaches a server and what
//! its failure means (`seqsvr-rpc`, which both share; its `Dialer` is re-exported because the
//! clients here are built with one), and any meaning of the replies.

pub mod admin;
pub mod backup;
pub mod leader;
pub mod ledger;
pub mod mover;
pub mod store;

pub use admin::AdminClient;
pub use backup::BackupClient;
pub use leader::{ControlError, Seed, StoreTimeouts};
pub use ledger::LedgerClient;
pub use mover::{MoveError, Mover};
pub use seqsvr_rpc::Dialer;
pub use store::StoreClient;
