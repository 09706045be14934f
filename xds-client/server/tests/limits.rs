//! Issue 12, item 15: open streams, connections, streams per connection, response sizes and
//! names per stream are bounded; past a bound the client gets the documented status (or its
//! connection closed) while the clients within it keep working.

use std::net::SocketAddr;
use std::time::Duration;

use meshkit_xds_server::envoy::{
    Any, DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use meshkit_xds_server::envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use meshkit_xds_server::{
    AdsServer, DeltaStream, RequestError, ServerConfig, SnapshotBuilder, SnapshotCache,
    SotwStream,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Code, Streaming};

const A: &str = "type.googleapis.com/test.A";

struct Running {
    addr: SocketAddr,
    ads: AdsServer,
    cache: SnapshotCache,
    _stop: watch::Sender<bool>,
}

/// A server on 127.0.0.1:0 serving `A` with `a1` of `size` bytes; stops when dropped.
async fn start(config: ServerConfig, size: usize) -> Running {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut b = SnapshotBuilder::new();
    b.add_any(
        A,
        "a1",
        Any {
            type_url: A.into(),
            value: vec![7; size],
        },
    );
    let cache = SnapshotCache::new(b.build());
    let (stop, mut stopped) = watch::channel(false);
    let ads = AdsServer::new(cache.clone())
        .with_config(config)
        .with_stop(stopped.clone());
    let server = ads.clone();
    tokio::spawn(async move {
        let _ = server
            .serve(listener, async move {
                let _ = stopped.wait_for(|s| *s).await;
            })
            .await;
    });
    Running {
        addr,
        ads,
        cache,
        _stop: stop,
    }
}

async fn channel(addr: SocketAddr) -> Result<Channel, tonic::transport::Error> {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
}

type Sotw = (mpsc::Sender<DiscoveryRequest>, Streaming<DiscoveryResponse>);

/// Opens a SotW stream on `ch` and subscribes to `A`; the error if the stream is refused.
async fn open_sotw(ch: Channel) -> Result<Sotw, tonic::Status> {
    let (tx, rx) = mpsc::channel(4);
    tx.send(DiscoveryRequest {
        type_url: A.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut client =
        AggregatedDiscoveryServiceClient::new(ch).max_decoding_message_size(usize::MAX);
    let responses = client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await?
        .into_inner();
    Ok((tx, responses))
}

/// The first response of a stream just opened.
async fn first(s: &mut Sotw) -> Result<DiscoveryResponse, tonic::Status> {
    tokio::time::timeout(Duration::from_secs(10), s.1.message())
        .await
        .expect("an answer within 10 s")
        .map(|m| m.expect("a response, not the end"))
}

#[tokio::test]
async fn a_stream_beyond_max_streams_is_refused_and_the_open_ones_carry_on() {
    let Running {
        addr,
        ads,
        cache,
        _stop,
    } = start(ServerConfig::default().max_streams(2), 1).await;
    let ch = channel(addr).await.unwrap();
    let mut one = open_sotw(ch.clone()).await.unwrap();
    let mut two = open_sotw(channel(addr).await.unwrap()).await.unwrap();
    first(&mut one).await.unwrap();
    first(&mut two).await.unwrap();

    let refused = match open_sotw(ch.clone()).await {
        Ok(mut third) => first(&mut third).await.unwrap_err(),
        Err(status) => status,
    };
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("2 ADS streams"), "{refused:?}");

    // The two open streams still get pushes.
    let mut b = SnapshotBuilder::new();
    b.add_any(
        A,
        "a1",
        Any {
            type_url: A.into(),
            value: b"new".to_vec(),
        },
    );
    cache.set(b.build());
    for s in [&mut one, &mut two] {
        let r = tokio::time::timeout(Duration::from_secs(10), s.1.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(r.resources[0].value, b"new");
    }

    // A closed stream gives its place back.
    drop(two);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while ads.open_streams() > 1 {
        assert!(tokio::time::Instant::now() < deadline, "stream not closed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut again = open_sotw(ch).await.unwrap();
    first(&mut again).await.unwrap();
}

#[tokio::test]
async fn a_connection_beyond_max_connections_is_closed_and_the_open_one_carries_on() {
    let s = start(ServerConfig::default().max_connections(1), 1).await;
    let ch = channel(s.addr).await.unwrap();
    let mut one = open_sotw(ch.clone()).await.unwrap();
    first(&mut one).await.unwrap();

    // The second connection is closed at once: its call fails, whatever the code.
    let refused = match channel(s.addr).await {
        Err(_) => true,
        Ok(ch2) => match open_sotw(ch2).await {
            Err(_) => true,
            Ok(mut two) => first(&mut two).await.is_err(),
        },
    };
    assert!(refused, "a second connection was served");

    // The first connection still opens streams.
    let mut more = open_sotw(ch.clone()).await.unwrap();
    first(&mut more).await.unwrap();

    // Once it closes, a new connection is served.
    drop((one, more, ch));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(ch) = channel(s.addr).await
            && let Ok(mut again) = open_sotw(ch).await
            && first(&mut again).await.is_ok()
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no place freed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn streams_per_connection_are_capped_by_http2_settings() {
    let s = start(ServerConfig::default().max_streams_per_connection(1), 1).await;
    let ch = channel(s.addr).await.unwrap();
    let mut one = open_sotw(ch.clone()).await.unwrap();
    first(&mut one).await.unwrap();
    // A second stream on the same connection waits for the first to end.
    let second = tokio::spawn(async move {
        let mut two = open_sotw(ch).await?;
        first(&mut two).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !second.is_finished(),
        "the second stream was opened at once"
    );
    drop(one);
    let r = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("the second stream opens once the first is gone")
        .unwrap();
    assert!(r.is_ok(), "{r:?}");
}

#[tokio::test]
async fn a_response_over_max_encoding_message_size_ends_the_stream_with_out_of_range() {
    let s = start(
        ServerConfig::default().max_encoding_message_size(1024),
        2048,
    )
    .await;
    let mut st = open_sotw(channel(s.addr).await.unwrap()).await.unwrap();
    let err = first(&mut st).await.unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
    // A response within it is sent.
    let s = start(
        ServerConfig::default().max_encoding_message_size(4096),
        2048,
    )
    .await;
    let mut st = open_sotw(channel(s.addr).await.unwrap()).await.unwrap();
    first(&mut st).await.unwrap();
}

#[test]
fn the_default_encoding_limit_is_64_mib() {
    // Default: a 64 MiB response (what meshkit-xds-client accepts), no longer unlimited.
    let config = format!("{:?}", ServerConfig::default());
    assert!(
        config.contains(&format!("max_encoding_message_size: {}", 64 << 20)),
        "{config}"
    );
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("r{i}")).collect()
}

#[test]
fn default_limit_on_names_per_stream_refuses_a_huge_subscription() {
    let mut sotw = SotwStream::new(&ServerConfig::default());
    let err = sotw
        .try_handle_request(DiscoveryRequest {
            type_url: A.into(),
            resource_names: names(100_001),
            ..Default::default()
        })
        .unwrap_err();
    assert!(
        matches!(err, RequestError::TooManyNames { limit: 100_000, .. }),
        "{err}"
    );
    assert_eq!(tonic::Status::from(err).code(), Code::ResourceExhausted);

    let mut delta = DeltaStream::new(&ServerConfig::default());
    let err = delta
        .try_handle_request(DeltaDiscoveryRequest {
            type_url: A.into(),
            initial_resource_versions: names(100_001)
                .into_iter()
                .map(|n| (n, "1".into()))
                .collect(),
            ..Default::default()
        })
        .unwrap_err();
    assert!(matches!(err, RequestError::TooManyNames { .. }), "{err}");
}

#[test]
fn delta_names_adding_up_over_requests_are_bounded() {
    let config = ServerConfig::default().max_names_per_stream(3);
    let mut st = DeltaStream::new(&config);
    let sub = |url: &str, add: &[&str], remove: &[&str]| DeltaDiscoveryRequest {
        type_url: url.into(),
        resource_names_subscribe: add.iter().map(|s| s.to_string()).collect(),
        resource_names_unsubscribe: remove.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    st.try_handle_request(sub(A, &["a", "b"], &[])).unwrap();
    // Names count over all types of the stream; the wildcard and repeats do not.
    st.try_handle_request(sub("type.googleapis.com/test.B", &["c", "*"], &[]))
        .unwrap();
    st.try_handle_request(sub(A, &["a", "b"], &[])).unwrap();
    let err = st.try_handle_request(sub(A, &["d"], &[])).unwrap_err();
    assert!(
        matches!(err, RequestError::TooManyNames { names: 4, limit: 3 }),
        "{err}"
    );
    // Refused without effect; swapping one name for another fits.
    st.try_handle_request(sub(A, &["d"], &["a"])).unwrap();
}

#[tokio::test]
async fn a_delta_stream_past_its_names_ends_with_resource_exhausted() {
    let s = start(ServerConfig::default().max_names_per_stream(2), 1).await;
    let (tx, rx) = mpsc::channel(4);
    let mut client = AggregatedDiscoveryServiceClient::new(channel(s.addr).await.unwrap());
    let mut responses: Streaming<DeltaDiscoveryResponse> = client
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    for names in [vec!["a1".to_string()], vec!["x".into(), "y".into()]] {
        tx.send(DeltaDiscoveryRequest {
            type_url: A.into(),
            resource_names_subscribe: names,
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let first = tokio::time::timeout(Duration::from_secs(10), responses.message())
        .await
        .expect("the first answer within 10 s")
        .unwrap()
        .unwrap();
    assert_eq!(first.resources[0].name, "a1");
    let err = loop {
        match tokio::time::timeout(Duration::from_secs(10), responses.message())
            .await
            .unwrap()
        {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("ended without a status"),
            Err(e) => break e,
        }
    };
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
}

/// The HTTP/2 client preface and an empty SETTINGS frame: all a silent client sends.
const H2_HELLO: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// Reads what the server sends until it closes; how long that took, or `None` after `wait`.
async fn closed_after(tcp: &mut tokio::net::TcpStream, wait: Duration) -> Option<Duration> {
    use tokio::io::AsyncReadExt;
    let start = tokio::time::Instant::now();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(wait, async {
        while let Ok(n) = tcp.read(&mut buf).await
            && n > 0
        {}
    })
    .await
    .ok()
    .map(|()| start.elapsed())
}

#[tokio::test]
async fn a_connection_that_opens_no_stream_is_closed_at_the_first_stream_timeout() {
    use tokio::io::AsyncWriteExt;
    let timeout = Duration::from_millis(500);
    let s = start(ServerConfig::default().first_stream_timeout(timeout), 1).await;
    let mut silent = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    silent.write_all(H2_HELLO).await.unwrap();
    // A client that opened a stream meanwhile keeps it past the deadline.
    let ch = channel(s.addr).await.unwrap();
    let mut admitted = open_sotw(ch).await.unwrap();
    first(&mut admitted).await.unwrap();

    let closed = closed_after(&mut silent, Duration::from_secs(10))
        .await
        .expect("the silent connection is closed");
    assert!(
        closed >= timeout - Duration::from_millis(100),
        "closed early: {closed:?}"
    );

    // Pushes still reach the admitted stream after the deadline.
    let mut b = SnapshotBuilder::new();
    b.add_any(
        A,
        "a2",
        Any {
            type_url: A.into(),
            value: vec![1],
        },
    );
    s.cache.set(b.build());
    let pushed = first(&mut admitted).await.unwrap();
    assert_eq!(pushed.resources.len(), 1);
}

#[tokio::test]
async fn a_connection_whose_streams_are_all_refused_is_closed_at_the_first_stream_timeout() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let refuse_all = |_: &tonic::metadata::MetadataMap| {
        Err::<Box<dyn meshkit_xds_server::StreamAccess>, _>(tonic::Status::unauthenticated(
            "no credentials",
        ))
    };
    let ads = AdsServer::new(SnapshotCache::default())
        .with_config(ServerConfig::default().first_stream_timeout(Duration::from_millis(500)))
        .with_access(refuse_all);
    tokio::spawn(ads.serve(listener, std::future::pending()));

    // A raw HTTP/2 client, so the connection is observed, not a pool that redials.
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    let connection = tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    for _ in 0..3 {
        let request = http::Request::post(format!(
            "http://{addr}/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
        let (response, _send) = client.send_request(request, false).unwrap();
        let response = response.await.unwrap();
        assert_eq!(
            response.headers()["grpc-status"],
            (Code::Unauthenticated as i32).to_string().as_str(),
            "refused"
        );
        client = client.ready().await.unwrap();
    }
    let ended = tokio::time::timeout(Duration::from_secs(10), connection)
        .await
        .expect("the server closes the connection");
    drop(ended);
}
