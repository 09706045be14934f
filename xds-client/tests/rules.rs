//! The eleven protocol rules of issue 5, each a test on the sans-I/O core with a scripted server
//! and a simulated clock.

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
    Resource as Wrapped,
};
use envoy_types::pb::google::protobuf::{Any, Duration as PbDuration};
use meshkit_xds_client::protocol::{
    Event, Mode, RemovalReason, Request, Response, Session, SessionConfig,
};
use meshkit_xds_client::{
    CLUSTER_TYPE_URL, ENDPOINT_TYPE_URL, LISTENER_TYPE_URL, RESOURCE_WRAPPER_TYPE_URL,
    ROUTE_TYPE_URL, Resource, ResourceType,
};
use prost::Message;

const CDS: &str = CLUSTER_TYPE_URL;
const SOTW: Mode = Mode::StateOfTheWorld;
const DELTA: Mode = Mode::Delta;

// === harness ===

struct H {
    s: Session,
    now: Instant,
}

impl H {
    fn new(mode: Mode) -> Self {
        Self::with_config(SessionConfig::new(mode))
    }

    fn with_config(config: SessionConfig) -> Self {
        let node = Node {
            id: "test-node".into(),
            ..Default::default()
        };
        Self {
            s: Session::new(config.node(node)),
            now: Instant::now(),
        }
    }

    fn connect(&mut self) {
        self.s.on_connected(self.now);
    }

    fn advance(&mut self, d: Duration) {
        self.now += d;
        self.s.handle_timeout(self.now);
    }

    fn requests(&mut self) -> Vec<Request> {
        std::iter::from_fn(|| self.s.poll_request(self.now)).collect()
    }

    fn sotw_requests(&mut self) -> Vec<DiscoveryRequest> {
        self.requests()
            .into_iter()
            .map(|r| match r {
                Request::Sotw(r) => r,
                Request::Delta(_) => panic!("delta request in sotw"),
            })
            .collect()
    }

    fn delta_requests(&mut self) -> Vec<DeltaDiscoveryRequest> {
        self.requests()
            .into_iter()
            .map(|r| match r {
                Request::Delta(r) => r,
                Request::Sotw(_) => panic!("sotw request in delta"),
            })
            .collect()
    }

    fn events(&mut self) -> Vec<Event> {
        std::iter::from_fn(|| self.s.poll_event()).collect()
    }

    fn sotw(&mut self, type_url: &str, version: &str, nonce: &str, resources: Vec<Any>) {
        self.s.handle_response(
            self.now,
            Response::Sotw(DiscoveryResponse {
                version_info: version.into(),
                resources,
                type_url: type_url.into(),
                nonce: nonce.into(),
                ..Default::default()
            }),
        );
    }

    fn delta(&mut self, type_url: &str, nonce: &str, resources: Vec<Wrapped>, removed: &[&str]) {
        self.s.handle_response(
            self.now,
            Response::Delta(DeltaDiscoveryResponse {
                resources,
                type_url: type_url.into(),
                nonce: nonce.into(),
                removed_resources: removed.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            }),
        );
    }

    fn has_cluster(&self, name: &str) -> bool {
        self.s.resource(CDS, name).is_some()
    }
}

fn any<T: Resource + Message>(r: &T) -> Any {
    Any {
        type_url: T::TYPE_URL.into(),
        value: r.encode_to_vec(),
    }
}

fn cluster(name: &str) -> Cluster {
    Cluster {
        name: name.into(),
        connect_timeout: Some(PbDuration {
            seconds: 1,
            nanos: 0,
        }),
        ..Default::default()
    }
}

/// Decodes, but fails validation (Envoy: connect_timeout must be > 0).
fn bad_cluster(name: &str) -> Cluster {
    Cluster {
        name: name.into(),
        connect_timeout: Some(PbDuration::default()),
        ..Default::default()
    }
}

fn listener(name: &str) -> Listener {
    Listener {
        name: name.into(),
        api_listener: Some(Default::default()),
        ..Default::default()
    }
}

fn route(name: &str) -> RouteConfiguration {
    RouteConfiguration {
        name: name.into(),
        ..Default::default()
    }
}

fn cla(name: &str) -> ClusterLoadAssignment {
    ClusterLoadAssignment {
        cluster_name: name.into(),
        ..Default::default()
    }
}

fn delta_res<T: Resource + Message>(r: &T, version: &str) -> Wrapped {
    Wrapped {
        name: r.name().into(),
        version: version.into(),
        resource: Some(any(r)),
        ..Default::default()
    }
}

fn cds() -> ResourceType {
    ResourceType::of::<Cluster>()
}

fn updated(events: &[Event]) -> Vec<&str> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Updated { name, .. } => Some(name.as_str()),
            _ => None,
        })
        .collect()
}

fn removed(events: &[Event]) -> Vec<(&str, RemovalReason)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Removed { name, reason, .. } => Some((name.as_str(), *reason)),
            _ => None,
        })
        .collect()
}

fn rejected(events: &[Event]) -> Vec<Option<&str>> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Rejected { name, .. } => Some(name.as_deref()),
            _ => None,
        })
        .collect()
}

/// A connected SotW session subscribed to clusters `a` and `b`, initial request drained.
fn sotw_ab() -> H {
    let mut h = H::new(SOTW);
    h.s.subscribe(cds(), "a");
    h.s.subscribe(cds(), "b");
    h.connect();
    assert_eq!(h.sotw_requests().len(), 1);
    h
}

fn delta_ab() -> H {
    let mut h = H::new(DELTA);
    h.s.subscribe(cds(), "a");
    h.s.subscribe(cds(), "b");
    h.connect();
    assert_eq!(h.delta_requests().len(), 1);
    h
}

// === rule 1: every response is ACKed or NACKed ===

#[test]
fn rule1_sotw_ack_carries_new_version_and_nonce_nack_keeps_last_good() {
    let mut h = sotw_ab();
    h.sotw(
        CDS,
        "v1",
        "n1",
        vec![any(&cluster("a")), any(&cluster("b"))],
    );
    let reqs = h.sotw_requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].version_info, "v1");
    assert_eq!(reqs[0].response_nonce, "n1");
    assert!(reqs[0].error_detail.is_none());
    assert_eq!(reqs[0].resource_names, ["a", "b"]);

    h.sotw(
        CDS,
        "v2",
        "n2",
        vec![any(&cluster("a")), any(&bad_cluster("b"))],
    );
    let reqs = h.sotw_requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(
        reqs[0].version_info, "v1",
        "NACK carries the last good version"
    );
    assert_eq!(reqs[0].response_nonce, "n2");
    let detail = reqs[0].error_detail.as_ref().expect("NACK");
    assert!(
        detail.message.contains("b: connect_timeout"),
        "{}",
        detail.message
    );
    assert!(!detail.message.contains("a:"), "{}", detail.message);
    assert_eq!(h.s.version(CDS), Some("v1"));
}

#[test]
fn rule1_delta_ack_and_nack_carry_the_nonce() {
    let mut h = delta_ab();
    h.delta(CDS, "n1", vec![delta_res(&cluster("a"), "1")], &[]);
    let reqs = h.delta_requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].response_nonce, "n1");
    assert!(reqs[0].error_detail.is_none());
    assert!(reqs[0].resource_names_subscribe.is_empty());

    h.delta(CDS, "n2", vec![delta_res(&bad_cluster("b"), "1")], &[]);
    let reqs = h.delta_requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].response_nonce, "n2");
    let detail = reqs[0].error_detail.as_ref().expect("NACK");
    assert!(detail.message.starts_with("b: "), "{}", detail.message);
    assert_eq!(detail.code, 3);
}

#[test]
fn rule1_undecodable_resource_is_nacked_by_position() {
    let mut h = sotw_ab();
    let garbage = Any {
        type_url: CDS.into(),
        value: vec![0xff, 0xff, 0xff],
    };
    h.sotw(CDS, "v1", "n1", vec![any(&cluster("a")), garbage]);
    let reqs = h.sotw_requests();
    let detail = reqs[0].error_detail.as_ref().expect("NACK");
    assert!(detail.message.contains("resource #1"), "{}", detail.message);
    assert!(h.has_cluster("a"));
}

// === rule 2: partial application ===

#[test]
fn rule2_sotw_valid_resources_apply_and_rejected_never_does_not_exist() {
    let mut h = sotw_ab();
    h.sotw(
        CDS,
        "v1",
        "n1",
        vec![any(&cluster("a")), any(&bad_cluster("b"))],
    );
    let ev = h.events();
    assert_eq!(updated(&ev), ["a"]);
    assert_eq!(rejected(&ev), [Some("b")]);
    let reqs = h.sotw_requests();
    let msg = &reqs[0].error_detail.as_ref().expect("NACK").message;
    assert!(msg.starts_with("b: ") && !msg.contains("a: "), "{msg}");
    // Cluster is a must-be-complete type: b is absent from the valid set but must not be
    // reported as deleted or non-existent, not now and not after the timeout.
    h.advance(Duration::from_secs(60));
    assert!(removed(&h.events()).is_empty());
    assert!(!h.s.is_absent(CDS, "b"));
}

#[test]
fn rule2_sotw_rejected_update_keeps_last_good_value() {
    let mut h = sotw_ab();
    h.sotw(
        CDS,
        "v1",
        "n1",
        vec![any(&cluster("a")), any(&cluster("b"))],
    );
    h.events();
    h.sotw_requests();
    h.sotw(
        CDS,
        "v2",
        "n2",
        vec![any(&cluster("a")), any(&bad_cluster("b"))],
    );
    let ev = h.events();
    assert!(removed(&ev).is_empty(), "{ev:?}");
    assert!(h.has_cluster("b"), "last good b is kept");
}

#[test]
fn rule2_delta_valid_resources_apply_and_rejected_never_does_not_exist() {
    let mut h = delta_ab();
    h.delta(
        CDS,
        "n1",
        vec![
            delta_res(&cluster("a"), "1"),
            delta_res(&bad_cluster("b"), "1"),
        ],
        &[],
    );
    let ev = h.events();
    assert_eq!(updated(&ev), ["a"]);
    assert_eq!(rejected(&ev), [Some("b")]);
    let msg = h.delta_requests()[0]
        .error_detail
        .clone()
        .expect("NACK")
        .message;
    assert!(msg.starts_with("b: ") && !msg.contains("a: "), "{msg}");
    h.advance(Duration::from_secs(60));
    assert!(removed(&h.events()).is_empty());
}

// === rule 3: repeated names ===

#[test]
fn rule3_sotw_repeated_name_is_nacked() {
    let mut h = sotw_ab();
    h.sotw(
        CDS,
        "v1",
        "n1",
        vec![any(&cluster("a")), any(&cluster("b")), any(&cluster("b"))],
    );
    let reqs = h.sotw_requests();
    let msg = &reqs[0].error_detail.as_ref().expect("NACK").message;
    assert!(msg.contains("b: name appears more than once"), "{msg}");
    assert_eq!(reqs[0].version_info, "");
    assert!(h.has_cluster("a"));
    assert!(!h.has_cluster("b"));
}

#[test]
fn rule3_delta_repeated_name_is_nacked() {
    let mut h = delta_ab();
    h.delta(
        CDS,
        "n1",
        vec![delta_res(&cluster("a"), "1"), delta_res(&cluster("a"), "2")],
        &[],
    );
    let msg = h.delta_requests()[0]
        .error_detail
        .clone()
        .expect("NACK")
        .message;
    assert!(msg.contains("a: name appears more than once"), "{msg}");
    // A name both updated and removed is repeated too.
    h.delta(CDS, "n2", vec![delta_res(&cluster("b"), "1")], &["b"]);
    let msg = h.delta_requests()[0]
        .error_detail
        .clone()
        .expect("NACK")
        .message;
    assert!(msg.contains("b: name appears more than once"), "{msg}");
}

// === rule 4: SotW absence ===

#[test]
fn rule4_sotw_missing_listener_or_cluster_is_deleted() {
    for (kind, url, a, b) in [
        (cds(), CDS, any(&cluster("a")), any(&cluster("b"))),
        (
            ResourceType::of::<Listener>(),
            LISTENER_TYPE_URL,
            any(&listener("a")),
            any(&listener("b")),
        ),
    ] {
        let mut h = H::new(SOTW);
        h.s.subscribe_wildcard(kind);
        h.connect();
        h.sotw_requests();
        h.sotw(url, "v1", "n1", vec![a.clone(), b]);
        assert_eq!(updated(&h.events()), ["a", "b"]);
        h.sotw(url, "v2", "n2", vec![a]);
        assert_eq!(
            removed(&h.events()),
            [("b", RemovalReason::Deleted)],
            "{url}"
        );
        assert!(h.s.resource(url, "b").is_none());
    }
}

/// A SotW response may answer a request sent before a name was subscribed: a Listener or
/// Cluster it leaves out that was never received is left to the does-not-exist timer, as gRPC
/// does, instead of being declared non-existent by the response (xds-watch --follow subscribing
/// clusters one by one saw them "removed" and then updated).
#[test]
fn rule4_sotw_absence_of_a_name_never_received_is_left_to_the_timer() {
    let mut h = H::new(SOTW);
    h.s.subscribe(cds(), "a");
    h.connect();
    assert_eq!(h.sotw_requests()[0].resource_names, ["a"]);
    // "b" is asked for just after; the server answers the first request.
    h.s.subscribe(cds(), "b");
    assert_eq!(h.sotw_requests()[0].resource_names, ["a", "b"]);
    h.sotw(CDS, "v1", "n1", vec![any(&cluster("a"))]);
    h.requests();
    let events = h.events();
    assert_eq!(updated(&events), ["a"]);
    assert!(removed(&events).is_empty(), "{events:?}");
    assert!(!h.s.is_absent(CDS, "b"));
    // The answer to the second request brings it.
    h.sotw(
        CDS,
        "v2",
        "n2",
        vec![any(&cluster("a")), any(&cluster("b"))],
    );
    assert_eq!(updated(&h.events()), ["b"]);
    // A name the server never sends does not exist 15 s after it was asked for.
    h.s.subscribe(cds(), "c");
    h.requests();
    h.sotw(
        CDS,
        "v3",
        "n3",
        vec![any(&cluster("a")), any(&cluster("b"))],
    );
    h.requests();
    assert!(h.events().is_empty());
    h.advance(Duration::from_secs(15));
    assert_eq!(removed(&h.events()), [("c", RemovalReason::DoesNotExist)]);
}

#[test]
fn rule4_sotw_missing_route_or_endpoints_is_kept() {
    for (kind, url, a, b) in [
        (
            ResourceType::of::<RouteConfiguration>(),
            ROUTE_TYPE_URL,
            any(&route("a")),
            any(&route("b")),
        ),
        (
            ResourceType::of::<ClusterLoadAssignment>(),
            ENDPOINT_TYPE_URL,
            any(&cla("a")),
            any(&cla("b")),
        ),
    ] {
        let mut h = H::new(SOTW);
        h.s.subscribe(kind, "a");
        h.s.subscribe(kind, "b");
        h.connect();
        h.sotw_requests();
        h.sotw(url, "v1", "n1", vec![a.clone(), b]);
        assert_eq!(updated(&h.events()), ["a", "b"]);
        h.sotw(url, "v2", "n2", vec![a]);
        assert!(h.events().is_empty(), "{url}");
        assert!(h.s.resource(url, "b").is_some());
    }
}

// === rule 5: Delta removal, omission, nonce-less subscription changes ===

#[test]
fn rule5_delta_removed_resources_delete_omission_does_not() {
    let mut h = delta_ab();
    h.delta(
        CDS,
        "n1",
        vec![delta_res(&cluster("a"), "1"), delta_res(&cluster("b"), "1")],
        &[],
    );
    h.events();
    h.delta(CDS, "n2", vec![delta_res(&cluster("a"), "2")], &[]);
    assert!(removed(&h.events()).is_empty());
    assert!(h.has_cluster("b"), "omission never deletes");
    h.delta(CDS, "n3", vec![], &["b"]);
    assert_eq!(removed(&h.events()), [("b", RemovalReason::Deleted)]);
    assert!(!h.has_cluster("b"));
}

#[test]
fn rule5_delta_subscription_changes_carry_no_nonce() {
    let mut h = delta_ab();
    h.delta(CDS, "n1", vec![delta_res(&cluster("a"), "1")], &[]);
    h.s.subscribe(cds(), "c");
    h.s.unsubscribe(CDS, "b");
    let reqs = h.delta_requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(reqs[0].response_nonce, "n1", "the ACK");
    assert!(reqs[0].resource_names_subscribe.is_empty());
    assert_eq!(reqs[1].response_nonce, "", "the change");
    assert_eq!(reqs[1].resource_names_subscribe, ["c"]);
    assert_eq!(reqs[1].resource_names_unsubscribe, ["b"]);
}

// === rule 6: does-not-exist timer ===

#[test]
fn rule6_does_not_exist_after_15s_of_connected_stream_only() {
    for mode in [SOTW, DELTA] {
        let mut h = H::new(mode);
        h.s.subscribe(cds(), "a");
        // Disconnected (backoff): no request sent, no timer.
        assert!(h.requests().is_empty());
        assert_eq!(h.s.poll_timeout(), None);
        h.advance(Duration::from_secs(60));
        assert!(h.events().is_empty());

        h.connect();
        assert_eq!(h.s.poll_timeout(), None, "not before the request is sent");
        assert_eq!(h.requests().len(), 1);
        assert_eq!(h.s.poll_timeout(), Some(h.now + Duration::from_secs(15)));
        h.advance(Duration::from_secs(10));
        // The stream drops: the timer stops and does not run during backoff.
        h.s.on_disconnected();
        assert_eq!(h.s.poll_timeout(), None);
        h.advance(Duration::from_secs(30));
        assert!(h.events().is_empty());
        // A new stream restarts it from the new request.
        h.connect();
        h.requests();
        h.advance(Duration::from_millis(14_999));
        assert!(h.events().is_empty());
        h.advance(Duration::from_millis(1));
        assert_eq!(
            removed(&h.events()),
            [("a", RemovalReason::DoesNotExist)],
            "{mode:?}"
        );
        assert!(h.s.is_absent(CDS, "a"));
    }
}

#[test]
fn rule6_no_timer_for_cached_resources_after_reconnect() {
    let mut h = delta_ab();
    h.delta(
        CDS,
        "n1",
        vec![delta_res(&cluster("a"), "1"), delta_res(&cluster("b"), "1")],
        &[],
    );
    h.delta_requests();
    h.events();
    h.s.on_disconnected();
    h.connect();
    h.delta_requests();
    assert_eq!(h.s.poll_timeout(), None);
    h.advance(Duration::from_secs(60));
    assert!(h.events().is_empty());
    assert!(h.has_cluster("a") && h.has_cluster("b"));
}

#[test]
fn rule6_arrival_cancels_the_timer() {
    let mut h = sotw_ab();
    h.advance(Duration::from_secs(5));
    h.sotw(
        CDS,
        "v1",
        "n1",
        vec![any(&cluster("a")), any(&cluster("b"))],
    );
    assert_eq!(h.s.poll_timeout(), None);
    h.advance(Duration::from_secs(30));
    assert!(removed(&h.events()).is_empty());
}

// === rule 7: resubscribe on a new stream ===

#[test]
fn rule7_sotw_new_stream_resends_everything_without_old_nonce() {
    let mut h = sotw_ab();
    h.s.subscribe_wildcard(ResourceType::of::<Listener>());
    h.sotw_requests();
    h.sotw(
        CDS,
        "v1",
        "n1",
        vec![any(&cluster("a")), any(&cluster("b"))],
    );
    h.sotw_requests();
    assert_eq!(updated(&h.events()), ["a", "b"]);
    h.s.on_disconnected();
    assert!(
        h.requests().is_empty(),
        "nothing is sent while disconnected"
    );
    h.connect();
    let mut reqs = h.sotw_requests();
    reqs.sort_by(|a, b| a.type_url.cmp(&b.type_url));
    assert_eq!(reqs.len(), 2);
    let cds_req = &reqs[0];
    assert_eq!(cds_req.type_url, CDS);
    assert_eq!(cds_req.resource_names, ["a", "b"]);
    assert_eq!(cds_req.version_info, "v1");
    assert_eq!(
        cds_req.response_nonce, "",
        "nonces do not survive a reconnect"
    );
    assert_eq!(reqs[1].resource_names, ["*"]);
    // The node goes on the first request of each stream, and only there.
    assert_eq!(reqs.iter().filter(|r| r.node.is_some()).count(), 1);
    // The cache is kept: no deletion, no event.
    assert!(h.events().is_empty());
    assert!(h.has_cluster("a"));
}

#[test]
fn rule7_delta_new_stream_sends_initial_versions_without_rejected() {
    let mut h = delta_ab();
    h.s.subscribe(cds(), "c");
    h.delta_requests();
    h.delta(
        CDS,
        "n1",
        vec![
            delta_res(&cluster("a"), "1"),
            delta_res(&cluster("b"), "1"),
            delta_res(&cluster("c"), "1"),
        ],
        &[],
    );
    // b v2 is rejected: the server must resend b, so b is left out of initial versions.
    h.delta(CDS, "n2", vec![delta_res(&bad_cluster("b"), "2")], &[]);
    h.delta_requests();
    h.s.on_disconnected();
    h.connect();
    let reqs = h.delta_requests();
    assert_eq!(reqs.len(), 1);
    let r = &reqs[0];
    assert!(r.node.is_some());
    assert_eq!(r.response_nonce, "");
    assert_eq!(r.resource_names_subscribe, ["a", "b", "c"]);
    let mut initial: Vec<_> = r.initial_resource_versions.iter().collect();
    initial.sort();
    assert_eq!(
        initial,
        [
            (&"a".to_string(), &"1".to_string()),
            (&"c".to_string(), &"1".to_string())
        ]
    );
    assert!(
        h.has_cluster("b"),
        "the last good b is still served to watchers"
    );
}

// === rule 8: unsubscribe then resubscribe in the same tick ===

#[test]
fn rule8_unsubscribe_resubscribe_same_tick_keeps_the_resource() {
    for mode in [SOTW, DELTA] {
        let mut h = H::new(mode);
        h.s.subscribe(cds(), "a");
        h.connect();
        h.requests();
        match mode {
            SOTW => h.sotw(CDS, "v1", "n1", vec![any(&cluster("a"))]),
            DELTA => h.delta(CDS, "n1", vec![delta_res(&cluster("a"), "1")], &[]),
        }
        h.requests();
        h.events();
        h.s.unsubscribe(CDS, "a");
        h.s.subscribe(cds(), "a");
        assert!(
            h.has_cluster("a"),
            "{mode:?}: still cached for the new watcher"
        );
        // Nothing changed on the wire, so nothing needs to be sent and nothing is lost.
        assert!(h.requests().is_empty(), "{mode:?}");
        h.advance(Duration::from_secs(60));
        assert!(h.events().is_empty(), "{mode:?}");
        assert!(h.has_cluster("a"));
    }
}

#[test]
fn rule8_unsubscribe_alone_drops_the_resource_when_sent() {
    let mut h = delta_ab();
    h.delta(CDS, "n1", vec![delta_res(&cluster("a"), "1")], &[]);
    h.delta_requests();
    h.s.unsubscribe(CDS, "a");
    let reqs = h.delta_requests();
    assert_eq!(reqs[0].resource_names_unsubscribe, ["a"]);
    assert!(!h.has_cluster("a"));
}

// === rule 9: responses for unwatched types are dropped ===

#[test]
fn rule9_unwatched_type_is_dropped_and_a_later_watch_works() {
    for mode in [SOTW, DELTA] {
        let mut h = H::new(mode);
        // Something else is watched, so the stream is up and the node was sent.
        h.s.subscribe(ResourceType::of::<Listener>(), "l");
        h.connect();
        assert_eq!(h.requests().len(), 1);
        match mode {
            SOTW => h.sotw(CDS, "v1", "n1", vec![any(&cluster("a"))]),
            DELTA => h.delta(CDS, "n1", vec![delta_res(&cluster("a"), "1")], &[]),
        }
        // No ACK: in SotW an ACK naming nothing is a wildcard subscription to every cluster.
        assert!(
            h.requests().is_empty(),
            "{mode:?}: answered an unwatched type"
        );
        assert!(h.events().is_empty(), "{mode:?}");
        assert!(
            !h.has_cluster("a"),
            "{mode:?}: kept a resource nobody asked for"
        );
        assert_eq!(h.s.version(CDS).unwrap_or_default(), "", "{mode:?}");
        h.s.subscribe(cds(), "a");
        match h.requests().as_slice() {
            [Request::Sotw(r)] => {
                assert_eq!(r.resource_names, ["a"]);
                assert_eq!(r.version_info, "", "we never accepted a version of it");
                assert_eq!(
                    r.response_nonce, "n1",
                    "the nonce of the type's last response on this stream"
                );
            }
            [Request::Delta(r)] => {
                assert_eq!(r.resource_names_subscribe, ["a"]);
                assert!(
                    r.response_nonce.is_empty(),
                    "a subscription carries no nonce"
                );
            }
            other => panic!("{other:?}"),
        }
        match mode {
            SOTW => h.sotw(CDS, "v2", "n2", vec![any(&cluster("a"))]),
            DELTA => h.delta(CDS, "n2", vec![delta_res(&cluster("a"), "1")], &[]),
        }
        assert_eq!(updated(&h.events()), ["a"], "{mode:?}");
        assert_eq!(
            h.requests().len(),
            1,
            "{mode:?}: the watched type is answered"
        );
    }
}

#[test]
fn rule9_a_type_no_longer_watched_is_dropped_on_this_stream_and_the_next() {
    for mode in [SOTW, DELTA] {
        let mut h = H::new(mode);
        h.s.subscribe(cds(), "a");
        h.connect();
        h.requests();
        match mode {
            SOTW => h.sotw(CDS, "v1", "n1", vec![any(&cluster("a"))]),
            DELTA => h.delta(CDS, "n1", vec![delta_res(&cluster("a"), "1")], &[]),
        }
        assert_eq!(h.requests().len(), 1);
        h.events();
        h.s.unsubscribe(CDS, "a");
        assert_eq!(h.requests().len(), 1, "the unsubscription");
        for nonce in ["n2", "n3"] {
            match mode {
                SOTW => h.sotw(CDS, "v2", nonce, vec![any(&cluster("a"))]),
                DELTA => h.delta(CDS, nonce, vec![delta_res(&cluster("a"), "2")], &[]),
            }
            assert!(h.requests().is_empty(), "{mode:?} {nonce}: answered");
            assert!(h.events().is_empty(), "{mode:?} {nonce}");
            assert!(!h.has_cluster("a"), "{mode:?} {nonce}");
            // On a new stream a SotW ACK would be the type's first request: a wildcard.
            h.s.on_disconnected();
            h.connect();
            assert!(h.requests().is_empty(), "{mode:?}: nothing to subscribe to");
        }
    }
}

// === gRFC A53: ignoring SotW deletions of Listeners and Clusters ===

#[test]
fn a53_sotw_deletion_ignored_keeps_the_resource_reports_it_once_and_clears_on_return() {
    let lds = ResourceType::of::<Listener>();
    for (kind, any_of) in [
        (cds(), (|n: &str| any(&cluster(n))) as fn(&str) -> Any),
        (lds, |n: &str| any(&listener(n))),
    ] {
        let url = kind.type_url();
        let mut h = H::with_config(SessionConfig::new(SOTW).ignore_resource_deletion(true));
        h.s.subscribe(kind, "a");
        h.s.subscribe(kind, "b");
        h.s.subscribe(kind, "never");
        h.connect();
        h.requests();
        h.sotw(url, "v1", "n1", vec![any_of("a"), any_of("b")]);
        h.requests();
        assert_eq!(updated(&h.events()), ["a", "b"]);
        // "b" left out: kept, no event, counted once however many responses leave it out.
        for (v, n) in [("v2", "n2"), ("v3", "n3")] {
            h.sotw(url, v, n, vec![any_of("a")]);
            let acks = h.sotw_requests();
            assert!(acks[0].error_detail.is_none(), "{url}: ACKed, {acks:?}");
            let events = h.events();
            assert!(removed(&events).is_empty(), "{url}: {events:?}");
            assert!(h.s.resource(url, "b").is_some(), "{url}: b kept");
            assert!(h.s.is_deletion_ignored(url, "b"), "{url}");
            assert_eq!(h.s.ignored_deletions(), 1, "{url}");
        }
        // A subscribed name never received still does not exist, by its timer: only
        // deletions are ignored.
        h.advance(Duration::from_secs(15));
        assert_eq!(
            removed(&h.events()),
            [("never", RemovalReason::DoesNotExist)],
            "{url}"
        );
        // "b" comes back unchanged: the mark clears, nothing to notify.
        h.sotw(url, "v4", "n4", vec![any_of("a"), any_of("b")]);
        h.requests();
        assert!(h.events().is_empty(), "{url}");
        assert!(!h.s.is_deletion_ignored(url, "b"), "{url}");
        // Left out again: counted again.
        h.sotw(url, "v5", "n5", vec![any_of("a")]);
        h.requests();
        assert!(h.events().is_empty(), "{url}");
        assert_eq!(h.s.ignored_deletions(), 2, "{url}");
        // Unsubscribing ends it: the entry goes with the request.
        h.s.unsubscribe(url, "b");
        h.requests();
        assert!(!h.s.is_deletion_ignored(url, "b"));
        assert!(h.s.resource(url, "b").is_none());
    }
}

#[test]
fn a53_option_off_deletes_and_delta_removals_always_delete() {
    let mut h = sotw_ab();
    h.sotw(
        CDS,
        "v1",
        "n1",
        vec![any(&cluster("a")), any(&cluster("b"))],
    );
    h.requests();
    h.events();
    h.sotw(CDS, "v2", "n2", vec![any(&cluster("a"))]);
    assert_eq!(removed(&h.events()), [("b", RemovalReason::Deleted)]);
    assert_eq!(h.s.ignored_deletions(), 0);

    let mut h = H::with_config(SessionConfig::new(DELTA).ignore_resource_deletion(true));
    h.s.subscribe(cds(), "a");
    h.connect();
    h.requests();
    h.delta(CDS, "n1", vec![delta_res(&cluster("a"), "1")], &[]);
    h.events();
    h.delta(CDS, "n2", vec![], &["a"]);
    assert_eq!(removed(&h.events()), [("a", RemovalReason::Deleted)]);
    assert_eq!(h.s.ignored_deletions(), 0);
}

// === rule 10: explicit wildcard; empty after names means nothing ===

#[test]
fn rule10_sotw_wildcard_is_explicit_and_empty_means_nothing() {
    let mut h = H::new(SOTW);
    h.s.subscribe_wildcard(cds());
    h.connect();
    assert_eq!(h.sotw_requests()[0].resource_names, ["*"]);
    h.s.unsubscribe_wildcard(CDS);
    h.s.subscribe(cds(), "a");
    assert_eq!(h.sotw_requests()[0].resource_names, ["a"]);
    h.s.unsubscribe(CDS, "a");
    let reqs = h.sotw_requests();
    assert_eq!(reqs.len(), 1, "the empty list is sent: it means nothing");
    assert!(reqs[0].resource_names.is_empty());
    // On a new stream an empty list would mean wildcard, so nothing is sent at all.
    h.s.on_disconnected();
    h.connect();
    assert!(h.sotw_requests().is_empty());
}

#[test]
fn rule10_delta_wildcard_is_explicit() {
    let mut h = H::new(DELTA);
    h.s.subscribe(cds(), "*");
    h.connect();
    assert_eq!(h.delta_requests()[0].resource_names_subscribe, ["*"]);
    h.s.subscribe(cds(), "a");
    h.s.unsubscribe_wildcard(CDS);
    let r = &h.delta_requests()[0];
    assert_eq!(r.resource_names_subscribe, ["a"]);
    assert_eq!(r.resource_names_unsubscribe, ["*"]);
    h.s.unsubscribe(CDS, "a");
    assert_eq!(h.delta_requests()[0].resource_names_unsubscribe, ["a"]);
    h.s.on_disconnected();
    h.connect();
    assert!(h.delta_requests().is_empty());
}

// === rule 11: TTL ===

fn ttl(secs: i64) -> Option<PbDuration> {
    Some(PbDuration {
        seconds: secs,
        nanos: 0,
    })
}

#[test]
fn rule11_delta_ttl_expires_without_heartbeat() {
    let mut h = H::new(DELTA);
    h.s.subscribe(cds(), "a");
    h.connect();
    h.delta_requests();
    let mut a = delta_res(&cluster("a"), "1");
    a.ttl = ttl(10);
    h.delta(CDS, "n1", vec![a], &[]);
    assert_eq!(updated(&h.events()), ["a"]);
    h.advance(Duration::from_secs(8));
    // Heartbeat: same name, no body; refreshes the TTL.
    let hb = Wrapped {
        name: "a".into(),
        version: "1".into(),
        ttl: ttl(10),
        ..Default::default()
    };
    h.delta(CDS, "n2", vec![hb], &[]);
    assert!(h.events().is_empty());
    h.advance(Duration::from_secs(7));
    let ev = h.events();
    assert!(ev.is_empty(), "the heartbeat kept it alive: {ev:?}");
    // TTL keeps running while disconnected: it exists for an unreachable server.
    h.s.on_disconnected();
    h.advance(Duration::from_secs(3));
    assert_eq!(removed(&h.events()), [("a", RemovalReason::TtlExpired)]);
    assert!(!h.has_cluster("a"));
}

#[test]
fn rule11_sotw_ttl_through_resource_wrapper() {
    let mut h = sotw_ab();
    let wrap = |body: Option<Any>| Any {
        type_url: RESOURCE_WRAPPER_TYPE_URL.into(),
        value: Wrapped {
            name: "a".into(),
            ttl: ttl(5),
            resource: body,
            ..Default::default()
        }
        .encode_to_vec(),
    };
    h.sotw(CDS, "v1", "n1", vec![wrap(Some(any(&cluster("a"))))]);
    assert_eq!(updated(&h.events()), ["a"]);
    h.advance(Duration::from_secs(4));
    h.sotw(CDS, "v1", "n2", vec![wrap(None)]);
    assert!(h.events().is_empty(), "a heartbeat counts as present");
    h.advance(Duration::from_secs(4));
    assert!(h.events().is_empty());
    h.advance(Duration::from_secs(1));
    assert_eq!(removed(&h.events()), [("a", RemovalReason::TtlExpired)]);
    assert_eq!(h.sotw_requests().len(), 2);
}

// === others ===

#[test]
fn unchanged_resource_is_not_notified_again() {
    let mut h = sotw_ab();
    h.sotw(CDS, "v1", "n1", vec![any(&cluster("a"))]);
    assert_eq!(updated(&h.events()), ["a"]);
    h.sotw(CDS, "v2", "n2", vec![any(&cluster("a"))]);
    assert!(h.events().is_empty());
}

#[test]
fn node_only_on_first_request_of_each_stream() {
    let mut h = H::new(DELTA);
    h.s.subscribe(cds(), "a");
    h.s.subscribe_wildcard(ResourceType::of::<Listener>());
    h.connect();
    let reqs = h.delta_requests();
    assert_eq!(reqs.len(), 2);
    assert!(reqs[0].node.is_some());
    assert!(reqs[1].node.is_none());
    h.s.on_disconnected();
    h.connect();
    let reqs = h.delta_requests();
    assert!(reqs[0].node.is_some());
    assert!(reqs[1].node.is_none());
}

// === the wildcard subscription's first state ===

fn synced(events: &[Event]) -> usize {
    events
        .iter()
        .filter(|e| matches!(e, Event::Synced { .. }))
        .count()
}

#[test]
fn a_wildcard_subscription_is_synced_by_its_first_response_even_an_empty_one() {
    for mode in [SOTW, DELTA] {
        let mut h = H::new(mode);
        h.s.subscribe_wildcard(cds());
        h.connect();
        assert_eq!(h.requests().len(), 1, "{mode:?}");
        assert!(!h.s.is_synced(CDS), "{mode:?}: synced before any response");
        match mode {
            Mode::StateOfTheWorld => h.sotw(CDS, "1", "n1", vec![]),
            _ => h.delta(CDS, "n1", vec![], &[]),
        }
        let events = h.events();
        assert_eq!(synced(&events), 1, "{mode:?}: {events:?}");
        assert!(h.s.is_synced(CDS), "{mode:?}");
        // Later responses do not say it again; their events come as usual.
        match mode {
            Mode::StateOfTheWorld => h.sotw(CDS, "2", "n2", vec![any(&cluster("a"))]),
            _ => h.delta(CDS, "n2", vec![delta_res(&cluster("a"), "1")], &[]),
        }
        let events = h.events();
        assert_eq!(synced(&events), 0, "{mode:?}: {events:?}");
        assert_eq!(updated(&events), ["a"], "{mode:?}");
        // Ending the wildcard subscription forgets it.
        h.s.unsubscribe_wildcard(CDS);
        assert!(!h.s.is_synced(CDS), "{mode:?}");
    }
}

#[test]
fn synced_follows_the_events_of_the_response_it_completes() {
    let mut h = H::new(DELTA);
    h.s.subscribe_wildcard(cds());
    h.connect();
    h.delta_requests();
    h.delta(
        CDS,
        "n1",
        vec![
            delta_res(&cluster("a"), "1"),
            delta_res(&bad_cluster("b"), "1"),
        ],
        &[],
    );
    let events = h.events();
    let last = events.last().expect("events");
    assert!(matches!(last, Event::Synced { .. }), "{events:?}");
    assert_eq!(updated(&events), ["a"]);
    assert_eq!(rejected(&events), [Some("b")]);
}

#[test]
fn a_named_subscription_alone_is_never_synced() {
    let mut h = delta_ab();
    h.delta(CDS, "n1", vec![delta_res(&cluster("a"), "1")], &[]);
    assert_eq!(synced(&h.events()), 0);
    assert!(!h.s.is_synced(CDS));
}
