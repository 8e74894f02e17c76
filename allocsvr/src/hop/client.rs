//! The forwarding side of the direct hop: one connection per peer, shared by every call to it.
//!
//! A call queues its frame; one write task per burst sends every frame queued by the time it runs
//! (the calls ready on its thread go first), and one reader task per connection hands each
//! answer to its call by id.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tracing::debug;

use super::wire::{self, Answer, Subject};

/// How long a connection to a peer may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// After a connection failed or could not open, how long calls to that peer go the long way
/// before another is tried.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Most bytes queued for a peer that has not taken them (a few thousand calls' frames), those
/// the writing task holds included.
const MAX_QUEUED: usize = 1 << 20;

/// A connection's frames not yet written.
#[derive(Default)]
struct Queue {
    /// Queued and not yet taken by the writing task.
    bytes: Vec<u8>,
    /// Taken by the writing task and not yet written.
    taken: usize,
    /// Whether a writing task runs.
    writing: bool,
}

/// One open connection.
struct Link {
    stream: TcpStream,
    out: Mutex<Queue>,
    waiting: Mutex<HashMap<u64, oneshot::Sender<Answer>>>,
    next_id: AtomicU64,
    dead: AtomicBool,
}

impl Link {
    /// Marks the link dead and drops every waiting call's sender: each goes the long way. The
    /// socket is shut down so that the reading and writing tasks end (a peer that stopped
    /// reading would otherwise keep them, and the connection, waiting for ever).
    fn fail(&self, why: &str) {
        if !self.dead.swap(true, Ordering::AcqRel) {
            debug!(%why, "hop: connection lost");
            use std::os::fd::AsRawFd;
            // SAFETY: the descriptor is this link's open socket (it is closed only when the
            // link is dropped, which `&self` prevents); shutdown(2) reads and writes no memory.
            unsafe { libc::shutdown(self.stream.as_raw_fd(), libc::SHUT_RDWR) };
        }
        self.waiting.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Queues `frame`; the first frame queued since the last write starts a task that writes
    /// every frame queued by then.
    fn send(self: &Arc<Self>, frame: &[u8]) {
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        if out.bytes.len() + out.taken + frame.len() > MAX_QUEUED {
            // A peer that stopped reading: its calls go the long way, and the bytes stop growing.
            drop(out);
            return self.fail("the peer stopped reading");
        }
        out.bytes.extend_from_slice(frame);
        if out.writing {
            return;
        }
        out.writing = true;
        drop(out);
        let link = self.clone();
        tokio::spawn(async move {
            // The calls this thread has ready queue their frames first: they leave in one write.
            tokio::task::yield_now().await;
            link.finish_write().await;
        });
    }

    /// Writes the queued bytes as the socket takes them, until none are left. The bytes are
    /// taken out of the queue and written without holding its lock: calls on the other threads
    /// queue their frames meanwhile instead of waiting for the system call (with the lock held
    /// across the write, about half of the forwarding node's `futex` calls at 50 connections
    /// were callers waiting on it or being woken from it).
    async fn finish_write(self: Arc<Self>) {
        // Only this task writes (`Queue::writing`); what it took and has not written yet.
        let mut taken: Vec<u8> = Vec::new();
        loop {
            {
                let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
                if taken.is_empty() {
                    if out.bytes.is_empty() {
                        out.taken = 0;
                        out.writing = false;
                        return;
                    }
                    // The emptied buffer goes back with its capacity: no allocation per burst.
                    std::mem::swap(&mut taken, &mut out.bytes);
                }
                out.taken = taken.len();
            }
            if let Err(e) = self.stream.writable().await {
                return self.fail(&e.to_string());
            }
            if let Err(e) = write_now(&self.stream, &mut taken) {
                return self.fail(&e.to_string());
            }
        }
    }

    /// Reads answers until the connection ends, handing each to its call.
    async fn read(self: Arc<Self>) {
        let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
        loop {
            if let Err(e) = self.stream.readable().await {
                return self.fail(&e.to_string());
            }
            // Into the spare capacity: nothing is zeroed first.
            buf.reserve(16 * 1024);
            match self.stream.try_read_buf(&mut buf) {
                Ok(0) => return self.fail("closed by the peer"),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return self.fail(&e.to_string()),
            }
            let mut at = 0;
            loop {
                match wire::take_answer(&buf[at..]) {
                    Ok(Some((id, answer, used))) => {
                        at += used;
                        let call = self.waiting.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
                        // A call that gave up waiting has gone the long way; its answer is dropped.
                        if let Some(call) = call {
                            let _ = call.send(answer);
                        }
                    }
                    Ok(None) => break,
                    Err(e) => return self.fail(&e.0),
                }
            }
            buf.drain(..at);
        }
    }
}

/// Writes as much of `out` as the socket takes without waiting, removing what went.
fn write_now(stream: &TcpStream, out: &mut Vec<u8>) -> std::io::Result<()> {
    while !out.is_empty() {
        match stream.try_write(out) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) if n == out.len() => out.clear(),
            Ok(n) => {
                out.drain(..n);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A peer's connection as the calls see it.
enum State {
    Up(Arc<Link>),
    Opening,
    Down(Instant),
}

/// Removes a call's entry when the call ends, whatever way it ends (a caller may be dropped).
struct Waiting<'a> {
    link: &'a Link,
    id: u64,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.link
            .waiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

/// Every peer's connection.
#[derive(Default)]
pub struct Links {
    peers: Mutex<HashMap<String, State>>,
}

impl Links {
    /// The open connection to the hop port `addr`; `None` (and one being opened in the
    /// background, unless one failed lately) when there is none yet.
    fn link(self: &Arc<Self>, addr: &str) -> Option<Arc<Link>> {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        match peers.get(addr) {
            Some(State::Up(l)) if !l.dead.load(Ordering::Acquire) => return Some(l.clone()),
            Some(State::Up(_)) => {
                // Lost: as one that could not open, so that a peer that drops every connection
                // costs one attempt a second, not one a call.
                peers.insert(addr.to_owned(), State::Down(Instant::now()));
                return None;
            }
            Some(State::Opening) => return None,
            Some(State::Down(at)) if at.elapsed() < RETRY_AFTER => return None,
            _ => {}
        }
        peers.insert(addr.to_owned(), State::Opening);
        let (links, addr) = (self.clone(), addr.to_owned());
        tokio::spawn(async move {
            let state = match open(&addr).await {
                Ok(link) => {
                    tokio::spawn(link.clone().read());
                    State::Up(link)
                }
                Err(e) => {
                    debug!(peer = %addr, error = %e, "hop: cannot open a connection; forwarding over gRPC");
                    State::Down(Instant::now())
                }
            };
            links
                .peers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(addr, state);
        });
        None
    }

    /// Takes `subject` at the owner whose hop port is `addr`, waiting `wait` at most. `None`:
    /// no answer (no connection yet, it failed, or the wait ran out); the call then goes the long
    /// way, and a value the owner may have taken meanwhile is lost, never handed out twice.
    pub async fn take(self: &Arc<Self>, addr: &str, subject: Subject<'_>, wait: Duration) -> Option<Answer> {
        let link = self.link(addr)?;
        let id = link.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        link.waiting.lock().unwrap_or_else(|e| e.into_inner()).insert(id, tx);
        let _entry = Waiting { link: &link, id };
        let mut frame = Vec::with_capacity(64);
        wire::put_request(&mut frame, id, subject);
        link.send(&frame);
        if link.dead.load(Ordering::Acquire) {
            return None;
        }
        tokio::time::timeout(wait, rx).await.ok()?.ok()
    }
}

async fn open(addr: &str) -> Result<Arc<Link>, String> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| format!("no connection within {CONNECT_TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?;
    let _ = stream.set_nodelay(true);
    let link = Arc::new(Link {
        stream,
        out: Mutex::default(),
        waiting: Mutex::default(),
        next_id: AtomicU64::new(0),
        dead: AtomicBool::new(false),
    });
    link.send(wire::PREFACE);
    if link.dead.load(Ordering::Acquire) {
        return Err("the preface could not be written".into());
    }
    Ok(link)
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A peer that reads the preface, then answers each request with `LongWay` when `answer` is
    /// set, or reads and says nothing; it closes after `keep` requests.
    async fn peer(answer: bool, keep: usize) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut preface = [0u8; 8];
            s.read_exact(&mut preface).await.unwrap();
            assert_eq!(&preface, wire::PREFACE);
            let (mut buf, mut seen) = (Vec::new(), 0);
            while seen < keep {
                let mut chunk = [0u8; 1024];
                let n = s.read(&mut chunk).await.unwrap();
                if n == 0 {
                    return;
                }
                buf.extend_from_slice(&chunk[..n]);
                while let Some((id, _, used)) = wire::take_request(&buf).unwrap() {
                    buf.drain(..used);
                    seen += 1;
                    if answer {
                        let mut out = Vec::new();
                        wire::put_answer(&mut out, id, &Answer::LongWay);
                        s.write_all(&out).await.unwrap();
                    }
                }
            }
        });
        addr
    }

    /// Takes until one is answered or `tries` have gone; the answers, in order.
    async fn take_until_answered(links: &Arc<Links>, addr: &str, tries: usize) -> Vec<Option<Answer>> {
        let mut got = Vec::new();
        for _ in 0..tries {
            let a = links.take(addr, Subject::Uid(1), Duration::from_millis(300)).await;
            let done = a.is_some();
            got.push(a);
            if done {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        got
    }

    #[tokio::test]
    async fn a_call_before_the_connection_is_open_goes_the_long_way_and_later_ones_are_answered() {
        let links = Arc::new(Links::default());
        let addr = peer(true, 10).await;
        let got = take_until_answered(&links, &addr, 20).await;
        assert_eq!(got[0], None, "the first call does not wait for the connection");
        assert_eq!(got.last(), Some(&Some(Answer::LongWay)), "{got:?}");
    }

    #[tokio::test]
    async fn a_silent_peer_costs_the_wait_and_a_closing_one_is_not_retried_at_once() {
        let links = Arc::new(Links::default());
        let silent = peer(false, 100).await;
        let got = take_until_answered(&links, &silent, 5).await;
        assert!(got.iter().all(Option::is_none), "{got:?}");

        // Closes after the second request: the calls after that get no answer and do not hang,
        // and the lost connection is not reopened before RETRY_AFTER.
        let closing = peer(true, 2).await;
        let got = take_until_answered(&links, &closing, 20).await;
        assert_eq!(got.last(), Some(&Some(Answer::LongWay)));
        let mut after = Vec::new();
        for _ in 0..3 {
            let started = Instant::now();
            after.push(links.take(&closing, Subject::Uid(1), Duration::from_millis(300)).await);
            assert!(started.elapsed() < Duration::from_millis(400));
        }
        assert_eq!(after.iter().filter(|a| a.is_some()).count(), 1, "{after:?}");
    }

    #[tokio::test]
    async fn a_peer_that_stops_reading_ends_the_connection_instead_of_a_growing_queue() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        // Accepts and never reads.
        let held = tokio::spawn(async move { listener.accept().await.unwrap() });
        let link = open(&addr).await.unwrap();
        let chunk = vec![0u8; 64 * 1024];
        // 64 MB: far more than the kernel's buffers and MAX_QUEUED together.
        for _ in 0..1024 {
            if link.dead.load(Ordering::Acquire) {
                break;
            }
            link.send(&chunk);
            tokio::task::yield_now().await;
        }
        assert!(link.dead.load(Ordering::Acquire), "the queue grew past its bound");
        let (queued, taken) = {
            let out = link.out.lock().unwrap();
            (out.bytes.len(), out.taken)
        };
        assert!(queued + taken <= MAX_QUEUED, "{queued} + {taken} bytes");
        // The writing task, stuck on a socket that takes nothing, ends too: the link is let go.
        let started = Instant::now();
        while Arc::strong_count(&link) > 1 {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "the writing task kept the dead link"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(held);
    }

    #[tokio::test]
    async fn nobody_listening_is_down_for_a_while() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        let links = Arc::new(Links::default());
        assert_eq!(take_until_answered(&links, &addr, 5).await, vec![None; 5]);
        let peers = links.peers.lock().unwrap();
        assert!(matches!(peers.get(&addr), Some(State::Down(_))));
    }
}
