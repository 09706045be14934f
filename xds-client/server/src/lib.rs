//! A snapshot-cache xDS server: `envoy.service.discovery.v3.AggregatedDiscoveryService`, in
//! both the State-of-the-World (`StreamAggregatedResources`) and the Delta
//! (`DeltaAggregatedResources`) variant, serving the current [`Snapshot`] of a
//! [`SnapshotCache`] — what go-control-plane's snapshot cache is for Go.
//!
//! # Overview
//!
//! - [`Snapshot`], built with [`SnapshotBuilder`]: every resource served, per type URL, as
//!   `google.protobuf.Any`, each with a content-hash version; a type's version is a content
//!   hash too unless set explicitly ([`SnapshotBuilder::version`]).
//! - [`SnapshotCache`]: holds the current snapshot; [`SnapshotCache::set`] replaces it and
//!   wakes every stream, unless the new one is equal (re-reading unchanged input pushes
//!   nothing).
//! - [`SotwStream`] and [`DeltaStream`]: the protocol state of one stream, without I/O in the
//!   style of `quinn-proto`: requests and snapshots in, responses out. Per-client
//!   subscriptions (named, `*`, legacy wildcard), Delta `initial_resource_versions`, only
//!   changes pushed, nothing on an ACK or a NACK.
//! - [`AdsServer`]: the tonic service, a thin loop around those states, with bounds
//!   ([`ServerConfig`]), authentication and per-client views ([`AccessPolicy`]: credentials
//!   checked when a stream opens, the node of every request checked, each stream served its
//!   own part of the snapshot), a hook that sees every request and response ([`RequestObserver`]), injection of
//!   raw responses and an abort (for tests and fault injection), graceful stop, and serving
//!   over TCP or any incoming stream of connections (for TLS).
//!
//! The push rules, in short (`docs/xds.md`, "The ADS server", has them all):
//! - A type that is not in the snapshot is not served: no answer at all, in both variants.
//!   Declare a type ([`SnapshotBuilder::declare`]) to serve it with no resources.
//! - State of the World: a type is answered on its first request, on a subscription change,
//!   and when the response would differ from the last one sent on the stream (its resources'
//!   names and versions, or its explicit version).
//! - Delta: only resources whose version differs from what the client holds, and removed
//!   names; the first request of a served type is always answered; subscribed names that do
//!   not exist are reported in `removed_resources` once.
//!
//! # Example
//!
//! ```no_run
//! use meshkit_xds_server::envoy_types::pb::envoy::config::cluster::v3::Cluster;
//! use meshkit_xds_server::{AdsServer, ServerConfig, SnapshotBuilder, SnapshotCache};
//!
//! const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let mut b = SnapshotBuilder::new();
//! b.add(CLUSTER, "backend", &Cluster { name: "backend".into(), ..Default::default() });
//! let cache = SnapshotCache::new(b.build());
//!
//! let (stop, stopped) = tokio::sync::watch::channel(false);
//! let server = AdsServer::new(cache.clone())
//!     .with_config(ServerConfig::default().max_types_per_stream(16))
//!     .with_stop(stopped);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:15010").await?;
//! let mut shutdown = stop.subscribe();
//! let serving = tokio::spawn(server.serve(listener, async move {
//!     let _ = shutdown.wait_for(|s| *s).await;
//! }));
//!
//! // Later: a new configuration; every stream is sent what changed for it.
//! let mut b = SnapshotBuilder::new();
//! b.declare(CLUSTER);
//! cache.set(b.build());
//!
//! // Shut down: streams end with OK, the listener closes.
//! stop.send_replace(true);
//! serving.await??;
//! # Ok(()) }
//! ```
//!
//! # Feature flags
//!
//! None. TLS is the caller's: serve over any acceptor with
//! [`AdsServer::serve_with_incoming`].
//!
//! # Stability
//!
//! Pre-1.0. The push rules follow the xDS protocol and are expected to stay; [`ServerConfig`]
//! may gain settings (each with a default) and [`RequestError`] variants (it is
//! `#[non_exhaustive]`). Resource versions are the first 64 bits of SHA-256 in hex and stay
//! stable across releases, so clients resume without a full resend after a server upgrade;
//! a type's content version is stable within a process only (see [`snapshot`]).

// docs.rs builds with `--cfg docsrs`: items behind a feature show it.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod access;
pub mod admission;
pub mod ads;
mod config;
mod delta;
mod error;
mod grpc;
mod io;
mod limits;
mod observer;
mod screen;
pub mod snapshot;
mod sotw;

/// The `envoy-types` crate this crate is built against.
pub use envoy_types;

/// The discovery messages of this crate's API, re-exported so that a user needs no
/// `envoy-types` dependency of a matching version.
pub mod envoy {
    pub use envoy_types::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
        Resource as DiscoveryResource,
    };
    pub use envoy_types::pb::google::protobuf::Any;
}

pub use access::{AccessPolicy, StreamAccess};
pub use admission::{Admission, AdmissionDeadline};
pub use ads::{AdsServer, AdsService, DeltaStream, SotwStream};
pub use config::ServerConfig;
pub use error::RequestError;
pub use observer::RequestObserver;
pub use snapshot::{
    Change, Resources, ResourcesIter, Snapshot, SnapshotBuilder, SnapshotCache, TypeSnapshot,
    VersionedResource,
};
