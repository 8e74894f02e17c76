//! [`ProcessOrderedBlocks`]: Leaf-segment's client mode, honestly labelled. It reserves blocks of
//! a uid's seqs (or a named counter's values) ahead (a double buffer: the next block is asked for in the background once the
//! current one is running low) and hands the values out from memory.
//!
//! What it promises, and what it does not:
//! - **Unique in the whole cluster**: every value comes from a block the owner handed out once.
//! - **Increasing within this process**: one block per uid is asked for at a time, and only after
//!   the previous one arrived, so each block lies above the one before it (P1 for blocks), and
//!   values are taken from a block in order under the uid's lock.
//! - **NOT ordered across processes**: two processes hold different blocks of the same uid and
//!   hand them out side by side, so a value one process hands out after another process's can be
//!   smaller. Callers that need "completed before means smaller" across processes call
//!   [`crate::Client::fetch_next_seq`] (or the [`crate::Coalescer`]) instead.
//! - **Gaps**: values of a block never handed out (the process exits, or a refill's reply is lost)
//!   are skipped for good, as a crashed AllocSvr's reserved seqs are.
//!
//! Deliberately left out: evicting idle uids' buffers (each costs two ranges; a process that
//! touches unboundedly many uids should not buffer them), and refilling when no caller asks.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use seqsvr_proto::Uid;
use tokio::task::JoinHandle;

use crate::client::Client;
use crate::error::{ClientError, FailureKind};

/// Whose values a buffer holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Name {
    Uid(Uid),
    Key(Arc<str>),
}

/// A uid's or key's buffer: the block values are taken from, and the refill in flight, if any.
#[derive(Default)]
struct Buffer {
    current: Range<u64>,
    refill: Option<JoinHandle<Result<Range<u64>, ClientError>>>,
}

/// Hands out seqs of uids from blocks reserved ahead: unique everywhere, increasing within this
/// process only (see the module docs for what that leaves out).
pub struct ProcessOrderedBlocks {
    client: Client,
    block: u32,
    refill_below: u64,
    buffers: Mutex<HashMap<Name, Arc<tokio::sync::Mutex<Buffer>>>>,
}

impl ProcessOrderedBlocks {
    /// Buffers of `block` seqs per uid (1 to the set's step; the server refuses more), the next
    /// one asked for when fewer than a fifth of a block are left.
    pub fn new(client: Client, block: u32) -> Result<Self, ClientError> {
        if block == 0 {
            return Err(ClientError::failed(
                FailureKind::BadConfig,
                "a block holds at least one seq",
            ));
        }
        Ok(Self {
            client,
            block,
            refill_below: u64::from(block / 5).max(1),
            buffers: Mutex::default(),
        })
    }

    fn buffer(&self, name: &Name) -> Arc<tokio::sync::Mutex<Buffer>> {
        let mut all = self.buffers.lock().unwrap_or_else(|e| e.into_inner());
        all.entry(name.clone()).or_default().clone()
    }

    fn start_refill(&self, name: &Name) -> JoinHandle<Result<Range<u64>, ClientError>> {
        let (client, block, name) = (self.client.clone(), self.block, name.clone());
        tokio::spawn(async move {
            match name {
                Name::Uid(uid) => client.reserve(uid, block).await.map(|b| b.seqs()),
                Name::Key(key) => client.counter_reserve(&key, block).await.map(|b| b.values()),
            }
        })
    }

    /// The next seq of `uid` for this process: above every value this process was handed for it.
    /// Waits for a block only when the buffer is empty and no refill arrived in time; an error is
    /// the reserve's (an unknown outcome there loses at most that block's values).
    pub async fn next(&self, uid: Uid) -> Result<u64, ClientError> {
        self.next_of(&Name::Uid(uid)).await
    }

    /// The next value of the named counter `key` for this process, as [`Self::next`] for a uid:
    /// unique everywhere, increasing within this process, not ordered across processes.
    pub async fn next_of_key(&self, key: &str) -> Result<u64, ClientError> {
        seqsvr_proto::keys::check_key_str(key)
            .map_err(|e| ClientError::failed(FailureKind::InvalidArgument, e.to_string()))?;
        self.next_of(&Name::Key(key.into())).await
    }

    async fn next_of(&self, name: &Name) -> Result<u64, ClientError> {
        let buffer = self.buffer(name);
        let mut b = buffer.lock().await;
        loop {
            if let Some(v) = b.current.next() {
                if b.refill.is_none() && b.current.end - b.current.start < self.refill_below {
                    b.refill = Some(self.start_refill(name));
                }
                return Ok(v);
            }
            let refill = b.refill.take().unwrap_or_else(|| self.start_refill(name));
            b.current = refill
                .await
                .map_err(|e| ClientError::unknown(format!("the block reserve task ended: {e}")))??;
        }
    }
}

impl Drop for ProcessOrderedBlocks {
    fn drop(&mut self) {
        // A refill in flight is no one's any more: its block is skipped like any unused one.
        let all = self.buffers.get_mut().unwrap_or_else(|e| e.into_inner());
        for buffer in all.values() {
            if let Ok(mut b) = buffer.try_lock()
                && let Some(r) = b.refill.take()
            {
                r.abort();
            }
        }
    }
}
