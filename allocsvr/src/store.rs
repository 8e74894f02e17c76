//! What the AllocSvr needs of its set's StoreSvr group, as a trait: the five calls of the ownership
//! protocol, each with the longest time it may take.
//!
//! The background tasks talk to this trait, not to a gRPC client, so that they can be driven by an
//! in-process store on paused tokio time (the tests of `tasks`) as well as by the real
//! leader-following client over the network ([`StoreClient`]).
//!
//! [`Bound`] wraps any store and binds the node's calls to its registration: it draws a secret
//! for each registration and sends it with every Renew, Release, Bump and RaiseMarks of that incarnation, so
//! that nobody who did not see the Register can act in the node's name (docs/DESIGN.md, rule 1).
//!
//! Deliberately left out: routing to the leader and retrying on another replica, which belong to
//! the client behind the trait; and any call an AllocSvr does not make (status, routes, admin).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
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
    fn raise_marks(&self, req: pb::RaiseMarksRequest, wait: Duration) -> Call<'_, pb::RaiseMarksReply>;
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

    fn raise_marks(&self, req: pb::RaiseMarksRequest, wait: Duration) -> Call<'_, pb::RaiseMarksReply> {
        Box::pin(async move { within(self, Some(wait)).raise_marks(req).await.map_err(failure) })
    }
}

/// A registration's secret: 128 random bits.
type Secret = [u8; seqsvr_proto::limits::MIN_SECRET_BYTES];

/// The secrets a [`Bound`] store holds, in memory only: the one drawn for the registration under
/// way (by its nonce: every retry of one registration sends the same secret, so a retry that
/// lands after an earlier attempt committed matches the hash the store kept), and the one of the
/// incarnation in use.
#[derive(Default)]
struct Keys {
    registering: Option<(u64, Secret)>,
    current: Option<(u64, Secret)>,
}

/// A [`Store`] whose every call after Register carries the secret the incarnation registered with.
/// A restarted process is a new `Bound` with no secret: it registers anew, as it always did.
pub struct Bound {
    inner: Arc<dyn Store>,
    keys: Mutex<Keys>,
}

impl Bound {
    pub fn new(inner: Arc<dyn Store>) -> Self {
        Self {
            inner,
            keys: Mutex::new(Keys::default()),
        }
    }

    fn keys(&self) -> std::sync::MutexGuard<'_, Keys> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The secret of the registration with `nonce`, drawn on its first attempt.
    fn for_registration(&self, nonce: u64) -> Secret {
        let mut keys = self.keys();
        match keys.registering {
            Some((n, secret)) if n == nonce => secret,
            _ => {
                let secret: Secret = rand::random();
                keys.registering = Some((nonce, secret));
                secret
            }
        }
    }

    /// The secret of `incarnation`; none for an earlier one (the store has superseded it, and
    /// answers its late calls as it always did).
    fn of(&self, incarnation: u64) -> Vec<u8> {
        match self.keys().current {
            Some((i, secret)) if i == incarnation => secret.to_vec(),
            _ => Vec::new(),
        }
    }
}

impl Store for Bound {
    fn register(&self, mut req: pb::RegisterRequest) -> Call<'_, pb::RegisterReply> {
        let secret = self.for_registration(req.nonce);
        req.secret = secret.to_vec();
        Box::pin(async move {
            let reply = self.inner.register(req).await?;
            self.keys().current = Some((reply.incarnation, secret));
            Ok(reply)
        })
    }

    fn renew(&self, mut req: pb::RenewRequest, wait: Duration) -> Call<'_, pb::RenewReply> {
        req.secret = self.of(req.incarnation);
        self.inner.renew(req, wait)
    }

    fn release(&self, mut req: pb::ReleaseRequest, wait: Option<Duration>) -> Call<'_, pb::ReleaseReply> {
        req.secret = self.of(req.incarnation);
        self.inner.release(req, wait)
    }

    fn bump(&self, mut req: pb::BumpRequest, wait: Duration) -> Call<'_, pb::BumpReply> {
        req.secret = self.of(req.incarnation);
        self.inner.bump(req, wait)
    }

    fn load(&self, req: pb::LoadRequest) -> Call<'_, pb::LoadReply> {
        self.inner.load(req)
    }

    fn raise_marks(&self, mut req: pb::RaiseMarksRequest, wait: Duration) -> Call<'_, pb::RaiseMarksReply> {
        req.secret = self.of(req.incarnation);
        self.inner.raise_marks(req, wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records every request's incarnation and secret; answers Register with the next
    /// incarnation, unless told to lose the reply.
    #[derive(Default)]
    struct Recorder {
        seen: Mutex<Vec<(&'static str, u64, Vec<u8>)>>,
        lose_register_reply: std::sync::atomic::AtomicBool,
    }

    impl Recorder {
        fn note(&self, call: &'static str, incarnation: u64, secret: &[u8]) {
            self.seen.lock().unwrap().push((call, incarnation, secret.to_vec()));
        }
    }

    impl Store for Recorder {
        fn register(&self, req: pb::RegisterRequest) -> Call<'_, pb::RegisterReply> {
            self.note("register", req.nonce, &req.secret);
            let lost = self
                .lose_register_reply
                .swap(false, std::sync::atomic::Ordering::Relaxed);
            let incarnation = self.seen.lock().unwrap().len() as u64;
            Box::pin(async move {
                if lost {
                    return Err(StoreFailure::Unknown("reply lost".into()));
                }
                Ok(pb::RegisterReply {
                    incarnation,
                    ..Default::default()
                })
            })
        }
        fn renew(&self, req: pb::RenewRequest, _: Duration) -> Call<'_, pb::RenewReply> {
            self.note("renew", req.incarnation, &req.secret);
            Box::pin(async { Ok(pb::RenewReply::default()) })
        }
        fn release(&self, req: pb::ReleaseRequest, _: Option<Duration>) -> Call<'_, pb::ReleaseReply> {
            self.note("release", req.incarnation, &req.secret);
            Box::pin(async { Ok(pb::ReleaseReply::default()) })
        }
        fn bump(&self, req: pb::BumpRequest, _: Duration) -> Call<'_, pb::BumpReply> {
            self.note("bump", req.incarnation, &req.secret);
            Box::pin(async { Ok(pb::BumpReply::default()) })
        }
        fn load(&self, _: pb::LoadRequest) -> Call<'_, pb::LoadReply> {
            Box::pin(async { Ok(pb::LoadReply::default()) })
        }
        fn raise_marks(&self, req: pb::RaiseMarksRequest, _: Duration) -> Call<'_, pb::RaiseMarksReply> {
            self.note("raise_marks", req.incarnation, &req.secret);
            Box::pin(async { Ok(pb::RaiseMarksReply::default()) })
        }
    }

    fn register(nonce: u64) -> pb::RegisterRequest {
        pb::RegisterRequest {
            node_id: 1,
            addr: "a:1".into(),
            nonce,
            secret: Vec::new(),
        }
    }

    async fn calls_of(store: &Bound, incarnation: u64) {
        let renew = pb::RenewRequest {
            incarnation,
            ..Default::default()
        };
        let release = pb::ReleaseRequest {
            incarnation,
            leaving: true,
            ..Default::default()
        };
        let bump = pb::BumpRequest {
            incarnation,
            ..Default::default()
        };
        store.renew(renew, Duration::from_secs(1)).await.unwrap();
        store.release(release, None).await.unwrap();
        store.bump(bump, Duration::from_secs(1)).await.unwrap();
    }

    #[tokio::test]
    async fn every_call_carries_the_secret_its_incarnation_registered_with() {
        let inner = Arc::new(Recorder::default());
        let store = Bound::new(inner.clone());
        inner
            .lose_register_reply
            .store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(
            store.register(register(9)).await.is_err(),
            "the first attempt's reply is lost"
        );
        let first = store.register(register(9)).await.unwrap().incarnation;
        calls_of(&store, first).await;
        let second = store.register(register(10)).await.unwrap().incarnation;
        calls_of(&store, second).await;
        calls_of(&store, first).await;

        let seen = inner.seen.lock().unwrap().clone();
        let secret = |i: usize| seen[i].2.clone();
        assert_eq!(secret(0).len(), 16, "128 random bits");
        assert_eq!(
            secret(0),
            secret(1),
            "a retry of one registration sends the same secret"
        );
        let of = |range: std::ops::Range<usize>| seen[range].iter().map(|c| c.2.clone()).collect::<Vec<_>>();
        assert_eq!(of(2..5), vec![secret(0); 3], "the first incarnation's calls");
        assert_ne!(secret(5), secret(0), "a new registration draws a new secret");
        assert_eq!(of(6..9), vec![secret(5); 3], "the second incarnation's calls");
        assert_eq!(
            of(9..12),
            vec![Vec::<u8>::new(); 3],
            "a superseded incarnation's calls carry none"
        );
    }
}
