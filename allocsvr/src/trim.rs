//! Memory freed after a flood goes back to the system. glibc's malloc keeps freed memory in its
//! arenas for reuse, and after a flood of connections or batches on the front ends that is most
//! of the flood's peak, for good (decision 0003: 5.6 → 19.6 MiB after three floods of 500
//! callers, and it stays). A thread of its own checks every [`PERIOD`] how much glibc holds
//! free and, over [`TRIM_ABOVE_BYTES`], calls `malloc_trim(0)`, which returns the free pages
//! of every arena (8.8 MiB after the same floods).
//!
//! Left out: any other allocator (mimalloc kept all of it; decision 0003), and trimming on
//! every period whatever is free: a trim walks every arena under its lock, which a process at
//! rest with little free memory has no reason to pay.

use std::time::Duration;

/// How often the free memory is looked at: a flood's memory is back within this of its end,
/// and the look (`mallinfo2`, a walk of the free lists) costs nothing at this rate.
pub const PERIOD: Duration = Duration::from_secs(10);

/// Free bytes held by glibc over which it is asked to give them back: above what a busy
/// AllocSvr frees and reuses between two looks, below what a flood of a few hundred
/// connections leaves (9–16 MiB measured, decision 0003).
pub const TRIM_ABOVE_BYTES: usize = 4 << 20;

/// Starts the thread that trims after floods (on glibc; elsewhere nothing to do).
pub fn after_floods() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let started = std::thread::Builder::new().name("malloc-trim".into()).spawn(|| {
            let mut trim = Trim::from_now();
            loop {
                std::thread::sleep(PERIOD);
                let _ = trim.maybe(TRIM_ABOVE_BYTES);
            }
        });
        if let Err(e) = started {
            tracing::warn!(error = %e, "cannot start the thread that returns memory after floods");
        }
    }
}

/// When to trim: the resident memory glibc does not hand out — the RSS less the bytes in use
/// (`uordblks` in the arenas, `hblkhd` in blocks of their own) — has grown by `threshold` since
/// the last trim, and at least `threshold` is free. The free bytes alone do not say: glibc
/// counts trimmed pages as free still, so a trim on them would repeat every period after the
/// first flood. Nor does the RSS alone: memory in use is no reason to trim, and a trim in the
/// middle of a flood must not stop the one after it.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[derive(Debug)]
struct Trim {
    /// The resident bytes not in use right after the last trim: the process's own (code,
    /// stacks, the runtime's) and what glibc could not give back.
    idle_after_last: usize,
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
impl Trim {
    /// Counting from what is resident and not in use now: a process that just started has
    /// nothing a flood left, and its first look must not say otherwise.
    fn from_now() -> Self {
        Self {
            idle_after_last: Self::look().map_or(0, |(_, _, idle)| idle),
        }
    }

    /// `malloc_trim(0)` if it is time to; then the free bytes glibc held and the RSS before and
    /// after.
    fn maybe(&mut self, threshold: usize) -> Option<(usize, usize, usize)> {
        let (rss, free, idle) = Self::look()?;
        if free < threshold || idle < self.idle_after_last.saturating_add(threshold) {
            return None;
        }
        let started = std::time::Instant::now();
        // SAFETY: malloc_trim takes a byte count and is safe to call from any thread.
        unsafe { libc::malloc_trim(0) };
        let took = started.elapsed();
        let (after, _, idle_after) = Self::look().unwrap_or((rss, free, idle));
        self.idle_after_last = idle_after;
        tracing::info!(
            free_mib = free >> 20,
            rss_mib = rss >> 20,
            rss_after_mib = after >> 20,
            ?took,
            "returned memory freed after a flood to the system"
        );
        Some((free, rss, after))
    }

    /// The RSS, glibc's free bytes, and the resident bytes not in use.
    fn look() -> Option<(usize, usize, usize)> {
        let rss = rss_bytes()?;
        // SAFETY: mallinfo2 takes nothing and returns a struct by value (glibc ≥ 2.33).
        let m = unsafe { libc::mallinfo2() };
        Some((rss, m.fordblks, rss.saturating_sub(m.uordblks + m.hblkhd)))
    }
}

/// The resident set, from `/proc/self/statm` (pages).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn rss_bytes() -> Option<usize> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: usize = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf takes a constant and reads nothing of ours.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * usize::try_from(page).ok()?)
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    /// 64 MiB in small blocks, touched and freed but for one allocated after them.
    fn flood() -> Vec<u8> {
        const BLOCK: usize = 4096;
        let blocks: Vec<Vec<u8>> = (0..FLOOD_BYTES / BLOCK).map(|i| vec![i as u8 | 1; BLOCK]).collect();
        // Allocated after them, so that glibc cannot give them back by shrinking its heap's top.
        let pin = vec![1u8; BLOCK];
        drop(blocks);
        pin
    }

    const FLOOD_BYTES: usize = 64 << 20;

    /// Memory in use is not trimmed; freed in the middle of the heap, it stays in the RSS until
    /// the trim, which gives most of it back; the next look trims nothing (nothing came back),
    /// and a second flood is trimmed again.
    #[test]
    fn memory_freed_after_a_flood_goes_back_once_per_flood() {
        let mut trim = Trim::from_now();
        let held: Vec<Vec<u8>> = (0..FLOOD_BYTES / 4096).map(|i| vec![i as u8 | 1; 4096]).collect();
        assert_eq!(trim.maybe(TRIM_ABOVE_BYTES), None, "memory in use was trimmed");
        drop(held);
        let _pin = flood();
        let (free, before, after) = trim.maybe(TRIM_ABOVE_BYTES).expect("a flood's memory is trimmed");
        assert!(free >= FLOOD_BYTES / 2, "{free} bytes free");
        assert!(
            after + FLOOD_BYTES / 2 <= before,
            "RSS {before} -> {after}: the freed blocks stayed"
        );
        assert_eq!(
            trim.maybe(TRIM_ABOVE_BYTES),
            None,
            "trimmed again with nothing come back"
        );
        let _pin2 = flood();
        let (_, before, after) = trim.maybe(TRIM_ABOVE_BYTES).expect("a second flood is trimmed too");
        assert!(after + FLOOD_BYTES / 2 <= before, "RSS {before} -> {after}");
    }
}
