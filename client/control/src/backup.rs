//! The `Backup` stream of a set's leader, read whole: [`BackupClient::backup`] returns the bytes of
//! the backup file, checked for length as they arrive (the file's own checksum is checked by the
//! caller with `seqsvr_proto::backup::decode` before it keeps anything).
//!
//! A stream that ends early or sends more than it announced is a failed attempt (DATA_LOSS),
//! retried like any other until the call's deadline: a backup changes nothing, so a retry is
//! always safe. One that announces more than `limits::MAX_BACKUP_BYTES` is refused at once.
//!
//! Left out: resuming a cut stream from where it stopped (each attempt takes a new backup, at a
//! newer point, which is what an operator wants anyway).

use seqsvr_proto::limits::{BACKUP_CHUNK_BYTES, MAX_BACKUP_BYTES, STORE_MESSAGE_BYTES};
use seqsvr_proto::pb;
use seqsvr_proto::pb::admin_service_client::AdminServiceClient;
use tonic::{Request, Response, Status, Streaming};

use crate::leader::{ControlError, Leader, LeaderCall, Seed, StoreTimeouts};
use seqsvr_rpc::transport::{Conn, Dialer};

/// One attempt's result: the whole file, or where the leader is.
#[derive(Debug, Clone, Default)]
pub struct BackupDownload {
    pub not_leader: Option<pb::LeaderHint>,
    pub file: Vec<u8>,
}

impl LeaderCall for pb::BackupRequest {
    type Reply = BackupDownload;

    async fn send(channel: Conn, req: Request<Self>) -> Result<Response<BackupDownload>, Status> {
        let stream = AdminServiceClient::new(channel)
            .max_decoding_message_size(STORE_MESSAGE_BYTES)
            .max_encoding_message_size(STORE_MESSAGE_BYTES)
            .backup(req)
            .await?
            .into_inner();
        collect(stream).await.map(Response::new)
    }

    fn hint(reply: &BackupDownload) -> Option<&pb::LeaderHint> {
        reply.not_leader.as_ref()
    }
}

/// Reads every chunk of one stream, checking sizes as they come.
async fn collect(mut stream: Streaming<pb::BackupChunk>) -> Result<BackupDownload, Status> {
    let mut file = Vec::new();
    let mut total: Option<usize> = None;
    while let Some(chunk) = stream.message().await? {
        if chunk.not_leader.is_some() {
            return Ok(BackupDownload {
                not_leader: chunk.not_leader,
                file: Vec::new(),
            });
        }
        let want = match total {
            Some(t) => t,
            None => {
                let t = usize::try_from(chunk.total_bytes).unwrap_or(usize::MAX);
                if t > MAX_BACKUP_BYTES {
                    return Err(Status::failed_precondition(format!(
                        "the leader announced a backup of {} bytes, above the {MAX_BACKUP_BYTES}-byte limit",
                        chunk.total_bytes
                    )));
                }
                file.reserve_exact(t);
                *total.insert(t)
            }
        };
        if chunk.data.len() > BACKUP_CHUNK_BYTES || file.len() + chunk.data.len() > want {
            return Err(Status::data_loss(format!(
                "the backup stream sent more than the {want} bytes it announced"
            )));
        }
        file.extend_from_slice(&chunk.data);
    }
    let want = total.unwrap_or(0);
    if file.is_empty() || file.len() != want {
        return Err(Status::data_loss(format!(
            "the backup stream ended after {} of {want} bytes",
            file.len()
        )));
    }
    Ok(BackupDownload { not_leader: None, file })
}

/// Takes backups of one set through its leader.
#[derive(Debug, Clone)]
pub struct BackupClient {
    leader: Leader,
}

impl BackupClient {
    /// A client over `seeds`; `timeouts.attempt` bounds one whole stream, so give it the time a
    /// backup of the set's size takes to travel.
    pub fn new(seeds: Vec<Seed>, timeouts: StoreTimeouts) -> Result<Self, String> {
        Self::with_dialer(seeds, timeouts, &Dialer::default())
    }

    /// The same, over the transport `dialer` opens.
    pub fn with_dialer(seeds: Vec<Seed>, timeouts: StoreTimeouts, dialer: &Dialer) -> Result<Self, String> {
        Ok(Self {
            leader: Leader::with_dialer(seeds, timeouts, dialer)?,
        })
    }

    /// The bytes of a backup file the leader took after a ReadIndex.
    pub async fn backup(&self) -> Result<Vec<u8>, ControlError> {
        Ok(self.leader.call(pb::BackupRequest {}).await?.file)
    }
}
