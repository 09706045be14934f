//! Trust bundles from PEM and the SPIFFE JWKS format, and bundle sets keyed by trust domain.

use meshkit_identity::test_util::TestCa;
use meshkit_identity::{
    Authorize, BundleError, PeerRole, SpiffeVerifier, TrustBundle, TrustBundleSet, TrustDomain,
};
use rustls_pki_types::UnixTime;

fn td(name: &str) -> TrustDomain {
    TrustDomain::new(name).unwrap()
}

#[test]
fn pem_bundle_round_trip() {
    let ca = TestCa::new(td("a.test"));
    let bundle = TrustBundle::from_pem(td("a.test"), &ca.root_pem()).unwrap();
    assert_eq!(bundle.roots(), [ca.root().clone()]);
    assert_eq!(bundle.trust_domain(), &td("a.test"));
    assert!(matches!(
        TrustBundle::from_pem(td("a.test"), "no pem here"),
        Err(BundleError::Pem(_))
    ));
    assert!(matches!(
        TrustBundle::from_der(td("a.test"), vec![]),
        Err(BundleError::NoRoots(_))
    ));
    assert!(matches!(
        TrustBundle::from_der(td("a.test"), vec![vec![1, 2, 3].into()]),
        Err(BundleError::BadRoot { index: 0, .. })
    ));
}

#[test]
fn jwks_bundle_round_trip_and_ignores_jwt_keys() {
    let ca = TestCa::new(td("a.test"));
    let jwks = ca.bundle().to_jwks();
    let parsed = TrustBundle::from_jwks(td("a.test"), &jwks).unwrap();
    assert_eq!(parsed.roots(), [ca.root().clone()]);

    let mut doc: serde_json::Value = serde_json::from_str(&jwks).unwrap();
    doc["spiffe_sequence"] = 7.into();
    doc["keys"].as_array_mut().unwrap().push(serde_json::json!({
        "use": "jwt-svid", "kty": "EC", "kid": "k1", "crv": "P-256", "x": "AA", "y": "AA"
    }));
    let parsed = TrustBundle::from_jwks(td("a.test"), &doc.to_string()).unwrap();
    assert_eq!(parsed.roots().len(), 1);
}

#[test]
fn jwks_errors_are_specific() {
    let two_x5c = r#"{"keys":[{"use":"x509-svid","kty":"EC","x5c":["AA==","AA=="]}]}"#;
    assert!(matches!(
        TrustBundle::from_jwks(td("a.test"), two_x5c),
        Err(BundleError::X5cCount { index: 0, count: 2 })
    ));
    let bad_b64 = r#"{"keys":[{"use":"jwt-svid"},{"use":"x509-svid","x5c":["***"]}]}"#;
    assert!(matches!(
        TrustBundle::from_jwks(td("a.test"), bad_b64),
        Err(BundleError::X5cBase64 { index: 1, .. })
    ));
    assert!(matches!(
        TrustBundle::from_jwks(td("a.test"), r#"{"keys":[]}"#),
        Err(BundleError::NoRoots(_))
    ));
    assert!(matches!(
        TrustBundle::from_jwks(td("a.test"), "[1,2]"),
        Err(BundleError::Json(_))
    ));
}

#[test]
fn bundle_sets_reject_duplicate_trust_domains() {
    let a = TestCa::new(td("a.test"));
    let a2 = TestCa::new(td("a.test"));
    let b = TestCa::new(td("b.test"));
    let mut set = TrustBundleSet::from_bundles([a.bundle(), b.bundle()]).unwrap();
    assert_eq!(set.len(), 2);
    assert!(matches!(
        set.insert(a2.bundle()),
        Err(BundleError::DuplicateTrustDomain(d)) if d == td("a.test")
    ));
    // The original roots are kept.
    assert_eq!(set.get("a.test").unwrap().roots(), [a.root().clone()]);

    let map = format!(
        r#"{{"a.test": {}, "b.test": {}}}"#,
        a.bundle().to_jwks(),
        b.bundle().to_jwks()
    );
    let set = TrustBundleSet::from_jwks_map(&map).unwrap();
    assert_eq!(set.get("b.test").unwrap().roots(), [b.root().clone()]);

    let dup = format!(
        r#"{{"a.test": {}, "a.test": {}}}"#,
        a.bundle().to_jwks(),
        a2.bundle().to_jwks()
    );
    assert!(matches!(
        TrustBundleSet::from_jwks_map(&dup),
        Err(BundleError::DuplicateTrustDomain(d)) if d == td("a.test")
    ));
    let bad_name = format!(r#"{{"A.test": {}}}"#, a.bundle().to_jwks());
    assert!(matches!(
        TrustBundleSet::from_jwks_map(&bad_name),
        Err(BundleError::TrustDomain { .. })
    ));
}

#[test]
fn federated_set_checks_each_peer_against_its_own_trust_domain() {
    let a = TestCa::new(td("a.test"));
    let b = TestCa::new(td("b.test"));
    let set = TrustBundleSet::from_bundles([a.bundle(), b.bundle()]).unwrap();
    let v = SpiffeVerifier::new(set, Authorize::AnyTrusted);
    for (ca, peer) in [(&a, "spiffe://a.test/w"), (&b, "spiffe://b.test/w")] {
        let svid = ca.issue(peer.parse().unwrap());
        assert_eq!(
            v.verify(svid.chain(), PeerRole::Client, UnixTime::now())
                .unwrap()
                .as_str(),
            peer
        );
    }
}
