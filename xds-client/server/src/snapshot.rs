//! Snapshots of everything served over ADS, and the cache that publishes them.
//!
//! A [`Snapshot`] holds, per type URL, named resources as `google.protobuf.Any`. Each
//! resource's version is a hash of its bytes. A type's version is, by default, a hash of its
//! names and resource versions, so re-reading unchanged input yields equal versions and the
//! server pushes nothing; [`SnapshotBuilder::version`] or [`TypeSnapshot::with_version`] set
//! it explicitly instead (a State-of-the-World push then also happens when only that version
//! changes).
//!
//! Hashes are the first 64 bits of SHA-256, in hex: stable across processes and builds, so a
//! Delta client resuming against a restarted server is not sent what it already holds.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use envoy_types::pb::google::protobuf::Any;
use prost::Message;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

/// The resources of one type, by name, with their versions. The default is an empty type.
#[derive(Debug, Clone, PartialEq)]
pub struct TypeSnapshot {
    version: String,
    /// Hash of the names and resource versions, whatever `version` is.
    content: String,
    /// `version` was set by the caller rather than computed.
    explicit: bool,
    resources: BTreeMap<String, Arc<VersionedResource>>,
    /// Other names a Delta client may subscribe to a resource by, to its own name.
    aliases: BTreeMap<String, String>,
    /// Resources sent to every Delta subscriber of the type, named or not.
    implicit: BTreeSet<String>,
}

/// A resource and its content version.
#[derive(Debug, Clone)]
pub struct VersionedResource {
    /// Hash of the encoded resource.
    pub version: String,
    /// The resource.
    pub resource: Any,
}

/// Equal when the same resource is shared (one snapshot derived from another holds the
/// resources it did not change by reference), else when version and resource are equal.
impl PartialEq for VersionedResource {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
            || (self.version == other.version && self.resource == other.resource)
    }
}

/// Every resource served, per type URL. Build one with [`SnapshotBuilder`], or from
/// [`TypeSnapshot`]s with [`Snapshot::with_type`].
///
/// A type that is not in the snapshot is not served: requests for it get no answer at all,
/// in both protocol variants. Declare a type ([`SnapshotBuilder::declare`]) to serve it
/// empty.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    types: BTreeMap<String, TypeSnapshot>,
}

/// Collects resources into a [`Snapshot`].
#[derive(Debug, Default)]
pub struct SnapshotBuilder {
    types: BTreeMap<String, BTreeMap<String, Any>>,
    versions: BTreeMap<String, String>,
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
        self.add_any(type_url, name, any)
    }

    /// Adds an already encoded resource under `name` of type `type_url`, as it is: the `Any`'s
    /// own type URL is not checked (tests use this to serve invalid resources).
    pub fn add_any(&mut self, type_url: &str, name: &str, resource: Any) -> &mut Self {
        self.types
            .entry(type_url.to_owned())
            .or_default()
            .insert(name.to_owned(), resource);
        self
    }

    /// Sets the version of a type (and declares it) instead of the content hash. State of the
    /// World subscribers are then pushed the type whenever this version changes, even when
    /// their resources did not; Delta subscribers still get only changed resources.
    pub fn version(&mut self, type_url: &str, version: &str) -> &mut Self {
        self.declare(type_url);
        self.versions
            .insert(type_url.to_owned(), version.to_owned());
        self
    }

    /// The snapshot, with versions computed.
    pub fn build(self) -> Snapshot {
        let mut versions = self.versions;
        let types = self
            .types
            .into_iter()
            .map(|(url, resources)| {
                let ts = TypeSnapshot::new(resources);
                let ts = match versions.remove(&url) {
                    Some(v) => ts.with_version(v),
                    None => ts,
                };
                (url, ts)
            })
            .collect();
        Snapshot { types }
    }
}

// === impl Snapshot ===

impl Snapshot {
    /// An empty snapshot: no type is served.
    pub fn new() -> Self {
        Self::default()
    }

    /// This snapshot with `type_url` served as `resources`, replacing what it had of that type.
    pub fn with_type(mut self, type_url: &str, resources: TypeSnapshot) -> Self {
        self.types.insert(type_url.to_owned(), resources);
        self
    }

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
        self.types.get(type_url)?.resources.get(name).map(|r| &**r)
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
    /// Resources by name (a later duplicate name replaces an earlier one), each versioned by
    /// the hash of its bytes; the type's version is the hash of the names and versions.
    pub fn new(resources: impl IntoIterator<Item = (String, Any)>) -> Self {
        let resources: BTreeMap<String, Arc<VersionedResource>> = resources
            .into_iter()
            .map(|(name, resource)| {
                let version = hash_hex(&resource.value);
                (name, Arc::new(VersionedResource { version, resource }))
            })
            .collect();
        let content = content_hash(&resources);
        Self {
            version: content.clone(),
            content,
            explicit: false,
            resources,
            aliases: BTreeMap::new(),
            implicit: BTreeSet::new(),
        }
    }

    /// The same resources, with other names (`alias`, `name`) a Delta client may subscribe
    /// to them by. A client that subscribes to an alias is sent the resource under the alias
    /// it asked for, with the resource's own name in `aliases`: clients match what they
    /// receive with what they asked for by name (ztunnel's on-demand lookups by
    /// `network/IP` do). When the alias no longer resolves, the client is told both names
    /// are removed, so that it drops what it holds. An alias that is also a resource's name,
    /// or names no resource, is ignored.
    pub fn with_aliases(mut self, aliases: impl IntoIterator<Item = (String, String)>) -> Self {
        for (alias, name) in aliases {
            if !self.resources.contains_key(&alias) && self.resources.contains_key(&name) {
                self.aliases.insert(alias, name);
            }
        }
        self.rehash();
        self
    }

    /// The same resources, with these (of its names) sent to every Delta subscriber of the
    /// type, including one that subscribed to no name (ztunnel's on-demand mode, which
    /// expects the workloads of its own node without asking). A name the type does not
    /// hold is ignored.
    pub fn with_implicit(mut self, names: impl IntoIterator<Item = String>) -> Self {
        let held = |n: &String| self.resources.contains_key(n);
        let names: Vec<String> = names.into_iter().filter(held).collect();
        self.implicit.extend(names);
        self.rehash();
        self
    }

    /// The same type with each of `resources` added, or put in place of the resource of its
    /// name; every other resource is kept as it is (by reference), and the type's version is
    /// recomputed unless it was set explicitly. Aliases and implicit names are kept, minus
    /// those that no longer hold.
    pub fn with_resources(mut self, resources: impl IntoIterator<Item = (String, Any)>) -> Self {
        for (name, resource) in resources {
            let version = hash_hex(&resource.value);
            // No resource is removed: only an alias that is now a resource's name goes.
            self.aliases.remove(&name);
            self.resources
                .insert(name, Arc::new(VersionedResource { version, resource }));
        }
        self.rehash();
        self
    }

    /// The resource name `alias` stands for ([`with_aliases`](Self::with_aliases)).
    pub fn alias(&self, alias: &str) -> Option<&str> {
        self.aliases.get(alias).map(String::as_str)
    }

    /// The names sent to every Delta subscriber ([`with_implicit`](Self::with_implicit)).
    pub fn implicit(&self) -> &BTreeSet<String> {
        &self.implicit
    }

    /// Recomputes the content hash (and the version, unless explicit) with the aliases and
    /// implicit names, so that a change of either alone is seen as a change of the type.
    /// Without either, the content hash is that of the resources alone, as [`Self::new`]
    /// computes it.
    fn rehash(&mut self) {
        self.content = content_hash(&self.resources);
        if !self.explicit {
            self.version = self.content.clone();
        }
        if self.aliases.is_empty() && self.implicit.is_empty() {
            return;
        }
        let mut h = Sha256::new();
        h.update(self.content.as_bytes());
        for (alias, name) in &self.aliases {
            h.update([1]);
            h.update(alias.as_bytes());
            h.update([0]);
            h.update(name.as_bytes());
        }
        for name in &self.implicit {
            h.update([2]);
            h.update(name.as_bytes());
        }
        self.content = hex64(&h.finalize());
        if !self.explicit {
            self.version = self.content.clone();
        }
    }

    /// The same resources at an explicit type version (see [`SnapshotBuilder::version`]).
    pub fn with_version(mut self, version: impl Into<String>) -> Self {
        self.version = version.into();
        self.explicit = true;
        self
    }

    /// The type's version: the one set explicitly, else a hash of the names and versions of
    /// every resource of the type. Sent as SotW `version_info` and Delta
    /// `system_version_info`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The resources by name.
    pub fn resources(&self) -> &BTreeMap<String, Arc<VersionedResource>> {
        &self.resources
    }

    /// The resources for which `keep` returns true, with their versions unchanged and the
    /// type's version recomputed from what is kept (an explicit version is kept as it is): a
    /// per-client view of a type without re-encoding or re-hashing its resources. Aliases and
    /// implicit names are not carried over: set them on the view.
    pub fn filtered(&self, mut keep: impl FnMut(&str, &VersionedResource) -> bool) -> Self {
        let resources: BTreeMap<String, Arc<VersionedResource>> = self
            .resources
            .iter()
            .filter(|(name, r)| keep(name, r))
            .map(|(name, r)| (name.clone(), Arc::clone(r)))
            .collect();
        let content = content_hash(&resources);
        Self {
            version: if self.explicit {
                self.version.clone()
            } else {
                content.clone()
            },
            content,
            explicit: self.explicit,
            resources,
            aliases: BTreeMap::new(),
            implicit: BTreeSet::new(),
        }
    }

    /// Hash of the names and resource versions, whatever the version is.
    pub(crate) fn content(&self) -> &str {
        &self.content
    }

    /// Whether [`version`](Self::version) was set explicitly.
    pub(crate) fn explicit(&self) -> bool {
        self.explicit
    }
}

impl Default for TypeSnapshot {
    fn default() -> Self {
        Self::new([])
    }
}

/// Hash of the names and versions of `resources`: a type's content version.
fn content_hash(resources: &BTreeMap<String, Arc<VersionedResource>>) -> String {
    let mut h = Sha256::new();
    for (name, r) in resources {
        h.update(name.as_bytes());
        h.update([0]);
        h.update(r.version.as_bytes());
        h.update([0]);
    }
    hex64(&h.finalize())
}

fn hash_hex(bytes: &[u8]) -> String {
    hex64(&Sha256::digest(bytes))
}

/// The first 64 bits of a digest, in hex.
fn hex64(digest: &[u8]) -> String {
    use std::fmt::Write;
    digest
        .iter()
        .take(8)
        .fold(String::with_capacity(16), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

// === impl SnapshotCache ===

impl SnapshotCache {
    /// A cache serving `initial`.
    pub fn new(initial: Snapshot) -> Self {
        Self {
            tx: Arc::new(watch::channel(Arc::new(initial)).0),
        }
    }

    /// Replaces what is served; streams are woken only when something differs, so setting an
    /// equal snapshot pushes nothing.
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

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "type.googleapis.com/test.A";

    fn any(bytes: &[u8]) -> Any {
        Any {
            type_url: A.into(),
            value: bytes.to_vec(),
        }
    }

    #[test]
    fn content_versions_are_stable_and_follow_content() {
        let build = |v: &[u8]| {
            let mut b = SnapshotBuilder::new();
            b.add_any(A, "a", any(v));
            b.build()
        };
        assert_eq!(build(b"1"), build(b"1"));
        assert_ne!(build(b"1").version(A), build(b"2").version(A));
        assert_eq!(
            build(b"1").get(A, "a").map(|r| r.version.as_str()),
            Some(hash_hex(b"1").as_str())
        );
        assert_eq!(hash_hex(b""), "e3b0c44298fc1c14", "SHA-256 of nothing");
    }

    #[test]
    fn explicit_version_replaces_the_hash_but_not_resource_versions() {
        let mut b = SnapshotBuilder::new();
        b.add_any(A, "a", any(b"1")).version(A, "v7");
        let s = b.build();
        assert_eq!(s.version(A), Some("v7"));
        let plain = Snapshot::new().with_type(A, TypeSnapshot::new([("a".into(), any(b"1"))]));
        assert_eq!(s.get(A, "a"), plain.get(A, "a"));
        assert_ne!(s, plain);
    }

    #[test]
    fn resources_put_in_place_keep_the_others_by_reference() {
        let before = TypeSnapshot::new([("a".into(), any(b"1")), ("b".into(), any(b"2"))])
            .with_aliases([("alias-of-b".into(), "b".into())]);
        let after = before
            .clone()
            .with_resources([("a".into(), any(b"3")), ("c".into(), any(b"4"))]);
        assert!(Arc::ptr_eq(
            &before.resources()["b"],
            &after.resources()["b"]
        ));
        assert_ne!(before.resources()["a"], after.resources()["a"]);
        assert_eq!(after.resources()["c"].resource.value, b"4");
        assert_eq!(after.alias("alias-of-b"), Some("b"));
        assert_ne!(before.version(), after.version());
        // Built whole from the same resources, the version is the same, with or without
        // aliases.
        let plain = TypeSnapshot::new([("a".into(), any(b"1"))]);
        let put = plain.clone().with_resources([("a".into(), any(b"1"))]);
        assert_eq!((put.version(), &put), (plain.version(), &plain));
        let whole = TypeSnapshot::new([
            ("a".into(), any(b"3")),
            ("b".into(), any(b"2")),
            ("c".into(), any(b"4")),
        ])
        .with_aliases([("alias-of-b".into(), "b".into())]);
        assert_eq!(whole, after);
        assert_eq!(whole.version(), after.version());
        // An alias that a resource's name now takes stands for nothing.
        let taken = after.with_resources([("alias-of-b".into(), any(b"5"))]);
        assert_eq!(taken.alias("alias-of-b"), None);
    }

    #[test]
    fn setting_an_equal_snapshot_wakes_nobody() {
        let cache = SnapshotCache::default();
        let mut rx = cache.subscribe();
        cache.set(Snapshot::new());
        assert!(!rx.has_changed().unwrap_or(true));
        cache.set(Snapshot::new().with_type(A, TypeSnapshot::default()));
        assert!(rx.has_changed().unwrap_or(false));
        rx.borrow_and_update();
        cache.set(Snapshot::new().with_type(A, TypeSnapshot::default()));
        assert!(!rx.has_changed().unwrap_or(true));
    }
}
