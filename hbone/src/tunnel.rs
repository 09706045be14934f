//! One HBONE tunnel: the two directions of an HTTP/2 CONNECT stream as a byte stream.
//!
//! - `shutdown()` sends END_STREAM: the peer reads EOF while the other direction keeps flowing
//!   (TCP half-close).
//! - Only END_STREAM is EOF. A peer's RST_STREAM before END_STREAM, whatever its code
//!   (NO_ERROR and CANCEL too), and a failed connection read as an error of kind
//!   `ConnectionReset`, so a cut transfer never looks complete (RFC 9113 section 8.5).
//! - Flow-control credit is given back as the reader consumes data, so a slow reader slows only
//!   its own stream, as long as the connection window holds a stream window for each stalled
//!   reader and one more (with the default windows, up to 15 stalled readers per connection).
//! - [`SendHalf::send`] passes `Bytes` to HTTP/2 without copying.

use std::any::Any;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use h2::{Reason, RecvStream, SendStream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::budget::SendBudget;

/// Something kept alive as long as either half of the tunnel (a pool's stream count).
pub(crate) type Guard = Arc<dyn Any + Send + Sync>;

/// An open HBONE tunnel: `AsyncRead + AsyncWrite` over one HTTP/2 CONNECT stream.
///
/// Dropping a tunnel that was not shut down resets its stream (RST_STREAM CANCEL, or the
/// reason set through [`Tunnel::reset_reason`]).
#[derive(Debug)]
pub struct Tunnel {
    recv: RecvHalf,
    send: SendHalf,
}

/// The receiving direction of a [`Tunnel`].
pub struct RecvHalf {
    stream: RecvStream,
    /// Data received and not yet read; its flow-control credit is released as it is read.
    pending: Bytes,
    eof: bool,
    /// Why reading ended, when it ended with an error: every later read fails the same way,
    /// so that a caller that reads again never takes the cut for an end.
    failed: Option<(io::ErrorKind, String)>,
    _guard: Option<Guard>,
}

/// The sending direction of a [`Tunnel`].
pub struct SendHalf {
    stream: SendStream<Bytes>,
    shut: bool,
    /// The RST_STREAM code sent when this half is dropped before it was shut; 0 for h2's own
    /// (CANCEL, unless the stream has ended).
    drop_reason: Arc<AtomicU32>,
    _guard: Option<Guard>,
    /// The connection's send budget (server connections), claimed before data goes to h2.
    budget: Option<Arc<SendBudget>>,
}

/// Chooses, from outside the task that owns a [`Tunnel`], the RST_STREAM code the tunnel is
/// reset with when it is dropped before its sending direction has ended (before `shutdown`
/// or [`SendHalf::finish`]).
///
/// By default a dropped tunnel is reset with CANCEL. The peer reads every reset before
/// END_STREAM as an error; a service that ends tunnels on purpose (a policy revoked, say) can
/// say why with a more telling code.
#[derive(Debug, Clone)]
pub struct ResetReason(Arc<AtomicU32>);

impl ResetReason {
    /// Resets with `reason` when the tunnel is dropped.
    pub fn set(&self, reason: Reason) {
        self.0.store(u32::from(reason), Ordering::Relaxed);
    }
}

// === impl Tunnel ===

impl Tunnel {
    pub(crate) fn new(send: SendStream<Bytes>, recv: RecvStream, guard: Option<Guard>) -> Self {
        Self {
            recv: RecvHalf {
                stream: recv,
                pending: Bytes::new(),
                eof: false,
                failed: None,
                _guard: guard.clone(),
            },
            send: SendHalf {
                stream: send,
                shut: false,
                drop_reason: Arc::default(),
                _guard: guard,
                budget: None,
            },
        }
    }

    /// Splits the tunnel into its two directions, to drive them from separate tasks.
    pub fn into_split(self) -> (RecvHalf, SendHalf) {
        (self.recv, self.send)
    }

    /// The receiving direction.
    pub fn recv_half(&mut self) -> &mut RecvHalf {
        &mut self.recv
    }

    /// The sending direction.
    pub fn send_half(&mut self) -> &mut SendHalf {
        &mut self.send
    }

    /// A handle that sets the RST_STREAM code this tunnel is reset with if it is dropped
    /// before its sending direction has ended. It stays valid after [`Tunnel::into_split`].
    pub fn reset_reason(&self) -> ResetReason {
        ResetReason(self.send.drop_reason.clone())
    }

    /// Aborts the tunnel: the peer sees RST_STREAM with `reason`.
    pub fn reset(&mut self, reason: Reason) {
        self.send.stream.send_reset(reason);
    }
}

impl AsyncRead for Tunnel {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.recv).poll_read(cx, buf)
    }
}

impl AsyncWrite for Tunnel {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.send).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.send).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.send).poll_shutdown(cx)
    }
}

// === impl RecvHalf ===

impl RecvHalf {
    /// The next chunk of data as HTTP/2 delivered it, or `None` at EOF. Its flow-control credit
    /// is released when it is returned.
    ///
    /// # Errors
    ///
    /// `ConnectionReset` when the stream was reset before END_STREAM, with any code, or the
    /// connection failed.
    pub fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Bytes>>> {
        if !self.pending.is_empty() {
            let chunk = std::mem::take(&mut self.pending);
            self.release(chunk.len());
            return Poll::Ready(Ok(Some(chunk)));
        }
        if self.eof {
            return Poll::Ready(self.ended().map(|()| None));
        }
        loop {
            match ready!(self.stream.poll_data(cx)) {
                Some(Ok(chunk)) if chunk.is_empty() => continue,
                Some(Ok(chunk)) => {
                    self.release(chunk.len());
                    return Poll::Ready(Ok(Some(chunk)));
                }
                Some(Err(e)) => return Poll::Ready(self.end_with(e).map(|()| None)),
                None => {
                    self.eof = true;
                    return Poll::Ready(Ok(None));
                }
            }
        }
    }

    /// The next chunk of data, or `None` at EOF. See [`RecvHalf::poll_chunk`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: no data is lost if the future is dropped.
    ///
    /// # Errors
    ///
    /// As [`RecvHalf::poll_chunk`].
    pub async fn chunk(&mut self) -> io::Result<Option<Bytes>> {
        std::future::poll_fn(|cx| self.poll_chunk(cx)).await
    }

    fn release(&mut self, n: usize) {
        // Failing to release only means the stream is already gone; the next poll reports it.
        let _ = self.stream.flow_control().release_capacity(n);
    }

    /// Ends reading with the stream's error. Every reset that comes before END_STREAM is an
    /// error, NO_ERROR and CANCEL included: data may have been cut. So is every failure of the
    /// connection under the stream (a TCP reset, a TLS connection cut without close_notify):
    /// to the reader each is a cut like a reset, and reads as one (`ConnectionReset`, the
    /// cause kept in the message).
    fn end_with(&mut self, e: h2::Error) -> io::Result<()> {
        let e = match h2_to_io(e) {
            e if e.kind() == io::ErrorKind::ConnectionReset => e,
            e => io::Error::new(io::ErrorKind::ConnectionReset, e),
        };
        self.eof = true;
        self.failed = Some((e.kind(), e.to_string()));
        Err(e)
    }

    /// How reading ended: `Ok` at END_STREAM, the first error again otherwise.
    fn ended(&self) -> io::Result<()> {
        match &self.failed {
            None => Ok(()),
            Some((kind, message)) => Err(io::Error::new(*kind, message.clone())),
        }
    }
}

impl AsyncRead for RecvHalf {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.pending.is_empty() && !self.eof {
            loop {
                match ready!(self.stream.poll_data(cx)) {
                    Some(Ok(chunk)) if chunk.is_empty() => continue,
                    Some(Ok(chunk)) => {
                        self.pending = chunk;
                        break;
                    }
                    Some(Err(e)) => return Poll::Ready(self.end_with(e)),
                    None => {
                        self.eof = true;
                        break;
                    }
                }
            }
        }
        if self.pending.is_empty() && self.eof {
            return Poll::Ready(self.ended());
        }
        let n = self.pending.len().min(buf.remaining());
        if n > 0 {
            buf.put_slice(&self.pending[..n]);
            self.pending.advance(n);
            self.release(n);
        }
        Poll::Ready(Ok(()))
    }
}

impl std::fmt::Debug for RecvHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvHalf")
            .field("stream", &self.stream.stream_id())
            .field("pending", &self.pending.len())
            .field("eof", &self.eof)
            .finish()
    }
}

// === impl SendHalf ===

/// Largest amount of send capacity asked for at once.
const MAX_RESERVE: usize = 1024 * 1024;

impl Tunnel {
    /// Counts what this tunnel sends against its connection's `budget`.
    pub(crate) fn set_send_budget(&mut self, budget: Arc<SendBudget>) {
        self.send.budget = Some(budget);
    }
}

impl SendHalf {
    fn stream_id(&self) -> u32 {
        u32::from(self.stream.stream_id())
    }

    /// Hands `chunk` to h2; gives its budget back if h2 refuses it.
    fn send_chunk(&mut self, chunk: Bytes) -> io::Result<()> {
        let n = chunk.len();
        self.stream.send_data(chunk, false).map_err(|e| {
            if let Some(budget) = &self.budget {
                budget.unclaim(u32::from(self.stream.stream_id()), n);
            }
            h2_to_io(e)
        })
    }

    /// Waits for send capacity; returns how many bytes may be sent now.
    fn poll_capacity(&mut self, cx: &mut Context<'_>, want: usize) -> Poll<io::Result<usize>> {
        if self.shut {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "tunnel already shut down for writing",
            )));
        }
        self.stream.reserve_capacity(want.min(MAX_RESERVE));
        loop {
            let available = self.stream.capacity();
            if available > 0 {
                // Flow control allows it; the connection's send budget must too. What is
                // claimed here is sent at once by the caller (it asked for `want`).
                return match &self.budget {
                    None => Poll::Ready(Ok(available)),
                    Some(budget) => budget
                        .poll_claim(cx, self.stream_id(), available.min(want))
                        .map(Ok),
                };
            }
            match self.stream.poll_capacity(cx) {
                Poll::Ready(Some(Ok(_))) => continue,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(h2_to_io(e))),
                Poll::Ready(None) => return Poll::Ready(Err(broken_pipe())),
                Poll::Pending => {
                    // Waiting for credit: make sure a reset from the peer wakes us too.
                    return match self.stream.poll_reset(cx) {
                        Poll::Ready(Ok(reason)) => Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::BrokenPipe,
                            format!("peer reset the tunnel: {reason:?}"),
                        ))),
                        Poll::Ready(Err(e)) => Poll::Ready(Err(h2_to_io(e))),
                        Poll::Pending => Poll::Pending,
                    };
                }
            }
        }
    }

    /// Sends as much of `data` as flow control allows now, without copying; what was sent is
    /// removed from the front of `data`.
    ///
    /// # Errors
    ///
    /// `BrokenPipe` when the stream is closed or reset, or the connection failed.
    pub fn poll_send(&mut self, cx: &mut Context<'_>, data: &mut Bytes) -> Poll<io::Result<()>> {
        if data.is_empty() {
            return Poll::Ready(Ok(()));
        }
        let n = ready!(self.poll_capacity(cx, data.len()))?.min(data.len());
        let chunk = data.split_to(n);
        self.send_chunk(chunk)?;
        Poll::Ready(Ok(()))
    }

    /// Sends all of `data`, waiting for flow-control credit as needed, without copying.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: if dropped, an unknown prefix of `data` has been sent.
    ///
    /// # Errors
    ///
    /// As [`SendHalf::poll_send`].
    pub async fn send(&mut self, mut data: Bytes) -> io::Result<()> {
        while !data.is_empty() {
            std::future::poll_fn(|cx| self.poll_send(cx, &mut data)).await?;
        }
        Ok(())
    }

    /// Sends END_STREAM: the peer reads EOF; the other direction stays open.
    ///
    /// # Errors
    ///
    /// When the stream is already reset.
    pub fn finish(&mut self) -> io::Result<()> {
        if !self.shut {
            self.shut = true;
            self.stream
                .send_data(Bytes::new(), true)
                .map_err(h2_to_io)?;
        }
        Ok(())
    }

    /// Aborts the stream with RST_STREAM `reason`.
    pub fn reset(&mut self, reason: Reason) {
        self.shut = true;
        self.stream.send_reset(reason);
        if let Some(budget) = &self.budget {
            budget.discard(self.stream_id());
        }
    }
}

impl AsyncWrite for SendHalf {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let n = ready!(self.poll_capacity(cx, buf.len()))?.min(buf.len());
        self.send_chunk(Bytes::copy_from_slice(&buf[..n]))?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Data handed to h2 is written by the connection task as fast as the socket takes it.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(self.finish())
    }
}

impl std::fmt::Debug for SendHalf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendHalf")
            .field("stream", &self.stream.stream_id())
            .field("shut", &self.shut)
            .finish()
    }
}

fn broken_pipe() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "tunnel stream closed")
}

pub(crate) fn h2_to_io(e: h2::Error) -> io::Error {
    if e.is_io() {
        return e
            .into_io()
            .unwrap_or_else(|| io::Error::other("h2 I/O error"));
    }
    let kind = if e.is_reset() || e.is_go_away() {
        io::ErrorKind::ConnectionReset
    } else {
        io::ErrorKind::Other
    };
    io::Error::new(kind, e)
}

impl Drop for SendHalf {
    fn drop(&mut self) {
        // Only a cut sending direction is reset with the chosen reason: once END_STREAM is
        // queued, the peer has all the data and its EOF is a true one.
        let reason = self.drop_reason.load(Ordering::Relaxed);
        if reason != 0 && !self.shut {
            self.stream.send_reset(Reason::from(reason));
        }
        if let Some(budget) = &self.budget {
            // A stream h2 already holds as reset will never write what it still queued: give
            // it all back now, whatever order the reset and the last claim came in.
            let waker = std::task::Waker::noop();
            let mut cx = Context::from_waker(waker);
            if self.stream.poll_reset(&mut cx).is_ready() {
                budget.discard(self.stream_id());
            } else {
                budget.close(self.stream_id());
            }
        }
    }
}
