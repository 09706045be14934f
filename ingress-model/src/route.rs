//! Ingress routing: which backend serves a request, with the Kubernetes Ingress semantics.
//!
//! Build a [`RouteTable`] from a set of Ingresses once, then call [`RouteTable::route`] per
//! request. The rules, precedence order and conflict rule are spelled out on [`RouteTable`]
//! and in `docs/ingress.md`.

use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use crate::k8s::io::api::networking::v1::{Ingress, IngressBackend, IngressClass};

/// Hash maps of the table: foldhash is several times faster than SipHash on short keys, and
/// its per-process random seed keeps keys chosen by Ingress authors from colliding on purpose.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// Annotation that marks an [`IngressClass`] as the cluster default.
pub const DEFAULT_CLASS_ANNOTATION: &str = "ingressclass.kubernetes.io/is-default-class";

/// Deprecated annotation naming the class of an Ingress; honoured when `spec.ingressClassName`
/// is unset, as ingress controllers still do.
pub const LEGACY_CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";

/// How an `HTTPIngressPath` matches the request path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PathType {
    /// Case-sensitive equality with the request path.
    Exact,
    /// Element-wise prefix on `/`-separated segments; a trailing slash is ignored.
    Prefix,
    /// Left to the implementation; meshkit treats it exactly as [`PathType::Prefix`].
    ImplementationSpecific,
}

/// A `pathType` string that is none of `Exact`, `Prefix`, `ImplementationSpecific`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown pathType {0:?}")]
pub struct UnknownPathType(pub String);

/// Which kind of host rule a match came from; earlier variants take precedence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HostMatch {
    /// The rule host equals the request host.
    Exact,
    /// The rule host is `*.suffix` and the request host is one label plus `suffix`.
    Wildcard,
    /// The rule has no host and matches every host.
    Any,
}

/// Where a [`RouteMatch`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MatchSource {
    /// A path of a rule: `spec.rules[rule].http.paths[path]`.
    Rule {
        /// Index into `spec.rules`.
        rule: usize,
        /// Index into `spec.rules[rule].http.paths`.
        path: usize,
        /// What kind of host rule matched.
        host: HostMatch,
    },
    /// `spec.defaultBackend`, used because no rule of any Ingress matched.
    DefaultBackend,
}

/// The result of [`RouteTable::route`]: the backend and where it came from.
#[derive(Debug, Clone, Copy)]
pub struct RouteMatch<'a> {
    table: &'a RouteTable,
    route: &'a Route,
}

/// The Secret that terminates TLS for a host, from [`RouteTable::tls_secret_for`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TlsSecretRef<'a> {
    /// Namespace of the Ingress, which is also the namespace of the Secret.
    pub namespace: &'a str,
    /// Name of the Secret (`spec.tls[].secretName`).
    pub secret_name: &'a str,
    /// Name of the Ingress that declared it.
    pub ingress_name: &'a str,
}

/// Configures which Ingresses a [`RouteTable`] takes, by IngressClass.
///
/// With neither [`ingress_class`](Self::ingress_class) nor [`controller`](Self::controller)
/// set, every Ingress is taken. Otherwise an Ingress is taken when its class is one of the
/// accepted classes. Its class is `spec.ingressClassName`; when that is unset, the legacy
/// `kubernetes.io/ingress.class` annotation; when that is unset too, the default class: the
/// single [`IngressClass`] passed to [`ingress_classes`](Self::ingress_classes) whose
/// `ingressclass.kubernetes.io/is-default-class` annotation is `"true"` (with several such
/// classes there is no default, as the API server's admission plugin decides).
#[derive(Debug, Clone, Default)]
pub struct RouteTableBuilder {
    accepted_classes: BTreeSet<String>,
    controllers: BTreeSet<String>,
    classes: Vec<IngressClass>,
}

/// A routing table over a set of Ingresses, with lookups whose cost does not depend on the
/// number of rules.
///
/// # Semantics
///
/// A `(host, path)` request is matched against every path of every rule:
///
/// - **Host.** Compared case-insensitively, after removing a `:port` and a trailing dot. A
///   rule host `foo.com` matches exactly `foo.com`; `*.foo.com` matches one extra label
///   (`a.foo.com`, not `foo.com` nor `a.b.foo.com`); a rule without host matches every host.
/// - **Path.** `Exact` is case-sensitive string equality. `Prefix` compares `/`-separated
///   elements, ignoring a trailing slash: `/foo` matches `/foo`, `/foo/` and `/foo/bar`, not
///   `/foobar`; `/` matches every path. `ImplementationSpecific` (and a missing `pathType`) is
///   treated as `Prefix`. Paths are matched as given: no percent-decoding, no query stripping.
/// - **Precedence.** Among the matching paths, the most specific host kind wins (exact host,
///   then wildcard, then no host); then the longest path (for `Prefix`, without its trailing
///   slash); then `Exact` over `Prefix`; then the older Ingress (see conflicts); then the
///   earlier rule and path in that Ingress.
/// - **Default backend.** When no path matches, the `spec.defaultBackend` of the first
///   Ingress (in conflict order) that has one serves the request.
/// - **Conflicts.** Ingresses are ordered by `metadata.creationTimestamp`, oldest first (an
///   Ingress without a timestamp counts as newer than every Ingress with one), then by
///   namespace, then by name, then by position in the input.
///
/// Rules without `http`, and paths without a backend, route nothing.
///
/// # Cost
///
/// Hosts are looked up in hash maps (exact hosts, and wildcard suffixes); paths in a hash map
/// (`Exact`) and in a trie keyed by path element (`Prefix`). A lookup does at most three host
/// probes and one probe per path element, whatever the number of rules.
#[derive(Debug, Clone, Default)]
pub struct RouteTable {
    ingresses: Vec<IngressId>,
    routes: Vec<Route>,
    exact_hosts: HashMap<Box<str>, VirtualHost>,
    wildcard_hosts: HashMap<Box<str>, VirtualHost>,
    any_host: VirtualHost,
    default_route: Option<u32>,
    tls: TlsTable,
}

#[derive(Debug, Clone)]
struct IngressId {
    namespace: Box<str>,
    name: Box<str>,
}

#[derive(Debug, Clone)]
struct Route {
    ingress: u32,
    backend: IngressBackend,
    source: MatchSource,
    path: Option<Box<str>>,
    path_type: Option<PathType>,
}

/// The paths of all rules that share a host (or a wildcard suffix, or no host).
#[derive(Debug, Clone, Default)]
struct VirtualHost {
    exact: HashMap<Box<str>, u32>,
    prefix: PrefixTrie,
}

/// Trie of `Prefix` paths keyed by `/`-separated element. Node 0 is the root and holds the
/// catch-all (`/`) route; a path `/a/b` lives at root -> "" -> "a" -> "b".
#[derive(Debug, Clone)]
pub(crate) struct PrefixTrie {
    nodes: Vec<TrieNode>,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct TrieNode {
    children: Children,
    route: Option<u32>,
}

/// Children of a trie node by path element. Most nodes have a handful of children, which a
/// short scan finds faster than hashing; past [`SMALL_CHILDREN`] a hash map takes over, so a
/// lookup stays bounded however wide a level is.
#[derive(Debug, Clone)]
enum Children {
    Small(Vec<(Box<str>, u32)>),
    Large(HashMap<Box<str>, u32>),
}

const SMALL_CHILDREN: usize = 8;

#[derive(Debug, Clone, Default)]
struct TlsTable {
    exact: HashMap<Box<str>, TlsEntry>,
    wildcard: HashMap<Box<str>, TlsEntry>,
    any: Option<TlsEntry>,
}

#[derive(Debug, Clone)]
struct TlsEntry {
    ingress: u32,
    secret_name: Box<str>,
}

// === impl PathType ===

impl PathType {
    /// The API spelling: `Exact`, `Prefix` or `ImplementationSpecific`.
    pub fn as_str(self) -> &'static str {
        match self {
            PathType::Exact => "Exact",
            PathType::Prefix => "Prefix",
            PathType::ImplementationSpecific => "ImplementationSpecific",
        }
    }

    /// True for the types matched by element-wise prefix (`Prefix` and
    /// `ImplementationSpecific`).
    pub fn is_prefix_like(self) -> bool {
        !matches!(self, PathType::Exact)
    }
}

impl FromStr for PathType {
    type Err = UnknownPathType;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "Exact" => Ok(PathType::Exact),
            "Prefix" => Ok(PathType::Prefix),
            "ImplementationSpecific" => Ok(PathType::ImplementationSpecific),
            other => Err(UnknownPathType(other.to_owned())),
        }
    }
}

impl fmt::Display for PathType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// === impl RouteMatch ===

impl<'a> RouteMatch<'a> {
    /// The backend that serves the request.
    pub fn backend(&self) -> &'a IngressBackend {
        &self.route.backend
    }

    /// Namespace of the Ingress that matched.
    pub fn namespace(&self) -> &'a str {
        self.ingress().map_or("", |i| &i.namespace)
    }

    /// Name of the Ingress that matched.
    pub fn ingress_name(&self) -> &'a str {
        self.ingress().map_or("", |i| &i.name)
    }

    // Indices are created with the table and always in range; `get` keeps lookups free of
    // panicking paths regardless.
    fn ingress(&self) -> Option<&'a IngressId> {
        self.table.ingresses.get(self.route.ingress as usize)
    }

    /// Which rule and path matched, or that the default backend did.
    pub fn source(&self) -> MatchSource {
        self.route.source
    }

    /// The rule path that matched, as written; `None` for the default backend or an unset
    /// path.
    pub fn path(&self) -> Option<&'a str> {
        self.route.path.as_deref()
    }

    /// The `pathType` of the rule path that matched; `None` for the default backend. A
    /// missing `pathType` is reported as `ImplementationSpecific`.
    pub fn path_type(&self) -> Option<PathType> {
        self.route.path_type
    }

    /// Service name of the backend, if it is a Service backend.
    pub fn service_name(&self) -> Option<&'a str> {
        self.route.backend.service.as_ref()?.name.as_deref()
    }
}

// === impl RouteTableBuilder ===

impl RouteTableBuilder {
    /// A builder that takes every Ingress.
    pub fn new() -> Self {
        Self::default()
    }

    /// Accept Ingresses of this IngressClass name. May be called several times.
    pub fn ingress_class(mut self, name: impl Into<String>) -> Self {
        self.accepted_classes.insert(name.into());
        self
    }

    /// Accept Ingresses of every IngressClass (from [`ingress_classes`](Self::ingress_classes))
    /// whose `spec.controller` is `controller`. May be called several times.
    pub fn controller(mut self, controller: impl Into<String>) -> Self {
        self.controllers.insert(controller.into());
        self
    }

    /// The IngressClass objects of the cluster: used to find the default class and the
    /// classes of a [`controller`](Self::controller).
    pub fn ingress_classes(mut self, classes: &[IngressClass]) -> Self {
        self.classes.extend_from_slice(classes);
        self
    }

    /// Builds the table from the accepted Ingresses.
    pub fn build(&self, ingresses: &[Ingress]) -> RouteTable {
        let filter = self.class_filter();
        let mut selected: Vec<(usize, &Ingress)> = ingresses
            .iter()
            .enumerate()
            .filter(|(_, ing)| filter.accepts(ing))
            .collect();
        selected.sort_by(|(ia, a), (ib, b)| conflict_order(a, b).then(ia.cmp(ib)));
        let mut table = RouteTable::default();
        for (_, ingress) in selected {
            table.add_ingress(ingress);
        }
        table
    }

    /// Whether a table built by this builder takes `ingress`: its class is accepted (or no
    /// class filter is set).
    pub fn accepts(&self, ingress: &Ingress) -> bool {
        self.class_filter().accepts(ingress)
    }

    fn class_filter(&self) -> ClassFilter {
        if self.accepted_classes.is_empty() && self.controllers.is_empty() {
            return ClassFilter::All;
        }
        let mut accepted = self.accepted_classes.clone();
        for class in &self.classes {
            let controller = class.spec.as_ref().and_then(|s| s.controller.as_deref());
            if let (Some(controller), Some(name)) = (controller, class_name(class))
                && self.controllers.contains(controller)
            {
                accepted.insert(name.to_owned());
            }
        }
        let mut defaults = self.classes.iter().filter(|c| is_default_class(c));
        let default = match (defaults.next(), defaults.next()) {
            (Some(only), None) => class_name(only).map(str::to_owned),
            _ => None,
        };
        ClassFilter::Classes { accepted, default }
    }
}

fn class_name(class: &IngressClass) -> Option<&str> {
    class.metadata.as_ref()?.name.as_deref()
}

fn is_default_class(class: &IngressClass) -> bool {
    class
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.get(DEFAULT_CLASS_ANNOTATION))
        .is_some_and(|v| v == "true")
}

enum ClassFilter {
    All,
    Classes {
        accepted: BTreeSet<String>,
        default: Option<String>,
    },
}

impl ClassFilter {
    fn accepts(&self, ingress: &Ingress) -> bool {
        match self {
            ClassFilter::All => true,
            ClassFilter::Classes { accepted, default } => {
                match ingress_class_of(ingress).or(default.as_deref()) {
                    Some(class) => accepted.contains(class),
                    None => false,
                }
            }
        }
    }
}

/// The class an Ingress names: `spec.ingressClassName`, else the legacy annotation.
fn ingress_class_of(ingress: &Ingress) -> Option<&str> {
    let spec_class = ingress
        .spec
        .as_ref()
        .and_then(|s| s.ingress_class_name.as_deref());
    spec_class.or_else(|| {
        ingress
            .metadata
            .as_ref()
            .and_then(|m| m.annotations.get(LEGACY_CLASS_ANNOTATION))
            .map(String::as_str)
    })
}

/// Conflict order between Ingresses: oldest `creationTimestamp` first (missing counts as
/// newest), then namespace, then name.
pub(crate) fn conflict_order(a: &Ingress, b: &Ingress) -> Ordering {
    fn key(i: &Ingress) -> (Option<(i64, i32)>, &str, &str) {
        let meta = i.metadata.as_ref();
        let created = meta
            .and_then(|m| m.creation_timestamp.as_ref())
            .map(|t| (t.seconds.unwrap_or(0), t.nanos.unwrap_or(0)));
        let namespace = meta.and_then(|m| m.namespace.as_deref()).unwrap_or("");
        let name = meta.and_then(|m| m.name.as_deref()).unwrap_or("");
        (created, namespace, name)
    }
    let (ta, na, ma) = key(a);
    let (tb, nb, mb) = key(b);
    let time = match (ta, tb) {
        (Some(x), Some(y)) => x.cmp(&y),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    };
    time.then(na.cmp(nb)).then(ma.cmp(mb))
}

// === impl RouteTable ===

impl RouteTable {
    /// A table over all `ingresses`, with no IngressClass filtering.
    pub fn new(ingresses: &[Ingress]) -> Self {
        RouteTableBuilder::new().build(ingresses)
    }

    /// A builder, for IngressClass filtering.
    pub fn builder() -> RouteTableBuilder {
        RouteTableBuilder::new()
    }

    /// The backend for a request to `host` (an HTTP `Host` header or `:authority`, with or
    /// without port) and `path` (the URL path, without query).
    pub fn route(&self, host: &str, path: &str) -> Option<RouteMatch<'_>> {
        // Host kinds in precedence order; a later kind is only consulted when no path of the
        // earlier one matched.
        let route = with_host_key(host, |host| {
            self.exact_hosts
                .get(host)
                .and_then(|vhost| vhost.lookup(path))
                .or_else(|| {
                    if self.wildcard_hosts.is_empty() {
                        return None;
                    }
                    let vhost = self.wildcard_hosts.get(wildcard_key(host)?)?;
                    vhost.lookup(path)
                })
        })
        .or_else(|| self.any_host.lookup(path))
        .or(self.default_route)?;
        Some(RouteMatch {
            table: self,
            route: self.routes.get(route as usize)?,
        })
    }

    /// The TLS Secret for a TLS server name (SNI) from the `spec.tls` of the Ingresses: an
    /// entry listing the exact host first, then one listing a matching `*.` wildcard, then one
    /// with no hosts (which covers every host). Ties go to the older Ingress, then the earlier
    /// entry. Entries without `secretName` are ignored.
    pub fn tls_secret_for(&self, server_name: &str) -> Option<TlsSecretRef<'_>> {
        let entry = with_host_key(server_name, |host| {
            self.tls
                .exact
                .get(host)
                .or_else(|| wildcard_key(host).and_then(|s| self.tls.wildcard.get(s)))
        })
        .or(self.tls.any.as_ref())?;
        let ingress = self.ingresses.get(entry.ingress as usize)?;
        Some(TlsSecretRef {
            namespace: &ingress.namespace,
            secret_name: &entry.secret_name,
            ingress_name: &ingress.name,
        })
    }

    /// Number of Ingresses taken into the table.
    pub fn ingress_count(&self) -> usize {
        self.ingresses.len()
    }

    /// Number of routes (rule paths plus default backends) in the table, including those
    /// shadowed by an identical earlier path.
    pub fn route_count(&self) -> usize {
        self.routes.len()
    }

    /// Adds one Ingress; Ingresses must be added in conflict order, since the first route for
    /// a given host and path wins.
    fn add_ingress(&mut self, ingress: &Ingress) {
        let meta = ingress.metadata.as_ref();
        let ingress_index = to_u32(self.ingresses.len());
        self.ingresses.push(IngressId {
            namespace: meta
                .and_then(|m| m.namespace.as_deref())
                .unwrap_or("")
                .into(),
            name: meta.and_then(|m| m.name.as_deref()).unwrap_or("").into(),
        });
        let Some(spec) = ingress.spec.as_ref() else {
            return;
        };
        for (rule_index, rule) in spec.rules.iter().enumerate() {
            let Some(http) = rule
                .ingress_rule_value
                .as_ref()
                .and_then(|v| v.http.as_ref())
            else {
                continue;
            };
            let rule_host = rule.host.as_deref().unwrap_or("").to_ascii_lowercase();
            for (path_index, http_path) in http.paths.iter().enumerate() {
                let Some(backend) = http_path.backend.as_ref() else {
                    continue;
                };
                let path_type = match http_path.path_type.as_deref() {
                    Some(text) => text.parse().unwrap_or(PathType::ImplementationSpecific),
                    None => PathType::ImplementationSpecific,
                };
                let (vhost, host_match) = if rule_host.is_empty() {
                    (&mut self.any_host, HostMatch::Any)
                } else if let Some(suffix) = rule_host.strip_prefix("*.") {
                    (
                        self.wildcard_hosts.entry(suffix.into()).or_default(),
                        HostMatch::Wildcard,
                    )
                } else {
                    (
                        self.exact_hosts
                            .entry(rule_host.as_str().into())
                            .or_default(),
                        HostMatch::Exact,
                    )
                };
                let route_index = to_u32(self.routes.len());
                let path = http_path.path.as_deref().unwrap_or("");
                vhost.insert(path_type, path, route_index);
                self.routes.push(Route {
                    ingress: ingress_index,
                    backend: backend.clone(),
                    source: MatchSource::Rule {
                        rule: rule_index,
                        path: path_index,
                        host: host_match,
                    },
                    path: http_path.path.as_deref().map(Into::into),
                    path_type: Some(path_type),
                });
            }
        }
        if let Some(backend) = spec.default_backend.as_ref() {
            let route_index = to_u32(self.routes.len());
            self.routes.push(Route {
                ingress: ingress_index,
                backend: backend.clone(),
                source: MatchSource::DefaultBackend,
                path: None,
                path_type: None,
            });
            self.default_route.get_or_insert(route_index);
        }
        for tls in &spec.tls {
            let Some(secret_name) = tls.secret_name.as_deref() else {
                continue;
            };
            let entry = TlsEntry {
                ingress: ingress_index,
                secret_name: secret_name.into(),
            };
            if tls.hosts.is_empty() {
                self.tls.any.get_or_insert(entry);
                continue;
            }
            for host in &tls.hosts {
                let host = host.to_ascii_lowercase();
                let map = match host.strip_prefix("*.") {
                    Some(suffix) => self.tls.wildcard.entry(suffix.into()),
                    None => self.tls.exact.entry(host.as_str().into()),
                };
                map.or_insert_with(|| entry.clone());
            }
        }
    }
}

/// Index type for the table's arrays. More than `u32::MAX` routes cannot be built in memory
/// in practice; saturating keeps this free of panics regardless.
pub(crate) fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Removes a `:port` and a trailing dot. IPv6 literals keep their brackets. Lowercasing is
/// left to `with_host_key`.
pub(crate) fn normalize_host(host: &str) -> &str {
    let bytes = host.as_bytes();
    let end = if bytes.first() == Some(&b'[') {
        bytes
            .iter()
            .position(|&b| b == b']')
            .map_or(bytes.len(), |i| i + 1)
    } else {
        // Exactly one colon: `name:port`. More than one is a bare IPv6 address.
        let mut colons = bytes.iter().enumerate().filter(|(_, b)| **b == b':');
        match (colons.next(), colons.next()) {
            (Some((i, _)), None) => i,
            _ => bytes.len(),
        }
    };
    let without_port = host.get(..end).unwrap_or(host);
    without_port.strip_suffix('.').unwrap_or(without_port)
}

/// Calls `f` with the request host normalized and lowercased, without allocating when the
/// host fits in a DNS name's length.
pub(crate) fn with_host_key<R>(host: &str, f: impl FnOnce(&str) -> R) -> R {
    let host = normalize_host(host);
    if !host.bytes().any(|b| b.is_ascii_uppercase()) {
        return f(host);
    }
    let mut buf = [0u8; 256];
    match buf.get_mut(..host.len()) {
        Some(dst) => {
            dst.copy_from_slice(host.as_bytes());
            dst.make_ascii_lowercase();
            // ASCII lowercasing keeps UTF-8 valid; the fallback is unreachable.
            f(std::str::from_utf8(dst).unwrap_or(""))
        }
        None => f(&host.to_ascii_lowercase()),
    }
}

/// The key under which `*.suffix` rules are stored that could match `host`: everything after
/// the first label, when the first label is not empty.
pub(crate) fn wildcard_key(host: &str) -> Option<&str> {
    match host.split_once('.') {
        Some((label, suffix)) if !label.is_empty() => Some(suffix),
        _ => None,
    }
}

/// A `Prefix` path without its trailing slashes: `/foo/` is `/foo`, `/` is empty.
pub(crate) fn trim_prefix_path(path: &str) -> &str {
    path.trim_end_matches('/')
}

// === impl VirtualHost ===

impl VirtualHost {
    fn insert(&mut self, path_type: PathType, path: &str, route: u32) {
        if path_type.is_prefix_like() {
            self.prefix.insert(trim_prefix_path(path), route);
        } else {
            self.exact.entry(path.into()).or_insert(route);
        }
    }

    /// The best route for `path` in this host: an exact hit is always at least as long as
    /// any prefix hit, and wins ties, so it is checked first.
    fn lookup(&self, path: &str) -> Option<u32> {
        if !self.exact.is_empty()
            && let Some(route) = self.exact.get(path)
        {
            return Some(*route);
        }
        self.prefix.longest_match(path)
    }
}

// === impl Children ===

/// Byte equality for the short strings of path elements, compared a word at a time in place:
/// for such lengths, the call into the C library's `memcmp` that `==` makes costs more than
/// the comparison itself.
#[inline]
fn short_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut a_words = a.chunks_exact(8);
    let mut b_words = b.chunks_exact(8);
    for (x, y) in (&mut a_words).zip(&mut b_words) {
        if x != y {
            return false;
        }
    }
    a_words
        .remainder()
        .iter()
        .zip(b_words.remainder())
        .all(|(x, y)| x == y)
}

impl Default for Children {
    fn default() -> Self {
        Children::Small(Vec::new())
    }
}

impl Children {
    fn is_empty(&self) -> bool {
        match self {
            Children::Small(v) => v.is_empty(),
            Children::Large(m) => m.is_empty(),
        }
    }

    fn get(&self, segment: &str) -> Option<u32> {
        match self {
            Children::Small(v) => v
                .iter()
                .find(|(key, _)| short_eq(key.as_bytes(), segment.as_bytes()))
                .map(|(_, child)| *child),
            Children::Large(m) => m.get(segment).copied(),
        }
    }

    /// The child for `segment`, or `next` after recording it as the new child.
    fn get_or_insert(&mut self, segment: &str, next: u32) -> u32 {
        if let Some(child) = self.get(segment) {
            return child;
        }
        match self {
            Children::Small(v) if v.len() < SMALL_CHILDREN => v.push((segment.into(), next)),
            Children::Small(v) => {
                let mut map: HashMap<Box<str>, u32> = std::mem::take(v).into_iter().collect();
                map.insert(segment.into(), next);
                *self = Children::Large(map);
            }
            Children::Large(m) => {
                m.insert(segment.into(), next);
            }
        }
        next
    }
}

// === impl PrefixTrie ===

impl Default for PrefixTrie {
    fn default() -> Self {
        PrefixTrie {
            nodes: vec![TrieNode::default()],
        }
    }
}

impl PrefixTrie {
    /// Inserts a trimmed prefix path; the first route inserted for a path wins.
    fn insert(&mut self, trimmed: &str, route: u32) {
        self.insert_or_get(trimmed, route);
    }

    /// The value of a trimmed prefix path: the one it already has, else `value`.
    pub(crate) fn insert_or_get(&mut self, trimmed: &str, value: u32) -> u32 {
        let mut node = 0usize;
        if !trimmed.is_empty() {
            for segment in trimmed.split('/') {
                let next = to_u32(self.nodes.len());
                let child = self.nodes[node].children.get_or_insert(segment, next);
                if child == next {
                    self.nodes.push(TrieNode::default());
                }
                node = child as usize;
            }
        }
        *self.nodes[node].route.get_or_insert(value)
    }

    /// Calls `visit` with the value of every prefix path that `path` matches element-wise,
    /// the deepest (so longest) first, until it returns `Some`.
    pub(crate) fn deepest_first<R>(
        &self,
        path: &str,
        mut visit: impl FnMut(u32) -> Option<R>,
    ) -> Option<R> {
        self.visit_from(0, path, &mut visit)
    }

    /// The walk of [`deepest_first`](Self::deepest_first) below `node`, with `rest` the part
    /// of the path after it. It recurses once per trie level the path follows, so its depth
    /// is bounded by the longest configured path, not by the request.
    fn visit_from<R>(
        &self,
        node: usize,
        rest: &str,
        visit: &mut impl FnMut(u32) -> Option<R>,
    ) -> Option<R> {
        let current = self.nodes.get(node)?;
        if !current.children.is_empty() {
            let (segment, tail) = match rest.as_bytes().iter().position(|&b| b == b'/') {
                Some(i) => (rest.get(..i).unwrap_or(""), rest.get(i + 1..)),
                None => (rest, None),
            };
            if let Some(child) = current.children.get(segment) {
                let found = match tail {
                    Some(tail) => self.visit_from(child as usize, tail, visit),
                    None => self
                        .nodes
                        .get(child as usize)
                        .and_then(|n| n.route)
                        .and_then(&mut *visit),
                };
                if found.is_some() {
                    return found;
                }
            }
        }
        current.route.and_then(visit)
    }

    /// The route of the deepest (so longest) prefix path that `path` matches element-wise.
    fn longest_match(&self, path: &str) -> Option<u32> {
        let mut node = self.nodes.first()?;
        let mut best = node.route;
        // A trailing slash in the request adds an empty final element, which no trimmed
        // rule path has, so it needs no special case.
        let mut rest = path;
        while !node.children.is_empty() {
            let (segment, tail) = match rest.as_bytes().iter().position(|&b| b == b'/') {
                Some(i) => (rest.get(..i).unwrap_or(""), rest.get(i + 1..)),
                None => (rest, None),
            };
            match node.children.get(segment) {
                Some(child) => match self.nodes.get(child as usize) {
                    Some(next) => node = next,
                    None => break,
                },
                None => break,
            }
            if node.route.is_some() {
                best = node.route;
            }
            match tail {
                Some(tail) => rest = tail,
                None => break,
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_normalization() {
        assert_eq!(with_host_key("Foo.COM:8080", str::to_owned), "foo.com");
        assert_eq!(
            with_host_key(&"A".repeat(300), str::to_owned),
            "a".repeat(300)
        );
        assert_eq!(normalize_host("foo.com."), "foo.com");
        assert_eq!(normalize_host("[::1]:443"), "[::1]");
        assert_eq!(normalize_host("::1"), "::1");
        assert_eq!(wildcard_key("a.foo.com"), Some("foo.com"));
        assert_eq!(wildcard_key(".foo.com"), None);
        assert_eq!(wildcard_key("localhost"), None);
    }

    #[test]
    fn wide_trie_levels_switch_to_a_map() {
        let mut trie = PrefixTrie::default();
        for i in 0..20u32 {
            trie.insert(&format!("/a{i}/x"), i);
        }
        assert!(matches!(trie.nodes[1].children, Children::Large(_)));
        for i in 0..20u32 {
            assert_eq!(trie.longest_match(&format!("/a{i}/x/y")), Some(i));
            assert_eq!(trie.longest_match(&format!("/a{i}")), None);
        }
        trie.insert("/a3/x", 99);
        assert_eq!(trie.longest_match("/a3/x"), Some(3));
    }

    #[test]
    fn path_type_parse() {
        assert_eq!("Exact".parse::<PathType>(), Ok(PathType::Exact));
        assert!("exact".parse::<PathType>().is_err());
        assert_eq!(PathType::Prefix.to_string(), "Prefix");
    }
}
