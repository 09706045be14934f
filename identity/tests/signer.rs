//! The production CA signer: generated and loaded roots and intermediates, CSR checks, the leaf
//! template, validity caps, the CA files on disk, and parsers that never panic.

use std::error::Error as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use meshkit_identity::{
    Authorize, CaLoadError, CaSigner, DEFAULT_MAX_VALIDITY, PeerRole, SignError, SpiffeId,
    SpiffeVerifier, TrustBundle, TrustDomain, VerifyError, generate_csr, parse_leaf,
};
use proptest::prelude::*;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose, SanType};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, CertificateSigningRequestDer, UnixTime};
use x509_parser::prelude::{FromDer, X509Certificate};

const WEB: &str = "spiffe://a.test/ns/shop/sa/web";
const HOUR: Duration = Duration::from_secs(3600);

fn td(s: &str) -> TrustDomain {
    TrustDomain::new(s).unwrap()
}

fn id(s: &str) -> SpiffeId {
    s.parse().unwrap()
}

fn ca() -> CaSigner {
    CaSigner::generate(td("a.test")).unwrap()
}

fn csr(for_id: &str) -> String {
    generate_csr(&id(for_id)).unwrap().0
}

fn verify(bundles: impl Into<meshkit_identity::TrustBundleSet>, chain: &[CertificateDer<'_>]) {
    let verifier = SpiffeVerifier::new(bundles.into(), Authorize::AnyTrusted);
    verifier
        .verify(chain, PeerRole::Client, UnixTime::now())
        .unwrap();
    verifier
        .verify(chain, PeerRole::Server, UnixTime::now())
        .unwrap();
}

fn secs_between(later: SystemTime, earlier: SystemTime) -> i64 {
    match later.duration_since(earlier) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    }
}

/// A CSR in PEM from DER, for hand-made and tampered requests.
fn csr_pem(der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    format!("-----BEGIN CERTIFICATE REQUEST-----\n{b64}\n-----END CERTIFICATE REQUEST-----\n")
}

/// A CSR with these SANs, signed by a fresh key of `alg`.
fn csr_with(sans: Vec<SanType>, alg: &'static rcgen::SignatureAlgorithm) -> String {
    let key = KeyPair::generate_for(alg).unwrap();
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.subject_alt_names = sans;
    params.serialize_request(&key).unwrap().pem().unwrap()
}

fn uri(s: &str) -> SanType {
    SanType::URI(s.try_into().unwrap())
}

/// A self-signed CA made outside `CaSigner`, in PEM: certificate and key.
fn foreign_ca(edit: impl FnOnce(&mut CertificateParams)) -> (String, String) {
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, "hand-made CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - Duration::from_secs(60);
    params.not_after = now + Duration::from_secs(10 * 24 * 3600);
    edit(&mut params);
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// A fresh folder under the system temp folder, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "meshkit-signer-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

const OPENSSL_ROOT: &str = include_str!("data/openssl-root.pem");
const OPENSSL_ROOT_SEC1_KEY: &str = include_str!("data/openssl-root.sec1.key");
const OPENSSL_INTERMEDIATE_CHAIN: &str = include_str!("data/openssl-intermediate-chain.pem");
const OPENSSL_INTERMEDIATE_KEY: &str = include_str!("data/openssl-intermediate.key");
const OPENSSL_REPEATED_OU: &str = include_str!("data/openssl-repeated-ou.pem");
const OPENSSL_REPEATED_OU_KEY: &str = include_str!("data/openssl-repeated-ou.key");

// === signing ===

#[test]
fn a_signed_csr_verifies_against_the_bundle_set() {
    let ca = ca();
    let chain = ca.sign_csr(&csr(WEB), &id(WEB), HOUR).unwrap();
    assert_eq!(chain.len(), 1, "a root CA's chain is the leaf alone");
    verify(ca.bundle_set(), &chain);
    assert_eq!(
        SpiffeVerifier::new(ca.bundle_set(), Authorize::Exact(id(WEB)))
            .verify(&chain, PeerRole::Client, UnixTime::now())
            .unwrap(),
        id(WEB)
    );
}

#[test]
fn the_leaf_follows_the_x509_svid_template() {
    let ca = ca();
    let request = csr(WEB);
    let before = SystemTime::now();
    let chain = ca.sign_csr(&request, &id(WEB), HOUR).unwrap();
    let after = SystemTime::now();
    let info = parse_leaf(&chain[0]).unwrap();
    assert_eq!(info.id, id(WEB));
    // Backdated a minute from the moment of signing, which lies between `before` and `after`
    // however slow the machine (whole seconds in X.509: rounded down).
    let backdated = Duration::from_secs(60);
    assert!(
        info.not_before + backdated + Duration::from_secs(1) > before
            && info.not_before + backdated <= after,
        "not_before {:?} is not a minute before signing ({before:?}..{after:?})",
        info.not_before
    );
    // Valid for the hour asked, counted from the signing moment.
    assert_eq!(secs_between(info.not_after, info.not_before), 3600 + 60);

    let (_, cert) = X509Certificate::from_der(&chain[0]).unwrap();
    assert!(cert.subject().as_raw().len() <= 2, "empty subject");
    let san = cert.subject_alternative_name().unwrap().unwrap();
    assert!(san.critical, "SAN is critical when the subject is empty");
    assert_eq!(san.value.general_names.len(), 1);
    assert!(!cert.basic_constraints().unwrap().unwrap().value.ca);
    let ku = cert.key_usage().unwrap().unwrap().value;
    assert!(ku.digital_signature() && ku.key_encipherment() && ku.key_agreement());
    assert!(!ku.key_cert_sign() && !ku.crl_sign());
    let eku = cert.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.server_auth && eku.client_auth);
    let (_, root) = X509Certificate::from_der(ca.root()).unwrap();
    assert_eq!(cert.issuer().as_raw(), root.subject().as_raw());

    // The same CSR signed twice gets two serial numbers.
    let csr = csr(WEB);
    let a = ca.sign_csr(&csr, &id(WEB), HOUR).unwrap();
    let b = ca.sign_csr(&csr, &id(WEB), HOUR).unwrap();
    let serial = |der: &CertificateDer<'_>| {
        X509Certificate::from_der(der)
            .unwrap()
            .1
            .raw_serial()
            .to_vec()
    };
    assert_ne!(serial(&a[0]), serial(&b[0]));
    assert!(serial(&a[0]).len() >= 15, "about 128 random bits");
}

#[test]
fn the_csr_asks_only_for_the_key_and_the_identity() {
    // A CSR asking to be a CA with keyCertSign gets the leaf template anyway.
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = CertificateParams::default();
    params.subject_alt_names = vec![uri(WEB)];
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
    let csr = params.serialize_request(&key).unwrap().pem().unwrap();
    let chain = ca().sign_csr(&csr, &id(WEB), HOUR).unwrap();
    parse_leaf(&chain[0]).expect("a valid X509-SVID leaf, not a CA");
}

#[test]
fn csrs_with_other_key_types_are_signed_with_their_own_key() {
    let ca = ca();
    for alg in [&rcgen::PKCS_ECDSA_P384_SHA384, &rcgen::PKCS_ED25519] {
        let chain = ca
            .sign_csr(&csr_with(vec![uri(WEB)], alg), &id(WEB), HOUR)
            .unwrap();
        verify(ca.bundle_set(), &chain);
    }
}

#[test]
fn the_csr_identity_is_read_for_the_caller_to_authorise() {
    assert_eq!(CaSigner::csr_spiffe_id(&csr(WEB)).unwrap(), id(WEB));
    assert!(matches!(
        CaSigner::csr_spiffe_id(&csr_with(
            vec![uri("https://a.test/x")],
            &rcgen::PKCS_ECDSA_P256_SHA256
        )),
        Err(SignError::CsrUriNotSpiffeId { .. })
    ));
}

#[test]
fn an_intermediate_signs_leaves_that_verify_against_the_root() {
    let root = ca();
    let intermediate = root.intermediate().unwrap();
    assert_eq!(intermediate.root(), root.root());
    assert_eq!(intermediate.chain().len(), 2);
    let chain = intermediate.sign_csr(&csr(WEB), &id(WEB), HOUR).unwrap();
    assert_eq!(chain.len(), 2, "leaf and intermediate, no root");
    assert_eq!(&chain[1], &intermediate.chain()[0]);
    verify(root.bundle_set(), &chain);
    verify(intermediate.bundle_set(), &chain);

    // Two levels down: leaf, lower, upper intermediate.
    let lower = intermediate.intermediate().unwrap();
    let chain = lower.sign_csr(&csr(WEB), &id(WEB), HOUR).unwrap();
    assert_eq!(chain.len(), 3);
    verify(root.bundle_set(), &chain);

    // Another root's bundle does not accept it.
    let err = SpiffeVerifier::new(ca().bundle_set(), Authorize::AnyTrusted)
        .verify(&chain, PeerRole::Client, UnixTime::now())
        .unwrap_err();
    assert!(matches!(err, VerifyError::UnknownIssuer(_)), "{err:?}");
}

#[test]
fn an_intermediate_written_and_loaded_again_signs_the_same_way() {
    let root = ca();
    let intermediate = root.intermediate().unwrap();
    let dir = TempDir::new();
    let (cert, key) = (dir.join("int.pem"), dir.join("int.key"));
    intermediate.save(&cert, &key).unwrap();
    let loaded = CaSigner::load(td("a.test"), &cert, &key).unwrap();
    assert_eq!(loaded.chain(), intermediate.chain());
    assert_eq!(loaded.root(), root.root());
    let chain = loaded.sign_csr(&csr(WEB), &id(WEB), HOUR).unwrap();
    verify(root.bundle_set(), &chain);
}

#[test]
fn issue_makes_a_valid_svid_of_the_trust_domain_only() {
    let ca = ca().intermediate().unwrap();
    let svid = ca.issue(&id(WEB), HOUR).unwrap();
    assert_eq!(svid.spiffe_id(), &id(WEB));
    assert_eq!(svid.chain().len(), 2);
    verify(ca.bundle_set(), svid.chain());
    assert!(matches!(
        ca.issue(&id("spiffe://b.test/ns/x/sa/y"), HOUR),
        Err(SignError::ForeignTrustDomain { .. })
    ));
}

// === refusals ===

#[test]
fn a_csr_for_another_identity_is_refused() {
    let err = ca()
        .sign_csr(&csr("spiffe://a.test/ns/shop/sa/db"), &id(WEB), HOUR)
        .unwrap_err();
    match err {
        SignError::CsrIdMismatch { requested, found } => {
            assert_eq!(requested, id(WEB));
            assert_eq!(found, id("spiffe://a.test/ns/shop/sa/db"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_identity_of_another_trust_domain_is_refused() {
    let other = "spiffe://b.test/ns/shop/sa/web";
    let err = ca().sign_csr(&csr(other), &id(other), HOUR).unwrap_err();
    assert!(
        matches!(&err, SignError::ForeignTrustDomain { id: i, trust_domain } if *i == id(other) && *trust_domain == td("a.test")),
        "{err:?}"
    );
}

#[test]
fn a_trust_domain_id_and_a_zero_validity_are_refused() {
    let ca = ca();
    let td_id = td("a.test").id();
    assert!(matches!(
        ca.sign_csr(&csr("spiffe://a.test"), &td_id, HOUR),
        Err(SignError::NoPath(_))
    ));
    assert!(matches!(
        ca.sign_csr(&csr(WEB), &id(WEB), Duration::ZERO),
        Err(SignError::ZeroValidity)
    ));
}

#[test]
fn a_csr_without_exactly_one_uri_san_is_refused() {
    let ca = ca();
    let p256 = &rcgen::PKCS_ECDSA_P256_SHA256;
    let two = csr_with(vec![uri(WEB), uri("spiffe://a.test/ns/shop/sa/db")], p256);
    assert!(matches!(
        ca.sign_csr(&two, &id(WEB), HOUR),
        Err(SignError::CsrSanCount { count: 2 })
    ));
    let uri_and_dns = csr_with(
        vec![uri(WEB), SanType::DnsName("web".try_into().unwrap())],
        p256,
    );
    assert!(matches!(
        ca.sign_csr(&uri_and_dns, &id(WEB), HOUR),
        Err(SignError::CsrSanCount { count: 2 })
    ));
    assert!(matches!(
        ca.sign_csr(&csr_with(vec![], p256), &id(WEB), HOUR),
        Err(SignError::CsrSanCount { count: 0 })
    ));
    let dns = csr_with(vec![SanType::DnsName("web".try_into().unwrap())], p256);
    assert!(matches!(
        ca.sign_csr(&dns, &id(WEB), HOUR),
        Err(SignError::CsrSanNotUri)
    ));
    let https = csr_with(vec![uri("https://a.test/ns/shop/sa/web")], p256);
    assert!(matches!(
        ca.sign_csr(&https, &id(WEB), HOUR),
        Err(SignError::CsrUriNotSpiffeId { .. })
    ));
}

#[test]
fn garbage_and_forged_csrs_are_refused() {
    let ca = ca();
    assert!(matches!(
        ca.sign_csr("not a CSR", &id(WEB), HOUR),
        Err(SignError::CsrPem(_))
    ));
    assert!(matches!(
        ca.sign_csr(&csr_pem(b"\x30\x03\x02\x01\x00"), &id(WEB), HOUR),
        Err(SignError::MalformedCsr(_))
    ));
    // A certificate is not a CSR.
    assert!(matches!(
        ca.sign_csr(&ca.root_pem(), &id(WEB), HOUR),
        Err(SignError::CsrPem(_))
    ));
    // A request whose signature was not made with its key: the sender does not hold the key.
    let der = CertificateSigningRequestDer::from_pem_slice(csr(WEB).as_bytes()).unwrap();
    let mut forged = der.to_vec();
    let last = forged.len() - 1;
    forged[last] ^= 0x01;
    assert!(matches!(
        ca.sign_csr(&csr_pem(&forged), &id(WEB), HOUR),
        Err(SignError::CsrSignature)
    ));
}

// === validity ===

#[test]
fn validity_is_capped_by_the_maximum() {
    let ca = ca();
    assert_eq!(ca.max_validity(), DEFAULT_MAX_VALIDITY);
    // What was granted: the leaf's lifetime less its one-minute backdating, read from the
    // certificate alone, so no wall-clock reading of this test enters.
    let granted = |chain: &[CertificateDer<'_>]| {
        let info = parse_leaf(&chain[0]).unwrap();
        secs_between(info.not_after, info.not_before) - 60
    };
    let month = Duration::from_secs(30 * 24 * 3600);
    let chain = ca.sign_csr(&csr(WEB), &id(WEB), month).unwrap();
    assert_eq!(granted(&chain), 86400, "default cap 24 h");

    let ca = ca.with_max_validity(HOUR);
    let chain = ca.sign_csr(&csr(WEB), &id(WEB), month).unwrap();
    assert_eq!(granted(&chain), 3600);
    // Less than the cap is granted as asked.
    let chain = ca
        .sign_csr(&csr(WEB), &id(WEB), Duration::from_secs(600))
        .unwrap();
    assert_eq!(granted(&chain), 600);
    // The intermediate keeps the cap.
    assert_eq!(ca.intermediate().unwrap().max_validity(), HOUR);
}

#[test]
fn a_leaf_never_outlives_the_ca() {
    let (cert, key) = foreign_ca(|p| p.not_after = time::OffsetDateTime::now_utc() + HOUR);
    let ca = CaSigner::from_pem(td("a.test"), &cert, &key)
        .unwrap()
        .with_max_validity(Duration::MAX);
    let chain = ca
        .sign_csr(&csr(WEB), &id(WEB), Duration::from_secs(365 * 24 * 3600))
        .unwrap();
    let leaf = parse_leaf(&chain[0]).unwrap();
    assert_eq!(leaf.not_after, ca.not_after());
    verify(ca.bundle_set(), &chain);

    // An intermediate under it expires with it too, and so do its leaves.
    let intermediate = ca.intermediate().unwrap();
    assert_eq!(intermediate.not_after(), ca.not_after());
    let svid = intermediate.issue(&id(WEB), Duration::MAX).unwrap();
    assert_eq!(svid.not_after(), ca.not_after());
}

#[test]
fn an_expired_or_not_yet_valid_ca_is_refused() {
    let now = time::OffsetDateTime::now_utc();
    let (cert, key) = foreign_ca(|p| {
        p.not_before = now - Duration::from_secs(7200);
        p.not_after = now - HOUR;
    });
    let err = CaSigner::from_pem(td("a.test"), &cert, &key).unwrap_err();
    assert!(
        matches!(err, CaLoadError::NotValidNow { index: 0, .. }),
        "{err:?}"
    );
    let (cert, key) = foreign_ca(|p| p.not_before = now + HOUR);
    let err = CaSigner::from_pem(td("a.test"), &cert, &key).unwrap_err();
    assert!(
        matches!(err, CaLoadError::NotValidNow { index: 0, .. }),
        "{err:?}"
    );
}

// === loading ===

#[test]
fn a_non_ca_certificate_is_refused() {
    let ca = ca();
    let (chain, key) = ca
        .sign_params(&CaSigner::leaf_params(&id(WEB), HOUR))
        .unwrap();
    let err = CaSigner::from_pem(
        td("a.test"),
        &meshkit_identity::certs_to_pem(&chain),
        &meshkit_identity::private_key_to_pem(&key),
    )
    .unwrap_err();
    assert!(matches!(err, CaLoadError::NotCa), "{err:?}");

    let (cert, key) = foreign_ca(|p| p.key_usages = vec![KeyUsagePurpose::DigitalSignature]);
    let err = CaSigner::from_pem(td("a.test"), &cert, &key).unwrap_err();
    assert!(matches!(err, CaLoadError::NoKeyCertSign), "{err:?}");
}

#[test]
fn a_key_that_is_not_the_certificates_is_refused() {
    let (cert, _) = foreign_ca(|_| {});
    let (_, other_key) = foreign_ca(|_| {});
    let err = CaSigner::from_pem(td("a.test"), &cert, &other_key).unwrap_err();
    assert!(matches!(err, CaLoadError::KeyMismatch), "{err:?}");

    // A chain in the wrong order (root first) pairs the intermediate's key with the root.
    let certs: Vec<_> = OPENSSL_INTERMEDIATE_CHAIN
        .split_inclusive("-----END CERTIFICATE-----\n")
        .collect();
    let reversed = format!("{}{}", certs[1], certs[0]);
    let err =
        CaSigner::from_pem(td("openssl.test"), &reversed, OPENSSL_INTERMEDIATE_KEY).unwrap_err();
    assert!(matches!(err, CaLoadError::KeyMismatch), "{err:?}");
}

#[test]
fn unreadable_pem_is_refused() {
    let (cert, key) = foreign_ca(|_| {});
    assert!(matches!(
        CaSigner::from_pem(td("a.test"), "", &key),
        Err(CaLoadError::CertPem(_))
    ));
    assert!(matches!(
        CaSigner::from_pem(td("a.test"), &cert, "no key here"),
        Err(CaLoadError::KeyPem(_))
    ));
    let not_a_key = "-----BEGIN PRIVATE KEY-----\nMAMCAQA=\n-----END PRIVATE KEY-----\n";
    assert!(matches!(
        CaSigner::from_pem(td("a.test"), &cert, not_a_key),
        Err(CaLoadError::UnsupportedKey(_))
    ));
}

#[test]
fn an_openssl_root_with_a_sec1_key_signs() {
    let ca = CaSigner::from_pem(td("openssl.test"), OPENSSL_ROOT, OPENSSL_ROOT_SEC1_KEY).unwrap();
    let id = id("spiffe://openssl.test/ns/shop/sa/web");
    let chain = ca
        .sign_csr(&generate_csr(&id).unwrap().0, &id, HOUR)
        .unwrap();
    assert_eq!(chain.len(), 1);
    verify(
        TrustBundle::from_pem(td("openssl.test"), OPENSSL_ROOT).unwrap(),
        &chain,
    );
}

#[test]
fn an_openssl_intermediate_with_its_chain_signs_under_the_root() {
    let ca = CaSigner::from_pem(
        td("openssl.test"),
        OPENSSL_INTERMEDIATE_CHAIN,
        OPENSSL_INTERMEDIATE_KEY,
    )
    .unwrap();
    let root = TrustBundle::from_pem(td("openssl.test"), OPENSSL_ROOT).unwrap();
    assert_eq!(
        ca.root(),
        &root.roots()[0],
        "the root is the chain's last certificate"
    );
    assert_eq!(ca.root_pem().trim(), OPENSSL_ROOT.trim());
    let id = id("spiffe://openssl.test/ns/shop/sa/web");
    let chain = ca
        .sign_csr(&generate_csr(&id).unwrap().0, &id, HOUR)
        .unwrap();
    assert_eq!(chain.len(), 2, "leaf and intermediate, no root");
    verify(root, &chain);
}

#[test]
fn the_intermediate_alone_is_its_own_root() {
    let first = OPENSSL_INTERMEDIATE_CHAIN
        .split_inclusive("-----END CERTIFICATE-----\n")
        .next()
        .unwrap();
    let ca = CaSigner::from_pem(td("openssl.test"), first, OPENSSL_INTERMEDIATE_KEY).unwrap();
    assert_eq!(ca.root(), &ca.chain()[0]);
    let id = id("spiffe://openssl.test/ns/shop/sa/web");
    let chain = ca
        .sign_csr(&generate_csr(&id).unwrap().0, &id, HOUR)
        .unwrap();
    assert_eq!(chain.len(), 1);
    verify(ca.bundle_set(), &chain);
}

#[test]
fn a_chain_that_does_not_lead_to_its_root_is_refused() {
    // The intermediate followed by an unrelated root.
    let first = OPENSSL_INTERMEDIATE_CHAIN
        .split_inclusive("-----END CERTIFICATE-----\n")
        .next()
        .unwrap();
    let (other_root, _) = foreign_ca(|_| {});
    let err = CaSigner::from_pem(
        td("openssl.test"),
        &format!("{first}{other_root}"),
        OPENSSL_INTERMEDIATE_KEY,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            CaLoadError::ChainInvalid(VerifyError::UnknownIssuer(_))
        ),
        "{err:?}"
    );
}

#[test]
fn a_ca_of_another_trust_domain_is_refused() {
    let err =
        CaSigner::from_pem(td("other.test"), OPENSSL_ROOT, OPENSSL_ROOT_SEC1_KEY).unwrap_err();
    match err {
        CaLoadError::TrustDomainMismatch { expected, found } => {
            assert_eq!(expected, td("other.test"));
            assert_eq!(found, id("spiffe://openssl.test"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_ca_name_rcgen_cannot_reproduce_is_refused_at_load() {
    let err = CaSigner::from_pem(
        td("openssl.test"),
        OPENSSL_REPEATED_OU,
        OPENSSL_REPEATED_OU_KEY,
    )
    .unwrap_err();
    assert!(matches!(err, CaLoadError::IssuerName), "{err:?}");
}

// === files ===

#[test]
fn load_or_generate_writes_the_files_once_then_loads_them() {
    let dir = TempDir::new();
    let (cert, key) = (dir.join("ca/root.pem"), dir.join("ca/root.key"));
    let first = CaSigner::load_or_generate(td("a.test"), &cert, &key).unwrap();
    assert_eq!(mode(&key), 0o600);
    assert_eq!(mode(&cert), 0o644);
    assert_eq!(mode(&dir.join("ca")), 0o700);
    let names: Vec<_> = std::fs::read_dir(dir.join("ca"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "no temporary file left: {names:?}");
    assert_eq!(std::fs::read_to_string(&cert).unwrap(), first.root_pem());
    assert!(
        std::fs::read_to_string(&key)
            .unwrap()
            .starts_with("-----BEGIN PRIVATE KEY-----")
    );

    let second = CaSigner::load_or_generate(td("a.test"), &cert, &key).unwrap();
    assert_eq!(second.root(), first.root());
    let chain = second.sign_csr(&csr(WEB), &id(WEB), HOUR).unwrap();
    verify(first.bundle_set(), &chain);
}

#[test]
fn one_ca_file_without_the_other_is_refused_by_name() {
    let dir = TempDir::new();
    let (cert, key) = (dir.join("root.pem"), dir.join("root.key"));
    ca().save(&cert, &key).unwrap();

    std::fs::remove_file(&key).unwrap();
    let err = CaSigner::load_or_generate(td("a.test"), &cert, &key).unwrap_err();
    match &err {
        CaLoadError::OnlyOneFile { present, missing } => {
            assert_eq!((present, missing), (&cert, &key));
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains(&*key.to_string_lossy()), "{err}");
    assert!(cert.exists() && !key.exists(), "nothing written");

    std::fs::rename(&cert, &key).unwrap();
    let err = CaSigner::load_or_generate(td("a.test"), &cert, &key).unwrap_err();
    assert!(
        matches!(&err, CaLoadError::OnlyOneFile { present, missing } if *present == key && *missing == cert),
        "{err:?}"
    );
}

#[test]
fn load_errors_name_the_files() {
    let dir = TempDir::new();
    let (cert, key) = (dir.join("root.pem"), dir.join("root.key"));
    let err = CaSigner::load(td("a.test"), &cert, &key).unwrap_err();
    assert!(
        matches!(&err, CaLoadError::Read { path, .. } if *path == cert),
        "{err:?}"
    );

    let (cert_pem, _) = foreign_ca(|_| {});
    let (_, other_key) = foreign_ca(|_| {});
    std::fs::write(&cert, cert_pem).unwrap();
    std::fs::write(&key, other_key).unwrap();
    let err = CaSigner::load(td("a.test"), &cert, &key).unwrap_err();
    let CaLoadError::Files {
        cert: c,
        key: k,
        source,
    } = &err
    else {
        panic!("{err:?}");
    };
    assert_eq!((c, k), (&cert, &key));
    assert!(matches!(**source, CaLoadError::KeyMismatch));
    // Display says this level only; the reason is the source.
    let shown = err.to_string();
    assert!(shown.contains(&*cert.to_string_lossy()) && shown.contains(&*key.to_string_lossy()));
    assert!(!shown.contains(&source.to_string()), "{shown}");
    assert_eq!(err.source().unwrap().to_string(), source.to_string());
}

#[test]
fn a_key_readable_by_others_still_loads() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = TempDir::new();
    let (cert, key) = (dir.join("root.pem"), dir.join("root.key"));
    let ca = ca();
    ca.save(&cert, &key).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    // A warning is logged; loading goes on.
    assert_eq!(
        CaSigner::load(td("a.test"), &cert, &key).unwrap().root(),
        ca.root()
    );
}

// === hygiene ===

#[test]
fn debug_never_shows_the_key() {
    let dir = TempDir::new();
    let (cert, key) = (dir.join("root.pem"), dir.join("root.key"));
    let ca = ca();
    ca.save(&cert, &key).unwrap();
    let key_pem = std::fs::read_to_string(&key).unwrap();
    let shown = format!("{ca:?}");
    assert!(shown.contains("a.test"), "{shown}");
    for line in key_pem.lines().filter(|l| !l.starts_with("-----")) {
        assert!(!shown.contains(line), "{shown}");
    }
    assert!(!shown.contains("PRIVATE"));
}

#[test]
fn public_types_are_send_and_sync() {
    fn check<T: Send + Sync + 'static>() {}
    check::<CaSigner>();
    check::<CaLoadError>();
    check::<SignError>();
}

#[test]
fn errors_display_one_level() {
    let err = CaSigner::from_pem(td("a.test"), "", "").unwrap_err();
    let source = err.source().expect("a source");
    assert!(!err.to_string().contains(&source.to_string()), "{err}");

    let err = ca().sign_csr("junk", &id(WEB), HOUR).unwrap_err();
    let source = err.source().expect("a source");
    assert!(!err.to_string().contains(&source.to_string()), "{err}");
}

// === never panics ===

fn pem_of(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    format!("-----BEGIN {label}-----\n{b64}\n-----END {label}-----\n")
}

/// One CA for every property case: key generation would dominate otherwise.
fn shared_ca() -> &'static CaSigner {
    static CA: std::sync::OnceLock<CaSigner> = std::sync::OnceLock::new();
    CA.get_or_init(ca)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn from_pem_never_panics(cert in ".{0,300}", key in ".{0,300}") {
        let _ = CaSigner::from_pem(td("a.test"), &cert, &key);
    }

    #[test]
    fn from_pem_never_panics_on_arbitrary_der(
        cert in proptest::collection::vec(any::<u8>(), 0..400),
        key in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let _ = CaSigner::from_pem(
            td("a.test"),
            &pem_of("CERTIFICATE", &cert),
            &pem_of("PRIVATE KEY", &key),
        );
        let _ = CaSigner::from_pem(td("a.test"), OPENSSL_ROOT, &pem_of("EC PRIVATE KEY", &key));
    }

    #[test]
    fn sign_csr_never_panics(csr in ".{0,400}") {
        let _ = shared_ca().sign_csr(&csr, &id(WEB), HOUR);
    }

    #[test]
    fn sign_csr_never_panics_on_arbitrary_der(der in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = shared_ca().sign_csr(&csr_pem(&der), &id(WEB), HOUR);
    }

    #[test]
    fn sign_csr_never_panics_on_a_mutated_csr(index in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let mut der = CertificateSigningRequestDer::from_pem_slice(csr(WEB).as_bytes()).unwrap().to_vec();
        let i = index.index(der.len());
        der[i] = byte;
        let _ = shared_ca().sign_csr(&csr_pem(&der), &id(WEB), HOUR);
    }
}
