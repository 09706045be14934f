//! Delta (incremental) protocol state of one stream, without I/O.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource as Wrapped,
};

use crate::config::ServerConfig;
use crate::error::RequestError;
use crate::screen::{Seen, screen};
use crate::snapshot::{Change, Snapshot, TypeSnapshot, VersionedResource, version_key};

/// Delta protocol state of one stream: requests and snapshots in, responses out.
///
/// Only resources whose version differs from what the client holds are sent, with the names
/// that were removed. The first request for a type the snapshot has is always answered
/// (empty if need be) so the client does not wait; explicitly subscribed names that do not
/// exist are reported in `removed_resources`, once per subscription. A type the snapshot
/// does not have gets no answer at all. An ACK or a NACK alone sends nothing.
///
/// Subscriptions follow the xDS rules: `resource_names_subscribe` and
/// `resource_names_unsubscribe` change the set, `*` is the wildcard, a type whose requests
/// have never subscribed to a name is a (legacy) wildcard subscription, and the
/// `initial_resource_versions` of a type's first request say what the client already holds
/// (a resumed stream is sent only what changed meanwhile). Subscribing to `*` and
/// unsubscribing from it in one request subscribes to nothing (ztunnel's on-demand start).
/// A subscription by name is also served by the type's aliases
/// ([`TypeSnapshot::with_aliases`](crate::TypeSnapshot::with_aliases)), and a subscription
/// that is not a wildcard also gets the type's implicit resources
/// ([`TypeSnapshot::with_implicit`](crate::TypeSnapshot::with_implicit)).
///
/// ```
/// use meshkit_xds_server::{DeltaStream, SnapshotBuilder};
/// use meshkit_xds_server::envoy::DeltaDiscoveryRequest;
/// use meshkit_xds_server::envoy_types::pb::google::protobuf::Any;
///
/// const URL: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// let mut b = SnapshotBuilder::new();
/// b.add(URL, "a", &Any::default());
/// let snapshot = b.build();
///
/// let mut stream = DeltaStream::default();
/// stream.handle_request(DeltaDiscoveryRequest {
///     type_url: URL.into(),
///     resource_names_subscribe: vec!["a".into(), "missing".into()],
///     ..Default::default()
/// });
/// let out = stream.poll(&snapshot);
/// assert_eq!(out[0].resources[0].name, "a");
/// assert_eq!(out[0].removed_resources, ["missing"]);
/// assert!(stream.poll(&snapshot).is_empty(), "each thing is said once");
/// ```
#[derive(Debug)]
pub struct DeltaStream {
    node: String,
    types: BTreeMap<String, DeltaType>,
    nonce: u64,
    max_types: usize,
    max_names: usize,
    /// Compare every type name by name, never by what changed (tests check one against the
    /// other).
    #[cfg(test)]
    compare_only: bool,
}

#[derive(Debug, Default)]
struct DeltaType {
    /// No request has subscribed to a name yet: the legacy wildcard.
    legacy: bool,
    /// Subscribed to `*`.
    wildcard: bool,
    names: BTreeSet<String>,
    /// Name to the version the client holds.
    known: Held,
    /// Explicitly subscribed names already reported as not existing.
    reported_missing: BTreeSet<String>,
    /// Subscribed aliases sent, with the resource name each stood for.
    aliased: HashMap<String, String>,
    /// The implicit names of the type snapshot last looked at.
    implicit: BTreeSet<String>,
    /// The type's first request came: what it says the client holds is yet to be pruned.
    resumed: bool,
    /// Answer even when there is nothing to send (first request).
    must_answer: bool,
    /// The subscription changed since the type was last looked at.
    dirty: bool,
    /// The type snapshot last looked at: to skip it when unchanged, and to tell what changed
    /// since.
    last: Option<TypeSnapshot>,
}

// === impl DeltaStream ===

impl Default for DeltaStream {
    fn default() -> Self {
        Self::new(&ServerConfig::default())
    }
}

impl DeltaStream {
    /// A stream with the limits of `config`.
    pub fn new(config: &ServerConfig) -> Self {
        Self {
            node: String::new(),
            types: BTreeMap::new(),
            nonce: 0,
            max_types: config.max_types_per_stream,
            max_names: config.max_names_per_stream,
            #[cfg(test)]
            compare_only: false,
        }
    }

    /// The node id of the first request that named a node; empty before one did.
    pub fn node_id(&self) -> &str {
        &self.node
    }

    /// Takes one request: records the node, logs ACK/NACK, updates the subscription. A request
    /// [`try_handle_request`](Self::try_handle_request) refuses is logged and ignored.
    pub fn handle_request(&mut self, req: DeltaDiscoveryRequest) {
        if let Err(e) = self.try_handle_request(req) {
            tracing::warn!(node = %self.node, error = %e, "Delta request ignored");
        }
    }

    /// Takes one request, as [`handle_request`](Self::handle_request) does.
    ///
    /// # Errors
    ///
    /// The request has no type URL, is for a new type beyond the stream's limit, or would take
    /// the stream past [`ServerConfig::max_names_per_stream`] (names subscribed over all
    /// types, or the versions of a type's first request); the stream's state is unchanged
    /// (the node is still recorded). The server ends the stream with the error's status.
    pub fn try_handle_request(&mut self, req: DeltaDiscoveryRequest) -> Result<(), RequestError> {
        let seen = Seen {
            variant: "Delta",
            node: req.node.as_ref(),
            type_url: &req.type_url,
            nonce: &req.response_nonce,
            version: "",
            error: req.error_detail.as_ref().map(|e| e.message.as_str()),
        };
        let known = self.types.contains_key(&req.type_url);
        let first = screen(
            &mut self.node,
            seen,
            known,
            self.types.len(),
            self.max_types,
        )?;
        self.check_names(&req, first)?;
        let sub = self.types.entry(req.type_url).or_default();
        if first {
            sub.legacy = true;
            sub.must_answer = true;
            sub.dirty = true;
        }
        for name in req.resource_names_subscribe {
            sub.legacy = false;
            sub.dirty = true;
            if name == "*" {
                sub.wildcard = true;
            } else {
                // Asked again: say again whether it exists.
                sub.reported_missing.remove(&name);
                sub.names.insert(name);
            }
        }
        for name in &req.resource_names_unsubscribe {
            sub.dirty = true;
            if name == "*" {
                sub.wildcard = false;
                sub.legacy = false;
            } else {
                sub.names.remove(name);
                sub.reported_missing.remove(name);
                // An alias is held by its subscription alone, wildcard or not.
                if sub.aliased.remove(name).is_some() {
                    sub.known.remove(name);
                }
            }
        }
        if first {
            sub.known = Held::of(req.initial_resource_versions);
            // Pruned by the next poll, which knows the type's implicit resources.
            sub.resumed = true;
        }
        // What the client holds outside its subscription is its own business (it drops it).
        if !first && sub.dirty && !(sub.legacy || sub.wildcard) {
            let (names, implicit) = (&sub.names, &sub.implicit);
            sub.known
                .retain(|n| names.contains(n) || implicit.contains(n));
        }
        Ok(())
    }

    /// Refuses a request that would take the stream past its limit of names: what all types
    /// subscribe to after it, or the versions it carries when it is a type's first.
    fn check_names(&self, req: &DeltaDiscoveryRequest, first: bool) -> Result<(), RequestError> {
        let held: usize = self.types.values().map(|t| t.names.len()).sum();
        let sub = self.types.get(&req.type_url);
        let has = |n: &String| sub.is_some_and(|t| t.names.contains(n));
        let unsubscribe: BTreeSet<&String> = req.resource_names_unsubscribe.iter().collect();
        let added: BTreeSet<&String> = req
            .resource_names_subscribe
            .iter()
            .filter(|n| *n != "*" && !has(n) && !unsubscribe.contains(n))
            .collect();
        let removed = unsubscribe.iter().filter(|n| has(n)).count();
        let names = (held - removed).saturating_add(added.len());
        let initial = if first {
            req.initial_resource_versions.len()
        } else {
            0
        };
        let names = names.max(initial);
        if names > self.max_names {
            return Err(RequestError::TooManyNames {
                names,
                limit: self.max_names,
            });
        }
        Ok(())
    }

    /// The responses due for `snapshot`: per type, the changed and the removed resources.
    ///
    /// A type derived from the one last looked at by putting resources in place
    /// ([`TypeSnapshot::with_resources`]) is gone through by what changed; any other is
    /// compared name by name with what the client holds.
    pub fn poll(&mut self, snapshot: &Snapshot) -> Vec<DeltaDiscoveryResponse> {
        let mut out = Vec::new();
        #[cfg(test)]
        let by_change = !self.compare_only;
        #[cfg(not(test))]
        let by_change = true;
        for (url, sub) in &mut self.types {
            let Some(ts) = snapshot.get_type(url) else {
                continue;
            };
            let last = sub.last.take();
            if !sub.dirty && last.as_ref().is_some_and(|l| l.content() == ts.content()) {
                sub.last = last;
                continue;
            }
            let changed = match &last {
                Some(last) if by_change && !sub.dirty && !sub.resumed => sub.changed(last, ts),
                _ => None,
            };
            sub.dirty = false;
            sub.last = Some(ts.clone());
            let (resources, removed) = match changed {
                Some(changes) => sub.take_changes(ts, &changes),
                None => sub.compare(ts),
            };
            if resources.is_empty() && removed.is_empty() && !sub.must_answer {
                continue;
            }
            sub.must_answer = false;
            self.nonce += 1;
            out.push(DeltaDiscoveryResponse {
                system_version_info: ts.version().to_owned(),
                resources,
                type_url: url.clone(),
                removed_resources: removed,
                nonce: self.nonce.to_string(),
                ..Default::default()
            });
        }
        out
    }
}

// === impl DeltaType ===

impl DeltaType {
    /// What changed from `last` to `ts`, when it can be told from what the two share and
    /// taken alone: the same aliases and implicit names, and no name removed while the
    /// client holds aliases.
    fn changed<'a>(&self, last: &'a TypeSnapshot, ts: &'a TypeSnapshot) -> Option<Vec<Change<'a>>> {
        if !last.same_names(ts) {
            return None;
        }
        // Made of `last` in one step: the names put in place say what changed.
        if let Some(names) = ts.put_since(last) {
            let put = names
                .iter()
                .filter_map(|name| Some(Change::Put(name, ts.resources().get(name)?)));
            return Some(put.collect());
        }
        let mut changes = Vec::new();
        for change in last.resources().diff(ts.resources()) {
            if matches!(change, Change::Removed(_)) && !self.aliased.is_empty() {
                return None;
            }
            changes.push(change);
        }
        Some(changes)
    }

    /// The resources to send and the names to say removed for `changes`, the difference
    /// from the type last looked at to `ts` ([`changed`](Self::changed)).
    fn take_changes(
        &mut self,
        ts: &TypeSnapshot,
        changes: &[Change<'_>],
    ) -> (Vec<Wrapped>, Vec<String>) {
        let all = self.legacy || self.wildcard;
        let mut resources = Vec::new();
        let mut removed = Vec::new();
        let mut send = |known: &mut Held, name: &str, r: &VersionedResource, own: Option<&str>| {
            if !known.holds(name, &r.version) {
                known.put(name, &r.version, ts);
                resources.push(wrap(name, r, own));
            }
        };
        for change in changes {
            match *change {
                Change::Put(name, r) => {
                    if all || self.names.contains(name) || self.implicit.contains(name) {
                        send(&mut self.known, name, r, None);
                    }
                    // Held aliases that stand for it.
                    for (alias, own) in &self.aliased {
                        if own == name
                            && self.names.contains(alias)
                            && ts.alias(alias) == Some(name)
                        {
                            send(&mut self.known, alias, r, Some(own));
                        }
                    }
                }
                Change::Removed(name) => {
                    // No alias is held (see `changed`), nor is the name implicit (the implicit
                    // names did not change, and are held).
                    let held = self.known.remove(name);
                    let subscribed = self.names.contains(name);
                    let reported = subscribed && self.reported_missing.insert(name.to_owned());
                    if held || reported {
                        removed.push(name.to_owned());
                    }
                }
            }
        }
        for r in &resources {
            self.reported_missing.remove(&r.name);
        }
        (resources, removed)
    }

    /// The resources to send and the names to say removed, comparing every name of `ts` the
    /// client is subscribed to with what it holds.
    fn compare(&mut self, ts: &TypeSnapshot) -> (Vec<Wrapped>, Vec<String>) {
        let all = self.legacy || self.wildcard;
        if !all {
            self.implicit = ts.implicit().clone();
        }
        // What a name the client holds stands for now: the resource of that name, or the
        // one an alias names (with that name).
        let resolve = |name: &str| match ts.resources().get(name) {
            Some(r) => Some((r, None)),
            None => {
                let own = ts.alias(name)?;
                Some((ts.resources().get(own)?, Some(own)))
            }
        };
        if std::mem::take(&mut self.resumed) && !all {
            // What a resumed client holds outside its subscription is its own business
            // (it drops it), except what no longer exists at all: that is said removed.
            let (names, implicit) = (&self.names, &self.implicit);
            self.known
                .retain(|n| resolve(n).is_none() || names.contains(n) || implicit.contains(n));
        }
        let mut resources = Vec::new();
        // Resources an alias stood for before it moved to another one.
        let mut left_behind = Vec::new();
        let mut send = |name: &str, r: &crate::VersionedResource, own: Option<&str>| {
            if !self.known.holds(name, &r.version) {
                self.known.put(name, &r.version, ts);
                resources.push(wrap(name, r, own));
            }
            if let Some(own) = own
                && let Some(before) = self.aliased.insert(name.to_owned(), own.to_owned())
                && before != own
            {
                left_behind.push(before);
            }
        };
        let implicit = self.implicit.iter().filter(|n| !self.names.contains(*n));
        if all {
            for (name, r) in ts.resources() {
                send(name, r, None);
            }
            // Names subscribed beside the wildcard that are aliases.
            for name in self
                .names
                .iter()
                .filter(|n| !ts.resources().contains_key(n))
            {
                if let Some((r, own)) = resolve(name) {
                    send(name, r, own);
                }
            }
        } else {
            for name in self.names.iter().chain(implicit) {
                if let Some((r, own)) = resolve(name) {
                    send(name, r, own);
                }
            }
        }
        for r in &resources {
            self.reported_missing.remove(&r.name);
        }
        let targets = |aliased: &HashMap<String, String>| -> BTreeSet<String> {
            aliased.values().cloned().collect()
        };
        // A resource's own name, by the wildcard, its name or as an implicit one; an alias by
        // its name alone.
        let wanted = |n: &str| {
            (all && ts.resources().contains_key(n))
                || self.names.contains(n)
                || self.implicit.contains(n)
        };
        // The resources that held aliases still wanted stand for (an alias is never a
        // resource's own name, so a name is never its own alias's target).
        let aliased_now: BTreeSet<&str> = self
            .aliased
            .iter()
            .filter(|(alias, own)| wanted(alias) && ts.alias(alias) == Some(own.as_str()))
            .map(|(_, own)| own.as_str())
            .collect();
        // Held names that no longer stand for anything, or (not a wildcard) are neither
        // subscribed nor implicit any more; a resource's own name stays while a held
        // alias stands for it (the client holds it once, by its content).
        let mut removed: Vec<String> = self
            .known
            .names()
            .filter(|n| match resolve(n) {
                None => true,
                Some(_) => !wanted(n) && !aliased_now.contains(n),
            })
            .map(str::to_owned)
            .collect();
        removed.sort_unstable();
        let mut stood_for = Vec::new();
        for name in &removed {
            self.known.remove(name);
            if self.names.contains(name) {
                self.reported_missing.insert(name.clone());
            }
            if let Some(own) = self.aliased.remove(name)
                && resolve(name).is_none()
            {
                stood_for.push(own);
            }
        }
        self.aliased
            .retain(|alias, _| self.known.contains_key(alias));
        // The resource a gone or moved alias stood for goes too, unless the client holds
        // it under its own name or another alias still stands for it.
        stood_for.extend(left_behind);
        let aliased_after = targets(&self.aliased);
        stood_for.retain(|own| !self.known.contains_key(own) && !aliased_after.contains(own));
        for name in &self.names {
            if resolve(name).is_none() && self.reported_missing.insert(name.clone()) {
                removed.push(name.clone());
            }
        }
        for own in stood_for {
            if !removed.contains(&own) {
                removed.push(own);
            }
        }
        (resources, removed)
    }
}

/// What a client holds of a type: per name, a keyed hash of the version it holds (a version
/// is compared, never sent back), so that a stream keeps 8 bytes per name beside the name.
/// A resource's name is the snapshot's own (shared, not copied per stream).
#[derive(Debug, Default)]
struct Held(HashMap<Arc<str>, u64>);

impl Held {
    /// What a client says it holds (`initial_resource_versions`).
    fn of(versions: HashMap<String, String>) -> Self {
        Self(
            versions
                .into_iter()
                .map(|(name, version)| (Arc::from(name), version_key(&version)))
                .collect(),
        )
    }

    fn holds(&self, name: &str, version: &str) -> bool {
        self.0.get(name) == Some(&version_key(version))
    }

    /// Holds `name` at `version`; a name `ts` has a resource of is kept as `ts` keeps it.
    fn put(&mut self, name: &str, version: &str, ts: &TypeSnapshot) {
        let key = version_key(version);
        match self.0.get_mut(name) {
            Some(held) => *held = key,
            None => {
                let name = match ts.resources().key(name) {
                    Some(shared) => Arc::clone(shared),
                    None => Arc::from(name),
                };
                self.0.insert(name, key);
            }
        }
    }

    fn remove(&mut self, name: &str) -> bool {
        self.0.remove(name).is_some()
    }

    fn contains_key(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.0.retain(|name, _| keep(name));
    }

    fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(|name| &**name)
    }
}

/// A resource as sent: under `name`, with the resource's own name as its alias when `name` is
/// an alias.
fn wrap(name: &str, r: &VersionedResource, own: Option<&str>) -> Wrapped {
    Wrapped {
        name: name.to_owned(),
        version: r.version.clone(),
        aliases: own.map(str::to_owned).into_iter().collect(),
        resource: Some(r.resource.clone()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::google::protobuf::Any;

    use super::*;
    use crate::snapshot::SnapshotBuilder;

    const A: &str = "type.googleapis.com/test.A";
    const B: &str = "type.googleapis.com/test.B";

    /// A snapshot of raw resources: `(type, name, bytes)`.
    fn snapshot(resources: &[(&str, &str, &[u8])]) -> Snapshot {
        let mut b = SnapshotBuilder::new();
        b.declare(A).declare(B);
        for (url, name, bytes) in resources {
            b.add(
                url,
                name,
                &Any {
                    type_url: "x".into(),
                    value: bytes.to_vec(),
                },
            );
        }
        b.build()
    }

    fn names(r: &DeltaDiscoveryResponse) -> Vec<&str> {
        r.resources.iter().map(|r| r.name.as_str()).collect()
    }

    #[test]
    fn delta_sends_only_differences() {
        let s1 = snapshot(&[(A, "a1", b"1"), (A, "a2", b"2")]);
        let mut st = DeltaStream::default();
        st.handle_request(DeltaDiscoveryRequest {
            type_url: A.into(),
            ..Default::default()
        });
        let out = st.poll(&s1);
        assert_eq!(names(&out[0]), ["a1", "a2"]);
        assert!(st.poll(&s1).is_empty());

        let s2 = snapshot(&[(A, "a1", b"1"), (A, "a3", b"3")]);
        let out = st.poll(&s2);
        assert_eq!(names(&out[0]), ["a3"]);
        assert_eq!(out[0].removed_resources, ["a2"]);
    }

    #[test]
    fn delta_resumes_from_initial_versions() {
        let s1 = snapshot(&[(A, "a1", b"1"), (A, "a2", b"2")]);
        let v1 = s1
            .get(A, "a1")
            .map(|r| r.version.clone())
            .unwrap_or_default();
        let mut st = DeltaStream::default();
        st.handle_request(DeltaDiscoveryRequest {
            type_url: A.into(),
            resource_names_subscribe: vec!["*".into()],
            initial_resource_versions: [("a1".to_owned(), v1), ("gone".to_owned(), "x".to_owned())]
                .into_iter()
                .collect(),
            ..Default::default()
        });
        let out = st.poll(&s1);
        assert_eq!(names(&out[0]), ["a2"], "a1 is up to date");
        assert_eq!(out[0].removed_resources, ["gone"]);
    }

    #[test]
    fn delta_reports_missing_names_once_and_honours_unsubscribe() {
        let s1 = snapshot(&[(B, "b1", b"1")]);
        let mut st = DeltaStream::default();
        st.handle_request(DeltaDiscoveryRequest {
            type_url: B.into(),
            resource_names_subscribe: vec!["b1".into(), "nope".into()],
            ..Default::default()
        });
        let out = st.poll(&s1);
        assert_eq!(names(&out[0]), ["b1"]);
        assert_eq!(out[0].removed_resources, ["nope"]);
        assert!(st.poll(&s1).is_empty());
        // It appears later: sent.
        let s2 = snapshot(&[(B, "b1", b"1"), (B, "nope", b"now")]);
        assert_eq!(names(&st.poll(&s2)[0]), ["nope"]);
        // Unsubscribed: changes are no longer sent, and no removal either.
        st.handle_request(DeltaDiscoveryRequest {
            type_url: B.into(),
            resource_names_unsubscribe: vec!["b1".into()],
            ..Default::default()
        });
        let s3 = snapshot(&[(B, "b1", b"changed"), (B, "nope", b"now")]);
        assert!(st.poll(&s3).is_empty());
    }

    /// Type A of `resources`, with aliases `(alias, name)` and implicit names.
    fn with_extras(
        resources: &[(&str, &str, &[u8])],
        aliases: &[(&str, &str)],
        implicit: &[&str],
    ) -> Snapshot {
        let ts = snapshot(resources).get_type(A).cloned().unwrap_or_default();
        let ts = ts
            .with_aliases(
                aliases
                    .iter()
                    .map(|(a, n)| ((*a).to_owned(), (*n).to_owned())),
            )
            .with_implicit(implicit.iter().map(|n| (*n).to_owned()));
        Snapshot::new().with_type(A, ts)
    }

    #[test]
    fn subscribing_to_nothing_gets_the_implicit_resources_and_an_answer() {
        let s1 = with_extras(&[(A, "local", b"1"), (A, "other", b"2")], &[], &["local"]);
        let mut st = DeltaStream::default();
        st.handle_request(DeltaDiscoveryRequest {
            type_url: A.into(),
            resource_names_subscribe: vec!["*".into()],
            resource_names_unsubscribe: vec!["*".into()],
            ..Default::default()
        });
        let out = st.poll(&s1);
        assert_eq!(names(&out[0]), ["local"], "implicit only, not the wildcard");
        assert!(st.poll(&s1).is_empty());
        // Subscribing to a name keeps what is held implicitly.
        st.handle_request(DeltaDiscoveryRequest {
            type_url: A.into(),
            resource_names_subscribe: vec!["other".into()],
            ..Default::default()
        });
        assert_eq!(names(&st.poll(&s1)[0]), ["other"]);
        // No longer implicit (the workload left the node): removed.
        let s2 = with_extras(&[(A, "local", b"1"), (A, "other", b"2")], &[], &[]);
        let out = st.poll(&s2);
        assert!(out[0].resources.is_empty());
        assert_eq!(out[0].removed_resources, ["local"]);
    }

    #[test]
    fn an_alias_is_answered_under_its_own_name_and_removed_with_what_it_stood_for() {
        let s1 = with_extras(&[(A, "uid-1", b"1")], &[("/10.0.0.1", "uid-1")], &[]);
        let mut st = DeltaStream::default();
        st.handle_request(DeltaDiscoveryRequest {
            type_url: A.into(),
            resource_names_subscribe: vec!["/10.0.0.1".into(), "/10.0.0.2".into()],
            ..Default::default()
        });
        let out = st.poll(&s1);
        assert_eq!(names(&out[0]), ["/10.0.0.1"]);
        assert_eq!(out[0].resources[0].aliases, ["uid-1"]);
        assert_eq!(
            out[0].removed_resources,
            ["/10.0.0.2"],
            "an unknown address"
        );
        // The resource changes: sent again under the alias.
        let s2 = with_extras(&[(A, "uid-1", b"changed")], &[("/10.0.0.1", "uid-1")], &[]);
        assert_eq!(names(&st.poll(&s2)[0]), ["/10.0.0.1"]);
        // It goes: both the alias and the name it stood for are removed.
        let s3 = with_extras(&[], &[], &[]);
        let out = st.poll(&s3);
        assert_eq!(out[0].removed_resources, ["/10.0.0.1", "uid-1"]);
        assert!(st.poll(&s3).is_empty());
    }

    #[test]
    fn an_alias_that_moves_or_shares_its_resource_keeps_the_client_consistent() {
        let both = &[("/10.0.0.1", "uid-1"), ("/10.0.0.9", "uid-1")][..];
        let s1 = with_extras(&[(A, "uid-1", b"1"), (A, "uid-2", b"2")], both, &[]);
        let mut st = DeltaStream::default();
        st.handle_request(DeltaDiscoveryRequest {
            type_url: A.into(),
            resource_names_subscribe: vec!["/10.0.0.1".into(), "/10.0.0.9".into()],
            ..Default::default()
        });
        assert_eq!(names(&st.poll(&s1)[0]), ["/10.0.0.1", "/10.0.0.9"]);
        // One address goes: the resource stays, the other alias still stands for it.
        let s2 = with_extras(
            &[(A, "uid-1", b"1"), (A, "uid-2", b"2")],
            &[("/10.0.0.1", "uid-1")],
            &[],
        );
        assert_eq!(st.poll(&s2)[0].removed_resources, ["/10.0.0.9"]);
        // The address moves to another resource: sent again, and the one left is removed.
        let s3 = with_extras(
            &[(A, "uid-1", b"1"), (A, "uid-2", b"2")],
            &[("/10.0.0.1", "uid-2")],
            &[],
        );
        let out = st.poll(&s3);
        assert_eq!(names(&out[0]), ["/10.0.0.1"]);
        assert_eq!(out[0].resources[0].aliases, ["uid-2"]);
        assert_eq!(out[0].removed_resources, ["uid-1"]);
    }

    #[test]
    fn a_resumed_on_demand_client_keeps_what_is_current_and_hears_what_went() {
        let s1 = with_extras(&[(A, "local", b"1")], &[], &["local"]);
        let v = s1.get(A, "local").map(|r| r.version.clone()).unwrap();
        let mut st = DeltaStream::default();
        st.handle_request(DeltaDiscoveryRequest {
            type_url: A.into(),
            resource_names_subscribe: vec!["*".into()],
            resource_names_unsubscribe: vec!["*".into()],
            initial_resource_versions: [("local".to_owned(), v), ("gone".to_owned(), "x".into())]
                .into_iter()
                .collect(),
            ..Default::default()
        });
        let out = st.poll(&s1);
        assert!(out[0].resources.is_empty(), "local is up to date");
        assert_eq!(out[0].removed_resources, ["gone"]);
    }

    #[test]
    fn a_wildcard_subscriber_naming_an_alias_is_answered_for_it() {
        let s1 = with_extras(&[(A, "uid-1", b"1")], &[("/10.0.0.1", "uid-1")], &[]);
        let mut st = DeltaStream::default();
        st.handle_request(DeltaDiscoveryRequest {
            type_url: A.into(),
            resource_names_subscribe: vec!["*".into(), "/10.0.0.1".into()],
            ..Default::default()
        });
        assert_eq!(names(&st.poll(&s1)[0]), ["uid-1", "/10.0.0.1"]);
    }

    #[test]
    fn the_node_id_is_the_first_one_named() {
        let node = |id: &str| {
            Some(envoy_types::pb::envoy::config::core::v3::Node {
                id: id.into(),
                ..Default::default()
            })
        };
        let mut st = DeltaStream::default();
        assert_eq!(st.node_id(), "");
        for id in ["n1", "n2"] {
            st.handle_request(DeltaDiscoveryRequest {
                node: node(id),
                type_url: A.into(),
                ..Default::default()
            });
        }
        assert_eq!(st.node_id(), "n1");
    }

    #[test]
    fn acks_do_not_rescan_unchanged_types() {
        let s1 = snapshot(&[(A, "a1", b"1")]);
        let mut st = DeltaStream::default();
        st.handle_request(DeltaDiscoveryRequest {
            type_url: A.into(),
            ..Default::default()
        });
        assert_eq!(st.poll(&s1).len(), 1);
        st.handle_request(DeltaDiscoveryRequest {
            type_url: A.into(),
            response_nonce: "1".into(),
            ..Default::default()
        });
        assert!(!st.types[A].dirty);
        assert!(st.poll(&s1).is_empty());
    }

    mod by_change {
        use proptest::prelude::*;

        use super::*;
        use crate::snapshot::TypeSnapshot;

        const NAMES: [&str; 5] = ["a", "b", "c", "d", "e"];
        const ALIASES: [&str; 3] = ["x", "y", "a"];

        #[derive(Debug, Clone)]
        enum Step {
            /// Resources put in place.
            Put(Vec<(usize, u8)>),
            /// The type built anew: resources, aliases to names, implicit names.
            Rebuild(Vec<(usize, u8)>, Vec<(usize, usize)>, Vec<usize>),
            /// A request: names subscribed and unsubscribed (`*` is index 5, an alias 6..).
            Request(Vec<usize>, Vec<usize>),
        }

        fn word(i: usize) -> String {
            match i {
                0..5 => NAMES[i].to_owned(),
                5 => "*".to_owned(),
                _ => ALIASES[(i - 6) % ALIASES.len()].to_owned(),
            }
        }

        fn resources(put: &[(usize, u8)]) -> Vec<(String, Any)> {
            put.iter()
                .map(|(n, b)| {
                    let any = Any {
                        type_url: A.into(),
                        value: vec![*b],
                    };
                    (NAMES[n % NAMES.len()].to_owned(), any)
                })
                .collect()
        }

        fn step() -> impl Strategy<Value = Step> {
            let put = prop::collection::vec((0..5usize, 0..3u8), 0..4);
            let names = prop::collection::vec(0..9usize, 0..3);
            prop_oneof![
                3 => put.clone().prop_map(Step::Put),
                1 => (
                    put,
                    prop::collection::vec((0..3usize, 0..5usize), 0..3),
                    prop::collection::vec(0..5usize, 0..3),
                )
                    .prop_map(|(r, a, i)| Step::Rebuild(r, a, i)),
                1 => (names.clone(), names).prop_map(|(s, u)| Step::Request(s, u)),
            ]
        }

        /// Per response, the resources sent (name, version, aliases) and the names removed.
        type Said = Vec<(Vec<(String, String, Vec<String>)>, Vec<String>)>;

        /// A response reduced to what a client acts on: what it is sent, and what it is told
        /// is removed, each in order.
        fn said(out: &[DeltaDiscoveryResponse]) -> Said {
            out.iter()
                .map(|r| {
                    let mut sent: Vec<_> = r
                        .resources
                        .iter()
                        .map(|w| (w.name.clone(), w.version.clone(), w.aliases.clone()))
                        .collect();
                    sent.sort();
                    let mut removed = r.removed_resources.clone();
                    removed.sort();
                    (sent, removed)
                })
                .collect()
        }

        proptest! {
            /// Going through what changed says exactly what comparing name by name says,
            /// whatever the subscription, the aliases and implicit names, and however the
            /// type came to be; and a client subscribed to all then holds every resource as
            /// it is, and nothing that is gone.
            #[test]
            fn says_what_comparing_name_by_name_says(
                first in prop::collection::vec(0..9usize, 0..3),
                steps in prop::collection::vec(step(), 1..24),
            ) {
                let mut by_change = DeltaStream::default();
                let mut by_name = DeltaStream {
                    compare_only: true,
                    ..DeltaStream::default()
                };
                let request = |subscribe: &[usize], unsubscribe: &[usize]| DeltaDiscoveryRequest {
                    type_url: A.into(),
                    resource_names_subscribe: subscribe.iter().map(|i| word(*i)).collect(),
                    resource_names_unsubscribe: unsubscribe.iter().map(|i| word(*i)).collect(),
                    ..Default::default()
                };
                by_change.handle_request(request(&first, &[]));
                by_name.handle_request(request(&first, &[]));
                // What a client of the stream holds, and whether it is subscribed to all.
                let mut held: BTreeMap<String, String> = BTreeMap::new();
                let (mut legacy, mut wildcard) = (first.is_empty(), first.contains(&5));
                let mut subscribed: BTreeSet<String> = first.iter().map(|i| word(*i)).collect();
                let mut ts = TypeSnapshot::default();
                for step in steps {
                    match step {
                        Step::Put(put) => ts = ts.with_resources(resources(&put)),
                        Step::Rebuild(put, aliases, implicit) => {
                            ts = TypeSnapshot::new(resources(&put))
                                .with_aliases(aliases.iter().map(|(a, n)| {
                                    (ALIASES[*a].to_owned(), NAMES[*n].to_owned())
                                }))
                                .with_implicit(implicit.iter().map(|n| NAMES[*n].to_owned()));
                        }
                        Step::Request(subscribe, unsubscribe) => {
                            by_change.handle_request(request(&subscribe, &unsubscribe));
                            by_name.handle_request(request(&subscribe, &unsubscribe));
                            legacy &= subscribe.is_empty() && !unsubscribe.contains(&5);
                            wildcard = (wildcard || subscribe.contains(&5)) && !unsubscribe.contains(&5);
                            subscribed.extend(subscribe.iter().map(|i| word(*i)));
                            // A client drops what it no longer subscribes to: a resource's
                            // own name stays while it is subscribed to all.
                            for name in unsubscribe.iter().map(|i| word(*i)) {
                                let resource = ts.resources().contains_key(&name);
                                let stays = (resource && (legacy || wildcard))
                                    || ts.implicit().contains(&name);
                                if subscribed.remove(&name) && !stays {
                                    held.remove(&name);
                                }
                            }
                            if !(legacy || wildcard) {
                                held.retain(|n, _| subscribed.contains(n) || ts.implicit().contains(n));
                            }
                        }
                    }
                    let snapshot = Snapshot::new().with_type(A, ts.clone());
                    let out = by_change.poll(&snapshot);
                    prop_assert_eq!(said(&out), said(&by_name.poll(&snapshot)));
                    for response in &out {
                        for name in &response.removed_resources {
                            held.remove(name);
                        }
                        for r in &response.resources {
                            held.insert(r.name.clone(), r.version.clone());
                        }
                    }
                    if legacy || wildcard {
                        // Every resource, as it is now; nothing that is gone.
                        for (name, r) in ts.resources() {
                            prop_assert_eq!(held.get(name), Some(&r.version), "{} is held as it is", name);
                        }
                        for name in held.keys() {
                            prop_assert!(
                                ts.resources().contains_key(name) || ts.alias(name).is_some(),
                                "{} is held but gone", name
                            );
                        }
                    }
                }
            }
        }
    }
}
