#![no_main]
//! SPIFFE bundle JSON and bundle maps.
libfuzzer_sys::fuzz_target!(|json: &str| {
    let td = meshkit_identity::TrustDomain::new("example.org").expect("valid name");
    let _ = meshkit_identity::TrustBundle::from_jwks(td, json);
    let _ = meshkit_identity::TrustBundleSet::from_jwks_map(json);
});
