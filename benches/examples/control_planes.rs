//! meshkit's control plane beside istiod, on one API server, in one run
//! (`benches/control-plane/run.sh` builds what it needs and runs this).
//!
//! The mesh is the shape of Istio's published load test: `SERVICES` Services (1,000) over
//! `PODS_PER_SERVICE` Pods each (2: 2,000 Pods), across `NAMESPACES` namespaces (10) and
//! `CLIENTS` nodes (20), every Pod enrolled in ambient and Ready. Each node has a node proxy
//! Pod of ServiceAccount `istio-system/ztunnel`; for each, one ztunnel-like Delta client
//! (its node id and metadata, a token bound to its Pod, `Address` and `Authorization`
//! subscribed as wildcards, every response ACKed) runs in this process.
//!
//! Each control plane in turn (istiod, then meshkit's `control-plane --kubeconfig`, the other
//! stopped), as a process of its own so that its memory and CPU are its own:
//!
//! - **CPU to the first full push**: its user + system CPU seconds from its start until every
//!   client holds every Service and every Pod's workload; with the wall time.
//! - **Resident memory after sync**: `VmRSS` two seconds after that (and, to tell the
//!   cluster's objects from what serving the clients costs, before any client connects).
//! - **Change to every client**: `CHANGES` times (100), one Pod turns not Ready, and once
//!   every client has seen it, Ready again; the time from the Ready write returning to every
//!   client holding the Pod healthy, p50 and p99, and the bytes of the responses the clients
//!   received for that change.
//! - **CPU per change**: the control plane's CPU seconds over the change loop, per change
//!   (each change is two transitions).
//!
//! `MESHKIT_ONLY=1` measures meshkit's control plane alone (to profile it; the ratios need
//! both). `CONTROL_PLANE_LOG=FILTER` runs it with that log filter and keeps its log.
//!
//! What each sends differs by design (docs/control-plane.md): istiod sends every ztunnel every
//! workload; meshkit sends a node its own workloads and the endpoints of Services, which here
//! are all of them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use meshkit_mesh::proto::workload::{Address, WorkloadStatus, address};
use meshkit_mesh::resources::{ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL};
use meshkit_test_support::apiserver::{ApiServer, Binaries};
use meshkit_test_support::istiod::{CLUSTER_ID, Istiod, NODE_ACCOUNT, SERVER_NAME};
use meshkit_test_support::{KillOnDrop, free_port, workspace_bin};
use prost::Message as _;
use serde_json::json;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The mesh's size, from the environment.
#[derive(Debug, Clone, Copy)]
struct Shape {
    services: usize,
    pods_per_service: usize,
    namespaces: usize,
    clients: usize,
    changes: usize,
}

impl Shape {
    fn from_env() -> Self {
        let get = |name: &str, default: usize| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(default)
        };
        Self {
            services: get("SERVICES", 1000),
            pods_per_service: get("PODS_PER_SERVICE", 2),
            namespaces: get("NAMESPACES", 10),
            clients: get("CLIENTS", 20),
            changes: get("CHANGES", 100),
        }
    }

    fn pods(&self) -> usize {
        self.services * self.pods_per_service
    }

    fn namespace(&self, service: usize) -> String {
        format!("ns-{}", service % self.namespaces)
    }

    /// (namespace, name) of replica `r` of service `s`.
    fn pod(&self, s: usize, r: usize) -> (String, String) {
        (self.namespace(s), format!("svc-{s}-{r}"))
    }

    /// The xDS names a client must hold to have the whole mesh.
    fn expected(&self) -> Vec<String> {
        let mut names = Vec::new();
        for s in 0..self.services {
            let ns = self.namespace(s);
            names.push(format!("{ns}/svc-{s}.{ns}.svc.cluster.local"));
            for r in 0..self.pods_per_service {
                let (ns, name) = self.pod(s, r);
                names.push(format!("{CLUSTER_ID}//Pod/{ns}/{name}"));
            }
        }
        names
    }
}

/// What one client holds: each Address by name (a workload's status; -1 for a service) and the
/// bytes of the responses it received.
#[derive(Debug, Default)]
struct Held {
    addresses: HashMap<String, i32>,
    bytes: u64,
    responses: u64,
}

type Clients = Vec<Arc<Mutex<Held>>>;

/// Creates the mesh's objects, `parallel` requests at a time.
async fn create_mesh(api: &ApiServer, shape: Shape) -> Result<(), Error> {
    let mut documents = Vec::new();
    for n in 0..shape.namespaces {
        documents.push(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": format!("ns-{n}")}}));
    }
    documents.push(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NODE_ACCOUNT.0}}),
    );
    for k in 0..shape.clients {
        documents.push(
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": format!("node-{k}")}}),
        );
    }
    api.apply_documents(&documents, false).await?;
    api.ensure_service_account(NODE_ACCOUNT.0, NODE_ACCOUNT.1)
        .await;
    for n in 0..shape.namespaces {
        api.ensure_service_account(&format!("ns-{n}"), "app").await;
    }

    let services: Vec<serde_json::Value> = (0..shape.services)
        .map(|s| {
            json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": format!("svc-{s}"), "namespace": shape.namespace(s)},
                "spec": {"selector": {"app": format!("svc-{s}")},
                         "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
            })
        })
        .collect();
    let mut pods = Vec::new();
    for s in 0..shape.services {
        for r in 0..shape.pods_per_service {
            let (ns, name) = shape.pod(s, r);
            let j = s * shape.pods_per_service + r;
            let ip = format!(
                "10.{}.{}.{}",
                100 + j / 62_500,
                (j / 250) % 250,
                j % 250 + 1
            );
            pods.push(pod_json(
                &ns,
                &name,
                &format!("node-{}", j % shape.clients),
                "app",
                &ip,
                &format!("svc-{s}"),
                true,
            ));
        }
    }
    for k in 0..shape.clients {
        pods.push(pod_json(
            NODE_ACCOUNT.0,
            &format!("ztunnel-{k}"),
            &format!("node-{k}"),
            NODE_ACCOUNT.1,
            &format!("10.250.0.{}", k + 1),
            "ztunnel",
            false,
        ));
    }
    let started = Instant::now();
    let client = api.client();
    let results: Vec<Result<(), Error>> = futures::stream::iter(services.into_iter().chain(pods))
        .map(|document| {
            let client = client.clone();
            async move { create(&client, document).await }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    results.into_iter().collect::<Result<Vec<()>, Error>>()?;
    eprintln!(
        "created {} Services and {} Pods (+{} node proxy Pods) in {:.1?}",
        shape.services,
        shape.pods(),
        shape.clients,
        started.elapsed()
    );
    Ok(())
}

fn pod_json(
    ns: &str,
    name: &str,
    node: &str,
    account: &str,
    ip: &str,
    app: &str,
    enrolled: bool,
) -> serde_json::Value {
    let annotations = if enrolled {
        json!({"ambient.istio.io/redirection": "enabled"})
    } else {
        json!({})
    };
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": app}, "annotations": annotations},
        "spec": {"nodeName": node, "serviceAccountName": account,
                 "containers": [{"name": "app", "image": "example.invalid/app", "ports": [{"containerPort": 8080}]}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                   "conditions": [{"type": "Ready", "status": "True"}]},
    })
}

/// Creates one Service or Pod, then a Pod's status, as a kubelet would.
async fn create(client: &kube::Client, document: serde_json::Value) -> Result<(), Error> {
    let ns = document["metadata"]["namespace"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let name = document["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if document["kind"] == "Service" {
        let api: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(client.clone(), &ns);
        api.create(&PostParams::default(), &serde_json::from_value(document)?)
            .await?;
        return Ok(());
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let status = json!({"status": document["status"].clone()});
    api.create(&PostParams::default(), &serde_json::from_value(document)?)
        .await?;
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    Ok(())
}

/// Sets the Ready condition of a Pod.
async fn set_ready(api: &Api<Pod>, name: &str, ready: bool) -> Result<(), Error> {
    let status = if ready { "True" } else { "False" };
    let patch = json!({"status": {"conditions": [{"type": "Ready", "status": status}]}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// A control plane under measurement: its process and where its clients dial.
#[derive(Debug, Clone)]
struct Subject {
    name: &'static str,
    pid: u32,
    url: String,
    root_pem: String,
    started: Instant,
}

/// One ztunnel-like client of node `k`: a Delta stream with both wildcards, every response
/// ACKed, what it holds kept in `held`.
async fn run_client(
    subject: &Subject,
    k: usize,
    token: String,
    held: Arc<Mutex<Held>>,
) -> Result<(), Error> {
    let tls = meshkit_xds_client::ControlPlaneTls::from_pem(&subject.root_pem)?
        .with_server_name(SERVER_NAME)?;
    let channel = tls.connect_lazy(&subject.url)?;
    let credentials = meshkit_xds_client::CallCredentials::bearer_token(&token)?;
    let mut client = AggregatedDiscoveryServiceClient::with_interceptor(channel, credentials)
        .max_decoding_message_size(64 << 20);
    let ip = std::net::Ipv4Addr::new(10, 250, 0, u8::try_from(k + 1)?);
    let node: Node = meshkit_mesh::feed::ProxyNode::new(
        format!("node-{k}"),
        format!("ztunnel-{k}"),
        NODE_ACCOUNT.0,
        ip.into(),
    )
    .with_cluster_id(CLUSTER_ID)
    .with_service_account(NODE_ACCOUNT.1)
    .to_node();
    let (requests, rx) = tokio::sync::mpsc::unbounded_channel();
    for (i, type_url) in [ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL]
        .into_iter()
        .enumerate()
    {
        requests.send(DeltaDiscoveryRequest {
            node: (i == 0).then(|| node.clone()),
            type_url: type_url.to_owned(),
            resource_names_subscribe: vec!["*".into()],
            ..Default::default()
        })?;
    }
    let mut stream = client
        .delta_aggregated_resources(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
        .await?
        .into_inner();
    while let Some(response) = stream.message().await? {
        let size = response.encoded_len() as u64;
        if response.type_url == ADDRESS_TYPE_URL {
            let mut decoded = Vec::with_capacity(response.resources.len());
            for r in &response.resources {
                let Some(any) = &r.resource else { continue };
                let status = match Address::decode(any.value.as_slice())?.r#type {
                    Some(address::Type::Workload(w)) => w.status,
                    _ => -1,
                };
                decoded.push((r.name.clone(), status));
            }
            let mut held = held.lock().expect("not poisoned");
            held.addresses.extend(decoded);
            for name in &response.removed_resources {
                held.addresses.remove(name);
            }
            held.bytes += size;
            held.responses += 1;
        } else {
            let mut held = held.lock().expect("not poisoned");
            held.bytes += size;
            held.responses += 1;
        }
        requests.send(DeltaDiscoveryRequest {
            type_url: response.type_url,
            response_nonce: response.nonce,
            ..Default::default()
        })?;
    }
    Err(format!("{}: client {k}'s stream ended", subject.name).into())
}

/// Waits, polling each millisecond, until `done` holds for every client.
async fn until_all(
    clients: &Clients,
    patience: Duration,
    what: &str,
    done: impl Fn(&Held) -> bool,
) -> Result<Duration, Error> {
    let started = Instant::now();
    loop {
        if clients
            .iter()
            .all(|c| done(&c.lock().expect("not poisoned")))
        {
            return Ok(started.elapsed());
        }
        if started.elapsed() > patience {
            let behind = clients
                .iter()
                .filter(|c| !done(&c.lock().expect("not poisoned")))
                .count();
            return Err(format!("{what}: {behind} clients behind after {patience:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn bytes_received(clients: &Clients) -> u64 {
    clients
        .iter()
        .map(|c| c.lock().expect("not poisoned").bytes)
        .sum()
}

/// User + system CPU seconds of process `pid` so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (in parentheses, which may hold spaces): utime is the
    // 14th field of the line, stime the 15th.
    let rest = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // Clock ticks are 100 per second on Linux (USER_HZ).
    (ticks(11) + ticks(12)) / 100.0
}

/// Resident memory of process `pid`, in MiB.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

/// What one control plane measured.
#[derive(Debug, Clone)]
struct Figures {
    rss_idle: f64,
    cpu_to_full: f64,
    wall_to_full: Duration,
    rss_mib: f64,
    bytes_full: u64,
    p50: Duration,
    p99: Duration,
    bytes_per_change: f64,
    cpu_per_change: f64,
}

async fn measure(
    api: &ApiServer,
    shape: Shape,
    subject: &Subject,
    tokens: &[String],
) -> Result<Figures, Error> {
    // What the control plane holds before any client: the cluster's objects and its model.
    let rss_idle = rss_mib(subject.pid);
    let clients: Clients = (0..shape.clients).map(|_| Arc::default()).collect();
    let mut tasks = Vec::new();
    for (k, held) in clients.iter().enumerate() {
        let (held, token) = (held.clone(), tokens[k].clone());
        let subject = subject.clone();
        tasks.push(tokio::spawn(async move {
            if let Err(e) = run_client(&subject, k, token, held).await {
                eprintln!("{}: client {k}: {e}", subject.name);
            }
        }));
    }
    let expected = shape.expected();
    until_all(
        &clients,
        Duration::from_secs(300),
        "the first full push",
        |h| expected.iter().all(|name| h.addresses.contains_key(name)),
    )
    .await?;
    let (cpu_to_full, wall_to_full) = (cpu_seconds(subject.pid), subject.started.elapsed());
    let bytes_full = bytes_received(&clients);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss = rss_mib(subject.pid);
    eprintln!(
        "{}: full push to {} clients after {wall_to_full:.1?} and {cpu_to_full:.2} CPU s; {rss:.0} MiB resident",
        subject.name, shape.clients
    );

    let healthy = WorkloadStatus::Healthy as i32;
    let cpu_before = cpu_seconds(subject.pid);
    let mut latencies = Vec::with_capacity(shape.changes);
    let mut bytes = 0;
    for i in 0..shape.changes {
        let s = i % shape.services;
        let (ns, name) = shape.pod(s, 0);
        let pods: Api<Pod> = Api::namespaced(api.client(), &ns);
        let uid = format!("{CLUSTER_ID}//Pod/{ns}/{name}");
        set_ready(&pods, &name, false).await?;
        until_all(&clients, Duration::from_secs(60), "not Ready", |h| {
            h.addresses.get(&uid) != Some(&healthy)
        })
        .await?;
        let before = bytes_received(&clients);
        set_ready(&pods, &name, true).await?;
        let took = until_all(&clients, Duration::from_secs(60), "Ready", |h| {
            h.addresses.get(&uid) == Some(&healthy)
        })
        .await?;
        latencies.push(took);
        bytes += bytes_received(&clients) - before;
    }
    let cpu_per_change = (cpu_seconds(subject.pid) - cpu_before) / shape.changes.max(1) as f64;
    for task in tasks {
        task.abort();
    }
    latencies.sort();
    let at = |q: f64| {
        latencies[((latencies.len() as f64 * q).ceil() as usize).clamp(1, latencies.len()) - 1]
    };
    Ok(Figures {
        rss_idle,
        cpu_to_full,
        wall_to_full,
        rss_mib: rss,
        bytes_full,
        p50: at(0.50),
        p99: at(0.99),
        bytes_per_change: bytes as f64 / shape.changes.max(1) as f64,
        cpu_per_change,
    })
}

/// meshkit's control plane as a process, watching the API server, over TLS with the same
/// ServiceAccount tokens as istiod's clients.
async fn start_meshkit(
    api: &ApiServer,
    dir: &std::path::Path,
) -> Result<(KillOnDrop, Subject), Error> {
    let (ads, ca, admin) = (free_port(), free_port(), free_port());
    let root = dir.join("meshkit-root.pem");
    let log = std::fs::File::create(dir.join("control-plane.log"))?;
    let started = Instant::now();
    let child = std::process::Command::new(workspace_bin("control-plane"))
        .arg("--kubeconfig")
        .arg(api.kubeconfig())
        .args(["--ads-listen", &format!("127.0.0.1:{ads}")])
        .args(["--ca-listen", &format!("127.0.0.1:{ca}")])
        .args(["--admin-addr", &format!("127.0.0.1:{admin}")])
        .arg("--root-out")
        .arg(&root)
        .arg("--no-status")
        .env(
            "RUST_LOG",
            std::env::var("CONTROL_PLANE_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()?;
    let process = KillOnDrop(child);
    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], admin));
    loop {
        let ready = tokio::task::spawn_blocking(move || {
            std::net::TcpStream::connect_timeout(&admin, Duration::from_millis(200))
                .is_ok()
                .then(|| meshkit_test_support::http_get(admin, "/healthz/ready").0)
        })
        .await?;
        if ready == Some(200) && root.exists() {
            break;
        }
        if started.elapsed() > Duration::from_secs(120) {
            return Err(
                "meshkit's control plane not ready after 120 s (see control-plane.log)".into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let subject = Subject {
        name: "meshkit",
        pid: process.0.id(),
        url: format!("https://127.0.0.1:{ads}"),
        root_pem: std::fs::read_to_string(&root)?,
        started,
    };
    Ok((process, subject))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Error> {
    let shape = Shape::from_env();
    eprintln!("{shape:?}");
    let binaries = Binaries::locate()?;
    let pilot = binaries
        .pilot_discovery
        .clone()
        .ok_or("pilot-discovery is not built: run test-support/kube/build.sh")?;
    let api = ApiServer::start(&binaries).await;
    create_mesh(&api, shape).await?;
    let pods: Api<Pod> = Api::namespaced(api.client(), NODE_ACCOUNT.0);
    let mut tokens = Vec::new();
    for k in 0..shape.clients {
        let pod = pods.get(&format!("ztunnel-{k}")).await?;
        tokens.push(
            api.service_account_token(NODE_ACCOUNT.0, NODE_ACCOUNT.1, &["istio-ca"], Some(&pod))
                .await,
        );
    }
    let dir = std::env::temp_dir().join(format!("meshkit-control-planes-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;

    // MESHKIT_ONLY=1 measures meshkit alone (to profile it); the ratios need both.
    let theirs = if std::env::var_os("MESHKIT_ONLY").is_some() {
        None
    } else {
        let istiod_started = Instant::now();
        let istiod = Istiod::start(&api, &pilot).await;
        let subject = Subject {
            name: "istiod",
            pid: istiod.pid(),
            url: format!("https://{}", istiod.secure_addr()),
            root_pem: istiod.root_pem().to_owned(),
            started: istiod_started,
        };
        Some(measure(&api, shape, &subject, &tokens).await?)
    };

    let (process, subject) = start_meshkit(&api, &dir).await?;
    let ours = measure(&api, shape, &subject, &tokens).await?;
    drop(process);
    if std::env::var_os("CONTROL_PLANE_LOG").is_some() {
        eprintln!(
            "control plane's log: {}",
            dir.join("control-plane.log").display()
        );
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let Some(theirs) = theirs else {
        println!("{ours:#?}");
        return Ok(());
    };

    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "\n{} Services, {} Pods in {} namespaces, {} nodes and ztunnel-like Delta clients, {} changes\n",
        shape.services,
        shape.pods(),
        shape.namespaces,
        shape.clients,
        shape.changes
    );
    println!("| | istiod | meshkit | meshkit / istiod | target |");
    println!("|---|---|---|---|---|");
    let row = |what: &str, a: f64, b: f64, unit: &str, target: Option<f64>| {
        let ratio = b / a;
        let verdict = target.map_or(String::new(), |t| {
            format!("≤ {t} {}", if ratio <= t { "(met)" } else { "(missed)" })
        });
        println!("| {what} | {a:.2} {unit} | {b:.2} {unit} | {ratio:.3} | {verdict} |");
    };
    row(
        "resident memory after sync",
        theirs.rss_mib,
        ours.rss_mib,
        "MiB",
        Some(0.25),
    );
    row(
        "resident memory before any client",
        theirs.rss_idle,
        ours.rss_idle,
        "MiB",
        None,
    );
    row(
        "CPU to the first full push",
        theirs.cpu_to_full,
        ours.cpu_to_full,
        "s",
        None,
    );
    row(
        "wall time to the first full push",
        theirs.wall_to_full.as_secs_f64(),
        ours.wall_to_full.as_secs_f64(),
        "s",
        None,
    );
    row(
        "bytes of the first full push (all clients)",
        theirs.bytes_full as f64 / 1e6,
        ours.bytes_full as f64 / 1e6,
        "MB",
        None,
    );
    row(
        "Ready to every client, p50",
        ms(theirs.p50),
        ms(ours.p50),
        "ms",
        None,
    );
    row(
        "Ready to every client, p99",
        ms(theirs.p99),
        ms(ours.p99),
        "ms",
        Some(0.5),
    );
    row(
        "bytes pushed per change (all clients)",
        theirs.bytes_per_change / 1e3,
        ours.bytes_per_change / 1e3,
        "kB",
        None,
    );
    row(
        "CPU per change",
        theirs.cpu_per_change * 1000.0,
        ours.cpu_per_change * 1000.0,
        "ms",
        Some(0.5),
    );
    Ok(())
}
