//! Validation of Gateway API objects by the rules of the standard-channel CRDs (their
//! OpenAPI schemas and CEL rules), with errors in the Kubernetes style and field paths.
//!
//! ```
//! use meshkit_ingress_model::gateway::{manifest, validation};
//!
//! let objects = manifest::from_yaml_str(r#"
//! apiVersion: gateway.networking.k8s.io/v1
//! kind: HTTPRoute
//! metadata: {name: shop, namespace: edge}
//! spec:
//!   parentRefs: [{name: public}]
//!   rules:
//!   - matches: [{path: {type: PathPrefix, value: api}}]
//!     backendRefs: [{name: api, port: 8080, weight: 2000000}]
//! "#)?;
//! let errors = validation::validate_http_route(&objects.http_routes[0]).unwrap_err();
//! assert_eq!(errors.errors()[0].path(), "spec.rules[0].matches[0].path.value");
//! assert_eq!(errors.errors()[1].path(), "spec.rules[0].backendRefs[0].weight");
//! # Ok::<(), meshkit_ingress_model::manifest::ManifestError>(())
//! ```
//!
//! Covered: object metadata; GatewayClass `controllerName`, `description` and
//! `parametersRef`; Gateway class name, listeners (count, names, hostnames, ports,
//! protocols, the TLS rules per protocol, uniqueness of names and of port, protocol and
//! hostname, certificate references, allowed routes) and addresses; HTTPRoute parent
//! references (and the rules on several references to one parent), hostnames, rules and
//! the total of matches, path values, header and query names and values, methods, filters
//! (each type with exactly its field, which may not repeat, redirect with neither rewrite
//! nor backends, `ReplacePrefixMatch` only with one PathPrefix match), backend references
//! (Service needs a port, weights 0 to 1,000,000) and timeouts' format; ReferenceGrant
//! `from` and `to`. Not covered: rules that need the previous object (immutability).

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use super::types::{
    BackendObjectReference, Gateway, GatewayClass, HttpPathModifier, HttpRoute, HttpRouteFilter,
    HttpRouteRule, Listener, ParentReference, ReferenceGrant, SecretObjectReference,
};
use crate::validation::{
    Errors, FieldError, ValidationErrors, dns1123_label_errors, dns1123_subdomain_errors,
    validate_object_meta,
};

const PROTOCOLS_WITHOUT_TLS: &[&str] = &["HTTP", "TCP", "UDP"];
const PROTOCOLS_WITHOUT_HOSTNAME: &[&str] = &["TCP", "UDP"];
const TLS_MODES: &[&str] = &["Passthrough", "Terminate"];
const FROM_NAMESPACES: &[&str] = &["All", "Same", "Selector"];
const PATH_MATCH_TYPES: &[&str] = &["Exact", "PathPrefix", "RegularExpression"];
const VALUE_MATCH_TYPES: &[&str] = &["Exact", "RegularExpression"];
const METHODS: &[&str] = &[
    "CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE",
];
const FILTER_TYPES: &[&str] = &[
    "CORS",
    "ExtensionRef",
    "RequestHeaderModifier",
    "RequestMirror",
    "RequestRedirect",
    "ResponseHeaderModifier",
    "URLRewrite",
];
const UNREPEATABLE_FILTERS: &[&str] = &[
    "CORS",
    "RequestHeaderModifier",
    "RequestRedirect",
    "ResponseHeaderModifier",
    "URLRewrite",
];
const PATH_MODIFIERS: &[&str] = &["ReplaceFullPath", "ReplacePrefixMatch"];
const SCHEMES: &[&str] = &["http", "https"];
const REDIRECT_CODES: &[&str] = &["301", "302", "303", "307", "308"];
const INVALID_PATH_SEQUENCES: &[&str] = &["//", "/./", "/../", "%2f", "%2F", "#"];
const INVALID_PATH_SUFFIXES: &[&str] = &["/..", "/."];
const MAX_WEIGHT: i32 = 1_000_000;

/// Validates a GatewayClass as the API server does on create.
///
/// # Errors
///
/// Every failing rule, each with its field path.
pub fn validate_gateway_class(class: &GatewayClass) -> Result<(), ValidationErrors> {
    let mut errs = Errors::default();
    validate_object_meta(Some(&class.metadata), false, &mut errs);
    let spec = &class.spec;
    controller_name(&spec.controller_name, "spec.controllerName", &mut errs);
    if let Some(description) = &spec.description {
        max_len(description, 64, "spec.description", &mut errs);
    }
    if let Some(params) = &spec.parameters_ref {
        group(&params.group, "spec.parametersRef.group", &mut errs);
        kind(&params.kind, "spec.parametersRef.kind", &mut errs);
        object_name(&params.name, "spec.parametersRef.name", &mut errs);
        if let Some(ns) = &params.namespace {
            namespace(ns, "spec.parametersRef.namespace", &mut errs);
        }
    }
    errs.finish()
}

/// Validates a Gateway as the API server does on create.
///
/// # Errors
///
/// Every failing rule, each with its field path.
pub fn validate_gateway(gateway: &Gateway) -> Result<(), ValidationErrors> {
    let mut errs = Errors::default();
    validate_object_meta(Some(&gateway.metadata), true, &mut errs);
    let spec = &gateway.spec;
    object_name(&spec.gateway_class_name, "spec.gatewayClassName", &mut errs);
    let listeners = &spec.listeners;
    if listeners.is_empty() {
        errs.required("spec.listeners", "a Gateway needs at least one listener");
    }
    too_many(listeners.len(), 64, "spec.listeners", &mut errs);
    let mut names = HashSet::new();
    let mut combinations = HashSet::new();
    for (i, listener) in listeners.iter().enumerate() {
        let at = format!("spec.listeners[{i}]");
        validate_listener(listener, &at, &mut errs);
        if !names.insert(listener.name.as_str()) {
            errs.invalid(
                format!("{at}.name"),
                &listener.name,
                "Listener name must be unique within the Gateway",
            );
        }
        let hostname = listener.hostname.as_deref().unwrap_or("");
        if !combinations.insert((listener.port, listener.protocol.as_str(), hostname)) {
            errs.invalid(
                at,
                &listener.name,
                "Combination of port, protocol and hostname must be unique for each listener",
            );
        }
    }
    too_many(spec.addresses.len(), 16, "spec.addresses", &mut errs);
    let mut addresses = HashSet::new();
    for (i, address) in spec.addresses.iter().enumerate() {
        let at = format!("spec.addresses[{i}]");
        let address_type = address.address_type.as_deref().unwrap_or("IPAddress");
        match address_type {
            "IPAddress" => {
                if !address.value.is_empty() && address.value.parse::<IpAddr>().is_err() {
                    errs.invalid(
                        format!("{at}.value"),
                        &address.value,
                        "must be an IP address",
                    );
                }
            }
            "Hostname" => {
                if !address.value.is_empty() {
                    hostname_value(&address.value, false, &format!("{at}.value"), &mut errs);
                }
            }
            other if other.contains('/') => {
                domain_prefixed(other, &format!("{at}.type"), &mut errs)
            }
            other => errs.0.push(FieldError::NotSupported {
                path: format!("{at}.type"),
                value: other.to_owned(),
                supported: vec!["Hostname", "IPAddress", "<domain>/<type>"],
            }),
        }
        max_len(&address.value, 253, &format!("{at}.value"), &mut errs);
        if matches!(address_type, "IPAddress" | "Hostname")
            && !address.value.is_empty()
            && !addresses.insert((address_type, address.value.as_str()))
        {
            errs.invalid(
                format!("{at}.value"),
                &address.value,
                format!("{address_type} values must be unique"),
            );
        }
    }
    errs.finish()
}

fn validate_listener(listener: &Listener, at: &str, errs: &mut Errors) {
    section_name(&listener.name, &format!("{at}.name"), errs);
    if let Some(hostname) = &listener.hostname {
        hostname_value(hostname, true, &format!("{at}.hostname"), errs);
    }
    port(listener.port, &format!("{at}.port"), errs);
    let protocol = listener.protocol.as_str();
    let protocol_at = format!("{at}.protocol");
    if protocol.is_empty() {
        errs.required(protocol_at, "");
    } else if protocol.contains('/') {
        domain_prefixed(protocol, &protocol_at, errs);
    } else if protocol.len() > 255 || !alnum_dash(protocol) {
        errs.invalid(
            protocol_at,
            protocol,
            "must be alphanumeric with '-' inside, or a domain-prefixed path",
        );
    }
    if PROTOCOLS_WITHOUT_TLS.contains(&protocol) && listener.tls.is_some() {
        errs.forbidden(
            format!("{at}.tls"),
            "tls must not be specified for protocols ['HTTP', 'TCP', 'UDP']",
        );
    }
    if PROTOCOLS_WITHOUT_HOSTNAME.contains(&protocol)
        && listener.hostname.as_deref().is_some_and(|h| !h.is_empty())
    {
        errs.forbidden(
            format!("{at}.hostname"),
            "hostname must not be specified for protocols ['TCP', 'UDP']",
        );
    }
    if protocol == "TLS"
        && listener
            .tls
            .as_ref()
            .and_then(|t| t.mode.as_deref())
            .is_none()
    {
        errs.required(
            format!("{at}.tls.mode"),
            "tls mode must be set for protocol TLS",
        );
    }
    if let Some(tls) = &listener.tls {
        let mode = tls.mode.as_deref().unwrap_or("Terminate");
        if !TLS_MODES.contains(&mode) {
            not_supported(format!("{at}.tls.mode"), mode, TLS_MODES, errs);
        }
        if protocol == "HTTPS" && mode != "Terminate" {
            errs.invalid(
                format!("{at}.tls.mode"),
                mode,
                "tls mode must be Terminate for protocol HTTPS",
            );
        }
        if mode == "Terminate" && tls.certificate_refs.is_empty() && tls.options.is_empty() {
            errs.required(
                format!("{at}.tls"),
                "certificateRefs or options must be specified when mode is Terminate",
            );
        }
        too_many(
            tls.certificate_refs.len(),
            64,
            &format!("{at}.tls.certificateRefs"),
            errs,
        );
        for (j, cert) in tls.certificate_refs.iter().enumerate() {
            secret_ref(cert, &format!("{at}.tls.certificateRefs[{j}]"), errs);
        }
        too_many(tls.options.len(), 16, &format!("{at}.tls.options"), errs);
        for value in tls.options.values() {
            max_len(value, 4096, &format!("{at}.tls.options"), errs);
        }
    }
    if let Some(allowed) = &listener.allowed_routes {
        if let Some(from) = allowed.namespaces.as_ref().and_then(|n| n.from.as_deref())
            && !FROM_NAMESPACES.contains(&from)
        {
            not_supported(
                format!("{at}.allowedRoutes.namespaces.from"),
                from,
                FROM_NAMESPACES,
                errs,
            );
        }
        too_many(
            allowed.kinds.len(),
            8,
            &format!("{at}.allowedRoutes.kinds"),
            errs,
        );
        for (j, k) in allowed.kinds.iter().enumerate() {
            let kind_at = format!("{at}.allowedRoutes.kinds[{j}]");
            if let Some(g) = &k.group {
                group(g, &format!("{kind_at}.group"), errs);
            }
            kind(&k.kind, &format!("{kind_at}.kind"), errs);
        }
    }
}

/// Validates an HTTPRoute as the API server does on create.
///
/// # Errors
///
/// Every failing rule, each with its field path.
pub fn validate_http_route(route: &HttpRoute) -> Result<(), ValidationErrors> {
    let mut errs = Errors::default();
    validate_object_meta(Some(&route.metadata), true, &mut errs);
    let spec = &route.spec;
    too_many(spec.parent_refs.len(), 32, "spec.parentRefs", &mut errs);
    for (i, parent) in spec.parent_refs.iter().enumerate() {
        parent_ref(parent, &format!("spec.parentRefs[{i}]"), &mut errs);
    }
    parent_refs_to_one_parent(&spec.parent_refs, &mut errs);
    too_many(spec.hostnames.len(), 16, "spec.hostnames", &mut errs);
    for (i, hostname) in spec.hostnames.iter().enumerate() {
        hostname_value(hostname, true, &format!("spec.hostnames[{i}]"), &mut errs);
    }
    too_many(spec.rules.len(), 16, "spec.rules", &mut errs);
    let total_matches: usize = spec.rules.iter().map(|r| r.matches.len()).sum();
    if total_matches > 128 {
        errs.invalid(
            "spec.rules",
            &total_matches.to_string(),
            "While 16 rules and 64 matches per rule are allowed, the total number of matches \
             across all rules in a route must be less than 128",
        );
    }
    for (i, rule) in spec.rules.iter().enumerate() {
        validate_rule(rule, &format!("spec.rules[{i}]"), &mut errs);
    }
    errs.finish()
}

fn parent_ref(parent: &ParentReference, at: &str, errs: &mut Errors) {
    if let Some(g) = &parent.group {
        group(g, &format!("{at}.group"), errs);
    }
    if let Some(k) = &parent.kind {
        kind(k, &format!("{at}.kind"), errs);
    }
    if let Some(ns) = &parent.namespace {
        namespace(ns, &format!("{at}.namespace"), errs);
    }
    object_name(&parent.name, &format!("{at}.name"), errs);
    if let Some(section) = &parent.section_name {
        section_name(section, &format!("{at}.sectionName"), errs);
    }
    if let Some(p) = parent.port {
        port(p, &format!("{at}.port"), errs);
    }
}

/// Several references to one parent must each name a different `sectionName`.
fn parent_refs_to_one_parent(parents: &[ParentReference], errs: &mut Errors) {
    let mut by_parent: HashMap<(&str, &str, &str, &str), Vec<Option<&str>>> = HashMap::new();
    for parent in parents {
        by_parent
            .entry((
                parent.group(),
                parent.kind(),
                parent.namespace.as_deref().unwrap_or(""),
                parent.name.as_str(),
            ))
            .or_default()
            .push(parent.section_name.as_deref().filter(|s| !s.is_empty()));
    }
    let mut missing = false;
    let mut repeated = false;
    for sections in by_parent.values().filter(|s| s.len() > 1) {
        if sections.iter().any(Option::is_some) && sections.iter().any(Option::is_none) {
            missing = true;
        }
        let mut seen = HashSet::new();
        if !sections.iter().all(|s| seen.insert(*s)) {
            repeated = true;
        }
    }
    if missing {
        errs.invalid(
            "spec.parentRefs",
            "",
            "sectionName must be specified when parentRefs includes 2 or more references to the same parent",
        );
    }
    if repeated {
        errs.invalid(
            "spec.parentRefs",
            "",
            "sectionName must be unique when parentRefs includes 2 or more references to the same parent",
        );
    }
}

fn validate_rule(rule: &HttpRouteRule, at: &str, errs: &mut Errors) {
    if let Some(name) = &rule.name {
        section_name(name, &format!("{at}.name"), errs);
    }
    too_many(rule.matches.len(), 64, &format!("{at}.matches"), errs);
    for (j, m) in rule.matches.iter().enumerate() {
        let match_at = format!("{at}.matches[{j}]");
        if let Some(path) = &m.path {
            let match_type = path.match_type();
            let value = path.value();
            if !PATH_MATCH_TYPES.contains(&match_type) {
                not_supported(
                    format!("{match_at}.path.type"),
                    match_type,
                    PATH_MATCH_TYPES,
                    errs,
                );
            }
            max_len(value, 1024, &format!("{match_at}.path.value"), errs);
            if matches!(match_type, "Exact" | "PathPrefix") {
                path_value(value, &format!("{match_at}.path.value"), errs);
            }
        }
        too_many(m.headers.len(), 16, &format!("{match_at}.headers"), errs);
        for (k, h) in m.headers.iter().enumerate() {
            let h_at = format!("{match_at}.headers[{k}]");
            value_match_type(h.match_type.as_deref(), &format!("{h_at}.type"), errs);
            header_name(&h.name, &format!("{h_at}.name"), errs);
            value_len(&h.value, 4096, &format!("{h_at}.value"), errs);
        }
        too_many(
            m.query_params.len(),
            16,
            &format!("{match_at}.queryParams"),
            errs,
        );
        for (k, q) in m.query_params.iter().enumerate() {
            let q_at = format!("{match_at}.queryParams[{k}]");
            value_match_type(q.match_type.as_deref(), &format!("{q_at}.type"), errs);
            header_name(&q.name, &format!("{q_at}.name"), errs);
            value_len(&q.value, 1024, &format!("{q_at}.value"), errs);
        }
        if let Some(method) = &m.method
            && !METHODS.contains(&method.as_str())
        {
            not_supported(format!("{match_at}.method"), method, METHODS, errs);
        }
    }
    let one_prefix_match = rule.matches.len() == 1
        && rule.matches.first().is_some_and(|m| {
            m.path
                .as_ref()
                .is_none_or(|p| p.match_type() == "PathPrefix")
        });
    filters(
        &rule.filters,
        one_prefix_match,
        &format!("{at}.filters"),
        errs,
    );
    if !rule.backend_refs.is_empty() && rule.filters.iter().any(|f| f.request_redirect.is_some()) {
        errs.invalid(
            format!("{at}.filters"),
            "RequestRedirect",
            "RequestRedirect filter must not be used together with backendRefs",
        );
    }
    too_many(
        rule.backend_refs.len(),
        16,
        &format!("{at}.backendRefs"),
        errs,
    );
    for (j, backend) in rule.backend_refs.iter().enumerate() {
        let b_at = format!("{at}.backendRefs[{j}]");
        backend_ref(&backend.backend, &b_at, errs);
        if let Some(weight) = backend.weight
            && !(0..=MAX_WEIGHT).contains(&weight)
        {
            errs.invalid(
                format!("{b_at}.weight"),
                &weight.to_string(),
                "must be between 0 and 1000000",
            );
        }
        filters(
            &backend.filters,
            one_prefix_match,
            &format!("{b_at}.filters"),
            errs,
        );
    }
    if let Some(timeouts) = &rule.timeouts {
        for (field, value) in [
            ("request", &timeouts.request),
            ("backendRequest", &timeouts.backend_request),
        ] {
            if let Some(value) = value
                && duration_millis(value).is_none()
            {
                errs.invalid(
                    format!("{at}.timeouts.{field}"),
                    value,
                    "must be a Gateway API duration such as 10s, 500ms or 1h30m",
                );
            }
        }
        if let (Some(request), Some(backend)) = (
            timeouts.request.as_deref().and_then(duration_millis),
            timeouts
                .backend_request
                .as_deref()
                .and_then(duration_millis),
        ) && request != 0
            && backend > request
        {
            errs.invalid(
                format!("{at}.timeouts"),
                "",
                "backendRequest timeout cannot be longer than request timeout",
            );
        }
    }
}

fn filters(list: &[HttpRouteFilter], one_prefix_match: bool, at: &str, errs: &mut Errors) {
    too_many(list.len(), 16, at, errs);
    let has = |t: &str| list.iter().any(|f| f.filter_type == t);
    if has("RequestRedirect") && has("URLRewrite") {
        errs.invalid(
            at,
            "",
            "May specify either httpRouteFilterRequestRedirect or httpRouteFilterRequestRewrite, but not both",
        );
    }
    for t in UNREPEATABLE_FILTERS {
        if list.iter().filter(|f| f.filter_type == *t).count() > 1 {
            errs.invalid(at, t, format!("{t} filter cannot be repeated"));
        }
    }
    for (i, filter) in list.iter().enumerate() {
        let f_at = format!("{at}[{i}]");
        let t = filter.filter_type.as_str();
        if !FILTER_TYPES.contains(&t) {
            not_supported(format!("{f_at}.type"), t, FILTER_TYPES, errs);
        }
        let fields = [
            (
                "requestHeaderModifier",
                "RequestHeaderModifier",
                filter.request_header_modifier.is_some(),
            ),
            (
                "responseHeaderModifier",
                "ResponseHeaderModifier",
                filter.response_header_modifier.is_some(),
            ),
            (
                "requestMirror",
                "RequestMirror",
                filter.request_mirror.is_some(),
            ),
            (
                "requestRedirect",
                "RequestRedirect",
                filter.request_redirect.is_some(),
            ),
            ("urlRewrite", "URLRewrite", filter.url_rewrite.is_some()),
            (
                "extensionRef",
                "ExtensionRef",
                filter.extension_ref.is_some(),
            ),
        ];
        for (field, owner, set) in fields {
            if set && t != owner {
                errs.forbidden(
                    format!("{f_at}.{field}"),
                    format!("filter.{field} must be nil if the filter.type is not {owner}"),
                );
            }
            if !set && t == owner {
                errs.required(
                    format!("{f_at}.{field}"),
                    format!("filter.{field} must be specified for {owner} filter.type"),
                );
            }
        }
        for (field, modifier) in [
            ("requestHeaderModifier", &filter.request_header_modifier),
            ("responseHeaderModifier", &filter.response_header_modifier),
        ] {
            let Some(modifier) = modifier else { continue };
            let m_at = format!("{f_at}.{field}");
            for (list_name, headers) in [("set", &modifier.set), ("add", &modifier.add)] {
                too_many(headers.len(), 16, &format!("{m_at}.{list_name}"), errs);
                let mut names = HashSet::new();
                for (k, h) in headers.iter().enumerate() {
                    let h_at = format!("{m_at}.{list_name}[{k}]");
                    header_name(&h.name, &format!("{h_at}.name"), errs);
                    value_len(&h.value, 4096, &format!("{h_at}.value"), errs);
                    if !names.insert(h.name.to_ascii_lowercase()) {
                        errs.invalid(format!("{h_at}.name"), &h.name, "duplicate header name");
                    }
                }
            }
            too_many(modifier.remove.len(), 16, &format!("{m_at}.remove"), errs);
        }
        if let Some(redirect) = &filter.request_redirect {
            let r_at = format!("{f_at}.requestRedirect");
            if let Some(scheme) = &redirect.scheme
                && !SCHEMES.contains(&scheme.as_str())
            {
                not_supported(format!("{r_at}.scheme"), scheme, SCHEMES, errs);
            }
            if let Some(hostname) = &redirect.hostname {
                hostname_value(hostname, false, &format!("{r_at}.hostname"), errs);
            }
            if let Some(p) = redirect.port {
                port(p, &format!("{r_at}.port"), errs);
            }
            if let Some(code) = redirect.status_code
                && !REDIRECT_CODES.contains(&code.to_string().as_str())
            {
                not_supported(
                    format!("{r_at}.statusCode"),
                    &code.to_string(),
                    REDIRECT_CODES,
                    errs,
                );
            }
            if let Some(path) = &redirect.path {
                path_modifier(
                    path,
                    one_prefix_match,
                    "RequestRedirect",
                    &format!("{r_at}.path"),
                    errs,
                );
            }
        }
        if let Some(rewrite) = &filter.url_rewrite {
            let r_at = format!("{f_at}.urlRewrite");
            if let Some(hostname) = &rewrite.hostname {
                hostname_value(hostname, false, &format!("{r_at}.hostname"), errs);
            }
            if let Some(path) = &rewrite.path {
                path_modifier(
                    path,
                    one_prefix_match,
                    "URLRewrite",
                    &format!("{r_at}.path"),
                    errs,
                );
            }
        }
        if let Some(mirror) = &filter.request_mirror {
            let m_at = format!("{f_at}.requestMirror");
            backend_ref(&mirror.backend_ref, &format!("{m_at}.backendRef"), errs);
            if let Some(percent) = mirror.percent
                && !(0..=100).contains(&percent)
            {
                errs.invalid(
                    format!("{m_at}.percent"),
                    &percent.to_string(),
                    "must be between 0 and 100",
                );
            }
        }
        if let Some(extension) = &filter.extension_ref {
            let e_at = format!("{f_at}.extensionRef");
            group(&extension.group, &format!("{e_at}.group"), errs);
            kind(&extension.kind, &format!("{e_at}.kind"), errs);
            object_name(&extension.name, &format!("{e_at}.name"), errs);
        }
    }
}

fn path_modifier(
    modifier: &HttpPathModifier,
    one_prefix_match: bool,
    filter: &str,
    at: &str,
    errs: &mut Errors,
) {
    let t = modifier.modifier_type.as_str();
    if !PATH_MODIFIERS.contains(&t) {
        not_supported(format!("{at}.type"), t, PATH_MODIFIERS, errs);
    }
    let full = modifier.replace_full_path.is_some();
    let prefix = modifier.replace_prefix_match.is_some();
    if t == "ReplaceFullPath" && !full {
        errs.required(
            format!("{at}.replaceFullPath"),
            "replaceFullPath must be specified when type is set to 'ReplaceFullPath'",
        );
    }
    if full && t != "ReplaceFullPath" {
        errs.forbidden(
            format!("{at}.replaceFullPath"),
            "type must be 'ReplaceFullPath' when replaceFullPath is set",
        );
    }
    if t == "ReplacePrefixMatch" && !prefix {
        errs.required(
            format!("{at}.replacePrefixMatch"),
            "replacePrefixMatch must be specified when type is set to 'ReplacePrefixMatch'",
        );
    }
    if prefix && t != "ReplacePrefixMatch" {
        errs.forbidden(
            format!("{at}.replacePrefixMatch"),
            "type must be 'ReplacePrefixMatch' when replacePrefixMatch is set",
        );
    }
    if t == "ReplacePrefixMatch" && !one_prefix_match {
        errs.invalid(
            at,
            t,
            format!(
                "When using {filter} filter with path.replacePrefixMatch, exactly one PathPrefix match must be specified"
            ),
        );
    }
    for value in [&modifier.replace_full_path, &modifier.replace_prefix_match]
        .into_iter()
        .flatten()
    {
        max_len(value, 1024, at, errs);
    }
}

fn backend_ref(backend: &BackendObjectReference, at: &str, errs: &mut Errors) {
    if let Some(g) = &backend.group {
        group(g, &format!("{at}.group"), errs);
    }
    if let Some(k) = &backend.kind {
        kind(k, &format!("{at}.kind"), errs);
    }
    object_name(&backend.name, &format!("{at}.name"), errs);
    if let Some(ns) = &backend.namespace {
        namespace(ns, &format!("{at}.namespace"), errs);
    }
    match backend.port {
        Some(p) => port(p, &format!("{at}.port"), errs),
        None if backend.group().is_empty() && backend.kind() == "Service" => {
            errs.required(format!("{at}.port"), "Must have port for Service reference");
        }
        None => {}
    }
}

fn secret_ref(secret: &SecretObjectReference, at: &str, errs: &mut Errors) {
    if let Some(g) = &secret.group {
        group(g, &format!("{at}.group"), errs);
    }
    if let Some(k) = &secret.kind {
        kind(k, &format!("{at}.kind"), errs);
    }
    object_name(&secret.name, &format!("{at}.name"), errs);
    if let Some(ns) = &secret.namespace {
        namespace(ns, &format!("{at}.namespace"), errs);
    }
}

/// Validates a ReferenceGrant as the API server does on create.
///
/// # Errors
///
/// Every failing rule, each with its field path.
pub fn validate_reference_grant(grant: &ReferenceGrant) -> Result<(), ValidationErrors> {
    let mut errs = Errors::default();
    validate_object_meta(Some(&grant.metadata), true, &mut errs);
    for (field, len) in [
        ("spec.from", grant.spec.from.len()),
        ("spec.to", grant.spec.to.len()),
    ] {
        if len == 0 {
            errs.required(field, "at least one entry");
        }
        too_many(len, 16, field, &mut errs);
    }
    for (i, from) in grant.spec.from.iter().enumerate() {
        let at = format!("spec.from[{i}]");
        group(&from.group, &format!("{at}.group"), &mut errs);
        kind(&from.kind, &format!("{at}.kind"), &mut errs);
        namespace(&from.namespace, &format!("{at}.namespace"), &mut errs);
    }
    for (i, to) in grant.spec.to.iter().enumerate() {
        let at = format!("spec.to[{i}]");
        group(&to.group, &format!("{at}.group"), &mut errs);
        kind(&to.kind, &format!("{at}.kind"), &mut errs);
        if let Some(name) = &to.name {
            object_name(name, &format!("{at}.name"), &mut errs);
        }
    }
    errs.finish()
}

// === the CRDs' string types ===

fn not_supported(path: String, value: &str, supported: &[&'static str], errs: &mut Errors) {
    errs.0.push(FieldError::NotSupported {
        path,
        value: value.to_owned(),
        supported: supported.to_vec(),
    });
}

fn too_many(len: usize, max: usize, at: &str, errs: &mut Errors) {
    if len > max {
        errs.invalid(
            at,
            &len.to_string(),
            format!("must have at most {max} items"),
        );
    }
}

fn max_len(value: &str, max: usize, at: &str, errs: &mut Errors) {
    if value.len() > max {
        errs.0.push(FieldError::TooLong {
            path: at.to_owned(),
            max,
        });
    }
}

/// A required string of 1 to `max` bytes.
fn value_len(value: &str, max: usize, at: &str, errs: &mut Errors) {
    if value.is_empty() {
        errs.required(at, "");
    }
    max_len(value, max, at, errs);
}

fn value_match_type(match_type: Option<&str>, at: &str, errs: &mut Errors) {
    if let Some(t) = match_type
        && !VALUE_MATCH_TYPES.contains(&t)
    {
        not_supported(at.to_owned(), t, VALUE_MATCH_TYPES, errs);
    }
}

/// `Hostname` (with `*.` when `wildcard`) or `PreciseHostname`: a lowercase DNS subdomain
/// of at most 253 bytes, never an IP address.
fn hostname_value(hostname: &str, wildcard: bool, at: &str, errs: &mut Errors) {
    let name = match hostname.strip_prefix("*.") {
        Some(rest) if wildcard => rest,
        Some(_) => {
            errs.invalid(
                at,
                hostname,
                "must be a precise hostname, without a wildcard",
            );
            return;
        }
        None => hostname,
    };
    if hostname.len() > 253 {
        errs.0.push(FieldError::TooLong {
            path: at.to_owned(),
            max: 253,
        });
    }
    if !dns1123_subdomain_errors(name).is_empty() {
        errs.invalid(
            at,
            hostname,
            "must be a lowercase RFC 1123 subdomain (optionally with a leading '*.' label)",
        );
    } else if name.parse::<IpAddr>().is_ok() {
        errs.invalid(at, hostname, "must be a DNS name, not an IP address");
    }
}

/// Exact and PathPrefix values: absolute, normalized, and of the CRD's characters.
fn path_value(value: &str, at: &str, errs: &mut Errors) {
    if !value.starts_with('/') {
        errs.invalid(at, value, "value must be an absolute path and start with '/' when type one of ['Exact', 'PathPrefix']");
    }
    if INVALID_PATH_SEQUENCES.iter().any(|s| value.contains(s)) {
        errs.invalid(at, value, "must not contain '//', '/./', '/../', '%2f', '%2F' or '#' when type one of ['Exact', 'PathPrefix']");
    }
    if INVALID_PATH_SUFFIXES.iter().any(|s| value.ends_with(s)) {
        errs.invalid(
            at,
            value,
            "must not end with '/..' or '/.' when type one of ['Exact', 'PathPrefix']",
        );
    }
    if !path_chars_ok(value) {
        errs.invalid(at, value, "must only contain valid characters (matching ^(?:[-A-Za-z0-9/._~!$&'()*+,;=:@]|[%][0-9a-fA-F]{2})+$) for types ['Exact', 'PathPrefix']");
    }
}

/// `^(?:[-A-Za-z0-9/._~!$&'()*+,;=:@]|[%][0-9a-fA-F]{2})+$`.
fn path_chars_ok(value: &str) -> bool {
    let bytes = value.as_bytes();
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hex = |j: usize| bytes.get(j).is_some_and(u8::is_ascii_hexdigit);
            if !(hex(i + 1) && hex(i + 2)) {
                return false;
            }
            i += 3;
            continue;
        }
        if !(b.is_ascii_alphanumeric() || b"-/._~!$&'()*+,;=:@".contains(&b)) {
            return false;
        }
        i += 1;
    }
    !bytes.is_empty()
}

/// `HTTPHeaderName`: an RFC 7230 token of 1 to 256 bytes.
fn header_name(name: &str, at: &str, errs: &mut Errors) {
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || name.len() > 256 || !name.bytes().all(token) {
        errs.invalid(
            at,
            name,
            "must be an HTTP header name (an RFC 7230 token of 1 to 256 characters)",
        );
    }
}

fn section_name(name: &str, at: &str, errs: &mut Errors) {
    for msg in dns1123_subdomain_errors(name) {
        errs.invalid(at, name, msg);
    }
}

fn object_name(name: &str, at: &str, errs: &mut Errors) {
    if name.is_empty() {
        errs.required(at, "");
    }
    max_len(name, 253, at, errs);
}

fn namespace(ns: &str, at: &str, errs: &mut Errors) {
    for msg in dns1123_label_errors(ns) {
        errs.invalid(at, ns, msg);
    }
}

/// `Group`: empty (the core group) or a DNS subdomain.
fn group(g: &str, at: &str, errs: &mut Errors) {
    if !g.is_empty() {
        for msg in dns1123_subdomain_errors(g) {
            errs.invalid(at, g, msg);
        }
    }
}

/// `Kind`: a letter, then letters, digits and `-`, alphanumeric at the end; 1 to 63 bytes.
fn kind(k: &str, at: &str, errs: &mut Errors) {
    let b = k.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 63
        && b.first().is_some_and(u8::is_ascii_alphabetic)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-');
    if !ok {
        errs.invalid(
            at,
            k,
            "must be a kind: a letter, then letters, digits or '-'",
        );
    }
}

fn port(p: i32, at: &str, errs: &mut Errors) {
    if !(1..=65535).contains(&p) {
        errs.invalid(at, &p.to_string(), "must be between 1 and 65535");
    }
}

fn alnum_dash(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
}

/// A domain-prefixed value such as `example.com/custom`: a DNS subdomain, `/`, a path.
fn domain_prefixed(value: &str, at: &str, errs: &mut Errors) {
    let ok = value.split_once('/').is_some_and(|(domain, path)| {
        dns1123_subdomain_errors(domain).is_empty()
            && !path.is_empty()
            && path.bytes().all(|b| b.is_ascii_alphanumeric())
    });
    if !ok {
        errs.invalid(
            at,
            value,
            "must be a domain-prefixed path such as example.com/name",
        );
    }
}

/// `GatewayController`: a DNS subdomain, `/`, and a path of URI characters; 1 to 253 bytes.
fn controller_name(value: &str, at: &str, errs: &mut Errors) {
    if value.is_empty() {
        errs.required(at, "");
        return;
    }
    max_len(value, 253, at, errs);
    let path_char = |b: u8| b.is_ascii_alphanumeric() || b"/-._~%!$&'()*+,;=:".contains(&b);
    let ok = value.split_once('/').is_some_and(|(domain, path)| {
        dns1123_subdomain_errors(domain).is_empty()
            && !path.is_empty()
            && path.bytes().all(path_char)
    });
    if !ok {
        errs.invalid(
            at,
            value,
            "must be a domain-prefixed path such as example.net/gateway-controller",
        );
    }
}

/// Milliseconds of a Gateway API duration (`^([0-9]{1,5}(h|m|s|ms)){1,4}$`).
pub(crate) fn duration_millis(value: &str) -> Option<u64> {
    let bytes = value.as_bytes();
    let mut i = 0;
    let mut parts = 0;
    let mut total: u64 = 0;
    while i < bytes.len() {
        let start = i;
        while bytes.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        let digits = i - start;
        if digits == 0 || digits > 5 {
            return None;
        }
        let number: u64 = value.get(start..i)?.parse().ok()?;
        let unit = match (bytes.get(i), bytes.get(i + 1)) {
            (Some(b'm'), Some(b's')) => {
                i += 2;
                1
            }
            (Some(b'h'), _) => {
                i += 1;
                3_600_000
            }
            (Some(b'm'), _) => {
                i += 1;
                60_000
            }
            (Some(b's'), _) => {
                i += 1;
                1_000
            }
            _ => return None,
        };
        total = total.checked_add(number.checked_mul(unit)?)?;
        parts += 1;
        if parts > 4 {
            return None;
        }
    }
    (parts > 0).then_some(total)
}
