//! The HTTP front end against callers that break the rules, over real loopback sockets with
//! small kernel buffers (so that what the server holds is not hidden in the kernel's): replies
//! never read, heads far over the bound. Each test states the bound it holds in bytes or slots,
//! never in RSS (that is the simulator's `--hostile` run).

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::Fake;
use seqsvr_frontends::http::{self, HttpConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// The kernel buffers asked for on both ends (Linux doubles them and keeps a floor).
const SOCKET_BUFFER: u32 = 4096;

/// What the kernel may hold between the two ends with [`SOCKET_BUFFER`]s: the client's send
/// buffer and the server's receive buffer, generously.
const KERNEL_SLACK: usize = 64 * 1024;

/// A front end over `fake` on a loopback port whose accepted sockets have small buffers.
fn start(fake: &Arc<Fake>, max_connections: usize) -> (SocketAddr, tokio::sync::watch::Sender<bool>) {
    let socket = TcpSocket::new_v4().unwrap();
    // Accepted sockets inherit the listener's buffer sizes.
    socket.set_recv_buffer_size(SOCKET_BUFFER).unwrap();
    socket.set_send_buffer_size(SOCKET_BUFFER).unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(64).unwrap();
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

/// Writes `chunks` until the server stops taking them (the write fails) or all are sent; the
/// bytes written are counted in `written` as they go.
async fn write_until_refused(mut w: tokio::net::tcp::OwnedWriteHalf, chunks: Vec<Vec<u8>>, written: Arc<AtomicUsize>) {
    for c in chunks {
        if w.write_all(&c).await.is_err() {
            return;
        }
        written.fetch_add(c.len(), Ordering::SeqCst);
    }
}

/// A caller that pipelines requests and never reads a reply holds its connection, and the
/// slot under `max_connections`, for no longer than the write timeout: with one slot, the next
/// caller is answered. Meanwhile the server read no more than its bounded buffer past the
/// requests it answered.
#[tokio::test(start_paused = true)]
async fn a_pipeline_whose_replies_are_never_read_is_cut_off_and_frees_its_slot() {
    let fake = Arc::new(Fake::default());
    let (addr, _stop) = start(&fake, 1);
    let request = b"POST /v1/seq/1/next HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".to_vec();
    let flood = connect(addr).await;
    let (unread, w) = flood.into_split();
    let written = Arc::new(AtomicUsize::new(0));
    let writer = tokio::spawn(write_until_refused(w, vec![request.clone(); 100_000], written.clone()));

    let mut next = connect(addr).await;
    next.write_all(b"GET /v1/seq/2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let served = tokio::time::timeout(Duration::from_secs(300), next.read_to_end(&mut out)).await;
    assert!(
        served.is_ok(),
        "the unread connection still holds the only slot after 300 s"
    );
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");

    // The flood's connection was closed by the server: its writes fail.
    tokio::time::timeout(Duration::from_secs(60), writer)
        .await
        .expect("the flood's writes still succeed")
        .unwrap();
    let taken = fake.taken() as usize;
    let buffered = written.load(Ordering::SeqCst).saturating_sub(taken * request.len());
    eprintln!("{taken} answered, {buffered} bytes read past them (with the kernel's)");
    assert!(
        taken < 100_000 && buffered <= http::MAX_BUFFERED_BYTES + KERNEL_SLACK,
        "{taken} answered, {buffered} bytes read past them"
    );
    drop(unread);
}

/// A head of a megabyte is refused after at most the head bound's bytes, with a 431, and the
/// connection closed: the server never holds more of it.
#[tokio::test]
async fn a_head_over_the_bound_is_refused_after_at_most_the_bound() {
    let fake = Arc::new(Fake::default());
    let (addr, _stop) = start(&fake, 16);
    let (mut r, w) = connect(addr).await.into_split();
    let mut chunks = vec![b"GET /v1/seq/1 HTTP/1.1\r\nHost: x\r\n".to_vec()];
    for i in 0..1000 {
        chunks.push(format!("x-pad-{i}: {}\r\n", "a".repeat(1000)).into_bytes());
    }
    chunks.push(b"\r\n".to_vec());
    let written = Arc::new(AtomicUsize::new(0));
    let writer = tokio::spawn(write_until_refused(w, chunks, written.clone()));
    let mut out = Vec::new();
    // A reset after the reply is fine: the server closed with the rest of the head unread.
    let read = tokio::time::timeout(Duration::from_secs(30), async {
        let mut buf = [0u8; 4096];
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the connection stayed open");
    let _ = tokio::time::timeout(Duration::from_secs(30), writer).await;
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 431"), "{out}");
    let sent = written.load(Ordering::SeqCst);
    eprintln!("{sent} bytes of the head sent before the server closed");
    assert!(
        sent <= http::MAX_HEAD_BYTES + KERNEL_SLACK,
        "the server took {sent} bytes of a head"
    );
    assert_eq!(fake.taken(), 0);
}
