//! SPIFFE mutual TLS to the control plane (feature `identity`) against the fake server.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::Node;
use meshkit_identity::test_util::TestCa;
use meshkit_identity::{Authorize, SpiffeVerifier, TlsSettings, TrustDomain};
use meshkit_xds_client::protocol::Mode;
use meshkit_xds_client::testing::{FakeServer, Snapshot, SnapshotExt};
use meshkit_xds_client::{ClientConfig, WatchEvent, XdsClient};

const SERVER_ID: &str = "spiffe://cluster.local/ns/istio-system/sa/istiod";
const CLIENT_ID: &str = "spiffe://cluster.local/ns/shop/sa/web";

async fn mtls_server(ca: &TestCa) -> FakeServer {
    let server_config = TlsSettings::default()
        .server_config(
            ca.issue(SERVER_ID.parse().unwrap()),
            SpiffeVerifier::new(
                ca.bundle_set(),
                Authorize::TrustDomain(ca.trust_domain().clone()),
            ),
        )
        .unwrap();
    let server = FakeServer::start_tls_on(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        Arc::new(server_config),
    )
    .await
    .unwrap();
    server.set_snapshot(Snapshot::new().with_resources(
        "v1",
        &[Cluster {
            name: "a".into(),
            ..Default::default()
        }],
    ));
    server
}

fn config(server: &FakeServer) -> ClientConfig {
    ClientConfig::new(
        format!("https://{}", server.addr()),
        Mode::Delta,
        Node::default(),
    )
    .backoff(Duration::from_millis(20), Duration::from_millis(100))
}

#[tokio::test]
async fn spiffe_mtls_to_the_control_plane() {
    let ca = TestCa::new(TrustDomain::new("cluster.local").unwrap());
    let server = mtls_server(&ca).await;
    let cfg = config(&server)
        .spiffe_mtls(
            ca.issue(CLIENT_ID.parse().unwrap()),
            SpiffeVerifier::new(
                ca.bundle_set(),
                Authorize::Exact(SERVER_ID.parse().unwrap()),
            ),
        )
        .unwrap();
    let (client, driver) = XdsClient::new(cfg);
    tokio::spawn(driver.run());
    let mut w = client.watch::<Cluster>("a");
    let ev = tokio::time::timeout(Duration::from_secs(10), w.next())
        .await
        .expect("in time")
        .expect("open");
    assert!(matches!(ev, WatchEvent::Updated { .. }), "{ev:?}");
}

#[tokio::test]
async fn server_with_the_wrong_identity_is_refused() {
    let ca = TestCa::new(TrustDomain::new("cluster.local").unwrap());
    let server = mtls_server(&ca).await;
    let cfg = config(&server)
        .spiffe_mtls(
            ca.issue(CLIENT_ID.parse().unwrap()),
            SpiffeVerifier::new(
                ca.bundle_set(),
                Authorize::Exact("spiffe://cluster.local/ns/evil/sa/x".parse().unwrap()),
            ),
        )
        .unwrap()
        .give_up_after(Duration::from_millis(300));
    let (client, driver) = XdsClient::new(cfg);
    let _w = client.watch::<Cluster>("a");
    let err = tokio::time::timeout(Duration::from_secs(10), driver.run())
        .await
        .expect("in time")
        .expect_err("refused");
    assert!(err.is_timeout(), "{err:?}");
    assert!(server.delta_requests().is_empty());
}
