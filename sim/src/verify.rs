//! What `sim run` and `sim load` both do around the workload: serve every section once before it
//! starts, and after the heal check that every uid it touched is served again (liveness).
//!
//! Deliberately left out: judging the answers (the checkers read them from the history).

use crate::workload::Recorder;
use anyhow::bail;
use seqsvr_client::Client;
use std::collections::HashSet;
use std::time::Duration;
use tokio::time::{Instant, sleep};

/// How long the cluster may take to serve every section, and a touched uid after the heal.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(60);
pub(crate) const VERIFY_TIMEOUT: Duration = Duration::from_secs(60);
/// Every uid the workload touched, sorted. Also `sim load`'s.
pub(crate) fn touched_uids(rec: &Recorder) -> Vec<u64> {
    let t = rec.touched.lock().unwrap_or_else(|e| e.into_inner());
    let mut v: Vec<u64> = t.iter().copied().collect();
    v.sort_unstable();
    v
}

/// One recorded fetch of the first uid of every section of `[0, uid_limit)`, until each has been
/// served once or [`READY_TIMEOUT`] passes. Also `sim load`'s first step.
pub(crate) async fn serve_every_section(
    probe: &Client,
    rec: &Recorder,
    section_size: u64,
    uid_limit: u64,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    let sections = uid_limit.div_ceil(section_size);
    let mut left: Vec<u64> = (0..sections).map(|s| s * section_size).collect();
    while !left.is_empty() {
        let served: HashSet<u64> = rec.batch(probe, 0, &left).await.into_iter().collect();
        left.retain(|u| !served.contains(u));
        if Instant::now() > deadline {
            bail!("{} sections not served within {READY_TIMEOUT:?}", left.len());
        }
        if !left.is_empty() {
            sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(())
}

/// Fetches every touched uid until each is served once or [`VERIFY_TIMEOUT`] passes (the liveness
/// checker then names the ones left). Also `sim load`'s last step.
pub(crate) async fn verify_served(probe: &Client, rec: &Recorder, touched: &[u64]) {
    let deadline = Instant::now() + VERIFY_TIMEOUT;
    let mut left: Vec<u64> = touched.to_vec();
    while !left.is_empty() && Instant::now() < deadline {
        let mut served = HashSet::new();
        let (keys, uids): (Vec<u64>, Vec<u64>) = left.iter().partition(|&&s| s & crate::keys::KEY_SUBJECT != 0);
        for chunk in uids.chunks(500) {
            served.extend(rec.batch(probe, 0, chunk).await);
        }
        for subject in keys {
            rec.fetch_subject(probe, 0, subject).await;
            served.insert(subject);
        }
        left.retain(|u| !served.contains(u));
        if !left.is_empty() {
            sleep(Duration::from_millis(500)).await;
        }
    }
}
