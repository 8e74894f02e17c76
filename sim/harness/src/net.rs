//! Loopback helpers for tests and benchmarks: a free port, waiting until something listens, and
//! polling a condition with a deadline — never a fixed sleep and hope.
//!
//! Deliberately left out: any address outside 127.0.0.0/8.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// A free loopback port, as `127.0.0.1:PORT`. Another process may take it before it is used; the
/// callers start their servers right away and fail loudly when the bind fails.
pub fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local addr").to_string()
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
