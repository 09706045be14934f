//! HTTP/2 and connection settings shared by the client and the server, with their defaults.

use std::time::Duration;

/// The most an HBONE connection reads from its socket in one call once TLS is established.
/// Records are decrypted in place where that read put them. The connection's read buffer
/// starts at two records and doubles each time a read fills what it asked for, up to two
/// such reads and a record, so a burst of records is one `read` system call and a bulk
/// connection moves the partial record a read leaves at the end at most every other read.
/// 256 KiB reads measured slower (the buffer no longer fits the cache), 32 KiB slightly
/// slower (docs/performance.md).
pub const TLS_READ_BUFFER: usize = 64 * 1024;

/// How many bytes of sealed TLS records an HBONE connection queues for its socket before a
/// write waits (rustls's buffered API holds 64 KiB by default). A bulk HTTP/2 write is sealed
/// in 256 KiB steps, and each step goes to the socket in one `writev` of 16 records instead of
/// four: measured with the process pair on loopback, about 7% more throughput
/// (docs/performance.md).
pub const TLS_WRITE_BUFFER: usize = 256 * 1024;

/// HTTP/2 settings of an HBONE connection.
///
/// Defaults are sized for bulk tunnels on fast links: a 4 MiB stream window, a 64 MiB
/// connection window, and 1 MiB frames.
///
/// A tunnel whose reader has stopped holds at most one stream window of the connection window
/// (h2 gives connection credit back only as the reader consumes data). With the connection
/// window sixteen stream windows wide, up to fifteen stalled readers on one connection leave a
/// full stream window to every other tunnel, which then moves at full rate; this is also the
/// most a peer can make one connection buffer on the receiving side (64 MiB).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct H2Settings {
    /// Initial flow-control window of each stream, in bytes. Default: 4 MiB.
    pub stream_window: u32,
    /// Flow-control window of the connection, in bytes: the most data received on one
    /// connection and not yet read, all tunnels together. Default: 64 MiB (16 stream windows).
    pub connection_window: u32,
    /// Largest frame payload accepted, in bytes. Default: 1 MiB.
    pub max_frame_size: u32,
    /// Largest header list accepted, in bytes. Default: 64 KiB.
    pub max_header_list_size: u32,
    /// Largest amount of data buffered per stream waiting for send capacity. Default: 1 MiB.
    pub max_send_buffer: usize,
    /// Largest amount of data one server connection's tunnels may have handed to HTTP/2 and
    /// not yet written to TLS, all streams together. A tunnel that would pass it waits until
    /// the socket takes data. Default: 16 MiB. (Without it, 2,000 streams of a peer that stops
    /// reading its socket could queue 1 MiB each.)
    pub max_connection_send_buffer: usize,
    /// Interval between keepalive PINGs. Default: 10 s.
    pub keepalive_interval: Duration,
    /// A connection whose PING is not answered within this time is closed. Default: 20 s.
    pub keepalive_timeout: Duration,
}

impl Default for H2Settings {
    fn default() -> Self {
        Self {
            stream_window: 4 * 1024 * 1024,
            connection_window: 64 * 1024 * 1024,
            max_frame_size: 1024 * 1024,
            max_header_list_size: 64 * 1024,
            max_send_buffer: 1024 * 1024,
            max_connection_send_buffer: 16 * 1024 * 1024,
            keepalive_interval: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(20),
        }
    }
}

impl H2Settings {
    /// Sets the stream and connection windows.
    pub fn with_windows(mut self, stream: u32, connection: u32) -> Self {
        self.stream_window = stream;
        self.connection_window = connection;
        self
    }

    /// Sets the largest frame accepted (clamped to HTTP/2's 16 KiB..16 MiB range).
    pub fn with_max_frame_size(mut self, size: u32) -> Self {
        self.max_frame_size = size.clamp(16 * 1024, 16 * 1024 * 1024 - 1);
        self
    }

    /// Sets the keepalive PING interval and timeout.
    pub fn with_keepalive(mut self, interval: Duration, timeout: Duration) -> Self {
        self.keepalive_interval = interval;
        self.keepalive_timeout = timeout;
        self
    }

    /// Sets the largest amount of data buffered per stream, and per server connection (all its
    /// streams), waiting to be written.
    pub fn with_send_buffers(mut self, per_stream: usize, per_connection: usize) -> Self {
        self.max_send_buffer = per_stream;
        self.max_connection_send_buffer = per_connection;
        self
    }

    /// Sets the largest header list accepted.
    pub fn with_max_header_list_size(mut self, size: u32) -> Self {
        self.max_header_list_size = size;
        self
    }

    pub(crate) fn server_builder(&self, max_streams: u32) -> h2::server::Builder {
        let mut b = h2::server::Builder::new();
        b.initial_window_size(self.stream_window)
            .initial_connection_window_size(self.connection_window)
            .max_frame_size(self.max_frame_size)
            .max_header_list_size(self.max_header_list_size)
            .max_send_buffer_size(self.max_send_buffer)
            .max_concurrent_streams(max_streams);
        b
    }

    pub(crate) fn client_builder(&self) -> h2::client::Builder {
        let mut b = h2::client::Builder::new();
        b.initial_window_size(self.stream_window)
            .initial_connection_window_size(self.connection_window)
            .max_frame_size(self.max_frame_size)
            .max_header_list_size(self.max_header_list_size)
            .max_send_buffer_size(self.max_send_buffer)
            .enable_push(false);
        b
    }
}
