//! Peer verification: X509-SVID leaf rules, the root chosen by the peer's own trust domain,
//! the chain checked by rustls-webpki, then an [`Authorizer`] decides.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, OtherError, SignatureScheme,
};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use webpki::{EndEntityCert, KeyUsage};

use crate::bundle::TrustBundleSet;
use crate::spiffe::{SpiffeId, TrustDomain};
use crate::svid::{SvidError, parse_leaf};

/// Why a peer's certificate chain was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// The peer sent no certificate.
    #[error("peer presented no certificate")]
    NoCertificate,
    /// The leaf breaks an X509-SVID rule.
    #[error("peer leaf is not a valid X509-SVID")]
    Leaf(#[from] SvidError),
    /// The leaf's validity period ended before the verification time.
    #[error("peer certificate expired at unix time {not_after}")]
    Expired {
        /// End of validity, seconds since the Unix epoch.
        not_after: u64,
    },
    /// The leaf's validity period starts after the verification time.
    #[error("peer certificate is not valid before unix time {not_before}")]
    NotYetValid {
        /// Start of validity, seconds since the Unix epoch.
        not_before: u64,
    },
    /// No trust bundle is configured for the peer's trust domain.
    #[error("no trust bundle for the peer's trust domain {0}")]
    UnknownTrustDomain(TrustDomain),
    /// The chain does not lead to a root of the peer's trust domain: no issuer of the chain is
    /// among its roots, or one has a root's name but not its key.
    #[error("peer chain does not lead to a root of trust domain {0}")]
    UnknownIssuer(TrustDomain),
    /// The chain leads only to roots of the peer's trust domain that are outside their
    /// validity at the verification time: an expired root (or one not yet valid) verifies
    /// nothing.
    #[error("peer chain leads only to a root of trust domain {0} that is outside its validity")]
    RootOutsideValidity(TrustDomain),
    /// Path building failed for another reason (bad signature, CA constraints, key usage of an
    /// intermediate, an intermediate outside its validity, ...).
    #[error("peer chain is invalid: {0}")]
    InvalidChain(String),
    /// The chain is valid but the authorizer refused the peer's ID.
    #[error("peer {0} is not authorized")]
    Unauthorized(SpiffeId),
}

/// Decides whether a verified peer ID may connect.
pub trait Authorizer: Send + Sync {
    /// Whether `peer` is allowed.
    fn authorize(&self, peer: &SpiffeId) -> bool;
}

impl<F> Authorizer for F
where
    F: Fn(&SpiffeId) -> bool + Send + Sync,
{
    fn authorize(&self, peer: &SpiffeId) -> bool {
        self(peer)
    }
}

/// The common authorization rules.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Authorize {
    /// Any peer whose chain verifies against its own trust domain's bundle.
    AnyTrusted,
    /// Any peer of this trust domain.
    TrustDomain(TrustDomain),
    /// Exactly this ID.
    Exact(SpiffeId),
    /// Any ID of this set.
    OneOf(BTreeSet<SpiffeId>),
}

impl Authorizer for Authorize {
    fn authorize(&self, peer: &SpiffeId) -> bool {
        match self {
            Authorize::AnyTrusted => true,
            Authorize::TrustDomain(td) => peer.trust_domain_str() == td.as_str(),
            Authorize::Exact(id) => peer == id,
            Authorize::OneOf(ids) => ids.contains(peer),
        }
    }
}

/// Which side of a handshake is being verified; selects the extended key usage required.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerRole {
    /// The peer is a TLS server (we are the client): `serverAuth` when EKUs are present.
    Server,
    /// The peer is a TLS client (we are the server): `clientAuth` when EKUs are present.
    Client,
}

/// Verifies SPIFFE peers: the core shared by [`SpiffeServerVerifier`] and
/// [`SpiffeClientVerifier`], usable without a handshake through [`SpiffeVerifier::verify`].
#[derive(Clone)]
pub struct SpiffeVerifier {
    bundles: Arc<TrustBundleSet>,
    authorizer: Arc<dyn Authorizer>,
    provider: Arc<CryptoProvider>,
}

// === impl SpiffeVerifier ===

impl SpiffeVerifier {
    /// A verifier over `bundles` that admits the peers `authorizer` allows, with the default
    /// crypto provider.
    pub fn new(
        bundles: impl Into<Arc<TrustBundleSet>>,
        authorizer: impl Authorizer + 'static,
    ) -> Self {
        Self {
            bundles: bundles.into(),
            authorizer: Arc::new(authorizer),
            provider: crate::default_provider(),
        }
    }

    /// Uses another crypto provider for signature checks.
    pub fn with_provider(mut self, provider: Arc<CryptoProvider>) -> Self {
        self.provider = provider;
        self
    }

    /// Replaces the authorizer.
    pub fn with_authorizer(mut self, authorizer: impl Authorizer + 'static) -> Self {
        self.authorizer = Arc::new(authorizer);
        self
    }

    /// The trust bundles.
    pub fn bundles(&self) -> &TrustBundleSet {
        &self.bundles
    }

    /// Verifies a DER chain (leaf first) for a peer acting as `role`, at time `now`, and returns
    /// the peer's SPIFFE ID.
    ///
    /// Order of checks: leaf rules, validity at `now`, the bundle of the leaf's own trust
    /// domain, path building to one of its roots, then the authorizer.
    ///
    /// # Errors
    ///
    /// The [`VerifyError`] of the first check that fails.
    pub fn verify(
        &self,
        chain: &[CertificateDer<'_>],
        role: PeerRole,
        now: UnixTime,
    ) -> Result<SpiffeId, VerifyError> {
        let (leaf, intermediates) = chain.split_first().ok_or(VerifyError::NoCertificate)?;
        self.verify_parts(leaf, intermediates, role, now)
    }

    fn verify_parts(
        &self,
        leaf: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        role: PeerRole,
        now: UnixTime,
    ) -> Result<SpiffeId, VerifyError> {
        let info = parse_leaf(leaf)?;
        let now_secs = now.as_secs();
        let secs = |t: std::time::SystemTime| {
            t.duration_since(UNIX_EPOCH)
                .unwrap_or(Duration::ZERO)
                .as_secs()
        };
        let (not_before, not_after) = (secs(info.not_before), secs(info.not_after));
        if now_secs < not_before {
            return Err(VerifyError::NotYetValid { not_before });
        }
        if now_secs > not_after {
            return Err(VerifyError::Expired { not_after });
        }

        let bundle = self
            .bundles
            .get(info.id.trust_domain_str())
            .ok_or_else(|| VerifyError::UnknownTrustDomain(info.id.trust_domain()))?;
        let cert =
            EndEntityCert::try_from(leaf).map_err(|e| VerifyError::InvalidChain(e.to_string()))?;
        let usage = match role {
            PeerRole::Server => KeyUsage::server_auth(),
            PeerRole::Client => KeyUsage::client_auth(),
        };
        let algorithms = self.provider.signature_verification_algorithms.all;
        let valid = bundle.anchors_at(now_secs);
        let path = |anchors: &[rustls_pki_types::TrustAnchor<'_>]| {
            cert.verify_for_usage(algorithms, anchors, intermediates, now, usage, None, None)
                .map(|_| ())
        };
        path(&valid).map_err(|e| match e {
            // A CA that only copies a root's name fails on the signature, not the name: to the
            // caller both mean the chain is not from this trust domain's authority.
            webpki::Error::UnknownIssuer | webpki::Error::InvalidSignatureForPublicKey => {
                // Told apart: a chain to a root of the bundle that is outside its validity.
                if valid.len() < bundle.anchors().len() && path(bundle.anchors()).is_ok() {
                    VerifyError::RootOutsideValidity(info.id.trust_domain())
                } else {
                    VerifyError::UnknownIssuer(info.id.trust_domain())
                }
            }
            other => VerifyError::InvalidChain(other.to_string()),
        })?;

        if !self.authorizer.authorize(&info.id) {
            return Err(VerifyError::Unauthorized(info.id));
        }
        Ok(info.id)
    }

    fn verify_for_rustls(
        &self,
        leaf: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        role: PeerRole,
        now: UnixTime,
    ) -> Result<SpiffeId, rustls::Error> {
        self.verify_parts(leaf, intermediates, role, now)
            .map_err(|e| {
                // Kept whole inside `Other` so callers can downcast to the typed error.
                tracing::debug!(error = %crate::ErrorChain(&e), ?role, "refused peer certificate");
                rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(e))))
            })
    }

    fn verify_tls13(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

impl fmt::Debug for SpiffeVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpiffeVerifier")
            .field("bundles", &self.bundles)
            .finish_non_exhaustive()
    }
}

/// Configs built by this crate offer TLS 1.3 only; a hand-built config that enables TLS 1.2
/// with these verifiers still gets no TLS 1.2 peer through.
fn tls12_refused() -> rustls::Error {
    rustls::Error::General("meshkit verifiers accept TLS 1.3 only".into())
}

/// Extracts the `VerifyError` behind a rustls handshake error produced by meshkit's
/// verifiers, if there is one.
pub fn verify_error(err: &rustls::Error) -> Option<&VerifyError> {
    match err {
        rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(inner))) => {
            inner.downcast_ref::<VerifyError>()
        }
        _ => None,
    }
}

/// A rustls [`ServerCertVerifier`] (used by clients) that accepts SPIFFE servers.
///
/// The server name the client dialled is not checked: in a mesh the SPIFFE ID, checked by the
/// authorizer, is the server's identity.
#[derive(Debug, Clone)]
pub struct SpiffeServerVerifier(SpiffeVerifier);

/// A rustls [`ClientCertVerifier`] (used by servers) that requires and accepts SPIFFE clients.
#[derive(Debug, Clone)]
pub struct SpiffeClientVerifier(SpiffeVerifier);

// === impl SpiffeServerVerifier ===

impl SpiffeServerVerifier {
    /// Wraps a verifier for use by a TLS client.
    pub fn new(verifier: SpiffeVerifier) -> Self {
        Self(verifier)
    }

    /// The underlying verifier.
    pub fn verifier(&self) -> &SpiffeVerifier {
        &self.0
    }
}

impl ServerCertVerifier for SpiffeServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.0
            .verify_for_rustls(end_entity, intermediates, PeerRole::Server, now)
            .map(|_| ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(tls12_refused())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.schemes()
    }
}

// === impl SpiffeClientVerifier ===

impl SpiffeClientVerifier {
    /// Wraps a verifier for use by a TLS server.
    pub fn new(verifier: SpiffeVerifier) -> Self {
        Self(verifier)
    }

    /// The underlying verifier.
    pub fn verifier(&self) -> &SpiffeVerifier {
        &self.0
    }
}

impl ClientCertVerifier for SpiffeClientVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // Hints would have to span every trust domain; SPIFFE clients have one SVID anyway.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.0
            .verify_for_rustls(end_entity, intermediates, PeerRole::Client, now)
            .map(|_| ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(tls12_refused())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.schemes()
    }
}

/// The SPIFFE ID of the peer of a finished rustls connection (client or server side).
///
/// The ID is read from the peer's leaf; it is a verified identity when the connection was
/// configured with a meshkit verifier, which refuses the handshake otherwise. `None` before the
/// handshake completes or when the peer sent no valid SVID. The verifier has usually parsed
/// the same leaf on the same thread a moment before: [`parse_leaf`] then answers from its
/// memory of it.
pub fn peer_spiffe_id(conn: &rustls::CommonState) -> Option<SpiffeId> {
    let leaf = conn.peer_certificates()?.first()?;
    parse_leaf(leaf).ok().map(|info| info.id)
}
