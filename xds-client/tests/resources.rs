//! The built-in `Resource` implementations: names, type URLs and Envoy's validation rules.

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::{ApiListener, Listener};
use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use meshkit_xds_client::{Resource, ResourceType};
use prost::{Message, Name};

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
    assert!(l.validate().is_err());
    l.api_listener = Some(ApiListener::default());
    assert!(l.validate().is_ok());
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
    let err = r.validate().unwrap_err();
    assert!(err.message().contains("duplicate virtual host"), "{err}");
}

#[test]
fn cluster_connect_timeout_must_be_positive() {
    let mut c = Cluster {
        name: "c".into(),
        ..Default::default()
    };
    assert!(c.validate().is_ok());
    c.connect_timeout = Some(PbDuration {
        seconds: -1,
        nanos: 0,
    });
    assert!(c.validate().is_err());
    c.connect_timeout = Some(PbDuration {
        seconds: 0,
        nanos: 1,
    });
    assert!(c.validate().is_ok());
}

#[test]
fn empty_names_are_invalid() {
    assert!(Cluster::default().validate().is_err());
    assert!(ClusterLoadAssignment::default().validate().is_err());
    assert!(Secret::default().validate().is_err());
    assert!(RouteConfiguration::default().validate().is_err());
}
