//! HTTP/2 and connection settings shared by the client and the server, with their defaults.

use std::time::Duration;

/// Size of the read buffer under TLS. rustls reads the socket about 4 KiB at a time; a buffer
/// beneath it turns a burst of records into one `read` system call instead of one per 4 KiB,
/// at the price of one copy of the ciphertext, which is cheaper than the calls it saves.
pub const TLS_READ_BUFFER: usize = 64 * 1024;

/// How much encrypted data rustls may hold before it must be written (rustls's default is
/// 64 KiB). A bulk HTTP/2 write is encrypted in 256 KiB steps, and each step goes to the socket
/// in one `writev` of 16 records instead of four: measured with the process pair on loopback,
/// about 7% more throughput (docs/performance.md).
pub const TLS_WRITE_BUFFER: usize = 256 * 1024;

/// HTTP/2 settings of an HBONE connection.
///
/// Defaults are sized for bulk tunnels on fast links: a 4 MiB stream window, a 16 MiB
/// connection window (four times the stream window: with equal windows, one stalled reader can
/// take the whole connection window and block every other stream), and 1 MiB frames.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct H2Settings {
    /// Initial flow-control window of each stream, in bytes. Default: 4 MiB.
    pub stream_window: u32,
    /// Flow-control window of the connection, in bytes. Default: 16 MiB.
    pub connection_window: u32,
    /// Largest frame payload accepted, in bytes. Default: 1 MiB.
    pub max_frame_size: u32,
    /// Largest header list accepted, in bytes. Default: 64 KiB.
    pub max_header_list_size: u32,
    /// Largest amount of data buffered per stream waiting for send capacity. Default: 1 MiB.
    pub max_send_buffer: usize,
    /// Interval between keepalive PINGs. Default: 10 s.
    pub keepalive_interval: Duration,
    /// A connection whose PING is not answered within this time is closed. Default: 20 s.
    pub keepalive_timeout: Duration,
}

impl Default for H2Settings {
    fn default() -> Self {
        Self {
            stream_window: 4 * 1024 * 1024,
            connection_window: 16 * 1024 * 1024,
            max_frame_size: 1024 * 1024,
            max_header_list_size: 64 * 1024,
            max_send_buffer: 1024 * 1024,
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
