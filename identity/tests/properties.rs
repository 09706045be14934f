//! Property tests: SPIFFE ID printing and parsing are inverse on every valid ID, and the
//! parsers of untrusted input never panic.

use meshkit_identity::{SpiffeId, TrustBundle, TrustBundleSet, TrustDomain, parse_leaf};
use proptest::prelude::*;

fn trust_domain() -> impl Strategy<Value = String> {
    "[a-z0-9._-]{1,40}"
}

fn path() -> impl Strategy<Value = String> {
    // Segments of allowed characters that are not "." or "..".
    proptest::collection::vec("[a-zA-Z0-9._-]{1,12}", 0..8).prop_map(|segments| {
        segments
            .into_iter()
            .filter(|s| s != "." && s != "..")
            .map(|s| format!("/{s}"))
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn display_then_parse_is_identity(td in trust_domain(), path in path()) {
        let text = format!("spiffe://{td}{path}");
        let id: SpiffeId = text.parse().unwrap();
        prop_assert_eq!(id.to_string(), text.clone());
        prop_assert_eq!(id.trust_domain_str(), td.as_str());
        prop_assert_eq!(id.path(), path.as_str());
        let again: SpiffeId = id.to_string().parse().unwrap();
        prop_assert_eq!(again, id);
    }

    #[test]
    fn parser_never_panics_and_accepted_ids_round_trip(s in "\\PC{0,80}") {
        if let Ok(id) = s.parse::<SpiffeId>() {
            prop_assert_eq!(id.to_string(), s.clone());
        }
        let _ = TrustDomain::new(&s);
    }

    #[test]
    fn near_miss_ids_never_panic(td in trust_domain(), tail in "[/a-zA-Z0-9.%?#:@_-]{0,30}") {
        let s = format!("spiffe://{td}{tail}");
        if let Ok(id) = s.parse::<SpiffeId>() {
            prop_assert_eq!(id.as_str(), s.as_str());
        }
    }

    #[test]
    fn leaf_parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = parse_leaf(&bytes);
    }

    #[test]
    fn bundle_parsers_never_panic(s in "\\PC{0,200}") {
        let _ = TrustBundle::from_jwks(TrustDomain::new("a.test").unwrap(), &s);
        let _ = TrustBundle::from_pem(TrustDomain::new("a.test").unwrap(), &s);
        let _ = TrustBundleSet::from_jwks_map(&s);
    }
}

/// Mutating a real certificate byte by byte must never panic the leaf parser.
#[test]
fn leaf_parser_survives_corrupted_certificates() {
    let ca = meshkit_identity::test_util::TestCa::new(TrustDomain::new("a.test").unwrap());
    let svid = ca.issue("spiffe://a.test/ns/a/sa/b".parse().unwrap());
    let der = svid.leaf().to_vec();
    for i in 0..der.len() {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut bad = der.clone();
            bad[i] ^= flip;
            let _ = parse_leaf(&bad);
        }
        let _ = parse_leaf(&der[..i]);
    }
}
