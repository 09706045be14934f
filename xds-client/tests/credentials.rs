//! Call credentials and caller-built channels, against an ADS server that authenticates and
//! scopes its streams (meshkit-xds-server's `AccessPolicy`), over loopback.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::Node;
use meshkit_xds_client::protocol::Mode;
use meshkit_xds_client::{
    CLUSTER_TYPE_URL, CallCredentials, ClientConfig, Error, Watch, WatchEvent, XdsClient,
};
use meshkit_xds_server::{AdsServer, Snapshot, SnapshotBuilder, SnapshotCache, StreamAccess};
use tonic::Status;
use tonic::metadata::MetadataMap;

const MODES: [Mode; 2] = [Mode::StateOfTheWorld, Mode::Delta];

/// Serves `visible` and `hidden`; a stream needs `Bearer good` and node `n1`, and never sees
/// `hidden`.
struct Scoped;

impl StreamAccess for Scoped {
    fn check_node(&mut self, node: &Node) -> Result<(), Status> {
        if node.id == "n1" {
            Ok(())
        } else {
            Err(Status::permission_denied("not your node"))
        }
    }
    fn view(&mut self, snapshot: &Arc<Snapshot>) -> Arc<Snapshot> {
        let ts = snapshot
            .get_type(CLUSTER_TYPE_URL)
            .map(|t| t.filtered(|name, _| name != "hidden"))
            .unwrap_or_default();
        Arc::new(Snapshot::new().with_type(CLUSTER_TYPE_URL, ts))
    }
}

async fn server() -> std::net::SocketAddr {
    let mut b = SnapshotBuilder::new();
    for name in ["visible", "hidden"] {
        b.add(
            CLUSTER_TYPE_URL,
            name,
            &Cluster {
                name: name.into(),
                ..Default::default()
            },
        );
    }
    let ads = AdsServer::new(SnapshotCache::new(b.build())).with_access(
        |md: &MetadataMap| -> Result<Box<dyn StreamAccess>, Status> {
            match md.get("authorization").and_then(|v| v.to_str().ok()) {
                Some("Bearer good") => Ok(Box::new(Scoped)),
                _ => Err(Status::unauthenticated("bad token")),
            }
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(ads.serve(listener, std::future::pending()));
    addr
}

fn config(uri: &str, mode: Mode, node_id: &str) -> ClientConfig {
    let node = Node {
        id: node_id.into(),
        ..Default::default()
    };
    ClientConfig::new(uri, mode, node).backoff(Duration::from_millis(20), Duration::from_millis(50))
}

/// Awaits `fut` for at most 20 s, failing with `what`.
async fn bounded<F: std::future::Future>(what: &str, fut: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within 20 s"))
}

/// Every cluster name a watch delivers until it ends (its driver stopped), sorted.
async fn rest(watch: &mut Watch<Cluster>, names: &mut Vec<String>) {
    while let Some(event) = bounded("the watch ends with its driver", watch.next()).await {
        match event {
            WatchEvent::Updated { name, .. } => names.push(name),
            // The view is whole: it says nothing about which clusters are in it.
            WatchEvent::Synced => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    names.sort();
}

/// Starts a client with `config` that the server admits; what a wildcard watch delivers: the
/// events up to `visible`, then, the driver stopped, whatever else it had delivered. No quiet
/// period is waited for, so a slow machine changes nothing.
async fn admitted(config: ClientConfig) -> Vec<String> {
    let (client, driver) = XdsClient::new(config);
    let driver = tokio::spawn(driver.run());
    let mut watch = client.watch_all::<Cluster>();
    let mut names = Vec::new();
    while !names.iter().any(|n| n == "visible") {
        match bounded("the first clusters", watch.next()).await {
            Some(WatchEvent::Updated { name, .. }) => names.push(name),
            Some(WatchEvent::Synced) => {}
            Some(other) => panic!("unexpected {other:?}"),
            None => panic!("the driver stopped: {:?}", driver.await),
        }
    }
    driver.abort();
    let _ = bounded("the driver stops", driver).await;
    rest(&mut watch, &mut names).await;
    drop(client);
    names
}

/// Starts a client with `config` that the server refuses; the error it gives up with, and
/// every name its wildcard watch delivered meanwhile.
async fn refused(config: ClientConfig) -> (Error, Vec<String>) {
    let (client, driver) = XdsClient::new(config);
    let driver = tokio::spawn(driver.run());
    let mut watch = client.watch_all::<Cluster>();
    let error = bounded("the client gives up", driver)
        .await
        .expect("no panic")
        .expect_err("refused");
    let mut names = Vec::new();
    rest(&mut watch, &mut names).await;
    drop(client);
    (error, names)
}

#[tokio::test]
async fn a_bearer_token_is_sent_and_the_server_scopes_the_view() {
    let addr = server().await;
    for mode in MODES {
        let uri = format!("http://{addr}");
        let got = admitted(config(&uri, mode, "n1").bearer_token("good").unwrap()).await;
        assert_eq!(got, ["visible"], "{mode:?}");
    }
}

#[tokio::test]
async fn a_token_file_is_read_for_the_stream() {
    let addr = server().await;
    let path = std::env::temp_dir().join(format!("meshkit-xds-token-{}", std::process::id()));
    std::fs::write(&path, "good\n").unwrap();
    let uri = format!("http://{addr}");
    let got = admitted(config(&uri, Mode::Delta, "n1").bearer_token_file(&path)).await;
    assert_eq!(got, ["visible"]);
    let _ = std::fs::remove_file(&path);
}

#[tokio::test]
async fn a_caller_built_channel_and_an_interceptor_are_used() {
    let addr = server().await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    // The URI names a port nobody listens on: only the caller's channel reaches the server.
    let config = config("http://127.0.0.1:1", Mode::StateOfTheWorld, "n1")
        .with_channel(channel)
        .with_interceptor(|mut request| {
            request
                .metadata_mut()
                .insert("authorization", "Bearer good".parse().unwrap());
            Ok(request)
        });
    let got = admitted(config).await;
    assert_eq!(got, ["visible"]);
}

#[tokio::test]
async fn without_the_token_or_with_another_node_the_client_gives_up() {
    let addr = server().await;
    let uri = format!("http://{addr}");
    let cases = [
        config(&uri, Mode::Delta, "n1"),
        config(&uri, Mode::Delta, "n1")
            .with_credentials(CallCredentials::bearer_token("bad").unwrap()),
        config(&uri, Mode::StateOfTheWorld, "n2")
            .bearer_token("good")
            .unwrap(),
    ];
    for (i, config) in cases.into_iter().enumerate() {
        let (error, got) = refused(config.give_up_after(Duration::from_millis(500))).await;
        assert!(got.is_empty(), "case {i}: {got:?}");
        assert!(error.is_timeout(), "case {i}: {error:?}");
        let chain = format!("{:?}", error);
        let expected = if i == 2 {
            "PermissionDenied"
        } else {
            "Unauthenticated"
        };
        assert!(chain.contains(expected), "case {i}: {chain}");
    }
}

#[test]
fn a_token_that_cannot_be_a_header_is_a_config_error() {
    let error = CallCredentials::bearer_token("bad\ntoken").expect_err("refused");
    assert!(error.is_config());
}
