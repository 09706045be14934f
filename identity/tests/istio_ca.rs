//! The Istio CA protocol end to end over a loopback gRPC server: token checked, CSR checked,
//! chain returned, SVIDs obtained and renewed through the cache.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use meshkit_identity::istio::{
    CertificateSigner, IstioCaClient, IstioCaServer, IstioCertificateRequest,
    IstioCertificateResponse, requested_validity,
};
use meshkit_identity::test_util::TestCa;
use meshkit_identity::{
    BoxFuture, CaError, RotationConfig, SpiffeId, SvidCache, TrustDomain, certs_to_pem, parse_leaf,
    request_svid,
};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::Status;

/// Signs CSRs for the identity bound to each token: the demo's trust model.
struct TokenSigner {
    ca: Arc<TestCa>,
    token: &'static str,
    allowed: SpiffeId,
}

impl CertificateSigner for TokenSigner {
    fn create_certificate(
        &self,
        request: tonic::Request<IstioCertificateRequest>,
    ) -> BoxFuture<'_, Result<IstioCertificateResponse, Status>> {
        let result = (|| {
            let auth = request
                .metadata()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .ok_or_else(|| Status::unauthenticated("no bearer token"))?;
            if auth != format!("Bearer {}", self.token) {
                return Err(Status::unauthenticated("unknown token"));
            }
            let body = request.get_ref();
            let validity = requested_validity(body, Duration::from_secs(3600));
            let chain = self
                .ca
                .sign_csr(&body.csr, &self.allowed, validity)
                .map_err(|e| Status::permission_denied(e.to_string()))?;
            let mut pems = vec![certs_to_pem(&chain)];
            pems.push(self.ca.root_pem());
            Ok(IstioCertificateResponse { cert_chain: pems })
        })();
        Box::pin(std::future::ready(result))
    }
}

async fn start(signer: TokenSigner) -> (String, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(IstioCaServer::new(signer))
            .serve_with_incoming(TcpListenerStream::new(listener))
            .await
            .unwrap();
    });
    (format!("http://{addr}"), server)
}

/// Awaits `fut` for at most 20 s, failing with `what`: the client's own timeouts should end
/// every call long before.
async fn bounded<F: Future>(what: &str, fut: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done within 20 s"))
}

fn web() -> SpiffeId {
    "spiffe://a.test/ns/shop/sa/web".parse().unwrap()
}

#[tokio::test]
async fn svid_from_an_istio_protocol_ca() {
    let ca = Arc::new(TestCa::new(TrustDomain::new("a.test").unwrap()));
    let (url, server) = start(TokenSigner {
        ca: ca.clone(),
        token: "s3cret",
        allowed: web(),
    })
    .await;
    let channel = bounded(
        "connecting to the CA",
        tonic::transport::Endpoint::from_shared(url)
            .unwrap()
            .connect(),
    )
    .await
    .unwrap();

    let client = IstioCaClient::new(channel.clone())
        .with_bearer_token("s3cret")
        .unwrap()
        .with_cluster_id("Kubernetes")
        .unwrap();
    let svid = bounded(
        "the signed SVID",
        request_svid(&client, &web(), Duration::from_secs(600)),
    )
    .await
    .unwrap();
    assert_eq!(svid.spiffe_id(), &web());
    // Leaf first, root last, as the protocol returns them.
    assert_eq!(svid.chain().len(), 2);
    assert_eq!(&svid.chain()[1], ca.root());
    let lifetime = svid.not_after().duration_since(svid.not_before()).unwrap();
    assert_eq!(lifetime, Duration::from_secs(660)); // 600 s asked + 60 s backdated

    // Wrong token: refused, not retried as an outage.
    let bad = IstioCaClient::new(channel.clone())
        .with_bearer_token("guess")
        .unwrap();
    let err = bounded(
        "the refusal",
        request_svid(&bad, &web(), Duration::from_secs(600)),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, CaError::Rejected(ref m) if m.contains("Unauthenticated")),
        "{err:?}"
    );

    // Right token, identity it may not hold: refused.
    let other: SpiffeId = "spiffe://a.test/ns/shop/sa/db".parse().unwrap();
    let err = bounded(
        "the refusal",
        request_svid(&client, &other, Duration::from_secs(600)),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, CaError::Rejected(ref m) if m.contains("PermissionDenied")),
        "{err:?}"
    );

    // The rotating cache works over the same protocol.
    let cache = SvidCache::new(client, RotationConfig::default());
    let rx = bounded("the cached SVID", cache.get(&web())).await.unwrap();
    assert_eq!(parse_leaf(rx.borrow().leaf()).unwrap().id, web());
    server.abort();
}

#[tokio::test]
async fn unreachable_ca_is_unavailable() {
    // Bind then drop to get a loopback port nobody listens on.
    let port = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect_lazy();
    let client = IstioCaClient::new(channel);
    let err = bounded(
        "the failure",
        request_svid(&client, &web(), Duration::from_secs(60)),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, CaError::Unavailable(_)), "{err:?}");
    // Refused at once, not given up on after the client's timeout.
    let why = err.to_string();
    assert!(
        !why.contains("no answer within") && !why.contains("Timeout expired"),
        "{err:?}"
    );
}

/// A CA that accepts connections and never answers: each call fails as unavailable within
/// the client's timeout (and the cache retries) instead of hanging for ever.
#[tokio::test]
async fn a_silent_ca_times_out() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    // Connections complete from the backlog; nothing is ever read or written.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect_lazy();
    let client = IstioCaClient::new(channel).with_timeout(Duration::from_millis(300));
    let td = TrustDomain::new("cluster.local").expect("td");
    let id = SpiffeId::from_istio(&td, "shop", "web").expect("id");
    let outcome = bounded(
        "the call ends within its timeout, not never",
        request_svid(&client, &id, Duration::from_secs(3600)),
    )
    .await;
    let err = outcome.expect_err("a silent CA signs nothing");
    // A timeout ended it, not a transport failure: the client's own, or tonic's enforcing
    // the same deadline (sent as `grpc-timeout`), whichever fires first.
    let CaError::Unavailable(why) = &err else {
        panic!("{err:?}")
    };
    assert!(
        why == "no answer within 300ms" || why == "Cancelled: Timeout expired",
        "{err:?}"
    );
    drop(listener);
}

#[tokio::test]
async fn a_token_file_is_read_for_every_request() {
    let ca = Arc::new(TestCa::new(TrustDomain::new("a.test").unwrap()));
    let (url, _server) = start(TokenSigner {
        ca,
        token: "rotated",
        allowed: web(),
    })
    .await;
    let channel = tonic::transport::Endpoint::from_shared(url)
        .unwrap()
        .connect_lazy();
    let dir = std::env::temp_dir().join(format!("meshkit-token-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("istio-token");
    std::fs::write(&path, "expired\n").unwrap();
    let client = IstioCaClient::new(channel).with_bearer_token_file(&path);
    let err = bounded(
        "the old token",
        request_svid(&client, &web(), Duration::from_secs(600)),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, CaError::Rejected(ref m) if m.contains("Unauthenticated")),
        "{err:?}"
    );
    // The kubelet writes the new token: the next request sends it, trimmed.
    std::fs::write(&path, "rotated\n").unwrap();
    bounded(
        "the new token",
        request_svid(&client, &web(), Duration::from_secs(600)),
    )
    .await
    .expect("signed with the new token");
    // A file that cannot be read is an outage (retried), not a refusal.
    std::fs::remove_file(&path).unwrap();
    let err = bounded(
        "no token",
        request_svid(&client, &web(), Duration::from_secs(600)),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, CaError::Unavailable(ref m) if m.contains("cannot read the token file")),
        "{err:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
