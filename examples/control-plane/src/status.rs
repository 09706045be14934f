//! Status written back to the API server, for the objects meshkit serves.
//!
//! | kind | which | status |
//! |---|---|---|
//! | Ingress | of an IngressClass whose `spec.controller` is [`StatusConfig::ingress_controller`] (also by default class) | `loadBalancer.ingress`: the gateway's addresses ([`StatusConfig::address`]); nothing while none is known |
//! | GatewayClass | `spec.controllerName` is the gateway controller | `Accepted` |
//! | Gateway | of such a class | `Accepted` (`False`, `ListenersNotValid`, when no listener is), `Programmed` (`False`, `AddressNotAssigned`, while no address is known), `addresses` (its `spec.addresses`, else the gateway's), each listener's `Accepted`, `Conflicted`, `Programmed`, `ResolvedRefs`, `supportedKinds` and `attachedRoutes` (the routes Accepted on it) |
//! | HTTPRoute | each parent that is such a Gateway | `parents[]`: `parentRef`, `controllerName`, `Accepted`, `ResolvedRefs` |
//!
//! Every condition carries the object's `observedGeneration`; its `lastTransitionTime` is
//! kept while its status stays the same. An HTTPRoute's parents written by other controllers
//! are kept as they are.
//!
//! Writes are server-side apply patches of the `status` subresource under one field manager
//! ([`StatusConfig::field_manager`], forced: the control plane owns what it writes). A status
//! is written only when what the API server holds differs from what it should be, so a
//! status the API server already holds is never written again, and a status someone else
//! changed is written back. Only the leader writes when [`StatusConfig::lease`] elects one
//! ([`crate::leader`]); the others follow the objects and serve, ready to take over, and the
//! writer checks that it still leads before each write. A write that fails is retried after
//! a second, doubling to a minute while writes keep failing. A parent meshkit wrote on an
//! HTTPRoute that no longer names a Gateway of meshkit's is removed, and an Ingress's address
//! is taken back when none is known any more. Objects the model refuses or cannot enforce
//! as written get a `Warning` Event (reason `Refused` or `NotFullyEnforced`) once per leader.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, DynamicObject, Patch, PatchParams};
use meshkit_ingress_model::RouteTableBuilder;
use meshkit_ingress_model::gateway::{Condition, GROUP, HttpRouteTable, Reason};
use serde_json::{Map, Value, json};
use tokio::sync::watch;

use crate::kube_source::{KINDS, StatusReader};
use crate::leader::LeaseConfig;
use crate::manifests::{ManifestError, ManifestSet};
use crate::metrics::StatusMetrics;
use crate::translate::TranslateOptions;

/// The field manager of the status writes by default.
pub const FIELD_MANAGER: &str = "meshkit-control-plane";

/// The IngressClass controller whose Ingresses get status by default: meshkit's gateway.
pub const INGRESS_CONTROLLER: &str = "meshkit.io/ingress-gateway";

/// Where the gateway's addresses come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressSource {
    /// These addresses: IP addresses or host names.
    Fixed(Vec<String>),
    /// The addresses in this Service's `status.loadBalancer.ingress` (IP, else host name),
    /// else its `spec.externalIPs`: the Service in front of the gateway.
    Service {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
}

/// What status the control plane writes, and who writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusConfig {
    /// The field manager of the writes. Default [`FIELD_MANAGER`].
    pub field_manager: String,
    /// The IngressClass controller whose Ingresses get status. Default
    /// [`INGRESS_CONTROLLER`].
    pub ingress_controller: String,
    /// The gateway's addresses, for Ingress `status.loadBalancer` and Gateway
    /// `status.addresses`. Default `None`: Ingresses get no address, and Gateways without
    /// `spec.addresses` are not Programmed.
    pub address: Option<AddressSource>,
    /// The Lease the replicas elect their writer on. Default `None`: this control plane is
    /// the only one and always writes.
    pub lease: Option<LeaseConfig>,
}

impl Default for StatusConfig {
    fn default() -> Self {
        Self {
            field_manager: FIELD_MANAGER.to_owned(),
            ingress_controller: INGRESS_CONTROLLER.to_owned(),
            address: None,
            lease: None,
        }
    }
}

impl StatusConfig {
    /// Sets where the gateway's addresses come from.
    pub fn with_address(mut self, address: AddressSource) -> Self {
        self.address = Some(address);
        self
    }

    /// Elects the writer among replicas on a Lease.
    pub fn with_lease(mut self, lease: LeaseConfig) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Sets the field manager.
    pub fn with_field_manager(mut self, manager: impl Into<String>) -> Self {
        self.field_manager = manager.into();
        self
    }
}

/// An object whose status is written.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Target {
    kind: &'static str,
    namespace: String,
    name: String,
}

/// What each object's status should be, before the times of its conditions are known; and
/// the objects the model refuses, each reported once as an Event on it.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Desired {
    statuses: BTreeMap<Target, Value>,
    /// The controller name of the HTTPRoute parents written.
    controller: String,
    refusals: BTreeSet<Refusal>,
}

/// An object the model refused or cannot enforce as written, and why.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Refusal {
    target: Target,
    /// The Event's reason: `Refused` (left out, or kept as last accepted) or
    /// `NotFullyEnforced`.
    reason: &'static str,
    message: String,
}

impl Desired {
    /// Reports `problems` (of objects from the API, named `KIND NAMESPACE/NAME` or `KIND
    /// NAME`) as Events, in place of those reported before; those also in `refused` with
    /// the reason `Refused`, the others `NotFullyEnforced`.
    pub(crate) fn with_problems(
        mut self,
        problems: &[ManifestError],
        refused: &[ManifestError],
    ) -> Self {
        self.refusals = problems
            .iter()
            .filter_map(|p| {
                let origin = p.file.to_str()?;
                let (kind, rest) = origin.split_once(' ')?;
                let kind = KINDS.iter().find(|k| k.kind == kind)?;
                let (namespace, name) = match rest.split_once('/') {
                    Some((ns, name)) => (ns, name),
                    None => ("", rest),
                };
                let message = match &p.field {
                    Some(field) => format!("{field}: {}", p.message),
                    None => p.message.clone(),
                };
                Some(Refusal {
                    target: target(kind.kind, namespace, name),
                    reason: if refused.contains(p) {
                        "Refused"
                    } else {
                        "NotFullyEnforced"
                    },
                    message,
                })
            })
            .collect();
        self
    }
}

/// The statuses `set` calls for, with `table` its Gateway API route table.
pub(crate) fn desired(
    set: &ManifestSet,
    table: &HttpRouteTable,
    options: &TranslateOptions,
    config: &StatusConfig,
) -> Desired {
    let controller = options
        .gateway_controller
        .clone()
        .unwrap_or_else(|| crate::gateway_api::DEFAULT_CONTROLLER.to_owned());
    let addresses = addresses(set, config.address.as_ref());
    let mut statuses = BTreeMap::new();
    ingresses(set, config, &addresses, &mut statuses);
    let objects = &set.gateway_api;
    let classes: BTreeSet<&str> = objects
        .gateway_classes
        .iter()
        .filter(|c| c.spec.controller_name == controller)
        .filter_map(|c| c.metadata.name.as_deref())
        .collect();
    for class in &objects.gateway_classes {
        let Some(name) = class.metadata.name.as_deref() else {
            continue;
        };
        if classes.contains(name) {
            let generation = class.metadata.generation;
            statuses.insert(
                target("GatewayClass", "", name),
                json!({ "conditions": [plain(
                    "Accepted",
                    true,
                    "Accepted",
                    "handled by meshkit's control plane",
                    generation,
                )] }),
            );
        }
    }
    let mut ours = BTreeSet::new();
    for gateway in &objects.gateways {
        if !classes.contains(gateway.spec.gateway_class_name.as_str()) {
            continue;
        }
        let namespace = gateway.metadata.namespace.clone().unwrap_or_default();
        let name = gateway.metadata.name.clone().unwrap_or_default();
        let generation = gateway.metadata.generation;
        let own: Vec<Value> = if gateway.spec.addresses.is_empty() {
            addresses.iter().map(|a| address(a)).collect()
        } else {
            gateway
                .spec
                .addresses
                .iter()
                .map(|a| {
                    json!({
                        "type": a.address_type.as_deref().unwrap_or("IPAddress"),
                        "value": a.value,
                    })
                })
                .collect()
        };
        let has_address = !own.is_empty();
        let listeners: Vec<Value> = table
            .listener_status()
            .iter()
            .filter(|l| l.namespace == namespace && l.gateway == name)
            .map(|l| {
                let protocol = gateway
                    .spec
                    .listeners
                    .iter()
                    .find(|spec| spec.name == l.listener)
                    .map(|spec| spec.protocol.as_str());
                let kinds: Vec<Value> = match protocol {
                    Some("HTTP" | "HTTPS") => vec![json!({ "group": GROUP, "kind": "HTTPRoute" })],
                    _ => Vec::new(),
                };
                let conflicted = l.accepted.reason == Reason::ProtocolConflict;
                json!({
                    "name": l.listener,
                    "attachedRoutes": l.attached_routes,
                    "supportedKinds": kinds,
                    "conditions": [
                        condition("Accepted", &l.accepted, generation),
                        plain("Conflicted", conflicted,
                            if conflicted { "ProtocolConflict" } else { "NoConflicts" },
                            if conflicted { "another listener serves another protocol on this port" } else { "" },
                            generation),
                        programmed(l.accepted.status, has_address, generation),
                        condition("ResolvedRefs", &l.resolved_refs, generation),
                    ],
                })
            })
            .collect();
        let accepted = listeners.is_empty()
            || table
                .listener_status()
                .iter()
                .any(|l| l.namespace == namespace && l.gateway == name && l.accepted.status);
        let accepted_condition = if accepted {
            plain("Accepted", true, "Accepted", "", generation)
        } else {
            plain(
                "Accepted",
                false,
                "ListenersNotValid",
                "no listener is valid",
                generation,
            )
        };
        statuses.insert(
            target("Gateway", &namespace, &name),
            json!({
                "addresses": own,
                "conditions": [accepted_condition, programmed(accepted, has_address, generation)],
                "listeners": listeners,
            }),
        );
        ours.insert((namespace, name));
    }
    http_routes(set, table, &controller, &ours, &mut statuses);
    Desired {
        statuses,
        controller,
        refusals: BTreeSet::new(),
    }
}

fn ingresses(
    set: &ManifestSet,
    config: &StatusConfig,
    addresses: &[String],
    statuses: &mut BTreeMap<Target, Value>,
) {
    let classes = RouteTableBuilder::new()
        .controller(config.ingress_controller.clone())
        .ingress_classes(&set.ingress_classes);
    let load_balancer: Vec<Value> = addresses
        .iter()
        .map(|a| match a.parse::<std::net::IpAddr>() {
            Ok(_) => json!({ "ip": a }),
            Err(_) => json!({ "hostname": a }),
        })
        .collect();
    for ingress in set.ingresses.iter().filter(|i| classes.accepts(i)) {
        let meta = ingress.metadata.clone().unwrap_or_default();
        statuses.insert(
            target(
                "Ingress",
                meta.namespace.as_deref().unwrap_or("default"),
                meta.name.as_deref().unwrap_or_default(),
            ),
            json!({ "loadBalancer": { "ingress": load_balancer } }),
        );
    }
}

fn http_routes(
    set: &ManifestSet,
    table: &HttpRouteTable,
    controller: &str,
    gateways: &BTreeSet<(String, String)>,
    statuses: &mut BTreeMap<Target, Value>,
) {
    let generations: BTreeMap<(&str, &str), Option<i64>> = set
        .gateway_api
        .http_routes
        .iter()
        .map(|r| {
            (
                (
                    r.metadata.namespace.as_deref().unwrap_or_default(),
                    r.metadata.name.as_deref().unwrap_or_default(),
                ),
                r.metadata.generation,
            )
        })
        .collect();
    let mut parents: BTreeMap<Target, Vec<Value>> = BTreeMap::new();
    for s in table.route_status() {
        let parent_ns = s
            .parent
            .namespace
            .clone()
            .unwrap_or_else(|| s.namespace.clone());
        if !gateways.contains(&(parent_ns, s.parent.name.clone())) {
            // Another controller's Gateway, or none: not this control plane's to report.
            continue;
        }
        let generation = generations
            .get(&(s.namespace.as_str(), s.name.as_str()))
            .copied()
            .flatten();
        let mut parent_ref = Map::new();
        parent_ref.insert("group".into(), json!(s.parent.group()));
        parent_ref.insert("kind".into(), json!(s.parent.kind()));
        if let Some(ns) = &s.parent.namespace {
            parent_ref.insert("namespace".into(), json!(ns));
        }
        parent_ref.insert("name".into(), json!(s.parent.name));
        if let Some(section) = &s.parent.section_name {
            parent_ref.insert("sectionName".into(), json!(section));
        }
        if let Some(port) = s.parent.port {
            parent_ref.insert("port".into(), json!(port));
        }
        parents
            .entry(target("HTTPRoute", &s.namespace, &s.name))
            .or_default()
            .push(json!({
                "parentRef": parent_ref,
                "controllerName": controller,
                "conditions": [
                    condition("Accepted", &s.accepted, generation),
                    condition("ResolvedRefs", &s.resolved_refs, generation),
                ],
            }));
    }
    for (target, parents) in parents {
        statuses.insert(target, json!({ "parents": parents }));
    }
}

/// The gateway's addresses now.
fn addresses(set: &ManifestSet, source: Option<&AddressSource>) -> Vec<String> {
    match source {
        None => Vec::new(),
        Some(AddressSource::Fixed(addresses)) => addresses.clone(),
        Some(AddressSource::Service { namespace, name }) => {
            let Some(service) = set.services.iter().find(|s| {
                s.metadata.namespace.as_deref() == Some(namespace.as_str())
                    && s.metadata.name.as_deref() == Some(name.as_str())
            }) else {
                return Vec::new();
            };
            let balanced: Vec<String> = service
                .status
                .iter()
                .flat_map(|s| s.load_balancer.iter())
                .flat_map(|lb| lb.ingress.iter().flatten())
                .filter_map(|i| i.ip.clone().or_else(|| i.hostname.clone()))
                .collect();
            if !balanced.is_empty() {
                return balanced;
            }
            service
                .spec
                .iter()
                .flat_map(|s| s.external_ips.iter().flatten().cloned())
                .collect()
        }
    }
}

fn address(value: &str) -> Value {
    let kind = if value.parse::<std::net::IpAddr>().is_ok() {
        "IPAddress"
    } else {
        "Hostname"
    };
    json!({ "type": kind, "value": value })
}

fn target(kind: &'static str, namespace: &str, name: &str) -> Target {
    Target {
        kind,
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    }
}

fn condition(kind: &str, c: &Condition, generation: Option<i64>) -> Value {
    plain(kind, c.status, c.reason.as_str(), &c.message, generation)
}

fn programmed(accepted: bool, has_address: bool, generation: Option<i64>) -> Value {
    match (accepted, has_address) {
        (true, true) => plain("Programmed", true, "Programmed", "", generation),
        (false, _) => plain("Programmed", false, "Invalid", "not accepted", generation),
        (true, false) => plain(
            "Programmed",
            false,
            "AddressNotAssigned",
            "the control plane knows no address of the gateway",
            generation,
        ),
    }
}

/// A condition without its `lastTransitionTime`, which [`stamp`] gives it.
fn plain(kind: &str, status: bool, reason: &str, message: &str, generation: Option<i64>) -> Value {
    let mut c = Map::new();
    c.insert("type".into(), json!(kind));
    c.insert(
        "status".into(),
        json!(if status { "True" } else { "False" }),
    );
    c.insert("reason".into(), json!(reason));
    c.insert("message".into(), json!(message));
    if let Some(generation) = generation {
        c.insert("observedGeneration".into(), json!(generation));
    }
    Value::Object(c)
}

/// `desired` with each condition's `lastTransitionTime`: `current`'s while the condition's
/// status is the same, else `now`.
fn stamp(desired: &mut Value, current: Option<&Value>, now: &str) {
    match desired {
        Value::Object(map) if map.contains_key("type") && map.contains_key("status") => {
            let kept = current
                .filter(|c| c.get("status") == map.get("status"))
                .and_then(|c| c.get("lastTransitionTime"))
                .cloned();
            map.insert(
                "lastTransitionTime".into(),
                kept.unwrap_or_else(|| json!(now)),
            );
        }
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                stamp(value, current.and_then(|c| c.get(key)), now);
            }
        }
        Value::Array(items) => {
            let current = current.and_then(Value::as_array);
            for (index, item) in items.iter_mut().enumerate() {
                let matched = current.and_then(|c| counterpart(c, item, index));
                stamp(item, matched, now);
            }
        }
        _ => {}
    }
}

/// The item of `current` that `item` (at `index`) stands for: a condition by its type, a
/// listener by its name, a route parent by its reference and controller, else by position.
fn counterpart<'c>(current: &'c [Value], item: &Value, index: usize) -> Option<&'c Value> {
    for key in ["type", "name"] {
        if let Some(id) = item.get(key) {
            return current.iter().find(|c| c.get(key) == Some(id));
        }
    }
    if let Some(parent) = item.get("parentRef") {
        return current.iter().find(|c| {
            c.get("controllerName") == item.get("controllerName")
                && c.get("parentRef").is_some_and(|p| contains(p, parent))
        });
    }
    current.get(index)
}

/// Whether `current` already holds all of `desired`: objects by key; conditions (items with
/// a `type` and a `status`) by type, and others' conditions allowed; listeners by name, and
/// route parents by reference and controller, in any order but no more and no fewer; other
/// lists item by item; an empty list or object is held by an absent one.
fn contains(current: &Value, desired: &Value) -> bool {
    match desired {
        Value::Object(map) => map.iter().all(|(key, value)| match current.get(key) {
            Some(c) => contains(c, value),
            None => is_empty(value),
        }),
        Value::Array(items) => {
            let current = match current {
                Value::Array(c) => c.as_slice(),
                Value::Null => &[],
                _ => return false,
            };
            let conditions = !items.is_empty()
                && items
                    .iter()
                    .all(|i| i.get("type").is_some() && i.get("status").is_some());
            if conditions {
                return items.iter().all(|i| {
                    current
                        .iter()
                        .any(|c| c.get("type") == i.get("type") && contains(c, i))
                });
            }
            let keyed = !items.is_empty()
                && items
                    .iter()
                    .all(|i| i.get("name").is_some() || i.get("parentRef").is_some());
            if keyed {
                return current.len() == items.len()
                    && items.iter().enumerate().all(|(index, i)| {
                        counterpart(current, i, index).is_some_and(|c| contains(c, i))
                    });
            }
            current.len() == items.len() && current.iter().zip(items).all(|(c, i)| contains(c, i))
        }
        scalar => current == scalar,
    }
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Array(items) => items.is_empty(),
        Value::Object(map) => map.is_empty(),
        Value::Null => true,
        _ => false,
    }
}

/// The full status to apply to `target` over `current`: `desired` stamped; for an HTTPRoute,
/// the parents other controllers wrote kept as they are and where they are, each of ours in
/// the place it had, new ones after, and ours that are no longer wanted left out.
fn merged(target: &Target, desired: &Value, current: &Value, controller: &str, now: &str) -> Value {
    let mut status = desired.clone();
    stamp(&mut status, Some(current), now);
    if target.kind == "HTTPRoute" {
        let mut ours: Vec<Option<Value>> = status
            .get("parents")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .cloned()
            .map(Some)
            .collect();
        let mut parents = Vec::new();
        for parent in current
            .get("parents")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if parent.get("controllerName").and_then(Value::as_str) != Some(controller) {
                parents.push(parent.clone());
                continue;
            }
            let mine = ours.iter_mut().find(|o| {
                o.as_ref()
                    .is_some_and(|o| match (o.get("parentRef"), parent.get("parentRef")) {
                        (Some(want), Some(have)) => contains(have, want),
                        _ => false,
                    })
            });
            if let Some(slot) = mine.and_then(Option::take) {
                parents.push(slot);
            }
        }
        parents.extend(ours.into_iter().flatten());
        // The API server keeps at most 32 parents.
        parents.truncate(32);
        status["parents"] = Value::Array(parents);
    }
    status
}

/// Writes the statuses.
pub(crate) struct Writer {
    pub(crate) client: kube::Client,
    pub(crate) config: StatusConfig,
    pub(crate) statuses: StatusReader,
    pub(crate) metrics: StatusMetrics,
    /// Without an election, the sender that says this control plane always leads.
    pub(crate) _fixed_leader: Option<watch::Sender<bool>>,
    /// The refusals reported as Events while this replica leads.
    pub(crate) reported: BTreeSet<Refusal>,
}

impl Writer {
    /// Writes what `desired` calls for whenever it, a status, or the leadership changes,
    /// while `leader` says so, until `stop`.
    pub(crate) async fn run(
        mut self,
        mut desired: watch::Receiver<Arc<Desired>>,
        mut leader: watch::Receiver<bool>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut retry: Option<tokio::time::Instant> = None;
        // Doubles from 1 s to a minute while writes keep failing.
        let mut backoff = Duration::from_secs(1);
        self.metrics.set_leading(*leader.borrow());
        loop {
            let retry_at =
                retry.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                changed = desired.changed() => if changed.is_err() { return },
                changed = leader.changed() => if changed.is_err() { return },
                () = self.statuses.changed() => {}
                () = tokio::time::sleep_until(retry_at) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            // Let a burst settle: one pass writes it all.
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(50)) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            let leading = *leader.borrow_and_update();
            self.metrics.set_leading(leading);
            if !leading {
                // A new leader reports what is refused then, itself.
                self.reported.clear();
                retry = None;
                continue;
            }
            let want = Arc::clone(&desired.borrow_and_update());
            retry = if self.reconcile(&want, &leader).await {
                backoff = Duration::from_secs(1);
                None
            } else {
                let at = tokio::time::Instant::now() + backoff;
                backoff = (backoff * 2).min(Duration::from_secs(60));
                Some(at)
            };
        }
    }

    /// Writes every status that differs from `desired`, and an Event for each refusal not
    /// reported yet; false when a write failed.
    async fn reconcile(&mut self, desired: &Desired, leader: &watch::Receiver<bool>) -> bool {
        let statuses = self.write_statuses(desired, leader).await;
        self.reported.retain(|r| desired.refusals.contains(r));
        let mut events = true;
        for refusal in desired.refusals.difference(&self.reported.clone()) {
            if !*leader.borrow() {
                break;
            }
            match self.event(refusal).await {
                Ok(()) => {
                    self.reported.insert(refusal.clone());
                }
                Err(error) => {
                    events = false;
                    tracing::warn!(kind = refusal.target.kind, name = %refusal.target.name, %error, "the Event of a refused object could not be written; retrying");
                }
            }
        }
        statuses && events
    }

    /// Reports `refusal` as a Warning Event on its object.
    async fn event(&self, refusal: &Refusal) -> Result<(), kube::Error> {
        use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
        let t = &refusal.target;
        let Some(kind) = KINDS.iter().find(|k| k.kind == t.kind) else {
            return Ok(());
        };
        let namespace = if t.namespace.is_empty() {
            "default".to_owned()
        } else {
            t.namespace.clone()
        };
        let now = k8s_openapi::jiff::Timestamp::now();
        let mut message = refusal.message.clone();
        if message.len() > 1024 {
            let mut end = 1024;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
        }
        let event = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}.", t.name)),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            involved_object: ObjectReference {
                api_version: Some(kind.api_version()),
                kind: Some(kind.kind.to_owned()),
                name: Some(t.name.clone()),
                namespace: (!t.namespace.is_empty()).then(|| t.namespace.clone()),
                ..ObjectReference::default()
            },
            reason: Some(refusal.reason.to_owned()),
            message: Some(message),
            type_: Some("Warning".to_owned()),
            action: Some("Apply".to_owned()),
            source: Some(EventSource {
                component: Some(self.config.field_manager.clone()),
                host: None,
            }),
            reporting_component: Some(self.config.field_manager.clone()),
            reporting_instance: Some(self.config.field_manager.clone()),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            event_time: Some(MicroTime(now)),
            count: Some(1),
            ..Event::default()
        };
        let events: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        events
            .create(&kube::api::PostParams::default(), &event)
            .await
            .map(|_| ())
    }

    /// Writes every status that differs from `desired`, while this replica leads; false when
    /// a write failed. An HTTPRoute that no longer names a Gateway of meshkit's loses the
    /// parents meshkit wrote.
    async fn write_statuses(&self, desired: &Desired, leader: &watch::Receiver<bool>) -> bool {
        let now = now_rfc3339();
        let mut ok = true;
        let none = json!({ "parents": [] });
        let stale: Vec<Target> = self
            .statuses
            .all("HTTPRoute")
            .into_iter()
            .filter(|(_, _, status)| {
                status
                    .get("parents")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .any(|p| {
                        p.get("controllerName").and_then(Value::as_str)
                            == Some(desired.controller.as_str())
                    })
            })
            .map(|(ns, name, _)| target("HTTPRoute", &ns, &name))
            .filter(|t| !desired.statuses.contains_key(t))
            .collect();
        let wanted = desired
            .statuses
            .iter()
            .chain(stale.iter().map(|t| (t, &none)));
        for (target, want) in wanted {
            if !*leader.borrow() {
                return true;
            }
            let Some(current) = self
                .statuses
                .status(target.kind, &target.namespace, &target.name)
            else {
                // Deleted meanwhile.
                continue;
            };
            let status = merged(target, want, &current, &desired.controller, &now);
            if contains(&current, &status) {
                continue;
            }
            match self.write(target, status).await {
                Ok(()) => {
                    self.metrics.written(target.kind);
                    tracing::debug!(kind = target.kind, namespace = %target.namespace, name = %target.name, "status written");
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(error) => {
                    ok = false;
                    self.metrics.failed(target.kind);
                    tracing::warn!(kind = target.kind, namespace = %target.namespace, name = %target.name, %error, "status could not be written; retrying");
                }
            }
        }
        ok
    }

    async fn write(&self, target: &Target, status: Value) -> Result<(), kube::Error> {
        let Some(kind) = KINDS.iter().find(|k| k.kind == target.kind) else {
            return Ok(());
        };
        let resource = kind.api_resource();
        let api: Api<DynamicObject> = if kind.namespaced() {
            Api::namespaced_with(self.client.clone(), &target.namespace, &resource)
        } else {
            Api::all_with(self.client.clone(), &resource)
        };
        let mut metadata = json!({ "name": target.name });
        if kind.namespaced() {
            metadata["namespace"] = json!(target.namespace);
        }
        let patch = json!({
            "apiVersion": kind.api_version(),
            "kind": kind.kind,
            "metadata": metadata,
            "status": status,
        });
        let params = PatchParams::apply(&self.config.field_manager).force();
        api.patch_status(&target.name, &params, &Patch::Apply(patch))
            .await
            .map(|_| ())
    }
}

fn now_rfc3339() -> String {
    let now = time::OffsetDateTime::now_utc();
    let now = now.replace_nanosecond(0).unwrap_or(now);
    now.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_keeps_its_time_while_its_status_holds() {
        let current = json!({ "conditions": [
            { "type": "Accepted", "status": "True", "reason": "Accepted", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z" },
            { "type": "Programmed", "status": "True", "reason": "Programmed", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z" },
        ]});
        let desired = json!({ "conditions": [
            plain("Accepted", true, "Accepted", "", None),
            plain("Programmed", false, "AddressNotAssigned", "none", None),
        ]});
        let t = target("Gateway", "ns", "g");
        let status = merged(&t, &desired, &current, "c", "2026-02-02T00:00:00Z");
        assert_eq!(
            status["conditions"][0]["lastTransitionTime"],
            "2026-01-01T00:00:00Z"
        );
        assert_eq!(
            status["conditions"][1]["lastTransitionTime"],
            "2026-02-02T00:00:00Z"
        );
        assert!(!contains(&current, &status));
        let stable = merged(&t, &desired, &status, "c", "2026-03-03T00:00:00Z");
        assert_eq!(stable, status);
        assert!(contains(&status, &stable));
    }

    #[test]
    fn what_the_api_server_adds_is_not_a_difference() {
        // Defaults the API server fills in, and conditions of other types, are held.
        let current = json!({
            "parents": [{
                "parentRef": { "group": GROUP, "kind": "Gateway", "name": "g" },
                "controllerName": "c",
                "conditions": [
                    { "type": "Accepted", "status": "True", "reason": "Accepted", "message": "", "lastTransitionTime": "t" },
                    { "type": "Other", "status": "True", "reason": "Other", "message": "", "lastTransitionTime": "t" },
                ],
            }],
        });
        let desired = json!({ "parents": [{
            "parentRef": { "name": "g" },
            "controllerName": "c",
            "conditions": [{ "type": "Accepted", "status": "True", "reason": "Accepted", "message": "", "lastTransitionTime": "t" }],
        }]});
        assert!(contains(&current, &desired));
        assert!(contains(&Value::Null, &json!({ "addresses": [] })));
        // A listener too many, or one missing, is a difference.
        let listeners = json!({ "listeners": [{ "name": "a" }, { "name": "b" }] });
        assert!(!contains(
            &listeners,
            &json!({ "listeners": [{ "name": "a" }] })
        ));
        assert!(contains(
            &listeners,
            &json!({ "listeners": [{ "name": "b" }, { "name": "a" }] })
        ));
    }

    #[test]
    fn lists_that_shrink_and_parents_in_another_order() {
        // An address gone is a difference.
        let current = json!({ "addresses": [
            { "type": "IPAddress", "value": "192.0.2.1" },
            { "type": "IPAddress", "value": "192.0.2.2" },
        ]});
        let desired = json!({ "addresses": [{ "type": "IPAddress", "value": "192.0.2.1" }] });
        assert!(!contains(&current, &desired));
        // Parents compare by reference and controller, wherever they are; ours keep their
        // place.
        let theirs =
            json!({ "parentRef": { "name": "t" }, "controllerName": "other", "conditions": [] });
        let ours = json!({ "parentRef": { "name": "g" }, "controllerName": "c", "conditions": [] });
        let current = json!({ "parents": [ours.clone(), theirs.clone()] });
        let desired = json!({ "parents": [ours.clone()] });
        let route = target("HTTPRoute", "ns", "r");
        let status = merged(&route, &desired, &current, "c", "now");
        assert_eq!(status, current);
        assert!(contains(&current, &status));
        // Ours no longer wanted: left out, theirs kept.
        let status = merged(&route, &json!({ "parents": [] }), &current, "c", "now");
        assert_eq!(status, json!({ "parents": [theirs] }));
    }

    #[test]
    fn other_controllers_parents_are_kept_first() {
        let current = json!({ "parents": [
            { "parentRef": { "name": "theirs" }, "controllerName": "other", "conditions": [] },
            { "parentRef": { "name": "old" }, "controllerName": "c", "conditions": [] },
        ]});
        let desired = json!({ "parents": [
            { "parentRef": { "name": "g" }, "controllerName": "c", "conditions": [] },
        ]});
        let status = merged(
            &target("HTTPRoute", "ns", "r"),
            &desired,
            &current,
            "c",
            "now",
        );
        let names: Vec<&str> = status["parents"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p["parentRef"]["name"].as_str())
            .collect();
        assert_eq!(names, ["theirs", "g"]);
    }
}
