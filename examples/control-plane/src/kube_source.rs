//! The Kubernetes API server as the control plane's source: one watch per kind ([`KINDS`]),
//! the objects kept in memory as the API serves them, and on every change the same
//! [`ManifestSet`] the manifests folder gives, built from them.
//!
//! - A kind's objects are replaced whole by each full list (the first, and any relist after
//!   the watch's resource version expired), then kept current by its events.
//! - Nothing is served until every kind has been listed once: a control plane that started
//!   serving with Pods but no policies yet would open what the policies close.
//! - A kind the API server does not serve (a CRD that is not installed: its first list
//!   answers 404) counts as listed and empty; its watch keeps retrying with backoff, so a CRD
//!   installed later is picked up. A 404 after a kind has been listed (an API server
//!   restarting) changes nothing: its objects are kept until a list says otherwise.
//! - An object the model refuses is left out alone, with a warning (and an Event on it,
//!   [`crate::status`]), and the others are served. A policy (AuthorizationPolicy,
//!   PeerAuthentication) whose new version is refused stays enforced as it was last accepted,
//!   since leaving it out could open what it closes; a new policy the model refuses is left
//!   out, as istiod leaves out for ztunnel an AuthorizationPolicy it cannot convert
//!   (`action: CUSTOM` or `AUDIT`, which a CRD without Istio's validating webhook stores).
//! - An event that leaves an object as it was (a write of `resourceVersion` alone) changes
//!   nothing.
//! - Changes are gathered for [`KubeSourceConfig::settle`] (100 ms by default) before a
//!   snapshot is built, so a burst of events (a Deployment's Pods starting) makes one push.
//!   A change of Pods' `status` alone is handed on as such, for the model to take in place,
//!   and as soon as the last update is [`KubeSourceConfig::status_interval`] (10 ms) old: at
//!   once after a quiet spell, and never more than one per interval (istiod, with
//!   `PILOT_ENABLE_EDS_DEBOUNCE=false`, also pushes endpoint changes without waiting for a
//!   burst to end).
//! - Secrets are watched with the field selector `type=kubernetes.io/tls`: no other Secret
//!   reaches the control plane's memory.
//!
//! The client is built by [`client`], over rustls with the crypto provider the caller
//! chooses.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use kube::api::{Api, ApiResource, GroupVersionKind, ObjectMeta};
use kube::client::ConfigExt as _;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher;
use rustls::crypto::CryptoProvider;
use serde_json::Value;
use tokio::sync::{Notify, watch};

use crate::manifests::{ManifestError, ManifestErrors, ManifestSet};
use crate::metrics::KubeMetrics;
use crate::status::StatusConfig;

/// A kind the control plane watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    /// API group, empty for the core group.
    pub group: &'static str,
    /// Version watched.
    pub version: &'static str,
    /// Kind.
    pub kind: &'static str,
    /// Resource name (plural).
    pub plural: &'static str,
    /// Field selector of the watch, if any.
    pub fields: Option<&'static str>,
    /// Whether the control plane writes this kind's `status` ([`crate::status`]): a change
    /// of its status alone wakes the status writer, not a new model.
    pub status_written: bool,
}

/// Every kind the control plane reads from the API server.
pub const KINDS: &[Kind] = &[
    core("Namespace", "namespaces"),
    core("Node", "nodes"),
    core("Pod", "pods"),
    core("Service", "services"),
    Kind {
        fields: Some("type=kubernetes.io/tls"),
        ..core("Secret", "secrets")
    },
    kind("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices"),
    Kind {
        status_written: true,
        ..kind("networking.k8s.io", "v1", "Ingress", "ingresses")
    },
    kind("networking.k8s.io", "v1", "IngressClass", "ingressclasses"),
    Kind {
        status_written: true,
        ..kind(
            "gateway.networking.k8s.io",
            "v1",
            "GatewayClass",
            "gatewayclasses",
        )
    },
    Kind {
        status_written: true,
        ..kind("gateway.networking.k8s.io", "v1", "Gateway", "gateways")
    },
    Kind {
        status_written: true,
        ..kind("gateway.networking.k8s.io", "v1", "HTTPRoute", "httproutes")
    },
    kind(
        "gateway.networking.k8s.io",
        "v1",
        "ReferenceGrant",
        "referencegrants",
    ),
    kind(
        "security.istio.io",
        "v1",
        "AuthorizationPolicy",
        "authorizationpolicies",
    ),
    kind(
        "security.istio.io",
        "v1",
        "PeerAuthentication",
        "peerauthentications",
    ),
    kind(
        "networking.istio.io",
        "v1",
        "ServiceEntry",
        "serviceentries",
    ),
    kind(
        "networking.istio.io",
        "v1",
        "WorkloadEntry",
        "workloadentries",
    ),
];

/// The resource to write an object of `apiVersion` and `kind` to, and whether it is
/// namespaced, when its kind is one the control plane watches (at any version of its group:
/// a `networking.istio.io/v1beta1` ServiceEntry is written as `v1beta1`).
pub fn resource_of(api_version: &str, kind: &str) -> Option<(ApiResource, bool)> {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let watched = KINDS.iter().find(|k| k.group == group && k.kind == kind)?;
    let gvk = GroupVersionKind::gvk(group, version, kind);
    Some((
        ApiResource::from_gvk_with_plural(&gvk, watched.plural),
        watched.namespaced(),
    ))
}

// === impl Kind ===

impl Kind {
    /// `GROUP/VERSION`, or `VERSION` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The resource, for a dynamic [`Api`].
    pub fn api_resource(&self) -> ApiResource {
        let gvk = GroupVersionKind::gvk(self.group, self.version, self.kind);
        ApiResource::from_gvk_with_plural(&gvk, self.plural)
    }

    /// Whether its objects belong to a namespace.
    pub fn namespaced(&self) -> bool {
        !matches!(
            self.kind,
            "Namespace" | "Node" | "IngressClass" | "GatewayClass"
        )
    }
}

const fn core(kind: &'static str, plural: &'static str) -> Kind {
    Kind {
        group: "",
        version: "v1",
        kind,
        plural,
        fields: None,
        status_written: false,
    }
}

const fn kind(
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
) -> Kind {
    Kind {
        group,
        version,
        kind,
        plural,
        fields: None,
        status_written: false,
    }
}

/// How the control plane reads the API server.
#[derive(Clone)]
pub struct KubeSourceConfig {
    /// The client.
    pub client: kube::Client,
    /// How long changes are gathered before a snapshot is built. Default 100 ms.
    pub settle: Duration,
    /// A change of Pods' status alone is not gathered: it goes on as soon as the last update
    /// is this old. Default 10 ms: it is taken in place, at a cost in proportion to the
    /// change, and a node proxy waits for it when a Pod turns Ready.
    pub status_interval: Duration,
    /// What status is written back, and who writes it ([`crate::status`]). Default
    /// [`StatusConfig::default`]: every status, by this control plane alone; `None` writes
    /// nothing.
    pub status: Option<StatusConfig>,
}

impl std::fmt::Debug for KubeSourceConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeSourceConfig")
            .field("settle", &self.settle)
            .field("status_interval", &self.status_interval)
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

impl KubeSourceConfig {
    /// Reads through `client`, with the default settle time.
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            settle: Duration::from_millis(100),
            status_interval: Duration::from_millis(10),
            status: Some(StatusConfig::default()),
        }
    }

    /// Writes status as `status` says.
    pub fn with_status(mut self, status: StatusConfig) -> Self {
        self.status = Some(status);
        self
    }

    /// Writes no status.
    pub fn without_status(mut self) -> Self {
        self.status = None;
        self
    }
}

/// Why a client could not be made: which part of the configuration, and why.
#[derive(Debug, thiserror::Error)]
#[error("unusable Kubernetes client configuration: {what}")]
pub struct ClientError {
    what: &'static str,
    #[source]
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl ClientError {
    /// The part of the configuration: `the API server's CA`, `the client certificate`,
    /// `the client key`, `the TLS versions`, `the TLS server name` or `the credentials`.
    pub fn what(&self) -> &'static str {
        self.what
    }
}

/// A client for `config` over rustls with `provider`: the API server's CA from the
/// configuration (required: no system roots, and `insecure-skip-tls-verify` is refused), its
/// TLS server name, the client certificate when it has one, and its token, token file or
/// exec plugin (a token file is re-read as it rotates).
///
/// # Errors
///
/// When the configuration's CA, client certificate or credentials cannot be used.
pub fn client(
    config: &kube::Config,
    provider: Arc<CryptoProvider>,
) -> Result<kube::Client, ClientError> {
    use rustls_pki_types::pem::PemObject as _;
    fn bad<E: Into<Box<dyn std::error::Error + Send + Sync>>>(
        what: &'static str,
    ) -> impl FnOnce(E) -> ClientError {
        move |e| ClientError {
            what,
            source: e.into(),
        }
    }
    if config.accept_invalid_certs {
        return Err(bad("the API server's CA")(
            "insecure-skip-tls-verify is not supported: name the API server's CA",
        ));
    }
    let mut roots = rustls::RootCertStore::empty();
    for der in config.root_cert.iter().flatten() {
        roots
            .add(rustls_pki_types::CertificateDer::from(der.clone()))
            .map_err(bad("the API server's CA"))?;
    }
    if roots.is_empty() {
        return Err(bad("the API server's CA")(
            "the configuration names no CA certificate (certificate-authority or certificate-authority-data)",
        ));
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(bad("the TLS versions"))?
        .with_root_certificates(roots);
    let auth = &config.auth_info;
    let cert = pem_of(
        auth.client_certificate_data.as_deref(),
        auth.client_certificate.as_deref(),
    )
    .map_err(bad("the client certificate"))?;
    let key = pem_of(
        auth.client_key_data
            .as_ref()
            .map(secrecy::ExposeSecret::expose_secret),
        auth.client_key.as_deref(),
    )
    .map_err(bad("the client key"))?;
    let tls = match (cert, key) {
        (Some(cert), Some(key)) => {
            let chain = rustls_pki_types::CertificateDer::pem_slice_iter(&cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(bad("the client certificate"))?;
            let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(&key)
                .map_err(bad("the client key"))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(bad("the client certificate"))?
        }
        (None, None) => builder.with_no_client_auth(),
        (Some(_), None) => return Err(bad("the client key")("a certificate without its key")),
        (None, Some(_)) => {
            return Err(bad("the client certificate")(
                "a key without its certificate",
            ));
        }
    };
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    let mut https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = rustls_pki_types::ServerName::try_from(name.clone())
            .map_err(bad("the TLS server name"))?;
        https = https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let https = https.enable_http1().wrap_connector(http);
    let hyper = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, kube::client::Body>(https);
    let auth = config.auth_layer().map_err(bad("the credentials"))?;
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(auth)
        .map_err(tower::BoxError::from)
        .service(hyper);
    Ok(kube::Client::new(service, config.default_namespace.clone()))
}

/// PEM from a kubeconfig's base64 `*-data` field, else from the file it names.
fn pem_of(
    data: Option<&str>,
    file: Option<&str>,
) -> Result<Option<Vec<u8>>, Box<dyn std::error::Error + Send + Sync>> {
    use base64::Engine as _;
    if let Some(data) = data {
        let compact: String = data.split_whitespace().collect();
        return Ok(Some(
            base64::engine::general_purpose::STANDARD.decode(compact)?,
        ));
    }
    match file {
        Some(path) => Ok(Some(
            std::fs::read(path).map_err(|e| format!("{path}: {e}"))?,
        )),
        None => Ok(None),
    }
}

/// The objects of every kind, as the API serves them, and which kinds are listed.
#[derive(Default)]
struct Store {
    objects: BTreeMap<&'static str, BTreeMap<(String, String), Stored>>,
    listed: BTreeMap<&'static str, bool>,
    /// A kind's objects during a (re)list, swapped in when it ends.
    relisting: BTreeMap<&'static str, BTreeMap<(String, String), Stored>>,
    /// What changed since the last model was handed on.
    dirty: Dirty,
}

/// What changed in the store since the last model: Pods whose `status` alone changed, or
/// anything else.
#[derive(Debug, Default)]
struct Dirty {
    /// Something other than a Pod's status changed: the model is built anew.
    full: bool,
    /// Pods (`namespace`, `name`) of which only `status` changed.
    pod_statuses: BTreeSet<(String, String)>,
}

/// What the source hands on after a settled burst of changes.
#[derive(Debug)]
pub(crate) enum Update {
    /// The model of everything stored, built anew.
    Full(Box<Result<ManifestSet, ManifestErrors>>),
    /// Only the `status` of these Pods changed since the last update, each as the model
    /// reads it. The receiver may take them in place of a new model, or answer that it
    /// cannot, and is then handed [`Update::Full`].
    PodStatuses(Vec<k8s_openapi::api::core::v1::Pod>),
}

/// The watches of every kind; [`Watches::changed`] wakes on each change of the model,
/// [`StatusReader::changed`] on each change of a status the control plane writes.
pub(crate) struct Watches {
    store: Arc<Mutex<Store>>,
    /// Each policy's last version the model accepted, by origin.
    last_good: Mutex<BTreeMap<String, Value>>,
    changed: Arc<Notify>,
    status_changed: Arc<Notify>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// The `status` of the objects whose status the control plane writes, as the API server
/// serves it now.
#[derive(Clone)]
pub(crate) struct StatusReader {
    store: Arc<Mutex<Store>>,
    changed: Arc<Notify>,
}

/// What an event changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    /// Nothing (a write of `resourceVersion` alone).
    None,
    /// Only the `status` of a kind whose status the control plane writes.
    Status,
    /// What the model is built from.
    Model,
}

impl Watches {
    /// Starts a watch of each of [`KINDS`].
    pub(crate) fn start(client: &kube::Client, metrics: KubeMetrics) -> Self {
        let store = Arc::new(Mutex::new(Store::default()));
        let changed = Arc::new(Notify::new());
        let status_changed = Arc::new(Notify::new());
        let tasks = KINDS
            .iter()
            .map(|kind| {
                tokio::spawn(watch_kind(
                    client.clone(),
                    *kind,
                    Arc::clone(&store),
                    [Arc::clone(&changed), Arc::clone(&status_changed)],
                    metrics.clone(),
                ))
            })
            .collect();
        Self {
            store,
            last_good: Mutex::new(BTreeMap::new()),
            changed,
            status_changed,
            tasks,
        }
    }

    /// The statuses, for the status writer.
    pub(crate) fn statuses(&self) -> StatusReader {
        StatusReader {
            store: Arc::clone(&self.store),
            changed: Arc::clone(&self.status_changed),
        }
    }

    /// Waits for the next change.
    pub(crate) async fn changed(&self) {
        self.changed.notified().await;
    }

    /// The kinds not listed yet; empty once every kind has been.
    pub(crate) fn unlisted(&self) -> Vec<&'static str> {
        let store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        KINDS
            .iter()
            .map(|k| k.kind)
            .filter(|k| !store.listed.get(k).copied().unwrap_or(false))
            .collect()
    }

    /// Whether what changed since the last model is some Pods' status and nothing else.
    fn pod_statuses_alone(&self) -> bool {
        let store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        !store.dirty.full && !store.dirty.pod_statuses.is_empty()
    }

    /// What changed since the last call, and nothing from then on.
    fn take_dirty(&self) -> Dirty {
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut store.dirty)
    }

    /// The stored Pods `keys`, each as the model reads it; `None` when one is no longer
    /// stored or the model would not take it alone (as [`ManifestSet::add_object`] says),
    /// and for no key at all.
    fn pods(
        &self,
        keys: &BTreeSet<(String, String)>,
    ) -> Option<Vec<k8s_openapi::api::core::v1::Pod>> {
        if keys.is_empty() {
            return None;
        }
        let stored: Vec<(String, Stored)> = {
            let store = self.store.lock().unwrap_or_else(|e| e.into_inner());
            let pods = store.objects.get("Pod")?;
            keys.iter()
                .map(|key| Some((format!("Pod {}/{}", key.0, key.1), pods.get(key)?.clone())))
                .collect::<Option<_>>()?
        };
        let mut set = ManifestSet::default();
        for (origin, pod) in stored {
            if !set.add_object(&origin, pod.value()).is_empty() {
                tracing::debug!(%origin, "a Pod the model refuses: building a new model");
                return None;
            }
        }
        if !set.warnings.is_empty() {
            tracing::debug!(warnings = ?set.warnings, "Pods with warnings: building a new model");
            return None;
        }
        Some(set.pods)
    }

    /// The model of what is stored now. The objects it refuses are left out, each with a
    /// warning; a policy it refuses is kept in the version it last accepted, if any.
    pub(crate) fn manifest_set(&self) -> Result<ManifestSet, ManifestErrors> {
        // Copied out under the lock and parsed after it: the watches go on meanwhile.
        let objects: Vec<(&'static str, String, Stored)> = {
            let store = self.store.lock().unwrap_or_else(|e| e.into_inner());
            KINDS
                .iter()
                .flat_map(|kind| {
                    store.objects.get(kind.kind).into_iter().flatten().map(
                        |((namespace, name), object)| {
                            let origin = if namespace.is_empty() {
                                format!("{} {name}", kind.kind)
                            } else {
                                format!("{} {namespace}/{name}", kind.kind)
                            };
                            (kind.kind, origin, object.clone())
                        },
                    )
                })
                .collect()
        };
        let mut set = ManifestSet::default();
        let mut last_good = self.last_good.lock().unwrap_or_else(|e| e.into_inner());
        let mut present = BTreeSet::new();
        for (kind, origin, object) in objects {
            let object = object.value();
            let policy = matches!(kind, "AuthorizationPolicy" | "PeerAuthentication");
            let refused = if policy {
                present.insert(origin.clone());
                let refused = set.add_object(&origin, object.clone());
                if refused.is_empty() {
                    last_good.insert(origin, object);
                    continue;
                }
                refused
            } else {
                // Only a policy's accepted version is kept: anything else goes in as it is.
                let refused = set.add_object(&origin, object);
                if refused.is_empty() {
                    continue;
                }
                refused
            };
            // A policy whose new version is refused stays enforced as it was last accepted:
            // leaving it out could open what it closes.
            let kept = policy
                && last_good
                    .get(&origin)
                    .is_some_and(|good| set.add_object(&origin, good.clone()).is_empty());
            let refused: Vec<ManifestError> = refused
                .into_iter()
                .map(|mut e| {
                    e.message.push_str(if kept {
                        "; the last accepted version of it stays enforced"
                    } else {
                        "; left out"
                    });
                    e
                })
                .collect();
            set.warnings.extend(refused.iter().cloned());
            set.refused.extend(refused);
        }
        last_good.retain(|origin, _| present.contains(origin));
        Ok(set)
    }
}

impl StatusReader {
    /// Waits for the next change of a status.
    pub(crate) async fn changed(&self) {
        self.changed.notified().await;
    }

    /// Every stored `kind` object, as `(namespace, name, status)`.
    pub(crate) fn all(&self, kind: &str) -> Vec<(String, String, Value)> {
        let store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        store
            .objects
            .get(kind)
            .into_iter()
            .flatten()
            .map(|((ns, name), object)| (ns.clone(), name.clone(), object.status()))
            .collect()
    }

    /// The `status` of the `kind` object `namespace/name` (`Value::Null` when it has none);
    /// `None` when no such object is stored.
    pub(crate) fn status(&self, kind: &str, namespace: &str, name: &str) -> Option<Value> {
        let store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        let object = store
            .objects
            .get(kind)?
            .get(&(namespace.to_owned(), name.to_owned()))?;
        Some(object.status())
    }
}

impl Drop for Watches {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Keeps `kind`'s objects in `store` current, for as long as the task runs.
async fn watch_kind(
    client: kube::Client,
    kind: Kind,
    store: Arc<Mutex<Store>>,
    [changed, status_changed]: [Arc<Notify>; 2],
    metrics: KubeMetrics,
) {
    let api: Api<RawObject> = Api::all_with(client, &kind.api_resource());
    let mut config = watcher::Config::default();
    if let Some(fields) = kind.fields {
        config = config.fields(fields);
    }
    let mut events = std::pin::pin!(watcher(api, config).default_backoff());
    let mut absent_logged = false;
    while let Some(event) = events.next().await {
        let mut s = store.lock().unwrap_or_else(|e| e.into_inner());
        match event {
            Ok(watcher::Event::Init) => {
                s.relisting.insert(kind.kind, BTreeMap::new());
            }
            Ok(watcher::Event::InitApply(object)) => {
                let (key, value) = entry(&kind, object);
                let stored = Stored::of(&value);
                s.relisting
                    .entry(kind.kind)
                    .or_default()
                    .insert(key, stored);
            }
            Ok(watcher::Event::InitDone) => {
                let objects = s.relisting.remove(kind.kind).unwrap_or_default();
                s.objects.insert(kind.kind, objects);
                s.listed.insert(kind.kind, true);
                s.dirty.full = true;
                absent_logged = false;
                drop(s);
                metrics.listed(kind.kind);
                changed.notify_one();
                if kind.status_written {
                    status_changed.notify_one();
                }
            }
            Ok(watcher::Event::Apply(object)) => {
                let (key, value) = entry(&kind, object);
                let stored = Stored::of(&value);
                let objects = s.objects.entry(kind.kind).or_default();
                // Parsed once, and only when its text differs.
                let old = match objects.get(&key) {
                    Some(old) if *old == stored => Some(None),
                    Some(old) => Some(Some(old.value())),
                    None => None,
                };
                let change = match &old {
                    None => Change::Model,
                    Some(None) => Change::None,
                    Some(Some(old)) => change_of(&kind, Some(old), &value),
                };
                if change == Change::Model {
                    let status_alone = kind.kind == "Pod"
                        && matches!(&old, Some(Some(old)) if same_but_status(old, &value));
                    if status_alone {
                        s.dirty.pod_statuses.insert(key.clone());
                    } else {
                        s.dirty.full = true;
                    }
                }
                if change != Change::None {
                    s.objects.entry(kind.kind).or_default().insert(key, stored);
                }
                drop(s);
                match change {
                    Change::None => {}
                    Change::Status => status_changed.notify_one(),
                    Change::Model => changed.notify_one(),
                }
            }
            Ok(watcher::Event::Delete(object)) => {
                let (key, _) = entry(&kind, object);
                if s.objects
                    .entry(kind.kind)
                    .or_default()
                    .remove(&key)
                    .is_some()
                {
                    s.dirty.full = true;
                    drop(s);
                    changed.notify_one();
                }
            }
            Err(watcher::Error::InitialListFailed(kube::Error::Api(status)))
                if status.code == 404 =>
            {
                // Not served (a CRD not installed): listed, and empty, until it is.
                if !absent_logged && !s.listed.get(kind.kind).copied().unwrap_or(false) {
                    tracing::warn!(
                        kind = kind.kind,
                        group = kind.group,
                        "the API server does not serve this kind; reading none until it does"
                    );
                    absent_logged = true;
                }
                // Once listed, a 404 is more likely an API server restarting than a CRD
                // removed: what was read stays until a list says otherwise.
                if !s.listed.get(kind.kind).copied().unwrap_or(false) {
                    s.listed.insert(kind.kind, true);
                    s.dirty.full = true;
                    drop(s);
                    changed.notify_one();
                }
            }
            Err(error) => {
                drop(s);
                tracing::warn!(kind = kind.kind, error = %error, "watch failed; retrying with backoff");
            }
        }
    }
}

/// What replacing `old` with `new` changes: a status the control plane writes is not part
/// of the model, so a status write does not rebuild it. The same fields in another order
/// change nothing.
fn change_of(kind: &Kind, old: Option<&Value>, new: &Value) -> Change {
    let Some(old) = old else {
        return Change::Model;
    };
    if old == new {
        return Change::None;
    }
    if kind.status_written && same_but_status(old, new) {
        Change::Status
    } else {
        Change::Model
    }
}

/// Whether two objects are the same but for their `status` (in whatever order their
/// fields come: a list and a watch event need not give them in the same order).
fn same_but_status(a: &Value, b: &Value) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a == b;
    };
    let fields = |o: &serde_json::Map<String, Value>| o.keys().filter(|k| *k != "status").count();
    fields(a) == fields(b)
        && a.iter()
            .filter(|(k, _)| *k != "status")
            .all(|(k, v)| b.get(k) == Some(v))
}

/// An object as the store keeps it: its JSON text, compact. Parsed, an object takes several
/// times the memory its text does, and the store holds every object of every kind read; it
/// is parsed again when it is read, which is when a model is built or a change compared.
#[derive(Clone, Debug, PartialEq)]
struct Stored(Box<str>);

impl Stored {
    fn of(value: &Value) -> Self {
        Self(value.to_string().into_boxed_str())
    }

    fn value(&self) -> Value {
        // The text is what serde_json wrote: it parses.
        serde_json::from_str(&self.0).unwrap_or(Value::Null)
    }

    /// Its `status`; `Value::Null` when it has none.
    fn status(&self) -> Value {
        match self.value() {
            Value::Object(mut map) => map.remove("status").unwrap_or(Value::Null),
            _ => Value::Null,
        }
    }
}

/// An object as the API server sends it: parsed once into a JSON value, with its metadata
/// read from it for the watcher (which tracks `resourceVersion`). The store keeps the value.
#[derive(Clone, Debug)]
struct RawObject {
    metadata: ObjectMeta,
    value: Value,
}

impl<'de> serde::Deserialize<'de> for RawObject {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let value = Value::deserialize(d)?;
        let metadata = match value.get("metadata") {
            Some(meta) => ObjectMeta::deserialize(meta).map_err(D::Error::custom)?,
            None => ObjectMeta::default(),
        };
        Ok(Self { metadata, value })
    }
}

impl kube::Resource for RawObject {
    type DynamicType = ApiResource;
    type Scope = kube::core::DynamicResourceScope;

    fn group(dt: &ApiResource) -> std::borrow::Cow<'_, str> {
        dt.group.as_str().into()
    }

    fn version(dt: &ApiResource) -> std::borrow::Cow<'_, str> {
        dt.version.as_str().into()
    }

    fn kind(dt: &ApiResource) -> std::borrow::Cow<'_, str> {
        dt.kind.as_str().into()
    }

    fn api_version(dt: &ApiResource) -> std::borrow::Cow<'_, str> {
        dt.api_version.as_str().into()
    }

    fn plural(dt: &ApiResource) -> std::borrow::Cow<'_, str> {
        dt.plural.as_str().into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The annotation `kubectl apply` keeps the whole object in.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The store's key and value of an object: `apiVersion` and `kind` set (list items come
/// without them); `managedFields` and kubectl's last applied configuration left out (nothing
/// reads them, and they are often the larger part of an object), and `resourceVersion` (it
/// changes with every write, a status write too, and nothing served depends on it); a Pod
/// trimmed to what the model reads of it ([`crate::ambient::trim_pod`]).
fn entry(kind: &Kind, object: RawObject) -> ((String, String), Value) {
    let RawObject {
        metadata,
        mut value,
    } = object;
    let key = (
        metadata.namespace.unwrap_or_default(),
        metadata.name.unwrap_or_default(),
    );
    if let Value::Object(map) = &mut value {
        map.insert("apiVersion".into(), Value::String(kind.api_version()));
        map.insert("kind".into(), Value::String(kind.kind.to_owned()));
        if let Some(Value::Object(meta)) = map.get_mut("metadata") {
            meta.remove("managedFields");
            meta.remove("resourceVersion");
            if let Some(Value::Object(annotations)) = meta.get_mut("annotations") {
                annotations.remove(LAST_APPLIED);
            }
        }
    }
    if kind.kind == "Pod" {
        crate::ambient::trim_pod(&mut value);
    }
    (key, value)
}

/// Runs the source: waits until every kind is listed, then hands `apply` a new model after
/// each settled burst of changes, until `stop` says so.
pub(crate) async fn run(
    config: KubeSourceConfig,
    watches: Watches,
    mut apply: impl FnMut(Update) -> bool,
    mut stop: watch::Receiver<bool>,
) {
    let mut waiting_logged = false;
    // When the last update was handed on.
    let mut last: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            () = watches.changed() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        // A change of Pods' status alone goes on as soon as the last update is a status
        // interval old: taken in place, it costs little, and it is what a node proxy waits for
        // when a Pod turns Ready. Any other change waits a settle time for the rest of its
        // burst.
        let wait = if watches.pod_statuses_alone() {
            last.map_or(Duration::ZERO, |at| {
                config.status_interval.saturating_sub(at.elapsed())
            })
        } else {
            config.settle
        };
        if !wait.is_zero() {
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
        let unlisted = watches.unlisted();
        if !unlisted.is_empty() {
            if !waiting_logged {
                tracing::info!(?unlisted, "waiting for the first list of every kind");
                waiting_logged = true;
            }
            continue;
        }
        let dirty = watches.take_dirty();
        if !dirty.full && dirty.pod_statuses.is_empty() {
            // A wake-up left from changes that the last model already holds.
            continue;
        }
        last = Some(tokio::time::Instant::now());
        if !dirty.full
            && let Some(pods) = watches.pods(&dirty.pod_statuses)
            && apply(Update::PodStatuses(pods))
        {
            continue;
        }
        apply(Update::Full(Box::new(watches.manifest_set())));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_change_of_status_alone_is_told_whatever_the_order_of_fields() {
        let listed =
            json!({"metadata": {"name": "a"}, "spec": {"x": 1}, "status": {"ready": true}});
        let mut event = serde_json::Map::new();
        event.insert("status".into(), json!({"ready": false}));
        event.insert("spec".into(), json!({"x": 1}));
        event.insert("metadata".into(), json!({"name": "a"}));
        let event = Value::Object(event);
        assert!(same_but_status(&listed, &event));
        let pods = KINDS
            .iter()
            .find(|k| k.kind == "Pod")
            .copied()
            .expect("Pods");
        let gateways = KINDS
            .iter()
            .find(|k| k.kind == "Gateway")
            .copied()
            .expect("Gateways");
        assert_eq!(change_of(&gateways, Some(&listed), &event), Change::Status);
        // A Pod's status is part of the model.
        assert_eq!(change_of(&pods, Some(&listed), &event), Change::Model);
        // The same fields in another order change nothing, though their text differs.
        let same: Value = serde_json::from_str(
            r#"{"status": {"ready": true}, "spec": {"x": 1}, "metadata": {"name": "a"}}"#,
        )
        .expect("JSON");
        assert_ne!(Stored::of(&listed), Stored::of(&same));
        assert_eq!(change_of(&pods, Some(&listed), &same), Change::None);
        let stored = Stored::of(&listed);
        assert_eq!(stored.value(), listed);
        assert_eq!(stored.status(), json!({"ready": true}));
        let respec =
            json!({"metadata": {"name": "a"}, "spec": {"x": 2}, "status": {"ready": true}});
        assert!(!same_but_status(&listed, &respec));
        let relabel =
            json!({"metadata": {"name": "a"}, "spec": {"x": 1}, "extra": 1, "status": {}});
        assert!(!same_but_status(&listed, &relabel));
    }
}
