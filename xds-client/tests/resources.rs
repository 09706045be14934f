//! The built-in `Resource` implementations: names, type URLs and Envoy's validation rules.

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier;
use envoy_types::pb::envoy::config::core::v3::{Address, SocketAddress, address};
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::{ApiListener, FilterChain, Listener};
use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use meshkit_xds_client::{Resource, ResourceType};
use prost::{Message, Name};

/// The field and rule `value` is rejected for; panics when it is accepted.
fn rejection<T: Resource + std::fmt::Debug>(value: &T) -> (String, String) {
    match value.validate() {
        Err(e) => {
            let v = e.violation().expect("a built-in rule names its violation");
            assert_eq!(e.message(), v.to_string(), "the message is the violation");
            (v.field(), v.rule().to_owned())
        }
        Ok(()) => panic!("{value:?} is accepted"),
    }
}

fn broken(field: &str, rule: &str) -> (String, String) {
    (field.to_owned(), rule.to_owned())
}

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
    assert_eq!(rejection(&l), broken("address", "envoy.listener.address"));
    l.api_listener = Some(ApiListener::default());
    assert_eq!(l.validate(), Ok(()));
    l.api_listener = None;
    l.address = Some(Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: "0.0.0.0".into(),
            port_specifier: Some(PortSpecifier::PortValue(15001)),
            ..Default::default()
        })),
    });
    l.default_filter_chain = Some(FilterChain::default());
    assert_eq!(l.validate(), Ok(()));
}

#[test]
fn route_configuration_virtual_host_names_are_unique() {
    let vh = |n: &str| VirtualHost {
        name: n.into(),
        domains: vec![format!("{n}.example")],
        ..Default::default()
    };
    let mut r = RouteConfiguration {
        name: "r".into(),
        virtual_hosts: vec![vh("a"), vh("b")],
        ..Default::default()
    };
    assert!(r.validate().is_ok());
    r.virtual_hosts.push(VirtualHost {
        domains: vec!["other.example".into()],
        ..vh("a")
    });
    assert_eq!(
        rejection(&r),
        broken("virtual_hosts[2].name", "meshkit.virtual_host_name")
    );
}

#[test]
fn cluster_connect_timeout_must_be_positive() {
    let mut c = Cluster {
        name: "c".into(),
        ..Default::default()
    };
    assert_eq!(c.validate(), Ok(()), "unset is Envoy's default");
    for (seconds, nanos) in [(-1, 0), (0, -1), (1, -1)] {
        c.connect_timeout = Some(PbDuration { seconds, nanos });
        assert_eq!(
            rejection(&c),
            broken("connect_timeout", "envoy.duration"),
            "{seconds} s {nanos} ns"
        );
    }
    c.connect_timeout = Some(PbDuration::default());
    assert_eq!(rejection(&c), broken("connect_timeout", "duration.gt"));
    for (seconds, nanos) in [(0, 1), (1, 0)] {
        c.connect_timeout = Some(PbDuration { seconds, nanos });
        assert_eq!(c.validate(), Ok(()), "{seconds} s {nanos} ns");
    }
}

#[test]
fn empty_names_are_invalid() {
    // The name is checked first: these would break no other rule, or (the listener) one more.
    assert_eq!(
        rejection(&Cluster::default()),
        broken("name", "string.min_len")
    );
    assert_eq!(
        rejection(&ClusterLoadAssignment::default()),
        broken("cluster_name", "string.min_len")
    );
    assert_eq!(rejection(&Secret::default()), broken("name", "xds.name"));
    assert_eq!(
        rejection(&RouteConfiguration::default()),
        broken("name", "xds.name")
    );
    assert_eq!(rejection(&Listener::default()), broken("name", "xds.name"));
}
