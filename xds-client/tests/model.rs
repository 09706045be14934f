//! Random sequences of subscriptions, stream changes, responses and time against the protocol
//! core, compared op by op with a reference model of the State-of-the-World and Delta rules:
//! the events watchers must see (updates, rejections, deletions, does-not-exist), what is
//! cached, the does-not-exist deadline, and how every response is answered.
//!
//! The model is written from the rules of `docs/xds.md`, not from the core's code: a
//! subscription change takes effect when the next request is sent (while connected); a named
//! resource not received within 15 s of a connected stream does not exist; a rejected resource
//! keeps its last good value and never "does not exist", and the end of its rejection is
//! reported (a valid version is an update even when it equals the value held; a removal is a
//! deletion even when no value was held); SotW leaves out a Cluster to delete it (one it never
//! sent is left to the timer: the response may predate the subscription);
//! Delta deletes only what it lists in `removed_resources`; a name repeated in one response is
//! rejected; a lost stream changes nothing a watcher sees; a response for a type nobody watches
//! is not answered (State of the World still remembers its nonce). A third run turns on
//! `ignore_resource_deletion` (gRFC A53): SotW absence then keeps a cached resource, marks and
//! counts it once, and a name never received still does not exist when its timer fires.
//!
//! "No does-not-exist while disconnected" holds for both variants: the timer stops with the
//! stream, and a SotW absence is only ever read from a response, which needs a stream.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryResponse, DiscoveryResponse, Resource as Wrapped,
};
use envoy_types::pb::google::protobuf::{Any, Duration as PbDuration};
use meshkit_xds_client::protocol::{
    Event, Mode, RemovalReason, Request, Response, Session, SessionConfig,
};
use meshkit_xds_client::{CLUSTER_TYPE_URL, ResourceType};
use proptest::prelude::*;
use prost::Message;

const NAMES: [&str; 4] = ["a", "b", "c", "d"];
const DOES_NOT_EXIST_AFTER: u64 = 15;

const INVALID: &str = "connect_timeout: must be > 0s [duration.gt]";
const REPEATED: &str = "name appears more than once in the response";
const UNNAMED: &str = "resource has an empty name";

/// What a response carries for one name.
#[derive(Debug, Clone, Copy)]
enum Body {
    /// A valid cluster whose `connect_timeout` is this many seconds (its content).
    Valid(i64),
    /// A cluster that fails validation (`connect_timeout` of zero).
    Invalid,
    /// A cluster with an empty name: rejected without a name.
    Unnamed,
}

#[derive(Debug, Clone)]
enum Op {
    Subscribe(Option<usize>),
    Unsubscribe(Option<usize>),
    Connect,
    Disconnect,
    /// (name index, body) pairs, and the name indices removed (Delta only).
    Respond(Vec<(usize, Body)>, Vec<usize>),
    Advance(u64),
    Flush,
}

fn body() -> impl Strategy<Value = Body> {
    prop_oneof![
        4 => (1i64..=2).prop_map(Body::Valid),
        1 => Just(Body::Invalid),
        1 => Just(Body::Unnamed),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let name = proptest::option::of(0..NAMES.len());
    prop_oneof![
        name.clone().prop_map(Op::Subscribe),
        name.prop_map(Op::Unsubscribe),
        Just(Op::Connect),
        Just(Op::Disconnect),
        (
            proptest::collection::vec((0..NAMES.len(), body()), 0..5),
            proptest::collection::vec(0..NAMES.len(), 0..2)
        )
            .prop_map(|(r, d)| Op::Respond(r, d)),
        (0u64..20).prop_map(Op::Advance),
        Just(Op::Flush),
    ]
}

fn any_cluster(name: &str, connect_timeout: i64) -> Any {
    Any {
        type_url: CLUSTER_TYPE_URL.into(),
        value: Cluster {
            name: name.into(),
            connect_timeout: Some(PbDuration {
                seconds: connect_timeout,
                nanos: 0,
            }),
            ..Default::default()
        }
        .encode_to_vec(),
    }
}

/// The wire form of one resource of a response.
fn encode(name: &str, body: Body) -> (&str, Any) {
    match body {
        Body::Valid(t) => (name, any_cluster(name, t)),
        Body::Invalid => (name, any_cluster(name, 0)),
        Body::Unnamed => ("", any_cluster("", 1)),
    }
}

// === what watchers see ===

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Gone {
    Deleted,
    DoesNotExist,
    TtlExpired,
}

/// An event, comparable: an update's content is its `connect_timeout`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Seen {
    Updated {
        name: String,
        version: String,
        connect_timeout: i64,
    },
    Removed {
        name: String,
        reason: Gone,
    },
    Rejected {
        name: Option<String>,
        error: String,
    },
}

fn connect_timeout_of(resource: &meshkit_xds_client::AnyResource) -> i64 {
    let cluster = resource
        .downcast_ref::<Cluster>()
        .expect("a cluster was cached");
    cluster.connect_timeout.expect("a timeout").seconds
}

fn seen(event: Event) -> Seen {
    match event {
        Event::Updated {
            name,
            version,
            resource,
            ..
        } => Seen::Updated {
            name,
            version,
            connect_timeout: connect_timeout_of(&resource),
        },
        Event::Removed { name, reason, .. } => Seen::Removed {
            name,
            reason: match reason {
                RemovalReason::Deleted => Gone::Deleted,
                RemovalReason::DoesNotExist => Gone::DoesNotExist,
                RemovalReason::TtlExpired => Gone::TtlExpired,
                other => panic!("unknown removal reason {other:?}"),
            },
        },
        Event::Rejected { name, error, .. } => Seen::Rejected { name, error },
        other => panic!("unknown event {other:?}"),
    }
}

// === the reference model ===

/// What the model knows of one name: the core keeps the same per-name facts.
#[derive(Debug, Clone, Default)]
struct Entry {
    /// Content and version.
    cached: Option<(i64, String)>,
    /// The latest version received was rejected.
    rejected: bool,
    /// Reported as gone (deleted or non-existent) and not received since.
    absent: bool,
    /// When it is declared non-existent, in seconds since the start.
    does_not_exist_at: Option<u64>,
    /// SotW left it out and the deletion was ignored; cleared when it is sent again.
    deletion_ignored: bool,
}

/// How the model expects a response to be answered.
struct Answer {
    nack: bool,
    /// SotW: the `version_info` of the answer.
    version: String,
}

struct Model {
    mode: Mode,
    /// `SessionConfig::ignore_resource_deletion`.
    ignore_deletions: bool,
    /// Deletions ignored so far.
    ignored: u64,
    connected: bool,
    wildcard: bool,
    named: BTreeSet<&'static str>,
    entries: BTreeMap<&'static str, Entry>,
    /// The named subscriptions the server has been told of on this stream; `None`: nothing yet.
    sent: Option<BTreeSet<&'static str>>,
    /// SotW: the last version accepted (kept across streams).
    accepted: String,
    /// The nonce of the last response on this stream.
    nonce: String,
    /// Seconds since the start.
    now: u64,
    events: Vec<Seen>,
}

impl Model {
    fn new(mode: Mode) -> Self {
        Self::with(mode, false)
    }

    fn with(mode: Mode, ignore_deletions: bool) -> Self {
        Self {
            mode,
            ignore_deletions,
            ignored: 0,
            connected: false,
            wildcard: false,
            named: BTreeSet::new(),
            entries: BTreeMap::new(),
            sent: None,
            accepted: String::new(),
            nonce: String::new(),
            now: 0,
            events: Vec::new(),
        }
    }

    fn covered(&self, name: &str) -> bool {
        self.wildcard || self.named.contains(name)
    }

    fn watching(&self) -> bool {
        self.wildcard || !self.named.is_empty()
    }

    fn subscribe(&mut self, name: Option<&'static str>) {
        match name {
            Some(n) => {
                if self.named.insert(n) {
                    self.entries.entry(n).or_default();
                }
            }
            None => self.wildcard = true,
        }
    }

    fn unsubscribe(&mut self, name: Option<&'static str>) {
        match name {
            Some(n) => {
                if self.named.remove(n)
                    && let Some(e) = self.entries.get_mut(n)
                {
                    e.does_not_exist_at = None;
                }
            }
            None => self.wildcard = false,
        }
    }

    fn connect(&mut self) {
        self.connected = true;
        self.sent = None;
        self.nonce.clear();
    }

    /// The stream is gone: no timer runs until the next one, and nobody is told anything.
    fn disconnect(&mut self) {
        self.connected = false;
        for e in self.entries.values_mut() {
            e.does_not_exist_at = None;
        }
    }

    /// The subscription changes go out (connected only): what nobody wants any more is
    /// dropped without an event, and each name newly sent that has no value, no rejection and
    /// no verdict yet gets its does-not-exist deadline. Returns the `initial_resource_versions`
    /// a Delta stream's first request carries.
    fn send_changes(&mut self) -> HashMap<String, String> {
        let (wildcard, named) = (self.wildcard, self.named.clone());
        self.entries.retain(|n, _| wildcard || named.contains(n));
        let first = self.sent.is_none();
        let newly: Vec<&'static str> = match &self.sent {
            None => named.iter().copied().collect(),
            Some(sent) => named.difference(sent).copied().collect(),
        };
        self.sent = Some(named);
        for n in newly {
            let e = self.entries.get_mut(n).expect("a named entry");
            if e.cached.is_none() && !e.rejected && !e.absent && e.does_not_exist_at.is_none() {
                e.does_not_exist_at = Some(self.now + DOES_NOT_EXIST_AFTER);
            }
        }
        if !first {
            return HashMap::new();
        }
        self.entries
            .iter()
            .filter(|(_, e)| !e.rejected)
            .filter_map(|(n, e)| e.cached.as_ref().map(|(_, v)| (n.to_string(), v.clone())))
            .collect()
    }

    fn advance(&mut self, secs: u64) {
        self.now += secs;
        for (n, e) in &mut self.entries {
            if e.does_not_exist_at.is_some_and(|at| at <= self.now) {
                e.does_not_exist_at = None;
                if e.cached.is_none() && !e.absent {
                    e.absent = true;
                    self.events.push(Seen::Removed {
                        name: n.to_string(),
                        reason: Gone::DoesNotExist,
                    });
                }
            }
        }
    }

    /// The server says `name` is gone: a deletion if we held it, else (a name we asked for
    /// and had no verdict on) a non-existence.
    fn remove(&mut self, name: &'static str) {
        let named = self.named.contains(name);
        let Some(e) = self.entries.get_mut(name) else {
            return;
        };
        e.does_not_exist_at = None;
        let had = e.cached.take().is_some();
        let was_absent = std::mem::replace(&mut e.absent, true);
        let was_rejected = std::mem::take(&mut e.rejected);
        e.deletion_ignored = false;
        if !named {
            self.entries.remove(name);
        }
        let reason = if had || was_rejected {
            Gone::Deleted
        } else if named && !was_absent {
            Gone::DoesNotExist
        } else {
            return;
        };
        self.events.push(Seen::Removed {
            name: name.to_owned(),
            reason,
        });
    }

    /// `None`: the response is dropped unanswered (nobody watches the type).
    fn respond(
        &mut self,
        n: u32,
        resources: &[(usize, Body)],
        removed: &[usize],
    ) -> Option<Answer> {
        let sotw_version = format!("v{n}");
        let delta_version = n.to_string();
        // SotW keeps even an unwatched type's nonce, for its later subscription request.
        self.nonce = format!("n{n}");
        if !self.watching() {
            return None;
        }
        // Step one and two: the valid ones, and the rejections (name or none, reason).
        let mut valid: Vec<(&'static str, i64)> = Vec::new();
        let mut errors: Vec<(Option<&'static str>, String)> = Vec::new();
        for (i, (index, body)) in resources.iter().enumerate() {
            let name = NAMES[*index];
            match body {
                Body::Valid(t) => valid.push((name, *t)),
                Body::Invalid => errors.push((Some(name), INVALID.to_owned())),
                Body::Unnamed => errors.push((None, format!("resource #{i}: {UNNAMED}"))),
            }
        }
        let removed: Vec<&'static str> = match self.mode {
            Mode::Delta => removed.iter().map(|i| NAMES[*i]).collect(),
            Mode::StateOfTheWorld => Vec::new(),
        };
        // A name given twice (updated, rejected or removed) is rejected, every copy of it.
        let mut count: BTreeMap<&str, usize> = BTreeMap::new();
        for n in valid
            .iter()
            .map(|(n, _)| *n)
            .chain(errors.iter().filter_map(|(n, _)| *n))
            .chain(removed.iter().copied())
        {
            *count.entry(n).or_default() += 1;
        }
        let repeated: BTreeSet<&'static str> = NAMES
            .iter()
            .copied()
            .filter(|n| count.get(n).is_some_and(|c| *c > 1))
            .collect();
        valid.retain(|(n, _)| !repeated.contains(n));
        errors.retain(|(n, _)| n.is_none_or(|n| !repeated.contains(n)));
        errors.extend(repeated.iter().map(|n| (Some(*n), REPEATED.to_owned())));
        let removed: Vec<&'static str> = removed
            .into_iter()
            .filter(|n| !repeated.contains(n))
            .collect();

        // SotW: a Cluster left out is deleted, unless a resource could not even be named.
        if self.mode == Mode::StateOfTheWorld && errors.iter().all(|(n, _)| n.is_some()) {
            let present: BTreeSet<&str> = valid
                .iter()
                .map(|(n, _)| *n)
                .chain(errors.iter().filter_map(|(n, _)| *n))
                .collect();
            let gone: Vec<&'static str> = self
                .entries
                .iter()
                .filter(|(n, e)| {
                    !present.contains(*n) && self.covered(n) && (e.cached.is_some() || e.rejected)
                })
                .map(|(n, _)| *n)
                .collect();
            for n in gone {
                match self.entries.get_mut(n) {
                    Some(e) if self.ignore_deletions && e.cached.is_some() => {
                        if !std::mem::replace(&mut e.deletion_ignored, true) {
                            self.ignored += 1;
                        }
                    }
                    _ => self.remove(n),
                }
            }
        }
        for (name, content) in valid {
            if !self.covered(name) {
                continue;
            }
            let version = match self.mode {
                Mode::StateOfTheWorld => sotw_version.clone(),
                Mode::Delta => delta_version.clone(),
            };
            let e = self.entries.entry(name).or_default();
            e.does_not_exist_at = None;
            e.absent = false;
            let was_rejected = std::mem::take(&mut e.rejected);
            e.deletion_ignored = false;
            let unchanged = e.cached.as_ref().is_some_and(|(c, _)| *c == content);
            e.cached = Some((content, version.clone()));
            if !unchanged || was_rejected {
                self.events.push(Seen::Updated {
                    name: name.to_owned(),
                    version,
                    connect_timeout: content,
                });
            }
        }
        for (name, error) in &errors {
            if let Some(name) = name {
                if !self.covered(name) {
                    continue;
                }
                let e = self.entries.entry(name).or_default();
                e.does_not_exist_at = None;
                e.rejected = true;
                e.deletion_ignored = false;
            }
            self.events.push(Seen::Rejected {
                name: name.map(str::to_owned),
                error: error.clone(),
            });
        }
        for n in removed {
            if self.covered(n) {
                self.remove(n);
            }
        }
        let nack = !errors.is_empty();
        if !nack {
            self.accepted.clone_from(&sotw_version);
        }
        Some(Answer {
            nack,
            version: if nack {
                self.accepted.clone()
            } else {
                sotw_version
            },
        })
    }

    /// SotW `resource_names`: `*` first when wildcard, then the names.
    fn resource_names(&self) -> Vec<String> {
        let star = self.wildcard.then(|| "*".to_owned());
        star.into_iter()
            .chain(self.named.iter().map(|n| n.to_string()))
            .collect()
    }
}

// === the run ===

fn response(mode: Mode, n: u32, resources: &[(usize, Body)], removed: &[usize]) -> Response {
    match mode {
        Mode::StateOfTheWorld => Response::Sotw(DiscoveryResponse {
            version_info: format!("v{n}"),
            resources: resources
                .iter()
                .map(|(i, b)| encode(NAMES[*i], *b).1)
                .collect(),
            type_url: CLUSTER_TYPE_URL.into(),
            nonce: format!("n{n}"),
            ..Default::default()
        }),
        Mode::Delta => Response::Delta(DeltaDiscoveryResponse {
            resources: resources
                .iter()
                .map(|(i, b)| {
                    let (name, any) = encode(NAMES[*i], *b);
                    Wrapped {
                        name: name.into(),
                        version: n.to_string(),
                        resource: Some(any),
                        ..Default::default()
                    }
                })
                .collect(),
            removed_resources: removed.iter().map(|i| NAMES[*i].to_string()).collect(),
            type_url: CLUSTER_TYPE_URL.into(),
            nonce: format!("n{n}"),
            ..Default::default()
        }),
    }
}

fn run(mode: Mode, ignore_deletions: bool, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let kind = ResourceType::of::<Cluster>();
    let mut s = Session::new(SessionConfig::new(mode).ignore_resource_deletion(ignore_deletions));
    let mut m = Model::with(mode, ignore_deletions);
    let start = Instant::now();
    let mut n = 0u32;
    for (step, op) in ops.into_iter().enumerate() {
        let mut answer = None;
        let mut responded = false;
        let mut initial = HashMap::new();
        match &op {
            Op::Subscribe(Some(i)) => {
                s.subscribe(kind, NAMES[*i]);
                m.subscribe(Some(NAMES[*i]));
            }
            Op::Subscribe(None) => {
                s.subscribe_wildcard(kind);
                m.subscribe(None);
            }
            Op::Unsubscribe(Some(i)) => {
                s.unsubscribe(CLUSTER_TYPE_URL, NAMES[*i]);
                m.unsubscribe(Some(NAMES[*i]));
            }
            Op::Unsubscribe(None) => {
                s.unsubscribe_wildcard(CLUSTER_TYPE_URL);
                m.unsubscribe(None);
            }
            Op::Connect => {
                if !m.connected {
                    s.on_connected(start + Duration::from_secs(m.now));
                    m.connect();
                }
            }
            Op::Disconnect => {
                s.on_disconnected();
                m.disconnect();
            }
            Op::Respond(resources, removed) => {
                if m.connected {
                    n += 1;
                    s.handle_response(
                        start + Duration::from_secs(m.now),
                        response(mode, n, resources, removed),
                    );
                    answer = m.respond(n, resources, removed);
                    responded = true;
                }
            }
            Op::Advance(secs) => {
                m.advance(*secs);
                s.handle_timeout(start + Duration::from_secs(m.now));
            }
            Op::Flush => {}
        }
        if m.connected {
            initial = m.send_changes();
        }
        let at = format!("step {step}, {op:?}");
        let now = start + Duration::from_secs(m.now);

        // Requests: nothing while down; a response's answer comes first and alone; a
        // subscription change carries the stream's state.
        let requests: Vec<Request> = std::iter::from_fn(|| s.poll_request(now)).collect();
        if !m.connected {
            prop_assert!(requests.is_empty(), "{}: sent while down", at);
        }
        let mut requests = requests.into_iter();
        if let Some(expected) = &answer {
            let nonce = format!("n{n}");
            match requests.next() {
                Some(Request::Sotw(r)) => {
                    prop_assert_eq!(&r.response_nonce, &nonce, "{}", at);
                    prop_assert_eq!(r.error_detail.is_some(), expected.nack, "{}: {:?}", at, r);
                    prop_assert_eq!(&r.version_info, &expected.version, "{}", at);
                    prop_assert_eq!(&r.resource_names, &m.resource_names(), "{}", at);
                }
                Some(Request::Delta(r)) => {
                    prop_assert_eq!(&r.response_nonce, &nonce, "{}", at);
                    prop_assert_eq!(r.error_detail.is_some(), expected.nack, "{}: {:?}", at, r);
                }
                None => prop_assert!(false, "{}: response not answered", at),
            }
            prop_assert!(requests.next().is_none(), "{}: more than the answer", at);
        } else if responded {
            prop_assert!(
                requests.len() == 0,
                "{}: a response nobody watches was answered",
                at
            );
        }
        for request in requests {
            match request {
                Request::Sotw(r) => {
                    prop_assert!(r.error_detail.is_none(), "{}", at);
                    prop_assert_eq!(&r.response_nonce, &m.nonce, "{}", at);
                    prop_assert_eq!(&r.version_info, &m.accepted, "{}", at);
                    prop_assert_eq!(&r.resource_names, &m.resource_names(), "{}", at);
                }
                Request::Delta(r) => {
                    prop_assert!(r.error_detail.is_none(), "{}", at);
                    prop_assert!(r.response_nonce.is_empty(), "{}: {:?}", at, r);
                    prop_assert_eq!(&r.initial_resource_versions, &initial, "{}", at);
                }
            }
        }

        // Events: exactly the model's, and the wildcard subscription's sync at most once per
        // step, after the step's other events (the model does not track what the server was
        // told, so `Synced` is checked for its place, not predicted).
        let events: Vec<Event> = std::iter::from_fn(|| s.poll_event()).collect();
        let synced = events
            .iter()
            .filter(|e| matches!(e, Event::Synced { .. }))
            .count();
        prop_assert!(synced <= 1, "{}: {:?}", at, events);
        if synced == 1 {
            prop_assert!(
                matches!(events.last(), Some(Event::Synced { .. })),
                "{}: {:?}",
                at,
                events
            );
            prop_assert!(s.is_synced(CLUSTER_TYPE_URL), "{}", at);
        }
        let mut got: Vec<Seen> = events
            .into_iter()
            .filter(|e| !matches!(e, Event::Synced { .. }))
            .map(seen)
            .collect();
        let mut want = std::mem::take(&mut m.events);
        got.sort();
        want.sort();
        if !m.connected {
            prop_assert!(
                got.iter().all(|e| !matches!(
                    e,
                    Seen::Removed {
                        reason: Gone::DoesNotExist,
                        ..
                    }
                )),
                "{}: does-not-exist while down: {:?}",
                at,
                got
            );
        }
        prop_assert_eq!(got, want, "{}", at);

        // State: the cache, the verdicts and the next deadline.
        for name in NAMES {
            let e = m.entries.get(name);
            let cached = s
                .resource(CLUSTER_TYPE_URL, name)
                .map(connect_timeout_of)
                .zip(
                    s.resource_version(CLUSTER_TYPE_URL, name)
                        .map(str::to_owned),
                );
            prop_assert_eq!(
                &cached,
                &e.and_then(|e| e.cached.clone()),
                "{}: {}",
                at,
                name
            );
            prop_assert_eq!(
                s.is_absent(CLUSTER_TYPE_URL, name),
                e.is_some_and(|e| e.absent),
                "{}: {} absent",
                at,
                name
            );
            prop_assert_eq!(
                s.is_deletion_ignored(CLUSTER_TYPE_URL, name),
                e.is_some_and(|e| e.deletion_ignored),
                "{}: {} deletion ignored",
                at,
                name
            );
        }
        prop_assert_eq!(
            s.ignored_deletions(),
            m.ignored,
            "{}: deletions ignored",
            at
        );
        let deadline = m
            .entries
            .values()
            .filter_map(|e| e.does_not_exist_at)
            .min()
            .map(|at| start + Duration::from_secs(at));
        prop_assert_eq!(s.poll_timeout(), deadline, "{}: next deadline", at);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn sotw_matches_the_model(ops in proptest::collection::vec(op(), 0..40)) {
        run(Mode::StateOfTheWorld, false, ops)?;
    }

    #[test]
    fn sotw_ignoring_deletions_matches_the_model(ops in proptest::collection::vec(op(), 0..40)) {
        run(Mode::StateOfTheWorld, true, ops)?;
    }

    #[test]
    fn delta_matches_the_model(ops in proptest::collection::vec(op(), 0..40)) {
        run(Mode::Delta, false, ops)?;
    }
}

/// The model's rules on a fixed story, so that a wrong model cannot agree with a wrong core
/// unnoticed: SotW deletes what a response leaves out, Delta only what it removes.
#[test]
fn the_model_deletes_by_absence_in_sotw_and_by_removal_in_delta() {
    for mode in [Mode::StateOfTheWorld, Mode::Delta] {
        let mut m = Model::new(mode);
        m.subscribe(Some("a"));
        m.subscribe(Some("b"));
        m.connect();
        m.send_changes();
        m.respond(1, &[(0, Body::Valid(1)), (1, Body::Valid(1))], &[]);
        m.events.clear();
        // "b" left out, "a" removed.
        m.respond(2, &[(0, Body::Valid(1))], &[0]);
        let deleted: Vec<Seen> = std::mem::take(&mut m.events);
        let expected = match mode {
            // SotW ignores removed_resources: the repeated-free response keeps "a".
            Mode::StateOfTheWorld => vec![Seen::Removed {
                name: "b".into(),
                reason: Gone::Deleted,
            }],
            // Delta: "a" is both updated and removed, so rejected; "b" is kept.
            Mode::Delta => vec![Seen::Rejected {
                name: Some("a".into()),
                error: REPEATED.into(),
            }],
        };
        assert_eq!(deleted, expected, "{mode:?}");
        // A name never answered does not exist 15 s after it was sent, and only then.
        m.subscribe(Some("c"));
        m.send_changes();
        m.advance(14);
        assert!(m.events.is_empty(), "{mode:?}");
        m.advance(1);
        assert_eq!(
            m.events,
            [Seen::Removed {
                name: "c".into(),
                reason: Gone::DoesNotExist
            }],
            "{mode:?}"
        );
    }
}

/// The model's issue-15 rules on a fixed story: an unwatched type's response gets no answer;
/// with `ignore_resource_deletion` a SotW absence keeps what was cached (counted once) and
/// leaves a name never received to its timer.
#[test]
fn the_model_drops_unwatched_responses_and_ignores_deletions_when_asked() {
    let mut m = Model::with(Mode::StateOfTheWorld, true);
    m.connect();
    assert!(m.respond(1, &[(0, Body::Valid(1))], &[]).is_none());
    assert!(m.events.is_empty() && m.entries.is_empty());
    m.subscribe(Some("a"));
    m.subscribe(Some("b"));
    m.send_changes();
    assert!(m.respond(2, &[(0, Body::Valid(1))], &[]).is_some());
    assert!(
        !m.events.iter().any(|e| matches!(e, Seen::Removed { .. })),
        "a name never received is not declared absent by a response: {:?}",
        m.events
    );
    m.events.clear();
    m.respond(3, &[], &[]);
    m.respond(4, &[], &[]);
    assert!(m.events.is_empty(), "the deletion of \"a\" is ignored");
    m.advance(DOES_NOT_EXIST_AFTER);
    assert_eq!(
        m.events,
        [Seen::Removed {
            name: "b".into(),
            reason: Gone::DoesNotExist
        }],
        "the timer decides"
    );
    assert!(m.entries["a"].cached.is_some() && m.entries["a"].deletion_ignored);
    assert_eq!(m.ignored, 1);
}
