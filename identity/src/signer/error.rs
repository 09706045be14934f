//! The errors of the CA signer: setting a CA up ([`CaLoadError`]) and signing ([`SignError`]).

use std::io;
use std::path::PathBuf;
use std::time::SystemTime;

use time::OffsetDateTime;

use crate::bundle::BundleError;
use crate::spiffe::{SpiffeId, SpiffeIdError, TrustDomain};
use crate::svid::SvidError;
use crate::verify::VerifyError;

/// Why a [`CaSigner`](super::CaSigner) could not be created, loaded or saved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaLoadError {
    /// A CA file could not be read (or its existence could not be checked).
    #[error("cannot read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A CA file could not be written.
    #[error("cannot write {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// Of the certificate and key files, only one exists; generating a new CA would orphan
    /// it, loading is impossible.
    #[error(
        "{} exists but {} does not: both CA files or neither are required",
        present.display(),
        missing.display()
    )]
    OnlyOneFile {
        /// The file that exists.
        present: PathBuf,
        /// The file that does not.
        missing: PathBuf,
    },
    /// The files were read but do not hold a usable CA; the source says why.
    #[error("CA files {} and {} are not a usable CA", cert.display(), key.display())]
    Files {
        /// The certificate (chain) file.
        cert: PathBuf,
        /// The private key file.
        key: PathBuf,
        /// What is wrong with their contents.
        #[source]
        source: Box<CaLoadError>,
    },
    /// The certificate PEM is unreadable or holds no certificate.
    #[error("invalid CA certificate PEM")]
    CertPem(#[source] SvidError),
    /// A certificate of the chain is not well-formed X.509.
    #[error("certificate {index} of the CA chain is malformed: {reason}")]
    MalformedCert {
        /// Position in the chain (0 is the signing CA's own certificate).
        index: usize,
        /// The parser's message.
        reason: String,
    },
    /// A certificate of the chain is not valid at this moment.
    #[error(
        "certificate {index} of the CA chain is valid from {} to {}, not now",
        rfc3339(.not_before),
        rfc3339(.not_after)
    )]
    NotValidNow {
        /// Position in the chain (0 is the signing CA's own certificate).
        index: usize,
        /// Start of its validity.
        not_before: SystemTime,
        /// End of its validity.
        not_after: SystemTime,
    },
    /// The signing certificate's basic constraints do not say `cA=true`.
    #[error("the CA certificate is not a certificate authority (basicConstraints cA=true)")]
    NotCa,
    /// The signing certificate's key usage is absent or lacks `keyCertSign`.
    #[error("the CA certificate's key usage does not include keyCertSign")]
    NoKeyCertSign,
    /// The signing certificate names a SPIFFE trust domain other than the one configured.
    #[error("the CA certificate belongs to {found}, not to trust domain {expected}")]
    TrustDomainMismatch {
        /// The trust domain the signer was asked to serve.
        expected: TrustDomain,
        /// The SPIFFE ID in the certificate's URI SAN.
        found: SpiffeId,
    },
    /// The key PEM is unreadable or holds no private key.
    #[error("invalid CA private key PEM")]
    KeyPem(#[source] rustls_pki_types::pem::Error),
    /// The private key is not one rcgen can sign with (PKCS#8 or SEC1 ECDSA P-256/P-384,
    /// PKCS#8 Ed25519 or RSA).
    #[error("unsupported CA private key")]
    UnsupportedKey(#[source] rcgen::Error),
    /// The private key does not belong to the signing certificate.
    #[error("the private key does not match the CA certificate's public key")]
    KeyMismatch,
    /// rcgen cannot take the signing certificate as an issuer.
    #[error("the CA certificate cannot be used as an issuer")]
    UnusableCa(#[source] rcgen::Error),
    /// A certificate signed by this CA would not carry the CA certificate's subject as its
    /// issuer name, byte for byte (rcgen re-encodes the name; a subject with a multi-valued RDN
    /// or a repeated attribute type, such as two OUs, does not survive), so no verifier could
    /// chain it.
    #[error("certificates signed by this CA would not name it exactly as its subject")]
    IssuerName,
    /// The chain does not lead from the signing certificate to the root (the last certificate),
    /// checked by verifying a certificate signed at load time.
    #[error("the CA chain does not verify up to its root")]
    ChainInvalid(#[source] VerifyError),
    /// The root (the chain's last certificate) cannot serve as a trust anchor.
    #[error("the CA's root cannot be a trust anchor")]
    Root(#[source] BundleError),
    /// Key or certificate generation failed.
    #[error("generating the CA key or certificate failed")]
    Generate(#[source] rcgen::Error),
    /// Signing with the CA failed while it was being set up.
    #[error("the CA cannot sign")]
    Sign(#[source] SignError),
}

/// Why a [`CaSigner`](super::CaSigner) refused or failed to sign.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SignError {
    /// The CSR PEM is unreadable or holds no `CERTIFICATE REQUEST`.
    #[error("invalid CSR PEM")]
    CsrPem(#[source] rustls_pki_types::pem::Error),
    /// The CSR is not a well-formed PKCS#10 request, or uses an extension or algorithm that is
    /// not supported.
    #[error("malformed or unsupported CSR")]
    MalformedCsr(#[source] rcgen::Error),
    /// The CSR's self-signature does not verify: its sender does not hold the private key.
    #[error("the CSR's signature does not verify")]
    CsrSignature,
    /// The CSR does not carry exactly one subject alternative name.
    #[error(
        "the CSR carries {count} subject alternative names; exactly one, a SPIFFE ID, is required"
    )]
    CsrSanCount {
        /// How many it carries.
        count: usize,
    },
    /// The CSR's one subject alternative name is not a URI.
    #[error("the CSR's subject alternative name is not a URI")]
    CsrSanNotUri,
    /// The CSR's URI SAN is not a SPIFFE ID.
    #[error("the CSR's URI SAN {uri:?} is not a SPIFFE ID")]
    CsrUriNotSpiffeId {
        /// The URI as found.
        uri: String,
        /// What is wrong with it.
        #[source]
        source: SpiffeIdError,
    },
    /// The CSR asks for another identity than the one the caller authorised.
    #[error("the CSR asks for {found}, not {requested}")]
    CsrIdMismatch {
        /// The identity the caller authorised.
        requested: SpiffeId,
        /// The identity in the CSR.
        found: SpiffeId,
    },
    /// The issued certificate would not carry the CSR's public key unchanged (a key type or
    /// curve that rcgen cannot re-encode from the CSR).
    #[error("the CSR's public key type is not supported")]
    UnsupportedCsrKey,
    /// The identity is not in this CA's trust domain.
    #[error("{id} is not in this CA's trust domain {trust_domain}")]
    ForeignTrustDomain {
        /// The identity asked for.
        id: SpiffeId,
        /// The CA's trust domain.
        trust_domain: TrustDomain,
    },
    /// The identity has no path: it names a trust domain, not a workload.
    #[error("{0} has no path; it names a trust domain, not a workload")]
    NoPath(SpiffeId),
    /// A validity of zero was asked for.
    #[error("a certificate validity of zero was asked for")]
    ZeroValidity,
    /// A certificate of the CA chain has expired.
    #[error("the CA chain expired at {}", rfc3339(.not_after))]
    CaExpired {
        /// End of validity of the first CA certificate of the chain to expire.
        not_after: SystemTime,
    },
    /// The system's random number generator failed (for the serial number).
    #[error("the random number generator failed")]
    Random,
    /// rcgen failed to generate the key or sign the certificate.
    #[error("signing the certificate failed")]
    Sign(#[source] rcgen::Error),
    /// The issued certificate and key are not a valid X509-SVID (for [`CaSigner::issue`](super::CaSigner::issue)).
    #[error("the issued certificate is not a valid X509-SVID")]
    InvalidSvid(#[source] SvidError),
}

/// `2026-01-31T12:00:00Z`.
pub(super) fn rfc3339(t: &SystemTime) -> String {
    let t = OffsetDateTime::from(*t);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}
