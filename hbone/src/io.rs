//! The server's I/O layers around TLS: a read buffer under TLS that costs nothing until the
//! handshake is done, and a frame watcher above it that sees the HTTP/2 frames go by.

use std::io;
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
#[derive(Debug)]
pub(crate) struct Frames<IO> {
    io: IO,
    reads: FrameParser,
    writes: FrameParser,
    preface_done: Arc<AtomicBool>,
    budget: Arc<SendBudget>,
}

impl<IO> Frames<IO> {
    pub(crate) fn server(io: IO, preface_done: Arc<AtomicBool>, budget: Arc<SendBudget>) -> Self {
        Self {
            io,
            reads: FrameParser::new(h2_preface_len()),
            writes: FrameParser::new(0),
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

impl<IO: AsyncRead + Unpin> AsyncRead for Frames<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
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
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let n = ready!(Pin::new(&mut self.io).poll_write(cx, buf))?;
        self.saw_written(&buf[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let mut n = ready!(Pin::new(&mut self.io).poll_write_vectored(cx, bufs))?;
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
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
