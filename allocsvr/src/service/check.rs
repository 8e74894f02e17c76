//! What a request must be before anything is served, and [`Who`] it asks about: a uid inside
//! `[0, uid_limit)`, or a counter key by the shared rules (`seqsvr_proto::keys`); a block of 1 to
//! the smaller of `MAX_BLOCK` and the set's step; a batch of 1 to [`MAX_BATCH`] items. A refusal
//! is INVALID_ARGUMENT naming the rule it broke and, in a batch, the item's index.
//!
//! A counter key is served exactly as a uid is, at its position in the uid space, which this
//! server computes itself from the key (a caller's idea of it is never trusted: a key placed in
//! two sections would have two sequences); the section holds the key's own `cur_seq` by name.
//!
//! Left out: whether this node holds what is asked, which is an answer (NOT_OWNER), not a refusal.

use seqsvr_proto::Uid;
use seqsvr_proto::limits::MAX_BLOCK;

use super::{MAX_BATCH, Service};
use crate::error::Error;
use crate::section::Counter;

/// Whose number a call asks for: a uid, or a counter key at its position in the uid space.
#[derive(Debug, Clone, Copy)]
pub(super) struct Who<'a> {
    pub(super) pos: Uid,
    pub(super) key: Option<&'a str>,
}

impl<'a> Who<'a> {
    pub(super) fn uid(uid: Uid) -> Self {
        Self { pos: uid, key: None }
    }

    pub(super) fn counter(&self, section_size: u64) -> Counter<'a> {
        match self.key {
            Some(key) => Counter::Key(key),
            None => Counter::Uid(self.pos.offset(section_size)),
        }
    }
}

impl std::fmt::Display for Who<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.key {
            Some(key) => write!(f, "key {key:?}"),
            None => write!(f, "uid {}", self.pos.0),
        }
    }
}

impl Service {
    pub(super) fn check_uid(&self, uid: u64) -> Result<Uid, Error> {
        let limit = self.shared.params().uid_limit;
        if uid >= limit {
            return Err(Error::InvalidArgument(format!("uid {uid} is outside [0, {limit})")));
        }
        Ok(Uid(uid))
    }

    /// Every uid of a batch checked; the first bad one named by its index.
    pub(super) fn check_uids(&self, uids: &[u64]) -> Result<(), Error> {
        for (i, uid) in uids.iter().enumerate() {
            self.check_uid(*uid)
                .map_err(|e| Error::InvalidArgument(format!("uids[{i}]: {e}")))?;
        }
        Ok(())
    }

    /// A block's size: 1 to the smaller of [`MAX_BLOCK`] and the set's step (one bump's room).
    pub(super) fn check_block(&self, count: u32) -> Result<u64, Error> {
        let step = self.shared.params().step;
        let most = step.min(u64::from(MAX_BLOCK));
        let n = u64::from(count);
        if n == 0 || n > most {
            return Err(Error::InvalidArgument(format!(
                "a block needs 1..={most} seqs (the smaller of the limit {MAX_BLOCK} and the set's step {step}), got {count}"
            )));
        }
        Ok(n)
    }

    /// The counter key in `bytes` and its place, or INVALID_ARGUMENT naming the rule it broke.
    pub(super) fn check_key<'k>(&self, bytes: &'k [u8]) -> Result<Who<'k>, Error> {
        let key = seqsvr_proto::keys::check_key(bytes).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        self.key_who(key)
    }

    /// Every key of a batch checked and placed, appended to `whos`; the first bad one named by its
    /// index.
    pub(super) fn check_keys<'k>(&self, keys: &'k [Vec<u8>], whos: &mut Vec<Who<'k>>) -> Result<(), Error> {
        for (i, key) in keys.iter().enumerate() {
            whos.push(self.check_key(key).map_err(|e| match e {
                Error::InvalidArgument(m) => Error::InvalidArgument(format!("keys[{i}]: {m}")),
                other => other,
            })?);
        }
        Ok(())
    }

    /// A key that is a string already (the front ends'): its length checked, not its UTF-8.
    pub(super) fn check_key_str<'k>(&self, key: &'k str) -> Result<Who<'k>, Error> {
        let key = seqsvr_proto::keys::check_key_str(key).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        self.key_who(key)
    }

    /// `key` at its position under the cluster's key placement (SHA-256 until the cluster map
    /// says: what a cluster set up before placements has; a StoreSvr of a cluster placing by slot
    /// grants no section before its map says so, `storesvr::protocol::step`).
    fn key_who<'k>(&self, key: &'k str) -> Result<Who<'k>, Error> {
        let placement = self.shared.key_placement().unwrap_or_default();
        Ok(Who {
            pos: placement.position(key, self.shared.params().uid_limit),
            key: Some(key),
        })
    }
}

/// A batch holds 1 to [`MAX_BATCH`] uids or keys.
pub(super) fn batch_len(n: usize, what: &str) -> Result<(), Error> {
    if n == 0 || n > MAX_BATCH {
        return Err(Error::InvalidArgument(format!(
            "a batch needs 1..={MAX_BATCH} {what}, got {n}"
        )));
    }
    Ok(())
}

/// CounterNext and CounterGet take no count: a caller that sends one meant CounterReserve.
pub(super) fn no_count(count: u32, rpc: &str) -> Result<(), Error> {
    if count != 0 {
        return Err(Error::InvalidArgument(format!(
            "{rpc} takes no count (got {count}): a block of values is CounterReserve"
        )));
    }
    Ok(())
}
