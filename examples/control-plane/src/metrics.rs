//! The control plane's Prometheus metrics, with istiod's names where istiod has one.
//!
//! | family (samples) | type | labels | counts |
//! |---|---|---|---|
//! | `pilot_xds` | gauge | `version` | ADS clients connected now (streams whose node was accepted), by the client's version: its node metadata `ISTIO_VERSION`, else its `user_agent_version` (or build version), else `unknown` |
//! | `pilot_xds_pushes` (`pilot_xds_pushes_total`) | counter | `type` | responses sent on ADS streams, State of the World and Delta |
//! | `pilot_total_xds_rejects` (`pilot_total_xds_rejects_total`) | counter | `type` | NACKs: requests carrying an `error_detail` |
//! | `citadel_server_csr_count` (`..._total`) | counter | | CSRs the CA decided on (every call that got past the limit on calls in progress) |
//! | `citadel_server_success_cert_issuance_count` (`..._total`) | counter | | certificates issued |
//! | `citadel_server_authentication_failure_count` (`..._total`) | counter | | calls without a known bearer token |
//! | `citadel_server_csr_parsing_err_count` (`..._total`) | counter | | CSRs that do not parse, or whose signature does not verify |
//! | `citadel_server_id_extraction_err_count` (`..._total`) | counter | | CSRs without exactly one SPIFFE ID URI SAN |
//! | `citadel_server_csr_sign_err_count` (`..._total`) | counter | `error` (`CERT_GEN_ERROR`) | CSRs that could not be signed |
//! | `citadel_server_root_cert_expiry_timestamp` | gauge | | when the CA root expires, in Unix seconds |
//! | `meshkit_ca_requests_refused` (`..._total`) | counter | `reason` | CA calls refused: `unauthenticated`, `permission_denied` (identity not granted to the token, or in another trust domain), `invalid_csr`, `limit` (too many calls in progress, or a CSR beyond [`CaLimits::max_csr_bytes`](crate::ca::CaLimits::max_csr_bytes)), `sign_error` |
//! | `meshkit_manifest_loads` (`..._total`) | counter | `result` (`applied`, `rejected`) | loads of the manifest folder |
//! | `meshkit_manifest_errors` | gauge | | problems found by the latest load (0 when it was applied) |
//! | `meshkit_status_writes` (`..._total`) | counter | `kind` | statuses written to the API server ([`crate::status`]) |
//! | `meshkit_status_write_errors` (`..._total`) | counter | `kind` | status writes that failed (each is retried) |
//! | `meshkit_token_reviews` (`..._total`) | counter | `result` (`authenticated`, `refused`, `error`) | TokenReviews asked of the API server for ServiceAccount tokens ([`crate::service_accounts`]; a cached answer asks none) |
//! | `meshkit_kube_lists` (`..._total`) | counter | `kind` | full lists of a watched kind from the API server: the first, and each relist (a watch that expired, 410 Gone, or an API server that came back) |
//! | `meshkit_leader` | gauge | | 1 while this replica holds the Lease and writes status (always 1 without an election), else 0 |
//!
//! The `type` label is istiod's: `cds`, `eds`, `lds`, `rds`, `sds`, `ecds`, `nds`, `pcds`,
//! `bds`, `wds` (the workload API's `Address` and `Workload`), `wads` (`Authorization`); a
//! type without a short name that the control plane serves (Ingress, IngressClass) is
//! labelled with its type URL, as istiod does, and any other type URL a client names is
//! `other`, so that clients cannot grow the label set. Versions are kept to 32 distinct
//! values (then `other`), of at most 32 characters of `[A-Za-z0-9.+_-]` (else `invalid`).
//!
//! Counters are OpenMetrics counters: their samples end in `_total` (`pilot_xds_pushes_total`),
//! as the format requires; istiod's own exposition leaves the suffix out for some of them.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use meshkit_mesh::resources::{INGRESS_CLASS_TYPE_URL, INGRESS_TYPE_URL};
use meshkit_xds_server::RequestObserver;
use meshkit_xds_server::envoy::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use meshkit_xds_server::envoy_types::pb::envoy::config::core::v3::{Node, node};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Distinct `version` label values kept; later ones are counted as `other`.
const MAX_VERSIONS: usize = 32;
/// Longest `version` label value.
const MAX_VERSION_LEN: usize = 32;

/// Every metric of the control plane; clones share the values. [`ControlPlane`] makes one
/// and serves it on its admin endpoint; an embedder with its own registry calls
/// [`ControlPlaneMetrics::register`].
///
/// [`ControlPlane`]: crate::ControlPlane
#[derive(Debug, Clone, Default)]
pub struct ControlPlaneMetrics {
    xds: XdsMetrics,
    ca: CaMetrics,
    manifests: ManifestMetrics,
    status: StatusMetrics,
    service_accounts: ServiceAccountMetrics,
    kube: KubeMetrics,
    listeners: ListenerMetrics,
}

/// The fair shares of the ADS and CA listeners' connections
/// (`meshkit_connections_refused{listener,reason}`), read at each scrape.
#[derive(Debug, Clone, Default)]
pub(crate) struct ListenerMetrics {
    pub(crate) ads: crate::tls::ListenerShares,
    pub(crate) ca: crate::tls::ListenerShares,
}

impl prometheus_client::collector::Collector for ListenerMetrics {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        let mut family = encoder.encode_descriptor(
            "meshkit_connections_refused",
            "ADS and CA connections closed for the fair share of places among sources: at accept (source_share: the source holds its share; full: every place is held fairly), or open ones closed to give their place to a source holding fewer (evicted); tls_* for the places of TLS handshakes",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (listener, shares) in [("ads", &self.ads), ("ca", &self.ca)] {
            for (reason, count) in shares.counts() {
                let labels = [("listener", listener), ("reason", reason)];
                let metric = family.encode_family(&labels)?;
                prometheus_client::metrics::counter::ConstCounter::new(count).encode(metric)?;
            }
        }
        Ok(())
    }
}

/// The Kubernetes source's watches.
#[derive(Debug, Clone, Default)]
pub struct KubeMetrics {
    lists: Family<KindLabels, Counter>,
}

/// The ServiceAccount token reviews.
#[derive(Debug, Clone, Default)]
pub struct ServiceAccountMetrics {
    reviews: Family<ResultLabels, Counter>,
}

/// The status writer's metrics.
#[derive(Debug, Clone, Default)]
pub struct StatusMetrics {
    writes: Family<KindLabels, Counter>,
    errors: Family<KindLabels, Counter>,
    leader: Gauge,
}

/// The ADS metrics: connected clients, pushes, NACKs. It is the [`RequestObserver`] of the
/// ADS server.
#[derive(Debug, Clone, Default)]
pub struct XdsMetrics {
    clients: Family<VersionLabels, Gauge>,
    pushes: Family<TypeLabels, Counter>,
    rejects: Family<TypeLabels, Counter>,
    versions: Arc<Mutex<BTreeSet<String>>>,
}

/// The CA's metrics.
#[derive(Debug, Clone, Default)]
pub struct CaMetrics {
    csrs: Counter,
    issued: Counter,
    authentication_failures: Counter,
    parsing_errors: Counter,
    id_extraction_errors: Counter,
    sign_errors: Family<ErrorLabels, Counter>,
    refused: Family<ReasonLabels, Counter>,
    root_expiry: Gauge,
    token_file_reloads: Family<ResultLabels, Counter>,
}

/// The manifest folder's load results.
#[derive(Debug, Clone, Default)]
pub struct ManifestMetrics {
    loads: Family<ResultLabels, Counter>,
    errors: Gauge,
}

/// Why the CA refused a call: the `reason` label of `meshkit_ca_requests_refused`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CaRefusal {
    /// No bearer token, or an unknown one (`UNAUTHENTICATED`).
    Unauthenticated,
    /// The token may not request the CSR's identity, or the identity is in another trust
    /// domain (`PERMISSION_DENIED`).
    PermissionDenied,
    /// The CSR does not parse, does not verify or names no single SPIFFE ID.
    InvalidCsr,
    /// Too many calls in progress, or a CSR beyond the size limit.
    Limit,
    /// The CSR could not be signed.
    SignError,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct VersionLabels {
    version: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TypeLabels {
    r#type: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ErrorLabels {
    error: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

// === impl ControlPlaneMetrics ===

impl ControlPlaneMetrics {
    /// New metrics, all zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers every family in `registry` (see the [module](self) table for the names).
    pub fn register(&self, registry: &mut Registry) {
        self.xds.register(registry);
        self.ca.register(registry);
        self.manifests.register(registry);
        self.status.register(registry);
        self.service_accounts.register(registry);
        self.kube.register(registry);
        registry.register_collector(Box::new(self.listeners.clone()));
    }

    /// Connections of `listener` (`ads`, `ca`) closed for `reason` so far (see
    /// `meshkit_connections_refused`).
    pub fn connections_refused(&self, listener: &str, reason: &str) -> u64 {
        let shares = match listener {
            "ads" => &self.listeners.ads,
            "ca" => &self.listeners.ca,
            _ => return 0,
        };
        shares
            .counts()
            .into_iter()
            .find(|(r, _)| *r == reason)
            .map_or(0, |(_, n)| n)
    }

    pub(crate) fn listeners(&self) -> &ListenerMetrics {
        &self.listeners
    }

    /// The ADS metrics.
    pub fn xds(&self) -> &XdsMetrics {
        &self.xds
    }

    /// The CA metrics.
    pub fn ca(&self) -> &CaMetrics {
        &self.ca
    }

    /// The manifest metrics.
    pub fn manifests(&self) -> &ManifestMetrics {
        &self.manifests
    }

    /// The status writer's metrics.
    pub fn status(&self) -> &StatusMetrics {
        &self.status
    }

    /// The ServiceAccount token reviews.
    pub fn service_accounts(&self) -> &ServiceAccountMetrics {
        &self.service_accounts
    }

    /// The Kubernetes source's watches.
    pub fn kube(&self) -> &KubeMetrics {
        &self.kube
    }
}

// === impl KubeMetrics ===

impl KubeMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "meshkit_kube_lists",
            "Full lists of a watched kind from the API server",
            self.lists.clone(),
        );
    }

    /// Full lists of `kind` so far.
    pub fn lists(&self, kind: &'static str) -> u64 {
        self.lists.get_or_create(&KindLabels { kind }).get()
    }

    pub(crate) fn listed(&self, kind: &'static str) {
        self.lists.get_or_create(&KindLabels { kind }).inc();
    }
}

// === impl ServiceAccountMetrics ===

impl ServiceAccountMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "meshkit_token_reviews",
            "TokenReviews of ServiceAccount tokens asked of the API server, by result",
            self.reviews.clone(),
        );
    }

    /// TokenReviews with `result` (`authenticated`, `refused`, `error`) so far.
    pub fn reviews(&self, result: &'static str) -> u64 {
        self.reviews.get_or_create(&ResultLabels { result }).get()
    }

    pub(crate) fn reviewed(&self, result: &'static str) {
        self.reviews.get_or_create(&ResultLabels { result }).inc();
    }
}

// === impl StatusMetrics ===

impl StatusMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "meshkit_status_writes",
            "Statuses written to the API server, by kind",
            self.writes.clone(),
        );
        registry.register(
            "meshkit_status_write_errors",
            "Status writes that failed, by kind",
            self.errors.clone(),
        );
        registry.register(
            "meshkit_leader",
            "1 while this replica writes status",
            self.leader.clone(),
        );
    }

    /// Statuses of `kind` written so far.
    pub fn writes(&self, kind: &'static str) -> u64 {
        self.writes.get_or_create(&KindLabels { kind }).get()
    }

    /// Statuses written so far, of every kind.
    pub fn total_writes(&self) -> u64 {
        ["Ingress", "GatewayClass", "Gateway", "HTTPRoute"]
            .into_iter()
            .map(|kind| self.writes(kind))
            .sum()
    }

    /// Whether this replica writes status now.
    pub fn leading(&self) -> bool {
        self.leader.get() == 1
    }

    pub(crate) fn written(&self, kind: &'static str) {
        self.writes.get_or_create(&KindLabels { kind }).inc();
    }

    pub(crate) fn failed(&self, kind: &'static str) {
        self.errors.get_or_create(&KindLabels { kind }).inc();
    }

    pub(crate) fn set_leading(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }
}

// === impl XdsMetrics ===

impl XdsMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "pilot_xds",
            "Number of endpoints connected to this control plane using xDS",
            self.clients.clone(),
        );
        registry.register(
            "pilot_xds_pushes",
            "xDS responses sent, by type",
            self.pushes.clone(),
        );
        registry.register(
            "pilot_total_xds_rejects",
            "xDS responses rejected by clients (NACKs), by type",
            self.rejects.clone(),
        );
    }

    /// A client whose node was accepted: counted in `pilot_xds` until the returned gauge is
    /// given to [`XdsMetrics::disconnected`].
    pub(crate) fn connected(&self, node: &Node) -> Gauge {
        let version = self.version_label(node);
        let gauge = self
            .clients
            .get_or_create(&VersionLabels { version })
            .clone();
        gauge.inc();
        gauge
    }

    /// The end of a client [`XdsMetrics::connected`] counted.
    pub(crate) fn disconnected(gauge: &Gauge) {
        gauge.dec();
    }

    /// The `version` label of a node, bounded in length and in distinct values.
    fn version_label(&self, node: &Node) -> String {
        let version = client_version(node).unwrap_or_else(|| "unknown".to_owned());
        let valid = !version.is_empty()
            && version.len() <= MAX_VERSION_LEN
            && version
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._+-".contains(&b));
        if !valid {
            return "invalid".to_owned();
        }
        let mut seen = self.versions.lock().unwrap_or_else(|p| p.into_inner());
        if seen.contains(&version) {
            return version;
        }
        if seen.len() >= MAX_VERSIONS {
            return "other".to_owned();
        }
        seen.insert(version.clone());
        version
    }

    fn pushed(&self, type_url: &str) {
        self.pushes
            .get_or_create(&TypeLabels {
                r#type: xds_type_label(type_url).to_owned(),
            })
            .inc();
    }

    fn rejected(&self, type_url: &str) {
        self.rejects
            .get_or_create(&TypeLabels {
                r#type: xds_type_label(type_url).to_owned(),
            })
            .inc();
    }
}

impl RequestObserver for XdsMetrics {
    fn on_sotw_request(&self, request: &DiscoveryRequest) {
        if request.error_detail.is_some() {
            self.rejected(&request.type_url);
        }
    }

    fn on_delta_request(&self, request: &DeltaDiscoveryRequest) {
        if request.error_detail.is_some() {
            self.rejected(&request.type_url);
        }
    }

    fn on_sotw_response(&self, response: &DiscoveryResponse) {
        self.pushed(&response.type_url);
    }

    fn on_delta_response(&self, response: &DeltaDiscoveryResponse) {
        self.pushed(&response.type_url);
    }
}

/// The version a client says it runs: Istio's `ISTIO_VERSION` metadata, else Envoy's user
/// agent version.
fn client_version(node: &Node) -> Option<String> {
    use meshkit_xds_server::envoy_types::pb::google::protobuf::value::Kind;
    if let Some(Kind::StringValue(v)) = node
        .metadata
        .as_ref()
        .and_then(|m| m.fields.get("ISTIO_VERSION"))
        .and_then(|v| v.kind.as_ref())
    {
        return Some(v.clone());
    }
    match node.user_agent_version_type.as_ref()? {
        node::UserAgentVersionType::UserAgentVersion(v) => Some(v.clone()),
        node::UserAgentVersionType::UserAgentBuildVersion(b) => {
            let v = b.version.as_ref()?;
            Some(format!("{}.{}.{}", v.major_number, v.minor_number, v.patch))
        }
    }
}

/// istiod's metric label of a type URL (see the [module](self) documentation).
pub fn xds_type_label(type_url: &str) -> &str {
    if type_url == INGRESS_TYPE_URL || type_url == INGRESS_CLASS_TYPE_URL {
        return type_url;
    }
    let Some(name) = type_url.strip_prefix("type.googleapis.com/") else {
        return "other";
    };
    match name {
        "envoy.config.cluster.v3.Cluster" => "cds",
        "envoy.config.listener.v3.Listener" => "lds",
        "envoy.config.route.v3.RouteConfiguration" => "rds",
        "envoy.config.endpoint.v3.ClusterLoadAssignment" => "eds",
        "envoy.extensions.transport_sockets.tls.v3.Secret" => "sds",
        "envoy.config.core.v3.TypedExtensionConfig" => "ecds",
        "envoy.config.bootstrap.v3.Bootstrap" => "bds",
        "istio.networking.nds.v1.NameTable" => "nds",
        "istio.mesh.v1alpha1.ProxyConfig" => "pcds",
        "istio.workload.Address" | "istio.workload.Workload" => "wds",
        "istio.security.Authorization" => "wads",
        _ => "other",
    }
}

// === impl CaMetrics ===

impl CaMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "citadel_server_csr_count",
            "CSRs the CA decided on",
            self.csrs.clone(),
        );
        registry.register(
            "citadel_server_success_cert_issuance_count",
            "Certificates issued",
            self.issued.clone(),
        );
        registry.register(
            "citadel_server_authentication_failure_count",
            "CA calls without a known bearer token",
            self.authentication_failures.clone(),
        );
        registry.register(
            "citadel_server_csr_parsing_err_count",
            "CSRs that do not parse or whose signature does not verify",
            self.parsing_errors.clone(),
        );
        registry.register(
            "citadel_server_id_extraction_err_count",
            "CSRs without exactly one SPIFFE ID URI SAN",
            self.id_extraction_errors.clone(),
        );
        registry.register(
            "citadel_server_csr_sign_err_count",
            "CSRs that could not be signed",
            self.sign_errors.clone(),
        );
        registry.register(
            "citadel_server_root_cert_expiry_timestamp",
            "When the CA root certificate expires, in Unix seconds",
            self.root_expiry.clone(),
        );
        registry.register(
            "meshkit_ca_requests_refused",
            "CA calls refused, by reason",
            self.refused.clone(),
        );
        registry.register(
            "meshkit_token_file_reloads",
            "Changes of the token file read, by result (applied, refused: the last good grants stay)",
            self.token_file_reloads.clone(),
        );
    }

    /// Changes of the token file read with `result` (`applied`, `refused`) so far.
    pub fn token_file_reloads(&self, result: &'static str) -> u64 {
        self.token_file_reloads
            .get_or_create(&ResultLabels { result })
            .get()
    }

    pub(crate) fn token_file_reload(&self, applied: bool) {
        let result = if applied { "applied" } else { "refused" };
        self.token_file_reloads
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// A CSR reached the signer.
    pub(crate) fn csr(&self) {
        self.csrs.inc();
    }

    /// A certificate was issued.
    pub(crate) fn issued(&self) {
        self.issued.inc();
    }

    /// A CSR that does not parse (`id: false`) or names no single SPIFFE ID (`id: true`).
    pub(crate) fn bad_csr(&self, id: bool) {
        if id {
            self.id_extraction_errors.inc();
        } else {
            self.parsing_errors.inc();
        }
    }

    /// A call was refused for `reason`.
    pub(crate) fn refused(&self, reason: CaRefusal) {
        match reason {
            CaRefusal::Unauthenticated => {
                self.authentication_failures.inc();
            }
            CaRefusal::SignError => {
                self.sign_errors
                    .get_or_create(&ErrorLabels {
                        error: "CERT_GEN_ERROR".to_owned(),
                    })
                    .inc();
            }
            _ => {}
        }
        self.refused
            .get_or_create(&ReasonLabels {
                reason: reason.label(),
            })
            .inc();
    }

    /// Sets the root's expiry, in Unix seconds.
    pub(crate) fn set_root_expiry(&self, unix_seconds: i64) {
        self.root_expiry.set(unix_seconds);
    }
}

// === impl CaRefusal ===

impl CaRefusal {
    /// The `reason` label value.
    pub fn label(self) -> &'static str {
        match self {
            Self::Unauthenticated => "unauthenticated",
            Self::PermissionDenied => "permission_denied",
            Self::InvalidCsr => "invalid_csr",
            Self::Limit => "limit",
            Self::SignError => "sign_error",
        }
    }
}

// === impl ManifestMetrics ===

impl ManifestMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "meshkit_manifest_loads",
            "Loads of the manifest folder, by result",
            self.loads.clone(),
        );
        registry.register(
            "meshkit_manifest_errors",
            "Problems found by the latest load of the manifest folder",
            self.errors.clone(),
        );
    }

    /// A load that replaced what is served.
    pub(crate) fn applied(&self) {
        self.loads
            .get_or_create(&ResultLabels { result: "applied" })
            .inc();
        self.errors.set(0);
    }

    /// A load with `errors` problems, which changed nothing.
    pub(crate) fn rejected(&self, errors: usize) {
        self.loads
            .get_or_create(&ResultLabels { result: "rejected" })
            .inc();
        self.errors.set(i64::try_from(errors).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshkit_mesh::resources::ADDRESS_TYPE_URL;

    #[test]
    fn type_labels_are_istiods_and_bounded() {
        assert_eq!(
            xds_type_label("type.googleapis.com/envoy.config.cluster.v3.Cluster"),
            "cds"
        );
        assert_eq!(xds_type_label(ADDRESS_TYPE_URL), "wds");
        assert_eq!(
            xds_type_label("type.googleapis.com/istio.security.Authorization"),
            "wads"
        );
        assert_eq!(xds_type_label(INGRESS_TYPE_URL), INGRESS_TYPE_URL);
        assert_eq!(xds_type_label("type.googleapis.com/made.Up"), "other");
    }

    #[test]
    fn version_labels_are_bounded() {
        let m = XdsMetrics::default();
        let node = |v: &str| Node {
            user_agent_version_type: Some(node::UserAgentVersionType::UserAgentVersion(
                v.to_owned(),
            )),
            ..Default::default()
        };
        assert_eq!(m.version_label(&Node::default()), "unknown");
        assert_eq!(m.version_label(&node("1.24.0")), "1.24.0");
        assert_eq!(m.version_label(&node("a b")), "invalid");
        assert_eq!(m.version_label(&node(&"9".repeat(33))), "invalid");
        for i in 0..MAX_VERSIONS {
            m.version_label(&node(&format!("v{i}")));
        }
        assert_eq!(m.version_label(&node("late")), "other");
        assert_eq!(
            m.version_label(&node("1.24.0")),
            "1.24.0",
            "known ones stay"
        );
    }
}
