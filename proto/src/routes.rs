//! A validated route table: uid → set → section range → owner.
//!
//! Route tables travel inside replies and are cached by clients; a malformed
//! one (overlaps, holes, zero section size) is refused here, once, so that
//! lookups never have to guess.

use crate::pb;
use crate::types::{Incarnation, NodeId, SectionId, Uid, section_count};

/// Why a route table was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RouteError {
    #[error("route table has section_size 0")]
    ZeroSectionSize,
    #[error("route table has uid_limit 0")]
    ZeroUidLimit,
    #[error("route entry {index} is empty or reversed: [{begin}, {end})")]
    EmptyEntry { index: usize, begin: u64, end: u64 },
    #[error("route entry {index} starts at section {begin}, expected {expected} (hole or overlap)")]
    NotContiguous { index: usize, begin: u64, expected: u64 },
    #[error("route table ends at section {end}, expected {expected}")]
    Incomplete { end: u64, expected: u64 },
}

/// Owner of one uid according to a route table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteTarget<'a> {
    pub section: SectionId,
    /// The set the entry says serves the section.
    pub set_id: u64,
    pub node_id: NodeId,
    pub incarnation: Incarnation,
    /// Empty when the section is currently unowned.
    pub addr: &'a str,
}

/// A route table whose entries are known to be sorted, contiguous and complete.
#[derive(Debug, Clone, PartialEq)]
pub struct Routes {
    table: pb::RouteTable,
}

impl Routes {
    /// Validates a table received from the wire.
    pub fn new(table: pb::RouteTable) -> Result<Self, RouteError> {
        if table.section_size == 0 {
            return Err(RouteError::ZeroSectionSize);
        }
        if table.uid_limit == 0 {
            return Err(RouteError::ZeroUidLimit);
        }
        let mut expected = 0;
        for (index, e) in table.entries.iter().enumerate() {
            if e.section_end <= e.section_begin {
                return Err(RouteError::EmptyEntry {
                    index,
                    begin: e.section_begin,
                    end: e.section_end,
                });
            }
            if e.section_begin != expected {
                return Err(RouteError::NotContiguous {
                    index,
                    begin: e.section_begin,
                    expected,
                });
            }
            expected = e.section_end;
        }
        let total = section_count(table.uid_limit, table.section_size);
        if expected != total {
            return Err(RouteError::Incomplete {
                end: expected,
                expected: total,
            });
        }
        Ok(Self { table })
    }

    pub fn version(&self) -> u64 {
        self.table.version
    }

    /// The set whose table this is.
    pub fn set_id(&self) -> u64 {
        self.table.set_id
    }

    pub fn section_size(&self) -> u64 {
        self.table.section_size
    }

    pub fn uid_limit(&self) -> u64 {
        self.table.uid_limit
    }

    pub fn entries(&self) -> &[pb::RouteEntry] {
        &self.table.entries
    }

    pub fn as_proto(&self) -> &pb::RouteTable {
        &self.table
    }

    /// The owner of `uid`, or `None` when the uid is outside `[0, uid_limit)`.
    pub fn lookup(&self, uid: Uid) -> Option<RouteTarget<'_>> {
        if uid.0 >= self.table.uid_limit {
            return None;
        }
        let section = uid.section(self.table.section_size);
        let entries = &self.table.entries;
        // Entries are contiguous from 0, so the last one starting at or before
        // the section covers it.
        let i = entries.partition_point(|e| e.section_begin <= section.0) - 1;
        let e = &entries[i];
        Some(RouteTarget {
            section,
            set_id: e.set_id,
            node_id: NodeId(e.node_id),
            incarnation: Incarnation(e.incarnation),
            addr: &e.addr,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(begin: u64, end: u64, node: u64, addr: &str) -> pb::RouteEntry {
        pb::RouteEntry {
            set_id: 0,
            section_begin: begin,
            section_end: end,
            node_id: node,
            incarnation: node * 10,
            addr: addr.into(),
        }
    }

    fn table(entries: Vec<pb::RouteEntry>) -> pb::RouteTable {
        pb::RouteTable {
            set_id: 0,
            version: 7,
            section_size: 100,
            uid_limit: 1_000,
            entries,
        }
    }

    #[test]
    fn lookup_finds_the_covering_entry() {
        let r = Routes::new(table(vec![entry(0, 4, 1, "a"), entry(4, 10, 2, "b")])).unwrap();
        let cases = [(0, 0, "a"), (399, 3, "a"), (400, 4, "b"), (999, 9, "b")];
        for (uid, section, addr) in cases {
            let t = r.lookup(Uid(uid)).unwrap();
            assert_eq!((t.section, t.addr), (SectionId(section), addr), "uid {uid}");
        }
        assert_eq!(r.lookup(Uid(1_000)), None);
        assert_eq!(r.lookup(Uid(u64::MAX)), None);
    }

    #[test]
    fn malformed_tables_are_refused() {
        let cases = [
            (table(vec![entry(0, 4, 1, "a"), entry(5, 10, 2, "b")]), "hole"),
            (table(vec![entry(0, 6, 1, "a"), entry(5, 10, 2, "b")]), "overlap"),
            (table(vec![entry(0, 4, 1, "a")]), "incomplete"),
            (table(vec![entry(0, 0, 1, "a"), entry(0, 10, 2, "b")]), "empty"),
            (table(vec![]), "no entries"),
            (
                pb::RouteTable {
                    set_id: 0,
                    section_size: 0,
                    ..table(vec![entry(0, 10, 1, "a")])
                },
                "zero size",
            ),
            (
                pb::RouteTable {
                    set_id: 0,
                    uid_limit: 0,
                    ..table(vec![entry(0, 10, 1, "a")])
                },
                "zero limit",
            ),
        ];
        for (t, what) in cases {
            assert!(Routes::new(t).is_err(), "{what} accepted");
        }
    }
}
