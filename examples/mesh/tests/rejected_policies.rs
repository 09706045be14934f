//! A rejected authorization policy is never ignored by the node's feed: its last good
//! version stays enforced, and one that never had a good version is replaced by a DENY of
//! the scope it would cover, over a real ADS stream in both protocol modes.

use std::time::Duration;

use meshkit_identity::{SpiffeId, TrustDomain};
use meshkit_mesh::authz::Connection;
use meshkit_mesh::feed::mesh_over_xds;
use meshkit_mesh::proto::security::{
    Action, Authorization, Clause, Match, Rule, Scope, StringMatch, string_match,
};
use meshkit_mesh::proto::workload::{Address, Workload, address};
use meshkit_mesh::resources::{ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL};
use meshkit_mesh::{MeshConfig, StandIn};
use meshkit_xds_client::ClientConfig;
use meshkit_xds_client::protocol::Mode;
use meshkit_xds_server::envoy_types::pb::envoy::config::core::v3::Node;
use meshkit_xds_server::{AdsServer, SnapshotBuilder, SnapshotCache};
use tokio::sync::watch;

const PATIENCE: Duration = Duration::from_secs(10);
const CLIENT: &str = "spiffe://cluster.local/ns/shop/sa/client";

fn workload(uid: &str, namespace: &str, ip: [u8; 4], policies: &[&str]) -> Address {
    Address {
        r#type: Some(address::Type::Workload(Workload {
            uid: uid.to_owned(),
            name: uid.to_owned(),
            namespace: namespace.to_owned(),
            addresses: vec![ip.to_vec()],
            service_account: uid.to_owned(),
            node: "node-a".to_owned(),
            authorization_policies: policies.iter().map(|p| (*p).to_owned()).collect(),
            ..Workload::default()
        })),
    }
}

/// An ALLOW policy of `namespace/name` for the client's principal; `action` 99 makes it one
/// that does not convert.
fn policy(namespace: &str, name: &str, scope: Scope, action: i32) -> Authorization {
    Authorization {
        name: name.to_owned(),
        namespace: namespace.to_owned(),
        scope: scope as i32,
        action,
        rules: vec![Rule {
            clauses: vec![Clause {
                matches: vec![Match {
                    principals: vec![StringMatch {
                        match_type: Some(string_match::MatchType::Exact(
                            CLIENT.trim_start_matches("spiffe://").to_owned(),
                        )),
                    }],
                    ..Match::default()
                }],
            }],
        }],
        ..Authorization::default()
    }
}

const ALLOW: i32 = Action::Allow as i32;
const BROKEN: i32 = 99;

/// The three workloads (the cart naming `cart_policies`) and `policies`.
fn snapshot(policies: &[Authorization], cart_policies: &[&str]) -> meshkit_xds_server::Snapshot {
    let mut builder = SnapshotBuilder::new();
    builder.declare(AUTHORIZATION_TYPE_URL);
    for w in [
        workload("web", "shop", [10, 0, 0, 1], &["shop/web-policy"]),
        workload("cart", "shop", [10, 0, 0, 2], cart_policies),
        workload("post", "blog", [10, 0, 0, 3], &[]),
    ] {
        let name = meshkit_mesh::resources::AddressResource::name_of(&w).unwrap();
        builder.add(ADDRESS_TYPE_URL, &name, &w);
    }
    for p in policies {
        builder.add(
            AUTHORIZATION_TYPE_URL,
            &format!("{}/{}", p.namespace, p.name),
            p,
        );
    }
    builder.build()
}

/// The first mesh sent after `cache` changed that `done` accepts.
async fn until(
    rx: &mut watch::Receiver<MeshConfig>,
    done: impl Fn(&MeshConfig) -> bool,
) -> MeshConfig {
    let got = tokio::time::timeout(PATIENCE, rx.wait_for(|m| done(m)))
        .await
        .map(|mesh| mesh.expect("the feed runs").clone());
    got.unwrap_or_else(|_| {
        panic!(
            "the mesh did not come in time; the last one rejects {:?}",
            rx.borrow().rejected_policies
        )
    })
}

/// Whether `identity` may connect to the workload at `ip` by the mesh's policies.
fn allowed(mesh: &MeshConfig, ip: [u8; 4], identity: &str) -> bool {
    let td = TrustDomain::new("cluster.local").unwrap();
    let index = mesh.index(&td);
    let (target, _) = index.workload(ip.into()).expect("the workload");
    let id = SpiffeId::new(identity).unwrap();
    let conn = Connection {
        source: "10.9.9.9:40000".parse().unwrap(),
        destination: (std::net::IpAddr::from(ip), 8080).into(),
        identity: Some(&id),
    };
    index.authorize(target, &conn).decision.is_allowed()
}

fn stand_ins(mesh: &MeshConfig) -> Vec<(&str, StandIn)> {
    mesh.rejected_policies
        .iter()
        .map(|r| (r.key.as_str(), r.enforced))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_policy_keeps_its_last_good_version_or_denies_its_scope() {
    for mode in [Mode::Delta, Mode::StateOfTheWorld] {
        let web_policy = |action| policy("shop", "web-policy", Scope::WorkloadSelector, action);
        let blog_policy = |action| policy("blog", "blog-policy", Scope::Namespace, action);
        // The web workload's policy is good; the blog namespace's has never been.
        let cache = SnapshotCache::new(snapshot(&[web_policy(ALLOW), blog_policy(BROKEN)], &[]));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(AdsServer::new(cache.clone()).serve(listener, async {
            let _ = stopped.await;
        }));
        let node = Node {
            id: "node-a".to_owned(),
            ..Node::default()
        };
        let (mut rx, tasks) =
            mesh_over_xds(ClientConfig::new(format!("http://{addr}"), mode, node));

        let mesh = until(&mut rx, |m| !m.workloads.is_empty()).await;
        assert_eq!(
            stand_ins(&mesh),
            [("blog/blog-policy", StandIn::DenyAll)],
            "{mode:?}"
        );
        assert!(
            mesh.rejected_policies[0].error.contains("blog/blog-policy"),
            "{:?}",
            mesh.rejected_policies
        );
        // Its namespace is denied, even to the client its rules name; others are not.
        assert!(!allowed(&mesh, [10, 0, 0, 3], CLIENT), "{mode:?}");
        assert!(allowed(
            &mesh,
            [10, 0, 0, 2],
            "spiffe://cluster.local/ns/x/sa/y"
        ));
        assert!(allowed(&mesh, [10, 0, 0, 1], CLIENT));
        assert!(!allowed(
            &mesh,
            [10, 0, 0, 1],
            "spiffe://cluster.local/ns/x/sa/y"
        ));

        // The web policy turns bad: its last good version stays. The blog policy turns good.
        cache.set(snapshot(&[web_policy(BROKEN), blog_policy(ALLOW)], &[]));
        let mesh = until(&mut rx, |m| {
            m.rejected_policies
                .iter()
                .any(|r| r.key == "shop/web-policy")
        })
        .await;
        assert_eq!(
            stand_ins(&mesh),
            [("shop/web-policy", StandIn::LastGood)],
            "{mode:?}"
        );
        assert!(allowed(&mesh, [10, 0, 0, 1], CLIENT));
        assert!(!allowed(
            &mesh,
            [10, 0, 0, 1],
            "spiffe://cluster.local/ns/x/sa/y"
        ));
        assert!(allowed(&mesh, [10, 0, 0, 3], CLIENT));

        // A policy that never had a good version, named by a workload: that workload is
        // denied, and its namespace's other workloads are not.
        let fresh = policy("shop", "fresh", Scope::WorkloadSelector, BROKEN);
        cache.set(snapshot(
            &[web_policy(ALLOW), blog_policy(ALLOW), fresh],
            &["shop/fresh"],
        ));
        // Until both types have arrived: before the cart names it, the policy's scope is taken
        // as its whole namespace.
        let mesh = until(&mut rx, |m| {
            m.rejected_policies.iter().any(|r| r.key == "shop/fresh")
                && m.workloads
                    .iter()
                    .any(|w| w.authorization_policies.iter().any(|p| p == "shop/fresh"))
        })
        .await;
        assert_eq!(
            stand_ins(&mesh),
            [("shop/fresh", StandIn::DenyAll)],
            "{mode:?}"
        );
        assert!(!allowed(&mesh, [10, 0, 0, 2], CLIENT), "{mode:?}");
        assert!(allowed(&mesh, [10, 0, 0, 1], CLIENT));

        // Removed by the server: nothing stands in for it any more.
        cache.set(snapshot(
            &[web_policy(ALLOW), blog_policy(ALLOW)],
            &["shop/fresh"],
        ));
        let mesh = until(&mut rx, |m| m.rejected_policies.is_empty()).await;
        assert!(allowed(
            &mesh,
            [10, 0, 0, 2],
            "spiffe://cluster.local/ns/x/sa/y"
        ));

        for task in tasks {
            task.abort();
        }
        let _ = stop.send(());
        let _ = server.await;
    }
}
