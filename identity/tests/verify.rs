//! Every X509-SVID and chain case the verifier must decide, each with its exact outcome.

use std::time::{Duration, SystemTime};

use meshkit_identity::test_util::TestCa;
use meshkit_identity::{
    Authorize, PeerRole, SpiffeId, SpiffeIdError, SpiffeVerifier, SvidError, TrustBundleSet,
    TrustDomain, VerifyError, X509Svid,
};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyUsagePurpose, SanType};
use rustls_pki_types::{CertificateDer, UnixTime};
use time::OffsetDateTime;

fn td(name: &str) -> TrustDomain {
    TrustDomain::new(name).unwrap()
}

fn id(s: &str) -> SpiffeId {
    s.parse().unwrap()
}

const WEB: &str = "spiffe://a.test/ns/shop/sa/web";

fn now() -> UnixTime {
    UnixTime::now()
}

/// A verifier trusting only `ca`, admitting any ID it can verify.
fn verifier(ca: &TestCa) -> SpiffeVerifier {
    SpiffeVerifier::new(ca.bundle_set(), Authorize::AnyTrusted)
}

fn chain_for(ca: &TestCa, params: &CertificateParams) -> Vec<CertificateDer<'static>> {
    ca.sign_params(params).0
}

fn leaf(ca: &TestCa, edit: impl FnOnce(&mut CertificateParams)) -> Vec<CertificateDer<'static>> {
    let mut params = TestCa::leaf_params(&id(WEB));
    edit(&mut params);
    chain_for(ca, &params)
}

fn uri(s: &str) -> SanType {
    SanType::URI(s.try_into().unwrap())
}

fn verify(v: &SpiffeVerifier, chain: &[CertificateDer<'_>]) -> Result<SpiffeId, VerifyError> {
    v.verify(chain, PeerRole::Client, now())
}

#[test]
fn valid_leaf_is_accepted_for_both_roles() {
    let ca = TestCa::new(td("a.test"));
    let chain = leaf(&ca, |_| {});
    let v = verifier(&ca);
    assert_eq!(v.verify(&chain, PeerRole::Client, now()), Ok(id(WEB)));
    assert_eq!(v.verify(&chain, PeerRole::Server, now()), Ok(id(WEB)));
}

#[test]
fn leaf_with_intermediate_is_accepted() {
    let root = TestCa::new(td("a.test"));
    let intermediate = root.intermediate();
    let chain = leaf(&intermediate, |_| {});
    assert_eq!(chain.len(), 2);
    assert_eq!(verify(&verifier(&root), &chain), Ok(id(WEB)));
    // Without the intermediate the path cannot be built.
    assert_eq!(
        verify(&verifier(&root), &chain[..1]),
        Err(VerifyError::UnknownIssuer(td("a.test")))
    );
}

#[test]
fn extra_dns_sans_are_allowed() {
    let ca = TestCa::new(td("a.test"));
    let chain = leaf(&ca, |p| {
        p.subject_alt_names
            .push(SanType::DnsName("web.shop.svc".try_into().unwrap()));
        p.subject_alt_names
            .push(SanType::DnsName("web.example".try_into().unwrap()));
    });
    assert_eq!(verify(&verifier(&ca), &chain), Ok(id(WEB)));
}

#[test]
fn expired_leaf_is_rejected() {
    let ca = TestCa::new(td("a.test"));
    let now_dt = OffsetDateTime::now_utc();
    let chain = leaf(&ca, |p| {
        p.not_before = now_dt - Duration::from_secs(7200);
        p.not_after = now_dt - Duration::from_secs(3600);
    });
    let not_after = (now_dt - Duration::from_secs(3600)).unix_timestamp() as u64;
    assert_eq!(
        verify(&verifier(&ca), &chain),
        Err(VerifyError::Expired { not_after })
    );
}

#[test]
fn not_yet_valid_leaf_is_rejected() {
    let ca = TestCa::new(td("a.test"));
    let now_dt = OffsetDateTime::now_utc();
    let chain = leaf(&ca, |p| {
        p.not_before = now_dt + Duration::from_secs(3600);
        p.not_after = now_dt + Duration::from_secs(7200);
    });
    let not_before = (now_dt + Duration::from_secs(3600)).unix_timestamp() as u64;
    assert_eq!(
        verify(&verifier(&ca), &chain),
        Err(VerifyError::NotYetValid { not_before })
    );
}

#[test]
fn verification_time_is_the_callers() {
    let ca = TestCa::new(td("a.test"));
    let chain = leaf(&ca, |_| {});
    let v = verifier(&ca);
    let in_two_hours = UnixTime::since_unix_epoch(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            + Duration::from_secs(7200),
    );
    assert!(matches!(
        v.verify(&chain, PeerRole::Client, in_two_hours),
        Err(VerifyError::Expired { .. })
    ));
}

#[test]
fn leaf_that_is_a_ca_is_rejected() {
    let ca = TestCa::new(td("a.test"));
    let chain = leaf(&ca, |p| p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained));
    assert_eq!(
        verify(&verifier(&ca), &chain),
        Err(VerifyError::Leaf(SvidError::LeafIsCa))
    );
}

#[test]
fn leaf_with_key_cert_sign_is_rejected() {
    let ca = TestCa::new(td("a.test"));
    let chain = leaf(&ca, |p| p.key_usages.push(KeyUsagePurpose::KeyCertSign));
    assert_eq!(
        verify(&verifier(&ca), &chain),
        Err(VerifyError::Leaf(SvidError::KeyCertSign))
    );
}

#[test]
fn leaf_with_crl_sign_is_rejected() {
    let ca = TestCa::new(td("a.test"));
    let chain = leaf(&ca, |p| p.key_usages.push(KeyUsagePurpose::CrlSign));
    assert_eq!(
        verify(&verifier(&ca), &chain),
        Err(VerifyError::Leaf(SvidError::CrlSign))
    );
}

#[test]
fn leaf_without_digital_signature_is_rejected() {
    let ca = TestCa::new(td("a.test"));
    let chain = leaf(&ca, |p| {
        p.key_usages = vec![KeyUsagePurpose::KeyEncipherment]
    });
    assert_eq!(
        verify(&verifier(&ca), &chain),
        Err(VerifyError::Leaf(SvidError::NoDigitalSignature))
    );
    let chain = leaf(&ca, |p| p.key_usages.clear());
    assert_eq!(
        verify(&verifier(&ca), &chain),
        Err(VerifyError::Leaf(SvidError::NoDigitalSignature))
    );
}

#[test]
fn two_uri_sans_are_rejected() {
    let ca = TestCa::new(td("a.test"));
    let chain = leaf(&ca, |p| {
        p.subject_alt_names
            .push(uri("spiffe://a.test/ns/shop/sa/db"))
    });
    assert_eq!(
        verify(&verifier(&ca), &chain),
        Err(VerifyError::Leaf(SvidError::MultipleUriSans { count: 2 }))
    );
}

#[test]
fn no_uri_san_is_rejected() {
    let ca = TestCa::new(td("a.test"));
    let chain = leaf(&ca, |p| {
        p.subject_alt_names = vec![SanType::DnsName("web.example".try_into().unwrap())]
    });
    assert_eq!(
        verify(&verifier(&ca), &chain),
        Err(VerifyError::Leaf(SvidError::NoUriSan))
    );
}

#[test]
fn non_spiffe_uri_is_rejected() {
    let ca = TestCa::new(td("a.test"));
    let chain = leaf(&ca, |p| {
        p.subject_alt_names = vec![uri("https://a.test/web")]
    });
    assert_eq!(
        verify(&verifier(&ca), &chain),
        Err(VerifyError::Leaf(SvidError::InvalidSpiffeId {
            uri: "https://a.test/web".into(),
            source: SpiffeIdError::WrongScheme,
        }))
    );
}

#[test]
fn id_without_path_is_rejected() {
    let ca = TestCa::new(td("a.test"));
    let chain = leaf(&ca, |p| p.subject_alt_names = vec![uri("spiffe://a.test")]);
    assert_eq!(
        verify(&verifier(&ca), &chain),
        Err(VerifyError::Leaf(SvidError::NoPath(id("spiffe://a.test"))))
    );
}

#[test]
fn trust_domain_b_leaf_signed_by_a_is_rejected() {
    let ca_a = TestCa::new(td("a.test"));
    let ca_b = TestCa::new(td("b.test"));
    let chain = chain_for(
        &ca_a,
        &TestCa::leaf_params(&id("spiffe://b.test/ns/x/sa/y")),
    );

    // B's bundle is configured: A's signature does not lead to B's roots.
    let both = TrustBundleSet::from_bundles([ca_a.bundle(), ca_b.bundle()]).unwrap();
    let v = SpiffeVerifier::new(both, Authorize::AnyTrusted);
    assert_eq!(
        verify(&v, &chain),
        Err(VerifyError::UnknownIssuer(td("b.test")))
    );

    // Only A's bundle is configured: B's leaf is never checked against A's roots.
    assert_eq!(
        verify(&verifier(&ca_a), &chain),
        Err(VerifyError::UnknownTrustDomain(td("b.test")))
    );
}

#[test]
fn untrusted_ca_with_the_right_trust_domain_name_is_rejected() {
    let trusted = TestCa::new(td("a.test"));
    let impostor = TestCa::new(td("a.test"));
    let chain = leaf(&impostor, |_| {});
    assert_eq!(
        verify(&verifier(&trusted), &chain),
        Err(VerifyError::UnknownIssuer(td("a.test")))
    );
}

#[test]
fn a_root_outside_its_validity_verifies_nothing() {
    let ca = TestCa::new(td("a.test"));
    let root_expiry = OffsetDateTime::from(ca.signer().not_after());
    // A leaf that outlives its root, checked once the root has expired.
    let chain = leaf(&ca, |p| {
        p.not_after = root_expiry + Duration::from_secs(2 * 86_400);
    });
    let at = |t: OffsetDateTime| {
        UnixTime::since_unix_epoch(Duration::from_secs(t.unix_timestamp() as u64))
    };
    let v = verifier(&ca);
    assert_eq!(
        v.verify(
            &chain,
            PeerRole::Client,
            at(root_expiry - Duration::from_secs(60))
        ),
        Ok(id(WEB)),
        "the root still valid"
    );
    let after = at(root_expiry + Duration::from_secs(86_400));
    let refused = v.verify(&chain, PeerRole::Client, after);
    assert_eq!(refused, Err(VerifyError::RootOutsideValidity(td("a.test"))));
    assert_eq!(
        refused.unwrap_err().to_string(),
        "peer chain leads only to a root of trust domain a.test that is outside its validity"
    );
    // Another trust domain's chain is still told apart as an unknown issuer.
    let impostor = TestCa::new(td("a.test"));
    let other = leaf(&impostor, |p| {
        p.not_after = root_expiry + Duration::from_secs(2 * 86_400);
    });
    assert_eq!(
        v.verify(&other, PeerRole::Client, after),
        Err(VerifyError::UnknownIssuer(td("a.test")))
    );
}

#[test]
fn wrong_authorized_id_is_rejected() {
    let ca = TestCa::new(td("a.test"));
    let chain = leaf(&ca, |_| {});
    let only_db = SpiffeVerifier::new(
        ca.bundle_set(),
        Authorize::Exact(id("spiffe://a.test/ns/shop/sa/db")),
    );
    assert_eq!(
        verify(&only_db, &chain),
        Err(VerifyError::Unauthorized(id(WEB)))
    );

    let other_td = SpiffeVerifier::new(ca.bundle_set(), Authorize::TrustDomain(td("b.test")));
    assert_eq!(
        verify(&other_td, &chain),
        Err(VerifyError::Unauthorized(id(WEB)))
    );

    let set = Authorize::OneOf([id(WEB), id("spiffe://a.test/ns/shop/sa/db")].into());
    assert_eq!(
        verify(&SpiffeVerifier::new(ca.bundle_set(), set), &chain),
        Ok(id(WEB))
    );

    let closure = |peer: &SpiffeId| peer.namespace() == Some("billing");
    assert_eq!(
        verify(&SpiffeVerifier::new(ca.bundle_set(), closure), &chain),
        Err(VerifyError::Unauthorized(id(WEB)))
    );
}

#[test]
fn empty_chain_and_garbage_are_rejected() {
    let ca = TestCa::new(td("a.test"));
    assert_eq!(verify(&verifier(&ca), &[]), Err(VerifyError::NoCertificate));
    let garbage = [CertificateDer::from(vec![0x30, 0x03, 0x01, 0x01, 0xff])];
    assert!(matches!(
        verify(&verifier(&ca), &garbage),
        Err(VerifyError::Leaf(SvidError::Malformed(_)))
    ));
}

#[test]
fn server_role_requires_server_auth_eku_when_ekus_are_present() {
    let ca = TestCa::new(td("a.test"));
    let chain = leaf(&ca, |p| {
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth]
    });
    let v = verifier(&ca);
    assert_eq!(v.verify(&chain, PeerRole::Client, now()), Ok(id(WEB)));
    assert!(matches!(
        v.verify(&chain, PeerRole::Server, now()),
        Err(VerifyError::InvalidChain(_))
    ));
}

#[test]
fn svid_loading_checks_the_leaf_and_the_key() {
    let ca = TestCa::new(td("a.test"));
    let (chain, key) = ca.sign_params(&TestCa::leaf_params(&id(WEB)));
    let svid = X509Svid::from_der(chain.clone(), key.clone_key()).unwrap();
    assert_eq!(svid.spiffe_id(), &id(WEB));
    assert_eq!(svid.chain(), chain.as_slice());
    assert!(svid.not_after() > SystemTime::now());

    // PEM round trip.
    let chain_pem = meshkit_identity::certs_to_pem(&chain);
    let key_pem = meshkit_identity::private_key_to_pem(&key);
    let from_pem = X509Svid::from_pem(&chain_pem, &key_pem).unwrap();
    assert_eq!(from_pem.leaf(), svid.leaf());

    // A key that belongs to another certificate.
    let (_, other_key) = ca.sign_params(&TestCa::leaf_params(&id(WEB)));
    assert!(matches!(
        X509Svid::from_der(chain.clone(), other_key),
        Err(SvidError::Key(_))
    ));

    // Leaf rules apply to our own SVIDs too.
    let mut params = TestCa::leaf_params(&id(WEB));
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let (bad, bad_key) = ca.sign_params(&params);
    assert_eq!(
        X509Svid::from_der(bad, bad_key).unwrap_err(),
        SvidError::LeafIsCa
    );

    assert_eq!(
        X509Svid::from_der(Vec::new(), key).unwrap_err(),
        SvidError::EmptyChain
    );
    assert!(matches!(
        X509Svid::from_pem("not pem", &key_pem),
        Err(SvidError::EmptyChain)
    ));
}
