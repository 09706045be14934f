//! The workloads and services of the mesh, derived from a [`ManifestSet`] as istiod's ambient
//! index derives them (istio/istio `pilot/pkg/serviceregistry/ambient/`), whichever source the
//! set came from: the manifests folder or the Kubernetes API.
//!
//! | object | becomes |
//! |---|---|
//! | Pod with an IP, not `Succeeded` or `Failed` | a Workload, uid `CLUSTER//Pod/NS/NAME` ([`pod_workload`]) |
//! | Service, except `ExternalName` | a Service `NAME.NS.svc.SUFFIX` with its cluster IPs ([`kube_service`]) |
//! | EndpointSlice endpoint without a Pod `targetRef`, of a known Service | a Workload, uid `CLUSTER/discovery.k8s.io/EndpointSlice/NS/SLICE/IP` |
//! | ServiceEntry | a Service per its first host |
//! | WorkloadEntry | a Workload, uid `CLUSTER/networking.istio.io/WorkloadEntry/NS/NAME` |
//!
//! docs/control-plane.md has the whole table, row by row beside istiod's behaviour, and where
//! meshkit differs, why.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Pod, Service as KubeService};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use meshkit_mesh::proto::workload;

use crate::manifests::{ManifestSet, ServiceEntry, ServicePort, WorkloadEntry};
use crate::translate::TranslateOptions;

/// The annotation the CNI writes on a Pod whose traffic it redirects; `enabled` enrols the
/// Pod for HBONE.
pub const REDIRECTION_ANNOTATION: &str = "ambient.istio.io/redirection";

/// The label a Pod that speaks HBONE itself carries (a comma-separated list containing
/// `http`).
pub const TUNNEL_LABEL: &str = "networking.istio.io/tunnel";

/// The label of the system namespace that names the local network.
pub const NETWORK_LABEL: &str = "topology.istio.io/network";

/// The label of an EndpointSlice that names its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// A workload to serve, with what policy selection and the CA need beside the resource.
#[derive(Debug, Clone, PartialEq)]
pub struct MeshWorkload {
    /// The workload API resource, without its `authorization_policies` (the policy
    /// translation adds them).
    pub workload: workload::Workload,
    /// Its labels, which policies select on.
    pub labels: BTreeMap<String, String>,
    /// Whether policies select it: not an EndpointSlice's endpoint, which istiod gives no
    /// policies (nothing says which workload it is).
    pub selectable: bool,
}

// === impl MeshWorkload ===

impl MeshWorkload {
    /// Whether every label of `labels` is on this workload (true for none: a policy's empty
    /// `matchLabels` selects every workload of its namespace).
    pub fn has_labels(&self, labels: &BTreeMap<String, String>) -> bool {
        labels.iter().all(|(k, v)| self.labels.get(k) == Some(v))
    }
}

/// Everything [`derive()`] finds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Derived {
    /// The services, in `namespace/hostname` order.
    pub services: Vec<workload::Service>,
    /// The workloads, in uid order.
    pub workloads: Vec<MeshWorkload>,
}

/// Derives the workloads and services of `set`.
pub fn derive(set: &ManifestSet, options: &TranslateOptions) -> Derived {
    let network = local_network(set, options);
    let mut derived = Derived::default();
    for service in &set.services {
        if let Some(service) = kube_service(service, options, &network) {
            derived.services.push(service);
        }
    }
    for se in &set.service_entries {
        if let Some(mut service) = service_entry_service(se, &network) {
            // One service of a host name is canonical, as istiod marks it: a Kubernetes
            // Service's, else the first ServiceEntry's (the entries are in namespace and name
            // order).
            service.canonical = !derived
                .services
                .iter()
                .any(|s| s.hostname == service.hostname);
            derived.services.push(service);
        }
    }
    for pod in &set.pods {
        if let Some(workload) = pod_workload(pod, set, options, &network) {
            derived.workloads.push(workload);
        }
    }
    for slice in &set.endpoint_slices {
        derived
            .workloads
            .extend(endpoint_slice_workloads(slice, set, options, &network));
    }
    for we in &set.workload_entries {
        derived
            .workloads
            .push(workload_entry_workload(we, set, options, &network));
    }
    // One service per `namespace/hostname`, a Kubernetes Service before a ServiceEntry of
    // the same name (istiod's rule; the sort is stable and they were pushed first).
    derived
        .services
        .sort_by(|a, b| (&a.namespace, &a.hostname).cmp(&(&b.namespace, &b.hostname)));
    derived.services.dedup_by(|later, first| {
        later.namespace == first.namespace && later.hostname == first.hostname
    });
    derived
        .workloads
        .sort_by(|a, b| a.workload.uid.cmp(&b.workload.uid));
    derived
}

/// The local network: the [`NETWORK_LABEL`] of the system namespace (the root namespace
/// here), or empty.
pub(crate) fn local_network(set: &ManifestSet, options: &TranslateOptions) -> String {
    set.namespaces
        .iter()
        .find(|ns| ns.metadata.name.as_deref() == Some(options.root_namespace.as_str()))
        .and_then(|ns| ns.metadata.labels.as_ref()?.get(NETWORK_LABEL).cloned())
        .unwrap_or_default()
}

/// `NAME.NAMESPACE.svc.SUFFIX`.
pub fn service_hostname(name: &str, namespace: &str, options: &TranslateOptions) -> String {
    format!("{name}.{namespace}.svc.{}", options.domain_suffix)
}

fn key(namespace: &str, hostname: &str) -> String {
    format!("{namespace}/{hostname}")
}

pub(crate) fn ip_bytes(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

// === Kubernetes Services ===

/// A Service as istiod serves it: `None` for `ExternalName` and for a cluster IP that does
/// not parse; headless and selectorless Services are kept (headless without addresses).
pub fn kube_service(
    service: &KubeService,
    options: &TranslateOptions,
    network: &str,
) -> Option<workload::Service> {
    let spec = service.spec.as_ref()?;
    if spec.type_.as_deref() == Some("ExternalName") {
        return None;
    }
    let name = service.metadata.name.clone()?;
    let namespace = service.metadata.namespace.clone().unwrap_or_default();
    let ips = match spec.cluster_ips.as_deref() {
        Some(ips) if !ips.is_empty() => ips.to_vec(),
        _ => spec.cluster_ip.iter().cloned().collect(),
    };
    // A cluster IP that does not parse leaves the whole Service out, as istiod does.
    let addresses = ips
        .iter()
        .filter(|ip| !ip.is_empty() && ip.as_str() != "None")
        .map(|ip| {
            let ip = ip.parse::<IpAddr>().ok()?;
            Some(workload::NetworkAddress {
                network: network.to_owned(),
                address: ip_bytes(ip),
                length: None,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    let ports = spec
        .ports
        .iter()
        .flatten()
        .map(|port| workload::Port {
            service_port: u32::try_from(port.port).unwrap_or(0),
            target_port: match &port.target_port {
                Some(IntOrString::Int(n)) => u32::try_from(*n).unwrap_or(0),
                // A name is resolved per Pod; no target port means the service port.
                Some(IntOrString::String(_)) => 0,
                None => u32::try_from(port.port).unwrap_or(0),
            },
            app_protocol: kube_app_protocol(port) as i32,
        })
        .collect();
    let ip_families = match spec.ip_families.as_deref().unwrap_or_default() {
        [_, _] => workload::IpFamilies::Dual,
        [one] if one == "IPv4" => workload::IpFamilies::Ipv4Only,
        [one] if one == "IPv6" => workload::IpFamilies::Ipv6Only,
        _ => workload::IpFamilies::Automatic,
    };
    let mut load_balancing = None;
    if spec.internal_traffic_policy.as_deref() == Some("Local") {
        load_balancing = Some(workload::LoadBalancing {
            routing_preference: vec![workload::load_balancing::Scope::Node as i32],
            mode: workload::load_balancing::Mode::Strict as i32,
            health_policy: 0,
        });
    }
    if spec.publish_not_ready_addresses == Some(true) {
        load_balancing
            .get_or_insert_with(Default::default)
            .health_policy = workload::load_balancing::HealthPolicy::AllowAll as i32;
    }
    Some(workload::Service {
        hostname: service_hostname(&name, &namespace, options),
        name,
        namespace,
        addresses,
        ports,
        ip_families: ip_families as i32,
        load_balancing,
        canonical: true,
        ..Default::default()
    })
}

/// istiod's protocol of a Service port: UDP is unknown; otherwise the `appProtocol` (with
/// Kubernetes' `kubernetes.io/h2c`, `ws` and `wss`), else the port name, read up to its first
/// `-` (`grpc-web` whole); a name Istio does not know is TCP on ports 25, 53, 3306 and 27017.
fn kube_app_protocol(port: &k8s_openapi::api::core::v1::ServicePort) -> workload::AppProtocol {
    use workload::AppProtocol as P;
    if port.protocol.as_deref() == Some("UDP") {
        return P::Unknown;
    }
    let name = match port.app_protocol.as_deref() {
        Some("kubernetes.io/h2c") => return P::Http2,
        Some("kubernetes.io/ws") => return P::Http11,
        Some("kubernetes.io/wss") => return P::Tls,
        Some(app) => app,
        None => port.name.as_deref().unwrap_or_default(),
    };
    if name
        .get(..8)
        .is_some_and(|p| p.eq_ignore_ascii_case("grpc-web"))
    {
        return P::Unknown;
    }
    let prefix = name
        .split('-')
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    match prefix.as_str() {
        "http" => P::Http11,
        "http2" => P::Http2,
        "grpc" => P::Grpc,
        "https" | "tls" => P::Tls,
        "tcp" => P::Tcp,
        // Known to Istio, without a workload API protocol of their own.
        "udp" | "http_proxy" | "mongo" | "redis" | "mysql" => P::Unknown,
        _ if matches!(port.port, 25 | 53 | 3306 | 27017) => P::Tcp,
        _ => P::Unknown,
    }
}

/// The workload API's protocol for an Istio protocol name (case-insensitive).
pub(crate) fn app_protocol(protocol: &str) -> workload::AppProtocol {
    match protocol.to_ascii_uppercase().as_str() {
        "HTTP" => workload::AppProtocol::Http11,
        "HTTP2" => workload::AppProtocol::Http2,
        "GRPC" => workload::AppProtocol::Grpc,
        "TCP" => workload::AppProtocol::Tcp,
        "TLS" | "HTTPS" => workload::AppProtocol::Tls,
        _ => workload::AppProtocol::Unknown,
    }
}

// === Pods ===

/// A Pod as istiod serves it: `None` when it is `Succeeded` or `Failed`, has no IP, or has an
/// IP that does not parse.
pub fn pod_workload(
    pod: &Pod,
    set: &ManifestSet,
    options: &TranslateOptions,
    network: &str,
) -> Option<MeshWorkload> {
    let status = pod.status.as_ref()?;
    if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
        return None;
    }
    let ips: Vec<String> = match status.pod_ips.as_deref() {
        Some(ips) if !ips.is_empty() => ips.iter().map(|ip| ip.ip.clone()).collect(),
        _ => status.pod_ip.iter().cloned().collect(),
    };
    if ips.is_empty() {
        return None;
    }
    let addresses = ips
        .iter()
        .map(|ip| ip.parse::<IpAddr>().ok().map(ip_bytes))
        .collect::<Option<Vec<_>>>()?;
    let meta = &pod.metadata;
    let name = meta.name.clone()?;
    let namespace = meta.namespace.clone().unwrap_or_default();
    let labels: BTreeMap<String, String> = meta.labels.clone().unwrap_or_default();
    let annotations = meta.annotations.clone().unwrap_or_default();
    let spec = pod.spec.as_ref();
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let healthy = ready && meta.deletion_timestamp.is_none();
    let node = spec.and_then(|s| s.node_name.clone()).unwrap_or_default();
    let workload_name = pod_workload_name(pod, &name, &labels);
    let (tunnel_protocol, native_tunnel) = tunnel(&labels, &annotations);
    let workload = workload::Workload {
        uid: format!("{}//Pod/{namespace}/{name}", options.cluster_id),
        name: name.clone(),
        namespace: namespace.clone(),
        addresses,
        network: network.to_owned(),
        tunnel_protocol: tunnel_protocol as i32,
        native_tunnel,
        trust_domain: wire_trust_domain(&options.trust_domain),
        service_account: spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        locality: node_locality(set, &node),
        node,
        canonical_name: canonical(&labels, CANONICAL_NAME_LABELS, &workload_name),
        canonical_revision: canonical(&labels, CANONICAL_REVISION_LABELS, "latest"),
        workload_type: workload::WorkloadType::Pod as i32,
        workload_name,
        services: pod_services(pod, &namespace, &labels, set, options),
        status: if healthy {
            workload::WorkloadStatus::Healthy
        } else {
            workload::WorkloadStatus::Unhealthy
        } as i32,
        cluster_id: options.cluster_id.clone(),
        network_mode: if spec.and_then(|s| s.host_network) == Some(true) {
            workload::NetworkMode::HostNetwork
        } else {
            workload::NetworkMode::Standard
        } as i32,
        ..Default::default()
    };
    Some(MeshWorkload {
        workload,
        labels,
        selectable: true,
    })
}

/// HBONE when the CNI's annotation says `enabled` (a Pod it redirects), or the Pod speaks
/// HBONE itself ([`TUNNEL_LABEL`], which also marks the tunnel native).
fn tunnel(
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> (workload::TunnelProtocol, bool) {
    if labels
        .get(TUNNEL_LABEL)
        .is_some_and(|v| v.split(',').any(|p| p.trim() == "http"))
    {
        return (workload::TunnelProtocol::Hbone, true);
    }
    if annotations.get(REDIRECTION_ANNOTATION).map(String::as_str) == Some("enabled") {
        return (workload::TunnelProtocol::Hbone, false);
    }
    (workload::TunnelProtocol::None, false)
}

const CANONICAL_NAME_LABELS: &[&str] = &[
    "service.istio.io/canonical-name",
    "app.kubernetes.io/name",
    "app",
];
const CANONICAL_REVISION_LABELS: &[&str] = &[
    "service.istio.io/canonical-revision",
    "app.kubernetes.io/version",
    "version",
];

/// The first of `keys` present in `labels` (even with an empty value), else `fallback`.
fn canonical(labels: &BTreeMap<String, String>, keys: &[&str], fallback: &str) -> String {
    keys.iter()
        .find_map(|k| labels.get(*k))
        .cloned()
        .unwrap_or_else(|| fallback.to_owned())
}

/// The name of what runs the Pod: the `service.istio.io/workload-name` label; else, for a
/// generated Pod, its controller (a ReplicaSet named after its Deployment and
/// `pod-template-hash`, a Job named after its CronJob and a schedule time); else the Pod's
/// name.
fn pod_workload_name(pod: &Pod, name: &str, labels: &BTreeMap<String, String>) -> String {
    if let Some(named) = labels.get("service.istio.io/workload-name") {
        return named.clone();
    }
    let meta = &pod.metadata;
    let generated = meta.generate_name.as_deref().is_some_and(|g| !g.is_empty());
    let controller = meta
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true));
    let derived = match (generated, controller) {
        (true, Some(owner)) => match owner.kind.as_str() {
            "ReplicaSet" => ["pod-template-hash", "rollouts-pod-template-hash"]
                .iter()
                .find_map(|label| {
                    let hash = labels.get(*label)?;
                    owner.name.strip_suffix(&format!("-{hash}"))
                })
                .unwrap_or(&owner.name)
                .to_owned(),
            "ReplicationController" => labels
                .get("deploymentconfig")
                .cloned()
                .unwrap_or_else(|| owner.name.clone()),
            "Job" => cron_job_name(&owner.name).to_owned(),
            _ => owner.name.clone(),
        },
        _ => String::new(),
    };
    if derived.is_empty() {
        name.to_owned()
    } else {
        derived
    }
}

/// A Job made by a CronJob is named `CRONJOB-TIME`, TIME 8 to 10 digits.
fn cron_job_name(job: &str) -> &str {
    match job.rsplit_once('-') {
        Some((prefix, digits))
            if !prefix.is_empty()
                && (8..=10).contains(&digits.len())
                && digits.bytes().all(|b| b.is_ascii_digit()) =>
        {
            prefix
        }
        _ => job,
    }
}

/// The locality of the Node `node` from its topology labels; `None` when it has none.
fn node_locality(set: &ManifestSet, node: &str) -> Option<workload::Locality> {
    let labels = set
        .nodes
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(node))?
        .metadata
        .labels
        .as_ref()?;
    let get = |k: &str| labels.get(k).cloned().unwrap_or_default();
    let locality = workload::Locality {
        region: get("topology.kubernetes.io/region"),
        zone: get("topology.kubernetes.io/zone"),
        subzone: get("topology.istio.io/subzone"),
    };
    (locality != workload::Locality::default()).then_some(locality)
}

/// The services of the Pod's namespace that select it (a non-empty selector, all of whose
/// labels the Pod has), and those whose EndpointSlices name it (a selectorless Service's
/// manual slice, say); each
/// with its ports, a named target port resolved against the Pod's TCP container ports (a
/// port whose name the Pod lacks is left out).
fn pod_services(
    pod: &Pod,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    set: &ManifestSet,
    options: &TranslateOptions,
) -> BTreeMap<String, workload::PortList> {
    let mut services = BTreeMap::new();
    for service in set
        .services
        .iter()
        .filter(|s| s.metadata.namespace.as_deref() == Some(namespace))
    {
        let Some(spec) = service.spec.as_ref() else {
            continue;
        };
        if spec.type_.as_deref() == Some("ExternalName") {
            continue;
        }
        let selected = spec.selector.as_ref().is_some_and(|selector| {
            !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
        });
        let named_by_slice = !selected && slices_name_pod(set, service, pod);
        if !(selected || named_by_slice) {
            continue;
        }
        let Some(name) = service.metadata.name.as_deref() else {
            continue;
        };
        let ports = port_list(spec, |port| match &port.target_port {
            Some(IntOrString::Int(n)) => u32::try_from(*n).ok(),
            Some(IntOrString::String(named)) => container_port(pod, named),
            None => u32::try_from(port.port).ok(),
        });
        services.insert(
            key(namespace, &service_hostname(name, namespace, options)),
            ports,
        );
    }
    for se in set
        .service_entries
        .iter()
        .filter(|se| se.namespace == namespace && !se.workload_selector.is_empty())
        .filter(|se| {
            se.workload_selector
                .iter()
                .all(|(k, v)| labels.get(k) == Some(v))
        })
    {
        let Some(hostname) = se.hosts.first() else {
            continue;
        };
        let ports = se
            .ports
            .iter()
            .map(|p| workload::Port {
                service_port: u32::from(p.number),
                target_port: container_port(pod, &p.name)
                    .unwrap_or_else(|| u32::from(p.target_port.unwrap_or(p.number))),
                app_protocol: 0,
            })
            .collect();
        services.insert(key(namespace, hostname), workload::PortList { ports });
    }
    services
}

/// A workload's ports of a Service: each port's target from `target`; a port it gives no
/// target for is left out.
fn port_list(
    spec: &k8s_openapi::api::core::v1::ServiceSpec,
    target: impl Fn(&k8s_openapi::api::core::v1::ServicePort) -> Option<u32>,
) -> workload::PortList {
    let ports = spec
        .ports
        .iter()
        .flatten()
        .filter_map(|port| {
            Some(workload::Port {
                service_port: u32::try_from(port.port).ok()?,
                target_port: target(port)?,
                app_protocol: 0,
            })
        })
        .collect();
    workload::PortList { ports }
}

/// Whether an EndpointSlice of `service` has an endpoint whose `targetRef` is `pod` (by
/// namespace, name and uid).
fn slices_name_pod(set: &ManifestSet, service: &KubeService, pod: &Pod) -> bool {
    let namespace = service.metadata.namespace.as_deref();
    set.endpoint_slices
        .iter()
        .filter(|s| s.metadata.namespace.as_deref() == namespace)
        .filter(|s| slice_service(s) == service.metadata.name.as_deref())
        .filter(|s| s.address_type != "FQDN")
        .flat_map(|s| s.endpoints.iter().flatten())
        .filter_map(|e| e.target_ref.as_ref())
        .any(|r| {
            r.kind.as_deref() == Some("Pod")
                && r.namespace == pod.metadata.namespace
                && r.name == pod.metadata.name
                && r.uid == pod.metadata.uid
        })
}

fn slice_service(slice: &EndpointSlice) -> Option<&str> {
    slice
        .metadata
        .labels
        .as_ref()?
        .get(SERVICE_NAME_LABEL)
        .map(String::as_str)
}

/// Leaves of a Pod, as JSON, what the model reads of it ([`pod_workload`],
/// [`container_port`]): all of its metadata; of its spec the node, ServiceAccount and host
/// network, and the named TCP ports of its containers and of the init containers that keep
/// running (containers with none are dropped); of its status the phase, the IPs and each
/// condition's type and status. The rest (images, environment, volumes, probes, container
/// states) is dropped as a Pod is read: the store and the model hold every Pod of the
/// cluster, and a change to what is dropped is then no change at all.
pub(crate) fn trim_pod(pod: &mut serde_json::Value) {
    use serde_json::Value;
    let Value::Object(pod) = pod else {
        return;
    };
    if let Some(Value::Object(spec)) = pod.get_mut("spec") {
        spec.retain(|field, _| {
            matches!(
                field.as_str(),
                "nodeName" | "serviceAccountName" | "hostNetwork" | "containers" | "initContainers"
            )
        });
        for (field, sidecars_only) in [("containers", false), ("initContainers", true)] {
            if let Some(Value::Array(containers)) = spec.get_mut(field) {
                containers.retain_mut(|c| trim_container(c, sidecars_only));
            }
        }
    }
    if let Some(Value::Object(status)) = pod.get_mut("status") {
        status.retain(|field, _| {
            matches!(field.as_str(), "phase" | "podIP" | "podIPs" | "conditions")
        });
        if let Some(Value::Array(conditions)) = status.get_mut("conditions") {
            for condition in conditions.iter_mut().filter_map(Value::as_object_mut) {
                condition.retain(|field, _| field == "type" || field == "status");
            }
        }
    }
}

/// A container as [`container_port`] reads it: its name and named TCP ports (and, for an
/// init container, that it keeps running); `false` when it has nothing to read.
fn trim_container(container: &mut serde_json::Value, sidecars_only: bool) -> bool {
    use serde_json::Value;
    let Value::Object(container) = container else {
        return false;
    };
    if sidecars_only && container.get("restartPolicy").and_then(Value::as_str) != Some("Always") {
        return false;
    }
    container.retain(|field, _| matches!(field.as_str(), "name" | "ports" | "restartPolicy"));
    let Some(Value::Array(ports)) = container.get_mut("ports") else {
        return false;
    };
    ports.retain_mut(|port| {
        let Value::Object(port) = port else {
            return false;
        };
        let named = port
            .get("name")
            .and_then(Value::as_str)
            .is_some_and(|n| !n.is_empty());
        let tcp = port
            .get("protocol")
            .is_none_or(|p| p.as_str() == Some("TCP"));
        port.retain(|field, _| matches!(field.as_str(), "name" | "containerPort" | "protocol"));
        named && tcp
    });
    !ports.is_empty()
}

/// The number of the Pod's TCP container port named `name` (native sidecars, init
/// containers that keep running, count too).
fn container_port(pod: &Pod, name: &str) -> Option<u32> {
    let spec = pod.spec.as_ref()?;
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"));
    spec.containers
        .iter()
        .chain(sidecars)
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| {
            p.name.as_deref() == Some(name) && p.protocol.as_deref().unwrap_or("TCP") == "TCP"
        })
        .and_then(|p| u32::try_from(p.container_port).ok())
}

// === EndpointSlices ===

/// The endpoints of a Service's slice that no Pod backs, each a workload: a selectorless
/// Service's manual endpoints.
fn endpoint_slice_workloads(
    slice: &EndpointSlice,
    set: &ManifestSet,
    options: &TranslateOptions,
    network: &str,
) -> Vec<MeshWorkload> {
    let Some(service_name) = slice_service(slice) else {
        return Vec::new();
    };
    if slice.address_type == "FQDN" {
        return Vec::new();
    }
    let namespace = slice.metadata.namespace.clone().unwrap_or_default();
    let Some(slice_name) = slice.metadata.name.clone() else {
        return Vec::new();
    };
    let Some(service) = set.services.iter().find(|s| {
        s.metadata.namespace.as_deref() == Some(namespace.as_str())
            && s.metadata.name.as_deref() == Some(service_name)
            && s.spec
                .as_ref()
                .is_some_and(|spec| spec.type_.as_deref() != Some("ExternalName"))
    }) else {
        return Vec::new();
    };
    let service_ports: Vec<_> = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default();
    let ports: Vec<workload::Port> = slice
        .ports
        .iter()
        .flatten()
        .filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP")
        .filter_map(|p| {
            let name = p.name.as_deref()?;
            let target = u32::try_from(p.port?).ok()?;
            let service_port = service_ports
                .iter()
                .find(|sp| sp.name.as_deref().unwrap_or_default() == name)?;
            Some(workload::Port {
                service_port: u32::try_from(service_port.port).ok()?,
                target_port: target,
                app_protocol: 0,
            })
        })
        .collect();
    let hostname = service_hostname(service_name, &namespace, options);
    let mut seen = std::collections::HashSet::new();
    let mut workloads = Vec::new();
    for endpoint in slice.endpoints.iter().flatten() {
        if endpoint
            .target_ref
            .as_ref()
            .is_some_and(|r| r.kind.as_deref() == Some("Pod"))
        {
            continue;
        }
        let Some(first) = endpoint.addresses.first() else {
            continue;
        };
        if !seen.insert(first.clone()) {
            continue;
        }
        let Some(addresses) = endpoint
            .addresses
            .iter()
            .map(|a| a.parse::<IpAddr>().ok().map(ip_bytes))
            .collect::<Option<Vec<_>>>()
        else {
            continue;
        };
        let ready = endpoint
            .conditions
            .as_ref()
            .and_then(|c| c.ready)
            .unwrap_or(true);
        let workload = workload::Workload {
            uid: format!(
                "{}/discovery.k8s.io/EndpointSlice/{namespace}/{slice_name}/{first}",
                options.cluster_id
            ),
            name: slice_name.clone(),
            namespace: namespace.clone(),
            addresses,
            network: network.to_owned(),
            trust_domain: wire_trust_domain(&options.trust_domain),
            services: BTreeMap::from([(
                key(&namespace, &hostname),
                workload::PortList {
                    ports: ports.clone(),
                },
            )]),
            status: if ready {
                workload::WorkloadStatus::Healthy
            } else {
                workload::WorkloadStatus::Unhealthy
            } as i32,
            cluster_id: options.cluster_id.clone(),
            network_mode: workload::NetworkMode::HostNetwork as i32,
            ..Default::default()
        };
        workloads.push(MeshWorkload {
            workload,
            labels: BTreeMap::new(),
            selectable: false,
        });
    }
    workloads
}

// === Istio's ServiceEntry and WorkloadEntry ===

/// A ServiceEntry's service, named by its first host, its addresses on the local network.
fn service_entry_service(se: &ServiceEntry, network: &str) -> Option<workload::Service> {
    let hostname = se.hosts.first()?;
    Some(workload::Service {
        name: se.name.clone(),
        namespace: se.namespace.clone(),
        hostname: hostname.clone(),
        addresses: se
            .addresses
            .iter()
            .map(|ip| workload::NetworkAddress {
                network: network.to_owned(),
                address: ip_bytes(*ip),
                length: None,
            })
            .collect(),
        ports: se
            .ports
            .iter()
            .map(|p| workload::Port {
                service_port: u32::from(p.number),
                target_port: u32::from(p.target_port.unwrap_or(0)),
                app_protocol: app_protocol(&p.protocol) as i32,
            })
            .collect(),
        ..Default::default()
    })
}

/// A WorkloadEntry's workload; on its own network, else the local one.
fn workload_entry_workload(
    we: &WorkloadEntry,
    set: &ManifestSet,
    options: &TranslateOptions,
    network: &str,
) -> MeshWorkload {
    let uid = format!(
        "{}/networking.istio.io/WorkloadEntry/{}/{}",
        options.cluster_id, we.namespace, we.name
    );
    let mut services: BTreeMap<String, workload::PortList> = set
        .service_entries
        .iter()
        .filter(|se| se.namespace == we.namespace && we.matches(&se.workload_selector))
        .filter_map(|se| {
            let hostname = se.hosts.first()?;
            let ports = se
                .ports
                .iter()
                .map(|p| workload::Port {
                    service_port: u32::from(p.number),
                    target_port: u32::from(target_port(p, &we.ports)),
                    // istiod leaves a workload's ports without their protocol: the
                    // service's ports carry it.
                    app_protocol: 0,
                })
                .collect();
            Some((key(&se.namespace, hostname), workload::PortList { ports }))
        })
        .collect();
    // Kubernetes Services select WorkloadEntries too: a named target port is the entry's
    // port of that name (left out without one); a number, the entry's port named as the
    // service port, else the number.
    for service in set
        .services
        .iter()
        .filter(|s| s.metadata.namespace.as_deref() == Some(we.namespace.as_str()))
    {
        let (Some(spec), Some(name)) = (service.spec.as_ref(), service.metadata.name.as_deref())
        else {
            continue;
        };
        let selector = spec.selector.clone().unwrap_or_default();
        if spec.type_.as_deref() == Some("ExternalName") || !we.matches(&selector) {
            continue;
        }
        let by_name = |n: &str| we.ports.get(n).map(|p| u32::from(*p));
        let ports = port_list(spec, |port| match &port.target_port {
            Some(IntOrString::String(named)) => by_name(named),
            Some(IntOrString::Int(n)) => port
                .name
                .as_deref()
                .and_then(by_name)
                .or_else(|| u32::try_from(*n).ok()),
            None => port
                .name
                .as_deref()
                .and_then(by_name)
                .or_else(|| u32::try_from(port.port).ok()),
        });
        services.insert(
            key(
                &we.namespace,
                &service_hostname(name, &we.namespace, options),
            ),
            ports,
        );
    }
    let workload = workload::Workload {
        uid,
        name: we.name.clone(),
        namespace: we.namespace.clone(),
        addresses: vec![ip_bytes(we.address)],
        network: if we.network.is_empty() {
            network.to_owned()
        } else {
            we.network.clone()
        },
        tunnel_protocol: workload::TunnelProtocol::Hbone as i32,
        trust_domain: wire_trust_domain(&options.trust_domain),
        service_account: we.service_account.clone(),
        node: we.node.clone().unwrap_or_default(),
        canonical_name: we
            .labels
            .get("app")
            .cloned()
            .unwrap_or_else(|| we.name.clone()),
        canonical_revision: we
            .labels
            .get("version")
            .cloned()
            .unwrap_or_else(|| "latest".to_owned()),
        workload_name: we.name.clone(),
        // As istiod has it: an entry stands in for a Pod.
        workload_type: workload::WorkloadType::Pod as i32,
        services,
        status: workload::WorkloadStatus::Healthy as i32,
        cluster_id: options.cluster_id.clone(),
        ..Default::default()
    };
    MeshWorkload {
        workload,
        labels: we.labels.clone(),
        selectable: true,
    }
}

/// A WorkloadEntry's port for a ServiceEntry port: its override by port name, else the
/// `targetPort`, else the service port.
pub(crate) fn target_port(port: &ServicePort, overrides: &BTreeMap<String, u16>) -> u16 {
    overrides
        .get(&port.name)
        .copied()
        .or(port.target_port)
        .unwrap_or(port.number)
}

/// The trust domain as a workload carries it: empty for the default `cluster.local`, as istiod
/// sends it (clients read an empty one as the default).
fn wire_trust_domain(trust_domain: &str) -> String {
    if trust_domain == "cluster.local" {
        String::new()
    } else {
        trust_domain.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set_of(objects: &[serde_json::Value]) -> ManifestSet {
        let mut set = ManifestSet::default();
        for object in objects {
            let errors = set.add_object("test", object.clone());
            assert!(errors.is_empty(), "{errors:?}");
        }
        set
    }

    #[test]
    fn a_pod_trimmed_is_read_as_it_was_whole() {
        use serde_json::json;
        let whole = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-0", "namespace": "shop", "uid": "u1",
                "labels": {"app": "web"}, "generateName": "web-",
                "annotations": {"ambient.istio.io/redirection": "enabled"}},
            "spec": {"nodeName": "n1", "serviceAccountName": "web", "hostNetwork": false,
                "restartPolicy": "Always", "volumes": [{"name": "data", "emptyDir": {}}],
                "containers": [
                    {"name": "app", "image": "app:1", "env": [{"name": "A", "value": "b"}],
                     "ports": [{"name": "http", "containerPort": 8080},
                               {"containerPort": 9090},
                               {"name": "dns", "containerPort": 53, "protocol": "UDP"}]},
                    {"name": "log", "image": "log:1"}],
                "initContainers": [
                    {"name": "proxy", "restartPolicy": "Always",
                     "ports": [{"name": "admin", "containerPort": 15000, "protocol": "TCP"}]},
                    {"name": "setup", "ports": [{"name": "setup", "containerPort": 1}]}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}],
                "hostIP": "192.168.0.1",
                "conditions": [{"type": "Ready", "status": "True",
                                "lastTransitionTime": "2026-01-01T00:00:00Z"}],
                "containerStatuses": [{"name": "app", "ready": true, "restartCount": 3,
                                       "image": "app:1", "imageID": "x"}]}});
        let mut trimmed = whole.clone();
        trim_pod(&mut trimmed);
        assert_eq!(
            trimmed,
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": whole["metadata"],
                "spec": {"nodeName": "n1", "serviceAccountName": "web", "hostNetwork": false,
                    "containers": [{"name": "app", "ports": [{"name": "http", "containerPort": 8080}]}],
                    "initContainers": [{"name": "proxy", "restartPolicy": "Always",
                        "ports": [{"name": "admin", "containerPort": 15000, "protocol": "TCP"}]}]},
                "status": {"phase": "Running", "podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}],
                    "conditions": [{"type": "Ready", "status": "True"}]}})
        );
        let pod =
            |v: &serde_json::Value| -> Pod { serde_json::from_value(v.clone()).expect("a Pod") };
        let (whole, trimmed) = (pod(&whole), pod(&trimmed));
        for port in ["http", "dns", "admin", "setup", "none"] {
            assert_eq!(
                container_port(&whole, port),
                container_port(&trimmed, port),
                "{port}"
            );
        }
        let set = ManifestSet::default();
        let options = TranslateOptions::default();
        let read = |p: &Pod| pod_workload(p, &set, &options, "").map(|w| w.workload);
        assert_eq!(read(&whole), read(&trimmed));
        assert!(read(&whole).is_some());
    }

    #[test]
    fn kubernetes_services_select_workload_entries_with_their_port_names() {
        use serde_json::json;
        let set = set_of(&[
            json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "db", "namespace": "shop"},
                "spec": {"selector": {"app": "db"}, "ports": [
                    {"name": "sql", "port": 5432, "targetPort": "pg"},
                    {"name": "admin", "port": 8080, "targetPort": 8081},
                    {"name": "metrics", "port": 9090, "targetPort": "missing"}]}}),
            json!({"apiVersion": "networking.istio.io/v1", "kind": "WorkloadEntry",
                "metadata": {"name": "db-vm", "namespace": "shop"},
                "spec": {"address": "10.9.0.1", "labels": {"app": "db"},
                    "ports": {"pg": 6432, "admin": 18081}}}),
            json!({"apiVersion": "networking.istio.io/v1", "kind": "WorkloadEntry",
                "metadata": {"name": "other", "namespace": "blog"},
                "spec": {"address": "10.9.0.2", "labels": {"app": "db"}}}),
        ]);
        let derived = derive(&set, &TranslateOptions::default());
        let by_uid = |uid: &str| {
            derived
                .workloads
                .iter()
                .find(|w| w.workload.uid == uid)
                .unwrap_or_else(|| panic!("{uid}"))
                .workload
                .clone()
        };
        let vm = by_uid("Kubernetes/networking.istio.io/WorkloadEntry/shop/db-vm");
        let ports: Vec<(u32, u32)> = vm.services["shop/db.shop.svc.cluster.local"]
            .ports
            .iter()
            .map(|p| (p.service_port, p.target_port))
            .collect();
        // The named target port by the entry's port of that name; the number overridden by
        // the entry's port named as the service port; a name it lacks left out.
        assert_eq!(ports, [(5432, 6432), (8080, 18081)]);
        let other = by_uid("Kubernetes/networking.istio.io/WorkloadEntry/blog/other");
        assert!(other.services.is_empty(), "another namespace's Service");
    }

    #[test]
    fn cron_job_names_lose_their_schedule_time_only() {
        assert_eq!(cron_job_name("backup-28912345"), "backup");
        assert_eq!(cron_job_name("backup-2891234567"), "backup");
        assert_eq!(cron_job_name("backup-1234567"), "backup-1234567");
        assert_eq!(cron_job_name("backup-12345678901"), "backup-12345678901");
        assert_eq!(cron_job_name("backup-2891234a"), "backup-2891234a");
        assert_eq!(cron_job_name("-28912345"), "-28912345");
    }

    #[test]
    fn port_names_give_the_protocol_as_istiod_reads_them() {
        let port =
            |name: &str, number: i32, app: Option<&str>| k8s_openapi::api::core::v1::ServicePort {
                name: Some(name.to_owned()),
                port: number,
                app_protocol: app.map(str::to_owned),
                ..Default::default()
            };
        use workload::AppProtocol as P;
        for (p, want) in [
            (port("http-web", 80, None), P::Http11),
            (port("HTTP2", 80, None), P::Http2),
            (port("grpc-api", 80, None), P::Grpc),
            (port("grpc-web", 80, None), P::Unknown),
            (port("grpc-web-x", 80, None), P::Unknown),
            (port("tls", 443, None), P::Tls),
            (port("https-x", 443, None), P::Tls),
            (port("tcp", 1, None), P::Tcp),
            (port("mongo", 27017, None), P::Unknown),
            (port("db", 3306, None), P::Tcp),
            (port("db", 3307, None), P::Unknown),
            (port("web", 80, Some("kubernetes.io/h2c")), P::Http2),
            (port("http", 80, Some("kubernetes.io/wss")), P::Tls),
            (port("tcp", 80, Some("http")), P::Http11),
            (port("tcp", 80, Some("HTTP2-x")), P::Http2),
        ] {
            assert_eq!(kube_app_protocol(&p), want, "{p:?}");
        }
    }
}
