//! `NextIds`: time-ordered ids from whichever slot this node holds, with no routing (any AllocSvr
//! that holds a slot answers; the ids are unique in the whole cluster).
//!
//! A call waits briefly, at most [`ID_WAIT`], when the answer is a moment away: for a raise of the
//! slot's mark that a call asked for, or for the clock to reach a tick a few milliseconds ahead
//! (after a short step back, or when a burst used up the borrowing allowance). Otherwise it is
//! refused as UNAVAILABLE with the reason, so that the caller tries another AllocSvr. A count
//! that no call can ever be handed under the layout (`IdLayout::most_ids_per_call`) is refused
//! as INVALID_ARGUMENT naming the limit: no wait or other AllocSvr would serve it.
//!
//! Left out: coalescing of callers (the client library's), the slot state (`slots`).

use std::time::Duration;

use seqsvr_proto::limits::{ID_BORROW_MS, MAX_IDS_PER_CALL};
use seqsvr_proto::pb;
use tokio::time::Instant;

use super::issuer::Refusal;
use super::slots::{Issued, NoIds};
use crate::error::Error;
use crate::state::AllocState;

/// Longest a call waits for a raise or the clock before it is refused.
pub const ID_WAIT: Duration = Duration::from_millis(200);

/// Longest single wait for the clock to reach a borrowed tick.
const CLOCK_WAIT_MAX: Duration = Duration::from_millis(20);

// The most one call can be handed (`IdLayout::most_ids_per_call`, which clients read too) counts
// on the issuer borrowing exactly this far ahead.
const _: () = assert!(super::slots::MAX_BORROW.as_millis() == ID_BORROW_MS as u128);

/// Answers one NextIds.
pub async fn next_ids(shared: &AllocState, req: pb::NextIdsRequest) -> Result<pb::NextIdsReply, Error> {
    if req.count == 0 || req.count > MAX_IDS_PER_CALL {
        return Err(Error::InvalidArgument(format!(
            "count must be 1 to {MAX_IDS_PER_CALL}, got {}",
            req.count
        )));
    }
    // A count no call can ever be handed under the layout is the caller's to fix: refused as
    // UNAVAILABLE ("clock behind"), it would be retried on every AllocSvr until the deadline.
    if let Some(layout) = shared.ids().layout()
        && req.count > layout.most_ids_per_call()
    {
        return Err(Error::InvalidArgument(format!(
            "count must be at most {} under the id layout ({layout}): one call is handed the ids of the \
             clock's tick and of the ticks up to {ID_BORROW_MS} ms ahead, {} a tick; got {}",
            layout.most_ids_per_call(),
            layout.ids_per_tick(),
            req.count
        )));
    }
    // Read only once a call has to wait: most calls are answered at the first attempt.
    let mut deadline = None;
    loop {
        // Registered before the attempt, so that an acknowledgement between the attempt and the
        // wait is not missed.
        let raised = shared.ids().raised.notified();
        let refusal = match shared.ids().issue(u64::from(req.count)) {
            Ok(issued) => return Ok(reply(shared, issued)),
            Err(NoIds::NoSlot) => {
                shared.metrics().ids_refused_no_slot.increment(1);
                return Err(Error::Unavailable(
                    "this AllocSvr holds no id slot (yet): ask another one".into(),
                ));
            }
            Err(NoIds::ClockLagging(ms)) => {
                shared.metrics().ids_refused_clock_lagging.increment(1);
                return Err(Error::Unavailable(format!(
                    "this AllocSvr's clock is {ms} ms behind the store's, more than the allowance of {} ms: the store \
                     stamps with its StoreSvrs' quorum clock, so this host is the one that is off (unless the store \
                     leader could not compare, see storesvr_clock_skew_ms); its ids would carry a time that far in \
                     the past; ask another AllocSvr",
                    shared.ids().max_ahead_ms()
                )));
            }
            Err(NoIds::Refused(r)) => r,
        };
        let now = Instant::now();
        let left = deadline.get_or_insert(now + ID_WAIT).saturating_duration_since(now);
        match refusal {
            Refusal::MarkBehind { .. } if !left.is_zero() => {
                let _ = tokio::time::timeout(left, raised).await;
            }
            Refusal::ClockBehind { ticks } if !left.is_zero() => {
                let tick_ms = shared.ids().layout().map_or(1, |l| l.tick_ms);
                let wait = Duration::from_millis(ticks.saturating_mul(tick_ms));
                if wait > CLOCK_WAIT_MAX || wait > left {
                    return Err(refused(shared, refusal));
                }
                tokio::time::sleep(wait).await;
            }
            _ => return Err(refused(shared, refusal)),
        }
    }
}

fn reply(shared: &AllocState, issued: Issued) -> pb::NextIdsReply {
    let m = shared.metrics();
    let mut borrowed = 0;
    for r in &issued.runs {
        m.ids_issued.increment(r.count);
        let tick = issued.layout.decompose(r.first).map_or(0, |p| p.tick);
        if issued.now_tick.is_some_and(|now| tick > now) {
            borrowed += r.count;
        }
    }
    // Most calls borrow nothing: an addition of 0 would still move the counter's cache line.
    if borrowed > 0 {
        m.ids_borrowed.increment(borrowed);
    }
    pb::NextIdsReply {
        runs: issued
            .runs
            .iter()
            .map(|r| pb::IdRun {
                first: r.first,
                count: r.count as u32,
            })
            .collect(),
        layout: Some(issued.layout.to_pb()),
        set_id: shared.params().set_id,
        slot_epoch: issued.epoch,
    }
}

/// The error for a refusal, counted by cause.
fn refused(shared: &AllocState, refusal: Refusal) -> Error {
    let m = shared.metrics();
    match refusal {
        Refusal::ClockBehind { ticks } => {
            m.ids_refused_clock_behind.increment(1);
            Error::Unavailable(format!(
                "this AllocSvr's clock is {ticks} ticks behind the last id its slot may issue (it stepped \
                 back, or the slot ran out of sequence numbers for now): retry, or ask another AllocSvr"
            ))
        }
        Refusal::MarkBehind { mark, needed } => {
            m.ids_refused_mark_behind.increment(1);
            Error::Unavailable(format!(
                "the slot's acknowledged mark (tick {mark}) is below tick {needed}, which this call needs, and \
                 no raise was acknowledged within {} ms (the store is slow or unreachable, or this host's clock \
                 runs ahead of the store's): retry, or ask another AllocSvr",
                ID_WAIT.as_millis()
            ))
        }
        Refusal::Exhausted => {
            m.ids_refused_exhausted.increment(1);
            Error::Exhausted("the id layout's time field is used up: no further time-ordered id can be issued".into())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use seqsvr_proto::id_layout::IdLayout;
    use seqsvr_proto::params::SetParams;
    use seqsvr_proto::{Incarnation, NodeId};

    use super::*;
    use crate::config::NodeConfig;
    use crate::store::{Call, Store, StoreFailure};

    /// A store that answers nothing: `NextIds` never calls one.
    struct NoStore;

    fn nothing<T>() -> Call<'static, T> {
        Box::pin(async { Err(StoreFailure::Unknown("no store in this test".into())) })
    }

    impl Store for NoStore {
        fn register(&self, _: pb::RegisterRequest) -> Call<'_, pb::RegisterReply> {
            nothing()
        }
        fn renew(&self, _: pb::RenewRequest, _: Duration) -> Call<'_, pb::RenewReply> {
            nothing()
        }
        fn release(&self, _: pb::ReleaseRequest, _: Option<Duration>) -> Call<'_, pb::ReleaseReply> {
            nothing()
        }
        fn bump(&self, _: pb::BumpRequest, _: Duration) -> Call<'_, pb::BumpReply> {
            nothing()
        }
        fn load(&self, _: pb::LoadRequest) -> Call<'_, pb::LoadReply> {
            nothing()
        }
        fn raise_marks(&self, _: pb::RaiseMarksRequest, _: Duration) -> Call<'_, pb::RaiseMarksReply> {
            nothing()
        }
    }

    /// A node holding slot 1 of `layout`, raised well past its clock.
    fn holding(layout: IdLayout) -> Arc<AllocState> {
        let cfg = NodeConfig::new(NodeId(1), "127.0.0.1:0".parse().unwrap(), vec![]);
        let (shared, _queue) = AllocState::new(
            &cfg,
            SetParams::single_set(0),
            "a:1".into(),
            Arc::new(NoStore),
            Incarnation(7),
        );
        let ids = shared.ids();
        let grant = pb::SlotGrant {
            slot: 1,
            epoch: 1,
            mark: 0,
        };
        ids.apply_renewal(Some(&layout.to_pb()), 10_000, &[grant]);
        let now = layout.tick_of(ids.now_ms()).unwrap();
        let raised = pb::RaiseResult {
            slot: 1,
            outcome: pb::RaiseOutcome::Applied as i32,
            mark: now + 60,
            epoch: 1,
            limit: 0,
        };
        ids.on_raised(&[raised], 0, Instant::now());
        shared
    }

    /// 4 ids a tick of a second, and a call borrows at most a second ahead: 8 ids are the most one
    /// call can ever be handed. More is the caller's mistake, not a moment's shortage: refused as
    /// INVALID_ARGUMENT naming the limit, not as UNAVAILABLE, which callers retry until their
    /// deadline on every AllocSvr.
    #[tokio::test]
    async fn a_count_no_call_can_ever_be_handed_is_refused_as_bad_input() {
        let layout = IdLayout {
            tick_ms: 1_000,
            epoch_ms: 0,
            slot_bits: 4,
            seq_bits: 2,
        };
        let shared = holding(layout);
        let got = next_ids(&shared, pb::NextIdsRequest { count: 9 }).await;
        match got {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("at most 8"), "{m}"),
            other => panic!("9 ids of 4 a second: {other:?}"),
        }
        let got = next_ids(&shared, pb::NextIdsRequest { count: 8 }).await.unwrap();
        assert_eq!(
            got.runs.iter().map(|r| r.count).sum::<u32>(),
            8,
            "the limit itself is served"
        );
        // Twitter's layout serves the wire's limit of 4,096 in one call.
        let shared = holding(IdLayout::twitter(0));
        let got = next_ids(
            &shared,
            pb::NextIdsRequest {
                count: MAX_IDS_PER_CALL,
            },
        )
        .await;
        assert!(got.is_ok(), "{got:?}");
    }
}
