//! Issuing time-ordered ids from one leased slot: the pure rules, handed the clock's reading.
//!
//! A holder issues an id with tick `t` only when `floor < t ≤ mark`: `floor` is the slot's
//! high-water mark as the store had it when this holder gained the slot (every earlier holder
//! issued ticks at or below it), and `mark` is the highest mark the store acknowledged under this
//! holder's epoch. So uniqueness rests on neither the clock nor the lease: whatever the clock
//! reads, a tick outside `(floor, mark]` is never used, and within it this holder alone issues.
//!
//! The clock only decides which tick in that window an id gets:
//! - `t = max(now, last)`: a clock that steps back continues from the last tick used;
//! - when the tick's sequence numbers run out, the next tick is *borrowed*, at most
//!   `max_borrow` ticks ahead of `now`; past that the call is refused as [`Refusal::ClockBehind`]
//!   (retryable: the clock catches up, or another holder answers);
//! - a tick above `mark` (the clock jumped forward, or the raise lags) is refused as
//!   [`Refusal::MarkBehind`] until a raise is acknowledged.
//!
//! Left out: the clock itself, the raise's Raft write (`tasks`), and any waiting: a caller that
//! wants to wait out a short borrow does so itself.

use seqsvr_proto::id_layout::{IdLayout, IdParts};

/// Consecutive ids `first, first + 1, …, first + count − 1` (one tick of one slot).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdRun {
    pub first: u64,
    pub count: u64,
}

/// Why no ids were issued (nothing changed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The ids would need a tick more than `max_borrow` ahead of the clock (it stepped back, or
    /// the slot is used faster than its ticks pass). Retry after `ticks` ticks.
    ClockBehind { ticks: u64 },
    /// The ids would need ticks above the acknowledged mark; a raise is under way.
    MarkBehind { mark: u64, needed: u64 },
    /// The layout's time field is used up.
    Exhausted,
}

/// The issuing state of one slot under one epoch.
#[derive(Clone, Debug)]
pub struct SlotIssuer {
    layout: IdLayout,
    slot: u64,
    floor: u64,
    mark: u64,
    /// The tick of the last id issued (`floor` before the first).
    last: u64,
    /// The next sequence number within `last`; `ids_per_tick` when `last` is used up (as the floor
    /// is: no id with the floor's tick may come from this holder).
    next_seq: u64,
    max_borrow: u64,
}

/// Test-only switches that break one rule (negative controls: the simulator must catch each).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnsafeIssuing {
    /// A new holder starts at its own clock: the floor is ignored.
    pub ignore_floor: bool,
    /// Ids are issued above the acknowledged mark.
    pub ignore_mark: bool,
}

impl SlotIssuer {
    /// A holder that gained `slot` when its mark was `floor`; it may issue nothing until a mark
    /// above the floor is acknowledged ([`Self::acknowledged`]).
    pub fn new(layout: IdLayout, slot: u64, floor: u64, max_borrow: u64) -> Self {
        Self {
            layout,
            slot,
            floor,
            mark: floor,
            last: floor,
            next_seq: layout.ids_per_tick(),
            max_borrow,
        }
    }

    pub fn slot(&self) -> u64 {
        self.slot
    }

    pub fn floor(&self) -> u64 {
        self.floor
    }

    /// The highest acknowledged mark.
    pub fn mark(&self) -> u64 {
        self.mark
    }

    /// The tick of the last id issued (the floor before the first).
    pub fn last_tick(&self) -> u64 {
        self.last
    }

    /// The store acknowledged `mark` under this holder's epoch. A lower one (a late reply) changes
    /// nothing.
    pub fn acknowledged(&mut self, mark: u64) {
        self.mark = self.mark.max(mark);
    }

    /// Ticks the acknowledged mark is ahead of `max(now, last)` (0 when behind).
    pub fn headroom(&self, now: u64) -> u64 {
        self.mark.saturating_sub(now.max(self.last))
    }

    /// The mark to ask for when fewer than `low` ticks of headroom are left: `window` ticks above
    /// `max(now, last)`, capped at the layout's last tick.
    pub fn wants_raise(&self, now: u64, low: u64, window: u64) -> Option<u64> {
        if self.headroom(now) >= low {
            return None;
        }
        let target = now.max(self.last).saturating_add(window).min(self.layout.max_tick());
        (target > self.mark).then_some(target)
    }

    /// Issues `count` ids at clock tick `now` (`None`: the clock reads before the layout's epoch),
    /// all or none, as runs of consecutive ids in increasing order.
    pub fn issue(&mut self, now: Option<u64>, count: u64, unsafe_rules: UnsafeIssuing) -> Result<Vec<IdRun>, Refusal> {
        let per_tick = self.layout.ids_per_tick();
        let (mut t, mut seq) = (self.last, self.next_seq);
        if unsafe_rules.ignore_floor && self.last == self.floor {
            // The negative control: a fresh holder trusts its clock, not the floor.
            (t, seq) = (now.unwrap_or(0), 0);
        }
        let clock = now.unwrap_or(0);
        let mut runs = Vec::new();
        let mut left = count;
        while left > 0 {
            if clock > t {
                (t, seq) = (clock, 0);
            }
            if seq == per_tick {
                (t, seq) = (t + 1, 0);
            }
            if now.is_none() || t > clock.saturating_add(self.max_borrow) {
                let ahead = t.saturating_sub(clock);
                return Err(Refusal::ClockBehind {
                    ticks: ahead.saturating_sub(self.max_borrow).max(1),
                });
            }
            if t > self.layout.max_tick() {
                return Err(Refusal::Exhausted);
            }
            if t > self.mark && !unsafe_rules.ignore_mark {
                return Err(Refusal::MarkBehind {
                    mark: self.mark,
                    needed: t,
                });
            }
            let n = left.min(per_tick - seq);
            let first = self.layout.compose(IdParts {
                tick: t,
                slot: self.slot,
                seq,
            });
            // `t ≤ max_tick`, `seq < per_tick` and the slot was checked when the issuer was made.
            let Some(first) = first else {
                return Err(Refusal::Exhausted);
            };
            runs.push(IdRun { first, count: n });
            seq += n;
            left -= n;
        }
        (self.last, self.next_seq) = (t, seq);
        Ok(runs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SAFE: UnsafeIssuing = UnsafeIssuing {
        ignore_floor: false,
        ignore_mark: false,
    };

    fn small() -> IdLayout {
        // 4 ids a tick, so a test reaches borrowing quickly.
        IdLayout {
            tick_ms: 1,
            epoch_ms: 0,
            slot_bits: 4,
            seq_bits: 2,
        }
    }

    fn ticks(l: &IdLayout, runs: &[IdRun]) -> Vec<(u64, u64)> {
        runs.iter()
            .flat_map(|r| (r.first..r.first + r.count).map(|id| l.decompose(id).unwrap()))
            .map(|p| (p.tick, p.seq))
            .collect()
    }

    #[test]
    fn a_new_holder_issues_nothing_at_or_below_its_floor_whatever_its_clock_says() {
        let l = small();
        let mut i = SlotIssuer::new(l, 3, 100, 2);
        assert_eq!(
            i.issue(Some(500), 1, SAFE),
            Err(Refusal::MarkBehind { mark: 100, needed: 500 })
        );
        i.acknowledged(600);
        // Its clock is far behind the floor: borrowing 101 from 50 is past the bound.
        assert_eq!(i.issue(Some(50), 1, SAFE), Err(Refusal::ClockBehind { ticks: 49 }));
        assert_eq!(
            ticks(&l, &i.issue(Some(99), 3, SAFE).unwrap()),
            [(101, 0), (101, 1), (101, 2)]
        );
        assert_eq!(ticks(&l, &i.issue(Some(500), 2, SAFE).unwrap()), [(500, 0), (500, 1)]);
    }

    #[test]
    fn a_clock_that_steps_back_continues_from_the_last_tick_and_borrows_within_the_bound() {
        let l = small();
        let mut i = SlotIssuer::new(l, 1, 0, 2);
        i.acknowledged(1_000);
        assert_eq!(ticks(&l, &i.issue(Some(10), 1, SAFE).unwrap()), [(10, 0)]);
        // Back to 9: tick 10 goes on, then 11 is borrowed (2 ahead of the clock, the bound).
        let got = ticks(&l, &i.issue(Some(9), 7, SAFE).unwrap());
        assert_eq!(got, [(10, 1), (10, 2), (10, 3), (11, 0), (11, 1), (11, 2), (11, 3)]);
        assert_eq!(i.issue(Some(9), 1, SAFE), Err(Refusal::ClockBehind { ticks: 1 }));
        assert_eq!(ticks(&l, &i.issue(Some(10), 1, SAFE).unwrap()), [(12, 0)]);
        assert_eq!(i.last_tick(), 12);
    }

    #[test]
    fn all_or_nothing_and_raises_ask_a_window_ahead() {
        let l = small();
        let mut i = SlotIssuer::new(l, 1, 0, 100);
        i.acknowledged(5);
        assert_eq!(
            i.issue(Some(5), 5, SAFE),
            Err(Refusal::MarkBehind { mark: 5, needed: 6 })
        );
        assert_eq!(i.last_tick(), 0, "a refused call changes nothing");
        assert_eq!(i.wants_raise(5, 3, 20), Some(25));
        assert_eq!(i.wants_raise(1, 3, 20), None);
        i.acknowledged(3);
        assert_eq!(i.mark(), 5, "a late, lower acknowledgement changes nothing");
    }

    #[test]
    fn the_time_field_running_out_is_its_own_refusal() {
        let l = IdLayout {
            tick_ms: 1,
            epoch_ms: 0,
            slot_bits: 30,
            seq_bits: 30,
        };
        let mut i = SlotIssuer::new(l, 0, l.max_tick(), 10);
        i.acknowledged(u64::MAX);
        assert_eq!(i.issue(Some(l.max_tick() + 1), 1, SAFE), Err(Refusal::Exhausted));
    }

    #[test]
    fn the_negative_controls_break_exactly_their_rule() {
        let l = small();
        let mut old = SlotIssuer::new(l, 5, 0, 2);
        old.acknowledged(1_000);
        let before = old.issue(Some(100), 1, SAFE).unwrap()[0].first;
        // The next holder's clock stepped back 50 ticks: with the floor ignored, it repeats tick 100.
        let mut new = SlotIssuer::new(l, 5, old.mark(), 2);
        new.acknowledged(2_000);
        let ignore_floor = UnsafeIssuing {
            ignore_floor: true,
            ..SAFE
        };
        let mut repeated = false;
        for now in 50..=100 {
            let runs = new.issue(Some(now), 1, ignore_floor).unwrap();
            repeated |= runs[0].first == before;
        }
        assert!(repeated, "the control did not repeat an id");
        let mut unacked = SlotIssuer::new(l, 5, 0, 2);
        let ignore_mark = UnsafeIssuing {
            ignore_mark: true,
            ..SAFE
        };
        assert!(
            unacked.issue(Some(10), 1, ignore_mark).is_ok(),
            "issued with no mark acknowledged"
        );
    }

    proptest! {
        /// Whatever the clock does, ids strictly increase, lie within (floor, mark] and never
        /// repeat; a holder that follows another on the same slot starts above everything the
        /// first issued once it takes the first's acknowledged mark as its floor.
        #[test]
        fn ids_increase_stay_between_floor_and_mark_and_never_repeat(
            floor in 0u64..1_000,
            steps in prop::collection::vec((-50i64..50, 1u64..10, 0u64..30, any::<bool>()), 1..200),
        ) {
            let l = small();
            let mut holder = SlotIssuer::new(l, 2, floor, 3);
            let mut clock = floor as i64;
            let mut seen = Vec::new();
            for (i, &(jump, count, raise, handover)) in steps.iter().enumerate() {
                clock = (clock + jump).max(0);
                let now = clock as u64;
                if handover && i % 7 == 0 {
                    // The next holder gains the slot with the mark the store held under the old epoch.
                    holder = SlotIssuer::new(l, 2, holder.mark(), 3);
                }
                holder.acknowledged(now + raise);
                let mark = holder.mark();
                if let Ok(runs) = holder.issue(Some(now), count, SAFE) {
                    for r in runs {
                        for id in r.first..r.first + r.count {
                            let t = l.decompose(id).unwrap().tick;
                            prop_assert!(t <= mark && t <= now + 3, "tick {t} above mark {mark} or borrow");
                            prop_assert!(seen.last().is_none_or(|&last| id > last), "{id} after {seen:?}");
                            seen.push(id);
                        }
                    }
                }
            }
            prop_assert!(seen.first().is_none_or(|&id| l.decompose(id).unwrap().tick > floor));
        }
    }
}
