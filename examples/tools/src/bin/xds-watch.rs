//! `xds-watch`: connects to an ADS server, watches one resource type (some names, or all), and
//! prints each event as one JSON line on stdout.
//!
//! ```text
//! xds-watch --server http://127.0.0.1:15010 --type cds            # every cluster, SotW
//! xds-watch --server http://127.0.0.1:15010 --type eds --delta --name outbound|80||web.shop
//! ```
//!
//! Exits non-zero when no response arrives within `--give-up-after` seconds (default 30) of
//! the start or of the last response.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use meshkit_cli::CliError;
use meshkit_xds_client::envoy::{
    Cluster, ClusterLoadAssignment, Listener, Node, RouteConfiguration, Secret,
};
use meshkit_xds_client::protocol::Mode;
use meshkit_xds_client::{ClientConfig, Resource, WatchEvent, XdsClient};
use tokio::sync::mpsc;

// mimalloc keeps the HTTP/2 frame buffers glibc would return to the kernel (docs/hbone.md).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Watch xDS resources and print each event as a JSON line.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// The ADS server, `https://host:port` (with --xds-ca), or `http://host:port`.
    #[arg(long)]
    server: String,
    /// TLS and token for the control plane.
    #[command(flatten)]
    control_plane: meshkit_cli::ControlPlaneArgs,
    /// The resource type.
    #[arg(long = "type", value_enum)]
    kind: Kind,
    /// A resource name to watch; repeatable. None: every resource of the type (wildcard).
    #[arg(long = "name")]
    names: Vec<String>,
    /// Speak Delta ADS instead of State of the World.
    #[arg(long)]
    delta: bool,
    /// The node ID sent to the server.
    #[arg(long, default_value = "xds-watch")]
    node_id: String,
    /// Give up (exit 1) after this many seconds without a response; 0 retries forever.
    #[arg(long, default_value_t = 30)]
    give_up_after: u64,
    /// Exit 0 after printing this many events.
    #[arg(long)]
    max_events: Option<usize>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Kind {
    /// Listener.
    Lds,
    /// RouteConfiguration.
    Rds,
    /// Cluster.
    Cds,
    /// ClusterLoadAssignment.
    Eds,
    /// Secret.
    Sds,
}

#[tokio::main]
async fn main() -> ExitCode {
    meshkit_cli::init_logging_quiet();
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xds-watch: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), CliError> {
    let node = Node {
        id: args.node_id.clone(),
        ..Default::default()
    };
    let mode = if args.delta {
        Mode::Delta
    } else {
        Mode::StateOfTheWorld
    };
    let mut config = args.control_plane.xds_config(
        &args.server,
        ClientConfig::new(args.server.clone(), mode, node),
    )?;
    if args.give_up_after > 0 {
        config = config.give_up_after(Duration::from_secs(args.give_up_after));
    }
    let (client, driver) = XdsClient::new(config);
    let mut driver = tokio::spawn(driver.run());
    let (tx, mut lines) = mpsc::unbounded_channel();
    match args.kind {
        Kind::Lds => spawn_watches::<Listener>(&client, &args.names, "lds", &tx),
        Kind::Rds => spawn_watches::<RouteConfiguration>(&client, &args.names, "rds", &tx),
        Kind::Cds => spawn_watches::<Cluster>(&client, &args.names, "cds", &tx),
        Kind::Eds => spawn_watches::<ClusterLoadAssignment>(&client, &args.names, "eds", &tx),
        Kind::Sds => spawn_watches::<Secret>(&client, &args.names, "sds", &tx),
    }
    drop(tx);
    let mut printed = 0;
    loop {
        tokio::select! {
            line = lines.recv() => {
                // Watches end only when the driver stops: report how it stopped.
                let Some(line) = line else { break };
                println!("{line}");
                printed += 1;
                if args.max_events.is_some_and(|max| printed >= max) {
                    return Ok(());
                }
            }
            done = &mut driver => {
                return match done {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(e)) => Err(e.into()),
                    Err(e) => Err(format!("driver task: {e}").into()),
                };
            }
            () = meshkit_cli::stop_signal() => return Ok(()),
        }
    }
    match driver.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.into()),
        Err(e) => Err(format!("driver task: {e}").into()),
    }
}

fn spawn_watches<T: Resource>(
    client: &XdsClient,
    names: &[String],
    kind: &'static str,
    tx: &mpsc::UnboundedSender<String>,
) {
    let watches = if names.is_empty() {
        vec![client.watch_all::<T>()]
    } else {
        names.iter().map(|n| client.watch::<T>(n)).collect()
    };
    for mut watch in watches {
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Some(event) = watch.next().await {
                if tx.send(json_line(kind, &event)).is_err() {
                    return;
                }
            }
        });
    }
}

fn json_line<T>(kind: &str, event: &WatchEvent<T>) -> String {
    let value = match event {
        WatchEvent::Updated { name, version, .. } => serde_json::json!({
            "type": kind, "event": "updated", "name": name, "version": version,
        }),
        WatchEvent::Removed { name, reason } => serde_json::json!({
            "type": kind, "event": "removed", "name": name, "reason": format!("{reason:?}"),
        }),
        WatchEvent::Rejected { name, error } => serde_json::json!({
            "type": kind, "event": "error", "name": name, "error": error,
        }),
        _ => serde_json::json!({ "type": kind, "event": "unknown" }),
    };
    value.to_string()
}
