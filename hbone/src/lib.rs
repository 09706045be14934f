//! HBONE for meshkit: HTTP/2 `CONNECT` tunnels over mutual TLS 1.3, as ambient meshes carry
//! traffic between workloads (port 15008).
//!
//! - [`Client`]: a `tower::Service<Target>` whose response is a [`Tunnel`]
//!   (`AsyncRead + AsyncWrite`), over pooled, multiplexed connections keyed by
//!   (local identity, acceptable peer identities, peer address). Transport-generic
//!   ([`Connect`]), so a tunnel can run inside another tunnel ([`TunnelConnector`]).
//! - [`Server`]: accepts TCP, picks its certificate per connection with a
//!   [`meshkit_identity::CertSelector`], requires the client's SPIFFE certificate, serves
//!   HTTP/2 and hands each CONNECT ([`ConnectRequest`]) to a `tower::Service` that returns a
//!   [`Decision`]. [`Forward`] is the ready-made service that dials the target and copies.
//! - [`Tunnel`]: END_STREAM is half-close and the only EOF; a reset before it is an error;
//!   flow-control credit is released as data is read; [`SendHalf::send`] passes `Bytes`
//!   without copying.
//! - [`copy_bidirectional`]: tunnel ⇄ TCP socket with adaptive buffers, half-close both ways,
//!   and resets carried across: a socket error resets the tunnel (CONNECT_ERROR), a tunnel
//!   reset resets the socket (RST), as RFC 9113 section 8.5 asks.
//! - [`proxy_protocol`]: PROXY v2 headers carrying the peer's SPIFFE ID (TLV 0xD0).
//! - [`Executor`]: where the background tasks of both ends run (client connection drivers,
//!   server connections and streams), as hyper takes one; [`TokioExecutor`] (`tokio::spawn`)
//!   unless [`ClientConfig::with_executor`] / [`ServerConfig::with_executor`] say otherwise.
//!
//! TLS: rustls runs the handshake (with the configuration's provider, ring by default), then
//! hands over the traffic keys, and the connection seals and opens its TLS 1.3 records
//! itself, decrypting each where the socket read put it. The configurations need
//! `enable_secret_extraction`; [`meshkit_identity::TlsSettings`]'s have it, and a selector's
//! configuration without it is copied with it set. KeyUpdate and session tickets stay with
//! rustls. The keys never leave the process.
//!
//! Answers of the server: 405 for a method other than CONNECT, 400 for a missing or
//! malformed `:authority` (HBONE targets are `ip:port`), 403 when a policy refuses, 503 when
//! the target is unreachable, 504 when connecting to it times out.
//!
//! # Example
//!
//! A server that forwards tunnels from one client identity, and a client that opens one:
//!
//! ```no_run
//! use std::sync::Arc;
//! use meshkit_hbone::{Client, ClientConfig, Forward, Server, ServerConfig, Target};
//! use meshkit_identity::test_util::TestCa;
//! use meshkit_identity::{Authorize, SingleIdentity, SpiffeVerifier, TlsSettings, TrustDomain};
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let ca = TestCa::new(TrustDomain::new("cluster.local")?);
//! let (web, db) = ("spiffe://cluster.local/ns/shop/sa/web", "spiffe://cluster.local/ns/shop/sa/db");
//!
//! // Server: presents db's certificate, admits web only, forwards to the CONNECT target.
//! let tls = TlsSettings::default().server_config(
//!     ca.issue(db.parse()?),
//!     SpiffeVerifier::new(ca.bundle_set(), Authorize::Exact(web.parse()?)),
//! )?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:15008").await?;
//! let server = Server::new(ServerConfig::default(), SingleIdentity::new(tls), Forward::new());
//! tokio::spawn(server.serve(listener));
//!
//! // Client: presents web, accepts only db at the other end.
//! let client = Client::new(ClientConfig::default(), ca.issue(web.parse()?), ca.bundle_set());
//! let target = Target::new(
//!     "127.0.0.1:15008".parse()?,   // the HBONE peer
//!     "127.0.0.1:8080".parse()?,    // where it forwards to
//!     web.parse()?,
//!     db.parse()?,
//! );
//! let mut tunnel = client.open(target).await?;
//! tunnel.write_all(b"GET / HTTP/1.0\r\n\r\n").await?;
//! tunnel.shutdown().await?; // END_STREAM: half-close
//! let mut response = Vec::new();
//! tunnel.read_to_end(&mut response).await?;
//! # Ok(())
//! # }
//! ```
//!
//! # Feature flags
//!
//! - `test-util`: enables `meshkit-identity/test-util` for tests of dependent crates.
//!
//! # Stability
//!
//! Pre-1.0: the API may change between minor versions.

// docs.rs builds with `--cfg docsrs`: items behind a feature show it.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod budget;
mod client;
mod config;
mod copy;
mod error;
pub mod fair;
mod forward;
mod io;
mod keepalive;
pub mod proxy_protocol;
mod rt;
mod server;
mod tls;
mod tunnel;

pub use client::{
    Client, ClientConfig, Connect, IdentityProvider, LocalIdentityError, Target, TcpConnector,
    TunnelConnector,
};
pub use config::{H2Settings, TLS_READ_BUFFER, TLS_WRITE_BUFFER};
pub use copy::{Copied, CopyError, Side, copy_bidirectional, socket_to_tunnel, tunnel_to_socket};
pub use error::Error;
pub use forward::Forward;
pub use rt::{Executor, TokioExecutor};
pub use server::{
    ConnectRequest, DecideFn, Decision, Handler, Server, ServerConfig, ServerStats, decide_fn,
};
pub use tunnel::{RecvHalf, ResetReason, SendHalf, Tunnel};

/// The boxed future of [`Connect::connect`], [`IdentityProvider::svid`], [`Handler::run`] and
/// [`Executor::execute`]: meshkit-identity's, so the workspace has one `BoxFuture`.
pub use meshkit_identity::BoxFuture;

/// HTTP/2 error codes, as [`Tunnel::reset`] and [`ResetReason::set`] take them.
pub use h2::Reason;

/// The port HBONE listens on in an ambient mesh.
pub const HBONE_PORT: u16 = 15008;
