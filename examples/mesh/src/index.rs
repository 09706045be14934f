//! The mesh as the data plane sees it: workloads, the nodes they run on, and services with
//! their endpoints. The control plane's `Address` resources map onto these types one to one
//! ([`crate::feed::mesh_config`]); the node proxy and the gateway read them from a
//! `tokio::sync::watch` channel.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use meshkit_identity::{SpiffeId, SpiffeIdError, TrustDomain};
use serde::{Deserialize, Serialize};

use crate::authz::{Connection, Evaluation, PolicySet, Target};

/// One workload (a pod, a VM): where it runs and who it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Workload {
    /// Workload name, unique within its namespace.
    pub name: String,
    /// Namespace; the `ns` of its SPIFFE ID.
    pub namespace: String,
    /// Service account; the `sa` of its SPIFFE ID.
    pub service_account: String,
    /// The workload's address; unique in the mesh.
    pub ip: IpAddr,
    /// Name of the node whose proxy carries this workload's traffic.
    pub node: String,
    /// Ports an inbound tunnel may reach on the workload. `None` (a mesh file that lists no
    /// `ports`): any port. `Some(list)`: only those, so `Some(vec![])` reaches none. A workload
    /// learned over xDS always has `Some`: the target ports of the services it backs
    /// ([`crate::feed::mesh_config`]). The node proxy's own listeners are refused whatever this
    /// says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<u16>>,
    /// Keys (`namespace/name`) of the WORKLOAD_SELECTOR authorization policies that select
    /// this workload (the workload API's `authorization_policies`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub authorization_policies: Vec<String>,
}

/// A port of a service and the workload port it maps to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServicePort {
    /// Port name (an Ingress backend may name the port instead of numbering it).
    #[serde(default)]
    pub name: Option<String>,
    /// The service port clients use.
    pub port: u16,
    /// The workload port that serves it.
    pub target_port: u16,
}

/// A service: a name for a set of workload endpoints. (Named `MeshService` so that it is
/// never confused with tower's `Service` trait.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeshService {
    /// Service name (what an Ingress backend names).
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// Fully qualified host name, for example `web.shop.svc.cluster.local`.
    pub hostname: String,
    /// The virtual IP of the service, where one exists. Informational on loopback: clients
    /// reach services through the node proxy's outbound listeners.
    #[serde(default)]
    pub vip: Option<IpAddr>,
    /// The service's ports.
    pub ports: Vec<ServicePort>,
    /// IPs of the workloads behind the service.
    pub endpoints: Vec<IpAddr>,
}

/// Everything the data plane knows about the mesh: the value carried by the watch channel.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeshConfig {
    /// Every workload of the mesh.
    #[serde(default)]
    pub workloads: Vec<Workload>,
    /// Every service of the mesh.
    #[serde(default)]
    pub services: Vec<MeshService>,
    /// The L4 authorization policies ([`crate::authz`]) node proxies enforce.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<crate::authz::Policy>,
    /// The authorization policies the node rejected as it received them, and what stands in
    /// for each in [`policies`](Self::policies) ([`crate::feed`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejected_policies: Vec<RejectedPolicy>,
}

/// An authorization policy rejected on receipt (its latest version is not a valid
/// [`crate::authz::Policy`]; the xDS client NACKed it), and what is enforced in its place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RejectedPolicy {
    /// Its key, `namespace/name`.
    pub key: String,
    /// Why it was rejected.
    pub error: String,
    /// What stands in for it.
    pub enforced: StandIn,
}

/// What a node enforces in place of a rejected authorization policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StandIn {
    /// Its last good version, as ztunnel does.
    LastGood,
    /// It had no good version: a DENY of every connection in the scope it would cover
    /// (fail closed), where ztunnel would enforce nothing.
    DenyAll,
}

/// Why a mesh file could not be loaded ([`MeshConfig::load`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MeshFileError {
    /// The file could not be read.
    #[error("cannot read mesh file {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not the JSON form of a [`MeshConfig`].
    #[error("mesh file {} is not a valid mesh", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong, with line and column.
        #[source]
        source: serde_json::Error,
    },
}

/// Where a tunnel to one workload endpoint goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The workload's address and the port to reach (the CONNECT `:authority`).
    pub address: SocketAddr,
    /// The HBONE address that carries traffic to the workload (its IP, port 15008).
    pub hbone: SocketAddr,
    /// The identity the workload's side must present.
    pub identity: SpiffeId,
    /// Workload name, for logs and answers.
    pub workload: String,
}

// === impl Workload ===

impl Workload {
    /// The workload's Istio SPIFFE ID, `spiffe://TD/ns/NAMESPACE/sa/SERVICE_ACCOUNT`.
    ///
    /// # Errors
    ///
    /// When the namespace or service account is not a valid SPIFFE path segment.
    pub fn spiffe_id(&self, trust_domain: &TrustDomain) -> Result<SpiffeId, SpiffeIdError> {
        SpiffeId::from_istio(trust_domain, &self.namespace, &self.service_account)
    }

    /// Whether an inbound tunnel may reach `port` ([`Workload::ports`]).
    pub fn serves_port(&self, port: u16) -> bool {
        self.ports
            .as_ref()
            .is_none_or(|ports| ports.contains(&port))
    }
}

// === impl MeshService ===

impl MeshService {
    /// The port matching an Ingress-style reference: by number, else by name.
    ///
    /// The workload API carries no port names, so a service learned from it has unnamed
    /// ports: a name then resolves to the service's only port when it has exactly one (the
    /// one reading that cannot be wrong), and to nothing otherwise.
    pub fn port(&self, number: Option<u16>, name: Option<&str>) -> Option<&ServicePort> {
        match (number, name) {
            (Some(n), _) => self.ports.iter().find(|p| p.port == n),
            (None, Some(name)) => self
                .ports
                .iter()
                .find(|p| p.name.as_deref() == Some(name))
                .or_else(|| match self.ports.as_slice() {
                    [only] if only.name.is_none() => Some(only),
                    _ => None,
                }),
            (None, None) => self.ports.first(),
        }
    }
}

// === impl MeshConfig ===

impl MeshConfig {
    /// Reads a mesh from a JSON file (the serde form of this type: `workloads`, `services`
    /// and `policies`), as a node proxy or gateway without a control plane is fed.
    ///
    /// # Errors
    ///
    /// Names the file, and whether it could not be read or parsed.
    pub fn load(path: &Path) -> Result<Self, MeshFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| MeshFileError::Read {
            path: path.to_owned(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|source| MeshFileError::Parse {
            path: path.to_owned(),
            source,
        })
    }

    /// An index for lookups by address and by name.
    pub fn index(&self, trust_domain: &TrustDomain) -> MeshIndex {
        MeshIndex::new(self, trust_domain)
    }
}

/// Lookups over a [`MeshConfig`], built once per configuration.
#[derive(Debug, Clone, Default)]
pub struct MeshIndex {
    workloads: HashMap<IpAddr, (Workload, SpiffeId)>,
    by_name: HashMap<(String, String), MeshService>,
    by_host: HashMap<String, MeshService>,
    policies: PolicySet,
    hbone_port: u16,
}

impl MeshIndex {
    fn new(mesh: &MeshConfig, trust_domain: &TrustDomain) -> Self {
        let mut workloads = HashMap::new();
        for w in &mesh.workloads {
            match w.spiffe_id(trust_domain) {
                Ok(id) => {
                    workloads.insert(w.ip, (w.clone(), id));
                }
                Err(e) => tracing::warn!(workload = %w.name, error = %e, "workload skipped"),
            }
        }
        let mut by_name = HashMap::new();
        let mut by_host = HashMap::new();
        for s in &mesh.services {
            by_name.insert((s.namespace.clone(), s.name.clone()), s.clone());
            by_host.insert(s.hostname.to_ascii_lowercase(), s.clone());
        }
        Self {
            workloads,
            by_name,
            by_host,
            policies: mesh.policies.iter().cloned().collect(),
            hbone_port: meshkit_hbone::HBONE_PORT,
        }
    }

    /// Uses `port` instead of 15008 as the HBONE port of every workload.
    pub fn with_hbone_port(mut self, port: u16) -> Self {
        self.hbone_port = port;
        self
    }

    /// The workload with address `ip` and its SPIFFE ID.
    pub fn workload(&self, ip: IpAddr) -> Option<(&Workload, &SpiffeId)> {
        self.workloads.get(&ip).map(|(w, id)| (w, id))
    }

    /// The workloads of node `node`.
    pub fn workloads_on<'a>(
        &'a self,
        node: &'a str,
    ) -> impl Iterator<Item = (&'a Workload, &'a SpiffeId)> + 'a {
        self.workloads
            .values()
            .filter(move |(w, _)| w.node == node)
            .map(|(w, id)| (w, id))
    }

    /// The authorization policies of the mesh.
    pub fn policies(&self) -> &PolicySet {
        &self.policies
    }

    /// Decides `conn` to the workload `target` by the policies that apply to it (its
    /// namespace's, the global ones, and those it names).
    pub fn authorize<'a>(&'a self, target: &Workload, conn: &Connection<'_>) -> Evaluation<'a> {
        self.policies.evaluate(
            Target {
                namespace: &target.namespace,
                policies: &target.authorization_policies,
            },
            conn,
        )
    }

    /// The service `name` in `namespace`.
    pub fn service(&self, namespace: &str, name: &str) -> Option<&MeshService> {
        self.by_name.get(&(namespace.to_owned(), name.to_owned()))
    }

    /// The service with host name `hostname` (case-insensitive).
    pub fn service_by_host(&self, hostname: &str) -> Option<&MeshService> {
        self.by_host.get(&hostname.to_ascii_lowercase())
    }

    /// The endpoints of `service` for `port`, in the service's order; endpoints whose workload
    /// is unknown are left out.
    pub fn endpoints(&self, service: &MeshService, port: &ServicePort) -> Vec<Endpoint> {
        service
            .endpoints
            .iter()
            .filter_map(|ip| {
                let (w, id) = self.workloads.get(ip)?;
                Some(Endpoint {
                    address: SocketAddr::new(*ip, port.target_port),
                    hbone: SocketAddr::new(*ip, self.hbone_port),
                    identity: id.clone(),
                    workload: w.name.clone(),
                })
            })
            .collect()
    }
}
