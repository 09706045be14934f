//! The authorization rules written as literally as possible, over a plain list of policies:
//! the oracle that property tests compare [`PolicySet::evaluate`](super::PolicySet::evaluate)
//! with, and the baseline of its benchmark. Every call reads every policy and parses the
//! identity again; use [`PolicySet`](super::PolicySet) to decide connections.

use super::{Action, Connection, Match, Policy, Scope, StringMatch, Target};

/// What the rules decide, without the deciding policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// No ALLOW policy applies, and no DENY policy matches.
    AllowedByDefault,
    /// An ALLOW policy matches.
    Allowed,
    /// A DENY policy matches.
    Denied,
    /// ALLOW policies apply, and none matches.
    NotAllowed,
}

/// Decides `conn` to `target` over every policy of `policies`; with `enforce_dry_run`, the
/// dry-run policies count as enforced ones.
pub fn decide(
    policies: &[Policy],
    target: Target<'_>,
    conn: &Connection<'_>,
    enforce_dry_run: bool,
) -> Outcome {
    let counted: Vec<&Policy> = policies
        .iter()
        .filter(|p| applies(p, target))
        .filter(|p| enforce_dry_run || !p.dry_run)
        .collect();
    let denies = counted.iter().filter(|p| p.action == Action::Deny);
    let allows: Vec<&&Policy> = counted
        .iter()
        .filter(|p| p.action == Action::Allow)
        .collect();
    if denies.into_iter().any(|p| policy_matches(p, conn)) {
        Outcome::Denied
    } else if allows.is_empty() {
        Outcome::AllowedByDefault
    } else if allows.iter().any(|p| policy_matches(p, conn)) {
        Outcome::Allowed
    } else {
        Outcome::NotAllowed
    }
}

/// Whether `policy` applies to `target`: by its scope, or because the workload names it.
pub fn applies(policy: &Policy, target: Target<'_>) -> bool {
    let by_scope = match policy.scope {
        Scope::Global => true,
        Scope::Namespace => policy.namespace == target.namespace,
        Scope::WorkloadSelector => false,
    };
    let key = format!("{}/{}", policy.namespace, policy.name);
    by_scope || target.policies.contains(&key)
}

/// Whether `policy` matches `conn`.
pub fn policy_matches(policy: &Policy, conn: &Connection<'_>) -> bool {
    let mut any_rule = false;
    for rule in &policy.rules {
        let mut every_clause = true;
        for clause in &rule.clauses {
            if !clause.matches.is_empty() && !clause.matches.iter().any(|m| match_holds(m, conn)) {
                every_clause = false;
            }
        }
        any_rule |= every_clause;
    }
    any_rule
}

fn match_holds(m: &Match, conn: &Connection<'_>) -> bool {
    let id = conn.identity.map(|id| id.as_str().to_owned());
    let principal = id
        .as_deref()
        .map(|id| id.strip_prefix("spiffe://").unwrap_or(id).to_owned());
    // `TD/ns/NS/sa/SA`, and nothing else, names a namespace and a service account.
    let parts: Option<(String, String)> = principal.as_deref().and_then(|p| {
        let segments: Vec<&str> = p.split('/').collect();
        (segments.len() == 5 && segments[1] == "ns" && segments[3] == "sa")
            .then(|| (segments[2].to_owned(), segments[4].to_owned()))
    });
    let namespace = parts.as_ref().map(|(ns, _)| ns.clone()).unwrap_or_default();
    let source = conn.source.ip();
    let destination = conn.destination.ip();
    let port = conn.destination.port();

    // Each kind: (set at all, some positive hits or there are none, some negative hits).
    let kinds = [
        kind(&m.namespaces, &m.not_namespaces, |s| {
            string_hit(s, &namespace)
        }),
        kind(&m.service_accounts, &m.not_service_accounts, |sa| {
            parts
                .as_ref()
                .is_some_and(|(ns, name)| *ns == sa.namespace && *name == sa.name)
        }),
        kind(&m.principals, &m.not_principals, |s| {
            principal.as_deref().is_some_and(|p| string_hit(s, p))
        }),
        kind(&m.source_ips, &m.not_source_ips, |c| c.contains(source)),
        kind(&m.destination_ips, &m.not_destination_ips, |c| {
            c.contains(destination)
        }),
        kind(&m.destination_ports, &m.not_destination_ports, |p| {
            *p == port
        }),
    ];
    if kinds.iter().all(|(set, _, _)| !set) {
        return false;
    }
    kinds
        .iter()
        .all(|&(_, positive, negative)| positive && !negative)
}

fn kind<T>(positive: &[T], negative: &[T], hit: impl Fn(&T) -> bool) -> (bool, bool, bool) {
    let set = !positive.is_empty() || !negative.is_empty();
    let positive_ok = positive.is_empty() || positive.iter().any(&hit);
    let negative_hit = negative.iter().any(&hit);
    (set, positive_ok, negative_hit)
}

fn string_hit(pattern: &StringMatch, value: &str) -> bool {
    match pattern {
        StringMatch::Exact(s) => value == s,
        StringMatch::Prefix(s) => value.starts_with(s.as_str()),
        StringMatch::Suffix(s) => value.ends_with(s.as_str()),
        StringMatch::Presence => !value.is_empty(),
    }
}
