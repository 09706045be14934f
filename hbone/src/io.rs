//! The I/O layers around TLS: on the server, a frame watcher above TLS that sees the HTTP/2
//! frames go by; on the client, a layer under TLS that sends its last handshake flight together with the
//! HTTP/2 preface. Both ends hold their first writes back to send them in one system call,
//! and afterwards send the small writes of one poll of the connection in one (on the server,
//! above TLS, in one record too).

use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::budget::SendBudget;

/// The most bytes a connection holds back for [`Held`]; past it, they go out at once.
const HOLD_LIMIT: usize = 16 * 1024;

/// The largest write a [`Cork`] holds to the end of its poll: frames such as SETTINGS ACK,
/// WINDOW_UPDATE, PING, RST_STREAM and GOAWAY, and close_notify, each a record of well under
/// this. Larger writes (DATA) go out at once, with what is held in front of them in the same
/// system call, so the data path copies nothing into the hold.
const CORK_SMALL: usize = 1024;

/// The most buffers one write passes to the transport: what is held and 63 of the caller's
/// (rustls writes at most 64 records at a time).
const MAX_SLICES: usize = 64;

/// Writes held back so that they leave with the next ones, in one system call and (above
/// TLS) one record.
///
/// Two kinds of holding:
/// - At the start of a connection (`holding`), where each flight of a few frames would
///   otherwise be a write of its own. Holding passes over `skip` flushes; the next flush, a
///   shutdown, or more than [`HOLD_LIMIT`] bytes send what is held, and from then on it stops.
/// - While `corked` (a [`Cork`] polls the connection), writes of up to [`CORK_SMALL`] bytes
///   wait and flushes are passed over; the cork sends what is held when its poll ends, so
///   frames that one poll of the connection writes one flush at a time leave together.
///
/// A write that is not held goes out behind what is, in one vectored write.
#[derive(Debug, Default)]
struct Held {
    buf: Vec<u8>,
    /// Bytes of `buf` already written.
    sent: usize,
    /// Flushes still to pass over.
    skip: u8,
    holding: bool,
    /// Inside a [`Cork`]'s poll.
    corked: bool,
    /// A flush passed over while corked, owed to the transport when the poll ends.
    flush_owed: bool,
}

impl Held {
    fn holding(skip: u8) -> Self {
        Self {
            holding: true,
            skip,
            ..Self::default()
        }
    }

    /// Takes `bufs` into the held bytes if they are to wait and fit; `None` when they are to
    /// be written through.
    fn take(&mut self, bufs: &[IoSlice<'_>]) -> Option<usize> {
        let n: usize = bufs.iter().map(|b| b.len()).sum();
        let waits = self.holding || (self.corked && n <= CORK_SMALL);
        if !waits || self.buf.len() + n > HOLD_LIMIT {
            return None;
        }
        for b in bufs {
            self.buf.extend_from_slice(b);
        }
        Some(n)
    }

    /// Whether a flush is to be passed over (and counts it). While holding, never once a
    /// release has begun, which a flush then finishes.
    fn pass_over(&mut self) -> bool {
        if self.holding {
            if self.sent == 0 && self.skip > 0 {
                self.skip -= 1;
                return true;
            }
            return false;
        }
        if self.corked {
            self.flush_owed = true;
            return true;
        }
        false
    }

    /// All of `buf` has been written: empty it, and stop holding.
    fn released(&mut self) {
        if self.holding {
            // The start of a connection is over: give its buffer back.
            self.holding = false;
            self.buf = Vec::new();
        } else {
            self.buf.clear();
        }
        self.sent = 0;
    }

    /// Writes what is held to `io`, and stops holding.
    fn poll_release<IO: AsyncWrite + Unpin>(
        &mut self,
        io: &mut IO,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        while self.sent < self.buf.len() {
            let n = ready!(Pin::new(&mut *io).poll_write(cx, &self.buf[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.released();
        Poll::Ready(Ok(()))
    }

    fn poll_write<IO: AsyncWrite + Unpin>(
        &mut self,
        io: &mut IO,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Some(n) = self.take(bufs) {
            return Poll::Ready(Ok(n));
        }
        // Not to be held, or too much to hold: what is held goes first, in the same write.
        while self.sent < self.buf.len() {
            let rest = self.buf.len() - self.sent;
            let mut slices = [IoSlice::new(&[]); MAX_SLICES];
            slices[0] = IoSlice::new(&self.buf[self.sent..]);
            let k = bufs.len().min(MAX_SLICES - 1);
            slices[1..=k].copy_from_slice(&bufs[..k]);
            let n = ready!(Pin::new(&mut *io).poll_write_vectored(cx, &slices[..=k]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            if n < rest {
                self.sent += n;
                continue;
            }
            self.released();
            if n > rest {
                return Poll::Ready(Ok(n - rest));
            }
        }
        if self.holding {
            self.released();
        }
        Pin::new(io).poll_write_vectored(cx, bufs)
    }

    fn poll_flush<IO: AsyncWrite + Unpin>(
        &mut self,
        io: &mut IO,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        if self.pass_over() {
            return Poll::Ready(Ok(()));
        }
        ready!(self.poll_release(io, cx))?;
        Pin::new(io).poll_flush(cx)
    }

    /// Sends what is held now, whatever flushes were still to be passed over.
    fn poll_flush_now<IO: AsyncWrite + Unpin>(
        &mut self,
        io: &mut IO,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        self.skip = 0;
        self.poll_flush(io, cx)
    }

    fn poll_shutdown<IO: AsyncWrite + Unpin>(
        &mut self,
        io: &mut IO,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        ready!(self.poll_release(io, cx))?;
        Pin::new(io).poll_shutdown(cx)
    }

    /// Ends a [`Cork`]'s poll: sends what is held and the flushes passed over.
    fn poll_uncork<IO: AsyncWrite + Unpin>(
        &mut self,
        io: &mut IO,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        self.corked = false;
        ready!(self.poll_release(io, cx))?;
        if self.flush_owed {
            ready!(Pin::new(io).poll_flush(cx))?;
            self.flush_owed = false;
        }
        Poll::Ready(Ok(()))
    }
}

/// The outer content type of every encrypted TLS 1.3 record.
const TLS_APPLICATION_DATA: u8 = 23;

/// Whether the TLS records of one write (whole records, as rustls writes them) include an
/// encrypted one. Before it the client writes only plaintext records: its ClientHello, a
/// ChangeCipherSpec with a second ClientHello after a HelloRetryRequest, alerts.
fn has_encrypted_record(bufs: &[IoSlice<'_>]) -> bool {
    let byte_at = |mut at: usize| {
        for b in bufs {
            if at < b.len() {
                return Some(b[at]);
            }
            at -= b.len();
        }
        None
    };
    let mut at = 0;
    while let Some(kind) = byte_at(at) {
        if kind == TLS_APPLICATION_DATA {
            return true;
        }
        let (Some(hi), Some(lo)) = (byte_at(at + 3), byte_at(at + 4)) else {
            return false;
        };
        at += 5 + usize::from(u16::from_be_bytes([hi, lo]));
    }
    false
}

/// The client's transport under TLS. It groups the client's writes into fewer system calls:
///
/// - Its last handshake flight (ChangeCipherSpec and the encrypted Certificate,
///   CertificateVerify and Finished) is held and goes out with the HTTP/2 connection preface
///   and first frames, in one write instead of three. Until then writes go through:
///   plaintext handshake records and alerts (a ClientHello, a second one after a
///   HelloRetryRequest). The first write of another record type (the last flight: TLS 1.3
///   encrypts everything the client sends after the server's hello) starts holding; the flush
///   that ends the handshake is passed over, and the next one, HTTP/2's first, sends all of
///   it. A handshake that fails calls [`FinalFlight::release`] and flushes, so that the alert
///   explaining the failure still reaches the server.
/// - After that, while the connection's driver polls the connection through the layer's
///   [`Cork`], small records wait for the end of that poll: h2 flushes after each step of a
///   poll, so the RST_STREAM, GOAWAY and close_notify of a closing connection, or a
///   WINDOW_UPDATE and the DATA after it, would otherwise be a write each.
///
/// The layer and its cork share the transport behind a mutex that only the driver's task
/// takes, so it is never contended.
#[derive(Debug)]
pub(crate) struct FinalFlight<IO> {
    shared: Arc<Mutex<Flight<IO>>>,
}

#[derive(Debug)]
struct Flight<IO> {
    io: IO,
    held: Held,
    /// Still looking for the final flight's first write.
    armed: bool,
    /// Where the send at the end of a cork's poll failed: the next write, flush or shutdown
    /// reports it, so that h2 sees the transport's error as its own.
    failed: Option<io::Error>,
}

impl<IO> Flight<IO> {
    fn failed(&mut self) -> io::Result<()> {
        self.failed.take().map_or(Ok(()), Err)
    }
}

impl<IO: AsyncWrite + Unpin> Flight<IO> {
    /// A flush of the layer above: first a failure the end of a cork's poll stored.
    fn poll_flush(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.failed()?;
        self.held.poll_flush(&mut self.io, cx)
    }

    /// A shutdown of the layer above: first a failure the end of a cork's poll stored.
    fn poll_shutdown(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.failed()?;
        self.held.poll_shutdown(&mut self.io, cx)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<IO> FinalFlight<IO> {
    pub(crate) fn new(io: IO) -> Self {
        let flight = Flight {
            io,
            held: Held::default(),
            armed: true,
            failed: None,
        };
        Self {
            shared: Arc::new(Mutex::new(flight)),
        }
    }

    /// Sends what is held at the next flush.
    pub(crate) fn release(&mut self) {
        let mut flight = lock(&self.shared);
        flight.armed = false;
        flight.held.skip = 0;
    }

    /// The handle through which the connection's driver polls the connection.
    pub(crate) fn cork(&self) -> Cork<IO> {
        Cork {
            shared: self.shared.clone(),
        }
    }
}

/// Polls a connection with its small writes held to the end of the poll (see
/// [`FinalFlight`] on the client and [`Frames`] on the server), then sends them in one write.
#[derive(Debug)]
pub(crate) struct Cork<IO> {
    shared: Arc<Mutex<Flight<IO>>>,
}

impl<IO: AsyncWrite + Unpin> Cork<IO> {
    /// Polls `connection` once, corked; `twice` when it is closing, and a poll that finds its
    /// last stream gone leaves the GOAWAY to the next (h2 wakes itself for it).
    pub(crate) fn poll<F: Future + Unpin>(
        &self,
        connection: &mut F,
        cx: &mut Context<'_>,
        twice: bool,
    ) -> Poll<F::Output> {
        self.poll_with(cx, |cx| {
            let mut connection = Pin::new(connection);
            let out = connection.as_mut().poll(cx);
            if twice && out.is_pending() {
                return connection.poll(cx);
            }
            out
        })
    }

    /// Runs `poll`, one poll of the connection, corked: the small writes it makes leave
    /// together when it returns.
    pub(crate) fn poll_with<T>(
        &self,
        cx: &mut Context<'_>,
        poll: impl FnOnce(&mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        lock(&self.shared).held.corked = true;
        let out = poll(cx);
        let mut flight = lock(&self.shared);
        let Flight {
            io, held, failed, ..
        } = &mut *flight;
        // Pending: the transport wakes this task when it takes more, and the next poll sends
        // the rest first.
        if let Poll::Ready(Err(e)) = held.poll_uncork(io, cx) {
            *failed = Some(e);
        }
        out
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for FinalFlight<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut lock(&self.shared).io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for FinalFlight<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let mut flight = lock(&self.shared);
        flight.failed()?;
        let this = &mut *flight;
        if this.armed {
            if !has_encrypted_record(bufs) {
                let total: usize = bufs.iter().map(|b| b.len()).sum();
                let n = ready!(Pin::new(&mut this.io).poll_write_vectored(cx, bufs))?;
                if n < total {
                    // The next write starts inside a record: stop looking.
                    this.armed = false;
                }
                return Poll::Ready(Ok(n));
            }
            this.armed = false;
            let corked = this.held.corked;
            this.held = Held::holding(1);
            this.held.corked = corked;
        }
        this.held.poll_write(&mut this.io, cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        lock(&self.shared).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        lock(&self.shared).poll_shutdown(cx)
    }
}

/// HTTP/2 frame headers read from a byte stream, however it is cut.
#[derive(Debug)]
struct FrameParser {
    /// Bytes of the connection preface still to skip (the client's, on the server's reads).
    skip: usize,
    header: [u8; 9],
    have: usize,
    /// Payload bytes of the current frame still to come.
    remaining: usize,
    kind: u8,
    stream: u32,
    /// Frames seen whole.
    frames: u64,
}

/// What the parser saw in one slice of bytes.
enum Seen {
    /// A frame header, complete.
    Header { kind: u8, stream: u32 },
    /// `n` payload bytes of a frame.
    Payload { kind: u8, stream: u32, n: usize },
}

const DATA: u8 = 0x0;
const RST_STREAM: u8 = 0x3;

impl FrameParser {
    fn new(skip: usize) -> Self {
        Self {
            skip,
            header: [0; 9],
            have: 0,
            remaining: 0,
            kind: 0,
            stream: 0,
            frames: 0,
        }
    }

    fn feed(&mut self, mut bytes: &[u8], mut on: impl FnMut(Seen)) {
        if self.skip > 0 {
            let n = self.skip.min(bytes.len());
            self.skip -= n;
            bytes = &bytes[n..];
        }
        while !bytes.is_empty() {
            if self.remaining > 0 {
                let n = self.remaining.min(bytes.len());
                self.remaining -= n;
                bytes = &bytes[n..];
                on(Seen::Payload {
                    kind: self.kind,
                    stream: self.stream,
                    n,
                });
                if self.remaining == 0 {
                    self.frames += 1;
                }
                continue;
            }
            let n = (9 - self.have).min(bytes.len());
            self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have < 9 {
                break;
            }
            self.have = 0;
            let h = self.header;
            self.remaining = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
            self.kind = h[3];
            self.stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
            on(Seen::Header {
                kind: self.kind,
                stream: self.stream,
            });
            if self.remaining == 0 {
                self.frames += 1;
            }
        }
    }
}

/// Watches the plaintext HTTP/2 frames of a server connection: it marks the client's preface
/// complete once its first frame (SETTINGS) has arrived whole, gives the connection's
/// [`SendBudget`] back as DATA payload is written, and tells it about every RST_STREAM read
/// or written (h2 drops what it held for that stream at the reset).
///
/// It also holds the server's SETTINGS, flushed alone by the HTTP/2 handshake, until the next
/// flush, which carries the SETTINGS ACK and WINDOW_UPDATE answering the client's preface:
/// one record and one write instead of two. A server never waits on the client while holding:
/// should a read find nothing before the client's first frame, what is held goes out then.
///
/// After that, while the server's driver polls the connection through the layer's [`Cork`],
/// small writes wait for the end of that poll and leave in one record and one write. h2 sends
/// a DATA frame of 256 bytes or more without copying it, and so flushes after each one: the
/// small responses of many tunnels that one poll writes (an HTTP/1.1 response each, for a
/// gateway's requests) used to be a record and a system call each. DATA larger than
/// [`CORK_SMALL`] is never copied into the hold.
///
/// The layer and its cork share the transport behind a mutex that only the driver's task
/// takes, so it is never contended.
#[derive(Debug)]
pub(crate) struct Frames<IO> {
    /// The transport and what is held for it, shared with the connection's [`Cork`].
    shared: Arc<Mutex<Flight<IO>>>,
    reads: FrameParser,
    writes: FrameParser,
    preface_done: Arc<AtomicBool>,
    budget: Arc<SendBudget>,
}

impl<IO> Frames<IO> {
    pub(crate) fn server(io: IO, preface_done: Arc<AtomicBool>, budget: Arc<SendBudget>) -> Self {
        let flight = Flight {
            io,
            held: Held::holding(1),
            // The server has no final flight to look for: its TLS is below this layer.
            armed: false,
            failed: None,
        };
        Self {
            shared: Arc::new(Mutex::new(flight)),
            reads: FrameParser::new(h2_preface_len()),
            writes: FrameParser::new(0),
            preface_done,
            budget,
        }
    }

    /// The handle through which the connection's driver polls the connection.
    pub(crate) fn cork(&self) -> Cork<IO> {
        Cork {
            shared: self.shared.clone(),
        }
    }

    fn saw_written(&mut self, bytes: &[u8]) {
        let budget = &self.budget;
        self.writes.feed(bytes, |seen| match seen {
            Seen::Payload {
                kind: DATA,
                stream,
                n,
            } => budget.written(stream, n),
            Seen::Header {
                kind: RST_STREAM,
                stream,
            } => budget.discard(stream),
            _ => {}
        });
    }
}

/// Length of the client connection preface, `PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`.
const fn h2_preface_len() -> usize {
    24
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for Frames<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        {
            let mut flight = lock(&this.shared);
            let Flight { io, held, .. } = &mut *flight;
            let read = Pin::new(&mut *io).poll_read(cx, buf);
            if read.is_pending() && held.holding && this.reads.frames == 0 {
                // The client may be waiting for the SETTINGS: send them now.
                ready!(held.poll_flush_now(io, cx))?;
            }
            ready!(read)?;
        }
        let budget = &this.budget;
        this.reads.feed(&buf.filled()[before..], |seen| {
            if let Seen::Header {
                kind: RST_STREAM,
                stream,
            } = seen
            {
                budget.discard(stream);
            }
        });
        if this.reads.frames > 0 && !this.preface_done.load(Ordering::Relaxed) {
            this.preface_done.store(true, Ordering::Relaxed);
        }
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Frames<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let mut n = {
            let mut flight = lock(&self.shared);
            flight.failed()?;
            let Flight { io, held, .. } = &mut *flight;
            ready!(held.poll_write(io, cx, bufs))?
        };
        let written = n;
        for b in bufs {
            if n == 0 {
                break;
            }
            let k = n.min(b.len());
            self.saw_written(&b[..k]);
            n -= k;
        }
        Poll::Ready(Ok(written))
    }

    fn is_write_vectored(&self) -> bool {
        // What is held goes out in front of the next write, in one vectored write.
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        lock(&self.shared).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        lock(&self.shared).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;
    use tokio::io::AsyncWriteExt;

    /// A transport that records each write call it takes; reads find nothing yet.
    #[derive(Default)]
    struct Recorder {
        writes: Vec<Vec<u8>>,
        flushes: usize,
        shutdowns: usize,
        /// Every write fails, as on a connection the peer has reset.
        broken: bool,
    }

    impl AsyncRead for Recorder {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Poll::Pending
        }
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.poll_write_vectored(cx, &[IoSlice::new(buf)])
        }

        /// Takes all of `bufs` as one write, as a socket with room does.
        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            if self.broken {
                return Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()));
            }
            let write: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
            let n = write.len();
            self.writes.push(write);
            Poll::Ready(Ok(n))
        }

        fn is_write_vectored(&self) -> bool {
            true
        }

        fn poll_flush(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.flushes += 1;
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.shutdowns += 1;
            Poll::Ready(Ok(()))
        }
    }

    /// What the transport under `io` has been given, one entry per write call.
    fn writes(io: &FinalFlight<Recorder>) -> Vec<Vec<u8>> {
        lock(&io.shared).io.writes.clone()
    }

    fn record(kind: u8, len: usize) -> Vec<u8> {
        let mut r = vec![kind, 3, 3, (len >> 8) as u8, len as u8];
        r.resize(5 + len, kind);
        r
    }

    #[tokio::test]
    async fn final_flight_leaves_with_the_preface() {
        let mut io = FinalFlight::new(Recorder::default());
        let hello = record(22, 200);
        io.write_all(&hello).await.unwrap();
        io.flush().await.unwrap();
        // A HelloRetryRequest brings a ChangeCipherSpec and a second ClientHello, in one
        // write: they too go at once.
        let retry = [record(20, 1), hello.clone()].concat();
        io.write_all(&retry).await.unwrap();
        io.flush().await.unwrap();
        assert_eq!(writes(&io), [hello.clone(), retry]);
        // The last flight (ChangeCipherSpec first) is held through the handshake's flush.
        let mut flight = record(20, 1);
        flight.extend(record(23, 600));
        io.write_all(&flight).await.unwrap();
        io.flush().await.unwrap();
        assert_eq!(writes(&io).len(), 2);
        // The preface, written without a flush, joins it; HTTP/2's first flush sends both.
        let preface = record(23, 24);
        let settings = record(23, 74);
        io.write_all(&preface).await.unwrap();
        io.write_all(&settings).await.unwrap();
        assert_eq!(writes(&io).len(), 2);
        io.flush().await.unwrap();
        let together = [flight.clone(), preface, settings].concat();
        assert_eq!(writes(&io)[2..], [together]);
        // From then on writes go straight through.
        let data = record(23, 1000);
        io.write_all(&data).await.unwrap();
        assert_eq!(writes(&io)[3..], [data]);
    }

    #[tokio::test]
    async fn final_flight_released_on_failure_limit_and_shutdown() {
        // A failed handshake: the held alert goes out at the next flush.
        let mut io = FinalFlight::new(Recorder::default());
        let alert = record(23, 19);
        io.write_all(&alert).await.unwrap();
        io.release();
        io.flush().await.unwrap();
        assert_eq!(writes(&io), std::slice::from_ref(&alert));

        // More than the limit: what is held goes first, in the same write as the rest.
        let mut io = FinalFlight::new(Recorder::default());
        let big = record(23, HOLD_LIMIT);
        io.write_all(&alert).await.unwrap();
        io.write_all(&big).await.unwrap();
        assert_eq!(writes(&io), [[alert.clone(), big].concat()]);

        // A shutdown sends what is held before it.
        let mut io = FinalFlight::new(Recorder::default());
        io.write_all(&alert).await.unwrap();
        io.shutdown().await.unwrap();
        assert_eq!(writes(&io), [alert]);
    }

    /// A client transport past its handshake, as the driver finds it.
    fn connected() -> FinalFlight<Recorder> {
        let mut io = FinalFlight::new(Recorder::default());
        io.release();
        io
    }

    /// Polls `io`'s cork once around `steps`, which writes as one poll of h2 would.
    fn corked_poll(
        io: &mut FinalFlight<Recorder>,
        mut steps: impl FnMut(&mut FinalFlight<Recorder>, &mut Context<'_>),
    ) {
        let cork = io.cork();
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut connection = poll_fn(|cx| {
            steps(&mut *io, cx);
            Poll::<()>::Pending
        });
        assert!(cork.poll(&mut connection, &mut cx, false).is_pending());
    }

    fn write_and_flush(io: &mut (impl AsyncWrite + Unpin), cx: &mut Context<'_>, bytes: &[u8]) {
        let mut io = Pin::new(io);
        assert!(
            matches!(io.as_mut().poll_write(cx, bytes), Poll::Ready(Ok(n)) if n == bytes.len())
        );
        assert!(matches!(io.poll_flush(cx), Poll::Ready(Ok(()))));
    }

    #[test]
    fn one_poll_of_the_connection_is_one_write() {
        // h2 closing a connection: the stream's reset, GOAWAY, then close_notify and the
        // shutdown, each flushed, all in one poll.
        let (reset, goaway, close_notify) = (record(23, 30), record(23, 34), record(23, 19));
        let mut io = connected();
        corked_poll(&mut io, |io, cx| {
            write_and_flush(io, cx, &reset);
            write_and_flush(io, cx, &goaway);
            assert_eq!(lock(&io.shared).io.writes.len(), 0, "held while corked");
            assert!(matches!(
                Pin::new(&mut *io).poll_write(cx, &close_notify),
                Poll::Ready(Ok(_))
            ));
            assert!(matches!(
                Pin::new(&mut *io).poll_shutdown(cx),
                Poll::Ready(Ok(()))
            ));
        });
        let flight = lock(&io.shared);
        assert_eq!(flight.io.writes, [[reset, goaway, close_notify].concat()]);
        assert_eq!(flight.io.shutdowns, 1);
    }

    #[test]
    fn a_cork_sends_at_the_end_of_its_poll_and_holds_no_data() {
        let (update, ack) = (record(23, 17), record(23, 9));
        let data = record(23, 4000);
        let mut io = connected();
        corked_poll(&mut io, |io, cx| {
            // Small records wait; a large one leaves at once, behind them, in one write.
            write_and_flush(io, cx, &update);
            write_and_flush(io, cx, &data);
            assert_eq!(
                lock(&io.shared).io.writes,
                [[update.clone(), data.clone()].concat()]
            );
            write_and_flush(io, cx, &ack);
        });
        // What is still held when the poll ends goes out then, with the flush it owed.
        let flight = lock(&io.shared);
        assert_eq!(flight.io.writes[1..], *std::slice::from_ref(&ack));
        assert_eq!(flight.io.flushes, 1);
        drop(flight);
        // Outside a cork's poll writes and flushes go straight through.
        let waker = std::task::Waker::noop();
        write_and_flush(&mut io, &mut Context::from_waker(waker), &ack);
        let flight = lock(&io.shared);
        assert_eq!((flight.io.writes.len(), flight.io.flushes), (3, 2));
    }

    #[test]
    fn a_failed_send_at_the_end_of_a_poll_is_reported_next() {
        let mut io = connected();
        corked_poll(&mut io, |io, cx| {
            lock(&io.shared).io.broken = true;
            write_and_flush(io, cx, &record(23, 20));
        });
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        let flushed = Pin::new(&mut io).poll_flush(&mut cx);
        assert!(
            matches!(&flushed, Poll::Ready(Err(e)) if e.kind() == io::ErrorKind::ConnectionReset),
            "{flushed:?}"
        );
    }

    fn frames(io: Recorder) -> Frames<Recorder> {
        Frames::server(
            io,
            Arc::new(AtomicBool::new(false)),
            Arc::new(SendBudget::new(1 << 20)),
        )
    }

    #[tokio::test]
    async fn server_settings_leave_with_the_ack() {
        let mut io = frames(Recorder::default());
        let settings = frame(0x4, 0, 24);
        io.write_all(&settings).await.unwrap();
        io.flush().await.unwrap();
        assert!(lock(&io.shared).io.writes.is_empty());
        let ack = [frame(0x8, 0, 4), frame(0x4, 0, 0)].concat();
        io.write_all(&ack).await.unwrap();
        io.flush().await.unwrap();
        let flight = lock(&io.shared);
        assert_eq!(flight.io.writes, [[settings, ack].concat()]);
        assert_eq!(flight.io.flushes, 1);
    }

    #[tokio::test]
    async fn server_never_waits_on_the_client_while_holding() {
        let mut io = frames(Recorder::default());
        let settings = frame(0x4, 0, 24);
        io.write_all(&settings).await.unwrap();
        io.flush().await.unwrap();
        // Nothing from the client yet: the read that waits sends the SETTINGS first.
        let mut buf = [0u8; 64];
        let polled = poll_fn(|cx| {
            let mut rb = ReadBuf::new(&mut buf);
            Poll::Ready(Pin::new(&mut io).poll_read(cx, &mut rb))
        })
        .await;
        assert!(polled.is_pending());
        assert_eq!(lock(&io.shared).io.writes, [settings]);
    }

    #[tokio::test]
    async fn one_poll_of_a_server_connection_is_one_write() {
        let budget = Arc::new(SendBudget::new(1 << 20));
        let mut io = Frames::server(
            Recorder::default(),
            Arc::new(AtomicBool::new(false)),
            budget.clone(),
        );
        // The start of the connection: SETTINGS, then the ACK, in one write.
        io.write_all(&frame(0x4, 0, 24)).await.unwrap();
        io.flush().await.unwrap();
        io.write_all(&frame(0x4, 0, 0)).await.unwrap();
        io.flush().await.unwrap();
        assert_eq!(lock(&io.shared).io.writes.len(), 1);

        // One poll answers three tunnels with 300 bytes each (h2 flushes after each such
        // DATA frame), then sends 4000 bytes on a fourth, then a fifth's 200 HEADERS.
        let answers: Vec<Vec<u8>> = [1, 3, 5].map(|s| frame(DATA, s, 300)).into();
        let (bulk, headers) = (frame(DATA, 7, 4000), frame(0x1, 9, 1));
        let cork = io.cork();
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        for (stream, n) in [(1, 300), (3, 300), (5, 300), (7, 4000)] {
            assert!(matches!(budget.poll_claim(&mut cx, stream, n), Poll::Ready(k) if k == n));
        }
        let polled = cork.poll_with(&mut cx, |cx| {
            for answer in &answers {
                write_and_flush(&mut io, cx, answer);
            }
            assert_eq!(lock(&io.shared).io.writes.len(), 1, "held while corked");
            // A large write leaves at once, behind what is held.
            write_and_flush(&mut io, cx, &bulk);
            assert_eq!(
                lock(&io.shared).io.writes[1..],
                [[answers.concat(), bulk.clone()].concat()]
            );
            write_and_flush(&mut io, cx, &headers);
            Poll::<()>::Pending
        });
        assert!(polled.is_pending());
        // What is still held when the poll ends goes out then, with the flush it owed.
        let flight = lock(&io.shared);
        assert_eq!(flight.io.writes[2..], [headers]);
        assert_eq!(flight.io.flushes, 2);
        drop(flight);
        // Every DATA byte held or written counts as sent: the tunnels have their budget back.
        assert_eq!(budget.in_flight(), 0);
    }

    fn frame(kind: u8, stream: u32, len: usize) -> Vec<u8> {
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, 0];
        f.extend_from_slice(&stream.to_be_bytes());
        f.resize(9 + len, 0xab);
        f
    }

    #[test]
    fn parser_follows_frames_cut_anywhere() {
        let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        bytes.extend(frame(0x4, 0, 12));
        bytes.extend(frame(DATA, 1, 1000));
        bytes.extend(frame(RST_STREAM, 3, 4));
        bytes.extend(frame(DATA, 5, 0));
        bytes.extend(frame(DATA, 7, 70_000));
        for cut in [1, 2, 7, 9, 10, 100, 4096, bytes.len()] {
            let mut parser = FrameParser::new(24);
            let (mut data, mut resets) = (Vec::new(), Vec::new());
            for piece in bytes.chunks(cut) {
                parser.feed(piece, |seen| match seen {
                    Seen::Payload {
                        kind: DATA,
                        stream,
                        n,
                    } => data.push((stream, n)),
                    Seen::Header {
                        kind: RST_STREAM,
                        stream,
                    } => resets.push(stream),
                    _ => {}
                });
            }
            assert_eq!(parser.frames, 5, "cut every {cut} bytes");
            let on = |s: u32| data.iter().filter(|d| d.0 == s).map(|d| d.1).sum::<usize>();
            assert_eq!((on(1), on(5), on(7)), (1000, 0, 70_000));
            assert_eq!(resets, [3]);
        }
    }
}
