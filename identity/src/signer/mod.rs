//! A certificate authority for one trust domain: it holds a CA key and certificate (generated,
//! or loaded from PEM files) and signs X509-SVID leaves from CSRs.
//!
//! What a leaf gets is decided here, never by the CSR: only the CSR's public key and its one
//! URI SAN (which must equal the identity the caller authorised) are used. Everything else
//! comes from [`CaSigner::leaf_params`]:
//!
//! | field | value | why |
//! |---|---|---|
//! | subject | empty | X509-SVID: the identity is the URI SAN, not the subject |
//! | SAN | the SPIFFE ID, one URI, critical | the subject is empty (RFC 5280 4.2.1.6) |
//! | basicConstraints | cA=false | a workload must not sign certificates |
//! | keyUsage | digitalSignature, keyEncipherment, keyAgreement | as Istio issues them |
//! | extKeyUsage | serverAuth, clientAuth | every workload is both ends of mTLS |
//! | serial | 128 random bits (top bit clear) | unique even when a CSR is signed twice |
//! | notBefore | now − 60 s | tolerates small clock differences between nodes |
//! | notAfter | now + min(asked, cap), never after any CA certificate of the chain | a leaf never outlives the authority that vouches for it |
//! | AKI | the CA's key identifier | lets path builders pick the right CA among same-named ones |

mod error;
mod files;
mod key;

use std::fmt;
use std::fs;
use std::path::Path;
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, PublicKeyData as _,
    SanType, SerialNumber,
};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{
    CertificateDer, CertificateSigningRequestDer, PrivateKeyDer, PrivatePkcs8KeyDer, UnixTime,
};
use time::OffsetDateTime;
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

use self::error::rfc3339;
pub use self::error::{CaLoadError, SignError};
use crate::bundle::{TrustBundle, TrustBundleSet};
use crate::spiffe::{SpiffeId, TrustDomain};
use crate::svid::{SvidError, X509Svid, certs_from_pem, certs_to_pem};
use crate::verify::{Authorize, PeerRole, SpiffeVerifier};

/// The longest validity a [`CaSigner`] grants a leaf unless told otherwise with
/// [`CaSigner::with_max_validity`]: 24 hours, Istio's default workload certificate lifetime.
pub const DEFAULT_MAX_VALIDITY: Duration = Duration::from_secs(24 * 3600);

/// Validity of a root made by [`CaSigner::generate`] (and the longest of an intermediate made
/// by [`CaSigner::intermediate`]): ten years.
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// How far back certificates are dated, to tolerate small clock differences.
const BACKDATE: Duration = Duration::from_secs(60);

/// A certificate authority for one trust domain: signs X509-SVIDs from CSRs.
///
/// It is a root (self-signed, from [`CaSigner::generate`], or loaded) or an intermediate
/// (loaded with its chain, or made by [`CaSigner::intermediate`]). It signs only identities of
/// its trust domain and only the public key and identity of a CSR; deciding *who* may have an
/// identity is the caller's job (a token check, a node check, ...).
///
/// # Chains without the root
///
/// [`sign_csr`](CaSigner::sign_csr), [`sign_params`](CaSigner::sign_params) and
/// [`issue`](CaSigner::issue) return the chain leaf first, then the intermediates (this CA's
/// certificate when it is not the root, then its issuers), **without the root**: a verifier
/// must get the root from its trust bundle, never from the peer, so sending it is only bytes
/// on the wire. Istio's `CreateCertificate` response carries the root last; a server speaking
/// that protocol appends [`root`](CaSigner::root) itself.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use meshkit_identity::{
///     Authorize, CaSigner, PeerRole, SpiffeId, SpiffeVerifier, TrustDomain, generate_csr,
/// };
///
/// let td = TrustDomain::new("cluster.local")?;
/// let ca = CaSigner::generate(td.clone())?;
/// let id = SpiffeId::from_istio(&td, "shop", "web")?;
///
/// // What a workload sends: a CSR for its own ID; the key stays with it.
/// let (csr_pem, _key) = generate_csr(&id)?;
/// // After checking that the caller may hold `id`:
/// let chain = ca.sign_csr(&csr_pem, &id, Duration::from_secs(3600))?;
///
/// let verifier = SpiffeVerifier::new(ca.bundle_set(), Authorize::Exact(id.clone()));
/// let now = rustls_pki_types::UnixTime::now();
/// assert_eq!(verifier.verify(&chain, PeerRole::Client, now)?, id);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct CaSigner {
    trust_domain: TrustDomain,
    issuer: Issuer<'static, KeyPair>,
    /// This CA's certificate, then its issuers up to the root (the last one).
    chain: Vec<CertificateDer<'static>>,
    bundle: TrustBundle,
    /// End of validity of the first certificate of `chain` to expire.
    not_after: OffsetDateTime,
    max_validity: Duration,
}

// === impl CaSigner ===

impl CaSigner {
    /// A new self-signed root for `trust_domain`: ECDSA P-256, `cA=true`, key usage
    /// keyCertSign + cRLSign + digitalSignature, the URI SAN `spiffe://<trust domain>`, CN
    /// `<trust domain> root CA` and O `<trust domain>`, valid from a minute ago for
    /// [`CA_VALIDITY`].
    ///
    /// # Errors
    ///
    /// [`CaLoadError::Generate`] when rcgen cannot generate the key or certificate, which does
    /// not happen with its ring backend.
    pub fn generate(trust_domain: TrustDomain) -> Result<Self, CaLoadError> {
        let key = new_key().map_err(CaLoadError::Generate)?;
        let now = OffsetDateTime::now_utc();
        let params = ca_params(&trust_domain, "root CA", now, add(now, CA_VALIDITY))?;
        let cert = params.self_signed(&key).map_err(CaLoadError::Generate)?;
        Self::assemble(trust_domain, vec![cert.der().clone()], key, false)
    }

    /// A CA from PEM: `cert_chain_pem` holds the signing CA's certificate first, then
    /// optionally its issuers up to the root; `key_pem` the signing CA's private key (PKCS#8
    /// `PRIVATE KEY`, or SEC1 `EC PRIVATE KEY` for P-256 and P-384).
    ///
    /// The root, whose certificate makes the trust bundle, is the chain's last certificate; with
    /// one certificate it is the signing CA itself (whether or not it is self-signed).
    ///
    /// Checked: every certificate of the chain is within its validity now; the first is a CA
    /// (`cA=true`, keyCertSign) whose SPIFFE URI SAN, if it has one, is of `trust_domain`; the
    /// key matches its public key (SubjectPublicKeyInfo compared); and a certificate signed
    /// with it verifies through the chain to the root.
    ///
    /// # Errors
    ///
    /// The [`CaLoadError`] of the first check that fails.
    pub fn from_pem(
        trust_domain: TrustDomain,
        cert_chain_pem: &str,
        key_pem: &str,
    ) -> Result<Self, CaLoadError> {
        let chain = certs_from_pem(cert_chain_pem).map_err(CaLoadError::CertPem)?;
        let key = key::parse_key(key_pem)?;
        Self::assemble(trust_domain, chain, key, true)
    }

    /// A CA from a PEM certificate (chain) file and a PEM key file, as [`CaSigner::from_pem`].
    /// Logs a warning (tracing) when the key file is readable by group or others.
    ///
    /// # Errors
    ///
    /// [`CaLoadError::Read`] naming the file that cannot be read, [`CaLoadError::Files`]
    /// naming both files when their contents are refused (its source says why).
    pub fn load(
        trust_domain: TrustDomain,
        cert_path: impl AsRef<Path>,
        key_path: impl AsRef<Path>,
    ) -> Result<Self, CaLoadError> {
        let (cert_path, key_path) = (cert_path.as_ref(), key_path.as_ref());
        let read = |path: &Path| {
            fs::read_to_string(path).map_err(|source| CaLoadError::Read {
                path: path.to_owned(),
                source,
            })
        };
        let cert_pem = read(cert_path)?;
        let key_pem = read(key_path)?;
        files::warn_if_exposed(key_path);
        Self::from_pem(trust_domain, &cert_pem, &key_pem).map_err(|source| CaLoadError::Files {
            cert: cert_path.to_owned(),
            key: key_path.to_owned(),
            source: Box::new(source),
        })
    }

    /// Loads the CA from its files, or on first start, when neither file exists, generates a
    /// root ([`CaSigner::generate`]) and saves it there ([`CaSigner::save`]).
    ///
    /// # Errors
    ///
    /// [`CaLoadError::OnlyOneFile`] when one file exists without the other (nothing is
    /// written), otherwise as [`CaSigner::load`] or [`CaSigner::save`].
    ///
    /// The files belong to one process: two first starts at once would each generate a root,
    /// and the last to rename its files into place would win.
    pub fn load_or_generate(
        trust_domain: TrustDomain,
        cert_path: impl AsRef<Path>,
        key_path: impl AsRef<Path>,
    ) -> Result<Self, CaLoadError> {
        let (cert_path, key_path) = (cert_path.as_ref(), key_path.as_ref());
        let exists = |path: &Path| {
            path.try_exists().map_err(|source| CaLoadError::Read {
                path: path.to_owned(),
                source,
            })
        };
        match (exists(cert_path)?, exists(key_path)?) {
            (true, true) => Self::load(trust_domain, cert_path, key_path),
            (false, false) => {
                let ca = Self::generate(trust_domain)?;
                ca.save(cert_path, key_path)?;
                tracing::info!(
                    cert = %cert_path.display(),
                    key = %key_path.display(),
                    trust_domain = %ca.trust_domain,
                    "generated a new root CA"
                );
                Ok(ca)
            }
            (true, false) => Err(CaLoadError::OnlyOneFile {
                present: cert_path.to_owned(),
                missing: key_path.to_owned(),
            }),
            (false, true) => Err(CaLoadError::OnlyOneFile {
                present: key_path.to_owned(),
                missing: cert_path.to_owned(),
            }),
        }
    }

    /// Writes the CA's chain ([`CaSigner::cert_pem`]) to `cert_path` with mode 0644 and its
    /// private key (PKCS#8 PEM) to `key_path` with mode 0600, each through a temporary file in
    /// the same folder renamed into place, so that a crash never leaves a half-written file.
    /// Existing files are replaced. Missing folders are created with mode 0700.
    ///
    /// The key is written first: a crash between the two leaves only the key, which
    /// [`CaSigner::load_or_generate`] refuses rather than overwrites.
    ///
    /// # Errors
    ///
    /// [`CaLoadError::Write`] naming the file that could not be written.
    pub fn save(
        &self,
        cert_path: impl AsRef<Path>,
        key_path: impl AsRef<Path>,
    ) -> Result<(), CaLoadError> {
        files::write_atomically(key_path.as_ref(), self.issuer.key().serialize_pem(), 0o600)?;
        files::write_atomically(cert_path.as_ref(), self.cert_pem(), 0o644)
    }

    /// A new intermediate CA of the same trust domain, signed by this one: a fresh P-256 key,
    /// CN `<trust domain> intermediate CA`, valid for [`CA_VALIDITY`] but never after this CA.
    /// Its leaves chain through it (and this CA's intermediates) to this CA's root. It keeps
    /// this CA's [`max_validity`](CaSigner::max_validity).
    ///
    /// # Errors
    ///
    /// [`CaLoadError::Sign`] with [`SignError::CaExpired`] when this CA has expired,
    /// [`CaLoadError::Generate`] when rcgen fails.
    pub fn intermediate(&self) -> Result<CaSigner, CaLoadError> {
        let now = OffsetDateTime::now_utc();
        self.check_not_expired(now).map_err(CaLoadError::Sign)?;
        let key = new_key().map_err(CaLoadError::Generate)?;
        let not_after = add(now, CA_VALIDITY).min(self.not_after);
        let params = ca_params(&self.trust_domain, "intermediate CA", now, not_after)?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(CaLoadError::Generate)?;
        let mut chain = vec![cert.der().clone()];
        chain.extend(self.chain.iter().cloned());
        let ca = Self::assemble(self.trust_domain.clone(), chain, key, false)?;
        Ok(ca.with_max_validity(self.max_validity))
    }

    /// Caps the validity of the leaves this CA signs (default [`DEFAULT_MAX_VALIDITY`]),
    /// whatever a request asks. Leaves never outlive the CA chain, whatever the cap.
    pub fn with_max_validity(mut self, max: Duration) -> Self {
        self.max_validity = max;
        self
    }

    /// The cap on leaf validity.
    pub fn max_validity(&self) -> Duration {
        self.max_validity
    }

    /// The trust domain this CA signs for.
    pub fn trust_domain(&self) -> &TrustDomain {
        &self.trust_domain
    }

    /// The root certificate: the last of the CA's chain (this CA's own certificate when it is
    /// the root).
    pub fn root(&self) -> &CertificateDer<'static> {
        self.chain.last().expect("a CA chain is never empty")
    }

    /// The root certificate as PEM.
    pub fn root_pem(&self) -> String {
        certs_to_pem(std::slice::from_ref(self.root()))
    }

    /// The CA's own chain: its certificate first, then its issuers up to the root.
    pub fn chain(&self) -> &[CertificateDer<'static>] {
        &self.chain
    }

    /// The CA's own chain ([`CaSigner::chain`]) as PEM, the form [`CaSigner::from_pem`] reads.
    pub fn cert_pem(&self) -> String {
        certs_to_pem(&self.chain)
    }

    /// When the first certificate of the CA's chain expires; no leaf is valid after it.
    pub fn not_after(&self) -> SystemTime {
        self.not_after.into()
    }

    /// The trust bundle: the root for this trust domain.
    pub fn bundle(&self) -> TrustBundle {
        self.bundle.clone()
    }

    /// A bundle set holding only [`CaSigner::bundle`].
    pub fn bundle_set(&self) -> TrustBundleSet {
        self.bundle().into()
    }

    /// The X509-SVID leaf template for `id`, valid from a minute ago until `validity` from now
    /// (see the module table): empty subject, `id` as the only URI SAN, `cA=false`, key usages
    /// digitalSignature + keyEncipherment + keyAgreement, EKUs serverAuth + clientAuth. No
    /// serial: [`CaSigner::sign_params`] draws one.
    ///
    /// Public so that tests can change it to build invalid leaves.
    pub fn leaf_params(id: &SpiffeId, validity: Duration) -> CertificateParams {
        let now = OffsetDateTime::now_utc();
        leaf_template(id, now, add(now, validity))
    }

    /// Signs exactly `params` (a random serial is drawn when it has none) with a fresh P-256
    /// key and returns the chain (leaf first, without the root) and the key.
    ///
    /// **Unchecked**: neither the identity, nor the trust domain, nor the validity are looked
    /// at, so that tests and tools can build any certificate. Services sign with
    /// [`CaSigner::sign_csr`] or [`CaSigner::issue`].
    ///
    /// # Errors
    ///
    /// [`SignError::Sign`] when rcgen refuses the parameters, [`SignError::Random`].
    pub fn sign_params(
        &self,
        params: &CertificateParams,
    ) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), SignError> {
        let key = new_key().map_err(SignError::Sign)?;
        let mut params = params.clone();
        if params.serial_number.is_none() {
            params.serial_number = Some(random_serial().ok_or(SignError::Random)?);
        }
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(SignError::Sign)?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        Ok((self.chain_with(cert.der().clone()), key))
    }

    /// Issues an SVID for `id` with a fresh key, valid for `validity` (capped as by
    /// [`CaSigner::sign_csr`]): for demos and tools that need credentials without a CSR round
    /// trip. The chain holds no root.
    ///
    /// # Errors
    ///
    /// [`SignError::ForeignTrustDomain`], [`SignError::NoPath`], [`SignError::ZeroValidity`],
    /// [`SignError::CaExpired`], or a signing failure.
    pub fn issue(&self, id: &SpiffeId, validity: Duration) -> Result<X509Svid, SignError> {
        let now = OffsetDateTime::now_utc();
        let not_after = self.check_request(id, validity, now)?;
        let (chain, key) = self.sign_params(&leaf_template(id, now, not_after))?;
        X509Svid::from_der(chain, key).map_err(SignError::InvalidSvid)
    }

    /// Signs a PEM CSR for `id`, which the caller has authorised, valid for `validity`.
    ///
    /// The CSR's self-signature must verify and it must carry exactly one SAN, a URI equal to
    /// `id`; `id` must be a workload ID (with a path) of this CA's trust domain. Only the CSR's
    /// public key is used: the leaf is [`CaSigner::leaf_params`] with a random serial, valid
    /// until now + min(`validity`, [`max_validity`](CaSigner::max_validity)), and never after
    /// [`not_after`](CaSigner::not_after).
    ///
    /// Returns the chain leaf first, then the intermediates, **without the root** (see the
    /// type's docs).
    ///
    /// # Errors
    ///
    /// A [`SignError`] naming the rule the request breaks, or a signing failure.
    pub fn sign_csr(
        &self,
        csr_pem: &str,
        id: &SpiffeId,
        validity: Duration,
    ) -> Result<Vec<CertificateDer<'static>>, SignError> {
        let now = OffsetDateTime::now_utc();
        let not_after = self.check_request(id, validity, now)?;
        let csr = Csr::parse(csr_pem)?;
        let found = csr.spiffe_id()?;
        if found != *id {
            return Err(SignError::CsrIdMismatch {
                requested: id.clone(),
                found,
            });
        }
        let mut params = leaf_template(id, now, not_after);
        params.serial_number = Some(random_serial().ok_or(SignError::Random)?);
        let leaf = CertificateSigningRequestParams {
            params,
            public_key: csr.params.public_key,
        }
        .signed_by(&self.issuer)
        .map_err(SignError::Sign)?;
        // rcgen re-encodes the key from the CSR's signature algorithm; a key whose type that
        // does not determine (a P-384 key signed with SHA-256, say) would come out wrong.
        let (_, cert) =
            X509Certificate::from_der(leaf.der()).map_err(|_| SignError::UnsupportedCsrKey)?;
        if cert.tbs_certificate.subject_pki.raw != csr.spki.as_slice() {
            return Err(SignError::UnsupportedCsrKey);
        }
        Ok(self.chain_with(leaf.der().clone()))
    }

    /// The identity a PEM CSR asks for: its only SAN, a URI that is a SPIFFE ID. The CSR's
    /// signature is verified. For servers that decide whether the caller may hold the identity
    /// before calling [`CaSigner::sign_csr`].
    ///
    /// # Errors
    ///
    /// [`SignError::CsrPem`], [`SignError::MalformedCsr`], [`SignError::CsrSignature`],
    /// [`SignError::CsrSanCount`], [`SignError::CsrSanNotUri`] or
    /// [`SignError::CsrUriNotSpiffeId`].
    pub fn csr_spiffe_id(csr_pem: &str) -> Result<SpiffeId, SignError> {
        Csr::parse(csr_pem)?.spiffe_id()
    }

    /// Checks what every signature for a workload requires and returns the leaf's end of
    /// validity.
    fn check_request(
        &self,
        id: &SpiffeId,
        validity: Duration,
        now: OffsetDateTime,
    ) -> Result<OffsetDateTime, SignError> {
        if id.trust_domain_str() != self.trust_domain.as_str() {
            return Err(SignError::ForeignTrustDomain {
                id: id.clone(),
                trust_domain: self.trust_domain.clone(),
            });
        }
        if !id.has_path() {
            return Err(SignError::NoPath(id.clone()));
        }
        if validity.is_zero() {
            return Err(SignError::ZeroValidity);
        }
        self.check_not_expired(now)?;
        Ok(add(now, validity.min(self.max_validity)).min(self.not_after))
    }

    fn check_not_expired(&self, now: OffsetDateTime) -> Result<(), SignError> {
        if now >= self.not_after {
            return Err(SignError::CaExpired {
                not_after: self.not_after.into(),
            });
        }
        Ok(())
    }

    /// The leaf followed by every certificate of the CA chain except the root.
    fn chain_with(&self, leaf: CertificateDer<'static>) -> Vec<CertificateDer<'static>> {
        let mut chain = vec![leaf];
        chain.extend(self.chain[..self.chain.len() - 1].iter().cloned());
        chain
    }

    /// Checks a CA chain and its key and builds the signer. `probe` signs and verifies a
    /// throwaway leaf, for CAs that were not made here.
    fn assemble(
        trust_domain: TrustDomain,
        chain: Vec<CertificateDer<'static>>,
        key: KeyPair,
        probe: bool,
    ) -> Result<Self, CaLoadError> {
        let now = OffsetDateTime::now_utc();
        let mut not_after = None::<OffsetDateTime>;
        for (index, der) in chain.iter().enumerate() {
            let cert = parse_cert(der, index)?;
            let validity = cert.validity();
            let (from, to) = (
                validity.not_before.to_datetime(),
                validity.not_after.to_datetime(),
            );
            if now < from || now > to {
                return Err(CaLoadError::NotValidNow {
                    index,
                    not_before: from.into(),
                    not_after: to.into(),
                });
            }
            not_after = Some(not_after.map_or(to, |t| t.min(to)));
        }
        let (Some(first), Some(not_after)) = (chain.first(), not_after) else {
            return Err(CaLoadError::CertPem(SvidError::EmptyChain));
        };
        let subject = check_ca_cert(first, &trust_domain, &key)?;
        let issuer = Issuer::from_ca_cert_der(first, key).map_err(CaLoadError::UnusableCa)?;
        let root = chain.last().cloned().into_iter().collect();
        let bundle =
            TrustBundle::from_der(trust_domain.clone(), root).map_err(CaLoadError::Root)?;
        let signer = Self {
            trust_domain,
            issuer,
            chain,
            bundle,
            not_after,
            max_validity: DEFAULT_MAX_VALIDITY,
        };
        if probe {
            signer.probe(&subject)?;
        }
        Ok(signer)
    }

    /// Signs a throwaway leaf and verifies it as a peer would, so that a CA that cannot issue
    /// usable certificates is refused at start rather than at its first request.
    fn probe(&self, subject: &[u8]) -> Result<(), CaLoadError> {
        let id = self
            .trust_domain
            .id_with_path("/meshkit-ca-self-test")
            .expect("a fixed valid path under a valid trust domain");
        let params = Self::leaf_params(&id, Duration::from_secs(300));
        let (chain, _key) = self.sign_params(&params).map_err(CaLoadError::Sign)?;
        let issuer_matches = X509Certificate::from_der(chain[0].as_ref())
            .is_ok_and(|(_, leaf)| leaf.tbs_certificate.issuer.as_raw() == subject);
        if !issuer_matches {
            return Err(CaLoadError::IssuerName);
        }
        SpiffeVerifier::new(self.bundle_set(), Authorize::AnyTrusted)
            .verify(&chain, PeerRole::Client, UnixTime::now())
            .map_err(CaLoadError::ChainInvalid)?;
        Ok(())
    }
}

impl fmt::Debug for CaSigner {
    /// Names the CA; never shows the key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CaSigner")
            .field("trust_domain", &self.trust_domain)
            .field("chain_len", &self.chain.len())
            .field("not_after", &rfc3339(&self.not_after.into()))
            .field("max_validity", &self.max_validity)
            .finish_non_exhaustive()
    }
}

/// A parsed, signature-checked CSR.
struct Csr {
    params: CertificateSigningRequestParams,
    /// The SubjectPublicKeyInfo as the CSR encodes it.
    spki: Vec<u8>,
}

impl Csr {
    fn parse(pem: &str) -> Result<Self, SignError> {
        let der = CertificateSigningRequestDer::from_pem_slice(pem.as_bytes())
            .map_err(SignError::CsrPem)?;
        // rcgen parses the CSR and verifies its self-signature.
        let params = CertificateSigningRequestParams::from_der(&der).map_err(|e| match e {
            rcgen::Error::InvalidCertificationRequestSignature => SignError::CsrSignature,
            other => SignError::MalformedCsr(other),
        })?;
        let (_, request) = X509CertificationRequest::from_der(&der).map_err(|_| {
            SignError::MalformedCsr(rcgen::Error::CouldNotParseCertificationRequest)
        })?;
        let spki = request.certification_request_info.subject_pki.raw.to_vec();
        Ok(Self { params, spki })
    }

    fn spiffe_id(&self) -> Result<SpiffeId, SignError> {
        match self.params.params.subject_alt_names.as_slice() {
            [SanType::URI(uri)] => {
                SpiffeId::new(uri.as_str()).map_err(|source| SignError::CsrUriNotSpiffeId {
                    uri: uri.as_str().to_owned(),
                    source,
                })
            }
            [_] => Err(SignError::CsrSanNotUri),
            sans => Err(SignError::CsrSanCount { count: sans.len() }),
        }
    }
}

fn new_key() -> Result<KeyPair, rcgen::Error> {
    KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
}

/// 128 random bits, positive and non-zero as RFC 5280 requires.
fn random_serial() -> Option<SerialNumber> {
    let mut bytes = [0u8; 16];
    crate::default_provider()
        .secure_random
        .fill(&mut bytes)
        .ok()?;
    bytes[0] &= 0x7f;
    if bytes[0] == 0 {
        bytes[0] = 1;
    }
    Some(SerialNumber::from_slice(&bytes))
}

/// `now + d`, saturating at the last date X.509 can express.
fn add(now: OffsetDateTime, d: Duration) -> OffsetDateTime {
    let last = rcgen::date_time_ymd(9999, 12, 31);
    time::Duration::try_from(d)
        .ok()
        .and_then(|d| now.checked_add(d))
        .map_or(last, |t| t.min(last))
}

fn leaf_template(
    id: &SpiffeId,
    now: OffsetDateTime,
    not_after: OffsetDateTime,
) -> CertificateParams {
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
    params.use_authority_key_identifier_extension = true;
    params.not_before = now - BACKDATE;
    params.not_after = not_after;
    params
}

fn ca_params(
    trust_domain: &TrustDomain,
    role: &str,
    now: OffsetDateTime,
    not_after: OffsetDateTime,
) -> Result<CertificateParams, CaLoadError> {
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, format!("{trust_domain} {role}"));
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
    params.use_authority_key_identifier_extension = true;
    params.serial_number = Some(random_serial().ok_or(CaLoadError::Sign(SignError::Random))?);
    params.not_before = now - BACKDATE;
    params.not_after = not_after;
    Ok(params)
}

fn parse_cert<'a>(
    der: &'a CertificateDer<'_>,
    index: usize,
) -> Result<X509Certificate<'a>, CaLoadError> {
    match X509Certificate::from_der(der) {
        Ok(([], cert)) => Ok(cert),
        Ok(_) => Err(CaLoadError::MalformedCert {
            index,
            reason: "trailing bytes after the certificate".into(),
        }),
        Err(e) => Err(CaLoadError::MalformedCert {
            index,
            reason: e.to_string(),
        }),
    }
}

/// The checks on the signing certificate itself; returns its raw subject name.
fn check_ca_cert(
    der: &CertificateDer<'_>,
    trust_domain: &TrustDomain,
    key: &KeyPair,
) -> Result<Vec<u8>, CaLoadError> {
    let cert = parse_cert(der, 0)?;
    let malformed = |e: x509_parser::error::X509Error| CaLoadError::MalformedCert {
        index: 0,
        reason: e.to_string(),
    };
    match cert.basic_constraints().map_err(malformed)? {
        Some(bc) if bc.value.ca => {}
        _ => return Err(CaLoadError::NotCa),
    }
    match cert.key_usage().map_err(malformed)? {
        Some(ku) if ku.value.key_cert_sign() => {}
        _ => return Err(CaLoadError::NoKeyCertSign),
    }
    if let Some(san) = cert.subject_alternative_name().map_err(malformed)? {
        for name in &san.value.general_names {
            if let GeneralName::URI(uri) = name
                && let Ok(found) = SpiffeId::new(uri)
                && found.trust_domain_str() != trust_domain.as_str()
            {
                return Err(CaLoadError::TrustDomainMismatch {
                    expected: trust_domain.clone(),
                    found,
                });
            }
        }
    }
    if key.subject_public_key_info() != cert.tbs_certificate.subject_pki.raw {
        return Err(CaLoadError::KeyMismatch);
    }
    Ok(cert.tbs_certificate.subject.as_raw().to_vec())
}
