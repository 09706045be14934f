//! The built-in `Resource` implementations: names, type URLs and Envoy's validation rules.

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::{ApiListener, Listener};
use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use meshkit_xds_client::{Resource, ResourceType};
use prost::{Message, Name};

/// The reason `value` is rejected for; panics when it is accepted.
fn rejection<T: Resource + std::fmt::Debug>(value: &T) -> String {
    match value.validate() {
        Err(e) => e.message().to_owned(),
        Ok(()) => panic!("{value:?} is accepted"),
    }
}

const NAME_IS_EMPTY: &str = "name is empty";
const LISTENER_NEEDS_AN_ADDRESS: &str =
    "address is required unless api_listener or listener_specifier is set";
const CONNECT_TIMEOUT_NOT_POSITIVE: &str = "connect_timeout must be greater than 0";

fn roundtrip<T: Resource + Message + Name + Default>(value: &T) -> T {
    assert_eq!(
        T::TYPE_URL,
        T::type_url(),
        "type URL matches the protobuf name"
    );
    <T as Resource>::decode(&value.encode_to_vec()).expect("decodes")
}

#[test]
fn type_urls_names_and_sotw_deletion_semantics() {
    let c = roundtrip(&Cluster {
        name: "c".into(),
        ..Default::default()
    });
    assert_eq!(Resource::name(&c), "c");
    let e = roundtrip(&ClusterLoadAssignment {
        cluster_name: "e".into(),
        ..Default::default()
    });
    assert_eq!(Resource::name(&e), "e");
    roundtrip(&Listener::default());
    roundtrip(&RouteConfiguration::default());
    roundtrip(&Secret::default());
    assert!(ResourceType::of::<Listener>().all_resources_required_in_sotw());
    assert!(ResourceType::of::<Cluster>().all_resources_required_in_sotw());
    assert!(!ResourceType::of::<RouteConfiguration>().all_resources_required_in_sotw());
    assert!(!ResourceType::of::<ClusterLoadAssignment>().all_resources_required_in_sotw());
    assert!(!ResourceType::of::<Secret>().all_resources_required_in_sotw());
}

#[test]
fn listener_needs_an_address_or_api_listener() {
    let mut l = Listener {
        name: "l".into(),
        ..Default::default()
    };
    assert_eq!(rejection(&l), LISTENER_NEEDS_AN_ADDRESS);
    l.api_listener = Some(ApiListener::default());
    assert_eq!(l.validate(), Ok(()));
    l.api_listener = None;
    l.address = Some(Default::default());
    assert_eq!(l.validate(), Ok(()));
}

#[test]
fn route_configuration_virtual_host_names_are_unique() {
    let vh = |n: &str| VirtualHost {
        name: n.into(),
        ..Default::default()
    };
    let mut r = RouteConfiguration {
        name: "r".into(),
        virtual_hosts: vec![vh("a"), vh("b")],
        ..Default::default()
    };
    assert!(r.validate().is_ok());
    r.virtual_hosts.push(vh("a"));
    assert_eq!(rejection(&r), r#"duplicate virtual host name "a""#);
}

#[test]
fn cluster_connect_timeout_must_be_positive() {
    let mut c = Cluster {
        name: "c".into(),
        ..Default::default()
    };
    assert_eq!(c.validate(), Ok(()), "unset is Envoy's default");
    for (seconds, nanos) in [(-1, 0), (0, 0), (0, -1), (1, -1)] {
        c.connect_timeout = Some(PbDuration { seconds, nanos });
        assert_eq!(
            rejection(&c),
            CONNECT_TIMEOUT_NOT_POSITIVE,
            "{seconds} s {nanos} ns"
        );
    }
    for (seconds, nanos) in [(0, 1), (1, 0)] {
        c.connect_timeout = Some(PbDuration { seconds, nanos });
        assert_eq!(c.validate(), Ok(()), "{seconds} s {nanos} ns");
    }
}

#[test]
fn empty_names_are_invalid() {
    // The name is checked first: these would break no other rule, or (the listener) one more.
    assert_eq!(rejection(&Cluster::default()), NAME_IS_EMPTY);
    assert_eq!(rejection(&ClusterLoadAssignment::default()), NAME_IS_EMPTY);
    assert_eq!(rejection(&Secret::default()), NAME_IS_EMPTY);
    assert_eq!(rejection(&RouteConfiguration::default()), NAME_IS_EMPTY);
    assert_eq!(rejection(&Listener::default()), NAME_IS_EMPTY);
}
