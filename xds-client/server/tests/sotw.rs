//! The State-of-the-World stream state, without I/O: what is answered, and when.

use meshkit_xds_server::envoy::{Any, DiscoveryRequest, DiscoveryResponse};
use meshkit_xds_server::envoy_types::pb::google::rpc::Status as RpcStatus;
use meshkit_xds_server::{
    RequestError, ServerConfig, Snapshot, SnapshotBuilder, SnapshotCache, SotwStream, TypeSnapshot,
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

fn req(url: &str, names: &[&str]) -> DiscoveryRequest {
    DiscoveryRequest {
        type_url: url.into(),
        resource_names: names.iter().map(|n| n.to_string()).collect(),
        ..Default::default()
    }
}

/// The ACK of `resp`, subscribed to `names`.
fn ack(resp: &DiscoveryResponse, names: &[&str]) -> DiscoveryRequest {
    DiscoveryRequest {
        version_info: resp.version_info.clone(),
        response_nonce: resp.nonce.clone(),
        ..req(&resp.type_url, names)
    }
}

fn values(resp: &DiscoveryResponse) -> Vec<String> {
    resp.resources
        .iter()
        .map(|r| String::from_utf8_lossy(&r.value).into_owned())
        .collect()
}

#[test]
fn first_request_is_answered_with_the_subscribed_resources() {
    let s = snapshot(&[(A, "a1", b"1"), (A, "a2", b"2")]);
    let mut st = SotwStream::default();
    st.handle_request(req(A, &["a2"]));
    let out = st.poll(&s);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].type_url, A);
    assert_eq!(out[0].version_info, s.version(A).unwrap_or_default());
    assert_eq!(values(&out[0]), ["2"]);
    assert!(!out[0].nonce.is_empty());
}

#[test]
fn ack_and_nack_alone_send_nothing() {
    let s = snapshot(&[(A, "a1", b"1")]);
    let mut st = SotwStream::default();
    st.handle_request(req(A, &[]));
    let out = st.poll(&s);
    st.handle_request(ack(&out[0], &[]));
    assert!(st.poll(&s).is_empty(), "ACK");
    let mut nack = ack(&out[0], &[]);
    nack.error_detail = Some(RpcStatus {
        message: "bad".into(),
        ..Default::default()
    });
    st.handle_request(nack);
    assert!(
        st.poll(&s).is_empty(),
        "NACK: the rejected version is not re-sent"
    );
}

#[test]
fn a_change_is_pushed_with_every_subscribed_resource_and_a_new_nonce() {
    let mut st = SotwStream::default();
    st.handle_request(req(A, &[]));
    let first = st.poll(&snapshot(&[(A, "a1", b"1"), (A, "a2", b"2")]));
    let out = st.poll(&snapshot(&[(A, "a1", b"1"), (A, "a2", b"changed")]));
    assert_eq!(values(&out[0]), ["1", "changed"]);
    assert_ne!(out[0].nonce, first[0].nonce);
    assert_ne!(out[0].version_info, first[0].version_info);
}

#[test]
fn an_equal_snapshot_built_again_pushes_nothing() {
    let mut st = SotwStream::default();
    st.handle_request(req(A, &[]));
    assert_eq!(st.poll(&snapshot(&[(A, "a1", b"1")])).len(), 1);
    assert!(st.poll(&snapshot(&[(A, "a1", b"1")])).is_empty());

    // And the cache does not even wake the streams.
    let cache = SnapshotCache::new(snapshot(&[(A, "a1", b"1")]));
    let rx = cache.subscribe();
    cache.set(snapshot(&[(A, "a1", b"1")]));
    assert!(!rx.has_changed().unwrap_or(true));
}

#[test]
fn an_explicit_version_change_is_pushed_to_wildcard_subscribers() {
    let at = |v: &str| {
        let mut b = SnapshotBuilder::new();
        b.add_any(A, "a1", any(b"1")).version(A, v);
        b.build()
    };
    let mut st = SotwStream::default();
    st.handle_request(req(A, &[]));
    assert_eq!(st.poll(&at("v1"))[0].version_info, "v1");
    let out = st.poll(&at("v2"));
    assert_eq!(out.len(), 1, "same resources, new version");
    assert_eq!(out[0].version_info, "v2");
    assert!(st.poll(&at("v2")).is_empty());
}

#[test]
fn named_subscribers_are_not_pushed_changes_of_other_names() {
    let mut st = SotwStream::default();
    st.handle_request(req(B, &["b1"]));
    assert_eq!(
        st.poll(&snapshot(&[(B, "b1", b"1"), (B, "b2", b"2")]))
            .len(),
        1
    );
    assert!(
        st.poll(&snapshot(&[(B, "b1", b"1"), (B, "b2", b"changed")]))
            .is_empty()
    );
    // The wildcard subscriber of the same type is.
    let mut all = SotwStream::default();
    all.handle_request(req(B, &["*"]));
    assert_eq!(
        all.poll(&snapshot(&[(B, "b1", b"1"), (B, "b2", b"2")]))
            .len(),
        1
    );
    let out = all.poll(&snapshot(&[(B, "b1", b"1"), (B, "b2", b"changed")]));
    assert_eq!(values(&out[0]), ["1", "changed"]);
}

#[test]
fn a_subscription_change_is_answered_even_when_the_resources_are_the_same() {
    let s = snapshot(&[(B, "b1", b"1")]);
    let mut st = SotwStream::default();
    st.handle_request(req(B, &["b1"]));
    let out = st.poll(&s);
    // A new name that does not exist: answered, so the client learns it is absent.
    st.handle_request(ack(&out[0], &["b1", "missing"]));
    let out = st.poll(&s);
    assert_eq!(values(&out[0]), ["1"]);
    // Re-sending the same subscription is not a change.
    st.handle_request(ack(&out[0], &["missing", "b1"]));
    assert!(st.poll(&s).is_empty());
}

#[test]
fn legacy_wildcard_and_explicit_star() {
    let s = snapshot(&[(A, "a1", b"1"), (A, "a2", b"2")]);
    // Empty names on every request so far: wildcard.
    let mut st = SotwStream::default();
    st.handle_request(req(A, &[]));
    assert_eq!(values(&st.poll(&s)[0]), ["1", "2"]);
    // Naming something ends the legacy wildcard.
    st.handle_request(req(A, &["a1"]));
    assert_eq!(values(&st.poll(&s)[0]), ["1"]);
    // After that, an empty list means nothing at all: no response.
    st.handle_request(req(A, &[]));
    assert!(st.poll(&s).is_empty());
    assert!(st.poll(&snapshot(&[(A, "a1", b"changed")])).is_empty());
    // `*` next to names is the wildcard.
    st.handle_request(req(A, &["*", "a1"]));
    assert_eq!(values(&st.poll(&s)[0]), ["1", "2"]);
}

#[test]
fn a_type_not_in_the_snapshot_gets_no_answer_until_it_is_served() {
    let mut st = SotwStream::default();
    st.handle_request(req("type.googleapis.com/test.Unserved", &["x"]));
    assert!(st.poll(&snapshot(&[])).is_empty());
    assert!(st.poll(&snapshot(&[])).is_empty());
    let served = Snapshot::new().with_type(
        "type.googleapis.com/test.Unserved",
        TypeSnapshot::new([("x".to_owned(), any(b"x"))]),
    );
    assert_eq!(st.poll(&served).len(), 1);
}

#[test]
fn several_types_on_one_stream_are_independent() {
    let s = snapshot(&[(A, "a1", b"1"), (B, "b1", b"1")]);
    let mut st = SotwStream::default();
    st.handle_request(req(A, &[]));
    st.handle_request(req(B, &[]));
    let out = st.poll(&s);
    assert_eq!(out.len(), 2);
    assert_ne!(
        out[0].nonce, out[1].nonce,
        "nonces are unique on the stream"
    );
    let out = st.poll(&snapshot(&[(A, "a1", b"1"), (B, "b1", b"2")]));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].type_url, B);
}

#[test]
fn refused_requests_leave_the_state_alone() {
    let mut st = SotwStream::new(&ServerConfig::default().max_types_per_stream(1));
    assert_eq!(
        st.try_handle_request(req("", &[])),
        Err(RequestError::MissingTypeUrl)
    );
    assert_eq!(st.try_handle_request(req(A, &[])), Ok(()));
    let err = st.try_handle_request(req(B, &[])).unwrap_err();
    assert_eq!(
        err,
        RequestError::TooManyTypes {
            type_url: B.into(),
            limit: 1
        }
    );
    assert_eq!(
        err.to_string(),
        format!("type {B} refused: at most 1 types per stream")
    );
    assert_eq!(
        tonic::Status::from(err).code(),
        tonic::Code::ResourceExhausted
    );
    let out = st.poll(&snapshot(&[(A, "a1", b"1"), (B, "b1", b"1")]));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].type_url, A);
}
