#![no_main]
//! Envelope decoding never panics; a decoded list re-encodes and decodes to itself.
use meshkit_ingress_model::{IngressList, envelope};
libfuzzer_sys::fuzz_target!(|bytes: &[u8]| {
    if let Ok(list) = envelope::decode::<IngressList>(bytes) {
        assert_eq!(
            envelope::decode::<IngressList>(&envelope::encode(&list)).ok(),
            Some(list)
        );
    }
});
