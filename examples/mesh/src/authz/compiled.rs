//! Policies as [`PolicySet`](super::PolicySet) evaluates them: every condition kind that a
//! match sets, and only those, in one contiguous list per match, cheapest first. A
//! [`Match`] holds twelve lists, most of them empty; reading all of their headers for every
//! match of every policy that applies is what a decision would otherwise spend its time on.

use std::sync::Arc;

use super::{Cidr, Facts, Match, Policy, ServiceAccount, StringMatch};

/// A policy and its compiled rules.
#[derive(Debug)]
pub(super) struct Compiled {
    pub(super) policy: Arc<Policy>,
    rules: Box<[Rule]>,
}

/// All clauses must match (none: the rule matches every connection).
#[derive(Debug)]
struct Rule(Box<[Clause]>);

/// Any match must match (none: no condition).
#[derive(Debug)]
struct Clause(Box<[Conditions]>);

/// Every condition must hold (none: the match never matches).
#[derive(Debug)]
struct Conditions(Box<[Condition]>);

/// One kind of a match: holds when some entry hits, or, `negated`, when none does.
#[derive(Debug)]
struct Condition {
    negated: bool,
    test: Test,
}

#[derive(Debug)]
enum Test {
    Ports(Box<[u16]>),
    DestinationIps(Box<[Cidr]>),
    SourceIps(Box<[Cidr]>),
    Accounts(Box<[ServiceAccount]>),
    Principals(Box<[StringMatch]>),
    Namespaces(Box<[StringMatch]>),
}

impl Compiled {
    pub(super) fn new(policy: Arc<Policy>) -> Self {
        let rules = compile(&policy);
        Self { policy, rules }
    }

    /// Whether the policy matches the connection of `facts`.
    pub(super) fn matches(&self, facts: &Facts<'_>) -> bool {
        rules_match(&self.rules, facts)
    }
}

/// Whether `policy` matches the connection of `facts`, compiling it for this one question
/// ([`Policy::matches`]; a [`PolicySet`](super::PolicySet) compiles each policy once).
pub(super) fn policy_matches(policy: &Policy, facts: &Facts<'_>) -> bool {
    rules_match(&compile(policy), facts)
}

fn compile(policy: &Policy) -> Box<[Rule]> {
    policy
        .rules
        .iter()
        .map(|r| {
            Rule(
                r.clauses
                    .iter()
                    .map(|c| Clause(c.matches.iter().map(conditions).collect()))
                    .collect(),
            )
        })
        .collect()
}

fn rules_match(rules: &[Rule], facts: &Facts<'_>) -> bool {
    rules.iter().any(|Rule(clauses)| {
        clauses.iter().all(|Clause(matches)| {
            matches.is_empty()
                || matches.iter().any(|Conditions(conditions)| {
                    !conditions.is_empty() && conditions.iter().all(|c| c.holds(facts))
                })
        })
    })
}

fn conditions(m: &Match) -> Conditions {
    let mut list = Vec::new();
    let mut add = |positive: bool, test: Option<Test>| {
        if let Some(test) = test {
            list.push(Condition {
                negated: !positive,
                test,
            });
        }
    };
    fn some<T: Clone>(entries: &[T], wrap: fn(Box<[T]>) -> Test) -> Option<Test> {
        (!entries.is_empty()).then(|| wrap(entries.into()))
    }
    add(true, some(&m.destination_ports, Test::Ports));
    add(false, some(&m.not_destination_ports, Test::Ports));
    add(true, some(&m.destination_ips, Test::DestinationIps));
    add(false, some(&m.not_destination_ips, Test::DestinationIps));
    add(true, some(&m.source_ips, Test::SourceIps));
    add(false, some(&m.not_source_ips, Test::SourceIps));
    add(true, some(&m.service_accounts, Test::Accounts));
    add(false, some(&m.not_service_accounts, Test::Accounts));
    add(true, some(&m.principals, Test::Principals));
    add(false, some(&m.not_principals, Test::Principals));
    add(true, some(&m.namespaces, Test::Namespaces));
    add(false, some(&m.not_namespaces, Test::Namespaces));
    Conditions(list.into())
}

impl Condition {
    fn holds(&self, facts: &Facts<'_>) -> bool {
        let hit = match &self.test {
            Test::Ports(ports) => ports.contains(&facts.destination.port()),
            Test::DestinationIps(ranges) => {
                let ip = facts.destination.ip();
                ranges.iter().any(|c| c.contains(ip))
            }
            Test::SourceIps(ranges) => ranges.iter().any(|c| c.contains(facts.source)),
            Test::Accounts(accounts) => facts
                .service_account
                .is_some_and(|(ns, sa)| accounts.iter().any(|a| a.namespace == ns && a.name == sa)),
            Test::Principals(patterns) => facts
                .principal
                .is_some_and(|id| patterns.iter().any(|p| p.matches(id))),
            Test::Namespaces(patterns) => patterns.iter().any(|p| p.matches(facts.namespace)),
        };
        hit != self.negated
    }
}
