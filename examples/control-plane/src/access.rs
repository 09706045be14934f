//! Who may use ADS, and what each client is served.
//!
//! Every ADS call carries a bearer token (`authorization: Bearer TOKEN`), the same tokens the
//! CA takes ([`TokenGrants`]). A token's line in the token file names what it may be over
//! ADS, its [`XdsRole`], and so the node identity of its holder:
//!
//! | word | the holder is | its requests' `node.id` must be | it is served |
//! |---|---|---|---|
//! | `node=NAME` | the node proxy of node `NAME` | `NAME`, or an Istio proxy id `TYPE~IP~ID~DOMAIN` (ztunnel's) whose metadata `NODE_NAME` is `NAME` | `Address` and `Authorization` only: every Service; the workloads on node `NAME`; the workloads that are endpoints of some Service (those its workloads may reach through a Service); every authorization policy |
//! | `gateway=NAME` | a gateway (meshkit's or Envoy) | `NAME` (`NAME*`: any id starting with `NAME`) | everything but Secrets, and the Secrets that some Ingress's `spec.tls` names (`namespace/secretName`) |
//! | `gateway=NAME:CLASS` | a gateway of IngressClass `CLASS` | as `gateway=NAME` | as `gateway=NAME`, but only the Ingresses of class `CLASS` (by `spec.ingressClassName`, the legacy annotation, or the default class) and only the Secrets those name |
//!
//! With ServiceAccount tokens taken ([`crate::service_accounts`]), a token not in the file is
//! reviewed by the API server: a node proxy's Pod-bound token is `node=` its Pod's node, a
//! gateway's ServiceAccount is `gateway=*`, and any other ServiceAccount may not use xDS.
//!
//! | the call | status |
//! |---|---|
//! | no `authorization: Bearer` header | `UNAUTHENTICATED` |
//! | a token not in the file (and, when taken, not a ServiceAccount token the API server accepts for the audience) | `UNAUTHENTICATED` |
//! | a ServiceAccount that is neither a node proxy's nor a gateway's | `PERMISSION_DENIED` |
//! | a token without an xDS role (CA only) | `PERMISSION_DENIED` |
//! | first request without a node | `INVALID_ARGUMENT` |
//! | a request whose `node.id` is not the token's | `PERMISSION_DENIED` |
//!
//! Workloads of other nodes that no Service selects are never sent to a node proxy: nothing
//! routes to them by name, and a node proxy needs no other node's workload list. Node proxies
//! are sent no Secrets, Ingresses or Envoy resources at all. The views are computed once per
//! snapshot and role and shared by all streams of that role, and every node's view is one
//! shared copy of the Addresses all nodes are sent plus its own node's other workloads.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use meshkit_ingress_model::{Ingress, IngressClass};
use meshkit_mesh::feed::ip_from_bytes;
use meshkit_mesh::proto::workload::{Address, address};
use meshkit_mesh::resources::{
    ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL, INGRESS_CLASS_TYPE_URL, INGRESS_TYPE_URL,
};
use meshkit_xds_client::SECRET_TYPE_URL;
use meshkit_xds_server::envoy_types::pb::envoy::config::core::v3::Node;
use meshkit_xds_server::{
    AccessPolicy, Change, Resources, Snapshot, StreamAccess, TypeSnapshot, VersionedResource,
};
use prost::Message;
use tokio::sync::watch;
use tonic::Status;
use tonic::metadata::MetadataMap;

use crate::ca::TokenGrants;
use crate::metrics::XdsMetrics;
use crate::service_accounts::{Reviewer, looks_like_jwt};
use futures::future::BoxFuture;

/// Why a `KIND=NAME` word of the token file is not an xDS role ([`XdsRole::parse_word`]);
/// each holds the word.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RoleWordError {
    /// Nothing after `=`.
    #[error("{0:?}: empty name")]
    EmptyName(String),
    /// `gateway=NAME:` or `gateway=:CLASS`.
    #[error("{0:?}: expected gateway=NAME:CLASS")]
    GatewayClass(String),
    /// Neither `node=` nor `gateway=`.
    #[error("{0:?}: unknown xDS role (expected node=NAME or gateway=NAME)")]
    UnknownRole(String),
}

/// What a token may be over ADS.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum XdsRole {
    /// The node proxy of the named node.
    Node(String),
    /// A gateway whose xDS node id is the name, serving every IngressClass.
    Gateway(String),
    /// A gateway whose xDS node id is `name`, serving only Ingresses of IngressClass `class`
    /// (token file word `gateway=NAME:CLASS`): it gets only those Ingresses and only the
    /// Secrets they name, so gateways of different classes never see each other's keys.
    GatewayOfClass {
        /// The node id its requests must carry (`*` suffix: a prefix).
        name: String,
        /// The IngressClass it serves.
        class: String,
    },
}

/// The [`AccessPolicy`] of the control plane's ADS server: tokens from [`TokenGrants`],
/// views per [`XdsRole`].
#[derive(Clone)]
pub struct TokenAccess {
    grants: watch::Receiver<Arc<TokenGrants>>,
    accounts: Option<Arc<Reviewer>>,
    views: Arc<Mutex<Views>>,
    metrics: Option<XdsMetrics>,
}

/// The views of the current snapshot, per role.
#[derive(Default)]
struct Views {
    source: Option<Arc<Snapshot>>,
    by_role: HashMap<XdsRole, Arc<Snapshot>>,
    /// The source's Addresses, indexed once for every node's view.
    addresses: Option<Arc<AddressIndex>>,
}

impl Views {
    /// Makes `snapshot` the source: when only some Addresses changed in place, each node's
    /// view takes them in place (a Pod turning Ready re-encodes one resource, not every
    /// node's view); otherwise every view is built anew when asked for.
    fn advance(&mut self, snapshot: &Arc<Snapshot>) {
        let changes = match (&self.source, &self.addresses) {
            (Some(old), Some(index)) => address_changes(old, snapshot, index),
            _ => None,
        };
        self.source = Some(Arc::clone(snapshot));
        match changes {
            Some(changes) => {
                self.by_role
                    .retain(|role, _| matches!(role, XdsRole::Node(_)));
                // The shared Addresses take the changes too, and the views that are them
                // plus nothing hold them in its memory again.
                let shared = self.addresses.as_mut().and_then(Arc::get_mut).map(|index| {
                    let shared = &mut index.shared.addresses;
                    if let Some(put) = put_held(shared, &changes) {
                        *shared = put;
                    }
                    shared.resources().clone()
                });
                if shared.is_none() {
                    // Held elsewhere (never while the lock is): indexed anew when next needed.
                    self.addresses = None;
                }
                for view in self.by_role.values_mut() {
                    *view = Arc::new(patched(view, &changes, shared.as_ref()));
                }
            }
            None => {
                self.by_role.clear();
                self.addresses = None;
            }
        }
    }
}

/// One stream's access.
struct ClientAccess {
    role: XdsRole,
    views: Arc<Mutex<Views>>,
    metrics: Option<XdsMetrics>,
    /// The `pilot_xds` gauge this stream counts in, once its node was accepted.
    connected: Option<prometheus_client::metrics::gauge::Gauge>,
}

// === impl XdsRole ===

impl XdsRole {
    /// The name in the token file: the `node.id` its requests must carry (a name ending in
    /// `*` accepts every node id with that prefix).
    pub fn node_id(&self) -> &str {
        match self {
            Self::Node(name) | Self::Gateway(name) | Self::GatewayOfClass { name, .. } => name,
        }
    }

    /// Whether a request may carry `node_id`.
    pub fn accepts_node_id(&self, node_id: &str) -> bool {
        match self.node_id().strip_suffix('*') {
            Some(prefix) => node_id.starts_with(prefix),
            None => node_id == self.node_id(),
        }
    }

    /// A token file word: `Some` for `node=NAME` or `gateway=NAME`, `None` for any word
    /// without `=` (an identity).
    ///
    /// # Errors
    ///
    /// An unknown role or an empty name.
    pub fn parse_word(word: &str) -> Result<Option<Self>, RoleWordError> {
        let Some((kind, name)) = word.split_once('=') else {
            return Ok(None);
        };
        if name.is_empty() {
            return Err(RoleWordError::EmptyName(word.to_owned()));
        }
        match kind {
            "node" => Ok(Some(Self::Node(name.to_owned()))),
            "gateway" => match name.split_once(':') {
                Some((name, class)) if !name.is_empty() && !class.is_empty() => {
                    Ok(Some(Self::GatewayOfClass {
                        name: name.to_owned(),
                        class: class.to_owned(),
                    }))
                }
                Some(_) => Err(RoleWordError::GatewayClass(word.to_owned())),
                None => Ok(Some(Self::Gateway(name.to_owned()))),
            },
            _ => Err(RoleWordError::UnknownRole(word.to_owned())),
        }
    }

    /// The part of `snapshot` this role is served (see the module table).
    pub fn view(&self, snapshot: &Snapshot) -> Snapshot {
        match self {
            Self::Node(node) => node_view(snapshot, node, &AddressIndex::of(snapshot)),
            _ => self.view_indexed(snapshot, &AddressIndex::default()),
        }
    }

    /// [`XdsRole::view`] with the snapshot's Addresses already indexed.
    fn view_indexed(&self, snapshot: &Snapshot, index: &AddressIndex) -> Snapshot {
        match self {
            Self::Node(node) => node_view(snapshot, node, index),
            Self::Gateway(_) => gateway_view(snapshot, None),
            Self::GatewayOfClass { class, .. } => gateway_view(snapshot, Some(class)),
        }
    }
}

/// The token file word: `node=NAME`, `gateway=NAME` or `gateway=NAME:CLASS`.
impl std::fmt::Display for XdsRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Node(name) => write!(f, "node={name}"),
            Self::Gateway(name) => write!(f, "gateway={name}"),
            Self::GatewayOfClass { name, class } => write!(f, "gateway={name}:{class}"),
        }
    }
}

/// What a node's view needs of each `Address` of one snapshot, decoded once for all the
/// node proxies served from it rather than once per node proxy.
#[derive(Debug, Default)]
struct AddressIndex {
    by_name: HashMap<String, AddressEntry>,
    /// The names of each node's workloads.
    by_node: HashMap<String, Vec<String>>,
    /// What every node's view starts from (see [`Shared`]).
    shared: Shared,
}

/// The Addresses sent to every node (services, and workloads that back one), each under the
/// aliases it alone claims among them: every node's view is this with its own node's other
/// workloads put in, so the views share one copy of it.
#[derive(Debug, Default)]
struct Shared {
    addresses: TypeSnapshot,
    /// Aliases that two or more of them claim (and so stand for none).
    contested: HashSet<String>,
}

#[derive(Debug, PartialEq)]
struct AddressEntry {
    /// The workload's node; `None` for a service.
    node: Option<String>,
    /// A service, or a workload that backs one: sent to every node.
    everywhere: bool,
    /// The addresses (`NETWORK/IP`) and host name it may be asked for by.
    aliases: Vec<String>,
}

impl AddressIndex {
    fn of(snapshot: &Snapshot) -> Self {
        let Some(addresses) = snapshot.get_type(ADDRESS_TYPE_URL) else {
            return Self::default();
        };
        let by_name: HashMap<String, AddressEntry> = addresses
            .resources()
            .iter()
            .filter_map(|(name, r)| Some((name.to_owned(), AddressEntry::of(r)?)))
            .collect();
        let mut by_node: HashMap<String, Vec<String>> = HashMap::new();
        for (name, entry) in &by_name {
            if let Some(node) = &entry.node {
                by_node.entry(node.clone()).or_default().push(name.clone());
            }
        }
        let everywhere = by_name.iter().filter(|(_, e)| e.everywhere);
        let claims = Claims::of(everywhere.map(|(name, e)| (name.as_str(), e)));
        let kept = addresses.filtered(|name, _| by_name.get(name).is_some_and(|e| e.everywhere));
        let shared = Shared {
            addresses: kept.with_aliases(claims.unique()),
            contested: claims.contested().map(str::to_owned).collect(),
        };
        Self {
            by_name,
            by_node,
            shared,
        }
    }
}

/// Which resources claim each alias (a resource that lists one twice claims it once).
struct Claims<'a>(BTreeMap<&'a str, BTreeSet<&'a str>>);

impl<'a> Claims<'a> {
    fn of(entries: impl Iterator<Item = (&'a str, &'a AddressEntry)>) -> Self {
        let mut claims: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for (name, entry) in entries {
            for alias in &entry.aliases {
                claims.entry(alias).or_default().insert(name);
            }
        }
        Self(claims)
    }

    /// The aliases one resource alone claims, with it.
    fn unique(&self) -> impl Iterator<Item = (String, String)> + '_ {
        self.0
            .iter()
            .filter_map(|(alias, names)| match names.len() {
                1 => names
                    .first()
                    .map(|n| ((*alias).to_owned(), (*n).to_owned())),
                _ => None,
            })
    }

    fn contested(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.0
            .iter()
            .filter(|(_, names)| names.len() > 1)
            .map(|(alias, _)| *alias)
    }
}

impl AddressEntry {
    /// What a view needs of one `Address`; `None` when it does not decode.
    fn of(resource: &VersionedResource) -> Option<Self> {
        let by_ip =
            |network: &str, bytes: &[u8]| ip_from_bytes(bytes).map(|ip| format!("{network}/{ip}"));
        Some(
            match Address::decode(resource.resource.value.as_slice())
                .ok()?
                .r#type?
            {
                address::Type::Service(svc) => {
                    let ips = svc.addresses.iter();
                    let mut aliases: Vec<String> =
                        ips.filter_map(|a| by_ip(&a.network, &a.address)).collect();
                    aliases.push(svc.hostname);
                    Self {
                        node: None,
                        everywhere: true,
                        aliases,
                    }
                }
                address::Type::Workload(w) => Self {
                    everywhere: !w.services.is_empty(),
                    aliases: w
                        .addresses
                        .iter()
                        .filter_map(|a| by_ip(&w.network, a))
                        .collect(),
                    node: Some(w.node),
                },
            },
        )
    }
}

/// The Addresses of `new` that differ from those of `old`, when nothing else does: the same
/// types, every other type equal, the same Address names, and each changed Address the same
/// to a view as `index` (built from `old`) says, so that every node's view of `new` is its
/// view of `old` with these in place. `None` otherwise, or when so many changed that
/// building the views anew costs less.
fn address_changes(
    old: &Snapshot,
    new: &Snapshot,
    index: &AddressIndex,
) -> Option<Vec<(String, Arc<VersionedResource>)>> {
    if !old.type_urls().eq(new.type_urls()) {
        return None;
    }
    let others_equal = new
        .type_urls()
        .filter(|url| *url != ADDRESS_TYPE_URL)
        .all(|url| old.get_type(url) == new.get_type(url));
    let (before, after) = (
        old.get_type(ADDRESS_TYPE_URL)?.resources(),
        new.get_type(ADDRESS_TYPE_URL)?.resources(),
    );
    if !others_equal {
        return None;
    }
    // Past this many, patching every view costs about what building them does.
    let most = (before.len() / 4).max(16);
    let mut changed = Vec::new();
    // What the two share is not looked at: a snapshot with some Addresses put in place
    // costs what changed.
    for change in before.diff(after) {
        let Change::Put(name, b) = change else {
            return None;
        };
        if changed.len() >= most || !before.contains_key(name) {
            return None;
        }
        let unchanged = index
            .by_name
            .get(name)
            .is_some_and(|e| AddressEntry::of(b).as_ref() == Some(e));
        if !unchanged {
            return None;
        }
        changed.push((name.to_owned(), Arc::clone(b)));
    }
    Some(changed)
}

/// `view` with each of `changed` that it holds put in place, its Addresses held in
/// `shared`'s memory when they are the same (see [`Shared`]).
fn patched(
    view: &Snapshot,
    changed: &[(String, Arc<VersionedResource>)],
    shared: Option<&Resources>,
) -> Snapshot {
    let Some(addresses) = view.get_type(ADDRESS_TYPE_URL) else {
        return view.clone();
    };
    let Some(mut put) = put_held(addresses, changed) else {
        return view.clone();
    };
    if let Some(shared) = shared {
        put = put.sharing(shared);
    }
    view.clone().with_type(ADDRESS_TYPE_URL, put)
}

/// `addresses` with each of `changed` that it holds put in place; `None` when it holds none.
fn put_held(
    addresses: &TypeSnapshot,
    changed: &[(String, Arc<VersionedResource>)],
) -> Option<TypeSnapshot> {
    let held = changed
        .iter()
        .filter(|(name, _)| addresses.resources().contains_key(name))
        .map(|(name, r)| (name.clone(), Arc::clone(r)))
        .collect::<Vec<_>>();
    (!held.is_empty()).then(|| addresses.clone().with_versioned(held))
}

fn node_view(snapshot: &Snapshot, node: &str, index: &AddressIndex) -> Snapshot {
    let Some(addresses) = snapshot.get_type(ADDRESS_TYPE_URL) else {
        return Snapshot::new();
    };
    // For a node proxy in on-demand mode (ztunnel's XDS_ON_DEMAND, which subscribes to no
    // Address by name at first): its own node's workloads without asking, and every kept
    // workload and service by the names it asks for them by.
    let own = index.by_node.get(node).map_or(&[][..], Vec::as_slice);
    let kept = with_own(&index.shared, addresses, own, &index.by_name);
    let view = Snapshot::new().with_type(ADDRESS_TYPE_URL, kept.with_implicit(own.to_vec()));
    // Every policy: a GLOBAL or NAMESPACE policy applies to workloads by scope, not by name,
    // so no subset is safe to leave out.
    match snapshot.get_type(AUTHORIZATION_TYPE_URL) {
        Some(policies) => view.with_type(AUTHORIZATION_TYPE_URL, policies.clone()),
        None => view,
    }
}

/// The shared Addresses with a node's own workloads that are not among them put in: each
/// also under the aliases it alone claims among all kept, and an alias of the shared ones
/// that one of them also claims taken away.
fn with_own(
    shared: &Shared,
    addresses: &TypeSnapshot,
    own: &[String],
    by_name: &HashMap<String, AddressEntry>,
) -> TypeSnapshot {
    let extra: Vec<(&str, &AddressEntry)> = own
        .iter()
        .filter_map(|name| Some((name.as_str(), by_name.get(name)?)))
        .filter(|(_, e)| !e.everywhere)
        .collect();
    if extra.is_empty() {
        return shared.addresses.clone();
    }
    let claims = Claims::of(extra.iter().copied());
    // An alias one shared resource claims stands for it in the shared aliases; one that two
    // claim is contested. Either way, a claim by an extra workload leaves it to none.
    let claimed_before =
        |alias: &str| shared.addresses.alias(alias).is_some() || shared.contested.contains(alias);
    let taken: Vec<&str> = claims
        .0
        .keys()
        .copied()
        .filter(|a| shared.addresses.alias(a).is_some())
        .collect();
    let unique: Vec<(String, String)> = claims
        .unique()
        .filter(|(alias, _)| !claimed_before(alias))
        .collect();
    let put = extra.iter().filter_map(|(name, _)| {
        let (name, r) = addresses.resources().get_key_value(name)?;
        Some((name.to_owned(), Arc::clone(r)))
    });
    shared
        .addresses
        .clone()
        .with_versioned(put.collect::<Vec<_>>())
        .without_aliases(taken)
        .with_aliases(unique)
}

/// A gateway's view: everything but Secrets that no Ingress of its class and no Gateway
/// listener names; with a class, also only the Ingresses of that class.
fn gateway_view(snapshot: &Snapshot, class: Option<&str>) -> Snapshot {
    let classes: Vec<IngressClass> = snapshot
        .get_type(INGRESS_CLASS_TYPE_URL)
        .map(|ts| {
            ts.resources()
                .values()
                .filter_map(|r| IngressClass::decode(r.resource.value.as_slice()).ok())
                .collect()
        })
        .unwrap_or_default();
    let filter = ClassFilter::new(class, &classes);
    let mut referenced = BTreeSet::new();
    if let Some(ingresses) = snapshot.get_type(INGRESS_TYPE_URL) {
        for r in ingresses.resources().values() {
            let Ok(ingress) = Ingress::decode(r.resource.value.as_slice()) else {
                continue;
            };
            if !filter.accepts(&ingress) {
                continue;
            }
            let namespace = ingress
                .metadata
                .as_ref()
                .and_then(|m| m.namespace.clone())
                .unwrap_or_else(|| "default".to_owned());
            for tls in ingress.spec.iter().flat_map(|s| s.tls.iter()) {
                if let Some(secret) = &tls.secret_name {
                    referenced.insert(format!("{namespace}/{secret}"));
                }
            }
        }
    }
    referenced.extend(gateway_certificate_refs(snapshot));
    let mut view = Snapshot::new();
    for url in snapshot.type_urls() {
        let Some(ts) = snapshot.get_type(url) else {
            continue;
        };
        let ts: TypeSnapshot = if url == SECRET_TYPE_URL {
            ts.filtered(|name, _| referenced.contains(name))
        } else if url == INGRESS_TYPE_URL && class.is_some() {
            ts.filtered(|_, r| {
                Ingress::decode(r.resource.value.as_slice()).is_ok_and(|i| filter.accepts(&i))
            })
        } else {
            ts.clone()
        };
        view = view.with_type(url, ts);
    }
    view
}

/// The Secrets (`namespace/name`) that the HTTPS listeners of the Gateways served name as
/// certificates (the snapshot holds only the Gateways of the control plane's controller):
/// those of the Gateway's own namespace, and those of another namespace whose
/// ReferenceGrant lets Gateways of the Gateway's namespace refer to them.
fn gateway_certificate_refs(snapshot: &Snapshot) -> BTreeSet<String> {
    use meshkit_ingress_model::gateway::types::{Gateway, ReferenceGrant};
    use meshkit_mesh::resources::{GATEWAY_TYPE_URL, REFERENCE_GRANT_TYPE_URL};
    fn objects<T: serde::de::DeserializeOwned>(snapshot: &Snapshot, url: &str) -> Vec<T> {
        snapshot
            .get_type(url)
            .map(|ts| {
                ts.resources()
                    .values()
                    .filter_map(|r| serde_json::from_slice(&r.resource.value).ok())
                    .collect()
            })
            .unwrap_or_default()
    }
    let grants: Vec<ReferenceGrant> = objects(snapshot, REFERENCE_GRANT_TYPE_URL);
    let granted = |from_ns: &str, to_ns: &str, name: &str| {
        grants
            .iter()
            .any(|g| g.allows("Gateway", from_ns, "", "Secret", to_ns, name))
    };
    let mut out = BTreeSet::new();
    for gateway in objects::<Gateway>(snapshot, GATEWAY_TYPE_URL) {
        let gateway_ns = gateway.metadata.namespace.clone().unwrap_or_default();
        for listener in gateway
            .spec
            .listeners
            .iter()
            .filter(|l| l.protocol == "HTTPS")
        {
            for cert in listener.tls.iter().flat_map(|t| &t.certificate_refs) {
                if !cert.group().is_empty() || cert.kind() != "Secret" {
                    continue;
                }
                let ns = cert.namespace.as_deref().unwrap_or(&gateway_ns);
                if ns == gateway_ns || granted(&gateway_ns, ns, &cert.name) {
                    out.insert(format!("{ns}/{}", cert.name));
                }
            }
        }
    }
    out
}

/// Which Ingresses a gateway of one class is sent, by the rule the gateway itself routes by:
/// an Ingress's class is `spec.ingressClassName`, else the legacy `kubernetes.io/ingress.class`
/// annotation, else the default class (the one IngressClass annotated
/// `ingressclass.kubernetes.io/is-default-class: "true"`, when there is exactly one).
struct ClassFilter {
    class: Option<String>,
    default: Option<String>,
}

impl ClassFilter {
    fn new(class: Option<&str>, classes: &[IngressClass]) -> Self {
        let mut defaults = classes.iter().filter(|c| {
            c.metadata
                .as_ref()
                .and_then(|m| {
                    m.annotations
                        .get("ingressclass.kubernetes.io/is-default-class")
                })
                .is_some_and(|v| v == "true")
        });
        let default = match (defaults.next(), defaults.next()) {
            (Some(only), None) => only.metadata.as_ref().and_then(|m| m.name.clone()),
            _ => None,
        };
        Self {
            class: class.map(str::to_owned),
            default,
        }
    }

    fn accepts(&self, ingress: &Ingress) -> bool {
        let Some(class) = &self.class else {
            return true;
        };
        let named = ingress
            .spec
            .as_ref()
            .and_then(|s| s.ingress_class_name.clone())
            .or_else(|| {
                ingress
                    .metadata
                    .as_ref()
                    .and_then(|m| m.annotations.get("kubernetes.io/ingress.class").cloned())
            })
            .or_else(|| self.default.clone());
        named.as_deref() == Some(class.as_str())
    }
}

// === impl TokenAccess ===

impl TokenAccess {
    /// Authenticates with `grants`.
    pub fn new(grants: TokenGrants) -> Self {
        Self {
            grants: watch::channel(Arc::new(grants)).1,
            accounts: None,
            views: Arc::default(),
            metrics: None,
        }
    }

    /// Takes the grants `grants` holds when each stream opens instead of fixed ones (the
    /// control plane follows its token file with it: [`crate::ControlPlaneConfig::tokens_file`]).
    pub fn with_grants(mut self, grants: watch::Receiver<Arc<TokenGrants>>) -> Self {
        self.grants = grants;
        self
    }

    /// Also takes ServiceAccount tokens, checked by `reviewer` ([`crate::service_accounts`]).
    pub(crate) fn with_service_accounts(mut self, reviewer: Arc<Reviewer>) -> Self {
        self.accounts = Some(reviewer);
        self
    }

    /// Counts the streams whose node was accepted in `metrics` (`pilot_xds`), until they
    /// end.
    pub fn with_metrics(mut self, metrics: XdsMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }
}

impl std::fmt::Debug for TokenAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenAccess")
            .field("grants", &**self.grants.borrow())
            .finish_non_exhaustive()
    }
}

/// The bearer token of a call, or `UNAUTHENTICATED`.
pub(crate) fn bearer(metadata: &MetadataMap) -> Result<&str, Status> {
    metadata
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| Status::unauthenticated("a bearer token is required"))
}

impl AccessPolicy for TokenAccess {
    fn open<'a>(
        &'a self,
        metadata: &'a MetadataMap,
    ) -> BoxFuture<'a, Result<Box<dyn StreamAccess>, Status>> {
        Box::pin(async move {
            let token = bearer(metadata)?;
            let grants = Arc::clone(&self.grants.borrow());
            let role = match grants.xds_role(token) {
                Some(role) => role.clone(),
                None if grants.knows(token) => {
                    return Err(Status::permission_denied(
                        "this token may not use xDS (it has no node= or gateway= role)",
                    ));
                }
                None => match &self.accounts {
                    Some(reviewer) if looks_like_jwt(token) => {
                        reviewer.caller(token).await?.xds_role()?
                    }
                    _ => return Err(Status::unauthenticated("unknown token")),
                },
            };
            Ok(Box::new(ClientAccess {
                role,
                views: Arc::clone(&self.views),
                metrics: self.metrics.clone(),
                connected: None,
            }) as Box<dyn StreamAccess>)
        })
    }
}

/// The `NODE_NAME` string of a node's metadata, as Istio's proxies send it.
fn node_name_metadata(node: &Node) -> Option<&str> {
    use meshkit_xds_server::envoy_types::pb::google::protobuf::value::Kind;
    match node
        .metadata
        .as_ref()?
        .fields
        .get("NODE_NAME")?
        .kind
        .as_ref()?
    {
        Kind::StringValue(s) => Some(s),
        _ => None,
    }
}

// === impl ClientAccess ===

impl ClientAccess {
    fn accepts(&self, node: &Node) -> bool {
        if self.role.accepts_node_id(&node.id) {
            return true;
        }
        // ztunnel's id is `ztunnel~IP~POD.NAMESPACE~NAMESPACE.svc.DOMAIN`; its node is the
        // NODE_NAME of its metadata.
        matches!(&self.role, XdsRole::Node(name)
            if node.id.split('~').count() == 4
                && node_name_metadata(node) == Some(name.as_str()))
    }
}

impl Drop for ClientAccess {
    fn drop(&mut self) {
        if let Some(gauge) = &self.connected {
            XdsMetrics::disconnected(gauge);
        }
    }
}

impl StreamAccess for ClientAccess {
    fn check_node(&mut self, node: &Node) -> Result<(), Status> {
        if !self.accepts(node) {
            return Err(Status::permission_denied(format!(
                "node {:?} is not the node this token belongs to",
                node.id
            )));
        }
        if self.connected.is_none()
            && let Some(metrics) = &self.metrics
        {
            self.connected = Some(metrics.connected(node));
        }
        Ok(())
    }

    fn view(&mut self, snapshot: &Arc<Snapshot>) -> Arc<Snapshot> {
        let mut views = self.views.lock().unwrap_or_else(|p| p.into_inner());
        if !views
            .source
            .as_ref()
            .is_some_and(|s| Arc::ptr_eq(s, snapshot))
        {
            views.advance(snapshot);
        }
        if let Some(view) = views.by_role.get(&self.role) {
            return Arc::clone(view);
        }
        let index = match (&self.role, &views.addresses) {
            (XdsRole::Node(_), None) => {
                let index = Arc::new(AddressIndex::of(snapshot));
                views.addresses = Some(Arc::clone(&index));
                index
            }
            (_, Some(index)) => Arc::clone(index),
            (_, None) => Arc::default(),
        };
        let view = Arc::new(self.role.view_indexed(snapshot, &index));
        views.by_role.insert(self.role.clone(), Arc::clone(&view));
        view
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshkit_ingress_model::manifest;
    use meshkit_xds_server::SnapshotBuilder;
    use meshkit_xds_server::envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;

    const INGRESSES: &str = r#"
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: a, namespace: shop}
spec:
  ingressClassName: public
  tls: [{hosts: [a.example.com], secretName: a-tls}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: b, namespace: shop}
spec:
  ingressClassName: internal
  tls: [{hosts: [b.example.com], secretName: b-tls}]
"#;

    fn snapshot() -> Snapshot {
        let mut builder = SnapshotBuilder::new();
        for ingress in manifest::from_yaml_str(INGRESSES).unwrap() {
            let name = ingress
                .metadata
                .as_ref()
                .and_then(|m| m.name.clone())
                .unwrap();
            builder.add(INGRESS_TYPE_URL, &format!("shop/{name}"), &ingress);
        }
        for secret in ["shop/a-tls", "shop/b-tls"] {
            let value = Secret {
                name: secret.to_owned(),
                ..Secret::default()
            };
            builder.add(SECRET_TYPE_URL, secret, &value);
        }
        builder.build()
    }

    #[test]
    fn a_gateway_sees_the_secrets_its_gateway_listeners_name_where_they_may() {
        use meshkit_mesh::resources::{GATEWAY_TYPE_URL, REFERENCE_GRANT_TYPE_URL};
        let mut builder = SnapshotBuilder::new();
        for secret in [
            "shop/gw-tls",
            "certs/shared",
            "certs/private",
            "shop/unnamed",
        ] {
            let value = Secret {
                name: secret.to_owned(),
                ..Secret::default()
            };
            builder.add(SECRET_TYPE_URL, secret, &value);
        }
        let gateway = serde_json::json!({
            "metadata": {"name": "public", "namespace": "shop"},
            "spec": {"gatewayClassName": "meshkit", "listeners": [{
                "name": "https", "port": 443, "protocol": "HTTPS",
                "tls": {"certificateRefs": [
                    {"name": "gw-tls"},
                    {"name": "shared", "namespace": "certs"},
                    {"name": "private", "namespace": "certs"}
                ]}
            }]}
        });
        let grant = serde_json::json!({
            "metadata": {"name": "g", "namespace": "certs"},
            "spec": {
                "from": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": "shop"}],
                "to": [{"group": "", "kind": "Secret", "name": "shared"}]
            }
        });
        for (url, name, value) in [
            (GATEWAY_TYPE_URL, "shop/public", gateway),
            (REFERENCE_GRANT_TYPE_URL, "certs/g", grant),
        ] {
            builder.add_any(
                url,
                name,
                envoy_types::pb::google::protobuf::Any {
                    type_url: url.to_owned(),
                    value: serde_json::to_vec(&value).unwrap(),
                },
            );
        }
        let view = XdsRole::Gateway("gw".into()).view(&builder.build());
        // Its own namespace's, and the granted one; not the one without a grant, nor one
        // no listener names.
        assert_eq!(view.names(SECRET_TYPE_URL), ["certs/shared", "shop/gw-tls"]);
    }

    #[test]
    fn a_gateway_of_a_class_sees_only_its_ingresses_and_their_secrets() {
        let snapshot = snapshot();
        let role = XdsRole::parse_word("gateway=public-gw:public")
            .unwrap()
            .unwrap();
        assert_eq!(
            role,
            XdsRole::GatewayOfClass {
                name: "public-gw".into(),
                class: "public".into()
            }
        );
        let view = role.view(&snapshot);
        assert_eq!(view.names(SECRET_TYPE_URL), ["shop/a-tls"]);
        assert_eq!(view.names(INGRESS_TYPE_URL), ["shop/a"]);
        // Without a class: every Ingress, and every Secret some Ingress names.
        let all = XdsRole::Gateway("gw".into()).view(&snapshot);
        assert_eq!(all.names(SECRET_TYPE_URL), ["shop/a-tls", "shop/b-tls"]);
        assert!(XdsRole::parse_word("gateway=gw:").is_err());
        assert!(XdsRole::parse_word("gateway=:public").is_err());
    }

    /// Addresses: a service, a workload behind it on node a, one on node b that no service
    /// selects; each workload's status and node as given.
    fn mesh(status: i32, lone_node: &str) -> Snapshot {
        use meshkit_mesh::proto::workload::{NetworkAddress, Service, Workload};
        let mut b = SnapshotBuilder::new();
        b.declare(AUTHORIZATION_TYPE_URL);
        let service = Service {
            name: "web".into(),
            namespace: "shop".into(),
            hostname: "web.shop.svc.cluster.local".into(),
            addresses: vec![NetworkAddress {
                network: String::new(),
                address: vec![10, 96, 0, 1],
                ..Default::default()
            }],
            ..Default::default()
        };
        let workload = |uid: &str, node: &str, ip: u8, services: bool| Workload {
            uid: uid.into(),
            node: node.into(),
            addresses: vec![vec![10, 0, 0, ip]],
            status,
            services: if services {
                [(
                    "shop/web.shop.svc.cluster.local".to_owned(),
                    Default::default(),
                )]
                .into()
            } else {
                Default::default()
            },
            ..Default::default()
        };
        let address = |t| Address { r#type: Some(t) };
        b.add(
            ADDRESS_TYPE_URL,
            "shop/web.shop.svc.cluster.local",
            &address(address::Type::Service(service)),
        );
        b.add(
            ADDRESS_TYPE_URL,
            "c//Pod/shop/web-0",
            &address(address::Type::Workload(workload(
                "c//Pod/shop/web-0",
                "a",
                1,
                true,
            ))),
        );
        b.add(
            ADDRESS_TYPE_URL,
            "c//Pod/shop/lone",
            &address(address::Type::Workload(workload(
                "c//Pod/shop/lone",
                lone_node,
                2,
                false,
            ))),
        );
        b.build()
    }

    /// A node's view as it is defined (see the module table): every service, every workload
    /// that backs one, and the node's own workloads, each also under the aliases it alone
    /// claims among them, the node's own workloads implicit; built from nothing shared.
    fn node_view_by_definition(snapshot: &Snapshot, node: &str) -> Snapshot {
        let index = AddressIndex::of(snapshot);
        let keep = |e: &AddressEntry| e.everywhere || e.node.as_deref() == Some(node);
        let addresses = snapshot.get_type(ADDRESS_TYPE_URL).expect("Addresses");
        let kept = addresses.filtered(|name, _| index.by_name.get(name).is_some_and(keep));
        let mut pairs = BTreeSet::new();
        for (name, entry) in index.by_name.iter().filter(|(_, e)| keep(e)) {
            pairs.extend(entry.aliases.iter().map(|a| (a.clone(), name.clone())));
        }
        let mut claims: HashMap<&str, usize> = HashMap::new();
        for (alias, _) in &pairs {
            *claims.entry(alias.as_str()).or_default() += 1;
        }
        let unique = pairs
            .iter()
            .filter(|(a, _)| claims[a.as_str()] == 1)
            .cloned();
        let own = index
            .by_name
            .iter()
            .filter(|(_, e)| e.node.as_deref() == Some(node));
        let kept = kept
            .with_aliases(unique)
            .with_implicit(own.map(|(name, _)| name.clone()));
        let view = Snapshot::new().with_type(ADDRESS_TYPE_URL, kept);
        match snapshot.get_type(AUTHORIZATION_TYPE_URL) {
            Some(policies) => view.with_type(AUTHORIZATION_TYPE_URL, policies.clone()),
            None => view,
        }
    }

    /// A mesh of services and workloads on nodes `a` to `c` whose addresses and host names
    /// are drawn from small sets, so that they collide, and may name another resource.
    fn colliding_mesh(services: &[(u8, u8)], workloads: &[(u8, bool, Vec<u8>)]) -> Snapshot {
        use meshkit_mesh::proto::workload::{NetworkAddress, Service, Workload};
        let mut b = SnapshotBuilder::new();
        b.declare(AUTHORIZATION_TYPE_URL).declare(ADDRESS_TYPE_URL);
        let hostnames = ["web.shop", "api.shop", "c//Pod/shop/w0", "shop/s1"];
        for (i, (ip, host)) in services.iter().enumerate() {
            let service = Service {
                name: format!("s{i}"),
                namespace: "shop".into(),
                hostname: hostnames[usize::from(*host) % hostnames.len()].into(),
                addresses: vec![NetworkAddress {
                    network: String::new(),
                    address: vec![10, 0, 0, *ip],
                    ..Default::default()
                }],
                ..Default::default()
            };
            let address = Address {
                r#type: Some(address::Type::Service(service)),
            };
            b.add(ADDRESS_TYPE_URL, &format!("shop/s{i}"), &address);
        }
        for (i, (node, backs, ips)) in workloads.iter().enumerate() {
            let uid = format!("c//Pod/shop/w{i}");
            let workload = Workload {
                uid: uid.clone(),
                node: ["a", "b", "c"][usize::from(*node) % 3].into(),
                addresses: ips.iter().map(|ip| vec![10, 0, 0, *ip]).collect(),
                services: if *backs {
                    [("shop/s0".to_owned(), Default::default())].into()
                } else {
                    Default::default()
                },
                ..Default::default()
            };
            let address = Address {
                r#type: Some(address::Type::Workload(workload)),
            };
            b.add(ADDRESS_TYPE_URL, &uid, &address);
        }
        b.build()
    }

    proptest::proptest! {
        /// Views built on the shared Addresses are the views as defined, aliases and
        /// versions included, whatever collides.
        #[test]
        fn node_views_on_the_shared_addresses_are_the_views_as_defined(
            services in proptest::collection::vec((0u8..6, 0u8..4), 0..4),
            workloads in proptest::collection::vec(
                (0u8..3, proptest::bool::ANY, proptest::collection::vec(0u8..6, 0..3)),
                0..8,
            ),
        ) {
            let snapshot = colliding_mesh(&services, &workloads);
            for node in ["a", "b", "c", "elsewhere"] {
                let view = XdsRole::Node(node.into()).view(&snapshot);
                let defined = node_view_by_definition(&snapshot, node);
                let (got, want) = (
                    view.get_type(ADDRESS_TYPE_URL).expect("Addresses"),
                    defined.get_type(ADDRESS_TYPE_URL).expect("Addresses"),
                );
                for alias in want.resources().keys().chain(["10.0.0.0", "/10.0.0.1", "web.shop"]) {
                    proptest::prop_assert_eq!(got.alias(alias), want.alias(alias));
                }
                proptest::prop_assert_eq!(&view, &defined, "node {}", node);
            }
        }
    }

    #[test]
    fn views_patched_in_place_are_the_views_built_anew() {
        let (healthy, unhealthy) = (1, 0);
        let old = mesh(unhealthy, "b");
        let index = AddressIndex::of(&old);
        let changed = mesh(healthy, "b");
        let changes = address_changes(&old, &changed, &index).expect("only statuses changed");
        assert_eq!(changes.len(), 2);
        let shared = put_held(&index.shared.addresses, &changes).expect("shared");
        for node in ["a", "b", "c"] {
            let role = XdsRole::Node(node.into());
            let view = patched(&role.view(&old), &changes, Some(shared.resources()));
            assert_eq!(view, role.view(&changed), "node {node}");
            // Node b's view is the shared Addresses and its lone workload; the others are
            // the shared ones alone, and hold them in the same memory.
            let addresses = view.get_type(ADDRESS_TYPE_URL).expect("Addresses");
            assert_eq!(addresses.resources().same(shared.resources()), node != "b");
        }
        // A workload that moves to another node changes who is sent it: views are built anew.
        assert!(address_changes(&old, &mesh(unhealthy, "a"), &index).is_none());
        // So does any change of another type.
        let mut b = SnapshotBuilder::new();
        b.add(AUTHORIZATION_TYPE_URL, "shop/deny", &Address::default());
        let policies = b.build();
        let other = mesh(healthy, "b").with_type(
            AUTHORIZATION_TYPE_URL,
            policies
                .get_type(AUTHORIZATION_TYPE_URL)
                .cloned()
                .unwrap_or_default(),
        );
        assert!(address_changes(&old, &other, &index).is_none());
    }
}
