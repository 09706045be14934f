//! SPIFFE mutual TLS to the control plane (feature `identity`) against the fake server.

use std::error::Error;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::Node;
use meshkit_identity::test_util::TestCa;
use meshkit_identity::{
    Authorize, SpiffeVerifier, TlsSettings, TrustDomain, VerifyError, verify_error,
};
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
    let err = tokio::time::timeout(Duration::from_secs(20), driver.run())
        .await
        .expect("the driver gives up within 20 s")
        .expect_err("refused");
    assert!(err.is_timeout(), "{err:?}");
    // Any failure to connect would give up too: the cause must be our verifier refusing the
    // server's identity, not a refused port, a TLS alert or a timeout.
    let refusal = verify_error_in(&err).unwrap_or_else(|| panic!("no verifier error in {err:?}"));
    assert_eq!(
        refusal,
        &VerifyError::Unauthorized(SERVER_ID.parse().unwrap()),
        "{err:?}"
    );
    assert!(server.delta_requests().is_empty());
}

/// The verifier's error behind `err`: the source chain leads to the TLS handshake's
/// `io::Error`, whose payload is the `rustls::Error` carrying the [`VerifyError`]. An
/// `io::Error`'s `source()` skips its payload, so the payload is read with `get_ref`.
fn verify_error_in<'a>(err: &'a (dyn Error + 'static)) -> Option<&'a VerifyError> {
    let mut next = Some(err);
    while let Some(e) = next {
        let tls = e.downcast_ref::<rustls::Error>().or_else(|| {
            e.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if let Some(found) = tls.and_then(verify_error) {
            return Some(found);
        }
        next = e.source();
    }
    None
}
