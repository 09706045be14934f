//! The part of Istio's workload API (`istio.workload.Address`, Istio's `workload.proto`) that
//! a client needs to reach a service: which workloads back it, on which port, with which
//! identity. prost skips the fields left out, so these few messages decode istiod's whole
//! resources; meshkit-xds-client needs nothing more than [`Resource`].

use std::collections::BTreeMap;
use std::net::IpAddr;

use meshkit_xds_client::{InvalidResource, Resource};
use prost::Message;

/// `istio.workload.Address`: a workload or a service. Its xDS name is the workload's uid, or
/// `namespace/hostname` for a service.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct Address {
    /// Which of the two it is.
    #[prost(oneof = "Kind", tags = "1, 2")]
    pub(crate) kind: Option<Kind>,
}

/// The two kinds of [`Address`].
#[derive(Clone, PartialEq, prost::Oneof)]
pub(crate) enum Kind {
    /// A workload (a Pod, a WorkloadEntry).
    #[prost(message, tag = "1")]
    Workload(Workload),
    /// A service (a Service, a ServiceEntry).
    #[prost(message, tag = "2")]
    Service(Service),
}

/// `istio.workload.Workload`, the fields a client reads.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct Workload {
    /// Its name in the mesh's view; the xDS resource name.
    #[prost(string, tag = "20")]
    pub(crate) uid: String,
    /// Its namespace, the middle of its SPIFFE ID.
    #[prost(string, tag = "2")]
    pub(crate) namespace: String,
    /// Its IP addresses, 4 or 16 bytes each.
    #[prost(bytes = "vec", repeated, tag = "3")]
    pub(crate) addresses: Vec<Vec<u8>>,
    /// 1 (`HBONE`) when a node proxy (or the workload itself) terminates HBONE for it.
    #[prost(int32, tag = "5")]
    pub(crate) tunnel_protocol: i32,
    /// Its trust domain; empty for the mesh's default, `cluster.local`.
    #[prost(string, tag = "6")]
    pub(crate) trust_domain: String,
    /// Its ServiceAccount, the end of its SPIFFE ID.
    #[prost(string, tag = "7")]
    pub(crate) service_account: String,
    /// The services it backs, keyed by `namespace/hostname`, with its target port for each
    /// service port.
    #[prost(btree_map = "string, message", tag = "22")]
    pub(crate) services: BTreeMap<String, PortList>,
    /// 0 (`HEALTHY`) when it takes traffic.
    #[prost(int32, tag = "17")]
    pub(crate) status: i32,
}

/// `istio.workload.Service`, the fields a client reads.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct Service {
    /// Its namespace.
    #[prost(string, tag = "2")]
    pub(crate) namespace: String,
    /// Its fully qualified host name.
    #[prost(string, tag = "3")]
    pub(crate) hostname: String,
    /// Its ports.
    #[prost(message, repeated, tag = "5")]
    pub(crate) ports: Vec<Port>,
}

/// `istio.workload.PortList`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct PortList {
    /// The ports.
    #[prost(message, repeated, tag = "1")]
    pub(crate) ports: Vec<Port>,
}

/// `istio.workload.Port`: a service port and the port behind it (0: the same).
#[derive(Clone, PartialEq, Message)]
pub(crate) struct Port {
    /// The service's port.
    #[prost(uint32, tag = "1")]
    pub(crate) service_port: u32,
    /// The workload's port for it; 0 when it is the service port.
    #[prost(uint32, tag = "2")]
    pub(crate) target_port: u32,
}

/// `TunnelProtocol.HBONE`.
pub(crate) const HBONE: i32 = 1;

/// An [`Address`] with its xDS name, as meshkit-xds-client's typed watches hand it out.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct AddressResource {
    /// The xDS name.
    pub(crate) name: String,
    /// The resource.
    pub(crate) address: Address,
}

impl Resource for AddressResource {
    const TYPE_URL: &'static str = "type.googleapis.com/istio.workload.Address";

    fn decode(bytes: &[u8]) -> Result<Self, InvalidResource> {
        let address = Address::decode(bytes).map_err(|e| InvalidResource::new(e.to_string()))?;
        let name = match &address.kind {
            Some(Kind::Workload(w)) => w.uid.clone(),
            Some(Kind::Service(s)) => format!("{}/{}", s.namespace, s.hostname),
            None => return Err(InvalidResource::new("an Address that is neither kind")),
        };
        Ok(Self { name, address })
    }

    fn name(&self) -> &str {
        &self.name
    }
}

/// Where a tunnel to a service goes: a workload behind HBONE, its address and target port,
/// and the SPIFFE ID it must present.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Endpoint {
    /// The workload's uid.
    pub(crate) uid: String,
    /// Its address.
    pub(crate) ip: IpAddr,
    /// The port the service port maps to on it.
    pub(crate) port: u16,
    /// The identity it must prove: `spiffe://TRUST_DOMAIN/ns/NAMESPACE/sa/ACCOUNT`.
    pub(crate) identity: String,
}

/// The healthy HBONE endpoints of port `port` of the service `hostname`, in the mesh
/// described by `addresses`; an error saying what is missing otherwise.
///
/// # Errors
///
/// No such service, no such port, or no workload behind it that can be reached over HBONE.
pub(crate) fn endpoints<'a>(
    addresses: impl Iterator<Item = &'a AddressResource> + Clone,
    hostname: &str,
    port: u16,
) -> Result<Vec<Endpoint>, String> {
    let service = addresses
        .clone()
        .find_map(|a| match &a.address.kind {
            Some(Kind::Service(s)) if s.hostname == hostname => Some(s),
            _ => None,
        })
        .ok_or_else(|| format!("no service {hostname} in the mesh"))?;
    let service_port = service
        .ports
        .iter()
        .find(|p| p.service_port == u32::from(port))
        .ok_or_else(|| format!("service {hostname} has no port {port}"))?;
    let key = format!("{}/{}", service.namespace, service.hostname);
    let mut found = Vec::new();
    for workload in addresses.filter_map(|a| match &a.address.kind {
        Some(Kind::Workload(w)) => Some(w),
        _ => None,
    }) {
        let Some(ports) = workload.services.get(&key) else {
            continue;
        };
        if workload.status != 0 || workload.tunnel_protocol != HBONE {
            continue;
        }
        // The workload's own mapping first, then the service's, then the port itself.
        let target = ports
            .ports
            .iter()
            .find(|p| p.service_port == u32::from(port))
            .map(|p| p.target_port)
            .filter(|&t| t != 0)
            .or(Some(service_port.target_port).filter(|&t| t != 0))
            .unwrap_or(u32::from(port));
        let Ok(target) = u16::try_from(target) else {
            continue;
        };
        let trust_domain = match workload.trust_domain.as_str() {
            "" => "cluster.local",
            td => td,
        };
        for bytes in &workload.addresses {
            let ip = match bytes.len() {
                4 => IpAddr::from(<[u8; 4]>::try_from(bytes.as_slice()).expect("4 bytes")),
                16 => IpAddr::from(<[u8; 16]>::try_from(bytes.as_slice()).expect("16 bytes")),
                _ => continue,
            };
            found.push(Endpoint {
                uid: workload.uid.clone(),
                ip,
                port: target,
                identity: format!(
                    "spiffe://{trust_domain}/ns/{}/sa/{}",
                    workload.namespace, workload.service_account
                ),
            });
        }
    }
    if found.is_empty() {
        return Err(format!(
            "no healthy workload behind {hostname}:{port} is reachable over HBONE"
        ));
    }
    Ok(found)
}
