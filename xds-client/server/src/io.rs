//! Any byte stream as a connection tonic can serve.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::admission::{Admission, AdmissionDeadline};

/// A connection of [`AdsServer::serve_with_incoming`](crate::AdsServer::serve_with_incoming).
/// tonic wants its `Connected` trait on every connection, which TLS streams of other crates
/// do not implement; the connection info is the connection's [`Admission`], which the
/// service marks when it admits a stream, under the deadline of
/// [`ServerConfig::first_stream_timeout`](crate::ServerConfig::first_stream_timeout). It
/// holds its place among [`ServerConfig::max_connections`](crate::ServerConfig::max_connections)
/// until it is dropped.
pub(crate) struct Io<T> {
    pub(crate) io: AdmissionDeadline<T>,
    pub(crate) _permit: Option<crate::limits::Permit>,
}

impl<T> tonic::transport::server::Connected for Io<T> {
    type ConnectInfo = Admission;

    fn connect_info(&self) -> Admission {
        self.io.admission().clone()
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Io<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Io<T> {
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
