#![no_main]
//! The X509-SVID leaf rules over arbitrary DER.
libfuzzer_sys::fuzz_target!(|der: &[u8]| {
    let _ = meshkit_identity::parse_leaf(der);
});
