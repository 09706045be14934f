//! The mesh model that meshkit's data plane reads: Istio's workload API, the xDS resource
//! types built on it, and the index of workloads and services that the node proxy and the
//! gateway look destinations up in.
//!
//! - [`proto`]: `istio.workload` (`Address`, `Workload`, `Service`, ...) and
//!   `istio.security` (`Authorization`) generated from `proto/` with the upstream package
//!   names and field numbers (prost-build and protox, checked in; a test fails when it is
//!   stale).
//! - [`authz`]: ztunnel's L4 authorization as a pure evaluator: policies and the facts of one
//!   connection in, a [`Decision`](authz::Decision) and the deciding policy out.
//! - [`resources`]: [`AddressResource`](resources::AddressResource) and the Ingress resource
//!   types, as meshkit-xds-client [`Resource`](meshkit_xds_client::Resource)s.
//! - [`MeshConfig`] and [`MeshIndex`]: the data plane's view (workloads, services, endpoints),
//!   as JSON in a file ([`MeshConfig::load`]) or from xDS ([`feed`]).
//!
//! ```
//! use meshkit_identity::TrustDomain;
//! use meshkit_mesh::MeshConfig;
//!
//! let mesh: MeshConfig = serde_json::from_str(r#"{
//!     "workloads": [{"name": "web-1", "namespace": "shop", "service_account": "web",
//!                    "ip": "127.0.0.11", "node": "node-a"}]
//! }"#)?;
//! let index = mesh.index(&TrustDomain::new("cluster.local")?);
//! let (workload, id) = index.workload("127.0.0.11".parse()?).expect("known workload");
//! assert_eq!(workload.node, "node-a");
//! assert_eq!(id.to_string(), "spiffe://cluster.local/ns/shop/sa/web");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Feature flags
//!
//! None.
//!
//! # Stability
//!
//! Pre-1.0: the API may change between minor versions. The generated types follow upstream's
//! `.proto` and change when it does.

// docs.rs builds with `--cfg docsrs`: items behind a feature show it.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod authz;
mod cidr;
pub mod feed;
mod index;
pub mod resources;

/// Istio's workload and L4 authorization APIs, generated from `proto/`.
pub mod proto {
    /// `istio.workload`: workloads and services (`Address`), from `proto/workload.proto`.
    #[allow(missing_docs, unreachable_pub, clippy::all)]
    pub mod workload {
        include!("generated/istio.workload.rs");
    }

    /// `istio.security`: L4 authorization policies (`Authorization`), from
    /// `proto/authorization.proto`.
    #[allow(missing_docs, unreachable_pub, clippy::all)]
    pub mod security {
        include!("generated/istio.security.rs");
    }
}

pub use cidr::{Cidr, CidrError};
pub use index::{
    Endpoint, MeshConfig, MeshFileError, MeshIndex, MeshService, RejectedPolicy, ServicePort,
    StandIn, Workload,
};
