//! Every size limit of the wire and the Raft log, in one table, so that both ends of a link read
//! the same number: a server that accepts what its client cannot decode (or the reverse) fails
//! only at the size where nobody tested it.
//!
//! Each server AND each client sets tonic's `max_decoding_message_size` and
//! `max_encoding_message_size` from here; each request that grows with a count is bounded here;
//! the relations between the numbers are checked at compile time at the bottom of this file.
//!
//! The worst-case sizes below count every protobuf varint at its 10-byte maximum; the unit tests
//! check them against prost's `encoded_len` of messages filled with `u64::MAX`.
//!
//! Replies that grow with the number of sections, at the largest set (2^20 sections):
//! - Load: up to 46 bytes a section, 46 MiB for all; bounded per request ([`MAX_LOAD_SECTIONS`])
//!   and asked for in chunks ([`LOAD_CHUNK_SECTIONS`]).
//! - Bump: bounded per request ([`MAX_BUMP_ITEMS`]); the AllocSvr sends at most
//!   [`BUMP_CHUNK_ITEMS`] in one.
//! - Status: counts only, no list per section; does not grow.
//! - Renew's grants (runs of equal owner, epoch and no-wait) and the route table (runs of equal
//!   owner) are NOT bounded here: ~16 bytes a grant and ~40 bytes a route entry (256-byte
//!   addresses: ~300) pass [`STORE_MESSAGE_BYTES`] only when most of the 2^20 sections are runs
//!   of their own. The arbiter moves whole contiguous runs, so runs number about the live
//!   AllocSvrs plus the moves under way; chunking these replies needs a protocol change.
//!
//! Left out: limits that concern one crate only (queue depths, retry counts): they stay beside
//! the code that uses them.

// ---- gRPC messages ----------------------------------------------------------------------------

/// Largest message of the `StoreService` and `AdminService`, both directions, both ends
/// (StoreSvr servers, `StoreClient`, `seqctl`). The largest replies are a Load of
/// [`MAX_LOAD_SECTIONS`] (≤ 11.5 MiB worst case) and a route table; 16 MiB holds either with room
/// and keeps one reply a short transfer on loopback or a LAN.
pub const STORE_MESSAGE_BYTES: usize = 16 << 20;

/// Largest message of the data plane (`AllocService`), both directions, both ends (AllocSvr
/// server, the client library's channels, `seqctl`). A reply may embed the route table, which the
/// AllocSvr received in a store reply (≤ [`STORE_MESSAGE_BYTES`]), next to at most
/// [`MAX_UIDS_PER_BATCH`] seqs (≤ 22 KB): one MiB on top covers the rest.
pub const DATA_PLANE_MESSAGE_BYTES: usize = STORE_MESSAGE_BYTES + (1 << 20);

/// Largest message between StoreSvr peers (`RaftService`), both ends. It must hold one Raft entry
/// of [`MAX_ENTRY_BYTES`] with its framing (asserted below); an AppendEntries of several entries
/// above it is split by the sender (openraft's `PayloadTooLarge`), and snapshots travel in
/// openraft's chunks (3 MiB by default).
pub const PEER_MESSAGE_BYTES: usize = 64 << 20;

// ---- counts per request -----------------------------------------------------------------------

/// Bytes of one `SectionState` inside a `LoadReply`, at most: 4 fields of (tag + 10-byte varint)
/// plus the field's own tag and length.
pub const SECTION_STATE_MAX_BYTES: usize = 4 * 11 + 2;

/// Most sections one Load may name; the store refuses more. 2^18 sections make a reply of at most
/// 2^18 × [`SECTION_STATE_MAX_BYTES`] = 11.5 MiB, under [`STORE_MESSAGE_BYTES`] (asserted below).
pub const MAX_LOAD_SECTIONS: u64 = 1 << 18;

/// Sections an AllocSvr asks for in one Load when it gains many: replies of at most
/// 65,536 × [`SECTION_STATE_MAX_BYTES`] = 2.9 MiB, under even tonic's default 4 MiB and a fifth
/// of [`STORE_MESSAGE_BYTES`]. A gain of the default 42,950 sections is one Load; the largest
/// set (2^20 sections) is 16 Loads, each one ReadIndex round.
pub const LOAD_CHUNK_SECTIONS: u64 = 1 << 16;

/// Bytes of one `BumpItem` in a `BumpRequest` (or `BumpResult` in a reply), at most: up to 4
/// fields of (tag + 10-byte varint) plus tag and length.
pub const BUMP_ITEM_MAX_BYTES: usize = 4 * 11 + 2;

/// Most items in one Bump; the store refuses more. 65,536 items make a request or reply of at
/// most 2.9 MiB and a Raft command of at most 2 MiB (3 varints each). AllocSvrs send smaller
/// Bumps ([`BUMP_CHUNK_ITEMS`]); the store keeps accepting this many from older ones.
pub const MAX_BUMP_ITEMS: usize = 1 << 16;

/// Most items the AllocSvr puts in one Bump (the store accepts up to [`MAX_BUMP_ITEMS`], so
/// AllocSvrs of either size work with any store). One Bump is one Raft entry, and an entry is
/// the smallest unit replication can send: openraft gives it one heartbeat interval (100 ms) to
/// be carried, decoded and flushed by the follower, or sends it again. 65,536 items (about
/// 0.5 MB) missed that in a debug build on 2 busy cores, for ever; 8,192 (about 64 KB) make an
/// entry an eighth of that. A gain of 2^20 sections is 128 Bumps, one after the other.
pub const BUMP_CHUNK_ITEMS: usize = 1 << 13;

/// Most uids in one `BatchFetchNextSeq`; the AllocSvr refuses more and the client library splits
/// larger calls into batches of this size.
pub const MAX_UIDS_PER_BATCH: usize = 1_000;

/// Most time-ordered ids in one `NextIds`. The reply is at most one run per tick (a run is at most
/// 24 bytes), and a count this large spans at most 16 ticks of Sonyflake's 256 ids a tick — one
/// tick of Twitter's 4,096 — so one call never borrows more than a few ticks ahead of the clock.
pub const MAX_IDS_PER_CALL: u32 = 4_096;

/// How far ahead of its clock an AllocSvr hands out ids, at most: when a tick's sequence numbers
/// run out the next tick is borrowed, up to this far (the AllocSvr's `ids::MAX_BORROW`, asserted
/// equal there). So one call is handed at most the ids of the clock's tick and of the ticks this
/// allows ahead of it ([`crate::id_layout::IdLayout::most_ids_per_call`]): a larger count could
/// never be served, however long it waited.
pub const ID_BORROW_MS: u64 = 1_000;

/// Most seqs in one block (`Reserve`). A block is also bounded by the set's `step`: one bump
/// raises a ceiling by a step, so a block of at most a step is served after at most one bump,
/// and no caller can make a section bump several steps at once (`MAX_BUMP_STEPS` of the store).
/// A million keeps a block's arithmetic far from 2^64 and is more than any Leaf-style client
/// buys at once (their segments are a few thousand).
pub const MAX_BLOCK: u32 = 1_000_000;

/// Most slot items in one `RaiseMarks`: all slots of one set's share, which an AllocSvr never
/// approaches (it holds one).
pub const MAX_RAISE_ITEMS: usize = 1_024;

/// Most time-ordered id slots one set leases (`--id-slots-per-set`). Every replica of every set
/// holds a record of 24 bytes per slot of its share (holder, epoch, mark) in its state machine and
/// in every snapshot (up to 30 bytes in postcard), scans the share on every renewal it answers and
/// every arbiter tick, and allocates the whole share when it applies the setup, which is a log
/// entry: an unbounded share (2^33 slots is 192 GiB) would crash-loop every replica on that entry.
/// 65,536 is Sonyflake's whole layout (16 slot bits) in one set: 1.5 MiB of state, a scan of a
/// few tens of microseconds, and 256 times the default share of 64. More slots than that serve
/// more sets, not bigger ones.
pub const MAX_ID_SLOTS_PER_SET: u64 = 1 << 16;

/// Most bytes of an encoded cluster map a set keeps as its cached copy (`PublishMap`): one Raft
/// command, and handed out whole in data-plane replies to callers that are behind. A map of 64
/// sets with 16 addresses each and a few thousand ranges and moves stays far below it.
pub const MAX_MAP_BYTES: usize = 1 << 20;

// ---- the audit trail of admin actions ---------------------------------------------------------

/// Records of admin actions a set keeps (in its state machine and its snapshot); older ones are
/// dropped and counted. At the field cap below a full trail is under 8 MB; a typical record
/// (a certificate subject, one line of arguments, one of outcome) is about 150 bytes, 1.5 MB for
/// the whole trail.
pub const MAX_AUDIT_RECORDS: usize = 10_000;

/// Bytes of each text field of an audit record (who, what, outcome); longer text is cut at a
/// character boundary, so a long certificate subject or refusal cannot grow the trail.
pub const MAX_AUDIT_FIELD_BYTES: usize = 256;

/// Most audit records in one `GetAudit` reply (a request for 0 gets this many).
pub const MAX_AUDIT_PAGE: usize = 1_000;

/// Bytes of one `AuditRecord` in a `GetAuditReply`, at most: two varint fields and three text
/// fields of [`MAX_AUDIT_FIELD_BYTES`] (each with tag and a 2-byte length), plus its own tag and
/// length.
pub const AUDIT_RECORD_MAX_BYTES: usize = 2 * 11 + 3 * (MAX_AUDIT_FIELD_BYTES + 3) + 4;

// ---- the binding of an incarnation to its registration ----------------------------------------

/// Fewest bytes of a registration's secret (`RegisterRequest.secret`): 128 random bits, so that
/// guessing one at any rate a store answers is hopeless. The AllocSvr draws exactly this many.
pub const MIN_SECRET_BYTES: usize = 16;

/// Most bytes of a secret the store accepts: what it hashes for every Renew, Release and Bump
/// stays small, and a request cannot make it hash megabytes.
pub const MAX_SECRET_BYTES: usize = 64;

// ---- backups ---------------------------------------------------------------------------------

/// Bytes of backup file in one `BackupChunk` of the `Backup` stream: a 16th of
/// [`STORE_MESSAGE_BYTES`], so a chunk and its framing always fit the store's message limit, and
/// the default set's whole backup (42,950 sections of at most 31 bytes: under 1.3 MiB) is at
/// most two chunks.
pub const BACKUP_CHUNK_BYTES: usize = 1 << 20;

/// Largest backup file, both ends: the server refuses to build a bigger one and `seqctl` stops
/// reading a stream that announces or sends more (a corrupt or hostile length must not fill the
/// disk or memory). The largest set (2^20 sections at ≤ 31 bytes each in postcard: 31 MiB) plus
/// range states, move records, a cached map of [`MAX_MAP_BYTES`] and an audit trail stays under it.
pub const MAX_BACKUP_BYTES: usize = 128 << 20;

// ---- Raft entries and the log -----------------------------------------------------------------

/// Most commands the StoreSvr writer packs into one Raft entry: bounds the apply time of one entry.
pub const MAX_ENTRY_COMMANDS: usize = 4_096;

/// Most bytes of commands (postcard) in one Raft entry. The writer closes an entry before it would
/// pass this and refuses a single command above it: an entry the peer link cannot carry never
/// replicates, and one above the log's record limit is fatal to the leader. The wire is not the
/// tightest bound: openraft gives every AppendEntries one heartbeat interval (100 ms by default)
/// to travel, be decoded and be flushed by the follower, or sends it again, forever. One run of
/// allocsvr's `big_set` test (debug build, 2-core machine at load average 7) saw AppendEntries
/// time out at 100 ms while the gain's 65,536-item Bumps (about 0.4 MB each) replicated. 4 MiB is
/// twice the largest possible Bump (≤ 2 MiB) and a sixteenth of [`PEER_MESSAGE_BYTES`].
pub const MAX_ENTRY_BYTES: usize = 4 << 20;

/// Bytes of entries the StoreSvr sends in one AppendEntries, at least one entry whatever its size.
/// openraft asks the log for up to 300 entries at once, gives their AppendEntries one heartbeat
/// interval (100 ms) or reads, decodes and sends the same range again, forever; the follower's
/// election timer waits on the same stream. CI's `big_set` run of 2026-11-27 (debug build, 2
/// cores) showed the loop this closes: one 65,536-item Bump missed its 100 ms, the AllocSvr
/// retried it as a new entry, the next AppendEntries carried several of them, missed again, and
/// the group churned through 50 terms without committing for a minute. The log store cuts the
/// range at this many bytes before decoding (`LogStore::limited_get_log_entries`).
pub const APPEND_ENTRIES_BYTES: usize = 256 << 10;

/// Bytes an entry adds around its commands, at most: log id (3 varints), payload tag and the
/// command count (postcard), plus the AppendEntries and gRPC framing around one entry
/// (vote, previous log id, commit index: 8 varints; 5 bytes of gRPC frame; protobuf tag and length).
pub const ENTRY_FRAMING_BYTES: usize = 1 << 10;

/// Largest record of the StoreSvr's segment log: a corrupt length must not allocate gigabytes on
/// open. One record is one entry.
pub const MAX_LOG_RECORD_BYTES: usize = 256 << 20;

const _: () = {
    assert!(MIN_SECRET_BYTES <= MAX_SECRET_BYTES);
    assert!(MAX_LOAD_SECTIONS as usize * SECTION_STATE_MAX_BYTES + 64 < STORE_MESSAGE_BYTES);
    assert!(LOAD_CHUNK_SECTIONS <= MAX_LOAD_SECTIONS);
    assert!(LOAD_CHUNK_SECTIONS as usize * SECTION_STATE_MAX_BYTES < 4 << 20);
    assert!(MAX_BUMP_ITEMS * BUMP_ITEM_MAX_BYTES + 64 < STORE_MESSAGE_BYTES);
    assert!(MAX_BUMP_ITEMS * 30 + 64 < MAX_ENTRY_BYTES);
    assert!(MAX_ENTRY_BYTES + ENTRY_FRAMING_BYTES < PEER_MESSAGE_BYTES);
    assert!(MAX_ENTRY_BYTES + ENTRY_FRAMING_BYTES < MAX_LOG_RECORD_BYTES);
    assert!(APPEND_ENTRIES_BYTES < PEER_MESSAGE_BYTES);
    assert!(BUMP_CHUNK_ITEMS <= MAX_BUMP_ITEMS);
    assert!(BUMP_CHUNK_ITEMS * 30 + 64 < APPEND_ENTRIES_BYTES);
    assert!(MAX_LOG_RECORD_BYTES <= u32::MAX as usize);
    assert!(BACKUP_CHUNK_BYTES + 1024 < STORE_MESSAGE_BYTES);
    assert!(BACKUP_CHUNK_BYTES <= MAX_BACKUP_BYTES);
    assert!(DATA_PLANE_MESSAGE_BYTES >= STORE_MESSAGE_BYTES + MAX_UIDS_PER_BATCH * 22);
    assert!(MAX_AUDIT_PAGE * AUDIT_RECORD_MAX_BYTES + 64 < STORE_MESSAGE_BYTES);
    assert!(MAX_AUDIT_PAGE <= MAX_AUDIT_RECORDS);
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb;
    use prost::Message;

    #[test]
    fn worst_case_sizes_hold_for_messages_full_of_u64_max() {
        let state = pb::SectionState {
            section: u64::MAX,
            max_seq: u64::MAX,
            epoch: u64::MAX,
            owner_incarnation: u64::MAX,
        };
        let one = pb::LoadReply {
            not_leader: None,
            sections: vec![state],
        };
        assert_eq!(one.encoded_len(), SECTION_STATE_MAX_BYTES);

        let item = pb::BumpItem {
            section: u64::MAX,
            epoch: u64::MAX,
            new_max: u64::MAX,
        };
        let req = pb::BumpRequest {
            secret: Vec::new(),
            incarnation: 0,
            items: vec![item],
        };
        assert!(req.encoded_len() <= BUMP_ITEM_MAX_BYTES);
        let result = pb::BumpResult {
            section: u64::MAX,
            outcome: i32::MAX,
            max_seq: u64::MAX,
            epoch: u64::MAX,
        };
        let reply = pb::BumpReply {
            not_leader: None,
            results: vec![result],
        };
        assert!(reply.encoded_len() <= BUMP_ITEM_MAX_BYTES, "{}", reply.encoded_len());
    }

    #[test]
    fn an_audit_record_at_the_field_cap_fits_its_worst_case_size() {
        let text = "x".repeat(MAX_AUDIT_FIELD_BYTES);
        let record = pb::AuditRecord {
            number: u64::MAX,
            at_ms: u64::MAX,
            who: text.clone(),
            what: text.clone(),
            outcome: text,
        };
        let reply = pb::GetAuditReply {
            records: vec![record],
            ..Default::default()
        };
        assert!(reply.encoded_len() <= AUDIT_RECORD_MAX_BYTES, "{}", reply.encoded_len());
    }

    #[test]
    fn a_load_reply_of_the_most_sections_fits_the_store_limit() {
        let state = pb::SectionState {
            section: u64::MAX,
            max_seq: u64::MAX,
            epoch: u64::MAX,
            owner_incarnation: u64::MAX,
        };
        let reply = pb::LoadReply {
            not_leader: None,
            sections: vec![state; MAX_LOAD_SECTIONS as usize],
        };
        assert!(reply.encoded_len() < STORE_MESSAGE_BYTES, "{}", reply.encoded_len());
    }
}
