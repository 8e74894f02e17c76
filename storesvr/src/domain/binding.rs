//! Binds an AllocSvr incarnation to the process that registered it.
//!
//! An AllocSvr draws a random secret when it registers and sends it with the Register and with
//! every Renew, Release and Bump of that incarnation. The set keeps only the secret's SHA-256,
//! per incarnation, in its replicated state; a call that names a bound incarnation without the
//! secret whose hash matches is refused. Incarnations and epochs are no secret (every Load reply
//! shows them, and they are small numbers), so without this anyone who reaches the leader could
//! end another node's grant with `Release{waited: true}` (the next owner then serves at once,
//! while the owner still serves from memory: two owners, a step back), keep a dead incarnation's
//! sections from being reassigned with Renews, or deregister a live node with `leaving`.
//!
//! Why a hash: the log, snapshots and backups then hold nothing that lets a reader act as the
//! incarnation. Why the AllocSvr draws the secret rather than the store: every attempt of one
//! registration carries the same nonce and the same secret, so a retry that lands after an
//! earlier attempt committed gets that attempt's incarnation *and* matches its hash; a secret the
//! store drew per attempt could not be handed out again from a hash. The hashes are compared in
//! constant time (`subtle`), although a hash's prefix leaks nothing useful about the secret.
//!
//! Deliberately left out:
//! - Incarnations registered without a secret (by an AllocSvr from before the binding) stay
//!   unbound and their calls forgeable, as before; they go away when those processes restart.
//! - Anyone who reads the secret — the AllocSvr's memory, or its calls on the wire without TLS —
//!   can act as the incarnation. TLS (and its `allocsvr` role) is what protects the wire.
//! - Register itself: a new registration is a new incarnation, not someone else's one.

use std::collections::BTreeMap;

use seqsvr_proto::Incarnation;
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;

pub use seqsvr_proto::limits::{MAX_SECRET_BYTES, MIN_SECRET_BYTES};

/// SHA-256 of a registration's secret.
#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretHash(pub [u8; 32]);

impl SecretHash {
    pub fn of(secret: &[u8]) -> Self {
        let digest = ring::digest::digest(&ring::digest::SHA256, secret);
        let mut out = [0u8; 32];
        out.copy_from_slice(digest.as_ref());
        Self(out)
    }
}

/// Only a prefix: a hash in a log line helps nobody act as the incarnation, but neither does the
/// whole of it help the reader.
impl std::fmt::Debug for SecretHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sha256:{:02x}{:02x}{:02x}{:02x}…",
            self.0[0], self.0[1], self.0[2], self.0[3]
        )
    }
}

/// What a call presented, against what its incarnation registered with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The incarnation is bound and the call carried its secret.
    Proven,
    /// No hash is kept for the incarnation: registered without a secret (an older AllocSvr), or
    /// not registered at all (the caller's own checks answer that). Nothing to check.
    Unbound,
    /// The incarnation is bound and the call carried no secret or another one.
    Refused,
}

/// The secret hashes of the set's live, bound incarnations.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Bindings(BTreeMap<Incarnation, SecretHash>);

impl Bindings {
    /// Binds a freshly minted incarnation. An incarnation is bound once: its number is never
    /// minted again, so its hash never changes while it lives.
    pub fn bind(&mut self, incarnation: Incarnation, hash: SecretHash) {
        self.0.entry(incarnation).or_insert(hash);
    }

    pub fn check(&self, incarnation: Incarnation, presented: Option<&SecretHash>) -> Verdict {
        match (self.0.get(&incarnation), presented) {
            (None, _) => Verdict::Unbound,
            (Some(kept), Some(p)) if bool::from(kept.0.ct_eq(&p.0)) => Verdict::Proven,
            (Some(_), _) => Verdict::Refused,
        }
    }

    /// Forgets the hashes of incarnations that are no longer registered (superseded, expired,
    /// left), so that the map is bounded by the registry.
    pub fn keep_only<V>(&mut self, live: &BTreeMap<Incarnation, V>) {
        if self.0.keys().any(|i| !live.contains_key(i)) {
            self.0.retain(|i, _| live.contains_key(i));
        }
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_incarnation_needs_its_own_secret_and_an_unbound_one_needs_none() {
        let mut b = Bindings::default();
        let (mine, other) = (SecretHash::of(b"sixteen bytes ok"), SecretHash::of(b"sixteen bytes no"));
        b.bind(Incarnation(4), mine);
        let cases = [
            (4, Some(&mine), Verdict::Proven),
            (4, Some(&other), Verdict::Refused),
            (4, None, Verdict::Refused),
            (5, None, Verdict::Unbound),
            (5, Some(&other), Verdict::Unbound),
        ];
        for (inc, presented, want) in cases {
            assert_eq!(
                b.check(Incarnation(inc), presented),
                want,
                "incarnation {inc} {presented:?}"
            );
        }
        b.bind(Incarnation(4), other);
        assert_eq!(
            b.check(Incarnation(4), Some(&mine)),
            Verdict::Proven,
            "a binding never changes"
        );
    }

    #[test]
    fn hashes_of_gone_incarnations_are_forgotten() {
        let mut b = Bindings::default();
        b.bind(Incarnation(1), SecretHash::of(b"a"));
        b.bind(Incarnation(2), SecretHash::of(b"b"));
        let live: BTreeMap<Incarnation, ()> = [(Incarnation(2), ())].into();
        b.keep_only(&live);
        assert_eq!(b.len(), 1);
        assert_eq!(b.check(Incarnation(1), None), Verdict::Unbound);
    }

    #[test]
    fn the_hash_is_sha256() {
        // FIPS 180-2 test vector "abc".
        let h = SecretHash::of(b"abc");
        assert_eq!(&h.0[..4], [0xba, 0x78, 0x16, 0xbf]);
        assert_eq!(format!("{h:?}"), "sha256:ba7816bf…");
    }
}
