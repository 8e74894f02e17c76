//! Control-plane clients of seqsvr-rs: the StoreService client an AllocSvr uses ([`StoreClient`])
//! and the AdminService client operators use through `seqctl` ([`AdminClient`]), both over one
//! leader-following loop ([`leader`]) with one hop limit, one error type ([`ControlError`]) and one
//! classifier of gRPC errors ([`classify`], which the data-plane client shares); [`backup`] reads a
//! set's backup stream.
//!
//! Deliberately left out: the data plane (`seqsvr-client`) and any meaning of the replies.

pub mod admin;
pub mod backup;
pub mod classify;
pub mod leader;
pub mod mover;
pub mod store;
pub mod transport;

pub use admin::AdminClient;
pub use backup::BackupClient;
pub use leader::{ControlError, Seed, StoreTimeouts};
pub use mover::{MoveError, Mover};
pub use store::StoreClient;
pub use transport::{Conn, Connect, Dialer};
