#![no_main]
//! Any bytes as a SotW response to a session watching clusters: never panics, always answered.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    assert!(meshkit_xds_client::protocol::fuzz_response(
        meshkit_xds_client::protocol::Mode::StateOfTheWorld,
        data
    ));
});
