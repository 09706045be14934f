//! The `gateway.networking.k8s.io` objects meshkit reads, as serde types with the Kubernetes
//! JSON field names.
//!
//! Fields whose values form an enumeration in the CRD (`protocol`, match and filter `type`s,
//! `method`, ...) are kept as the strings found in the manifest: [`validation`](super::validation)
//! reports a value outside the CRD's set with its field path, as the API server would, and the
//! [route table](super::HttpRouteTable) marks a route that uses a valid value meshkit does not
//! implement as not accepted (`UnsupportedValue`) instead of failing the whole manifest.
//! Absent and defaulted fields are `None` or empty; the defaults the CRD applies are applied
//! where the objects are read (the accessors here and the route table), not written back.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::k8s::io::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use crate::serde_impls::is_default;

/// The API group of the Gateway API kinds.
pub const GROUP: &str = "gateway.networking.k8s.io";

/// `gateway.networking.k8s.io/v1` `GatewayClass`: a kind of Gateway, and the controller that
/// implements it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct GatewayClass {
    /// Standard object metadata; GatewayClass is cluster-scoped.
    #[serde(skip_serializing_if = "is_default")]
    pub metadata: ObjectMeta,
    /// The class.
    pub spec: GatewayClassSpec,
}

/// `GatewayClass.spec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct GatewayClassSpec {
    /// The controller that manages Gateways of this class, a domain-prefixed path such as
    /// `meshkit.dev/gateway`.
    pub controller_name: String,
    /// Controller-specific parameters.
    #[serde(skip_serializing_if = "is_default")]
    pub parameters_ref: Option<ParametersReference>,
    /// Free text for people.
    #[serde(skip_serializing_if = "is_default")]
    pub description: Option<String>,
}

/// `GatewayClass.spec.parametersRef`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ParametersReference {
    /// API group of the referent.
    pub group: String,
    /// Kind of the referent.
    pub kind: String,
    /// Name of the referent.
    pub name: String,
    /// Namespace of a namespaced referent.
    #[serde(skip_serializing_if = "is_default")]
    pub namespace: Option<String>,
}

/// `gateway.networking.k8s.io/v1` `Gateway`: where traffic enters, as a set of listeners.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Gateway {
    /// Standard object metadata.
    #[serde(skip_serializing_if = "is_default")]
    pub metadata: ObjectMeta,
    /// The Gateway.
    pub spec: GatewaySpec,
}

/// `Gateway.spec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct GatewaySpec {
    /// Name of the GatewayClass this Gateway belongs to.
    pub gateway_class_name: String,
    /// The listeners: 1 to 64, names unique.
    pub listeners: Vec<Listener>,
    /// Addresses requested for the Gateway.
    #[serde(skip_serializing_if = "is_default")]
    pub addresses: Vec<GatewayAddress>,
}

/// `Gateway.spec.addresses[]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct GatewayAddress {
    /// `IPAddress` (the default), `Hostname`, or a domain-prefixed custom type.
    #[serde(rename = "type", skip_serializing_if = "is_default")]
    pub address_type: Option<String>,
    /// The address.
    pub value: String,
}

/// `Gateway.spec.listeners[]`: one port, protocol and (optional) hostname that accepts
/// connections, and which routes may attach to it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Listener {
    /// Name, unique within the Gateway; routes name it in `parentRefs[].sectionName`.
    pub name: String,
    /// Hostname (exact or `*.` wildcard) the listener accepts; every host when unset.
    #[serde(skip_serializing_if = "is_default")]
    pub hostname: Option<String>,
    /// Port, 1 to 65535.
    pub port: i32,
    /// `HTTP`, `HTTPS`, `TLS`, `TCP`, `UDP` or a domain-prefixed custom protocol.
    pub protocol: String,
    /// TLS settings, required for `HTTPS` and `TLS`.
    #[serde(skip_serializing_if = "is_default")]
    pub tls: Option<GatewayTlsConfig>,
    /// Which routes may attach; routes of the Gateway's own namespace when unset.
    #[serde(skip_serializing_if = "is_default")]
    pub allowed_routes: Option<AllowedRoutes>,
}

/// `Listener.tls`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct GatewayTlsConfig {
    /// `Terminate` (the default) or `Passthrough`.
    #[serde(skip_serializing_if = "is_default")]
    pub mode: Option<String>,
    /// The certificates, as Secrets (`kubernetes.io/tls`); at most 64.
    #[serde(skip_serializing_if = "is_default")]
    pub certificate_refs: Vec<SecretObjectReference>,
    /// Implementation-specific options.
    #[serde(skip_serializing_if = "is_default")]
    pub options: BTreeMap<String, String>,
}

/// A reference to a Secret (or another certificate holder) from a listener.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SecretObjectReference {
    /// API group; the core group (`""`) when unset.
    #[serde(skip_serializing_if = "is_default")]
    pub group: Option<String>,
    /// Kind; `Secret` when unset.
    #[serde(skip_serializing_if = "is_default")]
    pub kind: Option<String>,
    /// Name.
    pub name: String,
    /// Namespace; the Gateway's when unset. Another namespace needs a ReferenceGrant.
    #[serde(skip_serializing_if = "is_default")]
    pub namespace: Option<String>,
}

/// `Listener.allowedRoutes`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AllowedRoutes {
    /// Namespaces routes may come from; `Same` when unset.
    #[serde(skip_serializing_if = "is_default")]
    pub namespaces: Option<RouteNamespaces>,
    /// Route kinds that may attach; those of the listener's protocol when empty.
    #[serde(skip_serializing_if = "is_default")]
    pub kinds: Vec<RouteGroupKind>,
}

/// `AllowedRoutes.namespaces`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RouteNamespaces {
    /// `All`, `Same` (the default) or `Selector`.
    #[serde(skip_serializing_if = "is_default")]
    pub from: Option<String>,
    /// The namespaces' label selector, with `from: Selector`.
    #[serde(skip_serializing_if = "is_default")]
    pub selector: Option<LabelSelector>,
}

/// A Kubernetes label selector: every `matchLabels` entry and every expression must hold.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LabelSelector {
    /// Labels that must be present with these values.
    #[serde(skip_serializing_if = "is_default")]
    pub match_labels: BTreeMap<String, String>,
    /// Set-based requirements.
    #[serde(skip_serializing_if = "is_default")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// `LabelSelector.matchExpressions[]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LabelSelectorRequirement {
    /// Label key.
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: String,
    /// Values for `In` and `NotIn`.
    #[serde(skip_serializing_if = "is_default")]
    pub values: Vec<String>,
}

/// `AllowedRoutes.kinds[]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RouteGroupKind {
    /// API group; `gateway.networking.k8s.io` when unset.
    #[serde(skip_serializing_if = "is_default")]
    pub group: Option<String>,
    /// Kind, such as `HTTPRoute`.
    pub kind: String,
}

/// `gateway.networking.k8s.io/v1` `HTTPRoute`: HTTP routing rules attached to Gateway
/// listeners.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpRoute {
    /// Standard object metadata; `creationTimestamp` orders conflicting routes.
    #[serde(skip_serializing_if = "is_default")]
    pub metadata: ObjectMeta,
    /// The route.
    pub spec: HttpRouteSpec,
}

/// `HTTPRoute.spec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpRouteSpec {
    /// The Gateways (and listeners) the route attaches to; at most 32.
    #[serde(skip_serializing_if = "is_default")]
    pub parent_refs: Vec<ParentReference>,
    /// Hosts the route serves (exact or `*.` wildcard), intersected with the listener's;
    /// every host the listener accepts when empty. At most 16.
    #[serde(skip_serializing_if = "is_default")]
    pub hostnames: Vec<String>,
    /// The rules; one rule sending everything nowhere (`/` to no backend) when empty.
    #[serde(skip_serializing_if = "is_default")]
    pub rules: Vec<HttpRouteRule>,
}

/// `HTTPRoute.spec.parentRefs[]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ParentReference {
    /// API group; `gateway.networking.k8s.io` when unset.
    #[serde(skip_serializing_if = "is_default")]
    pub group: Option<String>,
    /// Kind; `Gateway` when unset.
    #[serde(skip_serializing_if = "is_default")]
    pub kind: Option<String>,
    /// Namespace; the route's when unset.
    #[serde(skip_serializing_if = "is_default")]
    pub namespace: Option<String>,
    /// Name of the Gateway.
    pub name: String,
    /// Name of the one listener to attach to.
    #[serde(skip_serializing_if = "is_default")]
    pub section_name: Option<String>,
    /// Port of the listeners to attach to.
    #[serde(skip_serializing_if = "is_default")]
    pub port: Option<i32>,
}

/// `HTTPRoute.spec.rules[]`: conditions, filters and backends.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpRouteRule {
    /// Optional name of the rule, unique in the route.
    #[serde(skip_serializing_if = "is_default")]
    pub name: Option<String>,
    /// The conditions, any of which selects the rule; PathPrefix `/` when empty. At most 64.
    #[serde(skip_serializing_if = "is_default")]
    pub matches: Vec<HttpRouteMatch>,
    /// Filters applied to requests the rule selects, in order; at most 16.
    #[serde(skip_serializing_if = "is_default")]
    pub filters: Vec<HttpRouteFilter>,
    /// Where the requests go, split by weight; at most 16.
    #[serde(skip_serializing_if = "is_default")]
    pub backend_refs: Vec<HttpBackendRef>,
    /// Timeouts.
    #[serde(skip_serializing_if = "is_default")]
    pub timeouts: Option<HttpRouteTimeouts>,
}

/// `HTTPRouteRule.timeouts`, as Gateway API durations such as `10s` or `1h30m`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpRouteTimeouts {
    /// The whole request, from the client's first byte to the response's last.
    #[serde(skip_serializing_if = "is_default")]
    pub request: Option<String>,
    /// One request to a backend.
    #[serde(skip_serializing_if = "is_default")]
    pub backend_request: Option<String>,
}

/// `HTTPRouteRule.matches[]`: every condition that is set must hold.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpRouteMatch {
    /// The path condition; PathPrefix `/` when unset.
    #[serde(skip_serializing_if = "is_default")]
    pub path: Option<HttpPathMatch>,
    /// Header conditions, all of which must hold; at most 16.
    #[serde(skip_serializing_if = "is_default")]
    pub headers: Vec<HttpHeaderMatch>,
    /// Query parameter conditions, all of which must hold; at most 16.
    #[serde(skip_serializing_if = "is_default")]
    pub query_params: Vec<HttpQueryParamMatch>,
    /// The request method.
    #[serde(skip_serializing_if = "is_default")]
    pub method: Option<String>,
}

/// `HTTPRouteMatch.path`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpPathMatch {
    /// `Exact`, `PathPrefix` (the default) or `RegularExpression`.
    #[serde(rename = "type", skip_serializing_if = "is_default")]
    pub match_type: Option<String>,
    /// The path; `/` when unset.
    #[serde(skip_serializing_if = "is_default")]
    pub value: Option<String>,
}

/// `HTTPRouteMatch.headers[]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpHeaderMatch {
    /// `Exact` (the default) or `RegularExpression`.
    #[serde(rename = "type", skip_serializing_if = "is_default")]
    pub match_type: Option<String>,
    /// Header name, compared case-insensitively.
    pub name: String,
    /// The value.
    pub value: String,
}

/// `HTTPRouteMatch.queryParams[]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpQueryParamMatch {
    /// `Exact` (the default) or `RegularExpression`.
    #[serde(rename = "type", skip_serializing_if = "is_default")]
    pub match_type: Option<String>,
    /// Parameter name, compared exactly.
    pub name: String,
    /// The value.
    pub value: String,
}

/// `HTTPRouteRule.filters[]` (and `backendRefs[].filters[]`): the `type` names which one of
/// the other fields is set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpRouteFilter {
    /// `RequestHeaderModifier`, `ResponseHeaderModifier`, `RequestMirror`,
    /// `RequestRedirect`, `URLRewrite` or `ExtensionRef`.
    #[serde(rename = "type")]
    pub filter_type: String,
    /// With `RequestHeaderModifier`.
    #[serde(skip_serializing_if = "is_default")]
    pub request_header_modifier: Option<HttpHeaderFilter>,
    /// With `ResponseHeaderModifier`.
    #[serde(skip_serializing_if = "is_default")]
    pub response_header_modifier: Option<HttpHeaderFilter>,
    /// With `RequestMirror`.
    #[serde(skip_serializing_if = "is_default")]
    pub request_mirror: Option<HttpRequestMirrorFilter>,
    /// With `RequestRedirect`.
    #[serde(skip_serializing_if = "is_default")]
    pub request_redirect: Option<HttpRequestRedirectFilter>,
    /// With `URLRewrite`.
    #[serde(rename = "urlRewrite", skip_serializing_if = "is_default")]
    pub url_rewrite: Option<HttpUrlRewriteFilter>,
    /// With `ExtensionRef`.
    #[serde(skip_serializing_if = "is_default")]
    pub extension_ref: Option<LocalObjectReference>,
}

/// Header changes: `set` replaces, `add` appends, `remove` deletes (by name,
/// case-insensitively).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpHeaderFilter {
    /// Headers to set, replacing any present; at most 16.
    #[serde(skip_serializing_if = "is_default")]
    pub set: Vec<HttpHeader>,
    /// Headers to add beside any present; at most 16.
    #[serde(skip_serializing_if = "is_default")]
    pub add: Vec<HttpHeader>,
    /// Header names to remove; at most 16.
    #[serde(skip_serializing_if = "is_default")]
    pub remove: Vec<String>,
}

/// One header name and value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpHeader {
    /// Name.
    pub name: String,
    /// Value.
    pub value: String,
}

/// `RequestMirror`: a copy of each request goes to another backend, its answer discarded.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpRequestMirrorFilter {
    /// The backend that receives the copies.
    pub backend_ref: BackendObjectReference,
    /// Share of requests mirrored, 0 to 100.
    #[serde(skip_serializing_if = "is_default")]
    pub percent: Option<i32>,
}

/// `RequestRedirect`: answer with a redirect instead of forwarding.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpRequestRedirectFilter {
    /// `http` or `https`; the request's when unset.
    #[serde(skip_serializing_if = "is_default")]
    pub scheme: Option<String>,
    /// Host of the location; the request's when unset.
    #[serde(skip_serializing_if = "is_default")]
    pub hostname: Option<String>,
    /// Path of the location; the request's when unset.
    #[serde(skip_serializing_if = "is_default")]
    pub path: Option<HttpPathModifier>,
    /// Port of the location.
    #[serde(skip_serializing_if = "is_default")]
    pub port: Option<i32>,
    /// 301 or 302 (the default).
    #[serde(skip_serializing_if = "is_default")]
    pub status_code: Option<i32>,
}

/// `URLRewrite`: change the host or path before forwarding.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpUrlRewriteFilter {
    /// The new `Host`.
    #[serde(skip_serializing_if = "is_default")]
    pub hostname: Option<String>,
    /// The new path.
    #[serde(skip_serializing_if = "is_default")]
    pub path: Option<HttpPathModifier>,
}

/// How a redirect or rewrite changes the path.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpPathModifier {
    /// `ReplaceFullPath` or `ReplacePrefixMatch`.
    #[serde(rename = "type")]
    pub modifier_type: String,
    /// With `ReplaceFullPath`: the new path.
    #[serde(skip_serializing_if = "is_default")]
    pub replace_full_path: Option<String>,
    /// With `ReplacePrefixMatch` (only on a PathPrefix match): what replaces the matched
    /// prefix.
    #[serde(skip_serializing_if = "is_default")]
    pub replace_prefix_match: Option<String>,
}

/// A reference to an object in the same namespace (`ExtensionRef`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LocalObjectReference {
    /// API group.
    pub group: String,
    /// Kind.
    pub kind: String,
    /// Name.
    pub name: String,
}

/// A backend: by default a Service and one of its ports.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct BackendObjectReference {
    /// API group; the core group (`""`) when unset.
    #[serde(skip_serializing_if = "is_default")]
    pub group: Option<String>,
    /// Kind; `Service` when unset.
    #[serde(skip_serializing_if = "is_default")]
    pub kind: Option<String>,
    /// Name.
    pub name: String,
    /// Namespace; the route's when unset. Another namespace needs a ReferenceGrant.
    #[serde(skip_serializing_if = "is_default")]
    pub namespace: Option<String>,
    /// Port, required for a Service.
    #[serde(skip_serializing_if = "is_default")]
    pub port: Option<i32>,
}

/// `HTTPRouteRule.backendRefs[]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HttpBackendRef {
    /// The backend.
    #[serde(flatten)]
    pub backend: BackendObjectReference,
    /// Relative share of requests, 0 to 1,000,000; 1 when unset, and 0 sends none.
    #[serde(skip_serializing_if = "is_default")]
    pub weight: Option<i32>,
    /// Filters for requests sent to this backend.
    #[serde(skip_serializing_if = "is_default")]
    pub filters: Vec<HttpRouteFilter>,
}

/// `gateway.networking.k8s.io/v1beta1` `ReferenceGrant`: lets objects of other namespaces
/// refer to objects of this one.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ReferenceGrant {
    /// Standard object metadata; the namespace is the one whose objects may be referred to.
    #[serde(skip_serializing_if = "is_default")]
    pub metadata: ObjectMeta,
    /// The grant.
    pub spec: ReferenceGrantSpec,
}

/// `ReferenceGrant.spec`: any `from` may refer to any `to`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ReferenceGrantSpec {
    /// Who may refer; 1 to 16 entries.
    pub from: Vec<ReferenceGrantFrom>,
    /// What may be referred to; 1 to 16 entries.
    pub to: Vec<ReferenceGrantTo>,
}

/// `ReferenceGrant.spec.from[]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ReferenceGrantFrom {
    /// API group of the referring kind (`gateway.networking.k8s.io`).
    pub group: String,
    /// The referring kind, such as `HTTPRoute` or `Gateway`.
    pub kind: String,
    /// The namespace the referring objects are in.
    pub namespace: String,
}

/// `ReferenceGrant.spec.to[]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ReferenceGrantTo {
    /// API group of the referent (`""` for Services and Secrets).
    pub group: String,
    /// Kind of the referent.
    pub kind: String,
    /// One object's name; every object of the kind when unset.
    #[serde(skip_serializing_if = "is_default")]
    pub name: Option<String>,
}

// === impl accessors with the CRD's defaults ===

impl ParentReference {
    /// `group`, defaulted.
    pub fn group(&self) -> &str {
        self.group.as_deref().unwrap_or(GROUP)
    }

    /// `kind`, defaulted.
    pub fn kind(&self) -> &str {
        self.kind.as_deref().unwrap_or("Gateway")
    }
}

impl BackendObjectReference {
    /// `group`, defaulted to the core group.
    pub fn group(&self) -> &str {
        self.group.as_deref().unwrap_or("")
    }

    /// `kind`, defaulted.
    pub fn kind(&self) -> &str {
        self.kind.as_deref().unwrap_or("Service")
    }
}

impl SecretObjectReference {
    /// `group`, defaulted to the core group.
    pub fn group(&self) -> &str {
        self.group.as_deref().unwrap_or("")
    }

    /// `kind`, defaulted.
    pub fn kind(&self) -> &str {
        self.kind.as_deref().unwrap_or("Secret")
    }
}

impl RouteGroupKind {
    /// `group`, defaulted.
    pub fn group(&self) -> &str {
        self.group.as_deref().unwrap_or(GROUP)
    }
}

impl HttpPathMatch {
    /// `type`, defaulted to `PathPrefix`.
    pub fn match_type(&self) -> &str {
        self.match_type.as_deref().unwrap_or("PathPrefix")
    }

    /// `value`, defaulted to `/`.
    pub fn value(&self) -> &str {
        self.value.as_deref().unwrap_or("/")
    }
}

impl ReferenceGrant {
    /// Whether this grant lets `from_kind` objects (of the Gateway API group) in `from_ns`
    /// refer to the `to_group`/`to_kind` object `to_name` in `to_ns`: the grant must live in
    /// `to_ns`, one `from` entry name the referrer and one `to` entry the referent (every
    /// object of its kind when it names none).
    pub fn allows(
        &self,
        from_kind: &str,
        from_ns: &str,
        to_group: &str,
        to_kind: &str,
        to_ns: &str,
        to_name: &str,
    ) -> bool {
        self.metadata.namespace.as_deref().unwrap_or("") == to_ns
            && self
                .spec
                .from
                .iter()
                .any(|f| f.group == GROUP && f.kind == from_kind && f.namespace == from_ns)
            && self.spec.to.iter().any(|t| {
                t.group == to_group
                    && t.kind == to_kind
                    && t.name.as_deref().is_none_or(|n| n == to_name)
            })
    }
}

impl HttpBackendRef {
    /// `weight`, defaulted to 1.
    pub fn weight(&self) -> i32 {
        self.weight.unwrap_or(1)
    }
}
