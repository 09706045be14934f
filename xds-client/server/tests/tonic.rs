//! The server over loopback TCP with a real tonic client: pushes, the request observer,
//! injection, abort, graceful stop and the bounds.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use meshkit_xds_server::envoy::{
    Any, DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use meshkit_xds_server::envoy_types::pb::envoy::config::core::v3::Node;
use meshkit_xds_server::envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use meshkit_xds_server::{
    AdsServer, RequestObserver, ServerConfig, Snapshot, SnapshotBuilder, SnapshotCache,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Streaming};

const A: &str = "type.googleapis.com/test.A";

fn snapshot(value: &[u8]) -> Snapshot {
    let mut b = SnapshotBuilder::new();
    b.add_any(
        A,
        "a1",
        Any {
            type_url: A.into(),
            value: value.to_vec(),
        },
    );
    b.build()
}

#[derive(Default)]
struct Recorder {
    sotw: Mutex<Vec<DiscoveryRequest>>,
    delta: Mutex<Vec<DeltaDiscoveryRequest>>,
    /// Nonces of the responses sent, both variants.
    sent: Mutex<Vec<String>>,
}

impl RequestObserver for Recorder {
    fn on_sotw_request(&self, request: &DiscoveryRequest) {
        self.sotw.lock().unwrap().push(request.clone());
    }
    fn on_delta_request(&self, request: &DeltaDiscoveryRequest) {
        self.delta.lock().unwrap().push(request.clone());
    }
    fn on_sotw_response(&self, response: &DiscoveryResponse) {
        self.sent.lock().unwrap().push(response.nonce.clone());
    }
    fn on_delta_response(&self, response: &DeltaDiscoveryResponse) {
        self.sent.lock().unwrap().push(response.nonce.clone());
    }
}

struct Running {
    addr: SocketAddr,
    ads: AdsServer,
    cache: SnapshotCache,
    recorder: Arc<Recorder>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

/// A server on 127.0.0.1:0 serving `A` with `a1`; `serve_with_incoming` when `custom`.
async fn start(config: ServerConfig, custom: bool) -> Running {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cache = SnapshotCache::new(snapshot(b"1"));
    let recorder = Arc::new(Recorder::default());
    let (stop, stopped) = watch::channel(false);
    let ads = AdsServer::new(cache.clone())
        .with_config(config)
        .with_stop(stopped.clone())
        .with_observer(Arc::clone(&recorder));
    let server = ads.clone();
    let mut shutdown = stopped;
    let shutdown = async move {
        let _ = shutdown.wait_for(|s| *s).await;
    };
    let task = tokio::spawn(async move {
        if custom {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            server.serve_with_incoming(incoming, shutdown).await
        } else {
            server.serve(listener, shutdown).await
        }
    });
    Running {
        addr,
        ads,
        cache,
        recorder,
        stop,
        task,
    }
}

async fn client(addr: SocketAddr) -> AggregatedDiscoveryServiceClient<Channel> {
    AggregatedDiscoveryServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
        .max_decoding_message_size(usize::MAX)
}

async fn sotw(addr: SocketAddr) -> (mpsc::Sender<DiscoveryRequest>, Streaming<DiscoveryResponse>) {
    let (tx, rx) = mpsc::channel(16);
    let responses = client(addr)
        .await
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    (tx, responses)
}

async fn delta(
    addr: SocketAddr,
) -> (
    mpsc::Sender<DeltaDiscoveryRequest>,
    Streaming<DeltaDiscoveryResponse>,
) {
    let (tx, rx) = mpsc::channel(16);
    let responses = client(addr)
        .await
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    (tx, responses)
}

async fn next<T>(s: &mut Streaming<T>) -> Result<Option<T>, tonic::Status> {
    tokio::time::timeout(Duration::from_secs(10), s.message())
        .await
        .expect("a message within 10 s")
}

/// Nothing arrives within `d`.
async fn quiet<T: std::fmt::Debug>(s: &mut Streaming<T>, d: Duration) {
    if let Ok(m) = tokio::time::timeout(d, s.message()).await {
        panic!("unexpected {m:?}");
    }
}

async fn wait_until(mut pred: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !pred() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not met in 10 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn sotw_push_ack_inject_and_abort() {
    for custom in [false, true] {
        let s = start(ServerConfig::default(), custom).await;
        let (tx, mut rx) = sotw(s.addr).await;
        tx.send(DiscoveryRequest {
            node: Some(Node {
                id: "n1".into(),
                ..Default::default()
            }),
            type_url: A.into(),
            ..Default::default()
        })
        .await
        .unwrap();
        let first = next(&mut rx).await.unwrap().unwrap();
        assert_eq!(first.resources[0].value, b"1");
        tx.send(DiscoveryRequest {
            type_url: A.into(),
            version_info: first.version_info.clone(),
            response_nonce: first.nonce.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
        quiet(&mut rx, Duration::from_millis(100)).await;
        assert_eq!(
            s.recorder.sotw.lock().unwrap().len(),
            2,
            "both requests observed"
        );
        assert_eq!(s.ads.open_streams(), 1);

        // An equal snapshot pushes nothing; a change is pushed.
        s.cache.set(snapshot(b"1"));
        quiet(&mut rx, Duration::from_millis(100)).await;
        s.cache.set(snapshot(b"2"));
        let pushed = next(&mut rx).await.unwrap().unwrap();
        assert_eq!(pushed.resources[0].value, b"2");
        assert_ne!(pushed.nonce, first.nonce);

        // Injected as it is.
        let queued = s.ads.inject_sotw(DiscoveryResponse {
            type_url: "type.googleapis.com/test.Other".into(),
            nonce: "scripted".into(),
            ..Default::default()
        });
        assert_eq!(queued, 1);
        assert_eq!(next(&mut rx).await.unwrap().unwrap().nonce, "scripted");
        assert_eq!(s.ads.inject_delta(DeltaDiscoveryResponse::default()), 0);
        assert_eq!(
            *s.recorder.sent.lock().unwrap(),
            [
                first.nonce.clone(),
                pushed.nonce.clone(),
                "scripted".to_owned()
            ],
            "every response sent observed, injected ones too"
        );

        // Abort: UNAVAILABLE now, and for streams opened later.
        s.ads.abort(tonic::Status::unavailable("going away"));
        let err = next(&mut rx).await.unwrap_err();
        assert_eq!(err.code(), Code::Unavailable, "{err:?}");
        let (tx2, mut rx2) = sotw(s.addr).await;
        // The stream may already be over, and its request side closed.
        let _ = tx2
            .send(DiscoveryRequest {
                type_url: A.into(),
                ..Default::default()
            })
            .await;
        assert_eq!(next(&mut rx2).await.unwrap_err().code(), Code::Unavailable);
        wait_until(|| s.ads.open_streams() == 0).await;

        drop((tx, tx2));
        s.stop.send_replace(true);
        tokio::time::timeout(Duration::from_secs(10), s.task)
            .await
            .expect("the server stops")
            .unwrap()
            .unwrap();
    }
}

#[tokio::test]
async fn delta_push_and_graceful_stop() {
    let s = start(ServerConfig::default(), false).await;
    let (tx, mut rx) = delta(s.addr).await;
    tx.send(DeltaDiscoveryRequest {
        type_url: A.into(),
        resource_names_subscribe: vec!["a1".into(), "missing".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    let first = next(&mut rx).await.unwrap().unwrap();
    assert_eq!(first.resources[0].name, "a1");
    assert_eq!(first.removed_resources, ["missing"]);
    tx.send(DeltaDiscoveryRequest {
        type_url: A.into(),
        response_nonce: first.nonce.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    quiet(&mut rx, Duration::from_millis(100)).await;
    s.cache.set(snapshot(b"2"));
    let pushed = next(&mut rx).await.unwrap().unwrap();
    assert_eq!(pushed.resources.len(), 1);
    assert!(pushed.removed_resources.is_empty(), "missing was said once");
    wait_until(|| s.recorder.delta.lock().unwrap().len() == 2).await;
    assert_eq!(
        *s.recorder.sent.lock().unwrap(),
        [first.nonce.clone(), pushed.nonce.clone()],
        "both responses observed"
    );

    // Graceful stop: the stream ends with OK and the server returns although the client
    // keeps its side open.
    s.stop.send_replace(true);
    assert!(next(&mut rx).await.unwrap().is_none());
    tokio::time::timeout(Duration::from_secs(10), s.task)
        .await
        .expect("the server stops")
        .unwrap()
        .unwrap();
    drop(tx);
}

#[tokio::test]
async fn bounds_end_the_stream_with_a_status() {
    let config = ServerConfig::default()
        .max_decoding_message_size(1024)
        .max_types_per_stream(1);
    let s = start(config, false).await;

    // A request over the decoding limit.
    let (tx, mut rx) = delta(s.addr).await;
    tx.send(DeltaDiscoveryRequest {
        type_url: A.into(),
        resource_names_subscribe: vec!["x".repeat(2048)],
        ..Default::default()
    })
    .await
    .unwrap();
    let err = next(&mut rx).await.unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");

    // One type too many.
    let (tx, mut rx) = sotw(s.addr).await;
    for url in [A, "type.googleapis.com/test.B"] {
        tx.send(DiscoveryRequest {
            type_url: url.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    assert_eq!(next(&mut rx).await.unwrap().unwrap().type_url, A);
    let err = next(&mut rx).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert_eq!(
        s.recorder.sotw.lock().unwrap().len(),
        2,
        "the refused one is observed too"
    );
}

#[tokio::test]
async fn a_type_the_server_does_not_serve_gets_no_answer() {
    let s = start(ServerConfig::default(), false).await;
    let (tx, mut rx) = sotw(s.addr).await;
    tx.send(DiscoveryRequest {
        type_url: "type.googleapis.com/test.Unserved".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    quiet(&mut rx, Duration::from_millis(200)).await;
    let (dtx, mut drx) = delta(s.addr).await;
    dtx.send(DeltaDiscoveryRequest {
        type_url: "type.googleapis.com/test.Unserved".into(),
        resource_names_subscribe: vec!["x".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    quiet(&mut drx, Duration::from_millis(200)).await;
    drop((tx, dtx));
}

#[tokio::test]
async fn a_compressed_request_or_an_unknown_method_is_unimplemented() {
    let s = start(ServerConfig::default(), false).await;
    let tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let service = "envoy.service.discovery.v3.AggregatedDiscoveryService";
    for (method, encoding) in [
        ("StreamAggregatedResources", Some("gzip")),
        ("DeltaAggregatedResources", Some("deflate")),
        ("FetchSomething", None),
    ] {
        let mut request = http::Request::post(format!("http://{}/{service}/{method}", s.addr))
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        if let Some(encoding) = encoding {
            request = request.header("grpc-encoding", encoding);
        }
        let (response, _send) = client
            .send_request(request.body(()).unwrap(), false)
            .unwrap();
        let response = response.await.unwrap();
        assert_eq!(
            response.headers()["grpc-status"],
            (Code::Unimplemented as i32).to_string().as_str(),
            "{method} {encoding:?}"
        );
        client = client.ready().await.unwrap();
    }
    // Uncompressed (`identity` says so too), a stream opens and is answered.
    let request = http::Request::post(format!(
        "http://{}/{service}/StreamAggregatedResources",
        s.addr
    ))
    .header("content-type", "application/grpc")
    .header("grpc-encoding", "identity")
    .header("te", "trailers")
    .body(())
    .unwrap();
    let (response, mut send) = client.send_request(request, false).unwrap();
    let body = prost::Message::encode_to_vec(&DiscoveryRequest {
        type_url: A.into(),
        ..Default::default()
    });
    let mut framed = vec![0];
    framed.extend_from_slice(&(body.len() as u32).to_be_bytes());
    framed.extend_from_slice(&body);
    send.send_data(framed.into(), false).unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.headers()["content-type"], "application/grpc");
    let mut body = response.into_body();
    let data = body.data().await.expect("a response").unwrap();
    let len = u32::from_be_bytes(data[1..5].try_into().unwrap()) as usize;
    assert_eq!(
        (data[0], data.len()),
        (0, 5 + len),
        "one message per data chunk"
    );
    let pushed: DiscoveryResponse = prost::Message::decode(&data[5..]).unwrap();
    assert_eq!(pushed.type_url, A);
}

#[test]
fn public_types_are_send_sync_unpin() {
    fn send_sync_unpin<T: Send + Sync + Unpin>() {}
    send_sync_unpin::<AdsServer>();
    send_sync_unpin::<SnapshotCache>();
    send_sync_unpin::<Snapshot>();
    send_sync_unpin::<ServerConfig>();
    send_sync_unpin::<meshkit_xds_server::SotwStream>();
    send_sync_unpin::<meshkit_xds_server::DeltaStream>();
    send_sync_unpin::<meshkit_xds_server::RequestError>();
}
