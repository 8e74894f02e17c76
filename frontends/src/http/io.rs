//! A deadline on a connection's writes: hyper 1 has none of its own, so a caller that sends
//! requests and never reads the replies would hold its connection, its slot under
//! `max_connections` and its buffers for as long as it likes.
//!
//! [`WriteDeadline`] wraps the stream: while a write, flush or shutdown makes no progress (the
//! stream answers `Pending`) a timer runs, and when it fires the call fails with `TimedOut`,
//! which ends hyper's connection. Any progress — one byte written — disarms it.
//!
//! Left out: a deadline on reads. Hyper bounds the wait for a request's head itself
//! (`header_read_timeout`, also between requests), and the routes bound the wait for a body.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// A stream whose writes fail with `TimedOut` after making no progress for `limit`.
pub(super) struct WriteDeadline<S> {
    inner: S,
    limit: Duration,
    /// Allocated at the first write that waits, then reset: most connections never wait.
    timer: Option<Pin<Box<Sleep>>>,
    armed: bool,
}

impl<S> WriteDeadline<S> {
    pub(super) fn new(inner: S, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            timer: None,
            armed: false,
        }
    }

    /// Passes a write's outcome on; a `Pending` one arms the timer (if it is not running) and
    /// becomes `TimedOut` once it has fired.
    fn watch<T>(&mut self, cx: &mut Context<'_>, polled: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.armed = false;
            return polled;
        }
        let deadline = Instant::now() + self.limit;
        let timer = match &mut self.timer {
            Some(t) => {
                if !self.armed {
                    t.as_mut().reset(deadline);
                }
                t
            }
            None => self.timer.insert(Box::pin(tokio::time::sleep_until(deadline))),
        };
        self.armed = true;
        ready!(timer.as_mut().poll(cx));
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("the caller read nothing for {:?}", self.limit),
        )))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.watch(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.watch(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A write the other end does not read fails after the limit, and not before; a write that
    /// keeps making progress, however slowly, never does.
    #[tokio::test(start_paused = true)]
    async fn a_write_without_progress_fails_after_the_limit_and_progress_resets_it() {
        let limit = Duration::from_secs(10);
        let (ours, mut theirs) = tokio::io::duplex(16);
        let mut w = WriteDeadline::new(ours, limit);
        let started = Instant::now();
        let e = w.write_all(&[0; 64]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), limit);

        let (ours, mut slow) = tokio::io::duplex(16);
        let mut w = WriteDeadline::new(ours, limit);
        let reader = tokio::spawn(async move {
            let mut b = [0u8; 8];
            let mut n = 0;
            while n < 160 {
                tokio::time::sleep(Duration::from_secs(9)).await;
                n += tokio::io::AsyncReadExt::read(&mut slow, &mut b).await.unwrap();
            }
        });
        // 160 bytes at 8 bytes per 9 s: about 3 minutes, never 10 s without progress.
        w.write_all(&[1; 160]).await.unwrap();
        reader.await.unwrap();
        drop(theirs.shutdown().await);
    }
}
