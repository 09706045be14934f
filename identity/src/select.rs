//! Certificate selection: the server picks its configuration per connection, after reading the
//! ClientHello, from the connection's destination, source, SNI and ALPN.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, RwLock};

use rustls::ServerConfig;
use rustls::server::{Acceptor, ClientHello};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::LazyConfigAcceptor;
use tokio_rustls::server::TlsStream;

use crate::verify::{VerifyError, verify_error};

/// A boxed future, as returned by [`CertSelector::select`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The facts of one incoming connection, known once its ClientHello has been read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionInfo {
    /// The local address the client connected to (for redirected traffic, the original
    /// destination).
    pub destination: SocketAddr,
    /// The client's address.
    pub source: SocketAddr,
    /// The SNI host name, if the client sent one.
    pub server_name: Option<String>,
    /// The ALPN protocols the client offered, in its order.
    pub alpn: Vec<Vec<u8>>,
}

impl ConnectionInfo {
    /// The facts of a connection from `source` to `destination` whose ClientHello is `hello`.
    pub fn from_client_hello(
        hello: &ClientHello<'_>,
        source: SocketAddr,
        destination: SocketAddr,
    ) -> Self {
        Self {
            destination,
            source,
            server_name: hello.server_name().map(str::to_owned),
            alpn: hello
                .alpn()
                .map(|protocols| protocols.map(<[u8]>::to_vec).collect())
                .unwrap_or_default(),
        }
    }
}

/// Why no TLS session was established with a client.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AcceptError {
    /// Reading the ClientHello failed (I/O error or not TLS).
    #[error("reading the TLS ClientHello failed")]
    ClientHello(#[source] io::Error),
    /// The selector has no certificate for this connection.
    #[error("no certificate for destination {destination} (SNI {server_name:?})")]
    NoCertificate {
        /// The destination address of the connection.
        destination: SocketAddr,
        /// The SNI the client sent.
        server_name: Option<String>,
    },
    /// The client's certificate was refused by a meshkit verifier.
    #[error("client certificate refused")]
    PeerRejected(#[source] VerifyError),
    /// The handshake failed after the configuration was chosen, for another reason.
    #[error("TLS handshake failed")]
    Handshake(#[source] io::Error),
}

impl AcceptError {
    /// The error of a handshake that failed after the configuration was chosen:
    /// [`AcceptError::PeerRejected`] when a meshkit verifier refused the client's certificate
    /// (the rustls error inside `e` says so), [`AcceptError::Handshake`] otherwise.
    pub fn from_handshake(e: io::Error) -> Self {
        let refused = e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .and_then(verify_error)
            .cloned();
        match refused {
            Some(reason) => Self::PeerRejected(reason),
            None => Self::Handshake(e),
        }
    }
}

/// Chooses the server configuration (and so the certificate) for a connection.
///
/// Called once per connection, after the ClientHello is read and before the handshake goes on;
/// it may await (to fetch a certificate on first use, for example).
pub trait CertSelector: Send + Sync {
    /// The configuration for this connection, or `None` to refuse it.
    fn select<'a>(&'a self, conn: &'a ConnectionInfo) -> BoxFuture<'a, Option<Arc<ServerConfig>>>;
}

/// Accepts a TLS connection, choosing its configuration with `selector`.
///
/// # Cancel safety
///
/// Not cancel safe: dropping the future drops the connection. Wrap it in a timeout to bound
/// slow clients.
///
/// # Errors
///
/// [`AcceptError`] names the stage that failed.
pub async fn accept<S, IO>(
    selector: &S,
    io: IO,
    source: SocketAddr,
    destination: SocketAddr,
) -> Result<(TlsStream<IO>, ConnectionInfo), AcceptError>
where
    S: CertSelector + ?Sized,
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let start = LazyConfigAcceptor::new(Acceptor::default(), io)
        .await
        .map_err(AcceptError::ClientHello)?;
    let info = ConnectionInfo::from_client_hello(&start.client_hello(), source, destination);
    let Some(config) = selector.select(&info).await else {
        return Err(AcceptError::NoCertificate {
            destination,
            server_name: info.server_name,
        });
    };
    let stream = start
        .into_stream(config)
        .await
        .map_err(AcceptError::from_handshake)?;
    Ok((stream, info))
}

/// Serves one configuration to every connection.
#[derive(Debug, Clone)]
pub struct SingleIdentity(Arc<ServerConfig>);

impl SingleIdentity {
    /// A selector that always answers `config`.
    pub fn new(config: impl Into<Arc<ServerConfig>>) -> Self {
        Self(config.into())
    }
}

impl CertSelector for SingleIdentity {
    fn select<'a>(&'a self, _conn: &'a ConnectionInfo) -> BoxFuture<'a, Option<Arc<ServerConfig>>> {
        Box::pin(std::future::ready(Some(self.0.clone())))
    }
}

/// Serves the configuration of the workload that owns the destination IP: the ambient inbound
/// rule, where one proxy answers for every workload on its node. Entries can change while the
/// server runs.
#[derive(Debug, Default)]
pub struct ByDestinationIp {
    configs: RwLock<HashMap<IpAddr, Arc<ServerConfig>>>,
}

impl ByDestinationIp {
    /// An empty selector: every connection is refused until an address is added.
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves `config` for connections to `ip`, replacing what was there.
    pub fn insert(&self, ip: IpAddr, config: impl Into<Arc<ServerConfig>>) {
        self.write().insert(ip, config.into());
    }

    /// Stops serving `ip`.
    pub fn remove(&self, ip: &IpAddr) -> Option<Arc<ServerConfig>> {
        self.write().remove(ip)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<IpAddr, Arc<ServerConfig>>> {
        // A panic while holding the lock leaves the map itself consistent; keep serving.
        self.configs.write().unwrap_or_else(|e| e.into_inner())
    }
}

impl CertSelector for ByDestinationIp {
    fn select<'a>(&'a self, conn: &'a ConnectionInfo) -> BoxFuture<'a, Option<Arc<ServerConfig>>> {
        let configs = self.configs.read().unwrap_or_else(|e| e.into_inner());
        let config = configs.get(&conn.destination.ip()).cloned();
        Box::pin(std::future::ready(config))
    }
}

/// Serves a configuration by SNI host name (compared case-insensitively), with an optional
/// fallback for clients that send no SNI or an unknown one.
#[derive(Debug, Default, Clone)]
pub struct BySni {
    configs: HashMap<String, Arc<ServerConfig>>,
    fallback: Option<Arc<ServerConfig>>,
}

impl BySni {
    /// An empty selector.
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves `config` for SNI `name`.
    pub fn with(mut self, name: &str, config: impl Into<Arc<ServerConfig>>) -> Self {
        self.configs
            .insert(name.to_ascii_lowercase(), config.into());
        self
    }

    /// Serves `config` when no name matches.
    pub fn with_fallback(mut self, config: impl Into<Arc<ServerConfig>>) -> Self {
        self.fallback = Some(config.into());
        self
    }
}

impl CertSelector for BySni {
    fn select<'a>(&'a self, conn: &'a ConnectionInfo) -> BoxFuture<'a, Option<Arc<ServerConfig>>> {
        let config = conn
            .server_name
            .as_deref()
            .and_then(|name| self.configs.get(&name.to_ascii_lowercase()))
            .or(self.fallback.as_ref())
            .cloned();
        Box::pin(std::future::ready(config))
    }
}

impl<S: CertSelector + ?Sized> CertSelector for Arc<S> {
    fn select<'a>(&'a self, conn: &'a ConnectionInfo) -> BoxFuture<'a, Option<Arc<ServerConfig>>> {
        (**self).select(conn)
    }
}
