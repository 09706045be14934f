//! The Gateway API (Gateway, HTTPRoute, GatewayClass, ReferenceGrant): served as they are to
//! meshkit gateways, translated to Envoy listeners and routes, and reported as status
//! conditions.
//!
//! | what | names | from |
//! |---|---|---|
//! | `meshkit.dev/k8s-json/...` resources (see `meshkit_mesh::resources`) | `namespace/name` (GatewayClass: `name`) | each object, as its Kubernetes JSON |
//! | Envoy `Listener` | `gateway-api-PORT` | each port with an HTTP or HTTPS listener of a served Gateway, bound on [`TranslateOptions::gateway_api_address`](crate::translate::TranslateOptions::gateway_api_address) |
//! | Envoy `RouteConfiguration` | `gateway-api-PORT` | the routes of that port's listeners |
//! | Envoy `Cluster` / `ClusterLoadAssignment` | as for Ingress | the ServiceEntry a backend names |
//!
//! How the Gateway API semantics map to Envoy (both follow
//! `meshkit_ingress_model::gateway::HttpRouteTable`, whose `domains` view is translated):
//!
//! - Each domain of a port (a listener hostname, a route hostname within it, or `*`) is a
//!   virtual host. Envoy picks the most specific domain as the table picks the listener and
//!   route hostname; Envoy's `*.example.com` covers any number of labels, as the Gateway
//!   API's does. A virtual host's routes are the rules of its own hostname and then of each
//!   wider hostname of the same listener, in precedence order, so Envoy's first match is the
//!   table's answer; a domain with no rules is kept, empty, so its hosts answer 404 rather
//!   than reaching a wider listener's routes.
//! - `Exact` is `path`; `PathPrefix` is `path_separated_prefix` without the trailing slash
//!   (`prefix: /` for `/`); headers are exact `HeaderMatcher`s, the method a `:method`
//!   matcher, query parameters exact `QueryParameterMatcher`s.
//! - Backends: one valid backend is a `cluster`; several are `weighted_clusters` (weight 0
//!   left out); an invalid backend keeps its weight under a cluster name that is never
//!   defined, and `cluster_not_found_response_code: INTERNAL_SERVER_ERROR` answers its share
//!   with 500; no backend of non-zero weight is a direct 500.
//! - `RequestHeaderModifier` and `ResponseHeaderModifier` are the route's
//!   `request_headers_to_add` (set: overwrite, add: append) and `_to_remove` (and the
//!   response ones); `URLRewrite` is `host_rewrite_literal` and `prefix_rewrite`
//!   (`regex_rewrite` to `/` for an empty replacement, and for `ReplaceFullPath`);
//!   `RequestRedirect` is a `redirect` with the scheme, host, path rewrite and code, and the
//!   port the specification derives, left out where it is the scheme's default (the HTTP
//!   connection manager strips the request's port, as for Ingress).
//! - HTTPS ports: one filter chain per listener, matched by its hostname as SNI, with its
//!   first certificate whose Secret exists, over SDS.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use envoy_types::pb::envoy::config::core::v3::{
    HeaderValue, HeaderValueOption, header_value_option,
};
use envoy_types::pb::envoy::config::listener::v3::{FilterChain, Listener};
use envoy_types::pb::envoy::config::route::v3::{
    DirectResponseAction, HeaderMatcher, QueryParameterMatcher, RedirectAction, Route, RouteAction,
    RouteConfiguration, RouteMatch, VirtualHost, WeightedCluster, header_matcher,
    query_parameter_matcher, redirect_action, route, route_action, route_match, weighted_cluster,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{
    RegexMatchAndSubstitute, RegexMatcher, StringMatcher, string_matcher,
};
use envoy_types::pb::google::protobuf::{Any, UInt32Value};
use meshkit_ingress_model::gateway::types::{Gateway, GatewayClass};
use meshkit_ingress_model::gateway::{
    Backend, Filter, HttpRouteTable, PathModifier, Redirect, RuleMatch, UrlRewrite,
};
use meshkit_mesh::resources::{GatewayApiKind, GatewayApiResource};
use meshkit_xds_client::{LISTENER_TYPE_URL, ROUTE_TYPE_URL};
use meshkit_xds_server::SnapshotBuilder;
use serde_json::{Value, json};

use crate::manifests::ManifestSet;
use crate::translate::{
    TranslateOptions, cluster_name, hcm_filter, inline, socket_address, tls_filter_chain,
    tls_inspector,
};

/// The controller name whose GatewayClasses meshkit serves by default.
pub const DEFAULT_CONTROLLER: &str = meshkit_mesh::resources::GATEWAY_CONTROLLER;

/// The route table of the Gateways the control plane serves, over the manifests' objects:
/// those of [`TranslateOptions::gateway_controller`]'s classes (all when it is `None`), with
/// the ServiceEntries as the Services that exist.
pub fn route_table(set: &ManifestSet, options: &TranslateOptions) -> HttpRouteTable {
    let mut builder = HttpRouteTable::builder()
        .services(
            set.service_entries
                .iter()
                .map(|se| (se.namespace.clone(), se.name.clone())),
        )
        .secrets(
            set.secrets
                .iter()
                .map(|s| (s.namespace.clone(), s.name.clone())),
        );
    if let Some(controller) = &options.gateway_controller {
        builder = builder.controller(controller.clone());
    }
    builder.build_objects(&set.gateway_api)
}

/// Adds the Gateway API objects as they are, for meshkit gateways: the GatewayClasses of
/// [`TranslateOptions::gateway_controller`] and their Gateways (all when it is `None`),
/// every HTTPRoute and ReferenceGrant. A gateway is sent no Gateway it does not serve, so
/// none of the Secrets such a Gateway names (see `access`).
pub fn add_resources(b: &mut SnapshotBuilder, set: &ManifestSet, options: &TranslateOptions) {
    let objects = &set.gateway_api;
    let classes: Vec<&GatewayClass> = objects
        .gateway_classes
        .iter()
        .filter(|c| {
            options
                .gateway_controller
                .as_ref()
                .is_none_or(|controller| c.spec.controller_name == *controller)
        })
        .collect();
    let served = |g: &&Gateway| {
        options.gateway_controller.is_none()
            || classes
                .iter()
                .any(|c| c.metadata.name.as_deref() == Some(g.spec.gateway_class_name.as_str()))
    };
    add_all(b, classes.iter().copied());
    add_all(b, objects.gateways.iter().filter(served));
    add_all(b, &objects.http_routes);
    add_all(b, &objects.reference_grants);
}

fn add_all<'o, K: GatewayApiKind>(
    b: &mut SnapshotBuilder,
    objects: impl IntoIterator<Item = &'o K>,
) {
    for object in objects {
        // Every object loaded from a manifest came from JSON, so it writes back as JSON.
        let Ok(value) = GatewayApiResource::encode(object) else {
            continue;
        };
        b.add_any(
            K::TYPE_URL,
            &GatewayApiResource::name_of(object),
            Any {
                type_url: K::TYPE_URL.to_owned(),
                value,
            },
        );
    }
}

/// Adds the Envoy listeners and routes of `table`'s ports.
pub fn add_envoy(
    b: &mut SnapshotBuilder,
    set: &ManifestSet,
    options: &TranslateOptions,
    table: &HttpRouteTable,
) {
    let secrets: BTreeSet<String> = set
        .secrets
        .iter()
        .map(|s| format!("{}/{}", s.namespace, s.name))
        .collect();
    for (port, https) in table.ports() {
        let name = format!("gateway-api-{port}");
        let address = std::net::SocketAddr::new(options.gateway_api_address, port);
        let collides = |ingress: std::net::SocketAddr| {
            ingress.port() == port
                && (ingress.ip() == address.ip()
                    || ingress.ip().is_unspecified()
                    || address.ip().is_unspecified())
        };
        if collides(options.http_listener) || options.https_listener.is_some_and(collides) {
            // Envoy would refuse the listener, and with it the whole update.
            tracing::warn!(
                port,
                "a Gateway listener's port is an Ingress listener's: not translated for Envoy"
            );
            continue;
        }
        let scheme = if https { "https" } else { "http" };
        let virtual_hosts = table
            .domains(port)
            .into_iter()
            .map(|domain| VirtualHost {
                name: domain.domain.clone(),
                domains: vec![domain.domain.clone()],
                routes: domain
                    .rules
                    .iter()
                    .map(|rule| envoy_route(set, rule, scheme, port))
                    .collect(),
                ..Default::default()
            })
            .collect();
        b.add(
            ROUTE_TYPE_URL,
            &name,
            &RouteConfiguration {
                name: name.clone(),
                virtual_hosts,
                ..Default::default()
            },
        );
        let filter_chains = if https {
            table
                .listeners(port)
                .into_iter()
                .filter(|l| l.https)
                .filter_map(|l| {
                    let secret = l
                        .certificates
                        .iter()
                        .map(|c| format!("{}/{}", c.namespace, c.name))
                        .find(|s| secrets.contains(s))?;
                    Some(tls_filter_chain(
                        l.hostname.clone().unwrap_or_else(|| "*".to_owned()),
                        l.hostname.map(|h| vec![h]),
                        &name,
                        secret,
                    ))
                })
                .collect()
        } else {
            vec![FilterChain {
                filters: vec![hcm_filter(&name)],
                ..Default::default()
            }]
        };
        if filter_chains.is_empty() {
            continue;
        }
        b.add(
            LISTENER_TYPE_URL,
            &name,
            &Listener {
                name: name.clone(),
                address: socket_address(options.gateway_api_address, port),
                listener_filters: if https {
                    vec![tls_inspector()]
                } else {
                    Vec::new()
                },
                filter_chains,
                ..Default::default()
            },
        );
    }
}

fn exact(value: &str) -> StringMatcher {
    StringMatcher {
        match_pattern: Some(string_matcher::MatchPattern::Exact(value.to_owned())),
        ..Default::default()
    }
}

fn header_exact(name: &str, value: &str) -> HeaderMatcher {
    HeaderMatcher {
        name: name.to_owned(),
        header_match_specifier: Some(header_matcher::HeaderMatchSpecifier::StringMatch(exact(
            value,
        ))),
        ..Default::default()
    }
}

fn envoy_route(set: &ManifestSet, rule: &RuleMatch<'_>, scheme: &str, port: u16) -> Route {
    let value = rule.matched_path();
    let path_specifier = if rule.is_exact_path() {
        route_match::PathSpecifier::Path(value.to_owned())
    } else {
        match value.trim_end_matches('/') {
            "" => route_match::PathSpecifier::Prefix("/".to_owned()),
            trimmed => route_match::PathSpecifier::PathSeparatedPrefix(trimmed.to_owned()),
        }
    };
    let mut headers: Vec<HeaderMatcher> = rule
        .header_matches()
        .map(|(name, value)| header_exact(name.as_str(), value))
        .collect();
    if let Some(method) = rule.method() {
        headers.push(header_exact(":method", method));
    }
    let query_parameters = rule
        .query_matches()
        .map(|(name, value)| QueryParameterMatcher {
            name: name.to_owned(),
            query_parameter_match_specifier: Some(
                query_parameter_matcher::QueryParameterMatchSpecifier::StringMatch(exact(value)),
            ),
        })
        .collect();
    let mut out = Route {
        name: format!(
            "{}/{} rule {} match {}",
            rule.namespace(),
            rule.route_name(),
            rule.rule_index(),
            rule.match_index()
        ),
        r#match: Some(RouteMatch {
            path_specifier: Some(path_specifier),
            headers,
            query_parameters,
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut rewrite = None;
    let mut redirect = None;
    for filter in rule.filters() {
        match filter {
            Filter::RequestHeaders(m) => {
                out.request_headers_to_add.extend(header_options(m));
                out.request_headers_to_remove
                    .extend(m.remove().iter().map(|n| n.as_str().to_owned()));
            }
            Filter::ResponseHeaders(m) => {
                out.response_headers_to_add.extend(header_options(m));
                out.response_headers_to_remove
                    .extend(m.remove().iter().map(|n| n.as_str().to_owned()));
            }
            Filter::Rewrite(r) => rewrite = Some(r),
            Filter::Redirect(r) => redirect = Some(r),
            _ => {}
        }
    }
    out.action = Some(match redirect {
        Some(r) => route::Action::Redirect(redirect_action(r, value, scheme, port)),
        None => forward_action(set, rule, rewrite),
    });
    out
}

fn header_options(m: &meshkit_ingress_model::gateway::HeaderModifier) -> Vec<HeaderValueOption> {
    use header_value_option::HeaderAppendAction as A;
    let option =
        |(name, value): &(http::HeaderName, http::HeaderValue), action: A| HeaderValueOption {
            header: Some(HeaderValue {
                key: name.as_str().to_owned(),
                value: String::from_utf8_lossy(value.as_bytes()).into_owned(),
                ..Default::default()
            }),
            append_action: action as i32,
            ..Default::default()
        };
    m.set()
        .iter()
        .map(|h| option(h, A::OverwriteIfExistsOrAdd))
        .chain(m.add().iter().map(|h| option(h, A::AppendIfExistsOrAdd)))
        .collect()
}

/// `prefix_rewrite`, or a `regex_rewrite` where Envoy's prefix rewrite cannot say it.
enum PathRewrite {
    Prefix(String),
    Regex(RegexMatchAndSubstitute),
}

fn path_rewrite(modifier: &PathModifier, matched: &str) -> PathRewrite {
    let regex = |pattern: String, substitution: String| {
        PathRewrite::Regex(RegexMatchAndSubstitute {
            pattern: Some(RegexMatcher {
                regex: pattern,
                ..Default::default()
            }),
            substitution,
        })
    };
    match modifier {
        PathModifier::ReplaceFullPath(full) => regex("^.*$".to_owned(), full.clone()),
        PathModifier::ReplacePrefixMatch(replacement) => {
            let prefix = matched.trim_end_matches('/');
            match (prefix, replacement.trim_end_matches('/')) {
                // The prefix and the slashes after it become the one `/`.
                (_, "") => regex(format!("^{}/*", regex_escape(prefix)), "/".to_owned()),
                // The matched prefix is Envoy's `/`, which the path's own `/` follows.
                ("", trimmed) => PathRewrite::Prefix(format!("{trimmed}/")),
                (_, trimmed) => PathRewrite::Prefix(trimmed.to_owned()),
            }
        }
    }
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let escape = !(c.is_ascii_alphanumeric() || c == '/' || c == '-' || c == '_');
            escape.then_some('\\').into_iter().chain([c])
        })
        .collect()
}

fn redirect_action(
    r: &Redirect,
    matched: &str,
    listener_scheme: &str,
    port: u16,
) -> RedirectAction {
    use redirect_action::{
        PathRewriteSpecifier as P, RedirectResponseCode as C, SchemeRewriteSpecifier as S,
    };
    let scheme = r.scheme().unwrap_or(listener_scheme);
    let port = r.port().unwrap_or(match r.scheme() {
        Some("http") => 80,
        Some("https") => 443,
        _ => port,
    });
    let default_port = matches!((scheme, port), ("http", 80) | ("https", 443));
    RedirectAction {
        scheme_rewrite_specifier: r.scheme().map(|s| S::SchemeRedirect(s.to_owned())),
        host_redirect: r.hostname().unwrap_or_default().to_owned(),
        port_redirect: if default_port { 0 } else { u32::from(port) },
        path_rewrite_specifier: r.path_modifier().map(|m| match m {
            PathModifier::ReplaceFullPath(full) => P::PathRedirect(full.clone()),
            PathModifier::ReplacePrefixMatch(_) => match path_rewrite(m, matched) {
                PathRewrite::Prefix(p) => P::PrefixRewrite(p),
                PathRewrite::Regex(re) => P::RegexRewrite(re),
            },
        }),
        response_code: match r.status() {
            301 => C::MovedPermanently,
            303 => C::SeeOther,
            307 => C::TemporaryRedirect,
            308 => C::PermanentRedirect,
            _ => C::Found,
        } as i32,
        ..Default::default()
    }
}

/// The cluster of a resolved backend: the ServiceEntry of its namespace by name.
fn backend_cluster(set: &ManifestSet, backend: &Backend) -> Option<String> {
    let service = backend.target.as_ref().ok()?;
    let entry = set
        .service_entries
        .iter()
        .find(|se| se.namespace == service.namespace && se.name == service.name)?;
    entry
        .ports
        .iter()
        .find(|p| p.number == service.port)
        .and_then(|p| Some(cluster_name(entry.hosts.first()?, p.number)))
}

fn forward_action(
    set: &ManifestSet,
    rule: &RuleMatch<'_>,
    rewrite: Option<&UrlRewrite>,
) -> route::Action {
    let shares: Vec<(String, u32, &Backend)> = rule
        .backends()
        .iter()
        .enumerate()
        .filter(|(_, b)| b.weight > 0)
        .map(|(i, b)| {
            let cluster = backend_cluster(set, b).unwrap_or_else(|| {
                // Never defined: Envoy answers this share with cluster_not_found_response_code.
                format!(
                    "invalid-backend|{}/{}|{}|{i}",
                    rule.namespace(),
                    rule.route_name(),
                    rule.rule_index()
                )
            });
            (cluster, b.weight, b)
        })
        .collect();
    // A backend's own filters (header changes only) need its own cluster entry.
    let per_backend = shares.iter().any(|(_, _, b)| !b.filters.is_empty());
    let specifier = match shares.as_slice() {
        [] => {
            return route::Action::DirectResponse(DirectResponseAction {
                status: 500,
                body: inline(b"no backend\n"),
                ..Default::default()
            });
        }
        [(cluster, _, _)] if !per_backend => {
            route_action::ClusterSpecifier::Cluster(cluster.clone())
        }
        _ => route_action::ClusterSpecifier::WeightedClusters(WeightedCluster {
            clusters: shares
                .iter()
                .map(|(name, weight, backend)| {
                    let mut entry = weighted_cluster::ClusterWeight {
                        name: name.clone(),
                        weight: Some(UInt32Value { value: *weight }),
                        ..Default::default()
                    };
                    for filter in &backend.filters {
                        match filter {
                            Filter::RequestHeaders(m) => {
                                entry.request_headers_to_add.extend(header_options(m));
                                entry
                                    .request_headers_to_remove
                                    .extend(m.remove().iter().map(|n| n.as_str().to_owned()));
                            }
                            Filter::ResponseHeaders(m) => {
                                entry.response_headers_to_add.extend(header_options(m));
                                entry
                                    .response_headers_to_remove
                                    .extend(m.remove().iter().map(|n| n.as_str().to_owned()));
                            }
                            _ => {}
                        }
                    }
                    entry
                })
                .collect(),
            ..Default::default()
        }),
    };
    let mut action = RouteAction {
        cluster_specifier: Some(specifier),
        cluster_not_found_response_code:
            route_action::ClusterNotFoundResponseCode::InternalServerError as i32,
        ..Default::default()
    };
    if let Some(rewrite) = rewrite {
        if let Some(host) = rewrite.hostname() {
            action.host_rewrite_specifier = Some(
                route_action::HostRewriteSpecifier::HostRewriteLiteral(host.to_owned()),
            );
        }
        match rewrite
            .path_modifier()
            .map(|m| path_rewrite(m, rule.matched_path()))
        {
            Some(PathRewrite::Prefix(p)) => action.prefix_rewrite = p,
            Some(PathRewrite::Regex(re)) => action.regex_rewrite = Some(re),
            None => {}
        }
    }
    route::Action::Route(action)
}

/// The routes' and listeners' status conditions, as the config dump shows them.
pub fn status_json(table: &HttpRouteTable) -> Value {
    let condition = |c: &meshkit_ingress_model::gateway::Condition| {
        json!({
            "status": if c.status { "True" } else { "False" },
            "reason": c.reason.as_str(),
            "message": c.message,
        })
    };
    let routes: Vec<Value> = table
        .route_status()
        .iter()
        .map(|s| {
            json!({
                "route": format!("{}/{}", s.namespace, s.name),
                "parent": {
                    "namespace": s.parent.namespace,
                    "name": s.parent.name,
                    "sectionName": s.parent.section_name,
                    "port": s.parent.port,
                },
                "conditions": {
                    "Accepted": condition(&s.accepted),
                    "ResolvedRefs": condition(&s.resolved_refs),
                },
            })
        })
        .collect();
    let listeners: Vec<Value> = table
        .listener_status()
        .iter()
        .map(|l| {
            json!({
                "gateway": format!("{}/{}", l.namespace, l.gateway),
                "listener": l.listener,
                "attachedRoutes": l.attached_routes,
                "conditions": {
                    "Accepted": condition(&l.accepted),
                    "ResolvedRefs": condition(&l.resolved_refs),
                },
            })
        })
        .collect();
    json!({ "httpRoutes": routes, "listeners": listeners })
}

/// Logs each route parent and listener whose condition is not `True`, and a summary.
pub fn log_status(table: &HttpRouteTable) {
    let mut accepted = 0usize;
    for s in table.route_status() {
        if s.accepted.status {
            accepted += 1;
        } else {
            tracing::warn!(route = %format!("{}/{}", s.namespace, s.name), parent = %s.parent.name,
                reason = s.accepted.reason.as_str(), message = %s.accepted.message, "HTTPRoute not accepted");
        }
        if !s.resolved_refs.status {
            tracing::warn!(route = %format!("{}/{}", s.namespace, s.name),
                reason = s.resolved_refs.reason.as_str(), message = %s.resolved_refs.message, "HTTPRoute references not resolved");
        }
    }
    for l in table.listener_status() {
        for c in [&l.accepted, &l.resolved_refs] {
            if !c.status {
                tracing::warn!(gateway = %format!("{}/{}", l.namespace, l.gateway), listener = %l.listener,
                    reason = c.reason.as_str(), message = %c.message, "Gateway listener condition");
            }
        }
    }
    let by_port: BTreeMap<u16, bool> = table.ports().into_iter().collect();
    tracing::info!(
        route_parents = table.route_status().len(),
        accepted,
        rules = table.rule_count(),
        ports = ?by_port.keys().collect::<Vec<_>>(),
        "Gateway API routes"
    );
}

/// The address Envoy's Gateway API listeners bind by default.
pub const DEFAULT_ADDRESS: IpAddr = IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);
