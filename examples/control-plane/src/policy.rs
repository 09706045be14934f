//! Istio's security policies, as node proxies enforce them: `security.istio.io/v1` (and
//! `v1beta1`) AuthorizationPolicy and PeerAuthentication, read from manifests and translated
//! to the L4 form (`istio.security.Authorization`, [`Policy`]) that ztunnel and meshkit's
//! node proxy evaluate.
//!
//! AuthorizationPolicy:
//!
//! - Scope: with a `selector`, WORKLOAD_SELECTOR (the workloads it selects name it in their
//!   `authorization_policies`; a policy in the root namespace selects in every namespace);
//!   without one, NAMESPACE, or GLOBAL in the root namespace. Policies with `targetRef(s)`
//!   are for waypoints and are skipped.
//! - Each rule becomes one [`Rule`]: all its `to` entries one clause (a match per entry:
//!   `ports`, `notPorts`), all its `from` entries one clause (a match per entry: principals,
//!   namespaces, service accounts, IP blocks and their `not` forms), and each `when` its own
//!   clause (`source.ip`, `source.namespace`, `source.principal`, `destination.ip`,
//!   `destination.port`, with `values` or `notValues`).
//! - Strings: `*` is any non-empty value, `*x` a suffix, `x*` a prefix, anything else exact.
//! - HTTP-only attributes (hosts, methods, paths, request principals, remote IP blocks, other
//!   `when` keys) cannot be enforced at L4. In an ALLOW policy the rule holding one is dropped
//!   (fewer connections allowed); in a DENY policy it is enforced without them (more
//!   connections denied): an entry left with no L4 condition matches every connection, so the
//!   clause holding it is no condition. Both come with a warning naming the attributes.
//! - Actions CUSTOM and AUDIT are refused with an error: a node proxy cannot enforce them.
//!   From a folder the error changes nothing; from the API the policy is left out alone with
//!   an Event on it, as istiod leaves it out for ztunnel (a waypoint enforces it).
//! - `istio.io/dry-run: "true"` makes a dry-run policy: evaluated and logged, never enforced.
//! - Values that do not parse (a port that is not a number up to 65535, an IP block that is
//!   not an address or CIDR range) are errors with their field path, never skipped: skipping
//!   an entry of a `not` list would widen what the policy lets through. So are, as Istio's
//!   validation has it, an empty `source` or `operation`, a `when` without `values` or
//!   `notValues`, and a field these do not have (a misspelt `principal` would otherwise be
//!   dropped, and its entry match every connection).
//!
//! PeerAuthentication, by the workload's effective mode (the oldest mesh-wide policy in the
//! root namespace, then the oldest of its namespace, then the oldest selecting it; UNSET
//! inherits):
//!
//! - STRICT: the workload names the static policy `ROOT/istio_converted_static_strict`, a DENY
//!   whose one match is "no principal present". It is served whenever any PeerAuthentication
//!   exists, named or not, as istiod serves it.
//! - With `portLevelMtls`, the workload instead names one converted DENY policy of its
//!   PeerAuthentication, `NAMESPACE/converted_peer_authentication_NAME`, that denies
//!   connections without a principal on exactly the ports whose effective mode is STRICT, in
//!   istiod's shape: when STRICT is the rule, one rule of "no principal" and "not port P" for
//!   each exempt port (the first clause first when the policy itself says STRICT, last when
//!   its namespace or the mesh does); when STRICT is the exception, one rule per STRICT port.
//! - A workload names its AuthorizationPolicies (sorted), then its PeerAuthentication's
//!   policy, in istiod's order.

use std::collections::BTreeMap;

use meshkit_mesh::Cidr;
use meshkit_mesh::authz::{
    Action, Clause, Match, Policy, Rule, Scope, ServiceAccount, StringMatch,
};
use serde::Deserialize;
use serde_json::Value;

use crate::ambient::MeshWorkload;
use crate::manifests::{RawMeta, check_name, deserialize, namespace};

/// Name of the static DENY policy that STRICT mutual TLS becomes.
pub const STATIC_STRICT_POLICY: &str = "istio_converted_static_strict";

/// Prefix of the name of the DENY policy a PeerAuthentication with port-level modes becomes.
pub const CONVERTED_PEER_AUTHENTICATION_PREFIX: &str = "converted_peer_authentication_";

/// The annotation that makes an AuthorizationPolicy a dry run.
pub const DRY_RUN_ANNOTATION: &str = "istio.io/dry-run";

/// The `when` keys a node proxy can enforce.
const L4_WHEN_KEYS: [&str; 5] = [
    "source.ip",
    "source.namespace",
    "source.principal",
    "destination.ip",
    "destination.port",
];

/// An AuthorizationPolicy, its rules already in L4 form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthorizationPolicy {
    /// Namespace (`default` when absent).
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `selector.matchLabels`; `None` without a selector (an empty map selects every workload
    /// of the namespace).
    pub selector: Option<BTreeMap<String, String>>,
    /// ALLOW or DENY.
    pub action: Action,
    /// The rules, translated.
    pub rules: Vec<Rule>,
    /// From the `istio.io/dry-run` annotation.
    pub dry_run: bool,
}

/// A PeerAuthentication's mutual TLS mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MtlsMode {
    /// Inherits the parent's mode.
    Unset,
    /// Plaintext only.
    Disable,
    /// Mutual TLS or plaintext.
    Permissive,
    /// Mutual TLS only.
    Strict,
}

/// A PeerAuthentication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerAuthentication {
    /// Namespace (`default` when absent).
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `selector.matchLabels`; `None` (or empty) for a namespace- or mesh-wide policy.
    pub selector: Option<BTreeMap<String, String>>,
    /// `mtls.mode`.
    pub mode: MtlsMode,
    /// `portLevelMtls`: the mode of each workload port.
    pub port_modes: BTreeMap<u16, MtlsMode>,
    /// `metadata.creationTimestamp`, which decides between conflicting policies (the oldest
    /// wins; policies without one count as newest, then by name).
    pub created: Option<String>,
}

/// One problem: the field path and what is wrong.
pub(crate) type Problem = (String, String);

// Raw serde forms, with Kubernetes field names.

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawAuthorizationPolicy {
    metadata: RawMeta,
    spec: RawAuthorizationSpec,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawAuthorizationSpec {
    selector: Option<RawLabelSelector>,
    target_ref: Option<Value>,
    target_refs: Vec<Value>,
    action: Option<String>,
    rules: Vec<RawRule>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawLabelSelector {
    match_labels: BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
struct RawRule {
    from: Vec<RawFrom>,
    to: Vec<RawTo>,
    when: Vec<RawCondition>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
struct RawFrom {
    source: RawSource,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
struct RawSource {
    principals: Vec<String>,
    not_principals: Vec<String>,
    request_principals: Vec<String>,
    not_request_principals: Vec<String>,
    namespaces: Vec<String>,
    not_namespaces: Vec<String>,
    service_accounts: Vec<String>,
    not_service_accounts: Vec<String>,
    ip_blocks: Vec<String>,
    not_ip_blocks: Vec<String>,
    remote_ip_blocks: Vec<String>,
    not_remote_ip_blocks: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
struct RawTo {
    operation: RawOperation,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
struct RawOperation {
    hosts: Vec<String>,
    not_hosts: Vec<String>,
    ports: Vec<String>,
    not_ports: Vec<String>,
    methods: Vec<String>,
    not_methods: Vec<String>,
    paths: Vec<String>,
    not_paths: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default, deny_unknown_fields)]
struct RawCondition {
    key: String,
    values: Vec<String>,
    not_values: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawPeerAuthentication {
    metadata: RawMeta,
    spec: RawPeerAuthenticationSpec,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawPeerAuthenticationSpec {
    selector: Option<RawLabelSelector>,
    mtls: Option<RawMtls>,
    port_level_mtls: BTreeMap<String, RawMtls>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct RawMtls {
    mode: Option<String>,
}

/// The outcome of parsing an AuthorizationPolicy.
pub(crate) enum Parsed<T> {
    /// Parsed, with warnings (field path, message).
    Policy(T, Vec<Problem>),
    /// Not for node proxies (a waypoint's policy), with the reason.
    Skipped(String),
}

/// Parses an AuthorizationPolicy manifest.
pub(crate) fn parse_authorization_policy(
    value: Value,
) -> Result<Parsed<AuthorizationPolicy>, Vec<Problem>> {
    let raw: RawAuthorizationPolicy = deserialize(value)?;
    check_name(&raw.metadata)?;
    let ns = namespace(&raw.metadata);
    let spec = raw.spec;
    if spec.target_ref.is_some() || !spec.target_refs.is_empty() {
        return Ok(Parsed::Skipped(format!(
            "AuthorizationPolicy {ns}/{} has targetRefs: it is for waypoints",
            raw.metadata.name
        )));
    }
    let action = match spec.action.as_deref().unwrap_or("ALLOW") {
        "ALLOW" => Action::Allow,
        "DENY" => Action::Deny,
        other @ ("CUSTOM" | "AUDIT") => {
            return Err(vec![(
                "spec.action".to_owned(),
                format!(
                    "action {other} cannot be enforced by a node proxy (only ALLOW and DENY); \
                     skipping it would let through what it was written to stop"
                ),
            )]);
        }
        other => {
            return Err(vec![(
                "spec.action".to_owned(),
                format!("{other:?} is not ALLOW, DENY, AUDIT or CUSTOM"),
            )]);
        }
    };
    let mut problems = Vec::new();
    let mut warnings = Vec::new();
    let mut rules = Vec::new();
    for (i, rule) in spec.rules.iter().enumerate() {
        let at = format!("spec.rules[{i}]");
        let (translated, http) = translate_rule(&at, rule, &ns, action, &mut problems);
        if !http.is_empty() {
            let consequence = match action {
                Action::Allow => "the rule is dropped, so fewer connections are allowed",
                Action::Deny => "the rule is enforced without them, so more connections are denied",
            };
            warnings.push((
                at,
                format!(
                    "HTTP attributes cannot be enforced by a node proxy (found: {}): {consequence}; \
                     a waypoint enforces HTTP rules",
                    http.join(", ")
                ),
            ));
        }
        rules.extend(translated);
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let dry_run = match raw
        .metadata
        .annotations
        .get(DRY_RUN_ANNOTATION)
        .map(String::as_str)
    {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(vec![(
                format!("metadata.annotations.{DRY_RUN_ANNOTATION}"),
                format!("{other:?} is not \"true\" or \"false\""),
            )]);
        }
    };
    Ok(Parsed::Policy(
        AuthorizationPolicy {
            namespace: ns,
            name: raw.metadata.name,
            selector: spec.selector.map(|s| s.match_labels),
            action,
            rules,
            dry_run,
        },
        warnings,
    ))
}

/// One rule in L4 form, and the HTTP-only attributes it named. `None` when an ALLOW rule is
/// dropped for them.
fn translate_rule(
    at: &str,
    rule: &RawRule,
    policy_namespace: &str,
    action: Action,
    problems: &mut Vec<Problem>,
) -> (Option<Rule>, Vec<&'static str>) {
    let mut http = Vec::new();
    let mut clauses = Vec::new();

    // All `to` entries: one clause.
    let mut to = Clause::default();
    let mut to_unconditional = false;
    for (j, entry) in rule.to.iter().enumerate() {
        let op = &entry.operation;
        let field = |name: &str| format!("{at}.to[{j}].operation.{name}");
        if op.is_empty() {
            problems.push((
                format!("{at}.to[{j}].operation"),
                "an operation needs at least one field".to_owned(),
            ));
        }
        for (name, list) in [
            ("hosts", &op.hosts),
            ("notHosts", &op.not_hosts),
            ("methods", &op.methods),
            ("notMethods", &op.not_methods),
            ("paths", &op.paths),
            ("notPaths", &op.not_paths),
        ] {
            if !list.is_empty() {
                http.push(name);
            }
        }
        let m = Match {
            destination_ports: ports(&field("ports"), &op.ports, problems),
            not_destination_ports: ports(&field("notPorts"), &op.not_ports, problems),
            ..Match::default()
        };
        if m.is_empty() {
            to_unconditional = true;
        } else {
            to.matches.push(m);
        }
    }
    if !rule.to.is_empty() && !to_unconditional {
        clauses.push(to);
    }

    // All `from` entries: one clause.
    let mut from = Clause::default();
    let mut from_unconditional = false;
    for (j, entry) in rule.from.iter().enumerate() {
        let s = &entry.source;
        let field = |name: &str| format!("{at}.from[{j}].source.{name}");
        if s.is_empty() {
            problems.push((
                format!("{at}.from[{j}].source"),
                "a source needs at least one field".to_owned(),
            ));
        }
        for (name, list) in [
            ("requestPrincipals", &s.request_principals),
            ("notRequestPrincipals", &s.not_request_principals),
            ("remoteIpBlocks", &s.remote_ip_blocks),
            ("notRemoteIpBlocks", &s.not_remote_ip_blocks),
        ] {
            if !list.is_empty() {
                http.push(name);
            }
        }
        let m = Match {
            principals: patterns(&s.principals),
            not_principals: patterns(&s.not_principals),
            namespaces: patterns(&s.namespaces),
            not_namespaces: patterns(&s.not_namespaces),
            service_accounts: accounts(&s.service_accounts, policy_namespace),
            not_service_accounts: accounts(&s.not_service_accounts, policy_namespace),
            source_ips: blocks(&field("ipBlocks"), &s.ip_blocks, problems),
            not_source_ips: blocks(&field("notIpBlocks"), &s.not_ip_blocks, problems),
            ..Match::default()
        };
        if m.is_empty() {
            from_unconditional = true;
        } else {
            from.matches.push(m);
        }
    }
    if !rule.from.is_empty() && !from_unconditional {
        clauses.push(from);
    }

    // Each `when`: its own clause.
    for (j, when) in rule.when.iter().enumerate() {
        let field = |name: &str| format!("{at}.when[{j}].{name}");
        if when.values.is_empty() && when.not_values.is_empty() {
            problems.push((
                format!("{at}.when[{j}]"),
                "a condition needs values or notValues".to_owned(),
            ));
        }
        if !L4_WHEN_KEYS.contains(&when.key.as_str()) {
            http.push("when");
            continue;
        }
        let mut m = Match::default();
        let (values, not_values) = (&when.values, &when.not_values);
        match when.key.as_str() {
            "source.ip" => {
                m.source_ips = blocks(&field("values"), values, problems);
                m.not_source_ips = blocks(&field("notValues"), not_values, problems);
            }
            "source.namespace" => {
                m.namespaces = patterns(values);
                m.not_namespaces = patterns(not_values);
            }
            "source.principal" => {
                m.principals = patterns(values);
                m.not_principals = patterns(not_values);
            }
            "destination.ip" => {
                m.destination_ips = blocks(&field("values"), values, problems);
                m.not_destination_ips = blocks(&field("notValues"), not_values, problems);
            }
            _ => {
                m.destination_ports = ports(&field("values"), values, problems);
                m.not_destination_ports = ports(&field("notValues"), not_values, problems);
            }
        }
        if !m.is_empty() {
            clauses.push(Clause { matches: vec![m] });
        }
    }

    http.sort_unstable();
    http.dedup();
    if action == Action::Allow && !http.is_empty() {
        return (None, http);
    }
    (Some(Rule { clauses }), http)
}

fn patterns(values: &[String]) -> Vec<StringMatch> {
    values
        .iter()
        .map(|v| StringMatch::from_pattern(v))
        .collect()
}

/// `NAMESPACE/NAME`, or `NAME` in the policy's namespace.
fn accounts(values: &[String], policy_namespace: &str) -> Vec<ServiceAccount> {
    values
        .iter()
        .map(|v| match v.split_once('/') {
            Some((ns, name)) => ServiceAccount {
                namespace: ns.to_owned(),
                name: name.to_owned(),
            },
            None => ServiceAccount {
                namespace: policy_namespace.to_owned(),
                name: v.clone(),
            },
        })
        .collect()
}

fn ports(field: &str, values: &[String], problems: &mut Vec<Problem>) -> Vec<u16> {
    values
        .iter()
        .enumerate()
        .filter_map(|(i, v)| match v.parse::<u16>() {
            Ok(port) => Some(port),
            Err(_) => {
                problems.push((
                    format!("{field}[{i}]"),
                    format!("{v:?} is not a port number (0-65535)"),
                ));
                None
            }
        })
        .collect()
}

fn blocks(field: &str, values: &[String], problems: &mut Vec<Problem>) -> Vec<Cidr> {
    values
        .iter()
        .enumerate()
        .filter_map(|(i, v)| match v.parse::<Cidr>() {
            Ok(cidr) => Some(cidr),
            Err(e) => {
                problems.push((format!("{field}[{i}]"), format!("{v:?}: {e}")));
                None
            }
        })
        .collect()
}

impl RawSource {
    fn is_empty(&self) -> bool {
        [
            &self.principals,
            &self.not_principals,
            &self.request_principals,
            &self.not_request_principals,
            &self.namespaces,
            &self.not_namespaces,
            &self.service_accounts,
            &self.not_service_accounts,
            &self.ip_blocks,
            &self.not_ip_blocks,
            &self.remote_ip_blocks,
            &self.not_remote_ip_blocks,
        ]
        .iter()
        .all(|list| list.is_empty())
    }
}

impl RawOperation {
    fn is_empty(&self) -> bool {
        [
            &self.hosts,
            &self.not_hosts,
            &self.ports,
            &self.not_ports,
            &self.methods,
            &self.not_methods,
            &self.paths,
            &self.not_paths,
        ]
        .iter()
        .all(|list| list.is_empty())
    }
}

/// Parses a PeerAuthentication manifest.
pub(crate) fn parse_peer_authentication(value: Value) -> Result<PeerAuthentication, Vec<Problem>> {
    let raw: RawPeerAuthentication = deserialize(value)?;
    check_name(&raw.metadata)?;
    let mut problems = Vec::new();
    let mode = mtls_mode(
        "spec.mtls.mode",
        raw.spec.mtls.as_ref().and_then(|m| m.mode.as_deref()),
        &mut problems,
    );
    let mut port_modes = BTreeMap::new();
    for (port, mtls) in &raw.spec.port_level_mtls {
        let field = format!("spec.portLevelMtls.{port}");
        let mode = mtls_mode(
            &format!("{field}.mode"),
            mtls.mode.as_deref(),
            &mut problems,
        );
        match port.parse::<u16>() {
            Ok(p) if p > 0 => {
                port_modes.insert(p, mode);
            }
            _ => problems.push((field, format!("{port:?} is not a port number (1-65535)"))),
        }
    }
    let selector = raw
        .spec
        .selector
        .map(|s| s.match_labels)
        .filter(|labels| !labels.is_empty());
    if !port_modes.is_empty() && selector.is_none() {
        problems.push((
            "spec.portLevelMtls".to_owned(),
            "port-level modes need a workload selector".to_owned(),
        ));
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(PeerAuthentication {
        namespace: namespace(&raw.metadata),
        name: raw.metadata.name,
        selector,
        mode,
        port_modes,
        created: raw.metadata.creation_timestamp,
    })
}

fn mtls_mode(field: &str, mode: Option<&str>, problems: &mut Vec<Problem>) -> MtlsMode {
    match mode.unwrap_or("UNSET") {
        "UNSET" => MtlsMode::Unset,
        "DISABLE" => MtlsMode::Disable,
        "PERMISSIVE" => MtlsMode::Permissive,
        "STRICT" => MtlsMode::Strict,
        other => {
            problems.push((
                field.to_owned(),
                format!("{other:?} is not UNSET, DISABLE, PERMISSIVE or STRICT"),
            ));
            MtlsMode::Unset
        }
    }
}

// === translation ===

/// The L4 policies of a manifest set, and the policy keys each workload names.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Translated {
    /// Every policy to serve.
    pub policies: Vec<Policy>,
    /// The keys (`namespace/name`) each workload names, by the workload's uid, sorted.
    pub workload_policies: BTreeMap<String, Vec<String>>,
}

/// Translates the policies for `workloads`, with `root` as the root namespace.
pub fn translate(
    authorization: &[AuthorizationPolicy],
    peer: &[PeerAuthentication],
    workloads: &[MeshWorkload],
    root: &str,
) -> Translated {
    let mut out = Translated::default();
    for p in authorization {
        let scope = match (&p.selector, p.namespace == root) {
            (Some(_), _) => Scope::WorkloadSelector,
            (None, true) => Scope::Global,
            (None, false) => Scope::Namespace,
        };
        out.policies.push(Policy {
            name: p.name.clone(),
            namespace: p.namespace.clone(),
            scope,
            action: p.action,
            rules: p.rules.clone(),
            dry_run: p.dry_run,
        });
    }

    let mut converted = BTreeMap::new();
    for w in workloads.iter().filter(|w| w.selectable) {
        let mut keys: Vec<String> = authorization
            .iter()
            .filter(|p| p.namespace == w.workload.namespace || p.namespace == root)
            .filter(|p| p.selector.as_ref().is_some_and(|s| w.has_labels(s)))
            .map(|p| format!("{}/{}", p.namespace, p.name))
            .collect();
        keys.sort();
        keys.dedup();
        match peer_policy_for(peer, w, root) {
            PeerPolicy::None => {}
            PeerPolicy::StaticStrict => {
                keys.push(format!("{root}/{STATIC_STRICT_POLICY}"));
            }
            PeerPolicy::Ports(pa, strict_ports, all_but) => {
                let policy = converted_peer_policy(pa, &strict_ports, all_but);
                keys.push(policy.key());
                converted.insert(policy.key(), policy);
            }
        }
        if !keys.is_empty() {
            out.workload_policies.insert(w.workload.uid.clone(), keys);
        }
    }
    if !peer.is_empty() {
        out.policies.push(static_strict(root));
    }
    out.policies.extend(converted.into_values());
    out
}

/// The static DENY policy of STRICT mutual TLS: denies every connection without a principal.
pub fn static_strict(root: &str) -> Policy {
    Policy {
        name: STATIC_STRICT_POLICY.to_owned(),
        namespace: root.to_owned(),
        scope: Scope::WorkloadSelector,
        action: Action::Deny,
        rules: vec![Rule::of([no_principal()])],
        dry_run: false,
    }
}

fn no_principal() -> Match {
    Match {
        not_principals: vec![StringMatch::Presence],
        ..Match::default()
    }
}

/// What PeerAuthentication makes a workload name.
enum PeerPolicy<'a> {
    /// Nothing: its effective mode is not STRICT on any port.
    None,
    /// The static STRICT policy.
    StaticStrict,
    /// Its PeerAuthentication's converted policy: STRICT on these ports, or (`true`) on
    /// every port but these.
    Ports(&'a PeerAuthentication, Vec<u16>, bool),
}

fn peer_policy_for<'a>(
    peer: &'a [PeerAuthentication],
    w: &MeshWorkload,
    root: &str,
) -> PeerPolicy<'a> {
    let oldest = |candidates: Vec<&'a PeerAuthentication>| {
        candidates
            .into_iter()
            .min_by(|a, b| match (&a.created, &b.created) {
                (Some(x), Some(y)) => x.cmp(y).then_with(|| a.name.cmp(&b.name)),
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (None, None) => a.name.cmp(&b.name),
            })
    };
    let mesh = oldest(
        peer.iter()
            .filter(|p| p.namespace == root && p.selector.is_none())
            .collect(),
    );
    let namespace = oldest(
        peer.iter()
            .filter(|p| {
                p.namespace == w.workload.namespace && p.namespace != root && p.selector.is_none()
            })
            .collect(),
    );
    let workload = oldest(
        peer.iter()
            .filter(|p| p.namespace == w.workload.namespace && p.namespace != root)
            .filter(|p| p.selector.as_ref().is_some_and(|s| w.has_labels(s)))
            .collect(),
    );
    let mut strict = false;
    for level in [mesh, namespace, workload].into_iter().flatten() {
        match level.mode {
            MtlsMode::Unset => {}
            mode => strict = mode == MtlsMode::Strict,
        }
    }
    let Some(w_policy) = workload.filter(|p| !p.port_modes.is_empty()) else {
        return if strict {
            PeerPolicy::StaticStrict
        } else {
            PeerPolicy::None
        };
    };
    if strict {
        let open: Vec<u16> = w_policy
            .port_modes
            .iter()
            .filter(|(_, m)| matches!(m, MtlsMode::Permissive | MtlsMode::Disable))
            .map(|(p, _)| *p)
            .collect();
        if open.is_empty() {
            PeerPolicy::StaticStrict
        } else {
            PeerPolicy::Ports(w_policy, open, true)
        }
    } else {
        let closed: Vec<u16> = w_policy
            .port_modes
            .iter()
            .filter(|(_, m)| **m == MtlsMode::Strict)
            .map(|(p, _)| *p)
            .collect();
        if closed.is_empty() {
            PeerPolicy::None
        } else {
            PeerPolicy::Ports(w_policy, closed, false)
        }
    }
}

fn converted_peer_policy(pa: &PeerAuthentication, ports: &[u16], all_but: bool) -> Policy {
    let rules = if all_but {
        let mut clauses: Vec<Clause> = ports
            .iter()
            .map(|port| Clause {
                matches: vec![Match {
                    not_destination_ports: vec![*port],
                    ..Match::default()
                }],
            })
            .collect();
        let strict = Clause {
            matches: vec![no_principal()],
        };
        if pa.mode == MtlsMode::Strict {
            clauses.insert(0, strict);
        } else {
            clauses.push(strict);
        }
        vec![Rule { clauses }]
    } else {
        ports
            .iter()
            .map(|port| {
                Rule::of([Match {
                    destination_ports: vec![*port],
                    ..no_principal()
                }])
            })
            .collect()
    };
    Policy {
        name: format!("{CONVERTED_PEER_AUTHENTICATION_PREFIX}{}", pa.name),
        namespace: pa.namespace.clone(),
        scope: Scope::WorkloadSelector,
        action: Action::Deny,
        rules,
        dry_run: false,
    }
}
