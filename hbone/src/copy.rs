//! Copying bytes between a tunnel and a TCP socket, in both directions, with half-close and
//! with resets carried across (RFC 9113 section 8.5).
//!
//! - EOF (FIN) on the socket sends END_STREAM; END_STREAM from the peer shuts the socket's
//!   write side (FIN). Each direction closes on its own.
//! - A read or write error on the socket, a TCP reset among them, resets the tunnel with
//!   RST_STREAM(CONNECT_ERROR).
//! - A reset of the tunnel by the peer before END_STREAM, whatever its code, or a failure of
//!   its HTTP/2 connection, resets the socket (SO_LINGER 0, so the kernel sends RST): the
//!   application sees a reset, never a FIN, so a cut transfer never looks complete.

use std::error::Error as StdError;
use std::fmt;
use std::io;

use bytes::BytesMut;
use h2::Reason;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::tunnel::{RecvHalf, SendHalf, Tunnel};

/// Smallest read buffer: what an idle or interactive tunnel holds.
const MIN_BUF: usize = 16 * 1024;
/// Largest read buffer, reached by bulk transfers.
const MAX_BUF: usize = 1024 * 1024;

/// Bytes moved by [`copy_bidirectional`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Copied {
    /// From the socket into the tunnel.
    pub to_tunnel: u64,
    /// From the tunnel into the socket.
    pub from_tunnel: u64,
}

/// Which end of a copy failed first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The local socket: reset by the application, or a read or write error. The tunnel was
    /// reset with RST_STREAM(CONNECT_ERROR).
    Socket,
    /// The tunnel: reset by the peer before its END_STREAM, or its HTTP/2 connection failed.
    /// The socket was reset (RST).
    Tunnel,
}

/// Why [`copy_bidirectional`] ended before both directions finished, with what had been
/// moved by then. [`source`](StdError::source) holds the I/O error.
#[derive(Debug)]
pub struct CopyError {
    side: Side,
    copied: Copied,
    error: io::Error,
}

impl CopyError {
    /// Which end failed first.
    pub fn side(&self) -> Side {
        self.side
    }

    /// Bytes delivered in each direction before the failure.
    pub fn copied(&self) -> Copied {
        self.copied
    }

    /// The I/O error of the failing end.
    pub fn io_error(&self) -> &io::Error {
        &self.error
    }

    /// The I/O error of the failing end, owned.
    pub fn into_io_error(self) -> io::Error {
        self.error
    }
}

impl fmt::Display for CopyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.side {
            Side::Socket => f.write_str("the local socket failed; the tunnel was reset"),
            Side::Tunnel => f.write_str("the tunnel failed; the local socket was reset"),
        }
    }
}

impl StdError for CopyError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.error)
    }
}

impl From<CopyError> for io::Error {
    fn from(e: CopyError) -> Self {
        e.error
    }
}

/// How one direction failed.
enum Failure {
    Socket(io::Error),
    Tunnel(io::Error),
}

/// Copies between `tunnel` and `socket` until both directions have ended, carrying half-close
/// and resets across (RFC 9113 section 8.5):
///
/// - FIN from the socket sends END_STREAM; END_STREAM from the peer shuts the socket's write
///   side. Each direction closes on its own.
/// - A read or write error on the socket, a TCP reset among them, resets the tunnel with
///   RST_STREAM(CONNECT_ERROR).
/// - A reset of the tunnel by the peer before END_STREAM, whatever its code, or a failure of
///   its HTTP/2 connection, resets the socket (SO_LINGER 0, so the kernel sends RST): the
///   application sees a reset, never a FIN, so a cut transfer never looks complete.
///
/// Socket reads start with a 16 KiB buffer and double, up to 1 MiB, each time a read fills it:
/// an idle tunnel holds little memory, a bulk one moves large chunks. Chunks go into HTTP/2
/// without a copy.
///
/// # Cancel safety
///
/// Not cancel safe: dropping the future resets the tunnel (CANCEL) and the socket (RST).
///
/// # Errors
///
/// The first failure of either end, after the other end was reset; the other direction is
/// abandoned.
pub async fn copy_bidirectional(tunnel: Tunnel, socket: TcpStream) -> Result<Copied, CopyError> {
    let (mut recv, mut send) = tunnel.into_split();
    // Reset unless both directions end cleanly: also when this future is dropped mid-copy
    // (a policy revoked, the proxy shutting down), so the application never reads a FIN.
    let mut socket = ResetOnDrop(Some(socket));
    let mut copied = Copied::default();
    let result = {
        let (mut reader, mut writer) = socket.stream().split();
        tokio::try_join!(
            pump_to_tunnel(&mut reader, &mut send, &mut copied.to_tunnel),
            pump_from_tunnel(&mut recv, &mut writer, &mut copied.from_tunnel),
        )
    };
    let (side, error) = match result {
        Ok(_) => {
            socket.close();
            return Ok(copied);
        }
        Err(Failure::Socket(error)) => (Side::Socket, error),
        Err(Failure::Tunnel(error)) => (Side::Tunnel, error),
    };
    send.reset(Reason::CONNECT_ERROR);
    drop(socket);
    Err(CopyError {
        side,
        copied,
        error,
    })
}

/// A socket that is reset (RST) when dropped, unless [`ResetOnDrop::close`] closed it.
struct ResetOnDrop(Option<TcpStream>);

impl ResetOnDrop {
    fn stream(&mut self) -> &mut TcpStream {
        self.0.as_mut().expect("the socket is only taken by close")
    }

    /// Closes the socket normally: both directions have ended with FINs.
    fn close(&mut self) {
        self.0.take();
    }
}

impl Drop for ResetOnDrop {
    fn drop(&mut self) {
        if let Some(socket) = &self.0 {
            abort(socket);
        }
    }
}

/// Makes the socket's close a reset: with SO_LINGER 0 the kernel discards unsent data and
/// sends RST when the socket is dropped.
fn abort(socket: &TcpStream) {
    if let Err(e) = socket.set_zero_linger() {
        tracing::debug!(error = %e, "setting SO_LINGER 0 failed; the socket closes with FIN");
    }
}

/// Reads the socket into the tunnel; END_STREAM at the socket's EOF. A read error resets the
/// tunnel with RST_STREAM(CONNECT_ERROR). Returns the bytes sent.
///
/// # Errors
///
/// The socket's read error, or the tunnel's error when the peer reset it or the connection
/// failed.
pub async fn socket_to_tunnel<R: AsyncRead + Unpin>(
    mut reader: R,
    mut send: SendHalf,
) -> io::Result<u64> {
    let mut total = 0;
    match pump_to_tunnel(&mut reader, &mut send, &mut total).await {
        Ok(()) => Ok(total),
        Err(Failure::Socket(e)) => {
            send.reset(Reason::CONNECT_ERROR);
            Err(e)
        }
        Err(Failure::Tunnel(e)) => Err(e),
    }
}

/// Writes the tunnel's data to `writer`; shuts down its write side at the tunnel's
/// END_STREAM. Returns the bytes written.
///
/// On a tunnel error (a reset before END_STREAM, a failed connection) the writer is not shut
/// down: reset the socket behind it instead (for a `TcpStream`, `set_zero_linger` and drop),
/// so that the application does not take the cut for a complete transfer.
///
/// # Errors
///
/// The tunnel's error, or the writer's.
pub async fn tunnel_to_socket<W: AsyncWrite + Unpin>(
    mut recv: RecvHalf,
    mut writer: W,
) -> io::Result<u64> {
    let mut total = 0;
    match pump_from_tunnel(&mut recv, &mut writer, &mut total).await {
        Ok(()) => Ok(total),
        Err(Failure::Socket(e) | Failure::Tunnel(e)) => Err(e),
    }
}

async fn pump_to_tunnel<R: AsyncRead + Unpin>(
    reader: &mut R,
    send: &mut SendHalf,
    total: &mut u64,
) -> Result<(), Failure> {
    let mut size = MIN_BUF;
    let mut buf = BytesMut::new();
    loop {
        buf.reserve(size);
        let n = reader.read_buf(&mut buf).await.map_err(Failure::Socket)?;
        if n == 0 {
            return send.finish().map_err(Failure::Tunnel);
        }
        if n >= size && size < MAX_BUF {
            size *= 2;
        }
        send.send(buf.split().freeze())
            .await
            .map_err(Failure::Tunnel)?;
        *total += n as u64;
    }
}

async fn pump_from_tunnel<W: AsyncWrite + Unpin>(
    recv: &mut RecvHalf,
    writer: &mut W,
    total: &mut u64,
) -> Result<(), Failure> {
    while let Some(chunk) = recv.chunk().await.map_err(Failure::Tunnel)? {
        writer.write_all(&chunk).await.map_err(Failure::Socket)?;
        *total += chunk.len() as u64;
    }
    writer.shutdown().await.map_err(Failure::Socket)
}
