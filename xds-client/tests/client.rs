//! The async client against the fake ADS server over loopback sockets.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use meshkit_xds_client::envoy::{DeltaDiscoveryResponse, DiscoveryResource, DiscoveryResponse};
use meshkit_xds_client::protocol::{Mode, RemovalReason};
use meshkit_xds_client::testing::{FakeServer, Snapshot, SnapshotExt};
use meshkit_xds_client::{ClientConfig, LISTENER_TYPE_URL, Watch, WatchEvent, XdsClient};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const MODES: [Mode; 2] = [Mode::StateOfTheWorld, Mode::Delta];

fn cluster(name: &str, timeout_s: i64) -> Cluster {
    Cluster {
        name: name.into(),
        connect_timeout: Some(PbDuration {
            seconds: timeout_s,
            nanos: 0,
        }),
        ..Default::default()
    }
}

fn config(server: &FakeServer, mode: Mode) -> ClientConfig {
    let node = Node {
        id: "test".into(),
        ..Default::default()
    };
    ClientConfig::new(server.uri(), mode, node)
        .backoff(Duration::from_millis(20), Duration::from_millis(100))
}

fn client(server: &FakeServer, mode: Mode) -> XdsClient {
    let (client, driver) = XdsClient::new(config(server, mode));
    tokio::spawn(driver.run());
    client
}

async fn next(w: &mut Watch<Cluster>) -> WatchEvent<Cluster> {
    tokio::time::timeout(Duration::from_secs(20), w.next())
        .await
        .expect("an event within 20 s")
        .expect("the watch is open")
}

async fn expect_updated(w: &mut Watch<Cluster>) -> Arc<Cluster> {
    match next(w).await {
        WatchEvent::Updated { resource, .. } => resource,
        other => panic!("expected an update, got {other:?}"),
    }
}

/// No event arrives within `d`.
async fn quiet(w: &mut Watch<Cluster>, d: Duration) {
    if let Ok(ev) = tokio::time::timeout(d, w.next()).await {
        panic!("unexpected event {ev:?}");
    }
}

#[tokio::test]
async fn watch_update_and_delete() {
    for mode in MODES {
        let server = FakeServer::start().await.unwrap();
        server.set_snapshot(
            Snapshot::new().with_resources("v1", &[cluster("a", 1), cluster("b", 1)]),
        );
        let client = client(&server, mode);
        let mut a = client.watch::<Cluster>("a");
        assert_eq!(expect_updated(&mut a).await.name, "a");
        server.set_snapshot(Snapshot::new().with_resources("v2", &[cluster("a", 2)]));
        let v2 = expect_updated(&mut a).await;
        assert_eq!(v2.connect_timeout.unwrap().seconds, 2, "{mode:?}");
        server.set_snapshot(Snapshot::new().with_resources("v3", &[cluster("b", 1)]));
        match next(&mut a).await {
            WatchEvent::Removed { reason, .. } => assert_eq!(reason, RemovalReason::Deleted),
            other => panic!("{mode:?}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn reconnect_after_kill_and_restart_keeps_cache_and_subscriptions() {
    for mode in MODES {
        let server = FakeServer::start().await.unwrap();
        let addr = server.addr();
        let snap = Snapshot::new().with_resources("v1", &[cluster("a", 1), cluster("b", 1)]);
        server.set_snapshot(snap.clone());
        let client = client(&server, mode);
        let mut a = client.watch::<Cluster>("a");
        let mut all = client.watch_all::<Cluster>();
        expect_updated(&mut a).await;
        let mut seen = HashSet::new();
        while seen.len() < 2 {
            seen.insert(expect_updated(&mut all).await.name.clone());
        }

        server.kill().await;
        // Down for a while: no watcher sees a deletion, the cache is served to new watchers.
        quiet(&mut a, Duration::from_millis(300)).await;
        let mut late = client.watch::<Cluster>("b");
        assert_eq!(expect_updated(&mut late).await.name, "b");

        let server = FakeServer::start_on(addr).await.unwrap();
        server.set_snapshot(snap);
        match mode {
            Mode::StateOfTheWorld => {
                server
                    .wait_sotw(|reqs| {
                        reqs.first().is_some_and(|r| {
                            r.node.is_some()
                                && r.resource_names == ["*", "a", "b"]
                                && r.version_info == "v1"
                                && r.response_nonce.is_empty()
                        })
                    })
                    .await
            }
            Mode::Delta => {
                server
                    .wait_delta(|reqs| {
                        reqs.first().is_some_and(|r| {
                            r.node.is_some()
                                && r.resource_names_subscribe.contains(&"*".to_string())
                                && r.resource_names_subscribe.contains(&"a".to_string())
                                && r.initial_resource_versions.len() == 2
                        })
                    })
                    .await
            }
        }
        // Same content after the restart: nothing to report.
        quiet(&mut a, Duration::from_millis(300)).await;
        // Subscriptions are live on the new stream.
        server.set_snapshot(
            Snapshot::new().with_resources("v2", &[cluster("a", 5), cluster("b", 1)]),
        );
        assert_eq!(
            expect_updated(&mut a)
                .await
                .connect_timeout
                .unwrap()
                .seconds,
            5,
            "{mode:?}"
        );
        let first = match mode {
            Mode::StateOfTheWorld => server.sotw_requests()[0].node.is_some(),
            Mode::Delta => server.delta_requests()[0].node.is_some(),
        };
        assert!(first, "node on the first request of the new stream");
    }
}

#[tokio::test]
async fn nack_of_a_bad_resource_then_recovery() {
    for mode in MODES {
        let server = FakeServer::start().await.unwrap();
        server.set_snapshot(
            Snapshot::new().with_resources("v1", &[cluster("good", 1), cluster("bad", 0)]),
        );
        let client = client(&server, mode);
        let mut good = client.watch::<Cluster>("good");
        let mut bad = client.watch::<Cluster>("bad");
        expect_updated(&mut good).await;
        match next(&mut bad).await {
            WatchEvent::Rejected { name, error } => {
                assert_eq!(name.as_deref(), Some("bad"));
                assert!(error.contains("connect_timeout"), "{error}");
            }
            other => panic!("{mode:?}: {other:?}"),
        }
        let nacked = |msg: Option<&str>| msg.is_some_and(|m| m.starts_with("bad: "));
        match mode {
            Mode::StateOfTheWorld => {
                server
                    .wait_sotw(|r| {
                        r.iter()
                            .any(|r| nacked(r.error_detail.as_ref().map(|e| e.message.as_str())))
                    })
                    .await
            }
            Mode::Delta => {
                server
                    .wait_delta(|r| {
                        r.iter()
                            .any(|r| nacked(r.error_detail.as_ref().map(|e| e.message.as_str())))
                    })
                    .await
            }
        }
        server.set_snapshot(
            Snapshot::new().with_resources("v2", &[cluster("good", 1), cluster("bad", 3)]),
        );
        assert_eq!(expect_updated(&mut bad).await.name, "bad");
        quiet(&mut good, Duration::from_millis(100)).await;
        if mode == Mode::StateOfTheWorld {
            server
                .wait_sotw(|r| {
                    r.last()
                        .is_some_and(|r| r.version_info == "v2" && r.error_detail.is_none())
                })
                .await;
        }
    }
}

#[tokio::test]
async fn ten_thousand_resource_snapshot() {
    for mode in MODES {
        let server = FakeServer::start().await.unwrap();
        let clusters: Vec<Cluster> = (0..10_000).map(|i| cluster(&format!("c{i}"), 1)).collect();
        server.set_snapshot(Snapshot::new().with_resources("v1", &clusters));
        let client = client(&server, mode);
        let mut all = client.watch_all::<Cluster>();
        let mut seen = HashSet::new();
        while seen.len() < 10_000 {
            seen.insert(expect_updated(&mut all).await.name.clone());
        }
        // The whole state is in: the watch is told so, once.
        assert!(
            matches!(next(&mut all).await, WatchEvent::Synced),
            "{mode:?}"
        );
        // One change among 10,000 arrives alone.
        let mut changed = clusters.clone();
        changed[42] = cluster("c42", 7);
        server.set_snapshot(Snapshot::new().with_resources("v2", &changed));
        let c = expect_updated(&mut all).await;
        assert_eq!(c.name, "c42", "{mode:?}");
        quiet(&mut all, Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn slow_watcher_gets_newest_state_and_blocks_nobody() {
    let server = FakeServer::start().await.unwrap();
    server.set_snapshot(Snapshot::new().with_resources("v0", &[cluster("a", 1)]));
    let client = client(&server, Mode::Delta);
    let mut slow = client.watch::<Cluster>("a");
    let mut fast = client.watch::<Cluster>("a");
    expect_updated(&mut fast).await;
    for i in 2..50 {
        server.set_snapshot(Snapshot::new().with_resources(&format!("v{i}"), &[cluster("a", i)]));
        let c = expect_updated(&mut fast).await;
        assert_eq!(c.connect_timeout.unwrap().seconds, i);
    }
    // The slow one never read: it holds one pending event, the newest.
    let c = expect_updated(&mut slow).await;
    assert_eq!(c.connect_timeout.unwrap().seconds, 49);
    quiet(&mut slow, Duration::from_millis(50)).await;
}

#[tokio::test]
async fn does_not_exist_over_the_wire() {
    // The server does not serve clusters at all, so it never answers: the client's
    // does-not-exist timer decides.
    for mode in MODES {
        let server = FakeServer::start().await.unwrap();
        server.set_snapshot(Snapshot::new().with_raw(LISTENER_TYPE_URL, "v1", Vec::new()));
        let (client, driver) = XdsClient::new(
            config(&server, mode).does_not_exist_timeout(Duration::from_millis(200)),
        );
        tokio::spawn(driver.run());
        let started = tokio::time::Instant::now();
        let mut missing = client.watch::<Cluster>("missing");
        match next(&mut missing).await {
            WatchEvent::Removed { reason, .. } => {
                assert_eq!(reason, RemovalReason::DoesNotExist, "{mode:?}")
            }
            other => panic!("{mode:?}: {other:?}"),
        }
        // Not a race against the machine: a timer never fires early, so this holds however
        // slow the machine is, and fails only if something else reported the name.
        assert!(started.elapsed() >= Duration::from_millis(200), "{mode:?}");
    }
}

#[tokio::test]
async fn delta_server_reports_a_missing_name_at_once() {
    // A served type: the Delta server says in `removed_resources` that the name does not
    // exist, long before the timer would.
    let server = FakeServer::start().await.unwrap();
    server.set_snapshot(Snapshot::new().with_resources("v1", &[cluster("a", 1)]));
    let (client, driver) = XdsClient::new(
        config(&server, Mode::Delta).does_not_exist_timeout(Duration::from_secs(60)),
    );
    tokio::spawn(driver.run());
    let mut missing = client.watch::<Cluster>("missing");
    match next(&mut missing).await {
        WatchEvent::Removed { reason, .. } => assert_eq!(reason, RemovalReason::DoesNotExist),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn gives_up_when_configured() {
    let server = FakeServer::start().await.unwrap();
    let cfg = config(&server, Mode::Delta).give_up_after(Duration::from_millis(300));
    server.kill().await;
    let (client, driver) = XdsClient::new(cfg);
    let _w = client.watch::<Cluster>("a");
    let err = tokio::time::timeout(Duration::from_secs(10), driver.run())
        .await
        .expect("gives up in time")
        .expect_err("an error");
    assert!(err.is_timeout(), "{err:?}");
}

#[tokio::test]
async fn driver_ends_when_everyone_is_gone() {
    let server = FakeServer::start().await.unwrap();
    let (client, driver) = XdsClient::new(config(&server, Mode::StateOfTheWorld));
    let task = tokio::spawn(driver.run());
    let w = client.watch::<Cluster>("a");
    drop(client);
    drop(w);
    let out = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("ends")
        .expect("no panic");
    assert!(out.is_ok());
}

#[test]
fn public_types_are_send_sync_unpin() {
    fn send_sync_unpin<T: Send + Sync + Unpin>() {}
    fn send<T: Send>() {}
    send_sync_unpin::<XdsClient>();
    send_sync_unpin::<meshkit_xds_client::Error>();
    send_sync_unpin::<meshkit_xds_client::protocol::Session>();
    send_sync_unpin::<meshkit_xds_client::protocol::Event>();
    send_sync_unpin::<WatchEvent<Cluster>>();
    send::<Watch<Cluster>>();
    send::<meshkit_xds_client::Driver>();
    fn unpin<T: Unpin>() {}
    unpin::<Watch<Cluster>>();
}

#[tokio::test]
async fn a_wildcard_watch_learns_when_the_servers_state_is_whole() {
    for mode in MODES {
        let server = FakeServer::start().await.unwrap();
        server.set_snapshot(
            Snapshot::new().with_resources("v1", &[cluster("a", 1), cluster("b", 1)]),
        );
        let client = client(&server, mode);
        let mut all = client.watch_all::<Cluster>();
        let mut names = Vec::new();
        loop {
            match next(&mut all).await {
                WatchEvent::Updated { name, .. } => names.push(name),
                WatchEvent::Synced => break,
                other => panic!("{mode:?}: {other:?}"),
            }
        }
        names.sort();
        assert_eq!(names, ["a", "b"], "{mode:?}: synced before the state");
        // Once: a new version is an update, not another sync.
        server.set_snapshot(Snapshot::new().with_resources("v2", &[cluster("a", 2)]));
        assert!(
            matches!(
                next(&mut all).await,
                WatchEvent::Updated { .. } | WatchEvent::Removed { .. }
            ),
            "{mode:?}"
        );
        // A later wildcard watch gets the cache, then the sync at once.
        let mut later = client.watch_all::<Cluster>();
        loop {
            match next(&mut later).await {
                WatchEvent::Updated { .. } => {}
                WatchEvent::Synced => break,
                other => panic!("{mode:?}: {other:?}"),
            }
        }
    }
}

#[tokio::test]
async fn an_empty_state_is_whole_too() {
    for mode in MODES {
        let server = FakeServer::start().await.unwrap();
        server.set_snapshot(Snapshot::new().with_resources::<Cluster>("v1", &[]));
        let client = client(&server, mode);
        let mut all = client.watch_all::<Cluster>();
        assert!(
            matches!(next(&mut all).await, WatchEvent::Synced),
            "{mode:?}"
        );
    }
}

#[tokio::test]
async fn rewatch_in_the_same_tick_gets_the_cached_value() {
    for mode in MODES {
        let server = FakeServer::start().await.unwrap();
        server.set_snapshot(Snapshot::new().with_resources("v1", &[cluster("a", 1)]));
        let client = client(&server, mode);
        let mut a = client.watch::<Cluster>("a");
        expect_updated(&mut a).await;
        drop(a);
        let mut again = client.watch::<Cluster>("a");
        let c = expect_updated(&mut again).await;
        assert_eq!(c.name, "a", "{mode:?}");
    }
}

/// Issue 15, item 2: a response for a type nobody watches is not answered (in SotW an ACK
/// naming nothing would subscribe the client to every listener), leaves nothing behind, and
/// shows no watcher anything; a later watch of the type starts from nothing and, in SotW,
/// carries the nonce of that response.
#[tokio::test]
async fn scripted_response_for_an_unwatched_type_is_dropped_unanswered() {
    let listener = Listener {
        name: "l".into(),
        address: Some(Default::default()),
        ..Default::default()
    };
    let unsolicited = Any {
        type_url: LISTENER_TYPE_URL.into(),
        value: listener.encode_to_vec(),
    };
    for mode in MODES {
        let server = FakeServer::start().await.unwrap();
        server.set_snapshot(Snapshot::new().with_resources("v1", &[cluster("a", 1)]));
        let client = client(&server, mode);
        let mut a = client.watch::<Cluster>("a");
        expect_updated(&mut a).await;
        match mode {
            Mode::StateOfTheWorld => server.send_sotw(DiscoveryResponse {
                version_info: "l1".into(),
                resources: vec![unsolicited.clone()],
                type_url: LISTENER_TYPE_URL.into(),
                nonce: "unsolicited".into(),
                ..Default::default()
            }),
            Mode::Delta => server.send_delta(DeltaDiscoveryResponse {
                resources: vec![DiscoveryResource {
                    name: "l".into(),
                    version: "1".into(),
                    resource: Some(unsolicited.clone()),
                    ..Default::default()
                }],
                type_url: LISTENER_TYPE_URL.into(),
                nonce: "unsolicited".into(),
                ..Default::default()
            }),
        }
        // The stream is ordered: once the next cluster response is ACKed, the unsolicited one
        // was read before it.
        server.set_snapshot(Snapshot::new().with_resources("v2", &[cluster("a", 2)]));
        assert_eq!(
            expect_updated(&mut a)
                .await
                .connect_timeout
                .unwrap()
                .seconds,
            2
        );
        let cds = meshkit_xds_client::CLUSTER_TYPE_URL;
        match mode {
            Mode::StateOfTheWorld => {
                server
                    .wait_sotw(|r| {
                        r.iter()
                            .any(|r| r.type_url == cds && r.version_info == "v2")
                    })
                    .await;
                let lds: Vec<_> = server
                    .sotw_requests()
                    .into_iter()
                    .filter(|r| r.type_url == LISTENER_TYPE_URL)
                    .collect();
                assert!(lds.is_empty(), "answered the unwatched type: {lds:?}");
            }
            Mode::Delta => {
                server
                    .wait_delta(|r| {
                        r.iter()
                            .filter(|r| r.type_url == cds && !r.response_nonce.is_empty())
                            .count()
                            >= 2
                    })
                    .await;
                let lds: Vec<_> = server
                    .delta_requests()
                    .into_iter()
                    .filter(|r| r.type_url == LISTENER_TYPE_URL)
                    .collect();
                assert!(lds.is_empty(), "answered the unwatched type: {lds:?}");
            }
        }
        // Nothing was kept: a new watch of the listener gets nothing (the server has none).
        let mut l = client.watch::<Listener>("l");
        match mode {
            Mode::StateOfTheWorld => {
                server
                    .wait_sotw(|r| {
                        r.iter().any(|r| {
                            r.type_url == LISTENER_TYPE_URL
                                && r.resource_names == ["l"]
                                && r.response_nonce == "unsolicited"
                                && r.version_info.is_empty()
                        })
                    })
                    .await;
            }
            Mode::Delta => {
                server
                    .wait_delta(|r| {
                        r.iter().any(|r| {
                            r.type_url == LISTENER_TYPE_URL
                                && r.resource_names_subscribe == ["l"]
                                && r.initial_resource_versions.is_empty()
                        })
                    })
                    .await;
            }
        }
        if let Ok(ev) = tokio::time::timeout(Duration::from_millis(300), l.next()).await {
            panic!("{mode:?}: the unsolicited listener surfaced: {ev:?}");
        }
    }
}

/// A TCP proxy that, for the connection whose index is in `blackhole`, keeps the socket open
/// but forwards nothing (a black-holed path). Counts connections.
async fn proxy(upstream: SocketAddr) -> (SocketAddr, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let blackhole = Arc::new(AtomicUsize::new(usize::MAX));
    let (c, b) = (Arc::clone(&count), Arc::clone(&blackhole));
    tokio::spawn(async move {
        while let Ok((down, _)) = listener.accept().await {
            let index = c.fetch_add(1, Ordering::SeqCst);
            let Ok(up) = TcpStream::connect(upstream).await else {
                continue;
            };
            let (dr, dw) = down.into_split();
            let (ur, uw) = up.into_split();
            tokio::spawn(pump(dr, uw, index, Arc::clone(&b)));
            tokio::spawn(pump(ur, dw, index, Arc::clone(&b)));
        }
    });
    (addr, count, blackhole)
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    index: usize,
    blackhole: Arc<AtomicUsize>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if blackhole.load(Ordering::SeqCst) == index {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[tokio::test]
async fn keepalive_detects_a_black_holed_connection() {
    let server = FakeServer::start().await.unwrap();
    server.set_snapshot(Snapshot::new().with_resources("v1", &[cluster("a", 1)]));
    let (addr, connections, blackhole) = proxy(server.addr()).await;
    let node = Node::default();
    let cfg = ClientConfig::new(format!("http://{addr}"), Mode::Delta, node)
        .backoff(Duration::from_millis(20), Duration::from_millis(100))
        .keepalive(Duration::from_millis(200), Duration::from_millis(300));
    let (client, driver) = XdsClient::new(cfg);
    tokio::spawn(driver.run());
    let mut a = client.watch::<Cluster>("a");
    expect_updated(&mut a).await;
    assert_eq!(connections.load(Ordering::SeqCst), 1);
    // The path goes silent without closing: only keepalive can notice.
    blackhole.store(0, Ordering::SeqCst);
    // Keepalive notices in about 0.5 s; the bound only keeps a broken client from hanging.
    tokio::time::timeout(Duration::from_secs(20), async {
        while connections.load(Ordering::SeqCst) < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("a reconnect within 20 s after the path went silent");
    // Subscriptions work on the new connection; no deletion was reported meanwhile.
    server.set_snapshot(Snapshot::new().with_resources("v2", &[cluster("a", 9)]));
    let c = expect_updated(&mut a).await;
    assert_eq!(c.connect_timeout.unwrap().seconds, 9);
}

#[tokio::test]
async fn dropping_the_last_watch_unsubscribes() {
    let server = FakeServer::start().await.unwrap();
    server.set_snapshot(Snapshot::new().with_resources("v1", &[cluster("a", 1)]));
    let client = client(&server, Mode::Delta);
    let mut a1 = client.watch::<Cluster>("a");
    let a2 = client.watch::<Cluster>("a");
    expect_updated(&mut a1).await;
    drop(a1);
    // A barrier instead of a sleep: the driver handles commands in order and the stream
    // carries requests in order, so once the server has the subscription to "b", an
    // unsubscribe of "a" caused by dropping `a1` would have arrived before it.
    let _b = client.watch::<Cluster>("b");
    server
        .wait_delta(|r| r.iter().any(|r| r.resource_names_subscribe == ["b"]))
        .await;
    assert!(
        server
            .delta_requests()
            .iter()
            .all(|r| r.resource_names_unsubscribe.is_empty()),
        "another watch still needs it"
    );
    drop(a2);
    server
        .wait_delta(|r| {
            r.iter()
                .any(|r| r.resource_names_unsubscribe == ["a"] && r.response_nonce.is_empty())
        })
        .await;
}

/// Issue 15, item 4, end to end: `ignore_resource_deletion` reaches the session. A cluster the
/// server's State-of-the-World response leaves out stays, and watchers hear nothing of it.
#[tokio::test]
async fn ignore_resource_deletion_keeps_a_cluster_the_server_leaves_out() {
    let server = FakeServer::start().await.unwrap();
    server.set_snapshot(Snapshot::new().with_resources("v1", &[cluster("a", 1), cluster("b", 1)]));
    let (client, driver) =
        XdsClient::new(config(&server, Mode::StateOfTheWorld).ignore_resource_deletion(true));
    tokio::spawn(driver.run());
    let mut a = client.watch::<Cluster>("a");
    let mut b = client.watch::<Cluster>("b");
    expect_updated(&mut a).await;
    expect_updated(&mut b).await;
    server.set_snapshot(Snapshot::new().with_resources("v2", &[cluster("a", 2)]));
    assert_eq!(
        expect_updated(&mut a)
            .await
            .connect_timeout
            .unwrap()
            .seconds,
        2
    );
    quiet(&mut b, Duration::from_millis(300)).await;
    let mut late = client.watch::<Cluster>("b");
    assert_eq!(expect_updated(&mut late).await.name, "b", "still cached");
}
