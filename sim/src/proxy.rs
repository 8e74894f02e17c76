//! A TCP proxy per directed link, whose mode changes at runtime.
//!
//! Every network link of the simulated cluster goes through one [`Proxy`]: it listens on
//! `127.0.0.1:0` and forwards each accepted connection to its target. gRPC over HTTP/2 keeps
//! connections open for the whole run, so a mode applies to connections already open, not only
//! to new ones: every pump watches the link's mode and re-reads it between chunks.
//!
//! Modes, per direction ([`FlowMode`]): pass; drop (bytes are read and discarded, the connection
//! stays open, nothing arrives, not even a close); delay (each chunk is delivered `d` after it was
//! read, in order); hold (bytes are buffered up to a bound, then reading stops; a later pass or
//! delay releases them in order, a later drop discards them). A [`LinkMode`] pairs the two
//! directions, which gives one-way cuts.
//!
//! Deliberately left out: reordering, corruption and bandwidth limits (TCP hides the first two
//! from gRPC anyway), and faking SYN-level behaviour: a connection is always accepted, and
//! forwarded if the target is up.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{Instant, sleep_until};

/// What happens to the bytes of one direction of a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlowMode {
    Pass,
    /// Read and discard: a black hole that keeps the connection open.
    Drop,
    /// Deliver each chunk this long after it was read.
    Delay(Duration),
    /// Buffer (bounded) until the mode changes.
    Hold,
}

/// The modes of both directions of a link. Forward is from the connecting side to the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkMode {
    pub forward: FlowMode,
    pub backward: FlowMode,
}

impl LinkMode {
    pub const PASS: Self = Self::both(FlowMode::Pass);
    pub const DROP: Self = Self::both(FlowMode::Drop);
    pub const HOLD: Self = Self::both(FlowMode::Hold);

    pub const fn both(m: FlowMode) -> Self {
        Self {
            forward: m,
            backward: m,
        }
    }

    pub const fn delay(d: Duration) -> Self {
        Self::both(FlowMode::Delay(d))
    }

    /// Requests are lost, replies (of requests already through) still flow.
    pub const fn cut_forward() -> Self {
        Self {
            forward: FlowMode::Drop,
            backward: FlowMode::Pass,
        }
    }

    /// Requests arrive and are acted upon, replies are lost: the caller sees unknown outcomes.
    pub const fn cut_backward() -> Self {
        Self {
            forward: FlowMode::Pass,
            backward: FlowMode::Drop,
        }
    }
}

/// Default bound on bytes buffered per direction (held or waiting out a delay); past it the pump
/// stops reading and TCP flow control pushes back on the sender.
pub const DEFAULT_BUFFER_LIMIT: usize = 8 << 20;

const CHUNK: usize = 64 << 10;

/// One directed link's proxy. Dropping it closes the listener and every connection.
pub struct Proxy {
    name: String,
    addr: SocketAddr,
    target: SocketAddr,
    mode: watch::Sender<LinkMode>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Listens on `127.0.0.1:0` and forwards to `target`, starting in pass mode.
    pub async fn start(name: impl Into<String>, target: SocketAddr) -> io::Result<Self> {
        Self::start_with_limit(name, target, DEFAULT_BUFFER_LIMIT).await
    }

    pub async fn start_with_limit(name: impl Into<String>, target: SocketAddr, limit: usize) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (mode, rx) = watch::channel(LinkMode::PASS);
        let accept = tokio::spawn(accept_loop(listener, target, rx, limit));
        Ok(Self {
            name: name.into(),
            addr,
            target,
            mode,
            accept,
        })
    }

    /// Where callers should connect instead of the target.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn target(&self) -> SocketAddr {
        self.target
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Changes the mode of this link, for open and future connections alike.
    pub fn set(&self, mode: LinkMode) {
        tracing::debug!(link = %self.name, ?mode, "proxy mode");
        self.mode.send_replace(mode);
    }

    pub fn mode(&self) -> LinkMode {
        *self.mode.borrow()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn accept_loop(listener: TcpListener, target: SocketAddr, mode: watch::Receiver<LinkMode>, limit: usize) {
    // Owning the connection tasks here means aborting this task aborts them all.
    let mut conns = JoinSet::new();
    loop {
        while conns.try_join_next().is_some() {}
        let Ok((inbound, _)) = listener.accept().await else {
            continue;
        };
        let mode = mode.clone();
        conns.spawn(async move {
            let Ok(outbound) = TcpStream::connect(target).await else {
                return;
            };
            let _ = inbound.set_nodelay(true);
            let _ = outbound.set_nodelay(true);
            let (in_rd, in_wr) = inbound.into_split();
            let (out_rd, out_wr) = outbound.into_split();
            let fwd = pump(in_rd, out_wr, mode.clone(), |m| m.forward, limit);
            let back = pump(out_rd, in_wr, mode, |m| m.backward, limit);
            tokio::join!(fwd, back);
        });
    }
}

/// Bytes of one direction not delivered yet: queued (with the instant each is due) or held.
#[derive(Default)]
struct Backlog {
    queue: VecDeque<(Instant, Vec<u8>)>,
    queued: usize,
    held: VecDeque<Vec<u8>>,
    held_bytes: usize,
}

impl Backlog {
    /// What a mode does to what is already here: a drop loses everything, passing or delaying
    /// releases what was held (due now).
    fn apply(&mut self, m: FlowMode) {
        match m {
            FlowMode::Hold => {}
            FlowMode::Drop => *self = Backlog::default(),
            FlowMode::Pass | FlowMode::Delay(_) => {
                let now = Instant::now();
                for chunk in self.held.drain(..) {
                    self.queued += chunk.len();
                    self.queue.push_back((now, chunk));
                }
                self.held_bytes = 0;
            }
        }
    }

    /// Takes bytes just read under mode `m` (a pass with nothing queued is written by the caller).
    fn accept(&mut self, m: FlowMode, bytes: &[u8]) {
        match m {
            FlowMode::Pass => self.push_due(Instant::now(), bytes),
            FlowMode::Delay(d) => self.push_due(Instant::now() + d, bytes),
            FlowMode::Hold => {
                self.held_bytes += bytes.len();
                self.held.push_back(bytes.to_vec());
            }
            FlowMode::Drop => {}
        }
    }

    fn push_due(&mut self, at: Instant, bytes: &[u8]) {
        self.queued += bytes.len();
        self.queue.push_back((at, bytes.to_vec()));
    }

    fn is_empty(&self) -> bool {
        self.queue.is_empty() && self.held.is_empty()
    }
}

/// Moves bytes of one direction according to the current mode until both the reader is done and
/// nothing is left to deliver.
async fn pump(
    mut rd: OwnedReadHalf,
    mut wr: OwnedWriteHalf,
    mut mode: watch::Receiver<LinkMode>,
    pick: fn(&LinkMode) -> FlowMode,
    limit: usize,
) {
    let mut buf = vec![0u8; CHUNK];
    let mut backlog = Backlog::default();
    let mut eof = false;
    loop {
        let m = pick(&mode.borrow_and_update());
        backlog.apply(m);
        // A black hole delivers nothing, not even the close: keep the far side waiting.
        if eof && backlog.is_empty() && m != FlowMode::Drop {
            break;
        }
        let can_read = !eof && backlog.held_bytes < limit && backlog.queued < limit;
        let next_due = backlog.queue.front().map(|(t, _)| *t);
        tokio::select! {
            // A mode change seen in the same poll as data applies to that data.
            biased;
            r = mode.changed() => {
                if r.is_err() {
                    return;
                }
            }
            r = rd.read(&mut buf), if can_read => match r {
                Ok(0) | Err(_) => eof = true,
                Ok(n) if m == FlowMode::Pass && backlog.queue.is_empty() => {
                    if wr.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
                Ok(n) => backlog.accept(m, &buf[..n]),
            },
            _ = sleep_until(next_due.unwrap_or_else(Instant::now)), if next_due.is_some() => {
                if let Some((_, chunk)) = backlog.queue.pop_front() {
                    backlog.queued -= chunk.len();
                    if wr.write_all(&chunk).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
    let _ = wr.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;
    use tokio::time::timeout;

    /// An echo server that also reports every chunk it received.
    async fn echo_server() -> (SocketAddr, mpsc::UnboundedReceiver<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    loop {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                let _ = tx.send(buf[..n].to_vec());
                                if s.write_all(&buf[..n]).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        });
        (addr, rx)
    }

    const QUIET: Duration = Duration::from_millis(300);
    const PATIENCE: Duration = Duration::from_secs(5);

    async fn read_exact(s: &mut TcpStream, n: usize) -> Vec<u8> {
        let mut buf = vec![0u8; n];
        timeout(PATIENCE, s.read_exact(&mut buf))
            .await
            .expect("reply in time")
            .unwrap();
        buf
    }

    async fn nothing_arrives(s: &mut TcpStream) {
        let mut b = [0u8; 1];
        assert!(
            timeout(QUIET, s.read(&mut b)).await.is_err(),
            "bytes arrived through a closed link"
        );
    }

    async fn server_got(rx: &mut mpsc::UnboundedReceiver<Vec<u8>>) -> Vec<u8> {
        timeout(PATIENCE, rx.recv()).await.expect("server got bytes").unwrap()
    }

    async fn server_got_nothing(rx: &mut mpsc::UnboundedReceiver<Vec<u8>>) {
        assert!(
            timeout(QUIET, rx.recv()).await.is_err(),
            "server got bytes through a closed link"
        );
    }

    #[tokio::test]
    async fn pass_forwards_both_ways() {
        let (target, mut seen) = echo_server().await;
        let p = Proxy::start("t", target).await.unwrap();
        let mut c = TcpStream::connect(p.addr()).await.unwrap();
        c.write_all(b"hello").await.unwrap();
        assert_eq!(read_exact(&mut c, 5).await, b"hello");
        assert_eq!(server_got(&mut seen).await, b"hello");
    }

    #[tokio::test]
    async fn drop_silences_an_open_connection_and_pass_resumes_it() {
        let (target, mut seen) = echo_server().await;
        let p = Proxy::start("t", target).await.unwrap();
        let mut c = TcpStream::connect(p.addr()).await.unwrap();
        c.write_all(b"a").await.unwrap();
        assert_eq!(read_exact(&mut c, 1).await, b"a");
        assert_eq!(server_got(&mut seen).await, b"a");

        p.set(LinkMode::DROP);
        c.write_all(b"lost").await.unwrap();
        nothing_arrives(&mut c).await;
        server_got_nothing(&mut seen).await;

        p.set(LinkMode::PASS);
        c.write_all(b"b").await.unwrap();
        assert_eq!(
            read_exact(&mut c, 1).await,
            b"b",
            "dropped bytes must never arrive later"
        );
        assert_eq!(server_got(&mut seen).await, b"b");
    }

    #[tokio::test]
    async fn cut_backward_lets_requests_through_but_not_replies() {
        let (target, mut seen) = echo_server().await;
        let p = Proxy::start("t", target).await.unwrap();
        let mut c = TcpStream::connect(p.addr()).await.unwrap();
        p.set(LinkMode::cut_backward());
        c.write_all(b"req").await.unwrap();
        assert_eq!(server_got(&mut seen).await, b"req");
        nothing_arrives(&mut c).await;
    }

    #[tokio::test]
    async fn cut_forward_loses_requests() {
        let (target, mut seen) = echo_server().await;
        let p = Proxy::start("t", target).await.unwrap();
        let mut c = TcpStream::connect(p.addr()).await.unwrap();
        p.set(LinkMode::cut_forward());
        c.write_all(b"req").await.unwrap();
        server_got_nothing(&mut seen).await;
        nothing_arrives(&mut c).await;
    }

    #[tokio::test]
    async fn delay_holds_each_chunk_back_in_order() {
        let (target, _seen) = echo_server().await;
        let p = Proxy::start("t", target).await.unwrap();
        let mut c = TcpStream::connect(p.addr()).await.unwrap();
        let d = Duration::from_millis(150);
        p.set(LinkMode::delay(d));
        let t = std::time::Instant::now();
        c.write_all(b"x").await.unwrap();
        c.write_all(b"y").await.unwrap();
        assert_eq!(read_exact(&mut c, 2).await, b"xy");
        assert!(
            t.elapsed() >= 2 * d,
            "round trip {:?} shorter than both delays",
            t.elapsed()
        );
    }

    #[tokio::test]
    async fn hold_buffers_until_release_then_delivers_in_order() {
        let (target, mut seen) = echo_server().await;
        let p = Proxy::start("t", target).await.unwrap();
        let mut c = TcpStream::connect(p.addr()).await.unwrap();
        p.set(LinkMode::HOLD);
        c.write_all(b"one").await.unwrap();
        c.write_all(b"two").await.unwrap();
        server_got_nothing(&mut seen).await;
        p.set(LinkMode::PASS);
        assert_eq!(read_exact(&mut c, 6).await, b"onetwo");
    }

    #[tokio::test]
    async fn hold_is_bounded_and_pushes_back_on_the_sender() {
        let (target, _seen) = echo_server().await;
        let p = Proxy::start_with_limit("t", target, 1024).await.unwrap();
        let mut c = TcpStream::connect(p.addr()).await.unwrap();
        p.set(LinkMode::HOLD);
        let big = vec![7u8; 64 << 20];
        assert!(
            timeout(QUIET, c.write_all(&big)).await.is_err(),
            "a 64 MiB write went through a held link"
        );
    }

    #[tokio::test]
    async fn target_down_closes_the_connection() {
        let target = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let p = Proxy::start("t", target).await.unwrap();
        let mut c = TcpStream::connect(p.addr()).await.unwrap();
        let mut b = [0u8; 1];
        let n = timeout(PATIENCE, c.read(&mut b))
            .await
            .expect("closed in time")
            .unwrap_or(0);
        assert_eq!(n, 0);
    }

    #[tokio::test]
    async fn dropping_the_proxy_closes_open_connections() {
        let (target, _seen) = echo_server().await;
        let p = Proxy::start("t", target).await.unwrap();
        let mut c = TcpStream::connect(p.addr()).await.unwrap();
        c.write_all(b"a").await.unwrap();
        assert_eq!(read_exact(&mut c, 1).await, b"a");
        drop(p);
        let mut b = [0u8; 1];
        let n = timeout(PATIENCE, c.read(&mut b))
            .await
            .expect("closed in time")
            .unwrap_or(0);
        assert_eq!(n, 0);
    }
}
