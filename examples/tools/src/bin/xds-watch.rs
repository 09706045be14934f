//! `xds-watch`: connects to an ADS server, watches one resource type (some names, or all), and
//! prints each event as one JSON line on stdout. With `--follow` it starts from the Listeners
//! and follows the resource graph as a proxy subscribes: the RouteConfigurations their
//! HttpConnectionManagers name (RDS), the Clusters their routes and TCP proxies point at, and
//! the ClusterLoadAssignments of the EDS Clusters, each watched by name and dropped when
//! nothing points at it any more.
//!
//! ```text
//! xds-watch --server http://127.0.0.1:15010 --type cds            # every cluster, SotW
//! xds-watch --server http://127.0.0.1:15010 --type eds --delta --name outbound|80||web.shop
//! xds-watch --server http://127.0.0.1:15010 --follow --delta      # what a proxy would hold
//! xds-watch --server https://istiod:15012 --xds-ca root.pem --xds-token-file token \
//!     --fallback-server https://istiod-backup:15012 --node-metadata NODE_NAME=node-a --type cds
//! ```
//!
//! Exits non-zero when no response arrives within `--give-up-after` seconds (default 30) of
//! the start or of the last response.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use envoy_types::pb::envoy::config::cluster::v3::cluster::{ClusterDiscoveryType, DiscoveryType};
use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType;
use envoy_types::pb::envoy::config::route::v3::route::Action;
use envoy_types::pb::envoy::config::route::v3::route_action::ClusterSpecifier as RouteCluster;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::tcp_proxy::ClusterSpecifier as TcpCluster;
use envoy_types::pb::google::protobuf::Any;
use meshkit_cli::CliError;
use meshkit_xds_client::envoy::{
    Cluster, ClusterLoadAssignment, Listener, Node, RouteConfiguration, Secret,
};
use prost::{Message, Name};
use tokio::task::AbortHandle;
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
    /// The resource type (with --follow: lds, or leave it out).
    #[arg(long = "type", value_enum, required_unless_present = "follow")]
    kind: Option<Kind>,
    /// A resource name to watch; repeatable. None: every resource of the type (wildcard).
    /// With --follow: the Listeners to start from.
    #[arg(long = "name")]
    names: Vec<String>,
    /// Start from the Listeners and follow what they point at, as a proxy subscribes: the
    /// RouteConfigurations their HttpConnectionManagers name (RDS), the Clusters of their
    /// routes and TCP proxies, the ClusterLoadAssignments of EDS Clusters (the service name, or
    /// else the cluster's). Each is watched by name, and dropped when nothing points at it.
    #[arg(long)]
    follow: bool,
    /// Speak Delta ADS instead of State of the World.
    #[arg(long)]
    delta: bool,
    /// A fallback ADS server (gRFC A71), tried in the order given after --server when the
    /// servers before it cannot be reached; the higher ones keep being retried, and the first
    /// to answer serves again. Repeatable. TLS, token and node apply to every server.
    #[arg(long = "fallback-server", value_name = "URL")]
    fallback_servers: Vec<String>,
    /// State of the World: keep a Listener or Cluster that a response leaves out instead of
    /// reporting it removed (gRFC A53's ignore_resource_deletion); the client logs it once.
    #[arg(long)]
    ignore_resource_deletion: bool,
    /// The node ID sent to the server.
    #[arg(long, default_value = "xds-watch")]
    node_id: String,
    /// The node's cluster sent to the server (Istio reads the proxy's cluster from it).
    #[arg(long, value_name = "NAME")]
    node_cluster: Option<String>,
    /// A string entry of the node's metadata sent to the server, as KEY=VALUE (for example
    /// NODE_NAME=node-a, which istiod and meshkit's control plane read); repeatable.
    #[arg(long = "node-metadata", value_name = "KEY=VALUE", value_parser = key_value)]
    node_metadata: Vec<(String, String)>,
    /// Give up (exit 1) after this many seconds without a response; 0 retries forever.
    #[arg(long, default_value_t = 30)]
    give_up_after: u64,
    /// Exit 0 after printing this many events.
    #[arg(long)]
    max_events: Option<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum)]
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

/// `KEY=VALUE`, with a non-empty key.
fn key_value(arg: &str) -> Result<(String, String), String> {
    match arg.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("{arg:?} is not KEY=VALUE")),
    }
}

/// The node sent to the server.
fn node(args: &Args) -> Node {
    use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind as ValueKind};
    let metadata = (!args.node_metadata.is_empty()).then(|| Struct {
        fields: args
            .node_metadata
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    Value {
                        kind: Some(ValueKind::StringValue(v.clone())),
                    },
                )
            })
            .collect(),
    });
    Node {
        id: args.node_id.clone(),
        cluster: args.node_cluster.clone().unwrap_or_default(),
        metadata,
        ..Default::default()
    }
}

async fn run(args: Args) -> Result<(), CliError> {
    let node = node(&args);
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
    config = config
        .fallback_servers(args.fallback_servers.iter().cloned())
        .ignore_resource_deletion(args.ignore_resource_deletion);
    let (client, driver) = XdsClient::new(config);
    let mut driver = tokio::spawn(driver.run());
    if args.follow {
        if args.kind.is_some_and(|k| k != Kind::Lds) {
            return Err("--follow starts from the Listeners: give --type lds or no --type".into());
        }
        return follow(client, &args, &mut driver).await;
    }
    let kind = args.kind.ok_or("--type is required")?;
    let (tx, mut lines) = mpsc::unbounded_channel();
    match kind {
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
            done = &mut driver => return driver_result(done),
            () = meshkit_cli::stop_signal() => return Ok(()),
        }
    }
    driver_result(driver.await)
}

type DriverTask = tokio::task::JoinHandle<Result<(), meshkit_xds_client::Error>>;

fn driver_result(
    done: Result<Result<(), meshkit_xds_client::Error>, tokio::task::JoinError>,
) -> Result<(), CliError> {
    match done {
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
        WatchEvent::Synced => serde_json::json!({ "type": kind, "event": "synced" }),
        _ => serde_json::json!({ "type": kind, "event": "unknown" }),
    };
    value.to_string()
}

// === --follow ===

/// An event of a followed watch.
enum Followed {
    Lds(WatchEvent<Listener>),
    Rds(WatchEvent<RouteConfiguration>),
    Cds(WatchEvent<Cluster>),
    Eds(WatchEvent<ClusterLoadAssignment>),
}

/// What the Listeners point at, resource by resource, as far as it has been received.
#[derive(Debug, Default)]
struct Graph {
    listeners: BTreeMap<String, ListenerRefs>,
    /// RouteConfiguration name to the Clusters of its routes.
    routes: BTreeMap<String, BTreeSet<String>>,
    /// Cluster name to the ClusterLoadAssignment it takes from EDS, if it does.
    clusters: BTreeMap<String, Option<String>>,
}

/// What one Listener points at.
#[derive(Debug, Default, PartialEq, Eq)]
struct ListenerRefs {
    /// RouteConfigurations named by its HttpConnectionManagers (RDS).
    routes: BTreeSet<String>,
    /// Clusters of its TCP proxies and of route configurations given inline.
    clusters: BTreeSet<String>,
}

/// The names a proxy holding these Listeners subscribes to, per type.
#[derive(Debug, Default, PartialEq, Eq)]
struct Wanted {
    routes: BTreeSet<String>,
    clusters: BTreeSet<String>,
    endpoints: BTreeSet<String>,
}

/// The watches `--follow` holds beyond the Listeners', by type and name.
struct Follower {
    client: XdsClient,
    tx: mpsc::UnboundedSender<Followed>,
    graph: Graph,
    watches: HashMap<(Kind, String), AbortHandle>,
}

async fn follow(client: XdsClient, args: &Args, driver: &mut DriverTask) -> Result<(), CliError> {
    let (tx, mut events) = mpsc::unbounded_channel();
    let roots = if args.names.is_empty() {
        vec![client.watch_all::<Listener>()]
    } else {
        args.names
            .iter()
            .map(|n| client.watch::<Listener>(n))
            .collect()
    };
    for watch in roots {
        forward(watch, Followed::Lds, tx.clone());
    }
    let mut follower = Follower {
        client,
        tx,
        graph: Graph::default(),
        watches: HashMap::new(),
    };
    let mut printed = 0;
    loop {
        tokio::select! {
            event = events.recv() => {
                // The follower holds a sender: the channel never closes while it runs.
                let Some(event) = event else { return Ok(()) };
                let Some(line) = follower.handle(event) else { continue };
                println!("{line}");
                printed += 1;
                if args.max_events.is_some_and(|max| printed >= max) {
                    return Ok(());
                }
            }
            done = &mut *driver => return driver_result(done),
            () = meshkit_cli::stop_signal() => return Ok(()),
        }
    }
}

/// Sends every event of `watch` to `tx`, wrapped, until the watch ends or the task is aborted
/// (which drops the watch, and so unsubscribes).
fn forward<T: Resource>(
    mut watch: meshkit_xds_client::Watch<T>,
    wrap: fn(WatchEvent<T>) -> Followed,
    tx: mpsc::UnboundedSender<Followed>,
) -> AbortHandle {
    tokio::spawn(async move {
        while let Some(event) = watch.next().await {
            if tx.send(wrap(event)).is_err() {
                return;
            }
        }
    })
    .abort_handle()
}

// === impl Follower ===

impl Follower {
    /// Takes in one event: the line to print, unless it is a late event of a watch already
    /// dropped. Then watches what the graph now points at and drops what it no longer does.
    fn handle(&mut self, event: Followed) -> Option<String> {
        let line = match event {
            Followed::Lds(ev) => {
                match &ev {
                    WatchEvent::Updated { name, resource, .. } => {
                        self.graph
                            .listeners
                            .insert(name.clone(), listener_refs(resource));
                    }
                    WatchEvent::Removed { name, .. } => {
                        self.graph.listeners.remove(name);
                    }
                    _ => {}
                }
                json_line("lds", &ev)
            }
            Followed::Rds(ev) => {
                let name = self.current(Kind::Rds, &ev)?;
                match &ev {
                    WatchEvent::Updated { resource, .. } => {
                        self.graph.routes.insert(name, route_clusters(resource));
                    }
                    WatchEvent::Removed { .. } => {
                        self.graph.routes.remove(&name);
                    }
                    _ => {}
                }
                json_line("rds", &ev)
            }
            Followed::Cds(ev) => {
                let name = self.current(Kind::Cds, &ev)?;
                match &ev {
                    WatchEvent::Updated { resource, .. } => {
                        self.graph.clusters.insert(name, eds_name(resource));
                    }
                    WatchEvent::Removed { .. } => {
                        self.graph.clusters.remove(&name);
                    }
                    _ => {}
                }
                json_line("cds", &ev)
            }
            Followed::Eds(ev) => {
                self.current(Kind::Eds, &ev)?;
                json_line("eds", &ev)
            }
        };
        self.sync();
        Some(line)
    }

    /// The name of an event of a watch still held (a rejection without a name: any name).
    fn current<T>(&self, kind: Kind, ev: &WatchEvent<T>) -> Option<String> {
        match ev.name() {
            Some(name) => self
                .watches
                .contains_key(&(kind, name.to_owned()))
                .then(|| name.to_owned()),
            None => Some(String::new()),
        }
    }

    /// Subscribes to what the graph points at and unsubscribes from what it no longer does.
    fn sync(&mut self) {
        let wanted = self.graph.wanted();
        self.graph.prune(&wanted);
        let want = |kind: Kind, name: &String| match kind {
            Kind::Rds => wanted.routes.contains(name),
            Kind::Cds => wanted.clusters.contains(name),
            Kind::Eds => wanted.endpoints.contains(name),
            Kind::Lds | Kind::Sds => false,
        };
        self.watches.retain(|(kind, name), task| {
            let keep = want(*kind, name);
            if !keep {
                task.abort();
            }
            keep
        });
        for (kind, names) in [
            (Kind::Rds, &wanted.routes),
            (Kind::Cds, &wanted.clusters),
            (Kind::Eds, &wanted.endpoints),
        ] {
            for name in names {
                let key = (kind, name.clone());
                if self.watches.contains_key(&key) {
                    continue;
                }
                let tx = self.tx.clone();
                let task = match kind {
                    Kind::Rds => forward(self.client.watch(name), Followed::Rds, tx),
                    Kind::Cds => forward(self.client.watch(name), Followed::Cds, tx),
                    _ => forward(self.client.watch(name), Followed::Eds, tx),
                };
                self.watches.insert(key, task);
            }
        }
    }
}

// === impl Graph ===

impl Graph {
    /// What the Listeners point at, directly and through what has been received of their
    /// RouteConfigurations and Clusters.
    fn wanted(&self) -> Wanted {
        let mut w = Wanted::default();
        for refs in self.listeners.values() {
            w.routes.extend(refs.routes.iter().cloned());
            w.clusters.extend(refs.clusters.iter().cloned());
        }
        for route in &w.routes {
            if let Some(clusters) = self.routes.get(route) {
                w.clusters.extend(clusters.iter().cloned());
            }
        }
        for cluster in &w.clusters {
            if let Some(Some(eds)) = self.clusters.get(cluster) {
                w.endpoints.insert(eds.clone());
            }
        }
        w
    }

    /// Forgets what nothing points at any more.
    fn prune(&mut self, wanted: &Wanted) {
        self.routes.retain(|name, _| wanted.routes.contains(name));
        self.clusters
            .retain(|name, _| wanted.clusters.contains(name));
    }
}

/// What a Listener points at: for each HttpConnectionManager (in a filter chain, the default
/// filter chain or an API listener) its RDS route configuration, or the clusters of its inline
/// one; for each TCP proxy its clusters.
fn listener_refs(listener: &Listener) -> ListenerRefs {
    let mut refs = ListenerRefs::default();
    let chains = listener
        .filter_chains
        .iter()
        .chain(listener.default_filter_chain.as_ref());
    let configs = chains
        .flat_map(|chain| &chain.filters)
        .filter_map(|filter| match &filter.config_type {
            Some(ConfigType::TypedConfig(any)) => Some(any),
            _ => None,
        })
        .chain(
            listener
                .api_listener
                .as_ref()
                .and_then(|api| api.api_listener.as_ref()),
        );
    for any in configs {
        if let Some(hcm) = unpack::<HttpConnectionManager>(any) {
            match hcm.route_specifier {
                Some(RouteSpecifier::Rds(rds)) if !rds.route_config_name.is_empty() => {
                    refs.routes.insert(rds.route_config_name);
                }
                Some(RouteSpecifier::RouteConfig(inline)) => {
                    refs.clusters.extend(route_clusters(&inline));
                }
                _ => {}
            }
        } else if let Some(tcp) = unpack::<TcpProxy>(any) {
            match tcp.cluster_specifier {
                Some(TcpCluster::Cluster(name)) => {
                    refs.clusters.insert(name);
                }
                Some(TcpCluster::WeightedClusters(w)) => {
                    refs.clusters.extend(w.clusters.into_iter().map(|c| c.name));
                }
                None => {}
            }
        }
    }
    refs.clusters.remove("");
    refs
}

/// The clusters the routes of a route configuration send to (one cluster, weighted clusters,
/// request mirrors); a cluster chosen by a request header cannot be known in advance.
fn route_clusters(config: &RouteConfiguration) -> BTreeSet<String> {
    let mut clusters = BTreeSet::new();
    let actions = config
        .virtual_hosts
        .iter()
        .flat_map(|vh| &vh.routes)
        .filter_map(|route| match &route.action {
            Some(Action::Route(action)) => Some(action),
            _ => None,
        });
    for action in actions {
        match &action.cluster_specifier {
            Some(RouteCluster::Cluster(name)) => {
                clusters.insert(name.clone());
            }
            Some(RouteCluster::WeightedClusters(w)) => {
                clusters.extend(w.clusters.iter().map(|c| c.name.clone()));
            }
            _ => {}
        }
        clusters.extend(
            action
                .request_mirror_policies
                .iter()
                .map(|m| m.cluster.clone()),
        );
    }
    clusters.remove("");
    clusters
}

/// The ClusterLoadAssignment an EDS cluster takes: its EDS service name, or else its own name.
fn eds_name(cluster: &Cluster) -> Option<String> {
    let eds = cluster.cluster_discovery_type
        == Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32));
    eds.then(|| {
        cluster
            .eds_cluster_config
            .as_ref()
            .map(|c| c.service_name.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| cluster.name.clone())
    })
}

/// `any` decoded as `T`, if it is one (whatever the type URL's host part).
fn unpack<T: Message + Name + Default>(any: &Any) -> Option<T> {
    let full_name = any.type_url.rsplit_once('/').map_or("", |(_, n)| n);
    (full_name == T::full_name()).then(|| T::decode(any.value.as_slice()).ok())?
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::cluster::v3::cluster::EdsClusterConfig;
    use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain};
    use envoy_types::pb::envoy::config::route::v3::route_action::RequestMirrorPolicy;
    use envoy_types::pb::envoy::config::route::v3::weighted_cluster::ClusterWeight;
    use envoy_types::pb::envoy::config::route::v3::{
        Route, RouteAction, VirtualHost, WeightedCluster,
    };
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::Rds;

    use super::*;

    fn typed<T: Message + Name>(m: &T) -> Filter {
        Filter {
            name: T::NAME.into(),
            config_type: Some(ConfigType::TypedConfig(Any {
                type_url: format!("type.googleapis.com/{}", T::full_name()),
                value: m.encode_to_vec(),
            })),
        }
    }

    fn route_to(spec: RouteCluster, mirror: &str) -> Route {
        Route {
            action: Some(Action::Route(RouteAction {
                cluster_specifier: Some(spec),
                request_mirror_policies: vec![RequestMirrorPolicy {
                    cluster: mirror.into(),
                    ..Default::default()
                }],
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    fn routes() -> RouteConfiguration {
        RouteConfiguration {
            name: "r".into(),
            virtual_hosts: vec![VirtualHost {
                name: "vh".into(),
                domains: vec!["*".into()],
                routes: vec![
                    route_to(RouteCluster::Cluster("c1".into()), ""),
                    route_to(
                        RouteCluster::WeightedClusters(WeightedCluster {
                            clusters: vec![
                                ClusterWeight {
                                    name: "c2".into(),
                                    ..Default::default()
                                },
                                ClusterWeight {
                                    name: "c3".into(),
                                    ..Default::default()
                                },
                            ],
                            ..Default::default()
                        }),
                        "shadow",
                    ),
                    route_to(RouteCluster::ClusterHeader("x-cluster".into()), ""),
                ],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn routes_point_at_their_clusters_weighted_and_mirrors() {
        let got: Vec<String> = route_clusters(&routes()).into_iter().collect();
        assert_eq!(got, ["c1", "c2", "c3", "shadow"]);
    }

    #[test]
    fn a_listener_points_at_rds_inline_routes_and_tcp_proxies() {
        let rds = HttpConnectionManager {
            route_specifier: Some(RouteSpecifier::Rds(Rds {
                route_config_name: "r".into(),
                ..Default::default()
            })),
            ..Default::default()
        };
        let inline = HttpConnectionManager {
            route_specifier: Some(RouteSpecifier::RouteConfig(routes())),
            ..Default::default()
        };
        let tcp = TcpProxy {
            cluster_specifier: Some(TcpCluster::Cluster("tcp".into())),
            ..Default::default()
        };
        let listener = Listener {
            name: "l".into(),
            filter_chains: vec![FilterChain {
                filters: vec![typed(&rds), typed(&tcp)],
                ..Default::default()
            }],
            default_filter_chain: Some(FilterChain {
                filters: vec![typed(&inline)],
                ..Default::default()
            }),
            ..Default::default()
        };
        let refs = listener_refs(&listener);
        assert_eq!(refs.routes.into_iter().collect::<Vec<_>>(), ["r"]);
        assert_eq!(
            refs.clusters.into_iter().collect::<Vec<_>>(),
            ["c1", "c2", "c3", "shadow", "tcp"]
        );
    }

    #[test]
    fn only_eds_clusters_have_endpoints_named_by_service_name_or_else_their_own() {
        let eds = |service: &str| Cluster {
            name: "c".into(),
            cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)),
            eds_cluster_config: Some(EdsClusterConfig {
                service_name: service.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(eds_name(&eds("svc")).as_deref(), Some("svc"));
        assert_eq!(eds_name(&eds("")).as_deref(), Some("c"));
        let static_cluster = Cluster {
            name: "s".into(),
            cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32)),
            ..Default::default()
        };
        assert_eq!(eds_name(&static_cluster), None);
    }

    #[test]
    fn the_graph_wants_what_listeners_reach_and_forgets_the_rest() {
        let mut g = Graph::default();
        g.listeners.insert(
            "l".into(),
            ListenerRefs {
                routes: ["r".to_owned()].into(),
                clusters: ["tcp".to_owned()].into(),
            },
        );
        g.routes.insert("r".into(), ["c1".to_owned()].into());
        g.routes.insert("old".into(), ["c9".to_owned()].into());
        g.clusters.insert("c1".into(), Some("c1-eds".into()));
        g.clusters.insert("tcp".into(), None);
        g.clusters.insert("c9".into(), Some("c9".into()));
        let w = g.wanted();
        assert_eq!(w.routes, ["r".to_owned()].into());
        assert_eq!(w.clusters, ["c1".to_owned(), "tcp".to_owned()].into());
        assert_eq!(w.endpoints, ["c1-eds".to_owned()].into());
        g.prune(&w);
        assert!(!g.routes.contains_key("old") && !g.clusters.contains_key("c9"));
        // The listener goes: nothing is wanted any more.
        g.listeners.clear();
        assert_eq!(g.wanted(), Wanted::default());
    }
}
