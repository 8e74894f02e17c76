//! `AdminService.Backup`: the set's applied state as a backup file, streamed in chunks.
//!
//! On the leader only, after a ReadIndex (`ensure_linearizable`): the state copied afterwards
//! holds every write committed before the call began, so a backup never misses a bump that was
//! acknowledged before it was asked for. The state is encoded under the state lock in one go (a
//! few milliseconds for a default set; applying waits that long), which is what makes the copy
//! one point in the log rather than a mix of two.
//!
//! Left out: incremental backups, and a backup from a follower (it could be behind the leader by
//! any amount; a backup is only useful as the newest state one can get).

use std::pin::Pin;
use std::time::{SystemTime, UNIX_EPOCH};

use futures::Stream;
use seqsvr_proto::backup::BackupFileError;
use seqsvr_proto::limits::BACKUP_CHUNK_BYTES;
use seqsvr_proto::pb;
use tonic::Status;

use crate::backup::{BackupError, capture};
use crate::error::RpcError;
use crate::replica::{Led, ReplicaState};

/// The chunks of one backup, as the gRPC server sends them.
pub type BackupStream = Pin<Box<dyn Stream<Item = Result<pb::BackupChunk, Status>> + Send>>;

/// Takes a backup on the leader and returns its chunks (or one chunk naming the leader).
pub async fn backup(ctx: &ReplicaState) -> Result<BackupStream, RpcError> {
    let file = match take(ctx).await? {
        Led::Here(file) => file,
        Led::Elsewhere(hint) => {
            let chunk = pb::BackupChunk {
                not_leader: Some(hint),
                ..Default::default()
            };
            return Ok(Box::pin(futures::stream::iter([Ok(chunk)])));
        }
    };
    Ok(Box::pin(futures::stream::iter(chunks(file).into_iter().map(Ok))))
}

/// The file cut into chunks of at most [`BACKUP_CHUNK_BYTES`]; the first says the total size.
fn chunks(file: Vec<u8>) -> Vec<pb::BackupChunk> {
    let total = file.len() as u64;
    file.chunks(BACKUP_CHUNK_BYTES)
        .enumerate()
        .map(|(i, data)| pb::BackupChunk {
            not_leader: None,
            data: data.to_vec(),
            total_bytes: if i == 0 { total } else { 0 },
        })
        .collect()
}

async fn take(ctx: &ReplicaState) -> Result<Led<Vec<u8>>, RpcError> {
    if let Led::Elsewhere(hint) = ctx.linearizable().await? {
        return Ok(Led::Elsewhere(hint));
    }
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let file = ctx.data(|d| capture(d, now_ms)).map_err(|e| match e {
        BackupError::NotInitialized | BackupError::File(BackupFileError::TooLarge(_)) => {
            RpcError::FailedPrecondition(e.to_string())
        }
        other => RpcError::Internal(other.to_string()),
    })?;
    tracing::info!(bytes = file.len(), "backup taken");
    Ok(Led::Here(file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_file_in_order_and_the_first_gives_its_size() {
        let file: Vec<u8> = (0..BACKUP_CHUNK_BYTES * 2 + 5).map(|i| i as u8).collect();
        let got = chunks(file.clone());
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].total_bytes, file.len() as u64);
        assert!(got[1..].iter().all(|c| c.total_bytes == 0));
        assert!(got.iter().all(|c| c.data.len() <= BACKUP_CHUNK_BYTES));
        assert_eq!(got.into_iter().flat_map(|c| c.data).collect::<Vec<_>>(), file);
    }
}
