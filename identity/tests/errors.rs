//! Every error of the crate prints its own level only; the cause is in `source()`, so a
//! reporter that walks the chain prints each level once.

use std::error::Error;

use meshkit_identity::test_util::TestCa;
use meshkit_identity::{
    BundleError, CaError, CaSigner, SvidError, TrustBundle, TrustDomain, VerifyError, parse_leaf,
};

fn assert_one_level(err: &(dyn Error + 'static)) {
    let shown = err.to_string();
    let source = err.source().expect("this error has a cause");
    assert!(
        !shown.contains(&source.to_string()),
        "{shown:?} repeats its source {source:?}"
    );
}

fn td() -> TrustDomain {
    TrustDomain::new("a.test").unwrap()
}

#[test]
fn wrapping_errors_do_not_repeat_their_cause() {
    assert_one_level(&VerifyError::Leaf(SvidError::NoUriSan));
    assert_one_level(&CaError::InvalidSvid(SvidError::EmptyChain));
    let err: BundleError = TrustBundle::from_pem(td(), "junk").unwrap_err();
    assert_one_level(&err);
    let err = TrustBundle::from_jwks(td(), "{").unwrap_err();
    assert_one_level(&err);
    let err =
        meshkit_identity::TrustBundleSet::from_jwks_map(r#"{"Bad TD": {"keys": []}}"#).unwrap_err();
    assert_one_level(&err);

    // A leaf whose URI SAN is not a SPIFFE ID.
    let ca = TestCa::new(td());
    let mut params = TestCa::leaf_params(&"spiffe://a.test/w".parse().unwrap());
    params.subject_alt_names = vec![rcgen::SanType::URI("spiffe://A.test/w".try_into().unwrap())];
    let (chain, _) = ca.sign_params(&params);
    let err = parse_leaf(&chain[0]).unwrap_err();
    assert!(matches!(err, SvidError::InvalidSpiffeId { .. }), "{err:?}");
    assert_one_level(&err);

    let err = CaSigner::from_pem(td(), "", "").unwrap_err();
    assert_one_level(&err);
}

#[test]
fn the_test_ca_is_a_thin_wrapper_on_a_signer() {
    let ca = TestCa::new(td());
    assert_eq!(ca.signer().root(), ca.root());
    assert_eq!(ca.signer().trust_domain(), ca.trust_domain());
    let web = "spiffe://a.test/ns/shop/sa/web".parse().unwrap();
    let (csr, _) = meshkit_identity::generate_csr(&web).unwrap();
    let chain = ca
        .sign_csr(&csr, &web, std::time::Duration::from_secs(600))
        .unwrap();
    assert_eq!(chain.len(), 1, "no root");
    let chain = ca
        .intermediate()
        .sign_csr(&csr, &web, std::time::Duration::from_secs(600))
        .unwrap();
    assert_eq!(chain.len(), 2, "leaf and intermediate, no root");

    // Refusals carry the signer's whole reason as the CA's message.
    let db = "spiffe://a.test/ns/shop/sa/db".parse().unwrap();
    match ca.sign_csr(&csr, &db, std::time::Duration::from_secs(600)) {
        Err(CaError::Rejected(message)) => {
            assert!(
                message.contains("spiffe://a.test/ns/shop/sa/web"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
    let garbage = ca.sign_csr("junk", &web, std::time::Duration::from_secs(600));
    match garbage {
        Err(CaError::Rejected(message)) => {
            assert!(message.starts_with("invalid CSR PEM: "), "{message}")
        }
        other => panic!("{other:?}"),
    }
}
