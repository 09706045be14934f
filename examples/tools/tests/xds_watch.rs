//! `xds-watch --follow` as a user runs it, against an ADS server (meshkit-xds-server, through
//! meshkit-xds-client's fake) on loopback with a small snapshot: from the Listener to its
//! RouteConfiguration, Clusters and ClusterLoadAssignments, subscribed by name as a proxy
//! subscribes, each type's events printed; what nothing points at is never asked for, and what
//! stops being pointed at is unsubscribed.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::cluster::v3::cluster::{
    ClusterDiscoveryType, DiscoveryType, EdsClusterConfig,
};
use envoy_types::pb::envoy::config::core::v3::address::Address as AddressKind;
use envoy_types::pb::envoy::config::core::v3::config_source::ConfigSourceSpecifier;
use envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier;
use envoy_types::pb::envoy::config::core::v3::{
    Address, AggregatedConfigSource, ApiVersion, ConfigSource, SocketAddress,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};
use envoy_types::pb::envoy::config::listener::v3::filter::ConfigType;
use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, Listener};
use envoy_types::pb::envoy::config::route::v3::route::Action;
use envoy_types::pb::envoy::config::route::v3::route_action::ClusterSpecifier;
use envoy_types::pb::envoy::config::route::v3::route_match::PathSpecifier;
use envoy_types::pb::envoy::config::route::v3::weighted_cluster::ClusterWeight;
use envoy_types::pb::envoy::config::route::v3::{
    Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost, WeightedCluster,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, Rds,
};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::tcp_proxy::ClusterSpecifier as TcpCluster;
use envoy_types::pb::google::protobuf::{Any, Duration as PbDuration};
use meshkit_test_support::KillOnDrop;
use meshkit_xds_client::protocol::Mode;
use meshkit_xds_client::testing::{FakeServer, Snapshot, SnapshotExt};
use meshkit_xds_client::{CLUSTER_TYPE_URL, ENDPOINT_TYPE_URL, LISTENER_TYPE_URL, ROUTE_TYPE_URL};
use prost::{Message, Name};

fn ads() -> Option<ConfigSource> {
    Some(ConfigSource {
        resource_api_version: ApiVersion::V3 as i32,
        config_source_specifier: Some(ConfigSourceSpecifier::Ads(AggregatedConfigSource {})),
        ..Default::default()
    })
}

fn socket(port: u32) -> Address {
    Address {
        address: Some(AddressKind::SocketAddress(SocketAddress {
            address: "127.0.0.1".into(),
            port_specifier: Some(PortSpecifier::PortValue(port)),
            ..Default::default()
        })),
    }
}

fn filter<T: Message + Name>(name: &str, config: &T) -> Filter {
    Filter {
        name: name.into(),
        config_type: Some(ConfigType::TypedConfig(Any {
            type_url: format!("type.googleapis.com/{}", T::full_name()),
            value: config.encode_to_vec(),
        })),
    }
}

/// `l1`: HTTP on 8080 with its routes from RDS `r1`; what matches no chain goes to cluster
/// `tcp` (the default filter chain).
fn listener() -> Listener {
    let hcm = HttpConnectionManager {
        stat_prefix: "http".into(),
        route_specifier: Some(RouteSpecifier::Rds(Rds {
            config_source: ads(),
            route_config_name: "r1".into(),
        })),
        ..Default::default()
    };
    let tcp = TcpProxy {
        stat_prefix: "tcp".into(),
        cluster_specifier: Some(TcpCluster::Cluster("tcp".into())),
        ..Default::default()
    };
    Listener {
        name: "l1".into(),
        address: Some(socket(8080)),
        filter_chains: vec![FilterChain {
            filters: vec![filter(
                "envoy.filters.network.http_connection_manager",
                &hcm,
            )],
            ..Default::default()
        }],
        default_filter_chain: Some(FilterChain {
            filters: vec![filter("envoy.filters.network.tcp_proxy", &tcp)],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn route(prefix: &str, cluster: ClusterSpecifier) -> Route {
    Route {
        r#match: Some(RouteMatch {
            path_specifier: Some(PathSpecifier::Prefix(prefix.into())),
            ..Default::default()
        }),
        action: Some(Action::Route(RouteAction {
            cluster_specifier: Some(cluster),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// `r1`: `/a` to `c1`; with `weighted`, `/` split between `c1` and `c2`.
fn routes(weighted: bool) -> RouteConfiguration {
    let mut list = vec![route("/a", ClusterSpecifier::Cluster("c1".into()))];
    if weighted {
        let weight = |name: &str| ClusterWeight {
            name: name.into(),
            weight: Some(envoy_types::pb::google::protobuf::UInt32Value { value: 50 }),
            ..Default::default()
        };
        list.push(route(
            "/",
            ClusterSpecifier::WeightedClusters(WeightedCluster {
                clusters: vec![weight("c1"), weight("c2")],
                ..Default::default()
            }),
        ));
    }
    RouteConfiguration {
        name: "r1".into(),
        virtual_hosts: vec![VirtualHost {
            name: "web".into(),
            domains: vec!["*".into()],
            routes: list,
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn eds_cluster(name: &str, service_name: &str) -> Cluster {
    Cluster {
        name: name.into(),
        connect_timeout: Some(PbDuration {
            seconds: 1,
            nanos: 0,
        }),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)),
        eds_cluster_config: Some(EdsClusterConfig {
            eds_config: ads(),
            service_name: service_name.into(),
        }),
        ..Default::default()
    }
}

fn endpoints(name: &str, port: u32) -> ClusterLoadAssignment {
    ClusterLoadAssignment {
        cluster_name: name.into(),
        endpoints: vec![LocalityLbEndpoints {
            lb_endpoints: vec![LbEndpoint {
                host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                    address: Some(socket(port)),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn static_cluster(name: &str) -> Cluster {
    Cluster {
        name: name.into(),
        connect_timeout: Some(PbDuration {
            seconds: 1,
            nanos: 0,
        }),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32)),
        load_assignment: Some(endpoints(name, 7000)),
        ..Default::default()
    }
}

/// The server's snapshot: what `l1` reaches, and an EDS cluster and endpoints nothing reaches.
fn snapshot(version: &str, weighted: bool) -> Snapshot {
    Snapshot::new()
        .with_resources(version, &[listener()])
        .with_resources(version, &[routes(weighted)])
        .with_resources(
            version,
            &[
                eds_cluster("c1", "c1-eds"),
                eds_cluster("c2", ""),
                static_cluster("tcp"),
                eds_cluster("unused", ""),
            ],
        )
        .with_resources(
            version,
            &[
                endpoints("c1-eds", 7001),
                endpoints("c2", 7002),
                endpoints("unused", 7003),
            ],
        )
}

/// `xds-watch --follow` against `server`, its JSON lines sent to the receiver as they come.
fn follow(server: &FakeServer, mode: Mode) -> (KillOnDrop, mpsc::Receiver<serde_json::Value>) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_xds-watch"));
    command.args([
        "--server",
        &server.uri(),
        "--follow",
        "--give-up-after",
        "20",
    ]);
    if mode == Mode::Delta {
        command.arg("--delta");
    }
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start xds-watch");
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            let value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
            if tx.send(value).is_err() {
                return;
            }
        }
    });
    (KillOnDrop(child), rx)
}

/// The next `n` lines as (type, event, name).
fn lines(rx: &mpsc::Receiver<serde_json::Value>, n: usize) -> BTreeSet<(String, String, String)> {
    let mut got = Vec::new();
    while got.len() < n {
        let Ok(v) = rx.recv_timeout(Duration::from_secs(20)) else {
            panic!("{n} lines within 20 s; got {got:?}");
        };
        // A wildcard watch's "the state is whole" names no resource.
        if v["event"] != "synced" {
            got.push(v);
        }
    }
    got.iter()
        .map(|v| {
            let field = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
            (field("type"), field("event"), field("name"))
        })
        .collect()
}

fn updated(list: &[(&str, &str)]) -> BTreeSet<(String, String, String)> {
    list.iter()
        .map(|(t, n)| (t.to_string(), "updated".to_owned(), n.to_string()))
        .collect()
}

/// The names the client subscribes to of `type_url` at the latest request (SotW), or over
/// every request (Delta: subscribed minus unsubscribed), and every name it ever asked for.
fn subscriptions(
    server: &FakeServer,
    mode: Mode,
    type_url: &str,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut now = BTreeSet::new();
    let mut ever = BTreeSet::new();
    match mode {
        Mode::StateOfTheWorld => {
            for r in server
                .sotw_requests()
                .iter()
                .filter(|r| r.type_url == type_url)
            {
                now = r.resource_names.iter().cloned().collect();
                ever.extend(now.iter().cloned());
            }
        }
        Mode::Delta => {
            for r in server
                .delta_requests()
                .iter()
                .filter(|r| r.type_url == type_url)
            {
                now.extend(r.resource_names_subscribe.iter().cloned());
                ever.extend(r.resource_names_subscribe.iter().cloned());
                for n in &r.resource_names_unsubscribe {
                    now.remove(n);
                }
            }
        }
    }
    (now, ever)
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| n.to_string()).collect()
}

#[test]
fn follow_subscribes_from_listeners_to_endpoints_as_a_proxy_does() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    for mode in [Mode::StateOfTheWorld, Mode::Delta] {
        let server = rt.block_on(FakeServer::start()).unwrap();
        server.set_snapshot(snapshot("v1", true));
        let (_proc, rx) = follow(&server, mode);
        assert_eq!(
            lines(&rx, 7),
            updated(&[
                ("lds", "l1"),
                ("rds", "r1"),
                ("cds", "c1"),
                ("cds", "c2"),
                ("cds", "tcp"),
                ("eds", "c1-eds"),
                ("eds", "c2"),
            ]),
            "{mode:?}"
        );
        // As a proxy subscribes: the Listeners by wildcard, the rest by name, nothing else.
        let (lds, _) = subscriptions(&server, mode, LISTENER_TYPE_URL);
        assert_eq!(lds, set(&["*"]), "{mode:?}");
        for (url, want) in [
            (ROUTE_TYPE_URL, set(&["r1"])),
            (CLUSTER_TYPE_URL, set(&["c1", "c2", "tcp"])),
            (ENDPOINT_TYPE_URL, set(&["c1-eds", "c2"])),
        ] {
            let (now, ever) = subscriptions(&server, mode, url);
            assert_eq!(now, want, "{mode:?} {url}");
            assert_eq!(ever, want, "{mode:?} {url}: asked for more");
        }

        // The route stops pointing at c2: its cluster and endpoints are unsubscribed.
        server.set_snapshot(snapshot("v2", false));
        assert_eq!(lines(&rx, 1), updated(&[("rds", "r1")]), "{mode:?}");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let (cds, _) = subscriptions(&server, mode, CLUSTER_TYPE_URL);
            let (eds, _) = subscriptions(&server, mode, ENDPOINT_TYPE_URL);
            if cds == set(&["c1", "tcp"]) && eds == set(&["c1-eds"]) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{mode:?}: still subscribed to {cds:?} {eds:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // Nothing else is printed: what is no longer watched is not reported.
        if let Ok(v) = rx.recv_timeout(Duration::from_millis(300)) {
            panic!("{mode:?}: unexpected line {v}");
        }
    }
}

/// The client's options from the command line: a first server that cannot be reached and a
/// fallback that serves (gRFC A71), and the node's cluster and metadata as the server sees
/// them.
#[test]
fn the_client_options_reach_the_server_a_fallback_serves() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server = rt.block_on(FakeServer::start()).unwrap();
    server.set_snapshot(snapshot("v1", true));
    // A port nothing listens on: bound, then closed.
    let unreachable = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_xds-watch"))
        .args([
            "--server",
            &format!("http://{unreachable}"),
            "--fallback-server",
            &server.uri(),
            "--type",
            "cds",
            "--node-cluster",
            "edge",
            "--node-metadata",
            "NODE_NAME=node-a",
            "--ignore-resource-deletion",
            "--give-up-after",
            "20",
            "--max-events",
            "4",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start xds-watch");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut child = KillOnDrop(child);
    let names: BTreeSet<String> = BufReader::new(stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(&l.unwrap()).unwrap())
        .filter(|v| v["event"] == "updated")
        .map(|v| v["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, set(&["c1", "c2", "tcp", "unused"]));
    assert!(child.0.wait().unwrap().success());
    let requests = server.sotw_requests();
    let node = requests
        .iter()
        .find_map(|r| r.node.clone())
        .expect("a request names the node");
    assert_eq!(node.id, "xds-watch");
    assert_eq!(node.cluster, "edge");
    let metadata = node.metadata.expect("metadata");
    assert_eq!(
        metadata.fields["NODE_NAME"].kind,
        Some(envoy_types::pb::google::protobuf::value::Kind::StringValue(
            "node-a".to_owned()
        ))
    );
}
