//! Named counters in the simulators (`--keys`): which keys the workload asks for, and how a key
//! is written in a history.
//!
//! A history records subjects as `u64`s (`Call::uids`). Key `i` is recorded as
//! [`KEY_SUBJECT`]` | i`, a number no uid reaches (uids are below the uid limit, at most 2^44),
//! so every checker keyed by subject keeps one sequence per key without knowing keys exist. The
//! checkers that need a subject's section ask [`section_of`], which places a key as the servers
//! do, under the run's key placement (`seqsvr_proto::keys::KeyPlacement`).
//!
//! The names mix what users write: plain words, `:`-separated ids, non-ASCII.
//!
//! Deliberately left out: random key names (the set is fixed by its size, so a history can be
//! checked without the run that wrote it).

use seqsvr_proto::keys::KeyPlacement;

/// The bit that marks a key in a history's subjects.
pub const KEY_SUBJECT: u64 = 1 << 63;

/// Keys the workload asks for with `--keys`: few enough that each gets many calls (P1 and P6
/// need consecutive values), more than an AllocSvr of the simulators may hold ([`MAX_LIVE_KEYS`]),
/// so keys are forgotten and come back.
pub const KEYS: u32 = 24;

/// Keys an AllocSvr holds in the simulators (`--max-live-keys`): below [`KEYS`] on purpose.
pub const MAX_LIVE_KEYS: usize = 8;

/// The name of key `i`.
pub fn name(i: u64) -> String {
    match i % 3 {
        0 => format!("orders-{i}"),
        1 => format!("conv:{i:08x}:msg"),
        _ => format!("zähler-{i}"),
    }
}

/// The history subject of key `i`.
pub fn subject(i: u64) -> u64 {
    KEY_SUBJECT | i
}

/// The key a subject stands for, if it is one.
pub fn key_of(subject: u64) -> Option<String> {
    (subject & KEY_SUBJECT != 0).then(|| name(subject & !KEY_SUBJECT))
}

/// The section that serves `subject` (a uid, or a key at its position under `placement`).
pub fn section_of(subject: u64, section_size: u64, uid_limit: u64, placement: KeyPlacement) -> u64 {
    let at = match key_of(subject) {
        Some(key) => placement.position(&key, uid_limit).0,
        None => subject,
    };
    at / section_size.max(1)
}

/// How a subject reads in a report: `uid 42` or `key "orders-3"`.
pub fn label(subject: u64) -> String {
    match key_of(subject) {
        Some(key) => format!("key {key:?}"),
        None => format!("uid {subject}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_subject_is_no_uid_and_is_placed_as_the_servers_place_it() {
        let s = subject(4);
        assert_eq!(key_of(s).as_deref(), Some("conv:00000004:msg"));
        assert_eq!(key_of(4), None);
        assert_eq!(section_of(250, 100, 1000, KeyPlacement::Slots), 2);
        let at = seqsvr_proto::keys::position(&name(4), 1000).0;
        assert_eq!(section_of(s, 100, 1000, KeyPlacement::Sha256), at / 100);
        let at = KeyPlacement::Slots.position(&name(4), 1000).0;
        assert_eq!(section_of(s, 100, 1000, KeyPlacement::Slots), at / 100);
        assert_eq!(label(s), "key \"conv:00000004:msg\"");
    }
}
