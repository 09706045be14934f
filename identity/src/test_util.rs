//! An in-process certificate authority for tests: a [`CaSigner`] with test switches.
//!
//! It issues real X.509-SVIDs (ECDSA P-256) under a real root, signs CSRs as a [`CaClient`],
//! and can be told to fail so that rotation and outage handling can be tested. It is meant for
//! tests and demos only: as a [`CaClient`] it signs whatever identity of its trust domain it is
//! asked for, and [`TestCa::issue`] and [`TestCa::sign_params`] sign anything at all.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use rcgen::CertificateParams;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::bundle::{TrustBundle, TrustBundleSet};
use crate::ca::{CaClient, CaError, CertificateRequest};
use crate::select::BoxFuture;
use crate::signer::CaSigner;
use crate::spiffe::{SpiffeId, TrustDomain};
use crate::svid::X509Svid;

/// Validity of [`TestCa::leaf_params`] and [`TestCa::issue`].
const TEST_LEAF_VALIDITY: Duration = Duration::from_secs(3600);

/// A test certificate authority for one trust domain, optionally an intermediate under another:
/// a [`CaSigner`] with switches for tests (fail on demand, count requests, cap validity).
pub struct TestCa {
    signer: CaSigner,
    failing: AtomicBool,
    requests: AtomicUsize,
    max_validity: Mutex<Option<Duration>>,
}

// === impl TestCa ===

impl TestCa {
    /// A new self-signed root CA for `trust_domain` ([`CaSigner::generate`]), whose leaves are
    /// capped only by the CA's own expiry (unless [`TestCa::set_max_validity`] says otherwise).
    ///
    /// # Panics
    ///
    /// If rcgen cannot generate a key or certificate, which does not happen with its ring
    /// backend.
    pub fn new(trust_domain: TrustDomain) -> Self {
        let signer = CaSigner::generate(trust_domain).expect("test root CA");
        Self::wrap(signer.with_max_validity(Duration::MAX))
    }

    /// A new intermediate CA of the same trust domain, signed by this one. Its leaves chain
    /// through it to this CA's root.
    ///
    /// # Panics
    ///
    /// As [`TestCa::new`].
    pub fn intermediate(&self) -> TestCa {
        Self::wrap(self.signer.intermediate().expect("test intermediate CA"))
    }

    /// A test CA over `signer` (a loaded one, say), with the test switches off.
    pub fn from_signer(signer: CaSigner) -> Self {
        Self::wrap(signer)
    }

    fn wrap(signer: CaSigner) -> Self {
        Self {
            signer,
            failing: AtomicBool::new(false),
            requests: AtomicUsize::new(0),
            max_validity: Mutex::new(None),
        }
    }

    /// The CA that signs.
    pub fn signer(&self) -> &CaSigner {
        &self.signer
    }

    /// The trust domain.
    pub fn trust_domain(&self) -> &TrustDomain {
        self.signer.trust_domain()
    }

    /// The root certificate.
    pub fn root(&self) -> &CertificateDer<'static> {
        self.signer.root()
    }

    /// The root certificate as PEM.
    pub fn root_pem(&self) -> String {
        self.signer.root_pem()
    }

    /// The trust bundle: this CA's root for its trust domain.
    pub fn bundle(&self) -> TrustBundle {
        self.signer.bundle()
    }

    /// A bundle set holding only [`TestCa::bundle`].
    pub fn bundle_set(&self) -> TrustBundleSet {
        self.signer.bundle_set()
    }

    /// Default parameters of a valid leaf for `id`, valid from a minute ago for an hour
    /// ([`CaSigner::leaf_params`]); tests change them to build invalid certificates and sign
    /// them with [`TestCa::sign_params`].
    pub fn leaf_params(id: &SpiffeId) -> CertificateParams {
        CaSigner::leaf_params(id, TEST_LEAF_VALIDITY)
    }

    /// Signs a leaf with these parameters and a fresh key; returns the chain (leaf first,
    /// without the root) and the key, unchecked, so that invalid certificates can be built
    /// ([`CaSigner::sign_params`]).
    ///
    /// # Panics
    ///
    /// If rcgen refuses the parameters.
    pub fn sign_params(
        &self,
        params: &CertificateParams,
    ) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        self.signer.sign_params(params).expect("rcgen signs leaf")
    }

    /// Issues a valid SVID for `id`, valid for an hour. Like [`TestCa::sign_params`], it does
    /// not check that `id` is of this CA's trust domain.
    ///
    /// # Panics
    ///
    /// If the SVID does not pass the checks of [`X509Svid::from_der`] (`id` without a path, for
    /// example).
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

    /// Signs a PEM CSR for `id`, valid for `validity` ([`CaSigner::sign_csr`]): the CSR's only
    /// SAN must be `id`, of this CA's trust domain; the CA sets the key usages and extended key
    /// usages of an X509-SVID itself. The chain holds no root.
    ///
    /// # Errors
    ///
    /// [`CaError::Rejected`] when the CSR is malformed or asks for another identity; its
    /// message is the whole [`SignError`](crate::SignError) chain.
    pub fn sign_csr(
        &self,
        csr_pem: &str,
        id: &SpiffeId,
        validity: Duration,
    ) -> Result<Vec<CertificateDer<'static>>, CaError> {
        let validity = match *self.max_validity.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(max) => validity.min(max),
            None => validity,
        };
        self.signer
            .sign_csr(csr_pem, id, validity)
            .map_err(|e| CaError::Rejected(crate::ErrorChain(&e).to_string()))
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
            .field("signer", &self.signer)
            .field("failing", &self.failing.load(Ordering::SeqCst))
            .finish_non_exhaustive()
    }
}
