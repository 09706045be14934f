//! `node-proxy`: ztunnel's job on loopback, from a mesh file or the control plane's xDS, and an
//! Istio-protocol CA.
//!
//! ```text
//! node-proxy --node node-a --mesh mesh.json \
//!     --ca http://127.0.0.1:15012 --ca-root root.pem --ca-token demo-token \
//!     --outbound 127.0.0.11:8080=web.shop.svc.cluster.local:80
//! ```
//!
//! The mesh file is the JSON form of `meshkit_mesh::MeshConfig` (workloads and services); it
//! is re-read when it changes.
//!
//! The admin endpoint (`--admin-addr`, 127.0.0.1:15020 by default) answers `/healthz/ready`,
//! `/metrics` (and `/stats/prometheus`), `/config_dump` and `/logging?level=`. Access-log
//! lines go to standard error at info (`--access-log-json` for JSON). SIGTERM or SIGINT drains:
//! readiness 503, no new connections, open ones finish for up to `--drain-seconds` (5), then
//! the rest are reset and the process exits 0.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use meshkit_cli::{
    CaToken, CliError, ControlPlaneArgs, init_logging_with_filter, load_bundle, parse_id,
    reload_every_second, run_main,
};
use meshkit_identity::istio::IstioCaClient;
use meshkit_identity::{SvidCache, TrustDomain};
use meshkit_mesh::MeshConfig;
use meshkit_mesh::feed::ProxyNode;
use meshkit_node_proxy::admin::{AccessLog, LogFilter, Registry};
use meshkit_node_proxy::{InboundPolicy, NodeProxy, NodeProxyConfig, OutboundListener, Telemetry};
use meshkit_xds_client::envoy::Node;
use meshkit_xds_client::protocol::Mode;
use tokio::sync::watch;

// mimalloc keeps the HTTP/2 frame buffers glibc would return to the kernel (docs/hbone.md).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Node proxy: inbound HBONE per local workload, outbound listeners per service port.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// This node's name (workloads with this `node` are served inbound).
    #[arg(long, env = "NODE_NAME")]
    node: String,
    /// The mesh's trust domain.
    #[arg(long, default_value = "cluster.local")]
    trust_domain: String,
    /// JSON file with the mesh's workloads and services; re-read when it changes.
    #[arg(long, required_unless_present = "xds", conflicts_with = "xds")]
    mesh: Option<PathBuf>,
    /// The control plane's ADS URL (`https://HOST:PORT`, or `http://` for a plaintext
    /// control plane on loopback): workloads over Delta xDS instead of a mesh file.
    #[arg(long)]
    xds: Option<String>,
    /// The cluster this node belongs to: sent to the control plane in the xDS node, and to
    /// the CA as the `clusterid` header (istiod requires it of a node proxy that asks for
    /// its workloads' certificates).
    #[arg(long, env = "CLUSTER_ID", default_value = "Kubernetes")]
    cluster: String,
    /// The node proxy's own Pod name. With --pod-namespace, the node proxy names itself to
    /// the control plane as ztunnel does (`ztunnel~IP~POD.NAMESPACE~...` and its metadata),
    /// as istiod expects of a node proxy; without, by the node's name alone.
    #[arg(long, env = "POD_NAME", requires = "pod_namespace")]
    pod_name: Option<String>,
    /// The node proxy's own Pod namespace: that of the ServiceAccount its token belongs to.
    #[arg(long, env = "POD_NAMESPACE", requires = "pod_name")]
    pod_namespace: Option<String>,
    /// The node proxy's own Pod address, sent as `INSTANCE_IPS`.
    #[arg(long, env = "INSTANCE_IP", default_value = "127.0.0.1")]
    instance_ip: std::net::IpAddr,
    /// The node proxy's own ServiceAccount, sent as `SERVICE_ACCOUNT`.
    #[arg(long, env = "SERVICE_ACCOUNT")]
    service_account: Option<String>,
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
    /// `LISTEN=HOST:PORT`: an outbound listener for port PORT of service HOST. Repeatable.
    #[arg(long = "outbound", value_parser = parse_outbound)]
    outbound: Vec<OutboundListener>,
    /// Refuse tunnels from this SPIFFE ID (repeatable).
    #[arg(long = "deny-id")]
    deny_ids: Vec<String>,
    /// Admit only these SPIFFE IDs (repeatable; default: the whole trust domain).
    #[arg(long = "allow-id")]
    allow_ids: Vec<String>,
    /// The HBONE port on every workload address.
    #[arg(long, default_value_t = meshkit_hbone::HBONE_PORT)]
    hbone_port: u16,
    /// Worker threads (1: everything on one thread).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// The admin endpoint: /healthz/ready, /metrics, /stats/prometheus, /config_dump,
    /// /logging. Unauthenticated: keep it on localhost.
    #[arg(long, default_value = "127.0.0.1:15020")]
    admin_addr: SocketAddr,
    /// Access-log lines as JSON objects instead of key=value text.
    #[arg(long)]
    access_log_json: bool,
    /// On SIGTERM, how long open connections may take to finish before they are reset.
    #[arg(long, default_value_t = 5)]
    drain_seconds: u64,
    /// Open outbound HBONE connections from the source workload's own address (it must be an
    /// address of this host), so that peers see the workload as the source, as IP-block
    /// policies expect.
    #[arg(long)]
    preserve_source_address: bool,
    /// Take plaintext TCP redirected (netfilter REDIRECT) to this address for the local
    /// workloads, decided by the mesh's policies without an identity (ztunnel's port 15006).
    #[arg(long, value_name = "ADDR")]
    inbound_plaintext: Option<std::net::SocketAddr>,
}

fn parse_outbound(s: &str) -> Result<OutboundListener, String> {
    let (listen, target) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected LISTEN=HOST:PORT"))?;
    let listen: SocketAddr = listen
        .parse()
        .map_err(|e| format!("listen address {listen:?}: {e}"))?;
    let (host, port) = target
        .rsplit_once(':')
        .ok_or_else(|| format!("{target:?}: expected HOST:PORT"))?;
    let port = port.parse().map_err(|e| format!("port {port:?}: {e}"))?;
    Ok(OutboundListener::new(listen, host, port))
}

fn main() -> ExitCode {
    let filter = init_logging_with_filter();
    let args = Args::parse();
    run_main("node-proxy", args.threads, run(args, filter))
}

/// SIGTERM or SIGINT, with the handlers installed when this is called (not when the future is
/// first polled), so that a signal during the start-up drains instead of killing the process.
fn stop_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

fn read_mesh(path: &std::path::Path) -> Result<MeshConfig, CliError> {
    MeshConfig::load(path).map_err(|e| meshkit_cli::error_chain(&e).into())
}

async fn run(args: Args, filter: LogFilter) -> Result<(), CliError> {
    let stop = stop_signal().map_err(|e| format!("installing the signal handlers: {e}"))?;
    let mut telemetry = Telemetry::new();
    if args.access_log_json {
        telemetry = telemetry.with_access_log(AccessLog::json());
    }
    let admin_listener = tokio::net::TcpListener::bind(args.admin_addr)
        .await
        .map_err(|e| format!("admin listener {}: {e}", args.admin_addr))?;
    let admin_addr = admin_listener.local_addr()?;
    let admin = telemetry.admin(Registry::default()).with_log_filter(filter);
    tokio::spawn(admin.serve(admin_listener, std::future::pending()));
    tracing::info!(admin = %admin_addr, "admin endpoint");
    let drain = Duration::from_secs(args.drain_seconds);

    let td = TrustDomain::new(&args.trust_domain)
        .map_err(|e| format!("--trust-domain {:?}: {e}", args.trust_domain))?;
    let bundles = load_bundle(&args.ca_root, &td)?;
    let channel = args.control_plane.ca_channel(&args.ca, &args.ca_root)?;
    let mut ca = IstioCaClient::new(channel)
        .with_impersonated_identity(true)
        .with_cluster_id(&args.cluster)
        .map_err(|e| format!("--cluster {:?}: {e}", args.cluster))?;
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

    let mut policy = InboundPolicy::any();
    for id in &args.deny_ids {
        policy = policy.deny(parse_id("--deny-id", id)?);
    }
    for id in &args.allow_ids {
        policy = policy.allow(parse_id("--allow-id", id)?);
    }
    let mut config = NodeProxyConfig::new(args.node.clone(), td)
        .with_policy(policy)
        .with_hbone_port(args.hbone_port)
        .with_client(meshkit_cli::hbone_client_config())
        .with_telemetry(telemetry)
        // Inbound tunnels must never reach the admin endpoint.
        .with_reserved(admin_addr);
    for rule in args.outbound {
        config = config.with_outbound(rule);
    }
    if args.preserve_source_address {
        config = config.preserving_source_address();
    }
    if let Some(addr) = args.inbound_plaintext {
        config = config.with_inbound_plaintext(addr);
    }

    let Some(mesh_file) = args.mesh.clone() else {
        // Workloads from the control plane, over Delta ADS.
        let ads = args.xds.clone().unwrap_or_default();
        let node = match (&args.pod_name, &args.pod_namespace) {
            (Some(pod), Some(namespace)) => {
                let mut node = ProxyNode::new(&args.node, pod, namespace, args.instance_ip)
                    .with_cluster_id(&args.cluster);
                if let Some(account) = &args.service_account {
                    node = node.with_service_account(account);
                }
                node.to_node()
            }
            _ => Node {
                id: args.node.clone(),
                cluster: args.cluster.clone(),
                ..Default::default()
            },
        };
        let xds = args.control_plane.xds_config(
            &ads,
            meshkit_xds_client::ClientConfig::new(ads.clone(), Mode::Delta, node),
        )?;
        let (mesh_rx, _feed) = meshkit_mesh::feed::mesh_over_xds(xds);
        let config = config.waiting_for_first_mesh();
        let mut stop = std::pin::pin!(stop);
        let proxy = tokio::select! {
            proxy = NodeProxy::start(config, mesh_rx, certs, bundles) => proxy?,
            () = &mut stop => return Ok(()),
        };
        tracing::info!(node = %args.node, %ads, outbound = ?proxy.outbound_addrs(), "node proxy started, workloads over xDS");
        stop.await;
        return finish(proxy, drain).await;
    };
    let (mesh_tx, mesh_rx) = watch::channel(read_mesh(&mesh_file)?);
    let mut stop = std::pin::pin!(stop);
    let proxy = tokio::select! {
        proxy = NodeProxy::start(config, mesh_rx, certs, bundles) => proxy?,
        () = &mut stop => return Ok(()),
    };
    tracing::info!(node = %args.node, outbound = ?proxy.outbound_addrs(), inbound = ?proxy.inbound_addrs(), "node proxy started");

    let reload = reload_every_second(&mesh_tx, "mesh file", || read_mesh(&mesh_file));
    tokio::select! {
        () = stop => {}
        () = reload => {}
    }
    finish(proxy, drain).await
}

/// Drains `proxy` for up to `deadline`, logging how it went.
async fn finish(proxy: NodeProxy, deadline: Duration) -> Result<(), CliError> {
    tracing::info!(deadline = ?deadline, "stopping: draining");
    let drained = proxy.drain(deadline).await;
    tracing::info!(reset = drained.reset, "drained; exiting");
    Ok(())
}
