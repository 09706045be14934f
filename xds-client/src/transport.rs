//! How the client reaches the control plane: a caller-built tonic [`Channel`], call
//! credentials (a bearer token, from a string or a file, or any interceptor), and (feature
//! `tls`) TLS with a CA file and an alternate server name, as istiod's clients connect.
//!
//! ```no_run
//! # #[cfg(feature = "tls")]
//! # fn demo() -> Result<(), meshkit_xds_client::Error> {
//! use meshkit_xds_client::envoy::Node;
//! use meshkit_xds_client::protocol::Mode;
//! use meshkit_xds_client::{ClientConfig, ControlPlaneTls};
//!
//! let tls = ControlPlaneTls::from_pem_file("root.pem")?.with_server_name("istiod.istio-system.svc")?;
//! let node = Node { id: "node-a".into(), ..Default::default() };
//! let config = ClientConfig::new("https://10.0.0.2:15010", Mode::Delta, node)
//!     .with_control_plane_tls(&tls)?
//!     .bearer_token_file("/var/run/secrets/tokens/istio-token");
//! # let _ = config; Ok(()) }
//! ```

use std::path::PathBuf;
use std::sync::Arc;

use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::transport::Channel;
use tonic::{Request, Status};

use crate::client::ClientConfig;
use crate::error::Error;

type InterceptFn = dyn Fn(Request<()>) -> Result<Request<()>, Status> + Send + Sync;

/// Call credentials: what the client adds to each ADS call it opens (one per stream). Cheap
/// to clone. Build with [`CallCredentials::bearer_token`], [`CallCredentials::bearer_token_file`]
/// or [`CallCredentials::from_fn`].
#[derive(Clone)]
pub struct CallCredentials {
    inner: Arc<InterceptFn>,
}

// === impl CallCredentials ===

impl CallCredentials {
    /// Sends `authorization: Bearer TOKEN` on every call.
    ///
    /// # Errors
    ///
    /// When the token cannot be a header value (control characters, non-ASCII).
    pub fn bearer_token(token: &str) -> Result<Self, Error> {
        let value: MetadataValue<_> = format!("Bearer {}", token.trim())
            .parse()
            .map_err(|_| Error::config("the bearer token is not a valid header value"))?;
        Ok(Self::from_fn(move |mut request| {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
            Ok(request)
        }))
    }

    /// Reads the token from `path` for every call, so a rotated token file (such as a
    /// projected service account token) is picked up on the next stream. A call whose token
    /// cannot be read fails with `UNAUTHENTICATED` on the client side and is retried with
    /// backoff.
    pub fn bearer_token_file(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        Self::from_fn(move |mut request| {
            let token = std::fs::read_to_string(&path).map_err(|e| {
                Status::unauthenticated(format!(
                    "cannot read the token file {}: {e}",
                    path.display()
                ))
            })?;
            let value: MetadataValue<_> = format!("Bearer {}", token.trim())
                .parse()
                .map_err(|_| Status::unauthenticated("the token file holds an invalid token"))?;
            request.metadata_mut().insert("authorization", value);
            Ok(request)
        })
    }

    /// Any interceptor: it may add metadata, or refuse the call with a status (the client
    /// then retries with backoff).
    pub fn from_fn(
        f: impl Fn(Request<()>) -> Result<Request<()>, Status> + Send + Sync + 'static,
    ) -> Self {
        Self { inner: Arc::new(f) }
    }
}

impl Interceptor for CallCredentials {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        (self.inner)(request)
    }
}

impl std::fmt::Debug for CallCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CallCredentials(..)")
    }
}

// === impl ClientConfig ===

impl ClientConfig {
    /// Uses `channel`, built by the caller (its own connector, TLS, load balancing), instead
    /// of connecting to the URI. The URI must still parse (give the one the channel connects
    /// to), but the connect timeout, keepalive and TLS settings do not apply; the channel
    /// reconnects by itself and the client still opens a new stream with backoff when one
    /// fails.
    pub fn with_channel(mut self, channel: Channel) -> Self {
        self.channel = Some(channel);
        self
    }

    /// Adds `credentials` to every ADS call (default: none).
    pub fn with_credentials(mut self, credentials: CallCredentials) -> Self {
        self.credentials = Some(credentials);
        self
    }

    /// Runs `interceptor` on every ADS call, as [`with_credentials`](Self::with_credentials)
    /// with [`CallCredentials::from_fn`].
    pub fn with_interceptor(
        self,
        interceptor: impl Fn(Request<()>) -> Result<Request<()>, Status> + Send + Sync + 'static,
    ) -> Self {
        self.with_credentials(CallCredentials::from_fn(interceptor))
    }

    /// Sends `authorization: Bearer TOKEN` on every ADS call.
    ///
    /// # Errors
    ///
    /// When the token cannot be a header value.
    pub fn bearer_token(self, token: &str) -> Result<Self, Error> {
        Ok(self.with_credentials(CallCredentials::bearer_token(token)?))
    }

    /// Sends the token read from `path` (re-read for every stream) as a bearer token.
    pub fn bearer_token_file(self, path: impl Into<PathBuf>) -> Self {
        self.with_credentials(CallCredentials::bearer_token_file(path))
    }

    /// TLS to the control plane as `tls` describes it (feature `tls`).
    ///
    /// # Errors
    ///
    /// When the rustls configuration cannot be built.
    #[cfg(feature = "tls")]
    pub fn with_control_plane_tls(self, tls: &ControlPlaneTls) -> Result<Self, Error> {
        let config = tls.client_config()?;
        Ok(self.tls(config, tls.server_name.clone()))
    }
}

/// TLS to a control plane whose serving certificate chains to a CA file, checked against an
/// alternate server name when the address is an IP or a name the certificate does not carry
/// (istiod's clients use `istiod.istio-system.svc`). TLS 1.3 and 1.2, ALPN `h2`. Feature `tls`.
#[cfg(feature = "tls")]
#[derive(Clone)]
pub struct ControlPlaneTls {
    roots: Arc<rustls::RootCertStore>,
    server_name: Option<rustls::pki_types::ServerName<'static>>,
    provider: Option<Arc<rustls::crypto::CryptoProvider>>,
}

#[cfg(feature = "tls")]
impl ControlPlaneTls {
    /// Trusts the certificates of `roots`.
    pub fn new(roots: rustls::RootCertStore) -> Self {
        Self {
            roots: Arc::new(roots),
            server_name: None,
            provider: None,
        }
    }

    /// Trusts every certificate of a PEM bundle.
    ///
    /// # Errors
    ///
    /// When the PEM holds no certificate or one that is not a usable root.
    pub fn from_pem(pem: &str) -> Result<Self, Error> {
        use rustls::pki_types::CertificateDer;
        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            let cert = cert.map_err(|e| Error::config(format!("bad PEM root: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| Error::config(format!("unusable root certificate: {e}")))?;
        }
        if roots.is_empty() {
            return Err(Error::config("the CA bundle holds no certificate"));
        }
        Ok(Self::new(roots))
    }

    /// Trusts every certificate of the PEM file at `path`.
    ///
    /// # Errors
    ///
    /// When the file cannot be read or holds no usable certificate.
    pub fn from_pem_file(path: impl AsRef<std::path::Path>) -> Result<Self, Error> {
        let path = path.as_ref();
        let pem = std::fs::read_to_string(path)
            .map_err(|e| Error::config(format!("cannot read {}: {e}", path.display())))?;
        Self::from_pem(&pem)
    }

    /// Checks the server's certificate against (and sends as SNI) `name` instead of the
    /// URI's host.
    ///
    /// # Errors
    ///
    /// When `name` is neither a DNS name nor an IP address.
    pub fn with_server_name(mut self, name: &str) -> Result<Self, Error> {
        let name = rustls::pki_types::ServerName::try_from(name.to_owned())
            .map_err(|e| Error::config(format!("server name {name:?}: {e}")))?;
        self.server_name = Some(name);
        Ok(self)
    }

    /// Uses `provider` for TLS (default: rustls's ring provider).
    pub fn with_provider(mut self, provider: Arc<rustls::crypto::CryptoProvider>) -> Self {
        self.provider = Some(provider);
        self
    }

    /// The rustls client configuration: these roots, TLS 1.3 and 1.2, ALPN `h2`.
    ///
    /// # Errors
    ///
    /// When the provider supports none of those protocol versions.
    pub fn client_config(&self) -> Result<Arc<rustls::ClientConfig>, Error> {
        let provider = self
            .provider
            .clone()
            .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(Error::config)?
            .with_root_certificates(Arc::clone(&self.roots))
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }

    /// A lazily connecting channel to `uri` (`https://HOST:PORT`) over this TLS, for the
    /// control plane's other gRPC services (its CA), or for
    /// [`ClientConfig::with_channel`].
    ///
    /// # Errors
    ///
    /// When `uri` does not parse or the rustls configuration cannot be built.
    pub fn connect_lazy(&self, uri: &str) -> Result<Channel, Error> {
        // Our connector does the TLS; tonic must see `http` or it looks for its own TLS.
        let plain = match uri.strip_prefix("https://") {
            Some(rest) => format!("http://{rest}"),
            None => uri.to_owned(),
        };
        let endpoint = tonic::transport::Endpoint::from_shared(plain).map_err(Error::config)?;
        let connector =
            crate::tls::TlsConnector::new(self.client_config()?, self.server_name.clone());
        Ok(endpoint.connect_with_connector_lazy(connector))
    }
}

#[cfg(feature = "tls")]
impl std::fmt::Debug for ControlPlaneTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlaneTls")
            .field("roots", &self.roots.len())
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}
