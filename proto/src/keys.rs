//! Counter keys: which strings name a counter, and where a key lives in the uid space.
//!
//! A key is 1 to [`MAX_KEY_BYTES`] bytes of UTF-8. It is placed at a *position*: a uid-space
//! number, `SHA-256(key)`'s first 8 bytes read big-endian, modulo the cluster's `uid_limit`. The
//! position picks the key's section, and with it everything a section has: its route, owner,
//! lease, ceiling, the set that serves it, moves and backups. The key keeps its own `cur_seq`
//! (the AllocSvr holds keys by name, never by position), so two keys at one position — or a key
//! and the uid of the same number — share a section's ceiling and nothing else.
//!
//! Why the uid space and not sections of their own: every section mechanism then applies to keys
//! unchanged, and there is nothing to configure that two sets could disagree on (a key placed
//! differently by two servers would have two sequences). What it costs: the uids of a section
//! share its ceiling with the keys placed there, so after an owner change they restart above
//! what those keys took too (a gap, never a repeat).
//!
//! Why SHA-256: the placement is part of the contract (every client and server must agree on it,
//! forever, in any language), and SHA-256 is in every language's standard library; it costs
//! about 100 ns for a short key here, against tens of microseconds for the call.
//!
//! Deliberately left out: any normalisation (keys are compared byte for byte: `Orders` and
//! `orders` are two counters, as are two Unicode spellings of one word).

use crate::types::Uid;

/// Longest key, in bytes: Redis allows 512 MB, but a key is held in memory by its owner for as
/// long as it is live, and 256 bytes fit every naming scheme people use for counters
/// (`tenant:table:column`, a conversation id and a suffix).
pub const MAX_KEY_BYTES: usize = 256;

/// Why a key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("a counter key must not be empty")]
    Empty,
    #[error("a counter key is at most {MAX_KEY_BYTES} bytes, got {0}")]
    TooLong(usize),
    #[error("a counter key must be UTF-8: {0}")]
    NotUtf8(String),
}

/// The key in `bytes`, if it is one.
pub fn check_key(bytes: &[u8]) -> Result<&str, KeyError> {
    check_len(bytes.len())?;
    std::str::from_utf8(bytes).map_err(|e| KeyError::NotUtf8(e.to_string()))
}

/// [`check_key`] of a string, which is UTF-8 already: only its length is checked (a pipelined
/// `INCR` validated its key's UTF-8 five times over before, a visible share of its cost).
pub fn check_key_str(key: &str) -> Result<&str, KeyError> {
    check_len(key.len()).map(|()| key)
}

fn check_len(len: usize) -> Result<(), KeyError> {
    match len {
        0 => Err(KeyError::Empty),
        n if n > MAX_KEY_BYTES => Err(KeyError::TooLong(n)),
        _ => Ok(()),
    }
}

/// Where `key` lives in a uid space of `uid_limit` (> 0) uids.
pub fn position(key: &str, uid_limit: u64) -> Uid {
    let digest = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest.as_ref()[..8]);
    Uid(u64::from_be_bytes(first) % uid_limit.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The placement is a wire contract: these values must never change.
    #[test]
    fn positions_are_pinned() {
        // SHA-256("abc") starts ba7816bf 8f01cfea (FIPS 180-2's example).
        let full = u64::MAX;
        let p = |k: &str, limit| position(k, limit).0;
        assert_eq!(p("orders", 1 << 32), p("orders", full) % (1 << 32));
        assert_eq!(p("abc", full), 0xba78_16bf_8f01_cfea);
        assert_eq!(p("abc", 1 << 32), 0x8f01_cfea);
        assert_eq!(p("abc", 1000), 0xba78_16bf_8f01_cfea % 1000);
    }

    #[test]
    fn keys_are_checked_for_length_and_utf8() {
        assert_eq!(check_key(b"orders"), Ok("orders"));
        assert_eq!(check_key("zähler:😀".as_bytes()), Ok("zähler:😀"));
        assert_eq!(check_key(b""), Err(KeyError::Empty));
        assert_eq!(check_key(&[b'a'; MAX_KEY_BYTES]).map(str::len), Ok(MAX_KEY_BYTES));
        assert_eq!(
            check_key(&[b'a'; MAX_KEY_BYTES + 1]),
            Err(KeyError::TooLong(MAX_KEY_BYTES + 1))
        );
        assert!(matches!(check_key(&[0xff, 0xfe]), Err(KeyError::NotUtf8(_))));
        for key in [
            "orders",
            "zähler:😀",
            "",
            &"a".repeat(MAX_KEY_BYTES),
            &"a".repeat(MAX_KEY_BYTES + 1),
        ] {
            assert_eq!(check_key_str(key), check_key(key.as_bytes()), "{key:?}");
        }
    }
}
