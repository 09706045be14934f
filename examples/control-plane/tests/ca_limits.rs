//! Issue 12, item 15 for the CA: CSR and message sizes, calls in progress, the call timeout and
//! connections are bounded ([`CaLimits`]); past each the caller gets the documented status
//! while honest callers keep getting certificates.

use std::net::SocketAddr;
use std::time::Duration;

use meshkit_control_plane::ca::{CaLimits, TokenGrants, TokenSigner};
use meshkit_identity::istio::{IstioCaClient, IstioCertificateRequest, IstioCertificateResponse};
use meshkit_identity::{
    CaClient, CaError, CaSigner, CertificateRequest, SpiffeId, TrustDomain, generate_csr,
    request_svid,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};

const TOKEN: &str = "tok-123";
const OTHER_TOKEN: &str = "tok-456";
/// Bound on every wait for something that must happen: far above what it needs, so that a
/// loaded machine does not fail it.
const PATIENCE: Duration = Duration::from_secs(10);

fn web() -> SpiffeId {
    "spiffe://cluster.local/ns/shop/sa/web".parse().unwrap()
}

/// The CA on 127.0.0.1:0 with `limits`, as the control plane serves it (plaintext).
async fn start(limits: CaLimits) -> SocketAddr {
    let td = TrustDomain::new("cluster.local").unwrap();
    let grants = TokenGrants::new()
        .grant(TOKEN, "spiffe://cluster.local/ns/shop/*")
        .unwrap()
        .grant(OTHER_TOKEN, "spiffe://cluster.local/ns/shop/*")
        .unwrap();
    let signer = TokenSigner::new(CaSigner::generate(td).unwrap(), grants);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let incoming = limits.connections(TcpListenerStream::new(listener));
        limits
            .server()
            .add_service(limits.service(signer))
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    });
    addr
}

async fn channel(addr: SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap()
}

fn client(ch: Channel) -> IstioCaClient {
    IstioCaClient::new(ch)
        .with_timeout(Duration::from_secs(10))
        .with_bearer_token(TOKEN)
        .unwrap()
}

/// An honest caller gets a certificate.
async fn honest(ch: Channel) {
    let svid = request_svid(&client(ch), &web(), Duration::from_secs(3600))
        .await
        .expect("a certificate");
    assert_eq!(svid.spiffe_id(), &web());
}

async fn sign_raw(ch: Channel, csr_pem: String) -> CaError {
    client(ch)
        .sign(&CertificateRequest {
            id: web(),
            csr_pem,
            validity: Duration::from_secs(3600),
        })
        .await
        .expect_err("refused")
}

#[tokio::test]
async fn an_oversized_csr_is_invalid_argument_and_an_oversized_request_out_of_range() {
    let addr = start(CaLimits::default()).await;
    let ch = channel(addr).await;
    // Over the CSR limit (16 KiB) but within the message limit (64 KiB).
    let (csr, _) = generate_csr(&web()).unwrap();
    let padded = format!("{csr}{}", "\n".repeat(20 * 1024));
    let err = sign_raw(ch.clone(), padded).await;
    let text = err.to_string();
    assert!(
        matches!(err, CaError::Rejected(_))
            && text.contains("InvalidArgument")
            && text.contains("limit"),
        "{text}"
    );
    // Over the message limit: refused before decoding.
    let err = sign_raw(ch.clone(), "x".repeat(100 * 1024)).await;
    assert!(err.to_string().contains("OutOfRange"), "{err}");
    honest(ch).await;
}

/// Opens a call whose request never arrives: it holds its place until the call times out or
/// `tx` is dropped.
async fn hold(
    ch: Channel,
) -> (
    mpsc::Sender<IstioCertificateRequest>,
    tokio::task::JoinHandle<Result<tonic::Response<IstioCertificateResponse>, tonic::Status>>,
) {
    let (tx, rx) = mpsc::channel(1);
    let mut grpc = tonic::client::Grpc::new(ch);
    let task = tokio::spawn(async move {
        grpc.ready().await.unwrap();
        let mut req = tonic::Request::new(ReceiverStream::new(rx));
        req.metadata_mut()
            .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
        grpc.client_streaming(
            req,
            PathAndQuery::from_static("/istio.v1.auth.IstioCertificateService/CreateCertificate"),
            tonic_prost::ProstCodec::default(),
        )
        .await
    });
    (tx, task)
}

#[tokio::test]
async fn calls_beyond_max_concurrent_requests_are_resource_exhausted() {
    let mut limits = CaLimits::default();
    limits.max_concurrent_requests = 1;
    let addr = start(limits).await;
    let ch = channel(addr).await;
    let (tx, held) = hold(ch.clone()).await;
    // Wait until the held call has its place: an honest call is then refused.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let err = loop {
        match request_svid(&client(ch.clone()), &web(), Duration::from_secs(3600)).await {
            Err(e) => break e,
            Ok(_) => {
                assert!(tokio::time::Instant::now() < deadline, "never refused");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert!(err.to_string().contains("ResourceExhausted"), "{err}");
    // Once the held call ends, honest calls are served again.
    drop(tx);
    let _ = tokio::time::timeout(PATIENCE, held)
        .await
        .expect("the held call ends with its request stream");
    honest(ch).await;
}

#[tokio::test]
async fn a_call_that_never_sends_its_request_times_out_and_frees_its_place() {
    let mut limits = CaLimits::default();
    limits.max_concurrent_requests = 1;
    limits.request_timeout = Duration::from_millis(300);
    let addr = start(limits).await;
    let ch = channel(addr).await;
    let (_tx, held) = hold(ch.clone()).await;
    let status = tokio::time::timeout(PATIENCE, held)
        .await
        .expect("ended by the server")
        .unwrap()
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Cancelled, "{status:?}");
    honest(ch).await;
}

#[tokio::test]
async fn a_connection_beyond_max_connections_is_closed_and_the_open_one_carries_on() {
    let mut limits = CaLimits::default();
    limits.max_connections = 1;
    let addr = start(limits).await;
    let first = channel(addr).await;
    honest(first.clone()).await;
    let second = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    let err = request_svid(&client(second), &web(), Duration::from_secs(3600))
        .await
        .expect_err("a second connection was served");
    assert!(matches!(err, CaError::Unavailable(_)), "{err}");
    honest(first).await;
}

#[tokio::test]
async fn streams_per_connection_are_capped_by_http2_settings() {
    let mut limits = CaLimits::default();
    limits.max_streams_per_connection = 1;
    let addr = start(limits).await;
    // A raw HTTP/2 connection, so the order of its streams is this test's: one call first,
    // which also has the client read the server's SETTINGS.
    let (mut h2, _connection) = raw_connection(addr).await;
    assert_eq!(raw_call(&mut h2, TOKEN).await, "0");
    // A call whose request never comes holds the connection's one stream...
    h2 = tokio::time::timeout(PATIENCE, h2.ready())
        .await
        .expect("ready in time")
        .unwrap();
    let held = tonic::codegen::http::Request::post(
        "http://ca/istio.v1.auth.IstioCertificateService/CreateCertificate",
    )
    .header("content-type", "application/grpc")
    .header("authorization", format!("Bearer {TOKEN}"))
    .body(())
    .unwrap();
    let (held_response, mut held_body) = h2.send_request(held, false).unwrap();
    // ...so an honest call on the same connection waits for it (checked for a while: a
    // stream opened at once would be answered well within it)...
    let mut second = h2.clone();
    let waiting = tokio::spawn(async move { raw_call(&mut second, TOKEN).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "a second stream was opened at once");
    // ...and is served once the first stream is gone.
    held_body.send_reset(h2::Reason::CANCEL);
    drop(held_response);
    let code = tokio::time::timeout(PATIENCE, waiting)
        .await
        .expect("served once the first stream is gone")
        .unwrap();
    assert_eq!(code, "0");
}

/// A `CreateCertificate` call on the raw HTTP/2 connection `h2` with `token`; the answer's
/// grpc-status (from the headers of a refusal, the trailers of a success).
async fn raw_call(h2: &mut h2::client::SendRequest<bytes::Bytes>, token: &str) -> String {
    use prost::Message;
    let (csr, _key) = generate_csr(&web()).unwrap();
    let message = IstioCertificateRequest {
        csr,
        validity_duration: 3600,
        metadata: None,
    }
    .encode_to_vec();
    let mut body = vec![0u8];
    body.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    body.extend_from_slice(&message);
    let request = tonic::codegen::http::Request::post(
        "http://ca/istio.v1.auth.IstioCertificateService/CreateCertificate",
    )
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .header("authorization", format!("Bearer {token}"))
    .body(())
    .unwrap();
    tokio::time::timeout(PATIENCE, async {
        *h2 = h2.clone().ready().await.unwrap();
        let (response, mut send) = h2.send_request(request, false).unwrap();
        send.send_data(body.into(), true).unwrap();
        let response = response.await.unwrap();
        if let Some(code) = response.headers().get("grpc-status") {
            return code.to_str().unwrap().to_owned();
        }
        let mut body = response.into_body();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.unwrap();
            let _ = body.flow_control().release_capacity(chunk.len());
        }
        let trailers = body.trailers().await.unwrap().expect("trailers");
        trailers["grpc-status"].to_str().unwrap().to_owned()
    })
    .await
    .expect("the call answered in time")
}

/// A raw HTTP/2 connection to `addr` and the task driving it, which ends when the server
/// closes the connection.
async fn raw_connection(
    addr: SocketAddr,
) -> (
    h2::client::SendRequest<bytes::Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    raw_connection_from(addr, 1).await
}

/// [`raw_connection`] from source address 127.0.0.`host`.
async fn raw_connection_from(
    addr: SocketAddr,
    host: u8,
) -> (
    h2::client::SendRequest<bytes::Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(SocketAddr::from(([127, 0, 0, host], 0))).unwrap();
    let tcp = sock.connect(addr).await.unwrap();
    let (h2, connection) = tokio::time::timeout(PATIENCE, h2::client::handshake(tcp))
        .await
        .expect("HTTP/2 handshake in time")
        .unwrap();
    (h2, tokio::spawn(connection))
}

#[tokio::test]
async fn a_connection_without_a_successful_call_is_closed_at_the_first_call_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut limits = CaLimits::default();
    limits.first_call_timeout = Duration::from_millis(500);
    let addr = start(limits).await;

    // Silent after the HTTP/2 preface.
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    silent
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    // Refused calls only.
    let (mut refused, refused_connection) = raw_connection(addr).await;
    for _ in 0..2 {
        let code = raw_call(&mut refused, "not-a-token").await;
        assert_eq!(code, (tonic::Code::Unauthenticated as i32).to_string());
    }
    // One successful call: the connection stays past the deadline.
    let (mut served, served_connection) = raw_connection(addr).await;
    assert_eq!(raw_call(&mut served, TOKEN).await, "0");

    let mut buf = [0u8; 1024];
    tokio::time::timeout(PATIENCE, async {
        while let Ok(n) = silent.read(&mut buf).await
            && n > 0
        {}
    })
    .await
    .expect("the silent connection is closed");
    tokio::time::timeout(PATIENCE, refused_connection)
        .await
        .expect("the refused connection is closed")
        .unwrap()
        .ok();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !served_connection.is_finished(),
        "the served connection was closed"
    );
    assert_eq!(raw_call(&mut served, TOKEN).await, "0", "and still serves");
}

/// Opens `n` calls with `token` on `h2` whose request body never comes; each answer's
/// grpc-status as it arrives (a refusal answers at once, from the headers), and the open
/// request streams, which hold the calls while kept.
async fn hold_raw(
    h2: &mut h2::client::SendRequest<bytes::Bytes>,
    token: &str,
    n: usize,
) -> (
    mpsc::UnboundedReceiver<String>,
    Vec<h2::SendStream<bytes::Bytes>>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut streams = Vec::new();
    for _ in 0..n {
        *h2 = tokio::time::timeout(PATIENCE, h2.clone().ready())
            .await
            .expect("a stream in time")
            .unwrap();
        let request = tonic::codegen::http::Request::post(
            "http://ca/istio.v1.auth.IstioCertificateService/CreateCertificate",
        )
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {token}"))
        .body(())
        .unwrap();
        let (response, stream) = h2.send_request(request, false).unwrap();
        streams.push(stream);
        let tx = tx.clone();
        tokio::spawn(async move {
            if let Ok(response) = response.await {
                let code = response
                    .headers()
                    .get("grpc-status")
                    .map_or("none", |c| c.to_str().unwrap())
                    .to_owned();
                let _ = tx.send(code);
            }
        });
    }
    (rx, streams)
}

/// The next `n` answers of [`hold_raw`], each within [`PATIENCE`].
async fn answers(rx: &mut mpsc::UnboundedReceiver<String>, n: usize) -> Vec<String> {
    let mut got = Vec::new();
    for _ in 0..n {
        got.push(
            tokio::time::timeout(PATIENCE, rx.recv())
                .await
                .expect("an answer in time")
                .expect("an answer"),
        );
    }
    got
}

/// Calls whose token is refused are refused from their headers, before they take a place:
/// a flood of them with their bodies held back leaves every place to honest callers.
#[tokio::test]
async fn calls_with_a_bad_token_are_refused_before_they_take_a_place() {
    let mut limits = CaLimits::default();
    limits.max_concurrent_requests = 2;
    limits.request_timeout = Duration::from_secs(60);
    let addr = start(limits).await;
    let (mut flood, _c1) = raw_connection_from(addr, 3).await;
    let (mut rx, _streams) = hold_raw(&mut flood, "guessed-token", 6).await;
    // UNAUTHENTICATED, each at once.
    assert_eq!(answers(&mut rx, 6).await, vec!["16"; 6]);
    let (mut honest, _c2) = raw_connection_from(addr, 4).await;
    assert_eq!(raw_call(&mut honest, TOKEN).await, "0");
}

/// One source fills its share of the calls and no more: past it, its calls are refused at
/// once, and another source is still served.
#[tokio::test]
async fn one_source_holds_its_share_of_the_calls_and_another_is_served() {
    let mut limits = CaLimits::default();
    limits.max_concurrent_requests = 4;
    limits.max_calls_per_source = 2;
    limits.request_timeout = Duration::from_secs(60);
    let addr = start(limits).await;
    let (mut greedy, _c1) = raw_connection_from(addr, 5).await;
    let (mut rx, _streams) = hold_raw(&mut greedy, TOKEN, 4).await;
    // RESOURCE_EXHAUSTED for the two past the share; the two within it stay open.
    assert_eq!(answers(&mut rx, 2).await, vec!["8"; 2]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        rx.try_recv().is_err(),
        "a call within the share was answered"
    );
    let (mut other, _c2) = raw_connection_from(addr, 6).await;
    assert_eq!(raw_call(&mut other, TOKEN).await, "0");
}

/// One caller (one token) holds its share of the calls and no more; another caller from the
/// same source is still served.
#[tokio::test]
async fn one_caller_holds_its_share_of_the_calls_and_another_is_served() {
    let mut limits = CaLimits::default();
    limits.max_concurrent_requests = 4;
    limits.max_calls_per_caller = 2;
    limits.request_timeout = Duration::from_secs(60);
    let addr = start(limits).await;
    let (mut h2, _c) = raw_connection_from(addr, 7).await;
    let (mut rx, _streams) = hold_raw(&mut h2, TOKEN, 4).await;
    assert_eq!(answers(&mut rx, 2).await, vec!["8"; 2]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        rx.try_recv().is_err(),
        "a call within the share was answered"
    );
    assert_eq!(raw_call(&mut h2, OTHER_TOKEN).await, "0");
}
