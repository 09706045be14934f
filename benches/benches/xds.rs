//! meshkit-xds-client: applying large State-of-the-World and Delta responses (decode, validate,
//! diff, notify), and a one-resource update with 100,000 resources cached, each beside plain
//! prost decoding of the same bytes in the same run; and the same one-resource update end to
//! end over loopback gRPC (meshkit-xds-server's `AdsServer` to an `XdsClient` holding 100,000
//! clusters, until the watcher has the event) beside a bare tonic Delta ADS stream carrying
//! the same response and ACK over the same loopback, with nothing of meshkit on either end.
//! Also prints the heap bytes held per cached resource.
//!
//! `cargo bench -p meshkit-benches --bench xds`

// A counting global allocator needs `unsafe impl GlobalAlloc`; it only forwards to `System`.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::Mutex;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, Throughput, criterion_group};
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
    Resource as Wrapped,
};
use envoy_types::pb::google::protobuf::{Any, Duration as PbDuration};
use meshkit_benches::{Ratio, Run};
use meshkit_xds_client::protocol::{Mode, Response, Session, SessionConfig};
use meshkit_xds_client::testing::{FakeServer, Snapshot, SnapshotExt};
use meshkit_xds_client::{CLUSTER_TYPE_URL, ClientConfig, ResourceType, WatchEvent, XdsClient};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards every call to `System` unchanged; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn cluster(i: usize, timeout: i64) -> Cluster {
    Cluster {
        name: format!("outbound|8080||svc-{i}.ns-{}.svc.cluster.local", i % 97),
        connect_timeout: Some(PbDuration {
            seconds: timeout,
            nanos: 0,
        }),
        ..Default::default()
    }
}

fn any(c: &Cluster) -> Any {
    Any {
        type_url: CLUSTER_TYPE_URL.into(),
        value: c.encode_to_vec(),
    }
}

fn sotw_bytes(n: usize, timeout: i64) -> Vec<u8> {
    DiscoveryResponse {
        version_info: format!("v{timeout}"),
        resources: (0..n).map(|i| any(&cluster(i, timeout))).collect(),
        type_url: CLUSTER_TYPE_URL.into(),
        nonce: format!("n{timeout}"),
        ..Default::default()
    }
    .encode_to_vec()
}

fn delta_bytes(range: std::ops::Range<usize>, timeout: i64) -> Vec<u8> {
    DeltaDiscoveryResponse {
        resources: range
            .map(|i| {
                let c = cluster(i, timeout);
                Wrapped {
                    name: c.name.clone(),
                    version: format!("{timeout}"),
                    resource: Some(any(&c)),
                    ..Default::default()
                }
            })
            .collect(),
        type_url: CLUSTER_TYPE_URL.into(),
        nonce: format!("n{timeout}"),
        ..Default::default()
    }
    .encode_to_vec()
}

fn session(mode: Mode) -> Session {
    let mut s = Session::new(SessionConfig::new(mode));
    s.subscribe_wildcard(ResourceType::of::<Cluster>());
    let now = Instant::now();
    s.on_connected(now);
    while s.poll_request(now).is_some() {}
    s
}

/// The subject: bytes in, ACK and watcher events out.
fn apply(s: &mut Session, mode: Mode, bytes: &[u8]) -> usize {
    let now = Instant::now();
    let resp = match mode {
        Mode::StateOfTheWorld => Response::Sotw(DiscoveryResponse::decode(bytes).unwrap()),
        Mode::Delta => Response::Delta(DeltaDiscoveryResponse::decode(bytes).unwrap()),
    };
    s.handle_response(now, resp);
    let mut events = 0;
    while let Some(ev) = s.poll_event() {
        black_box(&ev);
        events += 1;
    }
    while let Some(req) = s.poll_request(now) {
        black_box(req);
    }
    events
}

/// The baseline: decoding the same bytes and every resource in them with prost, nothing else.
fn prost_decode(mode: Mode, bytes: &[u8]) -> usize {
    let anys: Vec<Any> = match mode {
        Mode::StateOfTheWorld => DiscoveryResponse::decode(bytes).unwrap().resources,
        Mode::Delta => DeltaDiscoveryResponse::decode(bytes)
            .unwrap()
            .resources
            .into_iter()
            .filter_map(|r| r.resource)
            .collect(),
    };
    let mut decoded = 0;
    for a in &anys {
        black_box(Cluster::decode(a.value.as_slice()).unwrap());
        decoded += 1;
    }
    decoded
}

fn group_name(mode: Mode, n: usize) -> String {
    let m = match mode {
        Mode::StateOfTheWorld => "sotw",
        Mode::Delta => "delta",
    };
    format!("xds_apply_{m}_{}k", n / 1000)
}

fn bench_apply(c: &mut Criterion) {
    for mode in [Mode::StateOfTheWorld, Mode::Delta] {
        for n in [10_000, 100_000] {
            let bytes = match mode {
                Mode::StateOfTheWorld => sotw_bytes(n, 1),
                Mode::Delta => delta_bytes(0..n, 1),
            };
            let mut g = c.benchmark_group(group_name(mode, n));
            g.throughput(Throughput::Elements(n as u64));
            g.sample_size(10);
            g.bench_function("meshkit", |b| {
                b.iter_batched(
                    || session(mode),
                    |mut s| {
                        assert_eq!(apply(&mut s, mode, &bytes), n);
                        s
                    },
                    BatchSize::PerIteration,
                )
            });
            g.bench_function("prost_decode", |b| b.iter(|| prost_decode(mode, &bytes)));
            g.finish();
        }
    }
}

fn bench_update_one(c: &mut Criterion) {
    const CACHED: usize = 100_000;
    let mut s = session(Mode::Delta);
    apply(&mut s, Mode::Delta, &delta_bytes(0..CACHED, 1));
    // Two alternating versions of one resource, so every response is a real change.
    let updates = [delta_bytes(42..43, 2), delta_bytes(42..43, 3)];
    let mut g = c.benchmark_group("xds_update_one_of_100k");
    g.throughput(Throughput::Elements(1));
    let mut i = 0;
    g.bench_function("meshkit", |b| {
        b.iter(|| {
            i += 1;
            assert_eq!(apply(&mut s, Mode::Delta, &updates[i % 2]), 1);
        })
    });
    g.bench_function("prost_decode", |b| {
        b.iter(|| prost_decode(Mode::Delta, &updates[0]))
    });
    g.finish();
}

/// Bound on the loopback group's setup (the client receiving all 100,000 clusters).
const LOOPBACK_SETUP_BOUND: Duration = Duration::from_secs(120);
/// Bound on one loopback update, from push to the watcher's event (or the baseline's decode).
const LOOPBACK_UPDATE_BOUND: Duration = Duration::from_secs(10);

/// Awaits `fut`, failing with `what` after `bound`.
async fn bounded<F: std::future::Future>(bound: Duration, what: &str, fut: F) -> F::Output {
    tokio::time::timeout(bound, fut)
        .await
        .unwrap_or_else(|_| panic!("xds bench: {what} not done within {bound:?}"))
}

/// The one-resource Delta response of loopback update `i`: cluster 42 with connect timeout
/// `i` s, the same message for the subject and the baseline.
fn loopback_update(i: i64) -> DeltaDiscoveryResponse {
    let c = cluster(42, i);
    DeltaDiscoveryResponse {
        resources: vec![Wrapped {
            name: c.name.clone(),
            version: format!("{i}"),
            resource: Some(any(&c)),
            ..Default::default()
        }],
        type_url: CLUSTER_TYPE_URL.into(),
        nonce: format!("bench-{i}"),
        ..Default::default()
    }
}

type Pushed = mpsc::UnboundedSender<Result<DeltaDiscoveryResponse, tonic::Status>>;

/// The loopback baseline's server: envoy-types' generated ADS service with nothing behind it.
/// Its one Delta stream sends what the bench pushes, as it is, and reads (decodes) and drops
/// the requests.
struct BareAds {
    responses:
        Mutex<Option<mpsc::UnboundedReceiver<Result<DeltaDiscoveryResponse, tonic::Status>>>>,
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for BareAds {
    type StreamAggregatedResourcesStream =
        UnboundedReceiverStream<Result<DiscoveryResponse, tonic::Status>>;

    async fn stream_aggregated_resources(
        &self,
        _request: tonic::Request<tonic::Streaming<DiscoveryRequest>>,
    ) -> Result<tonic::Response<Self::StreamAggregatedResourcesStream>, tonic::Status> {
        Err(tonic::Status::unimplemented(
            "the baseline speaks Delta only",
        ))
    }

    type DeltaAggregatedResourcesStream =
        UnboundedReceiverStream<Result<DeltaDiscoveryResponse, tonic::Status>>;

    async fn delta_aggregated_resources(
        &self,
        request: tonic::Request<tonic::Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<tonic::Response<Self::DeltaAggregatedResourcesStream>, tonic::Status> {
        let responses = self
            .responses
            .lock()
            .unwrap()
            .take()
            .ok_or_else(|| tonic::Status::resource_exhausted("one stream only"))?;
        let mut requests = request.into_inner();
        tokio::spawn(async move {
            while let Ok(Some(req)) = requests.message().await {
                black_box(req);
            }
        });
        Ok(tonic::Response::new(UnboundedReceiverStream::new(
            responses,
        )))
    }
}

/// The loopback baseline's two ends: the bench pushes into `push`; the client reads
/// `responses` and sends its ACKs on `acks`.
struct BareStream {
    push: Pushed,
    responses: tonic::Streaming<DeltaDiscoveryResponse>,
    acks: mpsc::UnboundedSender<DeltaDiscoveryRequest>,
}

/// Serves [`BareAds`] on loopback (with `TCP_NODELAY`, as the fake server and the client set
/// it) and opens its Delta stream with envoy-types' generated client on a plain tonic channel.
async fn bare_stream() -> BareStream {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = TcpListenerStream::new(listener).map(|tcp| {
        let tcp = tcp?;
        tcp.set_nodelay(true)?;
        Ok::<_, std::io::Error>(tcp)
    });
    let (push, pushed) = mpsc::unbounded_channel();
    let service = AggregatedDiscoveryServiceServer::new(BareAds {
        responses: Mutex::new(Some(pushed)),
    })
    .max_decoding_message_size(usize::MAX);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming),
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .tcp_nodelay(true)
        .connect()
        .await
        .unwrap();
    let mut client =
        AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(usize::MAX);
    let (acks, requests) = mpsc::unbounded_channel();
    // The subscription the meshkit client sends first, so that the stream opens the same way.
    acks.send(DeltaDiscoveryRequest {
        type_url: CLUSTER_TYPE_URL.into(),
        resource_names_subscribe: vec!["*".into()],
        ..Default::default()
    })
    .unwrap();
    let responses = client
        .delta_aggregated_resources(UnboundedReceiverStream::new(requests))
        .await
        .unwrap()
        .into_inner();
    BareStream {
        push,
        responses,
        acks,
    }
}

/// The baseline's update `i`: the response reaches the client through tonic, which decodes it;
/// the client decodes the `Cluster` in it with prost, checks it is update `i`, and ACKs.
async fn bare_update(bare: &mut BareStream, i: i64) {
    bare.push.send(Ok(loopback_update(i))).unwrap();
    let resp = bare
        .responses
        .message()
        .await
        .expect("the bare stream failed")
        .expect("the bare stream ended");
    let any = resp.resources[0].resource.as_ref().expect("a resource");
    let c = Cluster::decode(any.value.as_slice()).unwrap();
    assert_eq!(c.connect_timeout.map(|t| t.seconds), Some(i));
    bare.acks
        .send(DeltaDiscoveryRequest {
            type_url: resp.type_url,
            response_nonce: resp.nonce,
            ..Default::default()
        })
        .unwrap();
}

/// The same update end to end: the fake server pushes a one-resource Delta response over
/// loopback gRPC to a client holding 100,000 clusters, until the named watcher has the event;
/// beside it, the same response over a bare tonic stream ([`bare_update`]).
fn bench_update_one_loopback(c: &mut Criterion) {
    const CACHED: usize = 100_000;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let clusters: Vec<Cluster> = (0..CACHED).map(|i| cluster(i, 1)).collect();
    let target = clusters[42].name.clone();
    let (server, _client, mut watch, _all) = rt.block_on(async {
        let server = FakeServer::start().await.unwrap();
        server.set_snapshot(Snapshot::new().with_resources("v1", &clusters));
        let config = ClientConfig::new(server.uri(), Mode::Delta, Default::default());
        let (client, driver) = XdsClient::new(config);
        tokio::spawn(driver.run());
        let mut all = client.watch_all::<Cluster>();
        bounded(
            LOOPBACK_SETUP_BOUND,
            "the client receiving 100,000 clusters",
            async {
                let mut seen = std::collections::HashSet::new();
                while seen.len() < CACHED {
                    match all.next().await {
                        Some(WatchEvent::Updated { name, .. }) => {
                            seen.insert(name);
                        }
                        Some(_) => {}
                        None => panic!("xds bench: the watch ended after {} clusters", seen.len()),
                    }
                }
            },
        )
        .await;
        // `all` stays alive and unread from here on: a slow watcher must not slow the others.
        let mut watch = client.watch::<Cluster>(&target);
        let first = bounded(
            LOOPBACK_UPDATE_BOUND,
            "the watcher's first event",
            watch.next(),
        )
        .await;
        assert!(
            matches!(first, Some(WatchEvent::Updated { .. })),
            "xds bench: the watcher's first event is not the cluster: {first:?}"
        );
        (server, client, watch, all)
    });
    let mut bare = rt.block_on(bounded(
        LOOPBACK_SETUP_BOUND,
        "opening the bare tonic stream",
        bare_stream(),
    ));
    let mut g = c.benchmark_group("xds_update_one_of_100k_loopback");
    g.throughput(Throughput::Elements(1));
    let mut i: i64 = 10;
    g.bench_function("meshkit", |b| {
        b.iter(|| {
            i += 1;
            server.send_delta(loopback_update(i));
            rt.block_on(bounded(
                LOOPBACK_UPDATE_BOUND,
                "the watcher's update",
                async {
                    loop {
                        match watch.next().await {
                            Some(WatchEvent::Updated { resource, .. })
                                if resource.connect_timeout.map(|t| t.seconds) == Some(i) =>
                            {
                                break;
                            }
                            Some(_) => {}
                            None => panic!("xds bench: the watch ended"),
                        }
                    }
                },
            ))
        })
    });
    let mut j: i64 = 10;
    g.bench_function("tonic_stream", |b| {
        b.iter(|| {
            j += 1;
            rt.block_on(bounded(
                LOOPBACK_UPDATE_BOUND,
                "the bare stream's update",
                bare_update(&mut bare, j),
            ))
        })
    });
    g.finish();
    drop(server);
}

/// Heap bytes held per cached resource: the decoded Cluster plus the cache's bookkeeping.
fn report_memory() {
    const N: usize = 100_000;
    for mode in [Mode::StateOfTheWorld, Mode::Delta] {
        let bytes = match mode {
            Mode::StateOfTheWorld => sotw_bytes(N, 1),
            Mode::Delta => delta_bytes(0..N, 1),
        };
        let before = LIVE.load(Ordering::Relaxed);
        let mut s = session(mode);
        apply(&mut s, mode, &bytes);
        let after = LIVE.load(Ordering::Relaxed);
        // What holding one decoded Cluster costs at least: the struct (in its Arc) and its heap.
        let one: isize = {
            let b = LIVE.load(Ordering::Relaxed);
            let c = black_box(std::sync::Arc::new(
                Cluster::decode(any(&cluster(1, 1)).value.as_slice()).unwrap(),
            ));
            let a = LIVE.load(Ordering::Relaxed);
            drop(c);
            a - b
        };
        println!(
            "memory {mode:?}: {} bytes per cached resource, of which {one} are the decoded \
             Cluster in its Arc (size_of::<Cluster>() = {})",
            (after - before) / N as isize,
            std::mem::size_of::<Cluster>(),
        );
        drop(s);
    }
}

criterion_group!(
    benches,
    bench_apply,
    bench_update_one,
    bench_update_one_loopback
);

fn main() {
    let run = Run::start();
    benches();
    Criterion::default().configure_from_args().final_summary();
    report_memory();
    let groups: Vec<String> = [Mode::StateOfTheWorld, Mode::Delta]
        .into_iter()
        .flat_map(|m| [group_name(m, 10_000), group_name(m, 100_000)])
        .chain(["xds_update_one_of_100k".to_string()])
        .collect();
    let ratios: Vec<Ratio<'_>> = groups
        .iter()
        .map(|g| Ratio {
            group: g,
            subject: "meshkit",
            baseline: "prost_decode",
        })
        .chain([Ratio {
            group: "xds_update_one_of_100k_loopback",
            subject: "meshkit",
            baseline: "tonic_stream",
        }])
        .collect();
    run.report_ratios(&ratios);
}
