//! `hbone-serve`: an HBONE server that forwards each accepted CONNECT to its `:authority`.
//!
//! ```text
//! hbone-serve --listen 127.0.0.1:15008 --cert server.crt --key server.key --ca ca.crt \
//!     --allow-id spiffe://cluster.local/ns/default/sa/client
//! ```
//!
//! Logs one line per tunnel with the verified peer ID; drains and stops on SIGINT/SIGTERM.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use http::StatusCode;
use meshkit_cli::{
    CliError, init_logging, load_bundle, load_svid, parse_id, run_main, stop_signal,
};
use meshkit_hbone::{ConnectRequest, Decision, Forward, Server, ServerConfig, decide_fn};
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
    /// A target tunnels may reach: `IP` (any port) or `IP:PORT` (repeatable). Default: the
    /// listen address's own IP, or with `0.0.0.0` or `[::]` this host's loopback addresses.
    /// Anything else gets 403: an admitted client must not use the server to reach every
    /// service the host can (the CA, other proxies' ports).
    #[arg(long = "allow-target", value_parser = parse_target_rule)]
    allow_targets: Vec<TargetRule>,
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

/// An address tunnels may reach: an IP, on any port or on one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TargetRule {
    ip: IpAddr,
    port: Option<u16>,
}

impl TargetRule {
    fn admits(&self, target: SocketAddr) -> bool {
        self.ip == target.ip() && self.port.is_none_or(|p| p == target.port())
    }

    /// The default: the listen address's own IP; when it listens on every address, this
    /// host's loopback addresses.
    fn defaults(listen: SocketAddr) -> Vec<Self> {
        let any_port = |ip| Self { ip, port: None };
        if listen.ip().is_unspecified() {
            vec![
                any_port(IpAddr::from([127, 0, 0, 1])),
                any_port(IpAddr::from(std::net::Ipv6Addr::LOCALHOST)),
            ]
        } else {
            vec![any_port(listen.ip())]
        }
    }
}

fn parse_target_rule(s: &str) -> Result<TargetRule, String> {
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(TargetRule {
            ip: addr.ip(),
            port: Some(addr.port()),
        });
    }
    s.parse::<IpAddr>()
        .map(|ip| TargetRule { ip, port: None })
        .map_err(|_| format!("{s:?}: expected IP or IP:PORT ([IPv6]:PORT)"))
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

    let allowed: Arc<[TargetRule]> = if args.allow_targets.is_empty() {
        TargetRule::defaults(args.listen).into()
    } else {
        args.allow_targets.clone().into()
    };
    let forward = Forward::new().with_proxy_protocol(args.proxy_protocol);
    let service = decide_fn(move |req: ConnectRequest| {
        let forward = forward.clone();
        let allowed = allowed.clone();
        async move {
            if !allowed.iter().any(|rule| rule.admits(req.target)) {
                tracing::warn!(peer = %req.peer, source = %req.source, target = %req.target, "target not allowed (--allow-target); 403");
                return Decision::refuse(StatusCode::FORBIDDEN);
            }
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
