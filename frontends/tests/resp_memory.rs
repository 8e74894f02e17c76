//! What a Redis connection keeps in memory after a large command: the buffers shrink back, so
//! that a flood of large commands leaves no residue once it is answered. Counted with a global
//! allocator that tracks live heap bytes (this test binary's own), over real loopback sockets so
//! that no in-memory pipe's buffer is counted.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use common::Fake;
use seqsvr_frontends::resp::{self, RespConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; only a counter is kept.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's layout, as given.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        // SAFETY: as for `dealloc`, and `new_size` is the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// An `MGET` of 1,000 names of 256 bytes each: a command of about 270 KB, the largest kind a
/// caller sends.
fn large_mget() -> Vec<u8> {
    let mut out = b"*1001\r\n$4\r\nMGET\r\n".to_vec();
    for i in 0..1000 {
        out.extend_from_slice(format!("$256\r\n{i:0>256}\r\n").as_bytes());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffers_shrink_back_after_large_commands() {
    const CONNECTIONS: usize = 40;
    let fake = Arc::new(Fake::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let server = tokio::spawn(resp::serve(listener, fake, Arc::new(RespConfig::default()), stop));

    // Each connection is served once (a PING answered) before the count starts: its own small
    // buffers are part of the baseline.
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(b"*1\r\n$4\r\nPING\r\n").await.unwrap();
        let mut pong = [0u8; 7];
        c.read_exact(&mut pong).await.unwrap();
        assert_eq!(&pong, b"+PONG\r\n");
        clients.push(c);
    }
    let input = large_mget();
    let before = LIVE.load(Ordering::Relaxed);
    // Each connection sends one large command and reads its whole reply, then stays open.
    let mut reply = vec![0u8; "*1000\r\n".len() + 1000 * "$-1\r\n".len()];
    for c in &mut clients {
        c.write_all(&input).await.unwrap();
        tokio::time::timeout(Duration::from_secs(30), c.read_exact(&mut reply))
            .await
            .unwrap()
            .unwrap();
        assert!(reply.starts_with(b"*1000\r\n$-1\r\n"));
    }
    drop(reply);
    // A connection shrinks its buffers right after its reply is written: wait for the last ones
    // (bounded), then judge what is kept.
    let kept = || (LIVE.load(Ordering::Relaxed) - before) / CONNECTIONS as isize;
    for _ in 0..50 {
        if kept() < 64 * 1024 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let per_connection = kept();
    // Idle again, a connection keeps small buffers, not the large command's or reply's.
    assert!(
        per_connection < 64 * 1024,
        "{per_connection} bytes kept per connection after a {}-byte command",
        input.len()
    );
    stop_tx.send(true).unwrap();
    server.await.unwrap();
    drop(clients);
}
