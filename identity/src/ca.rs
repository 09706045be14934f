//! Certificate authority clients: the trait the SVID cache requests certificates through, and
//! the CSR it sends (ECDSA P-256, the SPIFFE ID as the only SAN, empty subject).

use std::time::Duration;

use rcgen::{CertificateParams, DistinguishedName, KeyPair, SanType};
use rustls::crypto::CryptoProvider;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::select::BoxFuture;
use crate::spiffe::SpiffeId;
use crate::svid::{SvidError, X509Svid};

/// A certificate signing request for one SPIFFE ID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateRequest {
    /// The identity requested; the CSR's only SAN.
    pub id: SpiffeId,
    /// The PKCS#10 request, PEM-encoded.
    pub csr_pem: String,
    /// The validity asked for; the CA may grant less.
    pub validity: Duration,
}

/// Why a certificate could not be obtained from a CA.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CaError {
    /// The CA could not be reached or did not answer.
    #[error("certificate authority unavailable: {0}")]
    Unavailable(String),
    /// The CA answered with a refusal.
    #[error("certificate authority refused the request: {0}")]
    Rejected(String),
    /// The CA's answer could not be used as an SVID.
    #[error("certificate authority returned an invalid SVID")]
    InvalidSvid(#[source] SvidError),
    /// The CA issued a certificate for another identity than the one requested.
    #[error("requested {requested} but the certificate authority issued {issued}")]
    WrongIdentity {
        /// The identity asked for.
        requested: SpiffeId,
        /// The identity in the certificate returned.
        issued: SpiffeId,
    },
    /// The CSR could not be built.
    #[error("building the certificate request failed: {0}")]
    Csr(String),
}

/// A certificate authority that signs CSRs for SPIFFE IDs.
pub trait CaClient: Send + Sync {
    /// Signs `request` and returns the chain, leaf first.
    ///
    /// # Errors
    ///
    /// [`CaError::Unavailable`] for transient failures (retried by the cache with backoff),
    /// [`CaError::Rejected`] when the CA refuses.
    fn sign<'a>(
        &'a self,
        request: &'a CertificateRequest,
    ) -> BoxFuture<'a, Result<Vec<CertificateDer<'static>>, CaError>>;
}

impl<C: CaClient + ?Sized> CaClient for std::sync::Arc<C> {
    fn sign<'a>(
        &'a self,
        request: &'a CertificateRequest,
    ) -> BoxFuture<'a, Result<Vec<CertificateDer<'static>>, CaError>> {
        (**self).sign(request)
    }
}

/// A fresh ECDSA P-256 key and a PEM CSR for `id` with the ID as the only SAN and an empty
/// subject.
///
/// # Errors
///
/// [`CaError::Csr`] when key generation or encoding fails.
pub fn generate_csr(id: &SpiffeId) -> Result<(String, PrivateKeyDer<'static>), CaError> {
    let csr_err = |e: rcgen::Error| CaError::Csr(e.to_string());
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(csr_err)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.subject_alt_names = vec![SanType::URI(id.as_str().try_into().map_err(csr_err)?)];
    let csr = params.serialize_request(&key).map_err(csr_err)?;
    let pem = csr.pem().map_err(csr_err)?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    Ok((pem, key))
}

/// Generates a key, asks `ca` to sign it for `id`, and checks that the answer is a valid SVID
/// for exactly that ID. The key is loaded with the default provider
/// ([`default_provider`](crate::default_provider)).
///
/// # Errors
///
/// The CA's error, [`CaError::InvalidSvid`] or [`CaError::WrongIdentity`].
pub async fn request_svid<C: CaClient + ?Sized>(
    ca: &C,
    id: &SpiffeId,
    validity: Duration,
) -> Result<X509Svid, CaError> {
    request_svid_with_provider(ca, id, validity, &crate::default_provider()).await
}

/// As [`request_svid`], loading the key with `provider`, so that handshakes signed with the
/// SVID use the provider the rest of the process uses.
///
/// # Errors
///
/// As [`request_svid`].
pub async fn request_svid_with_provider<C: CaClient + ?Sized>(
    ca: &C,
    id: &SpiffeId,
    validity: Duration,
    provider: &CryptoProvider,
) -> Result<X509Svid, CaError> {
    let (csr_pem, key) = generate_csr(id)?;
    let request = CertificateRequest {
        id: id.clone(),
        csr_pem,
        validity,
    };
    let chain = ca.sign(&request).await?;
    let svid =
        X509Svid::from_der_with_provider(chain, key, provider).map_err(CaError::InvalidSvid)?;
    if svid.spiffe_id() != id {
        return Err(CaError::WrongIdentity {
            requested: id.clone(),
            issued: svid.spiffe_id().clone(),
        });
    }
    Ok(svid)
}
