//! The Delta stream state, without I/O: what is answered, and when.

use meshkit_xds_server::envoy::{Any, DeltaDiscoveryRequest, DeltaDiscoveryResponse};
use meshkit_xds_server::envoy_types::pb::google::rpc::Status as RpcStatus;
use meshkit_xds_server::{
    DeltaStream, RequestError, ServerConfig, Snapshot, SnapshotBuilder, TypeSnapshot,
};

const A: &str = "type.googleapis.com/test.A";
const B: &str = "type.googleapis.com/test.B";

fn any(bytes: &[u8]) -> Any {
    Any {
        type_url: A.into(),
        value: bytes.to_vec(),
    }
}

/// A snapshot serving A and B with raw resources `(type, name, bytes)`.
fn snapshot(resources: &[(&str, &str, &[u8])]) -> Snapshot {
    let mut b = SnapshotBuilder::new();
    b.declare(A).declare(B);
    for (url, name, bytes) in resources {
        b.add_any(url, name, any(bytes));
    }
    b.build()
}

fn subscribe(url: &str, names: &[&str]) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: url.into(),
        resource_names_subscribe: names.iter().map(|n| n.to_string()).collect(),
        ..Default::default()
    }
}

fn unsubscribe(url: &str, names: &[&str]) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: url.into(),
        resource_names_unsubscribe: names.iter().map(|n| n.to_string()).collect(),
        ..Default::default()
    }
}

fn ack(resp: &DeltaDiscoveryResponse) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: resp.type_url.clone(),
        response_nonce: resp.nonce.clone(),
        ..Default::default()
    }
}

fn names(r: &DeltaDiscoveryResponse) -> Vec<&str> {
    r.resources.iter().map(|r| r.name.as_str()).collect()
}

#[test]
fn first_request_of_a_served_type_is_answered_even_when_empty() {
    let mut st = DeltaStream::default();
    st.handle_request(subscribe(A, &["*"]));
    let out = st.poll(&snapshot(&[]));
    assert_eq!(out.len(), 1);
    assert!(out[0].resources.is_empty() && out[0].removed_resources.is_empty());
    assert_eq!(
        out[0].system_version_info,
        snapshot(&[]).version(A).unwrap_or_default()
    );
    assert!(st.poll(&snapshot(&[])).is_empty(), "once");
}

#[test]
fn a_type_not_in_the_snapshot_gets_no_answer_at_all() {
    let unserved = "type.googleapis.com/test.Unserved";
    let mut st = DeltaStream::default();
    st.handle_request(subscribe(unserved, &["x"]));
    assert!(
        st.poll(&snapshot(&[])).is_empty(),
        "not even the first answer"
    );
    let served = Snapshot::new().with_type(unserved, TypeSnapshot::new([]));
    let out = st.poll(&served);
    assert_eq!(out[0].removed_resources, ["x"], "answered once served");
}

#[test]
fn only_changed_resources_and_removed_names_are_sent() {
    let mut st = DeltaStream::default();
    st.handle_request(subscribe(A, &["*"]));
    let out = st.poll(&snapshot(&[
        (A, "a1", b"1"),
        (A, "a2", b"2"),
        (A, "a3", b"3"),
    ]));
    assert_eq!(names(&out[0]), ["a1", "a2", "a3"]);
    st.handle_request(ack(&out[0]));
    let out = st.poll(&snapshot(&[
        (A, "a1", b"1"),
        (A, "a2", b"changed"),
        (A, "a4", b"4"),
    ]));
    assert_eq!(names(&out[0]), ["a2", "a4"]);
    assert_eq!(out[0].removed_resources, ["a3"]);
    assert!(
        st.poll(&snapshot(&[
            (A, "a1", b"1"),
            (A, "a2", b"changed"),
            (A, "a4", b"4")
        ]))
        .is_empty()
    );
    // A name gone with nothing added or changed.
    let out = st.poll(&snapshot(&[(A, "a2", b"changed"), (A, "a4", b"4")]));
    assert!(out[0].resources.is_empty());
    assert_eq!(out[0].removed_resources, ["a1"]);
}

#[test]
fn resource_versions_are_content_hashes_and_explicit_type_versions_push_nothing() {
    let at = |v: &str| {
        let mut b = SnapshotBuilder::new();
        b.add_any(A, "a1", any(b"1")).version(A, v);
        b.build()
    };
    let mut st = DeltaStream::default();
    st.handle_request(subscribe(A, &["*"]));
    let out = st.poll(&at("v1"));
    assert_eq!(out[0].system_version_info, "v1");
    assert_eq!(
        out[0].resources[0].version,
        at("v1")
            .get(A, "a1")
            .map(|r| r.version.clone())
            .unwrap_or_default()
    );
    assert!(st.poll(&at("v2")).is_empty(), "no resource changed");
}

#[test]
fn ack_and_nack_alone_send_nothing() {
    let s = snapshot(&[(A, "a1", b"1")]);
    let mut st = DeltaStream::default();
    st.handle_request(subscribe(A, &["*"]));
    let out = st.poll(&s);
    st.handle_request(ack(&out[0]));
    assert!(st.poll(&s).is_empty());
    let mut nack = ack(&out[0]);
    nack.error_detail = Some(RpcStatus {
        message: "bad".into(),
        ..Default::default()
    });
    st.handle_request(nack);
    assert!(st.poll(&s).is_empty());
}

#[test]
fn named_subscriptions_grow_and_shrink() {
    let s = snapshot(&[(B, "b1", b"1"), (B, "b2", b"2")]);
    let mut st = DeltaStream::default();
    st.handle_request(subscribe(B, &["b1"]));
    assert_eq!(names(&st.poll(&s)[0]), ["b1"]);
    // Adding a name sends just that one.
    st.handle_request(subscribe(B, &["b2"]));
    assert_eq!(names(&st.poll(&s)[0]), ["b2"]);
    // Unsubscribing sends nothing, and later changes of it are not sent, nor its removal.
    st.handle_request(unsubscribe(B, &["b1"]));
    assert!(st.poll(&s).is_empty());
    assert!(
        st.poll(&snapshot(&[(B, "b1", b"changed"), (B, "b2", b"2")]))
            .is_empty()
    );
    assert!(st.poll(&snapshot(&[(B, "b2", b"2")])).is_empty());
    // Subscribing again sends it again (the client dropped it).
    st.handle_request(subscribe(B, &["b1"]));
    let out = st.poll(&snapshot(&[(B, "b1", b"changed"), (B, "b2", b"2")]));
    assert_eq!(names(&out[0]), ["b1"]);
}

#[test]
fn missing_names_are_reported_once_per_subscription() {
    let s = snapshot(&[(B, "b1", b"1")]);
    let mut st = DeltaStream::default();
    st.handle_request(subscribe(B, &["b1", "nope"]));
    let out = st.poll(&s);
    assert_eq!(names(&out[0]), ["b1"]);
    assert_eq!(out[0].removed_resources, ["nope"]);
    assert!(st.poll(&s).is_empty());
    assert!(
        st.poll(&snapshot(&[(B, "b1", b"changed")]))[0]
            .removed_resources
            .is_empty()
    );
    // Asked again: answered again.
    st.handle_request(subscribe(B, &["nope"]));
    assert_eq!(st.poll(&s)[0].removed_resources, ["nope"]);
    // It appears, then goes: sent, then removed.
    let with = snapshot(&[(B, "b1", b"1"), (B, "nope", b"now")]);
    assert_eq!(names(&st.poll(&with)[0]), ["nope"]);
    assert_eq!(st.poll(&s)[0].removed_resources, ["nope"]);
    assert!(st.poll(&s).is_empty());
}

#[test]
fn initial_resource_versions_resume_a_stream() {
    let s = snapshot(&[(A, "a1", b"1"), (A, "a2", b"2")]);
    let v = |name: &str| {
        s.get(A, name)
            .map(|r| r.version.clone())
            .unwrap_or_default()
    };
    let mut st = DeltaStream::default();
    let mut first = subscribe(A, &["*"]);
    first.initial_resource_versions = [
        ("a1".to_owned(), v("a1")),
        ("a2".to_owned(), "stale".to_owned()),
        ("gone".to_owned(), "x".to_owned()),
    ]
    .into_iter()
    .collect();
    st.handle_request(first);
    let out = st.poll(&s);
    assert_eq!(names(&out[0]), ["a2"], "a1 is up to date, a2 is not");
    assert_eq!(out[0].removed_resources, ["gone"]);

    // Up to date with everything: still one (empty) answer, so the client does not wait.
    let mut st = DeltaStream::default();
    let mut first = subscribe(A, &["*"]);
    first.initial_resource_versions = [("a1".to_owned(), v("a1")), ("a2".to_owned(), v("a2"))]
        .into_iter()
        .collect();
    st.handle_request(first);
    let out = st.poll(&s);
    assert_eq!(out.len(), 1);
    assert!(out[0].resources.is_empty() && out[0].removed_resources.is_empty());
}

#[test]
fn initial_resource_versions_only_count_on_the_first_request() {
    let s = snapshot(&[(A, "a1", b"1")]);
    let mut st = DeltaStream::default();
    st.handle_request(subscribe(A, &["*"]));
    let out = st.poll(&s);
    st.handle_request(ack(&out[0]));
    let mut late = ack(&out[0]);
    late.initial_resource_versions = [("a1".to_owned(), "other".to_owned())]
        .into_iter()
        .collect();
    st.handle_request(late);
    assert!(st.poll(&s).is_empty());
}

#[test]
fn wildcard_rules() {
    let s = snapshot(&[(A, "a1", b"1"), (A, "a2", b"2")]);
    // Legacy: a first request that subscribes to nothing is the wildcard.
    let mut st = DeltaStream::default();
    st.handle_request(subscribe(A, &[]));
    assert_eq!(names(&st.poll(&s)[0]), ["a1", "a2"]);
    // Naming something ends it: changes of other names are no longer sent.
    st.handle_request(subscribe(A, &["a1"]));
    assert!(st.poll(&s).is_empty());
    assert!(
        st.poll(&snapshot(&[(A, "a1", b"1"), (A, "a2", b"changed")]))
            .is_empty()
    );

    // Explicit `*` next to names, then unsubscribing from `*` keeps the names.
    let mut st = DeltaStream::default();
    st.handle_request(subscribe(A, &["*", "a1"]));
    assert_eq!(names(&st.poll(&s)[0]), ["a1", "a2"]);
    st.handle_request(unsubscribe(A, &["*"]));
    assert!(st.poll(&s).is_empty());
    let out = st.poll(&snapshot(&[(A, "a1", b"changed"), (A, "a2", b"changed")]));
    assert_eq!(names(&out[0]), ["a1"]);
}

#[test]
fn refused_requests_leave_the_state_alone() {
    let mut st = DeltaStream::new(&ServerConfig::default().max_types_per_stream(1));
    assert_eq!(
        st.try_handle_request(subscribe("", &["*"])),
        Err(RequestError::MissingTypeUrl)
    );
    assert_eq!(
        tonic::Status::from(RequestError::MissingTypeUrl).code(),
        tonic::Code::InvalidArgument
    );
    st.handle_request(subscribe(A, &["*"]));
    assert!(matches!(
        st.try_handle_request(subscribe(B, &["*"])),
        Err(RequestError::TooManyTypes { limit: 1, .. })
    ));
    let out = st.poll(&snapshot(&[(A, "a1", b"1"), (B, "b1", b"1")]));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].type_url, A);
}
