//! What the AllocSvr needs of its set's StoreSvr group, as a trait: the five calls of the ownership
//! protocol, each with the longest time it may take.
//!
//! The background tasks talk to this trait, not to a gRPC client, so that they can be driven by an
//! in-process store on paused tokio time (the tests of `tasks`) as well as by the real
//! leader-following client over the network ([`StoreClient`]).
//!
//! Deliberately left out: routing to the leader and retrying on another replica, which belong to
//! the client behind the trait; and any call an AllocSvr does not make (status, routes, admin).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use seqsvr_control::{ControlError, StoreClient, StoreTimeouts};
use seqsvr_proto::pb;

/// A call's future, boxed so that the trait can be used as `dyn Store`.
pub type Call<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreFailure>> + Send + 'a>>;

/// Why a store call did not succeed, named by what the caller does next.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreFailure {
    /// No answer in time: the outcome of a write is unknown; retry it unchanged.
    #[error("store unavailable: {0}")]
    Unknown(String),
    /// The store refused the request; resending it would not help.
    #[error("store refused the request: {0}")]
    Refused(String),
}

/// The StoreService calls of the ownership protocol. `wait` bounds the whole call (all attempts);
/// `None` leaves the client's own deadlines.
pub trait Store: Send + Sync + 'static {
    fn register(&self, req: pb::RegisterRequest) -> Call<'_, pb::RegisterReply>;
    fn renew(&self, req: pb::RenewRequest, wait: Duration) -> Call<'_, pb::RenewReply>;
    fn release(&self, req: pb::ReleaseRequest, wait: Option<Duration>) -> Call<'_, pb::ReleaseReply>;
    fn bump(&self, req: pb::BumpRequest, wait: Duration) -> Call<'_, pb::BumpReply>;
    fn load(&self, req: pb::LoadRequest) -> Call<'_, pb::LoadReply>;
}

fn failure(e: ControlError) -> StoreFailure {
    match e {
        ControlError::Rejected(status) => StoreFailure::Refused(status.to_string()),
        e @ ControlError::Unavailable { .. } => StoreFailure::Unknown(e.to_string()),
    }
}

/// One window for the whole call: a single attempt that may take all of it.
fn within(client: &StoreClient, wait: Option<Duration>) -> StoreClient {
    match wait {
        Some(w) => client.with_timeouts(StoreTimeouts { attempt: w, overall: w }),
        None => client.clone(),
    }
}

impl Store for StoreClient {
    fn register(&self, req: pb::RegisterRequest) -> Call<'_, pb::RegisterReply> {
        Box::pin(async move { StoreClient::register(self, req).await.map_err(failure) })
    }

    fn renew(&self, req: pb::RenewRequest, wait: Duration) -> Call<'_, pb::RenewReply> {
        Box::pin(async move { within(self, Some(wait)).renew(req).await.map_err(failure) })
    }

    fn release(&self, req: pb::ReleaseRequest, wait: Option<Duration>) -> Call<'_, pb::ReleaseReply> {
        Box::pin(async move { within(self, wait).release(req).await.map_err(failure) })
    }

    fn bump(&self, req: pb::BumpRequest, wait: Duration) -> Call<'_, pb::BumpReply> {
        Box::pin(async move { within(self, Some(wait)).bump(req).await.map_err(failure) })
    }

    fn load(&self, req: pb::LoadRequest) -> Call<'_, pb::LoadReply> {
        Box::pin(async move { StoreClient::load(self, req).await.map_err(failure) })
    }
}
