//! An in-process certificate authority for tests, built on rcgen.
//!
//! It issues real X.509-SVIDs (ECDSA P-256) under a real root, signs CSRs as a [`CaClient`],
//! and can be told to fail so that rotation and outage handling can be tested. It is meant for
//! tests and demos only: it signs whatever identity it is asked for.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, CertifiedIssuer,
    DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use time::OffsetDateTime;

use crate::bundle::{TrustBundle, TrustBundleSet};
use crate::ca::{CaClient, CaError, CertificateRequest};
use crate::select::BoxFuture;
use crate::spiffe::{SpiffeId, TrustDomain};
use crate::svid::{X509Svid, certs_to_pem};

/// How far back issued certificates are dated, to tolerate small clock differences.
const BACKDATE: Duration = Duration::from_secs(60);

/// A test certificate authority for one trust domain, optionally an intermediate under another.
pub struct TestCa {
    trust_domain: TrustDomain,
    issuer: CertifiedIssuer<'static, KeyPair>,
    /// Intermediates between issued leaves and the root, nearest first (empty for a root CA).
    intermediates: Vec<CertificateDer<'static>>,
    root: CertificateDer<'static>,
    failing: AtomicBool,
    requests: AtomicUsize,
    max_validity: Mutex<Option<Duration>>,
}

// === impl TestCa ===

impl TestCa {
    /// A new self-signed root CA for `trust_domain`.
    ///
    /// # Panics
    ///
    /// If rcgen cannot generate a key or certificate, which does not happen with its ring
    /// backend.
    pub fn new(trust_domain: TrustDomain) -> Self {
        let params = ca_params(&trust_domain, "meshkit test root CA");
        let issuer = CertifiedIssuer::self_signed(params, new_key()).expect("self-signed root");
        let root = issuer.der().clone();
        Self::from_parts(trust_domain, issuer, Vec::new(), root)
    }

    /// A new intermediate CA of the same trust domain, signed by this one. Its leaves chain
    /// through it to this CA's root.
    ///
    /// # Panics
    ///
    /// As [`TestCa::new`].
    pub fn intermediate(&self) -> TestCa {
        let params = ca_params(&self.trust_domain, "meshkit test intermediate CA");
        let issuer = CertifiedIssuer::signed_by(params, new_key(), &self.issuer)
            .expect("intermediate signed by root");
        let mut intermediates = vec![issuer.der().clone()];
        intermediates.extend(self.intermediates.iter().cloned());
        Self::from_parts(
            self.trust_domain.clone(),
            issuer,
            intermediates,
            self.root.clone(),
        )
    }

    fn from_parts(
        trust_domain: TrustDomain,
        issuer: CertifiedIssuer<'static, KeyPair>,
        intermediates: Vec<CertificateDer<'static>>,
        root: CertificateDer<'static>,
    ) -> Self {
        Self {
            trust_domain,
            issuer,
            intermediates,
            root,
            failing: AtomicBool::new(false),
            requests: AtomicUsize::new(0),
            max_validity: Mutex::new(None),
        }
    }

    /// The trust domain.
    pub fn trust_domain(&self) -> &TrustDomain {
        &self.trust_domain
    }

    /// The root certificate.
    pub fn root(&self) -> &CertificateDer<'static> {
        &self.root
    }

    /// The root certificate as PEM.
    pub fn root_pem(&self) -> String {
        certs_to_pem(std::slice::from_ref(&self.root))
    }

    /// The trust bundle: this CA's root for its trust domain.
    pub fn bundle(&self) -> TrustBundle {
        TrustBundle::from_der(self.trust_domain.clone(), vec![self.root.clone()])
            .expect("rcgen root is a valid trust anchor")
    }

    /// A bundle set holding only [`TestCa::bundle`].
    pub fn bundle_set(&self) -> TrustBundleSet {
        self.bundle().into()
    }

    /// Default parameters of a valid leaf for `id`, valid from a minute ago for an hour; tests
    /// change them to build invalid certificates and sign them with [`TestCa::sign_params`].
    pub fn leaf_params(id: &SpiffeId) -> CertificateParams {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.subject_alt_names = vec![SanType::URI(
            id.as_str()
                .try_into()
                .expect("a SPIFFE ID is a valid IA5 string"),
        )];
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
            KeyUsagePurpose::KeyAgreement,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        set_validity(&mut params, Duration::from_secs(3600));
        params
    }

    /// Signs a leaf with these parameters and a fresh key; returns the chain (leaf first,
    /// without the root) and the key, unchecked, so that invalid certificates can be built.
    ///
    /// # Panics
    ///
    /// If rcgen refuses the parameters.
    pub fn sign_params(
        &self,
        params: &CertificateParams,
    ) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        let key = new_key();
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("rcgen signs leaf");
        (self.chain_with(cert.der().clone()), key_der(&key))
    }

    /// Issues a valid SVID for `id`, valid for an hour.
    ///
    /// # Panics
    ///
    /// If the SVID does not pass the checks of [`X509Svid::from_der`], which would be a bug.
    pub fn issue(&self, id: SpiffeId) -> X509Svid {
        let (chain, key) = self.sign_params(&Self::leaf_params(&id));
        X509Svid::from_der(chain, key).expect("test CA issues valid SVIDs")
    }

    /// Makes every following [`CaClient::sign`] fail with [`CaError::Unavailable`] (or succeed
    /// again).
    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }

    /// Caps the validity granted to CSRs, whatever is asked.
    pub fn set_max_validity(&self, max: Option<Duration>) {
        *self.max_validity.lock().unwrap_or_else(|e| e.into_inner()) = max;
    }

    /// How many CSRs have been received (failed ones included).
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    /// Signs a PEM CSR for `id`, valid for `validity`: the CSR's only SAN must be `id`; the
    /// CA sets the key usages and extended key usages of an X509-SVID itself.
    ///
    /// # Errors
    ///
    /// [`CaError::Rejected`] when the CSR is malformed or asks for another identity.
    pub fn sign_csr(
        &self,
        csr_pem: &str,
        id: &SpiffeId,
        validity: Duration,
    ) -> Result<Vec<CertificateDer<'static>>, CaError> {
        let csr = CertificateSigningRequestParams::from_pem(csr_pem)
            .map_err(|e| CaError::Rejected(format!("malformed CSR: {e}")))?;
        let sans: Vec<_> = csr.params.subject_alt_names.iter().collect();
        match sans.as_slice() {
            [SanType::URI(uri)] if uri.as_str() == id.as_str() => {}
            _ => {
                return Err(CaError::Rejected(format!(
                    "CSR must carry exactly one URI SAN equal to {id}"
                )));
            }
        }
        let validity = match *self.max_validity.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(max) => validity.min(max),
            None => validity,
        };
        let mut params = Self::leaf_params(id);
        set_validity(&mut params, validity);
        let signed = CertificateSigningRequestParams {
            params,
            public_key: csr.public_key,
        }
        .signed_by(&self.issuer)
        .map_err(|e| CaError::Rejected(e.to_string()))?;
        Ok(self.chain_with(signed.der().clone()))
    }

    fn chain_with(&self, leaf: CertificateDer<'static>) -> Vec<CertificateDer<'static>> {
        let mut chain = vec![leaf];
        chain.extend(self.intermediates.iter().cloned());
        chain
    }
}

impl CaClient for TestCa {
    fn sign<'a>(
        &'a self,
        request: &'a CertificateRequest,
    ) -> BoxFuture<'a, Result<Vec<CertificateDer<'static>>, CaError>> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        let result = if self.failing.load(Ordering::SeqCst) {
            Err(CaError::Unavailable("test CA is set to fail".into()))
        } else {
            self.sign_csr(&request.csr_pem, &request.id, request.validity)
        };
        Box::pin(std::future::ready(result))
    }
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa")
            .field("trust_domain", &self.trust_domain)
            .field("intermediates", &self.intermediates.len())
            .finish_non_exhaustive()
    }
}

fn new_key() -> KeyPair {
    KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("P-256 key generation")
}

fn key_der(key: &KeyPair) -> PrivateKeyDer<'static> {
    PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()))
}

fn ca_params(trust_domain: &TrustDomain, name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, name);
    params
        .distinguished_name
        .push(DnType::OrganizationName, trust_domain.as_str());
    params.subject_alt_names = vec![SanType::URI(
        trust_domain
            .id()
            .as_str()
            .try_into()
            .expect("a SPIFFE ID is a valid IA5 string"),
    )];
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    set_validity(&mut params, Duration::from_secs(10 * 365 * 24 * 3600));
    params
}

fn set_validity(params: &mut CertificateParams, validity: Duration) {
    let now = OffsetDateTime::from(SystemTime::now());
    params.not_before = now - BACKDATE;
    params.not_after = now + validity;
}
