//! The bit layout of a time-ordered id: `id = (tick − epoch) << (slot_bits + seq_bits) | slot <<
//! seq_bits | seq`, the top bit always 0 so that ids sort the same as signed and unsigned 64-bit
//! numbers. One layout serves the whole cluster and is fixed when it is set up: an id decodes the
//! same way on every node and forever.
//!
//! Presets: Twitter's Snowflake (1 ms ticks, 41 time bits, 10 slot bits, 12 sequence bits),
//! Sonyflake (10 ms ticks, 39 time bits, 16 slot bits, 8 sequence bits) and a JavaScript-safe one
//! whose ids stay at most 2^53 − 1 (a JavaScript number, `JSON.parse`) for 174 years from its
//! epoch; any other split of the 63 bits is accepted if it keeps the rules of
//! [`IdLayout::validate`], and of [`IdLayout::validate_js_safe`] when it is to be JavaScript-safe.
//!
//! Deliberately left out: clocks. Everything here takes `now` in Unix milliseconds from the
//! caller, so the arithmetic is pure and the tests need no clock.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Bits an id has for time, slot and sequence together: 64 less the sign bit.
pub const ID_BITS: u32 = 63;

/// A layout must leave its time field this many years after `now`, or it is refused (uid-generator's
/// 28-bit clock ran out in production in 2024).
pub const MIN_YEARS_LEFT: u64 = 10;

/// Milliseconds in a (Julian) year, the unit of every "years" figure here.
pub const MS_PER_YEAR: u64 = 31_557_600_000;

/// 2020-01-01T00:00:00Z in Unix milliseconds: the default epoch (Twitter's 2010 one would spend a
/// decade of the time field on nothing).
pub const DEFAULT_EPOCH_MS: u64 = 1_577_836_800_000;

/// Bits a JavaScript number holds exactly: an id of at most 2^53 − 1 survives `JSON.parse`.
pub const JS_SAFE_BITS: u32 = 53;

/// Years a JavaScript-safe layout must keep its ids within [`JS_SAFE_BITS`] from its setup.
pub const JS_SAFE_YEARS: u64 = 100;

/// How an id's 63 bits are split, and what a tick is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdLayout {
    /// Length of one tick in milliseconds (1 for Snowflake, 10 for Sonyflake).
    pub tick_ms: u64,
    /// Tick 0, in Unix milliseconds.
    pub epoch_ms: u64,
    pub slot_bits: u32,
    pub seq_bits: u32,
}

/// The parts of one id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdParts {
    /// Ticks since the layout's epoch.
    pub tick: u64,
    pub slot: u64,
    pub seq: u64,
}

/// A layout refused, with the arithmetic that refused it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("id layout {layout}: {why}")]
pub struct LayoutError {
    pub layout: String,
    pub why: String,
}

impl IdLayout {
    /// Twitter's Snowflake split (41/10/12, 1 ms ticks) with `epoch_ms`.
    pub const fn twitter(epoch_ms: u64) -> Self {
        Self {
            tick_ms: 1,
            epoch_ms,
            slot_bits: 10,
            seq_bits: 12,
        }
    }

    /// Sonyflake's split (39/16/8, 10 ms ticks) with `epoch_ms`.
    pub const fn sonyflake(epoch_ms: u64) -> Self {
        Self {
            tick_ms: 10,
            epoch_ms,
            slot_bits: 16,
            seq_bits: 8,
        }
    }

    /// The JavaScript-safe preset with `epoch_ms`: 10 ms ticks, 8 slot bits (256 slots), 6
    /// sequence bits (64 ids a tick: 6,400 a second per slot, 1.6 million for all 256); ids pass
    /// 2^53 − 1 only after 2^39 ticks, 174 years from the epoch. Its 63-bit time field would last
    /// longer; [`IdLayout::js_safe_until_ms`] is what bounds it.
    pub const fn javascript(epoch_ms: u64) -> Self {
        Self {
            tick_ms: 10,
            epoch_ms,
            slot_bits: 8,
            seq_bits: 6,
        }
    }

    /// The Unix millisecond from which ids need more than [`JS_SAFE_BITS`] bits: the start of the
    /// first tick that does (the epoch itself when the slot and sequence bits alone pass them).
    pub fn js_safe_until_ms(&self) -> u64 {
        let time_bits = JS_SAFE_BITS.saturating_sub(self.slot_bits.saturating_add(self.seq_bits));
        let span = (1u128 << time_bits) * self.tick_ms as u128;
        (self.epoch_ms as u128 + span).min(u64::MAX as u128) as u64
    }

    /// Checks that every id issued in the [`JS_SAFE_YEARS`] after `now_ms` is at most 2^53 − 1,
    /// besides [`IdLayout::validate`]'s rules; the refusal shows the arithmetic.
    pub fn validate_js_safe(&self, now_ms: u64) -> Result<(), LayoutError> {
        self.validate(now_ms)?;
        let years = self.js_safe_until_ms().saturating_sub(now_ms) as f64 / MS_PER_YEAR as f64;
        if years < JS_SAFE_YEARS as f64 {
            let time_bits = JS_SAFE_BITS.saturating_sub(self.slot_bits + self.seq_bits);
            return Err(LayoutError {
                layout: self.to_string(),
                why: format!(
                    "ids pass 2^{JS_SAFE_BITS} - 1 (a JavaScript number) after {time_bits} bits of {} ms ticks, \
                     {years:.1} years from now; at least {JS_SAFE_YEARS} are needed (fewer slot or sequence \
                     bits, or longer ticks; the javascript preset lasts 174 years from its epoch)",
                    self.tick_ms
                ),
            });
        }
        Ok(())
    }

    /// Bits left for the tick count.
    pub fn time_bits(&self) -> u32 {
        ID_BITS.saturating_sub(self.slot_bits.saturating_add(self.seq_bits))
    }

    /// The last tick the time field can hold.
    pub fn max_tick(&self) -> u64 {
        mask(self.time_bits())
    }

    pub fn slots(&self) -> u64 {
        1 << self.slot_bits
    }

    /// Ids one slot can issue in one tick.
    pub fn ids_per_tick(&self) -> u64 {
        1 << self.seq_bits
    }

    /// Most ids one `NextIds` can ever be handed under this layout: they come from one slot, from
    /// the clock's tick and the ticks borrowed ahead of it ([`crate::limits::ID_BORROW_MS`]), so
    /// `ids_per_tick × (ID_BORROW_MS / tick_ms + 1)`, and never more than
    /// [`crate::limits::MAX_IDS_PER_CALL`]. Twitter's and Sonyflake's layouts reach the latter;
    /// the least any valid layout allows is 4 (one sequence bit, ticks of a second).
    pub fn most_ids_per_call(&self) -> u32 {
        use crate::limits::{ID_BORROW_MS, MAX_IDS_PER_CALL};
        let ticks = ID_BORROW_MS / self.tick_ms.max(1) + 1;
        let most = self.ids_per_tick().saturating_mul(ticks);
        most.min(u64::from(MAX_IDS_PER_CALL)) as u32
    }

    /// The Unix millisecond at which the time field runs out (its last tick ends).
    pub fn end_ms(&self) -> u64 {
        let span = (self.max_tick() as u128 + 1) * self.tick_ms as u128;
        (self.epoch_ms as u128 + span).min(u64::MAX as u128) as u64
    }

    /// Years from `now_ms` until the time field runs out (0 once it has).
    pub fn years_left(&self, now_ms: u64) -> f64 {
        self.end_ms().saturating_sub(now_ms) as f64 / MS_PER_YEAR as f64
    }

    /// The tick that contains `now_ms`, or `None` before the epoch. Above the last tick it is still
    /// returned (the issuer refuses it, not the clock).
    pub fn tick_of(&self, now_ms: u64) -> Option<u64> {
        now_ms.checked_sub(self.epoch_ms).map(|d| d / self.tick_ms)
    }

    /// Unix milliseconds at the start of `tick`.
    pub fn ms_of(&self, tick: u64) -> u64 {
        self.epoch_ms.saturating_add(tick.saturating_mul(self.tick_ms))
    }

    /// The id of `parts`, or `None` when a part does not fit its field.
    pub fn compose(&self, parts: IdParts) -> Option<u64> {
        if parts.tick > self.max_tick() || parts.slot >= self.slots() || parts.seq >= self.ids_per_tick() {
            return None;
        }
        Some(parts.tick << (self.slot_bits + self.seq_bits) | parts.slot << self.seq_bits | parts.seq)
    }

    /// The parts of `id`; `None` when its top bit is set (no layout issues such ids).
    pub fn decompose(&self, id: u64) -> Option<IdParts> {
        if id >> ID_BITS != 0 {
            return None;
        }
        Some(IdParts {
            tick: id >> (self.slot_bits + self.seq_bits),
            slot: (id >> self.seq_bits) & mask(self.slot_bits),
            seq: id & mask(self.seq_bits),
        })
    }

    /// Checks the layout against `now_ms`: the bits add up to 63 with room for time, a tick is at
    /// least 1 ms and at most a second, the epoch is not in the future, and the time field lasts
    /// at least [`MIN_YEARS_LEFT`] more years. Each refusal shows its arithmetic.
    pub fn validate(&self, now_ms: u64) -> Result<(), LayoutError> {
        let refuse = |why: String| {
            Err(LayoutError {
                layout: self.to_string(),
                why,
            })
        };
        if self.tick_ms == 0 || self.tick_ms > 1_000 {
            return refuse(format!("a tick of {} ms is outside 1..=1000 ms", self.tick_ms));
        }
        if self.seq_bits == 0 || self.slot_bits == 0 {
            return refuse("slot and sequence bits must each be at least 1".into());
        }
        let used = self.slot_bits.saturating_add(self.seq_bits);
        if used >= ID_BITS {
            return refuse(format!(
                "{} slot bits + {} sequence bits = {used}, which leaves no time bits of the {ID_BITS}",
                self.slot_bits, self.seq_bits
            ));
        }
        if self.epoch_ms > now_ms {
            return refuse(format!(
                "the epoch ({} ms) is {} ms in the future",
                self.epoch_ms,
                self.epoch_ms - now_ms
            ));
        }
        let years = self.years_left(now_ms);
        if years < MIN_YEARS_LEFT as f64 {
            return refuse(format!(
                "{} time bits × {} ms a tick = {:.1} years from the epoch, {years:.1} of them left; at least \
                 {MIN_YEARS_LEFT} are needed (fewer slot or sequence bits, longer ticks, or a later epoch)",
                self.time_bits(),
                self.tick_ms,
                (self.max_tick() as f64 + 1.0) * self.tick_ms as f64 / MS_PER_YEAR as f64,
            ));
        }
        Ok(())
    }
}

impl IdLayout {
    pub fn to_pb(&self) -> crate::pb::IdLayout {
        crate::pb::IdLayout {
            tick_ms: self.tick_ms,
            epoch_ms: self.epoch_ms,
            slot_bits: self.slot_bits,
            seq_bits: self.seq_bits,
        }
    }

    /// The wire form read back, with the rules that do not depend on the clock (bits and tick);
    /// a layout that was valid when set up stays usable after its ten years are down to fewer.
    pub fn from_pb(p: &crate::pb::IdLayout) -> Result<Self, LayoutError> {
        let layout = Self {
            tick_ms: p.tick_ms,
            epoch_ms: p.epoch_ms,
            slot_bits: p.slot_bits,
            seq_bits: p.seq_bits,
        };
        // Checked against its own epoch: the bits and the tick, not the years left.
        let bits_ok = p.slot_bits >= 1 && p.seq_bits >= 1 && p.slot_bits.saturating_add(p.seq_bits) < ID_BITS;
        if !bits_ok || p.tick_ms == 0 || p.tick_ms > 1_000 {
            return Err(LayoutError {
                layout: format!("{}/{}/{} ms", p.slot_bits, p.seq_bits, p.tick_ms),
                why: "slot and sequence bits must each be at least 1 and leave time bits, a tick 1..=1000 ms".into(),
            });
        }
        Ok(layout)
    }
}

fn mask(bits: u32) -> u64 {
    if bits >= 64 { u64::MAX } else { (1u64 << bits) - 1 }
}

/// `time/slot/seq bits, tick, epoch`, the form the flags take apart from the presets.
impl fmt::Display for IdLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{} bits, {} ms ticks, epoch {} ms",
            self.time_bits(),
            self.slot_bits,
            self.seq_bits,
            self.tick_ms,
            self.epoch_ms
        )
    }
}

/// The flag form of a layout's shape: `twitter`, `sonyflake`, `javascript`, or
/// `SLOT_BITS/SEQ_BITS/TICK_MS` (time gets the bits left). The epoch is a flag of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayoutShape {
    pub tick_ms: u64,
    pub slot_bits: u32,
    pub seq_bits: u32,
    /// Named `javascript`: the layout must pass [`IdLayout::validate_js_safe`] too.
    pub js_safe: bool,
}

impl LayoutShape {
    pub fn with_epoch(self, epoch_ms: u64) -> IdLayout {
        IdLayout {
            tick_ms: self.tick_ms,
            epoch_ms,
            slot_bits: self.slot_bits,
            seq_bits: self.seq_bits,
        }
    }
}

impl FromStr for LayoutShape {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let from = |l: IdLayout, js_safe: bool| LayoutShape {
            tick_ms: l.tick_ms,
            slot_bits: l.slot_bits,
            seq_bits: l.seq_bits,
            js_safe,
        };
        match s {
            "twitter" | "snowflake" => return Ok(from(IdLayout::twitter(0), false)),
            "sonyflake" => return Ok(from(IdLayout::sonyflake(0), false)),
            "javascript" | "js" => return Ok(from(IdLayout::javascript(0), true)),
            _ => {}
        }
        let parts: Vec<&str> = s.split('/').collect();
        let [slot, seq, tick] = parts.as_slice() else {
            return Err(format!(
                "{s:?}: expected twitter, sonyflake, javascript or SLOT_BITS/SEQ_BITS/TICK_MS (e.g. 10/12/1)"
            ));
        };
        let num = |what: &str, v: &str| v.parse::<u64>().map_err(|e| format!("{s:?}: {what} {v:?}: {e}"));
        let (slot_bits, seq_bits) = (num("slot bits", slot)?, num("sequence bits", seq)?);
        if slot_bits > 62 || seq_bits > 62 {
            return Err(format!("{s:?}: a field of more than 62 bits leaves no room for time"));
        }
        Ok(LayoutShape {
            tick_ms: num("tick ms", tick)?,
            slot_bits: slot_bits as u32,
            seq_bits: seq_bits as u32,
            js_safe: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// 2026-11-27T00:00:00Z.
    const NOW: u64 = 1_795_737_600_000;

    #[test]
    fn the_presets_are_valid_with_the_default_epoch_and_last_decades() {
        let t = IdLayout::twitter(DEFAULT_EPOCH_MS);
        assert_eq!((t.time_bits(), t.slots(), t.ids_per_tick()), (41, 1024, 4096));
        assert_eq!(t.validate(NOW), Ok(()));
        // 2^41 ms is 69.7 years from 2020.
        assert!((t.years_left(NOW) - 62.7).abs() < 0.1, "{}", t.years_left(NOW));
        let s = IdLayout::sonyflake(DEFAULT_EPOCH_MS);
        assert_eq!((s.time_bits(), s.slots(), s.ids_per_tick()), (39, 65_536, 256));
        assert_eq!(s.validate(NOW), Ok(()));
        assert!(s.years_left(NOW) > 160.0);
    }

    #[test]
    fn the_javascript_preset_keeps_ids_within_53_bits_for_a_century() {
        let js = IdLayout::javascript(DEFAULT_EPOCH_MS);
        assert_eq!((js.slots(), js.ids_per_tick()), (256, 64));
        assert_eq!(js.validate_js_safe(NOW), Ok(()));
        // 2^39 ticks of 10 ms: 174.2 years from 2020.
        let years = (js.js_safe_until_ms() - DEFAULT_EPOCH_MS) as f64 / MS_PER_YEAR as f64;
        assert!((years - 174.2).abs() < 0.1, "{years}");
        // The last id of the last safe tick is exactly 2^53 - 1; the next tick's first passes it.
        let last_tick = (js.js_safe_until_ms() - js.epoch_ms) / js.tick_ms - 1;
        let last = js
            .compose(IdParts {
                tick: last_tick,
                slot: 255,
                seq: 63,
            })
            .unwrap();
        assert_eq!(last, (1u64 << 53) - 1);
        let next = js
            .compose(IdParts {
                tick: last_tick + 1,
                slot: 0,
                seq: 0,
            })
            .unwrap();
        assert_eq!(next, 1u64 << 53);
        let shape: LayoutShape = "javascript".parse().unwrap();
        assert!(shape.js_safe);
        assert_eq!(shape.with_epoch(DEFAULT_EPOCH_MS), js);
    }

    #[test]
    fn a_layout_that_passes_53_bits_within_a_century_is_refused_with_its_arithmetic() {
        // Twitter's split passes 2^53 within 2^31 ms: 24.9 days.
        let err = IdLayout::twitter(DEFAULT_EPOCH_MS)
            .validate_js_safe(NOW)
            .unwrap_err()
            .to_string();
        assert!(err.contains("after 31 bits of 1 ms ticks"), "{err}");
        assert!(err.contains("at least 100 are needed"), "{err}");
        // One more sequence bit halves the 174 years from 2020: 80.2 left in 2026, refused.
        let wider = IdLayout {
            seq_bits: 7,
            ..IdLayout::javascript(DEFAULT_EPOCH_MS)
        };
        let err = wider.validate_js_safe(NOW).unwrap_err().to_string();
        assert!(err.contains("80.2 years from now"), "{err}");
        // Its 63-bit rules still apply first.
        let future = IdLayout::javascript(NOW + 1);
        assert!(
            future
                .validate_js_safe(NOW)
                .unwrap_err()
                .to_string()
                .contains("in the future")
        );
    }

    #[test]
    fn bad_layouts_are_refused_with_their_arithmetic() {
        let err = |l: IdLayout| l.validate(NOW).unwrap_err().to_string();
        let short = IdLayout {
            slot_bits: 16,
            seq_bits: 12,
            ..IdLayout::twitter(DEFAULT_EPOCH_MS)
        };
        let msg = err(short);
        assert!(msg.contains("35 time bits × 1 ms a tick = 1.1 years"), "{msg}");
        assert!(msg.contains("at least 10 are needed"), "{msg}");
        let full = IdLayout {
            slot_bits: 40,
            seq_bits: 23,
            ..IdLayout::twitter(0)
        };
        assert!(
            err(full).contains("40 slot bits + 23 sequence bits = 63"),
            "{}",
            err(full)
        );
        let future = IdLayout::twitter(NOW + 5);
        assert!(err(future).contains("5 ms in the future"), "{}", err(future));
        assert!(err(IdLayout { tick_ms: 0, ..future }).contains("tick of 0 ms"));
        assert!(
            err(IdLayout {
                seq_bits: 0,
                ..IdLayout::twitter(0)
            })
            .contains("at least 1")
        );
        // uid-generator's default (28 time bits of seconds from 2016) ran out in 2024.
        let uid_gen = IdLayout {
            tick_ms: 1_000,
            epoch_ms: 1_463_673_600_000,
            slot_bits: 22,
            seq_bits: 13,
        };
        assert!(err(uid_gen).contains("0.0 of them left"), "{}", err(uid_gen));
    }

    #[test]
    fn shapes_parse_from_presets_and_bit_counts() {
        assert_eq!(
            "twitter".parse::<LayoutShape>().unwrap().with_epoch(7),
            IdLayout::twitter(7)
        );
        assert_eq!(
            "sonyflake".parse::<LayoutShape>().unwrap().with_epoch(7),
            IdLayout::sonyflake(7)
        );
        let custom: LayoutShape = "8/14/2".parse().unwrap();
        assert_eq!((custom.slot_bits, custom.seq_bits, custom.tick_ms), (8, 14, 2));
        for bad in ["", "10/12", "a/12/1", "10/12/1/1", "99/1/1"] {
            assert!(bad.parse::<LayoutShape>().is_err(), "{bad}");
        }
    }

    #[test]
    fn one_call_is_handed_at_most_the_clocks_tick_and_the_borrowed_ones() {
        let shape = |slot_bits, seq_bits, tick_ms| IdLayout {
            tick_ms,
            epoch_ms: 0,
            slot_bits,
            seq_bits,
        };
        let most = |l: IdLayout| l.most_ids_per_call();
        // 4,096 × 1,001 ticks and 256 × 101 ticks: the wire's limit.
        assert_eq!(most(IdLayout::twitter(0)), 4_096);
        assert_eq!(most(IdLayout::sonyflake(0)), 4_096);
        // 4 a tick of a second, one tick borrowed; the least any valid layout allows.
        assert_eq!(most(shape(4, 2, 1_000)), 8);
        assert_eq!(most(shape(20, 1, 1_000)), 4);
        // 2 a tick of 10 ms, 100 borrowed; and sequence bits that would overflow a product.
        assert_eq!(most(shape(10, 1, 10)), 202);
        assert_eq!(most(shape(1, 61, 1)), 4_096);
    }

    #[test]
    fn compose_refuses_parts_that_do_not_fit_and_decompose_refuses_the_top_bit() {
        let l = IdLayout::twitter(0);
        assert_eq!(
            l.compose(IdParts {
                tick: 0,
                slot: 1024,
                seq: 0
            }),
            None
        );
        assert_eq!(
            l.compose(IdParts {
                tick: 0,
                slot: 0,
                seq: 4096
            }),
            None
        );
        assert_eq!(
            l.compose(IdParts {
                tick: 1 << 41,
                slot: 0,
                seq: 0
            }),
            None
        );
        assert_eq!(l.decompose(1 << 63), None);
        assert_eq!(
            l.compose(IdParts {
                tick: 1,
                slot: 1,
                seq: 1
            }),
            Some((1 << 22) | (1 << 12) | 1)
        );
    }

    proptest! {
        #[test]
        fn ids_round_trip_and_sort_by_tick_then_slot_then_seq(
            slot_bits in 1u32..20, seq_bits in 1u32..20,
            a in any::<(u64, u64, u64)>(), b in any::<(u64, u64, u64)>(),
        ) {
            let l = IdLayout { tick_ms: 1, epoch_ms: 0, slot_bits, seq_bits };
            let fit = |(t, s, q): (u64, u64, u64)| IdParts {
                tick: t % (l.max_tick() + 1), slot: s % l.slots(), seq: q % l.ids_per_tick(),
            };
            let (pa, pb) = (fit(a), fit(b));
            let (ia, ib) = (l.compose(pa).unwrap(), l.compose(pb).unwrap());
            prop_assert_eq!(l.decompose(ia), Some(pa));
            prop_assert!(ia >> 63 == 0);
            prop_assert_eq!(ia.cmp(&ib), (pa.tick, pa.slot, pa.seq).cmp(&(pb.tick, pb.slot, pb.seq)));
        }
    }
}
