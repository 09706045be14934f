//! Gateway API HTTP routing: which rule of which HTTPRoute serves a request on a Gateway
//! listener, with the specification's precedence, filters and weighted backends.
//!
//! Build an [`HttpRouteTable`] once from the Gateways, HTTPRoutes and ReferenceGrants, then
//! call [`HttpRouteTable::route`] per request. The table also says, per route and parent,
//! whether the route was accepted and its references resolved ([`RouteStatus`]), and per
//! listener how many routes attached ([`ListenerStatus`]).
//!
//! # Semantics
//!
//! - **Listeners.** A request arrives on a port. Among the HTTP and HTTPS listeners of that
//!   port (of every Gateway in the table), the one whose hostname matches the request host
//!   most specifically takes it: an exact hostname, then the longest `*.` wildcard, then a
//!   listener without hostname. Listeners of several Gateways with the same port and
//!   hostname share their routes.
//! - **Attachment.** A route attaches to a Gateway through `parentRefs` (group
//!   `gateway.networking.k8s.io`, kind `Gateway`, the route's namespace by default), to the
//!   listener named by `sectionName` and of the given `port`, or to all of them, where the
//!   listener's `allowedRoutes` admit it (namespaces `Same` by default, `All`, or `Selector`
//!   over the labels given to [`HttpRouteTableBuilder::namespace_labels`]; kinds `HTTPRoute`
//!   by default) and where at least one of the route's hostnames intersects the listener's.
//! - **Hostnames.** `*.example.com` matches every name below `example.com` (`a.example.com`,
//!   `a.b.example.com`), never `example.com` itself. A route hostname and a listener
//!   hostname intersect when one equals or lies within the other; the narrower one is what
//!   the route serves on that listener. A route without hostnames serves the listener's.
//! - **Matches.** Path `Exact` (string equality) and `PathPrefix` (whole `/`-separated
//!   elements, a trailing slash ignored: `/abc` matches `/abc`, `/abc/` and `/abc/def`, not
//!   `/abcd`); headers `Exact` (names case-insensitive, values exact; repeated request
//!   headers are compared joined by `,`); query parameters `Exact` (names exact, the first
//!   occurrence, percent-decoded); method. A rule without matches is PathPrefix `/`. Of
//!   several header (or query) matches with the same name, only the first counts.
//! - **Precedence.** Among the rules that match: the most specific route hostname (exact,
//!   then the longest wildcard, then none), then an `Exact` path, then the longest prefix,
//!   then a method match, then the most header matches, then the most query matches, then
//!   the oldest route (`creationTimestamp`), then the route first by `namespace/name`, then
//!   the first rule in the route and the first match in the rule.
//! - **Backends.** Each backend gets `weight` (1 by default) shares; 0 gets none. A backend
//!   is invalid when it is not a core `Service`, lies in another namespace without a
//!   ReferenceGrant, or (with [`HttpRouteTableBuilder::services`]) names no known Service:
//!   requests its share would have taken answer 500, as do requests to a rule with no
//!   backend of non-zero weight. No matching rule answers 404 (`route` returns `None`).
//! - **Unsupported values.** `RegularExpression` matches, `RequestMirror` and `ExtensionRef`
//!   filters are valid but not implemented: a route using one is not accepted
//!   (`UnsupportedValue`) and routes nothing.
//!
//! # Cost
//!
//! A lookup probes one hash map per label of the host for the listener and as many for the
//! route hostname, then one hash map and one trie walk per path element for the path, and
//! checks the method, header and query conditions of only the rules filed under the paths it
//! reaches. It does not depend on the number of routes elsewhere.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;

use http::{HeaderMap, HeaderName, HeaderValue};

use super::types::{
    BackendObjectReference, GROUP, Gateway, GatewayClass, HttpPathModifier, HttpRoute,
    HttpRouteFilter, HttpRouteRule, LabelSelector, Listener, ParentReference, ReferenceGrant,
};
use crate::k8s::io::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use crate::route::{PrefixTrie, normalize_host, to_u32, trim_prefix_path, with_host_key};

type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// The facts of a request that routing reads.
#[derive(Debug, Clone, Copy)]
pub struct HttpRequest<'a> {
    /// The port the request arrived on (the listener's port).
    pub port: u16,
    /// The host (`:authority` or `Host`), with or without a port.
    pub host: &'a str,
    /// The path, without the query.
    pub path: &'a str,
    /// The query, without the `?`.
    pub query: Option<&'a str>,
    /// The method, such as `GET`.
    pub method: &'a str,
    /// The request headers.
    pub headers: &'a HeaderMap,
}

/// One compiled rule match of the table, filed under a host and a path.
#[derive(Debug, Clone)]
struct Candidate {
    rule: u32,
    match_index: u16,
    exact_path: bool,
    prefix: Box<str>,
    method: Option<Box<str>>,
    headers: Box<[(HeaderName, Box<str>)]>,
    query: Box<[(Box<str>, Box<str>)]>,
}

/// The paths of the rules that serve one route hostname on one listener.
#[derive(Debug, Clone, Default)]
struct PathIndex {
    exact: HashMap<Box<str>, Vec<Candidate>>,
    prefix: PrefixTrie,
    /// Candidates of each trie node, by the slot the trie stores.
    slots: Vec<Vec<Candidate>>,
}

/// Route hostnames of one listener (or listeners sharing port and hostname).
#[derive(Debug, Clone, Default)]
struct HostIndex {
    exact: HashMap<Box<str>, PathIndex>,
    wildcard: HashMap<Box<str>, PathIndex>,
    any: Option<PathIndex>,
}

/// Listeners of one port, by listener hostname.
#[derive(Debug, Clone, Default)]
struct PortListeners {
    exact: HashMap<Box<str>, u32>,
    wildcard: HashMap<Box<str>, u32>,
    any: Option<u32>,
}

/// The routes of the listeners that share a port and hostname.
#[derive(Debug, Clone, Default)]
struct ListenerGroup {
    hosts: HostIndex,
    https: bool,
    certificates: Vec<CertificateRef>,
}

/// A route as the table knows it.
#[derive(Debug, Clone)]
struct RouteId {
    namespace: Box<str>,
    name: Box<str>,
}

/// A compiled rule.
#[derive(Debug, Clone)]
struct Rule {
    route: u32,
    index: u32,
    name: Option<Box<str>>,
    filters: Vec<Filter>,
    backends: Vec<Backend>,
}

/// A Secret that holds a listener's certificate.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CertificateRef {
    /// Namespace of the Secret.
    pub namespace: String,
    /// Name of the Secret.
    pub name: String,
}

/// A Service and port that a backend reference resolved to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServiceRef {
    /// Namespace of the Service.
    pub namespace: String,
    /// Name of the Service.
    pub name: String,
    /// Port of the Service.
    pub port: u16,
}

/// Why a backend reference does not resolve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BackendError {
    /// Not a core-group `Service`.
    InvalidKind,
    /// In another namespace, and no ReferenceGrant there allows it.
    RefNotPermitted,
    /// No such Service is known, or a Service reference has no valid port.
    BackendNotFound,
}

/// One backend of a rule.
#[derive(Debug, Clone, PartialEq)]
pub struct Backend {
    /// The Service, or why the reference does not resolve.
    pub target: Result<ServiceRef, BackendError>,
    /// Shares of the rule's requests.
    pub weight: u32,
    /// Filters for the requests sent to this backend.
    pub filters: Vec<Filter>,
}

/// A filter of a rule or backend, compiled.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Filter {
    /// `RequestHeaderModifier`.
    RequestHeaders(HeaderModifier),
    /// `ResponseHeaderModifier`.
    ResponseHeaders(HeaderModifier),
    /// `RequestRedirect`: the rule answers with a redirect.
    Redirect(Redirect),
    /// `URLRewrite`.
    Rewrite(UrlRewrite),
}

/// Header changes, applied in the order remove, set, add... as the specification lists
/// them: `set` replaces, `add` appends, `remove` deletes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HeaderModifier {
    set: Vec<(HeaderName, HeaderValue)>,
    add: Vec<(HeaderName, HeaderValue)>,
    remove: Vec<HeaderName>,
}

/// How a redirect or a rewrite changes the path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathModifier {
    /// The whole path becomes this.
    ReplaceFullPath(String),
    /// The part of the path that the rule's PathPrefix matched becomes this.
    ReplacePrefixMatch(String),
}

/// `RequestRedirect`, compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redirect {
    scheme: Option<String>,
    hostname: Option<String>,
    port: Option<u16>,
    path: Option<PathModifier>,
    status: u16,
}

/// `URLRewrite`, compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UrlRewrite {
    hostname: Option<String>,
    path: Option<PathModifier>,
}

/// What the gateway does with a request a rule selected, from [`RuleMatch::action`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Action<'a> {
    /// Forward to this backend (after the rule's and the backend's filters).
    Forward(&'a Backend),
    /// Answer with this redirect.
    Redirect(&'a Redirect),
    /// Answer with this status: 500 when the share chosen has no valid backend.
    Status(u16),
}

/// The rule that serves a request, from [`HttpRouteTable::route`].
#[derive(Debug, Clone, Copy)]
pub struct RuleMatch<'a> {
    table: &'a HttpRouteTable,
    rule: &'a Rule,
    candidate: &'a Candidate,
}

/// A route condition's reason, with the specification's spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// Accepted: the route attached to at least one listener of the parent.
    Accepted,
    /// Not accepted: no listener of the parent admits routes of this kind or namespace.
    NotAllowedByListeners,
    /// Not accepted: no hostname of the route intersects a listener's.
    NoMatchingListenerHostname,
    /// Not accepted: the parent does not exist, is not handled here, or has no listener of
    /// that `sectionName` and `port`.
    NoMatchingParent,
    /// Not accepted: the route uses a value meshkit does not implement.
    UnsupportedValue,
    /// References resolved: every backend is a permitted, known Service.
    ResolvedRefs,
    /// A backend in another namespace has no ReferenceGrant.
    RefNotPermitted,
    /// A backend is not a Service.
    InvalidKind,
    /// A backend names no known Service.
    BackendNotFound,
    /// Listener accepted.
    ListenerAccepted,
    /// Listener not accepted: its protocol is not HTTP or HTTPS.
    UnsupportedProtocol,
    /// Listener not accepted: an older listener serves the other protocol on its port.
    ProtocolConflict,
    /// A certificate reference is not a permitted Secret.
    InvalidCertificateRef,
}

/// A status condition: its type is where it is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// `True` or `False`.
    pub status: bool,
    /// Why.
    pub reason: Reason,
    /// For people.
    pub message: String,
}

/// The status of one route for one of its parents, as `status.parents[]` would hold it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteStatus {
    /// Namespace of the route.
    pub namespace: String,
    /// Name of the route.
    pub name: String,
    /// The parent reference, as written.
    pub parent: ParentReference,
    /// `Accepted`.
    pub accepted: Condition,
    /// `ResolvedRefs`.
    pub resolved_refs: Condition,
}

/// The status of one listener, as `status.listeners[]` would hold it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerStatus {
    /// Namespace of the Gateway.
    pub namespace: String,
    /// Name of the Gateway.
    pub gateway: String,
    /// Name of the listener.
    pub listener: String,
    /// Routes Accepted on it.
    pub attached_routes: u32,
    /// `Accepted`.
    pub accepted: Condition,
    /// `ResolvedRefs` (its certificates).
    pub resolved_refs: Condition,
}

/// Configures an [`HttpRouteTable`]: which Gateways it serves and what it knows of the
/// cluster.
#[derive(Debug, Clone, Default)]
pub struct HttpRouteTableBuilder {
    controllers: BTreeSet<String>,
    classes: Vec<GatewayClass>,
    namespace_labels: HashMap<String, BTreeMap<String, String>>,
    services: Option<HashSet<(String, String)>>,
    secrets: Option<HashSet<(String, String)>>,
}

/// Gateway API HTTP routes of a set of Gateways, with lookups whose cost does not depend on
/// the number of routes. See the [module documentation](self) for the semantics.
#[derive(Debug, Clone, Default)]
pub struct HttpRouteTable {
    routes: Vec<RouteId>,
    rules: Vec<Rule>,
    groups: Vec<ListenerGroup>,
    ports: HashMap<u16, PortListeners>,
    route_status: Vec<RouteStatus>,
    listener_status: Vec<ListenerStatus>,
}

// === impl HttpRequest ===

impl<'a> HttpRequest<'a> {
    /// The facts of an `http` request received on `port`: the host from the URI's
    /// authority, else the `Host` header.
    pub fn from_parts(
        port: u16,
        method: &'a http::Method,
        uri: &'a http::Uri,
        headers: &'a HeaderMap,
    ) -> Self {
        let host = uri
            .authority()
            .map(|a| a.as_str())
            .or_else(|| headers.get(http::header::HOST)?.to_str().ok())
            .unwrap_or("");
        HttpRequest {
            port,
            host,
            path: uri.path(),
            query: uri.query(),
            method: method.as_str(),
            headers,
        }
    }
}

// === impl HeaderModifier ===

impl HeaderModifier {
    /// The headers set, replacing any present.
    pub fn set(&self) -> &[(HeaderName, HeaderValue)] {
        &self.set
    }

    /// The headers added beside any present.
    pub fn add(&self) -> &[(HeaderName, HeaderValue)] {
        &self.add
    }

    /// The headers removed.
    pub fn remove(&self) -> &[HeaderName] {
        &self.remove
    }

    /// Applies the changes: removes, then sets (replacing), then adds (appending).
    pub fn apply(&self, headers: &mut HeaderMap) {
        for name in &self.remove {
            headers.remove(name);
        }
        for (name, value) in &self.set {
            headers.insert(name.clone(), value.clone());
        }
        for (name, value) in &self.add {
            headers.append(name.clone(), value.clone());
        }
    }

    fn compile(filter: &super::types::HttpHeaderFilter) -> Result<Self, String> {
        // The host a backend gets is URLRewrite's to change; a proxy rewrites `Host` for its
        // backend whatever a header filter says (Envoy refuses such a filter outright).
        let not_host = |name: &str| {
            if name.eq_ignore_ascii_case("host") {
                Err("a header filter may not change Host (use URLRewrite hostname)".to_owned())
            } else {
                Ok(())
            }
        };
        let pair = |h: &super::types::HttpHeader| -> Result<(HeaderName, HeaderValue), String> {
            not_host(&h.name)?;
            let name = HeaderName::from_bytes(h.name.as_bytes())
                .map_err(|_| format!("invalid header name {:?}", h.name))?;
            let value = HeaderValue::from_str(&h.value)
                .map_err(|_| format!("invalid header value for {:?}", h.name))?;
            Ok((name, value))
        };
        let mut set = Vec::new();
        for h in first_by_name(&filter.set) {
            set.push(pair(h)?);
        }
        let mut add = Vec::new();
        for h in first_by_name(&filter.add) {
            add.push(pair(h)?);
        }
        let mut remove = Vec::new();
        for name in &filter.remove {
            not_host(name)?;
            remove.push(
                HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| format!("invalid header name {name:?}"))?,
            );
        }
        Ok(HeaderModifier { set, add, remove })
    }
}

/// The entries of `headers` whose name (case-insensitively) no earlier entry has.
fn first_by_name(headers: &[super::types::HttpHeader]) -> Vec<&super::types::HttpHeader> {
    let mut seen = HashSet::new();
    headers
        .iter()
        .filter(|h| seen.insert(h.name.to_ascii_lowercase()))
        .collect()
}

// === impl PathModifier ===

impl PathModifier {
    /// The new path for `path`, whose part `matched_prefix` (a PathPrefix value, as the
    /// rule matched it) is what `ReplacePrefixMatch` replaces.
    pub fn apply(&self, path: &str, matched_prefix: &str) -> String {
        match self {
            PathModifier::ReplaceFullPath(full) => full.clone(),
            PathModifier::ReplacePrefixMatch(replacement) => {
                // Both without their trailing slashes: the rest of the path keeps its own
                // (`/foo/` with `/foo` to `/xyz` is `/xyz/`), and an empty result is `/`.
                let prefix = trim_prefix_path(matched_prefix);
                let rest = path.get(prefix.len()..).unwrap_or("");
                let replacement = trim_prefix_path(replacement);
                match format!("{replacement}{rest}") {
                    empty if empty.is_empty() => "/".to_owned(),
                    replaced => replaced,
                }
            }
        }
    }

    fn compile(modifier: &HttpPathModifier) -> Result<Self, String> {
        match modifier.modifier_type.as_str() {
            "ReplaceFullPath" => Ok(PathModifier::ReplaceFullPath(
                modifier
                    .replace_full_path
                    .clone()
                    .unwrap_or_else(|| "/".into()),
            )),
            "ReplacePrefixMatch" => Ok(PathModifier::ReplacePrefixMatch(
                modifier
                    .replace_prefix_match
                    .clone()
                    .unwrap_or_else(|| "/".into()),
            )),
            other => Err(format!("path modifier type {other:?}")),
        }
    }
}

// === impl Redirect ===

impl Redirect {
    /// The scheme of the location, when the filter sets one.
    pub fn scheme(&self) -> Option<&str> {
        self.scheme.as_deref()
    }

    /// The host of the location, when the filter sets one.
    pub fn hostname(&self) -> Option<&str> {
        self.hostname.as_deref()
    }

    /// The port of the location, when the filter sets one.
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// How the filter changes the path, if it does.
    pub fn path_modifier(&self) -> Option<&PathModifier> {
        self.path.as_ref()
    }

    /// The status: 301, 302 (the default), 303, 307 or 308.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The `Location` for a request with this scheme, host, path and query, arrived on a
    /// listener of `listener_port`, whose rule matched `matched_prefix`.
    ///
    /// The scheme, host and path are the request's unless the filter sets them. The port is
    /// the filter's; without one, the well-known port of the filter's scheme, or the
    /// listener's port when the filter sets no scheme. Port 80 with `http` and 443 with
    /// `https` are left out.
    pub fn location(
        &self,
        scheme: &str,
        host: &str,
        listener_port: u16,
        path: &str,
        query: Option<&str>,
        matched_prefix: &str,
    ) -> String {
        let scheme_out = self.scheme.as_deref().unwrap_or(scheme);
        let host = self
            .hostname
            .as_deref()
            .unwrap_or_else(|| normalize_host(host));
        let port = match (self.port, self.scheme.as_deref()) {
            (Some(port), _) => port,
            (None, Some("http")) => 80,
            (None, Some("https")) => 443,
            (None, _) => listener_port,
        };
        let default_port = matches!((scheme_out, port), ("http", 80) | ("https", 443));
        let path = match &self.path {
            Some(modifier) => modifier.apply(path, matched_prefix),
            None => path.to_owned(),
        };
        let mut location = format!("{scheme_out}://{host}");
        if !default_port {
            location.push_str(&format!(":{port}"));
        }
        location.push_str(&path);
        if let Some(query) = query {
            location.push('?');
            location.push_str(query);
        }
        location
    }
}

// === impl UrlRewrite ===

impl UrlRewrite {
    /// The new host, when the filter sets one.
    pub fn hostname(&self) -> Option<&str> {
        self.hostname.as_deref()
    }

    /// How the filter changes the path, if it does.
    pub fn path_modifier(&self) -> Option<&PathModifier> {
        self.path.as_ref()
    }

    /// The new path for `path`, when the filter changes it.
    pub fn path(&self, path: &str, matched_prefix: &str) -> Option<String> {
        self.path.as_ref().map(|m| m.apply(path, matched_prefix))
    }
}

// === impl RuleMatch ===

impl<'a> RuleMatch<'a> {
    /// Namespace of the route.
    pub fn namespace(&self) -> &'a str {
        self.route().map_or("", |r| &r.namespace)
    }

    /// Name of the route.
    pub fn route_name(&self) -> &'a str {
        self.route().map_or("", |r| &r.name)
    }

    fn route(&self) -> Option<&'a RouteId> {
        self.table.routes.get(self.rule.route as usize)
    }

    /// A key of the rule, the same for every request it serves while this table lives and
    /// different from every other rule's: for state a proxy keeps per rule (a weighted
    /// round robin).
    pub fn rule_key(&self) -> usize {
        std::ptr::from_ref(self.rule).addr()
    }

    /// Index of the rule in `spec.rules`.
    pub fn rule_index(&self) -> usize {
        self.rule.index as usize
    }

    /// The rule's `name`, if it has one.
    pub fn rule_name(&self) -> Option<&'a str> {
        self.rule.name.as_deref()
    }

    /// Index of the match in the rule's `matches` (0 for a rule without matches).
    pub fn match_index(&self) -> usize {
        usize::from(self.candidate.match_index)
    }

    /// The path value the rule matched (a PathPrefix value is what `ReplacePrefixMatch`
    /// replaces).
    pub fn matched_path(&self) -> &'a str {
        &self.candidate.prefix
    }

    /// Whether the path condition is `Exact` (else `PathPrefix`, on
    /// [`matched_path`](Self::matched_path)).
    pub fn is_exact_path(&self) -> bool {
        self.candidate.exact_path
    }

    /// The method the match requires, if any.
    pub fn method(&self) -> Option<&'a str> {
        self.candidate.method.as_deref()
    }

    /// The header conditions (name, exact value), the first of each name only.
    pub fn header_matches(&self) -> impl Iterator<Item = (&'a HeaderName, &'a str)> + 'a {
        self.candidate.headers.iter().map(|(n, v)| (n, &**v))
    }

    /// The query parameter conditions (name, exact value), the first of each name only.
    pub fn query_matches(&self) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
        self.candidate.query.iter().map(|(n, v)| (&**n, &**v))
    }

    /// The rule's filters, in order.
    pub fn filters(&self) -> &'a [Filter] {
        &self.rule.filters
    }

    /// The rule's backends.
    pub fn backends(&self) -> &'a [Backend] {
        &self.rule.backends
    }

    /// What to do with the request: `roll` is a random number that picks a backend by
    /// weight (the same roll picks the same backend).
    pub fn action(&self, roll: u64) -> Action<'a> {
        if let Some(redirect) = self.rule.filters.iter().find_map(|f| match f {
            Filter::Redirect(r) => Some(r),
            _ => None,
        }) {
            return Action::Redirect(redirect);
        }
        let total: u64 = self.rule.backends.iter().map(|b| u64::from(b.weight)).sum();
        if total == 0 {
            return Action::Status(500);
        }
        let mut pick = roll % total;
        for backend in &self.rule.backends {
            let weight = u64::from(backend.weight);
            if pick < weight {
                return match backend.target {
                    Ok(_) => Action::Forward(backend),
                    Err(_) => Action::Status(500),
                };
            }
            pick -= weight;
        }
        Action::Status(500)
    }
}

// === impl Reason ===

impl Reason {
    /// The specification's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Accepted | Reason::ListenerAccepted => "Accepted",
            Reason::NotAllowedByListeners => "NotAllowedByListeners",
            Reason::NoMatchingListenerHostname => "NoMatchingListenerHostname",
            Reason::NoMatchingParent => "NoMatchingParent",
            Reason::UnsupportedValue => "UnsupportedValue",
            Reason::ResolvedRefs => "ResolvedRefs",
            Reason::RefNotPermitted => "RefNotPermitted",
            Reason::InvalidKind => "InvalidKind",
            Reason::BackendNotFound => "BackendNotFound",
            Reason::UnsupportedProtocol => "UnsupportedProtocol",
            Reason::ProtocolConflict => "ProtocolConflict",
            Reason::InvalidCertificateRef => "InvalidCertificateRef",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Condition {
    fn yes(reason: Reason) -> Self {
        Condition {
            status: true,
            reason,
            message: String::new(),
        }
    }

    fn no(reason: Reason, message: impl Into<String>) -> Self {
        Condition {
            status: false,
            reason,
            message: message.into(),
        }
    }
}

// === impl HttpRouteTableBuilder ===

impl HttpRouteTableBuilder {
    /// A builder that serves every Gateway.
    pub fn new() -> Self {
        Self::default()
    }

    /// Serve the Gateways of the classes (from [`gateway_classes`](Self::gateway_classes))
    /// whose `controllerName` is `controller`. May be called several times; without it,
    /// every Gateway is served.
    pub fn controller(mut self, controller: impl Into<String>) -> Self {
        self.controllers.insert(controller.into());
        self
    }

    /// The GatewayClasses of the cluster.
    pub fn gateway_classes(mut self, classes: &[GatewayClass]) -> Self {
        self.classes.extend_from_slice(classes);
        self
    }

    /// The labels of a namespace, for listeners that admit routes by namespace selector.
    pub fn namespace_labels(
        mut self,
        namespace: impl Into<String>,
        labels: BTreeMap<String, String>,
    ) -> Self {
        self.namespace_labels.insert(namespace.into(), labels);
        self
    }

    /// The Services that exist, as `(namespace, name)`; a backend naming another is
    /// `BackendNotFound`. Without it, every Service reference is taken to exist.
    pub fn services<I, N, S>(mut self, services: I) -> Self
    where
        I: IntoIterator<Item = (N, S)>,
        N: Into<String>,
        S: Into<String>,
    {
        self.services
            .get_or_insert_with(HashSet::new)
            .extend(services.into_iter().map(|(n, s)| (n.into(), s.into())));
        self
    }

    /// The TLS Secrets that exist, as `(namespace, name)`; a listener certificate naming
    /// another is `InvalidCertificateRef`. Without it, every Secret reference is taken to
    /// exist.
    pub fn secrets<I, N, S>(mut self, secrets: I) -> Self
    where
        I: IntoIterator<Item = (N, S)>,
        N: Into<String>,
        S: Into<String>,
    {
        self.secrets
            .get_or_insert_with(HashSet::new)
            .extend(secrets.into_iter().map(|(n, s)| (n.into(), s.into())));
        self
    }

    /// True when this builder's table serves `gateway`.
    pub fn serves(&self, gateway: &Gateway) -> bool {
        if self.controllers.is_empty() {
            return true;
        }
        self.classes.iter().any(|class| {
            class.metadata.name.as_deref() == Some(gateway.spec.gateway_class_name.as_str())
                && self.controllers.contains(&class.spec.controller_name)
        })
    }

    /// Builds the table over a manifest's objects: its GatewayClasses (for
    /// [`controller`](Self::controller)), Gateways, HTTPRoutes and ReferenceGrants.
    pub fn build_objects(self, objects: &super::manifest::GatewayApiObjects) -> HttpRouteTable {
        self.gateway_classes(&objects.gateway_classes).build(
            &objects.gateways,
            &objects.http_routes,
            &objects.reference_grants,
        )
    }

    /// Builds the table.
    pub fn build(
        &self,
        gateways: &[Gateway],
        routes: &[HttpRoute],
        grants: &[ReferenceGrant],
    ) -> HttpRouteTable {
        Build::new(self, grants).run(gateways, routes)
    }
}

// === impl HttpRouteTable ===

impl HttpRouteTable {
    /// A table over every Gateway given.
    pub fn new(gateways: &[Gateway], routes: &[HttpRoute], grants: &[ReferenceGrant]) -> Self {
        HttpRouteTableBuilder::new().build(gateways, routes, grants)
    }

    /// A builder, to choose the Gateways served and describe the cluster.
    pub fn builder() -> HttpRouteTableBuilder {
        HttpRouteTableBuilder::new()
    }

    /// The rule that serves `request`, or `None` (404) when no rule matches.
    pub fn route(&self, request: &HttpRequest<'_>) -> Option<RuleMatch<'_>> {
        let listeners = self.ports.get(&request.port)?;
        with_host_key(request.host, |host| {
            let group = lookup_host(
                &listeners.exact,
                &listeners.wildcard,
                listeners.any.as_ref(),
                host,
            )?;
            let hosts = &self.groups.get(*group as usize)?.hosts;
            let query = QueryParams(request.query);
            let mut hit = None;
            if let Some(index) = hosts.exact.get(host) {
                hit = index.lookup(request, &query);
            }
            let mut suffix = host;
            while hit.is_none() {
                let Some(next) = wildcard_suffix(suffix) else {
                    break;
                };
                suffix = next;
                if let Some(index) = hosts.wildcard.get(suffix) {
                    hit = index.lookup(request, &query);
                }
            }
            if hit.is_none() {
                hit = hosts
                    .any
                    .as_ref()
                    .and_then(|index| index.lookup(request, &query));
            }
            let candidate = hit?;
            Some(RuleMatch {
                table: self,
                rule: self.rules.get(candidate.rule as usize)?,
                candidate,
            })
        })
    }

    /// The certificates of the HTTPS listener that takes connections for `server_name` on
    /// `port`; `None` when that listener is not HTTPS (or there is none).
    pub fn certificates_for(&self, port: u16, server_name: &str) -> Option<&[CertificateRef]> {
        let listeners = self.ports.get(&port)?;
        with_host_key(server_name, |host| {
            let group = lookup_host(
                &listeners.exact,
                &listeners.wildcard,
                listeners.any.as_ref(),
                host,
            )?;
            let group = self.groups.get(*group as usize)?;
            group.https.then_some(group.certificates.as_slice())
        })
    }

    /// The listeners of `port` as the table merged them (one per hostname): what a proxy
    /// needs to terminate TLS by SNI on it.
    pub fn listeners(&self, port: u16) -> Vec<ListenerView<'_>> {
        let Some(listeners) = self.ports.get(&port) else {
            return Vec::new();
        };
        let named = listeners
            .exact
            .iter()
            .map(|(h, g)| (Some(h.to_string()), *g))
            .chain(
                listeners
                    .wildcard
                    .iter()
                    .map(|(s, g)| (Some(format!("*.{s}")), *g)),
            )
            .chain(listeners.any.map(|g| (None, g)));
        let mut out: Vec<ListenerView<'_>> = named
            .filter_map(|(hostname, g)| {
                let group = self.groups.get(g as usize)?;
                Some(ListenerView {
                    hostname,
                    https: group.https,
                    certificates: &group.certificates,
                })
            })
            .collect();
        out.sort_by(|a, b| a.hostname.cmp(&b.hostname));
        out
    }

    /// Whether `port` has an HTTP or HTTPS listener.
    pub fn serves_port(&self, port: u16) -> bool {
        self.ports.contains_key(&port)
    }

    /// The ports with at least one HTTP or HTTPS listener, and whether each is HTTPS.
    pub fn ports(&self) -> Vec<(u16, bool)> {
        let mut ports: Vec<(u16, bool)> = self
            .ports
            .iter()
            .map(|(port, listeners)| {
                let https = listeners
                    .exact
                    .values()
                    .chain(listeners.wildcard.values())
                    .chain(listeners.any.iter())
                    .any(|g| self.groups.get(*g as usize).is_some_and(|g| g.https));
                (*port, https)
            })
            .collect();
        ports.sort_unstable();
        ports
    }

    /// The status of every route for each of its parents, in route order.
    pub fn route_status(&self) -> &[RouteStatus] {
        &self.route_status
    }

    /// The status of every listener of the Gateways served.
    pub fn listener_status(&self) -> &[ListenerStatus] {
        &self.listener_status
    }

    /// Every domain a request on `port` can name, each with the rules that serve it in
    /// precedence order: the view a proxy that takes the first matching route of the most
    /// specific domain (such as Envoy's virtual hosts) needs to route as this table does.
    ///
    /// A domain is `name`, `*.suffix` (any name below `suffix`) or `*`. Its rules are those
    /// of the listener that takes its hosts, under its own route hostname and then under
    /// each wider one of that listener, each hostname's Exact paths first, then its prefixes
    /// from the longest, ties in the table's order. A domain may have no rules: its hosts
    /// belong to a listener no route serves them on, and answer 404.
    pub fn domains(&self, port: u16) -> Vec<DomainRules<'_>> {
        let Some(listeners) = self.ports.get(&port) else {
            return Vec::new();
        };
        let mut keys: BTreeSet<HostKey> = BTreeSet::new();
        let groups = listeners
            .exact
            .values()
            .chain(listeners.wildcard.values())
            .chain(listeners.any.iter());
        for key in listeners.exact.keys() {
            keys.insert(HostKey::Exact(key.to_string()));
        }
        for key in listeners.wildcard.keys() {
            keys.insert(HostKey::Wildcard(key.to_string()));
        }
        if listeners.any.is_some() {
            keys.insert(HostKey::Any);
        }
        for group in groups {
            let Some(group) = self.groups.get(*group as usize) else {
                continue;
            };
            keys.extend(
                group
                    .hosts
                    .exact
                    .keys()
                    .map(|k| HostKey::Exact(k.to_string())),
            );
            keys.extend(
                group
                    .hosts
                    .wildcard
                    .keys()
                    .map(|k| HostKey::Wildcard(k.to_string())),
            );
            if group.hosts.any.is_some() {
                keys.insert(HostKey::Any);
            }
        }
        let mut out = Vec::new();
        for key in keys {
            let Some(group) =
                listener_for_key(listeners, &key).and_then(|g| self.groups.get(g as usize))
            else {
                continue;
            };
            let mut rules = Vec::new();
            for index in buckets_covering(&group.hosts, &key) {
                // Each path's list is in the table's order; the paths exclude each other.
                let mut paths: Vec<(&Box<str>, &Vec<Candidate>)> = index.exact.iter().collect();
                paths.sort_by_key(|(path, _)| *path);
                let exact = paths.into_iter().flat_map(|(_, list)| list);
                let mut prefixes: Vec<(usize, usize, &Candidate)> = index
                    .slots
                    .iter()
                    .flatten()
                    .enumerate()
                    .map(|(order, c)| (trim_prefix_path(&c.prefix).len(), order, c))
                    .collect();
                prefixes.sort_by_key(|(len, order, _)| (std::cmp::Reverse(*len), *order));
                for candidate in exact.chain(prefixes.into_iter().map(|(_, _, c)| c)) {
                    if let Some(rule) = self.rules.get(candidate.rule as usize) {
                        rules.push(RuleMatch {
                            table: self,
                            rule,
                            candidate,
                        });
                    }
                }
            }
            // A domain without rules stays: it keeps its hosts from wider domains (listener
            // isolation), answering 404.
            let domain = match &key {
                HostKey::Exact(name) => name.clone(),
                HostKey::Wildcard(suffix) => format!("*.{suffix}"),
                HostKey::Any => "*".to_owned(),
            };
            out.push(DomainRules { domain, rules });
        }
        out
    }

    /// Number of compiled rules of accepted routes.
    pub fn rule_count(&self) -> usize {
        self.rules.len()
    }
}

/// A listener of a port, from [`HttpRouteTable::listeners`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerView<'a> {
    /// Its hostname (`name` or `*.suffix`); `None` takes every host.
    pub hostname: Option<String>,
    /// Whether it terminates TLS.
    pub https: bool,
    /// Its certificates' Secrets (those it may use).
    pub certificates: &'a [CertificateRef],
}

/// One domain of a port and the rules that serve it, from [`HttpRouteTable::domains`].
#[derive(Debug, Clone)]
pub struct DomainRules<'a> {
    /// `name`, `*.suffix` or `*`.
    pub domain: String,
    /// The rules, in precedence order: the first that matches a request serves it.
    pub rules: Vec<RuleMatch<'a>>,
}

/// True when every name `key` covers lies below `suffix` (or is `suffix`'s wildcard itself).
fn key_below(key: &HostKey, suffix: &str) -> bool {
    let below = |name: &str| {
        name.len() > suffix.len() + 1
            && name.ends_with(suffix)
            && name.as_bytes().get(name.len() - suffix.len() - 1) == Some(&b'.')
    };
    match key {
        HostKey::Exact(name) => below(name),
        HostKey::Wildcard(s) => s == suffix || below(s),
        HostKey::Any => false,
    }
}

/// The listener group that takes the hosts of `key`: as [`lookup_host`] chooses for any of
/// them (they all choose alike, since every listener hostname is itself a key).
fn listener_for_key(listeners: &PortListeners, key: &HostKey) -> Option<u32> {
    if let HostKey::Exact(name) = key
        && let Some(g) = listeners.exact.get(name.as_str())
    {
        return Some(*g);
    }
    listeners
        .wildcard
        .iter()
        .filter(|(suffix, _)| key_below(key, suffix))
        .max_by_key(|(suffix, _)| suffix.len())
        .map(|(_, g)| *g)
        .or(listeners.any)
}

/// The route hostnames of a listener that cover `key`, most specific first.
fn buckets_covering<'h>(hosts: &'h HostIndex, key: &HostKey) -> Vec<&'h PathIndex> {
    let mut out = Vec::new();
    if let HostKey::Exact(name) = key
        && let Some(index) = hosts.exact.get(name.as_str())
    {
        out.push(index);
    }
    let mut wildcards: Vec<(&Box<str>, &PathIndex)> = hosts
        .wildcard
        .iter()
        .filter(|(suffix, _)| key_below(key, suffix))
        .collect();
    wildcards.sort_by_key(|(suffix, _)| std::cmp::Reverse(suffix.len()));
    out.extend(wildcards.into_iter().map(|(_, index)| index));
    out.extend(hosts.any.iter());
    out
}

/// The value filed under the most specific of `host`'s keys: the host, then its suffixes
/// from the longest (for `*.` wildcards, which cover every name below them), then `any`.
fn lookup_host<'m, V>(
    exact: &'m HashMap<Box<str>, V>,
    wildcard: &'m HashMap<Box<str>, V>,
    any: Option<&'m V>,
    host: &str,
) -> Option<&'m V> {
    if let Some(v) = exact.get(host) {
        return Some(v);
    }
    if !wildcard.is_empty() {
        let mut suffix = host;
        while let Some(next) = wildcard_suffix(suffix) {
            suffix = next;
            if let Some(v) = wildcard.get(suffix) {
                return Some(v);
            }
        }
    }
    any
}

/// `host` without its first label, when that label is not empty.
fn wildcard_suffix(host: &str) -> Option<&str> {
    match host.split_once('.') {
        Some((label, rest)) if !label.is_empty() && !rest.is_empty() => Some(rest),
        _ => None,
    }
}

/// The query of a request, searched lazily by name.
struct QueryParams<'a>(Option<&'a str>);

impl QueryParams<'_> {
    /// True when the first parameter called `name` has the value `value`, both compared
    /// after percent-decoding.
    fn first_is(&self, name: &str, value: &str) -> bool {
        let Some(query) = self.0 else { return false };
        for pair in query.split('&') {
            let (n, v) = pair.split_once('=').unwrap_or((pair, ""));
            if percent_decoded_eq(n, name) {
                return percent_decoded_eq(v, value);
            }
        }
        false
    }
}

/// True when `encoded`, percent-decoded, equals `plain`; an invalid escape stands for itself.
fn percent_decoded_eq(encoded: &str, plain: &str) -> bool {
    let mut out = plain.as_bytes().iter();
    let bytes = encoded.as_bytes();
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let decoded = if b == b'%' {
            match (
                bytes.get(i + 1).and_then(hex),
                bytes.get(i + 2).and_then(hex),
            ) {
                (Some(h), Some(l)) => {
                    i += 2;
                    h * 16 + l
                }
                _ => b,
            }
        } else {
            b
        };
        if out.next() != Some(&decoded) {
            return false;
        }
        i += 1;
    }
    out.next().is_none()
}

fn hex(b: &u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

// === impl PathIndex ===

impl PathIndex {
    fn insert(&mut self, candidate: Candidate) {
        if candidate.exact_path {
            self.exact
                .entry(candidate.prefix.clone())
                .or_default()
                .push(candidate);
        } else {
            let next = to_u32(self.slots.len());
            let slot = self
                .prefix
                .insert_or_get(trim_prefix_path(&candidate.prefix), next);
            if slot == next {
                self.slots.push(Vec::new());
            }
            if let Some(list) = self.slots.get_mut(slot as usize) {
                list.push(candidate);
            }
        }
    }

    fn sort(&mut self, order: &[u32], rules: &[Rule]) {
        let key = |c: &Candidate| {
            let route_rank = rules
                .get(c.rule as usize)
                .and_then(|r| order.get(r.route as usize))
                .copied()
                .unwrap_or(u32::MAX);
            (
                // Within one trie node (`/foo` and `/foo/`), the longer value as written.
                std::cmp::Reverse(c.prefix.len()),
                c.method.is_none(),
                std::cmp::Reverse(c.headers.len()),
                std::cmp::Reverse(c.query.len()),
                route_rank,
                c.rule,
                c.match_index,
            )
        };
        for list in self.exact.values_mut().chain(self.slots.iter_mut()) {
            list.sort_by_key(key);
        }
    }

    /// The first candidate, in precedence order, that `request` satisfies: exact paths, then
    /// prefixes from the longest.
    fn lookup<'s>(
        &'s self,
        request: &HttpRequest<'_>,
        query: &QueryParams<'_>,
    ) -> Option<&'s Candidate> {
        if !self.exact.is_empty()
            && let Some(list) = self.exact.get(request.path)
            && let Some(hit) = list.iter().find(|c| c.conditions_hold(request, query))
        {
            return Some(hit);
        }
        self.prefix.deepest_first(request.path, |slot| {
            self.slots
                .get(slot as usize)?
                .iter()
                .find(|c| c.conditions_hold(request, query))
        })
    }
}

// === impl Candidate ===

impl Candidate {
    /// Method, headers and query: the conditions besides the path.
    fn conditions_hold(&self, request: &HttpRequest<'_>, query: &QueryParams<'_>) -> bool {
        if let Some(method) = &self.method
            && **method != *request.method
        {
            return false;
        }
        for (name, value) in self.headers.iter() {
            if !header_is(request.headers, name, value) {
                return false;
            }
        }
        self.query
            .iter()
            .all(|(name, value)| query.first_is(name, value))
    }
}

/// True when the request's `name` headers, joined by `,`, equal `value`.
fn header_is(headers: &HeaderMap, name: &HeaderName, value: &str) -> bool {
    let mut values = headers.get_all(name).iter();
    let Some(first) = values.next() else {
        return false;
    };
    let Some(rest) = values.next() else {
        return first.as_bytes() == value.as_bytes();
    };
    let mut joined = Vec::with_capacity(value.len());
    joined.extend_from_slice(first.as_bytes());
    for v in std::iter::once(rest).chain(values) {
        joined.push(b',');
        joined.extend_from_slice(v.as_bytes());
    }
    joined == value.as_bytes()
}

// === building ===

/// Where a route hostname is filed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum HostKey {
    Exact(String),
    /// The suffix of a `*.` wildcard.
    Wildcard(String),
    Any,
}

struct Build<'b> {
    config: &'b HttpRouteTableBuilder,
    grants: &'b [ReferenceGrant],
    table: HttpRouteTable,
    /// Listener group by (port, listener host key).
    group_of: HashMap<(u16, HostKey), u32>,
    /// Whether each port serves HTTPS, as its first listener decided.
    port_protocol: HashMap<u16, bool>,
}

/// A listener of a served Gateway.
struct ListenerEntry<'g> {
    gateway: &'g Gateway,
    listener: &'g Listener,
    group: Option<u32>,
    status: usize,
}

impl<'b> Build<'b> {
    fn new(config: &'b HttpRouteTableBuilder, grants: &'b [ReferenceGrant]) -> Self {
        Build {
            config,
            grants,
            table: HttpRouteTable::default(),
            group_of: HashMap::default(),
            port_protocol: HashMap::default(),
        }
    }

    fn run(mut self, gateways: &[Gateway], routes: &[HttpRoute]) -> HttpRouteTable {
        let mut served: Vec<&Gateway> = gateways.iter().filter(|g| self.config.serves(g)).collect();
        served.sort_by(|a, b| object_order(&a.metadata, &b.metadata));
        let mut listeners = Vec::new();
        for gateway in served {
            for listener in &gateway.spec.listeners {
                let entry = self.add_listener(gateway, listener);
                listeners.push(entry);
            }
        }
        let mut ordered: Vec<&HttpRoute> = routes.iter().collect();
        ordered.sort_by(|a, b| object_order(&a.metadata, &b.metadata));
        // Rank of each route in precedence order: the table's route ids are in that order.
        for route in ordered {
            self.add_route(route, &listeners);
        }
        let order: Vec<u32> = (0..to_u32(self.table.routes.len())).collect();
        let rules = std::mem::take(&mut self.table.rules);
        for group in &mut self.table.groups {
            let hosts = &mut group.hosts;
            for index in hosts
                .exact
                .values_mut()
                .chain(hosts.wildcard.values_mut())
                .chain(hosts.any.iter_mut())
            {
                index.sort(&order, &rules);
            }
        }
        self.table.rules = rules;
        self.table
    }

    fn add_listener<'g>(
        &mut self,
        gateway: &'g Gateway,
        listener: &'g Listener,
    ) -> ListenerEntry<'g> {
        let namespace = gateway.metadata.namespace.clone().unwrap_or_default();
        let status = self.table.listener_status.len();
        let mut accepted = Condition::yes(Reason::ListenerAccepted);
        let mut resolved = Condition::yes(Reason::ResolvedRefs);
        let https = match listener.protocol.as_str() {
            "HTTP" => Some(false),
            "HTTPS" => Some(true),
            other => {
                accepted = Condition::no(
                    Reason::UnsupportedProtocol,
                    format!("protocol {other:?} is not served; HTTP and HTTPS are"),
                );
                None
            }
        };
        let port = u16::try_from(listener.port).ok().filter(|p| *p != 0);
        if port.is_none() && https.is_some() {
            accepted = Condition::no(Reason::UnsupportedValue, format!("port {}", listener.port));
        }
        let mut certificates = Vec::new();
        if https == Some(true) {
            let tls = listener.tls.clone().unwrap_or_default();
            if tls.certificate_refs.is_empty() {
                resolved = Condition::no(
                    Reason::InvalidCertificateRef,
                    "an HTTPS listener needs tls.certificateRefs",
                );
            }
            if tls.mode.as_deref().is_some_and(|m| m != "Terminate") {
                accepted = Condition::no(
                    Reason::UnsupportedValue,
                    "tls mode Passthrough is not served on an HTTPS listener",
                );
            }
            for cert in &tls.certificate_refs {
                let cert_ns = cert.namespace.clone().unwrap_or_else(|| namespace.clone());
                if cert.group() != "" || cert.kind() != "Secret" {
                    resolved = Condition::no(
                        Reason::InvalidCertificateRef,
                        format!("{}/{} is not a Secret", cert.group(), cert.kind()),
                    );
                } else if cert_ns != namespace
                    && !self.granted("Gateway", &namespace, "", "Secret", &cert_ns, &cert.name)
                {
                    resolved = Condition::no(
                        Reason::RefNotPermitted,
                        format!(
                            "no ReferenceGrant in {cert_ns:?} allows Secret {:?}",
                            cert.name
                        ),
                    );
                } else if self
                    .config
                    .secrets
                    .as_ref()
                    .is_some_and(|known| !known.contains(&(cert_ns.clone(), cert.name.clone())))
                {
                    resolved = Condition::no(
                        Reason::InvalidCertificateRef,
                        format!("no TLS Secret {cert_ns}/{}", cert.name),
                    );
                } else {
                    certificates.push(CertificateRef {
                        namespace: cert_ns,
                        name: cert.name.clone(),
                    });
                }
            }
        }
        // One protocol per port: the oldest Gateway's listener decides it, and a listener of
        // the other protocol on that port conflicts (it is not served).
        if let (Some(https), Some(port), true) = (https, port, accepted.status) {
            match self.port_protocol.get(&port) {
                Some(first) if *first != https => {
                    accepted = Condition::no(
                        Reason::ProtocolConflict,
                        format!(
                            "port {port} already serves {} for an older listener",
                            if *first { "HTTPS" } else { "HTTP" }
                        ),
                    );
                }
                _ => {
                    self.port_protocol.insert(port, https);
                }
            }
        }
        let mut group = None;
        if let (Some(https), Some(port), true) = (https, port, accepted.status) {
            let key = listener_host_key(listener.hostname.as_deref());
            let next = to_u32(self.table.groups.len());
            let id = *self.group_of.entry((port, key.clone())).or_insert(next);
            if id != next
                && let Some(existing) = self.table.groups.get_mut(id as usize)
            {
                // Listeners of several Gateways on one port and hostname: every
                // certificate of theirs may serve it, the older first.
                for cert in certificates.drain(..) {
                    if !existing.certificates.contains(&cert) {
                        existing.certificates.push(cert);
                    }
                }
            }
            if id == next {
                self.table.groups.push(ListenerGroup {
                    hosts: HostIndex::default(),
                    https,
                    certificates,
                });
                let listeners = self.table.ports.entry(port).or_default();
                match key {
                    HostKey::Exact(h) => {
                        listeners.exact.insert(h.into(), id);
                    }
                    HostKey::Wildcard(s) => {
                        listeners.wildcard.insert(s.into(), id);
                    }
                    HostKey::Any => listeners.any = Some(id),
                }
            }
            group = Some(id);
        }
        self.table.listener_status.push(ListenerStatus {
            namespace,
            gateway: gateway.metadata.name.clone().unwrap_or_default(),
            listener: listener.name.clone(),
            attached_routes: 0,
            accepted,
            resolved_refs: resolved,
        });
        ListenerEntry {
            gateway,
            listener,
            group,
            status,
        }
    }

    /// True when a ReferenceGrant in `to_ns` lets `from_kind` objects of `from_ns` refer to
    /// the `to_kind` object `to_name` of group `to_group`.
    fn granted(
        &self,
        from_kind: &str,
        from_ns: &str,
        to_group: &str,
        to_kind: &str,
        to_ns: &str,
        to_name: &str,
    ) -> bool {
        self.grants
            .iter()
            .any(|grant| grant.allows(from_kind, from_ns, to_group, to_kind, to_ns, to_name))
    }

    fn add_route(&mut self, route: &HttpRoute, listeners: &[ListenerEntry<'_>]) {
        let namespace = route.metadata.namespace.clone().unwrap_or_default();
        let name = route.metadata.name.clone().unwrap_or_default();
        let compiled = self.compile_rules(route, &namespace);
        let resolved = match &compiled {
            Ok(rules) => resolved_refs(rules),
            Err(_) => Condition::yes(Reason::ResolvedRefs),
        };
        let route_id = to_u32(self.table.routes.len());
        let mut attachments: Vec<(u32, HostKey)> = Vec::new();
        let mut counted = Vec::new();
        for parent in &route.spec.parent_refs {
            if parent.group() != GROUP || parent.kind() != "Gateway" {
                // Another kind of parent (a Service for mesh routing): not this table's.
                continue;
            }
            let accepted = match &compiled {
                Err(message) => Condition::no(Reason::UnsupportedValue, message.clone()),
                Ok(_) => self.attach(
                    route,
                    &namespace,
                    parent,
                    listeners,
                    &mut attachments,
                    &mut counted,
                ),
            };
            self.table.route_status.push(RouteStatus {
                namespace: namespace.clone(),
                name: name.clone(),
                parent: parent.clone(),
                accepted,
                resolved_refs: resolved.clone(),
            });
        }
        counted.sort_unstable();
        counted.dedup();
        for index in counted {
            if let Some(status) = self.table.listener_status.get_mut(index) {
                status.attached_routes += 1;
            }
        }
        let Ok(rules) = compiled else { return };
        if attachments.is_empty() {
            return;
        }
        self.table.routes.push(RouteId {
            namespace: namespace.into(),
            name: name.into(),
        });
        let first_rule = to_u32(self.table.rules.len());
        let mut conditions = Vec::new();
        for (index, (rule, compiled)) in route.spec.rules.iter().zip(rules).enumerate() {
            let rule_id = first_rule + to_u32(index);
            conditions.push((rule_id, rule_candidates(rule, rule_id)));
            self.table.rules.push(Rule {
                route: route_id,
                index: to_u32(index),
                ..compiled
            });
        }
        if route.spec.rules.is_empty() {
            // The CRD's default: one rule, PathPrefix `/`, no backend (so 500).
            let rule_id = first_rule;
            conditions.push((rule_id, rule_candidates(&HttpRouteRule::default(), rule_id)));
            self.table.rules.push(Rule {
                route: route_id,
                index: 0,
                name: None,
                filters: Vec::new(),
                backends: Vec::new(),
            });
        }
        let mut seen = HashSet::new();
        for (group, host) in attachments {
            if !seen.insert((group, host.clone())) {
                continue;
            }
            let Some(group) = self.table.groups.get_mut(group as usize) else {
                continue;
            };
            let index = match host {
                HostKey::Exact(h) => group.hosts.exact.entry(h.into()).or_default(),
                HostKey::Wildcard(s) => group.hosts.wildcard.entry(s.into()).or_default(),
                HostKey::Any => group.hosts.any.get_or_insert_with(PathIndex::default),
            };
            for (_, candidates) in &conditions {
                for candidate in candidates {
                    index.insert(candidate.clone());
                }
            }
        }
    }

    /// Attaches the route to the listeners `parent` names, recording where its hostnames
    /// go, and says whether it was accepted.
    fn attach(
        &self,
        route: &HttpRoute,
        namespace: &str,
        parent: &ParentReference,
        listeners: &[ListenerEntry<'_>],
        attachments: &mut Vec<(u32, HostKey)>,
        counted: &mut Vec<usize>,
    ) -> Condition {
        let parent_ns = parent.namespace.as_deref().unwrap_or(namespace);
        let mut named = false;
        let mut allowed = false;
        let mut attached = false;
        for entry in listeners {
            let gateway = &entry.gateway.metadata;
            if gateway.namespace.as_deref().unwrap_or("") != parent_ns
                || gateway.name.as_deref().unwrap_or("") != parent.name
                || parent
                    .section_name
                    .as_deref()
                    .is_some_and(|s| s != entry.listener.name)
                || parent.port.is_some_and(|p| p != entry.listener.port)
            {
                continue;
            }
            named = true;
            let Some(group) = entry.group else { continue };
            if !self.admits(entry.listener, parent_ns, namespace) {
                continue;
            }
            allowed = true;
            let hosts =
                effective_hostnames(entry.listener.hostname.as_deref(), &route.spec.hostnames);
            if hosts.is_empty() {
                continue;
            }
            attached = true;
            // attachedRoutes counts the routes Accepted on the listener.
            counted.push(entry.status);
            attachments.extend(hosts.into_iter().map(|h| (group, h)));
        }
        if attached {
            Condition::yes(Reason::Accepted)
        } else if allowed {
            Condition::no(
                Reason::NoMatchingListenerHostname,
                "no hostname of the route intersects a listener's",
            )
        } else if named {
            Condition::no(
                Reason::NotAllowedByListeners,
                "no listener admits routes of this namespace and kind",
            )
        } else {
            Condition::no(
                Reason::NoMatchingParent,
                format!(
                    "no served Gateway {parent_ns}/{} has a listener of this section and port",
                    parent.name
                ),
            )
        }
    }

    /// True when `listener` (of a Gateway in `gateway_ns`) admits HTTPRoutes of `route_ns`.
    fn admits(&self, listener: &Listener, gateway_ns: &str, route_ns: &str) -> bool {
        let allowed = listener.allowed_routes.clone().unwrap_or_default();
        let kind_ok = allowed.kinds.is_empty()
            || allowed
                .kinds
                .iter()
                .any(|k| k.group() == GROUP && k.kind == "HTTPRoute");
        if !kind_ok {
            return false;
        }
        let namespaces = allowed.namespaces.unwrap_or_default();
        match namespaces.from.as_deref().unwrap_or("Same") {
            "All" => true,
            "Same" => gateway_ns == route_ns,
            "Selector" => match (
                &namespaces.selector,
                self.config.namespace_labels.get(route_ns),
            ) {
                (Some(selector), Some(labels)) => selector_matches(selector, labels),
                // A namespace whose labels are not known is not admitted: matching it as
                // unlabelled would let a `NotIn` or `DoesNotExist` selector admit it.
                (Some(_), None) | (None, _) => false,
            },
            _ => false,
        }
    }

    /// The compiled rules of a route (backends resolved), or why it uses a value meshkit
    /// does not implement.
    fn compile_rules(&self, route: &HttpRoute, namespace: &str) -> Result<Vec<Rule>, String> {
        let mut rules = Vec::with_capacity(route.spec.rules.len());
        for (i, rule) in route.spec.rules.iter().enumerate() {
            for (j, m) in rule.matches.iter().enumerate() {
                let at = format!("spec.rules[{i}].matches[{j}]");
                if let Some(path) = &m.path
                    && !matches!(path.match_type(), "Exact" | "PathPrefix")
                {
                    return Err(format!(
                        "{at}.path.type {:?} is not supported",
                        path.match_type()
                    ));
                }
                for (k, h) in m.headers.iter().enumerate() {
                    if h.match_type.as_deref().is_some_and(|t| t != "Exact") {
                        return Err(format!("{at}.headers[{k}].type is not supported"));
                    }
                    if HeaderName::from_bytes(h.name.as_bytes()).is_err() {
                        return Err(format!("{at}.headers[{k}].name {:?} is invalid", h.name));
                    }
                }
                for (k, q) in m.query_params.iter().enumerate() {
                    if q.match_type.as_deref().is_some_and(|t| t != "Exact") {
                        return Err(format!("{at}.queryParams[{k}].type is not supported"));
                    }
                }
            }
            if rule.timeouts.is_some() {
                return Err(format!("spec.rules[{i}].timeouts are not supported"));
            }
            let filters = compile_filters(&rule.filters, &format!("spec.rules[{i}].filters"))?;
            let mut backends = Vec::with_capacity(rule.backend_refs.len());
            for (j, backend) in rule.backend_refs.iter().enumerate() {
                let at = format!("spec.rules[{i}].backendRefs[{j}].filters");
                let filters = compile_filters(&backend.filters, &at)?;
                // Per backend, a proxy can change headers (Envoy's weighted clusters can);
                // a redirect or a rewrite belongs to the rule.
                if filters
                    .iter()
                    .any(|f| !matches!(f, Filter::RequestHeaders(_) | Filter::ResponseHeaders(_)))
                {
                    return Err(format!(
                        "{at}: only header modifiers are supported on a backend"
                    ));
                }
                backends.push(Backend {
                    target: self.resolve_backend(&backend.backend, namespace),
                    weight: u32::try_from(backend.weight()).unwrap_or(0),
                    filters,
                });
            }
            rules.push(Rule {
                route: 0,
                index: to_u32(i),
                name: rule.name.as_deref().map(Into::into),
                filters,
                backends,
            });
        }
        Ok(rules)
    }

    fn resolve_backend(
        &self,
        backend: &BackendObjectReference,
        namespace: &str,
    ) -> Result<ServiceRef, BackendError> {
        if backend.group() != "" || backend.kind() != "Service" {
            return Err(BackendError::InvalidKind);
        }
        let backend_ns = backend.namespace.as_deref().unwrap_or(namespace);
        if backend_ns != namespace
            && !self.granted(
                "HTTPRoute",
                namespace,
                "",
                "Service",
                backend_ns,
                &backend.name,
            )
        {
            return Err(BackendError::RefNotPermitted);
        }
        let port = backend
            .port
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p != 0)
            .ok_or(BackendError::BackendNotFound)?;
        if let Some(services) = &self.config.services
            && !services.contains(&(backend_ns.to_owned(), backend.name.clone()))
        {
            return Err(BackendError::BackendNotFound);
        }
        Ok(ServiceRef {
            namespace: backend_ns.to_owned(),
            name: backend.name.clone(),
            port,
        })
    }
}

/// The ResolvedRefs condition of a route whose rules compiled: the first unresolved
/// backend's reason.
fn resolved_refs(rules: &[Rule]) -> Condition {
    for backend in rules.iter().flat_map(|r| &r.backends) {
        if let Err(error) = backend.target {
            let (reason, message) = match error {
                BackendError::InvalidKind => {
                    (Reason::InvalidKind, "a backend is not a core Service")
                }
                BackendError::RefNotPermitted => (
                    Reason::RefNotPermitted,
                    "a backend in another namespace has no ReferenceGrant",
                ),
                BackendError::BackendNotFound => (
                    Reason::BackendNotFound,
                    "a backend names no known Service and port",
                ),
            };
            return Condition::no(reason, message);
        }
    }
    Condition::yes(Reason::ResolvedRefs)
}

fn compile_filters(filters: &[HttpRouteFilter], at: &str) -> Result<Vec<Filter>, String> {
    let mut out = Vec::with_capacity(filters.len());
    for (i, filter) in filters.iter().enumerate() {
        let at = format!("{at}[{i}]");
        let missing = || {
            format!(
                "{at}: type {:?} without its configuration",
                filter.filter_type
            )
        };
        let compiled = match filter.filter_type.as_str() {
            "RequestHeaderModifier" => Filter::RequestHeaders(
                HeaderModifier::compile(
                    filter
                        .request_header_modifier
                        .as_ref()
                        .ok_or_else(missing)?,
                )
                .map_err(|e| format!("{at}: {e}"))?,
            ),
            "ResponseHeaderModifier" => Filter::ResponseHeaders(
                HeaderModifier::compile(
                    filter
                        .response_header_modifier
                        .as_ref()
                        .ok_or_else(missing)?,
                )
                .map_err(|e| format!("{at}: {e}"))?,
            ),
            "RequestRedirect" => {
                let r = filter.request_redirect.as_ref().ok_or_else(missing)?;
                Filter::Redirect(Redirect {
                    scheme: r.scheme.clone(),
                    hostname: r.hostname.clone(),
                    port: match r.port {
                        Some(p) => Some(u16::try_from(p).map_err(|_| format!("{at}: port {p}"))?),
                        None => None,
                    },
                    path: r
                        .path
                        .as_ref()
                        .map(PathModifier::compile)
                        .transpose()
                        .map_err(|e| format!("{at}: {e}"))?,
                    status: match r.status_code.unwrap_or(302) {
                        code @ (301 | 302 | 303 | 307 | 308) => code as u16,
                        other => return Err(format!("{at}: statusCode {other} is not supported")),
                    },
                })
            }
            "URLRewrite" => {
                let r = filter.url_rewrite.as_ref().ok_or_else(missing)?;
                Filter::Rewrite(UrlRewrite {
                    hostname: r.hostname.clone(),
                    path: r
                        .path
                        .as_ref()
                        .map(PathModifier::compile)
                        .transpose()
                        .map_err(|e| format!("{at}: {e}"))?,
                })
            }
            other => return Err(format!("{at}: filter type {other:?} is not supported")),
        };
        out.push(compiled);
    }
    Ok(out)
}

/// The compiled matches of one rule.
fn rule_candidates(rule: &HttpRouteRule, rule_id: u32) -> Vec<Candidate> {
    let default_match = [super::types::HttpRouteMatch::default()];
    let matches = if rule.matches.is_empty() {
        &default_match[..]
    } else {
        &rule.matches[..]
    };
    matches
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let path = m.path.clone().unwrap_or_default();
            let exact_path = path.match_type() == "Exact";
            let value = path.value();
            let mut seen = HashSet::new();
            let headers: Vec<(HeaderName, Box<str>)> = m
                .headers
                .iter()
                .filter_map(|h| {
                    let name = HeaderName::from_bytes(h.name.as_bytes()).ok()?;
                    seen.insert(name.clone())
                        .then(|| (name, h.value.as_str().into()))
                })
                .collect();
            let mut seen_query = HashSet::new();
            let query: Vec<(Box<str>, Box<str>)> = m
                .query_params
                .iter()
                .filter(|q| seen_query.insert(q.name.clone()))
                .map(|q| (q.name.as_str().into(), q.value.as_str().into()))
                .collect();
            Candidate {
                rule: rule_id,
                match_index: u16::try_from(i).unwrap_or(u16::MAX),
                exact_path,
                prefix: value.into(),
                method: m.method.as_deref().map(Into::into),
                headers: headers.into(),
                query: query.into(),
            }
        })
        .collect()
}

/// Where a listener's hostname files it.
fn listener_host_key(hostname: Option<&str>) -> HostKey {
    match hostname.filter(|h| !h.is_empty()) {
        None => HostKey::Any,
        Some(h) => host_key(h),
    }
}

fn host_key(hostname: &str) -> HostKey {
    let h = hostname.to_ascii_lowercase();
    match h.strip_prefix("*.") {
        Some(suffix) => HostKey::Wildcard(suffix.to_owned()),
        None => HostKey::Exact(h),
    }
}

/// The hostnames a route serves on a listener: each route hostname intersected with the
/// listener's, or the listener's when the route has none. Empty when none intersects.
fn effective_hostnames(listener: Option<&str>, route: &[String]) -> Vec<HostKey> {
    let listener = listener_host_key(listener);
    if route.is_empty() {
        return vec![listener];
    }
    let mut out: Vec<HostKey> = route
        .iter()
        .filter_map(|h| intersect(&listener, &host_key(h)))
        .collect();
    out.dedup();
    out
}

/// The narrower of two hostnames when one lies within the other.
fn intersect(listener: &HostKey, route: &HostKey) -> Option<HostKey> {
    let below = |name: &str, suffix: &str| {
        name.len() > suffix.len() + 1
            && name.ends_with(suffix)
            && name.as_bytes().get(name.len() - suffix.len() - 1) == Some(&b'.')
    };
    match (listener, route) {
        (HostKey::Any, r) => Some(r.clone()),
        (HostKey::Exact(l), HostKey::Exact(r)) => (l == r).then(|| route.clone()),
        (HostKey::Wildcard(l), HostKey::Exact(r)) => below(r, l).then(|| route.clone()),
        (HostKey::Exact(l), HostKey::Wildcard(r)) => below(l, r).then(|| listener.clone()),
        (HostKey::Wildcard(l), HostKey::Wildcard(r)) => {
            if l == r || below(r, l) {
                Some(route.clone())
            } else if below(l, r) {
                Some(listener.clone())
            } else {
                None
            }
        }
        (_, HostKey::Any) => Some(listener.clone()),
    }
}

/// True when `labels` satisfy every requirement of `selector`.
fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    selector
        .match_labels
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v))
        && selector.match_expressions.iter().all(|e| {
            let value = labels.get(&e.key);
            match e.operator.as_str() {
                "In" => value.is_some_and(|v| e.values.contains(v)),
                "NotIn" => value.is_none_or(|v| !e.values.contains(v)),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                _ => false,
            }
        })
}

/// Oldest first (an object without a timestamp counts as newest), then by namespace, then
/// by name.
fn object_order(a: &ObjectMeta, b: &ObjectMeta) -> Ordering {
    let key = |m: &ObjectMeta| {
        let time = m
            .creation_timestamp
            .as_ref()
            .map(|t| (t.seconds.unwrap_or(0), t.nanos.unwrap_or(0)));
        (
            time.is_none(),
            time,
            m.namespace.clone().unwrap_or_default(),
            m.name.clone().unwrap_or_default(),
        )
    };
    key(a).cmp(&key(b))
}
