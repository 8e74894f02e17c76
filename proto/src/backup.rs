//! The backup file: a header, the set's replicated state as opaque bytes, and a checksum.
//!
//! Written by a StoreSvr leader (`AdminService.Backup`), saved by `seqctl backup`, read by
//! `storesvr restore`. Both ends check it with [`decode`]: `seqctl` before it renames the file into
//! place (so a cut or damaged stream never leaves a file that looks whole), `storesvr restore`
//! before it builds anything from it.
//!
//! Layout, integers little-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 8 | magic `SEQSVRBK` |
//! | 4 | file format version ([`FORMAT_VERSION`]) |
//! | 4 | the StoreSvr data format of the payload (its `FORMAT`; a build restores only its own) |
//! | 8 | set id |
//! | 8 | Raft log index the state reflects (everything committed up to it, nothing after) |
//! | 8 | Raft term of that entry |
//! | 8 | when the leader took it, milliseconds since the Unix epoch (its wall clock) |
//! | 8 | sections in the set |
//! | 8 | payload length |
//! | n | payload: the state machine's `SetState` in postcard (opaque here) |
//! | 4 | CRC-32 (IEEE) of every byte before it |
//!
//! The version is checked before the checksum: a file of another version may lay its bytes out
//! differently, and "wrong version" is the error that tells the operator what to do.
//!
//! Left out on purpose: compression (a default set's file is at most 1.3 MiB) and encryption
//! (the file holds no secret, but it is an admin-only read; keep it where the set's data dirs
//! are kept).

use thiserror::Error;

use crate::limits::MAX_BACKUP_BYTES;

/// First bytes of every backup file.
pub const MAGIC: [u8; 8] = *b"SEQSVRBK";
/// The layout this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Bytes before the payload.
pub const HEADER_BYTES: usize = 8 + 4 + 4 + 6 * 8;
/// Bytes after the payload (the checksum).
pub const TRAILER_BYTES: usize = 4;

/// What a backup file says about itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The StoreSvr data format the payload is encoded in.
    pub state_format: u32,
    pub set_id: u64,
    /// The Raft log index the state reflects.
    pub log_index: u64,
    pub log_term: u64,
    /// The leader's wall clock when it took the backup, ms since the Unix epoch.
    pub taken_at_unix_ms: u64,
    pub sections: u64,
}

/// Why bytes are not a usable backup file.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum BackupFileError {
    #[error(
        "not a backup file: {0} bytes is shorter than the {min}-byte header and checksum",
        min = HEADER_BYTES + TRAILER_BYTES
    )]
    TooShort(usize),
    #[error("not a seqsvr backup file (it does not start with SEQSVRBK)")]
    BadMagic,
    #[error(
        "backup file format version {found}; this build reads version {FORMAT_VERSION} only: restore it with the \
         build that wrote it"
    )]
    WrongVersion { found: u32 },
    #[error("backup file is truncated or has trailing bytes: {found} bytes, the header announces {expected}")]
    WrongLength { found: usize, expected: u128 },
    #[error("backup file is damaged: checksum {found:#010x}, expected {expected:#010x}")]
    BadChecksum { found: u32, expected: u32 },
    #[error("backup file of {0} bytes is above the {MAX_BACKUP_BYTES}-byte limit")]
    TooLarge(usize),
}

/// Builds a whole backup file around `payload`.
pub fn encode(header: &Header, payload: &[u8]) -> Result<Vec<u8>, BackupFileError> {
    let total = HEADER_BYTES + payload.len() + TRAILER_BYTES;
    if total > MAX_BACKUP_BYTES {
        return Err(BackupFileError::TooLarge(total));
    }
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&header.state_format.to_le_bytes());
    for v in [
        header.set_id,
        header.log_index,
        header.log_term,
        header.taken_at_unix_ms,
        header.sections,
        payload.len() as u64,
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(payload);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    debug_assert_eq!(out.len(), total);
    Ok(out)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Checks a whole backup file and splits it into its header and payload.
pub fn decode(file: &[u8]) -> Result<(Header, &[u8]), BackupFileError> {
    if file.len() > MAX_BACKUP_BYTES {
        return Err(BackupFileError::TooLarge(file.len()));
    }
    if file.len() < MAGIC.len() || file[..MAGIC.len()] != MAGIC {
        return Err(BackupFileError::BadMagic);
    }
    if file.len() < HEADER_BYTES + TRAILER_BYTES {
        return Err(BackupFileError::TooShort(file.len()));
    }
    let version = u32_at(file, 8);
    if version != FORMAT_VERSION {
        return Err(BackupFileError::WrongVersion { found: version });
    }
    let payload_len = u64_at(file, HEADER_BYTES - 8);
    let expected = (HEADER_BYTES + TRAILER_BYTES) as u128 + payload_len as u128;
    if file.len() as u128 != expected {
        return Err(BackupFileError::WrongLength {
            found: file.len(),
            expected,
        });
    }
    let body = file.len() - TRAILER_BYTES;
    let (found, expected) = (crc32fast::hash(&file[..body]), u32_at(file, body));
    if found != expected {
        return Err(BackupFileError::BadChecksum { found, expected });
    }
    let header = Header {
        state_format: u32_at(file, 12),
        set_id: u64_at(file, 16),
        log_index: u64_at(file, 24),
        log_term: u64_at(file, 32),
        taken_at_unix_ms: u64_at(file, 40),
        sections: u64_at(file, 48),
    };
    Ok((header, &file[HEADER_BYTES..body]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            state_format: 2,
            set_id: 3,
            log_index: 1234,
            log_term: 7,
            taken_at_unix_ms: 1_700_000_000_000,
            sections: 20,
        }
    }

    #[test]
    fn a_file_round_trips() {
        let file = encode(&header(), b"state bytes").unwrap();
        assert_eq!(file.len(), HEADER_BYTES + 11 + TRAILER_BYTES);
        assert_eq!(decode(&file).unwrap(), (header(), &b"state bytes"[..]));
        let empty = encode(&header(), b"").unwrap();
        assert_eq!(decode(&empty).unwrap().1, b"");
    }

    #[test]
    fn every_truncation_is_refused() {
        let file = encode(&header(), b"some payload of a set").unwrap();
        for len in 0..file.len() {
            let err = decode(&file[..len]).expect_err("a cut file must not decode");
            assert!(
                matches!(
                    err,
                    BackupFileError::BadMagic | BackupFileError::TooShort(_) | BackupFileError::WrongLength { .. }
                ),
                "cut at {len}: {err}"
            );
        }
        let mut longer = file.clone();
        longer.push(0);
        assert!(matches!(decode(&longer), Err(BackupFileError::WrongLength { .. })));
    }

    #[test]
    fn every_flipped_bit_after_the_version_is_caught() {
        let file = encode(&header(), b"payload").unwrap();
        for at in 12..file.len() {
            for bit in 0..8 {
                let mut bad = file.clone();
                bad[at] ^= 1 << bit;
                assert!(decode(&bad).is_err(), "byte {at} bit {bit} flipped went unnoticed");
            }
        }
    }

    #[test]
    fn a_wrong_version_or_magic_says_so() {
        let mut file = encode(&header(), b"payload").unwrap();
        file[8..12].copy_from_slice(&2u32.to_le_bytes());
        assert_eq!(decode(&file), Err(BackupFileError::WrongVersion { found: 2 }));
        let msg = decode(&file).unwrap_err().to_string();
        assert!(msg.contains("version 2"), "{msg}");
        file[0] = b'X';
        assert_eq!(decode(&file), Err(BackupFileError::BadMagic));
        assert_eq!(decode(b"hello"), Err(BackupFileError::BadMagic));
    }

    #[test]
    fn a_huge_announced_length_is_a_length_error_not_an_allocation() {
        let mut file = encode(&header(), b"p").unwrap();
        file[HEADER_BYTES - 8..HEADER_BYTES].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(decode(&file), Err(BackupFileError::WrongLength { .. })));
    }
}
