//! `hbone-serve`: an HBONE server that forwards each accepted CONNECT to its `:authority`.
//!
//! ```text
//! hbone-serve --listen 127.0.0.1:15008 --cert server.crt --key server.key --ca ca.crt \
//!     --allow-id spiffe://cluster.local/ns/default/sa/client
//! ```
//!
//! Logs one line per tunnel with the verified peer ID; drains and stops on SIGINT/SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use meshkit_cli::{
    CliError, init_logging, load_bundle, load_svid, parse_id, run_main, stop_signal,
};
use meshkit_hbone::{ConnectRequest, Forward, Server, ServerConfig, decide_fn};
use meshkit_identity::{Authorize, SingleIdentity, SpiffeVerifier, TrustDomain};
use tokio::net::TcpListener;

// mimalloc keeps the HTTP/2 frame buffers glibc would return to the kernel (docs/hbone.md).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// HBONE server: mutual TLS 1.3 + HTTP/2 CONNECT, forwarding each tunnel to its target.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:15008")]
    listen: SocketAddr,
    /// PEM certificate chain of this server (an X.509-SVID, leaf first).
    #[arg(long)]
    cert: PathBuf,
    /// PEM private key of the certificate.
    #[arg(long)]
    key: PathBuf,
    /// PEM CA bundle that client certificates must chain to.
    #[arg(long)]
    ca: PathBuf,
    /// A client SPIFFE ID to accept (repeatable).
    #[arg(long = "allow-id")]
    allow_ids: Vec<String>,
    /// Accept any client of this trust domain.
    #[arg(long = "allow-trust-domain")]
    allow_trust_domain: Option<String>,
    /// Send a PROXY protocol v2 header (with the client's SPIFFE ID) to each target.
    #[arg(long)]
    proxy_protocol: bool,
    /// Seconds open tunnels may keep running after a stop signal.
    #[arg(long, default_value_t = 10)]
    drain_seconds: u64,
    /// Worker threads (1: everything on one thread).
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

fn main() -> ExitCode {
    init_logging();
    let args = Args::parse();
    run_main("hbone-serve", args.threads, run(args))
}

async fn run(args: Args) -> Result<(), CliError> {
    let svid = load_svid(&args.cert, &args.key)?;
    let authorize = match (&args.allow_trust_domain, args.allow_ids.is_empty()) {
        (Some(td), true) => Authorize::TrustDomain(
            TrustDomain::new(td).map_err(|e| format!("--allow-trust-domain {td:?}: {e}"))?,
        ),
        (None, false) => Authorize::OneOf(
            args.allow_ids
                .iter()
                .map(|v| parse_id("--allow-id", v))
                .collect::<Result<_, _>>()?,
        ),
        _ => return Err("give either --allow-id (repeatable) or --allow-trust-domain".into()),
    };
    // Clients are checked against the roots of this server's own trust domain.
    let trust_domain = svid.spiffe_id().trust_domain();
    let bundles = load_bundle(&args.ca, &trust_domain)?;
    let tls = meshkit_cli::tls_settings()
        .server_config(svid.clone(), SpiffeVerifier::new(bundles, authorize))?;

    let forward = Forward::new().with_proxy_protocol(args.proxy_protocol);
    let service = decide_fn(move |req: ConnectRequest| {
        let forward = forward.clone();
        async move {
            tracing::info!(peer = %req.peer, source = %req.source, target = %req.target, "tunnel");
            forward.decide(req).await
        }
    });
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    tracing::info!(listen = %args.listen, identity = %svid.spiffe_id(), "hbone-serve ready");
    Server::new(ServerConfig::default(), SingleIdentity::new(tls), service)
        .serve_with_shutdown(
            listener,
            stop_signal(),
            Duration::from_secs(args.drain_seconds),
        )
        .await?;
    tracing::info!("hbone-serve stopped");
    Ok(())
}
