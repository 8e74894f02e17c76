//! Domain newtypes (the words of docs/DESIGN.md). Each wraps a `u64` so that a uid cannot be
//! passed where a section or an epoch is expected.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! newtype {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub struct $name(pub u64);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl From<u64> for $name {
            fn from(v: u64) -> Self {
                Self(v)
            }
        }
    };
}

newtype!(
    /// Key whose sequence is asked for; the cluster serves `[0, uid_limit)`.
    Uid
);
newtype!(
    /// `uid / section_size`: a run of uids that share one `max_seq`.
    SectionId
);
newtype!(
    /// Per-section counter raised on every ownership change; fences stale owners.
    Epoch
);
newtype!(
    /// Stable identity of a process slot (StoreSvr replica or AllocSvr); never reused.
    NodeId
);
newtype!(
    /// A fresh number for every AllocSvr registration; 0 means "nobody".
    Incarnation
);

impl Uid {
    /// The section this uid belongs to.
    pub fn section(self, section_size: u64) -> SectionId {
        SectionId(self.0 / section_size)
    }

    /// Position of the uid inside its section.
    pub fn offset(self, section_size: u64) -> usize {
        (self.0 % section_size) as usize
    }
}

impl SectionId {
    /// First uid of the section.
    pub fn first_uid(self, section_size: u64) -> Uid {
        Uid(self.0 * section_size)
    }
}

/// Number of sections needed to cover `[0, uid_limit)`.
pub fn section_count(uid_limit: u64, section_size: u64) -> u64 {
    uid_limit.div_ceil(section_size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uid_maps_to_section_and_offset() {
        let cases = [
            (0, 100, 0, 0),
            (99, 100, 0, 99),
            (100, 100, 1, 0),
            (12_345, 1_000, 12, 345),
        ];
        for (uid, size, section, offset) in cases {
            assert_eq!(Uid(uid).section(size), SectionId(section));
            assert_eq!(Uid(uid).offset(size), offset);
            assert!(SectionId(section).first_uid(size).0 <= uid);
        }
    }

    #[test]
    fn section_count_rounds_up() {
        assert_eq!(section_count(1 << 32, 100_000), 42_950);
        assert_eq!(section_count(1_000, 100), 10);
        assert_eq!(section_count(1_001, 100), 11);
    }
}
