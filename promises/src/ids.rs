//! Time-ordered ids (docs/design/time-ordered-ids.md): every id once across the whole history
//! (U1), and each stamped within the allowance of the true time while its call ran (U3).
//!
//! The callers decide what "the true time" is: the simulator's clock, or the wall clock of the
//! host that made the calls (`seqctl verify`, whose own clock error then counts against the
//! allowance).
//!
//! Deliberately left out: order between calls (U2 needs each reply's slot grant, which only the
//! simulator records), and clock faults (the simulator widens the window itself while it injects
//! them).

use seqsvr_proto::id_layout::IdLayout;

/// Ids that appear more than once, with the two calls (or other tags) that got them. `all` is
/// every `(id, tag)`; `order` sorts the tags of one id so that the earliest evidence comes first.
pub fn repeated<T: Copy, K: Ord>(mut all: Vec<(u64, T)>, order: impl Fn(&T) -> K) -> Vec<(u64, T, T)> {
    all.sort_unstable_by(|a, b| a.0.cmp(&b.0).then_with(|| order(&a.1).cmp(&order(&b.1))));
    all.windows(2)
        .filter(|w| w[0].0 == w[1].0)
        .map(|w| (w[0].0, w[0].1, w[1].1))
        .collect()
}

/// The stamps (Unix ms) an id of a call may carry: from the true time at invoke less the
/// allowance and one tick (a tick starts at or before the clock that chose it), to the true time
/// at completion plus the allowance. Both ends inclusive.
pub fn stamp_window(layout: &IdLayout, invoke_ms: i128, complete_ms: i128, allowance_ms: i128) -> (i128, i128) {
    (
        invoke_ms - allowance_ms - layout.tick_ms as i128,
        complete_ms + allowance_ms + 1,
    )
}

/// Where one id's stamp falls against its window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stamp {
    Within,
    /// The id's stamp (Unix ms) and the bound it broke.
    TooEarly {
        stamp_ms: i128,
        bound_ms: i128,
    },
    TooLate {
        stamp_ms: i128,
        bound_ms: i128,
    },
    /// The id does not decode under the layout.
    Undecodable,
}

/// Judges one id's stamp against [`stamp_window`].
pub fn judge_stamp(layout: &IdLayout, id: u64, window: (i128, i128)) -> Stamp {
    let Some(parts) = layout.decompose(id) else {
        return Stamp::Undecodable;
    };
    let stamp_ms = layout.ms_of(parts.tick) as i128;
    if stamp_ms < window.0 {
        Stamp::TooEarly {
            stamp_ms,
            bound_ms: window.0,
        }
    } else if stamp_ms > window.1 {
        Stamp::TooLate {
            stamp_ms,
            bound_ms: window.1,
        }
    } else {
        Stamp::Within
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use seqsvr_proto::id_layout::IdParts;

    #[test]
    fn repeats_are_found_once_per_extra_copy_with_the_earliest_first() {
        let found = repeated(vec![(5, 30u64), (7, 1), (5, 10), (6, 2), (5, 20)], |t| *t);
        assert_eq!(found, vec![(5, 10, 20), (5, 20, 30)]);
        assert!(repeated(vec![(1, 0u8), (2, 0)], |t| *t).is_empty());
    }

    #[test]
    fn a_stamp_outside_the_allowance_is_early_or_late() {
        let layout = IdLayout::twitter(1_700_000_000_000);
        let id_at = |ms: u64| {
            layout
                .compose(IdParts {
                    tick: layout.tick_of(ms).unwrap(),
                    slot: 3,
                    seq: 0,
                })
                .unwrap()
        };
        let now: i128 = 1_800_000_000_000;
        let w = stamp_window(&layout, now, now + 5, 3_000);
        assert_eq!(judge_stamp(&layout, id_at(1_800_000_000_000 - 2_999), w), Stamp::Within);
        assert_eq!(judge_stamp(&layout, id_at(1_800_000_003_005), w), Stamp::Within);
        assert!(matches!(
            judge_stamp(&layout, id_at(1_800_000_000_000 - 5_000), w),
            Stamp::TooEarly { .. }
        ));
        assert!(matches!(
            judge_stamp(&layout, id_at(1_800_000_004_000), w),
            Stamp::TooLate { .. }
        ));
    }
}
