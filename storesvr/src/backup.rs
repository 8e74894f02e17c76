//! A set's backup file, from this crate's side: [`capture`] turns the applied state into the file
//! bytes (the `Backup` RPC streams them) and [`read`] turns a file back into a [`SetState`]
//! (`storesvr restore`). The layout and its checks are `seqsvr_proto::backup`'s; the payload is
//! the state machine's `SetState` in postcard, the encoding its snapshots use.
//!
//! The point a backup reflects is the applied state at one log index: the caller takes it under
//! the state lock after a ReadIndex, so it holds everything committed before the call began and
//! nothing half-applied.
//!
//! Left out: reading a payload of another data format. A backup is restored by a build with the
//! same `DATA_FORMAT` as the one that took it; a newer build refuses it with that error rather
//! than guessing at the bytes.

use seqsvr_proto::backup::{self, BackupFileError, Header};
use thiserror::Error;

use crate::domain::state::SetState;
use crate::startup::DATA_FORMAT;
use crate::storage::sm_store::SmData;

/// Why a backup could not be taken or read.
#[derive(Debug, Error)]
pub enum BackupError {
    #[error("{0}")]
    File(#[from] BackupFileError),
    #[error(
        "the backup's state is in data format {found}; this storesvr reads format {DATA_FORMAT} only: restore it \
         with the build that took it"
    )]
    StateFormat { found: u32 },
    #[error("the backup's state does not decode ({0}): the file is not from a storesvr of this data format")]
    Decode(String),
    #[error("the backup's state is inconsistent: {0}")]
    Inconsistent(String),
    #[error("the set is not initialized yet: there is nothing to back up")]
    NotInitialized,
    #[error("cannot encode the state: {0}")]
    Encode(String),
}

/// The backup file of the applied state `data`, stamped `now_unix_ms` (the leader's wall clock;
/// it only dates the file, nothing is computed from it but the margin an operator may derive).
pub fn capture(data: &SmData, now_unix_ms: u64) -> Result<Vec<u8>, BackupError> {
    let params = data.set.params.as_ref().ok_or(BackupError::NotInitialized)?;
    let payload = postcard::to_stdvec(&data.set).map_err(|e| BackupError::Encode(e.to_string()))?;
    let (log_index, log_term) = data.last_applied.map_or((0, 0), |l| (l.index, l.leader_id.term));
    let header = Header {
        state_format: DATA_FORMAT,
        set_id: params.set_id,
        log_index,
        log_term,
        taken_at_unix_ms: now_unix_ms,
        sections: data.set.sections.len() as u64,
    };
    Ok(backup::encode(&header, &payload)?)
}

/// Checks a backup file and decodes the state in it.
pub fn read(file: &[u8]) -> Result<(Header, SetState), BackupError> {
    let (header, payload) = backup::decode(file)?;
    if header.state_format != DATA_FORMAT {
        return Err(BackupError::StateFormat {
            found: header.state_format,
        });
    }
    // A backup written before a field was added to the state is read with it empty.
    let set: SetState =
        crate::storage::sm_store::decode_padded(payload).map_err(|e| BackupError::Decode(e.to_string()))?;
    check(&header, &set)?;
    Ok((header, set))
}

/// The header and the state must tell the same story (a file built by hand could disagree).
fn check(header: &Header, set: &SetState) -> Result<(), BackupError> {
    let params = set.params.as_ref().ok_or(BackupError::NotInitialized)?;
    params
        .validate()
        .map_err(|e| BackupError::Inconsistent(format!("parameters: {} {}", e.field, e.why)))?;
    if params.set_id != header.set_id {
        return Err(BackupError::Inconsistent(format!(
            "header names set {}, the state set {}",
            header.set_id, params.set_id
        )));
    }
    let want = params.total_sections();
    if set.sections.len() as u64 != want || header.sections != want {
        return Err(BackupError::Inconsistent(format!(
            "{} sections in the state and {} in the header, the parameters give {want}",
            set.sections.len(),
            header.sections
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::testing::set_with;
    use openraft::{CommittedLeaderId, LogId};

    fn data() -> SmData {
        let (set, _) = set_with(&[1, 2]);
        SmData {
            last_applied: Some(LogId::new(CommittedLeaderId::new(4, 1), 77)),
            set,
            ..Default::default()
        }
    }

    #[test]
    fn a_captured_state_reads_back_with_its_log_point() {
        let d = data();
        let file = capture(&d, 1_234).unwrap();
        let (h, set) = read(&file).unwrap();
        assert_eq!(set, d.set);
        assert_eq!(
            (h.set_id, h.log_index, h.log_term, h.taken_at_unix_ms),
            (0, 77, 4, 1_234)
        );
        assert_eq!(h.sections, 10);
    }

    #[test]
    fn an_uninitialized_set_is_not_backed_up() {
        assert!(matches!(
            capture(&SmData::default(), 1),
            Err(BackupError::NotInitialized)
        ));
    }

    #[test]
    fn another_data_format_or_a_lying_header_is_refused() {
        let d = data();
        let payload = postcard::to_stdvec(&d.set).unwrap();
        let header = Header {
            state_format: DATA_FORMAT,
            set_id: 0,
            log_index: 1,
            log_term: 1,
            taken_at_unix_ms: 1,
            sections: 10,
        };
        let with = |h: Header, p: &[u8]| read(&backup::encode(&h, p).unwrap()).map(|_| ());
        assert!(with(header, &payload).is_ok());
        let old = Header {
            state_format: 1,
            ..header
        };
        assert!(matches!(
            with(old, &payload),
            Err(BackupError::StateFormat { found: 1 })
        ));
        let other_set = Header { set_id: 5, ..header };
        assert!(matches!(with(other_set, &payload), Err(BackupError::Inconsistent(_))));
        let fewer = Header { sections: 9, ..header };
        assert!(matches!(with(fewer, &payload), Err(BackupError::Inconsistent(_))));
        assert!(matches!(
            with(header, &payload[..payload.len() / 2]),
            Err(BackupError::Decode(_))
        ));
        // Two bytes: one 0 alone reads as an empty ledger map, the field written last.
        let mut longer = payload.clone();
        longer.extend([0, 0]);
        assert!(matches!(with(header, &longer), Err(BackupError::Decode(_))));
    }
}
