#![no_main]
//! The CA signer's CSR checks over arbitrary PEM text.
static CA: std::sync::OnceLock<meshkit_identity::CaSigner> = std::sync::OnceLock::new();

libfuzzer_sys::fuzz_target!(|pem: &str| {
    let td = meshkit_identity::TrustDomain::new("example.org").expect("valid name");
    let ca = CA.get_or_init(|| meshkit_identity::CaSigner::generate(td.clone()).expect("CA"));
    let id = td.id_with_path("/ns/default/sa/fuzz").expect("valid ID");
    let _ = ca.sign_csr(pem, &id, std::time::Duration::from_secs(60));
});
