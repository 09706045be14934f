//! Mutual TLS handshakes with meshkit's verifiers, peer IDs after the handshake, and
//! per-connection certificate selection over loopback sockets.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use meshkit_identity::test_util::TestCa;
use meshkit_identity::{
    Authorize, ByDestinationIp, BySni, CertSelector, SingleIdentity, SpiffeId, SpiffeVerifier,
    TlsSettings, TrustDomain, VerifyError, X509Svid, accept, parse_leaf, peer_spiffe_id,
    verify_error,
};
use rustls::{ClientConfig, ServerConfig};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

fn id(s: &str) -> SpiffeId {
    s.parse().unwrap()
}

const WEB: &str = "spiffe://a.test/ns/shop/sa/web";
const DB: &str = "spiffe://a.test/ns/shop/sa/db";

struct Pki {
    ca: TestCa,
    tls: TlsSettings,
}

impl Pki {
    fn new() -> Self {
        Self {
            ca: TestCa::new(TrustDomain::new("a.test").unwrap()),
            tls: TlsSettings::default(),
        }
    }

    fn server(&self, me: &str, allow: Authorize) -> ServerConfig {
        self.tls
            .server_config(
                self.ca.issue(id(me)),
                SpiffeVerifier::new(self.ca.bundle_set(), allow),
            )
            .unwrap()
    }

    fn client(&self, me: &str, allow: Authorize) -> ClientConfig {
        self.tls
            .client_config(
                self.ca.issue(id(me)),
                SpiffeVerifier::new(self.ca.bundle_set(), allow),
            )
            .unwrap()
    }
}

/// Awaits `fut` for at most 20 s, failing with `what`: a handshake or an echo over loopback
/// that takes longer is stuck.
async fn bounded<F: Future>(what: &str, fut: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done within 20 s"))
}

fn name() -> ServerName<'static> {
    ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into())
}

/// Runs one handshake over an in-memory pipe; returns each side's result.
async fn handshake(
    client: ClientConfig,
    server: ServerConfig,
) -> (
    std::io::Result<tokio_rustls::client::TlsStream<tokio::io::DuplexStream>>,
    std::io::Result<tokio_rustls::server::TlsStream<tokio::io::DuplexStream>>,
) {
    let (c, s) = tokio::io::duplex(64 * 1024);
    let connector = TlsConnector::from(Arc::new(client));
    let acceptor = TlsAcceptor::from(Arc::new(server));
    bounded("the handshake", async {
        tokio::join!(connector.connect(name(), c), acceptor.accept(s))
    })
    .await
}

fn typed(err: &std::io::Error) -> Option<VerifyError> {
    let inner = err.get_ref()?.downcast_ref::<rustls::Error>()?;
    verify_error(inner).cloned()
}

#[tokio::test]
async fn mutual_tls_succeeds_and_both_sides_see_the_peer_id() {
    let pki = Pki::new();
    let (client, server) = handshake(
        pki.client(WEB, Authorize::Exact(id(DB))),
        pki.server(DB, Authorize::Exact(id(WEB))),
    )
    .await;
    let (mut client, mut server) = (client.unwrap(), server.unwrap());
    assert_eq!(peer_spiffe_id(client.get_ref().1), Some(id(DB)));
    assert_eq!(peer_spiffe_id(server.get_ref().1), Some(id(WEB)));
    assert_eq!(
        client.get_ref().1.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_3)
    );
    assert_eq!(client.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    assert_eq!(
        client
            .get_ref()
            .1
            .negotiated_cipher_suite()
            .map(|s| s.suite()),
        Some(rustls::CipherSuite::TLS13_AES_128_GCM_SHA256)
    );

    client.write_all(b"ping").await.unwrap();
    client.flush().await.unwrap();
    let mut buf = [0; 4];
    bounded("the server reads", server.read_exact(&mut buf))
        .await
        .unwrap();
    assert_eq!(&buf, b"ping");
}

#[tokio::test]
async fn client_refuses_a_server_with_the_wrong_identity() {
    let pki = Pki::new();
    let (client, _server) = handshake(
        pki.client(WEB, Authorize::Exact(id(DB))),
        pki.server("spiffe://a.test/ns/shop/sa/cache", Authorize::AnyTrusted),
    )
    .await;
    let err = client.unwrap_err();
    assert_eq!(
        typed(&err),
        Some(VerifyError::Unauthorized(id(
            "spiffe://a.test/ns/shop/sa/cache"
        )))
    );
}

#[tokio::test]
async fn server_refuses_an_unauthorized_client() {
    let pki = Pki::new();
    let (_client, server) = handshake(
        pki.client("spiffe://a.test/ns/other/sa/x", Authorize::AnyTrusted),
        pki.server(DB, Authorize::Exact(id(WEB))),
    )
    .await;
    let err = server.unwrap_err();
    assert_eq!(
        typed(&err),
        Some(VerifyError::Unauthorized(id(
            "spiffe://a.test/ns/other/sa/x"
        )))
    );
}

#[tokio::test]
async fn server_refuses_a_client_without_a_certificate() {
    let pki = Pki::new();
    let no_cert = ClientConfig::builder_with_provider(pki.tls.provider().clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(meshkit_identity::SpiffeServerVerifier::new(
            SpiffeVerifier::new(pki.ca.bundle_set(), Authorize::AnyTrusted),
        )))
        .with_no_client_auth();
    let (_client, server) = handshake(no_cert, pki.server(DB, Authorize::AnyTrusted)).await;
    let err = server.unwrap_err();
    let rustls_err = err
        .get_ref()
        .unwrap()
        .downcast_ref::<rustls::Error>()
        .unwrap();
    assert_eq!(rustls_err, &rustls::Error::NoCertificatesPresented);
}

#[tokio::test]
async fn client_refuses_a_server_from_another_ca() {
    let pki = Pki::new();
    let impostor = Pki::new();
    let (client, _server) = handshake(
        pki.client(WEB, Authorize::AnyTrusted),
        impostor.server(DB, Authorize::AnyTrusted),
    )
    .await;
    assert_eq!(
        typed(&client.unwrap_err()),
        Some(VerifyError::UnknownIssuer(
            TrustDomain::new("a.test").unwrap()
        ))
    );
}

/// Accepts `count` connections from two listeners with one selector, answering each with the
/// SPIFFE ID the server presented.
async fn serve(
    listeners: Vec<TcpListener>,
    selector: Arc<dyn CertSelector>,
    count: usize,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let (tx, mut rx) = tokio::sync::mpsc::channel(8);
        for listener in listeners {
            let tx = tx.clone();
            tokio::spawn(async move {
                loop {
                    let (sock, source) = listener.accept().await.unwrap();
                    tx.send((sock, source)).await.unwrap();
                }
            });
        }
        for _ in 0..count {
            let (sock, source) = bounded("a connection to serve", rx.recv())
                .await
                .expect("the listeners are open");
            let destination = sock.local_addr().unwrap();
            let selector = selector.clone();
            tokio::spawn(async move {
                // Refused connections (no certificate for them) end here; the client sees it.
                let Ok((mut tls, info)) = bounded(
                    "the server handshake",
                    accept(&*selector, sock, source, destination),
                )
                .await
                else {
                    return;
                };
                assert_eq!(info.destination, destination);
                assert_eq!(info.alpn, vec![b"h2".to_vec()]);
                let mut buf = [0; 5];
                bounded("the server reads", tls.read_exact(&mut buf))
                    .await
                    .unwrap();
                tls.write_all(&buf).await.unwrap();
                tls.shutdown().await.unwrap();
            });
        }
    })
}

/// Connects, sends `hello` and reads the echo; returns the server's ID. Bounded in time.
async fn dial(
    config: &ClientConfig,
    addr: SocketAddr,
    sni: Option<&str>,
) -> std::io::Result<SpiffeId> {
    bounded("the dial and echo", dial_unbounded(config, addr, sni)).await
}

async fn dial_unbounded(
    config: &ClientConfig,
    addr: SocketAddr,
    sni: Option<&str>,
) -> std::io::Result<SpiffeId> {
    let sock = TcpStream::connect(addr).await?;
    let name = match sni {
        Some(host) => ServerName::try_from(host.to_owned()).unwrap(),
        None => ServerName::IpAddress(addr.ip().into()),
    };
    let mut tls = TlsConnector::from(Arc::new(config.clone()))
        .connect(name, sock)
        .await?;
    tls.write_all(b"hello").await?;
    let mut buf = [0; 5];
    tls.read_exact(&mut buf).await?;
    assert_eq!(&buf, b"hello");
    let leaf = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    Ok(parse_leaf(&leaf).unwrap().id)
}

#[tokio::test]
async fn one_server_serves_the_certificate_of_the_dialled_destination() {
    let pki = Pki::new();
    let a = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = a.local_addr().unwrap().port();
    // The second address of the node, on the same port: 127.0.0.2 is loopback too.
    let b = TcpListener::bind(("127.0.0.2", port)).await.unwrap();
    let (addr_a, addr_b) = (a.local_addr().unwrap(), b.local_addr().unwrap());

    let selector = Arc::new(ByDestinationIp::new());
    selector.insert(addr_a.ip(), pki.server(WEB, Authorize::AnyTrusted));
    selector.insert(addr_b.ip(), pki.server(DB, Authorize::AnyTrusted));
    let server = serve(vec![a, b], selector.clone(), 4).await;

    let client = pki.client("spiffe://a.test/ns/shop/sa/gateway", Authorize::AnyTrusted);
    assert_eq!(dial(&client, addr_a, None).await.unwrap(), id(WEB));
    assert_eq!(dial(&client, addr_b, None).await.unwrap(), id(DB));
    assert_eq!(dial(&client, addr_b, None).await.unwrap(), id(DB));

    // An address nobody owns any more gets no certificate: the handshake fails.
    selector.remove(&addr_a.ip());
    assert!(dial(&client, addr_a, None).await.is_err());
    bounded("the server task", server).await.unwrap();
}

#[tokio::test]
async fn sni_selector_and_single_identity() {
    let pki = Pki::new();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let selector = BySni::new()
        .with("web.shop.svc", pki.server(WEB, Authorize::AnyTrusted))
        .with("DB.shop.svc", pki.server(DB, Authorize::AnyTrusted));
    let server = serve(vec![listener], Arc::new(selector), 3).await;
    let client = pki.client("spiffe://a.test/ns/x/sa/y", Authorize::AnyTrusted);
    assert_eq!(
        dial(&client, addr, Some("web.shop.svc")).await.unwrap(),
        id(WEB)
    );
    assert_eq!(
        dial(&client, addr, Some("db.SHOP.svc")).await.unwrap(),
        id(DB)
    );
    // No fallback configured: an unknown name is refused.
    assert!(dial(&client, addr, Some("other.svc")).await.is_err());
    bounded("the server task", server).await.unwrap();

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let single = SingleIdentity::new(pki.server(DB, Authorize::AnyTrusted));
    let server = serve(vec![listener], Arc::new(single), 1).await;
    assert_eq!(dial(&client, addr, None).await.unwrap(), id(DB));
    bounded("the server task", server).await.unwrap();
}

#[test]
fn svid_and_configs_are_send_sync() {
    fn check<T: Send + Sync + 'static>() {}
    check::<X509Svid>();
    check::<SpiffeVerifier>();
    check::<TlsSettings>();
    check::<ByDestinationIp>();
    check::<meshkit_identity::SvidCache>();
    check::<VerifyError>();
}

/// A client offering the session of its first connection gets a full handshake on the
/// second, with its certificate verified again: resumption would skip the client check.
#[tokio::test]
async fn a_second_connection_is_never_resumed() {
    let pki = Pki::new();
    let client = Arc::new(pki.client(WEB, Authorize::Exact(id(DB))));
    let server = Arc::new(pki.server(DB, Authorize::Exact(id(WEB))));
    for round in 0..3 {
        let (c, s) = tokio::io::duplex(64 * 1024);
        let (client_tls, server_tls) = bounded("the handshake", async {
            tokio::join!(
                TlsConnector::from(client.clone()).connect(name(), c),
                TlsAcceptor::from(server.clone()).accept(s)
            )
        })
        .await;
        let (mut client_tls, mut server_tls) = (client_tls.unwrap(), server_tls.unwrap());
        // Bytes both ways, so that any session ticket the server sent reaches the client
        // before the next round.
        server_tls.write_all(b"s").await.unwrap();
        server_tls.flush().await.unwrap();
        let mut byte = [0u8; 1];
        bounded("the client reads", client_tls.read_exact(&mut byte))
            .await
            .unwrap();
        client_tls.write_all(b"c").await.unwrap();
        client_tls.flush().await.unwrap();
        bounded("the server reads", server_tls.read_exact(&mut byte))
            .await
            .unwrap();
        assert_eq!(
            server_tls.get_ref().1.handshake_kind(),
            Some(rustls::HandshakeKind::Full),
            "connection {round} was resumed"
        );
        assert_eq!(
            peer_spiffe_id(server_tls.get_ref().1).map(|p| p.to_string()),
            Some(WEB.to_owned()),
            "connection {round}: the client's identity is verified"
        );
    }
}
