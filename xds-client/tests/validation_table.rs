//! Issue 15, item 1: validation as deep as Envoy's, one table per resource type.
//!
//! Every row is a resource (in protobuf text format, parsed against the envoy-types protos)
//! that breaks one rule, with the field and the rule the rejection must name. The tables cover
//! every rule kind the generated checks use for each type (read from the generated file's
//! header, so a new kind after an envoy-types upgrade fails here until it has a row) and every
//! load rule in `src/validate/semantic.rs`. Valid resources of the shapes meshkit's control
//! plane and demo serve pass, and a rejection reaches the NACK named by resource and field.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Instant;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
use envoy_types::pb::google::protobuf::Any;
use meshkit_xds_client::protocol::{Event, Mode, Request, Response, Session, SessionConfig};
use meshkit_xds_client::{CLUSTER_TYPE_URL, Resource, ResourceType};
use prost::Message;
use protox::prost_reflect::{DescriptorPool, DynamicMessage};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ty {
    Listener,
    Route,
    Cluster,
    Endpoint,
    Secret,
}

impl Ty {
    /// The entry names the generated header uses.
    fn entry(self) -> &'static str {
        match self {
            Ty::Listener => "listener",
            Ty::Route => "route_configuration",
            Ty::Cluster => "cluster",
            Ty::Endpoint => "cluster_load_assignment",
            Ty::Secret => "secret",
        }
    }

    fn message(self) -> &'static str {
        match self {
            Ty::Listener => "envoy.config.listener.v3.Listener",
            Ty::Route => "envoy.config.route.v3.RouteConfiguration",
            Ty::Cluster => "envoy.config.cluster.v3.Cluster",
            Ty::Endpoint => "envoy.config.endpoint.v3.ClusterLoadAssignment",
            Ty::Secret => "envoy.extensions.transport_sockets.tls.v3.Secret",
        }
    }

    /// What every row of the type starts from unless it says `full`: valid on its own.
    fn base(self) -> &'static str {
        match self {
            Ty::Listener => {
                r#"name: "l" address { socket_address { address: "0.0.0.0" port_value: 8080 } } default_filter_chain {}"#
            }
            Ty::Route => r#"name: "r""#,
            Ty::Cluster => r#"name: "c""#,
            Ty::Endpoint => r#"cluster_name: "c""#,
            Ty::Secret => r#"name: "s""#,
        }
    }
}

/// One row: a resource that breaks a rule, the field and rule its rejection names, and the
/// structural kinds (`repeated.items`, `map.keys`, `string.ignore_empty`) it also exercises.
struct Row {
    ty: Ty,
    text: String,
    field: String,
    rule: &'static str,
    also: &'static [&'static str],
}

fn row(ty: Ty, text: impl Into<String>, field: impl Into<String>, rule: &'static str) -> Row {
    Row {
        ty,
        text: format!("{} {}", ty.base(), text.into()),
        field: field.into(),
        rule,
        also: &[],
    }
}

/// A row whose text is the whole resource (it replaces a field of the base).
fn full(ty: Ty, text: impl Into<String>, field: impl Into<String>, rule: &'static str) -> Row {
    Row {
        text: text.into(),
        ..row(ty, "", field, rule)
    }
}

impl Row {
    fn also(mut self, kinds: &'static [&'static str]) -> Self {
        self.also = kinds;
        self
    }
}

fn long(n: usize) -> String {
    "a".repeat(n)
}

/// gRPC config source settings that reach core types deeply, inside a `ConfigSource`.
fn api_config_source(inner: &str) -> String {
    format!("api_config_source {{ api_type: GRPC {inner} }}")
}

fn grpc_service(inner: &str) -> String {
    api_config_source(&format!(
        r#"grpc_services {{ envoy_grpc {{ cluster_name: "x" }} {inner} }}"#
    ))
}

fn fcds(inner: &str) -> String {
    format!("fcds_config {{ config_source {{ {inner} }} }}")
}

fn leds(inner: &str) -> String {
    format!(
        r#"endpoints {{ leds_cluster_locality_config {{ leds_collection_name: "x" leds_config {{ {inner} }} }} }}"#
    )
}

const VH: &str = r#"name: "v" domains: "*""#;
const HEALTH: &str = r#"timeout { seconds: 1 } interval { seconds: 1 } unhealthy_threshold { value: 1 } healthy_threshold { value: 1 }"#;
const MATCH_TREE: &str = r#"input { name: "i" typed_config {} } exact_match_map {}"#;
const EP: &str =
    r#"endpoint { address { socket_address { address: "10.0.0.1" port_value: 80 } } }"#;

fn listener_rows() -> Vec<Row> {
    use Ty::Listener as L;
    let chain = |m: &str| format!("filter_chains {{ filter_chain_match {{ {m} }} }}");
    vec![
        // Generated: one row per kind.
        row(L, r#"listener_filters { name: "f" config_discovery { type_urls: "t" } }"#, "listener_filters[0].config_discovery.config_source", "any.required"),
        row(L, r#"listener_filters { name: "f" filter_disabled { any_match: false } }"#, "listener_filters[0].filter_disabled.any_match", "bool.const"),
        row(L, fcds(&grpc_service(&format!(r#"initial_metadata {{ key: "k" raw_value: "{}" }}"#, long(16385)))), "fcds_config.config_source.api_config_source.grpc_services[0].initial_metadata[0].raw_value", "bytes.max_len"),
        row(L, fcds(&api_config_source("rate_limit_settings { fill_rate { value: 0 } }")), "fcds_config.config_source.api_config_source.rate_limit_settings.fill_rate", "double.gt"),
        row(L, fcds(&api_config_source("request_timeout {}")), "fcds_config.config_source.api_config_source.request_timeout", "duration.gt"),
        row(L, fcds(r#"path_config_source { path: "/x" } "#).replace("/x\" }", "/x\" poll_interval { nanos: 1 } }"), "fcds_config.config_source.path_config_source.poll_interval", "duration.gte"),
        row(L, "udp_listener_config { quic_options { quic_protocol_options { connection_keepalive { initial_interval { nanos: 500000 } } } } }", "udp_listener_config.quic_options.quic_protocol_options.connection_keepalive.initial_interval", "duration.gte+lte").also(&["duration.lte"]),
        row(L, fcds(&grpc_service("retry_policy { retry_back_off {} }")), "fcds_config.config_source.api_config_source.grpc_services[0].retry_policy.retry_back_off.base_interval", "duration.required"),
        row(L, "drain_type: 7", "drain_type", "enum.defined"),
        row(L, r#"socket_options { int_value: 1 state: 9 }"#, "socket_options[0].state", "enum.defined_only"),
        row(L, "listener_filters_timeout { seconds: -1 }", "listener_filters_timeout", "envoy.duration"),
        row(L, r#"metadata { filter_metadata { key: "" value {} } }"#, r#"metadata.filter_metadata[""]"#, "string.min_len").also(&["map.keys"]),
        row(L, format!("filter_chain_matcher {{ matcher_tree {{ {MATCH_TREE} }} }}"), "filter_chain_matcher.matcher_tree.exact_match_map.map", "map.min_pairs"),
        row(L, r#"filter_chain_matcher { matcher_tree { exact_match_map { map { key: "a" value { action { name: "a" typed_config {} } } } } } }"#, "filter_chain_matcher.matcher_tree.input", "message.required"),
        full(L, r#"name: "l" address {} default_filter_chain {}"#, "address.address", "oneof.required"),
        row(L, chain("source_ports: 0"), "filter_chains[0].filter_chain_match.source_ports[0]", "uint32.gte+lte").also(&["repeated.items"]),
        row(L, "udp_listener_config { quic_options { save_cmsg_config {} save_cmsg_config {} } }", "udp_listener_config.quic_options.save_cmsg_config", "repeated.max_items"),
        row(L, r#"listener_filters { name: "f" config_discovery { config_source { ads {} } } }"#, "listener_filters[0].config_discovery.type_urls", "repeated.min_items"),
        row(L, r#"access_log { name: "a" filter { response_flag_filter { flags: "XX" } } }"#, "access_log[0].filter.response_flag_filter.flags[0]", "string.in"),
        row(L, fcds(&api_config_source(&format!(r#"grpc_services {{ envoy_grpc {{ cluster_name: "x" authority: "{}" }} }}"#, long(16385)))), "fcds_config.config_source.api_config_source.grpc_services[0].envoy_grpc.authority", "string.max_bytes"),
        row(L, r#"listener_filters { name: "" }"#, "listener_filters[0].name", "string.min_len"),
        row(L, r#"access_log { name: "a" filter { header_filter { header { name: "a\nb" } } } }"#, "access_log[0].filter.header_filter.header.name", "string.well_known_regex"),
        row(L, "max_connections_to_accept_per_socket_event { value: 0 }", "max_connections_to_accept_per_socket_event", "uint32.gt"),
        full(L, r#"name: "l" address { socket_address { address: "0.0.0.0" port_value: 70000 } } default_filter_chain {}"#, "address.socket_address.port_value", "uint32.lte"),
        row(L, "udp_listener_config { downstream_socket_config { max_rx_datagram_size { value: 0 } } }", "udp_listener_config.downstream_socket_config.max_rx_datagram_size", "uint64.gt+lt"),
        // Load rules.
        full(L, r#"address { socket_address { address: "0.0.0.0" port_value: 80 } } default_filter_chain {}"#, "name", "xds.name"),
        full(L, r#"name: "l" default_filter_chain {}"#, "address", "envoy.listener.address"),
        row(L, "internal_listener {}", "address", "envoy.listener.internal_listener"),
        full(L, r#"name: "l" internal_listener {} tcp_backlog_size { value: 8 } default_filter_chain {}"#, "tcp_backlog_size", "envoy.listener.internal_listener"),
        full(L, r#"name: "l" address { envoy_internal_address { server_listener_name: "x" } } default_filter_chain {}"#, "address.envoy_internal_address", "envoy.listener.internal_listener"),
        full(L, r#"name: "l" address { socket_address { address: "localhost" port_value: 80 } } default_filter_chain {}"#, "address.socket_address.address", "envoy.address.resolve"),
        full(L, r#"name: "l" address { socket_address { address: "0.0.0.0" named_port: "http" } } default_filter_chain {}"#, "address.socket_address.named_port", "envoy.address.resolve"),
        full(L, r#"name: "l" address { socket_address { address: "10.0.0.1" port_value: 80 ipv4_compat: true } } default_filter_chain {}"#, "address.socket_address.ipv4_compat", "envoy.listener.ipv4_compat"),
        row(L, r#"additional_addresses { address { socket_address { protocol: UDP address: "0.0.0.0" port_value: 80 } } }"#, "additional_addresses[0].address", "envoy.listener.socket_type"),
        row(L, r#"additional_addresses { address { socket_address { address: "example.com" port_value: 80 } } }"#, "additional_addresses[0].address.socket_address.address", "envoy.address.resolve"),
        full(L, r#"name: "l" address { pipe { path: "/tmp/l" } } enable_mptcp: true default_filter_chain {}"#, "enable_mptcp", "envoy.listener.mptcp"),
        full(L, r#"name: "l" address { socket_address { address: "0.0.0.0" port_value: 80 } }"#, "filter_chains", "envoy.listener.filter_chains"),
        full(L, r#"name: "l" address { socket_address { protocol: UDP address: "0.0.0.0" port_value: 53 } } filter_chains {}"#, "filter_chains", "envoy.listener.filter_chains"),
        full(L, r#"name: "l" address { socket_address { protocol: UDP address: "0.0.0.0" port_value: 443 } } udp_listener_config { quic_options {} } filter_chains {}"#, "filter_chains[0].transport_socket", "envoy.listener.quic"),
        row(L, chain(r#"address_suffix: "x""#), "filter_chains[0].filter_chain_match.address_suffix", "envoy.listener.filter_chain_match"),
        row(L, chain(r#"prefix_ranges { address_prefix: "ten.0.0.0" prefix_len { value: 8 } }"#), "filter_chains[0].filter_chain_match.prefix_ranges[0].address_prefix", "envoy.listener.filter_chain_match"),
        row(L, chain(r#"server_names: "a*.example.com""#), "filter_chains[0].filter_chain_match.server_names[0]", "envoy.listener.filter_chain_match"),
        row(L, format!("{} {}", chain("destination_port { value: 80 }"), chain("destination_port { value: 80 }")), "filter_chains[1].filter_chain_match", "envoy.listener.duplicate_match"),
        row(L, r#"filter_chain_matcher { on_no_match { action { name: "a" typed_config {} } } } filter_chains { name: "a" } filter_chains { name: "a" }"#, "filter_chains[1].name", "envoy.listener.filter_chain_name"),
        row(L, r#"filter_chain_matcher { on_no_match { action { name: "a" typed_config {} } } } filter_chains {}"#, "filter_chains[0].name", "envoy.listener.filter_chain_name"),
    ]
}

fn route_rows() -> Vec<Row> {
    use Ty::Route as R;
    let vh = |inner: &str| format!("virtual_hosts {{ {VH} {inner} }}");
    let route = |inner: &str| vh(&format!(r#"routes {{ match {{ prefix: "/" }} {inner} }}"#));
    let action = |inner: &str| route(&format!("route {{ {inner} }}"));
    let limit = |inner: &str| {
        vh(&format!(
            "rate_limits {{ actions {{ source_cluster {{}} }} {inner} }}"
        ))
    };
    let many = (0..1001)
        .map(|_| r#"response_headers_to_add { header { key: "x" } }"#)
        .collect::<Vec<_>>()
        .join(" ");
    vec![
        row(
            R,
            r#"route_specifiers { name: "x" }"#,
            "route_specifiers[0].typed_config",
            "any.required",
        ),
        row(
            R,
            format!(
                r#"response_headers_to_add {{ header {{ key: "x" raw_value: "{}" }} }}"#,
                long(16385)
            ),
            "response_headers_to_add[0].header.raw_value",
            "bytes.max_len",
        ),
        row(
            R,
            format!(
                "vhds {{ config_source {{ {} }} }}",
                api_config_source("rate_limit_settings { fill_rate { value: -1 } }")
            ),
            "vhds.config_source.api_config_source.rate_limit_settings.fill_rate",
            "double.gt",
        ),
        row(
            R,
            vh("retry_policy { retry_back_off { base_interval {} } }"),
            "virtual_hosts[0].retry_policy.retry_back_off.base_interval",
            "duration.gt",
        ),
        row(
            R,
            r#"vhds { config_source { path_config_source { path: "/x" poll_interval { nanos: 1 } } } }"#,
            "vhds.config_source.path_config_source.poll_interval",
            "duration.gte",
        ),
        row(
            R,
            vh("retry_policy { retry_back_off {} }"),
            "virtual_hosts[0].retry_policy.retry_back_off.base_interval",
            "duration.required",
        ),
        row(
            R,
            limit("x_ratelimit_option: 9"),
            "virtual_hosts[0].rate_limits[0].x_ratelimit_option",
            "enum.defined",
        ),
        row(
            R,
            vh("require_tls: 9"),
            "virtual_hosts[0].require_tls",
            "enum.defined_only",
        ),
        row(
            R,
            vh("retry_policy { per_try_timeout { seconds: -1 } }"),
            "virtual_hosts[0].retry_policy.per_try_timeout",
            "envoy.duration",
        ),
        row(
            R,
            r#"metadata { filter_metadata { key: "" value {} } }"#,
            r#"metadata.filter_metadata[""]"#,
            "string.min_len",
        )
        .also(&["map.keys"]),
        row(
            R,
            vh(&format!("matcher {{ matcher_tree {{ {MATCH_TREE} }} }}")),
            "virtual_hosts[0].matcher.matcher_tree.exact_match_map.map",
            "map.min_pairs",
        ),
        row(
            R,
            "response_headers_to_add {}",
            "response_headers_to_add[0].header",
            "message.required",
        ),
        row(
            R,
            vh(r#"routes { match { prefix: "/" } }"#),
            "virtual_hosts[0].routes[0].action",
            "oneof.required",
        ),
        row(
            R,
            r#"internal_only_headers: "a\nb""#,
            "internal_only_headers[0]",
            "string.well_known_regex",
        )
        .also(&["repeated.items"]),
        row(R, many, "response_headers_to_add", "repeated.max_items"),
        row(
            R,
            r#"virtual_hosts { name: "v" }"#,
            "virtual_hosts[0].domains",
            "repeated.min_items",
        ),
        row(
            R,
            action(
                r#"cluster: "c" internal_redirect_policy { response_headers_to_copy: "x" response_headers_to_copy: "x" }"#,
            ),
            "virtual_hosts[0].routes[0].route.internal_redirect_policy.response_headers_to_copy",
            "repeated.unique",
        ),
        row(
            R,
            limit(r#"hits_addend { format: "x%" }"#),
            "virtual_hosts[0].rate_limits[0].hits_addend.format",
            "string.prefix",
        )
        .also(&["string.ignore_empty"]),
        row(
            R,
            limit(r#"hits_addend { format: "%x" }"#),
            "virtual_hosts[0].rate_limits[0].hits_addend.format",
            "string.suffix",
        ),
        row(
            R,
            format!(
                r#"response_headers_to_add {{ header {{ key: "{}" }} }}"#,
                long(16385)
            ),
            "response_headers_to_add[0].header.key",
            "string.max_bytes",
        ),
        row(
            R,
            r#"virtual_hosts { name: "" domains: "*" }"#,
            "virtual_hosts[0].name",
            "string.min_len",
        ),
        row(
            R,
            vh(r#"routes { match { path_separated_prefix: "/a/" } route { cluster: "c" } }"#),
            "virtual_hosts[0].routes[0].match.path_separated_prefix",
            "string.pattern",
        ),
        row(
            R,
            vh("hedge_policy { initial_requests { value: 0 } }"),
            "virtual_hosts[0].hedge_policy.initial_requests",
            "uint32.gte",
        ),
        row(
            R,
            route("direct_response { status: 600 }"),
            "virtual_hosts[0].routes[0].direct_response.status",
            "uint32.gte+lt",
        ),
        row(
            R,
            limit("stage { value: 11 }"),
            "virtual_hosts[0].rate_limits[0].stage",
            "uint32.lte",
        ),
        row(
            R,
            limit("hits_addend { number { value: 1000000001 } }"),
            "virtual_hosts[0].rate_limits[0].hits_addend.number",
            "uint64.lte",
        ),
        // Load rules.
        full(R, vh(""), "name", "xds.name"),
        row(
            R,
            format!(
                r#"{} virtual_hosts {{ name: "v" domains: "b.example" }}"#,
                vh("")
            ),
            "virtual_hosts[1].name",
            "meshkit.virtual_host_name",
        ),
        row(
            R,
            r#"virtual_hosts { name: "a" domains: "A.example" } virtual_hosts { name: "b" domains: "a.example" }"#,
            "virtual_hosts[1].domains[0]",
            "envoy.route.duplicate_domain",
        ),
        row(
            R,
            r#"virtual_hosts { name: "a" domains: "*" } virtual_hosts { name: "b" domains: "*" }"#,
            "virtual_hosts[1].domains[0]",
            "envoy.route.duplicate_domain",
        ),
        row(
            R,
            r#"request_headers_to_add { header { key: ":path" value: "/" } }"#,
            "request_headers_to_add[0].header.key",
            "envoy.route.header",
        ),
        row(
            R,
            vh(r#"response_headers_to_remove: "Host""#),
            "virtual_hosts[0].response_headers_to_remove[0]",
            "envoy.route.header",
        ),
        row(
            R,
            action(
                r#"cluster: "c" internal_redirect_policy { response_headers_to_copy: ":status" }"#,
            ),
            "virtual_hosts[0].routes[0].route.internal_redirect_policy.response_headers_to_copy[0]",
            "envoy.route.header",
        ),
        row(
            R,
            r#"request_mirror_policies { cluster: "a" cluster_header: "x-c" }"#,
            "request_mirror_policies[0].cluster",
            "envoy.route.mirror_policy",
        ),
        row(
            R,
            action(
                r#"cluster: "c" prefix_rewrite: "/a" regex_rewrite { pattern { regex: "a" } substitution: "b" }"#,
            ),
            "virtual_hosts[0].routes[0].route.prefix_rewrite",
            "envoy.route.rewrite",
        ),
        row(
            R,
            vh(
                r#"routes { match { path_match_policy { name: "m" typed_config {} } } route { cluster: "c" prefix_rewrite: "/a" } }"#,
            ),
            "virtual_hosts[0].routes[0].route.prefix_rewrite",
            "envoy.route.rewrite",
        ),
        row(
            R,
            action(r#"weighted_clusters { clusters { name: "a" weight { value: 0 } } }"#),
            "virtual_hosts[0].routes[0].route.weighted_clusters.clusters",
            "envoy.route.weighted_clusters",
        ),
        row(
            R,
            action(
                r#"weighted_clusters { clusters { name: "a" weight { value: 1 } request_headers_to_remove: ":authority" } }"#,
            ),
            "virtual_hosts[0].routes[0].route.weighted_clusters.clusters[0].request_headers_to_remove[0]",
            "envoy.route.header",
        ),
        row(
            R,
            action(r#"cluster_specifier_plugin: "p""#),
            "virtual_hosts[0].routes[0].route.cluster_specifier_plugin",
            "envoy.route.cluster_specifier_plugin",
        ),
        row(
            R,
            action(
                r#"cluster: "c" upgrade_configs { upgrade_type: "websocket" } upgrade_configs { upgrade_type: "WebSocket" }"#,
            ),
            "virtual_hosts[0].routes[0].route.upgrade_configs[1].upgrade_type",
            "envoy.route.upgrade_configs",
        ),
        row(
            R,
            action(
                r#"cluster: "c" upgrade_configs { upgrade_type: "websocket" connect_config {} }"#,
            ),
            "virtual_hosts[0].routes[0].route.upgrade_configs[0].connect_config",
            "envoy.route.upgrade_configs",
        ),
        row(
            R,
            vh(
                "retry_policy { retry_back_off { base_interval { seconds: 2 } max_interval { seconds: 1 } } }",
            ),
            "virtual_hosts[0].retry_policy.retry_back_off.max_interval",
            "envoy.route.retry_back_off",
        ),
    ]
}

fn cluster_rows() -> Vec<Row> {
    use Ty::Cluster as C;
    let hc = |inner: &str| format!("health_checks {{ {HEALTH} {inner} }}");
    let http_hc = |inner: &str| hc(&format!(r#"http_health_check {{ path: "/" {inner} }}"#));
    let many = (0..1001)
        .map(|_| r#"request_headers_to_add { header { key: "x" } }"#)
        .collect::<Vec<_>>()
        .join(" ");
    let static_ep = |addr: &str| {
        format!(
            r#"load_assignment {{ cluster_name: "c" endpoints {{ lb_endpoints {{ endpoint {{ address {{ {addr} }} }} }} }} }}"#
        )
    };
    vec![
        row(
            C,
            r#"upstream_config { name: "u" }"#,
            "upstream_config.typed_config",
            "any.required",
        ),
        row(
            C,
            http_hc(&format!(
                r#"request_headers_to_add {{ header {{ key: "x" raw_value: "{}" }} }}"#,
                long(16385)
            )),
            "health_checks[0].http_health_check.request_headers_to_add[0].header.raw_value",
            "bytes.max_len",
        ),
        row(
            C,
            format!(
                "lrs_server {{ {} }}",
                api_config_source("rate_limit_settings { fill_rate { value: 0 } }")
            ),
            "lrs_server.api_config_source.rate_limit_settings.fill_rate",
            "double.gt",
        ),
        row(
            C,
            "preconnect_policy { per_upstream_preconnect_ratio { value: 0.5 } }",
            "preconnect_policy.per_upstream_preconnect_ratio",
            "double.gte+lte",
        )
        .also(&["double.lte"]),
        row(C, "connect_timeout {}", "connect_timeout", "duration.gt"),
        row(
            C,
            "http2_protocol_options { connection_keepalive { interval { nanos: 1 } timeout { seconds: 1 } } }",
            "http2_protocol_options.connection_keepalive.interval",
            "duration.gte",
        ),
        row(
            C,
            r#"health_checks { interval { seconds: 1 } unhealthy_threshold { value: 1 } healthy_threshold { value: 1 } tcp_health_check {} }"#,
            "health_checks[0].timeout",
            "duration.required",
        ),
        row(
            C,
            "protocol_selection: 9",
            "protocol_selection",
            "enum.defined",
        ),
        row(C, "type: 9", "type", "enum.defined_only"),
        // The issue's first defect: an undefined LB policy was ACKed.
        row(C, "lb_policy: 99", "lb_policy", "enum.defined_only"),
        row(
            C,
            http_hc("method: CONNECT"),
            "health_checks[0].http_health_check.method",
            "enum.not_in",
        ),
        row(
            C,
            "connect_timeout { seconds: -1 }",
            "connect_timeout",
            "envoy.duration",
        ),
        row(
            C,
            "connect_timeout { nanos: 1000000000 }",
            "connect_timeout",
            "envoy.duration",
        ),
        row(
            C,
            r#"metadata { filter_metadata { key: "" value {} } }"#,
            r#"metadata.filter_metadata[""]"#,
            "string.min_len",
        )
        .also(&["map.keys"]),
        row(
            C,
            format!("transport_socket_matcher {{ matcher_tree {{ {MATCH_TREE} }} }}"),
            "transport_socket_matcher.matcher_tree.exact_match_map.map",
            "map.min_pairs",
        ),
        row(
            C,
            "health_checks { timeout { seconds: 1 } interval { seconds: 1 } healthy_threshold { value: 1 } tcp_health_check {} }",
            "health_checks[0].unhealthy_threshold",
            "message.required",
        ),
        row(
            C,
            hc(""),
            "health_checks[0].health_checker",
            "oneof.required",
        ),
        row(
            C,
            http_hc(r#"request_headers_to_remove: "a\nb""#),
            "health_checks[0].http_health_check.request_headers_to_remove[0]",
            "string.well_known_regex",
        )
        .also(&["repeated.items"]),
        row(
            C,
            http_hc(&many),
            "health_checks[0].http_health_check.request_headers_to_add",
            "repeated.max_items",
        ),
        row(
            C,
            "dns_resolution_config {}",
            "dns_resolution_config.resolvers",
            "repeated.min_items",
        ),
        row(
            C,
            r#"upstream_http_protocol_options { override_auto_sni_header: "a b" }"#,
            "upstream_http_protocol_options.override_auto_sni_header",
            "string.well_known_regex",
        )
        .also(&["string.ignore_empty"]),
        row(
            C,
            http_hc(&format!(
                r#"request_headers_to_add {{ header {{ key: "{}" }} }}"#,
                long(16385)
            )),
            "health_checks[0].http_health_check.request_headers_to_add[0].header.key",
            "string.max_bytes",
        ),
        full(
            C,
            "connect_timeout { seconds: 1 }",
            "name",
            "string.min_len",
        ),
        row(
            C,
            "common_http_protocol_options { max_response_headers_kb { value: 0 } }",
            "common_http_protocol_options.max_response_headers_kb",
            "uint32.gt+lte",
        ),
        row(
            C,
            "http2_protocol_options { max_concurrent_streams { value: 0 } }",
            "http2_protocol_options.max_concurrent_streams",
            "uint32.gte+lte",
        )
        .also(&["uint32.lte"]),
        row(
            C,
            hc(
                "tcp_health_check { proxy_protocol_config { pass_through_tlvs { tlv_type: 256 } } }",
            ),
            "health_checks[0].tcp_health_check.proxy_protocol_config.pass_through_tlvs.tlv_type[0]",
            "uint32.lt",
        ),
        row(
            C,
            "ring_hash_lb_config { minimum_ring_size { value: 8388609 } }",
            "ring_hash_lb_config.minimum_ring_size",
            "uint64.lte",
        ),
        // Load rules.
        row(
            C,
            "type: ORIGINAL_DST",
            "lb_policy",
            "envoy.cluster.original_dst",
        ),
        row(
            C,
            r#"type: ORIGINAL_DST lb_policy: CLUSTER_PROVIDED load_assignment { cluster_name: "c" }"#,
            "load_assignment",
            "envoy.cluster.original_dst",
        ),
        row(
            C,
            r#"type: ORIGINAL_DST lb_policy: CLUSTER_PROVIDED original_dst_lb_config { http_header_name: "x-dst" }"#,
            "original_dst_lb_config.http_header_name",
            "envoy.cluster.original_dst",
        ),
        // The issue's second defect: an EDS cluster with a cluster-provided LB was ACKed.
        row(
            C,
            "type: EDS eds_cluster_config { eds_config { ads {} } } lb_policy: CLUSTER_PROVIDED",
            "lb_policy",
            "envoy.cluster.cluster_provided",
        ),
        row(
            C,
            r#"type: ORIGINAL_DST lb_policy: CLUSTER_PROVIDED lb_subset_config { subset_selectors { keys: "k" } }"#,
            "lb_subset_config",
            "envoy.cluster.cluster_provided",
        ),
        row(
            C,
            "lb_policy: LOAD_BALANCING_POLICY_CONFIG",
            "load_balancing_policy",
            "envoy.cluster.load_balancing_policy",
        ),
        row(
            C,
            r#"load_balancing_policy { policies { typed_extension_config { name: "p" typed_config {} } } } lb_subset_config {}"#,
            "lb_subset_config",
            "envoy.cluster.load_balancing_policy",
        ),
        row(
            C,
            r#"load_balancing_policy { policies { typed_extension_config { name: "p" typed_config {} } } } common_lb_config { zone_aware_lb_config {} }"#,
            "common_lb_config.zone_aware_lb_config",
            "envoy.cluster.load_balancing_policy",
        ),
        row(
            C,
            "lb_subset_config { locality_weight_aware: true }",
            "lb_subset_config.locality_weight_aware",
            "envoy.cluster.locality_weight_aware",
        ),
        row(
            C,
            "eds_cluster_config { eds_config { ads {} } }",
            "eds_cluster_config",
            "envoy.cluster.eds_cluster_config",
        ),
        row(
            C,
            "type: EDS",
            "eds_cluster_config",
            "envoy.cluster.eds_cluster_config",
        ),
        row(
            C,
            "http_protocol_options {} http2_protocol_options {}",
            "http2_protocol_options",
            "envoy.cluster.protocol_options",
        ),
        row(
            C,
            r#"filters { name: "f" typed_config {} config_discovery { config_source { ads {} } type_urls: "t" } }"#,
            "filters[0].config_discovery",
            "envoy.cluster.filters",
        ),
        row(
            C,
            r#"upstream_bind_config { source_address { address: "10.0.0.1" port_value: 0 } extra_source_addresses { address { address: "10.0.0.2" port_value: 0 } } additional_source_addresses { address: "10.0.0.3" port_value: 0 } }"#,
            "upstream_bind_config.additional_source_addresses",
            "envoy.cluster.bind_config",
        ),
        row(
            C,
            r#"upstream_bind_config { extra_source_addresses { address { address: "10.0.0.2" port_value: 0 } } }"#,
            "upstream_bind_config.source_address",
            "envoy.cluster.bind_config",
        ),
        row(
            C,
            r#"upstream_bind_config { source_address { address: "host.example" port_value: 0 } }"#,
            "upstream_bind_config.source_address.address",
            "envoy.address.resolve",
        ),
        row(
            C,
            "circuit_breakers { per_host_thresholds { max_requests { value: 1 } } }",
            "circuit_breakers.per_host_thresholds[0].max_requests",
            "envoy.cluster.per_host_thresholds",
        ),
        row(
            C,
            format!(
                r#"type: LOGICAL_DNS load_assignment {{ cluster_name: "c" endpoints {{ lb_endpoints {{ {EP} }} lb_endpoints {{ {EP} }} }} }}"#
            ),
            "load_assignment",
            "envoy.cluster.logical_dns",
        ),
        row(
            C,
            r#"type: LOGICAL_DNS load_assignment { cluster_name: "c" endpoints { lb_endpoints { endpoint { address { socket_address { address: "svc" port_value: 80 resolver_name: "r" } } } } } }"#,
            "load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address.resolver_name",
            "envoy.cluster.logical_dns",
        ),
        row(
            C,
            static_ep(r#"socket_address { address: "backend.example" port_value: 80 }"#),
            "load_assignment.endpoints[0].lb_endpoints[0].endpoint.address.socket_address.address",
            "envoy.address.resolve",
        ),
        row(
            C,
            r#"load_assignment { cluster_name: "c" endpoints { lb_endpoints { endpoint {} } } }"#,
            "load_assignment.endpoints[0].lb_endpoints[0].endpoint.address",
            "envoy.endpoint.address",
        ),
        row(
            C,
            r#"load_assignment { cluster_name: "c" policy { drop_overloads { category: "a" drop_percentage { numerator: 1 } } drop_overloads { category: "b" drop_percentage { numerator: 1 } } } }"#,
            "load_assignment.policy.drop_overloads[1]",
            "envoy.endpoint.drop_overloads",
        ),
    ]
}

fn endpoint_rows() -> Vec<Row> {
    use Ty::Endpoint as E;
    let lb = |inner: &str| format!("endpoints {{ lb_endpoints {{ {inner} }} }}");
    vec![
        row(
            E,
            leds(&api_config_source(r#"config_validators { name: "v" }"#)),
            "endpoints[0].leds_cluster_locality_config.leds_config.api_config_source.config_validators[0].typed_config",
            "any.required",
        ),
        row(
            E,
            leds(&grpc_service(&format!(
                r#"initial_metadata {{ key: "k" raw_value: "{}" }}"#,
                long(16385)
            ))),
            "endpoints[0].leds_cluster_locality_config.leds_config.api_config_source.grpc_services[0].initial_metadata[0].raw_value",
            "bytes.max_len",
        ),
        row(
            E,
            leds(&api_config_source(
                "rate_limit_settings { fill_rate { value: 0 } }",
            )),
            "endpoints[0].leds_cluster_locality_config.leds_config.api_config_source.rate_limit_settings.fill_rate",
            "double.gt",
        ),
        row(
            E,
            "policy { endpoint_stale_after {} }",
            "policy.endpoint_stale_after",
            "duration.gt",
        ),
        row(
            E,
            leds(r#"path_config_source { path: "/x" poll_interval { nanos: 1 } }"#),
            "endpoints[0].leds_cluster_locality_config.leds_config.path_config_source.poll_interval",
            "duration.gte",
        ),
        row(
            E,
            leds(&grpc_service("retry_policy { retry_back_off {} }")),
            "endpoints[0].leds_cluster_locality_config.leds_config.api_config_source.grpc_services[0].retry_policy.retry_back_off.base_interval",
            "duration.required",
        ),
        row(
            E,
            lb(&format!("{EP} health_status: 9")),
            "endpoints[0].lb_endpoints[0].health_status",
            "enum.defined",
        ),
        row(
            E,
            leds("ads {} resource_api_version: 9"),
            "endpoints[0].leds_cluster_locality_config.leds_config.resource_api_version",
            "enum.defined_only",
        ),
        row(
            E,
            "policy { endpoint_stale_after { seconds: -1 } }",
            "policy.endpoint_stale_after",
            "envoy.duration",
        ),
        row(
            E,
            r#"endpoints { metadata { filter_metadata { key: "" value {} } } }"#,
            r#"endpoints[0].metadata.filter_metadata[""]"#,
            "string.min_len",
        )
        .also(&["map.keys"]),
        row(
            E,
            r#"named_endpoints { key: "n" value { address {} } }"#,
            r#"named_endpoints["n"].address.address"#,
            "oneof.required",
        ),
        row(
            E,
            leds(&api_config_source(&format!(
                r#"grpc_services {{ envoy_grpc {{ cluster_name: "x" authority: "{}" }} }}"#,
                long(16385)
            ))),
            "endpoints[0].leds_cluster_locality_config.leds_config.api_config_source.grpc_services[0].envoy_grpc.authority",
            "string.max_bytes",
        ),
        row(
            E,
            leds(&api_config_source(
                r#"grpc_services { envoy_grpc { cluster_name: "x" authority: "a\nb" } }"#,
            )),
            "endpoints[0].leds_cluster_locality_config.leds_config.api_config_source.grpc_services[0].envoy_grpc.authority",
            "string.well_known_regex",
        ),
        full(E, "", "cluster_name", "string.min_len"),
        row(
            E,
            "policy { overprovisioning_factor { value: 0 } }",
            "policy.overprovisioning_factor",
            "uint32.gt",
        ),
        row(
            E,
            "endpoints { load_balancing_weight { value: 0 } }",
            "endpoints[0].load_balancing_weight",
            "uint32.gte",
        ),
        row(
            E,
            "endpoints { priority: 129 }",
            "endpoints[0].priority",
            "uint32.lte",
        ),
        // Load rules.
        row(
            E,
            format!(
                r#"endpoints {{ lb_endpoints {{ {EP} }} leds_cluster_locality_config {{ leds_collection_name: "x" leds_config {{ ads {{}} }} }} }}"#
            ),
            "endpoints[0].leds_cluster_locality_config",
            "envoy.endpoint.leds",
        ),
        row(
            E,
            r#"policy { drop_overloads { category: "a" drop_percentage { numerator: 1 } } drop_overloads { category: "b" drop_percentage { numerator: 1 } } }"#,
            "policy.drop_overloads[1]",
            "envoy.endpoint.drop_overloads",
        ),
        row(
            E,
            r#"policy { drop_overloads { category: "a" drop_percentage { numerator: 101 } } }"#,
            "policy.drop_overloads[0].drop_percentage.numerator",
            "envoy.endpoint.drop_overloads",
        ),
        row(
            E,
            lb("endpoint {}"),
            "endpoints[0].lb_endpoints[0].endpoint.address",
            "envoy.endpoint.address",
        ),
        row(
            E,
            lb(r#"endpoint_name: "n""#),
            "endpoints[0].lb_endpoints[0].endpoint",
            "envoy.endpoint.address",
        ),
        row(
            E,
            lb(
                r#"endpoint { address { socket_address { address: "10.0.0.1" port_value: 80 } } additional_addresses {} }"#,
            ),
            "endpoints[0].lb_endpoints[0].endpoint.additional_addresses[0].address",
            "envoy.endpoint.address",
        ),
        row(
            E,
            lb(
                r#"endpoint { address { socket_address { address: "backend.example" port_value: 80 } } }"#,
            ),
            "endpoints[0].lb_endpoints[0].endpoint.address.socket_address.address",
            "envoy.address.resolve",
        ),
        row(
            E,
            lb(
                r#"endpoint { address { pipe { path: "/tmp/b" } } health_check_config { port_value: 8080 } }"#,
            ),
            "endpoints[0].lb_endpoints[0].endpoint.health_check_config.port_value",
            "envoy.endpoint.health_check",
        ),
    ]
}

fn secret_rows() -> Vec<Row> {
    use Ty::Secret as S;
    let hash = |n: usize| {
        format!(
            r#"validation_context {{ verify_certificate_hash: "{}" }}"#,
            "A".repeat(n)
        )
    };
    vec![
        row(
            S,
            r#"validation_context { custom_validator_config { name: "v" } }"#,
            "validation_context.custom_validator_config.typed_config",
            "any.required",
        ),
        row(
            S,
            "tls_certificate { tls_params { compliance_policies: 9 } }",
            "tls_certificate.tls_params.compliance_policies[0]",
            "enum.defined",
        ),
        row(
            S,
            "validation_context { trust_chain_verification: 9 }",
            "validation_context.trust_chain_verification",
            "enum.defined_only",
        ),
        row(
            S,
            r#"validation_context { match_typed_subject_alt_names { matcher { exact: "a" } } }"#,
            "validation_context.match_typed_subject_alt_names[0].san_type",
            "enum.not_in",
        ),
        row(
            S,
            "validation_context { match_typed_subject_alt_names { san_type: DNS } }",
            "validation_context.match_typed_subject_alt_names[0].matcher",
            "message.required",
        ),
        row(
            S,
            "tls_certificate { certificate_chain {} }",
            "tls_certificate.certificate_chain.specifier",
            "oneof.required",
        ),
        row(
            S,
            hash(2),
            "validation_context.verify_certificate_hash[0]",
            "string.min_len",
        )
        .also(&["repeated.items"]),
        row(
            S,
            hash(96),
            "validation_context.verify_certificate_hash[0]",
            "string.max_bytes",
        ),
        row(
            S,
            "tls_certificate { tls_params { compliance_policies: FIPS_202205 compliance_policies: FIPS_202205 } }",
            "tls_certificate.tls_params.compliance_policies",
            "repeated.max_items",
        ),
        row(
            S,
            "session_ticket_keys {}",
            "session_ticket_keys.keys",
            "repeated.min_items",
        ),
        row(
            S,
            "validation_context { max_verify_depth { value: 101 } }",
            "validation_context.max_verify_depth",
            "uint32.lte",
        ),
        // Load rules.
        full(
            S,
            r#"tls_certificate { certificate_chain { inline_string: "x" } }"#,
            "name",
            "xds.name",
        ),
    ]
}

fn all_rows() -> Vec<Row> {
    let mut rows = listener_rows();
    rows.extend(route_rows());
    rows.extend(cluster_rows());
    rows.extend(endpoint_rows());
    rows.extend(secret_rows());
    rows
}

// === parsing text format against the envoy-types protos ===

fn pool() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| {
        let proto = envoy_types_proto_dir();
        let includes: Vec<PathBuf> = [
            "data-plane-api",
            "xds",
            "protoc-gen-validate",
            "googleapis",
            "cel-spec/proto",
            "opentelemetry-proto",
            "client_model",
        ]
        .iter()
        .map(|p| proto.join(p))
        .collect();
        let mut c = protox::Compiler::new(includes).expect("protox");
        c.include_imports(true);
        c.open_files([
            "envoy/config/listener/v3/listener.proto",
            "envoy/config/route/v3/route.proto",
            "envoy/config/cluster/v3/cluster.proto",
            "envoy/config/endpoint/v3/endpoint.proto",
            "envoy/extensions/transport_sockets/tls/v3/secret.proto",
        ])
        .expect("compile the resource protos");
        c.descriptor_pool()
    })
}

/// The `proto/` folder of the envoy-types version in Cargo.lock (as the codegen test finds it).
fn envoy_types_proto_dir() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let lock = std::fs::read_to_string(root.join("../Cargo.lock")).expect("Cargo.lock");
    let version = lock
        .split("name = \"envoy-types\"\nversion = \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("envoy-types in Cargo.lock");
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .expect("CARGO_HOME or HOME");
    std::fs::read_dir(home.join("registry/src"))
        .expect("cargo registry")
        .filter_map(Result::ok)
        .map(|e| e.path().join(format!("envoy-types-{version}/proto")))
        .find(|p| p.is_dir())
        .expect("envoy-types sources in the cargo registry")
}

fn parse<T: Message + Default>(ty: Ty, text: &str) -> T {
    let desc = pool().get_message_by_name(ty.message()).expect("message");
    let dynamic = DynamicMessage::parse_text_format(desc, text).unwrap_or_else(|e| {
        panic!(
            "{ty:?}: {e}\n{}",
            text.chars().take(400).collect::<String>()
        )
    });
    T::decode(dynamic.encode_to_vec().as_slice()).expect("decodes as the envoy-types struct")
}

fn validate(ty: Ty, text: &str) -> Result<(), meshkit_xds_client::InvalidResource> {
    match ty {
        Ty::Listener => parse::<Listener>(ty, text).validate(),
        Ty::Route => parse::<RouteConfiguration>(ty, text).validate(),
        Ty::Cluster => parse::<Cluster>(ty, text).validate(),
        Ty::Endpoint => parse::<ClusterLoadAssignment>(ty, text).validate(),
        Ty::Secret => parse::<Secret>(ty, text).validate(),
    }
}

/// The kinds a row's rule stands for: `uint32.gte+lte` is `uint32.gte` and `uint32.lte`.
fn kinds_of(rule: &str) -> Vec<String> {
    let Some((ty, bounds)) = rule.split_once('.') else {
        return vec![rule.to_owned()];
    };
    if !bounds.contains('+') || ty == "envoy" {
        return vec![rule.to_owned()];
    }
    bounds.split('+').map(|b| format!("{ty}.{b}")).collect()
}

// === the tests ===

#[test]
fn every_row_is_rejected_for_its_rule_at_its_field() {
    let mut failures = Vec::new();
    for r in all_rows() {
        match validate(r.ty, &r.text) {
            Ok(()) => failures.push(format!("{:?} {} at {}: accepted", r.ty, r.rule, r.field)),
            Err(e) => {
                let v = e.violation().expect("built-in rules carry a violation");
                if v.field() != r.field || v.rule() != r.rule {
                    failures.push(format!(
                        "{:?} expected {} at {}, got {}",
                        r.ty, r.rule, r.field, v
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} rows failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn every_generated_kind_has_a_row_for_every_type() {
    let generated = include_str!("../src/validate/generated.rs");
    let rows = all_rows();
    let mut missing = Vec::new();
    let mut current = None;
    let section = generated
        .split("with a path to one field that has it:")
        .nth(1)
        .expect("the per-root section of the header");
    for line in section.lines().take_while(|l| l.starts_with("//")) {
        let line = line.trim_start_matches("//");
        if let Some(entry) = line.strip_prefix(' ').and_then(|l| l.split(' ').next())
            && !line.starts_with("  ")
        {
            current = [
                Ty::Listener,
                Ty::Route,
                Ty::Cluster,
                Ty::Endpoint,
                Ty::Secret,
            ]
            .into_iter()
            .find(|t| t.entry() == entry);
            continue;
        }
        let Some(ty) = current else { continue };
        let kind = line.trim().split(':').next().unwrap_or_default();
        let covered = rows.iter().any(|r| {
            r.ty == ty && (kinds_of(r.rule).iter().any(|k| k == kind) || r.also.contains(&kind))
        });
        if !covered {
            missing.push(format!("{ty:?}: {kind} ({})", line.trim()));
        }
    }
    assert!(
        missing.is_empty(),
        "kinds without a row:\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_load_rule_has_a_row() {
    let semantic = include_str!("../src/validate/semantic.rs");
    let mut rules = BTreeSet::new();
    for part in semantic.split('"').skip(1).step_by(2) {
        let is_rule = ["envoy.", "meshkit.", "xds."]
            .iter()
            .any(|p| part.starts_with(p))
            && part
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'_');
        if is_rule && part.matches('.').count() >= 1 && !part.starts_with("envoy.extensions") {
            rules.insert(part.to_owned());
        }
    }
    assert!(rules.len() > 30, "found only {rules:?}");
    let rows = all_rows();
    let missing: Vec<&String> = rules
        .iter()
        .filter(|rule| !rows.iter().any(|r| r.rule == rule.as_str()))
        .collect();
    assert!(missing.is_empty(), "load rules without a row: {missing:?}");
}

/// Resources of the shapes meshkit's control plane serves to a gateway (its translation is
/// tested against these rules in meshkit-control-plane's own tests), and the empty values the
/// `ignore_empty` rules let through.
#[test]
fn valid_resources_pass() {
    let valid = [
        (
            Ty::Listener,
            r#"name: "gateway-http" address { socket_address { address: "0.0.0.0" port_value: 8080 } }
            filter_chains { filters { name: "envoy.filters.network.http_connection_manager"
              typed_config { type_url: "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager" } } }
            filter_chains { filter_chain_match { server_names: "*.example.com" transport_protocol: "tls" prefix_ranges { address_prefix: "10.0.0.0" prefix_len { value: 8 } } }
              transport_socket { name: "envoy.transport_sockets.tls" typed_config { type_url: "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext" } } }
            listener_filters { name: "envoy.filters.listener.tls_inspector" typed_config { type_url: "type.googleapis.com/envoy.extensions.filters.listener.tls_inspector.v3.TlsInspector" } }"#,
        ),
        (
            Ty::Listener,
            r#"name: "internal" internal_listener {} filter_chains {}"#,
        ),
        (
            Ty::Listener,
            r#"name: "grpc-api" api_listener { api_listener { type_url: "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager" } }"#,
        ),
        (
            Ty::Listener,
            r#"name: "quic" address { socket_address { protocol: UDP address: "::" port_value: 443 } } udp_listener_config { quic_options {} }
            filter_chains { transport_socket { name: "envoy.transport_sockets.quic" typed_config { type_url: "type.googleapis.com/x" } } }"#,
        ),
        (
            Ty::Listener,
            r#"name: "v6" address { socket_address { address: "::" port_value: 80 ipv4_compat: true } } default_filter_chain {}"#,
        ),
        (
            Ty::Route,
            r#"name: "http" virtual_hosts { name: "shop" domains: "shop.example.com" domains: "*.shop.example.com"
            routes { match { prefix: "/api" } route { cluster: "outbound|8080||api.shop.svc.cluster.local" timeout { seconds: 15 } prefix_rewrite: "/"
              retry_policy { retry_on: "5xx" retry_back_off { base_interval { nanos: 25000000 } max_interval { seconds: 1 } } }
              upgrade_configs { upgrade_type: "websocket" } upgrade_configs { upgrade_type: "CONNECT" connect_config {} } } }
            routes { match { path: "/split" } route { weighted_clusters { clusters { name: "a" weight { value: 90 } } clusters { name: "b" weight { value: 10 } } } } }
            routes { match { prefix: "/" } redirect { https_redirect: true } }
            request_headers_to_add { header { key: "x-forwarded-by" value: "meshkit" } } }
            virtual_hosts { name: "default" domains: "*" routes { match { prefix: "/" } direct_response { status: 404 } } rate_limits { actions { source_cluster {} } hits_addend { format: "" } } }"#,
        ),
        (
            Ty::Cluster,
            r#"name: "outbound|8080||api.shop.svc.cluster.local" type: EDS eds_cluster_config { eds_config { ads {} resource_api_version: V3 } }
            connect_timeout { seconds: 5 } lb_policy: LEAST_REQUEST
            circuit_breakers { thresholds { max_connections { value: 1024 } } per_host_thresholds { max_connections { value: 16 } } }
            health_checks { timeout { seconds: 1 } interval { seconds: 5 } unhealthy_threshold { value: 3 } healthy_threshold { value: 2 } http_health_check { path: "/healthz" } }
            transport_socket { name: "envoy.transport_sockets.tls" typed_config { type_url: "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext" } }"#,
        ),
        (
            Ty::Cluster,
            r#"name: "static" connect_timeout { nanos: 250000000 } load_assignment { cluster_name: "static" endpoints { lb_endpoints { endpoint { address { socket_address { address: "127.0.0.1" port_value: 15008 } } } } } }"#,
        ),
        (
            Ty::Cluster,
            r#"name: "dns" type: STRICT_DNS load_assignment { cluster_name: "dns" endpoints { lb_endpoints { endpoint { address { socket_address { address: "backend.example" port_value: 443 } } } } } }"#,
        ),
        (
            Ty::Cluster,
            r#"name: "one" type: LOGICAL_DNS load_assignment { cluster_name: "one" endpoints { lb_endpoints { endpoint { address { socket_address { address: "api.example" port_value: 443 } } } } } }"#,
        ),
        (
            Ty::Cluster,
            r#"name: "passthrough" type: ORIGINAL_DST lb_policy: CLUSTER_PROVIDED"#,
        ),
        (
            Ty::Cluster,
            r#"name: "custom" cluster_type { name: "envoy.clusters.aggregate" typed_config { type_url: "type.googleapis.com/x" } } lb_policy: CLUSTER_PROVIDED"#,
        ),
        (
            Ty::Cluster,
            r#"name: "sni" upstream_http_protocol_options { override_auto_sni_header: "" }"#,
        ),
        (
            Ty::Endpoint,
            r#"cluster_name: "outbound|8080||api.shop.svc.cluster.local"
            endpoints { locality { region: "r" zone: "z" } load_balancing_weight { value: 3 }
              lb_endpoints { endpoint { address { socket_address { address: "10.1.2.3" port_value: 8080 } } health_check_config { port_value: 15021 } } health_status: HEALTHY load_balancing_weight { value: 1 } }
              lb_endpoints { endpoint { address { socket_address { address: "fe80::1%eth0" port_value: 8080 } } } } }
            endpoints { priority: 1 lb_endpoints { endpoint { address { envoy_internal_address { server_listener_name: "tunnel" } } } } }
            policy { drop_overloads { category: "throttle" drop_percentage { numerator: 100 } } overprovisioning_factor { value: 140 } }"#,
        ),
        (Ty::Endpoint, r#"cluster_name: "empty""#),
        (
            Ty::Secret,
            r#"name: "gateway-cert" tls_certificate { certificate_chain { inline_string: "-----BEGIN CERTIFICATE-----" } private_key { inline_bytes: "k" } }"#,
        ),
        (
            Ty::Secret,
            r#"name: "ca" validation_context { trusted_ca { filename: "/etc/ca.pem" } match_typed_subject_alt_names { san_type: URI matcher { prefix: "spiffe://cluster.local/" } } }"#,
        ),
    ];
    for (ty, text) in valid {
        if let Err(e) = validate(ty, text) {
            panic!("{ty:?} rejected: {e}\n{text}");
        }
    }
}

/// The rejection reaches the NACK named by resource and field, and the valid sibling of the
/// same response applies: the two defects the issue found, on the protocol core.
#[test]
fn nack_names_the_resource_and_the_field() {
    let cluster = |text: &str| -> Any {
        let c: Cluster = parse(Ty::Cluster, text);
        Any {
            type_url: CLUSTER_TYPE_URL.into(),
            value: c.encode_to_vec(),
        }
    };
    for mode in [Mode::StateOfTheWorld] {
        let now = Instant::now();
        let mut s = Session::new(SessionConfig::new(mode));
        s.subscribe_wildcard(ResourceType::of::<Cluster>());
        s.on_connected(now);
        while s.poll_request(now).is_some() {}
        s.handle_response(
            now,
            Response::Sotw(DiscoveryResponse {
                version_info: "1".into(),
                nonce: "n1".into(),
                type_url: CLUSTER_TYPE_URL.into(),
                resources: vec![
                    cluster(r#"name: "good" connect_timeout { seconds: 1 }"#),
                    cluster(r#"name: "undefined-lb" lb_policy: 99"#),
                    cluster(r#"name: "eds-provided" type: EDS eds_cluster_config { eds_config { ads {} } } lb_policy: CLUSTER_PROVIDED"#),
                ],
                ..Default::default()
            }),
        );
        let mut rejected = Vec::new();
        while let Some(ev) = s.poll_event() {
            if let Event::Rejected { name, error, .. } = ev {
                rejected.push((name, error));
            }
        }
        rejected.sort();
        assert_eq!(rejected.len(), 2, "{rejected:?}");
        assert_eq!(rejected[0].0.as_deref(), Some("eds-provided"));
        assert!(
            rejected[0]
                .1
                .starts_with("lb_policy: CLUSTER_PROVIDED needs"),
            "{rejected:?}"
        );
        assert!(
            rejected[0].1.ends_with("[envoy.cluster.cluster_provided]"),
            "{rejected:?}"
        );
        assert_eq!(rejected[1].0.as_deref(), Some("undefined-lb"));
        assert!(
            rejected[1]
                .1
                .starts_with("lb_policy: 99 is not a defined value"),
            "{rejected:?}"
        );
        let nack = std::iter::from_fn(|| s.poll_request(now))
            .find_map(|r| match r {
                Request::Sotw(r) => r.error_detail,
                Request::Delta(_) => None,
            })
            .expect("a NACK");
        assert!(
            nack.message.contains("undefined-lb: lb_policy: "),
            "{}",
            nack.message
        );
        assert!(
            nack.message.contains("eds-provided: lb_policy: "),
            "{}",
            nack.message
        );
        assert!(
            s.resource(CLUSTER_TYPE_URL, "good").is_some(),
            "the valid sibling applies"
        );
        assert!(s.resource(CLUSTER_TYPE_URL, "undefined-lb").is_none());
        assert!(s.resource(CLUSTER_TYPE_URL, "eds-provided").is_none());
    }
}
