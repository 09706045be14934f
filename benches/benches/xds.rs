//! meshkit-xds-client: applying large State-of-the-World and Delta responses (decode, validate,
//! diff, notify), and a one-resource update with 100,000 resources cached, each beside plain
//! prost decoding of the same bytes in the same run. Also prints the heap bytes held per cached
//! resource.
//!
//! `cargo bench -p meshkit-benches --bench xds`

// A counting global allocator needs `unsafe impl GlobalAlloc`; it only forwards to `System`.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Instant;

use criterion::{BatchSize, Criterion, Throughput, criterion_group};
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryResponse, DiscoveryResponse, Resource as Wrapped,
};
use envoy_types::pb::google::protobuf::{Any, Duration as PbDuration};
use meshkit_benches::{Ratio, report_ratios};
use meshkit_xds_client::protocol::{Mode, Response, Session, SessionConfig};
use meshkit_xds_client::testing::{FakeServer, Snapshot, SnapshotExt};
use meshkit_xds_client::{CLUSTER_TYPE_URL, ClientConfig, ResourceType, WatchEvent, XdsClient};
use prost::Message;

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

/// The same update end to end: the fake server pushes a one-resource Delta response over
/// loopback gRPC to a client holding 100,000 clusters, until the named watcher has the event.
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
        let mut seen = std::collections::HashSet::new();
        while seen.len() < CACHED {
            if let Some(WatchEvent::Updated { name, .. }) = all.next().await {
                seen.insert(name);
            }
        }
        // `all` stays alive and unread from here on: a slow watcher must not slow the others.
        let mut watch = client.watch::<Cluster>(&target);
        assert!(matches!(
            watch.next().await,
            Some(WatchEvent::Updated { .. })
        ));
        (server, client, watch, all)
    });
    let mut g = c.benchmark_group("xds_update_one_of_100k_loopback");
    g.throughput(Throughput::Elements(1));
    let mut i: i64 = 10;
    g.bench_function("meshkit", |b| {
        b.iter(|| {
            i += 1;
            let c = cluster(42, i);
            server.send_delta(DeltaDiscoveryResponse {
                resources: vec![Wrapped {
                    name: c.name.clone(),
                    version: format!("{i}"),
                    resource: Some(any(&c)),
                    ..Default::default()
                }],
                type_url: CLUSTER_TYPE_URL.into(),
                nonce: format!("bench-{i}"),
                ..Default::default()
            });
            rt.block_on(async {
                loop {
                    if let Some(WatchEvent::Updated { resource, .. }) = watch.next().await
                        && resource.connect_timeout.map(|t| t.seconds) == Some(i)
                    {
                        break;
                    }
                }
            })
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
        .collect();
    report_ratios(&ratios);
}
