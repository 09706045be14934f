//! The I/O layers around TLS: on the server, a read buffer under TLS that costs nothing until
//! the handshake is done and a frame watcher above it that sees the HTTP/2 frames go by; on
//! the client, a layer under TLS that sends its last handshake flight together with the
//! HTTP/2 preface. Both ends hold their first writes back to send them in one system call.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::budget::SendBudget;

/// A read buffer of [`TLS_READ_BUFFER`](crate::TLS_READ_BUFFER) bytes under TLS, allocated at
/// the first read after [`LazyReadBuffer::enable`]: until the handshake is done, reads go to
/// the socket directly, so a socket that never completes TLS costs no buffer.
#[derive(Debug)]
pub(crate) struct LazyReadBuffer<IO> {
    io: IO,
    enabled: bool,
    buf: Box<[u8]>,
    pos: usize,
    filled: usize,
}

impl<IO> LazyReadBuffer<IO> {
    pub(crate) fn new(io: IO) -> Self {
        Self {
            io,
            enabled: false,
            buf: Box::default(),
            pos: 0,
            filled: 0,
        }
    }

    /// Buffers reads from now on.
    pub(crate) fn enable(&mut self) {
        self.enabled = true;
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for LazyReadBuffer<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.pos == this.filled {
            if !this.enabled || out.remaining() >= crate::TLS_READ_BUFFER {
                return Pin::new(&mut this.io).poll_read(cx, out);
            }
            if this.buf.is_empty() {
                this.buf = vec![0u8; crate::TLS_READ_BUFFER].into_boxed_slice();
            }
            let mut rb = ReadBuf::new(&mut this.buf);
            ready!(Pin::new(&mut this.io).poll_read(cx, &mut rb))?;
            this.pos = 0;
            this.filled = rb.filled().len();
        }
        let n = (this.filled - this.pos).min(out.remaining());
        out.put_slice(&this.buf[this.pos..this.pos + n]);
        this.pos += n;
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for LazyReadBuffer<IO> {
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

/// The most bytes a connection holds back for [`Held`]; past it, they go out at once.
const HOLD_LIMIT: usize = 16 * 1024;

/// Writes held back so that they leave with the next ones, in one system call and (above
/// TLS) one record: at the start of a connection, where each flight of a few frames would
/// otherwise be a write of its own. Holding passes over `skip` flushes; the next flush, a
/// shutdown, or more than [`HOLD_LIMIT`] bytes send what is held, and from then on every
/// write goes straight through.
#[derive(Debug, Default)]
struct Held {
    buf: Vec<u8>,
    /// Bytes of `buf` already written.
    sent: usize,
    /// Flushes still to pass over.
    skip: u8,
    holding: bool,
}

impl Held {
    fn holding(skip: u8) -> Self {
        Self {
            holding: true,
            skip,
            ..Self::default()
        }
    }

    /// Takes `bufs` into the held bytes if this is still holding and they fit; `None` when
    /// they are to be written through.
    fn take(&mut self, bufs: &[IoSlice<'_>]) -> Option<usize> {
        if !self.holding {
            return None;
        }
        let n: usize = bufs.iter().map(|b| b.len()).sum();
        if self.buf.len() + n > HOLD_LIMIT {
            return None;
        }
        for b in bufs {
            self.buf.extend_from_slice(b);
        }
        Some(n)
    }

    /// Whether a flush is to be passed over (and counts it); never once a release has begun,
    /// which a flush then finishes.
    fn pass_over(&mut self) -> bool {
        if self.holding && self.sent == 0 && self.skip > 0 {
            self.skip -= 1;
            return true;
        }
        false
    }

    /// Writes what is held to `io` and stops holding.
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
        if self.holding {
            self.holding = false;
            self.buf = Vec::new();
            self.sent = 0;
        }
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
        // Not holding, or too much to hold: what is held goes first.
        ready!(self.poll_release(io, cx))?;
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

/// The client's transport under TLS: its last handshake flight (ChangeCipherSpec and the
/// encrypted Certificate, CertificateVerify and Finished) is held and goes out with the
/// HTTP/2 connection preface and first frames, in one write instead of three.
///
/// Until then writes go through: plaintext handshake records and alerts (a ClientHello, a
/// second one after a HelloRetryRequest). The first write of another record type (the last
/// flight: TLS 1.3 encrypts everything the client sends after the server's hello) starts
/// holding; the flush that ends the handshake is passed over, and the next one, HTTP/2's
/// first, sends all of it. A handshake that fails calls [`FinalFlight::release`] and flushes,
/// so that the alert explaining the failure still reaches the server.
#[derive(Debug)]
pub(crate) struct FinalFlight<IO> {
    io: IO,
    held: Held,
    /// Still looking for the final flight's first write.
    armed: bool,
}

impl<IO> FinalFlight<IO> {
    pub(crate) fn new(io: IO) -> Self {
        Self {
            io,
            held: Held::default(),
            armed: true,
        }
    }

    /// Sends what is held at the next flush.
    pub(crate) fn release(&mut self) {
        self.armed = false;
        self.held.skip = 0;
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for FinalFlight<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
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
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
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
            this.held = Held::holding(1);
        }
        this.held.poll_write(&mut this.io, cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.held.poll_flush(&mut this.io, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.held.poll_shutdown(&mut this.io, cx)
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
#[derive(Debug)]
pub(crate) struct Frames<IO> {
    io: IO,
    reads: FrameParser,
    writes: FrameParser,
    held: Held,
    preface_done: Arc<AtomicBool>,
    budget: Arc<SendBudget>,
}

impl<IO> Frames<IO> {
    pub(crate) fn server(io: IO, preface_done: Arc<AtomicBool>, budget: Arc<SendBudget>) -> Self {
        Self {
            io,
            reads: FrameParser::new(h2_preface_len()),
            writes: FrameParser::new(0),
            held: Held::holding(1),
            preface_done,
            budget,
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
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        if read.is_pending() && this.held.holding && this.reads.frames == 0 {
            // The client may be waiting for the SETTINGS: send them now.
            ready!(this.held.poll_flush_now(&mut this.io, cx))?;
        }
        ready!(read)?;
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
        let this = &mut *self;
        let mut n = ready!(this.held.poll_write(&mut this.io, cx, bufs))?;
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
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.held.poll_flush(&mut this.io, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.held.poll_shutdown(&mut this.io, cx)
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
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.writes.push(buf.to_vec());
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.flushes += 1;
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
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
        assert_eq!(io.io.writes, [hello.clone(), retry]);
        // The last flight (ChangeCipherSpec first) is held through the handshake's flush.
        let mut flight = record(20, 1);
        flight.extend(record(23, 600));
        io.write_all(&flight).await.unwrap();
        io.flush().await.unwrap();
        assert_eq!(io.io.writes.len(), 2);
        // The preface, written without a flush, joins it; HTTP/2's first flush sends both.
        let preface = record(23, 24);
        let settings = record(23, 74);
        io.write_all(&preface).await.unwrap();
        io.write_all(&settings).await.unwrap();
        assert_eq!(io.io.writes.len(), 2);
        io.flush().await.unwrap();
        let together = [flight.clone(), preface, settings].concat();
        assert_eq!(io.io.writes[2..], [together]);
        // From then on writes go straight through.
        let data = record(23, 1000);
        io.write_all(&data).await.unwrap();
        assert_eq!(io.io.writes[3..], [data]);
    }

    #[tokio::test]
    async fn final_flight_released_on_failure_limit_and_shutdown() {
        // A failed handshake: the held alert goes out at the next flush.
        let mut io = FinalFlight::new(Recorder::default());
        let alert = record(23, 19);
        io.write_all(&alert).await.unwrap();
        io.release();
        io.flush().await.unwrap();
        assert_eq!(io.io.writes, std::slice::from_ref(&alert));

        // More than the limit: what is held goes first, then the rest, in order.
        let mut io = FinalFlight::new(Recorder::default());
        let big = record(23, HOLD_LIMIT);
        io.write_all(&alert).await.unwrap();
        io.write_all(&big).await.unwrap();
        assert_eq!(io.io.writes, [alert.clone(), big]);

        // A shutdown sends what is held before it.
        let mut io = FinalFlight::new(Recorder::default());
        io.write_all(&alert).await.unwrap();
        io.shutdown().await.unwrap();
        assert_eq!(io.io.writes, [alert]);
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
        assert!(io.io.writes.is_empty());
        let ack = [frame(0x8, 0, 4), frame(0x4, 0, 0)].concat();
        io.write_all(&ack).await.unwrap();
        io.flush().await.unwrap();
        assert_eq!(io.io.writes, [[settings, ack].concat()]);
        assert_eq!(io.io.flushes, 1);
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
        assert_eq!(io.io.writes, [settings]);
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
