use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use foldhash::{HashMap as FastMap, HashSet as FastSet};

use super::decode::{
    Checked, Rejection, check_sotw_any, check_wrapped, encoded_size, nack_status,
    reject_duplicates, summarize,
};
use crate::resource::{AnyResource, ResourceType};

/// The wildcard subscription name (xDS: an explicit `*`).
const WILDCARD: &str = "*";

/// A type URL or nonce longer than this is never kept for a type nobody watches.
const MAX_UNWATCHED_STRING: usize = 1024;

/// Which ADS variant a session speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// State of the World: `StreamAggregatedResources`; every response carries the full set.
    StateOfTheWorld,
    /// Incremental: `DeltaAggregatedResources`; responses carry changes and removals.
    Delta,
}

/// Configuration of a [`Session`].
#[derive(Debug, Clone)]
pub struct SessionConfig {
    mode: Mode,
    node: Option<Node>,
    does_not_exist_timeout: Duration,
    max_resources_per_type: usize,
    max_cached_bytes: usize,
    max_type_urls: usize,
    ignore_resource_deletion: bool,
}

/// A request for the caller to send on the current stream.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// On a `StreamAggregatedResources` stream.
    Sotw(DiscoveryRequest),
    /// On a `DeltaAggregatedResources` stream.
    Delta(DeltaDiscoveryRequest),
}

/// A response received on the current stream.
#[derive(Debug, Clone, PartialEq)]
pub enum Response {
    /// From a `StreamAggregatedResources` stream.
    Sotw(DiscoveryResponse),
    /// From a `DeltaAggregatedResources` stream.
    Delta(DeltaDiscoveryResponse),
}

/// Something watchers need to know.
#[derive(Clone)]
#[non_exhaustive]
pub enum Event {
    /// A resource was added or changed (never emitted when a response repeats it unchanged).
    Updated {
        /// Its type URL.
        type_url: &'static str,
        /// Its name.
        name: String,
        /// Its version (Delta: the resource's; SotW: the response's).
        version: String,
        /// The decoded, validated value.
        resource: AnyResource,
    },
    /// A resource is gone, or was never there.
    Removed {
        /// Its type URL.
        type_url: &'static str,
        /// Its name.
        name: String,
        /// Why.
        reason: RemovalReason,
    },
    /// A resource was rejected (and NACKed); the last good value, if any, stays in use.
    Rejected {
        /// Its type URL.
        type_url: &'static str,
        /// Its name, unless it could not be decoded far enough to know it.
        name: Option<String>,
        /// Why it was rejected.
        error: String,
    },
    /// The first response to the wildcard subscription of a type was applied: the events
    /// before this one are the server's whole state of the type (none, when it has no
    /// resource of it). Once per wildcard subscription, after that response's events.
    Synced {
        /// The type URL.
        type_url: &'static str,
    },
}

/// Why a resource was removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RemovalReason {
    /// The server deleted it (Delta `removed_resources`; SotW absence of a Listener/Cluster).
    Deleted,
    /// It was never received within the does-not-exist timeout of a connected stream.
    DoesNotExist,
    /// Its TTL expired without a heartbeat.
    TtlExpired,
}

/// The sans-I/O ADS client state machine. See the [module docs](crate::protocol).
pub struct Session {
    config: SessionConfig,
    types: HashMap<String, TypeState>,
    connected: bool,
    node_sent: bool,
    acks: VecDeque<Ack>,
    dirty: VecDeque<String>,
    events: VecDeque<Event>,
    timers: BTreeSet<Timer>,
    /// How many times a SotW deletion was ignored ([`SessionConfig::ignore_resource_deletion`]).
    ignored_deletions: u64,
}

/// Per type URL state.
#[derive(Default)]
struct TypeState {
    /// Set once somebody subscribes; `None` for types only the server mentioned.
    kind: Option<ResourceType>,
    wildcard: bool,
    names: BTreeSet<String>,
    /// Cache and per-name protocol state; holds every subscribed name and every cached one.
    entries: FastMap<String, Entry>,
    /// What the cached values of `entries` cost, as [`Cached::size`] counts it.
    bytes: usize,
    /// SotW: last accepted version.
    version: String,
    /// Last nonce received on the current stream.
    nonce: String,
    /// What the server knows of our subscriptions on this stream; `None`: nothing sent yet.
    sent: Option<Sent>,
    /// Names (or `*`) whose subscription changed since the last request.
    changed: BTreeSet<String>,
    /// Queued in `Session::dirty`.
    dirty: bool,
    /// A response to the wildcard subscription was applied ([`Event::Synced`] sent); cleared
    /// when the wildcard subscription ends.
    synced: bool,
}

#[derive(Default)]
struct Sent {
    wildcard: bool,
    names: BTreeSet<String>,
}

#[derive(Default)]
struct Entry {
    cached: Option<Cached>,
    /// The latest version received was rejected.
    rejected: bool,
    /// Already reported as non-existent or deleted.
    absent: bool,
    dne_deadline: Option<Instant>,
    /// SotW left it out and [`SessionConfig::ignore_resource_deletion`] kept it (gRFC A53's bit).
    deletion_ignored: bool,
    ttl_deadline: Option<Instant>,
}

struct Cached {
    value: AnyResource,
    version: String,
    hash: u64,
    /// What it counts against [`SessionConfig::max_cached_bytes`]: encoded size, name and
    /// version.
    size: usize,
}

struct Ack {
    type_url: String,
    version: String,
    nonce: String,
    error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Timer {
    at: Instant,
    kind: TimerKind,
    type_url: String,
    name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum TimerKind {
    DoesNotExist,
    Ttl,
}

/// The subscription change to put on the wire.
struct Diff {
    first: bool,
    subscribe: Vec<String>,
    unsubscribe: Vec<String>,
}

// === impl SessionConfig ===

impl SessionConfig {
    /// Defaults: no node, a does-not-exist timeout of 15 s (Envoy's and gRPC's), at most
    /// 100,000 resources of one type, 256 MiB of cached resources and 32 type URLs.
    pub fn new(mode: Mode) -> Self {
        Self {
            mode,
            node: None,
            does_not_exist_timeout: Duration::from_secs(15),
            max_resources_per_type: 100_000,
            max_cached_bytes: 256 << 20,
            max_type_urls: 32,
            ignore_resource_deletion: false,
        }
    }

    /// The most resources of one type the session holds (default 100,000): cached ones, the
    /// names subscribed to, and names remembered as rejected. A response that carries more
    /// than this is NACKed whole, before any of it is decoded; a resource that would add a
    /// name beyond it is rejected (NACKed by name; the rest of the response applies).
    /// Names the program subscribes to are never refused, but count.
    ///
    /// A 64 MiB response could otherwise carry millions of tiny resources, each costing far
    /// more decoded than on the wire.
    pub fn max_resources_per_type(mut self, max: usize) -> Self {
        self.max_resources_per_type = max;
        self
    }

    /// The most bytes of resources the session caches over all types (default 256 MiB),
    /// counting each resource as its encoded size plus its name and version (State of the
    /// World gives every resource the response's version, so a long version counts once per
    /// resource). A response whose resources alone exceed it is NACKed whole; a resource
    /// that would take the cache beyond it is rejected by name. Decoded values take more
    /// memory than this count, by a factor that depends on the type.
    pub fn max_cached_bytes(mut self, bytes: usize) -> Self {
        self.max_cached_bytes = bytes;
        self
    }

    /// The most type URLs the session keeps state for (default 32). Types the program
    /// subscribes to always get state; a response for a further type URL that nobody
    /// watches is NACKed and nothing of it is kept. The nonce of an unwatched type is kept
    /// (for a later subscription) only while the limit allows, and only when it and the
    /// type URL are at most 1 KiB each.
    pub fn max_type_urls(mut self, max: usize) -> Self {
        self.max_type_urls = max;
        self
    }

    /// State of the World: keep a Listener or Cluster that a response leaves out instead of
    /// deleting it (default false), as gRPC's `ignore_resource_deletion` server feature does
    /// (gRFC A53), for a control plane that may drop resources by mistake. The resource keeps
    /// serving its last version and watchers are told nothing; the client logs it at `warn`
    /// once (and at `info` when the server sends the resource again or it is unsubscribed),
    /// counts it ([`Session::ignored_deletions`]) and marks it
    /// ([`Session::is_deletion_ignored`]). A subscribed name never received is still reported
    /// as non-existent when its timer fires, and Delta's explicit removals still delete.
    pub fn ignore_resource_deletion(mut self, ignore: bool) -> Self {
        self.ignore_resource_deletion = ignore;
        self
    }

    /// The node sent on the first request of each stream.
    pub fn node(mut self, node: Node) -> Self {
        self.node = Some(node);
        self
    }

    /// How long after a request a named resource that has not arrived is declared
    /// non-existent (default 15 s).
    pub fn does_not_exist_timeout(mut self, timeout: Duration) -> Self {
        self.does_not_exist_timeout = timeout;
        self
    }

    /// The ADS variant.
    pub fn mode(&self) -> Mode {
        self.mode
    }
}

// === impl Event ===

impl Event {
    /// The type URL of the resource concerned.
    pub fn type_url(&self) -> &'static str {
        match self {
            Event::Updated { type_url, .. }
            | Event::Removed { type_url, .. }
            | Event::Rejected { type_url, .. }
            | Event::Synced { type_url } => type_url,
        }
    }

    /// The name of the resource concerned, if known.
    pub fn name(&self) -> Option<&str> {
        match self {
            Event::Updated { name, .. } | Event::Removed { name, .. } => Some(name),
            Event::Rejected { name, .. } => name.as_deref(),
            Event::Synced { .. } => None,
        }
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Updated {
                type_url,
                name,
                version,
                ..
            } => f
                .debug_struct("Updated")
                .field("type_url", type_url)
                .field("name", name)
                .field("version", version)
                .finish_non_exhaustive(),
            Event::Removed {
                type_url,
                name,
                reason,
            } => f
                .debug_struct("Removed")
                .field("type_url", type_url)
                .field("name", name)
                .field("reason", reason)
                .finish(),
            Event::Rejected {
                type_url,
                name,
                error,
            } => f
                .debug_struct("Rejected")
                .field("type_url", type_url)
                .field("name", name)
                .field("error", error)
                .finish(),
            Event::Synced { type_url } => f
                .debug_struct("Synced")
                .field("type_url", type_url)
                .finish(),
        }
    }
}

// === impl Session ===

impl Session {
    /// A session with no subscriptions and no stream.
    pub fn new(config: SessionConfig) -> Self {
        Self {
            config,
            types: HashMap::new(),
            connected: false,
            node_sent: false,
            acks: VecDeque::new(),
            dirty: VecDeque::new(),
            events: VecDeque::new(),
            timers: BTreeSet::new(),
            ignored_deletions: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &SessionConfig {
        &self.config
    }

    /// Whether a stream is up (between [`on_connected`](Self::on_connected) and
    /// [`on_disconnected`](Self::on_disconnected)).
    pub fn is_connected(&self) -> bool {
        self.connected
    }

    /// Subscribes to one resource by name; `*` means [`subscribe_wildcard`](Self::subscribe_wildcard).
    /// Subscriptions are sets: subscribing twice is subscribing once.
    pub fn subscribe(&mut self, kind: ResourceType, name: &str) {
        if name == WILDCARD {
            return self.subscribe_wildcard(kind);
        }
        let ts = self.type_state(kind);
        if ts.names.insert(name.to_owned()) {
            ts.changed.insert(name.to_owned());
            ts.entries.entry(name.to_owned()).or_default();
            self.mark_dirty(kind.type_url());
        }
    }

    /// Removes a named subscription. The cached value is dropped when the change is sent, so an
    /// unsubscribe followed by a subscribe before the next [`poll_request`](Self::poll_request)
    /// keeps it.
    pub fn unsubscribe(&mut self, type_url: &str, name: &str) {
        if name == WILDCARD {
            return self.unsubscribe_wildcard(type_url);
        }
        let Some(ts) = self.types.get_mut(type_url) else {
            return;
        };
        if ts.names.remove(name) {
            ts.changed.insert(name.to_owned());
            if let Some(e) = ts.entries.get_mut(name) {
                cancel_dne(&mut self.timers, type_url, name, e);
            }
            self.mark_dirty(type_url);
        }
    }

    /// Subscribes to every resource of a type (an explicit `*` on the wire).
    pub fn subscribe_wildcard(&mut self, kind: ResourceType) {
        let ts = self.type_state(kind);
        if !ts.wildcard {
            ts.wildcard = true;
            ts.changed.insert(WILDCARD.to_owned());
            self.mark_dirty(kind.type_url());
        }
    }

    /// Removes the wildcard subscription of a type; named subscriptions stay.
    pub fn unsubscribe_wildcard(&mut self, type_url: &str) {
        let Some(ts) = self.types.get_mut(type_url) else {
            return;
        };
        if ts.wildcard {
            ts.wildcard = false;
            ts.synced = false;
            ts.changed.insert(WILDCARD.to_owned());
            self.mark_dirty(type_url);
        }
    }

    /// Whether a response to the wildcard subscription of `type_url` has been applied
    /// ([`Event::Synced`]).
    pub fn is_synced(&self, type_url: &str) -> bool {
        self.types.get(type_url).is_some_and(|ts| ts.synced)
    }

    /// After a response of `type_url` was applied: the wildcard subscription is synced if the
    /// server had been told of it when it answered.
    fn mark_synced(&mut self, type_url: &'static str) {
        let Some(ts) = self.types.get_mut(type_url) else {
            return;
        };
        let told = ts.sent.as_ref().is_some_and(|sent| sent.wildcard);
        if ts.wildcard && told && !ts.synced {
            ts.synced = true;
            self.events.push_back(Event::Synced { type_url });
        }
    }

    /// The cached value of a resource, if any.
    pub fn resource(&self, type_url: &str, name: &str) -> Option<&AnyResource> {
        let e = self.types.get(type_url)?.entries.get(name)?;
        e.cached.as_ref().map(|c| &c.value)
    }

    /// The version of a cached resource (Delta: the resource's; SotW: its response's).
    pub fn resource_version(&self, type_url: &str, name: &str) -> Option<&str> {
        let e = self.types.get(type_url)?.entries.get(name)?;
        e.cached.as_ref().map(|c| c.version.as_str())
    }

    /// Every cached resource of a type.
    pub fn resources<'a>(
        &'a self,
        type_url: &str,
    ) -> impl Iterator<Item = (&'a str, &'a AnyResource)> + 'a {
        self.types
            .get(type_url)
            .into_iter()
            .flat_map(|ts| ts.entries.iter())
            .filter_map(|(n, e)| e.cached.as_ref().map(|c| (n.as_str(), &c.value)))
    }

    /// Whether a cached resource was left out of a State-of-the-World response and kept, as
    /// [`SessionConfig::ignore_resource_deletion`] asks, and not sent again since.
    pub fn is_deletion_ignored(&self, type_url: &str, name: &str) -> bool {
        self.types
            .get(type_url)
            .and_then(|ts| ts.entries.get(name))
            .is_some_and(|e| e.deletion_ignored)
    }

    /// How many times a resource left out of a State-of-the-World response was kept instead of
    /// deleted ([`SessionConfig::ignore_resource_deletion`]); a resource counts again only after
    /// it was sent again and then left out again.
    pub fn ignored_deletions(&self) -> u64 {
        self.ignored_deletions
    }

    /// Whether a named resource has been reported as non-existent (or deleted) and not seen
    /// since.
    pub fn is_absent(&self, type_url: &str, name: &str) -> bool {
        self.types
            .get(type_url)
            .and_then(|ts| ts.entries.get(name))
            .is_some_and(|e| e.absent)
    }

    /// What the cached resources cost over all types, as
    /// [`SessionConfig::max_cached_bytes`] counts it.
    pub fn cached_bytes(&self) -> usize {
        self.types.values().map(|ts| ts.bytes).sum()
    }

    /// Number of cached resources over all types.
    pub fn cached_len(&self) -> usize {
        self.types
            .values()
            .map(|ts| ts.entries.values().filter(|e| e.cached.is_some()).count())
            .sum()
    }

    /// SotW: the last accepted version of a type.
    pub fn version(&self, type_url: &str) -> Option<&str> {
        self.types.get(type_url).map(|ts| ts.version.as_str())
    }

    /// A new stream is up: every subscription will be sent again, the node goes on its first
    /// request, and nonces of the previous stream are forgotten.
    pub fn on_connected(&mut self, _now: Instant) {
        self.connected = true;
        self.node_sent = false;
        self.acks.clear();
        let mut dirty = Vec::new();
        for (url, ts) in &mut self.types {
            ts.nonce.clear();
            ts.sent = None;
            if ts.wildcard || !ts.names.is_empty() || !ts.changed.is_empty() {
                dirty.push(url.clone());
            }
        }
        dirty.sort();
        for url in dirty {
            self.mark_dirty(&url);
        }
    }

    /// The stream is gone. Does-not-exist timers stop (they never run during backoff); TTL
    /// timers keep running, since TTL exists to outlive an unreachable server.
    pub fn on_disconnected(&mut self) {
        self.connected = false;
        self.acks.clear();
        let dne: Vec<Timer> = self
            .timers
            .iter()
            .filter(|t| t.kind == TimerKind::DoesNotExist)
            .cloned()
            .collect();
        for t in dne {
            self.timers.remove(&t);
            if let Some(e) = self
                .types
                .get_mut(&t.type_url)
                .and_then(|ts| ts.entries.get_mut(&t.name))
            {
                e.dne_deadline = None;
            }
        }
    }

    /// The next request to send, if any. `now` arms the does-not-exist timers of the names it
    /// carries. Returns `None` while disconnected.
    pub fn poll_request(&mut self, now: Instant) -> Option<Request> {
        if !self.connected {
            return None;
        }
        let mut req = None;
        if let Some(ack) = self.acks.pop_front() {
            req = match self.config.mode {
                Mode::StateOfTheWorld => {
                    let url = ack.type_url.clone();
                    self.build_sotw(&url, now, Some(ack)).map(Request::Sotw)
                }
                Mode::Delta => Some(Request::Delta(DeltaDiscoveryRequest {
                    type_url: ack.type_url,
                    response_nonce: ack.nonce,
                    error_detail: ack.error.map(nack_status),
                    ..Default::default()
                })),
            };
        }
        while req.is_none() {
            let url = self.dirty.pop_front()?;
            let Some(ts) = self.types.get_mut(&url) else {
                continue;
            };
            if !ts.dirty {
                continue;
            }
            req = match self.config.mode {
                Mode::StateOfTheWorld => self.build_sotw(&url, now, None).map(Request::Sotw),
                Mode::Delta => self.build_delta(&url, now).map(Request::Delta),
            };
        }
        let mut req = req?;
        if !self.node_sent {
            self.node_sent = true;
            let node = self.config.node.clone();
            match &mut req {
                Request::Sotw(r) => r.node = node,
                Request::Delta(r) => r.node = node,
            }
        }
        Some(req)
    }

    /// The requests a new stream would open with, built from the subscriptions and the cache
    /// as they are now, without changing anything: every subscribed type (SotW: its names and
    /// last accepted version, no nonce; Delta: its names and the `initial_resource_versions`
    /// of what is cached), the node on the first. A client probing a higher-priority server
    /// while a fallback serves ([`Failover`](super::Failover)) sends these on the probe's
    /// stream, so that the server has something to answer; the session itself is resubscribed
    /// by [`on_connected`](Self::on_connected) once the client switches.
    pub fn initial_requests(&self) -> Vec<Request> {
        let mut urls: Vec<&String> = self
            .types
            .iter()
            .filter(|(_, ts)| ts.kind.is_some() && (ts.wildcard || !ts.names.is_empty()))
            .map(|(url, _)| url)
            .collect();
        urls.sort();
        let mut out = Vec::with_capacity(urls.len());
        for url in urls {
            let ts = &self.types[url];
            let mut names = Vec::with_capacity(ts.names.len() + 1);
            if ts.wildcard {
                names.push(WILDCARD.to_owned());
            }
            names.extend(ts.names.iter().cloned());
            let node = if out.is_empty() {
                self.config.node.clone()
            } else {
                None
            };
            out.push(match self.config.mode {
                Mode::StateOfTheWorld => Request::Sotw(DiscoveryRequest {
                    version_info: ts.version.clone(),
                    node,
                    resource_names: names,
                    type_url: url.clone(),
                    ..Default::default()
                }),
                Mode::Delta => Request::Delta(DeltaDiscoveryRequest {
                    node,
                    type_url: url.clone(),
                    resource_names_subscribe: names,
                    initial_resource_versions: ts
                        .entries
                        .iter()
                        .filter(|(n, e)| !e.rejected && (ts.wildcard || ts.names.contains(*n)))
                        .filter_map(|(n, e)| {
                            e.cached.as_ref().map(|c| (n.clone(), c.version.clone()))
                        })
                        .collect(),
                    ..Default::default()
                }),
            });
        }
        out
    }

    /// The next event for watchers, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The earliest timer deadline; call [`handle_timeout`](Self::handle_timeout) then.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.first().map(|t| t.at)
    }

    /// Fires every timer due at `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        while self.timers.first().is_some_and(|t| t.at <= now) {
            let Some(t) = self.timers.pop_first() else {
                break;
            };
            let Some(ts) = self.types.get_mut(&t.type_url) else {
                continue;
            };
            let Some(kind) = ts.kind else { continue };
            let covered = ts.wildcard || ts.names.contains(&t.name);
            let Some(e) = ts.entries.get_mut(&t.name) else {
                continue;
            };
            match t.kind {
                TimerKind::DoesNotExist if e.dne_deadline == Some(t.at) => {
                    e.dne_deadline = None;
                    if e.cached.is_none() && !e.absent {
                        e.absent = true;
                        self.events.push_back(Event::Removed {
                            type_url: kind.type_url(),
                            name: t.name,
                            reason: RemovalReason::DoesNotExist,
                        });
                    }
                }
                TimerKind::Ttl if e.ttl_deadline == Some(t.at) => {
                    e.ttl_deadline = None;
                    if let Some(gone) = e.cached.take() {
                        ts.bytes = ts.bytes.saturating_sub(gone.size);
                        e.absent = true;
                        e.deletion_ignored = false;
                        if !ts.names.contains(&t.name) {
                            ts.entries.remove(&t.name);
                        }
                        if covered {
                            self.events.push_back(Event::Removed {
                                type_url: kind.type_url(),
                                name: t.name,
                                reason: RemovalReason::TtlExpired,
                            });
                        }
                    }
                }
                _ => {}
            }
        }
    }

    /// Applies a response from the server, queueing its ACK or NACK and the resulting events.
    /// A response of the other ADS variant than the session's is ignored.
    pub fn handle_response(&mut self, now: Instant, response: Response) {
        match (self.config.mode, response) {
            (Mode::StateOfTheWorld, Response::Sotw(r)) => self.handle_sotw(now, r),
            (Mode::Delta, Response::Delta(r)) => self.handle_delta(now, r),
            _ => tracing::warn!("xds: response of the wrong ADS variant ignored"),
        }
    }

    fn handle_sotw(&mut self, now: Instant, resp: DiscoveryResponse) {
        let Some(kind) = self.watched(&resp.type_url) else {
            // Answering would subscribe: an ACK is a request, and a type's first request naming
            // nothing is a wildcard subscription. Drop it, but keep the nonce: a later
            // subscription request of the type must carry the nonce of its last response on
            // this stream, or a server that checks nonces ignores it as stale.
            self.remember_unwatched_nonce(&resp.type_url, &resp.nonce);
            log_unwatched(&resp.type_url, &resp.nonce, resp.resources.len());
            return;
        };
        if let Some(ts) = self.types.get_mut(kind.type_url()) {
            ts.nonce.clone_from(&resp.nonce);
        }
        if let Some(error) = self.refuse_whole(
            resp.resources.len(),
            resp.resources.iter().map(|a| a.value.len()).sum(),
        ) {
            let version = self.version(kind.type_url()).unwrap_or_default().to_owned();
            self.acks.push_back(Ack {
                type_url: resp.type_url,
                version,
                nonce: resp.nonce,
                error: Some(error),
            });
            return;
        }
        let Some(ts) = self.types.get_mut(kind.type_url()) else {
            return;
        };
        let mut errors: Vec<Rejection> = Vec::new();
        let mut checked: Vec<Checked> = Vec::with_capacity(resp.resources.len());
        let mut unnamed_errors = false;
        for (i, any) in resp.resources.iter().enumerate() {
            match check_sotw_any(&kind, any, &resp.version_info) {
                Ok(c) => checked.push(c),
                Err((Some(name), why)) => {
                    errors.push((Some(name), why));
                }
                Err((None, why)) => {
                    unnamed_errors = true;
                    errors.push((None, format!("resource #{i}: {why}")));
                }
            }
        }
        reject_duplicates(&mut checked, &mut errors, &[]);
        // Listener and Cluster: what the response leaves out is deleted. Rejected names count as
        // present (their last good value stays); if a resource could not even be named, nothing
        // is deleted, since it may be any of them. Only what we hold, or received and
        // rejected, can be deleted: a name never received may be missing because the response
        // answers a request sent before it was asked for, so its does-not-exist timer decides
        // (gRPC does the same).
        let mut gone = Vec::new();
        if kind.all_resources_required_in_sotw() && !unnamed_errors {
            let present: FastSet<&str> = checked
                .iter()
                .map(|c| c.name.as_str())
                .chain(errors.iter().filter_map(|(n, _)| n.as_deref()))
                .collect();
            gone.extend(
                ts.entries
                    .iter()
                    .filter(|(n, e)| {
                        !present.contains(n.as_str())
                            && (ts.wildcard || ts.names.contains(*n))
                            && (e.cached.is_some() || e.rejected)
                    })
                    .map(|(n, _)| n.clone()),
            );
        }
        // What the response drops goes first, so that its place counts for what it brings.
        let Some(ts) = self.types.get_mut(kind.type_url()) else {
            return;
        };
        let ignore = self.config.ignore_resource_deletion;
        for name in gone {
            if ignore
                && let Some(e) = ts.entries.get_mut(&name)
                && e.cached.is_some()
            {
                // gRFC A53: keep serving the last version; say it once.
                if !e.deletion_ignored {
                    e.deletion_ignored = true;
                    self.ignored_deletions += 1;
                    tracing::warn!(
                        type_url = kind.type_url(),
                        name = truncated(&name, 256),
                        "xds: the server left a resource out of its response; deletion ignored, the last version stays"
                    );
                }
                continue;
            }
            remove_entry(ts, &mut self.timers, &mut self.events, kind, &name);
        }
        self.apply(now, kind, checked, &mut errors);
        let Some(ts) = self.types.get_mut(kind.type_url()) else {
            return;
        };
        let error = summarize(&errors);
        if error.is_none() {
            ts.version.clone_from(&resp.version_info);
        }
        self.acks.push_back(Ack {
            type_url: resp.type_url,
            version: if error.is_none() {
                resp.version_info
            } else {
                ts.version.clone()
            },
            nonce: resp.nonce,
            error,
        });
        self.mark_synced(kind.type_url());
    }

    fn handle_delta(&mut self, now: Instant, resp: DeltaDiscoveryResponse) {
        let Some(kind) = self.watched(&resp.type_url) else {
            // Nothing to remember: Delta subscription requests carry no nonce.
            log_unwatched(
                &resp.type_url,
                &resp.nonce,
                resp.resources.len() + resp.removed_resources.len(),
            );
            return;
        };
        if let Some(ts) = self.types.get_mut(kind.type_url()) {
            ts.nonce.clone_from(&resp.nonce);
        }
        let encoded = resp
            .resources
            .iter()
            .map(|r| r.resource.as_ref().map_or(0, |a| a.value.len()))
            .sum();
        if let Some(error) = self.refuse_whole(resp.resources.len(), encoded) {
            self.acks.push_back(Ack {
                type_url: resp.type_url,
                version: String::new(),
                nonce: resp.nonce,
                error: Some(error),
            });
            return;
        }
        let mut errors: Vec<Rejection> = Vec::new();
        let mut checked: Vec<Checked> = Vec::with_capacity(resp.resources.len());
        for (i, r) in resp.resources.into_iter().enumerate() {
            match check_wrapped(&kind, r, None) {
                Ok(c) => checked.push(c),
                Err((Some(name), why)) => errors.push((Some(name), why)),
                Err((None, why)) => errors.push((None, format!("resource #{i}: {why}"))),
            }
        }
        let mut removed: Vec<String> = resp.removed_resources;
        removed.extend(
            resp.removed_resource_names
                .into_iter()
                .map(|n| n.name)
                .filter(|n| !n.is_empty()),
        );
        let rejected = reject_duplicates(&mut checked, &mut errors, &removed);
        self.apply(now, kind, checked, &mut errors);
        let Some(ts) = self.types.get_mut(kind.type_url()) else {
            return;
        };
        for name in removed {
            if rejected.contains(&name) || !(ts.wildcard || ts.names.contains(&name)) {
                continue;
            }
            remove_entry(ts, &mut self.timers, &mut self.events, kind, &name);
        }
        self.acks.push_back(Ack {
            type_url: resp.type_url,
            version: String::new(),
            nonce: resp.nonce,
            error: summarize(&errors),
        });
        self.mark_synced(kind.type_url());
    }

    /// Applies the valid resources of a response and records the rejected ones, adding to
    /// `errors` the resources refused for a limit.
    fn apply(
        &mut self,
        now: Instant,
        kind: ResourceType,
        checked: Vec<Checked>,
        errors: &mut Vec<Rejection>,
    ) {
        let type_url = kind.type_url();
        let max_entries = self.config.max_resources_per_type;
        let max_bytes = self.config.max_cached_bytes;
        let other_bytes: usize = self
            .types
            .iter()
            .filter(|(url, _)| url.as_str() != type_url)
            .map(|(_, ts)| ts.bytes)
            .sum();
        let Some(ts) = self.types.get_mut(type_url) else {
            return;
        };
        let timers = &mut self.timers;
        let mut refused: Vec<Rejection> = Vec::new();
        for c in checked {
            if !(ts.wildcard || ts.names.contains(&c.name)) {
                continue;
            }
            let held = ts.entries.contains_key(&c.name);
            if c.body.is_none() && !held {
                continue; // a heartbeat for something we do not have
            }
            if !held && ts.entries.len() >= max_entries {
                refused.push((
                    Some(c.name),
                    format!("refused: the client holds its limit of {max_entries} resources of this type"),
                ));
                continue;
            }
            if let Some((_, _, encoded)) = &c.body {
                let size = encoded_size(*encoded, &c.name, &c.version);
                let old = ts
                    .entries
                    .get(&c.name)
                    .and_then(|e| e.cached.as_ref())
                    .map_or(0, |c| c.size);
                if other_bytes
                    .saturating_add(ts.bytes.saturating_sub(old))
                    .saturating_add(size)
                    > max_bytes
                {
                    refused.push((
                        Some(c.name),
                        format!("refused: caching it would exceed the client's limit of {max_bytes} cached bytes"),
                    ));
                    continue;
                }
            }
            let e = ts.entries.entry(c.name.clone()).or_default();
            if e.deletion_ignored {
                e.deletion_ignored = false;
                log_returned(type_url, &c.name);
            }
            let Some((value, hash, encoded)) = c.body else {
                if e.cached.is_some() {
                    set_ttl(
                        timers,
                        type_url,
                        &c.name,
                        e,
                        c.ttl.and_then(|d| now.checked_add(d)),
                    );
                }
                continue;
            };
            cancel_dne(timers, type_url, &c.name, e);
            set_ttl(
                timers,
                type_url,
                &c.name,
                e,
                c.ttl.and_then(|d| now.checked_add(d)),
            );
            e.absent = false;
            let was_rejected = std::mem::take(&mut e.rejected);
            let size = encoded_size(encoded, &c.name, &c.version);
            let old = e.cached.as_ref().map_or(0, |c| c.size);
            ts.bytes = ts.bytes.saturating_sub(old).saturating_add(size);
            match &mut e.cached {
                Some(cached) if cached.hash == hash => {
                    cached.version = c.version;
                    cached.size = size;
                    // The version held is good again after a rejected one: a watcher that
                    // acted on the rejection learns that it is over.
                    if was_rejected {
                        self.events.push_back(Event::Updated {
                            type_url,
                            name: c.name,
                            version: cached.version.clone(),
                            resource: cached.value.clone(),
                        });
                    }
                }
                slot => {
                    *slot = Some(Cached {
                        value: value.clone(),
                        version: c.version.clone(),
                        hash,
                        size,
                    });
                    self.events.push_back(Event::Updated {
                        type_url,
                        name: c.name,
                        version: c.version,
                        resource: value,
                    });
                }
            }
        }
        for (name, why) in errors.iter() {
            if let Some(name) = name {
                if !(ts.wildcard || ts.names.contains(name)) {
                    continue;
                }
                if let Some(e) = ts.entries.get_mut(name) {
                    // It exists, it is just wrong: never report it as non-existent.
                    cancel_dne(timers, type_url, name, e);
                    e.rejected = true;
                    if e.deletion_ignored {
                        e.deletion_ignored = false;
                        log_returned(type_url, name);
                    }
                } else if ts.entries.len() < max_entries {
                    ts.entries.entry(name.clone()).or_default().rejected = true;
                }
            }
            self.events.push_back(Event::Rejected {
                type_url,
                name: name.clone(),
                error: why.clone(),
            });
        }
        for (name, why) in &refused {
            // Recorded as a rejection, as an invalid resource is, so that its end (a later
            // version, or its removal) is reported too.
            if let Some(name) = name
                && (ts.wildcard || ts.names.contains(name))
            {
                if let Some(e) = ts.entries.get_mut(name) {
                    cancel_dne(timers, type_url, name, e);
                    e.rejected = true;
                } else if ts.entries.len() < max_entries {
                    ts.entries.entry(name.clone()).or_default().rejected = true;
                }
            }
            self.events.push_back(Event::Rejected {
                type_url,
                name: name.clone(),
                error: why.clone(),
            });
        }
        errors.extend(refused);
    }

    /// The type of `type_url` if somebody watches it (by name or wildcard).
    fn watched(&self, type_url: &str) -> Option<ResourceType> {
        let ts = self.types.get(type_url)?;
        ts.kind.filter(|_| ts.wildcard || !ts.names.is_empty())
    }

    /// Records the nonce of a response for a type nobody watches, for a later subscription
    /// request of it. A type without state gets some only within
    /// [`SessionConfig::max_type_urls`] and when its type URL and nonce are short.
    fn remember_unwatched_nonce(&mut self, type_url: &str, nonce: &str) {
        let short = nonce.len() <= MAX_UNWATCHED_STRING;
        match self.types.get_mut(type_url) {
            Some(ts) => {
                ts.nonce.clear();
                if short || ts.kind.is_some() {
                    ts.nonce.push_str(nonce);
                }
            }
            None => {
                if short
                    && type_url.len() <= MAX_UNWATCHED_STRING
                    && self.types.len() < self.config.max_type_urls
                {
                    self.types.entry(type_url.to_owned()).or_default().nonce = nonce.to_owned();
                }
            }
        }
    }

    /// Why a whole response is NACKed before decoding, if it is: more resources than one type
    /// may hold, or more bytes than the whole cache may.
    fn refuse_whole(&self, count: usize, encoded: usize) -> Option<String> {
        let (max_count, max_bytes) = (
            self.config.max_resources_per_type,
            self.config.max_cached_bytes,
        );
        if count > max_count {
            Some(format!(
                "response refused: it carries {count} resources, more than the client's limit of {max_count} resources of one type; nothing of it applied"
            ))
        } else if encoded > max_bytes {
            Some(format!(
                "response refused: its resources take {encoded} bytes, more than the client's limit of {max_bytes} cached bytes; nothing of it applied"
            ))
        } else {
            None
        }
    }

    fn build_sotw(
        &mut self,
        url: &str,
        now: Instant,
        ack: Option<Ack>,
    ) -> Option<DiscoveryRequest> {
        let timeout = self.config.does_not_exist_timeout;
        let ts = self.types.get_mut(url)?;
        ts.dirty = false;
        let diff = diff_subscriptions(ts, &mut self.timers, url);
        if ack.is_none() {
            let nothing_wanted = !ts.wildcard && ts.names.is_empty();
            // An empty first request would mean the legacy wildcard: send nothing instead.
            if (diff.first && nothing_wanted)
                || (!diff.first && diff.subscribe.is_empty() && diff.unsubscribe.is_empty())
            {
                return None;
            }
        }
        arm_dne(ts, &mut self.timers, url, &diff.subscribe, now, timeout);
        let mut names = Vec::with_capacity(ts.names.len() + 1);
        if ts.wildcard {
            names.push(WILDCARD.to_owned());
        }
        names.extend(ts.names.iter().cloned());
        let (version, nonce, error) = match ack {
            Some(a) => (a.version, a.nonce, a.error),
            None => (ts.version.clone(), ts.nonce.clone(), None),
        };
        Some(DiscoveryRequest {
            version_info: version,
            resource_names: names,
            type_url: url.to_owned(),
            response_nonce: nonce,
            error_detail: error.map(nack_status),
            ..Default::default()
        })
    }

    fn build_delta(&mut self, url: &str, now: Instant) -> Option<DeltaDiscoveryRequest> {
        let timeout = self.config.does_not_exist_timeout;
        let ts = self.types.get_mut(url)?;
        ts.dirty = false;
        let diff = diff_subscriptions(ts, &mut self.timers, url);
        if diff.subscribe.is_empty() && diff.unsubscribe.is_empty() {
            return None;
        }
        let mut initial = HashMap::new();
        if diff.first {
            // What we hold, so the server need not resend it; never what we rejected.
            for (name, e) in &ts.entries {
                if let Some(c) = &e.cached
                    && !e.rejected
                    && (ts.wildcard || ts.names.contains(name))
                {
                    initial.insert(name.clone(), c.version.clone());
                }
            }
        }
        arm_dne(ts, &mut self.timers, url, &diff.subscribe, now, timeout);
        // Subscription changes carry no nonce: they answer no response.
        Some(DeltaDiscoveryRequest {
            type_url: url.to_owned(),
            resource_names_subscribe: diff.subscribe,
            resource_names_unsubscribe: diff.unsubscribe,
            initial_resource_versions: initial,
            ..Default::default()
        })
    }

    fn type_state(&mut self, kind: ResourceType) -> &mut TypeState {
        let ts = self.types.entry(kind.type_url().to_owned()).or_default();
        ts.kind.get_or_insert(kind);
        ts
    }

    fn mark_dirty(&mut self, type_url: &str) {
        if let Some(ts) = self.types.get_mut(type_url)
            && !ts.dirty
        {
            ts.dirty = true;
            self.dirty.push_back(type_url.to_owned());
        }
    }
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("mode", &self.config.mode)
            .field("connected", &self.connected)
            .field("types", &self.types.len())
            .field("cached", &self.cached_len())
            .finish_non_exhaustive()
    }
}

// === helpers ===

/// The subscription change since the last request, and the cache entries it drops.
fn diff_subscriptions(ts: &mut TypeState, timers: &mut BTreeSet<Timer>, url: &str) -> Diff {
    let changed = std::mem::take(&mut ts.changed);
    let TypeState {
        wildcard,
        names,
        entries,
        bytes,
        sent,
        ..
    } = ts;
    let wildcard = *wildcard;
    for n in &changed {
        if n == WILDCARD {
            if !wildcard {
                entries.retain(|k, e| {
                    let keep = names.contains(k);
                    if !keep {
                        drop_timers(timers, url, k, e);
                        *bytes = bytes.saturating_sub(e.cached.as_ref().map_or(0, |c| c.size));
                    }
                    keep
                });
            }
        } else if !wildcard
            && !names.contains(n)
            && let Some(e) = entries.remove(n)
        {
            drop_timers(timers, url, n, &e);
            *bytes = bytes.saturating_sub(e.cached.as_ref().map_or(0, |c| c.size));
        }
    }
    match sent {
        None => {
            let mut subscribe = Vec::with_capacity(names.len() + 1);
            if wildcard {
                subscribe.push(WILDCARD.to_owned());
            }
            subscribe.extend(names.iter().cloned());
            *sent = Some(Sent {
                wildcard,
                names: names.clone(),
            });
            Diff {
                first: true,
                subscribe,
                unsubscribe: Vec::new(),
            }
        }
        Some(sent) => {
            let mut diff = Diff {
                first: false,
                subscribe: Vec::new(),
                unsubscribe: Vec::new(),
            };
            for n in changed {
                let (want, have) = if n == WILDCARD {
                    (wildcard, sent.wildcard)
                } else {
                    (names.contains(&n), sent.names.contains(&n))
                };
                if want == have {
                    continue;
                }
                if n == WILDCARD {
                    sent.wildcard = want;
                } else if want {
                    sent.names.insert(n.clone());
                } else {
                    sent.names.remove(&n);
                }
                if want {
                    diff.subscribe.push(n);
                } else {
                    diff.unsubscribe.push(n);
                }
            }
            diff
        }
    }
}

/// Arms the does-not-exist timer of each just-requested name that we do not hold.
fn arm_dne(
    ts: &mut TypeState,
    timers: &mut BTreeSet<Timer>,
    url: &str,
    names: &[String],
    now: Instant,
    timeout: Duration,
) {
    let Some(at) = now.checked_add(timeout) else {
        return;
    };
    for n in names {
        let Some(e) = ts.entries.get_mut(n) else {
            continue;
        };
        if e.cached.is_none() && !e.rejected && !e.absent && e.dne_deadline.is_none() {
            e.dne_deadline = Some(at);
            timers.insert(Timer {
                at,
                kind: TimerKind::DoesNotExist,
                type_url: url.to_owned(),
                name: n.clone(),
            });
        }
    }
}

fn cancel_dne(timers: &mut BTreeSet<Timer>, url: &str, name: &str, e: &mut Entry) {
    if let Some(at) = e.dne_deadline.take() {
        timers.remove(&Timer {
            at,
            kind: TimerKind::DoesNotExist,
            type_url: url.to_owned(),
            name: name.to_owned(),
        });
    }
}

fn set_ttl(
    timers: &mut BTreeSet<Timer>,
    url: &str,
    name: &str,
    e: &mut Entry,
    at: Option<Instant>,
) {
    if e.ttl_deadline == at {
        return;
    }
    if let Some(old) = e.ttl_deadline.take() {
        timers.remove(&Timer {
            at: old,
            kind: TimerKind::Ttl,
            type_url: url.to_owned(),
            name: name.to_owned(),
        });
    }
    if let Some(at) = at {
        e.ttl_deadline = Some(at);
        timers.insert(Timer {
            at,
            kind: TimerKind::Ttl,
            type_url: url.to_owned(),
            name: name.to_owned(),
        });
    }
}

/// An entry is dropped because nobody wants it any more: its timers go, and so does a kept
/// deletion (said, as gRFC A53 asks).
fn drop_timers(timers: &mut BTreeSet<Timer>, url: &str, name: &str, e: &Entry) {
    if e.deletion_ignored {
        log_returned(url, name);
    }
    for (at, kind) in [
        (e.dne_deadline, TimerKind::DoesNotExist),
        (e.ttl_deadline, TimerKind::Ttl),
    ] {
        if let Some(at) = at {
            timers.remove(&Timer {
                at,
                kind,
                type_url: url.to_owned(),
                name: name.to_owned(),
            });
        }
    }
}

/// The server says a resource is gone (SotW absence of a required type, or Delta removal).
fn remove_entry(
    ts: &mut TypeState,
    timers: &mut BTreeSet<Timer>,
    events: &mut VecDeque<Event>,
    kind: ResourceType,
    name: &str,
) {
    let named = ts.names.contains(name);
    let Some(e) = ts.entries.get_mut(name) else {
        return;
    };
    cancel_dne(timers, kind.type_url(), name, e);
    set_ttl(timers, kind.type_url(), name, e, None);
    let gone = e.cached.take();
    let had = gone.is_some();
    ts.bytes = ts.bytes.saturating_sub(gone.as_ref().map_or(0, |c| c.size));
    let was_absent = e.absent;
    let was_rejected = e.rejected;
    e.absent = true;
    e.rejected = false;
    e.deletion_ignored = false;
    if !named {
        ts.entries.remove(name);
    }
    // A resource whose only version was rejected is gone too: a watcher that acted on the
    // rejection learns that it is over.
    let reason = if had || was_rejected {
        RemovalReason::Deleted
    } else if named && !was_absent {
        RemovalReason::DoesNotExist
    } else {
        return;
    };
    events.push_back(Event::Removed {
        type_url: kind.type_url(),
        name: name.to_owned(),
        reason,
    });
}

/// A resource whose deletion was ignored is sent again, or no longer wanted (gRFC A53).
fn log_returned(type_url: &str, name: &str) {
    tracing::info!(
        type_url,
        name = truncated(name, 256),
        "xds: a resource whose deletion was ignored is no longer missing"
    );
}

/// A response for a type nobody watches is dropped: said once per response, at `warn`, as a
/// server that pushes what was never asked for is misbehaving.
fn log_unwatched(type_url: &str, nonce: &str, resources: usize) {
    tracing::warn!(
        type_url = truncated(type_url, 128),
        nonce = truncated(nonce, 64),
        resources,
        "xds: response for a type nobody watches dropped, not answered"
    );
}

/// At most `max` bytes of `s`, cut at a character boundary.
fn truncated(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}
