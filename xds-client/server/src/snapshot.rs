//! Snapshots of everything served over ADS, and the cache that publishes them.
//!
//! A [`Snapshot`] holds, per type URL, named resources as `google.protobuf.Any`. Each
//! resource's version is a hash of its bytes. A type's version is, by default, a hash of its
//! names and resource versions, so re-reading unchanged input yields equal versions and the
//! server pushes nothing; [`SnapshotBuilder::version`] or [`TypeSnapshot::with_version`] set
//! it explicitly instead (a State-of-the-World push then also happens when only that version
//! changes).
//!
//! A resource's version is the first 64 bits of SHA-256 of its bytes, in hex: stable across
//! processes and builds, so a Delta client resuming against a restarted server is not sent
//! what it already holds. A type's content hash is the sum of a keyed hash of each of its
//! entries (name and version, alias, implicit name), under a key drawn once per process: it is
//! updated in step with each resource put in place rather than computed again, and no input
//! can be crafted to make two different types hash alike, since nobody outside the process
//! knows the key. It is stable within a process only.
//!
//! The resources of a type are held in a persistent map ([`Resources`]): a type derived from
//! another with some resources put in place shares the rest of its structure, so deriving
//! it, cloning it and telling what changed between the two cost in proportion to the change,
//! not to the type.

use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::{Arc, OnceLock};

use envoy_types::pb::google::protobuf::Any;
use imbl::OrdMap;
use prost::Message;
use sha2::{Digest, Sha256};
use tokio::sync::watch;

/// The resources of one type, by name, with their versions. The default is an empty type.
#[derive(Debug, Clone)]
pub struct TypeSnapshot {
    version: String,
    /// Sum of the keyed hashes of every resource, alias and implicit name.
    content: u128,
    /// `version` was set by the caller rather than computed.
    explicit: bool,
    resources: Resources,
    /// Other names a Delta client may subscribe to a resource by, to its own name.
    aliases: OrdMap<String, String>,
    /// Resources sent to every Delta subscriber of the type, named or not.
    implicit: Arc<BTreeSet<String>>,
    /// Tells this type from any other built or derived in the process; a clone keeps it.
    id: u64,
    /// When this type is another with resources put in place: that one and the names.
    step: Option<Arc<Step>>,
}

/// Resources put in place ([`TypeSnapshot::with_versioned`]).
#[derive(Debug)]
struct Step {
    /// The `id` of the type they were put in.
    from: u64,
    names: Vec<Arc<str>>,
}

/// Equal when they serve the same: the same resources, aliases, implicit names and version,
/// however each came to be. Two types whose content hashes differ are told apart without
/// looking further.
impl PartialEq for TypeSnapshot {
    fn eq(&self, other: &Self) -> bool {
        self.content == other.content
            && self.explicit == other.explicit
            && self.version == other.version
            && self.resources == other.resources
            && self.aliases == other.aliases
            && self.implicit == other.implicit
    }
}

/// The resources of one type by name, in name order. It is a persistent map: a clone costs a
/// reference count, and a type derived from another shares every resource it did not put in
/// place.
#[derive(Debug, Clone, Default)]
pub struct Resources(OrdMap<Arc<str>, Arc<VersionedResource>>);

/// What changed from one [`Resources`] to another ([`Resources::diff`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Change<'a> {
    /// The name is new, or holds another resource.
    Put(&'a str, &'a Arc<VersionedResource>),
    /// The name is gone.
    Removed(&'a str),
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
            .map(|t| t.resources.keys().map(str::to_owned).collect())
            .unwrap_or_default()
    }
}

// === impl Resources ===

impl Resources {
    /// The resource of `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<VersionedResource>> {
        self.0.get(name)
    }

    /// The resource of `name`, with the name as held.
    pub fn get_key_value(&self, name: &str) -> Option<(&str, &Arc<VersionedResource>)> {
        self.0.get_key_value(name).map(|(name, r)| (&**name, r))
    }

    /// Whether a resource of `name` is held.
    pub fn contains_key(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    /// The name of the resource of `name`, as the map keeps it (to share rather than copy).
    pub(crate) fn key(&self, name: &str) -> Option<&Arc<str>> {
        self.0.get_key_value(name).map(|(key, _)| key)
    }

    /// How many resources are held.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The resources in name order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&str, &Arc<VersionedResource>)> {
        self.0.iter().map(|(name, r)| (&**name, r))
    }

    /// The names in order.
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &str> {
        self.0.keys().map(|name| &**name)
    }

    /// The resources in name order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &Arc<VersionedResource>> {
        self.0.values()
    }

    /// What changed from `self` to `after`, in name order. What the two share (one derived
    /// from the other) is not looked at: the cost follows the change, not the size.
    pub fn diff<'a>(&'a self, after: &'a Resources) -> impl Iterator<Item = Change<'a>> {
        self.0.diff(&after.0).map(|item| match item {
            imbl::ordmap::DiffItem::Add(name, r)
            | imbl::ordmap::DiffItem::Update { new: (name, r), .. } => Change::Put(name, r),
            imbl::ordmap::DiffItem::Remove(name, _) => Change::Removed(name),
        })
    }

    /// Whether both are the same map (one is a clone of the other with nothing changed since).
    pub fn same(&self, other: &Resources) -> bool {
        self.0.ptr_eq(&other.0)
    }
}

/// Equal when they hold the same names with equal resources; what they share is not looked
/// at.
impl PartialEq for Resources {
    fn eq(&self, other: &Self) -> bool {
        self.same(other) || (self.len() == other.len() && self.diff(other).next().is_none())
    }
}

/// The resource of a name.
///
/// # Panics
///
/// When no resource has that name.
impl std::ops::Index<&str> for Resources {
    type Output = Arc<VersionedResource>;

    fn index(&self, name: &str) -> &Self::Output {
        &self.0[name]
    }
}

impl<'a> IntoIterator for &'a Resources {
    type Item = (&'a str, &'a Arc<VersionedResource>);
    type IntoIter = ResourcesIter<'a>;

    fn into_iter(self) -> Self::IntoIter {
        ResourcesIter(self.0.iter())
    }
}

impl<N: Into<Arc<str>>> FromIterator<(N, Arc<VersionedResource>)> for Resources {
    fn from_iter<I: IntoIterator<Item = (N, Arc<VersionedResource>)>>(iter: I) -> Self {
        Self(iter.into_iter().map(|(name, r)| (name.into(), r)).collect())
    }
}

/// The resources of a [`Resources`] in name order.
pub struct ResourcesIter<'a>(
    imbl::ordmap::Iter<'a, Arc<str>, Arc<VersionedResource>, imbl::shared_ptr::DefaultSharedPtr>,
);

impl std::fmt::Debug for ResourcesIter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResourcesIter").finish_non_exhaustive()
    }
}

impl<'a> Iterator for ResourcesIter<'a> {
    type Item = (&'a str, &'a Arc<VersionedResource>);

    fn next(&mut self) -> Option<Self::Item> {
        self.0.next().map(|(name, r)| (&**name, r))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.0.size_hint()
    }
}

// === impl TypeSnapshot ===

impl TypeSnapshot {
    /// Resources by name (a later duplicate name replaces an earlier one), each versioned by
    /// the hash of its bytes; the type's version is the hash of the names and versions.
    pub fn new(resources: impl IntoIterator<Item = (String, Any)>) -> Self {
        let resources: Resources = resources
            .into_iter()
            .map(|(name, resource)| {
                let version = hash_hex(&resource.value);
                (name, Arc::new(VersionedResource { version, resource }))
            })
            .collect();
        Self::of(resources, None)
    }

    /// `resources` with no alias nor implicit name, at `version` if it is set explicitly.
    fn of(resources: Resources, explicit: Option<String>) -> Self {
        let content = resources.iter().fold(0u128, |sum, (name, r)| {
            sum.wrapping_add(resource_digest(name, r))
        });
        let mut ts = Self {
            version: String::new(),
            content,
            explicit: explicit.is_some(),
            resources,
            aliases: OrdMap::new(),
            implicit: Arc::default(),
            id: next_id(),
            step: None,
        };
        ts.version = explicit.unwrap_or_else(|| ts.content_version());
        ts
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
                let digest = alias_digest(&alias, &name);
                if let Some(before) = self.aliases.insert(alias.clone(), name) {
                    self.content = self.content.wrapping_sub(alias_digest(&alias, &before));
                }
                self.content = self.content.wrapping_add(digest);
            }
        }
        self.restate();
        self
    }

    /// The same resources without these aliases ([`with_aliases`](Self::with_aliases)); an
    /// alias the type does not have is ignored.
    pub fn without_aliases<'a>(mut self, aliases: impl IntoIterator<Item = &'a str>) -> Self {
        for alias in aliases {
            // Looked up first, as in `with_versioned`.
            if self.aliases.contains_key(alias)
                && let Some(name) = self.aliases.remove(alias)
            {
                self.content = self.content.wrapping_sub(alias_digest(alias, &name));
            }
        }
        self.restate();
        self
    }

    /// The same resources, with these (of its names) sent to every Delta subscriber of the
    /// type, including one that subscribed to no name (ztunnel's on-demand mode, which
    /// expects the workloads of its own node without asking). A name the type does not
    /// hold is ignored.
    pub fn with_implicit(mut self, names: impl IntoIterator<Item = String>) -> Self {
        let mut implicit = (*self.implicit).clone();
        for name in names {
            if self.resources.contains_key(&name) && !implicit.contains(&name) {
                self.content = self.content.wrapping_add(implicit_digest(&name));
                implicit.insert(name);
            }
        }
        self.implicit = Arc::new(implicit);
        self.restate();
        self
    }

    /// The same type with each of `resources` added, or put in place of the resource of its
    /// name; every other resource is kept as it is (by reference), and the type's version is
    /// updated unless it was set explicitly. Aliases and implicit names are kept, minus
    /// those that no longer hold. The cost follows the number of resources put in place.
    pub fn with_resources(self, resources: impl IntoIterator<Item = (String, Any)>) -> Self {
        self.with_versioned(resources.into_iter().map(|(name, resource)| {
            let version = hash_hex(&resource.value);
            (name, Arc::new(VersionedResource { version, resource }))
        }))
    }

    /// [`with_resources`](Self::with_resources), of resources already versioned: taken from
    /// another snapshot (a view of a type puts in place what changed in the type), they are
    /// shared rather than encoded and hashed again.
    pub fn with_versioned(
        mut self,
        resources: impl IntoIterator<Item = (String, Arc<VersionedResource>)>,
    ) -> Self {
        let from = self.id;
        let mut names = Vec::new();
        for (name, r) in resources {
            // No resource is removed: only an alias that is now a resource's name goes.
            // (Looked up first: removing copies the path to where the name would be, and an
            // unchanged map stays shared.)
            if self.aliases.contains_key(&name)
                && let Some(stood_for) = self.aliases.remove(&name)
            {
                self.content = self.content.wrapping_sub(alias_digest(&name, &stood_for));
            }
            self.content = self.content.wrapping_add(resource_digest(&name, &r));
            let key: Arc<str> = Arc::from(name.as_str());
            if let Some(before) = self.resources.0.insert(Arc::clone(&key), r) {
                self.content = self.content.wrapping_sub(resource_digest(&name, &before));
            }
            names.push(key);
        }
        self.restate();
        self.step = Some(Arc::new(Step { from, names }));
        self
    }

    /// The names put in place ([`with_versioned`](Self::with_versioned)) to make this type
    /// of `earlier`, when it was made so in one step; some may hold what they held.
    pub(crate) fn put_since(&self, earlier: &TypeSnapshot) -> Option<&[Arc<str>]> {
        let step = self.step.as_deref()?;
        (step.from == earlier.id).then_some(step.names.as_slice())
    }

    /// The resource name `alias` stands for ([`with_aliases`](Self::with_aliases)).
    pub fn alias(&self, alias: &str) -> Option<&str> {
        self.aliases.get(alias).map(String::as_str)
    }

    /// The names sent to every Delta subscriber ([`with_implicit`](Self::with_implicit)).
    pub fn implicit(&self) -> &BTreeSet<String> {
        &self.implicit
    }

    /// Whether `self` and `other` have the same aliases and implicit names, told by what
    /// they share: `false` may mean they were built apart.
    pub(crate) fn same_names(&self, other: &Self) -> bool {
        let aliases = self.aliases.ptr_eq(&other.aliases)
            || (self.aliases.is_empty() && other.aliases.is_empty());
        let implicit = Arc::ptr_eq(&self.implicit, &other.implicit)
            || (self.implicit.is_empty() && other.implicit.is_empty());
        aliases && implicit
    }

    /// Sets the version from the content hash, unless it was set explicitly, and makes this
    /// a type of its own.
    fn restate(&mut self) {
        self.id = next_id();
        self.step = None;
        if !self.explicit {
            self.version = self.content_version();
        }
    }

    fn content_version(&self) -> String {
        format!("{:032x}", self.content)
    }

    /// The same resources at an explicit type version (see [`SnapshotBuilder::version`]).
    pub fn with_version(mut self, version: impl Into<String>) -> Self {
        self.version = version.into();
        self.explicit = true;
        self.id = next_id();
        self.step = None;
        self
    }

    /// The type's version: the one set explicitly, else a hash of the names and versions of
    /// every resource of the type. Sent as SotW `version_info` and Delta
    /// `system_version_info`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The resources by name.
    pub fn resources(&self) -> &Resources {
        &self.resources
    }

    /// The resources for which `keep` returns true, with their versions unchanged and the
    /// type's version recomputed from what is kept (an explicit version is kept as it is): a
    /// per-client view of a type without re-encoding or re-hashing its resources. Aliases and
    /// implicit names are not carried over: set them on the view.
    pub fn filtered(&self, mut keep: impl FnMut(&str, &VersionedResource) -> bool) -> Self {
        let (mut kept, mut dropped) = (Vec::new(), Vec::new());
        for (name, r) in self.resources.0.iter() {
            if keep(name, r) {
                kept.push((Arc::clone(name), Arc::clone(r)));
            } else {
                dropped.push(name);
            }
        }
        // Most kept: the map less what is dropped, sharing the rest with this type's.
        let resources = if dropped.len() <= kept.len() {
            let mut map = self.resources.0.clone();
            for name in dropped {
                map.remove(name);
            }
            Resources(map)
        } else {
            kept.into_iter().collect()
        };
        Self::of(resources, self.explicit.then(|| self.version.clone()))
    }

    /// The same type with its resources held in `other`'s memory when the two hold the same
    /// resources; nothing it serves changes. A view derived from a type in the same steps as
    /// the type (the same resources put in place) then shares its memory again, rather than
    /// each holding its own copy of what was put.
    pub fn sharing(mut self, other: &Resources) -> Self {
        if !self.resources.same(other) && self.resources == *other {
            self.resources = other.clone();
        }
        self
    }

    /// The content hash, whatever the version is.
    pub(crate) fn content(&self) -> u128 {
        self.content
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

/// An `id` no other type has.
fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The keyed hash of one entry of a type: 128 bits from the process's key.
fn digest(entry: impl Hash) -> u128 {
    static KEY: OnceLock<RandomState> = OnceLock::new();
    let key = KEY.get_or_init(RandomState::new);
    let high = key.hash_one((&entry, 0u8));
    let low = key.hash_one((&entry, 1u8));
    (u128::from(high) << 64) | u128::from(low)
}

/// A keyed 64-bit hash of a resource version, to tell versions apart without keeping them.
pub(crate) fn version_key(version: &str) -> u64 {
    // The low half of the 128-bit digest.
    digest((3u8, version)) as u64
}

fn resource_digest(name: &str, r: &VersionedResource) -> u128 {
    digest((0u8, name, r.version.as_str()))
}

fn alias_digest(alias: &str, name: &str) -> u128 {
    digest((1u8, alias, name))
}

fn implicit_digest(name: &str) -> u128 {
    digest((2u8, name))
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
    fn a_type_filtered_or_put_back_shares_its_sources_memory() {
        let all = TypeSnapshot::new((0..100).map(|i| (format!("r{i:02}"), any(&[i]))));
        let most = all.filtered(|name, _| name != "r05");
        let built = TypeSnapshot::new(
            (0..100)
                .filter(|i| *i != 5)
                .map(|i| (format!("r{i:02}"), any(&[i]))),
        );
        assert_eq!((most.version(), &most), (built.version(), &built));
        assert!(Arc::ptr_eq(
            &all.resources()["r06"],
            &most.resources()["r06"]
        ));
        let few = all.filtered(|name, _| name == "r05");
        assert_eq!(few.resources().keys().collect::<Vec<_>>(), ["r05"]);
        // Put back, it is the source again, and held in its memory once shared.
        let back = most.with_versioned([("r05".to_owned(), Arc::clone(&all.resources()["r05"]))]);
        assert_eq!((back.version(), &back), (all.version(), &all));
        assert!(!back.resources().same(all.resources()));
        let back = back.sharing(all.resources());
        assert!(back.resources().same(all.resources()));
        assert_eq!(back, all);
        // Not the same resources: nothing shared.
        assert!(
            !few.sharing(all.resources())
                .resources()
                .same(all.resources())
        );
    }

    #[test]
    fn aliases_taken_away_are_as_never_given() {
        let plain = TypeSnapshot::new([("a".into(), any(b"1")), ("b".into(), any(b"2"))]);
        let both = plain
            .clone()
            .with_aliases([("x".into(), "a".into()), ("y".into(), "b".into())]);
        let one = both.without_aliases(["x", "not-an-alias"]);
        let given = plain.with_aliases([("y".into(), "b".into())]);
        assert_eq!((one.version(), &one), (given.version(), &given));
        assert_eq!(one.alias("x"), None);
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
