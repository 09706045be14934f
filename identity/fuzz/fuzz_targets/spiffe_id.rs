#![no_main]
//! Any accepted SPIFFE ID prints back to exactly its input.
libfuzzer_sys::fuzz_target!(|s: &str| {
    if let Ok(id) = s.parse::<meshkit_identity::SpiffeId>() {
        assert_eq!(id.as_str(), s);
    }
});
