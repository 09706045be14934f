#![no_main]
//! JSON loading never panics.
libfuzzer_sys::fuzz_target!(|s: &str| {
    let _ = meshkit_ingress_model::manifest::from_json_str(s);
});
