//! Issue 15, item 3: fallback servers by gRFC A71. The server choice is a sans-I/O state
//! machine (`protocol::Failover`) tested here on a simulated clock, together with the session
//! across a switch; then the client over loopback against two meshkit-xds-server instances.

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryResponse, DiscoveryResponse, Resource as Wrapped,
};
use envoy_types::pb::google::protobuf::{Any, Duration as PbDuration};
use meshkit_xds_client::protocol::{
    Event, Failover, Mode, RemovalReason, Request, Response, Session, SessionConfig,
};
use meshkit_xds_client::testing::{FakeServer, Snapshot, SnapshotExt};
use meshkit_xds_client::{
    CLUSTER_TYPE_URL, ClientConfig, ResourceType, Watch, WatchEvent, XdsClient,
};
use prost::Message;

const MS: Duration = Duration::from_millis(1);
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

fn node() -> Node {
    Node {
        id: "fallback-test".into(),
        ..Default::default()
    }
}

// === the server choice, on a simulated clock ===

/// Backoff 100 ms doubling to 800 ms, so delays are easy to bound.
fn failover(servers: usize, now: Instant) -> Failover {
    Failover::new(servers, now).with_backoff(100 * MS, 800 * MS)
}

/// The retry lies within the jittered window of `nominal` after `now`.
fn assert_retry_within(f: &Failover, now: Instant, nominal: Duration) {
    let at = f.poll_timeout().expect("a retry is planned");
    assert!(
        at >= now + nominal / 2 && at <= now + nominal,
        "retry after {:?}, nominal {nominal:?}",
        at - now
    );
}

#[test]
fn a71_unreachable_primary_falls_back_at_once_and_is_probed_with_backoff() {
    let now = Instant::now();
    let mut f = failover(3, now);
    assert_eq!(f.active(), 0);
    assert_eq!(f.poll_connect(now), Some(0));
    assert_eq!(
        f.poll_connect(now),
        None,
        "one attempt at a time per server"
    );
    f.on_failure(0, now);
    assert_eq!(f.active(), 1, "the next server takes over");
    assert_eq!(f.poll_connect(now), Some(1), "at once, without waiting");
    assert_eq!(
        f.poll_connect(now),
        None,
        "the primary waits for its backoff"
    );
    assert_retry_within(&f, now, 100 * MS);
    // The fallback fails too: the third server, while both before it are probed.
    f.on_failure(1, now);
    assert_eq!(f.active(), 2);
    assert_eq!(f.poll_connect(now), Some(2));
    let later = now + 100 * MS;
    let mut due: Vec<usize> = std::iter::from_fn(|| f.poll_connect(later)).collect();
    due.sort();
    assert_eq!(due, [0, 1], "every higher-priority server is retried");
    // Servers never answer before they are dialled; a dialled one fails again: longer backoff.
    f.on_failure(0, later);
    assert_retry_within(&f, later, 200 * MS);
    assert_eq!(f.active(), 2, "a failing probe changes nothing");
}

#[test]
fn a71_a_stream_ending_before_a_response_falls_back_one_ending_after_reconnects() {
    let now = Instant::now();
    let mut f = failover(2, now);
    assert_eq!(f.poll_connect(now), Some(0));
    f.on_response(0, now);
    // The stream had answered: not a failure, the same server again after the first delay.
    f.on_closed(0, now);
    assert_eq!(f.active(), 0);
    assert_eq!(f.poll_connect(now), None);
    assert_retry_within(&f, now, 100 * MS);
    let t = f.poll_timeout().unwrap();
    assert_eq!(f.poll_connect(t), Some(0));
    // Now it accepts the stream but ends it before answering: that is a failure (A57/A71).
    f.on_failure(0, t);
    assert_eq!(f.active(), 1);
    assert_eq!(f.poll_connect(t), Some(1));
}

#[test]
fn a71_a_higher_priority_server_that_answers_again_takes_over() {
    let now = Instant::now();
    let mut f = failover(3, now);
    f.poll_connect(now);
    f.on_failure(0, now);
    f.poll_connect(now);
    f.on_failure(1, now);
    assert_eq!(f.poll_connect(now), Some(2));
    assert!(
        !f.on_response(2, now),
        "the active server answering switches nothing"
    );
    // Server 1 answers its probe: it becomes active, server 2 is dropped.
    let t = now + 100 * MS;
    let mut due: Vec<usize> = std::iter::from_fn(|| f.poll_connect(t)).collect();
    due.sort();
    assert_eq!(due, [0, 1]);
    assert!(f.on_response(1, t), "the switch");
    assert_eq!(f.active(), 1);
    // Late news of the dropped server is ignored; server 0 is still probed.
    f.on_failure(2, t);
    f.on_closed(2, t);
    assert_eq!(f.active(), 1);
    f.on_failure(0, t);
    assert_eq!(f.active(), 1);
    let next = f.poll_timeout().unwrap();
    assert_eq!(f.poll_connect(next), Some(0));
    assert!(f.on_response(0, next), "and the primary, once it answers");
    assert_eq!(f.active(), 0);
    assert_eq!(f.poll_timeout(), None, "nothing else to dial");
}

#[test]
fn a71_backoff_doubles_per_server_to_the_cap_and_resets_on_a_response() {
    let mut now = Instant::now();
    let mut f = failover(1, now);
    for nominal in [100u32, 200, 400, 800, 800, 800] {
        assert_eq!(f.poll_connect(now), Some(0));
        f.on_failure(0, now);
        assert_eq!(f.active(), 0, "the last server stays active");
        assert_retry_within(&f, now, nominal * MS);
        now = f.poll_timeout().unwrap();
    }
    assert_eq!(f.poll_connect(now), Some(0));
    f.on_response(0, now);
    f.on_closed(0, now);
    assert_retry_within(&f, now, 100 * MS);
}

// === the session across a switch ===

fn sotw_response(version: &str, nonce: &str, clusters: &[Cluster]) -> Response {
    Response::Sotw(DiscoveryResponse {
        version_info: version.into(),
        resources: clusters.iter().map(any).collect(),
        type_url: CLUSTER_TYPE_URL.into(),
        nonce: nonce.into(),
        ..Default::default()
    })
}

fn delta_response(nonce: &str, clusters: &[Cluster]) -> Response {
    Response::Delta(DeltaDiscoveryResponse {
        resources: clusters
            .iter()
            .map(|c| Wrapped {
                name: c.name.clone(),
                version: format!("{}", c.connect_timeout.unwrap().seconds),
                resource: Some(any(c)),
                ..Default::default()
            })
            .collect(),
        type_url: CLUSTER_TYPE_URL.into(),
        nonce: nonce.into(),
        ..Default::default()
    })
}

fn any(c: &Cluster) -> Any {
    Any {
        type_url: CLUSTER_TYPE_URL.into(),
        value: c.encode_to_vec(),
    }
}

#[test]
fn a71_switching_servers_keeps_the_cache_with_no_deletion_or_does_not_exist() {
    let kind = ResourceType::of::<Cluster>();
    for mode in MODES {
        let start = Instant::now();
        let mut now = start;
        let mut s = Session::new(SessionConfig::new(mode).node(node()));
        let mut f = failover(2, now);
        s.subscribe(kind, "a");
        s.subscribe(kind, "b");
        // Server 0 serves a and b.
        assert_eq!(f.poll_connect(now), Some(0));
        s.on_connected(now);
        while s.poll_request(now).is_some() {}
        let first = [cluster("a", 1), cluster("b", 1)];
        s.handle_response(
            now,
            match mode {
                Mode::StateOfTheWorld => sotw_response("v1", "n1", &first),
                Mode::Delta => delta_response("n1", &first),
            },
        );
        f.on_response(0, now);
        while s.poll_request(now).is_some() {}
        assert_eq!(std::iter::from_fn(|| s.poll_event()).count(), 2);
        // It goes away; the reconnect is refused: fall back.
        s.on_disconnected();
        f.on_closed(0, now);
        now = f.poll_timeout().unwrap();
        assert_eq!(f.poll_connect(now), Some(0));
        f.on_failure(0, now);
        assert_eq!(f.poll_connect(now), Some(1));
        // A name subscribed meanwhile, that no server has.
        s.subscribe(kind, "c");
        now += Duration::from_secs(20);
        s.handle_timeout(now);
        assert!(
            s.poll_event().is_none(),
            "{mode:?}: nothing while no server is connected"
        );
        // The fallback's stream: asked for what the client holds.
        s.on_connected(now);
        let requests: Vec<Request> = std::iter::from_fn(|| s.poll_request(now)).collect();
        match requests.as_slice() {
            [Request::Sotw(r)] => {
                assert_eq!(r.resource_names, ["a", "b", "c"]);
                assert_eq!(r.version_info, "v1", "the last accepted version");
                assert!(r.response_nonce.is_empty());
                assert!(r.node.is_some());
            }
            [Request::Delta(r)] => {
                assert_eq!(r.resource_names_subscribe, ["a", "b", "c"]);
                let mut held: Vec<_> = r.initial_resource_versions.keys().cloned().collect();
                held.sort();
                assert_eq!(held, ["a", "b"]);
            }
            other => panic!("{other:?}"),
        }
        assert!(s.resource(CLUSTER_TYPE_URL, "a").is_some());
        assert!(s.resource(CLUSTER_TYPE_URL, "b").is_some());
        // Only "c", never received, is declared non-existent, 15 s after it was asked for.
        s.handle_timeout(now + Duration::from_secs(14));
        assert!(s.poll_event().is_none(), "{mode:?}");
        s.handle_timeout(now + Duration::from_secs(15));
        let events: Vec<Event> = std::iter::from_fn(|| s.poll_event()).collect();
        match events.as_slice() {
            [Event::Removed { name, reason, .. }] => {
                assert_eq!(name, "c");
                assert_eq!(*reason, RemovalReason::DoesNotExist);
            }
            other => panic!("{mode:?}: {other:?}"),
        }
    }
}

#[test]
fn a71_a_probe_asks_for_what_a_new_stream_would_and_changes_nothing() {
    let kind = ResourceType::of::<Cluster>();
    for mode in MODES {
        let now = Instant::now();
        let mut s = Session::new(SessionConfig::new(mode).node(node()));
        s.subscribe_wildcard(kind);
        s.subscribe(kind, "a");
        s.subscribe(
            ResourceType::of::<envoy_types::pb::envoy::config::listener::v3::Listener>(),
            "l",
        );
        s.on_connected(now);
        while s.poll_request(now).is_some() {}
        s.handle_response(
            now,
            match mode {
                Mode::StateOfTheWorld => sotw_response("v1", "n1", &[cluster("a", 1)]),
                Mode::Delta => delta_response("n1", &[cluster("a", 1)]),
            },
        );
        while s.poll_request(now).is_some() {}
        let probe = s.initial_requests();
        assert!(
            s.poll_request(now).is_none(),
            "{mode:?}: building the probe's requests queues nothing"
        );
        // The same as the requests of a new stream of this session.
        s.on_disconnected();
        s.on_connected(now);
        let fresh: Vec<Request> = std::iter::from_fn(|| s.poll_request(now)).collect();
        assert_eq!(probe.len(), 2, "{mode:?}: one per subscribed type");
        let mut fresh_sorted = fresh.clone();
        fresh_sorted.sort_by_key(|r| match r {
            Request::Sotw(r) => r.type_url.clone(),
            Request::Delta(r) => r.type_url.clone(),
        });
        let strip = |r: &Request| match r.clone() {
            Request::Sotw(mut r) => {
                r.node = None;
                Request::Sotw(r)
            }
            Request::Delta(mut r) => {
                r.node = None;
                Request::Delta(r)
            }
        };
        assert_eq!(
            probe.iter().map(strip).collect::<Vec<_>>(),
            fresh_sorted.iter().map(strip).collect::<Vec<_>>(),
            "{mode:?}"
        );
        let with_node = probe
            .iter()
            .filter(|r| match r {
                Request::Sotw(r) => r.node.is_some(),
                Request::Delta(r) => r.node.is_some(),
            })
            .count();
        assert_eq!(with_node, 1, "{mode:?}: the node on the first only");
        match &probe[0] {
            Request::Sotw(r) => {
                assert_eq!(r.resource_names, ["*", "a"]);
                assert_eq!(r.version_info, "v1");
                assert!(r.response_nonce.is_empty());
            }
            Request::Delta(r) => {
                assert_eq!(r.resource_names_subscribe, ["*", "a"]);
                assert_eq!(r.initial_resource_versions.len(), 1);
            }
        }
    }
}

// === over loopback, two meshkit-xds-server instances ===

async fn next(w: &mut Watch<Cluster>) -> WatchEvent<Cluster> {
    tokio::time::timeout(Duration::from_secs(20), w.next())
        .await
        .expect("an event within 20 s")
        .expect("the watch is open")
}

/// The next event is an update of `name` to `timeout_s`; no deletion comes first.
async fn expect_timeout(w: &mut Watch<Cluster>, name: &str, timeout_s: i64) {
    match next(w).await {
        WatchEvent::Updated { resource, .. } => {
            assert_eq!(resource.name, name);
            assert_eq!(resource.connect_timeout.unwrap().seconds, timeout_s);
        }
        other => panic!("expected {name} at {timeout_s}, got {other:?}"),
    }
}

fn client(primary: &str, fallback: &str, mode: Mode) -> XdsClient {
    let config = ClientConfig::new(primary, mode, node())
        .fallback_servers([fallback])
        .backoff(Duration::from_millis(20), Duration::from_millis(100))
        .does_not_exist_timeout(Duration::from_secs(2));
    let (client, driver) = XdsClient::new(config);
    tokio::spawn(driver.run());
    client
}

fn subscribed_to(server: &FakeServer, mode: Mode, name: &str) -> bool {
    match mode {
        Mode::StateOfTheWorld => server
            .sotw_requests()
            .iter()
            .any(|r| r.resource_names.iter().any(|n| n == name)),
        Mode::Delta => server
            .delta_requests()
            .iter()
            .any(|r| r.resource_names_subscribe.iter().any(|n| n == name)),
    }
}

#[tokio::test]
async fn a71_the_fallback_serves_with_the_cache_kept_and_the_primary_takes_over_again() {
    for mode in MODES {
        let primary = FakeServer::start().await.unwrap();
        let addr = primary.addr();
        primary.set_snapshot(
            Snapshot::new().with_resources("v1", &[cluster("a", 1), cluster("b", 1)]),
        );
        let secondary = FakeServer::start().await.unwrap();
        secondary.set_snapshot(
            Snapshot::new().with_resources("s1", &[cluster("a", 2), cluster("b", 2)]),
        );
        let client = client(&primary.uri(), &secondary.uri(), mode);
        let mut a = client.watch::<Cluster>("a");
        expect_timeout(&mut a, "a", 1).await;
        let mut b = client.watch::<Cluster>("b");
        expect_timeout(&mut b, "b", 1).await;
        assert!(
            secondary.sotw_requests().is_empty() && secondary.delta_requests().is_empty(),
            "{mode:?}: the fallback is not used while the primary serves"
        );

        primary.kill().await;
        // The fallback serves; the first thing watchers see is its version, not a deletion.
        expect_timeout(&mut a, "a", 2).await;
        expect_timeout(&mut b, "b", 2).await;
        // It was asked for what the client held from the primary.
        match mode {
            Mode::StateOfTheWorld => {
                let first = &secondary.sotw_requests()[0];
                assert_eq!(first.version_info, "v1", "{first:?}");
                assert!(first.node.is_some());
            }
            Mode::Delta => {
                let first = &secondary.delta_requests()[0];
                assert_eq!(first.initial_resource_versions.len(), 2, "{first:?}");
            }
        }
        // A watch started on the fallback gets the cache at once.
        let mut late = client.watch::<Cluster>("b");
        expect_timeout(&mut late, "b", 2).await;

        // The primary comes back on the same port: the client switches back to it.
        let primary = FakeServer::start_on(addr).await.unwrap();
        primary.set_snapshot(
            Snapshot::new().with_resources("v3", &[cluster("a", 3), cluster("b", 1)]),
        );
        expect_timeout(&mut a, "a", 3).await;
        expect_timeout(&mut b, "b", 1).await;
        // The fallback's stream is closed: a new subscription goes to the primary only.
        let mut c = client.watch::<Cluster>("c");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !subscribed_to(&primary, mode, "c") {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{mode:?}: c never asked of the primary"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            !subscribed_to(&secondary, mode, "c"),
            "{mode:?}: the fallback still subscribed to"
        );
        // The primary has no "c" and says so (SotW by leaving it out, Delta by removing it).
        match next(&mut c).await {
            WatchEvent::Removed { reason, .. } => assert_eq!(reason, RemovalReason::DoesNotExist),
            other => panic!("{mode:?}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a71_a_primary_down_at_start_is_used_once_it_comes_up() {
    for mode in MODES {
        // A port nobody listens on, for now.
        let addr = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let secondary = FakeServer::start().await.unwrap();
        secondary.set_snapshot(Snapshot::new().with_resources("s1", &[cluster("a", 2)]));
        let client = client(&format!("http://{addr}"), &secondary.uri(), mode);
        let mut a = client.watch::<Cluster>("a");
        expect_timeout(&mut a, "a", 2).await;

        let primary = FakeServer::start_on(addr).await.unwrap();
        primary.set_snapshot(Snapshot::new().with_resources("v1", &[cluster("a", 1)]));
        expect_timeout(&mut a, "a", 1).await;
        // The primary now serves the changes.
        primary.set_snapshot(Snapshot::new().with_resources("v2", &[cluster("a", 4)]));
        expect_timeout(&mut a, "a", 4).await;
    }
}

#[tokio::test]
async fn a71_a_probe_is_reopened_when_the_subscriptions_change() {
    use envoy_types::pb::envoy::config::listener::v3::Listener;
    for mode in MODES {
        let addr = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let secondary = FakeServer::start().await.unwrap();
        secondary.set_snapshot(Snapshot::new().with_resources("s1", &[cluster("a", 2)]));
        let client = client(&format!("http://{addr}"), &secondary.uri(), mode);
        let mut a = client.watch::<Cluster>("a");
        expect_timeout(&mut a, "a", 2).await;
        // The primary comes up with listeners only: it never answers the probe's clusters.
        let primary = FakeServer::start_on(addr).await.unwrap();
        let listener = Listener {
            name: "l".into(),
            api_listener: Some(Default::default()),
            ..Default::default()
        };
        primary.set_snapshot(Snapshot::new().with_resources("v1", &[listener]));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !subscribed_to(&primary, mode, "a") {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{mode:?}: never probed"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // A watch of what only the primary has: the probe asks for it too, and is answered.
        let mut l = client.watch::<Listener>("l");
        let event = tokio::time::timeout(Duration::from_secs(20), l.next())
            .await
            .expect("the listener within 20 s");
        match event {
            Some(WatchEvent::Updated { name, .. }) => assert_eq!(name, "l", "{mode:?}"),
            other => panic!("{mode:?}: {other:?}"),
        }
    }
}
