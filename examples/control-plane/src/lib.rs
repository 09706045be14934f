//! meshkit's control plane: Kubernetes objects in, ADS and certificates out.
//!
//! - Two sources of one model ([`Source`]): [`kube_source`] watches a Kubernetes API server;
//!   [`manifests`] reads a folder of Kubernetes and Istio manifests, with errors naming
//!   file, document and field. Both give a [`manifests::ManifestSet`].
//! - [`ambient`]: the workloads and services of the mesh, derived from Pods, Services,
//!   EndpointSlices, ServiceEntries and WorkloadEntries as istiod's ambient index derives
//!   them.
//! - [`translate`]: turns them into a [`Snapshot`]: Istio workload `Address` resources for node
//!   proxies, the Ingress objects for meshkit's gateway, and Envoy LDS/RDS/CDS/EDS/SDS so an
//!   unmodified Envoy can be the gateway.
//! - ADS: meshkit-xds-server's snapshot-cache server (SotW and Delta), pushing only what
//!   changed; the workload API types come from meshkit-mesh.
//! - [`status`]: with Kubernetes, the status of the Ingresses, GatewayClasses, Gateways and
//!   HTTPRoutes meshkit serves, written back only when it differs, by the replica that holds
//!   the [`leader`] Lease.
//! - [`ca`]: `IstioCertificateService/CreateCertificate` with bootstrap-token authorization,
//!   signing with meshkit-identity's [`CaSigner`].
//! - [`metrics`]: Prometheus metrics with istiod's names (`pilot_xds`, `pilot_xds_pushes`,
//!   `pilot_total_xds_rejects`, `citadel_server_*`), served with readiness, a config dump
//!   and the log filter by meshkit-admin's [`Admin`] ([`ControlPlane::admin`]).
//!
//! [`ControlPlane::start`] runs all of it: it reads the source, serves ADS and the CA, and
//! follows changes: the API server's watch events (gathered for 100 ms), or the folder
//! (polled every 200 ms by default; a change is loaded once two polls in a row see the same
//! contents). A folder load with any error changes nothing that is served; the errors are
//! logged and published in [`LoadStatus`]. From the API, an object the model refuses is left
//! out alone, with a warning (and an Event on it), and the rest is served.
//!
//! # Admin endpoint
//!
//! With [`ControlPlaneConfig::with_admin_addr`] (the `control-plane` binary's
//! `--admin-addr`, default `127.0.0.1:15014`, istiod's monitoring port) the control plane
//! serves, on that address and before it binds anything else:
//!
//! | path | answer |
//! |---|---|
//! | `/healthz/ready` | `200` once the manifests were loaded once without error, the serving certificate exists (TLS) and the ADS and CA listeners are bound; `503 not ready: waiting for ...` with what is missing otherwise, and from the start of [`ControlPlane::shutdown`] on |
//! | `/metrics`, `/stats/prometheus` | the [`metrics`], build info and process metrics (OpenMetrics text) |
//! | `/config_dump` | JSON: listeners; the manifests' load status (errors, and warnings: what was left out or cannot be enforced as written), with the Gateway API status conditions (each HTTPRoute's `Accepted` and `ResolvedRefs` per parent, each Gateway listener's attached routes and conditions); per type URL, the snapshot's version and each resource's name and version (never its contents); the CA root's subject and validity; the serving certificate's names and validity; per token, the identities and xDS role it grants (never the token) |
//! | `/logging?level=FILTER` | sets the log filter, when [`ControlPlaneConfig::with_log_filter`] gave the means |
//!
//! Without an address nothing more is bound: an embedding service mounts
//! [`Admin::handle`] of [`ControlPlane::admin`] on a server of its own.
//!
//! ```no_run
//! use meshkit_control_plane::{ControlPlane, ControlPlaneConfig};
//! use meshkit_control_plane::ca::TokenGrants;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let grants = TokenGrants::new().grant("node-a-token", "spiffe://cluster.local/ns/shop/*")?;
//! let config = ControlPlaneConfig::new("examples/demo/manifests").with_grants(grants);
//! let cp = ControlPlane::start(config).await?;
//! println!("ADS on {}, CA on {}", cp.ads_addr(), cp.ca_addr());
//! cp.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! # Feature flags
//!
//! - `cli` (default): the `control-plane` binary and what only it needs (argument parsing,
//!   logging, its allocator). Embedders turn it off with `default-features = false`.
//! - `aws-lc-rs`: the binary with aws-lc-rs as its crypto provider.
//!
//! # Stability
//!
//! Pre-1.0: the API may change between minor versions.

// docs.rs builds with `--cfg docsrs`: items behind a feature show it.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod access;
mod admin;
pub mod ambient;
pub mod ca;
pub mod gateway_api;
pub mod kube_source;
pub mod leader;
pub mod manifests;
pub mod metrics;
pub mod policy;
pub mod service_accounts;
mod shares;
pub mod status;
pub mod tls;
pub mod token_file;
pub mod translate;

use std::collections::BTreeMap;
use std::hash::Hasher;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use meshkit_identity::TrustDomain;
use meshkit_mesh::resources::ADDRESS_TYPE_URL;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use ca::{CaLimits, TokenGrants, TokenSigner};
use manifests::{ManifestError, ManifestSet};
pub use meshkit_admin::{Admin, LogFilter, Readiness};
use meshkit_admin::{Condition, Registry};
use meshkit_identity::{CaLoadError, CaSigner};
use meshkit_xds_server::{AdsServer, ServerConfig, Snapshot, SnapshotCache};
use metrics::{ControlPlaneMetrics, ManifestMetrics};
use tls::{ServingTls, TlsSetupError};
use translate::TranslateOptions;

/// Where the CA's root comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaSource {
    /// A new self-signed root, generated at start.
    Generate,
    /// A PEM CA certificate (a root, or an intermediate followed by its issuers up to the
    /// root) and its PEM private key, which must exist.
    Files {
        /// The CA certificate (chain).
        cert: PathBuf,
        /// Its private key.
        key: PathBuf,
    },
    /// As [`CaSource::Files`] when both files exist; when neither does, a new root is
    /// generated and written there (the key with mode 0600), so that restarts keep the mesh's
    /// trust bundle.
    LoadOrGenerate {
        /// The CA certificate (chain).
        cert: PathBuf,
        /// Its private key.
        key: PathBuf,
    },
}

/// Why [`ControlPlane::start`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// A listener could not be bound.
    #[error("cannot listen for {what} on {addr}")]
    Bind {
        /// Which listener: `ADS`, `the CA` or `the admin endpoint`.
        what: &'static str,
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The CA's certificate or key could not be loaded or created.
    #[error("the CA could not be set up")]
    Ca(#[from] CaLoadError),
    /// Plaintext was asked for on an address other than loopback: tokens and TLS keys would
    /// cross the network in the clear.
    #[error("refusing to serve {what} in plaintext on {addr}: only loopback may be plaintext")]
    PlaintextNotLoopback {
        /// Which listener: `ADS` or `the CA`.
        what: &'static str,
        /// The address.
        addr: SocketAddr,
    },
    /// The serving certificate or the TLS configuration could not be made.
    #[error("TLS could not be set up")]
    Tls(#[from] TlsSetupError),
    /// The token file ([`ControlPlaneConfig::tokens_file`]) could not be read or parsed.
    #[error("the token file could not be loaded")]
    Tokens(#[from] ca::CaConfigError),
}

/// Where the control plane reads the mesh's objects from. Both give the same
/// [`ManifestSet`], so everything served is translated the same way from either.
#[derive(Debug, Clone)]
pub enum Source {
    /// A folder of manifests, polled for changes ([`manifests`]).
    Manifests(PathBuf),
    /// The Kubernetes API server, watched ([`kube_source`]).
    Kubernetes(Box<kube_source::KubeSourceConfig>),
}

/// Configuration of [`ControlPlane::start`]; build with [`ControlPlaneConfig::new`] (or
/// [`ControlPlaneConfig::kubernetes`]) and the `with_*` methods.
#[derive(Debug, Clone)]
pub struct ControlPlaneConfig {
    /// Where the objects come from.
    pub source: Source,
    /// ADS listen address. Default `127.0.0.1:15010` (istiod's plaintext xDS port).
    pub ads_addr: SocketAddr,
    /// CA listen address. Default `127.0.0.1:15012`.
    pub ca_addr: SocketAddr,
    /// Trust domain of the mesh. Default `cluster.local`.
    pub trust_domain: TrustDomain,
    /// Where the CA root comes from. Default [`CaSource::Generate`].
    pub ca: CaSource,
    /// Bootstrap tokens and the identities they grant. Default none (the CA refuses all).
    pub grants: TokenGrants,
    /// A token file ([`TokenGrants::parse`]) to take the bootstrap tokens from instead of
    /// [`Self::grants`]: read at start (a file that cannot be read or parsed is a
    /// [`StartError::Tokens`]), then again whenever it changes, so that removing a line
    /// revokes its token for every later call and stream without a restart. A change that
    /// does not parse is refused and the last good grants stay ([`token_file`]). Default
    /// `None`.
    pub tokens_file: Option<PathBuf>,
    /// Translation options (Envoy listener addresses, ingress class). The trust domain is
    /// taken from [`ControlPlaneConfig::trust_domain`].
    pub translate: TranslateOptions,
    /// How often the folder is checked for changes. Default 200 ms.
    pub poll_interval: Duration,
    /// Bounds of the CA server (CSR and message sizes, calls, connections). Default
    /// [`CaLimits::default`].
    pub ca_limits: CaLimits,
    /// TLS for ADS and the CA; `None` for plaintext, which only loopback addresses may use
    /// ([`StartError::PlaintextNotLoopback`]). Default on ([`ServingTls::default`]).
    pub tls: Option<ServingTls>,
    /// Connections open at once from one source (an IPv4 address, or an IPv6 /64), on each
    /// of the ADS and CA listeners; more are closed at accept, before TLS, so that one host
    /// cannot hold the connection slots whatever it sends. Default 64 (a node proxy or a
    /// gateway keeps one or two). The listeners' places (10,000 for ADS, the CA's
    /// [`CaLimits::max_connections`]) and their TLS handshakes in progress are shared fairly
    /// among sources ([`meshkit_hbone::fair`]): when all are taken, a connection from a source
    /// holding fewer than the largest holder closes that holder's least recently active
    /// connection, so that sources filling the listener together cannot keep another out.
    pub max_connections_per_source: usize,
    /// Where to serve the admin endpoint (readiness, metrics, config dump, log filter; see
    /// the [crate] documentation). It is unauthenticated: keep it on loopback. Default
    /// `None`: not served, [`ControlPlane::admin`] is there to mount. The `control-plane`
    /// binary's default is `127.0.0.1:15014`.
    pub admin_addr: Option<SocketAddr>,
    /// What `/logging?level=` sets. Default `None`: the admin endpoint cannot change the
    /// log filter.
    pub log_filter: Option<LogFilter>,
    /// Whether ADS and the CA also take Kubernetes ServiceAccount tokens, and how
    /// ([`service_accounts`]). Default `None`: only the tokens of [`Self::grants`].
    pub service_accounts: Option<service_accounts::ServiceAccountAuth>,
}

/// ADS connections open at once, shared fairly among sources (see
/// [`ControlPlaneConfig::max_connections_per_source`]).
const ADS_MAX_CONNECTIONS: usize = 10_000;

/// The outcome of the latest load of the manifest folder.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadStatus {
    /// Loads attempted so far (each start or change of the folder).
    pub loads: u64,
    /// Loads that succeeded and replaced what is served.
    pub applied: u64,
    /// Of `applied`, those taken in place (Kubernetes source): Pods whose `status` alone
    /// changed, each one's workload encoded again and every other resource kept.
    pub in_place: u64,
    /// The problems of the latest load; empty when it succeeded.
    pub errors: Vec<ManifestError>,
    /// What the latest applied load left out or cannot enforce as written: an object from
    /// the API that the model refuses, an AuthorizationPolicy's HTTP attributes.
    pub warnings: Vec<ManifestError>,
    /// The Gateway API status conditions of what is served (HTTPRoutes per parent, Gateway
    /// listeners), as JSON.
    pub gateway_api: serde_json::Value,
}

/// A running control plane. Dropping it stops it; [`ControlPlane::shutdown`] waits for that.
#[derive(Debug)]
pub struct ControlPlane {
    ads_addr: SocketAddr,
    ca_addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    root_pem: String,
    /// The serving certificate's first DNS name, when serving TLS.
    server_name: Option<String>,
    cache: SnapshotCache,
    status: watch::Receiver<LoadStatus>,
    admin: Admin,
    metrics: ControlPlaneMetrics,
    /// The readiness conditions of the listeners and the certificate; the manifests' is the
    /// watcher's.
    _conditions: Vec<Arc<Condition>>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

// === impl ControlPlaneConfig ===

impl ControlPlaneConfig {
    /// Defaults, reading the manifests in `manifest_dir`.
    pub fn new(manifest_dir: impl Into<PathBuf>) -> Self {
        Self::with_source(Source::Manifests(manifest_dir.into()))
    }

    /// Defaults, reading the Kubernetes API server as `source` says.
    pub fn kubernetes(source: kube_source::KubeSourceConfig) -> Self {
        Self::with_source(Source::Kubernetes(Box::new(source)))
    }

    fn with_source(source: Source) -> Self {
        Self {
            source,
            ads_addr: SocketAddr::from(([127, 0, 0, 1], 15010)),
            ca_addr: SocketAddr::from(([127, 0, 0, 1], 15012)),
            trust_domain: "cluster.local"
                .parse()
                .unwrap_or_else(|_| unreachable!("cluster.local is a valid trust domain")),
            ca: CaSource::Generate,
            grants: TokenGrants::new(),
            tokens_file: None,
            translate: TranslateOptions::default(),
            poll_interval: Duration::from_millis(200),
            ca_limits: CaLimits::default(),
            tls: Some(ServingTls::default()),
            max_connections_per_source: 64,
            admin_addr: None,
            log_filter: None,
            service_accounts: None,
        }
    }

    /// Also takes ServiceAccount tokens, reviewed as `auth` says.
    pub fn with_service_accounts(mut self, auth: service_accounts::ServiceAccountAuth) -> Self {
        self.service_accounts = Some(auth);
        self
    }

    /// Serves the admin endpoint on `addr` (port 0 for any; see
    /// [`ControlPlaneConfig::admin_addr`]).
    pub fn with_admin_addr(mut self, addr: SocketAddr) -> Self {
        self.admin_addr = Some(addr);
        self
    }

    /// Lets the admin endpoint's `/logging?level=` set the log filter with `filter`.
    pub fn with_log_filter(mut self, filter: LogFilter) -> Self {
        self.log_filter = Some(filter);
        self
    }

    /// Serves TLS as `tls` says (the default is [`ServingTls::default`]).
    pub fn with_tls(mut self, tls: ServingTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Serves ADS and the CA in plaintext: for tests and demos on loopback only (start fails
    /// with [`StartError::PlaintextNotLoopback`] otherwise). Clients still need tokens.
    pub fn with_plaintext(mut self) -> Self {
        self.tls = None;
        self
    }

    /// Sets the ADS listen address (port 0 for any).
    pub fn with_ads_addr(mut self, addr: SocketAddr) -> Self {
        self.ads_addr = addr;
        self
    }

    /// Sets the CA listen address (port 0 for any).
    pub fn with_ca_addr(mut self, addr: SocketAddr) -> Self {
        self.ca_addr = addr;
        self
    }

    /// Sets the trust domain.
    pub fn with_trust_domain(mut self, trust_domain: TrustDomain) -> Self {
        self.trust_domain = trust_domain;
        self
    }

    /// Sets where the CA root comes from.
    pub fn with_ca(mut self, ca: CaSource) -> Self {
        self.ca = ca;
        self
    }

    /// Sets the bootstrap tokens.
    pub fn with_grants(mut self, grants: TokenGrants) -> Self {
        self.grants = grants;
        self
    }

    /// Sets [`ControlPlaneConfig::tokens_file`]: the bootstrap tokens come from `path`, and
    /// follow it.
    pub fn with_tokens_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.tokens_file = Some(path.into());
        self
    }

    /// Sets the translation options.
    pub fn with_translate(mut self, translate: TranslateOptions) -> Self {
        self.translate = translate;
        self
    }

    /// Sets the poll interval.
    pub fn with_poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// Sets the CA server's bounds (default [`CaLimits::default`]).
    pub fn with_ca_limits(mut self, limits: CaLimits) -> Self {
        self.ca_limits = limits;
        self
    }

    /// Sets [`ControlPlaneConfig::max_connections_per_source`] (default 64; at least 1).
    pub fn with_max_connections_per_source(mut self, max: usize) -> Self {
        self.max_connections_per_source = max.max(1);
        self
    }
}

// === impl ControlPlane ===

impl ControlPlane {
    /// Loads the folder, binds both listeners and starts serving. A folder with errors is
    /// reported (logs and [`ControlPlane::status`]) and an empty snapshot is served until it
    /// is fixed.
    ///
    /// # Errors
    ///
    /// When a listener cannot be bound or the CA root files cannot be loaded.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: cancelling may leave the listeners bound until the runtime drops them.
    pub async fn start(config: ControlPlaneConfig) -> Result<Self, StartError> {
        if config.tls.is_none() {
            for (what, addr) in [("ADS", config.ads_addr), ("the CA", config.ca_addr)] {
                if !addr.ip().is_loopback() {
                    return Err(StartError::PlaintextNotLoopback { what, addr });
                }
            }
        }
        let readiness = Readiness::default();
        let manifests_loaded = readiness.condition("the manifests' first load");
        let certificate = Arc::new(readiness.condition("the serving certificate"));
        let ads_bound = Arc::new(readiness.condition("the ADS listener"));
        let ca_bound = Arc::new(readiness.condition("the CA listener"));
        let metrics = ControlPlaneMetrics::new();
        let mut registry = Registry::default();
        metrics.register(&mut registry);

        let cache = SnapshotCache::new(Snapshot::default());
        let (status_tx, status) = watch::channel(LoadStatus::default());
        let facts = Arc::new(OnceLock::new());
        let dump = admin::Dump {
            source: match &config.source {
                Source::Manifests(dir) => dir.display().to_string(),
                Source::Kubernetes(_) => "kubernetes".to_owned(),
            },
            cache: cache.clone(),
            status: status.clone(),
            facts: Arc::clone(&facts),
        };
        let mut admin = Admin::new("control-plane", registry)
            .with_readiness(readiness)
            .with_config_dump(move || dump.render());
        if let Some(filter) = &config.log_filter {
            admin = admin.with_log_filter(filter.clone());
        }
        let (stop, _) = watch::channel(false);
        let mut tasks = Vec::new();
        // First, so that a probe during start-up is told what is missing.
        let admin_addr = match config.admin_addr {
            Some(addr) => {
                let (listener, bound) = bind("the admin endpoint", addr).await?;
                if !bound.ip().is_loopback() {
                    tracing::warn!(addr = %bound, "the admin endpoint is unauthenticated and not on loopback");
                }
                let serving = admin.clone().serve(listener, stop_signal(&stop));
                tasks.push(tokio::spawn(async move {
                    if let Err(e) = serving.await {
                        tracing::error!(error = %e, "admin endpoint failed");
                    }
                }));
                Some(bound)
            }
            None => None,
        };

        let mut translate = config.translate.clone();
        translate.trust_domain = config.trust_domain.as_str().to_owned();
        let keys = match &config.ca {
            CaSource::Generate => CaSigner::generate(config.trust_domain.clone())?,
            CaSource::Files { cert, key } => {
                CaSigner::load(config.trust_domain.clone(), cert, key)?
            }
            CaSource::LoadOrGenerate { cert, key } => {
                CaSigner::load_or_generate(config.trust_domain.clone(), cert, key)?
            }
        };
        let root_pem = keys.root_pem();
        let root_summary = admin::cert_summary(keys.root().as_ref());
        if let Some(expiry) = admin::not_after_unix(keys.root().as_ref()) {
            metrics.ca().set_root_expiry(expiry);
        }
        let mut serving_cert = None;
        let acceptor = match &config.tls {
            Some(tls) => {
                let ips = tls::listen_ips(&[config.ads_addr, config.ca_addr]);
                let (acceptor, cert) = tls.acceptor(&keys, &ips)?;
                serving_cert = Some(cert);
                Some((acceptor, tls.handshake_timeout, tls.max_handshakes))
            }
            None => None,
        };
        // Plaintext has no certificate to wait for.
        certificate.set_ready();
        let server_name = config
            .tls
            .as_ref()
            .and_then(|t| t.dns_names.first().cloned());
        let (nodes_tx, nodes_rx) = watch::channel(Arc::new(ca::NodeIdentities::new()));
        let reviewer = config.service_accounts.clone().map(|auth| {
            Arc::new(service_accounts::Reviewer::new(
                auth,
                nodes_rx.clone(),
                metrics.service_accounts().clone(),
            ))
        });
        let grants = match &config.tokens_file {
            Some(path) => {
                let (grants, seen) = token_file::load(path)?;
                let following = grants.subscribe();
                tasks.push(tokio::spawn(token_file::follow(
                    path.clone(),
                    grants,
                    seen,
                    metrics.ca().clone(),
                    stop.subscribe(),
                )));
                following
            }
            None => watch::channel(Arc::new(config.grants.clone())).1,
        };
        let mut signer = TokenSigner::new(keys, TokenGrants::new())
            .with_grants(grants.clone())
            .with_metrics(metrics.ca().clone())
            .with_node_identities(nodes_rx);
        let mut access = access::TokenAccess::new(TokenGrants::new())
            .with_grants(grants.clone())
            .with_metrics(metrics.xds().clone());
        if let Some(reviewer) = reviewer {
            signer = signer.with_service_accounts(Arc::clone(&reviewer));
            access = access.with_service_accounts(reviewer);
        }
        let ca_limits = config.ca_limits.clone();

        let (ads_listener, ads_addr) = bind("ADS", config.ads_addr).await?;
        let (ca_listener, ca_addr) = bind("the CA", config.ca_addr).await?;
        ads_bound.set_ready();
        ca_bound.set_ready();
        let _ = facts.set(admin::Facts {
            ads_addr,
            ca_addr,
            admin_addr,
            trust_domain: config.trust_domain.as_str().to_owned(),
            root: root_summary,
            serving: serving_cert.clone(),
            grants,
        });

        let mut applier = Applier {
            translate,
            cache: cache.clone(),
            status: status_tx,
            loaded: manifests_loaded,
            metrics: metrics.manifests().clone(),
            nodes: nodes_tx,
            trust_domain: config.trust_domain.clone(),
            writes: None,
            last: None,
        };
        let mut folder = None;
        match &config.source {
            Source::Manifests(dir) => {
                let mut watcher = Watcher {
                    dir: dir.clone(),
                    fingerprint: None,
                    pending: None,
                    applier,
                };
                watcher.check();
                folder = Some(watcher);
            }
            Source::Kubernetes(source) => {
                let watches = kube_source::Watches::start(&source.client, metrics.kube().clone());
                if let Some(status) = &source.status {
                    let (desired_tx, desired) = watch::channel(Arc::default());
                    applier.writes = Some((status.clone(), desired_tx));
                    let (leader_tx, leader) = watch::channel(status.lease.is_none());
                    let mut fixed_leader = Some(leader_tx);
                    if let Some(lease) = &status.lease {
                        tasks.push(tokio::spawn(leader::run(
                            source.client.clone(),
                            lease.clone(),
                            fixed_leader.take().unwrap_or_else(|| unreachable!()),
                            stop.subscribe(),
                        )));
                    }
                    let writer = status::Writer {
                        client: source.client.clone(),
                        config: status.clone(),
                        statuses: watches.statuses(),
                        metrics: metrics.status().clone(),
                        _fixed_leader: fixed_leader,
                        reported: std::collections::BTreeSet::new(),
                    };
                    tasks.push(tokio::spawn(writer.run(desired, leader, stop.subscribe())));
                }
                let source = (**source).clone();
                let stopped = stop.subscribe();
                tasks.push(tokio::spawn(kube_source::run(
                    source,
                    watches,
                    move |update| applier.update(update),
                    stopped,
                )));
            }
        }

        let stopped = stop_signal(&stop);
        // Delta clients resuming with many resources send them all in their first request.
        let ads = AdsServer::new(cache.clone())
            .with_config(
                ServerConfig::default()
                    .max_decoding_message_size(16 * 1024 * 1024)
                    // The fair shares of `tls::incoming` are the cap; this one is a backstop
                    // with room for evicted connections that tonic has not dropped yet.
                    .max_connections(2 * ADS_MAX_CONNECTIONS),
            )
            .with_access(access)
            .with_observer(metrics.xds().clone())
            .with_stop(stop.subscribe());
        let per_source = config.max_connections_per_source;
        let ads_incoming = tls::incoming(
            ads_listener,
            acceptor.clone(),
            ADS_MAX_CONNECTIONS,
            per_source,
            metrics.listeners().ads.clone(),
        );
        let ads_up = Arc::clone(&ads_bound);
        tasks.push(tokio::spawn(async move {
            if let Err(e) = ads.serve_with_incoming(ads_incoming, stopped).await {
                ads_up.set_unready();
                tracing::error!(error = %e, "ADS server failed");
            }
        }));
        let stopped = stop_signal(&stop);
        let ca_up = Arc::clone(&ca_bound);
        let ca_shares = metrics.listeners().ca.clone();
        tasks.push(tokio::spawn(async move {
            // The fair shares of `tls::incoming` are the cap; `connections` keeps a backstop
            // with room for evicted connections that tonic has not dropped yet.
            let mut backstop = ca_limits.clone();
            backstop.max_connections = 2 * ca_limits.max_connections;
            let incoming = backstop.connections(tls::incoming(
                ca_listener,
                acceptor,
                ca_limits.max_connections,
                per_source,
                ca_shares,
            ));
            let result = ca_limits
                .server()
                .add_service(ca_limits.service(signer))
                .serve_with_incoming_shutdown(incoming, stopped)
                .await;
            if let Err(e) = result {
                ca_up.set_unready();
                tracing::error!(error = %e, "CA server failed");
            }
        }));
        if let Some(cert) = serving_cert {
            tasks.push(tokio::spawn(cert.renew_until(stop.subscribe())));
        }
        if let Some(mut watcher) = folder {
            let mut stopped = stop.subscribe();
            let interval = config.poll_interval;
            tasks.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval(interval);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = tick.tick() => watcher.check(),
                        _ = stopped.wait_for(|s| *s) => return,
                    }
                }
            }));
        }
        tracing::info!(
            %ads_addr,
            %ca_addr,
            admin_addr = admin_addr.map(tracing::field::display),
            tls = server_name.is_some(),
            source = ?config.source,
            "control plane started"
        );
        Ok(Self {
            ads_addr,
            ca_addr,
            admin_addr,
            root_pem,
            server_name,
            cache,
            status,
            admin,
            metrics,
            _conditions: vec![certificate, ads_bound, ca_bound],
            stop,
            tasks,
        })
    }

    /// The bound ADS address.
    pub fn ads_addr(&self) -> SocketAddr {
        self.ads_addr
    }

    /// The bound admin address, when [`ControlPlaneConfig::admin_addr`] asked for one.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// The admin endpoint (readiness, metrics, config dump, log filter), to mount with
    /// [`Admin::handle`] on a server of one's own; the same one that
    /// [`ControlPlaneConfig::admin_addr`] serves.
    pub fn admin(&self) -> &Admin {
        &self.admin
    }

    /// The metrics the admin endpoint serves.
    pub fn metrics(&self) -> &ControlPlaneMetrics {
        &self.metrics
    }

    /// `https://ADS_ADDR` (or `http://` when serving plaintext), for
    /// `meshkit_xds_client::ClientConfig::new`; with TLS, add [`ControlPlane::client_tls`].
    pub fn ads_uri(&self) -> String {
        format!("{}://{}", self.scheme(), self.ads_addr)
    }

    /// `https://CA_ADDR` (or `http://` when serving plaintext).
    pub fn ca_uri(&self) -> String {
        format!("{}://{}", self.scheme(), self.ca_addr)
    }

    fn scheme(&self) -> &'static str {
        if self.server_name.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// The name clients check the serving certificate against (its first DNS SAN); `None`
    /// when serving plaintext.
    pub fn server_name(&self) -> Option<&str> {
        self.server_name.as_deref()
    }

    /// What a client needs to reach this control plane over TLS: the root, and the server
    /// name when serving TLS.
    ///
    /// # Errors
    ///
    /// Only if the root or the name were unusable, which the control plane rules out.
    pub fn client_tls(
        &self,
    ) -> Result<meshkit_xds_client::ControlPlaneTls, meshkit_xds_client::Error> {
        let tls = meshkit_xds_client::ControlPlaneTls::from_pem(&self.root_pem)?;
        match &self.server_name {
            Some(name) => tls.with_server_name(name),
            None => Ok(tls),
        }
    }

    /// A lazily connecting gRPC channel to the CA, over TLS when serving TLS.
    ///
    /// # Errors
    ///
    /// As for [`ControlPlane::client_tls`].
    pub fn ca_channel(
        &self,
    ) -> Result<tonic::transport::Channel, Box<dyn std::error::Error + Send + Sync>> {
        if self.server_name.is_some() {
            return Ok(self.client_tls()?.connect_lazy(&self.ca_uri())?);
        }
        Ok(tonic::transport::Endpoint::from_shared(self.ca_uri())?.connect_lazy())
    }

    /// The bound CA address.
    pub fn ca_addr(&self) -> SocketAddr {
        self.ca_addr
    }

    /// The CA root certificate as PEM: the mesh's trust bundle.
    pub fn root_pem(&self) -> &str {
        &self.root_pem
    }

    /// The snapshot cache (to inspect what is served, or to serve something else).
    pub fn cache(&self) -> &SnapshotCache {
        &self.cache
    }

    /// The outcome of the latest load, updated on every load.
    pub fn status(&self) -> watch::Receiver<LoadStatus> {
        self.status.clone()
    }

    /// Stops serving (readiness turns 503 first, then open streams end and listeners
    /// close) and waits for the tasks.
    pub async fn shutdown(mut self) {
        self.admin.readiness().start_draining();
        self.stop.send_replace(true);
        for task in std::mem::take(&mut self.tasks) {
            if tokio::time::timeout(Duration::from_secs(2), task)
                .await
                .is_err()
            {
                tracing::debug!("control plane task did not stop in time");
            }
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop.send_replace(true);
        for task in &self.tasks {
            task.abort();
        }
    }
}

async fn bind(
    what: &'static str,
    addr: SocketAddr,
) -> Result<(TcpListener, SocketAddr), StartError> {
    let bound = async {
        let listener = TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        Ok((listener, local))
    };
    bound
        .await
        .map_err(|source| StartError::Bind { what, addr, source })
}

fn stop_signal(
    stop: &watch::Sender<bool>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let mut rx = stop.subscribe();
    async move {
        let _ = rx.wait_for(|s| *s).await;
    }
}

/// Turns each new model into what is served: the snapshot, the CA's node identities, the
/// load status and readiness.
struct Applier {
    translate: TranslateOptions,
    cache: SnapshotCache,
    status: watch::Sender<LoadStatus>,
    /// Holds once a load has been applied.
    loaded: Condition,
    metrics: ManifestMetrics,
    /// The workloads on each node, for the CA's impersonation rule.
    nodes: watch::Sender<Arc<ca::NodeIdentities>>,
    trust_domain: TrustDomain,
    /// What status to write, and where to send what each model calls for.
    writes: Option<(status::StatusConfig, watch::Sender<Arc<status::Desired>>)>,
    /// The model served now, kept to take a change of Pods' status in place; `None` until
    /// one is served, and after a model was refused.
    last: Option<Served>,
}

/// A model as it is served.
struct Served {
    /// The objects it was derived from, but its Pods: those are the larger part of a
    /// cluster, and each is in `derived` as its workload.
    set: ManifestSet,
    derived: ambient::Derived,
    network: String,
    /// The keys of the policies each workload names, by uid.
    workload_policies: BTreeMap<String, Vec<String>>,
    snapshot: Snapshot,
}

impl Served {
    /// Where `pod`'s workload goes in place of the one it had (its index in the workloads),
    /// and the workload: when the two differ in status alone. Otherwise why not.
    fn in_place(
        &self,
        pod: &k8s_openapi::api::core::v1::Pod,
        options: &TranslateOptions,
    ) -> Result<(usize, ambient::MeshWorkload), &'static str> {
        let new = ambient::pod_workload(pod, &self.set, options, &self.network)
            .ok_or("a Pod that loses its workload")?;
        let index = (self.derived.workloads)
            .binary_search_by(|w| w.workload.uid.cmp(&new.workload.uid))
            .map_err(|_| "a workload the model does not hold")?;
        let old = &self.derived.workloads[index];
        let mut unchanged = new.clone();
        unchanged.workload.status = old.workload.status;
        if unchanged != *old {
            return Err("a workload that changes more than its status");
        }
        Ok((index, new))
    }
}

impl Applier {
    /// Takes an update of the Kubernetes source; `false` when it is a change of Pods'
    /// status that the served model cannot take in place (the source then builds a new
    /// model).
    fn update(&mut self, update: kube_source::Update) -> bool {
        match update {
            kube_source::Update::Full(result) => {
                self.apply(*result);
                true
            }
            kube_source::Update::PodStatuses(pods) => self.apply_pod_statuses(pods),
        }
    }

    /// Serves the model with `pods` in place of the Pods of their names, when that changes
    /// nothing but each one's workload's status (and the workload's `Address` is all that
    /// is served anew, each other resource kept as it is): the common case of a Pod turning
    /// Ready or not Ready takes one workload's encoding rather than a whole model. Anything
    /// else (a Pod that gains or loses its workload, or changes its addresses) answers
    /// `false`, and nothing is changed.
    fn apply_pod_statuses(&mut self, pods: Vec<k8s_openapi::api::core::v1::Pod>) -> bool {
        let Some(served) = &mut self.last else {
            return false;
        };
        let mut changes = Vec::with_capacity(pods.len());
        for pod in pods {
            match served.in_place(&pod, &self.translate) {
                Ok((index, workload)) => changes.push((index, workload)),
                Err(why) => {
                    tracing::debug!(pod = ?pod.metadata.name, why, "building a new model");
                    return false;
                }
            }
        }
        let mut addresses = Vec::with_capacity(changes.len());
        for (index, workload) in changes {
            let address = translate::workload_address(&workload, &served.workload_policies);
            let any = envoy_types::pb::google::protobuf::Any {
                type_url: ADDRESS_TYPE_URL.to_owned(),
                value: prost::Message::encode_to_vec(&address),
            };
            addresses.push((workload.workload.uid.clone(), any));
            served.derived.workloads[index] = workload;
        }
        let types = served.snapshot.get_type(ADDRESS_TYPE_URL);
        let Some(types) = types.cloned() else {
            return false;
        };
        served.snapshot = std::mem::take(&mut served.snapshot)
            .with_type(ADDRESS_TYPE_URL, types.with_resources(addresses));
        self.cache.set(served.snapshot.clone());
        self.metrics.applied();
        self.status.send_modify(|status| {
            status.loads += 1;
            status.applied += 1;
            status.in_place += 1;
        });
        true
    }

    /// Serves `result` when it is a model; keeps serving the last one on errors.
    fn apply(&mut self, result: Result<ManifestSet, manifests::ManifestErrors>) {
        let mut status = self.status.borrow().clone();
        status.loads += 1;
        match result {
            Ok(set) => {
                for warning in &set.warnings {
                    // A warning logged once, not again with every load that repeats it.
                    if !status.warnings.contains(warning) {
                        tracing::warn!(%warning, "manifest applied with a warning");
                    }
                }
                status.warnings.clone_from(&set.warnings);
                let derived = ambient::derive(&set, &self.translate);
                let (snapshot, workload_policies) =
                    translate::snapshot_with_policies(&set, &derived, &self.translate);
                let gateway_routes = gateway_api::route_table(&set, &self.translate);
                gateway_api::log_status(&gateway_routes);
                status.gateway_api = gateway_api::status_json(&gateway_routes);
                if let Some((config, desired)) = &self.writes {
                    let wanted = status::desired(&set, &gateway_routes, &self.translate, config)
                        .with_problems(&set.warnings, &set.refused);
                    desired.send_if_modified(|d| {
                        let changed = **d != wanted;
                        if changed {
                            *d = Arc::new(wanted);
                        }
                        changed
                    });
                }
                self.nodes.send_replace(Arc::new(
                    ca::NodeIdentities::of_workloads(&derived.workloads, &self.trust_domain)
                        .with_pods(&set.pods),
                ));
                self.cache.set(snapshot.clone());
                status.applied += 1;
                status.errors.clear();
                self.loaded.set_ready();
                self.metrics.applied();
                tracing::info!(
                    ingresses = set.ingresses.len(),
                    services = derived.services.len(),
                    workloads = derived.workloads.len(),
                    pods = set.pods.len(),
                    secrets = set.secrets.len(),
                    authorization_policies = set.authorization_policies.len(),
                    peer_authentications = set.peer_authentications.len(),
                    gateways = set.gateway_api.gateways.len(),
                    http_routes = set.gateway_api.http_routes.len(),
                    "manifests loaded"
                );
                let mut set = set;
                set.pods = Vec::new();
                self.last = Some(Served {
                    network: ambient::local_network(&set, &self.translate),
                    set,
                    derived,
                    workload_policies,
                    snapshot,
                });
            }
            Err(errors) => {
                self.last = None;
                for error in &errors.0 {
                    tracing::warn!(%error, "manifest rejected; still serving the last good configuration");
                }
                self.metrics.rejected(errors.0.len());
                status.errors = errors.0;
            }
        }
        self.status.send_replace(status);
    }
}

/// Re-reads the folder when its contents change.
struct Watcher {
    dir: PathBuf,
    /// Hash of the folder's file names and contents at the last load.
    fingerprint: Option<u64>,
    /// A changed fingerprint seen once, loaded if the next check sees it again.
    pending: Option<u64>,
    applier: Applier,
}

impl Watcher {
    /// Loads the folder if it changed and has stayed the same since the previous check: a
    /// file caught halfway through being written (an editor truncates, then writes) must not
    /// be served, even when what was read so far happens to be valid.
    fn check(&mut self) {
        let fingerprint = folder_fingerprint(&self.dir);
        if self.fingerprint == Some(fingerprint) {
            self.pending = None;
            return;
        }
        if self.fingerprint.is_some() && self.pending != Some(fingerprint) {
            self.pending = Some(fingerprint);
            return;
        }
        self.pending = None;
        self.fingerprint = Some(fingerprint);
        self.applier.apply(ManifestSet::load_dir(&self.dir));
    }
}

/// A hash of every file's name, length and contents; cheap for a folder of manifests, and
/// unlike modification times it cannot miss an edit within the clock's granularity.
fn folder_fingerprint(dir: &Path) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for path in paths {
        h.write(path.as_os_str().as_encoded_bytes());
        if let Ok(bytes) = std::fs::read(&path) {
            h.write_usize(bytes.len());
            h.write(&bytes);
        }
    }
    h.finish()
}
