//! What the HTTP front end holds in memory, against the bound `docs/FRONTENDS.md` states:
//! connections × [`CONNECTION_BYTES`] + batches in service × [`BATCH_BYTES`]. Counted with a
//! global allocator that tracks live and peak heap bytes (this test binary's own: the server's
//! and the callers'), over real loopback sockets with small kernel buffers, so that neither an
//! in-memory pipe's buffer nor the allocator's retention (RSS) is counted.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use common::Fake;
use seqsvr_frontends::http::{self, BATCH_BYTES, CONNECTION_BYTES, HttpConfig, MAX_BATCHES_IN_SERVICE, MAX_BODY_BYTES};
use seqsvr_proto::limits::MAX_UIDS_PER_BATCH;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

fn grew(by: isize) {
    let now = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to the system allocator unchanged; only counters are kept.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size() as isize);
        // SAFETY: the caller's layout, as given.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        grew(new_size as isize - layout.size() as isize);
        // SAFETY: as for `dealloc`, and `new_size` is the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The counters are the whole binary's: one test at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The kernel buffers asked for on both ends: what a connection holds is in the process, not
/// hidden in the kernel.
const SOCKET_BUFFER: u32 = 4096;

fn start(fake: &Arc<Fake>, max_connections: usize) -> (SocketAddr, tokio::sync::watch::Sender<bool>) {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(SOCKET_BUFFER).unwrap();
    socket.set_send_buffer_size(SOCKET_BUFFER).unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(1024).unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let cfg = HttpConfig {
        max_connections,
        ..HttpConfig::default()
    };
    tokio::spawn(http::serve(listener, fake.clone(), cfg, stop));
    (addr, stop_tx)
}

async fn connect(addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(SOCKET_BUFFER).unwrap();
    socket.set_send_buffer_size(SOCKET_BUFFER).unwrap();
    socket.connect(addr).await.unwrap()
}

/// The live heap once it has stopped changing (the server has read what the callers sent):
/// sampled every 100 ms until five samples in a row are within a KiB, or `within` has passed.
async fn settled(within: Duration) -> isize {
    let end = tokio::time::Instant::now() + within;
    let mut last = LIVE.load(Ordering::Relaxed);
    let mut steady = 0;
    while steady < 5 && tokio::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = LIVE.load(Ordering::Relaxed);
        steady = if (now - last).abs() < 1024 { steady + 1 } else { 0 };
        last = now;
    }
    last
}

/// Connections that stall in the ways that fill a connection's buffers — a head never finished,
/// just under its bound or far over it, a pipeline of requests whose replies are never read —
/// each hold at most [`CONNECTION_BYTES`] of the heap, the server's and the caller's together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_connection_holds_at_most_its_bound() {
    const CONNECTIONS: usize = 200;
    let _alone = ONE_AT_A_TIME.lock().await;
    let fake = Arc::new(Fake::default());
    let (addr, stop) = start(&fake, CONNECTIONS * 2);
    // Warm what is allocated once (the runtime's, the router's, the fake's counter).
    let mut warm = connect(addr).await;
    warm.write_all(b"POST /v1/seq/1/next HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    warm.read_to_end(&mut Vec::new()).await.unwrap();

    let head = |len: usize| {
        let mut head = b"GET /v1/seq/1 HTTP/1.1\r\nHost: x\r\n".to_vec();
        while head.len() < len {
            head.extend_from_slice(format!("x-pad-{}: {}\r\n", head.len(), "a".repeat(200)).as_bytes());
        }
        head
    };
    let pipeline = b"POST /v1/seq/1/next HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".repeat(1000);
    for (what, bytes) in [
        ("a head just under the bound", head(http::MAX_HEAD_BYTES - 1024)),
        ("a head four times the bound", head(4 * http::MAX_HEAD_BYTES)),
        ("an unread pipeline", pipeline),
    ] {
        let before = settled(Duration::from_secs(2)).await;
        let bytes = Arc::new(bytes);
        let mut held = Vec::new();
        for _ in 0..CONNECTIONS {
            let (r, mut w) = connect(addr).await.into_split();
            let bytes = bytes.clone();
            // A writer blocked by a server that stopped reading stays blocked: it is held.
            let writer = tokio::spawn(async move {
                let _ = w.write_all(&bytes).await;
                w
            });
            held.push((r, writer));
        }
        // Within the head timeout: the stalled heads are still being held by the server.
        let after = settled(Duration::from_secs(6)).await;
        let per_connection = (after - before) / CONNECTIONS as isize;
        eprintln!("{what}: {per_connection} bytes a connection");
        assert!(
            per_connection <= CONNECTION_BYTES as isize,
            "{what}: {per_connection} bytes a connection, over {CONNECTION_BYTES}"
        );
        for (r, writer) in held {
            writer.abort();
            drop(r);
        }
    }
    stop.send(true).unwrap();
}

/// However many batches of the largest size arrive at once, the heap never holds more than the
/// stated bound: every connection its [`CONNECTION_BYTES`], and at most
/// [`MAX_BATCHES_IN_SERVICE`] batches their [`BATCH_BYTES`] (body, uids, results and reply); the
/// batches over that are answered 429 without their body being read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_at_once_hold_at_most_their_bound() {
    const CONNECTIONS: usize = 300;
    let _alone = ONE_AT_A_TIME.lock().await;
    let fake = Arc::new(Fake::default());
    let (addr, stop) = start(&fake, CONNECTIONS * 2);
    // The largest batch: the most uids, the widest numbers, padded to the largest body.
    let uids: Vec<u64> = (0..MAX_UIDS_PER_BATCH as u64).map(|i| u64::MAX - i).collect();
    let mut json = serde_json::json!({ "uids": uids }).to_string();
    let pad = MAX_BODY_BYTES.saturating_sub(json.len());
    json.insert_str(1, &" ".repeat(pad));
    let request = Arc::new(
        [
            format!(
                "POST /v1/seq/batch HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
                json.len()
            )
            .into_bytes(),
            json.into_bytes(),
        ]
        .concat(),
    );
    // Warm what is allocated once, the fake's counters of these uids included.
    let mut warm = connect(addr).await;
    warm.write_all(&request).await.unwrap();
    warm.read_to_end(&mut Vec::new()).await.unwrap();

    // Batches stay in service long enough for every caller to arrive.
    *fake.delay.lock().unwrap() = Some(Duration::from_secs(2));
    let before = settled(Duration::from_secs(2)).await;
    PEAK.store(before, Ordering::Relaxed);
    let callers: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            let request = request.clone();
            tokio::spawn(async move {
                let mut s = connect(addr).await;
                s.write_all(&request)
                    .await
                    .expect("the server takes every body, read or drained");
                // Only the status line is kept; the rest is read and dropped.
                let mut first = [0u8; 12];
                s.read_exact(&mut first).await.unwrap();
                let mut sink = [0u8; 512];
                while s.read(&mut sink).await.is_ok_and(|n| n > 0) {}
                String::from_utf8_lossy(&first[9..12]).into_owned()
            })
        })
        .collect();
    let mut statuses = std::collections::BTreeMap::<String, usize>::new();
    for c in callers {
        *statuses.entry(c.await.unwrap()).or_default() += 1;
    }
    let peak = PEAK.load(Ordering::Relaxed) - before;
    let bound = CONNECTIONS * CONNECTION_BYTES + MAX_BATCHES_IN_SERVICE * BATCH_BYTES;
    eprintln!("statuses {statuses:?}; peak {peak} bytes over the start, bound {bound}");
    assert!(peak <= bound as isize, "peak {peak} bytes, over the bound {bound}");
    // The bound was met by refusing, not by callers arriving one after the other.
    assert!(statuses.get("429").is_some_and(|&n| n > 0), "{statuses:?}");
    assert_eq!(
        statuses.values().sum::<usize>(),
        statuses.get("200").copied().unwrap_or(0) + statuses.get("429").copied().unwrap_or(0),
        "{statuses:?}"
    );
    stop.send(true).unwrap();
}
