//! Closing client connections that make no progress.
//!
//! A client that opens a connection and sends nothing, or stops halfway
//! through its headers, would otherwise hold the connection (and its file
//! descriptor) for ever. Like nginx's `client_header_timeout` and
//! `keepalive_timeout`, a connection with no bytes read or written over a
//! whole [`IDLE_TIMEOUT`] while no request of it is being answered is
//! closed: between one and two timeouts after its last activity.
//!
//! The cost on the request path is one relaxed store per read or write and
//! one per request start and end; each connection has one timer, re-armed
//! once per timeout, never per request (hyper's own per-request
//! `header_read_timeout` measured 6% of rejecting throughput).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::wire::stream::ClientIo;
use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// What one connection has been doing, shared by its I/O, its requests and
/// its watchdog.
#[derive(Default, Debug)]
pub struct Activity {
    progress: AtomicBool,
    answering: AtomicUsize,
}

impl Activity {
    /// A request of this connection is being answered until the guard drops.
    pub fn answering(self: &Arc<Self>) -> Answering {
        self.answering.fetch_add(1, Ordering::Relaxed);
        Answering(self.clone())
    }

    /// True when nothing happened since the last call and no request is
    /// being answered; resets the progress mark.
    pub fn idle_since_last_look(&self) -> bool {
        let moved = self.progress.swap(false, Ordering::Relaxed);
        !moved && self.answering.load(Ordering::Relaxed) == 0
    }
}

/// Marks a request as being answered while alive.
#[derive(Debug)]
pub struct Answering(Arc<Activity>);

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.answering.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A stream that records on `activity` every read or write that moved bytes.
/// It can also be given back bytes already read from it ([`Self::unread`]),
/// which is how a connection goes from the HTTP/1.1 path to hyper.
#[derive(Debug)]
pub struct Watched<S> {
    inner: S,
    activity: Arc<Activity>,
    unread: Bytes,
}

impl<S> Watched<S> {
    /// Watches `inner`.
    pub fn new(inner: S, activity: Arc<Activity>) -> Self {
        Self {
            inner,
            activity,
            unread: Bytes::new(),
        }
    }

    /// What this stream's connection is doing.
    pub fn activity(&self) -> &Arc<Activity> {
        &self.activity
    }

    /// `bytes` (read from this stream earlier) are read again before
    /// anything more from the stream.
    pub fn unread(&mut self, bytes: Bytes) {
        self.unread = bytes;
    }

    fn moved(&self) {
        self.activity.progress.store(true, Ordering::Relaxed);
    }
}

impl<S> Watched<S> {
    /// The stream inside.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl Watched<ClientIo> {
    /// Waits until a read would not block, with no buffer to read into.
    /// (`poll_read_ready` uses the stream's own reader waker slot;
    /// `TcpStream::readable` queues a waiter under the driver's lock, which
    /// cost 0.8% of the CPU per rejection in a profile.)
    pub async fn readable(&self) -> io::Result<()> {
        std::future::poll_fn(|cx| self.poll_readable(cx)).await
    }

    /// Ready when a read would not block (see [`Watched::readable`]); no
    /// syscall, so it costs a check of the socket's readiness only.
    pub fn poll_readable(&self, cx: &mut std::task::Context<'_>) -> Poll<io::Result<()>> {
        if self.unread.is_empty() {
            self.inner.poll_read_ready(cx)
        } else {
            Poll::Ready(Ok(()))
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.unread.is_empty() {
            let n = self.unread.len().min(buf.remaining());
            buf.put_slice(&self.unread[..n]);
            self.unread.advance(n);
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.moved();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.moved();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.moved();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Runs `conn` to its end (`Some`), or until it has been idle for a whole
/// `idle` period (`None`, and `conn` is dropped: the connection closes).
/// The timer is looked at only once it has fired (an atomic load per wake
/// of the connection), not polled on every wake.
pub fn run_until_idle<F: Future>(conn: F, activity: Arc<Activity>, idle: Duration) -> UntilIdle<F> {
    UntilIdle {
        conn: Box::pin(conn),
        timer: Box::pin(tokio::time::sleep(idle)),
        activity,
        idle,
        armed: false,
    }
}

/// The future of [`run_until_idle`].
#[derive(Debug)]
pub struct UntilIdle<F> {
    conn: Pin<Box<F>>,
    timer: Pin<Box<Sleep>>,
    activity: Arc<Activity>,
    idle: Duration,
    armed: bool,
}

impl<F: Future> Future for UntilIdle<F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Poll::Ready(out) = this.conn.as_mut().poll(cx) {
            return Poll::Ready(Some(out));
        }
        if this.armed && !this.timer.is_elapsed() {
            return Poll::Pending;
        }
        loop {
            if this.armed {
                if this.activity.idle_since_last_look() {
                    return Poll::Ready(None);
                }
                let next = tokio::time::Instant::now() + this.idle;
                this.timer.as_mut().reset(next);
            }
            this.armed = true;
            // Registers this task's waker for the new deadline.
            if this.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }
}
