//! Limits on connections, whatever a client sends or does not send: at most
//! `limits.max_connections` at once (a new one over the cap is closed at once), and a
//! connection with no traffic in either direction for `limits.idle_timeout_seconds` is
//! closed. Together with the header-read timeout (hyper's), a client cannot hold the
//! agent's descriptors by connecting and going quiet.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// The shared cap and the idle timeout.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    permits: Arc<Semaphore>,
    idle: Duration,
}

impl ConnectionLimits {
    pub fn new(max_connections: usize, idle: Duration) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(max_connections)),
            idle,
        }
    }

    /// `stream` under the limits, or an error when the cap is reached (the connection is
    /// then dropped without a word: answering would take the resources the cap saves).
    pub fn admit<S>(&self, stream: S) -> io::Result<Limited<S>> {
        let permit =
            self.permits.clone().try_acquire_owned().map_err(|_| {
                io::Error::other("connection limit reached (limits.max_connections)")
            })?;
        Ok(Limited {
            inner: stream,
            _permit: permit,
            idle: self.idle,
            deadline: Box::pin(tokio::time::sleep(self.idle)),
        })
    }
}

/// A stream that holds its place under the cap and fails once idle too long.
pub struct Limited<S> {
    inner: S,
    _permit: OwnedSemaphorePermit,
    idle: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl<S> Limited<S> {
    fn touch(&mut self) {
        let next = Instant::now() + self.idle;
        self.deadline.as_mut().reset(next);
    }

    /// Pending I/O turns into an error once the deadline passed.
    fn check_idle(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        self.deadline.as_mut().poll(cx).is_ready().then(|| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                "connection idle too long (limits.idle_timeout_seconds)",
            )
        })
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Limited<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(result) => {
                this.touch();
                Poll::Ready(result)
            }
            Poll::Pending => match this.check_idle(cx) {
                Some(error) => Poll::Ready(Err(error)),
                None => Poll::Pending,
            },
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Limited<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let written = Pin::new(&mut this.inner).poll_write(cx, data);
        if written.is_ready() {
            this.touch();
        }
        written
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let written = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if written.is_ready() {
            this.touch();
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
