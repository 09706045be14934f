//! From a [`ManifestSet`] to the [`Snapshot`] served over ADS.
//!
//! | type URL | names | from |
//! |---|---|---|
//! | [`ADDRESS_TYPE_URL`] | workload uid; `namespace/hostname` for services | Pod, Service, EndpointSlice, WorkloadEntry, ServiceEntry (see [`ambient`](crate::ambient)) |
//! | [`AUTHORIZATION_TYPE_URL`] | `namespace/name` | AuthorizationPolicy, PeerAuthentication (see [`policy`](crate::policy)) |
//! | [`INGRESS_TYPE_URL`] | `namespace/name` | Ingress, as is |
//! | [`INGRESS_CLASS_TYPE_URL`] | `name` | IngressClass, as is |
//! | Gateway API kinds (`meshkit.dev/k8s-json/...`) and their Envoy listeners and routes | see [`gateway_api`](crate::gateway_api) | GatewayClass, Gateway, HTTPRoute, ReferenceGrant |
//! | Envoy `Listener` | `http`, `https` | the HTTP listener and, when some `tls` entry has its Secret, the HTTPS one |
//! | Envoy `RouteConfiguration` | `http`, `https` | the Ingress rules (same routes on both) |
//! | Envoy `Cluster` / `ClusterLoadAssignment` | `outbound\|PORT\|\|HOSTNAME` | each backend service port |
//! | Envoy `Secret` | `namespace/name` | `kubernetes.io/tls` Secrets |
//!
//! How Ingress semantics map to Envoy routes:
//!
//! - Each rule host is a virtual host. Rules without a host go to the `*` virtual host. The
//!   port of the `Host` header is ignored (`strip_any_host_port`).
//! - `*.example.com` stays a wildcard domain, but Envoy's wildcard matches any number of
//!   labels and Kubernetes' exactly one: each route of a wildcard virtual host also requires
//!   an `:authority` of one label before the suffix (a case-insensitive regex), and the
//!   routes of the rules without a host follow, for the other hosts (inverted match), as they
//!   would reach them in Kubernetes; then the default backend.
//! - The HTTP connection manager is an edge proxy's (`use_remote_address`): it appends the
//!   client address to `X-Forwarded-For` and sets `X-Forwarded-Proto`, as meshkit's gateway
//!   does.
//! - `Exact` is Envoy `path`; `Prefix` (and `ImplementationSpecific`) is
//!   `path_separated_prefix` with the trailing slash removed, or `prefix: /` for `/`, so
//!   `/foo` matches `/foo` and `/foo/bar` but not `/foobar`.
//! - Envoy takes the first matching route, Kubernetes the longest path: routes are ordered by
//!   path length, longest first, `Exact` before `Prefix` on equal length. When two Ingresses
//!   define the same host, path and type, the first in `namespace/name` order wins.
//! - The `defaultBackend` of the first Ingress (in `namespace/name` order) that has one is the
//!   last route of every virtual host and the whole of the `*` virtual host.
//! - A backend is a ServiceEntry of the Ingress's namespace whose name equals the backend
//!   service name (or one of whose hosts is `NAME.NAMESPACE.svc.cluster.local`), on the port
//!   with that number or name. Backends that resolve to nothing answer 503.
//! - Endpoints are the WorkloadEntries of the same namespace selected by the ServiceEntry's
//!   `workloadSelector`, on the WorkloadEntry's port override for the port name, else the
//!   `targetPort`, else the service port.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::envoy::config::core::v3::{
    AggregatedConfigSource, ApiVersion, ConfigSource, DataSource, SocketAddress, TransportSocket,
    address, config_source, data_source, socket_address, transport_socket,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};
use envoy_types::pb::envoy::config::listener::v3::{
    Filter, FilterChain, FilterChainMatch, Listener, filter,
};
use envoy_types::pb::envoy::config::route::v3::{
    DirectResponseAction, HeaderMatcher, Route, RouteAction, RouteConfiguration, RouteMatch,
    VirtualHost, header_matcher, route, route_action, route_match,
};
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, Rds, http_connection_manager, http_filter,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CommonTlsContext, DownstreamTlsContext, SdsSecretConfig, Secret, TlsCertificate, secret,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{RegexMatcher, StringMatcher, string_matcher};
use envoy_types::pb::google::protobuf::{Any, BoolValue};
use meshkit_ingress_model::{Ingress, IngressBackend};
use meshkit_xds_client::{
    CLUSTER_TYPE_URL, ENDPOINT_TYPE_URL, LISTENER_TYPE_URL, ROUTE_TYPE_URL, SECRET_TYPE_URL,
};
use prost::{Message, Name};

use crate::ambient::{Derived, MeshWorkload, target_port};
use crate::manifests::{ManifestSet, ServiceEntry, ServicePort, TlsSecret};
use meshkit_mesh::proto::security;
use meshkit_mesh::proto::workload;
use meshkit_mesh::resources::{
    ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL, GATEWAY_CLASS_TYPE_URL, GATEWAY_TYPE_URL,
    HTTP_ROUTE_TYPE_URL, INGRESS_CLASS_TYPE_URL, INGRESS_TYPE_URL, REFERENCE_GRANT_TYPE_URL,
};
use meshkit_xds_server::{Snapshot, SnapshotBuilder};

/// How manifests are translated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TranslateOptions {
    /// Trust domain of workload identities. Default `cluster.local`.
    pub trust_domain: String,
    /// Cluster id in workload uids. Default `Kubernetes`.
    pub cluster_id: String,
    /// The cluster's DNS domain: a Service's host is `NAME.NAMESPACE.svc.DOMAIN`. Default
    /// `cluster.local`.
    pub domain_suffix: String,
    /// Istio's root namespace: its AuthorizationPolicies without a selector are GLOBAL, and
    /// its PeerAuthentication without a selector is mesh-wide. Default `istio-system`.
    pub root_namespace: String,
    /// Address of Envoy's plain HTTP listener. Default `0.0.0.0:8080`.
    pub http_listener: SocketAddr,
    /// Address of Envoy's HTTPS listener, `None` for none. Default `0.0.0.0:8443`.
    pub https_listener: Option<SocketAddr>,
    /// Only Ingresses with this `ingressClassName` (or none) are translated for Envoy; `None`
    /// translates all. The Ingress resources themselves are always all served. Default `None`.
    pub ingress_class: Option<String>,
    /// Connect timeout of Envoy clusters. Default 1 s.
    pub connect_timeout: Duration,
    /// The address Envoy's Gateway API listeners bind, each on its listener's port. Default
    /// `0.0.0.0`.
    pub gateway_api_address: IpAddr,
    /// The Gateway API controller whose GatewayClasses' Gateways are translated for Envoy
    /// (and reported on); `None` takes every Gateway. Default
    /// [`DEFAULT_CONTROLLER`](crate::gateway_api::DEFAULT_CONTROLLER).
    pub gateway_controller: Option<String>,
}

/// Every type URL a snapshot holds (each declared, so an empty one is served as empty).
pub const TYPE_URLS: [&str; 13] = [
    ADDRESS_TYPE_URL,
    AUTHORIZATION_TYPE_URL,
    INGRESS_TYPE_URL,
    INGRESS_CLASS_TYPE_URL,
    GATEWAY_CLASS_TYPE_URL,
    GATEWAY_TYPE_URL,
    HTTP_ROUTE_TYPE_URL,
    REFERENCE_GRANT_TYPE_URL,
    LISTENER_TYPE_URL,
    ROUTE_TYPE_URL,
    CLUSTER_TYPE_URL,
    ENDPOINT_TYPE_URL,
    SECRET_TYPE_URL,
];

/// A resolved Ingress backend: the cluster to route to.
struct Backend<'a> {
    service: &'a ServiceEntry,
    port: &'a ServicePort,
}

/// One Envoy route before ordering.
#[derive(Clone)]
struct PathRoute {
    path: String,
    exact: bool,
    action: route::Action,
}

// === impl TranslateOptions ===

impl Default for TranslateOptions {
    fn default() -> Self {
        Self {
            trust_domain: "cluster.local".to_owned(),
            cluster_id: "Kubernetes".to_owned(),
            domain_suffix: "cluster.local".to_owned(),
            root_namespace: "istio-system".to_owned(),
            http_listener: SocketAddr::from(([0, 0, 0, 0], 8080)),
            https_listener: Some(SocketAddr::from(([0, 0, 0, 0], 8443))),
            ingress_class: None,
            connect_timeout: Duration::from_secs(1),
            gateway_api_address: crate::gateway_api::DEFAULT_ADDRESS,
            gateway_controller: Some(crate::gateway_api::DEFAULT_CONTROLLER.to_owned()),
        }
    }
}

/// Name of the Envoy cluster (and EDS resource) for a service port, Istio style.
pub fn cluster_name(hostname: &str, port: u16) -> String {
    format!("outbound|{port}||{hostname}")
}

/// xDS name of an Ingress, Secret or service key: `namespace/name`.
fn ns_name(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

fn ingress_key(ingress: &Ingress) -> (String, String) {
    let meta = ingress.metadata.as_ref();
    (
        meta.and_then(|m| m.namespace.clone())
            .unwrap_or_else(|| "default".to_owned()),
        meta.and_then(|m| m.name.clone()).unwrap_or_default(),
    )
}

/// Translates `set` into every resource type the control plane serves.
pub fn build_snapshot(set: &ManifestSet, options: &TranslateOptions) -> Snapshot {
    snapshot_of(set, &crate::ambient::derive(set, options), options)
}

/// [`build_snapshot`] with the workloads and services already derived from `set`.
pub fn snapshot_of(set: &ManifestSet, derived: &Derived, options: &TranslateOptions) -> Snapshot {
    snapshot_with_policies(set, derived, options).0
}

/// [`snapshot_of`], with the keys of the policies each workload names, by the workload's
/// uid ([`workload_address`] needs them to encode a workload again).
pub(crate) fn snapshot_with_policies(
    set: &ManifestSet,
    derived: &Derived,
    options: &TranslateOptions,
) -> (Snapshot, BTreeMap<String, Vec<String>>) {
    let mut b = SnapshotBuilder::new();
    for url in TYPE_URLS {
        b.declare(url);
    }
    let policies = crate::policy::translate(
        &set.authorization_policies,
        &set.peer_authentications,
        &derived.workloads,
        &options.root_namespace,
    );
    for policy in &policies.policies {
        b.add(
            AUTHORIZATION_TYPE_URL,
            &policy.key(),
            &security::Authorization::from(policy),
        );
    }
    add_addresses(&mut b, derived, &policies.workload_policies);
    for ingress in &set.ingresses {
        let (ns, name) = ingress_key(ingress);
        b.add(INGRESS_TYPE_URL, &ns_name(&ns, &name), ingress);
    }
    for class in &set.ingress_classes {
        let name = class
            .metadata
            .as_ref()
            .and_then(|m| m.name.as_deref())
            .unwrap_or_default();
        b.add(INGRESS_CLASS_TYPE_URL, name, class);
    }
    for secret in &set.secrets {
        b.add(
            SECRET_TYPE_URL,
            &ns_name(&secret.namespace, &secret.name),
            &envoy_secret(secret),
        );
    }
    crate::gateway_api::add_resources(&mut b, set, options);
    add_envoy_gateway(&mut b, set, options);
    let gateway_routes = crate::gateway_api::route_table(set, options);
    crate::gateway_api::add_envoy(&mut b, set, options, &gateway_routes);
    (b.build(), policies.workload_policies)
}

// === workload API ===

fn add_addresses(
    b: &mut SnapshotBuilder,
    derived: &Derived,
    workload_policies: &BTreeMap<String, Vec<String>>,
) {
    for service in &derived.services {
        let name = ns_name(&service.namespace, &service.hostname);
        let address = workload::Address {
            r#type: Some(workload::address::Type::Service(service.clone())),
        };
        b.add(ADDRESS_TYPE_URL, &name, &address);
    }
    for w in &derived.workloads {
        b.add(
            ADDRESS_TYPE_URL,
            &w.workload.uid,
            &workload_address(w, workload_policies),
        );
    }
}

/// The `Address` of workload `w` (named by its uid), with the policies that select it.
pub(crate) fn workload_address(
    w: &MeshWorkload,
    workload_policies: &BTreeMap<String, Vec<String>>,
) -> workload::Address {
    let mut workload = w.workload.clone();
    workload.authorization_policies = workload_policies
        .get(&workload.uid)
        .cloned()
        .unwrap_or_default();
    workload::Address {
        r#type: Some(workload::address::Type::Workload(workload)),
    }
}

// === Envoy ===

pub(crate) fn ads() -> Option<ConfigSource> {
    Some(ConfigSource {
        resource_api_version: ApiVersion::V3 as i32,
        config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(
            AggregatedConfigSource {},
        )),
        ..Default::default()
    })
}

pub(crate) fn any_of<M: Message + Name>(message: &M) -> Any {
    Any {
        type_url: M::type_url(),
        value: message.encode_to_vec(),
    }
}

pub(crate) fn inline(bytes: &[u8]) -> Option<DataSource> {
    Some(DataSource {
        specifier: Some(data_source::Specifier::InlineBytes(bytes.to_vec())),
        ..Default::default()
    })
}

fn envoy_secret(secret: &TlsSecret) -> Secret {
    Secret {
        name: ns_name(&secret.namespace, &secret.name),
        r#type: Some(secret::Type::TlsCertificate(TlsCertificate {
            certificate_chain: inline(&secret.cert_pem),
            private_key: inline(&secret.key_pem),
            ..Default::default()
        })),
    }
}

pub(crate) fn socket_address(
    ip: IpAddr,
    port: u16,
) -> Option<envoy_types::pb::envoy::config::core::v3::Address> {
    Some(envoy_types::pb::envoy::config::core::v3::Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: ip.to_string(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(port))),
            ..Default::default()
        })),
    })
}

fn resolve<'a>(
    set: &'a ManifestSet,
    namespace: &str,
    backend: &IngressBackend,
) -> Option<Backend<'a>> {
    let svc = backend.service.as_ref()?;
    let name = svc.name.as_deref()?;
    let fqdn = format!("{name}.{namespace}.svc.cluster.local");
    let service = set
        .service_entries
        .iter()
        .find(|se| se.namespace == namespace && (se.name == name || se.hosts.contains(&fqdn)))?;
    let wanted = svc.port.as_ref()?;
    let port = service
        .ports
        .iter()
        .find(|p| match (wanted.number, &wanted.name) {
            (Some(n), _) => i32::from(p.number) == n,
            (None, Some(port_name)) => p.name == *port_name,
            (None, None) => false,
        })?;
    Some(Backend { service, port })
}

fn action_for(set: &ManifestSet, namespace: &str, backend: &IngressBackend) -> route::Action {
    let resolved = resolve(set, namespace, backend)
        .and_then(|b| Some(cluster_name(b.service.hosts.first()?, b.port.number)));
    match resolved {
        Some(cluster) => route::Action::Route(RouteAction {
            cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(cluster)),
            ..Default::default()
        }),
        None => route::Action::DirectResponse(DirectResponseAction {
            status: 503,
            body: inline(b"no such backend service\n"),
            ..Default::default()
        }),
    }
}

fn add_envoy_gateway(b: &mut SnapshotBuilder, set: &ManifestSet, options: &TranslateOptions) {
    let mut ingresses: Vec<&Ingress> = set
        .ingresses
        .iter()
        .filter(|i| match &options.ingress_class {
            None => true,
            Some(class) => {
                let own = i
                    .spec
                    .as_ref()
                    .and_then(|s| s.ingress_class_name.as_deref());
                own.is_none() || own == Some(class.as_str())
            }
        })
        .collect();
    ingresses.sort_by_key(|i| ingress_key(i));

    // Virtual hosts by domain, routes in definition order; `*` for rules without a host.
    let mut hosts: BTreeMap<String, Vec<PathRoute>> = BTreeMap::new();
    let mut default_action = None;
    let mut tls_hosts: BTreeMap<String, String> = BTreeMap::new();
    for ingress in &ingresses {
        let (ns, _) = ingress_key(ingress);
        let Some(spec) = &ingress.spec else { continue };
        if default_action.is_none()
            && let Some(backend) = &spec.default_backend
        {
            default_action = Some(action_for(set, &ns, backend));
        }
        for rule in &spec.rules {
            let host = rule
                .host
                .clone()
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "*".to_owned());
            let routes = hosts.entry(host).or_default();
            let Some(http) = rule
                .ingress_rule_value
                .as_ref()
                .and_then(|v| v.http.as_ref())
            else {
                continue;
            };
            for path in &http.paths {
                let Some(backend) = &path.backend else {
                    continue;
                };
                let p = path.path.clone().unwrap_or_else(|| "/".to_owned());
                let exact = path.path_type.as_deref() == Some("Exact");
                if routes.iter().any(|r| r.path == p && r.exact == exact) {
                    continue;
                }
                routes.push(PathRoute {
                    path: p,
                    exact,
                    action: action_for(set, &ns, backend),
                });
            }
        }
        for tls in &spec.tls {
            let Some(secret_name) = &tls.secret_name else {
                continue;
            };
            let secret_known = set
                .secrets
                .iter()
                .any(|s| s.namespace == ns && s.name == *secret_name);
            if !secret_known {
                continue;
            }
            for host in &tls.hosts {
                tls_hosts
                    .entry(host.clone())
                    .or_insert_with(|| ns_name(&ns, secret_name));
            }
        }
    }
    if default_action.is_some() {
        hosts.entry("*".to_owned()).or_default();
    }

    // The rules without a host, for the hosts a wildcard domain catches only in Envoy.
    let mut hostless = hosts.get("*").cloned().unwrap_or_default();
    sort_paths(&mut hostless);
    let virtual_hosts: Vec<VirtualHost> = hosts
        .into_iter()
        .map(|(domain, mut paths)| {
            sort_paths(&mut paths);
            let one_label = domain.strip_prefix("*.").map(one_label_authority);
            let mut routes: Vec<Route> = paths
                .into_iter()
                .map(|p| envoy_route(p, one_label.clone()))
                .collect();
            if let Some(one_label) = &one_label {
                routes.extend(hostless.iter().cloned().map(|p| {
                    envoy_route(
                        p,
                        Some(HeaderMatcher {
                            invert_match: true,
                            ..one_label.clone()
                        }),
                    )
                }));
            }
            if let Some(action) = &default_action {
                routes.push(Route {
                    name: "default-backend".to_owned(),
                    r#match: Some(RouteMatch {
                        path_specifier: Some(route_match::PathSpecifier::Prefix("/".to_owned())),
                        ..Default::default()
                    }),
                    action: Some(action.clone()),
                    ..Default::default()
                });
            }
            VirtualHost {
                name: domain.clone(),
                domains: vec![domain],
                routes,
                ..Default::default()
            }
        })
        .collect();

    b.add(
        ROUTE_TYPE_URL,
        "http",
        &RouteConfiguration {
            name: "http".to_owned(),
            virtual_hosts: virtual_hosts.clone(),
            ..Default::default()
        },
    );
    b.add(
        LISTENER_TYPE_URL,
        "http",
        &Listener {
            name: "http".to_owned(),
            address: socket_address(options.http_listener.ip(), options.http_listener.port()),
            filter_chains: vec![FilterChain {
                filters: vec![hcm_filter("http")],
                ..Default::default()
            }],
            ..Default::default()
        },
    );
    if let Some(https) = options.https_listener
        && !tls_hosts.is_empty()
    {
        b.add(
            ROUTE_TYPE_URL,
            "https",
            &RouteConfiguration {
                name: "https".to_owned(),
                virtual_hosts,
                ..Default::default()
            },
        );
        // One filter chain per Secret, matching the SNI names that use it.
        let mut by_secret: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (host, secret) in tls_hosts {
            by_secret.entry(secret).or_default().push(host);
        }
        let filter_chains = by_secret
            .into_iter()
            .map(|(secret, server_names)| {
                tls_filter_chain(secret.clone(), Some(server_names), "https", secret)
            })
            .collect();
        b.add(
            LISTENER_TYPE_URL,
            "https",
            &Listener {
                name: "https".to_owned(),
                address: socket_address(https.ip(), https.port()),
                filter_chains,
                listener_filters: vec![tls_inspector()],
                ..Default::default()
            },
        );
    }

    add_clusters(b, set, options);
}

/// A filter chain terminating TLS with the SDS Secret `secret` (ALPN `h2`, `http/1.1`) for
/// the SNI names `server_names` (every name when `None`), then HTTP routed by `route_config`.
pub(crate) fn tls_filter_chain(
    name: String,
    server_names: Option<Vec<String>>,
    route_config: &str,
    secret: String,
) -> FilterChain {
    FilterChain {
        name,
        filter_chain_match: server_names.map(|server_names| FilterChainMatch {
            server_names,
            ..Default::default()
        }),
        filters: vec![hcm_filter(route_config)],
        transport_socket: Some(TransportSocket {
            name: "envoy.transport_sockets.tls".to_owned(),
            config_type: Some(transport_socket::ConfigType::TypedConfig(any_of(
                &DownstreamTlsContext {
                    common_tls_context: Some(CommonTlsContext {
                        alpn_protocols: vec!["h2".to_owned(), "http/1.1".to_owned()],
                        tls_certificate_sds_secret_configs: vec![SdsSecretConfig {
                            name: secret,
                            sds_config: ads(),
                        }],
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ))),
        }),
        ..Default::default()
    }
}

/// Longest path first; Exact before Prefix on equal length (a stable sort keeps definition
/// order otherwise).
fn sort_paths(paths: &mut [PathRoute]) {
    paths.sort_by_key(|r| (std::cmp::Reverse(r.path.len()), !r.exact));
}

/// Matches an `:authority` of exactly one label before `suffix` (any case, optional port).
fn one_label_authority(suffix: &str) -> HeaderMatcher {
    let escaped: String = suffix
        .chars()
        .flat_map(|c| {
            let escape = !(c.is_ascii_alphanumeric() || c == '-' || c == '_');
            escape.then_some('\\').into_iter().chain([c])
        })
        .collect();
    HeaderMatcher {
        name: ":authority".to_owned(),
        header_match_specifier: Some(header_matcher::HeaderMatchSpecifier::StringMatch(
            StringMatcher {
                match_pattern: Some(string_matcher::MatchPattern::SafeRegex(RegexMatcher {
                    regex: format!("(?i)^[^.:]+\\.{escaped}(:[0-9]+)?$"),
                    ..Default::default()
                })),
                ..Default::default()
            },
        )),
        ..Default::default()
    }
}

fn envoy_route(r: PathRoute, header: Option<HeaderMatcher>) -> Route {
    let specifier = if r.exact {
        route_match::PathSpecifier::Path(r.path.clone())
    } else {
        let trimmed = r.path.trim_end_matches('/');
        if trimmed.is_empty() {
            route_match::PathSpecifier::Prefix("/".to_owned())
        } else {
            route_match::PathSpecifier::PathSeparatedPrefix(trimmed.to_owned())
        }
    };
    Route {
        name: format!("{} {}", if r.exact { "Exact" } else { "Prefix" }, r.path),
        r#match: Some(RouteMatch {
            path_specifier: Some(specifier),
            headers: header.into_iter().collect(),
            ..Default::default()
        }),
        action: Some(r.action),
        ..Default::default()
    }
}

pub(crate) fn hcm_filter(route_config: &str) -> Filter {
    let hcm = HttpConnectionManager {
        stat_prefix: route_config.to_owned(),
        route_specifier: Some(http_connection_manager::RouteSpecifier::Rds(Rds {
            config_source: ads(),
            route_config_name: route_config.to_owned(),
        })),
        strip_port_mode: Some(http_connection_manager::StripPortMode::StripAnyHostPort(
            true,
        )),
        use_remote_address: Some(BoolValue { value: true }),
        http_filters: vec![HttpFilter {
            name: "envoy.filters.http.router".to_owned(),
            config_type: Some(http_filter::ConfigType::TypedConfig(any_of(
                &Router::default(),
            ))),
            ..Default::default()
        }],
        ..Default::default()
    };
    Filter {
        name: "envoy.filters.network.http_connection_manager".to_owned(),
        config_type: Some(filter::ConfigType::TypedConfig(any_of(&hcm))),
    }
}

pub(crate) fn tls_inspector() -> envoy_types::pb::envoy::config::listener::v3::ListenerFilter {
    use envoy_types::pb::envoy::config::listener::v3::{ListenerFilter, listener_filter};
    use envoy_types::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
    ListenerFilter {
        name: "envoy.filters.listener.tls_inspector".to_owned(),
        config_type: Some(listener_filter::ConfigType::TypedConfig(any_of(
            &TlsInspector::default(),
        ))),
        ..Default::default()
    }
}

fn add_clusters(b: &mut SnapshotBuilder, set: &ManifestSet, options: &TranslateOptions) {
    for se in &set.service_entries {
        let Some(hostname) = se.hosts.first() else {
            continue;
        };
        for port in &se.ports {
            let name = cluster_name(hostname, port.number);
            let cluster = Cluster {
                name: name.clone(),
                cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
                    cluster::DiscoveryType::Eds as i32,
                )),
                eds_cluster_config: Some(cluster::EdsClusterConfig {
                    eds_config: ads(),
                    service_name: name.clone(),
                }),
                connect_timeout: Some(duration(options.connect_timeout)),
                ..Default::default()
            };
            b.add(CLUSTER_TYPE_URL, &name, &cluster);
            let lb_endpoints = set
                .workload_entries
                .iter()
                .filter(|we| we.namespace == se.namespace && we.matches(&se.workload_selector))
                .map(|we| LbEndpoint {
                    host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                        address: socket_address(we.address, target_port(port, &we.ports)),
                        ..Default::default()
                    })),
                    ..Default::default()
                })
                .collect();
            let cla = ClusterLoadAssignment {
                cluster_name: name.clone(),
                endpoints: vec![LocalityLbEndpoints {
                    lb_endpoints,
                    ..Default::default()
                }],
                ..Default::default()
            };
            b.add(ENDPOINT_TYPE_URL, &name, &cla);
        }
    }
}

fn duration(d: Duration) -> envoy_types::pb::google::protobuf::Duration {
    envoy_types::pb::google::protobuf::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}
