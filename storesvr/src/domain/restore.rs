//! Restoring a set from a backup: the margin and what it does to the backed-up state. Pure: the
//! caller hands in the state, the margin and the new replica's id (`crate::restore` reads the file
//! and writes the data dir).
//!
//! **Why every ceiling is raised.** A backup is a copy of the set at one log index. The set went on
//! serving after it: every Bump committed after the backup let an AllocSvr hand out numbers above
//! the backed-up `max_seq`, up to the ceiling the set had when it died. Those numbers are gone from
//! the backup, not from the world. A set restored with the backed-up ceilings would load them,
//! start every uid there and hand out numbers that were already served: P1 broken. Only a margin
//! at least as large as the growth of a section's ceiling since the backup keeps P1, because then
//! `backed-up max_seq + margin >= every number ever served`, and a new owner serves strictly above
//! the ceiling it loads. Nobody can measure that growth after the fact (the set is gone), so the
//! operator bounds it: a number of steps they know is enough, or a bound on bumps per second
//! times the backup's age ([`choose_margin`]). Too large a margin only skips numbers (P6's waste);
//! too small a one repeats them. docs/BACKUP.md says how to choose.
//!
//! **What else changes, and why.**
//! - Every section loses its owner and its epoch goes up by one, with `no_wait` off: no AllocSvr
//!   continues a lease from the old set, and the first owner of the new set waits out a lease
//!   (rule 4) in case an AllocSvr of the old set still serves from memory.
//! - The AllocSvr registry is emptied and the incarnation counter jumps by [`VERSION_GAP`]: the
//!   old set may have minted incarnations after the backup, and one of them presented to the new
//!   set must never match a fresh registration (P4).
//! - The route version jumps by [`VERSION_GAP`]: clients keep only route tables newer than the one
//!   they hold, and they may hold one the old set issued after the backup.
//! - A backup taken while a move had a range importing or frozen is refused: the move went on (or
//!   was cancelled) after it, and the restored set cannot know which side the range ended on.
//!
//! Left out: the cluster map's own version and contents (set 0) and the move records are restored
//! as they were: a map change or move after the backup is not recoverable from this set's backup
//! alone, which is why docs/BACKUP.md asks for a backup after every one.

use std::time::Duration;

#[cfg(test)]
use seqsvr_proto::SectionId;
use seqsvr_proto::{Epoch, Incarnation, NodeId};
use thiserror::Error;

use super::ranges::RangeState;
use super::state::{MAX_BUMP_STEPS, NOBODY, SetState};

/// How far the route version and the incarnation counter jump on a restore: more than any set
/// can issue between a backup and its restore (one a millisecond for 136 years), and still 2^32
/// restores before the `u64` runs out.
pub const VERSION_GAP: u64 = 1 << 32;

/// How the operator bounds the ceiling growth since the backup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MarginArgs {
    /// Steps every section may have grown by since the backup.
    pub steps: Option<u64>,
    /// Most bumps one section can have committed per second since the backup.
    pub max_bumps_per_sec: Option<u64>,
}

/// The margin chosen and how it was derived, for the operator's report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Margin {
    pub seqs: u64,
    pub why: String,
}

/// Why a backup cannot be restored as asked.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum RestoreError {
    #[error(
        "no margin given: pass --margin-steps N and/or --max-bumps-per-sec R (see docs/BACKUP.md, \
         \"Choosing the margin\")"
    )]
    NoMargin,
    #[error("the margin does not fit in 64 bits ({0})")]
    MarginOverflow(String),
    #[error(
        "the backup was taken {ahead_ms} ms after this machine's clock says it is now: its age is unknown, so \
         --max-bumps-per-sec cannot bound the growth since; give --margin-steps"
    )]
    BackupFromTheFuture { ahead_ms: u64 },
    #[error("the backup holds a set that was never initialized: nothing to restore")]
    NotInitialized,
    #[error(
        "section {section}: max_seq {max_seq} + margin {margin} passes 2^64-1; choose a smaller margin \
         (the section cannot be raised that far)"
    )]
    Overflow { section: u64, max_seq: u64, margin: u64 },
    #[error(
        "the backup was taken while move {op} had sections {begin}..{end} {what}: the move went on after the \
         backup, so the restored set cannot know where the range ended up; restore a backup taken before the \
         move began or after it ended"
    )]
    MoveInFlight {
        op: u64,
        begin: u64,
        end: u64,
        what: &'static str,
    },
    #[error("node id {0} was a member of the backed-up set: give the restored replica a node id never used")]
    NodeIdUsed(u64),
    #[error("the {0} cannot jump by 2^32 without passing 2^64-1")]
    VersionOverflow(&'static str),
}

/// The margin `args` ask for: the larger of `steps × step` and what `max_bumps_per_sec` can
/// raise a ceiling by in `age` (each bump at most [`MAX_BUMP_STEPS`] steps, plus one bump that
/// may have been in flight). `age` is `None` when the backup's time is ahead of the clock by
/// the given milliseconds.
pub fn choose_margin(step: u64, args: MarginArgs, age: Result<Duration, u64>) -> Result<Margin, RestoreError> {
    let overflow = |what: String| RestoreError::MarginOverflow(what);
    let mut best: Option<Margin> = None;
    if let Some(n) = args.steps {
        let seqs = n
            .checked_mul(step)
            .ok_or_else(|| overflow(format!("{n} steps of {step}")))?;
        best = Some(Margin {
            seqs,
            why: format!("--margin-steps {n} × step {step}"),
        });
    }
    if let Some(rate) = args.max_bumps_per_sec {
        let age = age.map_err(|ahead_ms| RestoreError::BackupFromTheFuture { ahead_ms })?;
        let bumps = (age.as_millis() * rate as u128).div_ceil(1000) + 1;
        let seqs = bumps * (MAX_BUMP_STEPS as u128) * step as u128;
        let seqs = u64::try_from(seqs).map_err(|_| overflow(format!("{bumps} bumps of {MAX_BUMP_STEPS} steps")))?;
        let why = format!(
            "backup age {:.1} s × {rate} bumps/s + 1 = {bumps} bumps × {MAX_BUMP_STEPS} steps × step {step}",
            age.as_secs_f64()
        );
        if best.as_ref().is_none_or(|b| seqs > b.seqs) {
            best = Some(Margin { seqs, why });
        }
    }
    best.ok_or(RestoreError::NoMargin)
}

/// What a restore changed, for the operator's report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Raised {
    pub sections: u64,
    pub margin: u64,
    /// Lowest and highest `max_seq` before and after.
    pub max_seq_before: (u64, u64),
    pub max_seq_after: (u64, u64),
    /// Sections that had an owner in the backup.
    pub owners_cleared: u64,
    /// AllocSvr registrations forgotten.
    pub allocsvrs_forgotten: usize,
    pub route_version: (u64, u64),
    pub last_incarnation: (u64, u64),
}

/// Refuses a backup taken while a move had a range importing or frozen here.
fn refuse_moves_in_flight(st: &SetState) -> Result<(), RestoreError> {
    for run in st.ranges.runs() {
        let (op, what) = match run.state {
            RangeState::Importing { op } => (op, "importing"),
            RangeState::Migrating { op, .. } => (op, "frozen for export"),
            RangeState::Owned | RangeState::Tombstoned { .. } => continue,
        };
        return Err(RestoreError::MoveInFlight {
            op,
            begin: run.begin.0,
            end: run.end.0,
            what,
        });
    }
    Ok(())
}

/// The state a new set starts from: `backup` with every ceiling raised by `margin`, no owners,
/// epochs up by one, no AllocSvrs, and the route version and incarnation counter moved past
/// anything the old set can have issued; `node` is recorded as a member (it must be a new id).
pub fn restore(backup: &SetState, margin: u64, node: NodeId) -> Result<(SetState, Raised), RestoreError> {
    if backup.params.is_none() {
        return Err(RestoreError::NotInitialized);
    }
    refuse_moves_in_flight(backup)?;
    if backup.replica_ids_ever.contains(&node) {
        return Err(RestoreError::NodeIdUsed(node.0));
    }
    let jump = |v: u64, what| v.checked_add(VERSION_GAP).ok_or(RestoreError::VersionOverflow(what));
    let mut st = backup.clone();
    let mut r = Raised {
        margin,
        max_seq_before: (u64::MAX, 0),
        max_seq_after: (u64::MAX, 0),
        allocsvrs_forgotten: st.allocsvrs.len(),
        route_version: (st.route_version, jump(st.route_version, "route version")?),
        last_incarnation: (
            st.last_incarnation.0,
            jump(st.last_incarnation.0, "incarnation counter")?,
        ),
        ..Raised::default()
    };
    for (i, s) in st.sections.iter_mut().enumerate() {
        let raised = s.max_seq.checked_add(margin).ok_or(RestoreError::Overflow {
            section: i as u64,
            max_seq: s.max_seq,
            margin,
        })?;
        r.max_seq_before = (r.max_seq_before.0.min(s.max_seq), r.max_seq_before.1.max(s.max_seq));
        r.max_seq_after = (r.max_seq_after.0.min(raised), r.max_seq_after.1.max(raised));
        r.owners_cleared += u64::from(s.owner != NOBODY);
        s.max_seq = raised;
        s.owner = NOBODY;
        s.epoch = Epoch(s.epoch.0.saturating_add(1));
        s.no_wait = false;
    }
    r.sections = st.sections.len() as u64;
    st.allocsvrs.clear();
    st.bindings = Default::default();
    st.route_version = r.route_version.1;
    st.last_incarnation = Incarnation(r.last_incarnation.1);
    st.replica_ids_ever.insert(node);
    debug_assert!(
        st.sections
            .iter()
            .zip(&backup.sections)
            .all(|(a, b)| a.max_seq == b.max_seq + margin && a.owner == NOBODY && a.epoch > b.epoch)
    );
    Ok((st, r))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ranges::RangeState;
    use crate::domain::state::{BumpItem, Command, CommandResult};
    use crate::domain::testing::{set_with, small_params};

    /// A set whose sections 0..10 are owned by one AllocSvr, section 3 bumped to 10.
    fn served() -> SetState {
        let (mut st, incs) = set_with(&[1]);
        let moves = vec![crate::domain::state::Move {
            begin: SectionId(0),
            end: SectionId(10),
            from: NOBODY,
            to: incs[0],
        }];
        st.apply(&Command::Assign { expire: vec![], moves }, false);
        let epoch = st.sections[3].epoch;
        let bump = Command::Bump {
            incarnation: incs[0],
            items: vec![BumpItem {
                section: SectionId(3),
                epoch,
                new_max: 10,
            }],
        };
        assert!(matches!(st.apply(&bump, false), CommandResult::Bumped(_)));
        st
    }

    #[test]
    fn every_ceiling_goes_up_by_the_margin_and_every_owner_goes() {
        let before = served();
        let (after, r) = restore(&before, 1_000, NodeId(9)).unwrap();
        for (a, b) in after.sections.iter().zip(&before.sections) {
            assert_eq!(a.max_seq, b.max_seq + 1_000);
            assert_eq!((a.owner, a.epoch, a.no_wait), (NOBODY, Epoch(b.epoch.0 + 1), false));
        }
        assert_eq!(after.sections[3].max_seq, 1_010);
        assert!(after.allocsvrs.is_empty());
        assert_eq!(after.route_version, before.route_version + VERSION_GAP);
        assert_eq!(after.last_incarnation.0, before.last_incarnation.0 + VERSION_GAP);
        assert!(after.replica_ids_ever.contains(&NodeId(9)));
        assert_eq!(after.params, before.params);
        assert_eq!(r.sections, 10);
        assert_eq!((r.max_seq_before, r.max_seq_after), ((0, 10), (1_000, 1_010)));
        assert_eq!((r.owners_cleared, r.allocsvrs_forgotten), (10, 1));
    }

    #[test]
    fn an_overflowing_section_is_named_and_nothing_is_returned() {
        let mut st = served();
        st.sections[7].max_seq = u64::MAX - 5;
        let err = restore(&st, 6, NodeId(9)).unwrap_err();
        assert_eq!(
            err,
            RestoreError::Overflow {
                section: 7,
                max_seq: u64::MAX - 5,
                margin: 6
            }
        );
        assert!(err.to_string().contains("section 7"), "{err}");
        assert!(restore(&st, 5, NodeId(9)).is_ok(), "exactly 2^64-1 fits");
    }

    #[test]
    fn a_move_in_flight_an_uninitialized_set_or_a_used_node_id_is_refused() {
        let mut st = served();
        st.ranges.set(
            SectionId(2),
            SectionId(4),
            Some(RangeState::Migrating { op: 5, to_set: 1 }),
        );
        assert!(matches!(
            restore(&st, 1, NodeId(9)),
            Err(RestoreError::MoveInFlight {
                op: 5,
                begin: 2,
                end: 4,
                ..
            })
        ));
        st.ranges
            .set(SectionId(2), SectionId(4), Some(RangeState::Importing { op: 6 }));
        assert!(matches!(
            restore(&st, 1, NodeId(9)),
            Err(RestoreError::MoveInFlight { op: 6, .. })
        ));
        assert_eq!(
            restore(&SetState::default(), 1, NodeId(9)),
            Err(RestoreError::NotInitialized)
        );
        let mut st = served();
        st.replica_ids_ever.insert(NodeId(4));
        assert_eq!(restore(&st, 1, NodeId(4)), Err(RestoreError::NodeIdUsed(4)));
    }

    #[test]
    fn the_margin_is_the_larger_bound_the_operator_gives() {
        let step = small_params().step; // 5
        let secs = |s| Ok(Duration::from_secs(s));
        let steps = |n| MarginArgs {
            steps: Some(n),
            ..Default::default()
        };
        let rate = |r| MarginArgs {
            max_bumps_per_sec: Some(r),
            ..Default::default()
        };
        type Age = Result<Duration, u64>;
        let cases: &[(MarginArgs, Age, Result<u64, RestoreError>)] = &[
            (steps(10), secs(0), Ok(50)),
            (steps(0), secs(0), Ok(0)),
            // 2.5 s at 3 bumps/s: ceil(7.5) + 1 = 9 bumps of 4 steps of 5.
            (rate(3), Ok(Duration::from_millis(2_500)), Ok(9 * 4 * 5)),
            (rate(0), secs(100), Ok(4 * 5)),
            (
                MarginArgs {
                    steps: Some(1_000),
                    max_bumps_per_sec: Some(1),
                },
                secs(10),
                Ok(5_000),
            ),
            (
                MarginArgs {
                    steps: Some(1),
                    max_bumps_per_sec: Some(1),
                },
                secs(10),
                Ok(11 * 4 * 5),
            ),
            (MarginArgs::default(), secs(1), Err(RestoreError::NoMargin)),
            (
                rate(1),
                Err(1_500),
                Err(RestoreError::BackupFromTheFuture { ahead_ms: 1_500 }),
            ),
        ];
        for (args, age, want) in cases {
            let got = choose_margin(step, *args, *age).map(|m| m.seqs);
            assert_eq!(&got, want, "{args:?} {age:?}");
        }
        assert!(matches!(
            choose_margin(u64::MAX / 2, steps(3), secs(0)),
            Err(RestoreError::MarginOverflow(_))
        ));
        assert!(matches!(
            choose_margin(1 << 40, rate(1 << 30), secs(1 << 20)),
            Err(RestoreError::MarginOverflow(_))
        ));
    }
}
