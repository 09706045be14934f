//! The ingress gateway: HTTP/1.1 and HTTP/2 in (plain or TLS by SNI), routed by Kubernetes
//! Ingress rules, forwarded over HBONE to the backend workloads.
//!
//! - **Configuration.** [`GatewaySettings`] is fixed for a run (the gateway's own identity
//!   and trust domain); [`GatewayConfig`] (Ingresses, TLS Secrets, the mesh) comes through a
//!   `tokio::sync::watch` channel. Each new value is compiled once (route table, parsed
//!   certificates, mesh index) and used by requests that start after it; open connections
//!   are not dropped.
//! - **Routing.** [`RouteTable`] semantics; 404 when nothing matches (and no default backend).
//! - **Forwarding.** The backend `Service` (namespace of the Ingress, name, port by number or
//!   name) is resolved in the mesh to its endpoints; the gateway opens an HBONE tunnel to
//!   `ENDPOINT_IP:15008` expecting the endpoint workload's SPIFFE ID, presenting its own, and
//!   speaks HTTP/1.1 inside. Endpoints are taken round-robin per service port; an endpoint
//!   whose tunnel cannot be opened is skipped; 503 when none can. `X-Forwarded-For`,
//!   `X-Forwarded-Proto` and `Forwarded` name the client.
//! - **Connection reuse.** A backend connection (HTTP/1.1 in a tunnel of its own) goes back
//!   to a pool per endpoint once its response has been read to the end, and serves later
//!   requests from any client; one that closed meanwhile hands its request to a new tunnel.
//!   A connection idle for `backend_idle_timeout` (60 s) is closed, a new configuration
//!   empties the pool, and a node proxy closes pooled tunnels whose identity its policy stops
//!   admitting.
//! - **TLS.** The certificate comes from the Secret that `spec.tls` names for the SNI
//!   ([`RouteTable::tls_secret_for`]); ALPN offers `h2` and `http/1.1`.
//!
//! ```no_run
//! use meshkit_gateway::{Gateway, GatewayConfig, GatewaySettings};
//! use meshkit_hbone::{Client, ClientConfig};
//! use meshkit_identity::{TrustDomain, test_util::TestCa};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let td = TrustDomain::new("cluster.local")?;
//! let ca = TestCa::new(td.clone());
//! let id = meshkit_identity::SpiffeId::from_istio(&td, "ingress", "gateway")?;
//! let client = Client::new(ClientConfig::default(), ca.issue(id.clone()), ca.bundle_set());
//! let (config_tx, config_rx) = tokio::sync::watch::channel(GatewayConfig::default());
//! let gateway = Gateway::new(GatewaySettings::new(id), client, config_rx);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! tokio::spawn(gateway.serve_http(listener));
//! # drop(config_tx);
//! # Ok(())
//! # }
//! ```

// docs.rs builds with `--cfg docsrs`: items behind a feature show it.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod feed;
mod proxy;
pub mod stack;
mod tls;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use meshkit_hbone::Client;
use meshkit_identity::{SpiffeId, TrustDomain};
use meshkit_ingress_model::{Ingress, IngressClass, RouteTable};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

pub use proxy::{BACKEND_IDENTITY, BACKEND_WORKLOAD, Body};

use meshkit_mesh::{MeshConfig, MeshIndex};
use rustls::crypto::CryptoProvider;

/// How long an HTTP/1 client may take to send a request head.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// A serving certificate from a `kubernetes.io/tls` Secret: a PEM certificate chain and its
/// PEM private key, by the Secret's namespace and name.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TlsCertificate {
    /// Namespace (the namespace of the Ingresses that name it).
    pub namespace: String,
    /// Secret name (`spec.tls[].secretName`).
    pub name: String,
    /// `tls.crt`: PEM certificates, leaf first.
    pub cert_pem: String,
    /// `tls.key`: the PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_pem: String,
}

/// What the gateway routes by: the value carried by the watch channel.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GatewayConfig {
    /// The Ingresses (already filtered by IngressClass, or to be filtered with
    /// [`GatewaySettings::ingress_class`]).
    pub ingresses: Vec<Ingress>,
    /// The IngressClasses, to find the default class when
    /// [`GatewaySettings::ingress_class`] is set.
    pub ingress_classes: Vec<IngressClass>,
    /// TLS Secrets that `spec.tls` entries name.
    pub secrets: Vec<TlsCertificate>,
    /// Services and workloads, to find each backend's endpoints.
    pub mesh: MeshConfig,
}

/// What is fixed for a gateway's run.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct GatewaySettings {
    /// The identity the gateway presents to backends (its HBONE client must hold it).
    pub identity: SpiffeId,
    /// The trust domain of the backends' identities. Default: the identity's.
    pub trust_domain: TrustDomain,
    /// The HBONE port of the workloads. Default: 15008.
    pub hbone_port: u16,
    /// When set, only Ingresses of this IngressClass are routed. Default: all.
    pub ingress_class: Option<String>,
    /// How long a client connection may take to complete its TLS handshake. Default: 10 s.
    pub tls_handshake_timeout: Duration,
    /// How long a pooled backend connection may stay without a request before it (and its
    /// tunnel) is closed. Default: 60 s, as the HBONE client's idle connections.
    pub backend_idle_timeout: Duration,
    /// The crypto provider of the client-facing TLS listener and of the certificates it
    /// loads. Default: meshkit-identity's ring provider; a program passes the one all its TLS
    /// endpoints share.
    pub provider: Arc<CryptoProvider>,
}

impl GatewaySettings {
    /// Settings for a gateway presenting `identity`, with the defaults.
    pub fn new(identity: SpiffeId) -> Self {
        Self {
            trust_domain: identity.trust_domain(),
            identity,
            hbone_port: meshkit_hbone::HBONE_PORT,
            ingress_class: None,
            tls_handshake_timeout: Duration::from_secs(10),
            backend_idle_timeout: Duration::from_secs(60),
            provider: meshkit_identity::default_provider(),
        }
    }

    /// Sets the crypto provider of the client-facing TLS.
    pub fn with_provider(mut self, provider: Arc<CryptoProvider>) -> Self {
        self.provider = provider;
        self
    }

    /// Sets how long a pooled backend connection may stay idle.
    pub fn with_backend_idle_timeout(mut self, timeout: Duration) -> Self {
        self.backend_idle_timeout = timeout;
        self
    }

    /// Sets the HBONE port of the workloads.
    pub fn with_hbone_port(mut self, port: u16) -> Self {
        self.hbone_port = port;
        self
    }

    /// Routes only Ingresses of IngressClass `class`.
    pub fn with_ingress_class(mut self, class: impl Into<String>) -> Self {
        self.ingress_class = Some(class.into());
        self
    }
}

/// One configuration, compiled for lookups.
#[derive(Debug, Default)]
struct Compiled {
    table: RouteTable,
    index: MeshIndex,
    certs: tls::CertStore,
}

/// What the steps of the request stack share.
struct Shared {
    settings: GatewaySettings,
    client: Client,
    current: watch::Receiver<Arc<Compiled>>,
    /// Round-robin position per (namespace, service, port); kept across configurations.
    positions: Mutex<HashMap<(String, String, u16), usize>>,
    /// Idle backend connections, reused across requests.
    pool: Arc<proxy::BackendPool>,
}

/// A running gateway: cheap to clone, serves any number of listeners.
#[derive(Clone)]
pub struct Gateway {
    shared: Arc<Shared>,
    stack: stack::Stack,
    _compiler: Arc<CompilerTask>,
}

/// Stops compiling configurations when the last [`Gateway`] clone is dropped.
struct CompilerTask(tokio::task::AbortHandle);

impl Drop for CompilerTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

// === impl Gateway ===

impl Gateway {
    /// A gateway presenting `settings.identity` through `client` and routing by the newest
    /// value of `config`.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime (it spawns the task that compiles configurations).
    pub fn new(
        settings: GatewaySettings,
        client: Client,
        mut config: watch::Receiver<GatewayConfig>,
    ) -> Self {
        let compile = {
            let settings = settings.clone();
            move |c: &GatewayConfig| Arc::new(compile(&settings, c))
        };
        let (tx, rx) = watch::channel(compile(&config.borrow_and_update()));
        let pool = Arc::new(proxy::BackendPool::new(settings.backend_idle_timeout));
        let idle = pool.clone();
        let task = tokio::spawn(async move {
            while config.changed().await.is_ok() {
                let next = compile(&config.borrow_and_update());
                tracing::info!(
                    routes = next.table.route_count(),
                    "gateway configuration applied"
                );
                tx.send_replace(next);
                // Endpoints may have moved or changed identity: new connections for all.
                idle.clear();
            }
        });
        let shared = Arc::new(Shared {
            settings,
            client,
            current: rx,
            positions: Mutex::default(),
            pool,
        });
        Self {
            stack: stack::build(shared.clone()),
            shared,
            _compiler: Arc::new(CompilerTask(task.abort_handle())),
        }
    }

    /// Serves plain HTTP (HTTP/1.1, and HTTP/2 with prior knowledge) on `listener`.
    /// Dropping the future closes the listener and every connection it accepted.
    ///
    /// # Errors
    ///
    /// Never in practice: failed accepts are logged and retried.
    pub async fn serve_http(self, listener: TcpListener) -> std::io::Result<()> {
        self.serve(listener, None).await
    }

    /// Serves HTTPS on `listener`, with the certificate chosen by SNI; HTTP/2 or HTTP/1.1
    /// by ALPN. Dropping the future closes the listener and every connection it accepted.
    ///
    /// # Errors
    ///
    /// When the TLS configuration cannot be built.
    pub async fn serve_https(self, listener: TcpListener) -> std::io::Result<()> {
        let config = tls::server_config(
            tls::SniResolver(self.shared.current.clone()),
            self.shared.settings.provider.clone(),
        )
        .map_err(std::io::Error::other)?;
        self.serve(listener, Some(TlsAcceptor::from(Arc::new(config))))
            .await
    }

    async fn serve(self, listener: TcpListener, tls: Option<TlsAcceptor>) -> std::io::Result<()> {
        let mut connections = JoinSet::new();
        loop {
            while connections.try_join_next().is_some() {}
            let (sock, client) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "gateway accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = sock.set_nodelay(true);
            let shared = self.shared.clone();
            let stack = self.stack.clone();
            let tls = tls.clone();
            connections.spawn(async move {
                match tls {
                    None => serve_connection(stack, sock, client, "http").await,
                    Some(acceptor) => {
                        let timeout = shared.settings.tls_handshake_timeout;
                        match tokio::time::timeout(timeout, acceptor.accept(sock)).await {
                            Ok(Ok(stream)) => {
                                serve_connection(stack, stream, client, "https").await;
                            }
                            Ok(Err(e)) => {
                                tracing::debug!(%client, error = %e, "TLS handshake failed");
                            }
                            Err(_) => tracing::debug!(%client, "TLS handshake timed out"),
                        }
                    }
                }
            });
        }
    }
}

impl std::fmt::Debug for TlsCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the private key.
        f.debug_struct("TlsCertificate")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("identity", &self.shared.settings.identity)
            .finish_non_exhaustive()
    }
}

async fn serve_connection<IO>(stack: stack::Stack, io: IO, client: SocketAddr, scheme: &'static str)
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let client = stack::Client {
        addr: client,
        scheme,
    };
    let service =
        hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
            req.extensions_mut().insert(client);
            tower::ServiceExt::oneshot(stack.clone(), req)
        });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // A client that does not finish its request head in time is dropped (slowloris).
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    if let Err(e) = builder.serve_connection(TokioIo::new(io), service).await {
        tracing::debug!(client = %client.addr, error = %e, "client connection ended with an error");
    }
}

fn compile(settings: &GatewaySettings, config: &GatewayConfig) -> Compiled {
    let mut builder = RouteTable::builder();
    if let Some(class) = &settings.ingress_class {
        builder = builder
            .ingress_class(class.clone())
            .ingress_classes(&config.ingress_classes);
    }
    Compiled {
        table: builder.build(&config.ingresses),
        index: config
            .mesh
            .index(&settings.trust_domain)
            .with_hbone_port(settings.hbone_port),
        certs: tls::load(&config.secrets, &settings.provider),
    }
}

// === impl Shared ===

impl Shared {
    fn next_endpoint(&self, namespace: &str, service: &str, port: u16) -> usize {
        let mut positions = self.positions.lock().unwrap_or_else(|e| e.into_inner());
        let slot = positions
            .entry((namespace.to_owned(), service.to_owned(), port))
            .or_insert(0);
        let current = *slot;
        *slot = slot.wrapping_add(1);
        current
    }
}
