//! rustls configurations for mutual TLS between SPIFFE workloads: TLS 1.3 only, ALPN `h2` by
//! default, one crypto provider passed explicitly (`builder_with_provider`).

use std::fmt;
use std::sync::{Arc, OnceLock};

use rustls::client::ResolvesClientCert;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, ServerConfig, SignatureScheme};
use tokio::sync::watch;

use crate::svid::X509Svid;
use crate::verify::{SpiffeClientVerifier, SpiffeServerVerifier, SpiffeVerifier};

/// The crypto provider used where none is given: rustls's ring provider, built once, with
/// TLS 1.3 AES-128-GCM preferred.
///
/// rustls lists AES-256-GCM first; meshkit prefers AES-128-GCM, as Envoy and BoringSSL do: it
/// is the suite mesh peers negotiate with each other, and it moves bulk data about a third
/// faster for a security margin that is not the weak point of a mesh. Peers that only offer
/// the other suites still get them.
pub fn default_provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(prefer_aes_128_gcm(rustls::crypto::ring::default_provider())))
        .clone()
}

/// `provider` with TLS 1.3 AES-128-GCM moved to the front of its cipher suites, the order
/// [`default_provider`] uses, for building another provider (aws-lc-rs, for example) the same
/// way. The other suites keep their order behind it.
///
/// ```
/// let provider = meshkit_identity::prefer_aes_128_gcm(rustls::crypto::ring::default_provider());
/// assert_eq!(
///     provider.cipher_suites[0].suite(),
///     rustls::CipherSuite::TLS13_AES_128_GCM_SHA256,
/// );
/// ```
pub fn prefer_aes_128_gcm(mut provider: CryptoProvider) -> CryptoProvider {
    // A stable sort: only AES-128-GCM moves.
    provider
        .cipher_suites
        .sort_by_key(|suite| suite.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    provider
}

/// Where a TLS endpoint gets its own certificate: a fixed SVID or the live value of a rotating
/// one (see [`SvidCache`](crate::SvidCache)). With a rotating source every new handshake uses
/// the newest SVID; connections already open keep theirs.
#[derive(Clone)]
pub enum SvidSource {
    /// Always this SVID.
    Fixed(X509Svid),
    /// The current value of a watch channel.
    Rotating(watch::Receiver<Arc<X509Svid>>),
}

impl SvidSource {
    /// The SVID to use now.
    pub fn current(&self) -> X509Svid {
        match self {
            SvidSource::Fixed(svid) => svid.clone(),
            SvidSource::Rotating(rx) => X509Svid::clone(&rx.borrow()),
        }
    }

    fn certified_key(&self) -> Arc<CertifiedKey> {
        match self {
            SvidSource::Fixed(svid) => svid.certified_key().clone(),
            SvidSource::Rotating(rx) => rx.borrow().certified_key().clone(),
        }
    }
}

impl From<X509Svid> for SvidSource {
    fn from(svid: X509Svid) -> Self {
        SvidSource::Fixed(svid)
    }
}

impl From<watch::Receiver<Arc<X509Svid>>> for SvidSource {
    fn from(rx: watch::Receiver<Arc<X509Svid>>) -> Self {
        SvidSource::Rotating(rx)
    }
}

impl fmt::Debug for SvidSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SvidSource::Fixed(svid) => f.debug_tuple("Fixed").field(svid.spiffe_id()).finish(),
            SvidSource::Rotating(rx) => f
                .debug_tuple("Rotating")
                .field(rx.borrow().spiffe_id())
                .finish(),
        }
    }
}

/// Presents the SVID of an [`SvidSource`] in every handshake, as client or as server.
#[derive(Debug, Clone)]
pub struct SvidResolver(SvidSource);

impl SvidResolver {
    /// A resolver for `source`.
    pub fn new(source: impl Into<SvidSource>) -> Self {
        Self(source.into())
    }
}

impl ResolvesServerCert for SvidResolver {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.certified_key())
    }
}

impl ResolvesClientCert for SvidResolver {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.0.certified_key())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// Builds mutual-TLS client and server configurations for SPIFFE workloads.
///
/// Defaults: rustls's ring provider, TLS 1.3 only, ALPN `h2` (HBONE).
///
/// ```
/// use meshkit_identity::{Authorize, SpiffeVerifier, TlsSettings, TrustDomain};
/// use meshkit_identity::test_util::TestCa;
///
/// let ca = TestCa::new(TrustDomain::new("cluster.local")?);
/// let server = ca.issue("spiffe://cluster.local/ns/shop/sa/db".parse()?);
/// let client = ca.issue("spiffe://cluster.local/ns/shop/sa/web".parse()?);
///
/// let tls = TlsSettings::default();
/// // The server admits any workload of its trust domain.
/// let server_config = tls.server_config(
///     server,
///     SpiffeVerifier::new(ca.bundle_set(), Authorize::TrustDomain(ca.trust_domain().clone())),
/// )?;
/// // The client talks only to the database's identity.
/// let client_config = tls.client_config(
///     client,
///     SpiffeVerifier::new(ca.bundle_set(), Authorize::Exact("spiffe://cluster.local/ns/shop/sa/db".parse()?)),
/// )?;
/// assert_eq!(server_config.alpn_protocols, [b"h2".to_vec()]);
/// # drop(client_config);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct TlsSettings {
    provider: Arc<CryptoProvider>,
    alpn: Vec<Vec<u8>>,
}

impl Default for TlsSettings {
    fn default() -> Self {
        Self {
            provider: default_provider(),
            alpn: vec![b"h2".to_vec()],
        }
    }
}

impl TlsSettings {
    /// Uses another crypto provider (for example aws-lc-rs) for handshakes and verification.
    pub fn with_provider(mut self, provider: Arc<CryptoProvider>) -> Self {
        self.provider = provider;
        self
    }

    /// Replaces the ALPN protocols offered (client) or accepted (server).
    pub fn with_alpn(mut self, alpn: Vec<Vec<u8>>) -> Self {
        self.alpn = alpn;
        self
    }

    /// The crypto provider.
    pub fn provider(&self) -> &Arc<CryptoProvider> {
        &self.provider
    }

    /// A client configuration that presents `identity` and accepts servers `verifier` accepts.
    ///
    /// Secret extraction is allowed (`enable_secret_extraction`): meshkit-hbone takes the
    /// traffic keys from rustls once the handshake is done and seals and opens the records
    /// itself, decrypting them in place. The keys never leave the process.
    ///
    /// # Errors
    ///
    /// A rustls error when the provider does not support TLS 1.3.
    pub fn client_config(
        &self,
        identity: impl Into<SvidSource>,
        verifier: SpiffeVerifier,
    ) -> Result<ClientConfig, rustls::Error> {
        let verifier = verifier.with_provider(self.provider.clone());
        let mut config = ClientConfig::builder_with_provider(self.provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(SpiffeServerVerifier::new(verifier)))
            .with_client_cert_resolver(Arc::new(SvidResolver::new(identity)));
        config.alpn_protocols = self.alpn.clone();
        config.enable_secret_extraction = true;
        Ok(config)
    }

    /// A server configuration that presents `identity` and requires clients `verifier`
    /// accepts.
    ///
    /// TLS session resumption is off: the server keeps no sessions and sends no tickets, so
    /// every connection runs a full handshake and the client's certificate is verified each
    /// time. A resumed session would skip that check and let a client whose certificate has
    /// since expired, or whose identity the verifier no longer accepts, back in for the
    /// ticket's lifetime.
    ///
    /// Secret extraction is allowed, as for [`TlsSettings::client_config`].
    ///
    /// # Errors
    ///
    /// A rustls error when the provider does not support TLS 1.3.
    pub fn server_config(
        &self,
        identity: impl Into<SvidSource>,
        verifier: SpiffeVerifier,
    ) -> Result<ServerConfig, rustls::Error> {
        let verifier = verifier.with_provider(self.provider.clone());
        let mut config = ServerConfig::builder_with_provider(self.provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_client_cert_verifier(Arc::new(SpiffeClientVerifier::new(verifier)))
            .with_cert_resolver(Arc::new(SvidResolver::new(identity)));
        config.alpn_protocols = self.alpn.clone();
        config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        config.send_tls13_tickets = 0;
        config.enable_secret_extraction = true;
        Ok(config)
    }
}
