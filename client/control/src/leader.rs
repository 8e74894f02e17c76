//! The one leader-following loop of the control plane.
//!
//! Writes and linearizable reads must reach the leader of a set's Raft group, and so must admin
//! actions. [`Leader`] keeps one lazily connected [`Conn`] per StoreSvr address, remembers
//! which one answered as leader last, and on a reply carrying `not_leader` follows the hint: to
//! the *configured* address of the hinted node id when it knows that id (the simulator puts
//! proxies in front of every StoreSvr, so the hint's own `leader_addr` would bypass them), else to
//! `leader_addr`, else to the next seed after a jittered backoff. Transport errors and timeouts
//! rotate to the next seed the same way. At most [`FREE_HOPS`] hints are followed in a row before
//! backing off (two replicas that both believe the other leads must not ping-pong).
//!
//! Every attempt has its own deadline and the whole call an overall one. What a gRPC error means is
//! decided by `classify`: a refusal is returned at once as [`ControlError::Rejected`]; anything else
//! is retried until the deadline, then returned as [`ControlError::Unavailable`], which says whether
//! an attempt may have taken effect (`maybe_taken`) — it never means "did not happen".
//!
//! Deliberately left out: connection pooling beyond one channel per address, request hedging, and
//! any knowledge of what the replies mean (see `store` and `admin`).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;
use seqsvr_proto::NodeId;
use seqsvr_proto::addr::HostPort;
use seqsvr_proto::pb;
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use seqsvr_rpc::classify::{Delivery, classify};
use seqsvr_rpc::transport::{Conn, Dialer};

/// Most addresses learnt from hints that are kept beside the seeds; bounds memory when hints
/// point at ever new addresses.
const MAX_LEARNT_ADDRS: usize = 8;
/// First backoff after a seed failed or the leader was unknown.
const BACKOFF_MIN: Duration = Duration::from_millis(20);
/// Upper bound of the backoff between rounds.
const BACKOFF_MAX: Duration = Duration::from_millis(500);
/// Hints followed in a row without backoff.
pub const FREE_HOPS: u32 = 3;

/// Why a control-plane call failed.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// No leader answered before the overall deadline. With `maybe_taken` an attempt may have been
    /// applied: the outcome of a write is unknown.
    #[error("store unavailable: {last}")]
    Unavailable {
        /// What the last attempt saw, for logs.
        last: String,
        /// Some attempt may have reached a replica that applied it.
        maybe_taken: bool,
    },
    /// The store refused the request itself; resending it anywhere would not help.
    #[error("store rejected the request: {0}")]
    Rejected(Status),
}

/// One StoreSvr address as configured: `host:port` or `id=host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seed {
    /// StoreSvr node id, when the operator named it; lets hints map to this address.
    pub node_id: Option<NodeId>,
    /// `host:port` (no scheme).
    pub addr: String,
}

impl Seed {
    /// Parses `host:port` or `id=host:port`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let (node_id, addr) = match s.split_once('=') {
            Some((id, addr)) => {
                let id: u64 = id
                    .trim()
                    .parse()
                    .map_err(|_| format!("store seed {s:?}: node id {id:?} is not a number"))?;
                if id == 0 {
                    return Err(format!("store seed {s:?}: node id must be > 0"));
                }
                (Some(NodeId(id)), addr)
            }
            None => (None, s),
        };
        let addr: HostPort = addr.parse().map_err(|e| format!("store seed {s:?}: {e}"))?;
        Ok(Self {
            node_id,
            addr: addr.to_string(),
        })
    }

    /// Parses a comma-separated list of seeds; at least one is required.
    pub fn parse_list(s: &str) -> Result<Vec<Self>, String> {
        let seeds: Vec<Seed> = s
            .split(',')
            .filter(|p| !p.trim().is_empty())
            .map(Seed::parse)
            .collect::<Result<_, _>>()?;
        if seeds.is_empty() {
            return Err("no store address given".into());
        }
        Ok(seeds)
    }
}

/// Deadlines of a control-plane client.
#[derive(Debug, Clone, Copy)]
pub struct StoreTimeouts {
    /// Longest wait for one reply from one replica.
    pub attempt: Duration,
    /// Longest time one call may take across all attempts.
    pub overall: Duration,
}

impl Default for StoreTimeouts {
    fn default() -> Self {
        Self {
            attempt: Duration::from_secs(1),
            overall: Duration::from_secs(5),
        }
    }
}

/// One control-plane RPC: how to send it on a channel and where its reply says "not the leader".
pub trait LeaderCall: Clone + Send + Sync + 'static {
    type Reply: Send;
    fn send(channel: Conn, req: Request<Self>) -> impl Future<Output = Result<Response<Self::Reply>, Status>> + Send;
    fn hint(reply: &Self::Reply) -> Option<&pb::LeaderHint>;
    /// A status that ends the call at once although `classify` would retry it: one that says
    /// every replica of this group will answer the same, so the caller must look elsewhere (a
    /// ledger whose section left the set). None by default.
    fn ends_call(_status: &Status) -> bool {
        false
    }
}

struct Target {
    node_id: Option<NodeId>,
    addr: String,
    channel: Conn,
}

struct Targets {
    /// Seeds first (in configured order), then addresses learnt from hints.
    list: Mutex<Vec<Target>>,
    seed_count: usize,
    /// Index into `list` of the replica believed to lead.
    leader: AtomicUsize,
    dialer: Dialer,
    /// Backoff jitter (seeded in the simulator, so that a run replays).
    rng: Mutex<StdRng>,
}

/// The replicas of one group and the loop that finds its leader; cheap to clone (clones share
/// channels and the believed leader).
#[derive(Clone)]
pub struct Leader {
    targets: Arc<Targets>,
    timeouts: StoreTimeouts,
}

impl std::fmt::Debug for Leader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = self.targets.list.lock().unwrap();
        let addrs: Vec<&str> = list.iter().map(|t| t.addr.as_str()).collect();
        f.debug_struct("Leader")
            .field("targets", &addrs)
            .field("leader", &self.targets.leader.load(Ordering::Relaxed))
            .field("timeouts", &self.timeouts)
            .finish()
    }
}

/// What one attempt left the loop with.
enum Next {
    /// Follow a hint at once.
    Hop(usize),
    /// Back off, then try this replica.
    Retry(usize),
}

impl Leader {
    /// A loop over the given seeds; no connection is made until the first call.
    pub fn new(seeds: Vec<Seed>, timeouts: StoreTimeouts) -> Result<Self, String> {
        Self::with_dialer(seeds, timeouts, &Dialer::default())
    }

    /// The same, over the transport `dialer` opens.
    pub fn with_dialer(seeds: Vec<Seed>, timeouts: StoreTimeouts, dialer: &Dialer) -> Result<Self, String> {
        if seeds.is_empty() {
            return Err("no store address given".into());
        }
        let mut list = Vec::with_capacity(seeds.len());
        for seed in seeds {
            let channel = dialer.dial(&seed.addr, timeouts.attempt)?;
            list.push(Target {
                node_id: seed.node_id,
                addr: seed.addr,
                channel,
            });
        }
        let seed_count = list.len();
        Ok(Self {
            targets: Arc::new(Targets {
                list: Mutex::new(list),
                seed_count,
                leader: AtomicUsize::new(0),
                rng: Mutex::new(dialer.rng()),
                dialer: dialer.clone(),
            }),
            timeouts,
        })
    }

    /// The same replicas (shared channels and leader) with other deadlines.
    pub fn with_timeouts(&self, timeouts: StoreTimeouts) -> Self {
        Self {
            targets: self.targets.clone(),
            timeouts,
        }
    }

    /// Address of the replica currently believed to lead (for logs and tests).
    pub fn believed_leader(&self) -> String {
        let list = self.targets.list.lock().unwrap();
        let i = self.targets.leader.load(Ordering::Relaxed).min(list.len() - 1);
        list[i].addr.clone()
    }

    /// Sends `req` to the leader, following hints and rotating seeds until the overall deadline.
    pub async fn call<R: LeaderCall>(&self, req: R) -> Result<R::Reply, ControlError> {
        let deadline = Instant::now() + self.timeouts.overall;
        let mut backoff = BACKOFF_MIN;
        let mut hops = 0u32;
        let mut i = self.targets.leader.load(Ordering::Relaxed);
        let mut last = String::from("no attempt made");
        let mut had_failure = false;
        let mut maybe_taken = false;
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Err(ControlError::Unavailable { last, maybe_taken });
            }
            let attempt = self.timeouts.attempt.min(deadline - now);
            let (idx, channel) = self.channel_at(i);
            i = idx;
            let mut request = Request::new(req.clone());
            request.set_timeout(attempt);
            let result = tokio::time::timeout(attempt, R::send(channel, request)).await;
            // An attempt the overall deadline cut short says only that time ran out; an earlier
            // attempt's error (a cut stream, a refusal to retry) is what the operator needs.
            let cut_short = attempt < self.timeouts.attempt && Instant::now() >= deadline;
            let mut note_failure = |this: String| {
                last = if cut_short && had_failure {
                    format!(
                        "{last} (the last attempt, to {}, was cut short by the deadline)",
                        self.describe(i)
                    )
                } else {
                    this
                };
                had_failure = true;
            };
            let next = match result {
                Ok(Ok(reply)) => {
                    let reply = reply.into_inner();
                    match R::hint(&reply) {
                        None => {
                            self.targets.leader.store(i, Ordering::Relaxed);
                            return Ok(reply);
                        }
                        Some(hint) => {
                            last = format!(
                                "{} is not the leader (hint: id {} addr {:?})",
                                self.describe(i),
                                hint.leader_id,
                                hint.leader_addr
                            );
                            self.after_hint(i, hint, &mut hops)
                        }
                    }
                }
                Ok(Err(status)) => {
                    let verdict = classify(&status);
                    if !verdict.retry || R::ends_call(&status) {
                        return Err(ControlError::Rejected(status));
                    }
                    maybe_taken |= verdict.delivery == Delivery::Maybe;
                    note_failure(format!("{}: {}", self.describe(i), status));
                    Next::Retry(self.next_seed(i))
                }
                Err(_) => {
                    maybe_taken = true;
                    note_failure(format!("{}: no reply within {attempt:?}", self.describe(i)));
                    Next::Retry(self.next_seed(i))
                }
            };
            match next {
                Next::Hop(to) => {
                    i = to;
                    continue;
                }
                Next::Retry(to) => i = to,
            }
            tracing::debug!(%last, "store call retrying");
            let jittered = self.targets.rng.lock().unwrap().random_range(backoff / 2..=backoff);
            tokio::time::sleep_until((Instant::now() + jittered).min(deadline)).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// Where to go after replica `i` answered with `hint`.
    fn after_hint(&self, i: usize, hint: &pb::LeaderHint, hops: &mut u32) -> Next {
        match self.follow_hint(hint) {
            Some(next) if next != i && *hops < FREE_HOPS => {
                *hops += 1;
                Next::Hop(next)
            }
            Some(next) if next != i => Next::Retry(next),
            _ => Next::Retry(self.next_seed(i)),
        }
    }

    fn channel_at(&self, i: usize) -> (usize, Conn) {
        let list = self.targets.list.lock().unwrap();
        let i = i % list.len();
        (i, list[i].channel.clone())
    }

    /// Where to go after a `not_leader` hint: `None` when the hint names no usable replica.
    fn follow_hint(&self, hint: &pb::LeaderHint) -> Option<usize> {
        let mut list = self.targets.list.lock().unwrap();
        if hint.leader_id != 0
            && let Some(i) = list.iter().position(|t| t.node_id == Some(NodeId(hint.leader_id)))
        {
            return Some(i);
        }
        if hint.leader_addr.is_empty() {
            return None;
        }
        if let Some(i) = list.iter().position(|t| t.addr == hint.leader_addr) {
            return Some(i);
        }
        let channel = self
            .targets
            .dialer
            .dial(&hint.leader_addr, self.timeouts.attempt)
            .ok()?;
        let target = Target {
            node_id: (hint.leader_id != 0).then_some(NodeId(hint.leader_id)),
            addr: hint.leader_addr.clone(),
            channel,
        };
        let seed_count = self.targets.seed_count;
        if list.len() < seed_count + MAX_LEARNT_ADDRS {
            list.push(target);
            Some(list.len() - 1)
        } else {
            // Replace a learnt address (round robin over the learnt slots).
            let slot = (seed_count + (list.len() % MAX_LEARNT_ADDRS)).min(list.len() - 1);
            list[slot] = target;
            Some(slot)
        }
    }

    /// The next seed after `i` (learnt addresses are skipped: they were tried through a hint).
    fn next_seed(&self, i: usize) -> usize {
        (i + 1) % self.targets.seed_count
    }

    fn describe(&self, i: usize) -> String {
        let list = self.targets.list.lock().unwrap();
        list.get(i).map(|t| t.addr.clone()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// Fails its first attempt with `data_loss`, then never answers.
    #[derive(Clone)]
    struct CutThenSilent(Arc<AtomicUsize>);

    impl LeaderCall for CutThenSilent {
        type Reply = ();

        async fn send(_channel: Conn, req: Request<Self>) -> Result<Response<()>, Status> {
            if req.get_ref().0.fetch_add(1, Ordering::Relaxed) == 0 {
                return Err(Status::data_loss("the stream ended after 2000 of 3000 bytes"));
            }
            std::future::pending().await
        }

        fn hint(_: &()) -> Option<&pb::LeaderHint> {
            None
        }
    }

    /// A leader loop over one seed that nothing listens on (the calls above never dial).
    fn leader(attempt: Duration, overall: Duration) -> Leader {
        let timeouts = StoreTimeouts { attempt, overall };
        Leader::new(vec![Seed::parse("127.0.0.1:1").unwrap()], timeouts).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_the_deadline_cuts_short_keeps_the_earlier_error() {
        let leader = leader(Duration::from_secs(1), Duration::from_millis(300));
        let attempts = Arc::new(AtomicUsize::new(0));
        let err = leader.call(CutThenSilent(attempts.clone())).await.unwrap_err();
        assert_eq!(
            attempts.load(Ordering::Relaxed),
            2,
            "one failure, one attempt cut short"
        );
        let ControlError::Unavailable { last, maybe_taken } = err else {
            panic!("{err:?}")
        };
        assert!(last.contains("ended after 2000"), "{last}");
        assert!(last.contains("cut short by the deadline"), "{last}");
        assert!(maybe_taken, "an attempt without a reply may have been applied");
    }

    #[tokio::test(start_paused = true)]
    async fn an_attempt_that_times_out_on_its_own_says_so() {
        let leader = leader(Duration::from_millis(100), Duration::from_secs(1));
        let attempts = Arc::new(AtomicUsize::new(1)); // silent from the first attempt
        let err = leader.call(CutThenSilent(attempts)).await.unwrap_err();
        assert!(err.to_string().contains("no reply within"), "{err}");
    }
}
