//! `hbone-connect`: listens for plain TCP and tunnels each connection over HBONE to a fixed
//! CONNECT target.
//!
//! ```text
//! hbone-connect --listen 127.0.0.1:15001=127.0.0.1:5201 --upstream 127.0.0.1:15008 \
//!     --cert client.crt --key client.key --ca ca.crt \
//!     --server-id spiffe://cluster.local/ns/default/sa/server
//! ```
//!
//! Logs one line per tunnel with the verified server ID; stops on SIGINT/SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use meshkit_cli::{
    CliError, init_logging, load_bundle, load_svid, parse_id, run_main, stop_signal,
};
use meshkit_hbone::{Client, Target, copy_bidirectional};
use meshkit_identity::ErrorChain;
use tokio::net::TcpListener;

// mimalloc keeps the HTTP/2 frame buffers glibc would return to the kernel (docs/hbone.md).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// HBONE client: plain TCP in, HTTP/2 CONNECT over mutual TLS 1.3 out.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// `LISTEN=TARGET`: accept TCP on LISTEN and tunnel it to TARGET (the CONNECT authority).
    /// Repeatable.
    #[arg(long = "listen", value_parser = parse_pair, required = true)]
    listens: Vec<(SocketAddr, SocketAddr)>,
    /// The HBONE server to connect to.
    #[arg(long)]
    upstream: SocketAddr,
    /// PEM certificate chain of this client (an X.509-SVID, leaf first).
    #[arg(long)]
    cert: PathBuf,
    /// PEM private key of the certificate.
    #[arg(long)]
    key: PathBuf,
    /// PEM CA bundle that the server's certificate must chain to.
    #[arg(long)]
    ca: PathBuf,
    /// The SPIFFE ID the server must present.
    #[arg(long)]
    server_id: String,
    /// Worker threads (1: everything on one thread).
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

fn parse_pair(s: &str) -> Result<(SocketAddr, SocketAddr), String> {
    let (listen, target) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected LISTEN=TARGET, both ip:port"))?;
    let listen = listen
        .parse()
        .map_err(|e| format!("listen address {listen:?}: {e}"))?;
    let target = target
        .parse()
        .map_err(|e| format!("target address {target:?}: {e}"))?;
    Ok((listen, target))
}

fn main() -> ExitCode {
    init_logging();
    let args = Args::parse();
    run_main("hbone-connect", args.threads, run(args))
}

async fn run(args: Args) -> Result<(), CliError> {
    let svid = load_svid(&args.cert, &args.key)?;
    let server_id = parse_id("--server-id", &args.server_id)?;
    let bundles = load_bundle(&args.ca, &server_id.trust_domain())?;
    let local = svid.spiffe_id().clone();
    let client = Client::new(meshkit_cli::hbone_client_config(), svid, bundles);

    let mut tasks = tokio::task::JoinSet::new();
    for (listen, target) in args.listens {
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
        tracing::info!(%listen, %target, upstream = %args.upstream, "hbone-connect listening");
        let template = Target::new(args.upstream, target, local.clone(), server_id.clone());
        let client = client.clone();
        tasks.spawn(accept_loop(listener, client, template));
    }
    tokio::select! {
        () = stop_signal() => tracing::info!("stopping"),
        Some(done) = tasks.join_next() => {
            if let Ok(Err(e)) = done {
                return Err(e);
            }
        }
    }
    tasks.shutdown().await;
    Ok(())
}

async fn accept_loop(
    listener: TcpListener,
    client: Client,
    template: Target,
) -> Result<(), CliError> {
    loop {
        let (sock, source) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: the listener is fine, the moment is
                // not. Back off instead of spinning, and never stop listening.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = sock.set_nodelay(true);
        let client = client.clone();
        let target = template.clone().forwarded_for(source);
        tokio::spawn(async move {
            let tunnel = match client.open(target.clone()).await {
                Ok(tunnel) => tunnel,
                Err(e) => {
                    tracing::warn!(%source, destination = %target.destination, error = %e, "tunnel refused");
                    // A reset, not a FIN: an empty answer must not look like a complete one.
                    let _ = sock.set_zero_linger();
                    return;
                }
            };
            let peer = target
                .peer_identities
                .iter()
                .next()
                .map(ToString::to_string)
                .unwrap_or_default();
            tracing::info!(%source, destination = %target.destination, %peer, "tunnel");
            match copy_bidirectional(tunnel, sock).await {
                Ok(copied) => {
                    tracing::info!(%source, sent = copied.to_tunnel, received = copied.from_tunnel, "tunnel closed")
                }
                Err(e) => tracing::warn!(%source, error = %ErrorChain(&e), "tunnel reset"),
            }
        });
    }
}
