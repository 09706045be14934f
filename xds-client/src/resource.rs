//! Typed xDS resources: the [`Resource`] trait, its implementations for the Envoy types, and the
//! type-erased [`ResourceType`] that the protocol core works with.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
use prost::Message;

use crate::validate::{self, Violation};

/// A decoded resource with its concrete type erased; [`Arc::downcast`] recovers it.
pub type AnyResource = Arc<dyn Any + Send + Sync>;

/// Type URL of Listener (LDS).
pub const LISTENER_TYPE_URL: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
/// Type URL of RouteConfiguration (RDS).
pub const ROUTE_TYPE_URL: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
/// Type URL of Cluster (CDS).
pub const CLUSTER_TYPE_URL: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// Type URL of ClusterLoadAssignment (EDS).
pub const ENDPOINT_TYPE_URL: &str =
    "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
/// Type URL of Secret (SDS).
pub const SECRET_TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
/// Type URL of the `envoy.service.discovery.v3.Resource` wrapper (TTL and heartbeats in SotW).
pub const RESOURCE_WRAPPER_TYPE_URL: &str =
    "type.googleapis.com/envoy.service.discovery.v3.Resource";

/// Why a resource was rejected: it did not decode, or it decoded but is not valid.
///
/// A rejection by one of the built-in Envoy types' rules carries the [`Violation`], which names
/// the field and the rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidResource {
    message: String,
    violation: Option<Box<Violation>>,
}

/// A resource type that can be received over xDS.
///
/// Decoding is two-step: [`decode`](Resource::decode) turns bytes into a value (whose
/// [`name`](Resource::name) is then known), and [`validate`](Resource::validate) checks it, so a
/// rejection is reported against the resource's name.
///
/// # Example: a user type
///
/// ```
/// use meshkit_xds_client::{InvalidResource, Resource};
///
/// #[derive(Clone, PartialEq, prost::Message)]
/// struct Workload {
///     #[prost(string, tag = "1")]
///     name: String,
///     #[prost(string, tag = "2")]
///     address: String,
/// }
///
/// impl Resource for Workload {
///     const TYPE_URL: &'static str = "type.googleapis.com/example.Workload";
///
///     fn decode(bytes: &[u8]) -> Result<Self, InvalidResource> {
///         <Workload as prost::Message>::decode(bytes).map_err(InvalidResource::from)
///     }
///     fn name(&self) -> &str {
///         &self.name
///     }
///     fn validate(&self) -> Result<(), InvalidResource> {
///         if self.address.is_empty() {
///             return Err(InvalidResource::new("address is empty"));
///         }
///         Ok(())
///     }
/// }
/// ```
pub trait Resource: Send + Sync + Sized + 'static {
    /// The type URL, `type.googleapis.com/<full protobuf name>`.
    const TYPE_URL: &'static str;

    /// State-of-the-World only: whether a resource missing from a response is deleted. True for
    /// Listener and Cluster, false for RouteConfiguration and ClusterLoadAssignment (xDS
    /// protocol, "Deleting resources").
    const ALL_RESOURCES_REQUIRED_IN_SOTW: bool = false;

    /// Step one: decodes the serialized message.
    ///
    /// # Errors
    ///
    /// The bytes are not a valid encoding of the message.
    fn decode(bytes: &[u8]) -> Result<Self, InvalidResource>;

    /// The resource name, by which it is subscribed.
    fn name(&self) -> &str;

    /// Step two: checks a decoded resource. The default accepts everything.
    ///
    /// # Errors
    ///
    /// The resource must not be applied; the message says why.
    fn validate(&self) -> Result<(), InvalidResource> {
        Ok(())
    }
}

type ErasedDecode = fn(&[u8]) -> Result<(String, AnyResource), InvalidResource>;

/// A resource type with its concrete type erased, as the protocol core sees it.
#[derive(Clone, Copy)]
pub struct ResourceType {
    type_url: &'static str,
    all_required: bool,
    decode: ErasedDecode,
    validate: fn(&AnyResource) -> Result<(), InvalidResource>,
}

// === impl InvalidResource ===

impl InvalidResource {
    /// A rejection with the given reason.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            violation: None,
        }
    }

    /// The reason.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The rule broken and the field that breaks it, when a [`validate`] check rejected the
    /// resource.
    pub fn violation(&self) -> Option<&Violation> {
        self.violation.as_deref()
    }
}

impl From<Violation> for InvalidResource {
    fn from(v: Violation) -> Self {
        Self {
            message: v.to_string(),
            violation: Some(Box::new(v)),
        }
    }
}

impl fmt::Display for InvalidResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for InvalidResource {}

impl From<prost::DecodeError> for InvalidResource {
    fn from(e: prost::DecodeError) -> Self {
        Self::new(format!("decode error: {e}"))
    }
}

// === impl ResourceType ===

impl ResourceType {
    /// The erased form of `T`.
    pub fn of<T: Resource>() -> Self {
        Self {
            type_url: T::TYPE_URL,
            all_required: T::ALL_RESOURCES_REQUIRED_IN_SOTW,
            decode: decode_erased::<T>,
            validate: validate_erased::<T>,
        }
    }

    /// The type URL.
    pub fn type_url(&self) -> &'static str {
        self.type_url
    }

    /// See [`Resource::ALL_RESOURCES_REQUIRED_IN_SOTW`].
    pub fn all_resources_required_in_sotw(&self) -> bool {
        self.all_required
    }

    /// Step one, erased: decodes and returns the name with the value.
    pub(crate) fn decode(&self, bytes: &[u8]) -> Result<(String, AnyResource), InvalidResource> {
        (self.decode)(bytes)
    }

    /// Step two, erased.
    pub(crate) fn validate(&self, value: &AnyResource) -> Result<(), InvalidResource> {
        (self.validate)(value)
    }
}

impl fmt::Debug for ResourceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResourceType")
            .field("type_url", &self.type_url)
            .field("all_required", &self.all_required)
            .finish()
    }
}

fn decode_erased<T: Resource>(bytes: &[u8]) -> Result<(String, AnyResource), InvalidResource> {
    let value = T::decode(bytes)?;
    Ok((value.name().to_owned(), Arc::new(value)))
}

fn validate_erased<T: Resource>(value: &AnyResource) -> Result<(), InvalidResource> {
    match value.downcast_ref::<T>() {
        Some(v) => v.validate(),
        None => Err(InvalidResource::new(
            "internal: resource of an unexpected type",
        )),
    }
}

// === impl Resource for Envoy types ===

impl Resource for Listener {
    const TYPE_URL: &'static str = LISTENER_TYPE_URL;
    const ALL_RESOURCES_REQUIRED_IN_SOTW: bool = true;

    fn decode(bytes: &[u8]) -> Result<Self, InvalidResource> {
        <Self as Message>::decode(bytes).map_err(Into::into)
    }
    fn name(&self) -> &str {
        &self.name
    }
    /// [`validate::listener`]: the schema and Envoy's listener rules.
    fn validate(&self) -> Result<(), InvalidResource> {
        validate::listener(self).map_err(Into::into)
    }
}

impl Resource for RouteConfiguration {
    const TYPE_URL: &'static str = ROUTE_TYPE_URL;

    fn decode(bytes: &[u8]) -> Result<Self, InvalidResource> {
        <Self as Message>::decode(bytes).map_err(Into::into)
    }
    fn name(&self) -> &str {
        &self.name
    }
    /// [`validate::route_configuration`]: the schema and Envoy's route rules.
    fn validate(&self) -> Result<(), InvalidResource> {
        validate::route_configuration(self).map_err(Into::into)
    }
}

impl Resource for Cluster {
    const TYPE_URL: &'static str = CLUSTER_TYPE_URL;
    const ALL_RESOURCES_REQUIRED_IN_SOTW: bool = true;

    fn decode(bytes: &[u8]) -> Result<Self, InvalidResource> {
        <Self as Message>::decode(bytes).map_err(Into::into)
    }
    fn name(&self) -> &str {
        &self.name
    }
    /// [`validate::cluster`]: the schema and Envoy's cluster rules.
    fn validate(&self) -> Result<(), InvalidResource> {
        validate::cluster(self).map_err(Into::into)
    }
}

impl Resource for ClusterLoadAssignment {
    const TYPE_URL: &'static str = ENDPOINT_TYPE_URL;

    fn decode(bytes: &[u8]) -> Result<Self, InvalidResource> {
        <Self as Message>::decode(bytes).map_err(Into::into)
    }
    fn name(&self) -> &str {
        &self.cluster_name
    }
    /// [`validate::cluster_load_assignment`]: the schema and what Envoy's EDS checks.
    fn validate(&self) -> Result<(), InvalidResource> {
        validate::cluster_load_assignment(self).map_err(Into::into)
    }
}

impl Resource for Secret {
    const TYPE_URL: &'static str = SECRET_TYPE_URL;

    fn decode(bytes: &[u8]) -> Result<Self, InvalidResource> {
        <Self as Message>::decode(bytes).map_err(Into::into)
    }
    fn name(&self) -> &str {
        &self.name
    }
    /// [`validate::secret`]: the schema (Envoy checks certificates when it uses them).
    fn validate(&self) -> Result<(), InvalidResource> {
        validate::secret(self).map_err(Into::into)
    }
}
