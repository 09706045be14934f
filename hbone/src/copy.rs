//! Copying bytes between a tunnel and a socket, in both directions, with half-close.

use std::io;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

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

/// Copies between `tunnel` and a socket given as its read and write halves until both
/// directions have ended.
///
/// EOF on the socket sends END_STREAM on the tunnel, and EOF on the tunnel shuts down the
/// socket's write side, so each direction closes on its own (half-close). Socket reads start
/// with a 16 KiB buffer and double, up to 1 MiB, each time a read fills it: an idle tunnel
/// holds little memory, a bulk one moves large chunks. Chunks go into HTTP/2 without a copy.
///
/// # Cancel safety
///
/// Not cancel safe: dropping the future resets the tunnel and drops the socket halves.
///
/// # Errors
///
/// The first error of either direction; the other direction is abandoned.
pub async fn copy_bidirectional<R, W>(tunnel: Tunnel, reader: R, writer: W) -> io::Result<Copied>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (recv, send) = tunnel.into_split();
    let (to_tunnel, from_tunnel) = tokio::try_join!(
        socket_to_tunnel(reader, send),
        tunnel_to_socket(recv, writer)
    )?;
    Ok(Copied {
        to_tunnel,
        from_tunnel,
    })
}

/// Reads the socket into the tunnel; END_STREAM at the socket's EOF.
pub async fn socket_to_tunnel<R: AsyncRead + Unpin>(
    mut reader: R,
    mut send: SendHalf,
) -> io::Result<u64> {
    let mut total = 0u64;
    let mut size = MIN_BUF;
    let mut buf = BytesMut::new();
    loop {
        buf.reserve(size);
        let n = reader.read_buf(&mut buf).await?;
        if n == 0 {
            send.finish()?;
            return Ok(total);
        }
        total += n as u64;
        if n >= size && size < MAX_BUF {
            size *= 2;
        }
        send.send(buf.split().freeze()).await?;
    }
}

/// Writes the tunnel's data to the socket; shuts down the socket's write side at EOF.
pub async fn tunnel_to_socket<W: AsyncWrite + Unpin>(
    mut recv: RecvHalf,
    mut writer: W,
) -> io::Result<u64> {
    let mut total = 0u64;
    while let Some(chunk) = recv.chunk().await? {
        total += chunk.len() as u64;
        writer.write_all(&chunk).await?;
    }
    writer.shutdown().await?;
    Ok(total)
}
