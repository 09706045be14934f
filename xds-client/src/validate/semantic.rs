//! The rules Envoy applies when it loads a resource, beyond its protos' annotations; written by
//! hand from Envoy's loaders (listener manager, filter chain manager, route matcher, header
//! parser, cluster factories, cluster info, EDS), each named `envoy.<resource>.<rule>`. Two
//! rules are meshkit's own and named `meshkit.*`.
//!
//! They run after the generated schema checks, so a field they read holds a value its type
//! allows (a defined enum value, a set required oneof).

use std::borrow::Cow;
use std::net::{IpAddr, Ipv6Addr};

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::cluster::v3::cluster::{
    ClusterDiscoveryType, ClusterProtocolSelection, DiscoveryType, LbConfig, LbPolicy,
    common_lb_config::LocalityConfigSpecifier,
};
use envoy_types::pb::envoy::config::core::v3::address::Address as AddressKind;
use envoy_types::pb::envoy::config::core::v3::socket_address::{PortSpecifier, Protocol};
use envoy_types::pb::envoy::config::core::v3::{
    Address, HeaderValueOption, RoutingPriority, SocketAddress,
};
use envoy_types::pb::envoy::config::endpoint::v3::cluster_load_assignment::Policy;
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::envoy::config::endpoint::v3::locality_lb_endpoints::LbConfig as LocalityLbConfig;
use envoy_types::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, Endpoint, LbEndpoint};
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::listener::v3::listener::ListenerSpecifier;
use envoy_types::pb::envoy::config::listener::v3::listener::connection_balance_config::BalanceType;
use envoy_types::pb::envoy::config::route::v3::route::Action;
use envoy_types::pb::envoy::config::route::v3::route_action::{
    ClusterSpecifier, RequestMirrorPolicy,
};
use envoy_types::pb::envoy::config::route::v3::route_match::PathSpecifier;
use envoy_types::pb::envoy::config::route::v3::{
    RetryPolicy, Route, RouteAction, RouteConfiguration,
};
use envoy_types::pb::envoy::r#type::v3::fractional_percent::DenominatorType;
use foldhash::{HashMap as FastMap, HashMapExt, HashSet as FastSet, HashSetExt};
use prost::Message;

use super::support::{Seg, Violation};

type R = Result<(), Violation>;

fn fail(seg: Seg, rule: &'static str, message: impl Into<Cow<'static, str>>) -> R {
    Err(Violation::new(seg, rule, message))
}

/// Adds the enclosing segments, outermost last, to a violation.
fn within(r: R, segs: impl IntoIterator<Item = Seg>) -> R {
    r.map_err(|mut v| {
        for s in segs {
            v = v.at(s);
        }
        v
    })
}

/// The xDS resource name: the protocol core keys its cache by it.
pub(crate) fn name(field: &'static str, name: &str) -> R {
    if name.is_empty() {
        return fail(
            Seg::Field(field),
            "xds.name",
            "must not be empty (it is the resource's name)",
        );
    }
    Ok(())
}

// === addresses ===

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum SocketType {
    Stream,
    Datagram,
}

/// Envoy's `protobufAddressSocketType`: UDP socket addresses are datagram, the rest stream.
fn socket_type(a: &Address) -> SocketType {
    match &a.address {
        Some(AddressKind::SocketAddress(s)) if s.protocol == Protocol::Udp as i32 => {
            SocketType::Datagram
        }
        _ => SocketType::Stream,
    }
}

/// An IP literal as Envoy's IP resolver parses it: IPv4, or IPv6 with an optional `%scope`.
fn parse_ip(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    let (addr, scope) = s.split_once('%')?;
    if scope.is_empty() {
        return None;
    }
    addr.parse::<Ipv6Addr>().ok().map(IpAddr::V6)
}

/// `envoy.address.resolve`: a socket address without a `resolver_name` goes to Envoy's IP
/// resolver, which takes an IP literal and a `port_value` (not a `named_port`).
fn socket_resolvable(s: &SocketAddress) -> R {
    if !s.resolver_name.is_empty() {
        // A custom resolver: which ones exist is the proxy's business.
        return Ok(());
    }
    if matches!(s.port_specifier, Some(PortSpecifier::NamedPort(_))) {
        return fail(
            Seg::Field("named_port"),
            "envoy.address.resolve",
            "the default (IP) resolver takes a port_value, not a named_port",
        );
    }
    if parse_ip(&s.address).is_none() {
        return fail(
            Seg::Field("address"),
            "envoy.address.resolve",
            "must be an IP address: the default resolver does not look names up",
        );
    }
    Ok(())
}

/// Envoy's `resolveProtoAddress`, as far as it can be decided without the proxy.
fn resolvable(a: &Address) -> R {
    match &a.address {
        None => fail(
            Seg::Field("address"),
            "envoy.address.resolve",
            "must be set",
        ),
        Some(AddressKind::SocketAddress(s)) => {
            within(socket_resolvable(s), [Seg::Field("socket_address")])
        }
        // The schema requires a pipe path and an internal address name.
        Some(_) => Ok(()),
    }
}

/// `envoy.listener.ipv4_compat`: only `::` or an IPv4-mapped IPv6 address may set it.
fn ipv4_compat(a: &Address) -> R {
    let Some(AddressKind::SocketAddress(s)) = &a.address else {
        return Ok(());
    };
    if !s.ipv4_compat || !s.resolver_name.is_empty() {
        return Ok(());
    }
    let ok = match parse_ip(&s.address) {
        Some(IpAddr::V6(v6)) => v6.is_unspecified() || v6.to_ipv4_mapped().is_some(),
        _ => false,
    };
    if ok {
        return Ok(());
    }
    within(
        fail(
            Seg::Field("ipv4_compat"),
            "envoy.listener.ipv4_compat",
            "only the IPv6 address :: or an IPv4-mapped IPv6 address can set ipv4_compat",
        ),
        [Seg::Field("socket_address")],
    )
}

// === Listener ===

/// Envoy's listener manager, listener and filter chain manager.
pub(crate) fn listener(l: &Listener) -> R {
    let internal = matches!(
        l.listener_specifier,
        Some(ListenerSpecifier::InternalListener(_))
    );
    match &l.address {
        None if !internal && l.api_listener.is_none() => {
            return fail(
                Seg::Field("address"),
                "envoy.listener.address",
                "is required unless internal_listener (or api_listener) is set",
            );
        }
        Some(_) if internal => {
            return fail(
                Seg::Field("address"),
                "envoy.listener.internal_listener",
                "must not be set when internal_listener is",
            );
        }
        _ => {}
    }
    if internal {
        internal_listener(l)?;
    }
    if let Some(a) = &l.address {
        within(listener_address(a), [Seg::Field("address")])?;
        let ty = socket_type(a);
        for (i, extra) in l.additional_addresses.iter().enumerate() {
            let at = |r| {
                within(
                    r,
                    [Seg::Field("address"), Seg::Index("additional_addresses", i)],
                )
            };
            let Some(ea) = &extra.address else {
                return within(
                    fail(
                        Seg::Field("address"),
                        "envoy.address.resolve",
                        "must be set",
                    ),
                    [Seg::Index("additional_addresses", i)],
                );
            };
            if socket_type(ea) != ty {
                return within(
                    fail(
                        Seg::Field("address"),
                        "envoy.listener.socket_type",
                        "must have the socket type (TCP or UDP) of the listener's address",
                    ),
                    [Seg::Index("additional_addresses", i)],
                );
            }
            at(listener_address(ea))?;
        }
    }
    let ty = match &l.address {
        Some(a) => socket_type(a),
        None => SocketType::Stream,
    };
    if l.enable_mptcp {
        let ip = matches!(
            &l.address,
            Some(Address {
                address: Some(AddressKind::SocketAddress(_))
            })
        );
        if ty != SocketType::Stream || !ip {
            return fail(
                Seg::Field("enable_mptcp"),
                "envoy.listener.mptcp",
                "can only be used with TCP listeners on IP addresses",
            );
        }
    }
    if l.address.is_none() && !internal {
        // An API listener: it has no sockets and no filter chains to check.
        return Ok(());
    }
    let quic = ty == SocketType::Datagram
        && l.udp_listener_config
            .as_ref()
            .is_some_and(|u| u.quic_options.is_some());
    let has_chains = !l.filter_chains.is_empty() || l.default_filter_chain.is_some();
    if (ty == SocketType::Stream || quic) && !has_chains {
        return fail(
            Seg::Field("filter_chains"),
            "envoy.listener.filter_chains",
            "a TCP or QUIC listener needs a filter chain or a default_filter_chain",
        );
    }
    if ty == SocketType::Datagram && !quic && has_chains {
        return fail(
            Seg::Field("filter_chains"),
            "envoy.listener.filter_chains",
            "a UDP listener without quic_options takes no filter chains",
        );
    }
    if quic {
        if l.connection_balance_config.is_some() {
            return fail(
                Seg::Field("connection_balance_config"),
                "envoy.listener.quic",
                "does not work with a QUIC listener",
            );
        }
        for (i, fc) in l.filter_chains.iter().enumerate() {
            if fc.transport_socket.is_none() {
                return within(
                    fail(
                        Seg::Field("transport_socket"),
                        "envoy.listener.quic",
                        "is required on the filter chains of a QUIC listener",
                    ),
                    [Seg::Index("filter_chains", i)],
                );
            }
        }
        if let Some(fc) = &l.default_filter_chain
            && fc.transport_socket.is_none()
        {
            return within(
                fail(
                    Seg::Field("transport_socket"),
                    "envoy.listener.quic",
                    "is required on the filter chains of a QUIC listener",
                ),
                [Seg::Field("default_filter_chain")],
            );
        }
    }
    filter_chains(l)
}

fn listener_address(a: &Address) -> R {
    if matches!(a.address, Some(AddressKind::EnvoyInternalAddress(_))) {
        return fail(
            Seg::Field("envoy_internal_address"),
            "envoy.listener.internal_listener",
            "an internal listener is declared with internal_listener, not an address",
        );
    }
    resolvable(a)?;
    ipv4_compat(a)
}

/// What an internal listener (no socket) cannot have.
fn internal_listener(l: &Listener) -> R {
    let rule = "envoy.listener.internal_listener";
    let unsupported = "is a TCP listener feature an internal listener does not support";
    if !l.additional_addresses.is_empty() {
        return fail(
            Seg::Field("additional_addresses"),
            rule,
            "must be empty when internal_listener is set",
        );
    }
    let exact = l
        .connection_balance_config
        .as_ref()
        .is_some_and(|c| matches!(c.balance_type, Some(BalanceType::ExactBalance(_))));
    let checks: [(bool, &'static str); 7] = [
        (exact, "connection_balance_config"),
        (l.enable_mptcp, "enable_mptcp"),
        (l.enable_reuse_port.is_some(), "enable_reuse_port"),
        (l.freebind.as_ref().is_some_and(|b| b.value), "freebind"),
        (l.tcp_backlog_size.is_some(), "tcp_backlog_size"),
        (
            l.tcp_fast_open_queue_length.is_some(),
            "tcp_fast_open_queue_length",
        ),
        (
            l.transparent.as_ref().is_some_and(|b| b.value),
            "transparent",
        ),
    ];
    for (set, field) in checks {
        if set {
            return fail(Seg::Field(field), rule, unsupported);
        }
    }
    if !l.socket_options.is_empty() {
        return fail(
            Seg::Field("socket_options"),
            rule,
            "an internal listener takes no socket options",
        );
    }
    Ok(())
}

/// The filter chain manager's checks: unimplemented match fields, CIDR ranges, server name
/// wildcards, and no two chains with the same match (or, with a filter_chain_matcher, the
/// same name).
fn filter_chains(l: &Listener) -> R {
    for (i, fc) in l.filter_chains.iter().enumerate() {
        let Some(m) = &fc.filter_chain_match else {
            continue;
        };
        let at = |r| {
            within(
                r,
                [
                    Seg::Field("filter_chain_match"),
                    Seg::Index("filter_chains", i),
                ],
            )
        };
        if !m.address_suffix.is_empty() || m.suffix_len.is_some() {
            let field = if m.address_suffix.is_empty() {
                "suffix_len"
            } else {
                "address_suffix"
            };
            return at(fail(
                Seg::Field(field),
                "envoy.listener.filter_chain_match",
                "is not implemented by Envoy",
            ));
        }
        let ranges = [
            ("prefix_ranges", &m.prefix_ranges),
            ("source_prefix_ranges", &m.source_prefix_ranges),
            (
                "direct_source_prefix_ranges",
                &m.direct_source_prefix_ranges,
            ),
        ];
        for (field, list) in ranges {
            for (j, r) in list.iter().enumerate() {
                if parse_ip(&r.address_prefix).is_none() {
                    return at(within(
                        fail(
                            Seg::Field("address_prefix"),
                            "envoy.listener.filter_chain_match",
                            "must be an IP address",
                        ),
                        [Seg::Index(field, j)],
                    ));
                }
            }
        }
        for (j, n) in m.server_names.iter().enumerate() {
            if n.contains('*') && !n.starts_with("*.") {
                return at(fail(
                    Seg::Index("server_names", j),
                    "envoy.listener.filter_chain_match",
                    "partial wildcards are not supported (only a leading `*.`)",
                ));
            }
        }
    }
    if l.filter_chain_matcher.is_some() {
        let mut names: FastMap<&str, usize> = FastMap::with_capacity(l.filter_chains.len());
        for (i, fc) in l.filter_chains.iter().enumerate() {
            let at = |r| within(r, [Seg::Index("filter_chains", i)]);
            if fc.name.is_empty() {
                return at(fail(
                    Seg::Field("name"),
                    "envoy.listener.filter_chain_name",
                    "is required when filter_chain_matcher is set",
                ));
            }
            if let Some(first) = names.insert(&fc.name, i) {
                return at(fail(
                    Seg::Field("name"),
                    "envoy.listener.filter_chain_name",
                    format!("duplicates the name of filter_chains[{first}]"),
                ));
            }
        }
    } else if l.filter_chains.len() > 1 {
        // prost encodes equal messages (FilterChainMatch has no maps) to equal bytes.
        let mut seen: FastMap<Vec<u8>, usize> = FastMap::with_capacity(l.filter_chains.len());
        for (i, fc) in l.filter_chains.iter().enumerate() {
            let key = fc
                .filter_chain_match
                .as_ref()
                .map(Message::encode_to_vec)
                .unwrap_or_default();
            if let Some(first) = seen.insert(key, i) {
                return within(
                    fail(
                        Seg::Field("filter_chain_match"),
                        "envoy.listener.duplicate_match",
                        format!("matches the same connections as filter_chains[{first}]"),
                    ),
                    [Seg::Index("filter_chains", i)],
                );
            }
        }
    }
    Ok(())
}

// === RouteConfiguration ===

/// Envoy's route matcher, virtual host and route entries, and header parser.
pub(crate) fn route_configuration(r: &RouteConfiguration) -> R {
    headers(
        &r.request_headers_to_add,
        &r.request_headers_to_remove,
        &r.response_headers_to_add,
        &r.response_headers_to_remove,
    )?;
    mirror_policies(&r.request_mirror_policies)?;
    let plugins: FastSet<&str> = r
        .cluster_specifier_plugins
        .iter()
        .filter_map(|p| p.extension.as_ref().map(|e| e.name.as_str()))
        .collect();
    let mut names: FastMap<&str, usize> = FastMap::with_capacity(r.virtual_hosts.len());
    let mut domains: FastMap<Cow<'_, str>, usize> = FastMap::new();
    for (i, vh) in r.virtual_hosts.iter().enumerate() {
        let at = |r| within(r, [Seg::Index("virtual_hosts", i)]);
        if let Some(first) = names.insert(&vh.name, i) {
            return at(fail(
                Seg::Field("name"),
                "meshkit.virtual_host_name",
                format!("duplicates the name of virtual_hosts[{first}]"),
            ));
        }
        for (j, d) in vh.domains.iter().enumerate() {
            // Envoy lower-cases domains and keeps one virtual host per domain (one `*`).
            let lower = if d.bytes().any(|b| b.is_ascii_uppercase()) {
                Cow::Owned(d.to_ascii_lowercase())
            } else {
                Cow::Borrowed(d.as_str())
            };
            if let Some(first) = domains.insert(lower, i) {
                return at(fail(
                    Seg::Index("domains", j),
                    "envoy.route.duplicate_domain",
                    format!(
                        "duplicates a domain of virtual_hosts[{first}] (domains are unique and compared in lower case)"
                    ),
                ));
            }
        }
        at(headers(
            &vh.request_headers_to_add,
            &vh.request_headers_to_remove,
            &vh.response_headers_to_add,
            &vh.response_headers_to_remove,
        ))?;
        at(mirror_policies(&vh.request_mirror_policies))?;
        if let Some(p) = &vh.retry_policy {
            at(within(retry_policy(p), [Seg::Field("retry_policy")]))?;
        }
        for (j, route) in vh.routes.iter().enumerate() {
            at(within(
                route_rules(route, &plugins),
                [Seg::Index("routes", j)],
            ))?;
        }
    }
    Ok(())
}

fn route_rules(rt: &Route, plugins: &FastSet<&str>) -> R {
    headers(
        &rt.request_headers_to_add,
        &rt.request_headers_to_remove,
        &rt.response_headers_to_add,
        &rt.response_headers_to_remove,
    )?;
    if let Some(Action::Route(a)) = &rt.action {
        let matcher_extension = matches!(
            rt.r#match.as_ref().and_then(|m| m.path_specifier.as_ref()),
            Some(PathSpecifier::PathMatchPolicy(_))
        );
        within(
            route_action(a, matcher_extension, plugins),
            [Seg::Field("route")],
        )?;
    }
    Ok(())
}

fn route_action(a: &RouteAction, matcher_extension: bool, plugins: &FastSet<&str>) -> R {
    let rewrites = usize::from(!a.prefix_rewrite.is_empty())
        + usize::from(a.regex_rewrite.is_some())
        + usize::from(a.path_rewrite_policy.is_some());
    if rewrites > 1 {
        return fail(
            Seg::Field("prefix_rewrite"),
            "envoy.route.rewrite",
            "specify only one of prefix_rewrite, regex_rewrite or path_rewrite_policy",
        );
    }
    if matcher_extension && !a.prefix_rewrite.is_empty() {
        return fail(
            Seg::Field("prefix_rewrite"),
            "envoy.route.rewrite",
            "cannot be used with a path_match_policy (a matcher extension)",
        );
    }
    match &a.cluster_specifier {
        Some(ClusterSpecifier::WeightedClusters(w)) => {
            let mut total: u64 = 0;
            for (k, c) in w.clusters.iter().enumerate() {
                total += u64::from(c.weight.as_ref().map_or(0, |x| x.value));
                within(
                    headers(
                        &c.request_headers_to_add,
                        &c.request_headers_to_remove,
                        &c.response_headers_to_add,
                        &c.response_headers_to_remove,
                    ),
                    [Seg::Index("clusters", k), Seg::Field("weighted_clusters")],
                )?;
            }
            if total == 0 || total > u64::from(u32::MAX) {
                return within(
                    fail(
                        Seg::Field("clusters"),
                        "envoy.route.weighted_clusters",
                        "the weights must sum to more than 0 and at most 4294967295",
                    ),
                    [Seg::Field("weighted_clusters")],
                );
            }
        }
        Some(ClusterSpecifier::ClusterSpecifierPlugin(name))
            if !plugins.contains(name.as_str()) =>
        {
            return fail(
                Seg::Field("cluster_specifier_plugin"),
                "envoy.route.cluster_specifier_plugin",
                "names no plugin of the route configuration's cluster_specifier_plugins",
            );
        }
        _ => {}
    }
    mirror_policies(&a.request_mirror_policies)?;
    let mut upgrades: FastSet<String> = FastSet::new();
    for (k, u) in a.upgrade_configs.iter().enumerate() {
        let at = |r| within(r, [Seg::Index("upgrade_configs", k)]);
        if !upgrades.insert(u.upgrade_type.to_ascii_lowercase()) {
            return at(fail(
                Seg::Field("upgrade_type"),
                "envoy.route.upgrade_configs",
                "is listed twice",
            ));
        }
        let connect = u.upgrade_type.eq_ignore_ascii_case("CONNECT")
            || u.upgrade_type.eq_ignore_ascii_case("CONNECT-UDP");
        if u.connect_config.is_some() && !connect {
            return at(fail(
                Seg::Field("connect_config"),
                "envoy.route.upgrade_configs",
                "is only for the CONNECT and CONNECT-UDP upgrade types",
            ));
        }
    }
    if let Some(p) = &a.retry_policy {
        within(retry_policy(p), [Seg::Field("retry_policy")])?;
    }
    if let Some(p) = &a.internal_redirect_policy {
        for (k, h) in p.response_headers_to_copy.iter().enumerate() {
            if !modifiable(h) {
                return within(
                    fail(
                        Seg::Index("response_headers_to_copy", k),
                        "envoy.route.header",
                        ":-prefixed headers and host may not be copied",
                    ),
                    [Seg::Field("internal_redirect_policy")],
                );
            }
        }
    }
    Ok(())
}

/// `envoy.route.retry_back_off`: `max_interval`, when set, is at least `base_interval`.
fn retry_policy(p: &RetryPolicy) -> R {
    if let Some(b) = &p.retry_back_off
        && let (Some(base), Some(max)) = (&b.base_interval, &b.max_interval)
        && super::support::nanos(max) < super::support::nanos(base)
    {
        return within(
            fail(
                Seg::Field("max_interval"),
                "envoy.route.retry_back_off",
                "must be greater than or equal to base_interval",
            ),
            [Seg::Field("retry_back_off")],
        );
    }
    Ok(())
}

/// `envoy.route.mirror_policy`: exactly one of `cluster` and `cluster_header`.
fn mirror_policies(list: &[RequestMirrorPolicy]) -> R {
    for (i, p) in list.iter().enumerate() {
        if p.cluster.is_empty() == p.cluster_header.is_empty() {
            return within(
                fail(
                    Seg::Field("cluster"),
                    "envoy.route.mirror_policy",
                    "exactly one of cluster and cluster_header must be set",
                ),
                [Seg::Index("request_mirror_policies", i)],
            );
        }
    }
    Ok(())
}

/// Envoy's `isModifiableHeader` (and `isRemovableHeader`): not `:`-prefixed, not `host`.
fn modifiable(name: &str) -> bool {
    !name.starts_with(':') && !name.eq_ignore_ascii_case("host")
}

/// `envoy.route.header`: the header parser's rules for headers to add and to remove.
fn headers(
    request_add: &[HeaderValueOption],
    request_remove: &[String],
    response_add: &[HeaderValueOption],
    response_remove: &[String],
) -> R {
    for (field, list) in [
        ("request_headers_to_add", request_add),
        ("response_headers_to_add", response_add),
    ] {
        for (i, h) in list.iter().enumerate() {
            if let Some(hv) = &h.header
                && !modifiable(&hv.key)
            {
                return within(
                    fail(
                        Seg::Field("key"),
                        "envoy.route.header",
                        ":-prefixed or host headers may not be modified",
                    ),
                    [Seg::Field("header"), Seg::Index(field, i)],
                );
            }
        }
    }
    for (field, list) in [
        ("request_headers_to_remove", request_remove),
        ("response_headers_to_remove", response_remove),
    ] {
        for (i, h) in list.iter().enumerate() {
            if !modifiable(h) {
                return fail(
                    Seg::Index(field, i),
                    "envoy.route.header",
                    ":-prefixed or host headers may not be removed",
                );
            }
        }
    }
    Ok(())
}

// === Cluster ===

const STATIC: i32 = DiscoveryType::Static as i32;
const STRICT_DNS: i32 = DiscoveryType::StrictDns as i32;
const LOGICAL_DNS: i32 = DiscoveryType::LogicalDns as i32;
const EDS: i32 = DiscoveryType::Eds as i32;
const ORIGINAL_DST: i32 = DiscoveryType::OriginalDst as i32;
const CLUSTER_PROVIDED: i32 = LbPolicy::ClusterProvided as i32;
const LOAD_BALANCING_POLICY_CONFIG: i32 = LbPolicy::LoadBalancingPolicyConfig as i32;
const HTTP_PROTOCOL_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";

/// Envoy's cluster factories and cluster info.
#[allow(
    deprecated,
    reason = "Envoy still reads the deprecated protocol option fields"
)]
pub(crate) fn cluster(c: &Cluster) -> R {
    // The discovery type; `None` for a custom `cluster_type`.
    let ty = match &c.cluster_discovery_type {
        None => Some(STATIC),
        Some(ClusterDiscoveryType::Type(t)) => Some(*t),
        Some(ClusterDiscoveryType::ClusterType(_)) => None,
    };
    let typed_policy = c.load_balancing_policy.is_some();
    if ty == Some(ORIGINAL_DST) {
        if c.lb_policy != CLUSTER_PROVIDED {
            return fail(
                Seg::Field("lb_policy"),
                "envoy.cluster.original_dst",
                "must be CLUSTER_PROVIDED for an ORIGINAL_DST cluster",
            );
        }
        if c.load_assignment.is_some() {
            return fail(
                Seg::Field("load_assignment"),
                "envoy.cluster.original_dst",
                "must not be set for an ORIGINAL_DST cluster",
            );
        }
        if let Some(LbConfig::OriginalDstLbConfig(o)) = &c.lb_config
            && !o.use_http_header
            && !o.http_header_name.is_empty()
        {
            return within(
                fail(
                    Seg::Field("http_header_name"),
                    "envoy.cluster.original_dst",
                    "needs use_http_header set",
                ),
                [Seg::Field("original_dst_lb_config")],
            );
        }
    }
    if !typed_policy && c.lb_policy == CLUSTER_PROVIDED {
        if matches!(ty, Some(STATIC | STRICT_DNS | LOGICAL_DNS | EDS)) {
            return fail(
                Seg::Field("lb_policy"),
                "envoy.cluster.cluster_provided",
                format!(
                    "CLUSTER_PROVIDED needs a cluster that provides a load balancer (ORIGINAL_DST or a custom cluster_type); a {} cluster does not",
                    DiscoveryType::try_from(ty.unwrap_or_default()).map_or("", |t| t.as_str_name())
                ),
            );
        }
        if c.lb_subset_config
            .as_ref()
            .is_some_and(|s| !s.subset_selectors.is_empty())
        {
            return fail(
                Seg::Field("lb_subset_config"),
                "envoy.cluster.cluster_provided",
                "cannot be combined with lb_policy CLUSTER_PROVIDED",
            );
        }
    }
    if c.lb_policy == LOAD_BALANCING_POLICY_CONFIG && !typed_policy {
        return fail(
            Seg::Field("load_balancing_policy"),
            "envoy.cluster.load_balancing_policy",
            "is required when lb_policy is LOAD_BALANCING_POLICY_CONFIG",
        );
    }
    if typed_policy {
        if c.lb_subset_config.is_some() {
            return fail(
                Seg::Field("lb_subset_config"),
                "envoy.cluster.load_balancing_policy",
                "cannot be combined with load_balancing_policy",
            );
        }
        if let Some(common) = &c.common_lb_config {
            let partial = match &common.locality_config_specifier {
                Some(LocalityConfigSpecifier::ZoneAwareLbConfig(_)) => Some("zone_aware_lb_config"),
                Some(LocalityConfigSpecifier::LocalityWeightedLbConfig(_)) => {
                    Some("locality_weighted_lb_config")
                }
                None => common
                    .consistent_hashing_lb_config
                    .as_ref()
                    .map(|_| "consistent_hashing_lb_config"),
            };
            if let Some(field) = partial {
                return within(
                    fail(
                        Seg::Field(field),
                        "envoy.cluster.load_balancing_policy",
                        "cannot be combined with load_balancing_policy",
                    ),
                    [Seg::Field("common_lb_config")],
                );
            }
        }
    }
    if let Some(s) = &c.lb_subset_config
        && s.locality_weight_aware
    {
        let weighted = c.common_lb_config.as_ref().is_some_and(|cl| {
            matches!(
                cl.locality_config_specifier,
                Some(LocalityConfigSpecifier::LocalityWeightedLbConfig(_))
            )
        });
        if !weighted {
            return within(
                fail(
                    Seg::Field("locality_weight_aware"),
                    "envoy.cluster.locality_weight_aware",
                    "needs common_lb_config.locality_weighted_lb_config",
                ),
                [Seg::Field("lb_subset_config")],
            );
        }
    }
    match (ty == Some(EDS), c.eds_cluster_config.is_some()) {
        (false, true) => {
            return fail(
                Seg::Field("eds_cluster_config"),
                "envoy.cluster.eds_cluster_config",
                "is only for EDS clusters",
            );
        }
        (true, false) => {
            return fail(
                Seg::Field("eds_cluster_config"),
                "envoy.cluster.eds_cluster_config",
                "is required for an EDS cluster",
            );
        }
        _ => {}
    }
    if c.protocol_selection == ClusterProtocolSelection::UseConfiguredProtocol as i32
        && c.http_protocol_options.is_some()
        && c.http2_protocol_options.is_some()
        && !c
            .typed_extension_protocol_options
            .contains_key(HTTP_PROTOCOL_OPTIONS)
    {
        return fail(
            Seg::Field("http2_protocol_options"),
            "envoy.cluster.protocol_options",
            "cannot be set beside http_protocol_options unless protocol_selection is USE_DOWNSTREAM_PROTOCOL",
        );
    }
    for (i, f) in c.filters.iter().enumerate() {
        if f.typed_config.is_some() && f.config_discovery.is_some() {
            return within(
                fail(
                    Seg::Field("config_discovery"),
                    "envoy.cluster.filters",
                    "only one of typed_config and config_discovery can be used",
                ),
                [Seg::Index("filters", i)],
            );
        }
    }
    if let Some(b) = &c.upstream_bind_config {
        within(bind_config(b), [Seg::Field("upstream_bind_config")])?;
    }
    if let Some(cb) = &c.circuit_breakers {
        for priority in [
            RoutingPriority::Default as i32,
            RoutingPriority::High as i32,
        ] {
            // Envoy reads the first thresholds of each priority and ignores the rest.
            let Some((i, t)) = cb
                .per_host_thresholds
                .iter()
                .enumerate()
                .find(|(_, t)| t.priority == priority)
            else {
                continue;
            };
            let unsupported = [
                (t.max_pending_requests.is_some(), "max_pending_requests"),
                (t.max_requests.is_some(), "max_requests"),
                (t.max_retries.is_some(), "max_retries"),
                (t.max_connection_pools.is_some(), "max_connection_pools"),
                (t.retry_budget.is_some(), "retry_budget"),
            ];
            if let Some((_, field)) = unsupported.into_iter().find(|(set, _)| *set) {
                return within(
                    fail(
                        Seg::Field(field),
                        "envoy.cluster.per_host_thresholds",
                        "only max_connections is supported per host",
                    ),
                    [
                        Seg::Index("per_host_thresholds", i),
                        Seg::Field("circuit_breakers"),
                    ],
                );
            }
        }
    }
    if ty == Some(LOGICAL_DNS) {
        logical_dns(c)?;
    }
    if let Some(la) = &c.load_assignment {
        let at = |r| within(r, [Seg::Field("load_assignment")]);
        if let Some(p) = &la.policy {
            at(within(drop_overloads(p), [Seg::Field("policy")]))?;
        }
        if ty == Some(STATIC) {
            // Envoy resolves a static cluster's endpoints when it loads it.
            at(endpoints(la))?;
        }
    }
    Ok(())
}

fn logical_dns(c: &Cluster) -> R {
    let single = c
        .load_assignment
        .as_ref()
        .filter(|la| la.endpoints.len() == 1 && la.endpoints[0].lb_endpoints.len() == 1)
        .map(|la| &la.endpoints[0].lb_endpoints[0]);
    let Some(lb) = single else {
        return fail(
            Seg::Field("load_assignment"),
            "envoy.cluster.logical_dns",
            "a LOGICAL_DNS cluster needs exactly one locality with exactly one endpoint",
        );
    };
    if let Some(HostIdentifier::Endpoint(e)) = &lb.host_identifier
        && let Some(Address {
            address: Some(AddressKind::SocketAddress(s)),
        }) = &e.address
        && !s.resolver_name.is_empty()
    {
        return within(
            fail(
                Seg::Field("resolver_name"),
                "envoy.cluster.logical_dns",
                "must not be set for a LOGICAL_DNS cluster",
            ),
            [
                Seg::Field("socket_address"),
                Seg::Field("address"),
                Seg::Field("endpoint"),
                Seg::Index("lb_endpoints", 0),
                Seg::Index("endpoints", 0),
                Seg::Field("load_assignment"),
            ],
        );
    }
    Ok(())
}

#[allow(deprecated, reason = "Envoy still reads additional_source_addresses")]
fn bind_config(b: &envoy_types::pb::envoy::config::core::v3::BindConfig) -> R {
    let rule = "envoy.cluster.bind_config";
    if !b.extra_source_addresses.is_empty() && !b.additional_source_addresses.is_empty() {
        return fail(
            Seg::Field("additional_source_addresses"),
            rule,
            "cannot be set beside extra_source_addresses",
        );
    }
    let Some(source) = &b.source_address else {
        if !b.extra_source_addresses.is_empty() || !b.additional_source_addresses.is_empty() {
            return fail(
                Seg::Field("source_address"),
                rule,
                "is required when extra or additional source addresses are set",
            );
        }
        return Ok(());
    };
    within(socket_resolvable(source), [Seg::Field("source_address")])?;
    for (i, e) in b.extra_source_addresses.iter().enumerate() {
        if let Some(a) = &e.address {
            within(
                socket_resolvable(a),
                [
                    Seg::Field("address"),
                    Seg::Index("extra_source_addresses", i),
                ],
            )?;
        }
    }
    for (i, a) in b.additional_source_addresses.iter().enumerate() {
        within(
            socket_resolvable(a),
            [Seg::Index("additional_source_addresses", i)],
        )?;
    }
    Ok(())
}

// === ClusterLoadAssignment ===

/// Envoy's EDS cluster: what it checks of an assignment before it applies it.
pub(crate) fn cluster_load_assignment(cla: &ClusterLoadAssignment) -> R {
    if let Some(p) = &cla.policy {
        within(drop_overloads(p), [Seg::Field("policy")])?;
    }
    for (i, loc) in cla.endpoints.iter().enumerate() {
        if matches!(
            loc.lb_config,
            Some(LocalityLbConfig::LedsClusterLocalityConfig(_))
        ) && !loc.lb_endpoints.is_empty()
        {
            return within(
                fail(
                    Seg::Field("leds_cluster_locality_config"),
                    "envoy.endpoint.leds",
                    "a locality takes LEDS or a list of endpoints, not both",
                ),
                [Seg::Index("endpoints", i)],
            );
        }
    }
    endpoints(cla)
}

/// `envoy.endpoint.drop_overloads`: at most one category, dropping at most everything.
fn drop_overloads(p: &Policy) -> R {
    if p.drop_overloads.len() > 1 {
        return fail(
            Seg::Index("drop_overloads", 1),
            "envoy.endpoint.drop_overloads",
            "Envoy supports one drop_overloads category",
        );
    }
    if let Some(d) = p.drop_overloads.first()
        && let Some(pct) = &d.drop_percentage
    {
        let denominator: u64 = match DenominatorType::try_from(pct.denominator) {
            Ok(DenominatorType::Hundred) => 100,
            Ok(DenominatorType::TenThousand) => 10_000,
            Ok(DenominatorType::Million) => 1_000_000,
            // Undefined values are rejected by the schema checks.
            Err(_) => return Ok(()),
        };
        if u64::from(pct.numerator) > denominator {
            return within(
                fail(
                    Seg::Field("numerator"),
                    "envoy.endpoint.drop_overloads",
                    "drops more than 100%",
                ),
                [
                    Seg::Field("drop_percentage"),
                    Seg::Index("drop_overloads", 0),
                ],
            );
        }
    }
    Ok(())
}

/// Every endpoint of an assignment that Envoy resolves itself (static clusters and EDS).
fn endpoints(cla: &ClusterLoadAssignment) -> R {
    for (i, loc) in cla.endpoints.iter().enumerate() {
        for (j, lb) in loc.lb_endpoints.iter().enumerate() {
            within(
                lb_endpoint(lb),
                [Seg::Index("lb_endpoints", j), Seg::Index("endpoints", i)],
            )?;
        }
    }
    Ok(())
}

fn lb_endpoint(lb: &LbEndpoint) -> R {
    let Some(HostIdentifier::Endpoint(e)) = &lb.host_identifier else {
        return fail(
            Seg::Field("endpoint"),
            "envoy.endpoint.address",
            "must be set: Envoy resolves an endpoint by its address (endpoint_name is not supported)",
        );
    };
    within(endpoint(e), [Seg::Field("endpoint")])
}

fn endpoint(e: &Endpoint) -> R {
    let Some(a) = &e.address else {
        return fail(
            Seg::Field("address"),
            "envoy.endpoint.address",
            "must be set",
        );
    };
    within(resolvable(a), [Seg::Field("address")])?;
    for (k, extra) in e.additional_addresses.iter().enumerate() {
        let at = |r| {
            within(
                r,
                [Seg::Field("address"), Seg::Index("additional_addresses", k)],
            )
        };
        let Some(ea) = &extra.address else {
            return within(
                fail(
                    Seg::Field("address"),
                    "envoy.endpoint.address",
                    "must be set",
                ),
                [Seg::Index("additional_addresses", k)],
            );
        };
        at(resolvable(ea))?;
    }
    if let Some(hc) = &e.health_check_config {
        if hc.port_value != 0 && !matches!(a.address, Some(AddressKind::SocketAddress(_))) {
            return within(
                fail(
                    Seg::Field("port_value"),
                    "envoy.endpoint.health_check",
                    "must be 0 for an endpoint without an IP address",
                ),
                [Seg::Field("health_check_config")],
            );
        }
        if let Some(ha) = &hc.address {
            within(
                resolvable(ha),
                [Seg::Field("address"), Seg::Field("health_check_config")],
            )?;
        }
    }
    Ok(())
}
