//! Envoy xDS client for meshkit: the Aggregated Discovery Service over gRPC, in both the
//! State-of-the-World (`StreamAggregatedResources`) and the Delta
//! (`DeltaAggregatedResources`) variant.
//!
//! # Layers
//!
//! - [`protocol`]: the protocol core, with no I/O and no clock of its own (in the style of
//!   `quinn-proto`). Subscriptions per type URL, versions, nonces, ACK/NACK, the resource cache,
//!   does-not-exist and TTL timers, and the choice among fallback servers. Every protocol rule
//!   is tested on it with a scripted server and a simulated clock.
//! - [`Resource`]: a resource type (type URL, name, two-step decode then validate), implemented
//!   for Envoy's `Listener`, `RouteConfiguration`, `Cluster`, `ClusterLoadAssignment` and
//!   `Secret` from the `envoy-types` crate, and implementable for your own types.
//! - [`validate`]: the checks of those five types, as deep as Envoy's: the protoc-gen-validate
//!   rules of their protos (generated from the annotations), defined enum values, and the rules
//!   Envoy applies when it loads a resource. Each rejection names the field.
//! - [`envoy`]: the Envoy types of the API re-exported (and [`envoy_types`] itself), so no
//!   separately versioned `envoy-types` dependency is needed.
//! - [`XdsClient`] and [`Driver`]: the async client over tonic. [`XdsClient::watch`] and
//!   [`XdsClient::watch_all`] return a [`Watch`], a stream of [`WatchEvent`]s with bounded
//!   memory (newest state wins; a slow watcher never blocks the others or the stream).
//!
//! # Example: watch clusters
//!
//! ```no_run
//! use envoy_types::pb::envoy::config::cluster::v3::Cluster;
//! use envoy_types::pb::envoy::config::core::v3::Node;
//! use meshkit_xds_client::protocol::Mode;
//! use meshkit_xds_client::{ClientConfig, WatchEvent, XdsClient};
//!
//! # async fn demo() -> Result<(), meshkit_xds_client::Error> {
//! let node = Node { id: "sidecar~10.0.0.1~web.shop~shop.svc.cluster.local".into(), ..Default::default() };
//! let config = ClientConfig::new("http://istiod.istio-system:15010", Mode::Delta, node);
//! let (client, driver) = XdsClient::new(config);
//! let driver = tokio::spawn(driver.run());
//!
//! let mut clusters = client.watch_all::<Cluster>();
//! while let Some(event) = clusters.next().await {
//!     match event {
//!         WatchEvent::Updated { name, resource, .. } => {
//!             println!("{name}: {:?}", resource.connect_timeout)
//!         }
//!         WatchEvent::Removed { name, reason } => println!("{name} removed: {reason:?}"),
//!         WatchEvent::Rejected { name, error } => println!("{name:?} rejected: {error}"),
//!         _ => {}
//!     }
//! }
//! // The stream ends when the driver stops.
//! driver.await.expect("driver task")?;
//! # Ok(()) }
//! ```
//!
//! # Failure behaviour
//!
//! The driver reconnects with exponential backoff and jitter (reset only after a response
//! arrives), resubscribes everything on the new stream and keeps serving the cache meanwhile:
//! a lost connection never produces a deletion. HTTP/2 keepalive detects a black-holed
//! connection. Invalid resources are NACKed with their names; the valid ones of the same
//! response are applied. A response for a type nobody watches is dropped unanswered (in
//! State of the World an ACK naming nothing would subscribe to every resource of the type).
//! With [`ClientConfig::fallback_servers`] the client moves to the next server when the
//! current one cannot be reached or fails before answering, keeps its cache across the
//! switch, and returns to a higher-priority server once that one answers again (gRFC A71,
//! [`protocol::Failover`]). [`ClientConfig::ignore_resource_deletion`] keeps Listeners and
//! Clusters that a State-of-the-World response leaves out (gRFC A53). See `docs/xds.md` for
//! each rule and how it is implemented.
//!
//! # Feature flags
//!
//! - `test-util`: `testing::FakeServer`, a fake ADS server on `127.0.0.1:0` (SotW and Delta,
//!   snapshot-driven or scripted, optionally over TLS), for tests of this crate and of its
//!   users.
//! - `tls`: TLS to the control plane with a rustls `ClientConfig` of your choosing
//!   (`ClientConfig::tls`), or with a CA file and an alternate server name
//!   (`ControlPlaneTls`, `ClientConfig::with_control_plane_tls`).
//!
//! Without any feature, [`ClientConfig::with_channel`] takes a tonic `Channel` you built and
//! [`CallCredentials`] (a bearer token, a token file, any interceptor) are added to every call.
//! - `identity`: SPIFFE mutual TLS with meshkit-identity (`ClientConfig::spiffe_mtls`): the
//!   client presents its X509-SVID and accepts only servers the `SpiffeVerifier` accepts.
//!
//! # Stability
//!
//! Pre-1.0. The protocol core's inputs and outputs follow the xDS protocol and are expected to
//! stay; the builder methods of [`ClientConfig`] may grow. Enums that may gain variants are
//! `#[non_exhaustive]`.

// docs.rs builds with `--cfg docsrs`: items behind a feature show it.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod client;
mod error;
pub mod protocol;
mod resource;
#[cfg(feature = "test-util")]
pub mod testing;
#[cfg(feature = "tls")]
mod tls;
mod transport;
pub mod validate;
mod watch;

/// The `envoy-types` crate this crate is built against, for the messages not re-exported in
/// [`envoy`].
pub use envoy_types;

/// The Envoy types of this crate's API, re-exported so that a user needs no `envoy-types`
/// dependency of a matching version.
pub mod envoy {
    pub use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    pub use envoy_types::pb::envoy::config::core::v3::Node;
    pub use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
    pub use envoy_types::pb::envoy::config::listener::v3::Listener;
    pub use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
    pub use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
    pub use envoy_types::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
        Resource as DiscoveryResource,
    };
}

pub use client::{ClientConfig, Driver, XdsClient};
pub use error::Error;
pub use resource::{
    AnyResource, CLUSTER_TYPE_URL, ENDPOINT_TYPE_URL, InvalidResource, LISTENER_TYPE_URL,
    RESOURCE_WRAPPER_TYPE_URL, ROUTE_TYPE_URL, Resource, ResourceType, SECRET_TYPE_URL,
};
pub use transport::CallCredentials;
#[cfg(feature = "tls")]
pub use transport::ControlPlaneTls;
pub use watch::{Watch, WatchEvent};
