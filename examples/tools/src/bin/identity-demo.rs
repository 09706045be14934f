//! Identity demo: SVIDs from an in-process CA (meshkit-identity's `CaSigner`), then a verified mutual-TLS echo over loopback.
//!
//! `cargo run --release -p meshkit-tools --bin identity-demo`
//!
//! It issues SVIDs for a client and a server workload through the rotating SVID cache, serves
//! an echo over TLS 1.3 on 127.0.0.1 with the certificate chosen per connection, connects as
//! the client, prints the SPIFFE ID each side verified, then shows that a workload the server
//! does not authorize is refused. It exits non-zero if any check fails.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use meshkit_identity::{
    Authorize, BoxFuture, CaClient, CaError, CaSigner, CertificateRequest, SingleIdentity,
    SpiffeId, SpiffeVerifier, SvidCache, TrustDomain, accept, peer_spiffe_id, verify_error,
};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;

type Error = Box<dyn std::error::Error + Send + Sync>;

// mimalloc keeps the HTTP/2 frame buffers glibc would return to the kernel (docs/hbone.md).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// meshkit-identity's CA signer as the rotating cache's CA, in this process, counting the
/// CSRs it signs.
struct InProcessCa {
    signer: CaSigner,
    requests: AtomicUsize,
}

impl CaClient for InProcessCa {
    fn sign<'a>(
        &'a self,
        request: &'a CertificateRequest,
    ) -> BoxFuture<'a, Result<Vec<CertificateDer<'static>>, CaError>> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let signed = self
            .signer
            .sign_csr(&request.csr_pem, &request.id, request.validity)
            .map_err(|e| CaError::Rejected(meshkit_cli::error_chain(&e)));
        Box::pin(std::future::ready(signed))
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => {
            println!("\nall identity checks passed");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("\nidentity demo FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Error> {
    let td = TrustDomain::new("cluster.local")?;
    let ca = Arc::new(InProcessCa {
        signer: CaSigner::generate(td.clone())?,
        requests: AtomicUsize::new(0),
    });
    let client_id = SpiffeId::from_istio(&td, "shop", "web")?;
    let server_id = SpiffeId::from_istio(&td, "shop", "db")?;
    let intruder_id = SpiffeId::from_istio(&td, "other", "scraper")?;
    println!("[1/4] in-process CA for trust domain {td}");

    let cache = SvidCache::new(ca.clone(), meshkit_cli::rotation_config());
    let server_svid = cache.get(&server_id).await?;
    let client_svid = cache.get(&client_id).await?;
    let intruder_svid = cache.get(&intruder_id).await?;
    println!(
        "[2/4] issued SVIDs through the rotating cache ({} CSRs signed): {}, {}, {}",
        ca.requests.load(Ordering::Relaxed),
        server_id,
        client_id,
        intruder_id
    );

    let tls = meshkit_cli::tls_settings();
    let server_config = tls.server_config(
        server_svid,
        SpiffeVerifier::new(ca.signer.bundle_set(), Authorize::Exact(client_id.clone())),
    )?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let selector = Arc::new(SingleIdentity::new(server_config));
    let server = tokio::spawn(async move {
        let mut outcomes = Vec::new();
        for _ in 0..2 {
            let (sock, source) = listener.accept().await?;
            let destination = sock.local_addr()?;
            outcomes.push(match accept(&*selector, sock, source, destination).await {
                Ok((mut stream, _info)) => {
                    let peer = peer_spiffe_id(stream.get_ref().1);
                    let mut buf = vec![0; 64];
                    let n = stream.read(&mut buf).await?;
                    stream.write_all(&buf[..n]).await?;
                    stream.shutdown().await?;
                    Ok(peer)
                }
                Err(e) => Err(meshkit_cli::error_chain(&e)),
            });
        }
        Ok::<_, Error>(outcomes)
    });
    println!("[3/4] mutual-TLS echo server on {addr}, admitting only {client_id}");

    let started = Instant::now();
    let client_config = tls.client_config(
        client_svid,
        SpiffeVerifier::new(ca.signer.bundle_set(), Authorize::Exact(server_id.clone())),
    )?;
    let (seen_server, echoed) = echo(client_config, addr, b"hello from web").await?;
    println!(
        "      client {client_id} verified server {seen_server}, echo {:?} in {:?}",
        String::from_utf8_lossy(&echoed),
        started.elapsed()
    );
    if seen_server != server_id || echoed != b"hello from web" {
        return Err("client saw the wrong server or echo".into());
    }

    let intruder_config = tls.client_config(
        intruder_svid,
        SpiffeVerifier::new(ca.signer.bundle_set(), Authorize::Exact(server_id.clone())),
    )?;
    let refused = echo(intruder_config, addr, b"let me in").await.is_err();

    let outcomes = tokio::time::timeout(Duration::from_secs(10), server).await???;
    match &outcomes[0] {
        Ok(Some(peer)) if *peer == client_id => {
            println!("      server {server_id} verified client {peer}")
        }
        other => return Err(format!("server saw {other:?} for the client").into()),
    }
    match &outcomes[1] {
        Err(reason) if refused => {
            println!("[4/4] {intruder_id} refused as it should be: {reason}")
        }
        other => return Err(format!("intruder was not refused: {other:?}").into()),
    }
    Ok(())
}

async fn echo(
    config: rustls::ClientConfig,
    addr: SocketAddr,
    message: &[u8],
) -> Result<(SpiffeId, Vec<u8>), Error> {
    let sock = TcpStream::connect(addr).await?;
    let name = ServerName::IpAddress(addr.ip().into());
    let mut tls = TlsConnector::from(Arc::new(config))
        .connect(name, sock)
        .await
        .map_err(|e| describe(&e))?;
    let peer = peer_spiffe_id(tls.get_ref().1).ok_or("server presented no SPIFFE ID")?;
    tls.write_all(message).await?;
    let mut echoed = Vec::new();
    tls.read_to_end(&mut echoed)
        .await
        .map_err(|e| describe(&e))?;
    Ok((peer, echoed))
}

/// Names the verification failure behind an I/O error, when there is one.
fn describe(e: &std::io::Error) -> Error {
    let typed = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .and_then(verify_error);
    match typed {
        Some(v) => meshkit_cli::error_chain(v).into(),
        None => meshkit_cli::error_chain(e).into(),
    }
}
