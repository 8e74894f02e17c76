//! The slots this node holds for time-ordered ids, shared by the renewal loop (which learns of
//! grants), the raiser (which raises marks) and the service (which issues).
//!
//! A slot learnt under a new epoch starts a fresh [`SlotIssuer`] whose floor is the mark the
//! renewal reported: the store raises a slot's epoch on every grant and refuses raises under an
//! older one, so that mark is at or above every mark any earlier holder was acknowledged. A slot
//! the renewal no longer lists, or whose raise comes back `STALE_EPOCH`, is dropped at once; so is
//! every slot when the lease runs out or the incarnation is forgotten. None of this is what keeps
//! ids unique (the floor and the acknowledged mark are), but it keeps a paused or cut-off holder
//! from issuing ids whose time is far behind (docs/design/time-ordered-ids.md, U3).
//!
//! The clock is the host's wall clock plus a test-only offset (`clock`), read once per call.
//!
//! Left out: the Raft write (`tasks::raise`) and the gRPC reply (`service`).

use std::collections::BTreeMap;
use std::ops::Bound::{Excluded, Included, Unbounded};
use std::sync::Mutex;
use std::time::Duration;

use seqsvr_proto::id_layout::IdLayout;
use seqsvr_proto::pb;
use tokio::sync::Notify;
use tracing::{info, warn};

use super::clock::IdClock;
use super::issuer::{IdRun, Refusal, SlotIssuer, UnsafeIssuing};

/// How far ahead of the clock the raiser keeps a slot's mark.
pub const RAISE_WINDOW: Duration = Duration::from_secs(2);

/// Most ticks an id may be ahead of the clock (borrowed when a tick's sequence runs out, or when
/// the clock stepped back below the last tick used).
pub const MAX_BORROW: Duration = Duration::from_millis(1_000);

/// Most slots one AllocSvr asks for.
pub const MAX_SLOTS_WANTED: usize = 256;

/// How long an AllocSvr's load must have needed fewer slots before it asks for fewer: slots are
/// gained in about a second (a renewal, an arbiter tick, a raise) but given back slowly, so that a
/// load that comes and goes does not move slots back and forth.
pub const SHRINK_AFTER: Duration = Duration::from_secs(60);

/// Shortest span [`IdSlots::slots_wanted`] measures the rate over (renewals may come tens of
/// milliseconds apart while ownership changes; a burst over so short a span says little).
const MIN_SPAN: Duration = Duration::from_millis(200);

/// How many slots this node's load needs: measured between renewals, asked for in each.
#[derive(Debug)]
struct Demand {
    /// Since when `issued` and `short` count.
    since: Option<tokio::time::Instant>,
    /// Ids issued since then.
    issued: u64,
    /// A call was refused since then because every held slot was used past the borrowing bound.
    short: bool,
    /// What the last renewal asked for.
    wanted: usize,
    /// Since when fewer would have done, and the most any span since then needed.
    low: Option<(tokio::time::Instant, usize)>,
}

impl Default for Demand {
    fn default() -> Self {
        Self {
            since: None,
            issued: 0,
            short: false,
            wanted: 1,
            low: None,
        }
    }
}

impl Demand {
    /// The slots to ask for at `now`, holding `held` of `per_ms` ids a millisecond each: enough
    /// for the rate since the last look to fill them half (the other half is room for a burst
    /// until the next grant), one more than held when a call found every slot used up, and never
    /// fewer than before until [`SHRINK_AFTER`] of needing fewer.
    fn wanted(&mut self, now: tokio::time::Instant, held: usize, per_ms: f64) -> usize {
        let Some(since) = self.since else {
            self.since = Some(now);
            return self.wanted;
        };
        let span = now.saturating_duration_since(since);
        if span < MIN_SPAN {
            return self.wanted;
        }
        let rate = self.issued as f64 / span.as_secs_f64() / 1_000.0;
        let mut need = (2.0 * rate / per_ms).ceil() as usize;
        if self.short {
            need = need.max(held + 1);
        }
        let need = need.clamp(1, MAX_SLOTS_WANTED);
        (self.since, self.issued, self.short) = (Some(now), 0, false);
        if need >= self.wanted {
            (self.wanted, self.low) = (need, None);
        } else {
            let (low_since, peak) = self.low.get_or_insert((now, need));
            *peak = (*peak).max(need);
            if now.saturating_duration_since(*low_since) >= SHRINK_AFTER {
                (self.wanted, self.low) = (*peak, None);
            }
        }
        self.wanted
    }
}

/// One held slot.
struct Held {
    epoch: u64,
    issuer: SlotIssuer,
}

#[derive(Default)]
struct Inner {
    layout: Option<IdLayout>,
    /// Slots each set leases, as the leader last said (0: unknown), to name an id's set.
    per_set: u64,
    max_ahead_ms: u64,
    slots: BTreeMap<u64, Held>,
    /// Round-robin position over held slots.
    next: usize,
    /// The store leader's clock as the last RaiseMarks reply gave it, and when (on the monotonic
    /// clock) that raise was *sent*: the leader's clock now is at most that reading plus the time
    /// since. Every call compares this clock with it, so that a step back between two raises is
    /// seen at the next call, not at the next raise (which a clock behind may never make due).
    leader_ref: Option<(tokio::time::Instant, u64)>,
    /// How far behind the leader's this clock was at the last call that looked, when more than
    /// the allowance (kept to log the change once).
    lagging_ms: Option<u64>,
    demand: Demand,
    /// When the raiser last warned of a capped raise.
    warned_at: Option<tokio::time::Instant>,
}

impl Inner {
    /// How far this clock (`now_ms`) is behind the store leader's, estimated from the last raise
    /// as the leader's reading plus the monotonic time since the raise was sent. Sent, not
    /// answered: the estimate can only run ahead of the leader's clock (by the round trip), so a
    /// lag is never understated and no id is stamped further behind the leader's time than the
    /// allowance (docs/design/time-ordered-ids.md, U3).
    fn lag_ms(&self, now_ms: u64) -> u64 {
        self.leader_ref.map_or(0, |(sent, leader_ms)| {
            let leader_now = leader_ms.saturating_add(sent.elapsed().as_millis() as u64);
            leader_now.saturating_sub(now_ms)
        })
    }

    /// Notes whether this clock lags the leader's by more than the allowance, logging a change.
    fn check_lag(&mut self, now_ms: u64) -> Option<u64> {
        let lag = self.lag_ms(now_ms);
        let was = self.lagging_ms;
        self.lagging_ms = (lag > self.max_ahead_ms).then_some(lag);
        match (was, self.lagging_ms) {
            (None, Some(lag)) => warn!(
                lag_ms = lag,
                max_ahead_ms = self.max_ahead_ms,
                "this host's clock is behind the store's (its StoreSvrs' quorum clock) by more than the \
                 allowance: this host is the one that is off (unless the store leader could not compare, see \
                 storesvr_clock_skew_ms); issuing no ids"
            ),
            (Some(_), None) => info!("this host's clock agrees with the store's again: issuing ids"),
            _ => {}
        }
        self.lagging_ms
    }
}

/// The ids a call got, and from which slot.
#[derive(Debug)]
pub struct Issued {
    pub runs: Vec<IdRun>,
    pub layout: IdLayout,
    pub slot: u64,
    /// The epoch the slot is held under (with the slot, it names this holder).
    pub epoch: u64,
    /// The clock's tick when they were issued (ids above it were borrowed).
    pub now_tick: Option<u64>,
}

/// Why a call got no ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoIds {
    /// No slot held (yet, or any more): another AllocSvr may have one.
    NoSlot,
    /// This clock is this many ms behind the store leader's, more than the allowance: its ids'
    /// times would lag that far (docs/design/time-ordered-ids.md, U3).
    ClockLagging(u64),
    Refused(Refusal),
}

/// A raise to send: one slot's target under its epoch.
pub type RaiseWanted = pb::SlotMark;

/// What a RaiseMarks reply did.
#[derive(Debug, Default)]
pub struct RaiseReply {
    /// A mark rose, or a slot was let go: the waiting calls have something new to try.
    pub progressed: bool,
    /// The results that said the raise asked past the leader's clock plus the allowance.
    pub too_far: Vec<pb::RaiseResult>,
}

/// The node's slots.
pub struct IdSlots {
    inner: Mutex<Inner>,
    clock: IdClock,
    unsafe_rules: UnsafeIssuing,
    /// Wakes the raiser (a call found too little headroom).
    pub raise_wanted: Notify,
    /// Wakes calls waiting for a mark (a raise was acknowledged).
    pub raised: Notify,
}

impl IdSlots {
    pub fn new(clock: IdClock, unsafe_rules: UnsafeIssuing) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            clock,
            unsafe_rules,
            raise_wanted: Notify::new(),
            raised: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This host's clock for ids, Unix milliseconds.
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    pub fn layout(&self) -> Option<IdLayout> {
        self.lock().layout
    }

    /// The layout and the slots each set leases (0 when the leader did not say), to decode ids.
    pub fn decoding(&self) -> Option<(IdLayout, u64)> {
        let inner = self.lock();
        Some((inner.layout?, inner.per_set))
    }

    /// Keeps the slots each set leases, from a renewal (`RenewReply.id_slots_per_set`).
    pub fn set_slots_per_set(&self, per_set: u64) {
        self.lock().per_set = per_set;
    }

    pub fn held(&self) -> usize {
        self.lock().slots.len()
    }

    /// How many slots to ask the store for in the next renewal, from the ids issued since the
    /// last one (see `Demand::wanted`); one while the set has no ids.
    pub fn slots_wanted(&self) -> u32 {
        let now = tokio::time::Instant::now();
        let mut inner = self.lock();
        let Some(layout) = inner.layout else { return 1 };
        let per_ms = layout.ids_per_tick() as f64 / layout.tick_ms.max(1) as f64;
        let held = inner.slots.len();
        inner.demand.wanted(now, held, per_ms) as u32
    }

    /// A renewal's slot part: keeps the slots still granted under the same epoch, starts the newly
    /// granted ones at their reported mark, drops the rest.
    pub fn apply_renewal(&self, layout: Option<&pb::IdLayout>, max_ahead_ms: u64, grants: &[pb::SlotGrant]) {
        let layout = match layout.map(IdLayout::from_pb) {
            Some(Ok(l)) => l,
            Some(Err(e)) => {
                warn!(error = %e, "the store sent an id layout that does not decode; holding no slots");
                self.drop_all("bad layout");
                return;
            }
            None => return self.drop_all("the set has no time-ordered ids"),
        };
        let borrow = MAX_BORROW.as_millis() as u64 / layout.tick_ms;
        let mut inner = self.lock();
        if inner.layout.is_some_and(|l| l != layout) {
            warn!(old = %inner.layout.unwrap(), new = %layout, "the id layout changed; dropping every slot");
            inner.slots.clear();
        }
        inner.layout = Some(layout);
        inner.max_ahead_ms = max_ahead_ms;
        let before = inner.slots.len();
        inner
            .slots
            .retain(|slot, h| grants.iter().any(|g| g.slot == *slot && g.epoch == h.epoch));
        let dropped = before - inner.slots.len();
        for g in grants {
            if g.slot >= layout.slots() || inner.slots.contains_key(&g.slot) {
                continue;
            }
            info!(slot = g.slot, epoch = g.epoch, floor = g.mark, "gained an id slot");
            let issuer = SlotIssuer::new(layout, g.slot, g.mark, borrow);
            inner.slots.insert(g.slot, Held { epoch: g.epoch, issuer });
        }
        if dropped > 0 {
            info!(dropped, "let go of id slots");
        }
        drop(inner);
        self.raise_wanted.notify_one();
    }

    /// Stops issuing from every slot.
    pub fn drop_all(&self, why: &str) {
        let mut inner = self.lock();
        if !inner.slots.is_empty() {
            warn!(slots = inner.slots.len(), why, "stopped issuing from every id slot");
            inner.slots.clear();
        }
    }

    /// Issues `count` ids from one held slot (round robin), all or none.
    pub fn issue(&self, count: u64) -> Result<Issued, NoIds> {
        let now_ms = self.now_ms();
        let mut guard = self.lock();
        // Through a plain reference, so that the slots and the demand are borrowed apart.
        let inner = &mut *guard;
        let layout = inner.layout.ok_or(NoIds::NoSlot)?;
        let n = inner.slots.len();
        if n == 0 {
            return Err(NoIds::NoSlot);
        }
        if let Some(ms) = inner.check_lag(now_ms) {
            return Err(NoIds::ClockLagging(ms));
        }
        let start = inner.next % n;
        inner.next = inner.next.wrapping_add(1);
        let now = layout.tick_of(now_ms);
        let mut last = Refusal::Exhausted;
        // Try each slot once from the round-robin position (the slots from the pivot up, then
        // those below it): one whose mark lags may be beside one that can answer. Two ranges of
        // the map rather than a list of its keys: no allocation on every call.
        let pivot = *inner.slots.keys().nth(start).expect("start < n");
        let from_pivot = [(Included(pivot), Unbounded), (Unbounded, Excluded(pivot))];
        for range in from_pivot {
            for (&slot, held) in inner.slots.range_mut(range) {
                match held.issuer.issue(now, count, self.unsafe_rules) {
                    Ok(runs) => {
                        inner.demand.issued += count;
                        return Ok(Issued {
                            runs,
                            layout,
                            slot,
                            epoch: held.epoch,
                            now_tick: now,
                        });
                    }
                    Err(r) => last = r,
                }
            }
        }
        match last {
            Refusal::MarkBehind { .. } => self.raise_wanted.notify_one(),
            Refusal::ClockBehind { .. } => inner.demand.short = true,
            Refusal::Exhausted => {}
        }
        Err(NoIds::Refused(last))
    }

    /// The raises due now: every slot with less than half the window of headroom, to a window
    /// ahead of the clock.
    pub fn raises_due(&self) -> Vec<RaiseWanted> {
        let now_ms = self.now_ms();
        let inner = self.lock();
        let Some(layout) = inner.layout else { return Vec::new() };
        let window = (RAISE_WINDOW.as_millis() as u64 / layout.tick_ms).max(2);
        let Some(now) = layout.tick_of(now_ms) else {
            return Vec::new();
        };
        inner
            .slots
            .iter()
            .filter_map(|(&slot, h)| {
                let mark = h.issuer.wants_raise(now, window / 2, window)?;
                Some(pb::SlotMark {
                    slot,
                    epoch: h.epoch,
                    mark,
                })
            })
            .collect()
    }

    /// Ticks of headroom of the least-raised slot (for the metric), or `None` with no slot.
    pub fn min_headroom(&self) -> Option<u64> {
        let now_ms = self.now_ms();
        let inner = self.lock();
        let now = inner.layout?.tick_of(now_ms)?;
        inner.slots.values().map(|h| h.issuer.headroom(now)).min()
    }

    /// Applies a RaiseMarks reply: an acknowledged mark under the slot's epoch widens what it may
    /// issue; `STALE_EPOCH` means the slot was granted again, so it is dropped. `TOO_FAR_AHEAD`
    /// says the raise asked past the leader's clock plus the allowance: a store that caps raises
    /// applied it at that limit, one that refuses them did not, and either way the mark it
    /// reports is one the slot holds under this holder's epoch, so it is acknowledged as well (a
    /// holder then issues up to the cap instead of nothing).
    ///
    /// Calls waiting for a raise are woken only when a mark rose or a slot was let go: a reply
    /// that changed nothing would only send them back to ask for the same raise (issue 47).
    ///
    /// `leader_ms` is the leader's clock when it proposed the raise (0: an older leader that does
    /// not say) and `sent` when the raise was sent: from then on every call checks this clock
    /// against the leader's, and one further behind it than the allowance issues nothing until it
    /// catches up.
    pub fn on_raised(&self, results: &[pb::RaiseResult], leader_ms: u64, sent: tokio::time::Instant) -> RaiseReply {
        let now_ms = self.now_ms();
        let mut inner = self.lock();
        if leader_ms > 0 {
            // A later-sent raise's reading is the better one; a late reply of an earlier raise
            // must not replace it.
            if inner.leader_ref.is_none_or(|(at, _)| at <= sent) {
                inner.leader_ref = Some((sent, leader_ms));
            }
            inner.check_lag(now_ms);
        }
        let mut reply = RaiseReply::default();
        for r in results {
            let outcome = pb::RaiseOutcome::try_from(r.outcome).unwrap_or(pb::RaiseOutcome::Unspecified);
            match outcome {
                pb::RaiseOutcome::Applied | pb::RaiseOutcome::NoOp | pb::RaiseOutcome::TooFarAhead => {
                    if outcome == pb::RaiseOutcome::TooFarAhead {
                        reply.too_far.push(*r);
                    }
                    if let Some(h) = inner.slots.get_mut(&r.slot)
                        && h.epoch == r.epoch
                        && r.mark > h.issuer.mark()
                    {
                        h.issuer.acknowledged(r.mark);
                        reply.progressed = true;
                    }
                }
                // The slot moved on past the epoch held (a raise sent under an older epoch that
                // lands after the renewal taught the newer one is not a reason to let go).
                pb::RaiseOutcome::StaleEpoch | pb::RaiseOutcome::NotOurs => {
                    let moved_on = outcome == pb::RaiseOutcome::NotOurs
                        || inner.slots.get(&r.slot).is_some_and(|h| r.epoch > h.epoch);
                    if moved_on && inner.slots.remove(&r.slot).is_some() {
                        info!(slot = r.slot, "id slot granted elsewhere; let go of it");
                        reply.progressed = true;
                    }
                }
                pb::RaiseOutcome::Unspecified => warn!(slot = r.slot, "raise result without an outcome"),
            }
        }
        drop(inner);
        if reply.progressed {
            self.raised.notify_waiters();
        }
        reply
    }

    /// Whether a warning is due, at most one per `every` (a holder whose clock runs ahead meets a
    /// capped raise every few hundred ms); notes it as given.
    pub fn warn_due(&self, every: Duration) -> bool {
        let now = tokio::time::Instant::now();
        let mut inner = self.lock();
        let due = inner
            .warned_at
            .is_none_or(|at| now.saturating_duration_since(at) >= every);
        if due {
            inner.warned_at = Some(now);
        }
        due
    }

    /// The store's allowance past its leader's clock (for messages).
    pub fn max_ahead_ms(&self) -> u64 {
        self.lock().max_ahead_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_asks_for_the_slots_its_load_needs_and_for_fewer_only_after_a_quiet_minute() {
        let t0 = tokio::time::Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let per_ms = 100.0;
        let mut d = Demand::default();
        assert_eq!(d.wanted(at(0), 0, per_ms), 1, "nothing measured yet");
        // 150 ids a millisecond: two slots would be 75 % full, three keep them at half.
        d.issued = 150_000;
        assert_eq!(d.wanted(at(1_000), 1, per_ms), 3);
        // A span too short to say anything changes nothing and keeps counting.
        d.issued = 10_000;
        assert_eq!(d.wanted(at(1_050), 3, per_ms), 3);
        // A call found every slot used up: one more than held, whatever the rate says.
        d.short = true;
        assert_eq!(d.wanted(at(2_000), 3, per_ms), 4);
        // Quiet, then a little load: still four until a minute has needed fewer, then the most
        // that minute needed.
        assert_eq!(d.wanted(at(3_000), 4, per_ms), 4);
        d.issued = 2_700_000;
        assert_eq!(d.wanted(at(30_000), 4, per_ms), 4);
        assert_eq!(d.wanted(at(62_000), 4, per_ms), 4);
        assert_eq!(d.wanted(at(63_000), 4, per_ms), 2);
        // Load returns: asked for at once, up to the cap.
        d.issued = 400_000;
        assert_eq!(d.wanted(at(64_000), 2, per_ms), 8);
        d.issued = u64::MAX / 2;
        assert_eq!(d.wanted(at(65_000), 8, per_ms), MAX_SLOTS_WANTED);
    }

    fn layout() -> pb::IdLayout {
        IdLayout::twitter(0).to_pb()
    }

    fn ack(slots: &IdSlots, slot: u64, epoch: u64, mark: u64) {
        slots.on_raised(
            &[pb::RaiseResult {
                slot,
                outcome: pb::RaiseOutcome::Applied as i32,
                mark,
                epoch,
                limit: 0,
            }],
            0,
            tokio::time::Instant::now(),
        );
    }

    #[test]
    fn a_slot_issues_only_after_a_raise_and_only_above_its_floor() {
        let slots = IdSlots::new(IdClock::with_offset(0), UnsafeIssuing::default());
        assert_eq!(slots.issue(1).unwrap_err(), NoIds::NoSlot);
        let now = slots.now_ms();
        slots.apply_renewal(
            Some(&layout()),
            10_000,
            &[pb::SlotGrant {
                slot: 3,
                epoch: 1,
                mark: now - 5_000,
            }],
        );
        assert!(matches!(
            slots.issue(1),
            Err(NoIds::Refused(Refusal::MarkBehind { .. }))
        ));
        let due = slots.raises_due();
        assert_eq!(due.len(), 1);
        assert!(due[0].mark >= now + 2_000 && due[0].epoch == 1, "{due:?}");
        ack(&slots, 3, 1, due[0].mark);
        let got = slots.issue(5).unwrap();
        let parts = got.layout.decompose(got.runs[0].first).unwrap();
        assert_eq!((parts.slot, got.runs[0].count), (3, 5));
        assert!(parts.tick > now - 5_000);
        assert!(slots.raises_due().is_empty(), "a window of headroom left");
    }

    #[test]
    fn a_new_epoch_restarts_the_slot_at_the_reported_mark_and_a_stale_one_drops_it() {
        let slots = IdSlots::new(IdClock::with_offset(0), UnsafeIssuing::default());
        let now = slots.now_ms();
        slots.apply_renewal(
            Some(&layout()),
            10_000,
            &[pb::SlotGrant {
                slot: 1,
                epoch: 1,
                mark: 0,
            }],
        );
        ack(&slots, 1, 1, now + 2_000);
        assert!(slots.issue(1).is_ok());
        // Granted again under epoch 3 with a mark above the clock: nothing until it is raised.
        slots.apply_renewal(
            Some(&layout()),
            10_000,
            &[pb::SlotGrant {
                slot: 1,
                epoch: 3,
                mark: now + 2_500,
            }],
        );
        assert!(slots.issue(1).is_err());
        ack(&slots, 1, 1, now + 9_000);
        assert!(
            slots.issue(1).is_err(),
            "an acknowledgement under the old epoch counts for nothing"
        );
        slots.on_raised(
            &[pb::RaiseResult {
                slot: 1,
                outcome: pb::RaiseOutcome::StaleEpoch as i32,
                mark: 0,
                epoch: 4,
                limit: 0,
            }],
            0,
            tokio::time::Instant::now(),
        );
        assert_eq!(slots.held(), 0);
    }

    #[test]
    fn calls_take_the_slots_in_turn_and_pass_over_one_whose_mark_lags() {
        let slots = IdSlots::new(IdClock::with_offset(0), UnsafeIssuing::default());
        let now = slots.now_ms();
        let grant = |slot| pb::SlotGrant {
            slot,
            epoch: 1,
            mark: 0,
        };
        slots.apply_renewal(Some(&layout()), 10_000, &[grant(2), grant(5), grant(9)]);
        for slot in [2, 5, 9] {
            ack(&slots, slot, 1, now + 2_000);
        }
        let slot_of = |slots: &IdSlots| slots.issue(1).unwrap().slot;
        let turns: Vec<u64> = (0..6).map(|_| slot_of(&slots)).collect();
        assert_eq!(turns, [2, 5, 9, 2, 5, 9]);
        // Slot 5 granted again under a new epoch: not raised yet, so its turns go to the next.
        slots.apply_renewal(
            Some(&layout()),
            10_000,
            &[
                grant(2),
                pb::SlotGrant {
                    slot: 5,
                    epoch: 2,
                    mark: now + 2_500,
                },
                grant(9),
            ],
        );
        let turns: Vec<u64> = (0..6).map(|_| slot_of(&slots)).collect();
        assert_eq!(turns, [2, 9, 9, 2, 9, 9]);
    }

    #[test]
    fn a_clock_behind_the_leaders_by_more_than_the_allowance_issues_nothing_until_it_catches_up() {
        let slots = IdSlots::new(IdClock::with_offset(-20_000), UnsafeIssuing::default());
        let leader_now = slots.now_ms() + 20_000;
        slots.apply_renewal(
            Some(&layout()),
            10_000,
            &[pb::SlotGrant {
                slot: 2,
                epoch: 1,
                mark: 0,
            }],
        );
        let mark = slots.now_ms() + 2_000;
        let applied = pb::RaiseResult {
            slot: 2,
            outcome: pb::RaiseOutcome::Applied as i32,
            mark,
            epoch: 1,
            limit: 0,
        };
        slots.on_raised(&[applied], leader_now, tokio::time::Instant::now());
        assert!(matches!(slots.issue(1), Err(NoIds::ClockLagging(lag)) if lag >= 19_000));
        slots.on_raised(&[applied], slots.now_ms() + 5_000, tokio::time::Instant::now());
        assert!(slots.issue(1).is_ok(), "within the allowance again");
    }

    #[tokio::test(start_paused = true)]
    async fn a_step_back_between_two_raises_stops_issuing_at_the_next_call() {
        let clock = IdClock::on_tokio_time(1_800_000_000_000);
        let slots = IdSlots::new(clock.clone(), UnsafeIssuing::default());
        slots.apply_renewal(
            Some(&layout()),
            3_000,
            &[pb::SlotGrant {
                slot: 0,
                epoch: 1,
                mark: 0,
            }],
        );
        let sent = tokio::time::Instant::now();
        let leader_ms = clock.now_ms();
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        let applied = pb::RaiseResult {
            slot: 0,
            outcome: pb::RaiseOutcome::Applied as i32,
            mark: clock.now_ms() + 2_000,
            epoch: 1,
            limit: 0,
        };
        slots.on_raised(&[applied], leader_ms, sent);
        assert!(slots.issue(1).is_ok());
        // The clock steps back 10 s, and then runs on for 9.5 s: past the borrow, below the mark,
        // and never raised again (the headroom looks ample to a clock behind).
        clock.set_offset(-10_000);
        tokio::time::sleep(std::time::Duration::from_millis(9_500)).await;
        assert!(slots.raises_due().is_empty());
        assert!(
            matches!(slots.issue(1), Err(NoIds::ClockLagging(lag)) if lag >= 10_000),
            "ids stamped 9.5 s behind the leader's clock would break U3"
        );
        clock.set_offset(0);
        assert!(
            matches!(slots.issue(1), Err(NoIds::Refused(Refusal::MarkBehind { .. }))),
            "the clock agrees again: what is missing now is a raise"
        );
        assert_eq!(slots.raises_due().len(), 1);
    }

    /// Issue 47, items 7 and 8: a raise capped at the store's limit still acknowledges the mark
    /// the store holds (committed under this holder's epoch), so the holder issues up to it; a
    /// reply that raises no mark wakes none of the calls waiting for one.
    #[tokio::test(start_paused = true)]
    async fn a_capped_raise_is_served_within_its_mark_and_a_refusal_wakes_nobody() {
        let clock = IdClock::on_tokio_time(1_800_000_000_000);
        let slots = IdSlots::new(clock.clone(), UnsafeIssuing::default());
        slots.apply_renewal(
            Some(&layout()),
            3_000,
            &[pb::SlotGrant {
                slot: 0,
                epoch: 1,
                mark: 0,
            }],
        );
        let now = clock.now_ms();
        let capped = |mark| pb::RaiseResult {
            slot: 0,
            outcome: pb::RaiseOutcome::TooFarAhead as i32,
            mark,
            epoch: 1,
            limit: mark,
        };
        // The leader's clock is 1.5 s behind this one: the 2 s window is capped 1.5 s short.
        slots.on_raised(&[capped(now + 500)], now - 1_500, tokio::time::Instant::now());
        assert!(slots.issue(1).is_ok(), "issued below the capped mark");
        // The same answer again raises nothing: a call waiting for a raise is not woken.
        let waiting = slots.raised.notified();
        tokio::pin!(waiting);
        waiting.as_mut().enable();
        slots.on_raised(&[capped(now + 500)], now - 1_500, tokio::time::Instant::now());
        assert!(
            tokio::time::timeout(Duration::from_millis(1), waiting.as_mut())
                .await
                .is_err(),
            "woken by a reply that raised no mark"
        );
        slots.on_raised(&[capped(now + 900)], now - 1_100, tokio::time::Instant::now());
        assert!(
            tokio::time::timeout(Duration::from_millis(1), waiting).await.is_ok(),
            "a mark rose: the waiting call tries again"
        );
    }
}
