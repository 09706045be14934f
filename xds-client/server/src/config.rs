//! Bounds and transport settings of an [`AdsServer`](crate::AdsServer).

use std::time::Duration;

/// Limits and transport settings of an [`AdsServer`](crate::AdsServer). Every setting has a
/// default (listed on its method) suitable for a control plane of a few thousand resources.
///
/// ```
/// use meshkit_xds_server::ServerConfig;
///
/// let config = ServerConfig::default()
///     .max_decoding_message_size(16 * 1024 * 1024)
///     .max_types_per_stream(8);
/// # let _ = config;
/// ```
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub(crate) max_decoding_message_size: usize,
    pub(crate) max_encoding_message_size: usize,
    pub(crate) max_types_per_stream: usize,
    pub(crate) max_names_per_stream: usize,
    pub(crate) max_streams: usize,
    pub(crate) max_streams_per_connection: u32,
    pub(crate) max_connections: usize,
    pub(crate) channel_depth: usize,
    pub(crate) keepalive_interval: Option<Duration>,
    pub(crate) keepalive_timeout: Duration,
    pub(crate) tcp_nodelay: bool,
    pub(crate) first_stream_timeout: Duration,
}

// === impl ServerConfig ===

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            max_decoding_message_size: 4 * 1024 * 1024,
            max_encoding_message_size: 64 * 1024 * 1024,
            max_types_per_stream: 64,
            max_names_per_stream: 100_000,
            max_streams: 10_000,
            max_streams_per_connection: 16,
            max_connections: 10_000,
            channel_depth: 16,
            keepalive_interval: Some(Duration::from_secs(10)),
            keepalive_timeout: Duration::from_secs(20),
            tcp_nodelay: true,
            first_stream_timeout: Duration::from_secs(10),
        }
    }
}

impl ServerConfig {
    /// The largest request accepted, in bytes; a larger one ends its stream with
    /// `OUT_OF_RANGE`. Default 4 MiB (gRPC's default). A Delta client that reconnects sends
    /// the version of every resource it holds in one request (about 40 bytes per resource
    /// plus its name), so raise this for clients holding tens of thousands of resources.
    pub fn max_decoding_message_size(mut self, bytes: usize) -> Self {
        self.max_decoding_message_size = bytes;
        self
    }

    /// The largest response sent, in bytes; a larger one ends its stream with `OUT_OF_RANGE`
    /// (the client reconnects and gets the same answer, so make snapshots fit). Default 64 MiB,
    /// what meshkit-xds-client accepts by default (gRPC clients default to 4 MiB): a
    /// State-of-the-World response carries every subscribed resource of its type.
    pub fn max_encoding_message_size(mut self, bytes: usize) -> Self {
        self.max_encoding_message_size = bytes;
        self
    }

    /// How many type URLs one stream may subscribe to; a request for one more ends the stream
    /// with `RESOURCE_EXHAUSTED`. Default 64 (Istio ambient and Envoy use fewer than 10).
    pub fn max_types_per_stream(mut self, types: usize) -> Self {
        self.max_types_per_stream = types;
        self
    }

    /// How many resource names one stream may subscribe to, over all its types (Delta: names
    /// subscribed and not unsubscribed, plus the versions of its first request; State of the
    /// World: the names of each type's latest request); a request that takes the stream past
    /// it ends the stream with `RESOURCE_EXHAUSTED`. Default 100,000. Delta subscriptions add
    /// up over requests, so without this one stream could grow without bound.
    pub fn max_names_per_stream(mut self, names: usize) -> Self {
        self.max_names_per_stream = names;
        self
    }

    /// How many ADS streams may be open at once over all connections, both variants; one more
    /// is refused with `RESOURCE_EXHAUSTED` before any request is read, and open streams carry
    /// on. Default 10,000 (one per proxy: Istio's proxies open one ADS stream each).
    pub fn max_streams(mut self, streams: usize) -> Self {
        self.max_streams = streams;
        self
    }

    /// HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS` of connections served by
    /// [`AdsServer::serve`](crate::AdsServer::serve) and
    /// [`serve_with_incoming`](crate::AdsServer::serve_with_incoming): how many streams one
    /// connection may have open; a client that opens more has them refused (`REFUSED_STREAM`;
    /// well-behaved clients wait for a free one). Default 16 (an xDS client needs one or two).
    pub fn max_streams_per_connection(mut self, streams: u32) -> Self {
        self.max_streams_per_connection = streams;
        self
    }

    /// How many connections [`AdsServer::serve`](crate::AdsServer::serve) and
    /// [`serve_with_incoming`](crate::AdsServer::serve_with_incoming) keep open at once; a
    /// connection beyond it is closed as soon as it is accepted (the client sees the
    /// connection fail and retries), and the open ones carry on. Default 10,000.
    pub fn max_connections(mut self, connections: usize) -> Self {
        self.max_connections = connections;
        self
    }

    /// How many injected responses ([`AdsServer::inject_sotw`](crate::AdsServer::inject_sotw),
    /// [`inject_delta`](crate::AdsServer::inject_delta)) may wait on one stream; beyond that
    /// an injection skips the stream. Default 16, at least 1. Snapshot pushes are not queued:
    /// they are computed when the stream can send, from the newest snapshot.
    pub fn channel_depth(mut self, depth: usize) -> Self {
        self.channel_depth = depth.max(1);
        self
    }

    /// HTTP/2 keepalive: a PING every `interval` (`None`: none), the connection closed when
    /// one is not answered within `timeout`. Default every 10 s, 20 s timeout, so a client
    /// that vanished without closing its connection is noticed and its streams end.
    pub fn keepalive(mut self, interval: Option<Duration>, timeout: Duration) -> Self {
        self.keepalive_interval = interval;
        self.keepalive_timeout = timeout;
        self
    }

    /// `TCP_NODELAY` on connections accepted by [`AdsServer::serve`](crate::AdsServer::serve).
    /// Default on: Nagle's algorithm with delayed ACKs adds tens of milliseconds to small
    /// responses.
    pub fn tcp_nodelay(mut self, enabled: bool) -> Self {
        self.tcp_nodelay = enabled;
        self
    }

    /// How long a connection served by [`AdsServer::serve`](crate::AdsServer::serve) and
    /// [`serve_with_incoming`](crate::AdsServer::serve_with_incoming) has to open its first
    /// stream that the server admits (past [`max_streams`](Self::max_streams) and the
    /// [`AccessPolicy`](crate::AccessPolicy)); a connection that opens none in time (silent
    /// after its handshake, or with refused credentials only) is closed. Once one stream is
    /// admitted the deadline is gone for good. Default 10 s.
    pub fn first_stream_timeout(mut self, timeout: Duration) -> Self {
        self.first_stream_timeout = timeout;
        self
    }
}
