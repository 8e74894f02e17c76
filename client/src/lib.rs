//! Client library of seqsvr-rs: routing, retries, batching and coalescing for the AllocSvr data plane.
//! The StoreSvr and admin clients are in `seqsvr-control`; the operator's CLI, `seqctl`, uses both.
//!
//! - [`Client`] learns the versioned route table from the AllocSvrs themselves (they embed it in any
//!   reply whose caller has an older version), sends each uid to its owner over one reused channel per
//!   address, and retries NOT_OWNER / NOT_READY / unreachable with bounded, jittered backoff under an
//!   overall deadline.
//! - [`Client::batch_fetch`] splits many uids by owner into RPCs of at most 1,000 uids, sends them
//!   concurrently and reassembles the answers in request order. [`Client::batch_get`] reads the
//!   last value of many uids and keys the same way, one `BatchGet` per owner.
//! - [`Coalescer`] lets many concurrent single-uid callers share batch RPCs;
//!   [`Coalescer::stats`] tells how many callers its batches carried (for tuning [`CoalescerConfig`]).
//! - [`Client::reserve`]: a block of a uid's seqs in one call. [`ProcessOrderedBlocks`] reserves
//!   blocks ahead and hands values out from memory: unique everywhere, increasing within the
//!   process only (Leaf-segment's client mode; its name says what it does not promise).
//! - [`Client::counter_next`], [`Client::counter_reserve`], [`Client::counter_get`]: named
//!   counters (`"orders"`), each key its own strictly increasing sequence, routed by the key's
//!   place in the uid space (`seqsvr_proto::keys`).
//! - [`Client::next_ids`] / [`Client::next_id`]: time-ordered ids, unique in the whole cluster, from
//!   any AllocSvr that holds a slot (no routing; another is asked when one cannot answer).
//! - [`Client::ledger_create`], [`Client::ledger_reserve`], [`Client::ledger_confirm`] and the
//!   other `ledger_` calls: ledger counters (numbers with no gaps, each held, confirmed or voided),
//!   from any AllocSvr, which forwards to the set that decides them; retries reuse the request id
//!   or reference, so a lost reply costs no number.
//! - [`MapView`]: the cluster map learned from replies (sent with the caller's map version in a
//!   header; a server adds the map only when that version is older). It tells the client which set
//!   serves a uid and where that set's AllocSvrs are, so seeds in one set reach every set, and a
//!   number is accepted only from a set the map allows to answer for the uid.
//!
//! - [`transport`]: one connection per address ([`transport::H2Conn`], a request in one write,
//!   plaintext or mutual TLS), or an in-process transport ([`Client::in_process`])
//!   with seeded random choices, on which the deterministic simulator runs this same client.
//!
//! Promise kept here (docs/DESIGN.md, Promises): a call never returns a number it did not get from an owner's OK
//! reply, and a call that timed out or lost its reply is reported as [`ClientError::Unknown`] — "may
//! have taken effect" — never as "did not happen" and never as 0.
//!
//! ```no_run
//! use seqsvr_client::{Client, ClientConfig};
//! use seqsvr_proto::Uid;
//!
//! # async fn demo() -> Result<(), seqsvr_client::ClientError> {
//! let client = Client::connect(ClientConfig::new(["127.0.0.1:7100"])).await?;
//! let a = client.fetch_next_seq(Uid(42)).await?;
//! let b = client.fetch_next_seq(Uid(42)).await?;
//! assert!(b.seq > a.seq);
//! let many = client.batch_fetch(&[Uid(1), Uid(2), Uid(1)]).await?;
//! assert!(many[2].seq > many[0].seq);
//! # Ok(())
//! # }
//! ```
//!
//! Deliberately left out: any cache of seqs outside [`ProcessOrderedBlocks`], and learning routes from StoreSvr (the data plane hands
//! them out, so an application needs only AllocSvr addresses).

mod batch;
mod batch_get;
mod client;
mod coalesce;
mod config;
mod error;
mod ids;
mod ledger;
mod local_blocks;
mod map;
mod retry;
mod routing;
#[cfg(test)]
mod routing_props;
/// The transport is shared with the control-plane clients (see `seqsvr_rpc::transport`).
pub use seqsvr_rpc::transport;

pub use batch::{MAX_UIDS_PER_CALL, MAX_UIDS_PER_RPC, Subject};
pub use batch_get::Current;
pub use client::{Block, Client, Counted, CounterBlock, CurSeq, Fetched, Owner};
pub use coalesce::{Coalescer, CoalescerConfig, CoalescerStats};
pub use config::ClientConfig;
pub use error::{ClientError, FailureKind};
pub use ids::Ids;
pub use ledger::{LedgerGaps, new_request_id};
pub use local_blocks::ProcessOrderedBlocks;
pub use map::MapView;
pub use routing::RouteSet;
pub use transport::{CallFuture, Conn, Connect};
