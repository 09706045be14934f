//! meshkit-mesh: one L4 authorization decision (`PolicySet::evaluate`) beside the literal
//! reference over a plain list (`authz::reference::decide`) in the same run:
//!
//! - `authz_applying_N`: N policies all apply to the destination (its namespace's), the
//!   connection matches none of the DENY ones and the last ALLOW one. Each names a
//!   principal of its own, so the set reads only the one naming the caller;
//! - `authz_naming_caller_N`: the same, but every policy names the caller's principal (and
//!   all but the last another port): the set's index cannot rule any out, and every policy
//!   is read, the worst case;
//! - `authz_other_namespaces_N`: the same 10 applying policies among N in other namespaces,
//!   which the index never reads and the reference scans.
//!
//! `cargo bench -p meshkit-benches --bench authz`

use std::hint::black_box;
use std::net::SocketAddr;

use criterion::{Criterion, criterion_group};
use meshkit_benches::{Ratio, Run};
use meshkit_identity::SpiffeId;
use meshkit_mesh::Cidr;
use meshkit_mesh::authz::reference;
use meshkit_mesh::authz::{
    Action, Connection, Match, Policy, PolicySet, Rule, Scope, ServiceAccount, StringMatch, Target,
};

const APPLYING: [usize; 3] = [1, 100, 10_000];
const NAMING_CALLER: [usize; 2] = [100, 10_000];
const OTHERS: [usize; 2] = [100, 10_000];

/// Which principal the policies name.
#[derive(Clone, Copy)]
enum Naming {
    /// Each its own, the matching one the caller's.
    Own,
    /// The caller's; those that must not match name another port.
    Caller,
}

const CALLER: &str = "cluster.local/ns/edge/sa/gateway";

/// A policy of namespace `ns` that the bench's connection does not match (DENY) or matches
/// only when `hit` (ALLOW): principals, namespaces, a service account, IP blocks and ports.
fn policy(ns: &str, i: usize, action: Action, hit: bool, naming: Naming) -> Policy {
    let principal = match (hit, naming) {
        (true, _) | (false, Naming::Caller) => CALLER.to_owned(),
        (false, Naming::Own) => format!("cluster.local/ns/edge/sa/other-{i}"),
    };
    let destination_ports = if hit {
        vec![8080, 9090]
    } else {
        vec![9090, 9091]
    };
    Policy {
        name: format!("p{i}"),
        namespace: ns.to_owned(),
        scope: Scope::Namespace,
        action,
        rules: vec![
            Rule::of([Match {
                namespaces: vec![StringMatch::Prefix(format!("team-{i}-"))],
                ..Match::default()
            }]),
            Rule::of([
                Match {
                    principals: vec![StringMatch::Exact(principal)],
                    destination_ports,
                    not_source_ips: vec!["192.168.0.0/16".parse::<Cidr>().unwrap()],
                    ..Match::default()
                },
                Match {
                    service_accounts: vec![ServiceAccount {
                        namespace: "ops".into(),
                        name: format!("sa-{i}"),
                    }],
                    ..Match::default()
                },
            ]),
        ],
        dry_run: false,
    }
}

/// `applying` policies of namespace `shop` (half DENY, the last an ALLOW that matches), and
/// `others` in other namespaces.
fn policies(applying: usize, others: usize, naming: Naming) -> Vec<Policy> {
    let mut all: Vec<Policy> = (0..applying)
        .map(|i| {
            let last = i + 1 == applying;
            let action = if i % 2 == 0 && !last {
                Action::Deny
            } else {
                Action::Allow
            };
            policy("shop", i, action, last, naming)
        })
        .collect();
    all.extend((0..others).map(|i| {
        let ns = format!("ns-{}", i % 97);
        policy(&ns, applying + i, Action::Allow, true, Naming::Own)
    }));
    all
}

fn decisions(c: &mut Criterion) {
    let id = SpiffeId::new("spiffe://cluster.local/ns/edge/sa/gateway").unwrap();
    let conn = Connection {
        source: SocketAddr::from(([10, 0, 0, 7], 40_000)),
        destination: SocketAddr::from(([10, 0, 1, 9], 8080)),
        identity: Some(&id),
    };
    let target = Target {
        namespace: "shop",
        policies: &[],
    };
    for (name, applying, others, naming) in groups() {
        let list = policies(applying, others, naming);
        let set: PolicySet = list.iter().cloned().collect();
        // Both must agree before their speed is compared.
        let evaluation = set.evaluate(target, &conn);
        assert!(
            evaluation.decision.is_allowed(),
            "{name}: {}",
            evaluation.decision
        );
        assert_eq!(
            reference::decide(&list, target, &conn, false),
            reference::Outcome::Allowed,
            "{name}"
        );
        let mut group = c.benchmark_group(&name);
        group.bench_function("policy_set", |b| {
            b.iter(|| {
                black_box(
                    set.evaluate(black_box(target), black_box(&conn))
                        .decision
                        .is_allowed(),
                )
            })
        });
        group.bench_function("reference", |b| {
            b.iter(|| {
                black_box(reference::decide(
                    black_box(&list),
                    target,
                    black_box(&conn),
                    false,
                ))
            })
        });
        group.finish();
    }
}

/// Each group: its name, the applying policies, the others, and what they name.
fn groups() -> impl Iterator<Item = (String, usize, usize, Naming)> {
    let applying = APPLYING
        .iter()
        .map(|&n| (format!("authz_applying_{n}"), n, 0, Naming::Own));
    let naming_caller = NAMING_CALLER
        .iter()
        .map(|&n| (format!("authz_naming_caller_{n}"), n, 0, Naming::Caller));
    let others = OTHERS
        .iter()
        .map(|&n| (format!("authz_other_namespaces_{n}"), 10, n, Naming::Own));
    applying.chain(naming_caller).chain(others)
}

criterion_group!(benches, decisions);

fn main() {
    let run = Run::start();
    benches();
    Criterion::default().configure_from_args().final_summary();
    let groups: Vec<String> = groups().map(|(name, ..)| name).collect();
    let ratios: Vec<Ratio<'_>> = groups
        .iter()
        .map(|group| Ratio {
            group,
            subject: "policy_set",
            baseline: "reference",
        })
        .collect();
    run.report_ratios(&ratios);
}
