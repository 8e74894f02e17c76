//! The client side of every call in seqsvr-rs, shared by the data-plane client (`seqsvr-client`)
//! and the control-plane clients (`seqsvr-control`): [`transport`] is how a client reaches a
//! server (an HTTP/2 connection of our own for the data plane, a tonic channel for the control
//! plane, or an in-process transport that the deterministic simulator drives), and [`classify`]
//! says what a failed call means — whether it may have taken effect and whether to retry it.
//!
//! Deliberately left out: any service's calls, routing and leader following (the two client
//! crates above), and the server side (`seqsvr-auth`, `seqsvr-plumbing::serve_limits`).

mod call;
pub mod classify;
mod h2conn;
pub mod transport;

pub use transport::{Conn, Connect, Dialer};
