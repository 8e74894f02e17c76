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
/// The kernel may give back a port it just gave: a test that picks every address of a cluster
/// first and starts the processes after would then have two servers on one port (an e2e test
/// once sent a StoreSvr's gRPC to an AllocSvr's metrics listener that way), so ports already
/// handed out are skipped.
pub fn free_addr() -> String {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut handed = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let port = unseen_port(&mut handed, || {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        l.local_addr().expect("local addr").port()
    });
    format!("127.0.0.1:{port}")
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
