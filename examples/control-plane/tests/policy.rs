//! Istio's AuthorizationPolicy and PeerAuthentication, from manifests to the decisions a node
//! proxy makes: `tests/data/policies.yaml` is translated and served as a snapshot, decoded as
//! a node proxy decodes it (the wire form of `Address` and `Authorization`), and each case
//! asserts the decision and the policy that made it.

use std::net::SocketAddr;
use std::path::Path;

use meshkit_control_plane::manifests::ManifestSet;
use meshkit_control_plane::policy::STATIC_STRICT_POLICY;
use meshkit_control_plane::translate::{TranslateOptions, build_snapshot};
use meshkit_identity::{SpiffeId, TrustDomain};
use meshkit_mesh::MeshIndex;
use meshkit_mesh::authz::{Action, Connection, Decision, Scope};
use meshkit_mesh::feed::mesh_config;
use meshkit_mesh::resources::{
    ADDRESS_TYPE_URL, AUTHORIZATION_TYPE_URL, AddressResource, AuthorizationResource,
};
use meshkit_xds_client::Resource;

const POLICIES: &str = include_str!("data/policies.yaml");

fn load(text: &str) -> ManifestSet {
    let mut set = ManifestSet::default();
    let errors = set.add_str(Path::new("policies.yaml"), text);
    assert!(errors.is_empty(), "{errors:?}");
    set
}

/// The mesh a node proxy would build from the control plane's snapshot of `set`.
fn served_mesh(set: &ManifestSet) -> MeshIndex {
    let snapshot = build_snapshot(set, &TranslateOptions::default());
    let decode_all = |url: &str| -> Vec<Vec<u8>> {
        snapshot
            .get_type(url)
            .map(|t| {
                t.resources()
                    .values()
                    .map(|r| r.resource.value.clone())
                    .collect()
            })
            .unwrap_or_default()
    };
    let addresses: Vec<AddressResource> = decode_all(ADDRESS_TYPE_URL)
        .iter()
        .map(|b| AddressResource::decode(b).expect("address"))
        .collect();
    let mut mesh = mesh_config(addresses.iter());
    mesh.policies = decode_all(AUTHORIZATION_TYPE_URL)
        .iter()
        .map(|b| (*AuthorizationResource::decode(b).expect("policy").policy).clone())
        .collect();
    mesh.index(&TrustDomain::new("cluster.local").unwrap())
}

/// What one case expects: allowed or not, and the deciding policy (`namespace/name`), if any.
#[derive(Debug, Clone, Copy)]
enum Expect {
    Allowed(&'static str),
    ByDefault,
    Denied(&'static str),
    NotAllowed,
}

impl Expect {
    /// The decision's text ([`Decision`]'s `Display`).
    fn text(self) -> String {
        match self {
            Self::Allowed(p) => format!("allowed by {p}"),
            Self::ByDefault => Decision::AllowedByDefault.to_string(),
            Self::Denied(p) => format!("denied by {p}"),
            Self::NotAllowed => Decision::NotAllowed.to_string(),
        }
    }
}

/// The decision for a connection from `id` (a path in `cluster.local`, `None` for no
/// identity) at `source` to `destination`, and the dry-run decision, as text.
fn decide(
    mesh: &MeshIndex,
    id: Option<&str>,
    source: &str,
    destination: &str,
) -> (String, Option<String>) {
    let id = id.map(|s| SpiffeId::new(&format!("spiffe://cluster.local/{s}")).unwrap());
    let destination: SocketAddr = destination.parse().unwrap();
    let (workload, _) = mesh
        .workload(destination.ip())
        .expect("destination workload");
    let conn = Connection {
        source: source.parse().unwrap(),
        destination,
        identity: id.as_ref(),
    };
    let evaluation = mesh.authorize(workload, &conn);
    (
        evaluation.decision.to_string(),
        evaluation.dry_run.map(|d| d.to_string()),
    )
}

#[test]
fn the_policy_table_decides_as_istio_specifies() {
    let mesh = served_mesh(&load(POLICIES));
    let strict = "istio-system/istio_converted_static_strict";
    assert_eq!(strict, format!("istio-system/{STATIC_STRICT_POLICY}"));
    let web = "10.0.0.11:8080";
    let cases: [(&str, Option<&str>, &str, &str, Expect); 13] = [
        (
            "a namespace on its port",
            Some("ns/edge/sa/gateway"),
            "10.0.0.1:40000",
            web,
            Expect::Allowed("shop/allow-web"),
        ),
        (
            "a namespace on another port",
            Some("ns/edge/sa/gateway"),
            "10.0.0.1:40000",
            "10.0.0.11:9090",
            Expect::NotAllowed,
        ),
        (
            "a namespace not listed",
            Some("ns/shop/sa/cart"),
            "10.0.0.1:40000",
            web,
            Expect::NotAllowed,
        ),
        (
            "a principal prefix, any port",
            Some("ns/ops/sa/admin"),
            "10.0.0.1:40000",
            "10.0.0.11:9090",
            Expect::Allowed("shop/allow-web"),
        ),
        (
            "a service account",
            Some("ns/billing/sa/invoicer"),
            "10.0.0.1:40000",
            "10.0.0.11:9090",
            Expect::Allowed("shop/allow-web"),
        ),
        (
            "DENY over ALLOW (principal suffix)",
            Some("ns/edge/sa/intruder"),
            "10.0.0.1:40000",
            web,
            Expect::Denied("shop/deny-intruder"),
        ),
        (
            "an IP block",
            Some("ns/edge/sa/gateway"),
            "10.9.3.4:40000",
            web,
            Expect::Denied("shop/deny-quarantine"),
        ),
        (
            "STRICT without a peer identity",
            None,
            "10.0.0.1:40000",
            web,
            Expect::Denied(strict),
        ),
        (
            "an ALLOW whose only rule is HTTP",
            Some("ns/edge/sa/gateway"),
            "10.0.0.1:40000",
            "10.0.0.12:8080",
            Expect::NotAllowed,
        ),
        (
            "a GLOBAL DENY with a when clause",
            Some("ns/edge/sa/gateway"),
            "10.0.0.1:40000",
            "10.0.0.13:6666",
            Expect::Denied("istio-system/deny-debug-port"),
        ),
        (
            "the when clause's notValues",
            Some("ns/ops/sa/admin"),
            "10.0.0.1:40000",
            "10.0.0.13:6666",
            Expect::ByDefault,
        ),
        (
            "no ALLOW policy, no identity, no STRICT",
            None,
            "10.0.0.1:40000",
            "10.0.0.14:8080",
            Expect::ByDefault,
        ),
        (
            "no ALLOW policy",
            Some("ns/edge/sa/gateway"),
            "10.0.0.1:40000",
            "10.0.0.13:5432",
            Expect::ByDefault,
        ),
    ];
    for (name, id, source, destination, expected) in cases {
        let (decision, _) = decide(&mesh, id, source, destination);
        assert_eq!(decision, expected.text(), "{name}");
    }
    // The dry-run DENY would have refused the first case; it is reported, not enforced.
    let (decision, dry_run) = decide(&mesh, Some("ns/edge/sa/gateway"), "10.0.0.1:40000", web);
    assert_eq!(decision, Expect::Allowed("shop/allow-web").text());
    assert_eq!(dry_run.as_deref(), Some("denied by shop/deny-edge-trial"));
}

#[test]
fn scopes_selectors_and_warnings_follow_the_manifests() {
    let set = load(POLICIES);
    let mesh = served_mesh(&set);
    let policy = |key: &str| {
        mesh.policies()
            .get(key)
            .unwrap_or_else(|| panic!("{key}"))
            .clone()
    };
    assert_eq!(policy("shop/allow-web").scope, Scope::WorkloadSelector);
    assert_eq!(policy("shop/deny-intruder").scope, Scope::Namespace);
    assert_eq!(policy("istio-system/deny-debug-port").scope, Scope::Global);
    assert!(policy("shop/deny-edge-trial").dry_run);
    let strict = policy(&format!("istio-system/{STATIC_STRICT_POLICY}"));
    assert_eq!(
        (strict.action, strict.scope),
        (Action::Deny, Scope::WorkloadSelector)
    );
    // Each rule is one Rule; `to` and `from` one clause each, `when` its own.
    let allow = policy("shop/allow-web");
    assert_eq!(allow.rules.len(), 3);
    assert_eq!(allow.rules[0].clauses.len(), 2);
    let debug = policy("istio-system/deny-debug-port");
    assert_eq!(debug.rules[0].clauses.len(), 2);
    // The HTTP rule was dropped from the ALLOW policy, with a warning naming the attribute.
    assert!(policy("shop/allow-api-get").rules.is_empty());
    let warning = set
        .warnings
        .iter()
        .find(|w| w.field.as_deref() == Some("spec.rules[0]") && w.message.contains("methods"))
        .unwrap_or_else(|| panic!("no warning in {:?}", set.warnings));
    assert!(warning.message.contains("the rule is dropped"), "{warning}");
    // The workloads name what selects them: web its ALLOW and STRICT, db nothing.
    let workload = |ip: &str| mesh.workload(ip.parse().unwrap()).unwrap().0.clone();
    // Its AuthorizationPolicies first, then the PeerAuthentication's, in istiod's order.
    assert_eq!(
        workload("10.0.0.11").authorization_policies,
        [
            "shop/allow-web".to_owned(),
            format!("istio-system/{STATIC_STRICT_POLICY}"),
        ]
    );
    assert!(workload("10.0.0.13").authorization_policies.is_empty());
}

#[test]
fn a_deny_with_http_attributes_is_enforced_on_what_remains() {
    let set = load(
        r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-get, namespace: shop}
spec:
  action: DENY
  rules:
  - from: [{source: {namespaces: [edge]}}]
    to: [{operation: {methods: [GET]}}]
"#,
    );
    let p = &set.authorization_policies[0];
    // The `to` entry had only an HTTP condition: it matches every connection, so its clause
    // is left out and the rule denies the whole edge namespace.
    assert_eq!(p.rules.len(), 1);
    assert_eq!(p.rules[0].clauses.len(), 1);
    assert_eq!(p.rules[0].clauses[0].matches[0].namespaces.len(), 1);
    assert!(
        set.warnings[0]
            .message
            .contains("more connections are denied")
    );
}

#[test]
fn unenforceable_and_malformed_policies_are_refused_by_field() {
    let refused = |text: &str| {
        let mut set = ManifestSet::default();
        let errors = set.add_str(Path::new("p.yaml"), text);
        assert!(set.authorization_policies.is_empty() && set.peer_authentications.is_empty());
        errors
            .iter()
            .map(|e| format!("{}: {}", e.field.as_deref().unwrap_or(""), e.message))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let head = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: p, namespace: shop}\n";
    for action in ["CUSTOM", "AUDIT"] {
        let e = refused(&format!("{head}spec: {{action: {action}}}\n"));
        assert!(
            e.starts_with("spec.action: action ") && e.contains("cannot be enforced"),
            "{e}"
        );
    }
    let e = refused(&format!(
        "{head}spec:\n  rules:\n  - to: [{{operation: {{ports: [\"http\"]}}}}]\n"
    ));
    assert!(
        e.starts_with("spec.rules[0].to[0].operation.ports[0]:"),
        "{e}"
    );
    let e = refused(&format!(
        "{head}spec:\n  rules:\n  - from: [{{source: {{notIpBlocks: [10.0.0.0/40]}}}}]\n"
    ));
    assert!(
        e.starts_with("spec.rules[0].from[0].source.notIpBlocks[0]:"),
        "{e}"
    );
    let e = refused(&format!(
        "{head}spec:\n  rules:\n  - when: [{{key: destination.port, values: [\"70000\"]}}]\n"
    ));
    assert!(e.starts_with("spec.rules[0].when[0].values[0]:"), "{e}");
    // What would otherwise match every connection: a misspelt field, an empty entry, a
    // condition without values.
    let rules = |yaml: &str| refused(&format!("{head}spec:\n  rules:\n  - {yaml}\n"));
    let e = rules("from: [{source: {principal: [x]}}]");
    assert!(e.contains("unknown field `principal`"), "{e}");
    let e = rules("from: [{source: {}}]");
    assert!(
        e.starts_with("spec.rules[0].from[0].source: a source needs at least one field"),
        "{e}"
    );
    let e = rules("to: [{operation: {}}]");
    assert!(
        e.starts_with("spec.rules[0].to[0].operation: an operation needs"),
        "{e}"
    );
    let e = rules("when: [{key: source.ip}]");
    assert!(
        e.starts_with("spec.rules[0].when[0]: a condition needs values"),
        "{e}"
    );
    let e = refused(
        "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {name: p}\nspec: {mtls: {mode: SOMETIMES}}\n",
    );
    assert!(e.starts_with("spec.mtls.mode:"), "{e}");
    let e = refused(
        "apiVersion: security.istio.io/v2\nkind: AuthorizationPolicy\nmetadata: {name: p}\n",
    );
    assert!(e.starts_with("apiVersion:"), "{e}");
    // A waypoint's policy is skipped with a warning, not refused.
    let mut set = ManifestSet::default();
    let errors = set.add_str(
        Path::new("p.yaml"),
        &format!("{head}spec:\n  targetRefs: [{{kind: Service, group: \"\", name: web}}]\n"),
    );
    assert!(errors.is_empty() && set.authorization_policies.is_empty());
    assert!(set.warnings[0].message.contains("for waypoints"));
}

#[test]
fn port_level_mtls_denies_plaintext_on_exactly_the_strict_ports() {
    let set = load(
        r#"
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: web-1, namespace: shop}
spec: {address: 10.0.0.11, serviceAccount: web, labels: {app: web}}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: mesh, namespace: istio-system}
spec: {mtls: {mode: STRICT}}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: web-health, namespace: shop}
spec:
  selector: {matchLabels: {app: web}}
  portLevelMtls: {"15021": {mode: PERMISSIVE}}
"#,
    );
    let mesh = served_mesh(&set);
    let converted = "shop/converted_peer_authentication_web-health";
    let (plain_app, _) = decide(&mesh, None, "10.0.0.1:40000", "10.0.0.11:8080");
    assert_eq!(plain_app, Expect::Denied(converted).text());
    let (plain_health, _) = decide(&mesh, None, "10.0.0.1:40000", "10.0.0.11:15021");
    assert_eq!(plain_health, Expect::ByDefault.text());
    let (mtls_app, _) = decide(
        &mesh,
        Some("ns/edge/sa/gateway"),
        "10.0.0.1:40000",
        "10.0.0.11:8080",
    );
    assert_eq!(mtls_app, Expect::ByDefault.text());
}
