//! The data plane's view of the mesh from xDS: workload API `Address` and
//! `istio.security.Authorization` resources in, a [`MeshConfig`] on a `tokio::sync::watch`
//! channel out.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use meshkit_xds_client::{ClientConfig, Resource, WatchEvent, XdsClient};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::proto::workload::address;
use crate::resources::{AddressResource, AuthorizationResource};
use crate::{MeshConfig, MeshService, RejectedPolicy, ServicePort, StandIn, Workload};

/// Follows the workload API Addresses and the authorization policies of the ADS server that
/// `config` names (its URI, mode and node), as a node proxy's view of the mesh. Returns the view and the two spawned tasks
/// (the xDS driver and the feed); aborting them ends the subscription.
///
/// Must be called inside a tokio runtime.
pub fn mesh_over_xds(config: ClientConfig) -> (watch::Receiver<MeshConfig>, Vec<JoinHandle<()>>) {
    let (client, driver) = spawn_client(config);
    let (tx, rx) = watch::channel(MeshConfig::default());
    (rx, vec![driver, tokio::spawn(feed_mesh(client, tx))])
}

/// An xDS client for `config` and the spawned task that drives it (it logs why it stopped).
///
/// Must be called inside a tokio runtime.
pub fn spawn_client(config: ClientConfig) -> (XdsClient, JoinHandle<()>) {
    let (client, driver) = XdsClient::new(config);
    let driver = tokio::spawn(async move {
        if let Err(e) = driver.run().await {
            tracing::warn!(error = %e, "xDS client stopped");
        }
    });
    (client, driver)
}

/// Keeps `tx` at the mesh described by the Address and Authorization resources `client`
/// receives. Returns when the client is gone.
///
/// A rejected authorization policy (its latest version does not convert; the client NACKs
/// it) is never ignored: its last good version stays enforced, as in ztunnel, and when it has
/// none, a DENY of every connection stands in for it in the scope it would cover (fail
/// closed, where ztunnel would enforce nothing), until the server sends a good version or
/// removes it. Both are listed in [`MeshConfig::rejected_policies`]. The scope of a policy
/// that was never good is not known: it is taken as the workloads that name it (a
/// WORKLOAD_SELECTOR policy; istiod names such a policy on each workload it selects), or,
/// when none does, as its namespace.
///
/// Nothing is sent until the server's whole state of both types has arrived
/// ([`WatchEvent::Synced`]): a view with the workloads but not yet the policies would let a
/// node proxy serve them with no policy to enforce, and admit what the policies deny. A
/// server must therefore answer both wildcard subscriptions, with an empty response when it
/// has nothing of a type (meshkit's control plane does, as istiod does for ztunnel).
pub async fn feed_mesh(client: XdsClient, tx: watch::Sender<MeshConfig>) {
    let mut addresses = client.watch_all::<AddressResource>();
    let mut authorizations = client.watch_all::<AuthorizationResource>();
    let mut current: BTreeMap<String, AddressResource> = BTreeMap::new();
    let mut policies: BTreeMap<String, AuthorizationResource> = BTreeMap::new();
    // Key to why its latest version was rejected.
    let mut rejected: BTreeMap<String, String> = BTreeMap::new();
    let (mut addresses_synced, mut policies_synced, mut sent) = (false, false, false);
    loop {
        let changed = tokio::select! {
            event = addresses.next() => match event {
                Some(WatchEvent::Synced) => {
                    addresses_synced = true;
                    false
                }
                Some(event) => apply(&mut current, event),
                None => return,
            },
            event = authorizations.next() => match event {
                Some(WatchEvent::Synced) => {
                    policies_synced = true;
                    false
                }
                Some(event) => apply_policy(&mut policies, &mut rejected, event),
                None => return,
            },
        };
        if !(addresses_synced && policies_synced) {
            continue;
        }
        // The first time both are whole, the view goes out even if empty.
        if changed || !sent {
            sent = true;
            let mut mesh = mesh_config(current.values());
            mesh.policies = policies.values().map(|p| (*p.policy).clone()).collect();
            stand_in_for_rejected(&mut mesh, &policies, &rejected);
            tx.send_replace(mesh);
        }
    }
}

/// Applies one watch event to a name-keyed view of a resource type; whether the view changed.
/// A rejected resource is logged and changes nothing (the last good version stays).
pub fn apply<T: Resource + Clone>(view: &mut BTreeMap<String, T>, event: WatchEvent<T>) -> bool {
    match event {
        WatchEvent::Updated { name, resource, .. } => {
            view.insert(name, T::clone(&resource));
            true
        }
        WatchEvent::Removed { name, .. } => view.remove(&name).is_some(),
        WatchEvent::Rejected { name, error } => {
            tracing::warn!(?name, %error, "rejected xDS resource");
            false
        }
        _ => false,
    }
}

/// [`apply`] for the authorization policies, recording which are rejected; whether anything
/// changed.
fn apply_policy(
    policies: &mut BTreeMap<String, AuthorizationResource>,
    rejected: &mut BTreeMap<String, String>,
    event: WatchEvent<AuthorizationResource>,
) -> bool {
    match event {
        WatchEvent::Updated { ref name, .. } | WatchEvent::Removed { ref name, .. } => {
            let was_rejected = rejected.remove(name).is_some();
            apply(policies, event) || was_rejected
        }
        WatchEvent::Rejected {
            name: Some(name),
            error,
        } => {
            let kept = policies.contains_key(&name);
            tracing::error!(
                policy = %name,
                %error,
                stand_in = if kept { "its last good version" } else { "a DENY of its scope" },
                "authorization policy rejected"
            );
            rejected.insert(name, error.clone()).as_ref() != Some(&error)
        }
        event => apply(policies, event),
    }
}

/// Adds to `mesh` what stands in for each rejected policy: nothing when its last good version
/// is in `policies`, else a DENY of every connection in the scope it would cover; and lists
/// them in [`MeshConfig::rejected_policies`].
fn stand_in_for_rejected(
    mesh: &mut MeshConfig,
    policies: &BTreeMap<String, AuthorizationResource>,
    rejected: &BTreeMap<String, String>,
) {
    use crate::authz::{Action, Policy, Rule, Scope};
    for (key, error) in rejected {
        let enforced = if policies.contains_key(key) {
            StandIn::LastGood
        } else {
            let (namespace, name) = key.split_once('/').unwrap_or(("", key));
            let named = mesh
                .workloads
                .iter()
                .any(|w| w.authorization_policies.iter().any(|p| p == key));
            mesh.policies.push(Policy {
                name: name.to_owned(),
                namespace: namespace.to_owned(),
                scope: if named {
                    Scope::WorkloadSelector
                } else {
                    Scope::Namespace
                },
                action: Action::Deny,
                // A rule without clauses matches every connection.
                rules: vec![Rule::default()],
                dry_run: false,
            });
            StandIn::DenyAll
        };
        mesh.rejected_policies.push(RejectedPolicy {
            key: key.clone(),
            error: error.clone(),
            enforced,
        });
    }
}

/// The data plane's view of the mesh from workload API Address resources: each workload with
/// its first address, each service with its endpoints (the workloads that name it) and its
/// target ports as the workloads declare them.
///
/// A workload's [`ports`](Workload::ports) are the target ports of the services it backs:
/// for each service port, the workload's own target port when it sets one (non-zero), else
/// the service's (non-zero); a port that resolves to neither is left out. A workload that
/// backs no service reaches no port at all: the workload API names every port a workload
/// serves through its services, so anything else is not the mesh's to reach.
pub fn mesh_config<'a>(addresses: impl Iterator<Item = &'a AddressResource>) -> MeshConfig {
    let mut workloads = Vec::new();
    let mut services = Vec::new();
    let mut members: BTreeMap<String, BTreeSet<IpAddr>> = BTreeMap::new();
    // Target ports as the workloads declare them (a WorkloadEntry may map a service port to
    // a port of its own), by service key and service port.
    let mut targets: BTreeMap<(String, u32), u32> = BTreeMap::new();
    // Each workload's services and its own port mappings, resolved once every service is known.
    let mut backs: Vec<Vec<Backs>> = Vec::new();
    for resource in addresses {
        match &resource.address.r#type {
            Some(address::Type::Workload(w)) => {
                let Some(ip) = w.addresses.first().and_then(|b| ip_from_bytes(b)) else {
                    continue;
                };
                let mut own = Vec::new();
                for (key, ports) in &w.services {
                    members.entry(key.clone()).or_default().insert(ip);
                    for p in &ports.ports {
                        targets
                            .entry((key.clone(), p.service_port))
                            .or_insert(p.target_port);
                    }
                    let mapping = ports
                        .ports
                        .iter()
                        .map(|p| (p.service_port, p.target_port))
                        .collect();
                    own.push((key.clone(), mapping));
                }
                backs.push(own);
                workloads.push(Workload {
                    name: w.name.clone(),
                    namespace: w.namespace.clone(),
                    service_account: w.service_account.clone(),
                    ip,
                    node: w.node.clone(),
                    ports: Some(Vec::new()),
                    authorization_policies: w.authorization_policies.clone(),
                });
            }
            Some(address::Type::Service(s)) => {
                services.push(MeshService {
                    name: s.name.clone(),
                    namespace: s.namespace.clone(),
                    hostname: s.hostname.clone(),
                    vip: s.addresses.first().and_then(|a| ip_from_bytes(&a.address)),
                    ports: s
                        .ports
                        .iter()
                        .filter_map(|p| {
                            Some(ServicePort {
                                name: None,
                                port: u16::try_from(p.service_port).ok()?,
                                target_port: u16::try_from(p.target_port).ok()?,
                            })
                        })
                        .collect(),
                    endpoints: Vec::new(),
                });
            }
            None => {}
        }
    }
    // The services' own target ports, before the workloads' mappings are folded in below.
    let service_targets: BTreeMap<String, Vec<(u16, u16)>> = services
        .iter()
        .map(|s| {
            let key = format!("{}/{}", s.namespace, s.hostname);
            (
                key,
                s.ports.iter().map(|p| (p.port, p.target_port)).collect(),
            )
        })
        .collect();
    for (workload, own) in workloads.iter_mut().zip(&backs) {
        workload.ports = Some(reachable_ports(own, &service_targets));
    }
    for service in &mut services {
        let key = format!("{}/{}", service.namespace, service.hostname);
        service.endpoints = members.get(&key).into_iter().flatten().copied().collect();
        for port in &mut service.ports {
            if let Some(target) = targets
                .get(&(key.clone(), u32::from(port.port)))
                .and_then(|t| u16::try_from(*t).ok())
                .filter(|t| *t != 0)
            {
                port.target_port = target;
            }
        }
    }
    MeshConfig {
        workloads,
        services,
        policies: Vec::new(),
        rejected_policies: Vec::new(),
    }
}

/// A service a workload backs (its key) and the workload's own (service port, target port)
/// mappings for it.
type Backs = (String, Vec<(u32, u32)>);

/// The ports one workload serves: per service it backs, per service port (the service's and
/// those the workload maps), the workload's non-zero target port, else the service's.
fn reachable_ports(own: &[Backs], services: &BTreeMap<String, Vec<(u16, u16)>>) -> Vec<u16> {
    let mut ports = BTreeSet::new();
    for (key, mapping) in own {
        let service = services.get(key).map(Vec::as_slice).unwrap_or_default();
        let override_for = |service_port: u16| {
            mapping
                .iter()
                .find(|(sp, _)| *sp == u32::from(service_port))
                .and_then(|(_, tp)| u16::try_from(*tp).ok())
                .filter(|tp| *tp != 0)
        };
        for &(service_port, target_port) in service {
            if let Some(port) =
                override_for(service_port).or((target_port != 0).then_some(target_port))
            {
                ports.insert(port);
            }
        }
        // Ports the workload maps for a service that is not (yet) known, or that the service
        // does not list: the workload's own target port, when it names one.
        for &(service_port, target_port) in mapping {
            let listed =
                u16::try_from(service_port).is_ok_and(|sp| service.iter().any(|(p, _)| *p == sp));
            if !listed && let Some(port) = u16::try_from(target_port).ok().filter(|p| *p != 0) {
                ports.insert(port);
            }
        }
    }
    ports.into_iter().collect()
}

/// An IP address from the workload API's bytes (4 for IPv4, 16 for IPv6).
pub fn ip_from_bytes(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?)),
        _ => None,
    }
}

/// How a node proxy names itself to an Istio control plane, in the shape ztunnel uses: the
/// node id `ztunnel~IP~POD.NAMESPACE~NAMESPACE.svc.cluster.local` and the metadata istiod
/// reads (`NAME`, `NAMESPACE`, `INSTANCE_IPS`, `NODE_NAME`, `CLUSTER_ID`, and
/// `SERVICE_ACCOUNT` when known).
///
/// istiod takes the `ztunnel` prefix as the proxy's type, checks that `NAMESPACE` (and
/// `SERVICE_ACCOUNT`, when sent) is the bearer token's ServiceAccount's, and trusts a token of
/// its `CA_TRUSTED_NODE_ACCOUNTS` to ask for the certificates of the workloads on the token's
/// Pod's node.
/// meshkit's control plane reads the same node.
///
/// ```
/// use meshkit_mesh::feed::ProxyNode;
///
/// let node = ProxyNode::new("node-a", "ztunnel-x1", "istio-system", [10, 0, 0, 10].into())
///     .with_cluster_id("Kubernetes")
///     .to_node();
/// assert_eq!(node.id, "ztunnel~10.0.0.10~ztunnel-x1.istio-system~istio-system.svc.cluster.local");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProxyNode {
    /// The Kubernetes node this proxy serves (`NODE_NAME`).
    pub node_name: String,
    /// The proxy's own Pod (`NAME`).
    pub pod_name: String,
    /// Its Pod's namespace (`NAMESPACE`): that of the ServiceAccount whose token it sends.
    pub pod_namespace: String,
    /// Its Pod's address (`INSTANCE_IPS`).
    pub instance_ip: IpAddr,
    /// The cluster it runs in (`CLUSTER_ID`, and the node's `cluster`). Default:
    /// `Kubernetes`, istiod's default.
    pub cluster_id: String,
    /// Its Pod's ServiceAccount (`SERVICE_ACCOUNT`), if known.
    pub service_account: Option<String>,
}

impl ProxyNode {
    /// The proxy of node `node_name` running as Pod `pod_namespace/pod_name` at `instance_ip`.
    pub fn new(
        node_name: impl Into<String>,
        pod_name: impl Into<String>,
        pod_namespace: impl Into<String>,
        instance_ip: IpAddr,
    ) -> Self {
        Self {
            node_name: node_name.into(),
            pod_name: pod_name.into(),
            pod_namespace: pod_namespace.into(),
            instance_ip,
            cluster_id: "Kubernetes".to_owned(),
            service_account: None,
        }
    }

    /// Names the cluster ([`ProxyNode::cluster_id`]).
    pub fn with_cluster_id(mut self, cluster_id: impl Into<String>) -> Self {
        self.cluster_id = cluster_id.into();
        self
    }

    /// Names the Pod's ServiceAccount ([`ProxyNode::service_account`]).
    pub fn with_service_account(mut self, service_account: impl Into<String>) -> Self {
        self.service_account = Some(service_account.into());
        self
    }

    /// The xDS node: id, cluster and metadata.
    pub fn to_node(&self) -> meshkit_xds_client::envoy::Node {
        use meshkit_xds_client::envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
        let namespace = &self.pod_namespace;
        let ip = self.instance_ip.to_string();
        let mut fields = vec![
            ("NAME", self.pod_name.clone()),
            ("NAMESPACE", namespace.clone()),
            ("INSTANCE_IPS", ip.clone()),
            ("NODE_NAME", self.node_name.clone()),
            ("CLUSTER_ID", self.cluster_id.clone()),
        ];
        if let Some(account) = &self.service_account {
            fields.push(("SERVICE_ACCOUNT", account.clone()));
        }
        meshkit_xds_client::envoy::Node {
            id: format!(
                "ztunnel~{ip}~{}.{namespace}~{namespace}.svc.cluster.local",
                self.pod_name
            ),
            cluster: self.cluster_id.clone(),
            metadata: Some(Struct {
                fields: fields
                    .into_iter()
                    .map(|(k, v)| {
                        let value = Value {
                            kind: Some(Kind::StringValue(v)),
                        };
                        (k.to_owned(), value)
                    })
                    .collect(),
            }),
            ..Default::default()
        }
    }
}
