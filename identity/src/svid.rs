//! X.509-SVIDs: a workload's own certificate chain and private key, and the leaf rules of the
//! X509-SVID standard that every SVID, ours or a peer's, must satisfy.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

use crate::spiffe::{SpiffeId, SpiffeIdError};

/// Why a certificate chain or key is not a valid X.509-SVID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SvidError {
    /// The chain holds no certificate.
    #[error("certificate chain is empty")]
    EmptyChain,
    /// PEM input could not be read.
    #[error("invalid PEM: {0}")]
    Pem(String),
    /// A certificate is not well-formed DER X.509, or has duplicate extensions.
    #[error("malformed certificate: {0}")]
    Malformed(String),
    /// The leaf has no URI subject alternative name.
    #[error("leaf certificate has no URI SAN")]
    NoUriSan,
    /// The leaf has more than one URI subject alternative name.
    #[error("leaf certificate has {count} URI SANs; an X509-SVID has exactly one")]
    MultipleUriSans {
        /// How many URI SANs were found.
        count: usize,
    },
    /// The leaf's URI SAN is not a SPIFFE ID.
    #[error("leaf URI SAN {uri:?} is not a SPIFFE ID")]
    InvalidSpiffeId {
        /// The URI as found in the certificate.
        uri: String,
        /// What is wrong with it.
        #[source]
        source: SpiffeIdError,
    },
    /// The leaf's SPIFFE ID names a trust domain, not a workload (it has no path).
    #[error("leaf SPIFFE ID {0} has no path; it names a trust domain, not a workload")]
    NoPath(SpiffeId),
    /// The leaf's basic constraints say it is a CA.
    #[error("leaf certificate is a CA (basicConstraints cA=true)")]
    LeafIsCa,
    /// The leaf's key usage lacks `digitalSignature` (or the extension is absent).
    #[error("leaf certificate key usage lacks digitalSignature")]
    NoDigitalSignature,
    /// The leaf's key usage includes `keyCertSign`.
    #[error("leaf certificate key usage includes keyCertSign")]
    KeyCertSign,
    /// The leaf's key usage includes `cRLSign`.
    #[error("leaf certificate key usage includes cRLSign")]
    CrlSign,
    /// The private key is unsupported or does not match the leaf's public key.
    #[error("private key unusable with the leaf certificate: {0}")]
    Key(String),
}

/// What the leaf rules establish about a certificate: its ID and validity window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafInfo {
    /// The SPIFFE ID in the one URI SAN.
    pub id: SpiffeId,
    /// Start of the validity period.
    pub not_before: SystemTime,
    /// End of the validity period.
    pub not_after: SystemTime,
}

/// Checks every X509-SVID leaf rule on a DER certificate and returns its SPIFFE ID and validity.
///
/// The rules: exactly one URI SAN, which is a SPIFFE ID with a path; not a CA; key usage
/// present with `digitalSignature` and without `keyCertSign` or `cRLSign`. Signatures and
/// validity are not checked here (see [`SpiffeVerifier`](crate::SpiffeVerifier)).
///
/// The last leaves accepted on the calling thread are remembered by their exact bytes, and a
/// leaf met again is answered without parsing it again: a handshake parses the peer's leaf in
/// the verifier, and again moments later, usually on the same thread, when the connection
/// asks for its peer's ID ([`peer_spiffe_id`](crate::peer_spiffe_id)). A leaf not found there
/// (another thread, or pushed out by other leaves) is parsed in full: the answer is the same.
///
/// # Errors
///
/// The [`SvidError`] for the first rule broken.
pub fn parse_leaf(der: &[u8]) -> Result<LeafInfo, SvidError> {
    // `try_with`: in a thread's own teardown, where its locals may be gone, the leaf is
    // parsed in full.
    if let Ok(Some(info)) = RECENT.try_with(|recent| recent.borrow().get(der)) {
        return Ok(info);
    }
    let info = parse_leaf_in_full(der)?;
    if der.len() <= MAX_REMEMBERED_LEAF {
        let _ = RECENT.try_with(|recent| recent.borrow_mut().put(der, &info));
    }
    Ok(info)
}

/// Leaves remembered per thread by [`parse_leaf`]: the two ends of a connection that one
/// thread drives (a client and a server in one process) each find theirs.
const REMEMBERED_LEAVES: usize = 2;

/// The longest leaf [`parse_leaf`] remembers: an SVID is well under 2 KiB, and a thread holds
/// no more than [`REMEMBERED_LEAVES`] times this for a peer that sends a large certificate.
const MAX_REMEMBERED_LEAF: usize = 4096;

thread_local! {
    static RECENT: std::cell::RefCell<RecentLeaves> = const {
        std::cell::RefCell::new(RecentLeaves { leaves: [None, None], next: 0 })
    };
}

/// The leaves [`parse_leaf`] accepted last on one thread, each with what it found.
struct RecentLeaves {
    leaves: [Option<(Box<[u8]>, LeafInfo)>; REMEMBERED_LEAVES],
    /// The slot the next leaf replaces.
    next: usize,
}

impl RecentLeaves {
    fn get(&self, der: &[u8]) -> Option<LeafInfo> {
        self.leaves
            .iter()
            .flatten()
            .find(|(seen, _)| **seen == *der)
            .map(|(_, info)| info.clone())
    }

    fn put(&mut self, der: &[u8], info: &LeafInfo) {
        self.leaves[self.next] = Some((der.into(), info.clone()));
        self.next = (self.next + 1) % REMEMBERED_LEAVES;
    }
}

/// [`parse_leaf`] without the memory of recent leaves.
fn parse_leaf_in_full(der: &[u8]) -> Result<LeafInfo, SvidError> {
    let (rest, cert) =
        X509Certificate::from_der(der).map_err(|e| SvidError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(SvidError::Malformed(
            "trailing bytes after certificate".into(),
        ));
    }
    let malformed = |e: x509_parser::error::X509Error| SvidError::Malformed(e.to_string());

    let mut uris = Vec::new();
    if let Some(san) = cert.subject_alternative_name().map_err(malformed)? {
        for name in &san.value.general_names {
            if let GeneralName::URI(uri) = name {
                uris.push(*uri);
            }
        }
    }
    let uri = match uris.as_slice() {
        [] => return Err(SvidError::NoUriSan),
        [one] => *one,
        many => return Err(SvidError::MultipleUriSans { count: many.len() }),
    };
    let id = SpiffeId::new(uri).map_err(|source| SvidError::InvalidSpiffeId {
        uri: uri.to_owned(),
        source,
    })?;
    if !id.has_path() {
        return Err(SvidError::NoPath(id));
    }

    if let Some(bc) = cert.basic_constraints().map_err(malformed)?
        && bc.value.ca
    {
        return Err(SvidError::LeafIsCa);
    }
    let Some(ku) = cert.key_usage().map_err(malformed)? else {
        return Err(SvidError::NoDigitalSignature);
    };
    if !ku.value.digital_signature() {
        return Err(SvidError::NoDigitalSignature);
    }
    if ku.value.key_cert_sign() {
        return Err(SvidError::KeyCertSign);
    }
    if ku.value.crl_sign() {
        return Err(SvidError::CrlSign);
    }

    let validity = cert.validity();
    Ok(LeafInfo {
        id,
        not_before: to_system_time(validity.not_before.timestamp()),
        not_after: to_system_time(validity.not_after.timestamp()),
    })
}

fn to_system_time(unix: i64) -> SystemTime {
    if unix >= 0 {
        UNIX_EPOCH + Duration::from_secs(unix.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_secs(unix.unsigned_abs())
    }
}

/// A workload's own X.509-SVID: certificate chain (leaf first) and private key, checked
/// against the X509-SVID leaf rules and ready for rustls.
///
/// Cheap to clone.
#[derive(Clone)]
pub struct X509Svid {
    info: LeafInfo,
    key: Arc<CertifiedKey>,
}

// === impl X509Svid ===

impl X509Svid {
    /// Builds an SVID from DER, with the default crypto provider
    /// ([`default_provider`](crate::default_provider)).
    ///
    /// # Errors
    ///
    /// [`SvidError::EmptyChain`], a leaf rule broken, or [`SvidError::Key`] when the key is
    /// unsupported or does not belong to the leaf.
    pub fn from_der(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<Self, SvidError> {
        Self::from_der_with_provider(chain, key, &crate::default_provider())
    }

    /// Builds an SVID from DER, loading the key with the given crypto provider.
    ///
    /// # Errors
    ///
    /// As [`X509Svid::from_der`].
    pub fn from_der_with_provider(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        provider: &CryptoProvider,
    ) -> Result<Self, SvidError> {
        let leaf = chain.first().ok_or(SvidError::EmptyChain)?;
        let info = parse_leaf(leaf)?;
        let key = CertifiedKey::from_der(chain, key, provider)
            .map_err(|e| SvidError::Key(e.to_string()))?;
        Ok(Self {
            info,
            key: Arc::new(key),
        })
    }

    /// Builds an SVID from a PEM chain (leaf first) and a PEM private key (PKCS#8, SEC1 or
    /// PKCS#1).
    ///
    /// # Errors
    ///
    /// [`SvidError::Pem`] when either input cannot be read, otherwise as
    /// [`X509Svid::from_der`].
    pub fn from_pem(chain_pem: &str, key_pem: &str) -> Result<Self, SvidError> {
        Self::from_pem_with_provider(chain_pem, key_pem, &crate::default_provider())
    }

    /// As [`X509Svid::from_pem`], loading the key with the given crypto provider.
    ///
    /// # Errors
    ///
    /// As [`X509Svid::from_pem`].
    pub fn from_pem_with_provider(
        chain_pem: &str,
        key_pem: &str,
        provider: &CryptoProvider,
    ) -> Result<Self, SvidError> {
        let chain = certs_from_pem(chain_pem)?;
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|e| SvidError::Pem(format!("private key: {e}")))?;
        Self::from_der_with_provider(chain, key, provider)
    }

    /// The SPIFFE ID in the leaf.
    pub fn spiffe_id(&self) -> &SpiffeId {
        &self.info.id
    }

    /// The chain, leaf first.
    pub fn chain(&self) -> &[CertificateDer<'static>] {
        &self.key.cert
    }

    /// The leaf certificate.
    pub fn leaf(&self) -> &CertificateDer<'static> {
        &self.key.cert[0]
    }

    /// Start of the leaf's validity.
    pub fn not_before(&self) -> SystemTime {
        self.info.not_before
    }

    /// End of the leaf's validity.
    pub fn not_after(&self) -> SystemTime {
        self.info.not_after
    }

    /// The chain and signing key as rustls uses them.
    pub fn certified_key(&self) -> &Arc<CertifiedKey> {
        &self.key
    }
}

impl fmt::Debug for X509Svid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("X509Svid")
            .field("id", &self.info.id)
            .field("not_before", &self.info.not_before)
            .field("not_after", &self.info.not_after)
            .field("chain_len", &self.key.cert.len())
            .finish_non_exhaustive()
    }
}

/// Reads every `CERTIFICATE` block of a PEM string.
///
/// # Errors
///
/// [`SvidError::Pem`] on unreadable PEM, [`SvidError::EmptyChain`] when there is no certificate.
pub fn certs_from_pem(pem: &str) -> Result<Vec<CertificateDer<'static>>, SvidError> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| SvidError::Pem(format!("certificate: {e}")))?;
    if certs.is_empty() {
        return Err(SvidError::EmptyChain);
    }
    Ok(certs)
}

/// PEM encoding of DER certificates, one `CERTIFICATE` block each, in order.
pub fn certs_to_pem(certs: &[CertificateDer<'_>]) -> String {
    certs
        .iter()
        .map(|der| pem_block("CERTIFICATE", der))
        .collect()
}

/// PEM encoding of a private key, labelled by its format (`PRIVATE KEY` for PKCS#8,
/// `EC PRIVATE KEY` for SEC1, `RSA PRIVATE KEY` for PKCS#1).
pub fn private_key_to_pem(key: &PrivateKeyDer<'_>) -> String {
    let label = match key {
        PrivateKeyDer::Pkcs1(_) => "RSA PRIVATE KEY",
        PrivateKeyDer::Sec1(_) => "EC PRIVATE KEY",
        _ => "PRIVATE KEY",
    };
    pem_block(label, key.secret_der())
}

fn pem_block(label: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut pem = format!("-----BEGIN {label}-----\n");
    // Base64 output is ASCII, so every 64-byte chunk is a valid str.
    for line in b64.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(line).unwrap_or_default());
        pem.push('\n');
    }
    pem.push_str(&format!("-----END {label}-----\n"));
    pem
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use rcgen::{DnType, SanType};

    use super::*;
    use crate::test_util::TestCa;

    /// Leaves that pass the rules and leaves that break them (no URI, two URIs, an ID without
    /// a path), one of them longer than a remembered leaf may be.
    fn leaves() -> Vec<Vec<u8>> {
        let ca = TestCa::new("cluster.local".parse().unwrap());
        let sans: [Vec<SanType>; 6] = [
            vec![SanType::URI(
                "spiffe://cluster.local/ns/a/sa/web".try_into().unwrap(),
            )],
            vec![SanType::URI(
                "spiffe://cluster.local/ns/b/sa/db".try_into().unwrap(),
            )],
            vec![SanType::DnsName("web.example".try_into().unwrap())],
            vec![
                SanType::URI("spiffe://cluster.local/ns/a/sa/web".try_into().unwrap()),
                SanType::URI("spiffe://cluster.local/ns/b/sa/db".try_into().unwrap()),
            ],
            vec![SanType::URI("spiffe://cluster.local".try_into().unwrap())],
            std::iter::once(SanType::URI(
                "spiffe://cluster.local/ns/c/sa/big".try_into().unwrap(),
            ))
            .chain((0..400).map(|i| SanType::DnsName(format!("n{i}.example").try_into().unwrap())))
            .collect(),
        ];
        sans.into_iter()
            .map(|sans| {
                let mut params = TestCa::leaf_params(&"spiffe://cluster.local/x".parse().unwrap());
                params.distinguished_name.push(DnType::CommonName, "leaf");
                params.subject_alt_names = sans;
                ca.sign_params(&params).0.swap_remove(0).to_vec()
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Whatever leaves a thread parsed before, each answer is the full parse's.
        #[test]
        fn a_remembered_leaf_is_answered_as_the_full_parse_answers(
            order in proptest::collection::vec(0..6usize, 1..24),
        ) {
            let leaves = leaves();
            prop_assert!(leaves[5].len() > MAX_REMEMBERED_LEAF);
            for i in order {
                prop_assert_eq!(parse_leaf(&leaves[i]), parse_leaf_in_full(&leaves[i]));
            }
        }
    }
}
