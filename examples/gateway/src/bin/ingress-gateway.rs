//! `ingress-gateway`: HTTP/1.1 and HTTP/2 (plain and TLS by SNI), routed by Kubernetes
//! Ingresses, forwarded over HBONE to the backends' workloads.
//!
//! ```text
//! ingress-gateway --listen 127.0.0.3:8080 --listen-tls 127.0.0.3:8443 \
//!     --ingress ingress.yaml --mesh mesh.json \
//!     --tls-secret shop/shop-tls=tls.crt,tls.key \
//!     --ca http://127.0.0.1:15012 --ca-root root.pem --ca-token demo-token
//! ```
//!
//! The Ingress file (YAML, multi-document) and the mesh file (JSON of
//! `meshkit_mesh::MeshConfig`) are re-read when they change; new requests use
//! the new configuration, open connections stay.
//!
//! The admin endpoint (`--admin-addr`, default `127.0.0.1:15090`) serves `/healthz/ready`
//! (ready once the gateway's certificate is obtained, the first configuration is there and
//! every listener is bound), `/metrics` and `/stats/prometheus`, `/config_dump` and
//! `/logging`. One access-log line per request at info level (`--access-log-json` for JSON).
//!
//! SIGINT or SIGTERM drains: readiness turns 503, the listeners close, requests in flight
//! get `--drain-seconds` (default 5) to finish, then what is left is closed. A second signal
//! stops at once.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::Parser;
use meshkit_admin::{AccessLog, Admin, LogFilter, Registry};
use meshkit_cli::{
    CaToken, CliError, ControlPlaneArgs, init_logging_with_filter, load_bundle, parse_id,
    reload_every_second, run_main, stop_signal,
};
use meshkit_gateway::{Gateway, GatewayConfig, GatewaySettings, TlsCertificate};
use meshkit_hbone::Client;
use meshkit_identity::SvidCache;
use meshkit_identity::istio::IstioCaClient;
use meshkit_mesh::MeshConfig;
use meshkit_xds_client::envoy::Node;
use meshkit_xds_client::protocol::Mode;
use tokio::net::TcpListener;
use tokio::sync::watch;

// mimalloc keeps the HTTP/2 frame buffers glibc would return to the kernel (docs/hbone.md).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Ingress gateway over HBONE.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Plain HTTP listener (HTTP/1.1 and HTTP/2 prior knowledge).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// HTTPS listener (certificate by SNI from the Ingresses' `tls`).
    #[arg(long)]
    listen_tls: Option<SocketAddr>,
    /// YAML file with the Ingresses; re-read when it changes.
    #[arg(long, required_unless_present = "xds", requires = "mesh")]
    ingress: Option<PathBuf>,
    /// JSON file with the mesh's workloads and services; re-read when it changes.
    #[arg(long, required_unless_present = "xds", requires = "ingress")]
    mesh: Option<PathBuf>,
    /// The control plane's ADS URL (`https://HOST:PORT`, or `http://` for a plaintext
    /// control plane on loopback): Ingresses, IngressClasses, TLS
    /// Secrets and workloads over State-of-the-World xDS instead of files.
    #[arg(long, conflicts_with_all = ["ingress", "mesh", "tls_secrets"])]
    xds: Option<String>,
    /// The xDS node ID the gateway sends to the control plane.
    #[arg(long, default_value = "ingress-gateway")]
    node_id: String,
    /// The cluster the gateway belongs to, sent in the xDS node.
    #[arg(long, default_value = "Kubernetes")]
    cluster: String,
    /// `NAMESPACE/NAME=CERT,KEY`: a TLS Secret from PEM files. Repeatable.
    #[arg(long = "tls-secret")]
    tls_secrets: Vec<String>,
    /// The gateway's SPIFFE ID.
    #[arg(
        long,
        default_value = "spiffe://cluster.local/ns/istio-system/sa/ingress-gateway"
    )]
    identity: String,
    /// URL of the Istio-protocol CA (`IstioCertificateService`).
    #[arg(long)]
    ca: String,
    /// PEM roots of the trust domain (the CA's root certificate).
    #[arg(long)]
    ca_root: PathBuf,
    /// Bearer token sent to the CA (default: the contents of --xds-token-file).
    #[arg(long)]
    ca_token: Option<String>,
    /// TLS and token for the control plane (ADS and CA).
    #[command(flatten)]
    control_plane: ControlPlaneArgs,
    /// Only route Ingresses of this IngressClass.
    #[arg(long)]
    ingress_class: Option<String>,
    /// Client limits and forwarding-header trust.
    #[command(flatten)]
    limits: LimitArgs,
    /// Worker threads (1: everything on one thread).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// The admin endpoint: /healthz/ready, /metrics, /stats/prometheus, /config_dump,
    /// /logging (unauthenticated: keep it on localhost).
    #[arg(long, default_value = "127.0.0.1:15090")]
    admin_addr: SocketAddr,
    /// Seconds requests in flight may take to finish after SIGTERM or SIGINT, before what is
    /// left is closed.
    #[arg(long, default_value_t = 5)]
    drain_seconds: u64,
    /// Access-log lines as JSON objects instead of key=value text.
    #[arg(long)]
    access_log_json: bool,
    /// The gateway's workload name, its `source_workload` label in the request metrics
    /// (default: unknown).
    #[arg(long)]
    workload_name: Option<String>,
    /// Serve the Gateway API: one listener on this address for each port of the Gateways
    /// served (HTTP or HTTPS, as each Gateway listener says), opened and closed as the
    /// configuration changes. Without it, Gateway API routes are not served.
    #[arg(long)]
    gateway_api_address: Option<std::net::IpAddr>,
    /// The GatewayClass controller name whose Gateways are served.
    #[arg(long, default_value = meshkit_mesh::resources::GATEWAY_CONTROLLER)]
    gateway_controller: String,
}

fn main() -> ExitCode {
    let log_filter = init_logging_with_filter();
    let args = Args::parse();
    run_main("ingress-gateway", args.threads, run(args, log_filter))
}

fn read(path: &Path, what: &str) -> Result<String, CliError> {
    std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {what} file {}: {e}", path.display()).into())
}

fn load_secret(spec: &str) -> Result<TlsCertificate, CliError> {
    let bad = || format!("--tls-secret {spec:?}: expected NAMESPACE/NAME=CERT,KEY");
    let (name, files) = spec.split_once('=').ok_or_else(bad)?;
    let (namespace, name) = name.split_once('/').ok_or_else(bad)?;
    let (cert, key) = files.split_once(',').ok_or_else(bad)?;
    Ok(TlsCertificate {
        namespace: namespace.into(),
        name: name.into(),
        cert_pem: read(Path::new(cert), "certificate")?,
        key_pem: read(Path::new(key), "private key")?,
    })
}

fn load_config(
    ingress: &Path,
    mesh: &Path,
    secrets: &[TlsCertificate],
) -> Result<GatewayConfig, CliError> {
    let ingresses = meshkit_ingress_model::manifest::from_yaml_str(&read(ingress, "Ingress")?)
        .map_err(|e| format!("Ingress file {}: {e}", ingress.display()))?;
    let mesh = MeshConfig::load(mesh).map_err(|e| meshkit_cli::error_chain(&e))?;
    Ok(GatewayConfig {
        ingresses,
        secrets: secrets.to_vec(),
        mesh,
        ..GatewayConfig::default()
    })
}

async fn run(args: Args, log_filter: LogFilter) -> Result<(), CliError> {
    if args.listen.is_none() && args.listen_tls.is_none() && args.gateway_api_address.is_none() {
        return Err("give --listen, --listen-tls, --gateway-api-address or several".into());
    }
    let identity = parse_id("--identity", &args.identity)?;
    let bundles = load_bundle(&args.ca_root, &identity.trust_domain())?;
    let channel = args.control_plane.ca_channel(&args.ca, &args.ca_root)?;
    let mut ca = IstioCaClient::new(channel);
    if let Some(token) = args
        .control_plane
        .ca_token(args.ca_token.as_deref(), &args.ca)?
    {
        ca = match token {
            CaToken::Value(token) => ca.with_bearer_token(&token)?,
            CaToken::File(path) => ca.with_bearer_token_file(path),
        };
    }
    let certs = SvidCache::new(ca, meshkit_cli::rotation_config());
    let client = Client::new(meshkit_cli::hbone_client_config(), certs.clone(), bundles);

    let secrets = args
        .tls_secrets
        .iter()
        .map(|s| load_secret(s))
        .collect::<Result<Vec<_>, _>>()?;
    // Configuration from the control plane over xDS, or from files re-read every second.
    let files = args.ingress.clone().zip(args.mesh.clone());
    let (config_tx, config_rx, _feed) = match (&args.xds, &files) {
        (Some(ads), _) => {
            let node = Node {
                id: args.node_id.clone(),
                cluster: args.cluster.clone(),
                ..Default::default()
            };
            let xds = args.control_plane.xds_config(
                ads,
                meshkit_xds_client::ClientConfig::new(ads.clone(), Mode::StateOfTheWorld, node),
            )?;
            let (rx, feed) = meshkit_gateway::feed::gateway_config_over_xds(xds);
            tracing::info!(%ads, "configuration over xDS");
            (None, rx, feed)
        }
        (None, Some((ingress, mesh))) => {
            let (tx, rx) = watch::channel(load_config(ingress, mesh, &secrets)?);
            (Some(tx), rx, Vec::new())
        }
        (None, None) => return Err("give --xds, or --ingress and --mesh".into()),
    };
    let mut settings = GatewaySettings::new(identity.clone())
        .with_provider(meshkit_cli::crypto_provider())
        .with_access_log(if args.access_log_json {
            AccessLog::json()
        } else {
            AccessLog::text()
        });
    if let Some(class) = &args.ingress_class {
        settings = settings.with_ingress_class(class.clone());
    }
    if let Some(name) = &args.workload_name {
        settings = settings.with_workload_name(name.clone());
    }
    settings = settings.with_gateway_controller(Some(args.gateway_controller.clone()));
    let settings = args.limits.apply(settings);
    let gateway = Gateway::new(settings, client, config_rx);

    // Ready once the gateway's own certificate is obtained and every listener is bound (the
    // gateway itself waits for its first configuration).
    let certificates = gateway.readiness().condition("certificates");
    let listeners = gateway.readiness().condition("listeners");
    let admin = admin(&gateway, &certs, &identity, log_filter);
    let admin_listener = TcpListener::bind(args.admin_addr)
        .await
        .map_err(|e| format!("cannot listen on {} (--admin-addr): {e}", args.admin_addr))?;
    tracing::info!(addr = %args.admin_addr, "admin listener");
    let (admin_stop, admin_stopped) = tokio::sync::oneshot::channel::<()>();
    let admin_task = tokio::spawn(admin.serve(admin_listener, async {
        let _ = admin_stopped.await;
    }));
    let obtain = {
        let (certs, identity) = (certs.clone(), identity.clone());
        tokio::spawn(async move {
            let mut wait = Duration::from_millis(200);
            loop {
                match certs.get(&identity).await {
                    Ok(_) => {
                        certificates.set_ready();
                        // Held, so that the condition stays (met) for the run.
                        return std::future::pending::<()>().await;
                    }
                    Err(e) => {
                        tracing::warn!(error = %meshkit_cli::error_chain(&e), "cannot obtain the gateway's certificate yet; retrying");
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(Duration::from_secs(10));
                    }
                }
            }
        })
    };

    let mut servers = tokio::task::JoinSet::new();
    if let Some(addr) = args.listen {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        tracing::info!(%addr, "HTTP listener");
        servers.spawn(gateway.clone().serve_http(listener));
    }
    if let Some(addr) = args.listen_tls {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        tracing::info!(%addr, "HTTPS listener");
        servers.spawn(gateway.clone().serve_https(listener));
    }
    let gateway_api = args
        .gateway_api_address
        .map(|address| tokio::spawn(gateway.clone().serve_gateway_api(address)));
    listeners.set_ready();

    let reload = async {
        let (Some(config_tx), Some((ingress, mesh))) = (&config_tx, &files) else {
            return std::future::pending().await;
        };
        reload_every_second(config_tx, "configuration", || {
            load_config(ingress, mesh, &secrets)
        })
        .await
    };
    tokio::select! {
        () = stop_signal() => {
            tracing::info!(drain_seconds = args.drain_seconds, "stopping: draining");
            tokio::select! {
                () = gateway.drain(Duration::from_secs(args.drain_seconds)) => {}
                () = stop_signal() => tracing::info!("second stop signal: stopping now"),
            }
        }
        () = reload => {}
        Some(done) = servers.join_next() => {
            if let Ok(Err(e)) = done {
                return Err(e.into());
            }
        }
    }
    servers.shutdown().await;
    if let Some(task) = gateway_api {
        task.abort();
    }
    obtain.abort();
    let _ = admin_stop.send(());
    let _ = admin_task.await;
    drop(listeners);
    Ok(())
}

/// The admin endpoint: the gateway's metrics, readiness and config dump (with the gateway's
/// own certificate: identity and expiry), and the log filter.
fn admin(
    gateway: &Gateway,
    certs: &SvidCache,
    identity: &meshkit_identity::SpiffeId,
    log_filter: LogFilter,
) -> Admin {
    let mut registry = Registry::default();
    gateway.register_metrics(&mut registry);
    let (gateway, certs, identity) = (gateway.clone(), certs.clone(), identity.clone());
    let readiness = gateway.readiness().clone();
    Admin::new("ingress-gateway", registry)
        .with_readiness(readiness)
        .with_log_filter(log_filter)
        .with_config_dump(move || {
            let mut dump = gateway.config_dump();
            let svid = certs.current(&identity).map(|svid| {
                let not_after = svid
                    .not_after()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                serde_json::json!({
                    "identity": svid.spiffe_id().as_ref(),
                    "not_after_unix": not_after,
                })
            });
            if let Some(out) = dump.as_object_mut() {
                out.insert(
                    "certificate".to_owned(),
                    svid.unwrap_or(serde_json::Value::Null),
                );
            }
            dump
        })
}

/// What a client may hold, and whose forwarding headers count (docs/gateway.md, "Limits").
#[derive(clap::Args, Debug)]
struct LimitArgs {
    /// Client connections open at once, all listeners together; more are closed at accept
    /// [default: 10000].
    #[arg(long)]
    max_connections: Option<usize>,
    /// The largest request body in bytes; more gets 413 [default: 16777216].
    #[arg(long)]
    max_request_body_bytes: Option<u64>,
    /// Seconds a request body may take to arrive; longer gets 408 [default: 60].
    #[arg(long)]
    request_body_timeout_seconds: Option<u64>,
    /// Seconds a backend may take to answer after the request body; longer gets 504
    /// [default: 30].
    #[arg(long)]
    response_timeout_seconds: Option<u64>,
    /// Seconds an HTTP/1 request head may take [default: 30].
    #[arg(long)]
    header_read_timeout_seconds: Option<u64>,
    /// Seconds a client connection may stay with no request in flight [default: 60].
    #[arg(long)]
    idle_timeout_seconds: Option<u64>,
    /// Seconds a write to a client that stopped reading may wait before the connection is
    /// closed [default: 30].
    #[arg(long)]
    write_stall_timeout_seconds: Option<u64>,
    /// `ADDRESS` or `ADDRESS/PREFIX` of a proxy in front of the gateway whose
    /// X-Forwarded-For and Forwarded are kept; from others they are replaced. Repeatable.
    #[arg(long = "trusted-proxy")]
    trusted_proxies: Vec<meshkit_gateway::Cidr>,
    /// Name the answering workload and its SPIFFE ID in answer headers (debugging; tells
    /// clients about the mesh).
    #[arg(long)]
    debug_backend_headers: bool,
}

impl LimitArgs {
    fn apply(&self, mut settings: GatewaySettings) -> GatewaySettings {
        let secs = std::time::Duration::from_secs;
        if let Some(max) = self.max_connections {
            settings = settings.with_max_connections(max);
        }
        if let Some(max) = self.max_request_body_bytes {
            settings = settings.with_max_request_body_bytes(max);
        }
        if let Some(s) = self.request_body_timeout_seconds {
            settings = settings.with_request_body_timeout(secs(s));
        }
        if let Some(s) = self.response_timeout_seconds {
            settings = settings.with_response_timeout(secs(s));
        }
        if let Some(s) = self.header_read_timeout_seconds {
            settings = settings.with_header_read_timeout(secs(s));
        }
        if let Some(s) = self.idle_timeout_seconds {
            settings = settings.with_idle_timeout(secs(s));
        }
        if let Some(s) = self.write_stall_timeout_seconds {
            settings = settings.with_write_stall_timeout(secs(s));
        }
        settings
            .with_trusted_proxies(self.trusted_proxies.iter().copied())
            .with_backend_headers(self.debug_backend_headers)
    }
}
