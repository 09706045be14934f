#![no_main]
//! Loading a CA from arbitrary certificate and key PEM text.
libfuzzer_sys::fuzz_target!(|input: (&str, &str)| {
    let td = meshkit_identity::TrustDomain::new("example.org").expect("valid name");
    let _ = meshkit_identity::CaSigner::from_pem(td, input.0, input.1);
});
