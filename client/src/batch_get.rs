//! Batched reads: the last value of many uids and named counters in one call ([`Client::batch_get`]),
//! sent as one `BatchGet` per owner (of at most [`crate::MAX_UIDS_PER_RPC`] items) rather than one
//! `GetCurSeq` or `CounterGet` per item. A Redis `MGET` of 1,000 names is the caller it was made
//! for: it cost one forwarded RPC per name.
//!
//! The rounds are the batch fetch's (`batch`): items grouped by owner, NOT_OWNER and NOT_READY
//! items asked again in the next round under the newest route table, each item answered on its
//! own. A read takes nothing, so an item that gets no value ends `Failed`, never `Unknown`.
//!
//! Deliberately left out: reading at one instant. Each item is read when its owner answers it,
//! as a loop of single reads would; the items of one call are not a snapshot.

use tokio::time::Instant;

use crate::batch::{Items, MAX_UIDS_PER_CALL, Subject};
use crate::client::{Client, Owner};
use crate::error::{ClientError, FailureKind};

/// One item's answer of [`Client::batch_get`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Current {
    /// The last value handed out, or a ceiling above it after an ownership change (P5); 0 if
    /// none ever was.
    pub value: u64,
    /// Who answered, when the server said.
    pub owner: Option<Owner>,
}

impl Client {
    /// The last value of every uid and key in `subjects`, one result per item in request order,
    /// each as its single read ([`Client::get_cur_seq`], [`Client::counter_get`]) would answer
    /// it, in one `BatchGet` per owner.
    ///
    /// The outer error is for the call as a whole, and nothing was sent: more than
    /// [`MAX_UIDS_PER_CALL`] items, a uid outside the cached table, a key that is not 1 to 256
    /// bytes.
    pub async fn batch_get(&self, subjects: &[Subject<'_>]) -> Result<Vec<Result<Current, ClientError>>, ClientError> {
        if subjects.len() > MAX_UIDS_PER_CALL {
            return Err(ClientError::failed(
                FailureKind::InvalidArgument,
                format!("{} items in one call; at most {MAX_UIDS_PER_CALL}", subjects.len()),
            ));
        }
        let limit = self.routes().uid_limit();
        for subject in subjects {
            match *subject {
                Subject::Uid(uid) => {
                    if let Some(limit) = limit
                        && uid.0 >= limit
                    {
                        return Err(ClientError::failed(
                            FailureKind::InvalidArgument,
                            format!("uid {uid} is outside [0, {limit})"),
                        ));
                    }
                }
                Subject::Key(key) => {
                    if let Err(e) = seqsvr_proto::keys::check_key_str(key) {
                        return Err(ClientError::failed(FailureKind::InvalidArgument, e.to_string()));
                    }
                }
            }
        }
        let deadline = Instant::now() + self.inner.cfg.deadline;
        let results = self.batch_fetch_until(Items::Reads(subjects), deadline).await;
        Ok(results
            .into_iter()
            .map(|r| {
                r.map(|f| Current {
                    value: f.seq,
                    owner: f.owner,
                })
            })
            .collect())
    }
}
