//! Issue 12, item 14: what a server can make the client hold is bounded. Resources per type,
//! cached bytes and type URLs each have a limit with a documented default; a response beyond
//! one is NACKed with an error detail that names it, and never panics. A response for a type
//! nobody watches is not answered at all (issue 15), and what it leaves is bounded too.

use std::time::Instant;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource as Wrapped,
};
use envoy_types::pb::google::protobuf::Any;
use meshkit_xds_client::protocol::{Event, Mode, Request, Response, Session, SessionConfig};
use meshkit_xds_client::{CLUSTER_TYPE_URL, ResourceType};
use prost::Message;

const CDS: &str = CLUSTER_TYPE_URL;

fn cds() -> ResourceType {
    ResourceType::of::<Cluster>()
}

fn cluster_any(name: &str) -> Any {
    Any {
        type_url: CDS.into(),
        value: Cluster {
            name: name.into(),
            ..Default::default()
        }
        .encode_to_vec(),
    }
}

fn wildcard_session(config: SessionConfig) -> (Session, Instant) {
    let mut s = Session::new(config);
    s.subscribe_wildcard(cds());
    let now = Instant::now();
    s.on_connected(now);
    while s.poll_request(now).is_some() {}
    (s, now)
}

fn sotw(s: &mut Session, now: Instant, type_url: &str, version: &str, nonce: &str, r: Vec<Any>) {
    s.handle_response(
        now,
        Response::Sotw(DiscoveryResponse {
            version_info: version.into(),
            resources: r,
            type_url: type_url.into(),
            nonce: nonce.into(),
            ..Default::default()
        }),
    );
}

fn delta(s: &mut Session, now: Instant, nonce: &str, names: impl Iterator<Item = String>) {
    let resources = names
        .map(|n| Wrapped {
            name: n.clone(),
            version: "1".into(),
            resource: Some(cluster_any(&n)),
            ..Default::default()
        })
        .collect();
    s.handle_response(
        now,
        Response::Delta(DeltaDiscoveryResponse {
            resources,
            type_url: CDS.into(),
            nonce: nonce.into(),
            ..Default::default()
        }),
    );
}

/// The one answer to the last response: its nonce and its error detail, if a NACK.
fn answer(s: &mut Session, now: Instant) -> (String, Option<String>) {
    let mut reqs: Vec<Request> = std::iter::from_fn(|| s.poll_request(now)).collect();
    assert_eq!(reqs.len(), 1, "one answer per response: {reqs:?}");
    match reqs.pop() {
        Some(Request::Sotw(DiscoveryRequest {
            response_nonce,
            error_detail,
            ..
        })) => (response_nonce, error_detail.map(|e| e.message)),
        Some(Request::Delta(r)) => (r.response_nonce, r.error_detail.map(|e| e.message)),
        None => unreachable!(),
    }
}

fn drain_events(s: &mut Session) -> Vec<Event> {
    std::iter::from_fn(|| s.poll_event()).collect()
}

#[test]
fn default_limit_nacks_a_response_of_too_many_resources_of_one_type_whole() {
    let over = 100_001;
    // State of the World: nothing of it is applied, the last good version stays.
    let (mut s, now) = wildcard_session(SessionConfig::new(Mode::StateOfTheWorld));
    sotw(&mut s, now, CDS, "v1", "n1", vec![cluster_any("a")]);
    assert_eq!(answer(&mut s, now).1, None);
    let many = (0..over).map(|i| cluster_any(&format!("c{i}"))).collect();
    sotw(&mut s, now, CDS, "v2", "n2", many);
    let (nonce, error) = answer(&mut s, now);
    assert_eq!(nonce, "n2");
    let error = error.expect("NACKed");
    assert!(error.contains("100000"), "{error}");
    assert_eq!(
        s.cached_len(),
        1,
        "the earlier resource stays, none of the new ones"
    );
    assert!(s.resource(CDS, "a").is_some());
    assert_eq!(s.version(CDS), Some("v1"));

    // Delta: the same.
    let (mut s, now) = wildcard_session(SessionConfig::new(Mode::Delta));
    delta(&mut s, now, "n1", (0..over).map(|i| format!("c{i}")));
    let (nonce, error) = answer(&mut s, now);
    assert_eq!(nonce, "n1");
    assert!(error.expect("NACKed").contains("100000"));
    assert_eq!(s.cached_len(), 0);
}

#[test]
fn delta_growth_beyond_the_per_type_limit_rejects_only_the_new_names() {
    let (mut s, now) = wildcard_session(SessionConfig::new(Mode::Delta).max_resources_per_type(3));
    delta(&mut s, now, "n1", ["a", "b"].map(String::from).into_iter());
    assert_eq!(answer(&mut s, now).1, None);
    drain_events(&mut s);
    // An update of a held name is fine; of the two new names only one fits.
    delta(
        &mut s,
        now,
        "n2",
        ["b", "c", "d"].map(String::from).into_iter(),
    );
    let error = answer(&mut s, now).1.expect("NACKed");
    assert!(
        error.contains("d: ") && error.contains("limit of 3"),
        "{error}"
    );
    assert_eq!(s.cached_len(), 3);
    assert!(s.resource(CDS, "c").is_some());
    assert!(s.resource(CDS, "d").is_none());
    assert!(
        drain_events(&mut s)
            .iter()
            .any(|e| matches!(e, Event::Rejected { name: Some(n), .. } if n == "d"))
    );
    // Once a name is removed, there is room again.
    s.handle_response(
        now,
        Response::Delta(DeltaDiscoveryResponse {
            type_url: CDS.into(),
            nonce: "n3".into(),
            removed_resources: vec!["a".into()],
            ..Default::default()
        }),
    );
    assert_eq!(answer(&mut s, now).1, None);
    delta(&mut s, now, "n4", ["d".to_owned()].into_iter());
    assert_eq!(answer(&mut s, now).1, None);
    assert_eq!(s.cached_len(), 3);
}

#[test]
fn cached_bytes_are_bounded_and_a_long_sotw_version_counts_for_every_resource() {
    // Each resource costs its encoded size, its name and its version: a 1,000-byte version
    // on 20 tiny clusters is 20,000 bytes held, more than the 10,000 allowed.
    let config = SessionConfig::new(Mode::StateOfTheWorld).max_cached_bytes(10_000);
    let (mut s, now) = wildcard_session(config);
    let version = "v".repeat(1_000);
    let many = (0..20).map(|i| cluster_any(&format!("c{i}"))).collect();
    sotw(&mut s, now, CDS, &version, "n1", many);
    let error = answer(&mut s, now).1.expect("NACKed");
    assert!(error.contains("10000 cached bytes"), "{error}");
    assert!(s.cached_len() < 10, "{} held", s.cached_len());
    assert!(s.cached_bytes() <= 10_000);

    // One response larger than the whole budget is refused without decoding any of it.
    let config = SessionConfig::new(Mode::Delta).max_cached_bytes(1_000);
    let (mut s, now) = wildcard_session(config);
    delta(
        &mut s,
        now,
        "n1",
        (0..100).map(|i| format!("cluster-{i:04}")),
    );
    let error = answer(&mut s, now).1.expect("NACKed");
    assert!(error.contains("1000"), "{error}");
    assert_eq!(s.cached_len(), 0);
    assert_eq!(s.cached_bytes(), 0);
}

#[test]
fn cached_bytes_are_released_when_resources_go() {
    let (mut s, now) = wildcard_session(SessionConfig::new(Mode::StateOfTheWorld));
    sotw(
        &mut s,
        now,
        CDS,
        "v1",
        "n1",
        vec![cluster_any("a"), cluster_any("b")],
    );
    answer(&mut s, now);
    let two = s.cached_bytes();
    assert!(two > 0);
    // SotW: absence of a Cluster deletes it.
    sotw(&mut s, now, CDS, "v2", "n2", vec![cluster_any("a")]);
    answer(&mut s, now);
    assert!(s.cached_bytes() < two);
    // Dropping the wildcard drops the cache.
    s.unsubscribe_wildcard(CDS);
    while s.poll_request(now).is_some() {}
    assert_eq!(s.cached_bytes(), 0);
    assert_eq!(s.cached_len(), 0);
}

#[test]
fn unwatched_type_urls_are_dropped_and_at_most_32_keep_a_nonce() {
    let (mut s, now) = wildcard_session(SessionConfig::new(Mode::StateOfTheWorld));
    for i in 0..40 {
        let url = format!("type.googleapis.com/unknown.T{i}");
        sotw(
            &mut s,
            now,
            &url,
            "v1",
            &format!("n{i}"),
            vec![cluster_any("x")],
        );
        assert!(
            s.poll_request(now).is_none(),
            "a response for a type nobody watches is not answered"
        );
    }
    // Cluster is one of the 32; 31 unwatched ones keep their nonce, the other 9 nothing.
    assert!(format!("{s:?}").contains("types: 32"), "{s:?}");
    assert_eq!(s.cached_len(), 0);
    // The watched type still works.
    sotw(&mut s, now, CDS, "v1", "c1", vec![cluster_any("a")]);
    assert_eq!(answer(&mut s, now).1, None);
    assert!(s.resource(CDS, "a").is_some());
}

#[test]
fn a_huge_unwatched_type_url_or_nonce_is_not_kept() {
    for mode in [Mode::StateOfTheWorld, Mode::Delta] {
        let (mut s, now) = wildcard_session(SessionConfig::new(mode));
        let url = format!("type.googleapis.com/{}", "x".repeat(4096));
        let short = "type.googleapis.com/unknown.T".to_owned();
        for (url, nonce) in [(url, "n".to_owned()), (short, "n".repeat(1 << 20))] {
            let response = match mode {
                Mode::StateOfTheWorld => Response::Sotw(DiscoveryResponse {
                    type_url: url,
                    nonce,
                    ..Default::default()
                }),
                Mode::Delta => Response::Delta(DeltaDiscoveryResponse {
                    type_url: url,
                    nonce,
                    ..Default::default()
                }),
            };
            s.handle_response(now, response);
            assert!(s.poll_request(now).is_none(), "{mode:?}: not answered");
        }
        assert!(format!("{s:?}").contains("types: 1"), "{mode:?}: {s:?}");
    }
}

#[test]
fn a_nack_error_detail_is_bounded() {
    // 50,000 invalid resources, each named: the detail lists the first ones and counts the rest.
    let (mut s, now) = wildcard_session(SessionConfig::new(Mode::Delta));
    let resources = (0..50_000)
        .map(|i| Wrapped {
            name: format!("a-rather-long-cluster-name-{i:06}"),
            version: "1".into(),
            resource: Some(Any {
                type_url: CDS.into(),
                value: vec![0xff, 0xff],
            }),
            ..Default::default()
        })
        .collect();
    s.handle_response(
        now,
        Response::Delta(DeltaDiscoveryResponse {
            resources,
            type_url: CDS.into(),
            nonce: "n1".into(),
            ..Default::default()
        }),
    );
    let error = answer(&mut s, now).1.expect("NACKed");
    assert!(error.len() <= 17 * 1024, "{} bytes", error.len());
    assert!(
        error.contains("more rejected"),
        "{}",
        &error[error.len() - 80..]
    );
}

#[test]
fn a_sotw_response_replacing_every_name_fits_at_the_limit() {
    // The names a State-of-the-World response drops give their place to the ones it brings.
    let config = SessionConfig::new(Mode::StateOfTheWorld).max_resources_per_type(2);
    let (mut s, now) = wildcard_session(config);
    sotw(
        &mut s,
        now,
        CDS,
        "v1",
        "n1",
        vec![cluster_any("a"), cluster_any("b")],
    );
    assert_eq!(answer(&mut s, now).1, None);
    sotw(
        &mut s,
        now,
        CDS,
        "v2",
        "n2",
        vec![cluster_any("c"), cluster_any("d")],
    );
    assert_eq!(answer(&mut s, now).1, None);
    assert!(s.resource(CDS, "c").is_some() && s.resource(CDS, "d").is_some());
    assert_eq!(s.cached_len(), 2);
}
