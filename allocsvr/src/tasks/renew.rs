//! Registration and the renewal loop, the only writer of the node's lease.
//!
//! Order on a confirming reply (it matters for P4): the grants are applied first — whatever the
//! reply no longer grants is dropped — and only then is the lease extended and published, so no
//! fetch ever serves a section the store has moved on under a lease this very reply extended. The
//! lease counts from `t_send`, noted before the request left.
//!
//! Deliberately left out: the diff itself (pure, in `grants`) and loading what was gained (`gain`).

use std::sync::Arc;
use std::time::Duration;

use seqsvr_proto::params::SetParams;
use seqsvr_proto::{Incarnation, pb};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use super::{backoff_after, gain, release, store_reply_wait};
use crate::error::StartError;
use crate::grants::{self, release_requests, released};
use crate::lease::Lease;
use crate::state::AllocState;
use crate::store::{Store, StoreFailure};

/// Registers until the store answers (or `deadline` passes): a new incarnation and the set's
/// validated parameters.
pub async fn register(
    store: &dyn Store,
    node_id: seqsvr_proto::NodeId,
    advertise: &str,
    deadline: Option<Instant>,
) -> Result<(Incarnation, SetParams), StartError> {
    let mut backoff = Duration::from_millis(50);
    // One nonce for every attempt of this registration: an attempt that committed but whose
    // reply was lost, or that lands after a later one, yields the same incarnation.
    let nonce = rand::random_range(1..=u64::MAX);
    loop {
        let req = pb::RegisterRequest {
            secret: Vec::new(),
            node_id: node_id.0,
            addr: advertise.to_string(),
            nonce,
        };
        let last = match store.register(req).await {
            Ok(reply) => return registered(&reply),
            Err(StoreFailure::Refused(why)) => return Err(StartError::Refused(why)),
            Err(e @ StoreFailure::Unknown(_)) => e.to_string(),
        };
        if deadline.is_some_and(|d| Instant::now() + backoff >= d) {
            return Err(StartError::NoStore(last));
        }
        warn!(%last, "registration failed, retrying");
        tokio::time::sleep(backoff).await;
        backoff = backoff_after(backoff);
    }
}

fn registered(reply: &pb::RegisterReply) -> Result<(Incarnation, SetParams), StartError> {
    let params = reply
        .params
        .as_ref()
        .ok_or_else(|| StartError::BadReply("register reply without params".into()))?;
    let params =
        SetParams::from_pb(params).map_err(|e| StartError::BadReply(format!("store sent bad set params: {e}")))?;
    if reply.incarnation == 0 {
        return Err(StartError::BadReply("register reply with incarnation 0".into()));
    }
    Ok((Incarnation(reply.incarnation), params))
}

/// What the loop does after one renewal.
enum Flow {
    Continue,
    /// Renew again at once (a new registration).
    RenewNow,
    /// Renew again after [`RENEW_SOON`]: the store expects this set's ownership to change.
    RenewSoon,
    Stop,
}

/// The pause before the next renewal when the store says ownership is about to change (a move
/// installing a range, a planned handover, sections released by their owner). It bounds how long
/// a released section serves nobody before its next owner hears of the grant: 50 ms gave a
/// single-section takeover a median no-serve window of 56 ms in `takeover-bench`, 25 ms 35 ms.
/// Only while the store says so, so the steady state keeps one renewal per renew interval; a
/// renewal is a read on the leader, so 40 a second per AllocSvr for a moment costs little.
pub const RENEW_SOON: Duration = Duration::from_millis(25);

/// The renewal loop's own state.
struct Renewer {
    shared: Arc<AllocState>,
    lease: Lease,
    /// Grants, handovers and map generation after the last diff: an unchanged renewal skips it.
    last_applied: Option<(Vec<pb::Grant>, Vec<pb::SectionRange>, u64)>,
    /// What this incarnation handed over and must not serve again (see `grants`).
    handed: grants::HandedOver,
    wait: Duration,
}

/// Renews every `renew_interval` until `stop`; see the module docs for the order of effects.
pub async fn renew_loop(shared: Arc<AllocState>, mut stop: watch::Receiver<bool>) {
    let interval = shared.params().renew_interval();
    let wait = store_reply_wait(shared.params());
    let mut r = Renewer {
        shared,
        lease: Lease::default(),
        last_applied: None,
        handed: grants::HandedOver::default(),
        wait,
    };
    let mut next = Instant::now();
    loop {
        // Biased, stop first (see `bump::bumper`).
        tokio::select! {
            biased;
            _ = stop.changed() => return,
            _ = tokio::time::sleep_until(next) => {}
        }
        next += interval;
        let now = Instant::now();
        if next < now {
            next = now + interval;
        }
        if r.shared.is_stopping() {
            return;
        }
        match r.renew_once(&mut stop).await {
            Flow::Continue => {}
            Flow::RenewNow => next = Instant::now(),
            Flow::RenewSoon => next = next.min(Instant::now() + RENEW_SOON),
            Flow::Stop => return,
        }
        r.expire_if_due(r.shared.lease_now());
    }
}

impl Renewer {
    async fn renew_once(&mut self, stop: &mut watch::Receiver<bool>) -> Flow {
        let t_send = self.shared.lease_now();
        // The grants answered are this incarnation's: a Release built from them names it (not
        // whatever this process is registered as when the Release is finally sent).
        let incarnation = self.shared.incarnation();
        let slots_wanted = self.shared.ids().slots_wanted();
        self.shared.metrics().id_slots_wanted.set(f64::from(slots_wanted));
        let req = pb::RenewRequest {
            secret: Vec::new(),
            incarnation: incarnation.0,
            route_version: self.shared.route_version(),
            map_version: self.shared.map_version_to_ask(),
            id_slots_wanted: slots_wanted,
            version: seqsvr_plumbing::version::LONG.into(),
        };
        match self.shared.store().renew(req, self.wait).await {
            Ok(reply) if reply.status == pb::RenewStatus::Ok as i32 => {
                if self.shared.is_stopping() {
                    return Flow::Stop;
                }
                let soon = reply.renew_soon;
                self.confirmed(reply, t_send, incarnation);
                if soon { Flow::RenewSoon } else { Flow::Continue }
            }
            Ok(reply) if reply.status == pb::RenewStatus::UnknownIncarnation as i32 => self.register_again(stop).await,
            Ok(reply) => {
                warn!(status = reply.status, "renewal with unknown status ignored");
                Flow::Continue
            }
            Err(e) => {
                debug!(error = %e, "renewal failed");
                Flow::Continue
            }
        }
    }

    /// A confirming reply to a renewal sent at `t_send` under `incarnation`.
    fn confirmed(&mut self, reply: pb::RenewReply, t_send: Instant, incarnation: Incarnation) {
        let shared = &self.shared;
        shared.store_routes(reply.route_version, reply.routes.clone());
        shared
            .ids()
            .apply_renewal(reply.id_layout.as_ref(), reply.id_max_ahead_ms, &reply.slots);
        shared.ids().set_slots_per_set(reply.id_slots_per_set);
        shared.metrics().id_slots_held.set(shared.ids().held() as f64);
        shared.store_map(reply.map.clone());
        let generation = shared.owned().generation();
        let unchanged = self
            .last_applied
            .as_ref()
            .is_some_and(|(g, h, gen_)| *g == reply.grants && *h == reply.handover && *gen_ == generation);
        if !unchanged {
            let p = shared.params();
            let held = shared.owned().held_epochs();
            let diff = grants::diff(p.all_sections(), &held, &reply.grants, &reply.handover, &self.handed);
            // Whether each handed-over section's wait had passed, read before its slot is dropped
            // (or remembered from the first handover, when the slot is long gone).
            let now = shared.lease_now();
            let release: Vec<_> = diff
                .release
                .iter()
                .map(|&(id, epoch)| {
                    let waited = self.handed.waited(id, epoch);
                    (
                        id,
                        epoch,
                        waited.unwrap_or_else(|| shared.owned().waited(id, epoch, now)),
                    )
                })
                .collect();
            self.handed.replace(&release);
            let gained = shared.apply_grants(&diff, now);
            // While anything handed over is still granted, diff every renewal again: a Release
            // that failed is then sent again (it is idempotent under its epochs).
            self.last_applied = diff
                .release
                .is_empty()
                .then(|| (reply.grants, reply.handover, shared.owned().generation()));
            if !gained.is_empty() {
                tokio::spawn(gain::gain(shared.clone(), gained));
            }
            for req in release_requests(incarnation.0, released(release), false) {
                tokio::spawn(release::hand_over(shared.clone(), req));
            }
        }
        // Only now, with everything no longer granted dropped, may the extended lease be seen.
        let was_valid = self.lease.is_valid(t_send);
        self.lease.confirmed(t_send, shared.timings());
        shared.owned().set_lease_until(self.lease.valid_until());
        if !was_valid {
            info!(
                until_ms = shared.timings().owner_validity().as_millis() as u64,
                "lease gained"
            );
        }
        shared.metrics().lease_valid.set(1.0);
    }

    /// The store no longer knows this incarnation: drop everything, register again.
    async fn register_again(&mut self, stop: &mut watch::Receiver<bool>) -> Flow {
        let shared = self.shared.clone();
        warn!(incarnation = %shared.incarnation(), "store does not know this incarnation any more");
        self.revoke("unknown incarnation");
        // What the forgotten incarnation handed over is named by it: a late Release of it cannot
        // free anything the next incarnation is granted. (Not on a lapsed lease: the store may
        // still grant this incarnation the handed-over pair, and its Release may still land.)
        self.handed.clear();
        let registered = tokio::select! {
            biased;
            _ = stop.changed() => return Flow::Stop,
            r = register(shared.store(), shared.node_id(), shared.advertise(), None) => r,
        };
        match registered {
            Ok((incarnation, params)) => {
                if &params != shared.params() {
                    error!(old = ?shared.params(), new = ?params, "set parameters changed; keeping the old ones");
                }
                shared.set_incarnation(incarnation);
                info!(%incarnation, "registered again");
            }
            Err(e) => error!(error = %e, "registration failed"),
        }
        Flow::RenewNow
    }

    /// Drops everything once the lease has run out at `now`.
    fn expire_if_due(&mut self, now: Instant) {
        let holds = self.shared.owned().held_count() > 0 || self.shared.ids().held() > 0;
        if !self.lease.is_valid(now) && holds {
            self.shared.metrics().lease_lost.increment(1);
            self.revoke("lease ran out");
        }
    }

    fn revoke(&mut self, why: &str) {
        self.lease.revoke();
        self.shared.owned().set_lease_until(None);
        self.shared.metrics().lease_valid.set(0.0);
        self.shared.drop_everything(why);
    }
}
