//! The AllocSvrs' memory through a hostile run: every [`EVERY`], each AllocSvr's resident set
//! (`VmRSS`) and its high-water mark (`VmHWM`, which also catches a peak between two samples) from
//! `/proc/PID/status`. A process restarted (by a fault or after a crash) starts a new mark; the
//! peak kept is the highest of all its incarnations.
//!
//! Deliberately left out: the StoreSvrs (the floods reach the front ends, which only AllocSvrs
//! serve) and memory that is not resident (swap, reserved address space).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use super::super::Lab;
use crate::topology::alloc_name;

const EVERY: Duration = Duration::from_millis(250);
pub(super) const MIB: u64 = 1024 * 1024;

/// `(VmRSS, VmHWM)` in bytes from the text of `/proc/PID/status`.
pub(super) fn parse_status(status: &str) -> Option<(u64, u64)> {
    let kib = |key: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(key))?;
        let mut words = line[key.len()..].split_whitespace();
        let n: u64 = words.next()?.parse().ok()?;
        (words.next()? == "kB").then_some(n * 1024)
    };
    Some((kib("VmRSS:")?, kib("VmHWM:")?))
}

/// One AllocSvr's memory so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Rss {
    pub peak: u64,
    /// The highest resident set sampled before the floods began.
    pub before_floods: u64,
    /// The last sample's resident set.
    pub end: u64,
}

/// Every AllocSvr's memory, and the first time one passed the bound.
#[derive(Debug, Default)]
pub(super) struct RssBook {
    pub per: BTreeMap<String, Rss>,
    /// `(process, bytes, at_ns)` of the first sample past the bound.
    pub over: Option<(String, u64, u64)>,
    pub samples: u64,
}

impl RssBook {
    /// Adds one reading of `name` at `at_ns` (`before_floods`: taken before the floods began).
    pub(super) fn add(&mut self, name: &str, (rss, hwm): (u64, u64), at_ns: u64, before_floods: bool, bound: u64) {
        let e = self.per.entry(name.to_string()).or_default();
        e.peak = e.peak.max(rss).max(hwm);
        if before_floods {
            e.before_floods = e.before_floods.max(rss);
        }
        e.end = rss;
        self.samples += 1;
        if self.over.is_none() && e.peak > bound {
            self.over = Some((name.to_string(), e.peak, at_ns));
        }
    }
}

/// Samples every AllocSvr of the run until `stop`; the floods begin at `floods_from_ns` (on the
/// run's clock; `u64::MAX` until they do).
pub(super) async fn sample(
    lab: Arc<Lab>,
    bound: u64,
    floods_from_ns: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> RssBook {
    let names: Vec<String> = lab.topo.alloc_addr.keys().map(|&i| alloc_name(i)).collect();
    let clock = lab.history.clock();
    let mut book = RssBook::default();
    while !stop.load(Ordering::Relaxed) {
        let pids: Vec<(&String, Option<u32>)> = {
            let cluster = lab.cluster.lock().await;
            names.iter().map(|n| (n, cluster.pid(n))).collect()
        };
        for (name, pid) in pids {
            // A process between a kill and its restart has no pid; one that just exited has no
            // status file any more.
            let Some(pid) = pid else { continue };
            let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
                continue;
            };
            if let Some(m) = parse_status(&status) {
                let now = clock.now_ns();
                book.add(name, m, now, now < floods_from_ns.load(Ordering::Relaxed), bound);
            }
        }
        tokio::time::sleep(EVERY).await;
    }
    book
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_are_read_in_kib() {
        let status = "Name:\tallocsvr\nVmHWM:\t   81234 kB\nVmRSS:\t   61000 kB\nThreads:\t9\n";
        assert_eq!(parse_status(status), Some((61_000 * 1024, 81_234 * 1024)));
        for bad in [
            "",
            "VmRSS:\t1 kB\n",
            "VmRSS:\tx kB\nVmHWM:\t1 kB\n",
            "VmRSS:\t1 MB\nVmHWM:\t1 kB\n",
        ] {
            assert_eq!(parse_status(bad), None, "{bad:?}");
        }
        let own = std::fs::read_to_string("/proc/self/status").unwrap();
        let (rss, hwm) = parse_status(&own).unwrap();
        assert!(rss > 0 && hwm >= rss);
    }

    #[test]
    fn the_peak_keeps_the_highest_mark_and_the_first_pass_of_the_bound() {
        let mut b = RssBook::default();
        b.add("allocsvr-1", (10 * MIB, 20 * MIB), 1, true, 100 * MIB);
        // A restart: a new, lower mark.
        b.add("allocsvr-1", (5 * MIB, 6 * MIB), 2, false, 100 * MIB);
        assert_eq!(
            b.per["allocsvr-1"],
            Rss {
                peak: 20 * MIB,
                before_floods: 10 * MIB,
                end: 5 * MIB
            }
        );
        assert_eq!(b.over, None);
        b.add("allocsvr-2", (50 * MIB, 101 * MIB), 3, false, 100 * MIB);
        b.add("allocsvr-1", (200 * MIB, 200 * MIB), 4, false, 100 * MIB);
        assert_eq!(b.per["allocsvr-1"].before_floods, 10 * MIB);
        assert_eq!(b.over, Some(("allocsvr-2".into(), 101 * MIB, 3)));
        assert_eq!(b.samples, 4);
    }
}
