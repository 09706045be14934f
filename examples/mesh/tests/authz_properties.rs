//! `PolicySet::evaluate` against the literal reference (`authz::reference`) on generated
//! policy sets and connections, and the protobuf form of policies: a valid policy survives the
//! round trip, and no byte string panics the decoder.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use meshkit_identity::SpiffeId;
use meshkit_mesh::Cidr;
use meshkit_mesh::authz::reference::{self, Outcome};
use meshkit_mesh::authz::{
    Action, Clause, Connection, Decision, Match, Policy, PolicySet, Rule, Scope, ServiceAccount,
    StringMatch, Target,
};
use meshkit_mesh::proto::security::Authorization;
use meshkit_mesh::resources::AuthorizationResource;
use meshkit_xds_client::Resource;
use proptest::prelude::*;
use prost::Message;

// A small world, so that generated policies and connections meet often.
const NAMESPACES: [&str; 3] = ["shop", "edge", ""];
const ACCOUNTS: [&str; 2] = ["web", "gateway"];
const PORTS: [u16; 3] = [80, 8080, 9090];

fn namespace() -> impl Strategy<Value = String> {
    prop::sample::select(&NAMESPACES[..]).prop_map(str::to_owned)
}

fn string_match() -> impl Strategy<Value = StringMatch> {
    prop_oneof![
        prop::sample::select(vec!["shop", "edge", "", "cluster.local/ns/shop/sa/web"])
            .prop_map(|s| StringMatch::Exact(s.to_owned())),
        prop::sample::select(vec!["sh", "cluster.local/ns/", "e"])
            .prop_map(|s| StringMatch::Prefix(s.to_owned())),
        prop::sample::select(vec!["op", "/sa/gateway", "web"])
            .prop_map(|s| StringMatch::Suffix(s.to_owned())),
        Just(StringMatch::Presence),
    ]
}

fn account() -> impl Strategy<Value = ServiceAccount> {
    (namespace(), prop::sample::select(&ACCOUNTS[..])).prop_map(|(namespace, name)| {
        ServiceAccount {
            namespace,
            name: name.to_owned(),
        }
    })
}

/// Host `host` of 10.0.0.0/24 (`family` 0), of fd00::/64 (1), or 10.0.0.`host` as an
/// IPv4-mapped IPv6 address (2), which counts as its IPv4 address.
fn address(family: u8, host: u8) -> IpAddr {
    match family {
        0 => IpAddr::V4(Ipv4Addr::new(10, 0, 0, host)),
        1 => IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, u16::from(host))),
        _ => IpAddr::V6(Ipv4Addr::new(10, 0, 0, host).to_ipv6_mapped()),
    }
}

fn cidr() -> impl Strategy<Value = Cidr> {
    (0u8..2, 0u8..4, 0usize..4).prop_map(|(family, host, p)| {
        let prefix = if family == 0 {
            [0, 8, 24, 32][p]
        } else {
            [0, 64, 120, 128][p]
        };
        Cidr::new(address(family, host), prefix).unwrap()
    })
}

fn list<T: std::fmt::Debug>(s: impl Strategy<Value = T>) -> impl Strategy<Value = Vec<T>> {
    prop::collection::vec(s, 0..2)
}

fn a_match() -> impl Strategy<Value = Match> {
    (
        (list(string_match()), list(string_match())),
        (list(account()), list(account())),
        (list(string_match()), list(string_match())),
        (list(cidr()), list(cidr())),
        (list(cidr()), list(cidr())),
        (
            list(prop::sample::select(&PORTS[..])),
            list(prop::sample::select(&PORTS[..])),
        ),
    )
        .prop_map(|(ns, sa, pr, src, dst, ports)| Match {
            namespaces: ns.0,
            not_namespaces: ns.1,
            service_accounts: sa.0,
            not_service_accounts: sa.1,
            principals: pr.0,
            not_principals: pr.1,
            source_ips: src.0,
            not_source_ips: src.1,
            destination_ips: dst.0,
            not_destination_ips: dst.1,
            destination_ports: ports.0,
            not_destination_ports: ports.1,
        })
}

fn rule() -> impl Strategy<Value = Rule> {
    prop::collection::vec(
        prop::collection::vec(a_match(), 0..3).prop_map(|matches| Clause { matches }),
        0..3,
    )
    .prop_map(|clauses| Rule { clauses })
}

fn policy(index: usize) -> impl Strategy<Value = Policy> {
    (
        namespace(),
        prop::sample::select(vec![
            Scope::Global,
            Scope::Namespace,
            Scope::WorkloadSelector,
        ]),
        prop::sample::select(vec![Action::Allow, Action::Deny]),
        prop::collection::vec(rule(), 0..3),
        prop::bool::weighted(0.2),
    )
        .prop_map(move |(namespace, scope, action, rules, dry_run)| Policy {
            name: format!("p{index}"),
            namespace,
            scope,
            action,
            rules,
            dry_run,
        })
}

fn policies() -> impl Strategy<Value = Vec<Policy>> {
    (0usize..6).prop_flat_map(|n| (0..n).map(policy).collect::<Vec<_>>())
}

/// A connection's facts: source host, destination host and port, and the identity (none, an
/// Istio one, or one whose path names no namespace).
fn facts() -> impl Strategy<Value = (u8, u8, u16, Option<String>)> {
    (
        0u8..4,
        0u8..4,
        prop::sample::select(&PORTS[..]),
        prop_oneof![
            Just(None),
            (namespace(), prop::sample::select(&ACCOUNTS[..])).prop_map(|(ns, sa)| {
                let ns = if ns.is_empty() { "x".to_owned() } else { ns };
                Some(format!("spiffe://cluster.local/ns/{ns}/sa/{sa}"))
            }),
            Just(Some("spiffe://cluster.local/job/nightly".to_owned())),
        ],
    )
}

fn outcome(decision: &Decision<'_>) -> Outcome {
    match decision {
        Decision::AllowedByDefault => Outcome::AllowedByDefault,
        Decision::Allowed(_) => Outcome::Allowed,
        Decision::Denied(_) => Outcome::Denied,
        Decision::NotAllowed => Outcome::NotAllowed,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn the_evaluator_decides_as_the_reference(
        policies in policies(),
        target_namespace in namespace(),
        named in prop::collection::vec(0usize..6, 0..3),
        (src, dst, port, id) in facts(),
        (src_family, dst_family) in (0u8..3, 0u8..3),
    ) {
        let set: PolicySet = policies.iter().cloned().collect();
        let named: Vec<String> = named.iter().map(|i| {
            policies.get(*i).map_or_else(|| format!("absent/p{i}"), Policy::key)
        }).collect();
        let target = Target { namespace: &target_namespace, policies: &named };
        let id = id.map(|s| SpiffeId::new(&s).unwrap());
        let conn = Connection {
            source: SocketAddr::new(address(src_family, src), 40000),
            destination: SocketAddr::new(address(dst_family, dst), port),
            identity: id.as_ref(),
        };
        for p in &policies {
            prop_assert_eq!(p.matches(&conn), reference::policy_matches(p, &conn), "{}", p);
        }
        let evaluation = set.evaluate(target, &conn);
        prop_assert_eq!(
            outcome(&evaluation.decision),
            reference::decide(&policies, target, &conn, false)
        );
        // The deciding policy applies, is enforced, has the decision's action and matches.
        if let Some(p) = evaluation.decision.policy() {
            prop_assert!(reference::applies(p, target) && !p.dry_run);
            prop_assert!(reference::policy_matches(p, &conn));
            let action = if evaluation.decision.is_allowed() { Action::Allow } else { Action::Deny };
            prop_assert_eq!(p.action, action);
        }
        let any_dry_run = policies.iter().any(|p| p.dry_run && reference::applies(p, target));
        prop_assert_eq!(evaluation.dry_run.is_some(), any_dry_run);
        if let Some(dry_run) = evaluation.dry_run {
            prop_assert_eq!(outcome(&dry_run), reference::decide(&policies, target, &conn, true));
        }
    }

    #[test]
    fn removals_and_replacements_leave_the_set_deciding_as_the_reference(
        first in policies(),
        second in policies(),
        removed in prop::collection::vec((namespace(), 0usize..6), 0..4),
        target_namespace in namespace(),
        (src, dst, port, id) in facts(),
    ) {
        // Inserting a policy replaces the one with its key; what the set then holds is
        // what a map by key holds.
        let mut set: PolicySet = first.iter().cloned().collect();
        let mut held: std::collections::BTreeMap<String, Policy> =
            first.into_iter().map(|p| (p.key(), p)).collect();
        for p in second {
            set.insert(p.clone());
            held.insert(p.key(), p);
        }
        for (ns, i) in removed {
            let key = format!("{ns}/p{i}");
            prop_assert_eq!(set.remove(&key).is_some(), held.remove(&key).is_some());
        }
        prop_assert_eq!(set.len(), held.len());
        let policies: Vec<Policy> = held.into_values().collect();
        let target = Target { namespace: &target_namespace, policies: &[] };
        let id = id.map(|s| SpiffeId::new(&s).unwrap());
        let conn = Connection {
            source: SocketAddr::new(address(0, src), 40000),
            destination: SocketAddr::new(address(0, dst), port),
            identity: id.as_ref(),
        };
        let evaluation = set.evaluate(target, &conn);
        prop_assert_eq!(
            outcome(&evaluation.decision),
            reference::decide(&policies, target, &conn, false)
        );
        if let Some(dry_run) = evaluation.dry_run {
            prop_assert_eq!(outcome(&dry_run), reference::decide(&policies, target, &conn, true));
        }
    }

    #[test]
    fn a_policy_survives_the_protobuf_round_trip(p in policy(0)) {
        let wire = Authorization::from(&p).encode_to_vec();
        let back = AuthorizationResource::decode(&wire).unwrap();
        prop_assert_eq!(&*back.policy, &p);
        prop_assert_eq!(back.name, p.key());
    }

    #[test]
    fn no_byte_string_panics_the_decoder(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let _ = AuthorizationResource::decode(&bytes);
    }
}

#[test]
fn invalid_policies_are_refused_with_the_rule_that_is_wrong() {
    use meshkit_mesh::proto::security::{self as pb, string_match::MatchType};
    let with_match = |m: pb::Match| pb::Authorization {
        name: "p".into(),
        namespace: "shop".into(),
        rules: vec![pb::Rule {
            clauses: vec![pb::Clause { matches: vec![m] }],
        }],
        ..Default::default()
    };
    // Decoded (its name is known), then refused by validation, naming the rule.
    let refused = |a: pb::Authorization| {
        let resource = AuthorizationResource::decode(&a.encode_to_vec()).expect("decoded");
        assert_eq!(resource.name, format!("{}/p", a.namespace));
        resource.validate().unwrap_err().to_string()
    };
    let bad_address = with_match(pb::Match {
        source_ips: vec![pb::Address {
            address: vec![10, 0, 0],
            length: 8,
        }],
        ..Default::default()
    });
    assert!(refused(bad_address).contains("rule 0: address of 3 bytes"));
    let long_prefix = with_match(pb::Match {
        destination_ips: vec![pb::Address {
            address: vec![10, 0, 0, 1],
            length: 33,
        }],
        ..Default::default()
    });
    assert!(refused(long_prefix).contains("prefix length 33"));
    let port = with_match(pb::Match {
        destination_ports: vec![70000],
        ..Default::default()
    });
    assert!(refused(port).contains("port 70000 is above 65535"));
    let empty = with_match(pb::Match {
        principals: vec![pb::StringMatch { match_type: None }],
        ..Default::default()
    });
    assert!(refused(empty).contains("a string match has no pattern"));
    let scope = pb::Authorization {
        name: "p".into(),
        scope: 7,
        ..Default::default()
    };
    assert!(refused(scope).contains("scope 7"));
    // A valid one decodes.
    let ok = with_match(pb::Match {
        principals: vec![pb::StringMatch {
            match_type: Some(MatchType::Presence(())),
        }],
        ..Default::default()
    });
    assert!(AuthorizationResource::decode(&ok.encode_to_vec()).is_ok());
}
