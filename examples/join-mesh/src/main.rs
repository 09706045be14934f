//! `join-mesh`: a Rust service joining an Istio ambient mesh run by istiod, built from
//! meshkit's SDK crates alone (meshkit-identity, meshkit-xds-client, meshkit-hbone).
//!
//! ```text
//! join-mesh --istiod https://istiod.istio-system.svc:15012 \
//!     --root /var/run/secrets/istio/root-cert.pem \
//!     --token-file /var/run/secrets/tokens/istio-token \
//!     --namespace shop --service-account web \
//!     --connect reviews.shop.svc.cluster.local:9080 < request > response
//! ```
//!
//! It proves its identity to istiod with its ServiceAccount token, gets its own SVID from
//! istiod's CA (renewed in the background before it expires), follows the workload API
//! (`istio.workload.Address`) over Delta xDS, resolves the service by host name to its
//! workloads, and opens an HBONE tunnel to one of them, verifying that the peer proves the
//! workload's identity. Standard input goes through the tunnel, half-closed at its end; what
//! comes back goes to standard output. The exit status is 0 when the exchange completed,
//! 1 otherwise, with the reason on standard error (a policy refusing it is answered 401).
//!
//! docs/join-mesh.md walks through the code step by step.

mod workload;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use meshkit_hbone::{Client, ClientConfig, Target};
use meshkit_identity::istio::IstioCaClient;
use meshkit_identity::{
    RotationConfig, SpiffeId, SvidCache, TrustBundle, TrustBundleSet, TrustDomain,
};
use meshkit_xds_client::envoy::Node;
use meshkit_xds_client::envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use meshkit_xds_client::protocol::Mode;
use meshkit_xds_client::{ControlPlaneTls, WatchEvent, XdsClient};
use tokio::io::AsyncWriteExt;
use workload::{AddressResource, Endpoint};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// Join an Istio ambient mesh and tunnel standard input to a mesh service.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// istiod's xDS and CA address (its port 15012).
    #[arg(long, env = "XDS_ADDRESS")]
    istiod: String,
    /// The mesh root (the `root-cert.pem` of the `istio-ca-root-cert` ConfigMap): istiod's
    /// serving certificate and every workload's chain end there.
    #[arg(long, env = "ROOT_CA")]
    root: PathBuf,
    /// The name istiod's certificate must carry, when the address's host is another.
    #[arg(long, default_value = "istiod.istio-system.svc")]
    server_name: String,
    /// The file holding this service's ServiceAccount token (audience `istio-ca`); read for
    /// every call, so a rotated token is used once written.
    #[arg(long, env = "AUTH_TOKEN")]
    token_file: PathBuf,
    /// This service's namespace.
    #[arg(long, env = "POD_NAMESPACE")]
    namespace: String,
    /// This service's ServiceAccount.
    #[arg(long, env = "SERVICE_ACCOUNT")]
    service_account: String,
    /// This service's Pod name, as it names itself to istiod.
    #[arg(long, env = "POD_NAME", default_value = "join-mesh")]
    pod_name: String,
    /// This service's address, as it names itself to istiod.
    #[arg(long, env = "INSTANCE_IP", default_value = "127.0.0.1")]
    instance_ip: std::net::IpAddr,
    /// The cluster istiod runs as (sent to the CA as `clusterid`).
    #[arg(long, env = "CLUSTER_ID", default_value = "Kubernetes")]
    cluster_id: String,
    /// The mesh's trust domain.
    #[arg(long, default_value = "cluster.local")]
    trust_domain: String,
    /// `HOST:PORT`: the mesh service to reach.
    #[arg(long)]
    connect: String,
    /// How long to wait for the service to appear in the mesh.
    #[arg(long, default_value_t = 30)]
    wait_seconds: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let mut chain = e.to_string();
            let mut source = e.source();
            while let Some(cause) = source {
                chain += &format!(": {cause}");
                source = cause.source();
            }
            eprintln!("join-mesh: {chain}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Error> {
    let (host, port) = args
        .connect
        .rsplit_once(':')
        .ok_or("--connect: expected HOST:PORT")?;
    let port: u16 = port.parse().map_err(|e| format!("--connect port: {e}"))?;

    // 1. istiod, over TLS verified against the mesh root.
    let root = std::fs::read_to_string(&args.root)
        .map_err(|e| format!("--root {}: {e}", args.root.display()))?;
    let tls = ControlPlaneTls::from_pem(&root)
        .map_err(|e| format!("--root {}: {e}", args.root.display()))?
        .with_server_name(&args.server_name)
        .map_err(|e| format!("--server-name {:?}: {e}", args.server_name))?;
    let channel = tls.connect_lazy(&args.istiod)?;

    // 2. Our own SVID from istiod's CA, for the identity our token proves, kept fresh.
    let trust_domain = TrustDomain::new(&args.trust_domain)?;
    let me = SpiffeId::from_istio(&trust_domain, &args.namespace, &args.service_account)?;
    let ca = IstioCaClient::new(channel)
        .with_cluster_id(&args.cluster_id)?
        .with_bearer_token_file(&args.token_file);
    let certificates = SvidCache::new(ca, RotationConfig::default());
    let svid = certificates.get(&me).await?.borrow().clone();
    tracing::info!(identity = %me, expires = ?svid.not_after(), "SVID from istiod's CA");

    // 3. The mesh, from istiod's workload API over Delta xDS.
    let node = Node {
        id: format!(
            "sidecar~{}~{}.{ns}~{ns}.svc.cluster.local",
            args.instance_ip,
            args.pod_name,
            ns = args.namespace
        ),
        metadata: Some(metadata(&args)),
        ..Default::default()
    };
    let config = meshkit_xds_client::ClientConfig::new(args.istiod.clone(), Mode::Delta, node)
        .with_control_plane_tls(&tls)?
        .bearer_token_file(&args.token_file);
    let (xds, driver) = XdsClient::new(config);
    tokio::spawn(async move {
        if let Err(e) = driver.run().await {
            tracing::warn!(error = %e, "xDS client stopped");
        }
    });
    let endpoints = resolve(&xds, host, port, Duration::from_secs(args.wait_seconds)).await?;

    // 4. A tunnel to one of its workloads, which must prove the workload's identity.
    let mut bundles = TrustBundleSet::new();
    bundles.insert(TrustBundle::from_pem(trust_domain, &root)?)?;
    let client = Client::new(ClientConfig::default(), certificates, Arc::new(bundles));
    // Any of them will do; a real client would balance and retry across them.
    let endpoint = &endpoints[0];
    tracing::info!(workload = %endpoint.uid, address = %endpoint.ip, port = endpoint.port, identity = %endpoint.identity, "opening HBONE");
    exchange(&client, endpoint, me).await
}

/// The node metadata istiod checks against the token: our namespace and ServiceAccount.
fn metadata(args: &Args) -> Struct {
    let string = |s: &str| Value {
        kind: Some(Kind::StringValue(s.to_owned())),
    };
    Struct {
        fields: [
            ("NAME", args.pod_name.as_str()),
            ("NAMESPACE", &args.namespace),
            ("SERVICE_ACCOUNT", &args.service_account),
            ("CLUSTER_ID", &args.cluster_id),
            ("INSTANCE_IPS", &args.instance_ip.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), string(v)))
        .collect(),
    }
}

/// Follows every `Address` until `host:port` resolves to reachable workloads, for at most
/// `patience`.
async fn resolve(
    xds: &XdsClient,
    host: &str,
    port: u16,
    patience: Duration,
) -> Result<Vec<Endpoint>, Error> {
    let mut watch = xds.watch_all::<AddressResource>();
    let mut mesh = std::collections::BTreeMap::new();
    let mut synced = false;
    let mut why = String::from("nothing from istiod yet");
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        let event = tokio::time::timeout_at(deadline, watch.next())
            .await
            .map_err(|_| format!("{host}:{port} after {patience:?}: {why}"))?
            .ok_or("the xDS client stopped")?;
        match event {
            WatchEvent::Updated { name, resource, .. } => {
                mesh.insert(name, AddressResource::clone(&resource));
            }
            WatchEvent::Removed { name, .. } => {
                mesh.remove(&name);
            }
            WatchEvent::Rejected { name, error } => {
                tracing::warn!(?name, %error, "rejected an Address");
            }
            WatchEvent::Synced => synced = true,
            _ => {}
        }
        if synced {
            match workload::endpoints(mesh.values(), host, port) {
                Ok(found) => return Ok(found),
                Err(e) => why = e,
            }
        }
    }
}

/// Standard input into a tunnel to `endpoint`, half-closed at its end; the answer to standard
/// output.
async fn exchange(client: &Client, endpoint: &Endpoint, me: SpiffeId) -> Result<(), Error> {
    let target = Target::new(
        SocketAddr::new(endpoint.ip, meshkit_hbone::HBONE_PORT),
        SocketAddr::new(endpoint.ip, endpoint.port),
        me,
        endpoint.identity.parse()?,
    );
    let tunnel = client.open(target).await?;
    let (mut from_tunnel, mut to_tunnel) = tokio::io::split(tunnel);
    // Either side failing ends both: a reset tunnel is not left waiting on standard input.
    let send = async {
        tokio::io::copy(&mut tokio::io::stdin(), &mut to_tunnel).await?;
        to_tunnel.shutdown().await
    };
    let receive = async {
        let mut stdout = tokio::io::stdout();
        tokio::io::copy(&mut from_tunnel, &mut stdout).await?;
        stdout.flush().await
    };
    tokio::try_join!(
        async { send.await.map_err(|e| format!("sending: {e}")) },
        async { receive.await.map_err(|e| format!("receiving: {e}")) },
    )?;
    Ok(())
}
