//! A deadline on a connection's first admitted call: a client that connects and never opens
//! a call its server accepts (no stream at all, or only refused ones) is closed when the
//! deadline passes, instead of holding its connection slot until keepalive notices nothing.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// The mark of one connection served through [`AdmissionDeadline`]: the service calls
/// [`admit`](Self::admit) once it has accepted a call on the connection, which lifts the
/// deadline. tonic hands it to every request of the connection as an extension:
///
/// ```
/// use meshkit_xds_server::Admission;
///
/// fn accepted<T>(request: &tonic::Request<T>) {
///     if let Some(admission) = request.extensions().get::<Admission>() {
///         admission.admit();
///     }
/// }
/// # let _ = accepted::<()>;
/// ```
#[derive(Debug, Clone, Default)]
pub struct Admission(Arc<AtomicBool>);

/// A connection that fails its next read with [`io::ErrorKind::TimedOut`] once `timeout` has
/// passed since it was made, unless its [`Admission`] was admitted first; after that it is the
/// connection it wraps. Its tonic connection info is the [`Admission`].
///
/// ```
/// # async fn demo(tcp: tokio::net::TcpStream) {
/// use meshkit_xds_server::AdmissionDeadline;
///
/// let io = AdmissionDeadline::new(tcp, std::time::Duration::from_secs(10));
/// # let _ = io;
/// # }
/// ```
#[derive(Debug)]
pub struct AdmissionDeadline<IO> {
    io: IO,
    admission: Admission,
    /// `None` once admitted (or with no deadline).
    deadline: Option<Pin<Box<Sleep>>>,
}

// === impl Admission ===

impl Admission {
    /// Marks the connection as admitted: its deadline no longer applies.
    pub fn admit(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether [`admit`](Self::admit) was called.
    pub fn is_admitted(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

// === impl AdmissionDeadline ===

impl<IO> AdmissionDeadline<IO> {
    /// `io`, closed at its next read after `timeout` unless admitted by then. Call within a
    /// tokio runtime: the deadline is a tokio timer.
    pub fn new(io: IO, timeout: Duration) -> Self {
        Self {
            io,
            admission: Admission::default(),
            deadline: Some(Box::pin(tokio::time::sleep(timeout))),
        }
    }

    /// The connection's [`Admission`].
    pub fn admission(&self) -> &Admission {
        &self.admission
    }

    /// `Err(TimedOut)` once the deadline has passed unadmitted; registers the waker otherwise,
    /// so that a connection with nothing to read is woken and closed.
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let Some(deadline) = &mut self.deadline else {
            return Ok(());
        };
        if self.admission.is_admitted() {
            self.deadline = None;
            return Ok(());
        }
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no call was admitted on this connection before its deadline",
            )),
            Poll::Pending => Ok(()),
        }
    }
}

impl<IO> tonic::transport::server::Connected for AdmissionDeadline<IO> {
    type ConnectInfo = Admission;

    fn connect_info(&self) -> Admission {
        self.admission.clone()
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for AdmissionDeadline<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Err(e) = self.check(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for AdmissionDeadline<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test(start_paused = true)]
    async fn an_unadmitted_connection_fails_its_read_at_the_deadline() {
        let (near, _far) = tokio::io::duplex(64);
        let start = tokio::time::Instant::now();
        let mut io = AdmissionDeadline::new(near, Duration::from_secs(10));
        let mut buf = [0u8; 8];
        let err = io.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(10),
            "at the deadline, not before"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_admitted_connection_reads_past_the_deadline() {
        let (near, mut far) = tokio::io::duplex(64);
        let mut io = AdmissionDeadline::new(near, Duration::from_secs(10));
        io.admission().admit();
        tokio::time::sleep(Duration::from_secs(60)).await;
        tokio::io::AsyncWriteExt::write_all(&mut far, b"hello")
            .await
            .unwrap();
        let mut buf = [0u8; 5];
        io.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"hello");
    }
}
