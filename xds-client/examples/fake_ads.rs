//! A fake ADS server with a few clusters, for trying clients such as `xds-watch` by hand.
//!
//! `cargo run -p meshkit-xds-client --features test-util --example fake_ads -- [SECONDS]`
//!
//! Prints its address, serves `web`, `db` and `cache` (SotW and Delta), changes `web` every
//! second, and stops after SECONDS (default 10).

use std::time::Duration;

use meshkit_xds_client::envoy::Cluster;
use meshkit_xds_client::envoy_types::pb::google::protobuf::Duration as PbDuration;
use meshkit_xds_client::testing::{FakeServer, Snapshot, SnapshotExt};

fn cluster(name: &str, timeout_s: i64) -> Cluster {
    Cluster {
        name: name.into(),
        connect_timeout: Some(PbDuration {
            seconds: timeout_s,
            nanos: 0,
        }),
        ..Default::default()
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let seconds: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let server = FakeServer::start().await?;
    println!("{}", server.uri());
    for i in 1..=seconds {
        let timeout = i64::try_from(i).unwrap_or(1);
        server.set_snapshot(Snapshot::new().with_resources(
            &format!("v{i}"),
            &[
                cluster("web", timeout),
                cluster("db", 1),
                cluster("cache", 1),
            ],
        ));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(())
}
