//! meshkit's control plane: reads the Kubernetes API server (or a folder of Kubernetes and
//! Istio manifests), serves what it reads over ADS (SotW and Delta) to node proxies,
//! meshkit's gateway and Envoy, and runs a CA for the holders of ServiceAccount tokens (with
//! Kubernetes) and of bootstrap tokens. See `docs/control-plane.md`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use meshkit_cli::{CliError, init_logging_with_filter, stop_signal};
use meshkit_control_plane::LogFilter;
use meshkit_control_plane::kube_source::{self, KubeSourceConfig};
use meshkit_control_plane::leader::LeaseConfig;
use meshkit_control_plane::service_accounts::{ServiceAccountAuth, ServiceAccountRef};
use meshkit_control_plane::status::{AddressSource, StatusConfig};
use meshkit_control_plane::tls::ServingTls;
use meshkit_control_plane::translate::TranslateOptions;
use meshkit_control_plane::{CaSource, ControlPlane, ControlPlaneConfig};

// mimalloc keeps the HTTP/2 frame buffers glibc would return to the kernel (docs/hbone.md).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Serve the mesh read from Kubernetes (or a folder of manifests) over ADS, and certificates
/// over Istio's CA protocol.
///
/// The source: `--kubeconfig`, `--in-cluster` or `--manifests`; with none of them, the
/// cluster the process runs in when it runs in a Pod, else `examples/demo/manifests`.
#[derive(Parser, Debug)]
#[command(name = "control-plane", version)]
struct Args {
    /// Folder of manifests (Ingress, IngressClass, TLS Secret, ServiceEntry, WorkloadEntry,
    /// AuthorizationPolicy, PeerAuthentication, GatewayClass, Gateway, HTTPRoute,
    /// ReferenceGrant, Namespace, Node, Pod, Service, EndpointSlice); re-read when a file
    /// changes.
    #[arg(long, conflicts_with_all = ["kubeconfig", "in_cluster"])]
    manifests: Option<PathBuf>,
    /// Watch the Kubernetes API server this kubeconfig file names (its current context).
    #[arg(long, conflicts_with = "in_cluster")]
    kubeconfig: Option<PathBuf>,
    /// Watch the API server of the cluster the process runs in, with its Pod's
    /// ServiceAccount.
    #[arg(long)]
    in_cluster: bool,
    /// ADS listen address.
    #[arg(long, default_value = "127.0.0.1:15010")]
    ads_listen: SocketAddr,
    /// CA (IstioCertificateService) listen address.
    #[arg(long, default_value = "127.0.0.1:15012")]
    ca_listen: SocketAddr,
    /// Token file: one token per line, then its xDS role (`node=NAME` or `gateway=NAME`) and
    /// the SPIFFE IDs (or `prefix/*`) it may request from the CA. Re-read when it changes:
    /// removing a line revokes its token without a restart. Without it ADS and the CA refuse
    /// every client (except ServiceAccount tokens, with Kubernetes).
    #[arg(long)]
    tokens: Option<PathBuf>,
    /// Trust domain of the mesh.
    #[arg(long, default_value = "cluster.local")]
    trust_domain: String,
    /// PEM certificate of the CA (a root, or an intermediate followed by its issuers), with
    /// --ca-key; without both, a root is generated in memory for this run.
    #[arg(long, requires = "ca_key")]
    ca_cert: Option<PathBuf>,
    /// PEM private key of the CA certificate.
    #[arg(long, requires = "ca_cert")]
    ca_key: Option<PathBuf>,
    /// When neither --ca-cert nor --ca-key exists yet, generate a root and write it there
    /// (the key with mode 0600) instead of failing; later starts load it.
    #[arg(long, requires = "ca_cert")]
    ca_generate_if_missing: bool,
    /// Writes the CA root certificate (PEM) here, for proxies' trust bundles.
    #[arg(long)]
    root_out: Option<PathBuf>,
    /// Envoy HTTP listener address sent in LDS.
    #[arg(long, default_value = "0.0.0.0:8080")]
    envoy_http: SocketAddr,
    /// Envoy HTTPS listener address sent in LDS.
    #[arg(long, default_value = "0.0.0.0:8443")]
    envoy_https: SocketAddr,
    /// Only Ingresses of this class (or without one) are translated for Envoy.
    #[arg(long)]
    ingress_class: Option<String>,
    /// The address Envoy's Gateway API listeners bind, each on its Gateway listener's port.
    #[arg(long, default_value = "0.0.0.0")]
    envoy_gateway_api_address: std::net::IpAddr,
    /// The Gateway API controller name whose GatewayClasses' Gateways are served.
    #[arg(long, default_value = meshkit_control_plane::gateway_api::DEFAULT_CONTROLLER)]
    gateway_controller: String,
    /// DNS name in the serving certificate of ADS and the CA (repeatable; the listen IPs are
    /// added as IP names).
    #[arg(long = "tls-dns-name", default_value = "istiod.istio-system.svc")]
    tls_dns_names: Vec<String>,
    /// Serve ADS and the CA in plaintext (refused unless both listen on loopback). Clients
    /// still need tokens.
    #[arg(long)]
    plaintext: bool,
    /// Admin endpoint (readiness, Prometheus metrics, config dump, log filter), istiod's
    /// monitoring port by default. Unauthenticated: keep it on loopback.
    #[arg(long, default_value = "127.0.0.1:15014")]
    admin_addr: SocketAddr,
    /// With Kubernetes: write no status (Ingress addresses, Gateway API conditions).
    #[arg(long)]
    no_status: bool,
    /// With Kubernetes: the gateway's address (an IP or a host name; repeatable), written
    /// in Ingress and Gateway status.
    #[arg(long = "gateway-address", conflicts_with = "gateway_service")]
    gateway_addresses: Vec<String>,
    /// With Kubernetes: the Service in front of the gateway (`NAMESPACE/NAME`), whose load
    /// balancer status (else external IPs) gives the address written in Ingress and Gateway
    /// status.
    #[arg(long)]
    gateway_service: Option<String>,
    /// With Kubernetes: write status from every replica, without electing one on a Lease
    /// (for a single replica only).
    #[arg(long)]
    no_leader_election: bool,
    /// The Lease's namespace; default: the kubeconfig's namespace (in a Pod, its own).
    #[arg(long)]
    lease_namespace: Option<String>,
    /// The Lease's name (deploy/rbac.yaml lets the control plane write only
    /// istio-system/meshkit-control-plane: change its Role with this).
    #[arg(long, default_value = "meshkit-control-plane")]
    lease_name: String,
    /// This replica's name in the Lease; default: the `POD_NAME` variable, else the host
    /// name, with the process id.
    #[arg(long)]
    identity: Option<String>,
    /// With Kubernetes: take only the --tokens file's tokens, not ServiceAccount tokens.
    #[arg(long)]
    no_service_account_tokens: bool,
    /// The node proxies' ServiceAccounts (`NAMESPACE/NAME`, comma-separated), whose
    /// Pod-bound tokens act for their Pod's node (istiod's CA_TRUSTED_NODE_ACCOUNTS).
    #[arg(long, value_delimiter = ',', default_value = "istio-system/ztunnel")]
    trusted_node_accounts: Vec<ServiceAccountRef>,
    /// The gateways' ServiceAccounts (`NAMESPACE/NAME`, comma-separated), served as
    /// gateways over ADS.
    #[arg(long, value_delimiter = ',')]
    gateway_accounts: Vec<ServiceAccountRef>,
    /// The audience ServiceAccount tokens must have.
    #[arg(long, default_value = meshkit_control_plane::service_accounts::ISTIO_CA_AUDIENCE)]
    token_audience: String,
}

fn main() -> ExitCode {
    #[cfg(not(target_os = "linux"))]
    return_freed_memory();
    let log_filter = init_logging_with_filter();
    let args = Args::parse();
    meshkit_cli::run_main("control-plane", 2, run(args, log_filter))
}

/// mimalloc's options, by their index in mimalloc 3's `mi_option_e`.
const MI_OPTION_ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Makes mimalloc give freed memory back to the kernel, and as soon as it is free. The
/// control plane's memory comes in bursts (a list of every object, the first push to each
/// node proxy, a model built anew) and then sits; by default mimalloc commits its arenas
/// up front (on a system that overcommits, as Linux does) and keeps what a burst freed
/// there, and purges elsewhere a second later, on some later allocation. Arenas committed
/// as they are used, and purged at once, leave resident what is live: measured beside istiod
/// (docs/performance.md), a quarter less resident memory after sync, at no measurable cost
/// per change. The proxies keep mimalloc's defaults: their buffers are reused at once.
///
/// It must run before the first allocation, which reserves the first arena: on Linux, as
/// the process starts ([`RETURN_FREED_MEMORY`]); elsewhere, first thing in `main`.
#[allow(unsafe_code)]
extern "C" fn return_freed_memory() {
    // SAFETY: `mi_option_set` takes any option and value, and allocates nothing; it runs
    // before any other thread exists.
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_ARENA_EAGER_COMMIT, 0);
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0);
    }
}

/// Runs [`return_freed_memory`] as the process starts, before `main` and any allocation.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
#[used]
#[unsafe(link_section = ".init_array")]
static RETURN_FREED_MEMORY: extern "C" fn() = return_freed_memory;

async fn run(args: Args, log_filter: LogFilter) -> Result<(), CliError> {
    let kube = source(&args).await?;
    let trust_domain = args
        .trust_domain
        .parse()
        .map_err(|e| format!("--trust-domain {:?}: {e}", args.trust_domain))?;
    if args.tokens.is_none() && (kube.is_none() || args.no_service_account_tokens) {
        tracing::warn!("no --tokens file: the CA will refuse every request");
    }
    let ca = match (args.ca_cert.clone(), args.ca_key.clone()) {
        (Some(cert), Some(key)) if args.ca_generate_if_missing => {
            CaSource::LoadOrGenerate { cert, key }
        }
        (Some(cert), Some(key)) => CaSource::Files { cert, key },
        _ => CaSource::Generate,
    };
    let translate = TranslateOptions {
        http_listener: args.envoy_http,
        https_listener: Some(args.envoy_https),
        ingress_class: args.ingress_class.clone(),
        gateway_api_address: args.envoy_gateway_api_address,
        gateway_controller: Some(args.gateway_controller.clone()),
        ..TranslateOptions::default()
    };
    let config = match kube {
        Some(kube) if args.no_service_account_tokens => {
            ControlPlaneConfig::kubernetes(kube_config(&args, kube)?)
        }
        Some(kube) => ControlPlaneConfig::kubernetes(kube_config(&args, kube.clone())?)
            .with_service_accounts(
                ServiceAccountAuth::new(kube)
                    .with_audience(&args.token_audience)
                    .with_node_accounts(args.trusted_node_accounts.clone())
                    .with_gateway_accounts(args.gateway_accounts.clone()),
            ),
        None => ControlPlaneConfig::new(
            args.manifests
                .clone()
                .unwrap_or_else(|| "examples/demo/manifests".into()),
        ),
    };
    let config = config
        .with_ads_addr(args.ads_listen)
        .with_ca_addr(args.ca_listen)
        .with_trust_domain(trust_domain)
        .with_ca(ca)
        .with_translate(translate)
        .with_admin_addr(args.admin_addr)
        .with_log_filter(log_filter);
    let config = if args.plaintext {
        config.with_plaintext()
    } else {
        config.with_tls(
            ServingTls::default()
                .with_dns_names(args.tls_dns_names)
                .with_provider(meshkit_cli::crypto_provider()),
        )
    };
    let config = match args.tokens {
        Some(path) => config.with_tokens_file(path),
        None => config,
    };
    let cp = ControlPlane::start(config).await?;
    if let Some(addr) = cp.admin_addr() {
        tracing::info!(%addr, "admin endpoint: /healthz/ready /metrics /config_dump /logging");
    }
    if let Some(path) = &args.root_out {
        std::fs::write(path, cp.root_pem())
            .map_err(|e| format!("cannot write the root to {}: {e}", path.display()))?;
        tracing::info!(path = %path.display(), "CA root written");
    }
    stop_signal().await;
    tracing::info!("stopping");
    cp.shutdown().await;
    Ok(())
}

/// The Kubernetes source the arguments ask for over `client`: status, its address, the
/// election.
fn kube_config(args: &Args, client: kube::Client) -> Result<KubeSourceConfig, CliError> {
    if args.no_status {
        return Ok(KubeSourceConfig::new(client).without_status());
    }
    let mut status = StatusConfig::default();
    if let Some(service) = &args.gateway_service {
        let Some((namespace, name)) = service.split_once('/') else {
            return Err(format!("--gateway-service {service:?}: expected NAMESPACE/NAME").into());
        };
        status = status.with_address(AddressSource::Service {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        });
    } else if !args.gateway_addresses.is_empty() {
        status = status.with_address(AddressSource::Fixed(args.gateway_addresses.clone()));
    }
    if !args.no_leader_election {
        let namespace = args
            .lease_namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_owned());
        let identity = args.identity.clone().unwrap_or_else(|| {
            let host = std::env::var("POD_NAME")
                .or_else(|_| std::env::var("HOSTNAME"))
                .unwrap_or_else(|_| "control-plane".to_owned());
            format!("{host}-{}", std::process::id())
        });
        status =
            status.with_lease(LeaseConfig::new(namespace, identity).with_name(&args.lease_name));
    }
    Ok(KubeSourceConfig::new(client).with_status(status))
}

/// The Kubernetes client the arguments ask for, `None` for the manifests folder.
async fn source(args: &Args) -> Result<Option<kube::Client>, CliError> {
    let in_a_pod = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    let config = if let Some(path) = &args.kubeconfig {
        let file = kube::config::Kubeconfig::read_from(path)
            .map_err(|e| format!("--kubeconfig {}: {e}", path.display()))?;
        kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| format!("--kubeconfig {}: {e}", path.display()))?
    } else if args.in_cluster || (args.manifests.is_none() && in_a_pod) {
        if !args.in_cluster {
            tracing::info!(
                "running in a Pod without --manifests: watching this cluster's API server"
            );
        }
        kube::Config::incluster().map_err(|e| format!("in-cluster configuration: {e}"))?
    } else {
        return Ok(None);
    };
    let client = kube_source::client(&config, meshkit_cli::crypto_provider())
        .map_err(|e| format!("Kubernetes client: {}", meshkit_cli::error_chain(&e)))?;
    Ok(Some(client))
}
