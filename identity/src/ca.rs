//! Certificate authority clients: the trait the SVID cache requests certificates through, and
//! the CSR it sends (ECDSA P-256, the SPIFFE ID as the only SAN, empty subject).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
    /// The CA issued a certificate that is not valid now: expired, or valid only from a time
    /// further ahead than the allowed clock skew
    /// ([`RotationConfig::max_clock_skew`](crate::RotationConfig::max_clock_skew)). Usually
    /// the CA's clock is off; the request is retried like an unavailable CA.
    #[error(
        "certificate authority issued a certificate valid from {} to {} (Unix seconds), not at {}",
        unix_secs(*.not_before),
        unix_secs(*.not_after),
        unix_secs(*.now)
    )]
    NotValidNow {
        /// The certificate's `notBefore`.
        not_before: SystemTime,
        /// The certificate's `notAfter`.
        not_after: SystemTime,
        /// This machine's time when the certificate arrived.
        now: SystemTime,
    },
    /// The CSR could not be built.
    #[error("building the certificate request failed: {0}")]
    Csr(String),
}

/// How far ahead of this machine's clock a new certificate's `notBefore` may be before it is
/// refused with [`CaError::NotValidNow`], unless configured otherwise: 60 s.
pub const DEFAULT_MAX_CLOCK_SKEW: Duration = Duration::from_secs(60);

fn unix_secs(t: SystemTime) -> i128 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(after) => i128::from(after.as_secs()),
        Err(before) => -i128::from(before.duration().as_secs()),
    }
}

/// Whether `svid` may be used at `now`: not expired, and valid from no later than
/// `now + max_skew`.
///
/// # Errors
///
/// [`CaError::NotValidNow`] otherwise.
pub fn check_validity(svid: &X509Svid, now: SystemTime, max_skew: Duration) -> Result<(), CaError> {
    let (not_before, not_after) = (svid.not_before(), svid.not_after());
    if not_after <= now || not_before > now + max_skew {
        return Err(CaError::NotValidNow {
            not_before,
            not_after,
            now,
        });
    }
    Ok(())
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
/// for exactly that ID, valid now ([`check_validity`] with [`DEFAULT_MAX_CLOCK_SKEW`]). The
/// key is loaded with the default provider ([`default_provider`](crate::default_provider)).
///
/// # Errors
///
/// The CA's error, [`CaError::InvalidSvid`], [`CaError::WrongIdentity`] or
/// [`CaError::NotValidNow`].
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
    request_checked(ca, id, validity, provider, DEFAULT_MAX_CLOCK_SKEW).await
}

/// As [`request_svid_with_provider`], with `max_skew` for the validity check.
pub(crate) async fn request_checked<C: CaClient + ?Sized>(
    ca: &C,
    id: &SpiffeId,
    validity: Duration,
    provider: &CryptoProvider,
    max_skew: Duration,
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
    check_validity(&svid, SystemTime::now(), max_skew)?;
    Ok(svid)
}
