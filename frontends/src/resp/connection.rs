//! The Redis port's connections: accepting them within two caps, reading each one's commands
//! with [`RequestReader`], and every deadline a connection lives under.
//!
//! | a connection that... | is closed |
//! |---|---|
//! | has not been *admitted* — authenticated when there is a password, else has sent one complete command — within [`ADMIT_TIMEOUT`] of its accept | with `-NOAUTH ...` (password) or `-ERR no command within ...` |
//! | has a command started and not complete within [`PARTIAL_TIMEOUT`] of its first byte | with `-ERR Protocol error: ...` |
//! | sends a command over [`MAX_PENDING_BYTES`](super::MAX_PENDING_BYTES) (refused as soon as its headers say so) | with `-ERR Protocol error: ...` |
//! | does not read a reply for [`WRITE_TIMEOUT`] | at once |
//! | is admitted and sends nothing for `idle_timeout`, when set (Redis's `timeout`; off by default) | quietly, as Redis does |
//!
//! Connections not yet admitted have their own, small cap ([`RespConfig::max_unauthenticated`]),
//! inside the cap of all connections: silent sockets can fill only it, and clients that
//! authenticate still get in. A connection's buffers shrink back to [`KEEP_BYTES`] each once a
//! large command or reply is done, so what a flood of large commands held is returned when it
//! ends: a connection holds at most about twice [`MAX_PENDING_BYTES`](super::MAX_PENDING_BYTES) while it reads one, and
//! about 2 × [`KEEP_BYTES`] when idle.
//!
//! Deliberately left out: a per-IP cap (behind a load balancer every caller has its address).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Instant;
use tracing::{debug, warn};

use super::request::RequestReader;
use super::{After, Reply, RespConfig, Session};
use crate::calls::Calls;
use crate::stopped;

/// Longest a started command may take to arrive in full, from its first byte.
pub const PARTIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a connection may take to be admitted (authenticate, or send a first command).
pub const ADMIT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a reply may wait for the caller to read it.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// What each of a connection's two buffers keeps between commands.
pub const KEEP_BYTES: usize = 16 * 1024;
/// Replies buffered before they are written even within one read's pipeline.
const FLUSH_BYTES: usize = 64 * 1024;
/// Most commands read before they are run.
const MAX_DECODED: usize = 256;

/// The bytes all connections together may hold for commands larger than [`KEEP_BYTES`] while
/// they arrive: without it, each of 10,000 connections may hold a command of up to
/// [`MAX_PENDING_BYTES`](super::MAX_PENDING_BYTES), 5 GB in all.
#[derive(Debug)]
pub(super) struct LargeBudget {
    used: AtomicUsize,
    limit: usize,
}

impl LargeBudget {
    pub(super) fn new(limit: usize) -> Self {
        Self {
            used: AtomicUsize::new(0),
            limit,
        }
    }

    /// Takes `n` more bytes if they fit.
    fn take(&self, n: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used + n <= self.limit).then_some(used + n)
            })
            .is_ok()
    }

    fn give(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }
}

/// What one connection holds of the [`LargeBudget`]; given back when dropped.
struct Held<'b> {
    budget: &'b LargeBudget,
    bytes: usize,
}

impl Held<'_> {
    /// Holds what a command of `need` bytes takes beyond [`KEEP_BYTES`]; false when the budget
    /// has no room for it.
    fn hold(&mut self, need: usize) -> bool {
        let want = need.saturating_sub(KEEP_BYTES);
        // Nearly every read holds nothing before and after: no touch of the shared counter.
        if want == self.bytes {
            return true;
        }
        if want > self.bytes {
            if !self.budget.take(want - self.bytes) {
                return false;
            }
        } else {
            self.budget.give(self.bytes - want);
        }
        self.bytes = want;
        true
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.budget.give(self.bytes);
    }
}

/// Serves the connections `listener` accepts until `stop` turns true.
pub async fn serve<C: Calls>(
    listener: tokio::net::TcpListener,
    calls: Arc<C>,
    cfg: Arc<RespConfig>,
    mut stop: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(cfg.max_connections));
    let unadmitted = Arc::new(Semaphore::new(cfg.max_unauthenticated.min(cfg.max_connections)));
    let large = Arc::new(LargeBudget::new(cfg.large_command_bytes));
    let ids = AtomicU64::new(1);
    loop {
        let (mut stream, peer) = tokio::select! {
            () = stopped(&mut stop) => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors, most likely: wait rather than spin.
                    warn!(error = %e, "RESP accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let permits = slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| "-ERR max number of clients reached\r\n")
            .and_then(|slot| {
                let gate = unadmitted
                    .clone()
                    .try_acquire_owned()
                    .map_err(|_| "-ERR max number of unauthenticated clients reached\r\n")?;
                Ok((slot, gate))
            });
        let (slot, gate) = match permits {
            Ok(p) => p,
            Err(line) => {
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(line.as_bytes())).await;
                });
                continue;
            }
        };
        let (calls, cfg, large) = (calls.clone(), cfg.clone(), large.clone());
        let id = ids.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let ended = match &cfg.tls {
                None => serve_connection(stream, &*calls, &cfg, id, Some(gate), &large).await,
                Some(tls) => match crate::tls::accept(tls, stream).await {
                    crate::tls::Accepted::Caller(stream, _) => {
                        serve_connection(stream, &*calls, &cfg, id, Some(gate), &large).await
                    }
                    crate::tls::Accepted::Refused(mut stream, why) => {
                        let line = format!("-NOPERM {}\r\n", why.replace(['\r', '\n'], " "));
                        let _ = tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(line.as_bytes())).await;
                        let _ = stream.shutdown().await;
                        Ok(())
                    }
                    crate::tls::Accepted::Failed(why) => Err(std::io::Error::other(why)),
                },
            };
            if let Err(e) = ended {
                debug!(%peer, error = %e, "RESP connection ended");
            }
            drop(slot);
        });
    }
}

/// Serves one connection until the caller closes it, sends `QUIT`, breaks the protocol or
/// misses a deadline (the module's table).
pub async fn connection<S, C>(stream: S, calls: &C, cfg: &RespConfig, id: u64) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
    C: Calls,
{
    let large = LargeBudget::new(cfg.large_command_bytes);
    serve_connection(stream, calls, cfg, id, None, &large).await
}

/// Which deadline the next read waits under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Deadline {
    Command,
    Admit,
    Idle,
}

async fn serve_connection<S, C>(
    mut stream: S,
    calls: &C,
    cfg: &RespConfig,
    id: u64,
    mut gate: Option<OwnedSemaphorePermit>,
    large: &LargeBudget,
) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
    C: Calls,
{
    let accepted = Instant::now();
    let mut session = Session::new(calls, cfg, id);
    let mut reader = RequestReader::default();
    let mut input: Vec<u8> = Vec::with_capacity(KEEP_BYTES);
    let mut out: Vec<u8> = Vec::with_capacity(KEEP_BYTES);
    let mut held = Held {
        budget: large,
        bytes: 0,
    };
    let mut admitted = false;
    // When the first byte of the command not yet complete arrived.
    let mut started: Option<Instant> = None;
    loop {
        let mut close = false;
        let mut ran = false;
        loop {
            let mut commands = Vec::new();
            let mut broken = None;
            while commands.len() < MAX_DECODED {
                match reader.next(&input) {
                    Ok(Some(c)) => commands.push(c),
                    Ok(None) => break,
                    Err(msg) => {
                        broken = Some(msg);
                        break;
                    }
                }
            }
            // The arguments borrow `input` until they have run: no copy of an argument.
            let args: Vec<Vec<&[u8]>> = commands
                .iter()
                .map(|c| c.iter().map(|r| &input[r.clone()]).collect())
                .collect();
            ran |= !args.is_empty();
            // The commands before a broken frame are run and answered; what follows it is not.
            if session.run(&args, &mut out).await == After::Close {
                close = true;
            } else if let Some(msg) = broken {
                Reply::err(msg).encode(session.proto(), &mut out);
                close = true;
            }
            if out.len() >= FLUSH_BYTES {
                write(&mut stream, &mut out).await?;
            }
            if close || commands.len() < MAX_DECODED {
                break;
            }
        }
        let done = reader.consumed();
        input.drain(..done);
        reader.discard(done);
        // A large command takes its room from the budget before its bytes are read, all at once
        // (no doubling past it).
        let need = reader.announced();
        if !close && !held.hold(need) {
            out.extend_from_slice(b"-OVERLOADED too many large commands arriving at once; send it again later\r\n");
            close = true;
        } else if need > input.capacity() {
            input.reserve_exact(need - input.len());
        }
        if input.is_empty() {
            started = None;
        } else if done > 0 || started.is_none() {
            // What is left began in the read just made: the commands before it were complete.
            started = Some(Instant::now());
        }
        if !admitted && ran && session.authenticated() {
            admitted = true;
            // Its place among the connections not yet admitted is free for another.
            drop(gate.take());
        }
        write(&mut stream, &mut out).await?;
        if close {
            let _ = stream.shutdown().await;
            return Ok(());
        }
        shrink(&mut input);
        shrink(&mut out);
        let deadlines = [
            started.map(|t| (t + PARTIAL_TIMEOUT, Deadline::Command)),
            (!admitted).then_some((accepted + ADMIT_TIMEOUT, Deadline::Admit)),
            cfg.idle_timeout
                .filter(|_| admitted && input.is_empty())
                .map(|idle| (Instant::now() + idle, Deadline::Idle)),
        ];
        let read = match deadlines.into_iter().flatten().min_by_key(|(at, _)| *at) {
            None => read_some(&mut stream, &mut input).await?,
            Some((at, which)) => match tokio::time::timeout_at(at, read_some(&mut stream, &mut input)).await {
                Ok(r) => r?,
                Err(_) => {
                    let line = match which {
                        Deadline::Command => Some(format!(
                            "-ERR Protocol error: a command not complete within {PARTIAL_TIMEOUT:?} of its first byte\r\n"
                        )),
                        Deadline::Admit if cfg.password.is_some() => Some(format!(
                            "-NOAUTH authentication not completed within {ADMIT_TIMEOUT:?}; closing\r\n"
                        )),
                        Deadline::Admit => Some(format!("-ERR no command within {ADMIT_TIMEOUT:?}; closing\r\n")),
                        Deadline::Idle => None,
                    };
                    if let Some(line) = line {
                        out.extend_from_slice(line.as_bytes());
                        write(&mut stream, &mut out).await?;
                    }
                    let _ = stream.shutdown().await;
                    return Ok(());
                }
            },
        };
        if read == 0 {
            return Ok(());
        }
    }
}

/// Reads what has arrived into `input`, into the room it has, or [`KEEP_BYTES`] more when it has
/// almost none.
async fn read_some<S: AsyncRead + Unpin>(stream: &mut S, input: &mut Vec<u8>) -> std::io::Result<usize> {
    // Exactly: the amortized doubling of `reserve` would double a large command's room.
    if input.capacity() - input.len() < 1024 {
        input.reserve_exact(KEEP_BYTES);
    }
    stream.read_buf(input).await
}

/// Gives back a buffer's room beyond [`KEEP_BYTES`] once it holds little.
fn shrink(buf: &mut Vec<u8>) {
    if buf.capacity() > KEEP_BYTES && buf.len() <= KEEP_BYTES / 2 {
        buf.shrink_to(KEEP_BYTES);
    }
}

/// Writes and empties `out`; a caller that does not read for [`WRITE_TIMEOUT`] is cut off.
async fn write<S: AsyncWrite + Unpin>(stream: &mut S, out: &mut Vec<u8>) -> std::io::Result<()> {
    if out.is_empty() {
        return Ok(());
    }
    match tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(out)).await {
        Ok(r) => r?,
        Err(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the caller read no reply for 30 s",
            ));
        }
    }
    out.clear();
    Ok(())
}
