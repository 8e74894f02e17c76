//! Measures the HTTP front end's resident memory before, during and after hostile floods, in
//! one process: the front end over an in-memory `Calls` on a multi-threaded runtime (as the
//! AllocSvr runs it), and the flooding callers on a runtime of their own.
//!
//! ```text
//! cargo run -p seqsvr-frontends --example http_flood -- [connections] [heads|pipelines|bodies|all] [trim]
//! cargo run -p seqsvr-frontends --example http_flood -- <seconds> serve [trim]
//! ```
//!
//! Floods, each from `connections` sockets at once (500 by default):
//! - `heads`: a head of 400 KB written in 4 KB pieces, 50 ms apart (slowly, within 10 s);
//! - `pipelines`: pipelined `POST /v1/seq/1/next` written until the server stops reading, and
//!   no reply ever read;
//! - `bodies`: `POST /v1/seq/batch` with a body of the largest size allowed, written at once.
//!
//! `serve` only serves, for a load generator, and prints the RSS at the start and the end.
//!
//! Each prints the process's RSS (from `/proc/self/status`) before, at its peak, and 30 s after
//! the flood ended. With `trim`, a thread calls glibc's `malloc_trim(0)` every 10 s, as the
//! AllocSvr binary does after a flood (`docs/decisions/0003-memory-after-a-flood.md`). The RSS includes the flooding callers' own memory (small: their buffers are
//! written from one shared request). Linux only. Left out: any check — this prints numbers for
//! a person; the bounds a test can hold are in `tests/http_hostile.rs`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use seqsvr_frontends::http::{self, HttpConfig};
use tokio::io::AsyncWriteExt;

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// Writes `chunks` to a new connection, `pause` apart, until the server stops taking them or
/// `within` has passed; holds the connection until `hold_until`.
async fn caller(addr: SocketAddr, chunk: Arc<Vec<u8>>, count: usize, pause: Duration, hold_until: Instant) {
    // A small receive buffer: a caller that never reads fills it, and the server's, soon.
    let Ok(socket) = tokio::net::TcpSocket::new_v4() else {
        return;
    };
    let _ = socket.set_recv_buffer_size(4096);
    let Ok(mut s) = socket.connect(addr).await else {
        return;
    };
    for _ in 0..count {
        match tokio::time::timeout(Duration::from_secs(2), s.write_all(&chunk)).await {
            Ok(Ok(())) => {}
            // Closed by the server, or it stopped reading: stop writing, keep the connection.
            _ => break,
        }
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
    }
    tokio::time::sleep_until(hold_until.into()).await;
}

/// glibc's `struct mallinfo2`: sizes of the heap, in bytes.
#[repr(C)]
#[derive(Default)]
struct MallInfo2 {
    arena: usize,
    ordblks: usize,
    smblks: usize,
    hblks: usize,
    hblkhd: usize,
    usmblks: usize,
    fsmblks: usize,
    uordblks: usize,
    /// Free bytes held in the arenas' chunks: what `malloc_trim` can give back.
    fordblks: usize,
    keepcost: usize,
}

unsafe extern "C" {
    /// glibc's: gives the free memory of every arena back to the system; 1 if any was.
    fn malloc_trim(pad: usize) -> std::ffi::c_int;
    /// glibc's: the heap's sizes, summed over every arena.
    fn mallinfo2() -> MallInfo2;
}

/// Free bytes glibc holds in its arenas.
fn free_in_arenas() -> usize {
    // SAFETY: mallinfo2 takes nothing and returns a struct by value; glibc ≥ 2.33.
    unsafe { mallinfo2() }.fordblks
}

/// The resident KiB not in use: the RSS less glibc's bytes in use.
fn idle_kib() -> u64 {
    // SAFETY: as in `free_in_arenas`.
    let m = unsafe { mallinfo2() };
    rss_kib().saturating_sub(((m.uordblks + m.hblkhd) / 1024) as u64)
}

/// As the AllocSvr binary does (`allocsvr/src/trim.rs`): every 10 s, when glibc holds 4 MiB
/// free and the resident memory not in use grew by 4 MiB since the last trim, `malloc_trim(0)`;
/// each trim printed with its time.
fn trim_after_floods() {
    const THRESHOLD_KIB: u64 = 4 << 10;
    std::thread::spawn(|| {
        // From what is resident and not in use at the start, as the AllocSvr's.
        let mut idle_after_last = idle_kib();
        loop {
            std::thread::sleep(Duration::from_secs(10));
            let (rss, free) = (rss_kib(), free_in_arenas());
            if idle_kib() < idle_after_last + THRESHOLD_KIB || (free as u64) < THRESHOLD_KIB * 1024 {
                continue;
            }
            let started = Instant::now();
            // SAFETY: glibc's malloc_trim takes any pad and is safe to call from any thread.
            unsafe { malloc_trim(0) };
            let took = started.elapsed();
            idle_after_last = idle_kib();
            println!(
                "  trim: {} free in arenas, RSS {} -> {} in {took:?}",
                mib(free as u64 / 1024),
                mib(rss),
                mib(rss_kib()),
            );
        }
    });
}

fn main() {
    let mut args = std::env::args().skip(1);
    let connections: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(500);
    let which = args.next().unwrap_or_else(|| "all".into());
    if args.next().as_deref() == Some("trim") {
        trim_after_floods();
    }

    let server = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let listener = server.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    let (_stop_tx, stop) = tokio::sync::watch::channel(false);
    server.spawn(http::serve(
        listener,
        Arc::new(common::Fake::default()),
        HttpConfig::default(),
        stop,
    ));

    if which == "serve" {
        // For a load generator (`wrk`): the same front end, for `connections` seconds.
        println!("serving on {addr} for {connections} s, at start {}", mib(rss_kib()));
        std::thread::sleep(Duration::from_secs(connections as u64));
        println!("at the end {}", mib(rss_kib()));
        return;
    }
    let callers = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    println!("connections {connections}, at start {}", mib(rss_kib()));

    let head = {
        let mut h = b"GET /v1/seq/1 HTTP/1.1\r\nhost: x\r\n".to_vec();
        while h.len() < 4096 {
            h.extend_from_slice(format!("x-pad-{}: {}\r\n", h.len(), "a".repeat(200)).as_bytes());
        }
        h
    };
    let pipeline = b"POST /v1/seq/1/next HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n".repeat(64);
    let body = {
        let n = http::MAX_BODY_BYTES - 64;
        let mut b = format!("POST /v1/seq/batch HTTP/1.1\r\nhost: x\r\ncontent-length: {n}\r\n\r\n").into_bytes();
        b.extend(std::iter::repeat_n(b' ', n));
        b
    };
    let floods: Vec<(&str, Vec<u8>, usize, Duration)> = vec![
        ("heads", head, 100, Duration::from_millis(50)),
        ("pipelines", pipeline, 2000, Duration::ZERO),
        ("bodies", body, 1, Duration::ZERO),
    ];
    for (name, chunk, count, pause) in floods {
        if which != "all" && which != name {
            continue;
        }
        let before = rss_kib();
        let hold_until = Instant::now() + Duration::from_secs(12);
        let chunk = Arc::new(chunk);
        let tasks: Vec<_> = (0..connections)
            .map(|_| callers.spawn(caller(addr, chunk.clone(), count, pause, hold_until)))
            .collect();
        let mut peak = before;
        while !tasks.iter().all(|t| t.is_finished()) {
            peak = peak.max(rss_kib());
            std::thread::sleep(Duration::from_millis(100));
        }
        let ended = rss_kib();
        std::thread::sleep(Duration::from_secs(30));
        println!(
            "{name}: before {}, peak {}, at the end {}, 30 s later {} ({} free in glibc's arenas)",
            mib(before),
            mib(peak),
            mib(ended),
            mib(rss_kib()),
            mib(free_in_arenas() as u64 / 1024)
        );
    }
}
