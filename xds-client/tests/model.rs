//! Random sequences of subscriptions, stream changes, responses and time against the core,
//! checking invariants that every rule relies on.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryResponse, DiscoveryResponse, Resource as Wrapped,
};
use envoy_types::pb::google::protobuf::{Any, Duration as PbDuration};
use meshkit_xds_client::protocol::{
    Event, Mode, RemovalReason, Request, Response, Session, SessionConfig,
};
use meshkit_xds_client::{CLUSTER_TYPE_URL, ResourceType};
use proptest::prelude::*;
use prost::Message;

const NAMES: [&str; 4] = ["a", "b", "c", "d"];

#[derive(Debug, Clone)]
enum Op {
    Subscribe(Option<usize>),
    Unsubscribe(Option<usize>),
    Connect,
    Disconnect,
    /// (name index, valid) pairs, removed name indices (Delta).
    Respond(Vec<(usize, bool)>, Vec<usize>),
    Advance(u64),
    Flush,
}

fn op() -> impl Strategy<Value = Op> {
    let name = proptest::option::of(0..NAMES.len());
    prop_oneof![
        name.clone().prop_map(Op::Subscribe),
        name.prop_map(Op::Unsubscribe),
        Just(Op::Connect),
        Just(Op::Disconnect),
        (
            proptest::collection::vec((0..NAMES.len(), any::<bool>()), 0..5),
            proptest::collection::vec(0..NAMES.len(), 0..2)
        )
            .prop_map(|(r, d)| Op::Respond(r, d)),
        (0u64..20).prop_map(Op::Advance),
        Just(Op::Flush),
    ]
}

fn any_cluster(name: &str, valid: bool) -> Any {
    Any {
        type_url: CLUSTER_TYPE_URL.into(),
        value: Cluster {
            name: name.into(),
            connect_timeout: Some(PbDuration {
                seconds: i64::from(valid),
                nanos: 0,
            }),
            ..Default::default()
        }
        .encode_to_vec(),
    }
}

fn run(mode: Mode, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let kind = ResourceType::of::<Cluster>();
    let mut s = Session::new(SessionConfig::new(mode));
    let mut now = Instant::now();
    let mut connected = false;
    let mut nonce = 0u32;
    let mut pending_nonces: Vec<String> = Vec::new();
    let mut named: BTreeSet<&str> = BTreeSet::new();
    let mut wildcard = false;
    for op in ops {
        match op {
            Op::Subscribe(Some(i)) => {
                s.subscribe(kind, NAMES[i]);
                named.insert(NAMES[i]);
            }
            Op::Subscribe(None) => {
                s.subscribe_wildcard(kind);
                wildcard = true;
            }
            Op::Unsubscribe(Some(i)) => {
                s.unsubscribe(CLUSTER_TYPE_URL, NAMES[i]);
                named.remove(NAMES[i]);
            }
            Op::Unsubscribe(None) => {
                s.unsubscribe_wildcard(CLUSTER_TYPE_URL);
                wildcard = false;
            }
            Op::Connect => {
                if !connected {
                    s.on_connected(now);
                    connected = true;
                    pending_nonces.clear();
                }
            }
            Op::Disconnect => {
                s.on_disconnected();
                connected = false;
                pending_nonces.clear();
                prop_assert_eq!(s.poll_timeout(), None, "no timer runs during backoff");
            }
            Op::Respond(resources, removed) => {
                if !connected {
                    continue;
                }
                nonce += 1;
                let n = format!("n{nonce}");
                let resp = match mode {
                    Mode::StateOfTheWorld => Response::Sotw(DiscoveryResponse {
                        version_info: format!("v{nonce}"),
                        resources: resources
                            .iter()
                            .map(|(i, ok)| any_cluster(NAMES[*i], *ok))
                            .collect(),
                        type_url: CLUSTER_TYPE_URL.into(),
                        nonce: n.clone(),
                        ..Default::default()
                    }),
                    Mode::Delta => Response::Delta(DeltaDiscoveryResponse {
                        resources: resources
                            .iter()
                            .map(|(i, ok)| Wrapped {
                                name: NAMES[*i].into(),
                                version: format!("{nonce}"),
                                resource: Some(any_cluster(NAMES[*i], *ok)),
                                ..Default::default()
                            })
                            .collect(),
                        removed_resources: removed.iter().map(|i| NAMES[*i].to_string()).collect(),
                        type_url: CLUSTER_TYPE_URL.into(),
                        nonce: n.clone(),
                        ..Default::default()
                    }),
                };
                s.handle_response(now, resp);
                pending_nonces.push(n);
            }
            Op::Advance(secs) => {
                now += Duration::from_secs(secs);
                s.handle_timeout(now);
            }
            Op::Flush => {}
        }
        // Drain: every response gets its ACK/NACK, in order; nothing is sent while down.
        let mut acked = Vec::new();
        while let Some(req) = s.poll_request(now) {
            prop_assert!(connected);
            let n = match req {
                Request::Sotw(r) => r.response_nonce,
                Request::Delta(r) => r.response_nonce,
            };
            if !n.is_empty() && acked.last() != Some(&n) {
                acked.push(n);
            }
        }
        if mode == Mode::Delta {
            prop_assert_eq!(&acked, &pending_nonces);
        } else {
            for n in &pending_nonces {
                prop_assert!(acked.contains(n), "{} not acked: {:?}", n, acked);
            }
        }
        pending_nonces.clear();
        while let Some(ev) = s.poll_event() {
            if let Event::Removed {
                reason: RemovalReason::DoesNotExist,
                name,
                ..
            } = &ev
            {
                prop_assert!(
                    connected || mode == Mode::StateOfTheWorld,
                    "DNE while down: {name}"
                );
            }
        }
        // Once changes are sent, the cache holds only what is subscribed.
        if connected {
            for name in NAMES {
                if s.resource(CLUSTER_TYPE_URL, name).is_some() {
                    prop_assert!(
                        wildcard || named.contains(name),
                        "{} cached unsubscribed",
                        name
                    );
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn sotw_invariants(ops in proptest::collection::vec(op(), 0..40)) {
        run(Mode::StateOfTheWorld, ops)?;
    }

    #[test]
    fn delta_invariants(ops in proptest::collection::vec(op(), 0..40)) {
        run(Mode::Delta, ops)?;
    }
}
