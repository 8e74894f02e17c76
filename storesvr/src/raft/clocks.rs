//! The replicas' wall clocks as the leader reads them, and the quorum's clock it takes from them.
//!
//! Time-ordered ids take the store leader's wall clock as the true time: a raise is capped at it
//! plus the allowance, and a holder further behind it than the allowance issues nothing
//! (docs/design/time-ordered-ids.md, U3). One replica's clock alone would be a single point of failure of the
//! whole set's ids: a leader 8 s slow capped every holder's raise below its clock, one fast by
//! more than the allowance made every holder "lagging" (issue 47, item 8). So every peer reply
//! carries the answering replica's wall clock (the [`CLOCK_HEADER`] gRPC header, beside the
//! openraft payload: no change to the Raft messages or their encoding), the leader keeps each
//! follower's offset from its own, and [`quorum_offset`] picks the clock a majority agrees with:
//! the median of the replicas' clocks, its own included. The leader stamps raises with its own
//! clock moved by that offset, publishes each offset and its own skew from the quorum as metrics
//! (`storesvr_clock_offset_ms{peer}`, `storesvr_clock_skew_ms`), and warns, naming itself, when
//! its clock disagrees with the quorum's by more than half the allowance.
//!
//! An offset is measured as `peer's clock − (own clock at send + round trip / 2)`: off by at most
//! half the round trip (well under a millisecond in one data centre), and read on every heartbeat.
//!
//! Left out: stepping down. openraft 0.9.25 has no leadership transfer (`Trigger` offers `elect`,
//! `heartbeat`, `snapshot` and `purge_log`), and a leader that only stops heartbeating may be
//! elected again; with the quorum's clock the set keeps issuing under a leader whose clock is
//! wrong, so the alert is for the operator to mend its clock at leisure. Followers do not compare
//! their clocks with each other (only a leader's clock is ever used). A peer of an older build
//! sends no clock; it is left out of the median, and with too few readings the leader uses its
//! own clock, as before.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The gRPC header of a peer reply that carries the answering replica's wall clock, Unix ms.
pub const CLOCK_HEADER: &str = "seqsvr-wall-ms";

/// How old a reading may be and still count: a follower that stopped answering for longer is
/// left out of the median (heartbeats come every 50–500 ms).
pub const FRESH_FOR: Duration = Duration::from_secs(3);

/// One follower's clock, as read at the last reply that carried it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    /// Its clock minus this replica's, ms.
    pub offset_ms: i64,
    pub round_trip: Duration,
    pub at: Instant,
}

/// The followers' clock readings this replica took as the leader (or as a candidate: vote
/// replies carry clocks too).
#[derive(Debug, Default)]
pub struct PeerClocks {
    readings: Mutex<BTreeMap<u64, Reading>>,
}

impl PeerClocks {
    /// Notes `peer`'s clock `peer_ms` from a reply to a request sent at `sent` (monotonic) when
    /// this replica's wall clock read `sent_ms`.
    pub fn record(&self, peer: u64, sent: Instant, sent_ms: u64, peer_ms: u64) {
        let round_trip = sent.elapsed();
        let mid_ms = sent_ms.saturating_add(round_trip.as_millis() as u64 / 2);
        let offset_ms = (peer_ms as i128 - mid_ms as i128).clamp(i64::MIN as i128, i64::MAX as i128) as i64;
        let reading = Reading {
            offset_ms,
            round_trip,
            at: Instant::now(),
        };
        self.lock().insert(peer, reading);
    }

    /// The readings no older than [`FRESH_FOR`] at `now`, by peer.
    pub fn fresh(&self, now: Instant) -> BTreeMap<u64, Reading> {
        self.lock()
            .iter()
            .filter(|(_, r)| now.saturating_duration_since(r.at) <= FRESH_FOR)
            .map(|(&p, &r)| (p, r))
            .collect()
    }

    /// The quorum's clock minus this replica's (see [`quorum_offset`]) over the fresh readings of
    /// `peers` (the other voters), `None` when too few are fresh.
    pub fn quorum_offset(&self, peers: &[u64], now: Instant) -> Option<i64> {
        let fresh = self.fresh(now);
        let offsets: Vec<i64> = peers.iter().filter_map(|p| fresh.get(p).map(|r| r.offset_ms)).collect();
        quorum_offset(&offsets, peers.len() + 1)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Reading>> {
        self.readings.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The clock a majority of `voters` agrees with, as an offset from this replica's: the median of
/// this replica's clock (offset 0) and the `peers`' offsets, when together they are a majority;
/// `None` otherwise. Of an even number the middle one nearer this replica's clock: two clocks
/// that disagree cannot say which is wrong, so this replica's own is kept (as before there was a
/// comparison).
///
/// With three voters and one clock wrong — the leader's or a follower's — the median is one of
/// the two right ones.
pub fn quorum_offset(peers: &[i64], voters: usize) -> Option<i64> {
    let mut all: Vec<i64> = std::iter::once(0).chain(peers.iter().copied()).collect();
    if all.len() * 2 <= voters {
        return None;
    }
    all.sort_unstable();
    let n = all.len();
    Some(match n % 2 {
        1 => all[n / 2],
        _ => {
            let (a, b) = (all[n / 2 - 1], all[n / 2]);
            if a.unsigned_abs() <= b.unsigned_abs() { a } else { b }
        }
    })
}

/// The sentence that names who disagrees with the quorum, when this replica's clock is more than
/// `tolerance_ms` off the quorum's (`offset_ms` = quorum − own).
pub fn disagreement(offset_ms: i64, tolerance_ms: u64) -> Option<String> {
    if offset_ms.unsigned_abs() <= tolerance_ms {
        return None;
    }
    let how = if offset_ms > 0 { "behind" } else { "ahead of" };
    Some(format!(
        "this StoreSvr's wall clock is {} ms {how} the median of its group's clocks, more than half the id \
         allowance ({tolerance_ms} ms): THIS HOST's clock is the one that disagrees with the quorum (check its \
         NTP); while it leads, id marks are stamped with the quorum's clock instead of its own",
        offset_ms.unsigned_abs()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quorum_clock_is_the_median_and_a_single_wrong_clock_never_wins() {
        // (followers' offsets from this replica, voters) → the quorum's offset.
        let cases: &[(&[i64], usize, Option<i64>)] = &[
            (&[], 1, Some(0)),
            (&[], 3, None),
            (&[5], 3, Some(0)),
            (&[8_000], 3, Some(0)),
            (&[-8_000], 3, Some(0)),
            // This leader is 8 s slow: both followers read 8 s more.
            (&[8_000, 8_010], 3, Some(8_000)),
            // One follower is wrong: the leader and the other agree.
            (&[3, 60_000], 3, Some(3)),
            (&[-60_000, 2], 3, Some(0)),
            (&[10, 20, 30, 40], 5, Some(20)),
            (&[10, 20], 5, Some(10)),
            (&[10], 5, None),
        ];
        for &(peers, voters, want) in cases {
            assert_eq!(quorum_offset(peers, voters), want, "{peers:?} of {voters}");
        }
    }

    #[test]
    fn a_reading_counts_while_fresh_and_names_the_side_that_disagrees() {
        let clocks = PeerClocks::default();
        let sent = Instant::now();
        clocks.record(2, sent, 1_000_000, 1_009_000);
        clocks.record(3, sent, 1_000_000, 1_009_100);
        let now = Instant::now();
        let off = clocks.quorum_offset(&[2, 3], now).unwrap();
        assert!((9_000..=9_100).contains(&off), "{off}");
        assert_eq!(clocks.quorum_offset(&[2, 3], now + FRESH_FOR * 2), None, "stale");
        let why = disagreement(off, 1_500).unwrap();
        assert!(why.contains("behind") && why.contains("THIS HOST"), "{why}");
        assert_eq!(disagreement(-1_000, 1_500), None);
    }
}
