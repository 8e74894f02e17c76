//! Loopback helpers for tests and benchmarks: a free port, waiting until something listens, and
//! polling a condition with a deadline — never a fixed sleep and hope.
//!
//! Deliberately left out: any address outside 127.0.0.0/8.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// A free loopback port, as `127.0.0.1:PORT`, never one this process was handed before. Another
/// process may take it before it is used; the callers start their servers right away and fail
/// loudly when the bind fails.
///
/// Chosen below the kernel's ephemeral port range (`/proc/sys/net/ipv4/ip_local_port_range`):
/// a test restarts servers on their ports, and while a server is down between a SIGKILL and its
/// restart, any outgoing connection of any process could take a port of the ephemeral range as
/// its local port, and the restart would fail to bind. Below it only another explicit bind can,
/// and a random pick makes that unlikely even for test binaries running side by side. Falls back
/// to `bind(0)` when the range leaves no room below it.
///
/// The kernel may give back a port it just gave, and a probe's listener is closed again at
/// once: a test that picks every address of a cluster first and starts the processes after would
/// then have two servers on one port (an e2e test once sent a StoreSvr's gRPC to an AllocSvr's
/// metrics listener that way), so ports already handed out are skipped.
pub fn free_addr() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// [`free_addr`]'s port.
pub fn free_port() -> u16 {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut handed = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let below = ephemeral_start();
    let mut rng = Lcg::seeded();
    let mut tries = 0;
    unseen_port(&mut handed, || {
        while below > LOW_PORT + 1_000 && tries < 200 {
            tries += 1;
            let port = LOW_PORT + (rng.next() % u64::from(below - LOW_PORT)) as u16;
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        l.local_addr().expect("local addr").port()
    })
}

/// The lowest port [`free_port`] picks: above the well-known and most registered services'.
const LOW_PORT: u16 = 10_000;

/// The first port of the kernel's ephemeral range (32768 when it cannot be read).
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// A small generator for port picks, seeded from the process id and the clock so that test
/// binaries started side by side pick differently (no dependency for so little).
struct Lcg(u64);

impl Lcg {
    fn seeded() -> Lcg {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Lcg(nanos ^ (u64::from(std::process::id()) << 32) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
}

/// The first port from `pick` not in `handed`, now added to it; after 1,000 repeats the last one
/// (a process that used up the ephemeral range takes a repeat rather than spin).
fn unseen_port(handed: &mut BTreeSet<u16>, mut pick: impl FnMut() -> u16) -> u16 {
    let mut port = pick();
    for _ in 1..1_000 {
        if handed.insert(port) {
            return port;
        }
        port = pick();
    }
    port
}

/// Waits until `addr` accepts TCP connections, at most `limit`.
pub async fn wait_listening(addr: &str, limit: Duration) -> bool {
    poll_until(limit, || async {
        tokio::net::TcpStream::connect(addr).await.is_ok().then_some(())
    })
    .await
    .is_some()
}

/// Calls `f` every 20 ms until it returns `Some`, at most `within`; `None` when time ran out.
pub async fn poll_until<T, F, Fut>(within: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_the_kernel_gives_again_is_skipped() {
        let mut handed = BTreeSet::new();
        let mut kernel = [5, 5, 5, 7, 5, 9].into_iter();
        let mut next = || kernel.next().unwrap();
        assert_eq!(unseen_port(&mut handed, &mut next), 5);
        assert_eq!(unseen_port(&mut handed, &mut next), 7);
        assert_eq!(unseen_port(&mut handed, &mut next), 9);
        // A kernel that only ever repeats: a repeat after 1,000 picks, no endless loop.
        assert_eq!(unseen_port(&mut handed, || 5), 5);
        let ports: BTreeSet<String> = (0..200).map(|_| free_addr()).collect();
        assert_eq!(ports.len(), 200);
    }

    #[tokio::test]
    async fn waits_for_a_listener_and_gives_up_without_one() {
        let addr = free_addr();
        assert!(!wait_listening(&addr, Duration::from_millis(100)).await);
        let listener = tokio::net::TcpListener::bind(&addr).await.unwrap();
        assert!(wait_listening(&addr, Duration::from_secs(1)).await);
        drop(listener);
        let mut n = 0;
        let got = poll_until(Duration::from_secs(1), || {
            n += 1;
            let v = (n == 3).then_some(n);
            async move { v }
        })
        .await;
        assert_eq!(got, Some(3));
    }
}
