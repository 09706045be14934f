//! L4 authorization with ztunnel's semantics, as a pure evaluator.
//!
//! A [`PolicySet`] holds the [`Policy`]s a control plane served (`istio.security.Authorization`,
//! converted with [`Policy::try_from`]). [`PolicySet::evaluate`] takes the destination workload
//! ([`Target`]) and the facts of one connection ([`Connection`]) and returns a [`Decision`]
//! with the policy that made it. Nothing is logged or counted here: the caller does that with
//! what it gets back, so any embedding service can call it.
//!
//! The rules, which are ztunnel's:
//!
//! - The policies that apply are the destination namespace's (scope NAMESPACE), the GLOBAL
//!   ones, and those the workload names in its `authorization_policies` (WORKLOAD_SELECTOR).
//!   Keys the set does not hold are skipped.
//! - A matching DENY policy denies. Otherwise, when no ALLOW policy applies, the connection is
//!   allowed; when one matches, allowed; otherwise denied. Dry-run policies take no part in
//!   the decision: [`Evaluation::dry_run`] is what the decision would be if they were
//!   enforced, for the caller to log.
//! - A policy matches when any of its rules does, and a policy without rules never matches. A
//!   rule matches when all its clauses do (a rule without clauses matches every connection); a
//!   clause when any of its matches does (a clause without matches is no condition). A match
//!   with no condition set never matches. Inside a match, each kind of condition that is set
//!   must hold: a positive list holds when any entry matches, a negative list when none does.
//! - Principals are compared without `spiffe://`. A connection without an identity has the
//!   namespace `""` and matches no principal and no service account.
//!
//! Evaluation allocates nothing, and its cost grows with the policies that apply, never with
//! those that do not: the set is indexed by namespace. Within a namespace, each policy is
//! indexed by what its rules require of the source (the principals, service accounts,
//! namespaces or ports one of which it names), so a decision reads only the policies its
//! connection could match, and those that name nothing an index can stand for (IP blocks,
//! negative conditions only).
//!
//! ```
//! use meshkit_identity::SpiffeId;
//! use meshkit_mesh::authz::{Action, Connection, Decision, Match, Policy, PolicySet, Rule,
//!                           Scope, StringMatch, Target};
//!
//! // In namespace "shop", only the gateway may connect.
//! let mut policies = PolicySet::new();
//! policies.insert(Policy {
//!     name: "gateway-only".into(),
//!     namespace: "shop".into(),
//!     scope: Scope::Namespace,
//!     action: Action::Allow,
//!     rules: vec![Rule::of([Match {
//!         principals: vec![StringMatch::Exact("cluster.local/ns/edge/sa/gateway".into())],
//!         ..Match::default()
//!     }])],
//!     dry_run: false,
//! });
//!
//! let target = Target { namespace: "shop", policies: &[] };
//! let gateway = SpiffeId::new("spiffe://cluster.local/ns/edge/sa/gateway")?;
//! let other = SpiffeId::new("spiffe://cluster.local/ns/shop/sa/cart")?;
//! let conn = |id| Connection {
//!     source: "10.0.0.1:40000".parse().unwrap(),
//!     destination: "10.0.0.2:8080".parse().unwrap(),
//!     identity: Some(id),
//! };
//! assert!(policies.evaluate(target, &conn(&gateway)).decision.is_allowed());
//! assert!(matches!(policies.evaluate(target, &conn(&other)).decision, Decision::NotAllowed));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use meshkit_identity::SpiffeId;
use serde::{Deserialize, Serialize};

use crate::Cidr;
use crate::proto::security as pb;

mod compiled;
mod index;
pub mod reference;

use compiled::Compiled;
use index::Index;

/// One authorization policy: `istio.security.Authorization` in checked form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// Name of the policy.
    pub name: String,
    /// Namespace of the policy.
    pub namespace: String,
    /// Which workloads it applies to.
    pub scope: Scope,
    /// What a match does.
    pub action: Action,
    /// The rules; the policy matches when any does, and never without rules.
    #[serde(default)]
    pub rules: Vec<Rule>,
    /// Evaluated and reported, never enforced.
    #[serde(default)]
    pub dry_run: bool,
}

/// Which workloads a policy applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Scope {
    /// Every workload in the mesh.
    Global,
    /// Every workload in the policy's namespace.
    Namespace,
    /// The workloads that name the policy in their `authorization_policies`.
    WorkloadSelector,
}

/// What a matching policy does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Action {
    /// Allows the connection.
    Allow,
    /// Denies the connection.
    Deny,
}

/// A rule: matches when all its clauses do.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Rule {
    /// The clauses; a rule without clauses matches every connection.
    pub clauses: Vec<Clause>,
}

/// A clause: matches when any of its matches does.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Clause {
    /// The matches; a clause without matches is no condition.
    pub matches: Vec<Match>,
}

/// Conditions on one connection. Each kind that is set must hold: a positive list when any
/// entry matches, a negative list when none does. A match with nothing set never matches.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Match {
    /// Source namespace (`""` without an identity).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<StringMatch>,
    /// Source namespace, negated.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_namespaces: Vec<StringMatch>,
    /// Source service account.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub service_accounts: Vec<ServiceAccount>,
    /// Source service account, negated.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_service_accounts: Vec<ServiceAccount>,
    /// Source principal, the SPIFFE ID without `spiffe://`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub principals: Vec<StringMatch>,
    /// Source principal, negated.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_principals: Vec<StringMatch>,
    /// Source address ranges.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub source_ips: Vec<Cidr>,
    /// Source address ranges, negated.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_source_ips: Vec<Cidr>,
    /// Destination address ranges.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub destination_ips: Vec<Cidr>,
    /// Destination address ranges, negated.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_destination_ips: Vec<Cidr>,
    /// Destination ports.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub destination_ports: Vec<u16>,
    /// Destination ports, negated.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_destination_ports: Vec<u16>,
}

/// A pattern for a string (in JSON: `{"exact": "x"}`, `{"prefix": "x"}`, `{"suffix": "x"}`
/// or `"presence"`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StringMatch {
    /// Equal to this.
    Exact(String),
    /// Starts with this.
    Prefix(String),
    /// Ends with this.
    Suffix(String),
    /// Any non-empty value.
    Presence,
}

/// A service account in a namespace.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ServiceAccount {
    /// Namespace of the service account.
    pub namespace: String,
    /// Name of the service account.
    pub name: String,
}

/// The destination workload a connection is decided for.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// The workload's namespace: its NAMESPACE-scoped policies apply.
    pub namespace: &'a str,
    /// The keys (`namespace/name`) of the WORKLOAD_SELECTOR policies that select it (the
    /// workload's `authorization_policies`).
    pub policies: &'a [String],
}

/// The facts of one connection that policies match on.
#[derive(Debug, Clone, Copy)]
pub struct Connection<'a> {
    /// Source address.
    pub source: SocketAddr,
    /// Destination address: the workload's address and port.
    pub destination: SocketAddr,
    /// The source's verified identity; `None` for a connection without one.
    pub identity: Option<&'a SpiffeId>,
}

/// What [`PolicySet::evaluate`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision<'p> {
    /// No ALLOW policy applies, and no DENY policy matched.
    AllowedByDefault,
    /// This ALLOW policy matched.
    Allowed(&'p Policy),
    /// This DENY policy matched.
    Denied(&'p Policy),
    /// ALLOW policies apply, and none matched.
    NotAllowed,
}

/// A decision, and what it would be with the dry-run policies enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Evaluation<'p> {
    /// The decision, by the enforced policies.
    pub decision: Decision<'p>,
    /// The decision had the dry-run policies been enforced too; `None` when no dry-run
    /// policy applies.
    pub dry_run: Option<Decision<'p>>,
}

/// Why an `istio.security.Authorization` is not a [`Policy`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidPolicy {
    /// The scope is not one of the enum's values.
    #[error("scope {0} is not GLOBAL, NAMESPACE or WORKLOAD_SELECTOR")]
    Scope(i32),
    /// The action is not one of the enum's values.
    #[error("action {0} is not ALLOW or DENY")]
    Action(i32),
    /// An address is neither 4 nor 16 bytes, or its prefix is longer than the address.
    #[error("rule {rule}: address of {bytes} bytes with prefix length {length} is not a range")]
    Address {
        /// Index of the rule.
        rule: usize,
        /// Length of the address in bytes.
        bytes: usize,
        /// The prefix length.
        length: u32,
    },
    /// A port is above 65535.
    #[error("rule {rule}: port {port} is above 65535")]
    Port {
        /// Index of the rule.
        rule: usize,
        /// The port.
        port: u32,
    },
    /// A string match has no pattern.
    #[error("rule {rule}: a string match has no pattern")]
    EmptyStringMatch {
        /// Index of the rule.
        rule: usize,
    },
}

/// The policies a node knows, indexed for [`evaluate`](Self::evaluate).
#[derive(Debug, Clone, Default)]
pub struct PolicySet {
    by_key: HashMap<String, Arc<Compiled>>,
    by_namespace: HashMap<String, Bucket>,
    global: Bucket,
}

/// The policies of one scope (a namespace's, or the global ones), split by action, so that a
/// decision reads each index once and never looks at an action or a scope again.
#[derive(Debug, Clone, Default)]
struct Bucket {
    deny: Index,
    allow: Index,
}

// === impl Policy ===

impl Policy {
    /// The policy's key, `namespace/name`: its xDS name, and how workloads name it.
    pub fn key(&self) -> String {
        self.to_string()
    }

    /// Whether the policy matches `conn`.
    pub fn matches(&self, conn: &Connection<'_>) -> bool {
        compiled::policy_matches(self, &Facts::of(conn))
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl TryFrom<&pb::Authorization> for Policy {
    type Error = InvalidPolicy;

    fn try_from(p: &pb::Authorization) -> Result<Self, InvalidPolicy> {
        let scope = match pb::Scope::try_from(p.scope) {
            Ok(pb::Scope::Global) => Scope::Global,
            Ok(pb::Scope::Namespace) => Scope::Namespace,
            Ok(pb::Scope::WorkloadSelector) => Scope::WorkloadSelector,
            Err(_) => return Err(InvalidPolicy::Scope(p.scope)),
        };
        let action = match pb::Action::try_from(p.action) {
            Ok(pb::Action::Allow) => Action::Allow,
            Ok(pb::Action::Deny) => Action::Deny,
            Err(_) => return Err(InvalidPolicy::Action(p.action)),
        };
        let rules = p
            .rules
            .iter()
            .enumerate()
            .map(|(i, rule)| {
                let clauses = rule
                    .clauses
                    .iter()
                    .map(|clause| {
                        let matches = clause
                            .matches
                            .iter()
                            .map(|m| Match::from_proto(i, m))
                            .collect::<Result<_, _>>()?;
                        Ok(Clause { matches })
                    })
                    .collect::<Result<_, _>>()?;
                Ok(Rule { clauses })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            name: p.name.clone(),
            namespace: p.namespace.clone(),
            scope,
            action,
            rules,
            dry_run: p.dry_run,
        })
    }
}

impl From<&Policy> for pb::Authorization {
    fn from(p: &Policy) -> Self {
        Self {
            name: p.name.clone(),
            namespace: p.namespace.clone(),
            scope: match p.scope {
                Scope::Global => pb::Scope::Global,
                Scope::Namespace => pb::Scope::Namespace,
                Scope::WorkloadSelector => pb::Scope::WorkloadSelector,
            } as i32,
            action: match p.action {
                Action::Allow => pb::Action::Allow,
                Action::Deny => pb::Action::Deny,
            } as i32,
            rules: p
                .rules
                .iter()
                .map(|r| pb::Rule {
                    clauses: r
                        .clauses
                        .iter()
                        .map(|c| pb::Clause {
                            matches: c.matches.iter().map(Match::to_proto).collect(),
                        })
                        .collect(),
                })
                .collect(),
            dry_run: p.dry_run,
            extensions: Vec::new(),
        }
    }
}

// === impl Rule ===

impl Rule {
    /// A rule of one clause holding `matches`.
    pub fn of(matches: impl IntoIterator<Item = Match>) -> Self {
        Self {
            clauses: vec![Clause {
                matches: matches.into_iter().collect(),
            }],
        }
    }
}

// === impl Match ===

impl Match {
    /// Whether no condition is set (such a match never matches).
    pub fn is_empty(&self) -> bool {
        self.namespaces.is_empty()
            && self.not_namespaces.is_empty()
            && self.service_accounts.is_empty()
            && self.not_service_accounts.is_empty()
            && self.principals.is_empty()
            && self.not_principals.is_empty()
            && self.source_ips.is_empty()
            && self.not_source_ips.is_empty()
            && self.destination_ips.is_empty()
            && self.not_destination_ips.is_empty()
            && self.destination_ports.is_empty()
            && self.not_destination_ports.is_empty()
    }

    fn from_proto(rule: usize, m: &pb::Match) -> Result<Self, InvalidPolicy> {
        let strings = |list: &[pb::StringMatch]| {
            list.iter()
                .map(|s| StringMatch::from_proto(s).ok_or(InvalidPolicy::EmptyStringMatch { rule }))
                .collect::<Result<Vec<_>, _>>()
        };
        let ranges = |list: &[pb::Address]| {
            list.iter()
                .map(|a| cidr_of(a).ok_or(address_error(rule, a)))
                .collect::<Result<Vec<_>, _>>()
        };
        let ports = |list: &[u32]| {
            list.iter()
                .map(|&port| u16::try_from(port).map_err(|_| InvalidPolicy::Port { rule, port }))
                .collect::<Result<Vec<_>, _>>()
        };
        let accounts = |list: &[pb::ServiceAccountMatch]| {
            list.iter()
                .map(|sa| ServiceAccount {
                    namespace: sa.namespace.clone(),
                    name: sa.service_account.clone(),
                })
                .collect()
        };
        Ok(Self {
            namespaces: strings(&m.namespaces)?,
            not_namespaces: strings(&m.not_namespaces)?,
            service_accounts: accounts(&m.service_accounts),
            not_service_accounts: accounts(&m.not_service_accounts),
            principals: strings(&m.principals)?,
            not_principals: strings(&m.not_principals)?,
            source_ips: ranges(&m.source_ips)?,
            not_source_ips: ranges(&m.not_source_ips)?,
            destination_ips: ranges(&m.destination_ips)?,
            not_destination_ips: ranges(&m.not_destination_ips)?,
            destination_ports: ports(&m.destination_ports)?,
            not_destination_ports: ports(&m.not_destination_ports)?,
        })
    }

    fn to_proto(&self) -> pb::Match {
        let strings = |list: &[StringMatch]| list.iter().map(StringMatch::to_proto).collect();
        let ranges = |list: &[Cidr]| {
            list.iter()
                .map(|c| pb::Address {
                    address: match c.network() {
                        IpAddr::V4(a) => a.octets().to_vec(),
                        IpAddr::V6(a) => a.octets().to_vec(),
                    },
                    length: u32::from(c.prefix()),
                })
                .collect()
        };
        let ports = |list: &[u16]| list.iter().map(|&p| u32::from(p)).collect();
        let accounts = |list: &[ServiceAccount]| {
            list.iter()
                .map(|sa| pb::ServiceAccountMatch {
                    namespace: sa.namespace.clone(),
                    service_account: sa.name.clone(),
                })
                .collect()
        };
        pb::Match {
            namespaces: strings(&self.namespaces),
            not_namespaces: strings(&self.not_namespaces),
            service_accounts: accounts(&self.service_accounts),
            not_service_accounts: accounts(&self.not_service_accounts),
            principals: strings(&self.principals),
            not_principals: strings(&self.not_principals),
            source_ips: ranges(&self.source_ips),
            not_source_ips: ranges(&self.not_source_ips),
            destination_ips: ranges(&self.destination_ips),
            not_destination_ips: ranges(&self.not_destination_ips),
            destination_ports: ports(&self.destination_ports),
            not_destination_ports: ports(&self.not_destination_ports),
            extensions: Vec::new(),
        }
    }
}

fn cidr_of(a: &pb::Address) -> Option<Cidr> {
    let addr = match a.address.len() {
        4 => IpAddr::from(<[u8; 4]>::try_from(a.address.as_slice()).ok()?),
        16 => IpAddr::from(<[u8; 16]>::try_from(a.address.as_slice()).ok()?),
        _ => return None,
    };
    Cidr::new(addr, u8::try_from(a.length).ok()?).ok()
}

fn address_error(rule: usize, a: &pb::Address) -> InvalidPolicy {
    InvalidPolicy::Address {
        rule,
        bytes: a.address.len(),
        length: a.length,
    }
}

// === impl StringMatch ===

impl StringMatch {
    /// Whether `value` matches the pattern.
    pub fn matches(&self, value: &str) -> bool {
        match self {
            Self::Exact(s) => value == s,
            Self::Prefix(s) => value.starts_with(s.as_str()),
            Self::Suffix(s) => value.ends_with(s.as_str()),
            Self::Presence => !value.is_empty(),
        }
    }

    /// The pattern of an AuthorizationPolicy value: `*` any non-empty value, `*x` ends with
    /// `x`, `x*` starts with `x`, anything else exactly that.
    pub fn from_pattern(pattern: &str) -> Self {
        if pattern == "*" {
            Self::Presence
        } else if let Some(suffix) = pattern.strip_prefix('*') {
            Self::Suffix(suffix.to_owned())
        } else if let Some(prefix) = pattern.strip_suffix('*') {
            Self::Prefix(prefix.to_owned())
        } else {
            Self::Exact(pattern.to_owned())
        }
    }

    fn from_proto(s: &pb::StringMatch) -> Option<Self> {
        use pb::string_match::MatchType;
        Some(match s.match_type.as_ref()? {
            MatchType::Exact(v) => Self::Exact(v.clone()),
            MatchType::Prefix(v) => Self::Prefix(v.clone()),
            MatchType::Suffix(v) => Self::Suffix(v.clone()),
            MatchType::Presence(()) => Self::Presence,
        })
    }

    fn to_proto(&self) -> pb::StringMatch {
        use pb::string_match::MatchType;
        pb::StringMatch {
            match_type: Some(match self {
                Self::Exact(v) => MatchType::Exact(v.clone()),
                Self::Prefix(v) => MatchType::Prefix(v.clone()),
                Self::Suffix(v) => MatchType::Suffix(v.clone()),
                Self::Presence => MatchType::Presence(()),
            }),
        }
    }
}

// === impl Decision ===

impl<'p> Decision<'p> {
    /// Whether the connection may proceed.
    pub fn is_allowed(&self) -> bool {
        matches!(self, Self::AllowedByDefault | Self::Allowed(_))
    }

    /// The policy that decided, when one did.
    pub fn policy(&self) -> Option<&'p Policy> {
        match self {
            Self::Allowed(p) | Self::Denied(p) => Some(p),
            Self::AllowedByDefault | Self::NotAllowed => None,
        }
    }
}

impl fmt::Display for Decision<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AllowedByDefault => f.write_str("allowed: no ALLOW policy applies"),
            Self::Allowed(p) => write!(f, "allowed by {p}"),
            Self::Denied(p) => write!(f, "denied by {p}"),
            Self::NotAllowed => f.write_str("denied: no ALLOW policy matched"),
        }
    }
}

// === impl PolicySet ===

impl PolicySet {
    /// An empty set: every connection is allowed by default.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `policy`, replacing the one with its key; returns the replaced one.
    pub fn insert(&mut self, policy: Policy) -> Option<Arc<Policy>> {
        let key = policy.key();
        let old = self.remove(&key);
        let policy = Arc::new(Compiled::new(Arc::new(policy)));
        let bucket = match policy.policy.scope {
            Scope::Global => Some(&mut self.global),
            Scope::Namespace => Some(
                self.by_namespace
                    .entry(policy.policy.namespace.clone())
                    .or_default(),
            ),
            Scope::WorkloadSelector => None,
        };
        if let Some(bucket) = bucket {
            bucket.insert(&policy);
        }
        self.by_key.insert(key, policy);
        old
    }

    /// Removes the policy with `key` (`namespace/name`); returns it.
    pub fn remove(&mut self, key: &str) -> Option<Arc<Policy>> {
        let old = self.by_key.remove(key)?;
        let namespace = &old.policy.namespace;
        match old.policy.scope {
            Scope::Global => self.global.remove(&old),
            Scope::Namespace => {
                if let Some(bucket) = self.by_namespace.get_mut(namespace) {
                    bucket.remove(&old);
                    if bucket.is_empty() {
                        self.by_namespace.remove(namespace);
                    }
                }
            }
            Scope::WorkloadSelector => {}
        }
        Some(old.policy.clone())
    }

    /// The policy with `key` (`namespace/name`).
    pub fn get(&self, key: &str) -> Option<&Arc<Policy>> {
        self.by_key.get(key).map(|c| &c.policy)
    }

    /// How many policies the set holds.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Whether the set holds no policy.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// Every policy, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Policy>> {
        self.by_key.values().map(|c| &c.policy)
    }

    /// Decides `conn` to `target` by the policies that apply to it.
    pub fn evaluate<'p>(&'p self, target: Target<'_>, conn: &Connection<'_>) -> Evaluation<'p> {
        let facts = Facts::of(conn);
        let namespaced = self.by_namespace.get(target.namespace);
        let named = || {
            target
                .policies
                .iter()
                .filter_map(|key| self.by_key.get(key))
        };
        let decision = self.decide(namespaced, named(), &facts, false);
        let any_dry_run = namespaced.is_some_and(|b| b.dry_runs() > 0)
            || self.global.dry_runs() > 0
            || named().any(|c| c.policy.dry_run);
        let dry_run = any_dry_run.then(|| self.decide(namespaced, named(), &facts, true));
        Evaluation { decision, dry_run }
    }

    /// The policies that apply to `target`: its namespace's, the global ones, and those it
    /// names (keys the set does not hold are skipped).
    pub fn applying<'p>(&'p self, target: Target<'_>) -> impl Iterator<Item = &'p Policy> {
        let namespaced = self.by_namespace.get(target.namespace);
        let buckets = namespaced.into_iter().chain([&self.global]);
        buckets
            .flat_map(|b| b.deny.iter().chain(b.allow.iter()))
            .chain(
                target
                    .policies
                    .iter()
                    .filter_map(|key| self.by_key.get(key)),
            )
            .map(|c| &*c.policy)
    }

    fn decide<'p>(
        &'p self,
        namespaced: Option<&'p Bucket>,
        named: impl Iterator<Item = &'p Arc<Compiled>> + Clone,
        facts: &Facts<'_>,
        with_dry_run: bool,
    ) -> Decision<'p> {
        let counted = |c: &Compiled| with_dry_run || !c.policy.dry_run;
        let hit = |c: &Compiled| counted(c) && c.matches(facts);
        let buckets = || namespaced.into_iter().chain([&self.global]);
        let indexed =
            |index: fn(&'p Bucket) -> &'p Index| buckets().find_map(|b| index(b).find(facts, hit));
        let named_with = |action| named.clone().filter(move |c| c.policy.action == action);
        if let Some(deny) =
            indexed(|b| &b.deny).or_else(|| named_with(Action::Deny).find(|c| hit(c)))
        {
            return Decision::Denied(&deny.policy);
        }
        if let Some(allow) =
            indexed(|b| &b.allow).or_else(|| named_with(Action::Allow).find(|c| hit(c)))
        {
            return Decision::Allowed(&allow.policy);
        }
        let enforced =
            |index: &Index| index.len() - if with_dry_run { 0 } else { index.dry_runs() };
        let any_allow = buckets().any(|b| enforced(&b.allow) > 0)
            || named_with(Action::Allow).any(|c| counted(c));
        if any_allow {
            Decision::NotAllowed
        } else {
            Decision::AllowedByDefault
        }
    }
}

// === impl Bucket ===

impl Bucket {
    fn index_mut(&mut self, action: Action) -> &mut Index {
        match action {
            Action::Deny => &mut self.deny,
            Action::Allow => &mut self.allow,
        }
    }

    fn insert(&mut self, compiled: &Arc<Compiled>) {
        self.index_mut(compiled.policy.action).insert(compiled);
    }

    fn remove(&mut self, compiled: &Arc<Compiled>) {
        self.index_mut(compiled.policy.action).remove(compiled);
    }

    /// How many of its policies are dry runs.
    fn dry_runs(&self) -> usize {
        self.deny.dry_runs() + self.allow.dry_runs()
    }

    fn is_empty(&self) -> bool {
        self.deny.len() == 0 && self.allow.len() == 0
    }
}

impl FromIterator<Policy> for PolicySet {
    fn from_iter<I: IntoIterator<Item = Policy>>(iter: I) -> Self {
        let mut set = Self::new();
        for p in iter {
            set.insert(p);
        }
        set
    }
}

/// A connection's facts in the form the matches compare with, computed once per evaluation.
struct Facts<'a> {
    source: IpAddr,
    destination: SocketAddr,
    /// The SPIFFE ID without `spiffe://`.
    principal: Option<&'a str>,
    /// `""` without an identity (or one whose path names no namespace).
    namespace: &'a str,
    service_account: Option<(&'a str, &'a str)>,
}

impl<'a> Facts<'a> {
    fn of(conn: &Connection<'a>) -> Self {
        let id = conn.identity;
        let service_account = id.and_then(|id| Some((id.namespace()?, id.service_account()?)));
        Self {
            source: conn.source.ip(),
            destination: conn.destination,
            principal: id.map(|id| id.as_str().strip_prefix("spiffe://").unwrap_or(id.as_str())),
            namespace: service_account.map_or("", |(ns, _)| ns),
            service_account,
        }
    }
}
