//! Response handling never panics on arbitrary input, and every response gets exactly one
//! ACK or NACK.

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryResponse, DiscoveryResponse, Resource as Wrapped,
};
use envoy_types::pb::google::protobuf::{Any, Duration as PbDuration};
use meshkit_xds_client::protocol::{Mode, Response, Session, SessionConfig};
use meshkit_xds_client::{CLUSTER_TYPE_URL, RESOURCE_WRAPPER_TYPE_URL, ResourceType};
use proptest::prelude::*;
use prost::Message;

fn session(mode: Mode) -> Session {
    let mut s = Session::new(SessionConfig::new(mode));
    s.subscribe_wildcard(ResourceType::of::<Cluster>());
    s.subscribe(ResourceType::of::<Cluster>(), "a");
    let now = Instant::now();
    s.on_connected(now);
    while s.poll_request(now).is_some() {}
    s
}

fn drain(s: &mut Session, now: Instant) -> usize {
    while s.poll_event().is_some() {}
    std::iter::from_fn(|| s.poll_request(now)).count()
}

fn type_url() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(CLUSTER_TYPE_URL.to_string()),
        Just(RESOURCE_WRAPPER_TYPE_URL.to_string()),
        ".{0,8}",
    ]
}

fn any_resource() -> impl Strategy<Value = Any> {
    (type_url(), proptest::collection::vec(any::<u8>(), 0..64)).prop_map(|(t, v)| Any {
        type_url: t,
        value: v,
    })
}

fn wrapped() -> impl Strategy<Value = Wrapped> {
    (
        prop_oneof![Just("a".to_string()), Just(String::new()), "[a-c]{1,2}"],
        proptest::option::of(any_resource()),
        proptest::option::of((any::<i64>(), any::<i32>())),
    )
        .prop_map(|(name, resource, ttl)| Wrapped {
            name,
            resource,
            ttl: ttl.map(|(seconds, nanos)| PbDuration { seconds, nanos }),
            ..Default::default()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        // The same function the fuzz targets in `xds-client/fuzz` call.
        for mode in [Mode::StateOfTheWorld, Mode::Delta] {
            prop_assert!(meshkit_xds_client::protocol::fuzz_response(mode, &bytes));
        }
    }

    #[test]
    fn arbitrary_bytes_inside_a_valid_envelope_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..256),
        wrapped in any::<bool>(),
    ) {
        let any = Any {
            type_url: if wrapped { RESOURCE_WRAPPER_TYPE_URL } else { CLUSTER_TYPE_URL }.into(),
            value: bytes,
        };
        let sotw = DiscoveryResponse {
            type_url: CLUSTER_TYPE_URL.into(),
            resources: vec![any.clone()],
            nonce: "n".into(),
            ..Default::default()
        };
        prop_assert!(meshkit_xds_client::protocol::fuzz_response(
            Mode::StateOfTheWorld,
            &sotw.encode_to_vec()
        ));
        let delta = DeltaDiscoveryResponse {
            type_url: CLUSTER_TYPE_URL.into(),
            resources: vec![Wrapped { name: "a".into(), resource: Some(any), ..Default::default() }],
            nonce: "n".into(),
            ..Default::default()
        };
        prop_assert!(meshkit_xds_client::protocol::fuzz_response(Mode::Delta, &delta.encode_to_vec()));
    }

    #[test]
    fn arbitrary_resources_never_panic(
        sotw in proptest::collection::vec(any_resource(), 0..8),
        delta in proptest::collection::vec(wrapped(), 0..8),
        removed in proptest::collection::vec("[a-c]{0,2}", 0..3),
    ) {
        let now = Instant::now();
        let mut s = session(Mode::StateOfTheWorld);
        s.handle_response(now, Response::Sotw(DiscoveryResponse {
            type_url: CLUSTER_TYPE_URL.into(),
            resources: sotw,
            nonce: "n".into(),
            ..Default::default()
        }));
        prop_assert_eq!(drain(&mut s, now), 1);
        s.handle_timeout(now + Duration::from_secs(1 << 40));

        let mut s = session(Mode::Delta);
        s.handle_response(now, Response::Delta(DeltaDiscoveryResponse {
            type_url: CLUSTER_TYPE_URL.into(),
            resources: delta,
            removed_resources: removed,
            nonce: "n".into(),
            ..Default::default()
        }));
        prop_assert_eq!(drain(&mut s, now), 1);
        s.on_disconnected();
        s.on_connected(now);
        drain(&mut s, now);
        s.handle_timeout(now + Duration::from_secs(1 << 40));
    }
}
