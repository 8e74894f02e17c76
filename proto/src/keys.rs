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
//! **Placement by hash slot** (`storesvr --key-placement slots`, chosen when the cluster is set up
//! and fixed from then on, [`KeyPlacement`]): a key's position is instead the first uid of its
//! Redis Cluster hash slot's share of the uid space, `slot × uid_limit / 16384` ([`hash_slot`]:
//! CRC16-XMODEM of the key, or of its `{hashtag}`, mod 16384). Every key of one slot is then at
//! one position, so in one section with one owner, and a Redis Cluster client that sends a slot's
//! keys to one node sends them to their owner. A cluster places keys one way only: the way its
//! id setup records (set 0's, published in the cluster map); a key placed two ways would have two
//! sequences.
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

/// How a cluster places counter keys in the uid space.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum KeyPlacement {
    /// [`position`]: SHA-256 of the key. What every cluster set up before placements existed has.
    #[default]
    Sha256,
    /// [`slot_position`] of the key's [`hash_slot`].
    Slots,
}

/// Redis Cluster's number of hash slots.
pub const HASH_SLOTS: u16 = 16384;

impl KeyPlacement {
    pub fn is_sha256(&self) -> bool {
        *self == KeyPlacement::Sha256
    }

    /// Where `key` lives in a uid space of `uid_limit` (> 0) uids under this placement.
    pub fn position(self, key: &str, uid_limit: u64) -> Uid {
        match self {
            KeyPlacement::Sha256 => position(key, uid_limit),
            KeyPlacement::Slots => slot_position(hash_slot(key.as_bytes()), uid_limit),
        }
    }

    /// The wire value (`pb::KeyPlacement`).
    pub fn to_pb(self) -> i32 {
        match self {
            KeyPlacement::Sha256 => crate::pb::KeyPlacement::Sha256 as i32,
            KeyPlacement::Slots => crate::pb::KeyPlacement::Slots as i32,
        }
    }

    /// The placement a wire value names; `None` for one this build does not know (a later
    /// release's), which must never be taken for another.
    pub fn from_pb(v: i32) -> Option<Self> {
        match crate::pb::KeyPlacement::try_from(v).ok()? {
            crate::pb::KeyPlacement::Sha256 => Some(KeyPlacement::Sha256),
            crate::pb::KeyPlacement::Slots => Some(KeyPlacement::Slots),
        }
    }

    /// The placement a cluster map's id setup records: `None` while the map carries no setup (set
    /// 0 has not set its ids up, or this copy predates it) or one of a later release.
    pub fn of_map(map: &crate::pb::ClusterMap) -> Option<Self> {
        map.ids.as_ref().and_then(|ids| Self::from_pb(ids.key_placement))
    }
}

impl std::fmt::Display for KeyPlacement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KeyPlacement::Sha256 => "sha256",
            KeyPlacement::Slots => "slots",
        })
    }
}

impl std::str::FromStr for KeyPlacement {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sha256" => Ok(KeyPlacement::Sha256),
            "slots" => Ok(KeyPlacement::Slots),
            _ => Err(format!("key placement {s:?}: expected sha256 or slots")),
        }
    }
}

/// Redis Cluster's hash slot of `key`: CRC16-XMODEM of the key, or of the part between its first
/// `{` and the first `}` after it when that part is not empty, mod [`HASH_SLOTS`].
pub fn hash_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(hashed) % HASH_SLOTS
}

/// The first uid of hash slot `slot`'s share of a uid space of `uid_limit` uids.
pub fn slot_position(slot: u16, uid_limit: u64) -> Uid {
    let at = u128::from(slot % HASH_SLOTS) * u128::from(uid_limit) / u128::from(HASH_SLOTS);
    Uid(at as u64)
}

/// Where `key` lives in a uid space of `uid_limit` (> 0) uids under SHA-256 placement.
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

    /// Redis's own examples (cluster spec and `CLUSTER KEYSLOT`): the slots are a wire contract
    /// shared with every Redis Cluster client.
    #[test]
    fn hash_slots_are_redis_clusters() {
        assert_eq!(hash_slot(b"123456789"), 0x31c3 % HASH_SLOTS);
        assert_eq!(hash_slot(b"somekey"), 11058);
        assert_eq!(hash_slot(b"foo"), 12182);
        assert_eq!(hash_slot(b"{user1000}.following"), hash_slot(b"user1000"));
        assert_eq!(hash_slot(b"{user1000}.followers"), hash_slot(b"user1000"));
        // An empty tag, or no closing brace, hashes the whole key.
        assert_eq!(hash_slot(b"foo{}{bar}"), hash_slot(b"foo{}{bar}"));
        assert_ne!(hash_slot(b"foo{}{bar}"), hash_slot(b"bar"));
        assert_eq!(hash_slot(b"foo{{bar}}zap"), hash_slot(b"{bar"));
        assert_eq!(hash_slot(b"foo{bar}{zap}"), hash_slot(b"bar"));
        let whole = |k: &[u8]| crc16::State::<crc16::XMODEM>::calculate(k) % HASH_SLOTS;
        assert_eq!(hash_slot(b"{abc"), whole(b"{abc"));
        assert_eq!(hash_slot(b"a}b{c"), whole(b"a}b{c"));
    }

    #[test]
    fn a_slots_keys_share_one_position_and_positions_rise_with_the_slot() {
        let limit = 1 << 32;
        let p = |k: &str| KeyPlacement::Slots.position(k, limit).0;
        assert_eq!(p("{t}a"), p("{t}b"));
        assert_eq!(p("foo"), 12182 * (limit / 16384));
        assert_eq!(slot_position(0, 1000).0, 0);
        assert_eq!(slot_position(16383, 1000).0, 999);
        for s in 1..HASH_SLOTS {
            assert!(slot_position(s, limit).0 > slot_position(s - 1, limit).0);
            assert!(slot_position(s, 1000).0 >= slot_position(s - 1, 1000).0);
        }
        assert_eq!(KeyPlacement::Sha256.position("abc", 1000), position("abc", 1000));
        for k in [KeyPlacement::Sha256, KeyPlacement::Slots] {
            assert_eq!(k.to_string().parse::<KeyPlacement>(), Ok(k));
            assert_eq!(KeyPlacement::from_pb(k.to_pb()), Some(k));
        }
        assert_eq!(KeyPlacement::from_pb(7), None);
        assert!("SHA256".parse::<KeyPlacement>().is_err());
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
