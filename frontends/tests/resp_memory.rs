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

    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        clients.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
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
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = LIVE.load(Ordering::Relaxed);
    let per_connection = (after - before) / CONNECTIONS as isize;
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
