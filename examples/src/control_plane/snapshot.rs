//! Snapshots of everything served over ADS, and the cache that publishes them.
//!
//! A [`Snapshot`] holds, per type URL, named resources as `google.protobuf.Any`. Versions are
//! content hashes: each resource's version is a hash of its bytes, and a type's version a hash
//! of its names and resource versions. Re-reading unchanged manifests therefore yields equal
//! versions, and the ADS server pushes nothing.

use std::collections::BTreeMap;
use std::hash::Hasher;
use std::sync::Arc;

use envoy_types::pb::google::protobuf::Any;
use prost::Message;
use tokio::sync::watch;

/// The resources of one type, by name, with their versions.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TypeSnapshot {
    version: String,
    resources: BTreeMap<String, VersionedResource>,
}

/// A resource and its content version.
#[derive(Debug, Clone, PartialEq)]
pub struct VersionedResource {
    /// Hash of the encoded resource.
    pub version: String,
    /// The resource.
    pub resource: Any,
}

/// Every resource served, per type URL. Build one with [`SnapshotBuilder`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    types: BTreeMap<String, TypeSnapshot>,
}

/// Collects resources into a [`Snapshot`].
#[derive(Debug, Default)]
pub struct SnapshotBuilder {
    types: BTreeMap<String, BTreeMap<String, Any>>,
}

/// Publishes the current [`Snapshot`] to every ADS stream. Cloning gives another handle on the
/// same cache.
#[derive(Debug, Clone)]
pub struct SnapshotCache {
    tx: Arc<watch::Sender<Arc<Snapshot>>>,
}

// === impl SnapshotBuilder ===

impl SnapshotBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Declares a type as served even when it has no resources, so that subscribers to it get
    /// an (empty) answer.
    pub fn declare(&mut self, type_url: &str) -> &mut Self {
        self.types.entry(type_url.to_owned()).or_default();
        self
    }

    /// Adds `message` under `name`, encoded as an `Any` of `type_url`. A second resource of the
    /// same type and name replaces the first.
    pub fn add<M: Message>(&mut self, type_url: &str, name: &str, message: &M) -> &mut Self {
        let any = Any {
            type_url: type_url.to_owned(),
            value: message.encode_to_vec(),
        };
        self.types
            .entry(type_url.to_owned())
            .or_default()
            .insert(name.to_owned(), any);
        self
    }

    /// The snapshot, with versions computed.
    pub fn build(self) -> Snapshot {
        let types = self
            .types
            .into_iter()
            .map(|(url, resources)| {
                let mut type_hash = std::hash::DefaultHasher::new();
                let resources: BTreeMap<String, VersionedResource> = resources
                    .into_iter()
                    .map(|(name, resource)| {
                        let version = hash_hex(&resource.value);
                        type_hash.write(name.as_bytes());
                        type_hash.write_u8(0);
                        type_hash.write(version.as_bytes());
                        (name, VersionedResource { version, resource })
                    })
                    .collect();
                let version = format!("{:016x}", type_hash.finish());
                (url, TypeSnapshot { version, resources })
            })
            .collect();
        Snapshot { types }
    }
}

fn hash_hex(bytes: &[u8]) -> String {
    let mut h = std::hash::DefaultHasher::new();
    h.write(bytes);
    format!("{:016x}", h.finish())
}

// === impl Snapshot ===

impl Snapshot {
    /// The served type URLs.
    pub fn type_urls(&self) -> impl Iterator<Item = &str> {
        self.types.keys().map(String::as_str)
    }

    /// The resources of one type, or `None` when the type is not served.
    pub fn get_type(&self, type_url: &str) -> Option<&TypeSnapshot> {
        self.types.get(type_url)
    }

    /// The version of one type.
    pub fn version(&self, type_url: &str) -> Option<&str> {
        self.types.get(type_url).map(|t| t.version.as_str())
    }

    /// One resource.
    pub fn get(&self, type_url: &str, name: &str) -> Option<&VersionedResource> {
        self.types.get(type_url)?.resources.get(name)
    }

    /// Names of the resources of one type, in order.
    pub fn names(&self, type_url: &str) -> Vec<String> {
        self.types
            .get(type_url)
            .map(|t| t.resources.keys().cloned().collect())
            .unwrap_or_default()
    }
}

// === impl TypeSnapshot ===

impl TypeSnapshot {
    /// Hash of the names and versions of every resource of the type.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The resources by name.
    pub fn resources(&self) -> &BTreeMap<String, VersionedResource> {
        &self.resources
    }
}

// === impl SnapshotCache ===

impl SnapshotCache {
    /// A cache serving `initial`.
    pub fn new(initial: Snapshot) -> Self {
        Self {
            tx: Arc::new(watch::channel(Arc::new(initial)).0),
        }
    }

    /// Replaces what is served; streams are woken only when something differs.
    pub fn set(&self, snapshot: Snapshot) {
        self.tx.send_if_modified(|current| {
            if **current == snapshot {
                false
            } else {
                *current = Arc::new(snapshot);
                true
            }
        });
    }

    /// What is served now.
    pub fn current(&self) -> Arc<Snapshot> {
        self.tx.borrow().clone()
    }

    /// A receiver that wakes on each new snapshot.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.tx.subscribe()
    }
}

impl Default for SnapshotCache {
    fn default() -> Self {
        Self::new(Snapshot::default())
    }
}
