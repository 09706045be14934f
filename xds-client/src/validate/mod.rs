//! Validation of the Envoy resource types as Envoy validates them: the checks their `.proto`
//! files declare with protoc-gen-validate, generated from those annotations, then the rules
//! Envoy applies when it loads a resource.
//!
//! [`Resource::validate`](crate::Resource::validate) of `Listener`, `RouteConfiguration`,
//! `Cluster`, `ClusterLoadAssignment` and `Secret` calls the function of that type here; a
//! control plane can call them too, to check what it is about to serve.
//!
//! Each function checks, in this order:
//! 1. the resource name is not empty (`xds.name`; the protocol core keys its cache by it);
//! 2. the schema: every rule of the protoc-gen-validate annotations on every message reachable
//!    from the resource (not inside `google.protobuf.Any` payloads, which name extensions this
//!    crate does not know), plus two checks Envoy makes of every resource: each enum field
//!    holds a value its enum defines (`enum.defined`; protoc-gen-validate's `defined_only`
//!    where the proto asks for it), and each `Duration` is non-negative and within protobuf's
//!    range (`envoy.duration`);
//! 3. the load rules of Envoy's listener manager, route matcher, cluster factories and EDS
//!    (`envoy.<resource>.<rule>`), such as an EDS cluster with `lb_policy: CLUSTER_PROVIDED`
//!    or two virtual hosts sharing a domain.
//!
//! The first rule broken is reported as a [`Violation`] that names the field by its path from
//! the resource. `docs/xds.md` lists every rule beside what Envoy and gRPC check.
//!
//! # Example
//!
//! ```
//! use meshkit_xds_client::envoy::Cluster;
//! use meshkit_xds_client::validate;
//!
//! let cluster = Cluster { name: "c".into(), lb_policy: 99, ..Default::default() };
//! let v = validate::cluster(&cluster).unwrap_err();
//! assert_eq!(v.field(), "lb_policy");
//! assert_eq!(v.rule(), "enum.defined_only");
//! ```

#[allow(
    deprecated,
    clippy::collapsible_if,
    clippy::collapsible_match,
    clippy::single_match,
    clippy::nonminimal_bool,
    clippy::manual_range_contains,
    clippy::too_many_lines,
    clippy::neg_cmp_op_on_partial_ord,
    reason = "generated code: one check after another, in the shape the generator writes; \
              deprecated fields are still fields Envoy validates; `!(x > bound)` is meant to \
              reject NaN"
)]
mod generated;
mod semantic;
mod support;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;

pub use support::Violation;

/// Checks a `Listener`: its name, its schema, then Envoy's listener rules (an address unless
/// it is an internal or API listener, resolvable addresses, filter chains a TCP or QUIC
/// listener needs, no two filter chains with the same match, ...).
///
/// # Errors
///
/// The first rule the listener breaks.
pub fn listener(l: &Listener) -> Result<(), Violation> {
    semantic::name("name", &l.name)?;
    generated::listener(l)?;
    semantic::listener(l)
}

/// Checks a `RouteConfiguration`: its name, its schema, then Envoy's route rules (unique
/// domains, headers that may be added and removed, one rewrite per route, weighted clusters
/// that sum to more than zero, ...) and meshkit's unique virtual host names.
///
/// # Errors
///
/// The first rule the route configuration breaks.
pub fn route_configuration(r: &RouteConfiguration) -> Result<(), Violation> {
    semantic::name("name", &r.name)?;
    generated::route_configuration(r)?;
    semantic::route_configuration(r)
}

/// Checks a `Cluster`: its schema (which requires the name), then Envoy's cluster rules (the
/// discovery type against the load assignment and the LB policy, EDS config only and always
/// on EDS clusters, resolvable static endpoints, ...).
///
/// # Errors
///
/// The first rule the cluster breaks.
pub fn cluster(c: &Cluster) -> Result<(), Violation> {
    generated::cluster(c)?;
    semantic::cluster(c)
}

/// Checks a `ClusterLoadAssignment`: its schema (which requires `cluster_name`), then what
/// Envoy's EDS checks of an assignment (one drop category of at most 100%, endpoints with
/// resolvable addresses, LEDS or endpoints per locality).
///
/// # Errors
///
/// The first rule the assignment breaks.
pub fn cluster_load_assignment(c: &ClusterLoadAssignment) -> Result<(), Violation> {
    generated::cluster_load_assignment(c)?;
    semantic::cluster_load_assignment(c)
}

/// Checks a `Secret`: its name and its schema. Envoy checks a secret's certificates and keys
/// when a TLS context uses it, not when SDS delivers it, and so does this crate: it has no load
/// rules for secrets.
///
/// # Errors
///
/// The first rule the secret breaks.
pub fn secret(s: &Secret) -> Result<(), Violation> {
    semantic::name("name", &s.name)?;
    generated::secret(s)
}
